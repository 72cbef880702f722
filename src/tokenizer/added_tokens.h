// Finds added tokens (special tokens like <|im_start|>, user-defined pieces) in text before
// pre-tokenization: leftmost match first, the longest token among those starting there (HF's
// leftmost-longest rule), with lstrip/rstrip swallowing neighbouring whitespace.
// Built once; matching does not modify the matcher.
#pragma once

#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace kvp {

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  // Takes the tokens for which `keep(token)` is true.
  template <typename Keep>
  AddedTokenMatcher(const std::vector<AddedToken>& tokens, Keep keep) {
    nodes_.emplace_back();
    for (const AddedToken& token : tokens) {
      if (keep(token)) insert(token);
    }
  }

  struct Match {
    size_t begin;  // byte offsets in the text, including stripped whitespace
    size_t end;
    TokenId id;
  };

  // All matches in `text`, left to right. With `parse_special` false, special tokens are not
  // matched (their text is encoded as ordinary text).
  std::vector<Match> find_all(std::string_view text, bool parse_special) const;

  bool empty() const { return nodes_.size() <= 1; }

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;  // sorted by byte
    int32_t token = -1;                                 // index into tokens_, -1 if none
  };
  void insert(const AddedToken& token);
  int32_t child(int32_t node, uint8_t byte) const;

  std::vector<Node> nodes_;         // [num_nodes], nodes_[0] is the root
  std::vector<AddedToken> tokens_;  // [num_matchable] indexed by Node::token
};

}  // namespace kvp

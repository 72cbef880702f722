// The BPE model: one pre-tokenized piece in, token ids out.
//
// Two merge orders, chosen by what the vocabulary has:
//  - ranked merges (HF BPE, GGUF tokenizer.ggml.merges): repeatedly merge the adjacent pair with
//    the lowest rank, leftmost first among equal ranks (HF tokenizers' Word::merge_all);
//  - scores only (GGUF "llama" vocab without merges): repeatedly merge the adjacent pair whose
//    concatenation is the best-scored normal or user-defined token, leftmost first among equal
//    scores (llama.cpp's SentencePiece tokenizer).
// Characters without a token become <0xXX> byte tokens (byte_fallback) or unk (fused when
// fuse_unk), or are dropped when the vocab has no unk, as HF does.
#pragma once

#include <array>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "tokenizer/vocab.h"

namespace kvp {

class BpeModel {
 public:
  // Errors: kCorruption for a merge whose parts or result are not tokens, kInvalidArgument for a
  // SentencePiece vocab with neither merges nor scores.
  static Result<BpeModel> create(const TokenizerVocab& vocab, const TokenizerPipeline& pipeline);

  // Appends the ids of `piece` to `out`. requires: `piece` is valid UTF-8. Does not modify the
  // model.
  void encode(std::string_view piece, std::vector<TokenId>* out) const;

  // The id of a token's exact text, if it is in the vocabulary.
  std::optional<TokenId> find(std::string_view token) const;

 private:
  struct Merge {
    int32_t rank;
    TokenId result;
  };
  // One symbol of a word being merged: a token, or (merging by score) a run of text.
  struct Symbol {
    TokenId id;          // -1 while the text is not (yet) known to be a token
    int32_t prev;        // index into the word's symbols, -1 at the start
    int32_t next;        // -1 at the end
    uint32_t begin;      // byte offset of the symbol's text in the piece
    uint32_t num_bytes;  // 0 once merged into its left neighbour
  };
  static uint64_t pair_key(TokenId left, TokenId right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }
  // Appends the ids for text that has no token: byte tokens, else unk (fused), else nothing.
  // `unk_pending` carries a fused unk across calls; flush_unk() emits it.
  void encode_unknown(std::string_view text, std::vector<TokenId>* out, bool* unk_pending) const;
  void flush_unk(std::vector<TokenId>* out, bool* unk_pending) const;
  void encode_by_rank(std::string_view piece, std::vector<TokenId>* out) const;
  void encode_by_score(std::string_view piece, std::vector<TokenId>* out) const;

  // Transparent hash: lookups by string_view allocate nothing.
  struct TextHash {
    using is_transparent = void;
    size_t operator()(std::string_view text) const { return std::hash<std::string_view>{}(text); }
  };
  std::unordered_map<std::string, TokenId, TextHash, std::equal_to<>> token_to_id_;
  std::unordered_map<uint64_t, Merge> merges_;  // [num_merges] (left, right) -> rank, result
  std::vector<float> scores_;                   // [num_tokens] when merging by score
  std::vector<bool> mergeable_;                 // [num_tokens] when merging by score
  std::array<TokenId, 256> byte_ids_{};         // <0xXX> ids, -1 where absent
  bool by_score_ = false;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  std::optional<TokenId> unk_id_;
};

}  // namespace kvp

// Added-token matching with a byte trie (see added_tokens.h).
#include "tokenizer/added_tokens.h"

#include <algorithm>

#include "tokenizer/utf8.h"

namespace kvp {
namespace {

// Rust's char::is_whitespace (Unicode White_Space), which HF uses for lstrip/rstrip.
bool is_whitespace(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

// Start of the code point that ends at byte `end` (exclusive).
size_t previous_char_start(std::string_view text, size_t end) {
  size_t pos = end - 1;
  while (pos > 0 && (static_cast<uint8_t>(text[pos]) & 0xC0) == 0x80) --pos;
  return pos;
}

}  // namespace

int32_t AddedTokenMatcher::child(int32_t node, uint8_t byte) const {
  const auto& children = nodes_[node].children;
  auto it = std::lower_bound(children.begin(), children.end(), std::make_pair(byte, int32_t{-1}));
  return it != children.end() && it->first == byte ? it->second : -1;
}

void AddedTokenMatcher::insert(const AddedToken& token) {
  int32_t node = 0;
  for (const char c : token.content) {
    const auto byte = static_cast<uint8_t>(c);
    int32_t next = child(node, byte);
    if (next < 0) {
      next = static_cast<int32_t>(nodes_.size());
      nodes_.emplace_back();
      auto& children = nodes_[node].children;
      children.insert(
          std::lower_bound(children.begin(), children.end(), std::make_pair(byte, int32_t{-1})),
          {byte, next});
    }
    node = next;
  }
  if (nodes_[node].token < 0) {  // the first of two equal contents wins
    nodes_[node].token = static_cast<int32_t>(tokens_.size());
    tokens_.push_back(token);
  }
}

std::vector<AddedTokenMatcher::Match> AddedTokenMatcher::find_all(std::string_view text,
                                                                  bool parse_special) const {
  std::vector<Match> matches;
  if (empty()) return matches;
  size_t pos = 0;
  while (pos < text.size()) {
    int32_t node = 0;
    int32_t best = -1;
    size_t best_end = 0;
    for (size_t i = pos; i < text.size(); ++i) {
      node = child(node, static_cast<uint8_t>(text[i]));
      if (node < 0) break;
      const int32_t t = nodes_[node].token;
      if (t >= 0 && (parse_special || !tokens_[t].special)) {
        best = t;
        best_end = i + 1;
      }
    }
    if (best < 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = tokens_[best];
    size_t begin = pos;
    size_t end = best_end;
    if (token.lstrip) {
      const size_t floor = matches.empty() ? 0 : matches.back().end;
      while (begin > floor) {
        const size_t prev = previous_char_start(text, begin);
        if (utf8::sequence_length(text, prev) == 0 || !is_whitespace(utf8::decode_at(text, prev))) {
          break;
        }
        begin = prev;
      }
    }
    if (token.rstrip) {
      while (end < text.size()) {
        const size_t n = utf8::sequence_length(text, end);
        if (n == 0 || !is_whitespace(utf8::decode_at(text, end))) break;
        end += n;
      }
    }
    matches.push_back({begin, end, token.id});
    pos = end;
  }
  return matches;
}

}  // namespace kvp

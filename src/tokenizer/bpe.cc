// BPE merging by rank (HF) and by score (llama.cpp SentencePiece); see bpe.h.
#include "tokenizer/bpe.h"

#include <queue>

#include "tokenizer/utf8.h"

namespace kvp {

Result<BpeModel> BpeModel::create(const TokenizerVocab& vocab, const TokenizerPipeline& pipeline) {
  BpeModel model;
  model.byte_fallback_ = pipeline.byte_fallback;
  model.fuse_unk_ = pipeline.fuse_unk;
  model.ignore_merges_ = pipeline.ignore_merges;
  model.unk_id_ = vocab.unk_id;
  model.token_to_id_.reserve(vocab.tokens.size());
  for (size_t i = 0; i < vocab.tokens.size(); ++i) {
    if (vocab.tokens[i].empty()) continue;
    // The first id wins for a duplicated text, as llama.cpp's token_to_id does.
    model.token_to_id_.emplace(vocab.tokens[i], static_cast<TokenId>(i));
  }
  model.byte_ids_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    if (auto id = model.find(fmt::format("<0x{:02X}>", b))) model.byte_ids_[b] = *id;
  }

  if (!vocab.merges.empty()) {
    model.merges_.reserve(vocab.merges.size());
    for (size_t rank = 0; rank < vocab.merges.size(); ++rank) {
      const auto& [left, right] = vocab.merges[rank];
      const auto left_id = model.find(left);
      const auto right_id = model.find(right);
      const auto result_id = model.find(left + right);
      if (!left_id || !right_id || !result_id) {
        return Status::corruption("tokenizer merge {} '{} {}': '{}' is not a token", rank, left,
                                  right,
                                  !left_id    ? left
                                  : !right_id ? right
                                              : left + right);
      }
      // A repeated pair keeps its first (best) rank.
      model.merges_.emplace(pair_key(*left_id, *right_id),
                            Merge{static_cast<int32_t>(rank), *result_id});
    }
  } else if (vocab.model == TokenizerModel::kSentencePieceBpe) {
    if (vocab.scores.size() != vocab.tokens.size()) {
      return Status::invalid_argument(
          "tokenizer: a SentencePiece vocab needs merges or one score per token ({} scores, {} "
          "tokens)",
          vocab.scores.size(), vocab.tokens.size());
    }
    model.by_score_ = true;
    model.scores_ = vocab.scores;
    model.mergeable_.assign(vocab.tokens.size(), true);
    for (size_t i = 0; i < vocab.token_types.size(); ++i) {
      const TokenType type = vocab.token_types[i];
      model.mergeable_[i] = type == TokenType::kNormal || type == TokenType::kUserDefined;
    }
  }
  return model;
}

std::optional<TokenId> BpeModel::find(std::string_view token) const {
  auto it = token_to_id_.find(token);
  if (it == token_to_id_.end()) return std::nullopt;
  return it->second;
}

void BpeModel::flush_unk(std::vector<TokenId>* out, bool* unk_pending) const {
  if (*unk_pending) out->push_back(*unk_id_);
  *unk_pending = false;
}

void BpeModel::encode_unknown(std::string_view text, std::vector<TokenId>* out,
                              bool* unk_pending) const {
  if (byte_fallback_) {
    bool all_bytes = true;
    for (const char c : text) all_bytes = all_bytes && byte_ids_[static_cast<uint8_t>(c)] >= 0;
    if (all_bytes) {
      flush_unk(out, unk_pending);
      for (const char c : text) out->push_back(byte_ids_[static_cast<uint8_t>(c)]);
      return;
    }
  }
  if (!unk_id_) return;  // HF drops the character when there is no unk token
  if (fuse_unk_) {
    *unk_pending = true;
  } else {
    out->push_back(*unk_id_);
  }
}

void BpeModel::encode(std::string_view piece, std::vector<TokenId>* out) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    if (auto id = find(piece)) {
      out->push_back(*id);
      return;
    }
  }
  if (by_score_) {
    encode_by_score(piece, out);
  } else {
    encode_by_rank(piece, out);
  }
}

void BpeModel::encode_by_rank(std::string_view piece, std::vector<TokenId>* out) const {
  // Initial symbols: one per character, or its byte tokens, or a (fused) unk.
  std::vector<Symbol> symbols;  // [num_symbols]
  symbols.reserve(piece.size());
  std::vector<TokenId> ids;  // scratch
  bool unk_pending = false;
  auto push_symbol = [&](TokenId id) {
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, index - 1, -1, 0, 1});
    if (index > 0) symbols[index - 1].next = index;
  };
  size_t pos = 0;
  while (pos < piece.size()) {
    const size_t num_bytes = utf8::sequence_length(piece, pos);
    KVP_DCHECK(num_bytes > 0, "piece is not valid UTF-8 at byte {}", pos);
    const std::string_view ch = piece.substr(pos, num_bytes);
    if (auto id = find(ch)) {
      ids.clear();
      flush_unk(&ids, &unk_pending);
      for (TokenId unk : ids) push_symbol(unk);
      push_symbol(*id);
    } else {
      ids.clear();
      encode_unknown(ch, &ids, &unk_pending);
      for (TokenId t : ids) push_symbol(t);
    }
    pos += num_bytes;
  }
  ids.clear();
  flush_unk(&ids, &unk_pending);
  for (TokenId unk : ids) push_symbol(unk);

  // Lowest rank first; among equal ranks the leftmost position.
  struct Candidate {
    int32_t rank;
    int32_t pos;
    TokenId result;
    bool operator<(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;  // priority_queue pops the largest
    }
  };
  std::priority_queue<Candidate> queue;
  auto try_push = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = symbols[left].next;
    if (right < 0) return;
    auto it = merges_.find(pair_key(symbols[left].id, symbols[right].id));
    if (it != merges_.end()) queue.push({it->second.rank, left, it->second.result});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) try_push(i);

  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (left.num_bytes == 0 || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    // Stale if either side changed since the candidate was pushed.
    auto it = merges_.find(pair_key(left.id, right.id));
    if (it == merges_.end() || it->second.result != top.result) continue;
    left.id = top.result;
    right.num_bytes = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    try_push(left.prev);
    try_push(top.pos);
  }
  for (const Symbol& s : symbols) {
    if (s.num_bytes > 0) out->push_back(s.id);
  }
}

void BpeModel::encode_by_score(std::string_view piece, std::vector<TokenId>* out) const {
  std::vector<Symbol> symbols;  // [num_characters], merged in place
  size_t pos = 0;
  while (pos < piece.size()) {
    size_t num_bytes = utf8::sequence_length(piece, pos);
    KVP_DCHECK(num_bytes > 0, "piece is not valid UTF-8 at byte {}", pos);
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back(
        {-1, index - 1, -1, static_cast<uint32_t>(pos), static_cast<uint32_t>(num_bytes)});
    if (index > 0) symbols[index - 1].next = index;
    pos += num_bytes;
  }

  // Best score first; among equal scores the leftmost.
  struct Candidate {
    float score;
    int32_t left;
    uint32_t num_bytes;  // of the merged text, to detect stale candidates
    TokenId result;
    bool operator<(const Candidate& o) const {
      return score != o.score ? score < o.score : left > o.left;
    }
  };
  std::priority_queue<Candidate> queue;
  auto try_push = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = symbols[left].next;
    if (right < 0) return;
    const uint32_t num_bytes = symbols[left].num_bytes + symbols[right].num_bytes;
    auto id = find(piece.substr(symbols[left].begin, num_bytes));
    if (!id || !mergeable_[*id]) return;
    queue.push({scores_[*id], left, num_bytes, *id});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) try_push(i);

  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.left];
    if (left.num_bytes == 0 || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    if (left.num_bytes + right.num_bytes != top.num_bytes) continue;
    left.num_bytes = top.num_bytes;
    left.id = top.result;
    right.num_bytes = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.left;
    try_push(left.prev);
    try_push(top.left);
  }

  bool unk_pending = false;
  for (const Symbol& s : symbols) {
    if (s.num_bytes == 0) continue;
    const std::string_view text = piece.substr(s.begin, s.num_bytes);
    std::optional<TokenId> id = s.id >= 0 ? std::optional<TokenId>(s.id) : find(text);
    if (id) {
      flush_unk(out, &unk_pending);
      out->push_back(*id);
    } else {
      encode_unknown(text, out, &unk_pending);
    }
  }
  flush_unk(out, &unk_pending);
}

}  // namespace kvp

// Tokenizer (see tokenizer.h).
#include "tokenizer/tokenizer.h"

#include "tokenizer/tokenizer_json.h"
#include "tokenizer/utf8.h"

namespace kvp {
namespace {

Status check_id(const TokenizerVocab& vocab, const std::optional<TokenId>& id, const char* name) {
  if (id && (*id < 0 || static_cast<size_t>(*id) >= vocab.tokens.size())) {
    return Status::invalid_argument("tokenizer vocab: {} {} is outside [0, {})", name, *id,
                                    vocab.tokens.size());
  }
  return Status::ok();
}

}  // namespace

Result<Tokenizer> Tokenizer::create(TokenizerVocab vocab, TokenizerPipeline pipeline) {
  const size_t num_tokens = vocab.tokens.size();
  if (num_tokens == 0) return Status::invalid_argument("tokenizer vocab: no tokens");
  if (!vocab.scores.empty() && vocab.scores.size() != num_tokens) {
    return Status::invalid_argument("tokenizer vocab: {} scores for {} tokens", vocab.scores.size(),
                                    num_tokens);
  }
  if (!vocab.token_types.empty() && vocab.token_types.size() != num_tokens) {
    return Status::invalid_argument("tokenizer vocab: {} token types for {} tokens",
                                    vocab.token_types.size(), num_tokens);
  }
  KVP_RETURN_IF_ERROR(check_id(vocab, vocab.bos_id, "bos_token_id"));
  KVP_RETURN_IF_ERROR(check_id(vocab, vocab.eos_id, "eos_token_id"));
  KVP_RETURN_IF_ERROR(check_id(vocab, vocab.pad_id, "padding_token_id"));
  KVP_RETURN_IF_ERROR(check_id(vocab, vocab.unk_id, "unknown_token_id"));
  if (vocab.add_bos && !vocab.bos_id) {
    return Status::invalid_argument("tokenizer vocab: add_bos_token without bos_token_id");
  }
  if (vocab.add_eos && !vocab.eos_id) {
    return Status::invalid_argument("tokenizer vocab: add_eos_token without eos_token_id");
  }
  for (const AddedToken& added : pipeline.added_tokens) {
    if (added.id < 0 || static_cast<size_t>(added.id) >= num_tokens) {
      return Status::invalid_argument("tokenizer: added token '{}' has id {} outside [0, {})",
                                      added.content, added.id, num_tokens);
    }
    if (added.content.empty() || !utf8::is_valid(added.content)) {
      return Status::invalid_argument("tokenizer: added token {} is empty or not UTF-8", added.id);
    }
  }

  Tokenizer tok;
  KVP_ASSIGN_OR_RETURN(tok.pre_tokenizer_, PreTokenizer::create(pipeline));
  KVP_ASSIGN_OR_RETURN(tok.model_, BpeModel::create(vocab, pipeline));
  tok.decoder_ = Decoder(pipeline.decoder);
  tok.raw_added_ =
      AddedTokenMatcher(pipeline.added_tokens, [](const AddedToken& t) { return !t.normalized; });
  // As HF does, a normalized added token is looked for as its normalized content (with a
  // Prepend normalizer, "\t" is found as "▁\t", i.e. only where the prefix was added).
  std::vector<AddedToken> normalized_tokens;
  for (const AddedToken& added : pipeline.added_tokens) {
    if (!added.normalized) continue;
    normalized_tokens.push_back(added);
    normalized_tokens.back().content = tok.pre_tokenizer_.normalize(added.content);
  }
  // HF also decodes such a token as its normalized content.
  tok.decode_text_ = vocab.tokens;
  for (const AddedToken& added : normalized_tokens) tok.decode_text_[added.id] = added.content;
  tok.normalized_added_ =
      AddedTokenMatcher(normalized_tokens, [](const AddedToken&) { return true; });
  tok.special_.assign(num_tokens, false);
  for (const AddedToken& added : pipeline.added_tokens) tok.special_[added.id] = added.special;
  tok.vocab_ = std::move(vocab);
  tok.pipeline_ = std::move(pipeline);
  return tok;
}

Result<Tokenizer> Tokenizer::from_tokenizer_json(const std::string& path) {
  KVP_ASSIGN_OR_RETURN(TokenizerJson json, load_tokenizer_json(path));
  return create(std::move(json.vocab), std::move(json.pipeline));
}

Result<Tokenizer> Tokenizer::from_gguf_vocab(TokenizerVocab vocab) {
  KVP_ASSIGN_OR_RETURN(TokenizerPipeline pipeline, pipeline_for_gguf(vocab));
  return create(std::move(vocab), std::move(pipeline));
}

std::optional<TokenId> Tokenizer::token_id(std::string_view token) const {
  for (const AddedToken& added : pipeline_.added_tokens) {
    if (added.content == token) return added.id;
  }
  return model_.find(token);
}

bool Tokenizer::is_special(TokenId id) const {
  return id >= 0 && static_cast<size_t>(id) < special_.size() && special_[id];
}

Status Tokenizer::encode_stretch(std::string_view text, size_t offset, bool parse_special,
                                 std::vector<TokenId>* out) const {
  if (text.empty()) return Status::ok();
  const std::string normalized = pre_tokenizer_.normalize(text);
  std::vector<TextPiece> pieces;
  size_t pos = 0;
  // Normalized added tokens split the normalized stretch; the rest is pre-tokenized.
  for (const auto& match : normalized_added_.find_all(normalized, parse_special)) {
    KVP_RETURN_IF_ERROR(pre_tokenizer_.split(
        std::string_view(normalized).substr(pos, match.begin - pos), offset + pos, &pieces));
    for (const TextPiece& piece : pieces) model_.encode(piece.text, out);
    pieces.clear();
    out->push_back(match.id);
    pos = match.end;
  }
  KVP_RETURN_IF_ERROR(
      pre_tokenizer_.split(std::string_view(normalized).substr(pos), offset + pos, &pieces));
  for (const TextPiece& piece : pieces) model_.encode(piece.text, out);
  return Status::ok();
}

Result<std::vector<TokenId>> Tokenizer::encode(std::string_view text, EncodeOptions options) const {
  if (auto bad = utf8::first_invalid(text)) {
    return Status::invalid_argument("tokenizer input: not valid UTF-8 at byte {} of {}", *bad,
                                    text.size());
  }
  std::vector<TokenId> ids;
  if (options.add_special_tokens && vocab_.add_bos) ids.push_back(*vocab_.bos_id);
  size_t pos = 0;
  for (const auto& match : raw_added_.find_all(text, options.parse_special)) {
    KVP_RETURN_IF_ERROR(
        encode_stretch(text.substr(pos, match.begin - pos), pos, options.parse_special, &ids));
    ids.push_back(match.id);
    pos = match.end;
  }
  KVP_RETURN_IF_ERROR(encode_stretch(text.substr(pos), pos, options.parse_special, &ids));
  if (options.add_special_tokens && vocab_.add_eos) ids.push_back(*vocab_.eos_id);
  return ids;
}

Result<std::string> Tokenizer::decode(std::span<const TokenId> ids, bool skip_special) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!is_valid_id(ids[i])) {
      return Status::invalid_argument("decode: token id {} at position {} is not in the vocab",
                                      ids[i], i);
    }
    if (skip_special && special_[ids[i]]) continue;
    tokens.push_back(decode_text_[ids[i]]);
  }
  return decoder_.decode(std::move(tokens));
}

}  // namespace kvp

// Tokenizer: text to token ids and back, for byte-level BPE (GPT-2, Llama 3, SmolLM2, Qwen2) and
// SentencePiece-style BPE (Llama 2, Gemma) vocabularies, matching Hugging Face `tokenizers` on
// the same tokenizer.json (tests/tokenizer/ checks it on a multilingual corpus).
//
// Encoding: added tokens are found first (leftmost-longest; non-normalized ones in the raw text,
// normalized ones in each normalized stretch), the stretches between them are normalized and
// pre-tokenized (PCRE2 regexes), each piece is BPE-encoded, then BOS/EOS are added if the vocab
// says so. An immutable Tokenizer may be used from many threads at once.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/decoder.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/vocab.h"

namespace kvp {

struct EncodeOptions {
  bool add_special_tokens = true;  // BOS/EOS as vocab.add_bos / vocab.add_eos say
  bool parse_special = true;  // match special added tokens in the text; false: encode their text
                              // as ordinary text (for untrusted input)
};

class Tokenizer {
 public:
  // Validates the vocab and pipeline. Errors name the field: kInvalidArgument for inconsistent
  // sizes or ids out of range, kCorruption for merges of unknown tokens, kInvalidArgument for a
  // regex PCRE2 refuses.
  static Result<Tokenizer> create(TokenizerVocab vocab, TokenizerPipeline pipeline);
  // load_tokenizer_json() + create().
  static Result<Tokenizer> from_tokenizer_json(const std::string& path);
  // pipeline_for_gguf() + create(): what the GGUF reader calls with the vocab it filled.
  static Result<Tokenizer> from_gguf_vocab(TokenizerVocab vocab);

  // Errors: kInvalidArgument if `text` is not valid UTF-8 (naming the byte offset).
  Result<std::vector<TokenId>> encode(std::string_view text, EncodeOptions options = {}) const;

  // Text of `ids` as HF's decode(ids, skip_special_tokens) gives it. Errors: kInvalidArgument
  // for an id outside the vocabulary.
  Result<std::string> decode(std::span<const TokenId> ids, bool skip_special = false) const;

  size_t num_tokens() const { return vocab_.tokens.size(); }
  const TokenizerVocab& vocab() const { return vocab_; }
  const TokenizerPipeline& pipeline() const { return pipeline_; }
  // The id whose text is exactly `token` (vocabulary or added token).
  std::optional<TokenId> token_id(std::string_view token) const;
  bool is_special(TokenId id) const;
  bool is_valid_id(TokenId id) const {
    return id >= 0 && static_cast<size_t>(id) < vocab_.tokens.size() && !vocab_.tokens[id].empty();
  }
  const Decoder& decoder() const { return decoder_; }
  // The text decode() gives the decoder for `id`: the vocab token, or for a normalized added
  // token its normalized content, as HF does. requires: is_valid_id(id)
  const std::string& decode_text(TokenId id) const { return decode_text_[id]; }

 private:
  Tokenizer() = default;
  // Encodes one stretch of text that holds no non-normalized added token.
  Status encode_stretch(std::string_view text, size_t offset, bool parse_special,
                        std::vector<TokenId>* out) const;

  TokenizerVocab vocab_;
  TokenizerPipeline pipeline_;
  PreTokenizer pre_tokenizer_;
  BpeModel model_;
  Decoder decoder_;
  AddedTokenMatcher raw_added_;           // added tokens with normalized == false
  AddedTokenMatcher normalized_added_;    // added tokens with normalized == true
  std::vector<bool> special_;             // [num_tokens] special added tokens
  std::vector<std::string> decode_text_;  // [num_tokens] see decode_text()
};

}  // namespace kvp

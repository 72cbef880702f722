// Normalization and pre-tokenization: turning a stretch of text between added tokens into the
// pieces the BPE model encodes one by one, following HF tokenizers' semantics for the steps in
// TokenizerPipeline. Built once by Tokenizer::create(); running it does not modify it.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "tokenizer/regex.h"
#include "tokenizer/vocab.h"

namespace kvp {

// The GPT-2 byte-to-character table: byte b is spelled byte_level_char(b) in byte-level
// vocabularies. Printable Latin-1 bytes map to themselves, the rest to U+0100 and up.
class ByteLevelAlphabet {
 public:
  static const ByteLevelAlphabet& get();
  const std::string& encode(uint8_t byte) const { return byte_to_utf8_[byte]; }
  // The byte spelled by code point `cp`, or -1 if `cp` is not in the alphabet.
  int decode(char32_t cp) const { return cp < char_to_byte_.size() ? char_to_byte_[cp] : -1; }

 private:
  ByteLevelAlphabet();
  std::array<std::string, 256> byte_to_utf8_;  // [256] UTF-8 of each byte's character
  std::array<int16_t, 324> char_to_byte_{};    // [max code point + 1]
};

// One pre-tokenized piece.
struct TextPiece {
  std::string text;
  size_t original_offset = 0;  // where its stretch of text began in the input (for "first")
};

class PreTokenizer {
 public:
  static Result<PreTokenizer> create(const TokenizerPipeline& pipeline);

  // Applies the normalizer steps to one stretch of text (HF normalizes each stretch between
  // added tokens on its own, so Prepend applies to each non-empty stretch).
  std::string normalize(std::string_view text) const;

  // Splits one normalized stretch into pieces and appends them to `out`.
  // requires: `text` is valid UTF-8.
  Status split(std::string_view text, size_t original_offset, std::vector<TextPiece>* out) const;

 private:
  struct Step {
    PreTokenizerStep spec;
    std::vector<Regex> regexes;  // kSplit: the pattern; kByteLevel with use_regex: GPT-2's
  };
  std::vector<NormalizerStep> normalizer_;  // [num_normalizer_steps] applied in order
  std::vector<Step> steps_;                 // [num_pre_tokenizer_steps] applied in order
};

}  // namespace kvp

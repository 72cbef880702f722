// Decoders: token strings back to text, following HF tokenizers' decoder steps.
//
// decode() is the batch form and matches HF exactly, including how it replaces invalid UTF-8
// with U+FFFD (ByteLevel: per maximal ill-formed subsequence; ByteFallback: one per byte of a
// group of byte tokens that is not valid UTF-8).
// token_bytes() is the streaming form used by IncrementalDetokenizer: the raw bytes one token
// contributes, before any UTF-8 validation, so a character split across tokens can be joined.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace kvp {

class Decoder {
 public:
  Decoder() = default;
  explicit Decoder(std::vector<DecoderStep> steps);

  // HF Decoder::decode: runs every step over the token list, then joins it. With no steps the
  // tokens are joined with " " (what HF does without a decoder).
  std::string decode(std::vector<std::string> tokens) const;

  // The bytes token number `index` of a stream contributes (Metaspace strips the first token's
  // leading space). Strip steps are not applied here: see leading_strip().
  std::string token_bytes(std::string_view token, size_t index) const;

  // Strip steps at the start of the text: at most `count` leading `content` characters.
  struct LeadingStrip {
    std::string content;
    int count = 0;
  };
  const std::vector<LeadingStrip>& leading_strips() const { return leading_strips_; }

 private:
  std::vector<DecoderStep> steps_;            // [num_steps] applied in order
  std::vector<LeadingStrip> leading_strips_;  // [num Strip steps with start > 0]
};

// True for the text of a byte-fallback token: "<0x" two upper-case hex digits ">".
bool is_byte_token_text(std::string_view token, uint8_t* byte);

}  // namespace kvp

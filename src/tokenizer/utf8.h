// UTF-8 helpers for the tokenizer: validation, code point iteration, and the lossy conversion
// (invalid bytes become U+FFFD) that decoders and the incremental detokenizer use.
// Everything here works on bytes; nothing allocates except the functions returning strings.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kvp::utf8 {

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// Length in bytes of the well-formed sequence starting at text[pos], or 0 if the bytes there
// are not a complete well-formed sequence (invalid, or cut off by the end of `text`).
// requires: pos < text.size()
size_t sequence_length(std::string_view text, size_t pos);

// True if `text` is entirely well-formed UTF-8 (no surrogates, no overlongs, <= U+10FFFF).
bool is_valid(std::string_view text);

// Byte offset of the first invalid byte, or nullopt if `text` is valid.
std::optional<size_t> first_invalid(std::string_view text);

// Appends the UTF-8 encoding of `code_point` (requires: a Unicode scalar value).
void append(std::string& out, char32_t code_point);

// Decodes the well-formed sequence at text[pos] (requires: sequence_length(text, pos) > 0).
char32_t decode_at(std::string_view text, size_t pos);

// Number of bytes at the end of `text` that are a proper prefix of a well-formed sequence
// (0..3): what a stream must hold back until more bytes arrive.
size_t incomplete_tail_length(std::string_view text);

// `text` with every maximal ill-formed subsequence replaced by U+FFFD (the Unicode "substitution
// of maximal subparts" practice, as Rust's String::from_utf8_lossy does).
std::string lossy(std::string_view text);

}  // namespace kvp::utf8

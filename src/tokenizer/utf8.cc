// UTF-8 helpers (see utf8.h).
#include "tokenizer/utf8.h"

#include "common/check.h"

namespace kvp::utf8 {
namespace {

// Length of the valid prefix of a sequence at text[pos]: how many bytes form a well-formed
// (possibly incomplete) start of one code point. Sets `expected` to the full length the lead
// byte announces (0 if the lead byte itself is invalid).
size_t valid_prefix(std::string_view text, size_t pos, size_t* expected) {
  const auto b0 = static_cast<uint8_t>(text[pos]);
  if (b0 < 0x80) {
    *expected = 1;
    return 1;
  }
  uint8_t lo = 0x80;
  uint8_t hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    *expected = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    *expected = 3;
    if (b0 == 0xE0) lo = 0xA0;  // no overlongs
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    *expected = 4;
    if (b0 == 0xF0) lo = 0x90;  // no overlongs
    if (b0 == 0xF4) hi = 0x8F;  // <= U+10FFFF
  } else {
    *expected = 0;
    return 0;
  }
  size_t n = 1;
  while (n < *expected && pos + n < text.size()) {
    const auto b = static_cast<uint8_t>(text[pos + n]);
    const uint8_t min = n == 1 ? lo : 0x80;
    const uint8_t max = n == 1 ? hi : 0xBF;
    if (b < min || b > max) break;
    ++n;
  }
  return n;
}

}  // namespace

size_t sequence_length(std::string_view text, size_t pos) {
  KVP_DCHECK(pos < text.size(), "pos {} past the end of {} bytes", pos, text.size());
  size_t expected = 0;
  const size_t n = valid_prefix(text, pos, &expected);
  return n == expected && n > 0 ? n : 0;
}

std::optional<size_t> first_invalid(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t n = sequence_length(text, pos);
    if (n == 0) return pos;
    pos += n;
  }
  return std::nullopt;
}

bool is_valid(std::string_view text) { return !first_invalid(text).has_value(); }

void append(std::string& out, char32_t cp) {
  KVP_DCHECK(cp <= 0x10FFFF && (cp < 0xD800 || cp > 0xDFFF), "not a scalar value: {}",
             static_cast<uint32_t>(cp));
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

char32_t decode_at(std::string_view text, size_t pos) {
  const size_t n = sequence_length(text, pos);
  KVP_DCHECK(n > 0, "no well-formed sequence at byte {}", pos);
  const auto b0 = static_cast<uint8_t>(text[pos]);
  if (n == 1) return b0;
  char32_t cp = b0 & (0x7F >> n);
  for (size_t i = 1; i < n; ++i) cp = (cp << 6) | (static_cast<uint8_t>(text[pos + i]) & 0x3F);
  return cp;
}

size_t incomplete_tail_length(std::string_view text) {
  // A proper prefix is at most 3 bytes long, so only the last 3 bytes can start one.
  const size_t begin = text.size() > 3 ? text.size() - 3 : 0;
  for (size_t pos = begin; pos < text.size(); ++pos) {
    const auto b = static_cast<uint8_t>(text[pos]);
    if (b < 0xC0) continue;  // ASCII or continuation: not a lead byte
    size_t expected = 0;
    const size_t n = valid_prefix(text, pos, &expected);
    if (expected > 0 && pos + n == text.size() && n < expected) return n;
  }
  return 0;
}

std::string lossy(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    size_t expected = 0;
    const size_t n = valid_prefix(text, pos, &expected);
    if (n == expected && n > 0) {
      out.append(text.substr(pos, n));
      pos += n;
    } else {
      // The maximal subpart is the valid prefix (at least the one bad byte).
      out.append(kReplacementChar);
      pos += n > 0 ? n : 1;
    }
  }
  return out;
}

}  // namespace kvp::utf8

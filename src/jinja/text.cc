#include "jinja/text.h"

#include <algorithm>

namespace kvp::jinja {

namespace {

// Invalid bytes decode to U+DC80..U+DCFF (Python's surrogateescape) and encode back.
constexpr uint32_t kEscapeBase = 0xDC00;

bool is_ascii_lower(uint32_t c) { return c >= 'a' && c <= 'z'; }
bool is_ascii_upper(uint32_t c) { return c >= 'A' && c <= 'Z'; }
uint32_t upper_cp(uint32_t c) { return is_ascii_lower(c) ? c - 32 : c; }
uint32_t lower_cp(uint32_t c) { return is_ascii_upper(c) ? c + 32 : c; }
bool is_cased(uint32_t c) { return is_ascii_lower(c) || is_ascii_upper(c); }

bool is_line_break(uint32_t c) {
  return c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e ||
         c == 0x85 || c == 0x2028 || c == 0x2029;
}

}  // namespace

std::vector<uint32_t> decode_utf8(std::string_view text) {
  std::vector<uint32_t> out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const auto b0 = static_cast<uint8_t>(text[i]);
    size_t num_bytes = 0;
    uint32_t cp = 0;
    if (b0 < 0x80) {
      num_bytes = 1;
      cp = b0;
    } else if ((b0 & 0xE0) == 0xC0 && b0 >= 0xC2) {
      num_bytes = 2;
      cp = b0 & 0x1F;
    } else if ((b0 & 0xF0) == 0xE0) {
      num_bytes = 3;
      cp = b0 & 0x0F;
    } else if ((b0 & 0xF8) == 0xF0 && b0 <= 0xF4) {
      num_bytes = 4;
      cp = b0 & 0x07;
    }
    bool valid = num_bytes > 0 && i + num_bytes <= text.size();
    for (size_t k = 1; valid && k < num_bytes; ++k) {
      const auto b = static_cast<uint8_t>(text[i + k]);
      if ((b & 0xC0) != 0x80) valid = false;
      cp = (cp << 6) | (b & 0x3F);
    }
    if (valid && num_bytes == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) valid = false;
    if (valid && num_bytes == 4 && (cp < 0x10000 || cp > 0x10FFFF)) valid = false;
    if (!valid) {
      out.push_back(kEscapeBase + b0);
      ++i;
      continue;
    }
    out.push_back(cp);
    i += num_bytes;
  }
  return out;
}

void append_utf8(uint32_t cp, std::string* out) {
  if (cp >= kEscapeBase + 0x80 && cp <= kEscapeBase + 0xFF) {
    out->push_back(static_cast<char>(cp - kEscapeBase));
  } else if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string encode_utf8(const std::vector<uint32_t>& code_points) {
  std::string out;
  out.reserve(code_points.size());
  for (uint32_t cp : code_points) append_utf8(cp, &out);
  return out;
}

size_t count_code_points(std::string_view text) { return decode_utf8(text).size(); }

bool is_space(uint32_t c) {
  return c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f) || c == 0x85 ||
         c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
         c == 0x202f || c == 0x205f || c == 0x3000;
}

std::string to_upper(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(upper_cp(static_cast<uint8_t>(c)));
  return out;
}

std::string to_lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(lower_cp(static_cast<uint8_t>(c)));
  return out;
}

std::string capitalize(std::string_view text) {
  std::string out = to_lower(text);
  if (!out.empty()) out[0] = static_cast<char>(upper_cp(static_cast<uint8_t>(out[0])));
  return out;
}

std::string python_title(std::string_view text) {
  std::string out(text);
  bool previous_cased = false;
  for (char& ch : out) {
    const uint32_t c = static_cast<uint8_t>(ch);
    if (is_cased(c)) {
      ch = static_cast<char>(previous_cased ? lower_cp(c) : upper_cp(c));
      previous_cased = true;
    } else {
      previous_cased = false;
    }
  }
  return out;
}

std::string jinja_title(std::string_view text) {
  const std::vector<uint32_t> cps = decode_utf8(text);
  std::string out;
  bool word_start = true;
  for (uint32_t c : cps) {
    const bool separator = is_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    if (separator) {
      word_start = true;
      append_utf8(c, &out);
    } else {
      append_utf8(word_start ? upper_cp(c) : lower_cp(c), &out);
      word_start = false;
    }
  }
  return out;
}

std::string strip(std::string_view text, const std::optional<std::string>& chars, bool left,
                  bool right) {
  const std::vector<uint32_t> cps = decode_utf8(text);
  std::vector<uint32_t> set;
  if (chars) set = decode_utf8(*chars);
  auto strippable = [&](uint32_t c) {
    return chars ? std::find(set.begin(), set.end(), c) != set.end() : is_space(c);
  };
  size_t begin = 0;
  size_t end = cps.size();
  if (left) {
    while (begin < end && strippable(cps[begin])) ++begin;
  }
  if (right) {
    while (end > begin && strippable(cps[end - 1])) --end;
  }
  return encode_utf8(std::vector<uint32_t>(cps.begin() + begin, cps.begin() + end));
}

std::vector<std::string> split(std::string_view text, const std::optional<std::string>& sep,
                               int64_t max_splits) {
  std::vector<std::string> parts;
  if (sep) {
    size_t start = 0;
    while (max_splits < 0 || static_cast<int64_t>(parts.size()) < max_splits) {
      const size_t at = text.find(*sep, start);
      if (at == std::string_view::npos) break;
      parts.emplace_back(text.substr(start, at - start));
      start = at + sep->size();
    }
    parts.emplace_back(text.substr(start));
    return parts;
  }
  const std::vector<uint32_t> cps = decode_utf8(text);
  size_t i = 0;
  while (true) {
    while (i < cps.size() && is_space(cps[i])) ++i;
    if (i == cps.size()) break;
    if (max_splits >= 0 && static_cast<int64_t>(parts.size()) == max_splits) {
      parts.push_back(encode_utf8(std::vector<uint32_t>(cps.begin() + i, cps.end())));
      break;
    }
    size_t j = i;
    while (j < cps.size() && !is_space(cps[j])) ++j;
    parts.push_back(encode_utf8(std::vector<uint32_t>(cps.begin() + i, cps.begin() + j)));
    i = j;
  }
  return parts;
}

std::vector<std::string> rsplit(std::string_view text, const std::optional<std::string>& sep,
                                int64_t max_splits) {
  if (max_splits < 0) return split(text, sep, max_splits);
  std::vector<std::string> parts;
  if (sep) {
    size_t end = text.size();
    while (static_cast<int64_t>(parts.size()) < max_splits) {
      if (end < sep->size()) break;
      const size_t at = text.rfind(*sep, end - sep->size());
      if (at == std::string_view::npos) break;
      parts.emplace_back(text.substr(at + sep->size(), end - at - sep->size()));
      end = at;
    }
    parts.emplace_back(text.substr(0, end));
    std::reverse(parts.begin(), parts.end());
    return parts;
  }
  const std::vector<uint32_t> cps = decode_utf8(text);
  size_t j = cps.size();
  while (true) {
    while (j > 0 && is_space(cps[j - 1])) --j;
    if (j == 0) break;
    if (static_cast<int64_t>(parts.size()) == max_splits) {
      parts.push_back(encode_utf8(std::vector<uint32_t>(cps.begin(), cps.begin() + j)));
      break;
    }
    size_t i = j;
    while (i > 0 && !is_space(cps[i - 1])) --i;
    parts.push_back(encode_utf8(std::vector<uint32_t>(cps.begin() + i, cps.begin() + j)));
    j = i;
  }
  std::reverse(parts.begin(), parts.end());
  return parts;
}

std::vector<std::string> split_lines(std::string_view text) {
  const std::vector<uint32_t> cps = decode_utf8(text);
  std::vector<std::string> lines;
  std::string current;
  for (size_t i = 0; i < cps.size(); ++i) {
    if (!is_line_break(cps[i])) {
      append_utf8(cps[i], &current);
      continue;
    }
    if (cps[i] == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') ++i;
    lines.push_back(std::move(current));
    current.clear();
  }
  if (!current.empty()) lines.push_back(std::move(current));
  return lines;
}

std::optional<std::string> replace(std::string_view text, std::string_view from,
                                   std::string_view to, int64_t count, size_t max_bytes) {
  std::string out;
  if (from.empty()) {
    const std::vector<uint32_t> cps = decode_utf8(text);
    int64_t done = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      if (i < cps.size()) append_utf8(cps[i], &out);
      if (out.size() > max_bytes) return std::nullopt;
    }
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t at = text.find(from, start);
    if (at == std::string_view::npos) break;
    out.append(text.substr(start, at - start));
    out.append(to);
    if (out.size() > max_bytes) return std::nullopt;
    start = at + from.size();
    ++done;
  }
  out.append(text.substr(start));
  if (out.size() > max_bytes) return std::nullopt;
  return out;
}

int64_t count_occurrences(std::string_view text, std::string_view needle) {
  if (needle.empty()) return static_cast<int64_t>(count_code_points(text)) + 1;
  int64_t count = 0;
  for (size_t at = text.find(needle); at != std::string_view::npos;
       at = text.find(needle, at + needle.size())) {
    ++count;
  }
  return count;
}

int64_t find_code_point(std::string_view text, std::string_view needle, bool reverse) {
  const size_t at = reverse ? text.rfind(needle) : text.find(needle);
  if (at == std::string_view::npos) return -1;
  return static_cast<int64_t>(count_code_points(text.substr(0, at)));
}

std::string html_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

}  // namespace kvp::jinja

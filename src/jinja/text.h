// Text helpers for the Jinja interpreter: UTF-8 code points (Python strings index, slice and
// measure by code point) and the Python str methods that templates call (strip, split, title,
// ...). Case mapping covers ASCII only; other code points pass through unchanged.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvp::jinja {

// Code points of UTF-8 text; an invalid byte decodes to itself (as U+0080..U+00FF would not),
// so text round-trips byte for byte through encode_utf8.
std::vector<uint32_t> decode_utf8(std::string_view text);
void append_utf8(uint32_t code_point, std::string* out);
std::string encode_utf8(const std::vector<uint32_t>& code_points);
size_t count_code_points(std::string_view text);

// Python's str.isspace() for one code point (ASCII and the common Unicode spaces).
bool is_space(uint32_t code_point);

std::string to_upper(std::string_view text);
std::string to_lower(std::string_view text);
// str.capitalize(): first character upper, the rest lower.
std::string capitalize(std::string_view text);
// str.title(): a letter after a non-letter is upper, other letters lower.
std::string python_title(std::string_view text);
// jinja2's title filter: words split at whitespace and -([{<; first character upper, rest lower.
std::string jinja_title(std::string_view text);

// str.strip/lstrip/rstrip(chars): chars == nullopt strips whitespace.
std::string strip(std::string_view text, const std::optional<std::string>& chars, bool left,
                  bool right);
// str.split(sep, maxsplit): sep == nullopt splits at runs of whitespace and drops empties.
std::vector<std::string> split(std::string_view text, const std::optional<std::string>& sep,
                               int64_t max_splits);
std::vector<std::string> rsplit(std::string_view text, const std::optional<std::string>& sep,
                                int64_t max_splits);
// str.splitlines(keepends=False).
std::vector<std::string> split_lines(std::string_view text);
// str.replace(old, new, count); count < 0 replaces all. nullopt when the result would pass
// max_bytes (it is not built).
std::optional<std::string> replace(std::string_view text, std::string_view from,
                                   std::string_view to, int64_t count, size_t max_bytes);
// Non-overlapping occurrences (str.count); an empty needle counts code points + 1.
int64_t count_occurrences(std::string_view text, std::string_view needle);
// str.find as a code point index, or -1.
int64_t find_code_point(std::string_view text, std::string_view needle, bool reverse);

// HTML escaping as markupsafe.escape: & < > " '.
std::string html_escape(std::string_view text);

}  // namespace kvp::jinja

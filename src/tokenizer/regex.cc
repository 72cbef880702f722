// PCRE2 wrapper (see regex.h).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

namespace kvp {
namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  const int n = pcre2_get_error_message(code, buffer, sizeof(buffer));
  return n < 0 ? fmt::format("PCRE2 error {}", code)
               : std::string(reinterpret_cast<const char*>(buffer), static_cast<size_t>(n));
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};

}  // namespace

void Regex::CodeDeleter::operator()(void* code) const {
  pcre2_code_free(static_cast<pcre2_code*>(code));
}

Result<Regex> Regex::compile(std::string_view pattern, bool literal) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  // PCRE2_LITERAL refuses PCRE2_UCP (it has no character classes to apply it to).
  const uint32_t options = literal ? PCRE2_UTF | PCRE2_LITERAL : PCRE2_UTF | PCRE2_UCP;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   options, &error_code, &error_offset, /*ccontext=*/nullptr);
  if (code == nullptr) {
    return Status::invalid_argument("regex '{}': {} at offset {}", pattern,
                                    pcre2_message(error_code), error_offset);
  }
  // JIT is an optimisation: where it is unavailable the interpreter gives the same matches.
  (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  Regex regex;
  regex.pattern_ = std::string(pattern);
  regex.code_.reset(code);
  return regex;
}

Result<std::vector<std::pair<size_t, size_t>>> Regex::find_all(std::string_view subject) const {
  auto* code = static_cast<pcre2_code*>(code_.get());
  KVP_CHECK(code != nullptr, "find_all on a moved-from Regex");
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> data(
      pcre2_match_data_create_from_pattern(code, nullptr));
  std::vector<std::pair<size_t, size_t>> matches;
  const auto* bytes = reinterpret_cast<PCRE2_SPTR>(subject.data());
  size_t offset = 0;
  while (offset <= subject.size()) {
    const int rc = pcre2_match(code, bytes, subject.size(), offset, PCRE2_NO_UTF_CHECK, data.get(),
                               /*mcontext=*/nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      return Status::internal("regex '{}': matching failed: {}", pattern_, pcre2_message(rc));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data.get());
    const size_t begin = ovector[0];
    const size_t end = ovector[1];
    if (end > begin) {
      matches.emplace_back(begin, end);
      offset = end;
    } else {
      // Empty match: step over one whole UTF-8 character.
      offset = end + 1;
      while (offset < subject.size() && (static_cast<uint8_t>(subject[offset]) & 0xC0) == 0x80) {
        ++offset;
      }
    }
  }
  return matches;
}

}  // namespace kvp

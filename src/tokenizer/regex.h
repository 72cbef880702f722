// A compiled PCRE2 pattern (UTF-8, Unicode properties for \s \w \d, JIT when available), used by
// the pre-tokenizer. Matching never modifies the Regex, so one may be shared across threads.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace kvp {

class Regex {
 public:
  // `literal`: match `pattern` as plain text. Errors: kInvalidArgument naming the pattern and
  // PCRE2's message with the offset.
  static Result<Regex> compile(std::string_view pattern, bool literal = false);

  // All non-overlapping matches in `subject`, left to right, as [begin, end) byte offsets.
  // An empty match advances by one character. requires: `subject` is valid UTF-8.
  Result<std::vector<std::pair<size_t, size_t>>> find_all(std::string_view subject) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct CodeDeleter {
    void operator()(void* code) const;
  };
  std::string pattern_;
  std::unique_ptr<void, CodeDeleter> code_;  // pcre2_code_8*
};

}  // namespace kvp

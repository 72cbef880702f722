// Assertions for broken invariants (programming errors, never user input).
//   KVP_CHECK(cond, fmt, args...)  always on; prints file:line and the message, then aborts.
//   KVP_DCHECK(cond, fmt, args...) for hot paths; on when KVP_ENABLE_DCHECK (asan preset, tests
//                                  of bookkeeping), compiled out otherwise.
// User input errors are never checked with these: they return a Status (status.h).
#pragma once

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>

namespace kvp::detail {

[[noreturn]] inline void check_failed(const char* file, int line, const char* cond,
                                      const std::string& message) {
  std::fprintf(stderr, "%s:%d: KVP_CHECK(%s) failed: %s\n", file, line, cond, message.c_str());
  std::fflush(stderr);
  std::abort();
}

inline std::string check_message() { return {}; }
template <typename... Args>
std::string check_message(fmt::format_string<Args...> f, Args&&... args) {
  return fmt::format(f, std::forward<Args>(args)...);
}

}  // namespace kvp::detail

#define KVP_CHECK(cond, ...)                                                  \
  do {                                                                        \
    if (!(cond)) [[unlikely]] {                                               \
      ::kvp::detail::check_failed(__FILE__, __LINE__, #cond,                  \
                                  ::kvp::detail::check_message(__VA_ARGS__)); \
    }                                                                         \
  } while (0)

#if defined(KVP_ENABLE_DCHECK)
#define KVP_DCHECK(cond, ...) KVP_CHECK(cond, __VA_ARGS__)
#else
#define KVP_DCHECK(cond, ...) \
  do {                        \
  } while (0)
#endif

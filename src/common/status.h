// Status and Result<T>: failures at the boundary (files, user options, requests, cache files).
// A Status names the thing and the reason: Status::corruption("cache file 'a.kvc': checksum ...").
// Library code returns these; only main() decides to exit.
#pragma once

#include <fmt/format.h>

#include <optional>
#include <string>
#include <utility>
#include <variant>

#include "common/check.h"

namespace kvp {

enum class StatusCode {
  kOk,
  kInvalidArgument,  // a caller's argument or option is wrong
  kNotFound,         // a named thing (file, session, tensor) does not exist
  kCorruption,       // a file's bytes are not what its format promises
  kUnsupported,      // valid, but kvpool does not do it (architecture, dtype, version)
  kMismatch,         // valid, but made for something else (another model, another geometry)
  kResourceExhausted,
  kIoError,
  kInternal,
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // ok
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return {}; }
  template <typename... A>
  static Status invalid_argument(fmt::format_string<A...> f, A&&... a) {
    return {StatusCode::kInvalidArgument, fmt::format(f, std::forward<A>(a)...)};
  }
  template <typename... A>
  static Status not_found(fmt::format_string<A...> f, A&&... a) {
    return {StatusCode::kNotFound, fmt::format(f, std::forward<A>(a)...)};
  }
  template <typename... A>
  static Status corruption(fmt::format_string<A...> f, A&&... a) {
    return {StatusCode::kCorruption, fmt::format(f, std::forward<A>(a)...)};
  }
  template <typename... A>
  static Status unsupported(fmt::format_string<A...> f, A&&... a) {
    return {StatusCode::kUnsupported, fmt::format(f, std::forward<A>(a)...)};
  }
  template <typename... A>
  static Status mismatch(fmt::format_string<A...> f, A&&... a) {
    return {StatusCode::kMismatch, fmt::format(f, std::forward<A>(a)...)};
  }
  template <typename... A>
  static Status resource_exhausted(fmt::format_string<A...> f, A&&... a) {
    return {StatusCode::kResourceExhausted, fmt::format(f, std::forward<A>(a)...)};
  }
  template <typename... A>
  static Status io_error(fmt::format_string<A...> f, A&&... a) {
    return {StatusCode::kIoError, fmt::format(f, std::forward<A>(a)...)};
  }
  template <typename... A>
  static Status internal(fmt::format_string<A...> f, A&&... a) {
    return {StatusCode::kInternal, fmt::format(f, std::forward<A>(a)...)};
  }

  bool is_ok() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "corruption: cache file 'a.kvc': checksum mismatch"
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Result<T>: a value or a non-ok Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : data_(std::move(value)) {}        // NOLINT(google-explicit-constructor)
  Result(Status status) : data_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    KVP_CHECK(!std::get<Status>(data_).is_ok(), "Result built from an ok Status carries no value");
  }

  bool is_ok() const { return std::holds_alternative<T>(data_); }
  explicit operator bool() const { return is_ok(); }
  const Status& status() const {
    static const Status kOk;
    return is_ok() ? kOk : std::get<Status>(data_);
  }
  T& value() & {
    KVP_CHECK(is_ok(), "value() of a failed Result: {}", std::get<Status>(data_).to_string());
    return std::get<T>(data_);
  }
  const T& value() const& {
    KVP_CHECK(is_ok(), "value() of a failed Result: {}", std::get<Status>(data_).to_string());
    return std::get<T>(data_);
  }
  T&& value() && {
    KVP_CHECK(is_ok(), "value() of a failed Result: {}", std::get<Status>(data_).to_string());
    return std::get<T>(std::move(data_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> data_;
};

}  // namespace kvp

#define KVP_CONCAT_INNER(a, b) a##b
#define KVP_CONCAT(a, b) KVP_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function if `expr` is not ok.
#define KVP_RETURN_IF_ERROR(expr)                 \
  do {                                            \
    ::kvp::Status kvp_status_ = (expr);           \
    if (!kvp_status_.is_ok()) return kvp_status_; \
  } while (0)

// KVP_ASSIGN_OR_RETURN(auto x, make_x()): binds the value or returns the Status.
#define KVP_ASSIGN_OR_RETURN(lhs, expr) \
  KVP_ASSIGN_OR_RETURN_IMPL(KVP_CONCAT(kvp_result_, __LINE__), lhs, expr)
#define KVP_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.is_ok()) return tmp.status();          \
  lhs = std::move(tmp).value()

// ApiError: every error the server answers with, as an HTTP status and OpenAI's error object
//   {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
// Handlers and the HTTP layer build one of these (from a Status or for a named case) and hand
// it to error_json(); no endpoint writes an error body of its own.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "common/status.h"

namespace kvp::server {

struct ApiError {
  int http_status = 500;
  std::string type;       // invalid_request_error, authentication_error, not_found_error, ...
  std::string message;    // names the thing and the reason
  std::string param;      // the request field at fault ("" when none)
  std::string code;       // a short machine-readable reason ("" when none)
  int retry_after_s = 0;  // > 0: a Retry-After header (429, 503)

  // 400 naming the parameter.
  static ApiError bad_request(std::string param, std::string message);
  static ApiError unauthorized(std::string message);
  static ApiError not_found(std::string message);
  static ApiError payload_too_large(std::string message);
  static ApiError too_many_requests(std::string message, int retry_after_s);
  static ApiError unavailable(std::string message);
  static ApiError internal(std::string message);
  // From a Status: invalid_argument, mismatch, corruption, unsupported → 400; not_found → 404;
  // resource_exhausted → 429; io_error and internal → 500.
  static ApiError from_status(const Status& status, std::string param = "");
};

// The OpenAI error object of `error`.
nlohmann::json error_json(const ApiError& error);

}  // namespace kvp::server

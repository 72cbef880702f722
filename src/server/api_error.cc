#include "server/api_error.h"

namespace kvp::server {

ApiError ApiError::bad_request(std::string param, std::string message) {
  return {400, "invalid_request_error", std::move(message), std::move(param), "", 0};
}
ApiError ApiError::unauthorized(std::string message) {
  return {401, "authentication_error", std::move(message), "", "invalid_api_key", 0};
}
ApiError ApiError::not_found(std::string message) {
  return {404, "not_found_error", std::move(message), "", "not_found", 0};
}
ApiError ApiError::payload_too_large(std::string message) {
  return {413, "invalid_request_error", std::move(message), "", "payload_too_large", 0};
}
ApiError ApiError::too_many_requests(std::string message, int retry_after_s) {
  return {429, "rate_limit_error", std::move(message), "", "queue_full", retry_after_s};
}
ApiError ApiError::unavailable(std::string message) {
  return {503, "service_unavailable", std::move(message), "", "shutting_down", 1};
}
ApiError ApiError::internal(std::string message) {
  return {500, "internal_error", std::move(message), "", "", 0};
}

ApiError ApiError::from_status(const Status& status, std::string param) {
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kMismatch:
    case StatusCode::kCorruption:
    case StatusCode::kUnsupported:
      return bad_request(std::move(param), status.message());
    case StatusCode::kNotFound:
      return not_found(status.message());
    case StatusCode::kResourceExhausted:
      return too_many_requests(status.message(), 1);
    default:
      return internal(status.to_string());
  }
}

nlohmann::json error_json(const ApiError& error) {
  nlohmann::json body = {
      {"message", error.message},
      {"type", error.type},
      {"param", error.param.empty() ? nlohmann::json() : nlohmann::json(error.param)},
      {"code", error.code.empty() ? nlohmann::json() : nlohmann::json(error.code)}};
  return {{"error", body}};
}

}  // namespace kvp::server

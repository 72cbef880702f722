// The OpenAI wire types the server takes: a /v1/chat/completions or /v1/completions body parsed
// and validated into a GenerationRequest, with every error naming its `param` (the field) and
// the reason. No engine, no socket: JSON in, a validated struct or an ApiError out.
//
//   body (JSON) ─▶ parse_generation_request ─▶ GenerationRequest ─▶ handlers (generation.h)
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "engine/sampler.h"
#include "server/api_error.h"

namespace kvp::server {

// Limits on what one request may ask for (each refusal names the limit).
struct RequestLimits {
  int32_t max_n = 16;             // parallel samples
  int32_t max_stop_strings = 16;  // and each at most max_stop_bytes
  int32_t max_stop_bytes = 256;
  int32_t max_messages = 4096;
  int32_t max_tools = 256;
  int32_t max_session_id_bytes = 128;
  // Arrays and objects nested in a body, or in a tool call's arguments text (tool schemas nest
  // a few levels); deeper ones are refused before they are parsed, as JSON's own functions
  // (dump, copy, ==) recurse once per level.
  int32_t max_json_depth = 64;
};

struct GenerationRequest {
  bool chat = true;  // /v1/chat/completions (else /v1/completions)
  std::string model;
  // chat: the messages, tools and template variables for the chat template
  nlohmann::ordered_json messages;
  nlohmann::ordered_json tools;  // null or an array
  nlohmann::ordered_json tool_choice;
  bool parallel_tool_calls = true;
  nlohmann::ordered_json chat_template_kwargs = nlohmann::ordered_json::object();
  // completions: a text, or token ids
  std::variant<std::string, std::vector<int32_t>> prompt;
  bool echo = false;

  std::optional<int32_t> max_tokens;  // none: up to the model's context
  int32_t min_tokens = 0;
  int32_t n = 1;
  SamplingParams sampling;  // temperature, top_p, top_k, min_p, penalties, seed, logprobs
  bool logprobs = false;    // chat: logprobs true; completions: logprobs >= 0
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  bool skip_special_tokens = true;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  std::string user;
  std::optional<std::string> session_id;  // kvpool's extension (or the X-Session-Id header)
};

// A request body as JSON. 400 errors: not valid JSON (naming the parse error), not an object,
// or arrays and objects nested deeper than limits.max_json_depth (naming the limit).
std::variant<nlohmann::json, ApiError> parse_request_body(std::string_view text,
                                                          const RequestLimits& limits);

// Parses a body of /v1/chat/completions (chat) or /v1/completions. Unknown fields are ignored,
// as OpenAI's server does; known fields of the wrong type or out of range are a 400 naming the
// field.
std::variant<GenerationRequest, ApiError> parse_generation_request(const nlohmann::json& body,
                                                                   bool chat,
                                                                   const RequestLimits& limits);

// The ids of a /detokenize body ({"tokens": [ids]}); each must lie in [0, vocab_size). A 400
// naming the first id that does not.
std::variant<std::vector<int32_t>, ApiError> parse_detokenize_request(const nlohmann::json& body,
                                                                      int64_t vocab_size);

// A session id names a file under --session-dir: 1..128 characters of [A-Za-z0-9_.-], not
// starting with '.'. invalid_argument naming the id otherwise.
Status validate_session_id(const std::string& id, int32_t max_bytes = 128);

}  // namespace kvp::server

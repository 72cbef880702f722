// Generation: one /v1/chat/completions or /v1/completions request, from a validated
// GenerationRequest to OpenAI responses, without a socket (the HTTP layer polls it).
//
//   GenerationRequest ─▶ chat template / tokenizer ─▶ EngineFront::submit ─▶ RequestStream
//   poll_stream():   engine events ─▶ per-sample text (detokenized, stop strings cut, tool calls
//                    parsed) ─▶ SSE payloads: one chunk per token, the finish chunk, the usage
//                    chunk (stream_options.include_usage), "[DONE]"
//   poll_response(): the same state, one response object at the end
// A Generation that is destroyed before its request finished cancels it (a client that went
// away), so its blocks return to the pool.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "engine/engine_front.h"
#include "server/api_error.h"
#include "server/chat_template.h"
#include "server/openai_api.h"
#include "server/server_metrics.h"
#include "server/tool_calls.h"
#include "tokenizer/tokenizer.h"

namespace kvp::server {

// What every request of a server shares. Not owned; outlives the generations.
struct ServerContext {
  EngineFront* engine = nullptr;
  const Tokenizer* tokenizer = nullptr;
  const ChatTemplate* chat_template = nullptr;  // null: chat requests are refused
  ToolCallFormat tool_call_format = ToolCallFormat::kNone;
  IdSource* ids = nullptr;
  ServerMetrics* metrics = nullptr;  // may be null
  std::string model_name;
  int32_t context_length = 0;  // the model's; 0: unknown
  int32_t pool_tokens = 0;     // tokens the KV pool holds (group 0)
  std::vector<int32_t> eos_token_ids;
  RequestLimits limits;
  bool log_requests = true;  // one line per request on stderr
};

// Renders a chat request's messages (with tools and template kwargs) through the model's chat
// template; the text the model is prompted with.
std::variant<std::string, ApiError> render_chat_prompt(const ServerContext& context,
                                                       const GenerationRequest& request);

// The prompt's token ids: the rendered chat text (its special tokens as written), or the
// completion's text (with the model's BOS) or ids.
std::variant<std::vector<int32_t>, ApiError> prompt_token_ids(const ServerContext& context,
                                                              const GenerationRequest& request);

class Generation {
 public:
  // Tokenizes and submits. engine_session: the engine's name of the request's session (its
  // owner's namespace included), if any. Errors: the prompt (over the context: 400 naming both
  // numbers), the engine's refusal.
  static std::variant<std::unique_ptr<Generation>, ApiError> start(
      const ServerContext& context, GenerationRequest request,
      std::optional<std::string> engine_session);
  ~Generation();
  Generation(const Generation&) = delete;
  Generation& operator=(const Generation&) = delete;

  // Waits up to `wait` for engine events and appends the SSE payloads they make to *out (JSON
  // texts, then "[DONE]" last). Returns false once the last payload was appended.
  bool poll_stream(std::chrono::milliseconds wait, std::vector<std::string>* out);
  // Waits up to `wait`; once the request has finished, sets *response and returns true.
  bool poll_response(std::chrono::milliseconds wait, nlohmann::json* response);
  // Cancels the request (its stream then ends with finish_reason "abort").
  void cancel();
  // The client went away: cancels the request and waits (up to `wait`) for the engine to end
  // it, so it is logged and counted like any other.
  void abandon(std::chrono::milliseconds wait);
  const std::string& id() const { return id_; }
  RequestId request_id() const { return stream_->id(); }

 private:
  struct Sample;
  Generation(const ServerContext& context, GenerationRequest request);
  // Folds engine events into the samples; streaming payloads go to *out when not null.
  void absorb(std::vector<EngineEvent>& events, std::vector<std::string>* out);
  nlohmann::json chunk(int32_t index, nlohmann::json delta, const nlohmann::json& logprobs,
                       const char* finish_reason) const;
  nlohmann::json usage_json() const;
  nlohmann::json final_response();
  void log_finish() const;

  const ServerContext& context_;
  GenerationRequest request_;
  std::string id_;
  int64_t created_ = 0;
  std::optional<std::string> session_;
  std::shared_ptr<RequestStream> stream_;
  std::vector<std::unique_ptr<Sample>> samples_;
  Usage usage_;
  bool finished_ = false;  // the engine's last event arrived
  bool done_sent_ = false;
  std::chrono::steady_clock::time_point start_time_;
  std::optional<std::chrono::steady_clock::time_point> first_token_time_;
  std::chrono::steady_clock::time_point last_token_time_;
};

}  // namespace kvp::server

#include "server/generation.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include "tokenizer/detokenizer.h"

namespace kvp::server {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string random_hex(size_t num_chars) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(num_chars, '0');
  for (char& c : out) c = kHex[rng() & 15];
  return out;
}

const char* finish_reason_text(FinishReason reason, bool tool_calls) {
  switch (reason) {
    case FinishReason::kStop:
      return tool_calls ? "tool_calls" : "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
    case FinishReason::kAborted:
      return "abort";
  }
  return "stop";
}

// The length of the longest suffix of text that is a proper prefix of one of stops.
size_t held_suffix(const std::string& text, const std::vector<std::string>& stops) {
  size_t best = 0;
  for (const std::string& stop : stops) {
    for (size_t k = std::min(text.size(), stop.size() - 1); k > best; --k) {
      if (text.compare(text.size() - k, k, stop, 0, k) == 0) {
        best = k;
        break;
      }
    }
  }
  return best;
}

json byte_list(const std::string& text) {
  json bytes = json::array();
  for (unsigned char c : text) bytes.push_back(int(c));
  return bytes;
}

// The OpenAI form of a stream's tool-call deltas; with `calls`, each is also recorded there whole
// (a non-streamed reply's message.tool_calls).
json tool_call_deltas(const std::vector<ToolCallDelta>& deltas, json* calls) {
  json out = json::array();
  for (const ToolCallDelta& c : deltas) {
    json call = {{"index", c.index}};
    if (c.id) call["id"] = *c.id, call["type"] = "function";
    json function = {{"arguments", c.arguments}};
    if (c.name) function["name"] = *c.name;
    call["function"] = std::move(function);
    if (calls != nullptr) {
      calls->push_back({{"id", c.id.value_or("")},
                        {"type", "function"},
                        {"function", {{"name", c.name.value_or("")}, {"arguments", c.arguments}}}});
    }
    out.push_back(std::move(call));
  }
  return out;
}

}  // namespace

// One choice of the request: its text as it streams, and what the response reports.
struct Generation::Sample {
  Sample(const Tokenizer& tokenizer, bool skip_special, ToolCallFormat format, IdSource* ids)
      : detokenizer(tokenizer, skip_special) {
    if (format != ToolCallFormat::kNone) tools.emplace(format, ids);
  }
  IncrementalDetokenizer detokenizer;
  std::optional<ToolCallStream> tools;  // when the request has tools
  std::string held;                     // text that may be the start of a stop string
  bool stopped_by_string = false;
  bool finished = false;
  bool role_sent = false;
  FinishReason reason = FinishReason::kStop;
  int32_t num_tokens = 0;
  std::string content;  // the whole content (non-streaming)
  json tool_calls = json::array();
  json logprobs = json::array();  // chat: logprobs.content entries (non-streaming)
  // completions logprobs (non-streaming)
  json lp_tokens = json::array(), lp_token_logprobs = json::array(), lp_top = json::array();
  json lp_offsets = json::array();
  size_t text_bytes = 0;

  // Adds generated text; returns what may be sent now (stop strings cut, their prefixes held).
  std::string add_text(const std::string& piece, const std::vector<std::string>& stops) {
    if (stopped_by_string) return "";
    held += piece;
    if (stops.empty()) return std::exchange(held, "");
    size_t cut = std::string::npos;
    for (const std::string& stop : stops) cut = std::min(cut, held.find(stop));
    if (cut != std::string::npos) {
      stopped_by_string = true;
      std::string out = held.substr(0, cut);
      held.clear();
      return out;
    }
    const size_t keep = held_suffix(held, stops);
    std::string out = held.substr(0, held.size() - keep);
    held.erase(0, held.size() - keep);
    return out;
  }
  // The end of the sample: the detokenizer's and the stop check's held text.
  std::string flush(const std::vector<std::string>& stops) {
    std::string out = add_text(detokenizer.finish(), stops);
    if (!stopped_by_string) out += std::exchange(held, "");
    return out;
  }
};

std::variant<std::string, ApiError> render_chat_prompt(const ServerContext& context,
                                                       const GenerationRequest& request) {
  if (context.chat_template == nullptr) {
    return ApiError::bad_request("messages",
                                 "the model has no chat template (start the server with "
                                 "--chat-template FILE, or use /v1/completions)");
  }
  ChatTemplateInputs inputs;
  inputs.messages = request.messages;
  inputs.tools = request.tools;
  inputs.add_generation_prompt = true;
  inputs.extra = request.chat_template_kwargs;
  Result<std::string> text = context.chat_template->render(inputs);
  if (!text.is_ok()) {
    return ApiError::bad_request("messages", "the chat template: " + text.status().message());
  }
  return std::move(text).value();
}

std::variant<std::vector<int32_t>, ApiError> prompt_token_ids(const ServerContext& context,
                                                              const GenerationRequest& request) {
  if (!request.chat && std::holds_alternative<std::vector<int32_t>>(request.prompt)) {
    return std::get<std::vector<int32_t>>(request.prompt);
  }
  std::string text;
  EncodeOptions options;
  if (request.chat) {
    auto rendered = render_chat_prompt(context, request);
    if (auto* error = std::get_if<ApiError>(&rendered)) return *error;
    text = std::move(std::get<std::string>(rendered));
    options.add_special_tokens = false;  // the template wrote them
  } else {
    text = std::get<std::string>(request.prompt);
  }
  Result<std::vector<TokenId>> ids = context.tokenizer->encode(text, options);
  if (!ids.is_ok()) {
    return ApiError::bad_request(request.chat ? "messages" : "prompt", ids.status().message());
  }
  return std::vector<int32_t>(ids->begin(), ids->end());
}

Generation::Generation(const ServerContext& context, GenerationRequest request)
    : context_(context), request_(std::move(request)) {
  id_ = (request_.chat ? "chatcmpl-" : "cmpl-") + random_hex(24);
  created_ = std::chrono::duration_cast<std::chrono::seconds>(
                 std::chrono::system_clock::now().time_since_epoch())
                 .count();
  start_time_ = Clock::now();
  last_token_time_ = start_time_;
  const ToolCallFormat format =
      request_.chat && !request_.tools.is_null() ? context.tool_call_format : ToolCallFormat::kNone;
  for (int32_t i = 0; i < request_.n; ++i) {
    samples_.push_back(std::make_unique<Sample>(*context.tokenizer, request_.skip_special_tokens,
                                                format, context.ids));
  }
}

Generation::~Generation() {
  if (stream_ && !finished_) context_.engine->cancel(stream_->id());
}

std::variant<std::unique_ptr<Generation>, ApiError> Generation::start(
    const ServerContext& context, GenerationRequest request,
    std::optional<std::string> engine_session) {
  auto prompt = prompt_token_ids(context, request);
  if (auto* error = std::get_if<ApiError>(&prompt)) return *error;
  std::vector<int32_t>& tokens = std::get<std::vector<int32_t>>(prompt);
  const char* prompt_param = request.chat ? "messages" : "prompt";
  if (tokens.empty()) return ApiError::bad_request(prompt_param, "the prompt has no tokens");
  const auto num_prompt = static_cast<int32_t>(tokens.size());
  if (context.context_length > 0 && num_prompt >= context.context_length) {
    return ApiError::bad_request(
        prompt_param, fmt::format("the prompt has {} tokens; the model's context is {} tokens",
                                  num_prompt, context.context_length));
  }
  int32_t max_tokens = 0;
  if (request.max_tokens) {
    max_tokens = *request.max_tokens;
  } else {
    // up to the context, and what the pool can hold for n samples
    const int32_t context_left = context.context_length > 0 ? context.context_length - num_prompt
                                                            : std::numeric_limits<int32_t>::max();
    const int32_t pool_left = context.pool_tokens / request.n - num_prompt - 64;
    max_tokens = std::max(1, std::min(context_left, pool_left));
  }

  std::unique_ptr<Generation> g(new Generation(context, std::move(request)));
  const GenerationRequest& r = g->request_;
  Request engine_request;
  engine_request.prompt_tokens = std::move(tokens);
  engine_request.sampling = r.sampling;
  engine_request.max_tokens = max_tokens;
  engine_request.min_tokens = r.min_tokens;
  engine_request.n = r.n;
  engine_request.stop_strings = r.stop;
  engine_request.stop_token_ids = r.stop_token_ids;
  engine_request.ignore_eos = r.ignore_eos;
  if (engine_session) {
    engine_request.session = *engine_session;
    engine_request.prompt_includes_history = true;
    g->session_ = std::move(engine_session);
  }
  Result<std::shared_ptr<RequestStream>> stream = context.engine->submit(std::move(engine_request));
  if (!stream.is_ok()) {
    const std::string& message = stream.status().message();
    const bool busy = message.find("is busy") != std::string::npos;
    if (busy) return ApiError{409, "conflict_error", message, "session_id", "session_busy", 0};
    return ApiError::from_status(stream.status(), prompt_param);
  }
  g->stream_ = std::move(stream).value();
  return g;
}

void Generation::cancel() {
  if (stream_ && !finished_) context_.engine->cancel(stream_->id());
}

void Generation::abandon(std::chrono::milliseconds wait) {
  cancel();
  const auto deadline = Clock::now() + wait;
  std::vector<std::string> unused;
  while (!finished_ && Clock::now() < deadline) {
    std::vector<EngineEvent> events;
    stream_->take(std::chrono::milliseconds(100), &events);
    absorb(events, &unused);
    unused.clear();
  }
}

json Generation::chunk(int32_t index, json delta, const json& logprobs,
                       const char* finish_reason) const {
  json choice = {{"index", index}};
  if (request_.chat) {
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = delta.value("content", "");
  }
  choice["logprobs"] = logprobs;
  choice["finish_reason"] = finish_reason == nullptr ? json() : json(finish_reason);
  return {{"id", id_},
          {"object", request_.chat ? "chat.completion.chunk" : "text_completion"},
          {"created", created_},
          {"model", context_.model_name},
          {"choices", json::array({std::move(choice)})}};
}

json Generation::usage_json() const {
  return {{"prompt_tokens", usage_.prompt_tokens},
          {"completion_tokens", usage_.completion_tokens},
          {"total_tokens", usage_.prompt_tokens + usage_.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", usage_.cached_tokens}}}};
}

void Generation::absorb(std::vector<EngineEvent>& events, std::vector<std::string>* out) {
  const Tokenizer& tokenizer = *context_.tokenizer;
  for (EngineEvent& e : events) {
    Sample& s = *samples_.at(e.sample_index);
    if (e.kind == EngineEvent::Kind::kToken) {
      const Clock::time_point now = Clock::now();
      if (!first_token_time_) {
        first_token_time_ = now;
        if (context_.metrics) {
          context_.metrics->observe_first_token(
              std::chrono::duration<double>(now - start_time_).count());
        }
      } else if (context_.metrics) {
        context_.metrics->observe_inter_token(
            std::chrono::duration<double>(now - last_token_time_).count());
      }
      last_token_time_ = now;
      ++s.num_tokens;
      const bool eos = std::find(context_.eos_token_ids.begin(), context_.eos_token_ids.end(),
                                 e.token_id) != context_.eos_token_ids.end();
      std::string piece;
      if (!eos) {
        Result<std::string> text = s.detokenizer.push(e.token_id);
        if (text.is_ok()) piece = std::move(text).value();
      }
      std::string text = s.add_text(piece, request_.stop);
      // logprobs of this token
      json lp;
      if (request_.logprobs) {
        Result<std::string> token_text = tokenizer.decode(std::span<const int32_t>(&e.token_id, 1));
        const std::string tok = token_text.is_ok() ? *token_text : "";
        if (request_.chat) {
          json top = json::array();
          for (const TokenLogprob& t : e.top_logprobs) {
            Result<std::string> tt = tokenizer.decode(std::span<const int32_t>(&t.token_id, 1));
            const std::string ts = tt.is_ok() ? *tt : "";
            top.push_back({{"token", ts}, {"logprob", t.logprob}, {"bytes", byte_list(ts)}});
          }
          json entry = {{"token", tok},
                        {"logprob", e.logprob},
                        {"bytes", byte_list(tok)},
                        {"top_logprobs", std::move(top)}};
          if (out) {
            lp = {{"content", json::array({entry})}};
          } else {
            s.logprobs.push_back(std::move(entry));
          }
        } else {
          json top = json::object();
          for (const TokenLogprob& t : e.top_logprobs) {
            Result<std::string> tt = tokenizer.decode(std::span<const int32_t>(&t.token_id, 1));
            top[tt.is_ok() ? *tt : ""] = t.logprob;
          }
          if (out) {
            lp = {{"tokens", {tok}},
                  {"token_logprobs", {e.logprob}},
                  {"top_logprobs", {top}},
                  {"text_offset", {s.text_bytes}}};
          } else {
            s.lp_tokens.push_back(tok);
            s.lp_token_logprobs.push_back(e.logprob);
            s.lp_top.push_back(std::move(top));
            s.lp_offsets.push_back(s.text_bytes);
          }
        }
      }
      json delta = json::object();
      if (s.tools) {
        StreamDelta d = s.tools->push(text);
        text = std::move(d.content);
        if (!d.tool_calls.empty()) {
          delta["tool_calls"] = tool_call_deltas(d.tool_calls, out ? nullptr : &s.tool_calls);
        }
      }
      s.text_bytes += text.size();
      if (out) {
        if (request_.chat && !s.role_sent) {
          delta["role"] = "assistant";
          s.role_sent = true;
        }
        if (!delta.contains("tool_calls") || !text.empty()) delta["content"] = text;
        out->push_back(chunk(e.sample_index, std::move(delta), lp, nullptr).dump());
      } else {
        s.content += text;
      }
      continue;
    }
    // kFinished: one sample ended
    s.finished = true;
    s.reason = e.finish_reason;
    std::string text = s.flush(request_.stop);
    json delta = json::object();
    if (s.tools) {
      StreamDelta d = s.tools->push(text);
      StreamDelta tail = s.tools->finish();
      text = d.content + tail.content;
      d.tool_calls.insert(d.tool_calls.end(), tail.tool_calls.begin(), tail.tool_calls.end());
      if (!d.tool_calls.empty()) {
        delta["tool_calls"] = tool_call_deltas(d.tool_calls, out ? nullptr : &s.tool_calls);
      }
    }
    const bool tool_calls = s.tools && s.tools->saw_tool_call();
    const char* reason = finish_reason_text(s.reason, tool_calls);
    if (out) {
      if (!text.empty()) delta["content"] = text;
      if (request_.chat && !s.role_sent) {
        delta["role"] = "assistant";
        s.role_sent = true;
      }
      out->push_back(chunk(e.sample_index, std::move(delta), json(), reason).dump());
    } else {
      s.content += text;
    }
    if (e.request_finished) {
      finished_ = true;
      usage_ = e.usage;
      log_finish();
      if (out) {
        if (request_.include_usage) {
          json usage_chunk = chunk(0, json::object(), json(), nullptr);
          usage_chunk["choices"] = json::array();
          usage_chunk["usage"] = usage_json();
          out->push_back(usage_chunk.dump());
        }
        out->push_back("[DONE]");
        done_sent_ = true;
      }
    }
  }
}

bool Generation::poll_stream(std::chrono::milliseconds wait, std::vector<std::string>* out) {
  if (done_sent_) return false;
  std::vector<EngineEvent> events;
  stream_->take(wait, &events);
  absorb(events, out);
  return !done_sent_;
}

bool Generation::poll_response(std::chrono::milliseconds wait, json* response) {
  std::vector<EngineEvent> events;
  stream_->take(wait, &events);
  absorb(events, nullptr);
  if (!finished_) return false;
  *response = final_response();
  return true;
}

json Generation::final_response() {
  json choices = json::array();
  for (size_t i = 0; i < samples_.size(); ++i) {
    Sample& s = *samples_[i];
    const bool tool_calls = !s.tool_calls.empty();
    json choice = {{"index", i}};
    if (request_.chat) {
      json message = {{"role", "assistant"},
                      {"content", s.content.empty() && tool_calls ? json() : json(s.content)}};
      if (tool_calls) message["tool_calls"] = s.tool_calls;
      choice["message"] = std::move(message);
      choice["logprobs"] = request_.logprobs ? json{{"content", s.logprobs}} : json();
    } else {
      choice["text"] = s.content;
      choice["logprobs"] = request_.logprobs ? json{{"tokens", s.lp_tokens},
                                                    {"token_logprobs", s.lp_token_logprobs},
                                                    {"top_logprobs", s.lp_top},
                                                    {"text_offset", s.lp_offsets}}
                                             : json();
    }
    choice["finish_reason"] = finish_reason_text(s.reason, tool_calls);
    choices.push_back(std::move(choice));
  }
  return {{"id", id_},
          {"object", request_.chat ? "chat.completion" : "text_completion"},
          {"created", created_},
          {"model", context_.model_name},
          {"choices", std::move(choices)},
          {"usage", usage_json()}};
}

void Generation::log_finish() const {
  const Clock::time_point now = Clock::now();
  const double duration_s = std::chrono::duration<double>(now - start_time_).count();
  const double ttft_s =
      first_token_time_ ? std::chrono::duration<double>(*first_token_time_ - start_time_).count()
                        : duration_s;
  const char* reason = finish_reason_text(samples_[0]->reason, false);
  if (context_.metrics) {
    context_.metrics->observe_finished(usage_, duration_s, samples_[0]->num_tokens, ttft_s, reason,
                                       session_.has_value());
  }
  if (!context_.log_requests) return;
  std::fprintf(stderr,
               "[kvpool] request %s session=%s prompt=%d cached=%d output=%d ttft=%.3fs "
               "duration=%.3fs finish=%s\n",
               id_.c_str(), session_ ? session_->c_str() : "-", usage_.prompt_tokens,
               usage_.cached_tokens, usage_.completion_tokens, ttft_s, duration_s, reason);
}

}  // namespace kvp::server

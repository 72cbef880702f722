#include "server/openai_api.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace kvp::server {
namespace {

using json = nlohmann::json;

// Reads optional field `name` of `body` as T, checking its JSON type; the error names the
// field. A JSON null counts as absent (clients send "seed": null).
class Fields {
 public:
  explicit Fields(const json& body) : body_(body) {}
  const std::optional<ApiError>& error() const { return error_; }
  bool has(const char* name) const {
    auto it = body_.find(name);
    return it != body_.end() && !it->is_null();
  }
  const json* get(const char* name) const {
    auto it = body_.find(name);
    return it == body_.end() || it->is_null() ? nullptr : &*it;
  }
  void fail(const char* name, std::string message) {
    if (!error_) error_ = ApiError::bad_request(name, std::move(message));
  }

  std::optional<bool> boolean(const char* name) {
    const json* v = get(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_boolean()) {
      fail(name, fmt::format("'{}' must be a boolean, not {}", name, v->type_name()));
      return std::nullopt;
    }
    return v->get<bool>();
  }
  // A finite number in [min, max].
  std::optional<double> number(const char* name, double min, double max) {
    const json* v = get(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number()) {
      fail(name, fmt::format("'{}' must be a number, not {}", name, v->type_name()));
      return std::nullopt;
    }
    const double x = v->get<double>();
    if (!std::isfinite(x) || x < min || x > max) {
      fail(name, fmt::format("'{}' is {}; it must be in [{}, {}]", name, v->dump(), min, max));
      return std::nullopt;
    }
    return x;
  }
  // An integer in [min, max].
  std::optional<int64_t> integer(const char* name, int64_t min, int64_t max) {
    const json* v = get(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number_integer()) {
      fail(name, fmt::format("'{}' must be an integer, not {}", name, v->dump()));
      return std::nullopt;
    }
    if (v->is_number_unsigned() &&
        v->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())) {
      fail(name, fmt::format("'{}' is {}; it must be in [{}, {}]", name, v->dump(), min, max));
      return std::nullopt;
    }
    const int64_t x = v->get<int64_t>();
    if (x < min || x > max) {
      fail(name, fmt::format("'{}' is {}; it must be in [{}, {}]", name, x, min, max));
      return std::nullopt;
    }
    return x;
  }
  std::optional<std::string> string(const char* name, size_t max_bytes) {
    const json* v = get(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_string()) {
      fail(name, fmt::format("'{}' must be a string, not {}", name, v->type_name()));
      return std::nullopt;
    }
    if (v->get_ref<const std::string&>().size() > max_bytes) {
      fail(name, fmt::format("'{}' is longer than {} bytes", name, max_bytes));
      return std::nullopt;
    }
    return v->get<std::string>();
  }

 private:
  const json& body_;
  std::optional<ApiError> error_;
};

// A message's content: a string, or a list of parts of which only text parts are taken.
std::optional<std::string> check_message(const json& message, size_t index, std::string* why) {
  if (!message.is_object()) {
    *why = fmt::format("messages[{}] must be an object", index);
    return std::nullopt;
  }
  auto role = message.find("role");
  if (role == message.end() || !role->is_string()) {
    *why = fmt::format("messages[{}].role must be a string", index);
    return std::nullopt;
  }
  const std::string r = role->get<std::string>();
  if (r != "system" && r != "user" && r != "assistant" && r != "tool" && r != "developer") {
    *why = fmt::format(
        "messages[{}].role '{}' is not one of system, developer, user, assistant, "
        "tool",
        index, r);
    return std::nullopt;
  }
  auto content = message.find("content");
  const bool has_tool_calls = message.contains("tool_calls") && !message["tool_calls"].is_null();
  if (content == message.end() || content->is_null()) {
    if (r == "assistant" && has_tool_calls) return r;
    *why = fmt::format("messages[{}].content is missing", index);
    return std::nullopt;
  }
  if (content->is_array()) {
    for (size_t p = 0; p < content->size(); ++p) {
      const json& part = (*content)[p];
      if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
          !part["text"].is_string()) {
        *why = fmt::format(
            "messages[{}].content[{}]: only text parts ({{\"type\": \"text\", \"text\": ...}}) "
            "are supported",
            index, p);
        return std::nullopt;
      }
    }
  } else if (!content->is_string()) {
    *why = fmt::format("messages[{}].content must be a string or a list of text parts", index);
    return std::nullopt;
  }
  if (has_tool_calls) {
    const json& calls = message["tool_calls"];
    if (!calls.is_array()) {
      *why = fmt::format("messages[{}].tool_calls must be a list", index);
      return std::nullopt;
    }
  }
  return r;
}

// The deepest nesting of arrays and objects in JSON text (brackets inside strings skipped).
// Stops counting past `limit`.
int32_t json_nesting_depth(std::string_view text, int32_t limit) {
  int32_t depth = 0;
  int32_t deepest = 0;
  bool in_string = false;
  bool escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
      if (deepest > limit) return deepest;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

// Tool-call arguments arrive as JSON text (OpenAI's wire format); templates expect objects
// (transformers' templates iterate over them), so text that parses as an object is replaced by it.
// Text nested past max_depth is refused: it is a body inside the body, held to the same limit.
std::optional<ApiError> parse_tool_call_arguments(nlohmann::ordered_json& messages,
                                                  int32_t max_depth) {
  for (size_t m = 0; m < messages.size(); ++m) {
    auto calls = messages[m].find("tool_calls");
    if (calls == messages[m].end() || !calls->is_array()) continue;
    for (size_t c = 0; c < calls->size(); ++c) {
      auto& call = (*calls)[c];
      if (!call.is_object() || !call.contains("function")) continue;
      auto& function = call["function"];
      if (!function.is_object()) continue;
      auto args = function.find("arguments");
      if (args == function.end() || !args->is_string()) continue;
      const std::string& text = args->get_ref<const std::string&>();
      if (json_nesting_depth(text, max_depth) > max_depth) {
        return ApiError::bad_request(
            "messages", fmt::format("messages[{}].tool_calls[{}].function.arguments nests arrays "
                                    "and objects deeper than the limit of {} levels",
                                    m, c, max_depth));
      }
      nlohmann::ordered_json parsed = nlohmann::ordered_json::parse(text, nullptr, false);
      if (!parsed.is_discarded() && parsed.is_object()) *args = std::move(parsed);
    }
  }
  return std::nullopt;
}

}  // namespace

std::variant<json, ApiError> parse_request_body(std::string_view text,
                                                const RequestLimits& limits) {
  if (json_nesting_depth(text, limits.max_json_depth) > limits.max_json_depth) {
    return ApiError::bad_request(
        "", fmt::format("the body nests arrays and objects deeper than the limit of {} levels",
                        limits.max_json_depth));
  }
  json body = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) {
    // parse again with exceptions for the position of the error: a parse_error, or an
    // out_of_range for a number past a double ("1e400")
    try {
      body = json::parse(text);
    } catch (const json::exception& e) {
      return ApiError::bad_request("", fmt::format("the body is not valid JSON: {}", e.what()));
    }
    return ApiError::bad_request("", "the body is not valid JSON");
  }
  if (!body.is_object()) return ApiError::bad_request("", "the body must be a JSON object");
  return body;
}

std::variant<std::vector<int32_t>, ApiError> parse_detokenize_request(const json& body,
                                                                      int64_t vocab_size) {
  auto tokens = body.find("tokens");
  if (tokens == body.end() || !tokens->is_array()) {
    return ApiError::bad_request("tokens", "'tokens' must be a list of token ids");
  }
  std::vector<int32_t> ids;
  for (const json& t : *tokens) {
    const bool in_vocab =
        t.is_number_unsigned()  ? t.get<uint64_t>() < static_cast<uint64_t>(vocab_size)
        : t.is_number_integer() ? t.get<int64_t>() >= 0 && t.get<int64_t>() < vocab_size
                                : false;
    if (!in_vocab) {
      return ApiError::bad_request(
          "tokens",
          fmt::format("token {} is not an id of the vocabulary of {}", t.dump(), vocab_size));
    }
    ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  return ids;
}

Status validate_session_id(const std::string& id, int32_t max_bytes) {
  if (id.empty()) return Status::invalid_argument("session id is empty");
  if (static_cast<int32_t>(id.size()) > max_bytes) {
    return Status::invalid_argument("session id is longer than {} characters", max_bytes);
  }
  if (id[0] == '.') return Status::invalid_argument("session id '{}' starts with '.'", id);
  for (char c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-' || c == '.';
    if (!ok) {
      return Status::invalid_argument("session id '{}' has a character outside [A-Za-z0-9_.-]",
                                      id.size() > 64 ? id.substr(0, 64) + "..." : id);
    }
  }
  return Status::ok();
}

std::variant<GenerationRequest, ApiError> parse_generation_request(const json& body, bool chat,
                                                                   const RequestLimits& limits) {
  if (!body.is_object()) return ApiError::bad_request("", "the request body must be a JSON object");
  GenerationRequest r;
  r.chat = chat;
  Fields f(body);
  if (auto model = f.string("model", 512)) r.model = *model;

  if (chat) {
    const json* messages = f.get("messages");
    if (messages == nullptr) return ApiError::bad_request("messages", "'messages' is required");
    if (!messages->is_array() || messages->empty()) {
      return ApiError::bad_request("messages", "'messages' must be a non-empty list");
    }
    if (static_cast<int32_t>(messages->size()) > limits.max_messages) {
      return ApiError::bad_request("messages", fmt::format("{} messages: over the limit of {}",
                                                           messages->size(), limits.max_messages));
    }
    for (size_t i = 0; i < messages->size(); ++i) {
      std::string why;
      if (!check_message((*messages)[i], i, &why)) return ApiError::bad_request("messages", why);
    }
    r.messages = nlohmann::ordered_json::parse(messages->dump());
    if (auto error = parse_tool_call_arguments(r.messages, limits.max_json_depth)) return *error;
    if (const json* tools = f.get("tools")) {
      if (!tools->is_array()) return ApiError::bad_request("tools", "'tools' must be a list");
      if (static_cast<int32_t>(tools->size()) > limits.max_tools) {
        return ApiError::bad_request("tools", fmt::format("{} tools: over the limit of {}",
                                                          tools->size(), limits.max_tools));
      }
      for (size_t i = 0; i < tools->size(); ++i) {
        const json& tool = (*tools)[i];
        if (!tool.is_object() || tool.value("type", "") != "function" ||
            !tool.contains("function") || !tool["function"].is_object() ||
            !tool["function"].contains("name") || !tool["function"]["name"].is_string()) {
          return ApiError::bad_request(
              "tools", fmt::format("tools[{}] must be {{\"type\": \"function\", \"function\": "
                                   "{{\"name\": ..., \"parameters\": ...}}}}",
                                   i));
        }
      }
      if (!tools->empty()) r.tools = nlohmann::ordered_json::parse(tools->dump());
    }
    if (const json* choice = f.get("tool_choice")) {
      const bool ok = (choice->is_string() &&
                       (*choice == "none" || *choice == "auto" || *choice == "required")) ||
                      (choice->is_object() && choice->contains("function"));
      if (!ok) {
        return ApiError::bad_request(
            "tool_choice", "'tool_choice' must be none, auto, required or a named function");
      }
      r.tool_choice = nlohmann::ordered_json::parse(choice->dump());
      if (*choice == "none") r.tools = nullptr;
    }
    if (auto p = f.boolean("parallel_tool_calls")) r.parallel_tool_calls = *p;
    if (const json* kwargs = f.get("chat_template_kwargs")) {
      if (!kwargs->is_object()) {
        return ApiError::bad_request("chat_template_kwargs",
                                     "'chat_template_kwargs' must be an object");
      }
      r.chat_template_kwargs = nlohmann::ordered_json::parse(kwargs->dump());
    }
    if (auto lp = f.boolean("logprobs")) r.logprobs = *lp;
    if (auto top = f.integer("top_logprobs", 0, 20)) {
      r.sampling.num_logprobs = static_cast<int32_t>(*top);
      if (!r.logprobs && *top > 0) {
        return ApiError::bad_request("top_logprobs", "'top_logprobs' needs 'logprobs': true");
      }
    }
  } else {
    const json* prompt = f.get("prompt");
    if (prompt == nullptr) return ApiError::bad_request("prompt", "'prompt' is required");
    if (prompt->is_string()) {
      r.prompt = prompt->get<std::string>();
    } else if (prompt->is_array() && !prompt->empty() && (*prompt)[0].is_number_integer()) {
      std::vector<int32_t> ids;
      for (const json& id : *prompt) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
            id.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
          return ApiError::bad_request("prompt", "'prompt' token ids must be integers >= 0");
        }
        ids.push_back(id.get<int32_t>());
      }
      r.prompt = std::move(ids);
    } else if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) {
      r.prompt = (*prompt)[0].get<std::string>();
    } else {
      return ApiError::bad_request(
          "prompt", "'prompt' must be a string or a list of token ids (one prompt per request)");
    }
    if (auto lp = f.integer("logprobs", 0, 20)) {
      r.logprobs = true;
      r.sampling.num_logprobs = static_cast<int32_t>(*lp);
    }
    if (auto echo = f.boolean("echo")) r.echo = *echo;
    if (r.echo) return ApiError::bad_request("echo", "'echo' is not supported");
  }

  // max_completion_tokens is the newer name of max_tokens (chat); either may be given.
  for (const char* name : {"max_tokens", "max_completion_tokens"}) {
    if (auto m = f.integer(name, 1, 1 << 24)) r.max_tokens = static_cast<int32_t>(*m);
  }
  if (auto m = f.integer("min_tokens", 0, 1 << 24)) r.min_tokens = static_cast<int32_t>(*m);
  if (auto n = f.integer("n", 1, limits.max_n)) r.n = static_cast<int32_t>(*n);
  SamplingParams& s = r.sampling;
  if (auto t = f.number("temperature", 0.0, 2.0)) s.temperature = static_cast<float>(*t);
  if (auto p = f.number("top_p", 0.0, 1.0)) {
    if (*p <= 0.0) return ApiError::bad_request("top_p", "'top_p' must be > 0");
    s.top_p = static_cast<float>(*p);
  }
  if (auto k = f.integer("top_k", -1, 1 << 24)) s.top_k = *k < 0 ? 0 : static_cast<int32_t>(*k);
  if (auto m = f.number("min_p", 0.0, 0.999999)) s.min_p = static_cast<float>(*m);
  if (auto p = f.number("presence_penalty", -2.0, 2.0)) s.presence_penalty = static_cast<float>(*p);
  if (auto p = f.number("frequency_penalty", -2.0, 2.0)) {
    s.frequency_penalty = static_cast<float>(*p);
  }
  if (auto p = f.number("repetition_penalty", 1e-3, 100.0)) {
    s.repetition_penalty = static_cast<float>(*p);
  }
  if (auto seed = f.integer("seed", std::numeric_limits<int64_t>::min(),
                            std::numeric_limits<int64_t>::max())) {
    s.seed = static_cast<uint64_t>(*seed);
  }
  if (const json* stop = f.get("stop")) {
    std::vector<std::string> strings;
    if (stop->is_string()) {
      strings.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (const json& x : *stop) {
        if (!x.is_string()) return ApiError::bad_request("stop", "'stop' must hold strings");
        strings.push_back(x.get<std::string>());
      }
    } else {
      return ApiError::bad_request("stop", "'stop' must be a string or a list of strings");
    }
    if (static_cast<int32_t>(strings.size()) > limits.max_stop_strings) {
      return ApiError::bad_request("stop", fmt::format("{} stop strings: over the limit of {}",
                                                       strings.size(), limits.max_stop_strings));
    }
    for (const std::string& x : strings) {
      if (x.empty()) return ApiError::bad_request("stop", "'stop' holds an empty string");
      if (static_cast<int32_t>(x.size()) > limits.max_stop_bytes) {
        return ApiError::bad_request(
            "stop", fmt::format("a stop string is longer than {} bytes", limits.max_stop_bytes));
      }
    }
    r.stop = std::move(strings);
  }
  if (const json* ids = f.get("stop_token_ids")) {
    if (!ids->is_array()) return ApiError::bad_request("stop_token_ids", "must be a list");
    for (const json& id : *ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
          id.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        return ApiError::bad_request("stop_token_ids", "'stop_token_ids' must be token ids");
      }
      r.stop_token_ids.push_back(id.get<int32_t>());
    }
  }
  if (auto b = f.boolean("ignore_eos")) r.ignore_eos = *b;
  if (auto b = f.boolean("skip_special_tokens")) r.skip_special_tokens = *b;
  if (auto b = f.boolean("stream")) r.stream = *b;
  if (const json* options = f.get("stream_options")) {
    if (!options->is_object()) {
      return ApiError::bad_request("stream_options", "'stream_options' must be an object");
    }
    auto usage = options->find("include_usage");
    if (usage != options->end() && !usage->is_null()) {
      if (!usage->is_boolean()) {
        return ApiError::bad_request("stream_options",
                                     "'stream_options.include_usage' must be a boolean");
      }
      r.include_usage = usage->get<bool>();
    }
  }
  if (auto user = f.string("user", 256)) r.user = *user;
  if (auto session = f.string("session_id", static_cast<size_t>(limits.max_session_id_bytes) + 1)) {
    r.session_id = *session;
  }
  if (f.error()) return *f.error();
  if (r.session_id) {
    if (Status s = validate_session_id(*r.session_id, limits.max_session_id_bytes); !s.is_ok()) {
      return ApiError::bad_request("session_id", s.message());
    }
    if (r.n != 1) return ApiError::bad_request("n", "a request with a session takes n = 1");
  }
  if (Status s = validate_sampling_params(r.sampling); !s.is_ok()) {
    return ApiError::bad_request("", s.message());
  }
  return r;
}

}  // namespace kvp::server

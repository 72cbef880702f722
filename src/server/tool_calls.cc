#include "server/tool_calls.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <utility>

namespace kvp {
namespace {

// ordered_json keeps the model's key order when the arguments are re-serialised.
using Json = nlohmann::ordered_json;

constexpr std::string_view kHermesStart = "<tool_call>";
constexpr std::string_view kHermesEnd = "</tool_call>";
constexpr std::string_view kMistralStart = "[TOOL_CALLS]";
constexpr std::string_view kMistralArgs = "[ARGS]";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kWhitespace = " \t\n\r";
constexpr std::string_view kIdAlphabet =
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
constexpr size_t kIdRandomChars = 24;

bool is_space(char c) { return kWhitespace.find(c) != std::string_view::npos; }

size_t skip_spaces(std::string_view text, size_t pos) {
  while (pos < text.size() && is_space(text[pos])) ++pos;
  return pos;
}

// Where a suffix of `text` starts that is a proper prefix of `marker` (the marker may be
// arriving), or text.size() when none is.
size_t partial_marker_start(std::string_view text, std::string_view marker) {
  const size_t first = text.size() >= marker.size() ? text.size() - marker.size() + 1 : 0;
  for (size_t pos = first; pos < text.size(); ++pos) {
    if (marker.starts_with(text.substr(pos))) return pos;
  }
  return text.size();
}

// Mistral v11 function names: what may stand between [TOOL_CALLS] and [ARGS].
bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-' || c == '.';
}

std::string compact(const Json& value) {
  return value.dump(-1, ' ', false, Json::error_handler_t::replace);
}

// The arguments of a call: an object, or a string holding one's JSON text (some models quote it).
std::optional<std::string> arguments_text(const Json& arguments) {
  if (arguments.is_object()) return compact(arguments);
  if (!arguments.is_string()) return std::nullopt;
  const Json inner = Json::parse(arguments.get_ref<const std::string&>(), nullptr, false);
  if (inner.is_discarded() || !inner.is_object()) return std::nullopt;
  return compact(inner);
}

// {"name": "f", "arguments" | "parameters": {...}}. Without arguments the call takes none ({}),
// unless `require_arguments` (Llama 3, whose calls are bare JSON and could be a JSON answer).
std::optional<ToolCall> call_from_json(const Json& value, bool require_arguments) {
  if (!value.is_object()) return std::nullopt;
  const auto name = value.find("name");
  if (name == value.end() || !name->is_string() || name->get_ref<const std::string&>().empty()) {
    return std::nullopt;
  }
  auto arguments = value.find("arguments");
  if (arguments == value.end()) arguments = value.find("parameters");
  ToolCall call;
  call.name = name->get<std::string>();
  if (arguments == value.end()) {
    if (require_arguments) return std::nullopt;
    call.arguments = "{}";
    return call;
  }
  std::optional<std::string> text = arguments_text(*arguments);
  if (!text) return std::nullopt;
  call.arguments = std::move(*text);
  return call;
}

std::optional<ToolCall> call_from_text(std::string_view text, bool require_arguments) {
  const Json value = Json::parse(text, nullptr, false);
  if (value.is_discarded()) return std::nullopt;
  return call_from_json(value, require_arguments);
}

}  // namespace

Result<ToolCallFormat> parse_tool_call_format(const std::string& name) {
  for (ToolCallFormat format : {ToolCallFormat::kNone, ToolCallFormat::kHermes,
                                ToolCallFormat::kLlama3Json, ToolCallFormat::kMistral}) {
    if (name == tool_call_format_name(format)) return format;
  }
  return Status::invalid_argument(
      "tool-call format '{}': unknown (choices: none, hermes, llama3_json, mistral)", name);
}

const char* tool_call_format_name(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kNone:
      return "none";
    case ToolCallFormat::kHermes:
      return "hermes";
    case ToolCallFormat::kLlama3Json:
      return "llama3_json";
    case ToolCallFormat::kMistral:
      return "mistral";
  }
  return "unknown";
}

ToolCallFormat detect_tool_call_format(const std::string& chat_template_source) {
  const auto has = [&](std::string_view marker) {
    return chat_template_source.find(marker) != std::string::npos;
  };
  if (has(kMistralStart)) return ToolCallFormat::kMistral;
  if (has(kHermesStart)) return ToolCallFormat::kHermes;
  if (has(kPythonTag)) return ToolCallFormat::kLlama3Json;
  // Llama 3.2 asks for {"name": function name, "parameters": dictionary of argument ...}.
  if (has("<|start_header_id|>") && has("\"parameters\"")) return ToolCallFormat::kLlama3Json;
  return ToolCallFormat::kNone;
}

IdSource::IdSource() : rng_(std::random_device{}()) {}

IdSource::IdSource(uint64_t seed) : rng_(seed) {}

std::string IdSource::next_tool_call_id() {
  std::uniform_int_distribution<size_t> pick(0, kIdAlphabet.size() - 1);
  std::string id = "call_";
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < kIdRandomChars; ++i) id += kIdAlphabet[pick(rng_)];
  return id;
}

ParsedReply parse_tool_calls(ToolCallFormat format, std::string_view text, IdSource& ids) {
  ToolCallStream stream(format, &ids);
  ParsedReply reply;
  const auto absorb = [&reply](StreamDelta delta) {
    reply.content += delta.content;
    for (ToolCallDelta& call : delta.tool_calls) {
      if (call.id) {
        reply.tool_calls.push_back({std::move(*call.id), call.name.value_or(""), ""});
      }
      reply.tool_calls.at(call.index).arguments += call.arguments;
    }
  };
  absorb(stream.push(text));
  absorb(stream.finish());
  return reply;
}

ToolCallStream::ToolCallStream(ToolCallFormat format, IdSource* ids)
    : format_(format),
      ids_(ids),
      state_(format == ToolCallFormat::kLlama3Json ? State::kLlamaStart : State::kText) {
  KVP_CHECK(ids_ != nullptr, "ToolCallStream needs an IdSource");
}

StreamDelta ToolCallStream::push(std::string_view text) {
  KVP_CHECK(!finished_, "push() after finish()");
  StreamDelta out;
  if (format_ == ToolCallFormat::kNone) {
    out.content = text;
    return out;
  }
  buffer_ += text;
  drain(/*at_end=*/false, out);
  return out;
}

StreamDelta ToolCallStream::finish() {
  KVP_CHECK(!finished_, "finish() called twice");
  finished_ = true;
  StreamDelta out;
  if (format_ == ToolCallFormat::kNone) return out;
  drain(/*at_end=*/true, out);
  KVP_CHECK(buffer_.empty(), "finish() left {} bytes undecided", buffer_.size());
  if (!last_was_call_) out.content += held_whitespace_;
  held_whitespace_.clear();
  return out;
}

void ToolCallStream::drain(bool at_end, StreamDelta& out) {
  bool progressed = true;
  while (progressed) {
    switch (state_) {
      case State::kText:
        progressed = step_text(at_end, out);
        break;
      case State::kCall:
        progressed = step_call(at_end, out);
        break;
      case State::kLlamaStart:
        progressed = step_llama_start(at_end, out);
        break;
      case State::kLlamaAfter:
        progressed = step_llama_after(at_end, out);
        break;
      case State::kPassThrough:
        emit_content(take(buffer_.size()), out);
        progressed = false;
        break;
    }
  }
}

bool ToolCallStream::step_text(bool at_end, StreamDelta& out) {
  const std::string_view marker = format_ == ToolCallFormat::kHermes ? kHermesStart : kMistralStart;
  const size_t start = buffer_.find(marker);
  if (start != std::string::npos) {
    emit_content(take(start), out);
    state_ = State::kCall;
    return true;
  }
  // Hold back only what may be the marker's beginning.
  emit_content(take(at_end ? buffer_.size() : partial_marker_start(buffer_, marker)), out);
  return false;
}

bool ToolCallStream::step_call(bool at_end, StreamDelta& out) {
  bool valid = false;
  std::vector<ToolCall> calls;
  const std::optional<size_t> end = find_call_end(at_end, &valid, &calls);
  if (!end) {
    KVP_CHECK(!at_end, "an incomplete call at the end of the reply must be decided");
    return false;
  }
  std::string raw = take(*end);
  if (valid) {
    for (ToolCall& call : calls) emit_call(std::move(call), out);
  } else {
    emit_content(raw, out);
  }
  if (format_ == ToolCallFormat::kLlama3Json) {
    state_ = valid ? State::kLlamaAfter : State::kPassThrough;
  } else {
    state_ = State::kText;
  }
  return true;
}

bool ToolCallStream::llama_next(std::string_view rest, bool at_end) {
  if (rest.starts_with(kPythonTag) || rest.front() == '{') {
    state_ = State::kCall;
    return true;
  }
  if (kPythonTag.starts_with(rest) && !at_end) return false;
  state_ = State::kPassThrough;
  return true;
}

bool ToolCallStream::step_llama_start(bool at_end, StreamDelta& out) {
  const size_t first = skip_spaces(buffer_, 0);
  const std::string_view rest = std::string_view(buffer_).substr(first);
  if (rest.empty()) {
    if (at_end) emit_content(take(buffer_.size()), out);
    return false;
  }
  return llama_next(rest, at_end);
}

bool ToolCallStream::step_llama_after(bool at_end, StreamDelta& out) {
  size_t pos = skip_spaces(buffer_, 0);
  if (pos < buffer_.size() && buffer_[pos] == ';') pos = skip_spaces(buffer_, pos + 1);
  const std::string_view rest = std::string_view(buffer_).substr(pos);
  if (rest.empty()) {
    if (!at_end) return false;
    state_ = State::kPassThrough;  // a dangling separator (or only whitespace) is content
    return true;
  }
  return llama_next(rest, at_end);
}

std::optional<size_t> ToolCallStream::find_call_end(bool at_end, bool* valid,
                                                    std::vector<ToolCall>* calls) {
  *valid = false;
  const std::string_view text = buffer_;
  // The end of the JSON value starting at `begin` (a '{' or '['), scanning only bytes not
  // scanned by an earlier push; nullopt while it has not closed.
  const auto json_end = [&](size_t begin) -> std::optional<size_t> {
    if (json_begin_ != begin || json_scanned_ < begin) {
      json_begin_ = begin;
      json_scanned_ = begin;
      json_depth_ = 0;
      json_in_string_ = false;
      json_escaped_ = false;
    }
    for (; json_scanned_ < text.size(); ++json_scanned_) {
      const char c = text[json_scanned_];
      if (json_in_string_) {
        if (json_escaped_) {
          json_escaped_ = false;
        } else if (c == '\\') {
          json_escaped_ = true;
        } else if (c == '"') {
          json_in_string_ = false;
        }
      } else if (c == '"') {
        json_in_string_ = true;
      } else if (c == '{' || c == '[') {
        ++json_depth_;
      } else if ((c == '}' || c == ']') && --json_depth_ == 0) {
        return ++json_scanned_;
      }
    }
    return std::nullopt;
  };
  // Not a call: the text up to `end` is content.
  const auto not_a_call = [](size_t end) -> std::optional<size_t> { return end; };
  // More text is needed; at the end of the reply there is none, so the rest is content.
  const auto need_more = [&]() -> std::optional<size_t> {
    if (at_end) return text.size();
    return std::nullopt;
  };

  switch (format_) {
    case ToolCallFormat::kHermes: {
      const size_t body_begin = kHermesStart.size();
      const size_t search_from = std::max(body_begin, json_scanned_);
      const size_t close = text.find(kHermesEnd, search_from);
      // Another <tool_call> before this one closed: this one was not a call.
      const size_t restart = text.find(kHermesStart, search_from);
      if (restart < close) return not_a_call(restart);
      std::string_view body;
      size_t end = 0;
      if (close != std::string_view::npos) {
        body = text.substr(body_begin, close - body_begin);
        end = close + kHermesEnd.size();
      } else if (at_end) {
        // A complete call whose closing tag never came (a stop string took it) still counts.
        body = text.substr(body_begin);
        end = text.size();
      } else {
        json_scanned_ = std::min(partial_marker_start(text, kHermesEnd),
                                 partial_marker_start(text, kHermesStart));
        return std::nullopt;
      }
      std::optional<ToolCall> call = call_from_text(body, /*require_arguments=*/false);
      if (!call) return not_a_call(end);
      calls->push_back(std::move(*call));
      *valid = true;
      return end;
    }
    case ToolCallFormat::kMistral: {
      const size_t begin = skip_spaces(text, kMistralStart.size());
      if (begin == text.size()) return need_more();
      if (text[begin] == '[') {  // v0.3: [TOOL_CALLS][{...}, ...]
        const std::optional<size_t> end = json_end(begin);
        if (!end) return need_more();
        const Json value = Json::parse(text.substr(begin, *end - begin), nullptr, false);
        if (value.is_discarded() || !value.is_array() || value.empty()) return not_a_call(*end);
        for (const Json& element : value) {
          std::optional<ToolCall> call = call_from_json(element, /*require_arguments=*/false);
          if (!call) {
            calls->clear();
            return not_a_call(*end);
          }
          calls->push_back(std::move(*call));
        }
        *valid = true;
        return end;
      }
      // v11: [TOOL_CALLS]name[ARGS]{...}
      size_t name_end = begin;
      while (name_end < text.size() && is_name_char(text[name_end])) ++name_end;
      if (name_end == text.size()) return need_more();
      const std::string_view after_name = text.substr(name_end);
      if (!after_name.starts_with(kMistralArgs)) {
        if (kMistralArgs.starts_with(after_name)) return need_more();
        return not_a_call(name_end);
      }
      if (name_end == begin) return not_a_call(name_end + kMistralArgs.size());
      const size_t object_begin = skip_spaces(text, name_end + kMistralArgs.size());
      if (object_begin == text.size()) return need_more();
      if (text[object_begin] != '{') return not_a_call(object_begin);
      const std::optional<size_t> end = json_end(object_begin);
      if (!end) return need_more();
      const Json arguments =
          Json::parse(text.substr(object_begin, *end - object_begin), nullptr, false);
      if (arguments.is_discarded() || !arguments.is_object()) return not_a_call(*end);
      calls->push_back({"", std::string(text.substr(begin, name_end - begin)), compact(arguments)});
      *valid = true;
      return end;
    }
    case ToolCallFormat::kLlama3Json: {
      size_t begin = skip_spaces(text, 0);
      if (num_tool_calls_ > 0 && begin < text.size() && text[begin] == ';') {
        begin = skip_spaces(text, begin + 1);
      }
      if (text.substr(begin).starts_with(kPythonTag)) {
        begin = skip_spaces(text, begin + kPythonTag.size());
      }
      if (begin == text.size()) return need_more();
      if (text[begin] != '{') return not_a_call(begin);
      const std::optional<size_t> end = json_end(begin);
      if (!end) return need_more();
      std::optional<ToolCall> call =
          call_from_text(text.substr(begin, *end - begin), /*require_arguments=*/true);
      if (!call) return not_a_call(*end);
      calls->push_back(std::move(*call));
      *valid = true;
      return end;
    }
    case ToolCallFormat::kNone:
      break;
  }
  KVP_CHECK(false, "find_call_end() for format {}", tool_call_format_name(format_));
  return std::nullopt;
}

void ToolCallStream::emit_content(std::string_view text, StreamDelta& out) {
  const size_t last_visible = text.find_last_not_of(kWhitespace);
  if (last_visible == std::string_view::npos) {
    held_whitespace_ += text;
    return;
  }
  out.content += held_whitespace_;
  out.content += text.substr(0, last_visible + 1);
  held_whitespace_ = text.substr(last_visible + 1);
  last_was_call_ = false;
}

void ToolCallStream::emit_call(ToolCall call, StreamDelta& out) {
  held_whitespace_.clear();  // the run just before a call
  out.tool_calls.push_back({num_tool_calls_++, ids_->next_tool_call_id(), std::move(call.name),
                            std::move(call.arguments)});
  last_was_call_ = true;
}

std::string ToolCallStream::take(size_t num_bytes) {
  std::string taken = buffer_.substr(0, num_bytes);
  buffer_.erase(0, num_bytes);
  // Positions into buffer_ moved: the next scan starts over.
  json_begin_ = 0;
  json_scanned_ = 0;
  json_depth_ = 0;
  json_in_string_ = false;
  json_escaped_ = false;
  return taken;
}

}  // namespace kvp

// Fuzz target: the chat-template (Jinja) interpreter on arbitrary template text and arbitrary
// message JSON, with the interpreter's own limits (jinja::Limits' defaults, as the server runs
// it). The input is split at its first NUL byte:
//
//   <template text> \0 <JSON object>
//
// The JSON object may hold "messages", "tools", "add_generation_prompt" and "extra" (the
// template kwargs), handed to ChatTemplate::render as the server hands a request's; "tool_use"
// (a second template, selected when tools are given) goes through ChatTemplate::parse_named, as
// a tokenizer_config.json's named templates do. Without a NUL, or when the rest is no JSON
// object, the template renders a fixed two-message conversation. detect_tool_call_format reads
// the template text too. Anything but a Status is a bug; so is a render that passes the output
// size limit.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "jinja/template.h"
#include "server/chat_template.h"
#include "server/tool_calls.h"

namespace {

using ordered_json = nlohmann::ordered_json;

ordered_json default_messages() {
  return ordered_json::array({{{"role", "system"}, {"content", "Be brief."}},
                              {{"role", "user"}, {"content", "Hi <b> & \"you\" 👋"}}});
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvp;  // NOLINT(google-build-using-namespace)
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t split = input.find('\0');
  std::string source(input.substr(0, split));
  ordered_json options = ordered_json::object();
  if (split != std::string_view::npos) {
    options = ordered_json::parse(input.substr(split + 1), nullptr, /*allow_exceptions=*/false);
    if (options.is_discarded() || !options.is_object()) options = ordered_json::object();
  }

  (void)detect_tool_call_format(source);
  std::vector<std::pair<std::string, std::string>> named = {{"default", std::move(source)}};
  if (auto it = options.find("tool_use"); it != options.end() && it->is_string()) {
    named.emplace_back("tool_use", it->get<std::string>());
  }
  Result<ChatTemplate> chat_template =
      ChatTemplate::parse_named(std::move(named), "fuzz", "<s>", "</s>");
  if (!chat_template.is_ok()) return 0;

  ChatTemplateInputs inputs;
  inputs.messages = options.contains("messages") ? options["messages"] : default_messages();
  if (options.contains("tools")) inputs.tools = options["tools"];
  if (auto it = options.find("add_generation_prompt"); it != options.end() && it->is_boolean()) {
    inputs.add_generation_prompt = it->get<bool>();
  }
  if (options.contains("extra")) inputs.extra = options["extra"];
  Result<std::string> text = chat_template->render(inputs);
  if (text.is_ok() && text->size() > jinja::Limits{}.max_output_bytes) std::abort();
  return 0;
}

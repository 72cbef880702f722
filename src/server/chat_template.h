// ChatTemplate: a model's chat template (Jinja, run by src/jinja/) turned into the prompt text
// for a list of OpenAI-style messages, the way Hugging Face transformers' apply_chat_template
// renders it (tests/server/ compares the two byte for byte).
//
//   load_chat_template(model, tokenizer, override)  → the template text and bos/eos strings
//   ChatTemplate::parse(...)                          → parsed once
//   render({messages, tools, add_generation_prompt, extra})  → prompt text, from many threads
//
// The rendered text already holds whatever special tokens the template writes (BOS included
// for most templates): encode it with add_special_tokens = false, as transformers does.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "tokenizer/tokenizer.h"

namespace kvp {

namespace jinja {
class Template;
}

struct ChatTemplateInputs {
  // OpenAI messages: role, content (a string, or a list of {type: text, text} parts, passed to
  // the template as given), tool_calls, tool_call_id, name, reasoning_content.
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;  // null, or a list of OpenAI tool objects
  bool add_generation_prompt = true;
  // More template variables (chat_template_kwargs, e.g. enable_thinking); they override
  // bos_token / eos_token but may not name messages, tools, documents or add_generation_prompt.
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
};

class ChatTemplate {
 public:
  // origin names the template in errors ("GGUF tokenizer.chat_template of X", a file path).
  // Empty bos/eos strings leave bos_token / eos_token undefined in the template.
  // Errors: kInvalidArgument naming origin and line:column for a syntax error.
  static Result<ChatTemplate> parse(std::string source, std::string origin, std::string bos_token,
                                    std::string eos_token);
  // A model with named templates (tokenizer_config.json's list of {name, template}): "default"
  // renders, and "tool_use" instead when the inputs carry tools (transformers' choice).
  // Errors: as parse(); kNotFound when there is no "default".
  static Result<ChatTemplate> parse_named(std::vector<std::pair<std::string, std::string>> named,
                                          std::string origin, std::string bos_token,
                                          std::string eos_token);

  // The variables the template sees: messages (keys whose value is null dropped, reasoning
  // aliased to reasoning_content and thinking, as transformers does), tools (none when null),
  // documents (none), add_generation_prompt, bos_token, eos_token, then `extra`.
  // Errors: kInvalidArgument for malformed inputs (messages not a non-empty list of objects),
  // for the template's own failures (raise_exception's message, an undefined value), each
  // naming the origin and line:column; kResourceExhausted past the interpreter's limits.
  // Does not modify the template; safe from many threads at once.
  Result<std::string> render(const ChatTemplateInputs& inputs) const;

  const std::string& source() const { return source_; }  // the default template
  const std::string& origin() const { return origin_; }
  bool has_tool_use_template() const { return tool_use_ != nullptr; }
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }

 private:
  std::string source_;
  std::string origin_;
  std::string bos_token_;
  std::string eos_token_;
  std::shared_ptr<const jinja::Template> default_;
  std::shared_ptr<const jinja::Template> tool_use_;  // null when the model has none
};

// The model's own template:
//   override_file non-empty → that file's text (bos/eos still come from the model);
//   a GGUF file → `tokenizer.chat_template` (and `tokenizer.chat_template.tool_use`), bos/eos
//                 from the vocabulary's bos/eos token ids;
//   a Hugging Face directory → chat_template.jinja (+ additional_chat_templates/tool_use.jinja),
//                 else tokenizer_config.json's `chat_template` (a string, or a list of
//                 {name, template}), else chat_template.json; bos/eos from tokenizer_config.json
//                 (`bos_token` / `eos_token`, a string or {content}), else the vocabulary.
// Errors: kNotFound naming the model and the places looked in when it has no template; file
// and parse errors naming the file.
Result<ChatTemplate> load_chat_template(const std::string& model_path, const Tokenizer& tokenizer,
                                        const std::string& override_file);

}  // namespace kvp

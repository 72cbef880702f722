#include "server/chat_template.h"

#include <filesystem>
#include <fstream>
#include <iterator>

#include "jinja/template.h"
#include "model/gguf_file.h"
#include "model/model_loader.h"

namespace kvp {

namespace fs = std::filesystem;

namespace {

// Names a message's reasoning may come under; the first is what templates read
// (transformers' _REASONING_FIELDS).
constexpr const char* kReasoningFields[] = {"reasoning_content", "thinking", "reasoning"};

Status with_origin(const std::string& origin, const Status& status) {
  return Status(status.code(), fmt::format("chat template ({}): {}", origin, status.message()));
}

Result<std::shared_ptr<const jinja::Template>> compile(const std::string& source,
                                                       const std::string& origin) {
  Result<jinja::Template> parsed = jinja::Template::parse(source);
  if (!parsed.is_ok()) return with_origin(origin, parsed.status());
  return std::make_shared<const jinja::Template>(std::move(parsed).value());
}

// One message as transformers hands it to the template: keys whose value is null dropped
// (apply_chat_template), then reasoning copied to `thinking` (first) and `reasoning_content`
// (_alias_reasoning_fields).
nlohmann::ordered_json prepare_message(const nlohmann::ordered_json& message) {
  nlohmann::ordered_json kept = nlohmann::ordered_json::object();
  for (const auto& [key, value] : message.items()) {
    if (!value.is_null()) kept[key] = value;
  }
  const nlohmann::ordered_json* reasoning = nullptr;
  for (const char* field : kReasoningFields) {
    if (kept.contains(field)) {
      reasoning = &kept[field];
      break;
    }
  }
  if (reasoning == nullptr) return kept;
  const nlohmann::ordered_json value = *reasoning;
  nlohmann::ordered_json aliased = nlohmann::ordered_json::object();
  aliased["thinking"] = value;
  for (const auto& [key, item] : kept.items()) aliased[key] = item;
  aliased["reasoning_content"] = value;
  return aliased;
}

Result<std::string> read_text(const std::string& path, const char* what) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    return Status::not_found("{} '{}' does not exist", what, path);
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::io_error("cannot read {} '{}'", what, path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A special token in tokenizer_config.json: "text" or {"content": "text", ...}.
std::string config_token(const nlohmann::json& config, const char* key) {
  const auto it = config.find(key);
  if (it == config.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return "";
}

std::string vocab_token(const Tokenizer& tokenizer, std::optional<TokenId> id) {
  if (!id || !tokenizer.is_valid_id(*id)) return "";
  return tokenizer.vocab().tokens[*id];
}

struct FoundTemplates {
  std::vector<std::pair<std::string, std::string>> named;  // "default" first
  std::string origin;
  std::string bos_token;
  std::string eos_token;
};

Result<FoundTemplates> find_in_gguf(const std::string& path, const Tokenizer& tokenizer) {
  KVP_ASSIGN_OR_RETURN(GgufFile file, GgufFile::open(path));
  FoundTemplates found;
  found.origin = fmt::format("GGUF tokenizer.chat_template of {}", path);
  found.bos_token = vocab_token(tokenizer, tokenizer.vocab().bos_id);
  found.eos_token = vocab_token(tokenizer, tokenizer.vocab().eos_id);
  if (file.find("tokenizer.chat_template") != nullptr) {
    KVP_ASSIGN_OR_RETURN(std::string_view text, file.get_string("tokenizer.chat_template"));
    found.named.emplace_back("default", std::string(text));
  }
  if (file.find("tokenizer.chat_template.tool_use") != nullptr) {
    KVP_ASSIGN_OR_RETURN(std::string_view text,
                         file.get_string("tokenizer.chat_template.tool_use"));
    found.named.emplace_back("tool_use", std::string(text));
  }
  return found;
}

Result<FoundTemplates> find_in_directory(const std::string& dir, const Tokenizer& tokenizer) {
  FoundTemplates found;
  nlohmann::json config = nlohmann::json::object();
  const fs::path config_path = fs::path(dir) / "tokenizer_config.json";
  std::error_code ec;
  if (fs::exists(config_path, ec)) {
    KVP_ASSIGN_OR_RETURN(std::string text, read_text(config_path.string(), "tokenizer config"));
    config = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object()) {
      return Status::corruption("'{}' is not a JSON object", config_path.string());
    }
  }
  found.bos_token = config.contains("bos_token") ? config_token(config, "bos_token")
                                                 : vocab_token(tokenizer, tokenizer.vocab().bos_id);
  found.eos_token = config.contains("eos_token") ? config_token(config, "eos_token")
                                                 : vocab_token(tokenizer, tokenizer.vocab().eos_id);

  const fs::path jinja_path = fs::path(dir) / "chat_template.jinja";
  if (fs::exists(jinja_path, ec)) {
    KVP_ASSIGN_OR_RETURN(std::string text, read_text(jinja_path.string(), "chat template"));
    found.origin = jinja_path.string();
    found.named.emplace_back("default", std::move(text));
    const fs::path tool_use = fs::path(dir) / "additional_chat_templates" / "tool_use.jinja";
    if (fs::exists(tool_use, ec)) {
      KVP_ASSIGN_OR_RETURN(std::string tool_text, read_text(tool_use.string(), "chat template"));
      found.named.emplace_back("tool_use", std::move(tool_text));
    }
    return found;
  }
  if (config.contains("chat_template")) {
    const nlohmann::json& value = config["chat_template"];
    found.origin = fmt::format("{} chat_template", config_path.string());
    if (value.is_string()) {
      found.named.emplace_back("default", value.get<std::string>());
    } else if (value.is_array()) {
      for (const auto& entry : value) {
        if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") ||
            !entry["name"].is_string() || !entry["template"].is_string()) {
          return Status::corruption("{}: each named template needs a string name and template",
                                    found.origin);
        }
        found.named.emplace_back(entry["name"].get<std::string>(),
                                 entry["template"].get<std::string>());
      }
    } else {
      return Status::corruption("{} is neither a string nor a list", found.origin);
    }
    return found;
  }
  const fs::path json_path = fs::path(dir) / "chat_template.json";
  if (fs::exists(json_path, ec)) {
    KVP_ASSIGN_OR_RETURN(std::string text, read_text(json_path.string(), "chat template"));
    const auto json = nlohmann::json::parse(text, nullptr, false);
    if (json.is_object() && json.contains("chat_template") && json["chat_template"].is_string()) {
      found.origin = json_path.string();
      found.named.emplace_back("default", json["chat_template"].get<std::string>());
    }
  }
  return found;
}

}  // namespace

Result<ChatTemplate> ChatTemplate::parse(std::string source, std::string origin,
                                         std::string bos_token, std::string eos_token) {
  return parse_named({{"default", std::move(source)}}, std::move(origin), std::move(bos_token),
                     std::move(eos_token));
}

Result<ChatTemplate> ChatTemplate::parse_named(
    std::vector<std::pair<std::string, std::string>> named, std::string origin,
    std::string bos_token, std::string eos_token) {
  ChatTemplate t;
  t.origin_ = std::move(origin);
  t.bos_token_ = std::move(bos_token);
  t.eos_token_ = std::move(eos_token);
  for (auto& [name, source] : named) {
    if (name == "default") {
      KVP_ASSIGN_OR_RETURN(t.default_, compile(source, t.origin_));
      t.source_ = std::move(source);
    } else if (name == "tool_use") {
      KVP_ASSIGN_OR_RETURN(t.tool_use_, compile(source, t.origin_ + " (tool_use)"));
    }
  }
  if (t.default_ == nullptr) {
    std::string names;
    for (const auto& [name, source] : named) names += (names.empty() ? "" : ", ") + name;
    return Status::not_found("{} has no template named 'default' (has: {})", t.origin_,
                             names.empty() ? "none" : names);
  }
  return t;
}

Result<std::string> ChatTemplate::render(const ChatTemplateInputs& inputs) const {
  if (!inputs.messages.is_array()) {
    return Status::invalid_argument("chat messages must be a list, not {}",
                                    inputs.messages.type_name());
  }
  if (inputs.messages.empty()) {
    return Status::invalid_argument("cannot apply a chat template to an empty conversation");
  }
  if (!inputs.tools.is_null() && !inputs.tools.is_array()) {
    return Status::invalid_argument("tools must be a list or null, not {}",
                                    inputs.tools.type_name());
  }
  if (!inputs.extra.is_object()) {
    return Status::invalid_argument("chat template kwargs must be an object, not {}",
                                    inputs.extra.type_name());
  }
  nlohmann::ordered_json context = nlohmann::ordered_json::object();
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  for (size_t i = 0; i < inputs.messages.size(); ++i) {
    if (!inputs.messages[i].is_object()) {
      return Status::invalid_argument("chat message {} must be an object, not {}", i,
                                      inputs.messages[i].type_name());
    }
    messages.push_back(prepare_message(inputs.messages[i]));
  }
  context["messages"] = std::move(messages);
  context["tools"] = inputs.tools;
  context["documents"] = nullptr;
  context["add_generation_prompt"] = inputs.add_generation_prompt;
  if (!bos_token_.empty()) context["bos_token"] = bos_token_;
  if (!eos_token_.empty()) context["eos_token"] = eos_token_;
  for (const auto& [key, value] : inputs.extra.items()) {
    if (key == "messages" || key == "tools" || key == "documents" ||
        key == "add_generation_prompt") {
      return Status::invalid_argument("chat template kwarg '{}' would replace the request's own",
                                      key);
    }
    context[key] = value;
  }
  const bool use_tool_template = !inputs.tools.is_null() && tool_use_ != nullptr;
  const jinja::Template& chosen = use_tool_template ? *tool_use_ : *default_;
  Result<std::string> text = chosen.render(context);
  if (!text.is_ok()) return with_origin(origin_, text.status());
  return text;
}

Result<ChatTemplate> load_chat_template(const std::string& model_path, const Tokenizer& tokenizer,
                                        const std::string& override_file) {
  std::error_code ec;
  FoundTemplates found;
  if (fs::is_regular_file(model_path, ec) && is_gguf_file(model_path)) {
    KVP_ASSIGN_OR_RETURN(found, find_in_gguf(model_path, tokenizer));
  } else if (fs::is_directory(model_path, ec)) {
    KVP_ASSIGN_OR_RETURN(found, find_in_directory(model_path, tokenizer));
  } else if (override_file.empty()) {
    return Status::not_found("model '{}' is neither a GGUF file nor a model directory", model_path);
  } else {
    found.bos_token = vocab_token(tokenizer, tokenizer.vocab().bos_id);
    found.eos_token = vocab_token(tokenizer, tokenizer.vocab().eos_id);
  }
  if (!override_file.empty()) {
    KVP_ASSIGN_OR_RETURN(std::string text, read_text(override_file, "chat template file"));
    return ChatTemplate::parse(std::move(text), override_file, found.bos_token, found.eos_token);
  }
  if (found.named.empty()) {
    return Status::not_found(
        "model '{}' has no chat template (looked for GGUF tokenizer.chat_template, or "
        "chat_template.jinja / tokenizer_config.json chat_template / chat_template.json in a "
        "directory); give one with a chat template file",
        model_path);
  }
  return ChatTemplate::parse_named(std::move(found.named), std::move(found.origin),
                                   std::move(found.bos_token), std::move(found.eos_token));
}

}  // namespace kvp

#include "chat.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <iostream>

#include "engine/engine.h"
#include "server/chat_template.h"
#include "tokenizer/detokenizer.h"

namespace kvp::app {
namespace {

constexpr const char* kSession = "chat";

// One reply: submits the whole conversation on the session, streams the text, returns it.
Result<std::string> reply(Engine& engine, const Tokenizer& tokenizer, const ModelSpec& spec,
                          const ChatTemplate& chat_template, const nlohmann::ordered_json& messages,
                          const ChatOptions& o, int32_t* num_cached) {
  ChatTemplateInputs inputs;
  inputs.messages = messages;
  KVP_ASSIGN_OR_RETURN(std::string text, chat_template.render(inputs));
  EncodeOptions encode;
  encode.add_special_tokens = false;
  KVP_ASSIGN_OR_RETURN(std::vector<TokenId> ids, tokenizer.encode(text, encode));
  Request request;
  request.prompt_tokens.assign(ids.begin(), ids.end());
  request.max_tokens = o.max_tokens;
  request.sampling.temperature = o.temperature;
  request.sampling.top_p = o.top_p;
  request.sampling.seed = o.seed;
  request.session = kSession;
  request.prompt_includes_history = true;
  KVP_RETURN_IF_ERROR(engine.submit(std::move(request)).status());
  IncrementalDetokenizer detokenizer(tokenizer, /*skip_special=*/true);
  std::string out;
  while (engine.has_unfinished()) {
    for (const EngineEvent& e : engine.step()) {
      if (e.kind == EngineEvent::Kind::kFinished) {
        *num_cached = e.usage.cached_tokens;
        continue;
      }
      if (std::find(spec.eos_token_ids.begin(), spec.eos_token_ids.end(), e.token_id) !=
          spec.eos_token_ids.end()) {
        continue;
      }
      Result<std::string> piece = detokenizer.push(e.token_id);
      if (!piece.is_ok()) continue;
      out += *piece;
      std::fputs(piece->c_str(), stdout);
      std::fflush(stdout);
    }
  }
  const std::string rest = detokenizer.finish();
  out += rest;
  std::fputs(rest.c_str(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
  return out;
}

Status save(Engine& engine, const nlohmann::ordered_json& messages, const std::string& file) {
  KVP_RETURN_IF_ERROR(engine.save_session(kSession, file));
  std::ofstream out(file + ".json");
  out << messages.dump(1);
  if (!out) return Status::io_error("{}.json: cannot be written", file);
  return Status::ok();
}

Status load(Engine& engine, nlohmann::ordered_json* messages, const std::string& file) {
  std::ifstream in(file + ".json");
  if (!in) return Status::not_found("{}.json: cannot be read (the conversation's messages)", file);
  nlohmann::ordered_json loaded = nlohmann::ordered_json::parse(in, nullptr, false);
  if (loaded.is_discarded() || !loaded.is_array()) {
    return Status::corruption("{}.json: not a list of messages", file);
  }
  const std::vector<EngineSessionInfo> sessions = engine.sessions();
  if (!sessions.empty()) KVP_RETURN_IF_ERROR(engine.delete_session(kSession));
  KVP_RETURN_IF_ERROR(engine.load_session(kSession, file));
  *messages = std::move(loaded);
  return Status::ok();
}

}  // namespace

CLI::App* add_chat_command(CLI::App& app, ChatOptions* o) {
  CLI::App* cmd = app.add_subcommand(
      "chat", "Chat with a model in the terminal (/save FILE, /load FILE, /reset, /exit)");
  add_engine_options(cmd, &o->engine);
  cmd->add_option("--system", o->system, "A system message (default: the template's own)");
  cmd->add_option("--chat-template", o->chat_template,
                  "A Jinja chat template file instead of the model's own");
  cmd->add_option("--max-tokens,-n", o->max_tokens, "Tokens per reply at most")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--temperature", o->temperature, "0: greedy")->check(finite_range(0.0, 100.0));
  cmd->add_option("--top-p", o->top_p, "Nucleus sampling mass, (0, 1]")
      ->check(finite_range(0.0, 1.0));
  cmd->add_option("--seed", o->seed, "Sampling seed");
  return cmd;
}

int run_chat(const ChatOptions& o) {
  auto fail = [](const std::string& message) {
    fmt::print(stderr, "kvpool chat: {}\n", message);
    return 2;
  };
  Result<LoadedModel> loaded = load_model(o.engine, /*need_tokenizer=*/true);
  if (!loaded.is_ok()) return fail(loaded.status().to_string());
  const Tokenizer& tokenizer = *loaded->tokenizer;
  ForwardBackend& backend = *loaded->backend;
  Result<ChatTemplate> chat_template =
      load_chat_template(o.engine.model, tokenizer, o.chat_template);
  if (!chat_template.is_ok()) return fail(chat_template.status().to_string());
  Result<EngineConfig> config = make_engine_config(o.engine, backend);
  if (!config.is_ok()) return fail(config.status().message());
  config->tokenizer = &tokenizer;
  Result<std::unique_ptr<Engine>> engine = Engine::create(&backend, *config);
  if (!engine.is_ok()) return fail(engine.status().to_string());

  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (!o.system.empty()) messages.push_back({{"role", "system"}, {"content", o.system}});
  const nlohmann::ordered_json initial = messages;
  fmt::print(stderr, "kvpool chat: {} — /save FILE, /load FILE, /reset, /exit\n", o.engine.model);
  std::string line;
  while (true) {
    std::fputs("> ", stdout);
    std::fflush(stdout);
    if (!std::getline(std::cin, line)) break;
    if (line.empty()) continue;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      messages = initial;
      if (!(*engine)->sessions().empty()) (void)(*engine)->delete_session(kSession);
      fmt::print("(new conversation)\n");
      continue;
    }
    if (line.rfind("/save ", 0) == 0 || line.rfind("/load ", 0) == 0) {
      const std::string file = line.substr(6);
      const bool saving = line[1] == 's';
      Status st = saving ? save(**engine, messages, file) : load(**engine, &messages, file);
      if (!st.is_ok()) {
        fmt::print("({} failed: {})\n", saving ? "save" : "load", st.to_string());
      } else {
        fmt::print("({} {}: {} messages)\n", saving ? "saved to" : "loaded from", file,
                   messages.size());
      }
      continue;
    }
    if (line[0] == '/') {
      fmt::print("(commands: /save FILE, /load FILE, /reset, /exit)\n");
      continue;
    }
    messages.push_back({{"role", "user"}, {"content", line}});
    int32_t num_cached = 0;
    Result<std::string> text =
        reply(**engine, tokenizer, backend.spec(), *chat_template, messages, o, &num_cached);
    if (!text.is_ok()) {
      messages.erase(messages.end() - 1);
      fmt::print("(error: {})\n", text.status().to_string());
      continue;
    }
    messages.push_back({{"role", "assistant"}, {"content", *text}});
    fmt::print(stderr, "[kvpool] {} tokens of the conversation reused\n", num_cached);
  }
  return 0;
}

}  // namespace kvp::app

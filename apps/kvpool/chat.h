// `kvpool chat`: an interactive terminal chat with a model, through its chat template (the
// path `serve` and `generate` use). The conversation is one engine session, so each turn
// prefills only its new tokens; replies stream as they are sampled. Commands: /save FILE,
// /load FILE (the session's cache file, and FILE.json with the messages), /reset, /exit.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "engine_options.h"

namespace kvp::app {

struct ChatOptions {
  EngineOptions engine;
  std::string system;         // a system message (none: the template's default)
  std::string chat_template;  // a Jinja file instead of the model's own
  int32_t max_tokens = 512;   // per reply
  float temperature = 0.7f;
  float top_p = 0.95f;
  std::optional<uint64_t> seed;
};

CLI::App* add_chat_command(CLI::App& app, ChatOptions* options);
// Reads turns from standard input until /exit or its end. Exit code: 0, 2 for bad options or a
// model that does not load.
int run_chat(const ChatOptions& options);

}  // namespace kvp::app

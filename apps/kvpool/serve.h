// `kvpool serve`: the OpenAI-compatible HTTP server (src/server/, docs/server.md) over one
// model and one engine. SIGINT / SIGTERM shut it down gracefully: no new requests, in-flight
// ones finish within --grace seconds, sessions are saved to --session-dir.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

#include "engine_options.h"

namespace kvp::app {

struct ServeOptions {
  EngineOptions engine;
  std::string host = "127.0.0.1";
  int32_t port = 8080;  // 0: any free port (printed)
  std::string api_key;
  std::string api_key_file;  // one key per line
  std::string session_dir;
  int32_t max_queue = 256;
  std::string chat_template;  // a Jinja file instead of the model's own
  std::string tool_call_parser = "auto";
  std::string served_model_name;  // default: the model file's name
  std::string max_body = "16MiB";
  int32_t max_connections = 1024;
  int32_t grace_seconds = 30;
  bool quiet = false;  // no per-request log lines
};

CLI::App* add_serve_command(CLI::App& app, ServeOptions* options);
// Exit code: 0 after a clean shutdown, 2 for bad options or a model that does not load, 1 if
// the socket cannot be bound.
int run_serve(const ServeOptions& options);

}  // namespace kvp::app

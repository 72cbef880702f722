#include "serve.h"

#include <fmt/format.h>
#include <signal.h>

#include <atomic>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <thread>

#include "engine/engine_front.h"
#include "model/model_loader.h"
#include "server/chat_template.h"
#include "server/http_server.h"
#include "server/server_metrics.h"
#include "server/tool_calls.h"

namespace kvp::app {
namespace {

namespace fs = std::filesystem;

volatile std::sig_atomic_t g_signal = 0;  // the last SIGINT / SIGTERM received

Result<std::vector<std::string>> read_api_keys(const ServeOptions& o) {
  std::vector<std::string> keys;
  if (!o.api_key.empty()) keys.push_back(o.api_key);
  if (!o.api_key_file.empty()) {
    std::ifstream in(o.api_key_file);
    if (!in) return Status::not_found("--api-key-file {}: cannot be read", o.api_key_file);
    std::string line;
    while (std::getline(in, line)) {
      while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
      if (!line.empty() && line[0] != '#') keys.push_back(line);
    }
    if (keys.empty()) {
      return Status::invalid_argument("--api-key-file {}: holds no key", o.api_key_file);
    }
  }
  for (const std::string& key : keys) {
    if (key.size() < 8 || key.size() > 512) {
      return Status::invalid_argument("an API key must have 8 to 512 characters");
    }
  }
  return keys;
}

}  // namespace

CLI::App* add_serve_command(CLI::App& app, ServeOptions* o) {
  CLI::App* cmd = app.add_subcommand(
      "serve", "An OpenAI-compatible HTTP server with sessions that keep their KV between turns");
  add_engine_options(cmd, &o->engine, ModelChoice::kFileOrRandom);
  cmd->add_option("--host", o->host, "address to listen on (default: localhost only)")
      ->capture_default_str();
  cmd->add_option("--port", o->port, "port (0: any free port, printed)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  auto* key = cmd->add_option("--api-key", o->api_key,
                              "require Authorization: Bearer KEY on every endpoint but /health");
  cmd->add_option("--api-key-file", o->api_key_file, "as --api-key, one key per line")
      ->excludes(key);
  cmd->add_option("--session-dir", o->session_dir,
                  "folder for saved sessions (/v1/sessions/{id}/save, and at shutdown)");
  cmd->add_option("--max-queue", o->max_queue,
                  "requests waiting beyond the running batch before answering 429")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--chat-template", o->chat_template,
                  "a Jinja chat template file instead of the model's own");
  cmd->add_option("--tool-call-parser", o->tool_call_parser,
                  "how the model writes tool calls: auto (from the template), hermes, "
                  "llama3_json, mistral, none")
      ->capture_default_str();
  cmd->add_option("--served-model-name", o->served_model_name,
                  "the model's name in the API (default: the file's name)");
  cmd->add_option("--max-body", o->max_body, "largest request body (413 above)")
      ->capture_default_str();
  cmd->add_option("--max-connections", o->max_connections,
                  "connection threads; each open stream holds one")
      ->check(CLI::Range(8, 1 << 16))
      ->capture_default_str();
  cmd->add_option("--grace", o->grace_seconds,
                  "seconds in-flight requests get to finish at shutdown")
      ->check(CLI::Range(0, 3600))
      ->capture_default_str();
  cmd->add_flag("--quiet", o->quiet, "no log line per request");
  return cmd;
}

int run_serve(const ServeOptions& o) {
  auto fail = [](const std::string& message) {
    fmt::print(stderr, "kvpool serve: {}\n", message);
    return 2;
  };
  if (Status s = check_engine_options(o.engine); !s.is_ok()) return fail(s.message());
  Result<std::vector<std::string>> keys = read_api_keys(o);
  if (!keys.is_ok()) return fail(keys.status().message());
  Result<int64_t> max_body = parse_size(o.max_body, "--max-body");
  if (!max_body.is_ok()) return fail(max_body.status().message());
  if (!o.session_dir.empty()) {
    std::error_code ec;
    fs::create_directories(o.session_dir, ec);
    if (!fs::is_directory(o.session_dir, ec)) {
      return fail(fmt::format("--session-dir {}: not a folder that can be created", o.session_dir));
    }
  }
  // SIGINT and SIGTERM only set a flag (threads that libraries start, OpenBLAS's among them,
  // may receive them); a watcher thread below acts on it.
  struct sigaction action = {};
  action.sa_handler = [](int sig) { g_signal = sig; };
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  signal(SIGPIPE, SIG_IGN);

  Result<LoadedModel> loaded = load_model(o.engine, /*need_tokenizer=*/true);
  if (!loaded.is_ok()) return fail(loaded.status().to_string());
  const Tokenizer& tokenizer = *loaded->tokenizer;
  ForwardBackend& backend = *loaded->backend;

  // A random model (benchmarks of a shape) takes its template from --tokenizer's file, if any.
  const bool random = !o.engine.random_model.empty();
  Result<ChatTemplate> chat_template =
      load_chat_template(random ? o.engine.tokenizer : o.engine.model, tokenizer, o.chat_template);
  if (!chat_template.is_ok() && !o.chat_template.empty()) {
    return fail(chat_template.status().to_string());
  }
  if (!chat_template.is_ok()) {
    fmt::print(stderr, "kvpool serve: {}; /v1/chat/completions is refused\n",
               chat_template.status().message());
  }
  ToolCallFormat tool_format = ToolCallFormat::kNone;
  if (o.tool_call_parser == "auto") {
    if (chat_template.is_ok()) tool_format = detect_tool_call_format(chat_template->source());
  } else {
    Result<ToolCallFormat> parsed = parse_tool_call_format(o.tool_call_parser);
    if (!parsed.is_ok()) return fail("--tool-call-parser: " + parsed.status().message());
    tool_format = *parsed;
  }

  Result<EngineConfig> made = make_engine_config(o.engine, backend);
  if (!made.is_ok()) return fail(made.status().message());
  EngineConfig config = std::move(made).value();
  config.tokenizer = &tokenizer;
  Result<std::unique_ptr<Engine>> engine = Engine::create(&backend, config);
  if (!engine.is_ok()) return fail(engine.status().to_string());
  EngineFront front(std::move(engine).value());

  IdSource ids;
  server::ServerMetrics metrics(&front);
  server::ServerContext context;
  context.engine = &front;
  context.tokenizer = &tokenizer;
  context.chat_template = chat_template.is_ok() ? &*chat_template : nullptr;
  context.tool_call_format = tool_format;
  context.ids = &ids;
  context.metrics = &metrics;
  context.model_name = o.served_model_name;
  if (context.model_name.empty()) {
    context.model_name =
        random ? o.engine.random_model + "-random" : fs::path(o.engine.model).filename().string();
  }
  if (context.model_name.empty()) context.model_name = o.engine.model;
  context.context_length = backend.spec().context_length;
  context.pool_tokens = config.num_blocks * config.block_size;
  context.eos_token_ids = backend.spec().eos_token_ids;
  context.log_requests = !o.quiet;

  server::HttpServerConfig http;
  http.host = o.host;
  http.port = o.port;
  http.api_keys = std::move(keys).value();
  http.session_dir = o.session_dir;
  http.max_queue = o.max_queue;
  http.max_running = config.max_num_seqs;
  http.max_body_bytes = static_cast<size_t>(*max_body);
  http.max_connections = o.max_connections;
  http.grace = std::chrono::seconds(o.grace_seconds);
  server::HttpServer server(&context, &metrics, http);
  const int32_t num_restored = server.restore_sessions();
  if (Status s = server.bind(); !s.is_ok()) {
    fmt::print(stderr, "kvpool serve: {}\n", s.message());
    return 1;
  }
  fmt::print(stderr,
             "kvpool serve: {} ({}) on {}, KV {} x {} blocks of {} tokens, chat template {}, "
             "tool calls {}, {} session(s) restored, API keys {}\n",
             context.model_name, architecture_name(backend.spec().architecture),
             backend.device_name(), dtype_name(config.kv_dtype), config.num_blocks,
             config.block_size, chat_template.is_ok() ? chat_template->origin() : "none",
             tool_call_format_name(tool_format), num_restored,
             http.api_keys.empty() ? "off" : "on");
  fmt::print(stderr, "kvpool serve: listening on http://{}:{}\n", o.host, server.port());

  std::atomic<bool> stopped{false};
  std::thread signal_thread([&] {
    while (!stopped) {
      if (const int sig = g_signal; sig != 0) {
        fmt::print(stderr, "kvpool serve: {}: shutting down (grace {} s)\n",
                   sig == SIGINT ? "SIGINT" : "SIGTERM", o.grace_seconds);
        server.shutdown();
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  server.serve();
  stopped = true;
  signal_thread.join();
  fmt::print(stderr, "kvpool serve: stopped\n");
  return 0;
}

}  // namespace kvp::app

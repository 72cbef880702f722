#include "server/http_server.h"

#include <fmt/format.h>
#include <httplib.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <sys/socket.h>

#include <cstdio>
#include <thread>

namespace kvp::server {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr auto kPollWait = 500ms;  // an idle stream writes a ping this often (disconnects)

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Compares without an early exit, so the time taken does not tell how much of a key matched.
bool constant_time_equal(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

std::string owner_of_key(const std::string& key) {
  return fmt::format("k{:016x}", XXH64(key.data(), key.size(), 0x6b7670));
}

}  // namespace

struct HttpServer::Active {
  RequestId request_id;
  EngineFront* engine;
};

HttpServer::HttpServer(ServerContext* context, ServerMetrics* metrics, HttpServerConfig config)
    : context_(context),
      metrics_(metrics),
      config_(std::move(config)),
      http_(std::make_unique<httplib::Server>()) {
  const int threads = std::max(8, config_.max_connections);
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http_->set_payload_max_length(config_.max_body_bytes);
  http_->set_read_timeout(30, 0);
  http_->set_write_timeout(30, 0);
  http_->set_keep_alive_timeout(5);
  add_routes();
}

HttpServer::~HttpServer() = default;

void HttpServer::reply_json(httplib::Response& res, const json& body, int status) {
  res.status = status;
  res.set_content(body.dump(), "application/json");
}

void HttpServer::reply_error(httplib::Response& res, const ApiError& error) {
  if (metrics_) metrics_->observe_error(error.http_status);
  if (error.retry_after_s > 0) res.set_header("Retry-After", std::to_string(error.retry_after_s));
  reply_json(res, error_json(error), error.http_status);
}

bool HttpServer::authorize(const httplib::Request& req, std::string* owner) const {
  if (config_.api_keys.empty()) {
    *owner = "anon";
    return true;
  }
  const std::string header = req.get_header_value("Authorization");
  constexpr std::string_view kBearer = "Bearer ";
  if (header.size() <= kBearer.size() || header.compare(0, kBearer.size(), kBearer) != 0) {
    return false;
  }
  const std::string key = header.substr(kBearer.size());
  bool found = false;
  for (const std::string& k : config_.api_keys) found |= constant_time_equal(k, key);
  if (found) *owner = owner_of_key(key);
  return found;
}

void HttpServer::add_routes() {
  httplib::Server& s = *http_;
  // Every route but /health checks the key first.
  auto guarded = [this](auto handler) {
    return [this, handler](const httplib::Request& req, httplib::Response& res) {
      std::string owner;
      if (!authorize(req, &owner)) {
        res.set_header("WWW-Authenticate", "Bearer");
        reply_error(res, ApiError::unauthorized(
                             "a valid API key is required: Authorization: Bearer <key>"));
        return;
      }
      handler(req, res, owner);
    };
  };
  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (shutting_down_) {
      reply_error(res, ApiError::unavailable("the server is shutting down"));
      return;
    }
    reply_json(res, {{"status", "ok"}});
  });
  s.Get("/v1/models",
        guarded([this](const httplib::Request&, httplib::Response& res, const std::string&) {
          json model = {{"id", context_->model_name},
                        {"object", "model"},
                        {"created", unix_seconds()},
                        {"owned_by", "kvpool"}};
          if (context_->context_length > 0) model["max_model_len"] = context_->context_length;
          reply_json(res, {{"object", "list"}, {"data", json::array({model})}});
        }));
  s.Get("/metrics",
        guarded([this](const httplib::Request&, httplib::Response& res, const std::string&) {
          res.set_content(metrics_->render(), kPrometheusContentType);
        }));
  s.Post("/v1/chat/completions",
         guarded([this](const httplib::Request& req, httplib::Response& res,
                        const std::string& owner) { handle_generation(req, res, true, owner); }));
  s.Post("/v1/completions",
         guarded([this](const httplib::Request& req, httplib::Response& res,
                        const std::string& owner) { handle_generation(req, res, false, owner); }));
  s.Post("/tokenize", guarded([this](const httplib::Request& req, httplib::Response& res,
                                     const std::string&) { handle_tokenize(req, res); }));
  s.Post("/detokenize", guarded([this](const httplib::Request& req, httplib::Response& res,
                                       const std::string&) { handle_detokenize(req, res); }));
  s.Get("/v1/sessions", guarded([this](const httplib::Request&, httplib::Response& res,
                                       const std::string& owner) { list_sessions(res, owner); }));
  s.Get(R"(/v1/sessions/([^/]+))",
        guarded([this](const httplib::Request& req, httplib::Response& res,
                       const std::string& owner) { handle_session(req, res, "get", owner); }));
  s.Delete(
      R"(/v1/sessions/([^/]+))",
      guarded([this](const httplib::Request& req, httplib::Response& res,
                     const std::string& owner) { handle_session(req, res, "delete", owner); }));
  s.Post(R"(/v1/sessions/([^/]+)/(save|load))",
         guarded(
             [this](const httplib::Request& req, httplib::Response& res, const std::string& owner) {
               handle_session(req, res, req.matches[2].str(), owner);
             }));
  s.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 413) {
      reply_error(res, ApiError::payload_too_large(fmt::format(
                           "the body is over the limit of {} bytes", config_.max_body_bytes)));
    } else if (res.status == 404) {
      reply_error(res,
                  ApiError::not_found(fmt::format("no route for {} {}", req.method, req.path)));
    } else {
      ApiError error = ApiError::bad_request("", fmt::format("HTTP status {}", res.status));
      error.http_status = res.status;
      reply_error(res, error);
    }
  });
  s.set_exception_handler(
      [this](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown exception";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        reply_error(res, ApiError::internal("internal error: " + what));
      });
}

void HttpServer::handle_generation(const httplib::Request& req, httplib::Response& res, bool chat,
                                   const std::string& owner) {
  if (shutting_down_) {
    reply_error(res, ApiError::unavailable("the server is shutting down"));
    return;
  }
  auto body = parse_request_body(req.body, context_->limits);
  if (auto* error = std::get_if<ApiError>(&body)) {
    reply_error(res, *error);
    return;
  }
  auto parsed = parse_generation_request(std::get<json>(body), chat, context_->limits);
  if (auto* error = std::get_if<ApiError>(&parsed)) {
    reply_error(res, *error);
    return;
  }
  GenerationRequest request = std::move(std::get<GenerationRequest>(parsed));
  if (!request.session_id && req.has_header("X-Session-Id")) {
    request.session_id = req.get_header_value("X-Session-Id");
    if (Status st = validate_session_id(*request.session_id); !st.is_ok()) {
      reply_error(res, ApiError::bad_request("X-Session-Id", st.message()));
      return;
    }
    if (request.n != 1) {
      reply_error(res, ApiError::bad_request("n", "a request with a session takes n = 1"));
      return;
    }
  }
  std::optional<std::string> engine_session;
  if (request.session_id) engine_session = owner + "/" + *request.session_id;
  // The queue: running batch plus max_queue waiting, then 429.
  const int32_t limit = config_.max_running + config_.max_queue;
  if (num_active_.fetch_add(1) >= limit) {
    num_active_.fetch_sub(1);
    reply_error(res, ApiError::too_many_requests(
                         fmt::format("the server has {} requests in flight, its limit "
                                     "(--max-seqs {} + --max-queue {}); retry later",
                                     limit, config_.max_running, config_.max_queue),
                         1));
    return;
  }
  auto started = Generation::start(*context_, std::move(request), engine_session);
  if (auto* error = std::get_if<ApiError>(&started)) {
    num_active_.fetch_sub(1);
    if (engine_session && error->message.find(*engine_session) != std::string::npos) {
      error->message.replace(error->message.find(*engine_session), owner.size() + 1, "");
    }
    reply_error(res, *error);
    return;
  }
  std::shared_ptr<Generation> generation =
      std::move(std::get<std::unique_ptr<Generation>>(started));
  if (engine_session) touch_session(*engine_session);
  auto active = std::make_shared<Active>(Active{generation->request_id(), context_->engine});
  {
    std::lock_guard lock(active_mutex_);
    active_.insert(active.get());
  }
  const bool stream = std::get<json>(body).value("stream", false);
  // The request leaves the in-flight count once its last byte is written (a client may send its
  // next turn before httplib is done with this connection), or when httplib gives up on it.
  auto counted = std::make_shared<std::atomic<bool>>(true);
  auto leave = [this, counted] {
    if (counted->exchange(false)) num_active_.fetch_sub(1);
  };
  auto release = [this, generation, active, engine_session, leave](bool success) {
    if (!success) generation->abandon(std::chrono::seconds(10));
    {
      std::lock_guard lock(active_mutex_);
      active_.erase(active.get());
    }
    if (engine_session) touch_session(*engine_session);
    leave();
  };
  if (stream) {
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream",
        [generation, leave](size_t, httplib::DataSink& sink) {
          std::vector<std::string> payloads;
          const bool more = generation->poll_stream(kPollWait, &payloads);
          std::string out;
          for (const std::string& p : payloads) out += "data: " + p + "\n\n";
          if (out.empty()) out = ": ping\n\n";  // a write that fails tells a client is gone
          if (!sink.write(out.data(), out.size())) {
            generation->cancel();
            return false;
          }
          if (!more) {
            leave();
            sink.done();
          }
          return true;
        },
        release);
    return;
  }
  // Not streamed: JSON after leading whitespace, one space per idle poll, so a client that went
  // away is noticed (the write fails) and its request cancelled.
  res.set_chunked_content_provider(
      "application/json",
      [generation, leave](size_t, httplib::DataSink& sink) {
        json response;
        if (!generation->poll_response(kPollWait, &response)) {
          if (!sink.write(" ", 1)) {
            generation->cancel();
            return false;
          }
          return true;
        }
        const std::string text = response.dump();
        leave();
        if (!sink.write(text.data(), text.size())) return false;
        sink.done();
        return true;
      },
      release);
}

void HttpServer::handle_tokenize(const httplib::Request& req, httplib::Response& res) {
  auto body = parse_request_body(req.body, context_->limits);
  if (auto* error = std::get_if<ApiError>(&body)) {
    reply_error(res, *error);
    return;
  }
  const json& b = std::get<json>(body);
  const bool chat = b.contains("messages");
  json request_body = b;
  if (!chat && !b.contains("prompt")) {
    reply_error(res, ApiError::bad_request("prompt", "give 'prompt' or 'messages'"));
    return;
  }
  if (!chat && !b["prompt"].is_string()) {
    reply_error(res, ApiError::bad_request("prompt", "'prompt' must be a string"));
    return;
  }
  auto parsed = parse_generation_request(request_body, chat, context_->limits);
  if (auto* error = std::get_if<ApiError>(&parsed)) {
    reply_error(res, *error);
    return;
  }
  GenerationRequest& request = std::get<GenerationRequest>(parsed);
  std::vector<int32_t> ids;
  if (!chat && b.contains("add_special_tokens") && b["add_special_tokens"].is_boolean() &&
      !b["add_special_tokens"].get<bool>()) {
    EncodeOptions options;
    options.add_special_tokens = false;
    Result<std::vector<TokenId>> encoded =
        context_->tokenizer->encode(std::get<std::string>(request.prompt), options);
    if (!encoded.is_ok()) {
      reply_error(res, ApiError::bad_request("prompt", encoded.status().message()));
      return;
    }
    ids.assign(encoded->begin(), encoded->end());
  } else {
    auto tokens = prompt_token_ids(*context_, request);
    if (auto* error = std::get_if<ApiError>(&tokens)) {
      reply_error(res, *error);
      return;
    }
    ids = std::move(std::get<std::vector<int32_t>>(tokens));
  }
  json out = {{"tokens", ids}, {"count", ids.size()}};
  if (context_->context_length > 0) out["max_model_len"] = context_->context_length;
  reply_json(res, out);
}

void HttpServer::handle_detokenize(const httplib::Request& req, httplib::Response& res) {
  auto body = parse_request_body(req.body, context_->limits);
  if (auto* error = std::get_if<ApiError>(&body)) {
    reply_error(res, *error);
    return;
  }
  auto ids = parse_detokenize_request(std::get<json>(body),
                                      static_cast<int64_t>(context_->tokenizer->num_tokens()));
  if (auto* error = std::get_if<ApiError>(&ids)) {
    reply_error(res, *error);
    return;
  }
  Result<std::string> text = context_->tokenizer->decode(std::get<std::vector<int32_t>>(ids));
  if (!text.is_ok()) {
    reply_error(res, ApiError::bad_request("tokens", text.status().message()));
    return;
  }
  reply_json(res, {{"prompt", *text}});
}

void HttpServer::touch_session(const std::string& engine_name) {
  std::lock_guard lock(last_used_mutex_);
  last_used_[engine_name] = unix_seconds();
}

json HttpServer::session_json(const EngineSessionInfo& info, const std::string& id) const {
  int64_t last_used = 0;
  {
    std::lock_guard lock(const_cast<std::mutex&>(last_used_mutex_));
    auto it = last_used_.find(info.name);
    if (it != last_used_.end()) last_used = it->second;
  }
  return {{"id", id},
          {"object", "session"},
          {"tokens", info.num_tokens},
          {"kv_tokens", info.num_kv_tokens},
          {"tier", session_tier_name(info.tier)},
          {"busy", info.busy},
          {"turns", info.num_turns},
          {"resumed_tokens", info.num_resumed_tokens},
          {"last_used", last_used}};
}

void HttpServer::list_sessions(httplib::Response& res, const std::string& owner) {
  json data = json::array();
  const std::string prefix = owner + "/";
  for (const EngineSessionInfo& info : context_->engine->sessions()) {
    if (info.name.compare(0, prefix.size(), prefix) != 0) continue;
    data.push_back(session_json(info, info.name.substr(prefix.size())));
  }
  reply_json(res, {{"object", "list"}, {"data", data}});
}

fs::path HttpServer::session_file(const std::string& owner, const std::string& id) const {
  return fs::path(config_.session_dir) / owner / (id + ".kvc");
}

void HttpServer::handle_session(const httplib::Request& req, httplib::Response& res,
                                const std::string& action, const std::string& owner) {
  const std::string id = req.matches[1].str();
  if (Status st = validate_session_id(id); !st.is_ok()) {
    reply_error(res, ApiError::bad_request("session_id", st.message()));
    return;
  }
  const std::string name = owner + "/" + id;
  auto find = [&]() -> std::optional<EngineSessionInfo> {
    for (EngineSessionInfo& info : context_->engine->sessions()) {
      if (info.name == name) return info;
    }
    return std::nullopt;
  };
  auto fail = [&](const Status& st) {
    std::string message = st.message();
    for (size_t at; (at = message.find(name)) != std::string::npos;) {
      message.replace(at, name.size(), id);
    }
    reply_error(res, ApiError::from_status(Status(st.code(), message), "session_id"));
  };
  if (action == "get") {
    std::optional<EngineSessionInfo> info = find();
    if (!info) {
      reply_error(res, ApiError::not_found(fmt::format("session '{}' does not exist", id)));
      return;
    }
    reply_json(res, session_json(*info, id));
    return;
  }
  if (action == "delete") {
    if (Status st = context_->engine->delete_session(name); !st.is_ok()) {
      fail(st);
      return;
    }
    {
      std::lock_guard lock(last_used_mutex_);
      last_used_.erase(name);
    }
    reply_json(res, {{"id", id}, {"object", "session"}, {"deleted", true}});
    return;
  }
  if (config_.session_dir.empty()) {
    reply_error(res, ApiError::bad_request("session_id",
                                           "the server has no session folder (start it with "
                                           "--session-dir DIR)"));
    return;
  }
  const fs::path file = session_file(owner, id);
  if (action == "save") {
    std::error_code ec;
    fs::create_directories(file.parent_path(), ec);
    fs::path tmp = file;
    tmp += ".tmp";
    if (Status st = context_->engine->save_session(name, tmp); !st.is_ok()) {
      fs::remove(tmp, ec);
      fail(st);
      return;
    }
    fs::rename(tmp, file, ec);
    if (ec) {
      reply_error(res,
                  ApiError::internal(fmt::format("saving session '{}': {}", id, ec.message())));
      return;
    }
    const std::optional<EngineSessionInfo> info = find();
    json out = info ? session_json(*info, id) : json{{"id", id}};
    out["saved"] = true;
    reply_json(res, out);
    return;
  }
  // load
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) {
    reply_error(res, ApiError::not_found(fmt::format("session '{}' has no saved file", id)));
    return;
  }
  if (find()) {
    if (Status st = context_->engine->delete_session(name); !st.is_ok()) {
      fail(st);
      return;
    }
  }
  if (Status st = context_->engine->load_session(name, file); !st.is_ok()) {
    fail(st);
    return;
  }
  touch_session(name);
  const std::optional<EngineSessionInfo> info = find();
  json out = info ? session_json(*info, id) : json{{"id", id}};
  out["loaded"] = true;
  reply_json(res, out);
}

int32_t HttpServer::restore_sessions() {
  if (config_.session_dir.empty()) return 0;
  std::error_code ec;
  if (!fs::is_directory(config_.session_dir, ec)) return 0;
  int32_t num_loaded = 0;
  for (const fs::directory_entry& owner_dir : fs::directory_iterator(config_.session_dir, ec)) {
    if (!owner_dir.is_directory()) continue;
    const std::string owner = owner_dir.path().filename().string();
    for (const fs::directory_entry& entry : fs::directory_iterator(owner_dir.path(), ec)) {
      if (entry.path().extension() != ".kvc" || !entry.is_regular_file()) continue;
      const std::string id = entry.path().stem().string();
      if (!validate_session_id(id).is_ok()) continue;
      // the file is copied aside: the engine reads the session from it while a later save
      // writes a new one in its place
      Status st = context_->engine->load_session(owner + "/" + id, entry.path());
      if (!st.is_ok()) {
        std::fprintf(stderr, "[kvpool] session %s/%s not restored: %s\n", owner.c_str(), id.c_str(),
                     st.to_string().c_str());
        continue;
      }
      touch_session(owner + "/" + id);
      ++num_loaded;
    }
  }
  return num_loaded;
}

Status HttpServer::bind() {
  // Debian's cpp-httplib listens with a backlog of 5: a burst of connects overflows it and the
  // dropped ones retry after 1 s and 3 s (docs/server.md). The socket is kept here and listened
  // on again with the system's largest backlog once bound.
  int listen_fd = -1;
  http_->set_socket_options([&listen_fd](socket_t fd) {
    int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    listen_fd = fd;
  });
  if (config_.port == 0) {
    port_ = http_->bind_to_any_port(config_.host);
    if (port_ <= 0) return Status::io_error("cannot listen on {} (any port)", config_.host);
  } else {
    if (!http_->bind_to_port(config_.host, config_.port)) {
      return Status::io_error("cannot listen on {}:{} (in use, or not an address of this host)",
                              config_.host, config_.port);
    }
    port_ = config_.port;
  }
  if (listen_fd >= 0) ::listen(listen_fd, SOMAXCONN);
  return Status::ok();
}

void HttpServer::serve() { http_->listen_after_bind(); }

void HttpServer::shutdown() {
  if (shutting_down_.exchange(true)) return;
  const auto deadline = std::chrono::steady_clock::now() + config_.grace;
  while (num_active_.load() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(50ms);
  }
  {
    std::lock_guard lock(active_mutex_);
    for (Active* a : active_) a->engine->cancel(a->request_id);
  }
  while (num_active_.load() > 0) std::this_thread::sleep_for(20ms);
  if (!config_.session_dir.empty()) {
    int32_t num_saved = 0;
    for (const EngineSessionInfo& info : context_->engine->sessions()) {
      const size_t slash = info.name.find('/');
      if (slash == std::string::npos || info.num_tokens == 0) continue;
      const fs::path file = session_file(info.name.substr(0, slash), info.name.substr(slash + 1));
      std::error_code ec;
      fs::create_directories(file.parent_path(), ec);
      fs::path tmp = file;
      tmp += ".tmp";
      Status st = context_->engine->save_session(info.name, tmp);
      if (st.is_ok()) fs::rename(tmp, file, ec);
      if (!st.is_ok() || ec) {
        fs::remove(tmp, ec);
        std::fprintf(stderr, "[kvpool] session %s not saved: %s\n", info.name.c_str(),
                     st.is_ok() ? ec.message().c_str() : st.to_string().c_str());
        continue;
      }
      ++num_saved;
    }
    std::fprintf(stderr, "[kvpool] saved %d session(s) to %s\n", num_saved,
                 config_.session_dir.c_str());
  }
  http_->stop();
}

}  // namespace kvp::server

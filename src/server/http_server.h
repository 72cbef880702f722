// HttpServer: the HTTP plumbing of `kvpool serve` on cpp-httplib (docs/server.md says why):
// routes, API keys, size and queue limits, SSE framing, sessions' owners, shutdown.
//
//   connection thread (httplib pool) ─▶ auth ─▶ route ─▶ parse (openai_api.h)
//        ─▶ Generation::start (generation.h) ─▶ EngineFront (its own thread)
//        ◀─ chunked provider: poll_stream / poll_response, a ping while idle
// The engine loop never touches a socket: it pushes events into each request's queue and a
// connection thread writes them; a slow reader stalls only its own thread, and a write that
// fails (the client went away) cancels its request, so its blocks return to the pool.
// Sessions are namespaced by API key: the engine's name of session `id` is "<owner>/<id>", the
// owner a hash of the key ("anon" without keys), so another key's request cannot see it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "server/generation.h"
#include "server/server_metrics.h"

namespace httplib {
class Server;
class Request;
class Response;
}  // namespace httplib

namespace kvp::server {

struct HttpServerConfig {
  std::string host = "127.0.0.1";
  int port = 8080;                    // 0: any free port (port() tells which)
  std::vector<std::string> api_keys;  // empty: no authentication
  std::string session_dir;            // save/load and shutdown saves (empty: none)
  int32_t max_queue = 256;            // requests beyond the running batch before 429
  int32_t max_running = 64;           // the engine's --max-seqs
  size_t max_body_bytes = 16 << 20;   // 413 above
  int32_t max_connections = 1024;     // connection threads (each open stream holds one)
  std::chrono::seconds grace{30};     // shutdown: in-flight requests finish within this
};

class HttpServer {
 public:
  // context and metrics: not owned, outlive the server.
  HttpServer(ServerContext* context, ServerMetrics* metrics, HttpServerConfig config);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Loads every session saved under session_dir (<dir>/<owner>/<id>.kvc), so a restarted
  // server continues them. Returns how many; a file that does not load is reported and skipped.
  int32_t restore_sessions();
  // Binds the socket. io_error naming the host and port when it cannot.
  Status bind();
  int port() const { return port_; }
  // Serves until shutdown() (blocks).
  void serve();
  // Stops accepting generation requests (503), lets in-flight ones finish within the grace
  // period, cancels the rest, saves every session when session_dir is set, and stops serving.
  // Safe from any thread, once.
  void shutdown();

 private:
  struct Active;  // a running generation: cancelled at the end of the grace period
  void add_routes();
  // The request's owner (a hash of its API key, "anon" without keys); false: refused (401).
  bool authorize(const httplib::Request& req, std::string* owner) const;
  void reply_error(httplib::Response& res, const ApiError& error);
  void reply_json(httplib::Response& res, const nlohmann::json& body, int status = 200);
  void handle_generation(const httplib::Request& req, httplib::Response& res, bool chat,
                         const std::string& owner);
  void handle_tokenize(const httplib::Request& req, httplib::Response& res);
  void handle_detokenize(const httplib::Request& req, httplib::Response& res);
  void list_sessions(httplib::Response& res, const std::string& owner);
  // action: get, delete, save or load of the session named in the path.
  void handle_session(const httplib::Request& req, httplib::Response& res,
                      const std::string& action, const std::string& owner);
  std::filesystem::path session_file(const std::string& owner, const std::string& id) const;
  nlohmann::json session_json(const EngineSessionInfo& info, const std::string& id) const;
  void touch_session(const std::string& engine_name);

  ServerContext* context_;
  ServerMetrics* metrics_;
  HttpServerConfig config_;
  std::unique_ptr<httplib::Server> http_;
  int port_ = 0;
  std::atomic<bool> shutting_down_{false};
  std::atomic<int32_t> num_active_{0};
  std::mutex active_mutex_;
  std::set<Active*> active_;                  // guarded by active_mutex_
  std::map<std::string, int64_t> last_used_;  // engine session name -> unix seconds
  std::mutex last_used_mutex_;
};

}  // namespace kvp::server

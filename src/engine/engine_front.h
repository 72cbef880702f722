// EngineFront: the thread-safe face of an Engine (issue "Engine": "requests in through a queue,
// an event stream out per request"). One background thread owns the Engine and runs its loop;
// any thread may submit, read its request's events, or cancel.
//
//   caller threads ── submit() ──▶ [inbox] ──▶ engine thread: engine.submit / step / cancel
//   caller threads ◀── stream->next() ◀── [per-request event queue] ◀──┘
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "engine/engine.h"

namespace kvp {

// The events of one request, in order. Thread-safe.
class RequestStream {
 public:
  // Blocks until the next event; nullopt once the request has finished and every event was read.
  std::optional<EngineEvent> next();
  // Waits up to `wait` for events, then moves every queued event to *events (none on a
  // timeout). Returns false once the request has finished and every event was taken.
  bool take(std::chrono::milliseconds wait, std::vector<EngineEvent>* events);
  RequestId id() const { return id_; }

 private:
  friend class EngineFront;
  void push(EngineEvent event, bool last);
  RequestId id_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<EngineEvent> events_;
  bool done_ = false;
};

class EngineFront {
 public:
  // Starts the engine thread. The engine is owned from here on.
  explicit EngineFront(std::unique_ptr<Engine> engine);
  // Cancels what is left and joins the thread.
  ~EngineFront();
  EngineFront(const EngineFront&) = delete;
  EngineFront& operator=(const EngineFront&) = delete;

  // Validates and queues the request on the engine thread; its errors come back here.
  Result<std::shared_ptr<RequestStream>> submit(Request request);
  // Asks the engine thread to cancel; the stream then ends with a kCancelled event.
  void cancel(RequestId id);
  // A snapshot of the engine's statistics (taken on the engine thread).
  EngineStats stats();
  // Session management, run on the engine thread between steps (see Engine).
  std::vector<EngineSessionInfo> sessions();
  Status save_session(const std::string& name, const std::filesystem::path& path);
  Status load_session(const std::string& name, const std::filesystem::path& path);
  Status delete_session(const std::string& name);

 private:
  struct SubmitCommand {
    Request request;
    std::promise<Result<std::shared_ptr<RequestStream>>>* reply;
  };
  struct CancelCommand {
    RequestId id;
  };
  struct StatsCommand {
    std::promise<EngineStats>* reply;
  };
  // Runs `run` on the engine thread, then sets `done`.
  struct CallCommand {
    std::function<void(Engine&)> run;
    std::promise<void>* done;
  };
  using Command = std::variant<SubmitCommand, CancelCommand, StatsCommand, CallCommand>;

  // Runs fn on the engine thread and waits for it.
  void call(std::function<void(Engine&)> fn);
  void loop();
  void deliver(std::vector<EngineEvent>& events);

  std::unique_ptr<Engine> engine_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Command> inbox_;
  bool stopping_ = false;
  std::map<RequestId, std::shared_ptr<RequestStream>> streams_;  // engine thread only
  std::thread thread_;
};

}  // namespace kvp

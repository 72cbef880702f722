#include "engine/engine_front.h"

namespace kvp {

std::optional<EngineEvent> RequestStream::next() {
  std::unique_lock lock(mutex_);
  ready_.wait(lock, [&] { return !events_.empty() || done_; });
  if (events_.empty()) return std::nullopt;
  EngineEvent e = std::move(events_.front());
  events_.pop_front();
  return e;
}

bool RequestStream::take(std::chrono::milliseconds wait, std::vector<EngineEvent>* events) {
  std::unique_lock lock(mutex_);
  ready_.wait_for(lock, wait, [&] { return !events_.empty() || done_; });
  for (EngineEvent& e : events_) events->push_back(std::move(e));
  events_.clear();
  return !done_;
}

void RequestStream::push(EngineEvent event, bool last) {
  {
    std::lock_guard lock(mutex_);
    events_.push_back(std::move(event));
    if (last) done_ = true;
  }
  ready_.notify_all();
}

EngineFront::EngineFront(std::unique_ptr<Engine> engine)
    : engine_(std::move(engine)), thread_([this] { loop(); }) {}

EngineFront::~EngineFront() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

Result<std::shared_ptr<RequestStream>> EngineFront::submit(Request request) {
  std::promise<Result<std::shared_ptr<RequestStream>>> reply;
  auto future = reply.get_future();
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return Status::invalid_argument("engine: shutting down");
    inbox_.push_back(SubmitCommand{std::move(request), &reply});
  }
  wake_.notify_all();
  return future.get();
}

void EngineFront::cancel(RequestId id) {
  {
    std::lock_guard lock(mutex_);
    inbox_.push_back(CancelCommand{id});
  }
  wake_.notify_all();
}

EngineStats EngineFront::stats() {
  std::promise<EngineStats> reply;
  auto future = reply.get_future();
  {
    std::lock_guard lock(mutex_);
    inbox_.push_back(StatsCommand{&reply});
  }
  wake_.notify_all();
  return future.get();
}

void EngineFront::call(std::function<void(Engine&)> fn) {
  std::promise<void> done;
  auto future = done.get_future();
  {
    std::lock_guard lock(mutex_);
    inbox_.push_back(CallCommand{std::move(fn), &done});
  }
  wake_.notify_all();
  future.get();
}

std::vector<EngineSessionInfo> EngineFront::sessions() {
  std::vector<EngineSessionInfo> out;
  call([&](Engine& engine) { out = engine.sessions(); });
  return out;
}

Status EngineFront::save_session(const std::string& name, const std::filesystem::path& path) {
  Status st;
  call([&](Engine& engine) { st = engine.save_session(name, path); });
  return st;
}

Status EngineFront::load_session(const std::string& name, const std::filesystem::path& path) {
  Status st;
  call([&](Engine& engine) { st = engine.load_session(name, path); });
  return st;
}

Status EngineFront::delete_session(const std::string& name) {
  Status st;
  call([&](Engine& engine) { st = engine.delete_session(name); });
  return st;
}

void EngineFront::deliver(std::vector<EngineEvent>& events) {
  for (EngineEvent& e : events) {
    auto it = streams_.find(e.request_id);
    if (it == streams_.end()) continue;
    RequestStream& stream = *it->second;
    const bool last = e.request_finished;
    const RequestId id = e.request_id;
    stream.push(std::move(e), last);
    if (last) streams_.erase(id);
  }
}

void EngineFront::loop() {
  for (;;) {
    std::deque<Command> commands;
    bool stopping;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !inbox_.empty() || engine_->has_unfinished(); });
      commands.swap(inbox_);
      stopping = stopping_;
    }
    std::vector<EngineEvent> events;
    for (Command& command : commands) {
      if (auto* submit = std::get_if<SubmitCommand>(&command)) {
        auto id = engine_->submit(std::move(submit->request));
        if (!id.is_ok()) {
          submit->reply->set_value(id.status());
          continue;
        }
        auto stream = std::make_shared<RequestStream>();
        stream->id_ = *id;
        streams_[*id] = stream;
        submit->reply->set_value(stream);
      } else if (auto* cancel = std::get_if<CancelCommand>(&command)) {
        engine_->cancel(cancel->id, &events);
      } else if (auto* stats = std::get_if<StatsCommand>(&command)) {
        stats->reply->set_value(engine_->stats());
      } else if (auto* call = std::get_if<CallCommand>(&command)) {
        call->run(*engine_);
        call->done->set_value();
      }
    }
    if (stopping) {
      std::vector<RequestId> ids;
      for (const auto& [id, stream] : streams_) ids.push_back(id);
      for (RequestId id : ids) engine_->cancel(id, &events);
      deliver(events);
      return;
    }
    deliver(events);
    if (engine_->has_unfinished()) {
      std::vector<EngineEvent> step_events = engine_->step();
      deliver(step_events);
    }
  }
}

}  // namespace kvp

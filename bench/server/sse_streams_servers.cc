// The SSE streams benchmark's servers (sse_streams_common.h): the token source standing in for
// the engine loop, cpp-httplib's server and Boost.Beast's, each run in a forked child process.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>

#ifdef KVP_HAVE_BEAST
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#endif

#include "sse_streams_common.h"

namespace kvp_sse {
// ---------------------------------------------------------------------------------------------
// Token source (server side): the engine's stand-in. Owns one queue per stream.

struct StreamState {
  int stream_id = 0;
  int64_t open_ns = 0;
  int num_events_emitted = 0;  // token source thread only

  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::string> events;  // guarded by mu; each one complete SSE event
  bool finished = false;           // guarded by mu; `data: [DONE]` is queued
  size_t queued_bytes = 0;         // guarded by mu
  size_t peak_queued_bytes = 0;    // guarded by mu

  std::atomic<bool> cancelled{false};
  std::function<void()> on_push;  // called by the token source after a push; must not block
};

struct Notice {
  int stream_id;
  int64_t notice_ns;
  NoticeHow how;
};

class TokenSource {
 public:
  explicit TokenSource(const CaseConfig& config) : config_(config) {
    thread_ = std::thread([this] { loop(); });
  }
  ~TokenSource() {
    stop_ = true;
    thread_.join();
  }

  // Registers a stream; its events start after first_event_delay_ms. Thread-safe.
  std::shared_ptr<StreamState> open_stream(int stream_id, std::function<void()> on_push) {
    auto stream = std::make_shared<StreamState>();
    stream->stream_id = stream_id;
    stream->open_ns = now_ns();
    stream->on_push = std::move(on_push);
    std::lock_guard lock(mu_);
    active_.push_back(stream);
    all_.push_back(stream);
    return stream;
  }

  // The server tells the producer that the stream's client is gone. Thread-safe; first call wins.
  void cancel(StreamState& stream, NoticeHow how) {
    if (stream.cancelled.exchange(true)) return;
    std::lock_guard lock(mu_);
    notices_.push_back({stream.stream_id, now_ns(), how});
  }

  // "notice <id> <ns> <how>" lines and "peak_queue <bytes>", for the parent process.
  std::string report() {
    std::lock_guard lock(mu_);
    std::string out;
    for (const Notice& n : notices_) {
      out += "notice " + std::to_string(n.stream_id) + " " + std::to_string(n.notice_ns) + " " +
             notice_name(n.how) + "\n";
    }
    size_t peak = 0;
    for (const auto& stream : all_) {
      std::lock_guard stream_lock(stream->mu);
      peak = std::max(peak, stream->peak_queued_bytes);
    }
    out += "peak_queue " + std::to_string(peak) + "\nend\n";
    return out;
  }

 private:
  std::string make_event(int seq, int64_t emit_ns) const {
    std::string event = "data: {\"seq\":" + std::to_string(seq) +
                        ",\"t\":" + std::to_string(emit_ns) + ",\"pad\":\"";
    const size_t tail_bytes = 4;  // "\"}\n\n"
    const size_t target = static_cast<size_t>(config_.event_bytes);
    if (event.size() + tail_bytes < target) event.append(target - event.size() - tail_bytes, 'x');
    event += "\"}\n\n";
    return event;
  }

  void loop() {
    const auto interval = std::chrono::milliseconds(config_.interval_ms);
    auto next_tick = std::chrono::steady_clock::now() + interval;
    std::vector<std::shared_ptr<StreamState>> tick_streams;
    while (!stop_) {
      std::this_thread::sleep_until(next_tick);
      next_tick += interval;
      {
        std::lock_guard lock(mu_);
        std::erase_if(active_, [](const auto& s) { return s->cancelled.load(); });
        tick_streams = active_;
      }
      const int64_t tick_ns = now_ns();
      bool any_finished = false;
      for (const auto& stream : tick_streams) {
        if (tick_ns < stream->open_ns + int64_t{config_.first_event_delay_ms} * 1'000'000) continue;
        const bool last = ++stream->num_events_emitted >= config_.num_events_per_stream;
        std::string event = make_event(stream->num_events_emitted, now_ns());
        {
          std::lock_guard lock(stream->mu);
          stream->queued_bytes += event.size();
          stream->events.push_back(std::move(event));
          if (last) {
            stream->events.emplace_back("data: [DONE]\n\n");
            stream->finished = true;
            any_finished = true;
          }
          stream->peak_queued_bytes = std::max(stream->peak_queued_bytes, stream->queued_bytes);
        }
        stream->cv.notify_one();
        if (stream->on_push) stream->on_push();
      }
      if (any_finished) {
        std::lock_guard lock(mu_);
        std::erase_if(active_, [](const auto& s) {
          std::lock_guard stream_lock(s->mu);
          return s->finished;
        });
      }
    }
  }

  const CaseConfig config_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<std::shared_ptr<StreamState>> active_;  // guarded by mu_
  std::vector<std::shared_ptr<StreamState>> all_;     // guarded by mu_
  std::vector<Notice> notices_;                       // guarded by mu_
  std::thread thread_;
};

// Takes everything queued for the stream. Returns whether [DONE] was among it.
bool take_events(StreamState& stream, std::deque<std::string>* batch) {
  std::lock_guard lock(stream.mu);
  batch->swap(stream.events);
  stream.queued_bytes = 0;
  return stream.finished;
}

void write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

// Blocks until the parent closes its end of the control pipe.
void wait_for_parent(int control_fd) {
  char byte = 0;
  while (::read(control_fd, &byte, 1) > 0) {
  }
}

// ---------------------------------------------------------------------------------------------
// cpp-httplib server

// How often an idle provider asks sink.is_writable() whether the client is still there.
constexpr auto kIdlePoll = std::chrono::milliseconds(20);

bool provide_events(TokenSource& source, StreamState& stream, httplib::DataSink& sink) {
  {
    std::unique_lock lock(stream.mu);
    while (stream.events.empty() && !stream.finished) {
      if (stream.cv.wait_for(lock, kIdlePoll) == std::cv_status::timeout) {
        lock.unlock();
        if (!sink.is_writable()) {
          source.cancel(stream, NoticeHow::NotWritable);
          return false;
        }
        lock.lock();
      }
    }
  }
  std::deque<std::string> batch;
  const bool finished = take_events(stream, &batch);
  for (const std::string& event : batch) {
    if (!sink.write(event.data(), event.size())) {
      source.cancel(stream, NoticeHow::WriteFailed);
      return false;
    }
  }
  if (finished) sink.done();
  return true;
}

void serve_httplib(const CaseConfig& config, int report_fd, int control_fd) {
  TokenSource source(config);
  httplib::Server server;
  int listen_fd = -1;
  server.set_socket_options([&listen_fd](int fd) {
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    listen_fd = fd;
  });
  const size_t num_threads = static_cast<size_t>(config.num_streams) + 16;
  server.new_task_queue = [num_threads] { return new httplib::ThreadPool(num_threads); };
  server.Get("/stream", [&source](const httplib::Request& req, httplib::Response& res) {
    auto stream = source.open_stream(std::atoi(req.get_param_value("id").c_str()), nullptr);
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [&source, stream](size_t /*offset*/, httplib::DataSink& sink) {
          return provide_events(source, *stream, sink);
        },
        [&source, stream](bool success) {
          if (!success) source.cancel(*stream, NoticeHow::LibraryClosed);
        });
  });
  const int port = server.bind_to_any_port("127.0.0.1");
  if (port <= 0) die("httplib bind");
  // The Debian build fixes the accept queue at CPPHTTPLIB_LISTEN_BACKLOG = 5: a burst of connects
  // overflows it and the dropped SYNs are retried after 1 s. Linux lets listen() be called again
  // on the bound socket to raise it; "httplib-backlog5" keeps the library's 5.
  if (config.library == "httplib" && ::listen(listen_fd, SOMAXCONN) != 0) die("listen");
  std::thread listener([&server] { server.listen_after_bind(); });
  write_all(report_fd, "port " + std::to_string(port) + "\n");
  wait_for_parent(control_fd);
  write_all(report_fd, source.report());
  _exit(0);  // the pool's threads may sit in blocked writes; the report is out
}

// ---------------------------------------------------------------------------------------------
// Boost.Beast server

#ifdef KVP_HAVE_BEAST
namespace net = boost::asio;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;
using boost::system::error_code;

// Same bound on a blocked write as cpp-httplib's default (CPPHTTPLIB_WRITE_TIMEOUT_SECOND).
constexpr auto kBeastWriteTimeout = std::chrono::seconds(5);

class BeastSession : public std::enable_shared_from_this<BeastSession> {
 public:
  BeastSession(tcp::socket socket, TokenSource& source)
      : socket_(std::move(socket)), write_timer_(socket_.get_executor()), source_(source) {}

  void start() {
    http::async_read(socket_, buffer_, request_,
                     [self = shared_from_this()](error_code ec, size_t) { self->on_request(ec); });
  }

 private:
  void on_request(error_code ec) {
    if (ec) return close();
    const std::string target(request_.target());
    const size_t id_at = target.find("id=");
    const int stream_id = id_at == std::string::npos ? 0 : std::atoi(target.c_str() + id_at + 3);
    stream_ = source_.open_stream(stream_id, [weak = weak_from_this()] {
      auto self = weak.lock();
      if (!self || self->notify_pending_.exchange(true)) return;
      net::post(self->socket_.get_executor(), [self] { self->on_events(); });
    });
    response_.result(http::status::ok);
    response_.version(11);
    response_.set(http::field::content_type, "text/event-stream");
    response_.set(http::field::cache_control, "no-cache");
    response_.chunked(true);
    serializer_.emplace(response_);
    writing_ = true;
    http::async_write_header(socket_, *serializer_,
                             [self = shared_from_this()](error_code ec, size_t) {
                               self->writing_ = false;
                               if (ec) return self->fail(NoticeHow::WriteFailed);
                               self->watch_for_close();
                               self->on_events();
                             });
  }

  // An outstanding read: the client sends nothing after its request, so completion means it
  // closed (EOF) or reset the connection.
  void watch_for_close() {
    socket_.async_read_some(net::buffer(probe_),
                            [self = shared_from_this()](error_code ec, size_t) {
                              if (!ec) return self->watch_for_close();
                              if (!self->sent_done_)
                                self->source_.cancel(*self->stream_, NoticeHow::ReadEof);
                              self->close();
                            });
  }

  void on_events() {
    notify_pending_ = false;
    if (writing_ || closed_ || sent_done_) return;
    std::deque<std::string> batch;
    const bool finished = take_events(*stream_, &batch);
    if (batch.empty()) return;
    // Chunk framing by hand, batched into one write: the bytes http::make_chunk would produce.
    out_.clear();
    for (const std::string& event : batch) {
      char size_line[24];
      std::snprintf(size_line, sizeof(size_line), "%zx\r\n", event.size());
      out_ += size_line;
      out_ += event;
      out_ += "\r\n";
    }
    if (finished) out_ += "0\r\n\r\n";
    writing_ = true;
    const uint64_t generation = ++write_generation_;
    write_timer_.expires_after(kBeastWriteTimeout);
    write_timer_.async_wait([self = shared_from_this(), generation](error_code ec) {
      if (ec || !self->writing_ || self->write_generation_ != generation) return;
      self->fail(NoticeHow::WriteTimeout);
    });
    net::async_write(socket_, net::buffer(out_),
                     [self = shared_from_this(), finished](error_code ec, size_t) {
                       self->writing_ = false;
                       self->write_timer_.cancel();
                       if (ec) return self->fail(NoticeHow::WriteFailed);
                       if (finished) {
                         self->sent_done_ = true;  // the client closes; watch_for_close sees it
                         return;
                       }
                       self->on_events();
                     });
  }

  void fail(NoticeHow how) {
    if (stream_ && !sent_done_) source_.cancel(*stream_, how);
    close();
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
    write_timer_.cancel();
  }

  tcp::socket socket_;
  net::steady_timer write_timer_;
  TokenSource& source_;
  boost::beast::flat_buffer buffer_;
  http::request<http::empty_body> request_;
  http::response<http::empty_body> response_;
  std::optional<http::response_serializer<http::empty_body>> serializer_;
  std::shared_ptr<StreamState> stream_;
  std::atomic<bool> notify_pending_{false};
  std::string out_;  // the bytes of the write in flight
  char probe_[64];
  uint64_t write_generation_ = 0;
  bool writing_ = false;
  bool sent_done_ = false;
  bool closed_ = false;
};

void accept_next(tcp::acceptor& acceptor, net::io_context& io, TokenSource& source) {
  acceptor.async_accept(net::make_strand(io),
                        [&acceptor, &io, &source](error_code ec, tcp::socket socket) {
                          if (!ec)
                            std::make_shared<BeastSession>(std::move(socket), source)->start();
                          accept_next(acceptor, io, source);
                        });
}

void serve_beast(const CaseConfig& config, int report_fd, int control_fd) {
  TokenSource source(config);
  net::io_context io(config.beast_threads);
  tcp::acceptor acceptor(io);
  const tcp::endpoint endpoint(net::ip::make_address("127.0.0.1"), 0);
  acceptor.open(endpoint.protocol());
  acceptor.set_option(net::socket_base::reuse_address(true));
  acceptor.bind(endpoint);
  acceptor.listen(net::socket_base::max_listen_connections);
  accept_next(acceptor, io, source);
  std::vector<std::thread> threads;
  for (int i = 0; i < config.beast_threads; ++i) threads.emplace_back([&io] { io.run(); });
  write_all(report_fd, "port " + std::to_string(acceptor.local_endpoint().port()) + "\n");
  wait_for_parent(control_fd);
  write_all(report_fd, source.report());
  _exit(0);
}
#endif

}  // namespace kvp_sse

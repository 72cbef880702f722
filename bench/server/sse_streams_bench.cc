// SSE streams benchmark: picks kvpool's HTTP library by serving many concurrent long-lived
// Server-Sent-Events streams, the shape of `kvpool serve`'s traffic (one event per generated
// token, tens of ms apart, for many seconds).
//
// Servers (--libs), doing the same work:
//   httplib           cpp-httplib 0.11: chunked content provider, a thread per open stream (the
//                     pool is sized to the stream count through svr.new_task_queue), the listen
//                     backlog raised to SOMAXCONN.
//   httplib-backlog5  the same with the library's compiled-in listen backlog of 5.
//   beast, beast-2t   Boost.Beast (Asio): an io_context on 1 or 2 threads, a strand per
//                     connection, an outstanding read per connection to see the peer go away.
// In both, one "token source" thread stands in for the engine loop: every --interval-ms it appends
// one event per open stream to that stream's queue and never touches a socket; the server
// delivers the queue as text/event-stream chunks and ends with `data: [DONE]`.
//
// Each case forks a fresh server process (so its threads, RSS and CPU are its own) and drives it
// from this process with a single-threaded epoll client over raw sockets on 127.0.0.1. Cases:
//   steady           N streams read promptly.
//   slow_reader      as steady, but one client (4 KiB receive buffer) stops reading after its
//                    first event: the others' latency, and how far the server's queue for the
//                    stalled stream grows.
//   disconnect       half the clients close mid-stream; time from close() to the server telling
//                    the token source (the "producer") to stop that stream.
//   idle_disconnect  streams are silent for 4 s first (prefill, or waiting for a slot); half the
//                    clients close after 1 s, while nothing is being written.
//
// Latency is emit -> receive: the event carries the CLOCK_MONOTONIC time at which the token source
// queued it, the client subtracts it from its own receive time (same machine, same clock).
// One fixed-format line per case on stdout, all cases in the CSV (--csv).
//
//   sse_streams_bench [--libs=httplib,beast] [--cases=steady,slow_reader,disconnect,...]
//                     [--streams=64,256,1024] [--fault-streams=256] [--interval-ms=25]
//                     [--duration-s=10] [--event-bytes=200] [--csv=sse_streams.csv]

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
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

#include "sse_streams_common.h"

namespace kvp_sse {
namespace {

// ---------------------------------------------------------------------------------------------
// Server process measurements, read from /proc by the parent.

struct ProcSample {
  int num_threads = 0;
  double rss_mb = 0;
  double peak_rss_mb = 0;  // VmHWM
  double cpu_s = 0;        // user + system
};

ProcSample sample_proc(pid_t pid) {
  ProcSample sample;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/status", pid);
  if (FILE* f = std::fopen(path, "r")) {
    char line[256];
    while (std::fgets(line, sizeof(line), f)) {
      long value = 0;
      if (std::sscanf(line, "Threads: %ld", &value) == 1)
        sample.num_threads = static_cast<int>(value);
      if (std::sscanf(line, "VmRSS: %ld", &value) == 1) sample.rss_mb = value / 1024.0;
      if (std::sscanf(line, "VmHWM: %ld", &value) == 1) sample.peak_rss_mb = value / 1024.0;
    }
    std::fclose(f);
  }
  std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  if (FILE* f = std::fopen(path, "r")) {
    char buf[1024] = {};
    const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
    std::fclose(f);
    buf[n] = 0;
    if (const char* after_comm = std::strrchr(buf, ')')) {
      // Fields after "(comm)": state(3) ... utime(14) stime(15).
      std::istringstream fields(after_comm + 2);
      std::string field;
      unsigned long long utime = 0, stime = 0;
      for (int i = 3; i <= 15 && fields >> field; ++i) {
        if (i == 14) utime = std::stoull(field);
        if (i == 15) stime = std::stoull(field);
      }
      sample.cpu_s = static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
    }
  }
  return sample;
}

// ---------------------------------------------------------------------------------------------
// Client: one thread, epoll, raw sockets.

struct ClientStream {
  int fd = -1;
  int stream_id = 0;
  int64_t connect_ns = 0;
  int64_t first_event_ns = 0;
  int64_t close_at_ns = 0;  // 0: never closes on its own
  int64_t closed_ns = 0;    // when the client closed it mid-stream
  bool slow = false;        // stops reading after its first event
  bool connected = false;
  bool headers_ok = false;
  bool completed = false;
  bool failed = false;
  int num_events = 0;
  std::string buf;
};

struct CaseResult {
  int num_completed = 0;
  int num_failed = 0;
  int num_closed_by_client = 0;
  long long num_events = 0;
  long long num_events_expected = 0;
  double latency_p50_ms = 0, latency_p99_ms = 0, latency_max_ms = 0;
  double first_event_p99_ms = 0;
  int peak_threads = 0;
  double peak_rss_mb = 0;
  double cpu_s = 0;
  double peak_queue_kb = 0;
  int num_noticed = 0;
  double notice_p50_ms = -1, notice_max_ms = -1;
  std::string notice_how = "-";
  double wall_s = 0;
};

double percentile_ms(std::vector<int64_t>& values_us, double q) {
  if (values_us.empty()) return 0;
  const size_t index = std::min(values_us.size() - 1, static_cast<size_t>(q * values_us.size()));
  std::nth_element(values_us.begin(), values_us.begin() + static_cast<ptrdiff_t>(index),
                   values_us.end());
  return values_us[index] / 1000.0;
}

class Client {
 public:
  Client(const CaseConfig& config, int port, pid_t server_pid)
      : config_(config), port_(port), server_pid_(server_pid), streams_(config.num_streams) {
    epoll_fd_ = epoll_create1(0);
    if (epoll_fd_ < 0) die("epoll_create1");
  }
  ~Client() {
    for (ClientStream& s : streams_) {
      if (s.fd >= 0) ::close(s.fd);
    }
    ::close(epoll_fd_);
  }

  // Runs the case to its end (every stream resolved, or its time bound).
  void run(CaseResult* result) {
    std::mt19937 rng(1234);
    const int64_t start_ns = now_ns();
    const int64_t ramp_ns = 500'000;  // one connection per 0.5 ms
    const int64_t stream_ns = int64_t{config_.first_event_delay_ms +
                                      config_.num_events_per_stream * config_.interval_ms} *
                              1'000'000;
    const int64_t deadline_ns =
        start_ns + ramp_ns * config_.num_streams + stream_ns + 3'000'000'000;
    int num_opened = 0;
    int64_t next_sample_ns = start_ns;
    std::vector<epoll_event> ready(512);
    while (now_ns() < deadline_ns && num_resolved_ < config_.num_streams) {
      const int64_t now = now_ns();
      while (num_opened < config_.num_streams && start_ns + ramp_ns * num_opened <= now) {
        open_stream(num_opened, rng);
        ++num_opened;
      }
      if (now >= next_sample_ns) {
        const ProcSample sample = sample_proc(server_pid_);
        result->peak_threads = std::max(result->peak_threads, sample.num_threads);
        next_sample_ns = now + 100'000'000;
      }
      const int num_ready = epoll_wait(epoll_fd_, ready.data(), static_cast<int>(ready.size()), 1);
      for (int i = 0; i < num_ready; ++i)
        on_ready(streams_[ready[static_cast<size_t>(i)].data.u32],
                 ready[static_cast<size_t>(i)].events);
      close_due_streams();
    }
    result->wall_s = (now_ns() - start_ns) / 1e9;
    for (const ClientStream& s : streams_) {
      result->num_completed += s.completed;
      result->num_failed += s.failed;
      result->num_closed_by_client += s.closed_ns != 0;
      result->num_events += s.num_events;
      if (s.first_event_ns) first_event_us_.push_back((s.first_event_ns - s.connect_ns) / 1000);
    }
    result->num_events_expected =
        static_cast<long long>(config_.num_streams) * config_.num_events_per_stream;
    result->latency_p50_ms = percentile_ms(latency_us_, 0.50);
    result->latency_p99_ms = percentile_ms(latency_us_, 0.99);
    result->latency_max_ms = percentile_ms(latency_us_, 1.0);
    result->first_event_p99_ms = percentile_ms(first_event_us_, 0.99);
  }

  // Close times of the streams the client closed mid-stream, by stream id (0: not closed).
  std::vector<int64_t> closed_ns() const {
    std::vector<int64_t> out;
    for (const ClientStream& s : streams_) out.push_back(s.closed_ns);
    return out;
  }

 private:
  void open_stream(int index, std::mt19937& rng) {
    ClientStream& s = streams_[static_cast<size_t>(index)];
    s.stream_id = index;
    s.connect_ns = now_ns();
    s.slow = config_.kind == CaseKind::SlowReader && index == 0;
    if (config_.kind == CaseKind::IdleDisconnect && index % 2 == 0) {
      s.close_at_ns = s.connect_ns + 1'000'000'000;  // inside the 4 s of silence
    }
    s.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (s.fd < 0) die("socket");
    if (s.slow) {
      const int rcvbuf = 4096;
      setsockopt(s.fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
    }
    const int one = 1;
    setsockopt(s.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port_));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(s.fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 &&
        errno != EINPROGRESS) {
      resolve(s, /*failed=*/true);
      return;
    }
    epoll_event ev{};
    ev.events = EPOLLOUT | EPOLLIN;
    ev.data.u32 = static_cast<uint32_t>(index);
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, s.fd, &ev);
    if (config_.kind == CaseKind::Disconnect && index % 2 == 0) {
      // Closes between 1 s and (stream length - 1 s) after the connect.
      const int64_t stream_ms = int64_t{config_.num_events_per_stream} * config_.interval_ms;
      std::uniform_int_distribution<int64_t> after_ms(1000,
                                                      std::max<int64_t>(1001, stream_ms - 1000));
      s.close_at_ns = s.connect_ns + after_ms(rng) * 1'000'000;
    }
  }

  void on_ready(ClientStream& s, uint32_t events) {
    if (s.fd < 0) return;
    if (!s.connected && (events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) {
      int error = 0;
      socklen_t len = sizeof(error);
      getsockopt(s.fd, SOL_SOCKET, SO_ERROR, &error, &len);
      if (error != 0) return resolve(s, /*failed=*/true);
      s.connected = true;
      const std::string request =
          "GET /stream?id=" + std::to_string(s.stream_id) +
          " HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n";
      if (::send(s.fd, request.data(), request.size(), MSG_NOSIGNAL) !=
          static_cast<ssize_t>(request.size())) {
        return resolve(s, /*failed=*/true);
      }
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u32 = static_cast<uint32_t>(s.stream_id);
      epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, s.fd, &ev);
      return;
    }
    char chunk[65536];
    const ssize_t n = ::recv(s.fd, chunk, sizeof(chunk), 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return resolve(s, /*failed=*/true);
    if (n < 0) return;
    const int64_t receive_ns = now_ns();
    s.buf.append(chunk, static_cast<size_t>(n));
    size_t line_start = 0;
    for (size_t eol; s.fd >= 0 && (eol = s.buf.find('\n', line_start)) != std::string::npos;
         line_start = eol + 1) {
      on_line(s, std::string_view(s.buf).substr(line_start, eol - line_start), receive_ns);
    }
    if (s.fd >= 0) s.buf.erase(0, line_start);
  }

  void on_line(ClientStream& s, std::string_view line, int64_t receive_ns) {
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (!s.headers_ok) {
      if (line.starts_with("HTTP/1.")) {
        if (line.find(" 200") == std::string_view::npos) resolve(s, /*failed=*/true);
      } else if (line.empty()) {
        s.headers_ok = true;
      }
      return;
    }
    if (!line.starts_with("data: ")) return;  // chunk sizes, blank separators
    if (line == "data: [DONE]") {
      s.completed = true;
      return resolve(s, /*failed=*/false);
    }
    const size_t t_at = line.find("\"t\":");
    if (t_at == std::string_view::npos) return;
    const int64_t emit_ns = std::strtoll(line.data() + t_at + 4, nullptr, 10);
    if (!s.slow) latency_us_.push_back((receive_ns - emit_ns) / 1000);
    if (s.num_events++ == 0) {
      s.first_event_ns = receive_ns;
      if (s.slow) {  // stop reading; the connection stays open to the end of the case
        epoll_event ev{};
        ev.data.u32 = static_cast<uint32_t>(s.stream_id);
        epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, s.fd, &ev);
        ++num_resolved_;
      }
    }
  }

  void close_due_streams() {
    const int64_t now = now_ns();
    for (ClientStream& s : streams_) {
      if (s.fd >= 0 && s.close_at_ns != 0 && now >= s.close_at_ns) {
        s.closed_ns = now_ns();  // before close(): the server may see the FIN within microseconds
        ::close(s.fd);
        s.fd = -1;
        ++num_resolved_;
      }
    }
  }

  void resolve(ClientStream& s, bool failed) {
    if (s.fd >= 0) {
      epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, s.fd, nullptr);
      ::close(s.fd);
      s.fd = -1;
    }
    s.failed = failed;
    if (!s.slow) ++num_resolved_;
  }

  const CaseConfig config_;
  const int port_;
  const pid_t server_pid_;
  int epoll_fd_ = -1;
  int num_resolved_ = 0;
  std::vector<ClientStream> streams_;
  std::vector<int64_t> latency_us_;  // emit -> receive, every event of every prompt reader
  std::vector<int64_t> first_event_us_;
};

// ---------------------------------------------------------------------------------------------
// One case: fork the server, run the client, collect.

std::string read_line(int fd) {
  std::string line;
  char c = 0;
  while (::read(fd, &c, 1) == 1 && c != '\n') line += c;
  return line;
}

CaseResult run_case(const CaseConfig& config) {
  int report_pipe[2], control_pipe[2];
  if (pipe(report_pipe) != 0 || pipe(control_pipe) != 0) die("pipe");
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid < 0) die("fork");
  if (pid == 0) {
    ::close(report_pipe[0]);
    ::close(control_pipe[1]);
#ifdef KVP_HAVE_BEAST
    if (config.library.starts_with("beast")) serve_beast(config, report_pipe[1], control_pipe[0]);
#endif
    serve_httplib(config, report_pipe[1], control_pipe[0]);
  }
  ::close(report_pipe[1]);
  ::close(control_pipe[0]);
  const std::string port_line = read_line(report_pipe[0]);
  if (!port_line.starts_with("port ")) die("server did not start");
  const int port = std::atoi(port_line.c_str() + 5);

  CaseResult result;
  std::vector<int64_t> closed_ns;
  {
    Client client(config, port, pid);
    client.run(&result);
    closed_ns = client.closed_ns();
  }
  const ProcSample end = sample_proc(pid);
  result.peak_rss_mb = end.peak_rss_mb;
  result.cpu_s = end.cpu_s;
  result.peak_threads = std::max(result.peak_threads, end.num_threads);
  ::close(control_pipe[1]);

  std::vector<int64_t> notice_us;
  std::string how;
  for (std::string line = read_line(report_pipe[0]); !line.empty() && line != "end";
       line = read_line(report_pipe[0])) {
    std::istringstream fields(line);
    std::string kind;
    fields >> kind;
    if (kind == "peak_queue") {
      double bytes = 0;
      fields >> bytes;
      result.peak_queue_kb = bytes / 1024.0;
    } else if (kind == "notice") {
      int stream_id = 0;
      int64_t notice_ns = 0;
      std::string notice_how;
      fields >> stream_id >> notice_ns >> notice_how;
      const size_t index = static_cast<size_t>(stream_id);
      if (index < closed_ns.size() && closed_ns[index] != 0 && notice_ns >= closed_ns[index]) {
        notice_us.push_back((notice_ns - closed_ns[index]) / 1000);
        if (how.find(notice_how) == std::string::npos) how += (how.empty() ? "" : "+") + notice_how;
      } else if (config.kind == CaseKind::SlowReader && stream_id == 0) {
        how = notice_how;  // the server gave up on the stalled reader
      }
    }
  }
  ::close(report_pipe[0]);
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  result.num_noticed = static_cast<int>(notice_us.size());
  if (!notice_us.empty()) {
    result.notice_p50_ms = percentile_ms(notice_us, 0.5);
    result.notice_max_ms = percentile_ms(notice_us, 1.0);
  }
  if (!how.empty()) result.notice_how = how;
  return result;
}

// ---------------------------------------------------------------------------------------------

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, ',');) {
    if (!part.empty()) parts.push_back(part);
  }
  return parts;
}

const char* kCsvHeader =
    "library,case,streams,interval_ms,events_per_stream,completed,failed,closed_by_client,events,"
    "events_expected,latency_p50_ms,latency_p99_ms,latency_max_ms,first_event_p99_ms,"
    "server_threads_peak,server_rss_peak_mb,server_cpu_s,queue_peak_kb,noticed,notice_p50_ms,"
    "notice_max_ms,notice_how,wall_s\n";

}  // namespace
}  // namespace kvp_sse

int main(int argc, char** argv) {
  using namespace kvp_sse;
  std::string libs = "httplib,beast", cases = "steady,slow_reader,disconnect,idle_disconnect";
  std::string stream_counts = "64,256,1024", csv_path = "sse_streams.csv";
  int interval_ms = 25, duration_s = 10, event_bytes = 200;
  int fault_streams = 256;  // stream count of the slow_reader and disconnect cases
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    const std::string key = arg.substr(0, eq),
                      value = eq == std::string::npos ? "" : arg.substr(eq + 1);
    if (key == "--libs") {
      libs = value;
    } else if (key == "--cases") {
      cases = value;
    } else if (key == "--streams") {
      stream_counts = value;
    } else if (key == "--fault-streams") {
      fault_streams = std::atoi(value.c_str());
    } else if (key == "--interval-ms") {
      interval_ms = std::atoi(value.c_str());
    } else if (key == "--duration-s") {
      duration_s = std::atoi(value.c_str());
    } else if (key == "--event-bytes") {
      event_bytes = std::atoi(value.c_str());
    } else if (key == "--csv") {
      csv_path = value;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--libs=httplib,beast] [--cases=steady,slow_reader,"
                   "disconnect,idle_disconnect] [--streams=64,256,1024] [--fault-streams=256] "
                   "[--interval-ms=25] [--duration-s=10] [--event-bytes=200] "
                   "[--csv=sse_streams.csv]\n",
                   argv[0]);
      return 2;
    }
  }
  rlimit files{};
  getrlimit(RLIMIT_NOFILE, &files);
  files.rlim_cur = files.rlim_max;
  setrlimit(RLIMIT_NOFILE, &files);
  // Both processes: a write to a closed socket is an error value, not a signal. (cpp-httplib's
  // Server() does the same, process-wide; Asio sends with MSG_NOSIGNAL.)
  std::signal(SIGPIPE, SIG_IGN);

  std::vector<CaseConfig> configs;
  for (const std::string& library : split(libs)) {
#ifndef KVP_HAVE_BEAST
    if (library.starts_with("beast")) {
      std::printf("# beast: not built (Boost not found by CMake)\n");
      continue;
    }
#endif
    for (const std::string& case_name : split(cases)) {
      CaseConfig base;
      base.library = library;
      base.case_name = case_name;
      base.interval_ms = interval_ms;
      base.num_events_per_stream = duration_s * 1000 / interval_ms;
      base.event_bytes = event_bytes;
      base.beast_threads = library == "beast-2t" ? 2 : 1;
      if (case_name == "steady") {
        for (const std::string& count : split(stream_counts)) {
          CaseConfig config = base;
          config.num_streams = std::atoi(count.c_str());
          configs.push_back(config);
        }
        continue;
      }
      base.num_streams = fault_streams;
      if (case_name == "slow_reader") {
        base.kind = CaseKind::SlowReader;
      } else if (case_name == "disconnect") {
        base.kind = CaseKind::Disconnect;
      } else if (case_name == "idle_disconnect") {
        base.kind = CaseKind::IdleDisconnect;
        base.first_event_delay_ms = 4000;
        base.num_events_per_stream = 2000 / interval_ms;
      } else {
        std::fprintf(stderr, "unknown case %s\n", case_name.c_str());
        return 2;
      }
      configs.push_back(base);
    }
  }

  FILE* csv = std::fopen(csv_path.c_str(), "w");
  if (!csv) die("open " + csv_path);
  std::fputs(kCsvHeader, csv);
  std::printf(
      "# ceiling per case: every stream completes with events=streams*%d (steady), latency = "
      "loopback (~0.05 ms), queue_peak = one event (%d B), notice = 0 ms\n",
      duration_s * 1000 / interval_ms, event_bytes);
  for (const CaseConfig& config : configs) {
    const CaseResult r = run_case(config);
    std::printf(
        "sse %-16s %-15s streams=%4d done=%4d failed=%4d closed=%4d events=%7lld/%-7lld "
        "lat_p50=%7.2fms lat_p99=%7.2fms lat_max=%8.2fms first_p99=%7.2fms threads=%4d "
        "rss=%6.1fMB cpu=%5.2fs queue_peak=%7.1fKB noticed=%4d notice_p50=%8.1fms "
        "notice_max=%8.1fms how=%s\n",
        config.library.c_str(), config.case_name.c_str(), config.num_streams, r.num_completed,
        r.num_failed, r.num_closed_by_client, r.num_events, r.num_events_expected, r.latency_p50_ms,
        r.latency_p99_ms, r.latency_max_ms, r.first_event_p99_ms, r.peak_threads, r.peak_rss_mb,
        r.cpu_s, r.peak_queue_kb, r.num_noticed, r.notice_p50_ms, r.notice_max_ms,
        r.notice_how.c_str());
    std::fflush(stdout);
    std::fprintf(csv,
                 "%s,%s,%d,%d,%d,%d,%d,%d,%lld,%lld,%.3f,%.3f,%.3f,%.3f,%d,%.1f,%.2f,%.1f,%d,%.1f,"
                 "%.1f,%s,%.1f\n",
                 config.library.c_str(), config.case_name.c_str(), config.num_streams,
                 config.interval_ms, config.num_events_per_stream, r.num_completed, r.num_failed,
                 r.num_closed_by_client, r.num_events, r.num_events_expected, r.latency_p50_ms,
                 r.latency_p99_ms, r.latency_max_ms, r.first_event_p99_ms, r.peak_threads,
                 r.peak_rss_mb, r.cpu_s, r.peak_queue_kb, r.num_noticed, r.notice_p50_ms,
                 r.notice_max_ms, r.notice_how.c_str(), r.wall_s);
    std::fflush(csv);
  }
  std::fclose(csv);
  return 0;
}

// The SSE streams benchmark's shared pieces (sse_streams_bench.cc says what it measures): a
// case's configuration, how a server noticed a client was gone, and the two servers that
// sse_streams_servers.cc runs in the forked child of each case:
//
//   parent (sse_streams_bench.cc): fork ──▶ child: serve_httplib / serve_beast(config)
//     ◀── "port N" on report_fd ── ... ── parent closes control_fd ──▶ child writes its report
#pragma once

#include <time.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace kvp_sse {

inline int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

[[noreturn]] inline void die(const std::string& what) {
  std::fprintf(stderr, "sse_streams_bench: %s: %s\n", what.c_str(), std::strerror(errno));
  std::exit(1);
}

// ---------------------------------------------------------------------------------------------
// Cases

enum class CaseKind { Steady, SlowReader, Disconnect, IdleDisconnect };

struct CaseConfig {
  std::string library;  // "httplib", "httplib-backlog5", "beast" or "beast-2t"
  CaseKind kind = CaseKind::Steady;
  std::string case_name;
  int num_streams = 64;
  int interval_ms = 25;
  int num_events_per_stream = 400;  // then `data: [DONE]`
  int first_event_delay_ms = 0;     // silence before the first event ("prefill")
  int event_bytes = 200;            // one `data: {...}\n\n` event, padded to this size
  int beast_threads = 1;
};

// How a server learned that a stream's client is gone.
enum class NoticeHow { WriteFailed, NotWritable, LibraryClosed, ReadEof, WriteTimeout };

inline const char* notice_name(NoticeHow how) {
  switch (how) {
    case NoticeHow::WriteFailed:
      return "write_failed";
    case NoticeHow::NotWritable:
      return "is_writable_false";
    case NoticeHow::LibraryClosed:
      return "library_closed";
    case NoticeHow::ReadEof:
      return "read_eof";
    case NoticeHow::WriteTimeout:
      return "write_timeout";
  }
  return "?";
}

// Serve the case on 127.0.0.1 (an ephemeral port, written as "port N\n" to report_fd) until
// control_fd closes; then write the token source's report to report_fd and _exit.
[[noreturn]] void serve_httplib(const CaseConfig& config, int report_fd, int control_fd);
#ifdef KVP_HAVE_BEAST
[[noreturn]] void serve_beast(const CaseConfig& config, int report_fd, int control_fd);
#endif

}  // namespace kvp_sse

// ServerMetrics: the server's Prometheus metrics (GET /metrics), named like vLLM's with the
// `kvpool:` prefix where the meaning is the same. Request threads record latencies and token
// counts as requests run; render() takes one snapshot of the engine's statistics and sessions
// (a call on the engine thread) and writes the exposition text (metrics.h).
#pragma once

#include <mutex>
#include <string>
#include <vector>

#include "engine/engine_front.h"
#include "server/metrics.h"

namespace kvp::server {

class ServerMetrics {
 public:
  // engine: not owned, outlives this.
  explicit ServerMetrics(EngineFront* engine);
  ServerMetrics(const ServerMetrics&) = delete;
  ServerMetrics& operator=(const ServerMetrics&) = delete;

  void observe_first_token(double seconds);  // time to first token
  void observe_inter_token(double seconds);  // between two tokens of one request
  // A finished request: usage, end-to-end seconds, tokens of sample 0 and its TTFT (for the
  // time per output token), finish reason, whether it ran on a session.
  void observe_finished(const Usage& usage, double e2e_seconds, int32_t num_output_tokens,
                        double ttft_seconds, const std::string& finish_reason, bool session);
  // An HTTP error answered (by status code).
  void observe_error(int http_status);

  // The exposition text (Prometheus text format 0.0.4).
  std::string render();

 private:
  EngineFront* engine_;
  MetricsRegistry registry_;
  Histogram* ttft_ = nullptr;
  Histogram* inter_token_ = nullptr;
  Histogram* tpot_ = nullptr;
  Histogram* e2e_ = nullptr;
  Counter* prompt_tokens_ = nullptr;
  Counter* cached_tokens_ = nullptr;
  Counter* session_hit_tokens_ = nullptr;
  Counter* generation_tokens_ = nullptr;
  CounterFamily* finished_ = nullptr;  // {finished_reason}
  CounterFamily* errors_ = nullptr;    // {code}
  std::mutex render_mutex_;            // one render at a time: the callbacks read snapshot_
  EngineStats stats_;
  std::vector<EngineSessionInfo> sessions_;
};

}  // namespace kvp::server

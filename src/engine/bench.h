// Workloads and measurements for `kvpool bench` (issue "Engine": kvpool bench).
//   offline:  every request arrives at t = 0
//   poisson:  open loop, arrivals at `rate` requests/s until `target_output_tokens` are asked for
//   closed:   `concurrency` clients, each sending its next request when the last one finished
//   agents:   A agents x T turns on a shared system prompt; each turn adds user tokens to a
//             growing history, then waits `think_time_s`. With sessions the history stays in
//             the pool (only new tokens prefill); without, every turn resends the whole history
//             (the prefix cache may still help).
// The driver runs the Engine on the calling thread against the wall clock and reports latency
// percentiles, throughput, KV utilisation, prefix hits, session evictions, and how much of the
// wall time was ramp-up, steady state and drain.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/engine.h"

namespace kvp {

struct BenchConfig {
  enum class Workload { kOffline, kPoisson, kClosed, kAgents } workload = Workload::kOffline;
  int32_t num_requests = 64;            // offline
  double rate = 4.0;                    // poisson: requests per second
  int32_t concurrency = 8;              // closed
  int64_t target_output_tokens = 2048;  // poisson, closed
  int32_t prompt_tokens_min = 32, prompt_tokens_max = 256;
  int32_t output_tokens_min = 16, output_tokens_max = 128;
  int32_t num_agents = 8, num_turns = 4;  // agents
  int32_t system_prompt_tokens = 256;     // agents: shared by every agent
  int32_t turn_tokens = 64;               // agents: user tokens per turn
  int32_t first_turn_tokens = 0;          // agents: user tokens of a first turn (0: turn_tokens)
  int32_t reply_tokens = 32;              // agents: generated tokens per turn
  double think_time_s = 0.0;              // agents: pause between a reply and the next turn
  bool sessions = true;                   // agents: keep each agent's history in a session
  uint64_t seed = 1;
  float temperature = 0.0f;  // every request's sampling (0: greedy)
  float top_p = 1.0f;
};

// Parses "offline", "poisson", "closed", "agents".
Result<BenchConfig::Workload> parse_workload(const std::string& name);
const char* workload_name(BenchConfig::Workload workload);

struct RequestTiming {
  int64_t request_id = 0;
  int32_t agent = -1, turn = -1;
  double arrival_s = 0, first_token_s = 0, finish_s = 0;
  int32_t prompt_tokens = 0, prefilled_tokens = 0, cached_tokens = 0, output_tokens = 0;
  int32_t restored_tokens = 0;  // Usage::restored_tokens: its session came back from host or disk
  // RequestTimes on the bench's clock (seconds since its start); negative: did not happen
  double admitted_s = -1, kv_copy_start_s = -1, kv_copy_done_s = -1, first_step_s = -1;
  std::vector<double> token_times_s;
};

struct Percentiles {
  double p50 = 0, p95 = 0, p99 = 0, mean = 0;
};

struct BenchReport {
  std::string workload;
  double wall_s = 0;
  int64_t num_requests = 0;
  int64_t output_tokens = 0, prompt_tokens = 0, prefilled_tokens = 0;
  double output_tokens_per_s = 0;
  Percentiles ttft_s, tpot_s, itl_s;
  // TTFT of requests whose session KV was restored from the host or disk tier, and of the rest
  int64_t num_restored_requests = 0;
  Percentiles ttft_restored_s, ttft_other_s;
  // agents: TTFT of each agent's first turn and of its later ones (which find the history in
  // the pool, restore it from a tier or recompute it)
  int64_t num_later_turns = 0;
  Percentiles ttft_first_turn_s, ttft_later_turns_s;
  double kv_utilisation_mean = 0, kv_utilisation_peak = 0;  // of group 0's blocks
  double prefix_hit_rate = 0;  // prompt tokens served from the prefix cache or a session
  int64_t num_preemptions = 0, num_session_evictions = 0;
  int64_t num_preemption_swaps = 0, num_swapped_in_tokens = 0;
  // session tiers (EngineConfig host / disk budgets): moves out of the pool and back
  int64_t num_session_moves_to_host = 0, num_session_moves_to_disk = 0, num_session_restores = 0;
  int64_t num_restores_joined_steps = 0;  // EngineStats::num_restores_joined_steps
  int64_t num_copies_out_ordered = 0;     // EngineStats::num_copies_out_ordered
  int64_t num_file_reads_pageable = 0;    // EngineStats::num_file_reads_pageable
  int64_t num_file_reads_deferred = 0;    // EngineStats::num_file_reads_deferred
  // spill files that could not be written or read back (damaged, deleted, disk full): the
  // sessions' KV was dropped and recomputed (EngineStats::num_tier_errors)
  int64_t num_tier_errors = 0;
  // the tiers' byte moves (EngineStats::Moves): pool -> host, host -> pool, file writes, reads
  EngineStats::Moves to_host, to_pool, file_writes, file_reads;
  double ramp_share = 0, steady_share = 0, drain_share = 0;  // of wall time
  std::vector<RequestTiming> requests;

  // One fixed-format line per metric group, for logs and docs.
  std::string to_text() const;
  // One row per request: id, agent, turn, arrival, ttft, finish, token counts.
  Status write_csv(const std::string& path) const;
};

// Runs a workload to completion on `engine` (which must be idle). Vocabulary ids for synthetic
// prompts are drawn from [3, vocab_size).
Result<BenchReport> run_bench(Engine& engine, int32_t vocab_size, const BenchConfig& config);

}  // namespace kvp

#include "server/server_metrics.h"

#include <string>

namespace kvp::server {
namespace {

std::vector<double> latency_buckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,  0.75,
          1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0};
}

}  // namespace

ServerMetrics::ServerMetrics(EngineFront* engine) : engine_(engine) {
  MetricsRegistry& r = registry_;
  const auto gauge = [&](const char* name, const char* help, auto read) {
    r.add_callback(MetricType::kGauge, name, help, [this, read] { return double(read(stats_)); });
  };
  const auto counter = [&](const char* name, const char* help, auto read) {
    r.add_callback(MetricType::kCounter, name, help, [this, read] { return double(read(stats_)); });
  };
  gauge("kvpool:num_requests_running", "Number of requests in the engine's running batch.",
        [](const EngineStats& s) { return s.num_running; });
  gauge("kvpool:num_requests_waiting", "Number of requests waiting to be admitted.",
        [](const EngineStats& s) { return s.num_waiting; });
  gauge("kvpool:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
        [](const EngineStats& s) {
          return s.num_blocks_total > 0 ? double(s.num_blocks_used) / s.num_blocks_total : 0.0;
        });
  gauge("kvpool:kv_cache_blocks_used", "KV blocks held (cache group 0), cached ones excluded.",
        [](const EngineStats& s) { return s.num_blocks_used; });
  gauge("kvpool:kv_cache_blocks_total", "KV blocks in the pool (cache group 0).",
        [](const EngineStats& s) { return s.num_blocks_total; });
  counter("kvpool:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
          [](const EngineStats& s) { return s.num_prompt_tokens; });
  counter("kvpool:prefix_cache_hits", "Prompt tokens found in the prefix cache.",
          [](const EngineStats& s) { return s.num_prefix_hit_tokens; });
  counter("kvpool:num_preemptions", "Cumulative number of preemptions.",
          [](const EngineStats& s) { return s.num_preemptions; });
  counter("kvpool:preemption_swaps",
          "Preemptions that swapped the sequence's KV to host memory instead of recomputing it.",
          [](const EngineStats& s) { return s.num_preemption_swaps; });
  counter("kvpool:prefill_tokens", "Tokens run through the model as prefill.",
          [](const EngineStats& s) { return s.num_prefill_tokens; });
  counter("kvpool:session_moves_to_host", "Idle sessions moved from the pool to host memory.",
          [](const EngineStats& s) { return s.num_session_moves_to_host; });
  counter("kvpool:session_moves_to_disk", "Idle sessions moved to a cache file.",
          [](const EngineStats& s) { return s.num_session_moves_to_disk; });
  counter("kvpool:session_restores", "Sessions brought back from host memory or disk.",
          [](const EngineStats& s) { return s.num_session_restores; });
  counter("kvpool:session_restores_joined_steps",
          "Restores that ran in a step ordered after their copy into the pool (not waiting for a "
          "later step).",
          [](const EngineStats& s) { return s.num_restores_joined_steps; });
  counter("kvpool:tier_copies_out_not_waited",
          "Copies out of the pool whose blocks were given back at once, later steps ordered after "
          "the copy (EngineConfig::copy_out_overlap).",
          [](const EngineStats& s) { return s.num_copies_out_ordered; });
  counter("kvpool:session_restored_tokens", "Tokens whose KV came back from host memory or disk.",
          [](const EngineStats& s) { return s.num_restored_tokens; });
  counter("kvpool:session_evictions", "Idle sessions whose KV was dropped (recomputed later).",
          [](const EngineStats& s) { return s.num_session_evictions; });
  counter("kvpool:tier_errors", "Disk-tier writes or reads that failed (the KV was recomputed).",
          [](const EngineStats& s) { return s.num_tier_errors; });
  r.add_callback(
      MetricType::kGauge, "kvpool:tier_bytes", "Bytes held by a session tier.", {"tier"}, [this] {
        return std::vector<LabelledValue>{{{"host"}, double(stats_.host_tier_bytes_used)},
                                          {{"disk"}, double(stats_.disk_tier_bytes_used)}};
      });
  r.add_callback(MetricType::kGauge, "kvpool:sessions", "Sessions by the tier their KV is in.",
                 {"tier"}, [this] {
                   double count[4] = {0, 0, 0, 0};
                   for (const EngineSessionInfo& s : sessions_) count[int(s.tier)] += 1;
                   std::vector<LabelledValue> out;
                   for (SessionTier tier : {SessionTier::kDevice, SessionTier::kHost,
                                            SessionTier::kDisk, SessionTier::kNone}) {
                     out.push_back({{session_tier_name(tier)}, count[int(tier)]});
                   }
                   return out;
                 });
  prompt_tokens_ = &r.add_counter("kvpool:prompt_tokens", "Number of prompt tokens processed.");
  cached_tokens_ = &r.add_counter("kvpool:prompt_tokens_cached",
                                  "Prompt tokens whose KV was already there (prefix cache or "
                                  "session): prefill saved.");
  session_hit_tokens_ = &r.add_counter(
      "kvpool:session_hit_tokens", "Prompt tokens of session requests served from the session.");
  generation_tokens_ =
      &r.add_counter("kvpool:generation_tokens", "Number of generation tokens processed.");
  finished_ =
      &r.add_counter("kvpool:request_success", "Count of finished requests.", {"finished_reason"});
  errors_ =
      &r.add_counter("kvpool:request_errors", "Requests answered with an HTTP error.", {"code"});
  ttft_ = &r.add_histogram("kvpool:time_to_first_token_seconds",
                           "Histogram of time to first token in seconds.", latency_buckets());
  tpot_ = &r.add_histogram("kvpool:time_per_output_token_seconds",
                           "Histogram of time per output token in seconds.", latency_buckets());
  inter_token_ =
      &r.add_histogram("kvpool:inter_token_latency_seconds",
                       "Histogram of inter-token latency in seconds.", latency_buckets());
  e2e_ = &r.add_histogram("kvpool:e2e_request_latency_seconds",
                          "Histogram of end to end request latency in seconds.", latency_buckets());
}

void ServerMetrics::observe_first_token(double seconds) { ttft_->observe(seconds); }
void ServerMetrics::observe_inter_token(double seconds) { inter_token_->observe(seconds); }

void ServerMetrics::observe_finished(const Usage& usage, double e2e_seconds,
                                     int32_t num_output_tokens, double ttft_seconds,
                                     const std::string& finish_reason, bool session) {
  e2e_->observe(e2e_seconds);
  if (num_output_tokens > 1) {
    tpot_->observe((e2e_seconds - ttft_seconds) / (num_output_tokens - 1));
  }
  prompt_tokens_->inc(usage.prompt_tokens);
  cached_tokens_->inc(usage.cached_tokens);
  if (session) session_hit_tokens_->inc(usage.cached_tokens);
  generation_tokens_->inc(usage.completion_tokens);
  finished_->labels({finish_reason}).inc();
}

void ServerMetrics::observe_error(int http_status) {
  errors_->labels({std::to_string(http_status)}).inc();
}

std::string ServerMetrics::render() {
  std::lock_guard lock(render_mutex_);
  stats_ = engine_->stats();
  sessions_ = engine_->sessions();
  return registry_.render();
}

}  // namespace kvp::server

#include "engine/bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <queue>
#include <random>
#include <thread>

namespace kvp {

Result<BenchConfig::Workload> parse_workload(const std::string& name) {
  if (name == "offline") return BenchConfig::Workload::kOffline;
  if (name == "poisson") return BenchConfig::Workload::kPoisson;
  if (name == "closed") return BenchConfig::Workload::kClosed;
  if (name == "agents") return BenchConfig::Workload::kAgents;
  return Status::invalid_argument("bench: unknown workload '{}' (offline, poisson, closed, agents)",
                                  name);
}

const char* workload_name(BenchConfig::Workload workload) {
  switch (workload) {
    case BenchConfig::Workload::kOffline:
      return "offline";
    case BenchConfig::Workload::kPoisson:
      return "poisson";
    case BenchConfig::Workload::kClosed:
      return "closed";
    case BenchConfig::Workload::kAgents:
      return "agents";
  }
  return "?";
}

namespace {

Percentiles percentiles(std::vector<double> v) {
  Percentiles p;
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  auto at = [&](double q) { return v[static_cast<size_t>(q * double(v.size() - 1) + 0.5)]; };
  p.p50 = at(0.50);
  p.p95 = at(0.95);
  p.p99 = at(0.99);
  double sum = 0;
  for (double x : v) sum += x;
  p.mean = sum / double(v.size());
  return p;
}

struct Arrival {
  double at_s;
  int64_t order;  // ties keep submission order
  Request request;
  int32_t agent = -1, turn = -1;
  bool operator>(const Arrival& o) const {
    return at_s > o.at_s || (at_s == o.at_s && order > o.order);
  }
};

}  // namespace

std::string BenchReport::to_text() const {
  std::string s;
  s += fmt::format(
      "bench {}: {} requests, {} prompt tokens ({} prefilled), {} output tokens in {:.2f} s = "
      "{:.1f} output tok/s\n",
      workload, num_requests, prompt_tokens, prefilled_tokens, output_tokens, wall_s,
      output_tokens_per_s);
  s += fmt::format("  ttft  p50 {:8.2f} ms  p95 {:8.2f} ms  p99 {:8.2f} ms\n", ttft_s.p50 * 1e3,
                   ttft_s.p95 * 1e3, ttft_s.p99 * 1e3);
  s += fmt::format("  tpot  p50 {:8.2f} ms  p95 {:8.2f} ms  p99 {:8.2f} ms\n", tpot_s.p50 * 1e3,
                   tpot_s.p95 * 1e3, tpot_s.p99 * 1e3);
  s += fmt::format("  itl   p50 {:8.2f} ms  p95 {:8.2f} ms  p99 {:8.2f} ms\n", itl_s.p50 * 1e3,
                   itl_s.p95 * 1e3, itl_s.p99 * 1e3);
  s += fmt::format(
      "  kv utilisation mean {:.1f}% peak {:.1f}%; prefix/session hit rate {:.1f}%; "
      "preemptions {} ({} swapped to host, {} tokens swapped back in); session evictions {}\n",
      kv_utilisation_mean * 100, kv_utilisation_peak * 100, prefix_hit_rate * 100, num_preemptions,
      num_preemption_swaps, num_swapped_in_tokens, num_session_evictions);
  s += fmt::format(
      "  session tiers: moves to host {}, to disk {}; restores {} ({} ran in a step under their "
      "copy); copies out not waited for {}; tier errors {}\n",
      num_session_moves_to_host, num_session_moves_to_disk, num_session_restores,
      num_restores_joined_steps, num_copies_out_ordered, num_tier_errors);
  auto moves = [](const char* what, const EngineStats::Moves& m) {
    std::string s =
        m.count == 0
            ? fmt::format("{} 0", what)
            : fmt::format("{} {} x {:.1f} MB in {:.2f} ms each = {:.2f} GB/s", what, m.count,
                          double(m.bytes) / m.count / 1e6, m.seconds / m.count * 1e3,
                          m.seconds > 0 ? double(m.bytes) / m.seconds / 1e9 : 0.0);
    if (m.overlapped > 0) {
      s += fmt::format(" + {} x {:.1f} MB under compute", m.overlapped,
                       double(m.overlapped_bytes) / m.overlapped / 1e6);
    }
    return s;
  };
  if (num_later_turns > 0) {
    s += fmt::format(
        "  ttft of {} first turns p50 {:.2f} ms p95 {:.2f} ms; of {} later turns p50 {:.2f} ms "
        "p95 {:.2f} ms\n",
        num_requests - num_later_turns, ttft_first_turn_s.p50 * 1e3, ttft_first_turn_s.p95 * 1e3,
        num_later_turns, ttft_later_turns_s.p50 * 1e3, ttft_later_turns_s.p95 * 1e3);
  }
  if (num_restored_requests > 0) {
    s += fmt::format(
        "  ttft of {} requests restored from host/disk p50 {:.2f} ms p95 {:.2f} ms; of the "
        "other {} p50 {:.2f} ms p95 {:.2f} ms\n",
        num_restored_requests, ttft_restored_s.p50 * 1e3, ttft_restored_s.p95 * 1e3,
        num_requests - num_restored_requests, ttft_other_s.p50 * 1e3, ttft_other_s.p95 * 1e3);
  }
  if (to_host.count + to_pool.count + file_writes.count + file_reads.count + to_host.overlapped +
          to_pool.overlapped >
      0) {
    s += fmt::format("  tier moves: {}; {}\n", moves("pool->host", to_host),
                     moves("host->pool", to_pool));
    s += fmt::format(
        "  file moves: {}; {} ({} into pageable memory, the staging tier full; {} put off until "
        "it had room)\n",
        moves("writes", file_writes), moves("reads", file_reads), num_file_reads_pageable,
        num_file_reads_deferred);
  }
  s += fmt::format("  wall time: ramp-up {:.1f}%, steady {:.1f}%, drain {:.1f}%\n",
                   ramp_share * 100, steady_share * 100, drain_share * 100);
  return s;
}

Status BenchReport::write_csv(const std::string& path) const {
  std::ofstream out(path);
  if (!out) return Status::io_error("bench: cannot write '{}'", path);
  // the stages on the way to the first token, as seconds after arrival; empty: did not happen
  const auto after_arrival = [](const RequestTiming& r, double t) {
    return t < 0 ? std::string() : fmt::format("{:.6f}", t - r.arrival_s);
  };
  out << "request_id,agent,turn,arrival_s,ttft_s,finish_s,prompt_tokens,prefilled_tokens,"
         "cached_tokens,output_tokens,restored_tokens,admitted_after_s,kv_copy_start_after_s,"
         "kv_copy_done_after_s,first_step_after_s\n";
  for (const RequestTiming& r : requests) {
    out << fmt::format("{},{},{},{:.6f},{:.6f},{:.6f},{},{},{},{},{},{},{},{},{}\n", r.request_id,
                       r.agent, r.turn, r.arrival_s, r.first_token_s - r.arrival_s, r.finish_s,
                       r.prompt_tokens, r.prefilled_tokens, r.cached_tokens, r.output_tokens,
                       r.restored_tokens, after_arrival(r, r.admitted_s),
                       after_arrival(r, r.kv_copy_start_s), after_arrival(r, r.kv_copy_done_s),
                       after_arrival(r, r.first_step_s));
  }
  if (!out) return Status::io_error("bench: write to '{}' failed", path);
  return Status::ok();
}

Result<BenchReport> run_bench(Engine& engine, int32_t vocab_size, const BenchConfig& config) {
  if (engine.has_unfinished()) return Status::invalid_argument("bench: the engine is busy");
  if (vocab_size <= 3) return Status::invalid_argument("bench: vocabulary of {}", vocab_size);
  if (config.prompt_tokens_min < 1 || config.prompt_tokens_max < config.prompt_tokens_min ||
      config.output_tokens_min < 1 || config.output_tokens_max < config.output_tokens_min) {
    return Status::invalid_argument("bench: token ranges must be positive and ordered");
  }
  if (config.first_turn_tokens < 0) {
    return Status::invalid_argument("bench: first turn tokens {} is negative",
                                    config.first_turn_tokens);
  }
  std::mt19937_64 rng(config.seed);
  std::uniform_int_distribution<int32_t> token_dist(3, vocab_size - 1);
  auto random_tokens = [&](int32_t n) {
    std::vector<int32_t> t(n);
    for (int32_t& x : t) x = token_dist(rng);
    return t;
  };
  auto make_request = [&](std::vector<int32_t> prompt, int32_t max_tokens) {
    Request r;
    r.prompt_tokens = std::move(prompt);
    r.sampling.temperature = config.temperature;
    r.sampling.top_p = config.top_p;
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    return r;
  };
  std::uniform_int_distribution<int32_t> prompt_len(config.prompt_tokens_min,
                                                    config.prompt_tokens_max);
  std::uniform_int_distribution<int32_t> output_len(config.output_tokens_min,
                                                    config.output_tokens_max);

  std::priority_queue<Arrival, std::vector<Arrival>, std::greater<>> arrivals;
  int64_t order = 0;
  int64_t requested_tokens = 0;
  auto schedule_random = [&](double at) {
    const int32_t out = output_len(rng);
    requested_tokens += out;
    arrivals.push({at, order++, make_request(random_tokens(prompt_len(rng)), out)});
  };
  const std::vector<int32_t> system_prompt = random_tokens(config.system_prompt_tokens);
  std::vector<std::vector<int32_t>> agent_history(config.num_agents);  // sessions off
  auto schedule_turn = [&](int32_t agent, int32_t turn, double at) {
    std::vector<int32_t> user = random_tokens(
        turn == 0 && config.first_turn_tokens > 0 ? config.first_turn_tokens : config.turn_tokens);
    std::vector<int32_t> prompt;
    Request r;
    if (config.sessions) {
      if (turn == 0) prompt = system_prompt;
      prompt.insert(prompt.end(), user.begin(), user.end());
      r = make_request(prompt, config.reply_tokens);
      r.session = fmt::format("bench-agent-{}", agent);
    } else {
      auto& history = agent_history[agent];
      if (turn == 0) history = system_prompt;
      history.insert(history.end(), user.begin(), user.end());
      r = make_request(history, config.reply_tokens);
    }
    r.min_tokens = config.reply_tokens;
    arrivals.push({at, order++, std::move(r), agent, turn});
  };
  switch (config.workload) {
    case BenchConfig::Workload::kOffline:
      for (int32_t i = 0; i < config.num_requests; ++i) schedule_random(0.0);
      break;
    case BenchConfig::Workload::kPoisson: {
      std::exponential_distribution<double> gap(config.rate);
      double t = 0;
      while (requested_tokens < config.target_output_tokens) {
        schedule_random(t);
        t += gap(rng);
      }
      break;
    }
    case BenchConfig::Workload::kClosed:
      for (int32_t c = 0; c < config.concurrency; ++c) schedule_random(0.0);
      break;
    case BenchConfig::Workload::kAgents:
      for (int32_t a = 0; a < config.num_agents; ++a) schedule_turn(a, 0, 0.0);
      break;
  }

  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto now_s = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  std::map<int64_t, RequestTiming> live;
  std::map<int64_t, std::vector<int32_t>> live_outputs;  // agents without sessions: replies
  BenchReport report;
  report.workload = workload_name(config.workload);
  std::vector<std::pair<double, int32_t>> concurrency_trace;  // (time, running)
  double kv_sum = 0;
  int64_t kv_samples = 0;
  const EngineStats before = engine.stats();

  while (true) {
    const double t = now_s();
    while (!arrivals.empty() && arrivals.top().at_s <= t) {
      Arrival a = arrivals.top();
      arrivals.pop();
      const auto prompt_size = static_cast<int32_t>(a.request.prompt_tokens.size());
      auto id = engine.submit(std::move(a.request));
      if (!id.is_ok()) return id.status();
      RequestTiming timing;
      timing.request_id = id->value;
      timing.agent = a.agent;
      timing.turn = a.turn;
      timing.arrival_s = a.at_s;
      timing.prompt_tokens = prompt_size;
      live[id->value] = timing;
    }
    if (!engine.has_unfinished()) {
      if (arrivals.empty()) break;
      std::this_thread::sleep_for(
          std::chrono::duration<double>(std::max(0.0, arrivals.top().at_s - now_s())));
      continue;
    }
    std::vector<EngineEvent> events = engine.step();
    const double step_end = now_s();
    const EngineStats stats = engine.stats();
    const double utilisation = double(stats.num_blocks_used) / stats.num_blocks_total;
    kv_sum += utilisation;
    ++kv_samples;
    report.kv_utilisation_peak = std::max(report.kv_utilisation_peak, utilisation);
    concurrency_trace.emplace_back(step_end, stats.num_running);
    for (const EngineEvent& e : events) {
      RequestTiming& timing = live.at(e.request_id.value);
      if (e.kind == EngineEvent::Kind::kToken) {
        if (timing.token_times_s.empty()) timing.first_token_s = step_end;
        timing.token_times_s.push_back(step_end);
        ++timing.output_tokens;
        live_outputs[e.request_id.value].push_back(e.token_id);
        continue;
      }
      if (!e.request_finished) continue;
      timing.finish_s = step_end;
      timing.prefilled_tokens = e.usage.prefilled_tokens;
      timing.cached_tokens = e.usage.cached_tokens;
      timing.restored_tokens = e.usage.restored_tokens;
      const auto since_start = [&](const std::optional<RequestTimes::TimePoint>& t) {
        return t ? std::chrono::duration<double>(*t - start).count() : -1.0;
      };
      timing.admitted_s = since_start(e.times.admitted);
      timing.kv_copy_start_s = since_start(e.times.kv_copy_start);
      timing.kv_copy_done_s = since_start(e.times.kv_copy_done);
      timing.first_step_s = since_start(e.times.first_step);
      if (config.workload == BenchConfig::Workload::kClosed &&
          requested_tokens < config.target_output_tokens) {
        schedule_random(step_end);
      }
      if (config.workload == BenchConfig::Workload::kAgents && timing.turn + 1 < config.num_turns) {
        if (!config.sessions) {
          // the reply joins the history the next turn resends
          const auto& reply = live_outputs[e.request_id.value];
          auto& history = agent_history[timing.agent];
          history.insert(history.end(), reply.begin(), reply.end());
        }
        schedule_turn(timing.agent, timing.turn + 1, step_end + config.think_time_s);
      }
      report.requests.push_back(timing);
      live.erase(e.request_id.value);
      live_outputs.erase(e.request_id.value);
    }
  }
  report.wall_s = now_s();
  const EngineStats after = engine.stats();

  std::vector<double> ttft, tpot, itl, ttft_restored, ttft_other, ttft_first, ttft_later;
  int64_t cached = 0;
  for (const RequestTiming& r : report.requests) {
    ++report.num_requests;
    report.output_tokens += r.output_tokens;
    report.prompt_tokens += r.prompt_tokens;
    report.prefilled_tokens += r.prefilled_tokens;
    cached += r.cached_tokens;
    if (r.token_times_s.empty()) continue;
    ttft.push_back(r.first_token_s - r.arrival_s);
    (r.restored_tokens > 0 ? ttft_restored : ttft_other).push_back(ttft.back());
    if (r.turn >= 0) (r.turn == 0 ? ttft_first : ttft_later).push_back(ttft.back());
    if (r.output_tokens > 1) {
      tpot.push_back((r.finish_s - r.first_token_s) / (r.output_tokens - 1));
    }
    for (size_t i = 1; i < r.token_times_s.size(); ++i) {
      itl.push_back(r.token_times_s[i] - r.token_times_s[i - 1]);
    }
  }
  report.ttft_s = percentiles(ttft);
  report.num_restored_requests = static_cast<int64_t>(ttft_restored.size());
  report.ttft_restored_s = percentiles(ttft_restored);
  report.ttft_other_s = percentiles(ttft_other);
  report.num_later_turns = static_cast<int64_t>(ttft_later.size());
  report.ttft_first_turn_s = percentiles(ttft_first);
  report.ttft_later_turns_s = percentiles(ttft_later);
  report.tpot_s = percentiles(tpot);
  report.itl_s = percentiles(itl);
  report.output_tokens_per_s = report.wall_s > 0 ? report.output_tokens / report.wall_s : 0;
  report.kv_utilisation_mean = kv_samples ? kv_sum / kv_samples : 0;
  report.prefix_hit_rate = (cached + report.prefilled_tokens) > 0
                               ? double(cached) / double(cached + report.prefilled_tokens)
                               : 0;
  report.num_preemptions = after.num_preemptions - before.num_preemptions;
  report.num_preemption_swaps = after.num_preemption_swaps - before.num_preemption_swaps;
  report.num_swapped_in_tokens = after.num_swapped_in_tokens - before.num_swapped_in_tokens;
  report.num_session_evictions = after.num_session_evictions - before.num_session_evictions;
  report.num_session_moves_to_host =
      after.num_session_moves_to_host - before.num_session_moves_to_host;
  report.num_session_moves_to_disk =
      after.num_session_moves_to_disk - before.num_session_moves_to_disk;
  report.num_session_restores = after.num_session_restores - before.num_session_restores;
  report.num_restores_joined_steps =
      after.num_restores_joined_steps - before.num_restores_joined_steps;
  report.num_copies_out_ordered = after.num_copies_out_ordered - before.num_copies_out_ordered;
  report.num_file_reads_pageable = after.num_file_reads_pageable - before.num_file_reads_pageable;
  report.num_file_reads_deferred = after.num_file_reads_deferred - before.num_file_reads_deferred;
  report.num_tier_errors = after.num_tier_errors - before.num_tier_errors;
  auto moved = [](const EngineStats::Moves& a, const EngineStats::Moves& b) {
    return EngineStats::Moves{a.count - b.count, a.bytes - b.bytes, a.seconds - b.seconds,
                              a.overlapped - b.overlapped, a.overlapped_bytes - b.overlapped_bytes};
  };
  report.to_host = moved(after.to_host, before.to_host);
  report.to_pool = moved(after.to_pool, before.to_pool);
  report.file_writes = moved(after.file_writes, before.file_writes);
  report.file_reads = moved(after.file_reads, before.file_reads);
  // steady state: steps running at least 80% of the peak concurrency
  int32_t peak = 0;
  for (const auto& [t, running] : concurrency_trace) peak = std::max(peak, running);
  double first_steady = report.wall_s, last_steady = report.wall_s;
  bool seen = false;
  for (const auto& [t, running] : concurrency_trace) {
    if (running * 5 >= peak * 4) {
      if (!seen) first_steady = t;
      seen = true;
      last_steady = t;
    }
  }
  if (report.wall_s > 0 && seen) {
    report.ramp_share = first_steady / report.wall_s;
    report.steady_share = (last_steady - first_steady) / report.wall_s;
    report.drain_share = 1.0 - report.ramp_share - report.steady_share;
  }
  return report;
}

}  // namespace kvp

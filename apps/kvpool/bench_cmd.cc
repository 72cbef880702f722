// `kvpool bench`: option parsing, one model load, one fresh Engine per run, and the reports.
// With --compare-sessions the agents workload runs on the same model with sessions, re-sending
// the whole history every turn, and (models with a prefix cache) re-sending it with the prefix
// cache off: true re-prefill. Each run gets a fresh engine, so none finds another's cache; the
// table shows them side by side with the prefill tokens sessions saved.
#include "bench_cmd.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "bench_plot.h"
#include "common/thread_pool.h"
#include "generate.h"
#include "model/model_loader.h"
#include "model/random_model.h"

namespace kvp::app {
namespace {

namespace fs = std::filesystem;

bool write_plot(std::span<const PlotRun> runs, const BenchOptions& o) {
  const std::string model =
      o.model.random_model.empty() ? o.model.model : o.model.random_model + " (random weights)";
  const std::string title =
      fmt::format("kvpool bench {}: {} on {}", o.workload, model, o.model.device);
  const Status written = write_bench_plot(runs, title, o.plot_path);
  if (!written.is_ok()) {
    fmt::print(stderr, "kvpool bench: {}\n", written.to_string());
    return false;
  }
  fmt::print("wrote {}\n", o.plot_path);
  return true;
}

// "out.csv" + "sessions" -> "out.sessions.csv".
std::string tagged_path(const std::string& path, const std::string& tag) {
  const fs::path p(path);
  fs::path tagged = p.parent_path() / p.stem();
  tagged += "." + tag;
  tagged += p.extension();
  return tagged.string();
}

// Checks what CLI11's per-option checks cannot: options that must agree with each other.
Status check_options(const BenchOptions& o) {
  const BenchConfig& b = o.bench;
  KVP_RETURN_IF_ERROR(check_engine_options(o.model));
  if (b.prompt_tokens_max < b.prompt_tokens_min) {
    return Status::invalid_argument("--prompt-tokens-max {} is below --prompt-tokens-min {}",
                                    b.prompt_tokens_max, b.prompt_tokens_min);
  }
  if (b.output_tokens_max < b.output_tokens_min) {
    return Status::invalid_argument("--output-tokens-max {} is below --output-tokens-min {}",
                                    b.output_tokens_max, b.output_tokens_min);
  }
  if (o.compare_sessions && b.workload != BenchConfig::Workload::kAgents) {
    return Status::invalid_argument("--compare-sessions needs --workload agents, not {}",
                                    o.workload);
  }
  if (!o.plot_path.empty()) {
    const fs::path folder = fs::path(o.plot_path).parent_path();
    std::error_code ec;
    if (!folder.empty() && !fs::is_directory(folder, ec)) {
      return Status::invalid_argument("--plot {}: folder {} does not exist", o.plot_path,
                                      folder.string());
    }
  }
  return Status::ok();
}

// One run on a fresh engine (the backend's KV pool allocated anew). Prints a line and returns
// nullopt on failure.
std::optional<BenchReport> run_once(ForwardBackend& backend, const BenchOptions& o,
                                    const BenchConfig& config) {
  Result<std::unique_ptr<Engine>> created = Engine::create(&backend, o.engine);
  if (!created.is_ok()) {
    fmt::print(stderr, "kvpool bench: {}\n", created.status().to_string());
    return std::nullopt;
  }
  Engine& engine = **created;
  Result<BenchReport> report = run_bench(engine, backend.spec().vocab_size, config);
  if (!report.is_ok()) {
    const bool refused = report.status().code() == StatusCode::kInvalidArgument;
    fmt::print(stderr, "kvpool bench: the {} run failed: {}{}\n", workload_name(config.workload),
               report.status().to_string(),
               refused ? " (check --blocks, --block-size and the workload's token options)" : "");
    return std::nullopt;
  }
  engine.check_integrity();
  return std::move(report).value();
}

bool write_csv(const BenchReport& report, const std::string& path) {
  const Status written = report.write_csv(path);
  if (!written.is_ok()) {
    fmt::print(stderr, "kvpool bench: --csv: {}\n", written.to_string());
    return false;
  }
  fmt::print("wrote {} ({} requests)\n", path, report.requests.size());
  return true;
}

struct Run {
  std::string label;     // column header
  std::string tag;       // CSV file tag
  std::string describe;  // heading of its report
  BenchConfig bench;
  EngineConfig engine;
  std::optional<BenchReport> report;
};

// The agents runs as one table: a row per metric, a column per run; then what sessions saved
// against each other run.
void print_side_by_side(const std::vector<Run>& runs) {
  using Metric = std::string (*)(const BenchReport&);
  struct Row {
    const char* name;
    Metric value;
  };
  static const Row kRows[] = {
      {"requests (turns)", [](const BenchReport& r) { return fmt::format("{}", r.num_requests); }},
      {"prompt tokens sent",
       [](const BenchReport& r) { return fmt::format("{}", r.prompt_tokens); }},
      {"prompt tokens prefilled",
       [](const BenchReport& r) { return fmt::format("{}", r.prefilled_tokens); }},
      {"output tokens", [](const BenchReport& r) { return fmt::format("{}", r.output_tokens); }},
      {"wall s", [](const BenchReport& r) { return fmt::format("{:.2f}", r.wall_s); }},
      {"output tok/s",
       [](const BenchReport& r) { return fmt::format("{:.1f}", r.output_tokens_per_s); }},
      {"ttft p50 ms",
       [](const BenchReport& r) { return fmt::format("{:.2f}", r.ttft_s.p50 * 1e3); }},
      {"ttft p95 ms",
       [](const BenchReport& r) { return fmt::format("{:.2f}", r.ttft_s.p95 * 1e3); }},
      {"ttft p99 ms",
       [](const BenchReport& r) { return fmt::format("{:.2f}", r.ttft_s.p99 * 1e3); }},
      {"tpot p50 ms",
       [](const BenchReport& r) { return fmt::format("{:.2f}", r.tpot_s.p50 * 1e3); }},
      {"tpot p95 ms",
       [](const BenchReport& r) { return fmt::format("{:.2f}", r.tpot_s.p95 * 1e3); }},
      {"itl p50 ms", [](const BenchReport& r) { return fmt::format("{:.2f}", r.itl_s.p50 * 1e3); }},
      {"itl p99 ms", [](const BenchReport& r) { return fmt::format("{:.2f}", r.itl_s.p99 * 1e3); }},
      {"kv utilisation mean",
       [](const BenchReport& r) { return fmt::format("{:.1f}%", r.kv_utilisation_mean * 100); }},
      {"kv utilisation peak",
       [](const BenchReport& r) { return fmt::format("{:.1f}%", r.kv_utilisation_peak * 100); }},
      {"prefix/session hit rate",
       [](const BenchReport& r) { return fmt::format("{:.1f}%", r.prefix_hit_rate * 100); }},
      {"preemptions", [](const BenchReport& r) { return fmt::format("{}", r.num_preemptions); }},
      {"preemption swaps",
       [](const BenchReport& r) { return fmt::format("{}", r.num_preemption_swaps); }},
      {"session evictions",
       [](const BenchReport& r) { return fmt::format("{}", r.num_session_evictions); }},
  };
  std::vector<std::vector<std::string>> table = {{"metric"}};
  for (const Run& run : runs) table[0].push_back(run.label);
  for (const Row& row : kRows) {
    table.push_back({row.name});
    for (const Run& run : runs) table.back().push_back(row.value(*run.report));
  }
  std::vector<size_t> widths(table[0].size(), 0);
  for (const auto& line : table) {
    for (size_t i = 0; i < line.size(); ++i) widths[i] = std::max(widths[i], line[i].size());
  }
  fmt::print("\nagents workload side by side:\n");
  for (const auto& line : table) {
    std::string text = fmt::format("  {:<{}}", line[0], widths[0]);
    for (size_t i = 1; i < line.size(); ++i) text += fmt::format("  {:>{}}", line[i], widths[i]);
    fmt::print("{}\n", text);
  }
  const BenchReport& with = *runs[0].report;
  for (size_t i = 1; i < runs.size(); ++i) {
    const BenchReport& other = *runs[i].report;
    fmt::print(
        "  sessions vs {}: {} vs {} prefilled tokens ({:+.1f}%); {} took {:.2f}x the sessions' "
        "wall time\n",
        runs[i].label, with.prefilled_tokens, other.prefilled_tokens,
        other.prefilled_tokens > 0
            ? 100.0 * static_cast<double>(with.prefilled_tokens - other.prefilled_tokens) /
                  static_cast<double>(other.prefilled_tokens)
            : 0.0,
        runs[i].label, with.wall_s > 0 ? other.wall_s / with.wall_s : 0.0);
  }
}

}  // namespace

CLI::App* add_bench_command(CLI::App& app, BenchOptions* o) {
  CLI::App* bench = app.add_subcommand(
      "bench",
      "Runs an engine benchmark workload on a model and prints latency, throughput and "
      "cache statistics");
  BenchConfig& b = o->bench;
  add_engine_options(bench, &o->model, ModelChoice::kFileOrRandom);
  bench->add_option("--workload", o->workload, "offline, poisson, closed or agents")
      ->check(CLI::IsMember({"offline", "poisson", "closed", "agents"}))
      ->capture_default_str();
  // Workload parameters (BenchConfig).
  bench->add_option("--requests", b.num_requests, "offline: requests, all arriving at t = 0")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  bench->add_option("--rate", b.rate, "poisson: arrivals per second")
      ->check(finite_range(1e-3, 1e6))
      ->capture_default_str();
  bench->add_option("--concurrency", b.concurrency, "closed: clients, each one request at a time")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  bench
      ->add_option("--target-output-tokens", b.target_output_tokens,
                   "poisson, closed: output tokens to ask for in all")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->capture_default_str();
  bench->add_option("--prompt-tokens-min", b.prompt_tokens_min, "prompt length, uniform from")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  bench->add_option("--prompt-tokens-max", b.prompt_tokens_max, "prompt length, uniform to")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  bench->add_option("--output-tokens-min", b.output_tokens_min, "output length, uniform from")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  bench->add_option("--output-tokens-max", b.output_tokens_max, "output length, uniform to")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  bench->add_option("--agents", b.num_agents, "agents: agents")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  bench->add_option("--turns", b.num_turns, "agents: turns per agent")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  bench
      ->add_option("--system-prompt-tokens", b.system_prompt_tokens,
                   "agents: system prompt tokens shared by every agent")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  bench->add_option("--turn-tokens", b.turn_tokens, "agents: user tokens per turn")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  bench
      ->add_option("--first-turn-tokens", b.first_turn_tokens,
                   "agents: user tokens of each agent's first turn (0: --turn-tokens), e.g. a long "
                   "document that later turns ask about")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  bench->add_option("--reply-tokens", b.reply_tokens, "agents: generated tokens per turn")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  bench
      ->add_option("--think-time", b.think_time_s,
                   "agents: seconds between a reply and the agent's next turn")
      ->check(finite_range(0.0, 3600.0))
      ->capture_default_str();
  bench->add_flag("--sessions,!--no-sessions", b.sessions,
                  "agents: keep each agent's history in a session (--no-sessions: re-send the "
                  "whole history every turn; default: sessions)");
  bench->add_option("--seed", b.seed, "seed of the synthetic prompts and lengths")
      ->capture_default_str();
  bench->add_option("--temperature", b.temperature, "every request's temperature (0: greedy)")
      ->check(CLI::Range(0.0f, 100.0f))
      ->capture_default_str();
  bench->add_option("--top-p", b.top_p, "every request's nucleus mass in (0, 1]")
      ->check(CLI::Range(0.0f, 1.0f))
      ->capture_default_str();
  bench
      ->add_option("--warmup", o->warmup,
                   "run the workload once unmeasured first: auto (on for cuda, off for cpu), on, "
                   "off")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  bench->add_flag(
      "--compare-sessions", o->compare_sessions,
      "agents: run with sessions, with the history re-sent every turn (prefix cache on), "
      "and re-sent with no prefix cache (re-prefill); print them side by side");
  bench->add_option("--csv", o->csv_path,
                    "write one row per request here (--compare-sessions: one file per run, "
                    "PATH with .sessions, .resend, .reprefill before the extension)");
  bench->add_option("--plot", o->plot_path,
                    "draw a PNG here: output tokens over time and time to first token per "
                    "request, every run in one picture (needs gnuplot)");
  return bench;
}

int run_bench_command(BenchOptions o) {
  Result<BenchConfig::Workload> workload = parse_workload(o.workload);
  if (!workload.is_ok()) {
    fmt::print(stderr, "kvpool bench: --workload: {}\n", workload.status().to_string());
    return 2;
  }
  o.bench.workload = *workload;
  const Status options_ok = check_options(o);
  if (!options_ok.is_ok()) {
    fmt::print(stderr, "kvpool bench: {}\n", options_ok.message());
    return 2;
  }
  const int32_t num_threads = resolved_threads(o.model);
  ThreadPool pool(num_threads);
  const bool random = !o.model.random_model.empty();
  Result<std::unique_ptr<ForwardBackend>> backend =
      random ? make_random_backend(o.model.random_model, o.model.device, o.bench.seed, &pool,
                                   o.model.tensor_parallel)
             : load_backend(o.model.model, o.model.device, &pool, {}, o.model.tensor_parallel);
  if (!backend.is_ok()) {
    fmt::print(stderr, "kvpool bench: {} {}: {}\n", random ? "--random-model" : "--model",
               random ? o.model.random_model : o.model.model, backend.status().to_string());
    return 2;
  }
  Result<EngineConfig> engine_config = make_engine_config(o.model, **backend);
  if (!engine_config.is_ok()) {
    fmt::print(stderr, "kvpool bench: {}\n", engine_config.status().message());
    return 2;
  }
  o.engine = std::move(engine_config).value();
  const ModelSpec& spec = (*backend)->spec();
  fmt::print(
      "kvpool bench: {} ({}, {} layers, vocab {}) on {}; engine: block size {}, {} blocks per "
      "group x {} group(s), KV {}, max {} seqs, {} tokens per step, prefix caching {}; {} "
      "thread(s); sampling: temperature {}, top-p {} on the {}\n",
      random ? o.model.random_model + " with random weights" : o.model.model,
      architecture_name(spec.architecture), spec.num_layers, spec.vocab_size,
      (*backend)->device_name(), o.engine.block_size, o.engine.num_blocks,
      (*backend)->num_cache_groups(), dtype_name(o.engine.kv_dtype), o.engine.max_num_seqs,
      o.engine.max_step_tokens, o.engine.prefix_caching ? "on" : "off", num_threads,
      o.bench.temperature, o.bench.top_p,
      o.engine.device_sampling && (*backend)->samples_on_device() ? "device" : "CPU");
  if (const std::string w = describe_weights(**backend); !w.empty()) fmt::print("{}\n", w);

  const bool warmup = o.warmup == "on" || (o.warmup == "auto" && o.model.device != "cpu");
  if (warmup) {
    BenchConfig first = o.bench;
    first.sessions = o.bench.sessions || o.compare_sessions;
    std::optional<BenchReport> report = run_once(**backend, o, first);
    if (!report) return 1;
    fmt::print("warm-up run (not measured): {:.2f} s\n", report->wall_s);
  }
  if (!o.compare_sessions) {
    std::optional<BenchReport> report = run_once(**backend, o, o.bench);
    if (!report) return 1;
    fmt::print("{}", report->to_text());
    if (!o.csv_path.empty() && !write_csv(*report, o.csv_path)) return 1;
    if (!o.plot_path.empty()) {
      const PlotRun run{o.workload, &*report};
      if (!write_plot({&run, 1}, o)) return 1;
    }
    return 0;
  }
  // Sessions; the whole history re-sent every turn with the prefix cache finding most of it
  // and re-sent with no prefix cache: true re-prefill.
  std::vector<Run> runs;
  runs.push_back({"sessions", "sessions", "sessions", o.bench, o.engine, std::nullopt});
  runs.back().bench.sessions = true;
  if (o.engine.prefix_caching) {
    runs.push_back({"resend", "resend", "history re-sent every turn (prefix cache on)", o.bench,
                    o.engine, std::nullopt});
    runs.back().bench.sessions = false;
  }
  runs.push_back({"re-prefill", "reprefill",
                  "history re-sent every turn, no prefix cache (re-prefill)", o.bench, o.engine,
                  std::nullopt});
  runs.back().bench.sessions = false;
  runs.back().engine.prefix_caching = false;
  for (Run& run : runs) {
    BenchOptions run_options = o;
    run_options.engine = run.engine;
    run.report = run_once(**backend, run_options, run.bench);
    if (!run.report) return 1;
    fmt::print("{}:\n{}", run.describe, run.report->to_text());
  }
  print_side_by_side(runs);
  if (!o.csv_path.empty()) {
    for (const Run& run : runs) {
      if (!write_csv(*run.report, tagged_path(o.csv_path, run.tag))) return 1;
    }
  }
  if (!o.plot_path.empty()) {
    std::vector<PlotRun> plot_runs;
    for (const Run& run : runs) plot_runs.push_back({run.label, &*run.report});
    if (!write_plot(plot_runs, o)) return 1;
  }
  return 0;
}

}  // namespace kvp::app

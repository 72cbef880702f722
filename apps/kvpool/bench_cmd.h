// `kvpool bench`: loads a model and runs one of the engine's benchmark workloads on it
// (src/engine/bench.h: offline, poisson, closed, agents), printing BenchReport::to_text() and
// optionally writing the per-request CSV. `--compare-sessions` runs the agents workload on fresh
// engines with sessions, with the whole history re-sent every turn, and re-sent with the prefix
// cache off (re-prefill), and prints them side by side.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

#include "engine/bench.h"
#include "engine/engine.h"
#include "engine_options.h"

namespace kvp::app {

// The shared options with the benchmark's defaults.
inline EngineOptions default_model_options() {
  EngineOptions o;
  o.blocks = 1024;
  return o;
}

struct BenchOptions {
  // --model (a GGUF file or Hugging Face directory), device, pool, tiers, threads; the
  // benchmark's default pool is 1024 blocks per group (--blocks), not --kv-memory.
  EngineOptions model = default_model_options();
  std::string workload = "offline";  // offline | poisson | closed | agents
  BenchConfig bench;                 // workload parameters (its `workload` is set from the name)
  EngineConfig engine;               // from `model` once the backend is loaded
  std::string csv_path;              // empty: no CSV
  std::string plot_path;             // empty: no PNG (bench_plot.h)
  bool compare_sessions = false;
  // One unmeasured run of the same workload first (CUDA graphs captured, buffers grown, cuBLAS
  // warmed), so the first measured run is not the one paying for them. auto: on for cuda.
  std::string warmup = "auto";  // auto | on | off
};

// With --random-model the prompts are random token ids (as always) and no tokenizer is needed;
// on cpu only shapes whose f32 weights fit kMaxRandomCpuWeightBytes run (smollm2-135m, not
// llama3-8b).

// Registers the `bench` subcommand on `app`, parsing into *options (which must outlive app).
CLI::App* add_bench_command(CLI::App& app, BenchOptions* options);

// Runs the benchmark; prints the report to stdout, errors to stderr. Returns the process exit
// code: 0, 2 for bad input (bad option values, a model that does not load), 1 if a run fails.
int run_bench_command(BenchOptions options);

}  // namespace kvp::app

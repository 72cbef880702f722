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

namespace kvp::app {

struct BenchOptions {
  std::string model_path;            // a GGUF file or Hugging Face directory (load_backend)
  std::string random_model;          // or a named shape with random weights (random_model.h)
  std::string device = "cpu";        // cpu, cuda or cuda:N
  std::string kv_dtype = "auto";     // f32, bf16, f16; auto: f32 on cpu, bf16 on cuda
  std::string workload = "offline";  // offline | poisson | closed | agents
  BenchConfig bench;                 // workload parameters (its `workload` is set from the name)
  EngineConfig engine;
  int32_t num_threads = 1;  // attention threads of the CPU runner
  std::string csv_path;     // empty: no CSV
  std::string plot_path;    // empty: no PNG (bench_plot.h)
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

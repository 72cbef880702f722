// `kvpool plan`: KV memory per model and how many agents fit a pool, from real config.json files
// (ADR-002's table recomputed), then the pool simulation (pending: print_simulation in plan.cc).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace kvp::app {

struct PlanOptions {
  std::vector<std::string> config_paths;  // empty: the fixtures in tests/cache/fixtures
  double pool_gib = 4.0;                  // pool budget, GiB (2^30 bytes)
  int64_t context_tokens = 8192;          // context of one agent
  std::vector<int32_t> block_sizes = {16, 256};
};

// Registers the `plan` subcommand on `app`, parsing into *options (which must outlive app).
CLI::App* add_plan_command(CLI::App& app, PlanOptions* options);

// Runs the plan; prints to stdout, errors to stderr. Returns the process exit code: 0, or 2 for
// bad input (unreadable or invalid config, bad option values).
int run_plan(const PlanOptions& options);

}  // namespace kvp::app

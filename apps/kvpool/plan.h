// `kvpool plan`: KV memory per model and how many agents fit a pool, from real config.json files
// (ADR-002's table recomputed), then the pool simulation (src/cache/pool_simulator.h): N agents
// take turns on that pool with a shared system prompt; per model and block size it prints pool
// utilisation, slot waste, prefix-hit rate, context reuse, evictions and tier moves.
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
  double host_gib = 4.0;  // host (offload) pool of the simulation, GiB; 0: sessions go to disk
  // The simulation: agents x turns, `concurrency` agents active at once.
  int32_t sim_agents = 16;
  int32_t sim_turns = 8;
  int32_t sim_concurrency = 4;
  int32_t system_prompt_tokens = 1024;  // shared by every agent, sent on its first turn
  int32_t turn_tokens = 128;            // user tokens per turn (mean)
  int32_t reply_tokens = 256;           // generated tokens per turn (mean)
  uint64_t sim_seed = 1;
  std::vector<int32_t> sim_block_sizes = {16, 32, 64, 128, 256};
};

// Registers the `plan` subcommand on `app`, parsing into *options (which must outlive app).
CLI::App* add_plan_command(CLI::App& app, PlanOptions* options);

// Runs the plan; prints to stdout, errors to stderr. Returns the process exit code: 0, 2 for
// bad input (unreadable or invalid config, bad option values), 1 if the simulator fails.
int run_plan(const PlanOptions& options);

}  // namespace kvp::app

// Pool simulator: a deterministic simulation of agents taking turns on one KV block pool, for
// `kvpool plan` (which block size, how many blocks?). It drives the real bookkeeping classes
// (BlockAllocator, BlockTable, PrefixCache, SessionStore); no KV bytes exist.
//
// Each agent is a session. Every round, agents take turns in groups of `concurrency` (a batch):
// each one begins (resuming from host or disk if it was moved down), appends its user tokens
// (the first turn: the shared system prompt first), then its reply tokens one at a time
// (decode), and ends. With window_tokens > 0 the model also has a sliding-window cache group
// (Gemma 3's local layers) with its own device and host pools; sessions move in both at once. Idle
// sessions are moved down tiers (device -> host -> disk) when the pool runs short.
// Lengths vary by +-jitter around their means, from `seed`: the same config gives the same
// result.
//
// The API is plain structs of numbers so the app can sweep block sizes and print a table.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cache/session_store.h"
#include "common/status.h"

namespace kvp {

struct PoolSimConfig {
  int32_t block_size = 16;      // tokens per block, a power of two in [1, 1024]
  int32_t pool_blocks = 1024;   // device pool
  int32_t host_blocks = 1024;   // host (offload) pool; 0 = none (sessions go to disk)
  int64_t bytes_per_block = 0;  // KV bytes of one block (all layers, K and V); for reporting
  int32_t agents = 8;
  int32_t turns = 8;        // turns per agent
  int32_t concurrency = 4;  // agents active at once
  int32_t system_prompt_tokens = 512;
  int32_t user_tokens = 64;    // mean per turn
  int32_t reply_tokens = 128;  // mean per turn
  double jitter = 0.5;         // lengths uniform in mean * [1 - jitter, 1 + jitter]
  uint64_t seed = 1;
  // Optional sliding-window group (same block size): window in tokens, 0 = none.
  int32_t window_tokens = 0;
  int32_t window_pool_blocks = 0;  // required when window_tokens > 0
  int32_t window_host_blocks = 0;
  int64_t window_bytes_per_block = 0;
};

struct PoolSimSession {
  std::string name;
  int32_t num_tokens = 0;  // at the end
  Tier final_tier = Tier::Resident;
  int32_t failed_turns = 0;  // turns that found no room
  SessionStats stats;
};

struct PoolSimResult {
  int32_t block_size = 0;
  int32_t pool_blocks = 0;
  int64_t pool_bytes = 0;  // both groups' device pools
  // Used blocks (ref_count > 0) over pool blocks, sampled after every turn.
  double utilisation_mean = 0;
  double utilisation_peak = 0;
  int64_t peak_used_bytes = 0;  // both groups, each at its own peak
  // The same for the window group's pool (0 without one).
  double window_utilisation_mean = 0;
  double window_utilisation_peak = 0;
  // Allocated but unfilled slots over allocated slots of the held blocks of the global group
  // (shared blocks counted once), sampled after every turn.
  double slot_waste_mean = 0;
  // Tokens sent as new prompts (system prompt + user tokens), and those served by the prefix
  // cache instead of being computed.
  int64_t prompt_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  double prefix_hit_rate = 0;
  // A stateless server would recompute the whole context every turn: tokens of context
  // (history + new prompt) over all turns, and the share that was not recomputed.
  int64_t context_tokens = 0;
  double context_reuse_rate = 0;
  int64_t evictions = 0;           // cached blocks reclaimed by the allocators
  int64_t offloads = 0;            // sessions moved device -> host
  int64_t saves_to_disk = 0;       // sessions moved to disk
  int64_t resumes = 0;             // sessions brought back to the device
  int64_t blocks_transferred = 0;  // device <-> host, both groups
  int64_t bytes_transferred = 0;
  int64_t blocks_loaded_from_disk = 0;
  int64_t bytes_saved_to_disk = 0;
  int64_t bytes_loaded_from_disk = 0;
  int32_t failed_turns = 0;
  std::vector<PoolSimSession> sessions;  // [agents]
};

// Ok, or invalid_argument naming the field and the reason.
Status validate(const PoolSimConfig& config);
// Runs the simulation. invalid_argument for a bad config.
Result<PoolSimResult> simulate_pool(const PoolSimConfig& config);

}  // namespace kvp

// Pool simulator: agents in rounds over a SessionStore, sampling utilisation and waste.
#include "cache/pool_simulator.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <memory>
#include <random>
#include <unordered_map>

#include "cache/block_allocator.h"
#include "cache/prefix_cache.h"

namespace kvp {

Status validate(const PoolSimConfig& c) {
  if (c.block_size < 1 || c.block_size > 1024 ||
      !std::has_single_bit(static_cast<uint32_t>(c.block_size))) {
    return Status::invalid_argument("block_size {} is not a power of two in [1, 1024]",
                                    c.block_size);
  }
  if (c.pool_blocks < 1) return Status::invalid_argument("pool_blocks {} < 1", c.pool_blocks);
  if (c.host_blocks < 0) return Status::invalid_argument("host_blocks {} < 0", c.host_blocks);
  if (c.bytes_per_block < 0) {
    return Status::invalid_argument("bytes_per_block {} < 0", c.bytes_per_block);
  }
  if (c.agents < 1) return Status::invalid_argument("agents {} < 1", c.agents);
  if (c.turns < 0) return Status::invalid_argument("turns {} < 0", c.turns);
  if (c.concurrency < 1) return Status::invalid_argument("concurrency {} < 1", c.concurrency);
  if (c.system_prompt_tokens < 0 || c.user_tokens < 1 || c.reply_tokens < 0) {
    return Status::invalid_argument(
        "token counts (system_prompt_tokens {}, user_tokens {}, reply_tokens {}) must be >= 0, "
        ">= 1, >= 0",
        c.system_prompt_tokens, c.user_tokens, c.reply_tokens);
  }
  if (!(c.jitter >= 0 && c.jitter <= 1)) {
    return Status::invalid_argument("jitter {} is not in [0, 1]", c.jitter);
  }
  if (c.window_tokens < 0) return Status::invalid_argument("window_tokens {} < 0", c.window_tokens);
  if (c.window_tokens > 0 && c.window_pool_blocks < 1) {
    return Status::invalid_argument("window_pool_blocks {} < 1 with window_tokens {}",
                                    c.window_pool_blocks, c.window_tokens);
  }
  if (c.window_host_blocks < 0 || c.window_bytes_per_block < 0) {
    return Status::invalid_argument(
        "window_host_blocks {} and window_bytes_per_block {} must be >= 0", c.window_host_blocks,
        c.window_bytes_per_block);
  }
  return Status::ok();
}

namespace {

// One cache group's pools: a device pool with its prefix cache, and a host pool. An allocator
// needs a block, so a host pool of 0 blocks is one block held here (nothing fits in it).
struct SimGroup {
  SimGroup(int32_t device_blocks, int32_t host_blocks, int32_t block_size, int32_t window,
           int64_t block_bytes)
      : device(device_blocks),
        host(std::max(1, host_blocks)),
        cache(&device, block_size, /*salt=*/0x6b76706f6f6cULL),
        window_tokens(window),
        bytes_per_block(block_bytes) {
    if (host_blocks == 0) placeholder = host.alloc();
  }
  ~SimGroup() {
    if (placeholder) host.release(*placeholder);
  }
  BlockAllocator device;
  BlockAllocator host;
  PrefixCache cache;
  std::optional<BlockId> placeholder;
  int32_t window_tokens;
  int64_t bytes_per_block;
  double utilisation_sum = 0;
  double utilisation_peak = 0;
};

class Simulation {
 public:
  explicit Simulation(const PoolSimConfig& c) : c_(c), rng_(c.seed) {
    groups_.push_back(std::make_unique<SimGroup>(c.pool_blocks, c.host_blocks, c.block_size, 0,
                                                 c.bytes_per_block));
    if (c.window_tokens > 0) {
      groups_.push_back(std::make_unique<SimGroup>(c.window_pool_blocks, c.window_host_blocks,
                                                   c.block_size, c.window_tokens,
                                                   c.window_bytes_per_block));
    }
    std::vector<SessionGroup> session_groups;  // [num_groups]
    for (const std::unique_ptr<SimGroup>& g : groups_) {
      session_groups.push_back(
          SessionGroup{&g->device, &g->cache, &g->host, c.block_size, g->window_tokens});
    }
    store_ = std::make_unique<SessionStore>(std::move(session_groups), "plan");
    for (int32_t i = 0; i < c.system_prompt_tokens; ++i) system_prompt_.push_back(i);
  }
  ~Simulation() { store_.reset(); }  // sessions release into the pools first

  PoolSimResult run() {
    std::vector<SessionId> ids;                 // [agents]
    std::vector<int32_t> failed(c_.agents, 0);  // [agents]
    for (int32_t a = 0; a < c_.agents; ++a) {
      ids.push_back(store_->create("agent-" + std::to_string(a)).value());
    }
    for (int32_t turn = 0; turn < c_.turns; ++turn) {
      for (int32_t first = 0; first < c_.agents; first += c_.concurrency) {
        const int32_t last = std::min(c_.agents, first + c_.concurrency);
        std::vector<int32_t> active;  // agents of this batch that began
        for (int32_t a = first; a < last; ++a) {
          std::vector<CacheOp> ops;  // executed by nobody: the simulation moves no bytes
          const bool began = store_->begin(ids[a], &ops);
          count_bytes(ops);
          if (began) {
            active.push_back(a);
          } else {
            ++failed[a];
          }
        }
        for (int32_t a : active) {
          if (!take_turn(ids[a], a)) ++failed[a];
          store_->end(ids[a]);
        }
        sample();
      }
    }
    return result(ids, failed);
  }

 private:
  int32_t jittered(int32_t mean) {
    const double lo = mean * (1 - c_.jitter);
    const double hi = mean * (1 + c_.jitter);
    const int32_t n =
        static_cast<int32_t>(std::lround(std::uniform_real_distribution<>(lo, hi)(rng_)));
    return std::max(n, 0);
  }
  std::vector<int32_t> agent_tokens(int32_t agent, int32_t count) {
    // Ids past the system prompt's, and distinct per agent: agents share only the system prompt.
    std::vector<int32_t> tokens(count);  // [count]
    std::uniform_int_distribution<int32_t> pick(0, 9999);
    for (int32_t& t : tokens) t = c_.system_prompt_tokens + agent * 10000 + pick(rng_);
    return tokens;
  }

  // One turn of an active agent: prompt, then reply one token at a time. false if the pool
  // could not hold them.
  bool take_turn(SessionId id, int32_t agent) {
    const int32_t history = store_->info(id).num_tokens;
    std::vector<int32_t> prompt;  // [system prompt on the first turn + user tokens]
    if (history == 0) prompt = system_prompt_;
    std::vector<int32_t> user =  // [user tokens]
        agent_tokens(agent, std::max(1, jittered(c_.user_tokens)));
    prompt.insert(prompt.end(), user.begin(), user.end());
    prompt_tokens_ += static_cast<int64_t>(prompt.size());
    context_tokens_ += history + static_cast<int64_t>(prompt.size());
    std::vector<CacheOp> ops;  // executed by nobody: the simulation moves no bytes
    std::optional<int32_t> num_cached = store_->append_tokens(id, prompt, &ops);
    count_bytes(ops);
    if (!num_cached) return false;
    prefix_hit_tokens_ += *num_cached;
    reused_context_tokens_ += history + *num_cached;
    const std::vector<int32_t> reply =  // [reply tokens]
        agent_tokens(agent, jittered(c_.reply_tokens));
    for (const int32_t& token : reply) {
      ops.clear();
      const bool ok =
          store_->append_tokens(id, std::span<const int32_t>(&token, 1), &ops).has_value();
      count_bytes(ops);
      if (!ok) return false;
    }
    return true;
  }

  void count_bytes(const std::vector<CacheOp>& ops) {
    for (const CacheOp& op : ops) {
      if (const auto* t = std::get_if<BlockTransfer>(&op)) {
        bytes_transferred_ += groups_[t->group]->bytes_per_block;
      } else if (const auto* sv = std::get_if<SaveToDisk>(&op)) {
        bytes_saved_ +=
            groups_[sv->group]->bytes_per_block * static_cast<int64_t>(sv->blocks.size());
      } else if (const auto* l = std::get_if<LoadFromDisk>(&op)) {
        bytes_loaded_ +=
            groups_[l->group]->bytes_per_block * static_cast<int64_t>(l->blocks.size());
      }
    }
  }

  void sample() {
    for (const std::unique_ptr<SimGroup>& g : groups_) {
      const double utilisation =
          static_cast<double>(g->device.stats().num_used) / g->device.num_blocks();
      g->utilisation_sum += utilisation;
      g->utilisation_peak = std::max(g->utilisation_peak, utilisation);
    }
    // Filled slots of each held block of the global group, counted once however many sessions
    // share it.
    std::unordered_map<int32_t, int32_t> filled;  // block id -> filled slots
    for (SessionId id : store_->session_ids()) {
      if (store_->info(id).tier != Tier::Resident) continue;
      const BlockTable& t = store_->table(id, 0);
      for (int32_t i = 0; i < t.num_blocks(); ++i) {
        const int32_t n = std::min(c_.block_size, t.num_tokens() - i * c_.block_size);
        int32_t& f = filled[t.block(i).value];
        f = std::max(f, n);
      }
    }
    int64_t allocated = 0;
    int64_t used = 0;
    for (const auto& [block, n] : filled) {
      allocated += c_.block_size;
      used += n;
    }
    waste_sum_ += allocated > 0 ? 1.0 - static_cast<double>(used) / allocated : 0.0;
    ++num_samples_;
  }

  PoolSimResult result(const std::vector<SessionId>& ids, const std::vector<int32_t>& failed) {
    PoolSimResult r;
    const SimGroup& global = *groups_[0];
    r.block_size = c_.block_size;
    r.pool_blocks = c_.pool_blocks;
    for (const std::unique_ptr<SimGroup>& g : groups_) {
      const BlockAllocatorStats s = g->device.stats();
      r.pool_bytes += g->bytes_per_block * s.num_blocks;
      r.peak_used_bytes += g->bytes_per_block * s.peak_used;
      r.evictions += s.num_evictions;
    }
    r.utilisation_mean = num_samples_ > 0 ? global.utilisation_sum / num_samples_ : 0;
    r.utilisation_peak = global.utilisation_peak;
    if (groups_.size() > 1) {
      r.window_utilisation_mean = num_samples_ > 0 ? groups_[1]->utilisation_sum / num_samples_ : 0;
      r.window_utilisation_peak = groups_[1]->utilisation_peak;
    }
    r.slot_waste_mean = num_samples_ > 0 ? waste_sum_ / num_samples_ : 0;
    r.prompt_tokens = prompt_tokens_;
    r.prefix_hit_tokens = prefix_hit_tokens_;
    r.prefix_hit_rate =
        prompt_tokens_ > 0 ? static_cast<double>(prefix_hit_tokens_) / prompt_tokens_ : 0;
    r.context_tokens = context_tokens_;
    r.context_reuse_rate =
        context_tokens_ > 0 ? static_cast<double>(reused_context_tokens_) / context_tokens_ : 0;
    for (size_t a = 0; a < ids.size(); ++a) {
      const SessionInfo info = store_->info(ids[a]);
      r.sessions.push_back(PoolSimSession{.name = info.name,
                                          .num_tokens = info.num_tokens,
                                          .final_tier = info.tier,
                                          .failed_turns = failed[a],
                                          .stats = info.stats});
      r.offloads += info.stats.num_offloads;
      r.saves_to_disk += info.stats.num_saves_to_disk;
      r.resumes += info.stats.num_resumes;
      r.blocks_transferred += info.stats.num_blocks_transferred;
      r.blocks_loaded_from_disk += info.stats.num_blocks_loaded;
      r.failed_turns += failed[a];
    }
    r.bytes_transferred = bytes_transferred_;
    r.bytes_saved_to_disk = bytes_saved_;
    r.bytes_loaded_from_disk = bytes_loaded_;
    return r;
  }

  PoolSimConfig c_;
  std::mt19937_64 rng_;
  std::vector<std::unique_ptr<SimGroup>> groups_;  // [1 or 2]: global, then window
  std::unique_ptr<SessionStore> store_;
  std::vector<int32_t> system_prompt_;  // [system_prompt_tokens]
  int64_t prompt_tokens_ = 0;
  int64_t prefix_hit_tokens_ = 0;
  int64_t context_tokens_ = 0;
  int64_t reused_context_tokens_ = 0;
  int64_t bytes_transferred_ = 0;
  int64_t bytes_saved_ = 0;
  int64_t bytes_loaded_ = 0;
  double waste_sum_ = 0;
  int64_t num_samples_ = 0;
};

}  // namespace

Result<PoolSimResult> simulate_pool(const PoolSimConfig& config) {
  KVP_RETURN_IF_ERROR(validate(config));
  Simulation sim(config);
  return sim.run();
}

}  // namespace kvp

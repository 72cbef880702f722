// Pool simulator: agents in rounds over a SessionStore, sampling utilisation and waste.
#include "cache/pool_simulator.h"

#include <algorithm>
#include <bit>
#include <cmath>
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
  return Status::ok();
}

namespace {

class Simulation {
 public:
  explicit Simulation(const PoolSimConfig& c)
      : c_(c),
        rng_(c.seed),
        device_(c.pool_blocks),
        host_(std::max(1, c.host_blocks)),  // an allocator needs a block; see host_blocks == 0
        cache_(&device_, c.block_size, /*salt=*/0x6b76706f6f6cULL),
        store_(&device_, &cache_, &host_, SessionStoreConfig{c.block_size, "plan"}) {
    if (c.host_blocks == 0) {  // no host tier: hold the only block so nothing fits there
      host_placeholder_ = host_.alloc();
    }
    for (int32_t i = 0; i < c.system_prompt_tokens; ++i) system_prompt_.push_back(i);
  }
  ~Simulation() {
    if (host_placeholder_) host_.release(*host_placeholder_);
  }

  PoolSimResult run() {
    std::vector<SessionId> ids;                 // [agents]
    std::vector<int32_t> failed(c_.agents, 0);  // [agents]
    for (int32_t a = 0; a < c_.agents; ++a) {
      ids.push_back(store_.create("agent-" + std::to_string(a)).value());
    }
    std::vector<CacheOp> ops;  // executed by nobody: the simulation moves no bytes
    for (int32_t turn = 0; turn < c_.turns; ++turn) {
      for (int32_t first = 0; first < c_.agents; first += c_.concurrency) {
        const int32_t last = std::min(c_.agents, first + c_.concurrency);
        std::vector<int32_t> active;  // agents of this batch that began
        for (int32_t a = first; a < last; ++a) {
          ops.clear();
          if (store_.begin(ids[a], &ops)) {
            active.push_back(a);
          } else {
            ++failed[a];
          }
        }
        for (int32_t a : active) {
          if (!take_turn(ids[a], a)) ++failed[a];
          store_.end(ids[a]);
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

  // One turn of an active agent: prompt then reply. false if the pool could not hold them.
  bool take_turn(SessionId id, int32_t agent) {
    const int32_t history = store_.info(id).num_tokens;
    std::vector<int32_t> prompt;  // [system prompt on the first turn + user tokens]
    if (history == 0) prompt = system_prompt_;
    std::vector<int32_t> user =  // [user tokens]
        agent_tokens(agent, std::max(1, jittered(c_.user_tokens)));
    prompt.insert(prompt.end(), user.begin(), user.end());
    prompt_tokens_ += static_cast<int64_t>(prompt.size());
    context_tokens_ += history + static_cast<int64_t>(prompt.size());
    std::vector<CacheOp> ops;
    std::optional<int32_t> num_cached = store_.append_tokens(id, prompt, &ops);
    if (!num_cached) return false;
    prefix_hit_tokens_ += *num_cached;
    reused_context_tokens_ += history + *num_cached;
    const int32_t reply = jittered(c_.reply_tokens);
    if (reply > 0 && !store_.append_tokens(id, agent_tokens(agent, reply), &ops)) return false;
    return true;
  }

  void sample() {
    const BlockAllocatorStats s = device_.stats();
    const double utilisation = static_cast<double>(s.num_used) / c_.pool_blocks;
    utilisation_sum_ += utilisation;
    utilisation_peak_ = std::max(utilisation_peak_, utilisation);
    // Filled slots of each held block, counted once however many sessions share it.
    std::unordered_map<int32_t, int32_t> filled;  // block id -> filled slots
    for (SessionId id : store_.session_ids()) {
      if (store_.info(id).tier != Tier::Resident) continue;
      const BlockTable& t = store_.table(id);
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
    const BlockAllocatorStats s = device_.stats();
    r.block_size = c_.block_size;
    r.pool_blocks = c_.pool_blocks;
    r.pool_bytes = c_.bytes_per_block * c_.pool_blocks;
    r.utilisation_mean = num_samples_ > 0 ? utilisation_sum_ / num_samples_ : 0;
    r.utilisation_peak = utilisation_peak_;
    r.peak_used_bytes = c_.bytes_per_block * s.peak_used;
    r.slot_waste_mean = num_samples_ > 0 ? waste_sum_ / num_samples_ : 0;
    r.prompt_tokens = prompt_tokens_;
    r.prefix_hit_tokens = prefix_hit_tokens_;
    r.prefix_hit_rate =
        prompt_tokens_ > 0 ? static_cast<double>(prefix_hit_tokens_) / prompt_tokens_ : 0;
    r.context_tokens = context_tokens_;
    r.context_reuse_rate =
        context_tokens_ > 0 ? static_cast<double>(reused_context_tokens_) / context_tokens_ : 0;
    r.evictions = s.num_evictions;
    for (size_t a = 0; a < ids.size(); ++a) {
      const SessionInfo info = store_.info(ids[a]);
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
    r.bytes_transferred = r.blocks_transferred * c_.bytes_per_block;
    return r;
  }

  PoolSimConfig c_;
  std::mt19937_64 rng_;
  BlockAllocator device_;
  BlockAllocator host_;
  std::optional<BlockId> host_placeholder_;
  PrefixCache cache_;
  SessionStore store_;
  std::vector<int32_t> system_prompt_;  // [system_prompt_tokens]
  int64_t prompt_tokens_ = 0;
  int64_t prefix_hit_tokens_ = 0;
  int64_t context_tokens_ = 0;
  int64_t reused_context_tokens_ = 0;
  double utilisation_sum_ = 0;
  double utilisation_peak_ = 0;
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

// Randomized model-based test of the cache bookkeeping: allocator, block tables, prefix cache
// and session store driven together by random operations (append, fork, write into shared
// tails, truncate, free, prefix match/register, session turns, offload, save to disk, resume,
// make_room, erase) against a deliberately simple model:
//   - every sequence and session is just its vector of token ids;
//   - a fake byte store (one int per slot of the device pool, of the host pool, and a map of
//     "files") executes the operations the cache returns; the "KV" of a position is its token id.
// After every write, a sequence's slot mapping must read back its own tokens; the forward pass
// may only write into blocks that are writable (ref_count 1, not cached); a SaveToDisk must find
// exactly the session's tokens in the blocks it names. check_integrity() of every class and an
// exact ref-count census run after each operation.
//
// A second model-based test drives KvCacheManager over a global group and sliding-window groups
// (different block sizes): appends, forks, copy-on-write, truncates and frees, checking that
// every position inside the window of the next token reads back its own token in every group,
// that window groups never hold more than the window needs, and exact ref counts.
//
// Replay: the seed is printed at the start of each run (stderr) and in every failure; set
// KVP_SEED=<seed> to replay it, KVP_RANDOM_OPS=<n> to change the number of operations.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <stdexcept>
#include <string>

#include "cache/block_allocator.h"
#include "cache/block_table.h"
#include "cache/kv_cache_manager.h"
#include "cache/prefix_cache.h"
#include "cache/session_store.h"

namespace kvp {
namespace {

#if defined(KVP_SANITIZED)  // tests/CMakeLists.txt: the ASan + UBSan build
constexpr int64_t kDefaultOps = 300'000;
#else
constexpr int64_t kDefaultOps = 2'000'000;
#endif

int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtoll(v, nullptr, 10) : fallback;
}

struct RunConfig {
  int32_t block_size = 4;
  int32_t device_blocks = 32;
  int32_t host_blocks = 16;
  int32_t vocab = 6;  // small: identical blocks and prefix hits happen often
  int64_t num_ops = 1000;
  uint64_t seed = 1;
};

// Counts of what a run exercised; each must be non-zero, or the run proved little.
struct Coverage {
  int64_t copies = 0;
  int64_t prefix_hit_tokens = 0;
  int64_t evictions = 0;
  int64_t offloads = 0;
  int64_t saves = 0;
  int64_t loads = 0;
  int64_t host_restores = 0;
  int64_t failed_appends = 0;
};

class World {
 public:
  explicit World(const RunConfig& config)
      : config_(config),
        rng_(config.seed),
        device_(config.device_blocks),
        host_(config.host_blocks),
        cache_(&device_, config.block_size, /*salt=*/config.seed * 31 + 7),
        store_(&device_, &cache_, &host_, SessionStoreConfig{config.block_size, "/disk"}),
        device_bytes_(static_cast<size_t>(config.device_blocks) * config.block_size, -1),
        host_bytes_(static_cast<size_t>(config.host_blocks) * config.block_size, -1) {
    for (int i = 0; i < 4 * config.block_size + 3; ++i) system_prompt_.push_back(token());
  }

  void run() {
    for (op_index_ = 0; op_index_ < config_.num_ops; ++op_index_) {
      step();
      check_all();
      if (op_index_ % 32 == 0) verify_everything();
    }
    verify_everything();
    coverage_.evictions = device_.stats().num_evictions;
  }
  const Coverage& coverage() const { return coverage_; }

 private:
  struct Seq {
    BlockTable table;
    std::vector<int32_t> tokens;  // [table.num_tokens()]
  };
  static constexpr size_t kMaxSeqs = 8;
  static constexpr int32_t kMaxSessions = 6;

  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("seed " + std::to_string(config_.seed) + ", op " +
                             std::to_string(op_index_) + ": " + what);
  }
  void require(bool cond, const char* what) const {
    if (!cond) fail(what);
  }

  int32_t uniform(int32_t lo, int32_t hi) {  // [lo, hi]
    return std::uniform_int_distribution<int32_t>(lo, hi)(rng_);
  }
  bool chance(double p) { return std::bernoulli_distribution(p)(rng_); }
  int32_t token() { return uniform(0, config_.vocab - 1); }
  std::vector<int32_t> random_tokens(int32_t count) {
    std::vector<int32_t> t(count);  // [count]
    for (int32_t& x : t) x = token();
    return t;
  }
  // A new prompt: often a prefix of the shared system prompt, then random tokens.
  std::vector<int32_t> prompt() {
    std::vector<int32_t> p;
    if (chance(0.6)) {
      const int32_t n = uniform(0, static_cast<int32_t>(system_prompt_.size()));
      p.assign(system_prompt_.begin(), system_prompt_.begin() + n);
    }
    std::vector<int32_t> rest = random_tokens(uniform(1, 3 * config_.block_size));
    p.insert(p.end(), rest.begin(), rest.end());
    return p;
  }

  int32_t& byte(Pool pool, BlockId block, int32_t offset) {
    std::vector<int32_t>& bytes = pool == Pool::Device ? device_bytes_ : host_bytes_;
    return bytes[static_cast<size_t>(block.value) * config_.block_size + offset];
  }

  // The backend: executes the operations in order.
  void execute(const std::vector<CacheOp>& ops) {
    const int32_t bs = config_.block_size;
    for (const CacheOp& op : ops) {
      if (const auto* c = std::get_if<BlockCopy>(&op)) {
        for (int32_t i = 0; i < bs; ++i)
          byte(Pool::Device, c->dst, i) = byte(Pool::Device, c->src, i);
        ++coverage_.copies;
      } else if (const auto* t = std::get_if<BlockTransfer>(&op)) {
        require(t->src_pool != t->dst_pool, "transfer within one pool");
        for (int32_t i = 0; i < bs; ++i)
          byte(t->dst_pool, t->dst, i) = byte(t->src_pool, t->src, i);
        if (t->src_pool == Pool::Device) ++coverage_.offloads;
        if (t->src_pool == Pool::Host) ++coverage_.host_restores;
      } else if (const auto* s = std::get_if<SaveToDisk>(&op)) {
        require(static_cast<int32_t>(s->token_ids.size()) == s->num_tokens, "save token count");
        require(static_cast<int32_t>(s->blocks.size()) == (s->num_tokens + bs - 1) / bs,
                "save block count");
        std::vector<int32_t> file(s->num_tokens);  // [num_tokens]
        for (int32_t p = 0; p < s->num_tokens; ++p) {
          file[p] = byte(s->src_pool, s->blocks[p / bs], p % bs);
          if (file[p] != s->token_ids[p])
            fail("SaveToDisk reads a wrong KV at position " + std::to_string(p));
        }
        disk_[s->path] = std::move(file);
        ++coverage_.saves;
      } else if (const auto* l = std::get_if<LoadFromDisk>(&op)) {
        auto it = disk_.find(l->path);
        require(it != disk_.end(), "LoadFromDisk of a file never saved");
        require(static_cast<int32_t>(it->second.size()) == l->num_tokens, "load token count");
        require(l->first_position % bs == 0, "load starts inside a block");
        for (int32_t p = l->first_position; p < l->num_tokens; ++p) {
          byte(l->dst_pool, l->blocks[(p - l->first_position) / bs], p % bs) = it->second[p];
        }
        ++coverage_.loads;
      } else if (const auto* r = std::get_if<RemoveFile>(&op)) {
        require(disk_.erase(r->path) == 1, "RemoveFile of a file never saved");
      }
    }
  }

  // The forward pass: writes tokens[p] into the slot of every position p >= first_position.
  void write(const BlockTable& t, int32_t first_position, const std::vector<int32_t>& tokens) {
    for (int32_t p = first_position; p < t.num_tokens(); ++p) {
      const BlockId b = t.block(p / config_.block_size);
      if (!device_.is_writable(b)) {
        fail("write into shared or cached block " + std::to_string(b.value) + " at position " +
             std::to_string(p));
      }
      device_bytes_[t.slot(p)] = tokens[p];
    }
  }
  void verify(const BlockTable& t, std::span<const int32_t> tokens) const {
    if (t.num_tokens() != static_cast<int32_t>(tokens.size())) fail("table length differs");
    for (int32_t p = t.num_dropped_blocks() * config_.block_size; p < t.num_tokens(); ++p) {
      if (device_bytes_[t.slot(p)] != tokens[p]) {
        fail("position " + std::to_string(p) + " reads back " +
             std::to_string(device_bytes_[t.slot(p)]) + ", expected " + std::to_string(tokens[p]));
      }
    }
  }
  void verify_everything() const {
    for (const Seq& s : seqs_) verify(s.table, s.tokens);
    for (const auto& [id, tokens] : session_tokens_) {
      SessionInfo info = store_.info(id);
      if (info.num_tokens != static_cast<int32_t>(tokens.size())) fail("session length differs");
      if (info.tier == Tier::Resident) verify(store_.table(id), tokens);
    }
  }

  void check_all() const {
    device_.check_integrity();
    cache_.check_integrity();
    store_.check_integrity();
    std::vector<int32_t> refs(device_.num_blocks(), 0);  // [device num_blocks]
    for (const Seq& s : seqs_) {
      s.table.check_integrity();
      if (s.table.num_tokens() != static_cast<int32_t>(s.tokens.size())) fail("seq length");
      for (int32_t i = 0; i < s.table.num_blocks(); ++i) ++refs[s.table.block(i).value];
    }
    store_.count_device_refs(&refs);
    for (int32_t b = 0; b < device_.num_blocks(); ++b) {
      if (refs[b] != device_.ref_count(BlockId{b})) {
        fail("device block " + std::to_string(b) + " ref_count " +
             std::to_string(device_.ref_count(BlockId{b})) + ", referenced " +
             std::to_string(refs[b]) + " times");
      }
    }
  }

  // Appends num_tokens to a table, moving idle sessions down a tier if the pool is short.
  bool append_with_room(BlockTable* t, int32_t num_tokens) {
    std::vector<BlockCopy> copies;
    bool ok = t->append(num_tokens, &copies);
    if (!ok) {
      std::vector<CacheOp> ops;
      const bool room = store_.make_room(t->blocks_needed(num_tokens), &ops);
      execute(ops);  // sessions may have moved even when there is still no room
      if (room) ok = t->append(num_tokens, &copies);
    }
    if (!ok) {
      ++coverage_.failed_appends;
      return false;
    }
    std::vector<CacheOp> ops(copies.begin(), copies.end());
    execute(ops);
    return true;
  }

  void step() {
    const int32_t kind = uniform(0, 99);
    if (kind < 12) {
      new_seq();
    } else if (kind < 32) {
      append_seq();
    } else if (kind < 40) {
      fork_seq();
    } else if (kind < 46) {
      truncate_seq();
    } else if (kind < 54) {
      free_seq();
    } else if (kind < 58) {
      register_seq();
    } else if (kind < 62) {
      new_session();
    } else if (kind < 78) {
      session_turn();
    } else if (kind < 84) {
      session_offload();
    } else if (kind < 88) {
      session_save();
    } else if (kind < 94) {
      session_resume();
    } else if (kind < 96) {
      session_erase();
    } else {
      make_room();
    }
  }

  Seq* random_seq() {
    if (seqs_.empty()) return nullptr;
    return &seqs_[uniform(0, static_cast<int32_t>(seqs_.size()) - 1)];
  }

  void new_seq() {
    if (seqs_.size() >= kMaxSeqs) return free_seq();
    std::vector<int32_t> tokens = prompt();
    const int32_t n = static_cast<int32_t>(tokens.size());
    Seq s{BlockTable(&device_, config_.block_size), {}};
    int32_t num_cached = 0;
    if (chance(0.8)) {
      PrefixMatch m = cache_.match(std::span<const int32_t>(tokens).first(n - 1));
      if (!m.blocks.empty()) s.table.adopt(0, m.blocks, m.num_tokens);
      num_cached = m.num_tokens;
      coverage_.prefix_hit_tokens += num_cached;
      // The cached KV must be the prompt's own.
      verify(s.table, std::span<const int32_t>(tokens).first(num_cached));
    }
    if (!append_with_room(&s.table, n - num_cached)) return;  // s releases the hit
    write(s.table, num_cached, tokens);
    s.tokens = std::move(tokens);
    verify(s.table, s.tokens);
    seqs_.push_back(std::move(s));
  }

  void append_seq() {
    Seq* s = random_seq();
    if (s == nullptr) return new_seq();
    const int32_t old = s->table.num_tokens();
    std::vector<int32_t> more = random_tokens(uniform(1, 2 * config_.block_size));
    if (!append_with_room(&s->table, static_cast<int32_t>(more.size()))) return;
    s->tokens.insert(s->tokens.end(), more.begin(), more.end());
    write(s->table, old, s->tokens);
    verify(s->table, s->tokens);
  }

  void fork_seq() {
    Seq* s = random_seq();
    if (s == nullptr || seqs_.size() >= kMaxSeqs) return append_seq();
    Seq child{s->table.fork(), s->tokens};
    seqs_.push_back(std::move(child));
  }

  void truncate_seq() {
    Seq* s = random_seq();
    if (s == nullptr) return;
    const int32_t n = uniform(0, s->table.num_tokens());
    s->table.truncate(n);
    s->tokens.resize(n);
  }

  void register_full_blocks(const Seq& s) {
    const size_t num_full = s.tokens.size() / config_.block_size;
    cache_.register_blocks(s.tokens, s.table.blocks().first(num_full));
  }

  void free_seq() {
    if (seqs_.empty()) return;
    const int32_t i = uniform(0, static_cast<int32_t>(seqs_.size()) - 1);
    if (chance(0.7)) register_full_blocks(seqs_[i]);  // a finished request feeds the cache
    std::swap(seqs_[i], seqs_.back());
    seqs_.pop_back();
  }

  void register_seq() {
    if (Seq* s = random_seq()) register_full_blocks(*s);
  }

  std::optional<SessionId> random_session(bool (*want)(const SessionInfo&)) {
    std::vector<SessionId> ids;
    for (const auto& [id, tokens] : session_tokens_) {
      if (want(store_.info(id))) ids.push_back(id);
    }
    if (ids.empty()) return std::nullopt;
    return ids[uniform(0, static_cast<int32_t>(ids.size()) - 1)];
  }

  void new_session() {
    if (static_cast<int32_t>(session_tokens_.size()) >= kMaxSessions) return session_turn();
    Result<SessionId> id = store_.create("agent-" + std::to_string(next_session_name_++));
    require(id.is_ok(), "create of a fresh name failed");
    session_tokens_[*id] = {};
  }

  void session_turn() {
    std::optional<SessionId> id = random_session([](const SessionInfo&) { return true; });
    if (!id) return new_session();
    std::vector<int32_t>& model = session_tokens_[*id];
    std::vector<CacheOp> ops;
    const bool began = store_.begin(*id, &ops);
    execute(ops);
    if (!began) return;
    verify(store_.table(*id), model);
    const int32_t num_appends = uniform(1, 3);  // a prompt, then some decode steps
    for (int32_t a = 0; a < num_appends; ++a) {
      std::vector<int32_t> tokens = model.empty() ? prompt() : random_tokens(uniform(1, 5));
      const int32_t old = static_cast<int32_t>(model.size());
      ops.clear();
      std::optional<int32_t> num_cached = store_.append_tokens(*id, tokens, &ops);
      execute(ops);
      if (!num_cached) {
        ++coverage_.failed_appends;
        break;
      }
      coverage_.prefix_hit_tokens += *num_cached;
      model.insert(model.end(), tokens.begin(), tokens.end());
      write(store_.table(*id), old + *num_cached, model);
      verify(store_.table(*id), model);
    }
    store_.end(*id);
  }

  void session_offload() {
    std::optional<SessionId> id =
        random_session([](const SessionInfo& i) { return i.tier == Tier::Resident; });
    if (!id) return;
    std::vector<CacheOp> ops;
    const bool ok = store_.offload(*id, &ops);
    execute(ops);
    require(store_.info(*id).tier == (ok ? Tier::Offloaded : Tier::Resident), "offload tier");
  }

  void session_save() {
    std::optional<SessionId> id =
        random_session([](const SessionInfo& i) { return i.tier != Tier::OnDisk; });
    if (!id) return;
    std::vector<CacheOp> ops;
    store_.save_to_disk(*id, &ops);
    execute(ops);
    require(store_.info(*id).tier == Tier::OnDisk, "save tier");
  }

  void session_resume() {
    std::optional<SessionId> id =
        random_session([](const SessionInfo& i) { return i.tier != Tier::Resident; });
    if (!id) return;
    const Tier before = store_.info(*id).tier;
    std::vector<CacheOp> ops;
    const bool ok = store_.resume(*id, &ops);
    execute(ops);
    if (ok) {
      verify(store_.table(*id), session_tokens_[*id]);
    } else {
      require(store_.info(*id).tier == before, "failed resume changed the tier");
    }
  }

  void session_erase() {
    std::optional<SessionId> id = random_session([](const SessionInfo&) { return true; });
    if (!id) return;
    std::vector<CacheOp> ops;
    store_.erase(*id, &ops);
    execute(ops);
    session_tokens_.erase(*id);
  }

  void make_room() {
    std::vector<CacheOp> ops;
    const int32_t n = uniform(1, config_.device_blocks);
    const bool ok = store_.make_room(n, &ops);
    execute(ops);
    if (ok) require(device_.can_allocate(n), "make_room said yes without room");
  }

  RunConfig config_;
  std::mt19937_64 rng_;
  int64_t op_index_ = 0;
  Coverage coverage_;
  // Declaration order matters: tables and sessions release into the pools, so they go first.
  BlockAllocator device_;
  BlockAllocator host_;
  PrefixCache cache_;
  SessionStore store_;
  std::vector<Seq> seqs_;
  std::map<SessionId, std::vector<int32_t>> session_tokens_;  // the model of each session
  int64_t next_session_name_ = 0;
  std::vector<int32_t> system_prompt_;
  std::vector<int32_t> device_bytes_;  // [device_blocks * block_size] token id per slot
  std::vector<int32_t> host_bytes_;    // [host_blocks * block_size]
  std::map<std::string, std::vector<int32_t>> disk_;  // path -> token id per position
};

TEST(Randomized, CacheBookkeepingMatchesASimpleModel) {
  const uint64_t base_seed = static_cast<uint64_t>(env_int("KVP_SEED", 20261122));
  const int64_t total_ops = env_int("KVP_RANDOM_OPS", kDefaultOps);
  const RunConfig shapes[] = {
      {.block_size = 1, .device_blocks = 24, .host_blocks = 12, .vocab = 3},
      {.block_size = 2, .device_blocks = 28, .host_blocks = 12, .vocab = 4},
      {.block_size = 4, .device_blocks = 32, .host_blocks = 16, .vocab = 4},
      {.block_size = 16, .device_blocks = 20, .host_blocks = 8, .vocab = 2},
  };
  const int64_t num_shapes = sizeof(shapes) / sizeof(shapes[0]);
  Coverage total;
  for (int64_t i = 0; i < num_shapes; ++i) {
    RunConfig config = shapes[i];
    config.num_ops = total_ops / num_shapes;
    config.seed = base_seed + static_cast<uint64_t>(i);
    std::fprintf(stderr, "randomized: block_size %d, %lld ops, seed %llu (replay: KVP_SEED=%llu)\n",
                 config.block_size, static_cast<long long>(config.num_ops),
                 static_cast<unsigned long long>(config.seed),
                 static_cast<unsigned long long>(base_seed));
    World world(config);
    try {
      world.run();
    } catch (const std::exception& e) {
      FAIL() << e.what() << " (replay: KVP_SEED=" << base_seed << ")";
    }
    const Coverage& c = world.coverage();
    total.copies += c.copies;
    total.prefix_hit_tokens += c.prefix_hit_tokens;
    total.evictions += c.evictions;
    total.offloads += c.offloads;
    total.saves += c.saves;
    total.loads += c.loads;
    total.host_restores += c.host_restores;
    total.failed_appends += c.failed_appends;
  }
  std::fprintf(stderr,
               "randomized: copies %lld, prefix-hit tokens %lld, evictions %lld, offloaded blocks "
               "%lld, restored blocks %lld, saves %lld, loads %lld, failed appends %lld\n",
               static_cast<long long>(total.copies),
               static_cast<long long>(total.prefix_hit_tokens),
               static_cast<long long>(total.evictions), static_cast<long long>(total.offloads),
               static_cast<long long>(total.host_restores), static_cast<long long>(total.saves),
               static_cast<long long>(total.loads), static_cast<long long>(total.failed_appends));
  if (total_ops >= 10'000) {  // a run this long must have exercised every path
    EXPECT_GT(total.copies, 0);
    EXPECT_GT(total.prefix_hit_tokens, 0);
    EXPECT_GT(total.evictions, 0);
    EXPECT_GT(total.offloads, 0);
    EXPECT_GT(total.host_restores, 0);
    EXPECT_GT(total.saves, 0);
    EXPECT_GT(total.loads, 0);
    EXPECT_GT(total.failed_appends, 0);
  }
}

// KvCacheManager with sliding windows: the model is each sequence's token vector.
class GroupWorld {
 public:
  GroupWorld(std::vector<CacheGroupConfig> groups, int64_t num_ops, uint64_t seed)
      : groups_(groups),
        num_ops_(num_ops),
        seed_(seed),
        rng_(seed),
        manager_(std::move(groups), /*prefix_salt=*/seed),
        hosts_(make_hosts(groups_)),
        store_(session_groups(), "/disk") {
    for (const CacheGroupConfig& g : groups_) {
      bytes_.emplace_back(static_cast<size_t>(g.num_blocks) * g.block_size, -1);
      host_bytes_.emplace_back(static_cast<size_t>(kHostBlocks) * g.block_size, -1);
    }
    for (int i = 0; i < 48; ++i) shared_prompt_.push_back(uniform(0, 3));
  }

  void run() {
    for (op_index_ = 0; op_index_ < num_ops_; ++op_index_) {
      step();
      std::vector<std::vector<int32_t>> session_refs;  // [num_groups][num_blocks]
      for (int32_t g = 0; g < manager_.num_groups(); ++g) {
        session_refs.emplace_back(groups_[g].num_blocks, 0);
        store_.count_device_refs(&session_refs.back(), g);
      }
      manager_.check_integrity(session_refs);
      store_.check_integrity();
      for (const auto& [id, tokens] : model_) {
        if (manager_.num_tokens(id) != static_cast<int32_t>(tokens.size())) fail("length");
      }
      if (op_index_ % 16 == 0) {
        for (const auto& [id, tokens] : sessions_) verify_session(id);
      }
    }
  }
  int64_t session_moves() const { return session_moves_; }
  int64_t copies() const { return copies_; }
  int64_t dropped() const { return dropped_; }
  int64_t prefix_hit_tokens() const { return prefix_hit_tokens_; }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("seed " + std::to_string(seed_) + ", op " + std::to_string(op_index_) +
                             ": " + what);
  }
  int32_t uniform(int32_t lo, int32_t hi) {
    return std::uniform_int_distribution<int32_t>(lo, hi)(rng_);
  }
  std::optional<SeqId> random_seq() {
    if (model_.empty()) return std::nullopt;
    auto it = model_.begin();
    std::advance(it, uniform(0, static_cast<int32_t>(model_.size()) - 1));
    return it->first;
  }

  static constexpr int32_t kHostBlocks = 24;
  static std::vector<std::unique_ptr<BlockAllocator>> make_hosts(
      const std::vector<CacheGroupConfig>& groups) {
    std::vector<std::unique_ptr<BlockAllocator>> hosts;
    for (size_t g = 0; g < groups.size(); ++g) {
      hosts.push_back(std::make_unique<BlockAllocator>(kHostBlocks));
    }
    return hosts;
  }
  std::vector<SessionGroup> session_groups() {
    std::vector<SessionGroup> out;
    for (int32_t g = 0; g < manager_.num_groups(); ++g) {
      out.push_back(SessionGroup{&manager_.allocator(g), manager_.prefix_cache(g), hosts_[g].get(),
                                 groups_[g].block_size, groups_[g].window_tokens});
    }
    return out;
  }

  int32_t& byte(int32_t g, Pool pool, BlockId block, int32_t offset) {
    std::vector<int32_t>& bytes = pool == Pool::Device ? bytes_[g] : host_bytes_[g];
    return bytes[static_cast<size_t>(block.value) * groups_[g].block_size + offset];
  }

  // The backend, for every group.
  void execute(const std::vector<CacheOp>& ops) {
    for (const CacheOp& op : ops) {
      if (const auto* c = std::get_if<BlockCopy>(&op)) {
        for (int32_t i = 0; i < groups_[c->group].block_size; ++i) {
          byte(c->group, Pool::Device, c->dst, i) = byte(c->group, Pool::Device, c->src, i);
        }
        ++copies_;
      } else if (const auto* t = std::get_if<BlockTransfer>(&op)) {
        for (int32_t i = 0; i < groups_[t->group].block_size; ++i) {
          byte(t->group, t->dst_pool, t->dst, i) = byte(t->group, t->src_pool, t->src, i);
        }
        ++session_moves_;
      } else if (const auto* sv = std::get_if<SaveToDisk>(&op)) {
        const int32_t bs = groups_[sv->group].block_size;
        std::vector<int32_t> file(sv->num_tokens, -1);  // [num_tokens]; -1: not in the file
        for (int32_t p = sv->first_position; p < sv->num_tokens; ++p) {
          file[p] =
              byte(sv->group, sv->src_pool, sv->blocks[(p - sv->first_position) / bs], p % bs);
          if (file[p] != sv->token_ids[p]) fail("SaveToDisk reads a wrong KV");
        }
        disk_[{sv->path, sv->group}] = std::move(file);
        ++session_moves_;
      } else if (const auto* l = std::get_if<LoadFromDisk>(&op)) {
        const int32_t bs = groups_[l->group].block_size;
        auto it = disk_.find({l->path, l->group});
        if (it == disk_.end()) fail("LoadFromDisk of a file never saved");
        for (int32_t p = l->first_position; p < l->num_tokens; ++p) {
          if (it->second[p] < 0) fail("LoadFromDisk of a position the file does not hold");
          byte(l->group, l->dst_pool, l->blocks[(p - l->first_position) / bs], p % bs) =
              it->second[p];
        }
        ++session_moves_;
      } else if (const auto* r = std::get_if<RemoveFile>(&op)) {
        for (int32_t g = 0; g < manager_.num_groups(); ++g) disk_.erase({r->path, g});
      }
    }
  }

  // Every position the next token attends to must read back its token, in every group.
  void verify(SeqId id) const {
    for (int32_t g = 0; g < manager_.num_groups(); ++g) {
      verify_table(g, manager_.table(id, g), model_.at(id));
    }
  }
  void verify_session(SessionId id) const {
    if (store_.info(id).tier != Tier::Resident) return;
    for (int32_t g = 0; g < manager_.num_groups(); ++g) {
      verify_table(g, store_.table(id, g), sessions_.at(id));
    }
  }
  void verify_table(int32_t g, const BlockTable& t, const std::vector<int32_t>& tokens) const {
    const int32_t n = static_cast<int32_t>(tokens.size());
    if (t.num_tokens() != n) fail("table length differs");
    {
      const int32_t w = groups_[g].window_tokens;
      const int32_t first = w == 0 ? 0 : std::max(0, n - w + 1);
      if (first < t.num_dropped_blocks() * t.block_size()) {
        fail("group " + std::to_string(g) + " dropped a position inside the window");
      }
      for (int32_t p = first; p < n; ++p) {
        if (bytes_[g][t.slot(p)] != tokens[p]) {
          fail("group " + std::to_string(g) + " position " + std::to_string(p) + " reads " +
               std::to_string(bytes_[g][t.slot(p)]) + ", expected " + std::to_string(tokens[p]));
        }
      }
    }
  }

  std::optional<SessionId> random_session(bool (*want)(const SessionInfo&)) {
    std::vector<SessionId> ids;
    for (const auto& [id, tokens] : sessions_) {
      if (want(store_.info(id))) ids.push_back(id);
    }
    if (ids.empty()) return std::nullopt;
    return ids[uniform(0, static_cast<int32_t>(ids.size()) - 1)];
  }

  void session_step(int32_t kind) {
    std::vector<CacheOp> ops;
    if (kind < 12) {  // a turn: a prompt or some decode steps
      std::optional<SessionId> id = random_session([](const SessionInfo&) { return true; });
      if (!id || (sessions_.size() < 4 && uniform(0, 3) == 0)) {
        id = store_.create("s" + std::to_string(next_seq_++)).value();
        sessions_[*id] = {};
      }
      std::vector<int32_t>& model = sessions_[*id];
      const bool began = store_.begin(*id, &ops);
      execute(ops);
      if (!began) return;
      verify_session(*id);
      for (int32_t a = uniform(1, 4); a > 0; --a) {
        std::vector<int32_t> tokens;
        if (model.empty()) {
          tokens.assign(shared_prompt_.begin(), shared_prompt_.begin() + uniform(0, 48));
        }
        for (int32_t i = uniform(1, 3); i > 0; --i) tokens.push_back(uniform(0, 3));
        const int32_t old = static_cast<int32_t>(model.size());
        ops.clear();
        std::optional<int32_t> num_cached = store_.append_tokens(*id, tokens, &ops);
        execute(ops);
        if (!num_cached) break;
        prefix_hit_tokens_ += *num_cached;
        model.insert(model.end(), tokens.begin(), tokens.end());
        for (int32_t g = 0; g < manager_.num_groups(); ++g) {
          const BlockTable& t = store_.table(*id, g);
          for (int32_t p = old + *num_cached; p < t.num_tokens(); ++p) {
            if (!manager_.allocator(g).is_writable(t.block(p / groups_[g].block_size))) {
              fail("session write into a shared block");
            }
            bytes_[g][t.slot(p)] = model[p];
          }
        }
        verify_session(*id);
      }
      store_.end(*id);
    } else if (kind < 17) {
      std::optional<SessionId> id =
          random_session([](const SessionInfo& i) { return i.tier == Tier::Resident; });
      if (id && store_.offload(*id, &ops)) execute(ops);
    } else if (kind < 21) {
      std::optional<SessionId> id =
          random_session([](const SessionInfo& i) { return i.tier != Tier::OnDisk; });
      if (!id) return;
      store_.save_to_disk(*id, &ops);
      execute(ops);
    } else if (kind < 26) {
      std::optional<SessionId> id =
          random_session([](const SessionInfo& i) { return i.tier != Tier::Resident; });
      if (!id) return;
      const bool ok = store_.resume(*id, &ops);
      execute(ops);
      if (ok) verify_session(*id);
    } else if (kind < 27) {
      std::optional<SessionId> id = random_session([](const SessionInfo&) { return true; });
      if (!id) return;
      store_.erase(*id, &ops);
      execute(ops);
      sessions_.erase(*id);
    } else {
      std::vector<int32_t> needed;  // [num_groups]
      for (const CacheGroupConfig& g : groups_) needed.push_back(uniform(0, g.num_blocks / 2));
      const bool ok = store_.make_room(needed, &ops);
      execute(ops);
      for (int32_t g = 0; ok && g < manager_.num_groups(); ++g) {
        if (!manager_.allocator(g).can_allocate(needed[g])) fail("make_room without room");
      }
    }
  }

  void step() {
    const int32_t kind = uniform(0, 129);
    if (kind >= 100) {
      session_step(kind - 100);
    } else if (kind < 10 || model_.empty()) {
      if (model_.size() >= 8) return free_seq();
      new_seq();
    } else if (kind < 60) {
      append();
    } else if (kind < 72) {
      if (model_.size() >= 8) return free_seq();
      const SeqId parent = *random_seq();
      const SeqId child{next_seq_++};
      manager_.fork(parent, child);
      model_[child] = model_[parent];
      verify(child);
    } else if (kind < 84) {
      const SeqId id = *random_seq();
      const int32_t n = uniform(0, manager_.num_tokens(id));
      for (int32_t g = 0; g < manager_.num_groups(); ++g) {
        if (!manager_.table(id, g).can_truncate(n)) return;
      }
      manager_.truncate(id, n);
      model_[id].resize(n);
      verify(id);
    } else if (kind < 88) {
      const SeqId id = *random_seq();
      manager_.register_prefix(id, model_[id]);
    } else {
      free_seq();
    }
  }

  // A new sequence; usually a prompt sharing a prefix with others, started from the cache.
  void new_seq() {
    const SeqId id{next_seq_++};
    manager_.add_sequence(id);
    model_[id] = {};
    if (uniform(0, 3) == 0) return;  // starts empty; grows by appends
    std::vector<int32_t> prompt(shared_prompt_.begin(), shared_prompt_.begin() + uniform(0, 48));
    for (int32_t i = uniform(1, 6); i > 0; --i) prompt.push_back(uniform(0, 3));
    const int32_t num_cached = manager_.match_prefix(id, prompt);
    prefix_hit_tokens_ += num_cached;
    model_[id].assign(prompt.begin(), prompt.begin() + num_cached);
    verify(id);  // the cached KV must be this prompt's own
    if (!append_tokens(id, std::vector<int32_t>(prompt.begin() + num_cached, prompt.end()))) {
      manager_.free_sequence(id);
      model_.erase(id);
      return;
    }
  }

  void append() {
    const SeqId id = *random_seq();
    const int32_t num_new = uniform(0, 9) < 7 ? 1 : uniform(2, 12);  // decode or a chunk
    std::vector<int32_t> more(num_new);                              // [num_new]
    for (int32_t& t : more) t = uniform(0, 3);
    append_tokens(id, more);
  }

  bool append_tokens(SeqId id, const std::vector<int32_t>& more) {
    const int32_t num_new = static_cast<int32_t>(more.size());
    std::vector<GroupBlockCopy> copies;
    bool ok = manager_.append(id, num_new, &copies, model_[id]);
    if (!ok) {
      if (!copies.empty()) fail("failed append returned copies");
      std::vector<int32_t> needed;  // [num_groups]
      for (int32_t g = 0; g < manager_.num_groups(); ++g) {
        needed.push_back(manager_.table(id, g).blocks_needed(num_new));
      }
      std::vector<CacheOp> ops;
      const bool room = store_.make_room(needed, &ops);
      execute(ops);
      if (room) ok = manager_.append(id, num_new, &copies, model_[id]);
      if (!ok) return false;
    }
    for (const GroupBlockCopy& c : copies) {
      const int32_t bs = groups_[c.group].block_size;
      for (int32_t i = 0; i < bs; ++i) {
        bytes_[c.group][c.copy.dst.value * bs + i] = bytes_[c.group][c.copy.src.value * bs + i];
      }
      ++copies_;
    }
    std::vector<int32_t>& tokens = model_[id];
    const int32_t old = static_cast<int32_t>(tokens.size());
    tokens.insert(tokens.end(), more.begin(), more.end());
    for (int32_t g = 0; g < manager_.num_groups(); ++g) {
      const BlockTable& t = manager_.table(id, g);
      const int32_t bs = groups_[g].block_size;
      for (int32_t p = old; p < t.num_tokens(); ++p) {
        if (!manager_.allocator(g).is_writable(t.block(p / bs))) fail("write into shared block");
        bytes_[g][t.slot(p)] = tokens[p];
      }
      const int32_t w = groups_[g].window_tokens;
      if (w > 0) {
        // The window of the chunk's first token plus the chunk itself.
        const int32_t cap = (w + num_new - 1 + bs - 1) / bs + 1;
        if (t.num_held_blocks() > cap) {
          fail("group " + std::to_string(g) + " holds " + std::to_string(t.num_held_blocks()) +
               " blocks, cap " + std::to_string(cap));
        }
        dropped_ += t.num_dropped_blocks() > 0;
      }
    }
    verify(id);
    return true;
  }

  void free_seq() {
    std::optional<SeqId> id = random_seq();
    if (!id) return;
    if (uniform(0, 9) < 7) manager_.register_prefix(*id, model_[*id]);  // a finished request
    manager_.free_sequence(*id);
    model_.erase(*id);
  }

  std::vector<CacheGroupConfig> groups_;
  int64_t num_ops_;
  uint64_t seed_;
  std::mt19937_64 rng_;
  int64_t op_index_ = 0;
  KvCacheManager manager_;
  std::vector<std::unique_ptr<BlockAllocator>> hosts_;  // [num_groups] host pools
  SessionStore store_;                                  // shares the manager's device pools
  std::vector<std::vector<int32_t>> bytes_;             // [num_groups][num_blocks * block_size]
  std::vector<std::vector<int32_t>> host_bytes_;        // [num_groups][kHostBlocks * block_size]
  std::map<std::pair<std::string, int32_t>, std::vector<int32_t>> disk_;  // (path, group)
  std::map<SessionId, std::vector<int32_t>> sessions_;  // the model of each session
  int64_t session_moves_ = 0;
  std::map<SeqId, std::vector<int32_t>> model_;
  int64_t next_seq_ = 1;
  int64_t copies_ = 0;
  int64_t dropped_ = 0;
  int64_t prefix_hit_tokens_ = 0;
  std::vector<int32_t> shared_prompt_;  // [48]
};

TEST(Randomized, CacheGroupsWithSlidingWindowsMatchASimpleModel) {
  const uint64_t base_seed = static_cast<uint64_t>(env_int("KVP_SEED", 20261122));
  const int64_t total_ops = env_int("KVP_RANDOM_OPS", kDefaultOps) / 4;
  std::mt19937_64 shape_rng(base_seed);
  const int32_t num_shapes = 4;
  int64_t copies = 0;
  int64_t dropped = 0;
  int64_t prefix_hit_tokens = 0;
  int64_t session_moves = 0;
  for (int32_t i = 0; i < num_shapes; ++i) {
    auto pick = [&](int32_t lo, int32_t hi) {
      return std::uniform_int_distribution<int32_t>(lo, hi)(shape_rng);
    };
    const int32_t global_bs = 1 << pick(0, 4);
    const int32_t window_bs = 1 << pick(0, 3);
    std::vector<CacheGroupConfig> groups = {
        {.num_blocks = 40 * 16 / global_bs + 8, .block_size = global_bs, .window_tokens = 0},
        {.num_blocks = 48, .block_size = window_bs, .window_tokens = pick(1, 4 * window_bs)},
        {.num_blocks = 64, .block_size = 1, .window_tokens = pick(1, 6)},
    };
    const uint64_t seed = base_seed + 100 + static_cast<uint64_t>(i);
    std::fprintf(stderr,
                 "randomized groups: block sizes %d/%d/1, windows 0/%d/%d, %lld ops, seed %llu "
                 "(replay: KVP_SEED=%llu)\n",
                 global_bs, window_bs, groups[1].window_tokens, groups[2].window_tokens,
                 static_cast<long long>(total_ops / num_shapes),
                 static_cast<unsigned long long>(seed), static_cast<unsigned long long>(base_seed));
    GroupWorld world(groups, total_ops / num_shapes, seed);
    try {
      world.run();
    } catch (const std::exception& e) {
      FAIL() << e.what() << " (replay: KVP_SEED=" << base_seed << ")";
    }
    copies += world.copies();
    dropped += world.dropped();
    prefix_hit_tokens += world.prefix_hit_tokens();
    session_moves += world.session_moves();
  }
  std::fprintf(stderr,
               "randomized groups: copies %lld, prefix-hit tokens %lld, session block moves %lld\n",
               static_cast<long long>(copies), static_cast<long long>(prefix_hit_tokens),
               static_cast<long long>(session_moves));
  if (total_ops >= 10'000) {
    EXPECT_GT(copies, 0);
    EXPECT_GT(dropped, 0);
    EXPECT_GT(prefix_hit_tokens, 0);
    EXPECT_GT(session_moves, 0);
  }
}

}  // namespace
}  // namespace kvp

// KvCacheManager: all-or-nothing sequence operations across cache groups.
#include "cache/kv_cache_manager.h"

#include <algorithm>
#include <bit>

namespace kvp {

Status KvCacheManager::validate(const std::vector<CacheGroupConfig>& groups) {
  if (groups.empty()) return Status::invalid_argument("cache spec has no cache groups");
  for (size_t g = 0; g < groups.size(); ++g) {
    const CacheGroupConfig& c = groups[g];
    if (c.num_blocks < 1) {
      return Status::invalid_argument("cache group {}: num_blocks {} must be at least 1", g,
                                      c.num_blocks);
    }
    if (c.block_size < 1 || c.block_size > 1024 ||
        !std::has_single_bit(static_cast<uint32_t>(c.block_size))) {
      return Status::invalid_argument(
          "cache group {}: block_size {} is not a power of two in "
          "[1, 1024]",
          g, c.block_size);
    }
    if (c.window_tokens < 0) {
      return Status::invalid_argument("cache group {}: window_tokens {} is negative", g,
                                      c.window_tokens);
    }
  }
  return Status::ok();
}

KvCacheManager::KvCacheManager(std::vector<CacheGroupConfig> groups,
                               std::optional<uint64_t> prefix_salt)
    : configs_(std::move(groups)) {
  Status s = validate(configs_);
  KVP_CHECK(s.is_ok(), "{}", s.to_string());
  for (const CacheGroupConfig& c : configs_) {
    allocators_.push_back(std::make_unique<BlockAllocator>(c.num_blocks));
    if (prefix_salt) {
      caches_.push_back(
          std::make_unique<PrefixCache>(allocators_.back().get(), c.block_size, *prefix_salt));
    }
  }
}

// Tables release their blocks first, then the caches forget theirs, then the pools go.
KvCacheManager::~KvCacheManager() {
  sequences_.clear();
  caches_.clear();
}

std::vector<BlockTable>& KvCacheManager::tables(SeqId seq_id) {
  auto it = sequences_.find(seq_id);
  KVP_CHECK(it != sequences_.end(), "unknown sequence {}", seq_id.value);
  return it->second;
}

const BlockTable& KvCacheManager::table(SeqId seq_id, int32_t group) const {
  auto it = sequences_.find(seq_id);
  KVP_CHECK(it != sequences_.end(), "unknown sequence {}", seq_id.value);
  KVP_CHECK(group >= 0 && group < num_groups(), "group {} of {}", group, num_groups());
  return it->second[group];
}

void KvCacheManager::adopt_prefix(SeqId seq_id, std::span<const BlockId> blocks,
                                  int32_t num_tokens) {
  KVP_CHECK(num_groups() == 1, "adopt_prefix needs a single cache group, have {}", num_groups());
  BlockTable& table = tables(seq_id)[0];
  KVP_CHECK(table.num_tokens() == 0, "adopt_prefix into sequence {} holding {} tokens",
            seq_id.value, table.num_tokens());
  table.adopt(0, blocks, num_tokens);
}

void KvCacheManager::add_sequence(SeqId seq_id) {
  KVP_CHECK(!has_sequence(seq_id), "sequence {} already exists", seq_id.value);
  std::vector<BlockTable> group_tables;  // [num_groups]
  group_tables.reserve(configs_.size());
  for (int32_t g = 0; g < num_groups(); ++g) {
    group_tables.emplace_back(allocators_[g].get(), configs_[g].block_size,
                              configs_[g].window_tokens);
  }
  sequences_.emplace(seq_id, std::move(group_tables));
}

bool KvCacheManager::can_append(SeqId seq_id, int32_t num_tokens) const {
  for (int32_t g = 0; g < num_groups(); ++g) {
    if (!allocators_[g]->can_allocate(table(seq_id, g).blocks_needed(num_tokens))) return false;
  }
  return true;
}

bool KvCacheManager::append(SeqId seq_id, int32_t num_tokens, std::vector<GroupBlockCopy>* copies,
                            std::span<const int32_t> tokens) {
  KVP_CHECK(copies != nullptr, "append needs a copy list");
  std::vector<BlockTable>& group_tables = tables(seq_id);
  if (has_prefix_cache() && !tokens.empty()) {
    const int32_t num_done = group_tables[0].num_tokens();
    KVP_CHECK(static_cast<int32_t>(tokens.size()) == num_done,
              "append to sequence {} of {} tokens given {} token ids", seq_id.value, num_done,
              tokens.size());
    for (int32_t g = 0; g < num_groups(); ++g) {
      const int32_t window = configs_[g].window_tokens;
      if (window == 0) continue;
      const BlockTable& t = group_tables[g];
      const int32_t drop_until =
          std::min(std::max(0, num_done - window + 1), num_done) / configs_[g].block_size;
      if (drop_until > t.num_dropped_blocks()) {
        caches_[g]->register_blocks(tokens, t.blocks().first(drop_until), t.num_dropped_blocks());
      }
    }
  }
  // Dropping blocks behind the window is right whether or not the append succeeds, and the
  // freed blocks count toward this append.
  for (BlockTable& t : group_tables) t.trim_window();
  if (!can_append(seq_id, num_tokens)) return false;
  std::vector<BlockCopy> group_copies;  // copies of one group's append
  for (int32_t g = 0; g < num_groups(); ++g) {
    group_copies.clear();
    const bool ok = group_tables[g].append(num_tokens, &group_copies);
    KVP_CHECK(ok, "group {} could not append after can_append said it could", g);
    for (const BlockCopy& c : group_copies) copies->push_back(GroupBlockCopy{g, c});
  }
  return true;
}

void KvCacheManager::fork(SeqId parent, SeqId child) {
  KVP_CHECK(!has_sequence(child), "sequence {} already exists", child.value);
  std::vector<BlockTable>& parent_tables = tables(parent);
  std::vector<BlockTable> child_tables;  // [num_groups]
  child_tables.reserve(parent_tables.size());
  for (const BlockTable& t : parent_tables) child_tables.push_back(t.fork());
  sequences_.emplace(child, std::move(child_tables));
}

void KvCacheManager::truncate(SeqId seq_id, int32_t num_tokens) {
  std::vector<BlockTable>& group_tables = tables(seq_id);
  for (const BlockTable& t : group_tables) {
    KVP_CHECK(t.can_truncate(num_tokens), "sequence {} cannot be truncated to {} tokens",
              seq_id.value, num_tokens);
  }
  for (BlockTable& t : group_tables) t.truncate(num_tokens);
}

void KvCacheManager::free_sequence(SeqId seq_id) {
  auto it = sequences_.find(seq_id);
  KVP_CHECK(it != sequences_.end(), "unknown sequence {}", seq_id.value);
  sequences_.erase(it);  // the tables release their blocks
}

int32_t KvCacheManager::match_prefix(SeqId seq_id, std::span<const int32_t> tokens) {
  KVP_CHECK(has_prefix_cache(), "match_prefix without prefix caching");
  std::vector<BlockTable>& group_tables = tables(seq_id);
  KVP_CHECK(group_tables[0].num_tokens() == 0, "match_prefix into sequence {} that has tokens",
            seq_id.value);
  if (tokens.size() < 2) return 0;
  std::vector<PrefixGroup> groups;  // [num_groups]
  for (int32_t g = 0; g < num_groups(); ++g) {
    groups.push_back(PrefixGroup{caches_[g].get(), configs_[g].window_tokens});
  }
  GroupPrefixMatch m = match_prefix_groups(groups, tokens.first(tokens.size() - 1));
  if (m.num_tokens == 0) return 0;
  for (int32_t g = 0; g < num_groups(); ++g) {
    group_tables[g].adopt(m.num_dropped[g], m.blocks[g], m.num_tokens);
  }
  return m.num_tokens;
}

void KvCacheManager::register_prefix(SeqId seq_id, std::span<const int32_t> tokens) {
  KVP_CHECK(has_prefix_cache(), "register_prefix without prefix caching");
  std::vector<BlockTable>& group_tables = tables(seq_id);
  KVP_CHECK(static_cast<int32_t>(tokens.size()) == group_tables[0].num_tokens(),
            "register_prefix of {} tokens for sequence {} with {}", tokens.size(), seq_id.value,
            group_tables[0].num_tokens());
  for (int32_t g = 0; g < num_groups(); ++g) {
    const BlockTable& t = group_tables[g];
    const size_t num_full = static_cast<size_t>(t.num_tokens() / t.block_size());
    caches_[g]->register_blocks(tokens, t.blocks().first(num_full), t.num_dropped_blocks());
  }
}

void KvCacheManager::check_integrity(std::span<const std::vector<int32_t>> extra_refs) const {
  KVP_CHECK(extra_refs.empty() || static_cast<int32_t>(extra_refs.size()) == num_groups(),
            "extra refs for {} groups, {} groups", extra_refs.size(), num_groups());
  for (const std::unique_ptr<PrefixCache>& cache : caches_) cache->check_integrity();
  for (int32_t g = 0; g < num_groups(); ++g) {
    const BlockAllocator& a = *allocators_[g];
    a.check_integrity();
    std::vector<int32_t> refs = extra_refs.empty() ? std::vector<int32_t>(a.num_blocks(), 0)
                                                   : extra_refs[g];  // [num_blocks]
    KVP_CHECK(static_cast<int32_t>(refs.size()) == a.num_blocks(), "group {}: {} extra refs", g,
              refs.size());
    for (const auto& [seq_id, group_tables] : sequences_) {
      const BlockTable& t = group_tables[g];
      t.check_integrity();
      KVP_CHECK(t.num_tokens() == group_tables[0].num_tokens(),
                "sequence {}: group {} has {} tokens, group 0 has {}", seq_id.value, g,
                t.num_tokens(), group_tables[0].num_tokens());
      for (int32_t i = t.num_dropped_blocks(); i < t.num_blocks(); ++i) ++refs[t.block(i).value];
    }
    for (int32_t id = 0; id < a.num_blocks(); ++id) {
      KVP_CHECK(refs[id] == a.ref_count(BlockId{id}),
                "group {} block {}: ref_count {} but {} tables hold it", g, id,
                a.ref_count(BlockId{id}), refs[id]);
    }
  }
}

}  // namespace kvp

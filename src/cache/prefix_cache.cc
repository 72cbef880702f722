// PrefixCache: chained XXH3 block hashes in an open-addressing table.
#include "cache/prefix_cache.h"

#include <algorithm>
#include <bit>
#include <cstring>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace kvp {

PrefixCache::PrefixCache(BlockAllocator* allocator, int32_t block_size, uint64_t salt)
    : allocator_(allocator), block_size_(block_size) {
  KVP_CHECK(allocator != nullptr, "PrefixCache needs an allocator");
  KVP_CHECK(block_size >= 1 && block_size <= 1024 &&
                std::has_single_bit(static_cast<uint32_t>(block_size)),
            "block_size {} is not a power of two in [1, 1024]", block_size);
  root_hash_ = XXH3_64bits(&salt, sizeof(salt));
  const size_t num_blocks = static_cast<size_t>(allocator->num_blocks());
  const size_t capacity = std::bit_ceil(2 * num_blocks);
  slot_hash_.assign(capacity, kNoHash);
  slot_block_.assign(capacity, -1);
  slot_mask_ = capacity - 1;
  block_hash_.assign(num_blocks, kNoHash);
  block_parent_.assign(num_blocks, 0);
  block_tokens_.assign(num_blocks * block_size, 0);
  allocator_->set_eviction_listener(this);
}

PrefixCache::~PrefixCache() {
  clear();
  allocator_->set_eviction_listener(nullptr);
}

uint64_t PrefixCache::block_hash(uint64_t parent, const int32_t* tokens) const {
  uint64_t h = XXH3_64bits_withSeed(tokens, sizeof(int32_t) * block_size_, parent);
  return h == kNoHash ? 1 : h;
}

size_t PrefixCache::find_slot(uint64_t hash) const {
  size_t i = hash & slot_mask_;
  while (slot_hash_[i] != kNoHash && slot_hash_[i] != hash) i = (i + 1) & slot_mask_;
  return i;
}

bool PrefixCache::entry_matches(int32_t block_id, uint64_t parent, const int32_t* tokens) const {
  return block_parent_[block_id] == parent &&
         std::memcmp(&block_tokens_[size_t{static_cast<uint32_t>(block_id)} * block_size_], tokens,
                     sizeof(int32_t) * block_size_) == 0;
}

PrefixMatch PrefixCache::match(std::span<const int32_t> tokens) {
  PrefixMatch result;
  const size_t num_full = tokens.size() / block_size_;
  result.blocks.reserve(num_full);
  uint64_t parent = root_hash_;
  for (size_t i = 0; i < num_full; ++i) {
    const int32_t* block_tokens = tokens.data() + i * block_size_;
    const uint64_t h = block_hash(parent, block_tokens);
    const size_t slot = find_slot(h);
    if (slot_hash_[slot] == kNoHash) break;
    const int32_t block_id = slot_block_[slot];
    if (!entry_matches(block_id, parent, block_tokens)) break;
    allocator_->retain(BlockId{block_id});
    result.blocks.push_back(BlockId{block_id});
    parent = h;
  }
  result.num_tokens = static_cast<int32_t>(result.blocks.size()) * block_size_;
  ++num_queries_;
  num_query_tokens_ += static_cast<int64_t>(tokens.size());
  num_hit_tokens_ += result.num_tokens;
  return result;
}

int32_t PrefixCache::count_match(std::span<const int32_t> tokens) const {
  const size_t num_full = tokens.size() / block_size_;
  uint64_t parent = root_hash_;
  int32_t num_blocks = 0;
  for (size_t i = 0; i < num_full; ++i) {
    const int32_t* block_tokens = tokens.data() + i * block_size_;
    const uint64_t h = block_hash(parent, block_tokens);
    const size_t slot = find_slot(h);
    if (slot_hash_[slot] == kNoHash || !entry_matches(slot_block_[slot], parent, block_tokens)) {
      break;
    }
    ++num_blocks;
    parent = h;
  }
  return num_blocks * block_size_;
}

void PrefixCache::lookup_blocks(std::span<const int32_t> tokens,
                                std::vector<std::optional<BlockId>>* out) const {
  const size_t num_full = tokens.size() / block_size_;
  out->assign(num_full, std::nullopt);
  uint64_t parent = root_hash_;
  for (size_t i = 0; i < num_full; ++i) {
    const int32_t* block_tokens = tokens.data() + i * block_size_;
    const uint64_t h = block_hash(parent, block_tokens);
    const size_t slot = find_slot(h);
    if (slot_hash_[slot] != kNoHash && entry_matches(slot_block_[slot], parent, block_tokens)) {
      (*out)[i] = BlockId{slot_block_[slot]};
    }
    parent = h;
  }
}

int32_t PrefixCache::register_blocks(std::span<const int32_t> tokens,
                                     std::span<const BlockId> blocks, int32_t first_block) {
  KVP_CHECK(tokens.size() >= blocks.size() * block_size_,
            "register of {} blocks with only {} tokens (block_size {})", blocks.size(),
            tokens.size(), block_size_);
  int32_t num_new = 0;
  uint64_t parent = root_hash_;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const int32_t* block_tokens = tokens.data() + i * block_size_;
    const uint64_t h = block_hash(parent, block_tokens);
    if (static_cast<int32_t>(i) < first_block) {
      parent = h;
      continue;
    }
    const int32_t block_id = blocks[i].value;
    KVP_CHECK(allocator_->ref_count(blocks[i]) > 0, "register of block {} that is not held",
              block_id);
    if (block_hash_[block_id] != kNoHash) {
      KVP_CHECK(block_hash_[block_id] == h,
                "block {} is registered with other contents than position {} of this sequence",
                block_id, i);
      parent = h;
      continue;
    }
    const size_t slot = find_slot(h);
    if (slot_hash_[slot] == kNoHash) {
      slot_hash_[slot] = h;
      slot_block_[slot] = block_id;
      block_hash_[block_id] = h;
      block_parent_[block_id] = parent;
      std::memcpy(&block_tokens_[size_t{static_cast<uint32_t>(block_id)} * block_size_],
                  block_tokens, sizeof(int32_t) * block_size_);
      allocator_->set_cached(blocks[i]);
      ++num_entries_;
      ++num_registered_;
      ++num_new;
    }
    // else: the same contents are cached in another block (or, astronomically rarely, a
    // colliding hash): this block stays uncached.
    parent = h;
  }
  return num_new;
}

void PrefixCache::erase_entry(int32_t block_id) {
  size_t hole = find_slot(block_hash_[block_id]);
  KVP_CHECK(slot_hash_[hole] != kNoHash && slot_block_[hole] == block_id,
            "entry of block {} is missing from the hash table", block_id);
  // Backward-shift deletion: move later entries of the probe run into the hole when their home
  // slot is not between the hole and them.
  size_t next = (hole + 1) & slot_mask_;
  while (slot_hash_[next] != kNoHash) {
    const size_t home = slot_hash_[next] & slot_mask_;
    if (((next - home) & slot_mask_) >= ((next - hole) & slot_mask_)) {
      slot_hash_[hole] = slot_hash_[next];
      slot_block_[hole] = slot_block_[next];
      hole = next;
    }
    next = (next + 1) & slot_mask_;
  }
  slot_hash_[hole] = kNoHash;
  slot_block_[hole] = -1;
  block_hash_[block_id] = kNoHash;
  --num_entries_;
}

void PrefixCache::on_evict(BlockId block_id) {
  erase_entry(block_id.value);
  ++num_evicted_;
}

void PrefixCache::clear() {
  for (int32_t id = 0; id < static_cast<int32_t>(block_hash_.size()); ++id) {
    if (block_hash_[id] == kNoHash) continue;
    erase_entry(id);
    allocator_->clear_cached(BlockId{id});
  }
}

PrefixCacheStats PrefixCache::stats() const {
  PrefixCacheStats s;
  s.num_entries = num_entries_;
  s.num_queries = num_queries_;
  s.num_query_tokens = num_query_tokens_;
  s.num_hit_tokens = num_hit_tokens_;
  s.num_registered = num_registered_;
  s.num_evicted = num_evicted_;
  return s;
}

void PrefixCache::check_integrity() const {
  int32_t in_table = 0;
  for (size_t i = 0; i <= slot_mask_; ++i) {
    if (slot_hash_[i] == kNoHash) continue;
    ++in_table;
    const int32_t id = slot_block_[i];
    KVP_CHECK(id >= 0 && id < static_cast<int32_t>(block_hash_.size()),
              "hash slot {} holds block id {}", i, id);
    KVP_CHECK(block_hash_[id] == slot_hash_[i], "block {} records another hash than its slot", id);
    KVP_CHECK(find_slot(slot_hash_[i]) == i, "hash of block {} is not reachable by probing", id);
    KVP_CHECK(allocator_->is_cached(BlockId{id}), "registered block {} is not cached", id);
  }
  KVP_CHECK(in_table == num_entries_, "{} entries counted, {} in the table", num_entries_,
            in_table);
  int32_t cached = 0;
  for (int32_t id = 0; id < static_cast<int32_t>(block_hash_.size()); ++id) {
    const bool registered = block_hash_[id] != kNoHash;
    KVP_CHECK(registered == allocator_->is_cached(BlockId{id}),
              "block {}: registered {} but cached {}", id, registered,
              allocator_->is_cached(BlockId{id}));
    cached += registered;
  }
  KVP_CHECK(cached == num_entries_, "{} registered blocks, {} entries", cached, num_entries_);
}

GroupPrefixMatch match_prefix_groups(std::span<const PrefixGroup> groups,
                                     std::span<const int32_t> tokens) {
  const int32_t num_groups = static_cast<int32_t>(groups.size());
  GroupPrefixMatch result;
  result.num_dropped.assign(num_groups, 0);
  result.blocks.assign(num_groups, {});
  // Per group: which full blocks are cached. A global group limits the prefix to its leading
  // run of hits; block sizes are powers of two, so the prefix steps by the largest one.
  std::vector<std::vector<std::optional<BlockId>>> hits(num_groups);  // [num_groups][full blocks]
  int32_t limit = static_cast<int32_t>(tokens.size());
  int32_t step = 1;
  for (int32_t g = 0; g < num_groups; ++g) {
    const PrefixGroup& group = groups[g];
    KVP_CHECK(group.cache != nullptr && group.window_tokens >= 0, "prefix group {} is invalid", g);
    group.cache->lookup_blocks(tokens, &hits[g]);
    step = std::max(step, group.cache->block_size());
    if (group.window_tokens == 0) {
      int32_t run = 0;
      while (run < static_cast<int32_t>(hits[g].size()) && hits[g][run]) ++run;
      limit = std::min(limit, run * group.cache->block_size());
    }
  }
  auto first_block = [&](int32_t g, int32_t num_tokens) {
    if (groups[g].window_tokens == 0) return 0;
    return std::max(0, num_tokens - groups[g].window_tokens + 1) / groups[g].cache->block_size();
  };
  int32_t num_tokens = limit / step * step;
  for (; num_tokens > 0; num_tokens -= step) {
    bool servable = true;
    for (int32_t g = 0; g < num_groups && servable; ++g) {
      const int32_t end = num_tokens / groups[g].cache->block_size();
      for (int32_t i = first_block(g, num_tokens); i < end && servable; ++i) {
        servable = hits[g][i].has_value();
      }
    }
    if (servable) break;
  }
  if (num_tokens <= 0) return result;
  result.num_tokens = num_tokens;
  for (int32_t g = 0; g < num_groups; ++g) {
    const int32_t first = first_block(g, num_tokens);
    const int32_t end = num_tokens / groups[g].cache->block_size();
    result.num_dropped[g] = first;
    for (int32_t i = first; i < end; ++i) {
      groups[g].cache->allocator()->retain(*hits[g][i]);
      result.blocks[g].push_back(*hits[g][i]);
    }
  }
  return result;
}

}  // namespace kvp

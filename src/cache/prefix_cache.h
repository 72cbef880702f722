// PrefixCache: finds cached full blocks for a token prefix, so a request reuses their KV.
//
//   block i's hash h_i = XXH3_64bits_withSeed(tokens[i*B, (i+1)*B), seed = h_{i-1})
//   h_{-1}           = XXH3_64bits(model salt)
//   so h_i depends on the salt, every earlier token and block i's own tokens.
//
// Only full blocks are registered; a registered block is "cached" in the allocator (immutable;
// when its ref_count drops to 0 it stays evictable in LRU order). The allocator reclaims
// evictable blocks only when its free list is empty and tells this cache (EvictionListener),
// which drops the hash. A lookup also compares the block's parent hash and token ids, so a
// 64-bit hash collision can never hand out wrong KV.
//
// One PrefixCache per allocator (it installs itself as the allocator's eviction listener).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "cache/block_allocator.h"
#include "common/ids.h"

namespace kvp {

struct PrefixMatch {
  std::vector<BlockId> blocks;  // [num_tokens / block_size] each retained for the caller
  int32_t num_tokens = 0;       // tokens covered: blocks.size() * block_size
};

struct PrefixCacheStats {
  int32_t num_entries = 0;       // registered blocks
  int64_t num_queries = 0;       // match() calls
  int64_t num_query_tokens = 0;  // tokens passed to match()
  int64_t num_hit_tokens = 0;    // tokens served from cache by match()
  int64_t num_registered = 0;    // blocks ever registered
  int64_t num_evicted = 0;       // entries dropped by allocator eviction
};

class PrefixCache final : public EvictionListener {
 public:
  // requires: allocator != nullptr (not owned, outlives the cache; gets this as its listener),
  // block_size a power of two in [1, 1024].
  PrefixCache(BlockAllocator* allocator, int32_t block_size, uint64_t salt);
  ~PrefixCache() override;
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  int32_t block_size() const { return block_size_; }
  BlockAllocator* allocator() const { return allocator_; }
  int32_t num_entries() const { return num_entries_; }

  // The longest run of cached full blocks that prefixes `tokens`. Each returned block is
  // retained once for the caller (who adopts it into a BlockTable or releases it).
  // Mutates ref counts and statistics.
  PrefixMatch match(std::span<const int32_t> tokens);
  // The number of tokens match() would return now. Does not modify.
  int32_t count_match(std::span<const int32_t> tokens) const;

  // For each full block of `tokens`, the cached block holding exactly it (after the same
  // prefix), or nullopt; entries after a miss are still looked up (sliding-window groups need
  // only the blocks inside their window). out: [tokens.size() / block_size], resized. Retains
  // nothing; does not modify.
  void lookup_blocks(std::span<const int32_t> tokens,
                     std::vector<std::optional<BlockId>>* out) const;

  // Registers the full blocks of a sequence: blocks[i] holds tokens[i*B, (i+1)*B); entries
  // before first_block are not registered (dropped behind a window; they only feed the hash
  // chain). Blocks already registered are skipped; a block whose contents are already cached
  // under another block stays uncached. Returns the number of newly registered blocks.
  // requires: blocks [first_block, blocks.size()) are held; tokens.size() >= blocks.size() * B.
  // Mutates.
  int32_t register_blocks(std::span<const int32_t> tokens, std::span<const BlockId> blocks,
                          int32_t first_block = 0);

  // Forgets every entry (evictable blocks return to the free list). Mutates.
  void clear();

  // Called by the allocator when it reclaims an evictable block: drops its entry.
  void on_evict(BlockId block_id) override;

  PrefixCacheStats stats() const;
  // Aborts unless: every entry's block is cached in the allocator, the map and the per-block
  // records agree, and the allocator has no cached block this cache does not know.
  // Does not modify.
  void check_integrity() const;

 private:
  static constexpr uint64_t kNoHash = 0;  // a computed hash of 0 is remapped to 1

  uint64_t block_hash(uint64_t parent, const int32_t* tokens) const;
  // Slot of `hash` in the open-addressing table, or of the empty slot where it would go.
  size_t find_slot(uint64_t hash) const;
  void erase_entry(int32_t block_id);
  bool entry_matches(int32_t block_id, uint64_t parent, const int32_t* tokens) const;

  BlockAllocator* allocator_;
  int32_t block_size_;
  uint64_t root_hash_;
  // Open-addressing hash table (linear probing, backward-shift deletion), capacity a power of
  // two >= 2 * num_blocks, so it never fills.
  std::vector<uint64_t> slot_hash_;  // [capacity] kNoHash = empty
  std::vector<int32_t> slot_block_;  // [capacity]
  size_t slot_mask_;
  // Per block of the pool: what is registered for it.
  std::vector<uint64_t> block_hash_;    // [num_blocks] kNoHash = not registered
  std::vector<uint64_t> block_parent_;  // [num_blocks]
  std::vector<int32_t> block_tokens_;   // [num_blocks, block_size]
  int32_t num_entries_ = 0;
  int64_t num_queries_ = 0;
  int64_t num_query_tokens_ = 0;
  int64_t num_hit_tokens_ = 0;
  int64_t num_registered_ = 0;
  int64_t num_evicted_ = 0;
};

// One cache group in a prefix match across groups: its cache (and through it, its pool and
// block size) and its sliding window (0: global attention).
struct PrefixGroup {
  PrefixCache* cache = nullptr;
  int32_t window_tokens = 0;
};

// The result of a match across groups: per group, the entries to adopt into a BlockTable with
// adopt(num_dropped[g], blocks[g], num_tokens). Every block is retained once for the caller.
struct GroupPrefixMatch {
  int32_t num_tokens = 0;                    // a multiple of every group's block size
  std::vector<int32_t> num_dropped;          // [num_groups]
  std::vector<std::vector<BlockId>> blocks;  // [num_groups][num_tokens / B_g - num_dropped[g]]
};

// The longest prefix of `tokens` that every group can serve: a global group needs every block of
// it cached, a window group only the blocks of positions [T - W + 1, T) (the window of the first
// token after it; earlier entries start dropped). Block sizes must be powers of two.
// Mutates ref counts (retains the returned blocks) and nothing else.
GroupPrefixMatch match_prefix_groups(std::span<const PrefixGroup> groups,
                                     std::span<const int32_t> tokens);

}  // namespace kvp

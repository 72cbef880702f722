// BlockAllocator: the ids of one fixed pool of num_blocks KV blocks, with reference counts.
//
// Every block is in exactly one of three states:
//   free       on the free list (a stack: O(1) alloc and free), ref_count 0
//   held       ref_count > 0 (by block tables, prefix-cache hits, sessions)
//   evictable  ref_count 0 but kept because the prefix cache knows its contents; kept in LRU
//              order (least recently released first) and reclaimed only when the free list is
//              empty. Reclaiming tells the EvictionListener (the prefix cache) first.
// A block is "cached" when the prefix cache has registered it (set_cached); a cached block is
// immutable: writers must copy it first.
//
// Errors: block ids never come from users, so an invalid id, a double free or a retain of a free
// block is a programming error and aborts through KVP_CHECK (always on; a predictable branch).
// Running out of blocks is an expected outcome: alloc() returns std::nullopt, alloc_n() false.
// Pure bookkeeping; never touches KV bytes. Not thread-safe (the engine loop owns it).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "common/check.h"
#include "common/ids.h"

namespace kvp {

// Told when the allocator reclaims an evictable block, before it is handed out again.
class EvictionListener {
 public:
  virtual ~EvictionListener() = default;
  virtual void on_evict(BlockId block_id) = 0;
};

struct BlockAllocatorStats {
  int32_t num_blocks = 0;
  int32_t num_free = 0;       // on the free list
  int32_t num_used = 0;       // ref_count > 0
  int32_t num_cached = 0;     // registered by the prefix cache (used or evictable)
  int32_t num_evictable = 0;  // ref_count 0, kept for the prefix cache
  int32_t peak_used = 0;      // highest num_used seen
  int64_t num_allocs = 0;     // blocks handed out
  int64_t num_evictions = 0;  // evictable blocks reclaimed by alloc
};

class BlockAllocator {
 public:
  // requires: num_blocks >= 1
  explicit BlockAllocator(int32_t num_blocks);
  BlockAllocator(const BlockAllocator&) = delete;
  BlockAllocator& operator=(const BlockAllocator&) = delete;

  int32_t num_blocks() const { return static_cast<int32_t>(blocks_.size()); }
  int32_t num_free() const { return static_cast<int32_t>(free_ids_.size()); }
  int32_t num_evictable() const { return num_evictable_; }
  // Blocks alloc can hand out now: free plus evictable.
  int32_t num_available() const { return num_free() + num_evictable_; }
  bool can_allocate(int32_t num_blocks) const { return num_blocks <= num_available(); }

  // A block with ref_count 1, from the free list, else by evicting the least recently released
  // evictable block; nullopt when neither exists. Mutates.
  std::optional<BlockId> alloc() {
    int32_t id;
    if (!free_ids_.empty()) [[likely]] {
      id = free_ids_.back();
      free_ids_.pop_back();
    } else if (lru_head_ != kNone) {
      id = evict_lru();
    } else {
      return std::nullopt;
    }
    BlockState& b = blocks_[id];
    b.flags = 0;
    b.ref_count = 1;
    ++num_allocs_;
    if (++num_used_ > peak_used_) peak_used_ = num_used_;
    return BlockId{id};
  }
  // All or nothing: appends num_blocks new blocks to *out and returns true, or changes nothing
  // and returns false. requires: num_blocks >= 0, out != nullptr. Mutates.
  bool alloc_n(int32_t num_blocks, std::vector<BlockId>* out);

  // One more reference. requires: block is held or evictable (an evictable block becomes held
  // and leaves the LRU list). Mutates.
  void retain(BlockId block_id) {
    BlockState& b = state(block_id);
    KVP_CHECK(!(b.flags & kFree), "retain of free block {}", block_id.value);
    if (b.ref_count == 0) unlink_lru(block_id.value);
    if (b.ref_count++ == 0) ++num_used_;
    if (num_used_ > peak_used_) peak_used_ = num_used_;
  }
  // One reference fewer. At 0 the block goes to the free list, or to the LRU tail of evictable
  // blocks when it is cached. requires: ref_count(block) > 0 (else: double free). Mutates.
  void release(BlockId block_id) {
    BlockState& b = state(block_id);
    KVP_CHECK(b.ref_count > 0, "release of block {} with ref_count 0 (double free?)",
              block_id.value);
    if (--b.ref_count == 0) {
      --num_used_;
      if (b.flags & kCached) {
        link_lru_tail(block_id.value);
      } else {
        b.flags = kFree;
        free_ids_.push_back(block_id.value);
      }
    }
  }

  int32_t ref_count(BlockId block_id) const { return state(block_id).ref_count; }
  bool is_free(BlockId block_id) const { return state(block_id).flags & kFree; }
  bool is_cached(BlockId block_id) const { return state(block_id).flags & kCached; }
  bool is_evictable(BlockId block_id) const {
    const BlockState& b = state(block_id);
    return b.ref_count == 0 && (b.flags & kCached);
  }
  // A writer may change this block in place: held by exactly one reference and not cached.
  bool is_writable(BlockId block_id) const {
    const BlockState& b = state(block_id);
    return b.ref_count == 1 && !(b.flags & kCached);
  }

  // Marks a held block as cached (its contents are now known to the prefix cache).
  // requires: ref_count > 0, not already cached. Mutates.
  void set_cached(BlockId block_id);
  // Forgets that a block is cached; an evictable block goes to the free list.
  // requires: is_cached. Does not call the eviction listener. Mutates.
  void clear_cached(BlockId block_id);

  // The listener is told of every eviction; nullptr for none. Not owned.
  void set_eviction_listener(EvictionListener* listener) { listener_ = listener; }

  BlockAllocatorStats stats() const;
  // Aborts (KVP_CHECK) unless: every block is exactly one of free / held / evictable; the free
  // list has no duplicates and holds exactly the free blocks; the LRU list is well linked and
  // holds exactly the evictable blocks; the counters match. Does not modify the allocator.
  void check_integrity() const;

 private:
  static constexpr int32_t kNone = -1;
  static constexpr uint8_t kFree = 1;
  static constexpr uint8_t kCached = 2;

  struct BlockState {
    int32_t ref_count = 0;
    int32_t lru_prev = kNone;  // evictable blocks only
    int32_t lru_next = kNone;
    uint8_t flags = kFree;
  };

  BlockState& state(BlockId block_id) {
    KVP_CHECK(block_id.value >= 0 && block_id.value < num_blocks(),
              "block id {} out of range [0, {})", block_id.value, num_blocks());
    return blocks_[block_id.value];
  }
  const BlockState& state(BlockId block_id) const {
    KVP_CHECK(block_id.value >= 0 && block_id.value < num_blocks(),
              "block id {} out of range [0, {})", block_id.value, num_blocks());
    return blocks_[block_id.value];
  }
  void link_lru_tail(int32_t id);
  void unlink_lru(int32_t id);
  int32_t evict_lru();

  std::vector<BlockState> blocks_;  // [num_blocks]
  std::vector<int32_t> free_ids_;   // [num_free] stack of free block ids
  int32_t lru_head_ = kNone;        // least recently released evictable block
  int32_t lru_tail_ = kNone;
  int32_t num_evictable_ = 0;
  int32_t num_cached_ = 0;
  int32_t num_used_ = 0;
  int32_t peak_used_ = 0;
  int64_t num_allocs_ = 0;
  int64_t num_evictions_ = 0;
  EvictionListener* listener_ = nullptr;
};

}  // namespace kvp

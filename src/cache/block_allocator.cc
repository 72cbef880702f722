// BlockAllocator: the cold paths (alloc_n, cached marks, LRU list, eviction, integrity check).
#include "cache/block_allocator.h"

namespace kvp {

BlockAllocator::BlockAllocator(int32_t num_blocks) {
  KVP_CHECK(num_blocks >= 1, "a block pool needs at least one block, got {}", num_blocks);
  blocks_.resize(num_blocks);
  free_ids_.reserve(num_blocks);
  // Lowest ids on top of the stack: block 0 is handed out first.
  for (int32_t id = num_blocks - 1; id >= 0; --id) free_ids_.push_back(id);
}

bool BlockAllocator::alloc_n(int32_t num_blocks, std::vector<BlockId>* out) {
  KVP_CHECK(num_blocks >= 0 && out != nullptr, "alloc_n({}, {})", num_blocks,
            static_cast<const void*>(out));
  if (!can_allocate(num_blocks)) return false;
  for (int32_t i = 0; i < num_blocks; ++i) out->push_back(*alloc());
  return true;
}

void BlockAllocator::set_cached(BlockId block_id) {
  BlockState& b = state(block_id);
  KVP_CHECK(b.ref_count > 0, "set_cached of block {} that is not held", block_id.value);
  KVP_CHECK(!(b.flags & kCached), "block {} is already cached", block_id.value);
  b.flags |= kCached;
  ++num_cached_;
}

void BlockAllocator::clear_cached(BlockId block_id) {
  BlockState& b = state(block_id);
  KVP_CHECK(b.flags & kCached, "clear_cached of block {} that is not cached", block_id.value);
  if (b.ref_count == 0) {
    unlink_lru(block_id.value);
    b.flags = kFree;
    free_ids_.push_back(block_id.value);
  } else {
    b.flags &= static_cast<uint8_t>(~kCached);
  }
  --num_cached_;
}

void BlockAllocator::link_lru_tail(int32_t id) {
  BlockState& b = blocks_[id];
  b.lru_prev = lru_tail_;
  b.lru_next = kNone;
  if (lru_tail_ != kNone) {
    blocks_[lru_tail_].lru_next = id;
  } else {
    lru_head_ = id;
  }
  lru_tail_ = id;
  ++num_evictable_;
}

void BlockAllocator::unlink_lru(int32_t id) {
  BlockState& b = blocks_[id];
  if (b.lru_prev != kNone) {
    blocks_[b.lru_prev].lru_next = b.lru_next;
  } else {
    lru_head_ = b.lru_next;
  }
  if (b.lru_next != kNone) {
    blocks_[b.lru_next].lru_prev = b.lru_prev;
  } else {
    lru_tail_ = b.lru_prev;
  }
  b.lru_prev = b.lru_next = kNone;
  --num_evictable_;
}

int32_t BlockAllocator::evict_lru() {
  int32_t id = lru_head_;
  unlink_lru(id);
  blocks_[id].flags = 0;
  --num_cached_;
  ++num_evictions_;
  if (listener_ != nullptr) listener_->on_evict(BlockId{id});
  return id;
}

BlockAllocatorStats BlockAllocator::stats() const {
  BlockAllocatorStats s;
  s.num_blocks = num_blocks();
  s.num_free = num_free();
  s.num_used = num_used_;
  s.num_cached = num_cached_;
  s.num_evictable = num_evictable_;
  s.peak_used = peak_used_;
  s.num_allocs = num_allocs_;
  s.num_evictions = num_evictions_;
  return s;
}

void BlockAllocator::check_integrity() const {
  const int32_t n = num_blocks();
  std::vector<uint8_t> on_free_list(n, 0);  // [num_blocks]
  for (int32_t id : free_ids_) {
    KVP_CHECK(id >= 0 && id < n, "free list holds out-of-range id {}", id);
    KVP_CHECK(!on_free_list[id], "free list holds block {} twice", id);
    on_free_list[id] = 1;
    KVP_CHECK(blocks_[id].flags == kFree && blocks_[id].ref_count == 0,
              "block {} is on the free list but not free (ref_count {}, flags {})", id,
              blocks_[id].ref_count, blocks_[id].flags);
  }
  std::vector<uint8_t> on_lru(n, 0);  // [num_blocks]
  int32_t lru_count = 0;
  int32_t prev = kNone;
  for (int32_t id = lru_head_; id != kNone; id = blocks_[id].lru_next) {
    KVP_CHECK(id >= 0 && id < n && !on_lru[id], "LRU list is corrupt at block {}", id);
    on_lru[id] = 1;
    KVP_CHECK(blocks_[id].lru_prev == prev, "LRU back link of block {} is wrong", id);
    KVP_CHECK(blocks_[id].ref_count == 0 && blocks_[id].flags == kCached,
              "block {} is on the LRU list but not evictable", id);
    prev = id;
    ++lru_count;
  }
  KVP_CHECK(prev == lru_tail_, "LRU tail is {}, list ends at {}", lru_tail_, prev);
  KVP_CHECK(lru_count == num_evictable_, "{} evictable blocks counted, {} on the LRU list",
            num_evictable_, lru_count);
  int32_t used = 0;
  int32_t cached = 0;
  for (int32_t id = 0; id < n; ++id) {
    const BlockState& b = blocks_[id];
    KVP_CHECK(b.ref_count >= 0, "block {} has ref_count {}", id, b.ref_count);
    if (b.flags & kFree) {
      KVP_CHECK(on_free_list[id], "block {} is marked free but not on the free list", id);
      continue;
    }
    if (b.flags & kCached) ++cached;
    if (b.ref_count > 0) {
      ++used;
    } else {
      KVP_CHECK(on_lru[id], "block {} has ref_count 0, is not free and not evictable (leak)", id);
    }
  }
  KVP_CHECK(used == num_used_, "{} used blocks counted, {} found", num_used_, used);
  KVP_CHECK(cached == num_cached_, "{} cached blocks counted, {} found", num_cached_, cached);
  KVP_CHECK(num_free() + num_used_ + num_evictable_ == n, "free {} + used {} + evictable {} != {}",
            num_free(), num_used_, num_evictable_, n);
}

}  // namespace kvp

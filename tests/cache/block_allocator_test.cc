// Tests of BlockAllocator: alloc/free, all-or-nothing alloc_n, reference counts, cached blocks
// kept evictable in LRU order, statistics, and the KVP_CHECK paths (death tests).
#include "cache/block_allocator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

namespace kvp {
namespace {

struct RecordingListener : EvictionListener {
  std::vector<BlockId> evicted;
  void on_evict(BlockId block_id) override { evicted.push_back(block_id); }
};

TEST(BlockAllocator, HandsOutEveryBlockOnceThenReportsExhaustion) {
  BlockAllocator a(5);
  std::set<int32_t> seen;
  for (int i = 0; i < 5; ++i) {
    std::optional<BlockId> b = a.alloc();
    ASSERT_TRUE(b.has_value());
    EXPECT_TRUE(seen.insert(b->value).second);
    EXPECT_EQ(a.ref_count(*b), 1);
  }
  EXPECT_EQ(seen, (std::set<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_FALSE(a.alloc().has_value());
  EXPECT_FALSE(a.can_allocate(1));
  a.check_integrity();
}

TEST(BlockAllocator, FreedBlockIsReusable) {
  BlockAllocator a(1);
  BlockId b = *a.alloc();
  a.release(b);
  EXPECT_TRUE(a.is_free(b));
  std::optional<BlockId> again = a.alloc();
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(*again, b);
  a.check_integrity();
}

TEST(BlockAllocator, AllocNIsAllOrNothing) {
  BlockAllocator a(4);
  std::vector<BlockId> got;
  EXPECT_FALSE(a.alloc_n(5, &got));
  EXPECT_TRUE(got.empty());
  EXPECT_EQ(a.num_free(), 4);
  EXPECT_TRUE(a.alloc_n(3, &got));
  EXPECT_EQ(got.size(), 3u);
  EXPECT_FALSE(a.alloc_n(2, &got));
  EXPECT_EQ(got.size(), 3u);
  EXPECT_EQ(a.num_free(), 1);
  EXPECT_TRUE(a.alloc_n(0, &got));
  a.check_integrity();
}

TEST(BlockAllocator, BlockReturnsToFreeListOnlyWhenLastReferenceIsReleased) {
  BlockAllocator a(2);
  BlockId b = *a.alloc();
  a.retain(b);
  a.retain(b);
  EXPECT_EQ(a.ref_count(b), 3);
  EXPECT_FALSE(a.is_writable(b));
  a.release(b);
  a.release(b);
  EXPECT_FALSE(a.is_free(b));
  EXPECT_TRUE(a.is_writable(b));
  a.release(b);
  EXPECT_TRUE(a.is_free(b));
  EXPECT_EQ(a.num_free(), 2);
  a.check_integrity();
}

TEST(BlockAllocator, CachedBlockStaysEvictableAndIsReclaimedOnlyWhenFreeListIsEmpty) {
  BlockAllocator a(3);
  RecordingListener listener;
  a.set_eviction_listener(&listener);
  BlockId c0 = *a.alloc();
  BlockId c1 = *a.alloc();
  a.set_cached(c0);
  a.set_cached(c1);
  EXPECT_FALSE(a.is_writable(c0));  // cached blocks are immutable
  a.release(c1);                    // released first: least recently used
  a.release(c0);
  EXPECT_TRUE(a.is_evictable(c0));
  EXPECT_TRUE(a.is_evictable(c1));
  EXPECT_EQ(a.num_free(), 1);
  EXPECT_EQ(a.num_available(), 3);
  a.check_integrity();

  BlockId fresh = *a.alloc();  // from the free list: nothing evicted
  EXPECT_NE(fresh, c0);
  EXPECT_NE(fresh, c1);
  EXPECT_TRUE(listener.evicted.empty());

  std::optional<BlockId> e1 = a.alloc();  // evicts LRU: c1
  ASSERT_TRUE(e1.has_value());
  EXPECT_EQ(*e1, c1);
  ASSERT_EQ(listener.evicted.size(), 1u);
  EXPECT_EQ(listener.evicted[0], c1);
  EXPECT_FALSE(a.is_cached(c1));
  EXPECT_EQ(a.stats().num_evictions, 1);
  a.check_integrity();
}

TEST(BlockAllocator, RetainOfEvictableBlockTakesItOffTheLruList) {
  BlockAllocator a(2);
  BlockId c = *a.alloc();
  a.set_cached(c);
  a.release(c);
  EXPECT_EQ(a.num_evictable(), 1);
  a.retain(c);  // a prefix-cache hit
  EXPECT_EQ(a.num_evictable(), 0);
  EXPECT_EQ(a.ref_count(c), 1);
  BlockId other = *a.alloc();
  EXPECT_NE(other, c);
  EXPECT_FALSE(a.alloc().has_value());  // c is held, not evictable
  a.check_integrity();
}

TEST(BlockAllocator, ReleaseRefreshesLruOrder) {
  BlockAllocator a(2);
  BlockId x = *a.alloc();
  BlockId y = *a.alloc();
  a.set_cached(x);
  a.set_cached(y);
  a.release(x);
  a.release(y);
  a.retain(x);  // x used again: now y is least recent
  a.release(x);
  EXPECT_EQ(*a.alloc(), y);
  EXPECT_EQ(*a.alloc(), x);
  a.check_integrity();
}

TEST(BlockAllocator, ClearCachedSendsEvictableBlockToFreeList) {
  BlockAllocator a(2);
  BlockId c = *a.alloc();
  a.set_cached(c);
  a.release(c);
  a.clear_cached(c);
  EXPECT_TRUE(a.is_free(c));
  EXPECT_EQ(a.num_evictable(), 0);
  BlockId held = *a.alloc();
  a.set_cached(held);
  a.clear_cached(held);
  EXPECT_TRUE(a.is_writable(held));
  a.check_integrity();
}

TEST(BlockAllocator, StatisticsCountAllocsPeakAndStates) {
  BlockAllocator a(4);
  BlockId b0 = *a.alloc();
  BlockId b1 = *a.alloc();
  BlockId b2 = *a.alloc();
  a.release(b1);
  a.set_cached(b2);
  a.release(b2);
  BlockAllocatorStats s = a.stats();
  EXPECT_EQ(s.num_blocks, 4);
  EXPECT_EQ(s.num_used, 1);
  EXPECT_EQ(s.num_free, 2);
  EXPECT_EQ(s.num_evictable, 1);
  EXPECT_EQ(s.num_cached, 1);
  EXPECT_EQ(s.peak_used, 3);
  EXPECT_EQ(s.num_allocs, 3);
  EXPECT_EQ(s.num_evictions, 0);
  a.release(b0);
}

using BlockAllocatorDeathTest = ::testing::Test;

TEST_F(BlockAllocatorDeathTest, DoubleFreeAborts) {
  BlockAllocator a(2);
  BlockId b = *a.alloc();
  a.release(b);
  EXPECT_DEATH(a.release(b), "double free");
}

TEST_F(BlockAllocatorDeathTest, InvalidIdAborts) {
  BlockAllocator a(2);
  EXPECT_DEATH(a.release(BlockId{2}), "out of range");
  EXPECT_DEATH(a.retain(BlockId{-1}), "out of range");
  EXPECT_DEATH((void)a.ref_count(BlockId{7}), "out of range");
}

TEST_F(BlockAllocatorDeathTest, RetainOfFreeBlockAborts) {
  BlockAllocator a(2);
  EXPECT_DEATH(a.retain(BlockId{0}), "retain of free block");
}

TEST_F(BlockAllocatorDeathTest, CachedMarksCheckState) {
  BlockAllocator a(2);
  EXPECT_DEATH(a.set_cached(BlockId{0}), "not held");
  BlockId b = *a.alloc();
  EXPECT_DEATH(a.clear_cached(b), "not cached");
  a.set_cached(b);
  EXPECT_DEATH(a.set_cached(b), "already cached");
}

TEST_F(BlockAllocatorDeathTest, EmptyPoolAborts) {
  EXPECT_DEATH(BlockAllocator a(0), "at least one block");
}

}  // namespace
}  // namespace kvp

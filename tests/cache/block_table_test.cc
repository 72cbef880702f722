// Tests of BlockTable: block-boundary allocation, slot mapping, truncate, fork with
// copy-on-write of a shared partial tail, sliding-window release, adopt, and the error paths.
#include "cache/block_table.h"

#include <gtest/gtest.h>

namespace kvp {
namespace {

TEST(BlockTable, AllocatesOnlyWhenABlockBoundaryIsCrossed) {
  BlockAllocator a(8);
  BlockTable t(&a, 4);
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(t.append(1, &copies));
  EXPECT_EQ(t.num_blocks(), 1);
  EXPECT_EQ(a.num_free(), 7);
  ASSERT_TRUE(t.append(3, &copies));  // fills block 0 exactly
  EXPECT_EQ(t.num_blocks(), 1);
  ASSERT_TRUE(t.append(1, &copies));  // position 4: second block
  EXPECT_EQ(t.num_blocks(), 2);
  ASSERT_TRUE(t.append(6, &copies));  // positions 5..10: third block
  EXPECT_EQ(t.num_tokens(), 11);
  EXPECT_EQ(t.num_blocks(), 3);
  EXPECT_EQ(a.num_free(), 5);
  EXPECT_TRUE(copies.empty());
  t.check_integrity();
  a.check_integrity();
}

TEST(BlockTable, SlotMappingIsBlockTimesBlockSizePlusOffset) {
  BlockAllocator a(8);
  // Take blocks 0 and 1 so the table gets 2, 3, 4 (the free list hands out lowest ids first).
  BlockId b0 = *a.alloc();
  BlockId b1 = *a.alloc();
  BlockTable t(&a, 4);
  ASSERT_TRUE(t.append(10, nullptr));
  ASSERT_EQ(t.block(0), BlockId{2});
  ASSERT_EQ(t.block(1), BlockId{3});
  ASSERT_EQ(t.block(2), BlockId{4});
  EXPECT_EQ(t.slot(0), 8);
  EXPECT_EQ(t.slot(3), 11);
  EXPECT_EQ(t.slot(4), 12);
  EXPECT_EQ(t.slot(9), 17);
  std::vector<int64_t> slots(7);  // [7]
  t.fill_slots(2, 7, slots.data());
  EXPECT_EQ(slots, (std::vector<int64_t>{10, 11, 12, 13, 14, 15, 16}));
  a.release(b0);
  a.release(b1);
}

TEST(BlockTable, FillLastSlotsGivesEachSequencesNewestSlot) {
  BlockAllocator a(8);
  BlockTable t0(&a, 2);
  BlockTable t1(&a, 2);
  ASSERT_TRUE(t0.append(3, nullptr));  // blocks 0, 1
  ASSERT_TRUE(t1.append(1, nullptr));  // block 2
  const BlockTable* batch[] = {&t0, &t1};
  int64_t out[2];  // [batch]
  fill_last_slots(batch, out);
  EXPECT_EQ(out[0], 1 * 2 + 0);
  EXPECT_EQ(out[1], 2 * 2 + 0);
}

TEST(BlockTable, AppendFailsWithoutChangingAnythingWhenPoolIsShort) {
  BlockAllocator a(2);
  BlockTable t(&a, 4);
  ASSERT_TRUE(t.append(6, nullptr));
  EXPECT_EQ(t.blocks_needed(3), 1);
  EXPECT_FALSE(t.append(3, nullptr));
  EXPECT_EQ(t.num_tokens(), 6);
  EXPECT_EQ(t.num_blocks(), 2);
  EXPECT_TRUE(t.append(2, nullptr));  // fits in the tail
  t.check_integrity();
  a.check_integrity();
}

TEST(BlockTable, TruncateReleasesBlocksPastTheNewEnd) {
  BlockAllocator a(4);
  BlockTable t(&a, 4);
  ASSERT_TRUE(t.append(13, nullptr));
  EXPECT_EQ(a.num_free(), 0);
  t.truncate(5);
  EXPECT_EQ(t.num_blocks(), 2);
  EXPECT_EQ(a.num_free(), 2);
  t.truncate(4);
  EXPECT_EQ(t.num_blocks(), 1);
  t.truncate(0);
  EXPECT_EQ(t.num_blocks(), 0);
  EXPECT_EQ(a.num_free(), 4);
  EXPECT_FALSE(t.can_truncate(1));
  t.check_integrity();
  a.check_integrity();
}

TEST(BlockTable, ForkSharesFullBlocksAndCopiesPartialTail) {
  BlockAllocator a(8);
  BlockTable parent(&a, 4);
  ASSERT_TRUE(parent.append(6, nullptr));  // blocks 0 (full), 1 (2 of 4)
  BlockTable child = parent.fork();
  EXPECT_EQ(child.num_tokens(), 6);
  EXPECT_EQ(a.ref_count(BlockId{0}), 2);
  EXPECT_EQ(a.ref_count(BlockId{1}), 2);

  std::vector<BlockCopy> copies;
  ASSERT_TRUE(child.append(1, &copies));  // writes into the shared tail: copy first
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0], (BlockCopy{BlockId{1}, BlockId{2}}));
  EXPECT_EQ(child.block(0), BlockId{0});
  EXPECT_EQ(child.block(1), BlockId{2});
  EXPECT_EQ(a.ref_count(BlockId{1}), 1);

  copies.clear();
  ASSERT_TRUE(parent.append(1, &copies));  // the parent's tail is its own again
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(parent.block(1), BlockId{1});
  EXPECT_EQ(parent.slot(6), 1 * 4 + 2);
  EXPECT_EQ(child.slot(6), 2 * 4 + 2);
  parent.check_integrity();
  child.check_integrity();
  a.check_integrity();
}

TEST(BlockTable, ForkAtBlockBoundaryNeedsNoCopy) {
  BlockAllocator a(8);
  BlockTable parent(&a, 4);
  ASSERT_TRUE(parent.append(8, nullptr));
  BlockTable child = parent.fork();
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(child.append(1, &copies));
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(child.num_blocks(), 3);
  EXPECT_EQ(a.ref_count(child.block(0)), 2);
}

TEST(BlockTable, CopyOnWriteCountsTheCopyAndFailsCleanlyWhenPoolIsShort) {
  BlockAllocator a(2);
  BlockTable parent(&a, 4);
  ASSERT_TRUE(parent.append(2, nullptr));
  BlockTable child = parent.fork();
  EXPECT_EQ(child.blocks_needed(1), 1);
  EXPECT_EQ(child.blocks_needed(3), 2);
  std::vector<BlockCopy> copies;
  EXPECT_FALSE(child.append(3, &copies));
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(child.num_tokens(), 2);
  EXPECT_EQ(a.ref_count(BlockId{0}), 2);
  a.check_integrity();
}

TEST(BlockTable, WritingIntoACachedBlockAfterTruncateCopiesIt) {
  BlockAllocator a(4);
  BlockTable t(&a, 4);
  ASSERT_TRUE(t.append(4, nullptr));
  a.set_cached(t.block(0));  // registered by the prefix cache: immutable
  t.truncate(2);
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(t.append(1, &copies));
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].src, BlockId{0});
  EXPECT_TRUE(a.is_evictable(BlockId{0}));
  t.check_integrity();
  a.check_integrity();
}

TEST(BlockTable, FreeReturnsEveryBlock) {
  BlockAllocator a(4);
  {
    BlockTable t(&a, 2);
    ASSERT_TRUE(t.append(7, nullptr));
    EXPECT_EQ(a.num_free(), 0);
    t.free();
    EXPECT_EQ(a.num_free(), 4);
    ASSERT_TRUE(t.append(3, nullptr));
  }  // destructor releases
  EXPECT_EQ(a.num_free(), 4);
  a.check_integrity();
}

TEST(BlockTable, MovedTableOwnsTheBlocks) {
  BlockAllocator a(4);
  BlockTable t(&a, 2);
  ASSERT_TRUE(t.append(3, nullptr));
  BlockTable moved = std::move(t);
  EXPECT_EQ(moved.num_tokens(), 3);
  EXPECT_EQ(a.num_free(), 2);
  BlockTable other(&a, 2);
  other = std::move(moved);
  EXPECT_EQ(a.num_free(), 2);
  other.free();
  EXPECT_EQ(a.num_free(), 4);
}

TEST(BlockTable, SlidingWindowReleasesBlocksWhollyBehindTheWindow) {
  // W = 6, block_size 4: after each single-token append at most ceil(6/4)+1 = 3 blocks held.
  BlockAllocator a(16);
  BlockTable t(&a, 4, 6);
  int32_t max_held = 0;
  for (int i = 0; i < 40; ++i) {
    ASSERT_TRUE(t.append(1, nullptr));
    max_held = std::max(max_held, t.num_held_blocks());
    t.check_integrity();
    // The newest token at position i attends to (i-6, i]: those slots must still be held.
    for (int p = std::max(0, i - 5); p <= i; ++p) {
      EXPECT_GE(p / 4, t.num_dropped_blocks()) << "position " << p << " at step " << i;
    }
  }
  EXPECT_EQ(max_held, 3);
  EXPECT_EQ(t.num_blocks(), 10);
  // Next token is position 40, window (34, 40]: block 8 (32..35) still needed, 0..7 dropped.
  t.trim_window();
  EXPECT_EQ(t.num_dropped_blocks(), 8);
  EXPECT_EQ(a.num_free(), 16 - 2);
  EXPECT_EQ(t.slot(35) % 4, 3);
  a.check_integrity();
}

TEST(BlockTable, ForkOfWindowedTableKeepsDroppedEntries) {
  BlockAllocator a(16);
  BlockTable t(&a, 2, 3);
  ASSERT_TRUE(t.append(9, nullptr));
  t.trim_window();  // next position 9, window (6, 9]: blocks 0..2 (positions 0..5) dropped
  EXPECT_EQ(t.num_dropped_blocks(), 3);
  BlockTable child = t.fork();
  EXPECT_EQ(child.num_dropped_blocks(), 3);
  EXPECT_EQ(child.num_held_blocks(), 2);
  EXPECT_EQ(a.ref_count(t.block(3)), 2);
  EXPECT_FALSE(t.can_truncate(7));  // position 7 would need 5, which is dropped
  EXPECT_TRUE(t.can_truncate(8));
  child.check_integrity();
}

TEST(BlockTable, AdoptTakesOwnershipOfRetainedBlocks) {
  BlockAllocator a(4);
  BlockId b0 = *a.alloc();
  BlockId b1 = *a.alloc();
  BlockTable t(&a, 4);
  std::vector<BlockId> blocks{b0, b1};
  t.adopt(0, blocks, 7);
  EXPECT_EQ(t.slot(5), b1.value * 4 + 1);
  t.check_integrity();
  t.free();
  EXPECT_EQ(a.num_free(), 4);
}

using BlockTableDeathTest = ::testing::Test;

TEST_F(BlockTableDeathTest, RejectsBadBlockSize) {
  BlockAllocator a(4);
  EXPECT_DEATH(BlockTable(&a, 3), "power of two");
  EXPECT_DEATH(BlockTable(&a, 2048), "power of two");
  EXPECT_DEATH(BlockTable(nullptr, 4), "needs an allocator");
}

TEST_F(BlockTableDeathTest, TruncateBeyondEndAborts) {
  BlockAllocator a(4);
  BlockTable t(&a, 4);
  ASSERT_TRUE(t.append(3, nullptr));
  EXPECT_DEATH(t.truncate(4), "truncate to 4");
}

TEST_F(BlockTableDeathTest, AdoptWithWrongCountAborts) {
  BlockAllocator a(4);
  BlockTable t(&a, 4);
  BlockId b = *a.alloc();
  std::vector<BlockId> blocks{b};
  EXPECT_DEATH(t.adopt(0, blocks, 5), "adopt of 0 dropped \\+ 1 blocks for 5 tokens");
}

TEST_F(BlockTableDeathTest, SharedTailWithoutCopyListAborts) {
  BlockAllocator a(4);
  BlockTable t(&a, 4);
  ASSERT_TRUE(t.append(1, nullptr));
  BlockTable child = t.fork();
  EXPECT_DEATH((void)child.append(1, nullptr), "needs a copy list");
}

TEST_F(BlockTableDeathTest, IntegrityCheckCatchesATableReferencingAFreedBlock) {
  BlockAllocator a(4);
  BlockTable t(&a, 4);
  ASSERT_TRUE(t.append(1, nullptr));
  a.release(t.block(0));  // a bug elsewhere frees the table's block
  EXPECT_DEATH(t.check_integrity(), "not held");
  ASSERT_EQ(a.alloc(), BlockId{0});  // hold it again so the destructor's release balances
}

}  // namespace
}  // namespace kvp

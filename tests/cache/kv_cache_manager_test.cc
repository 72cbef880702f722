// Tests of KvCacheManager: sequences across a global and a sliding-window group (Gemma 3
// style), all-or-nothing append, fork with copy-on-write per group, config validation.
#include "cache/kv_cache_manager.h"

#include <gtest/gtest.h>

namespace kvp {
namespace {

std::vector<CacheGroupConfig> gemma_like() {
  return {CacheGroupConfig{.num_blocks = 32, .block_size = 4, .window_tokens = 0},
          CacheGroupConfig{.num_blocks = 8, .block_size = 4, .window_tokens = 8}};
}

TEST(KvCacheManager, AppendGrowsEveryGroupAndWindowGroupStaysCapped) {
  KvCacheManager m(gemma_like());
  m.add_sequence(SeqId{1});
  std::vector<GroupBlockCopy> copies;
  for (int i = 0; i < 60; ++i) {
    ASSERT_TRUE(m.append(SeqId{1}, 1, &copies)) << "step " << i;
    m.check_integrity();
    // ceil(8/4)+1 = 3 blocks at most in the window group.
    EXPECT_LE(m.table(SeqId{1}, 1).num_held_blocks(), 3);
  }
  EXPECT_EQ(m.num_tokens(SeqId{1}), 60);
  EXPECT_EQ(m.table(SeqId{1}, 0).num_held_blocks(), 15);
  EXPECT_EQ(m.table(SeqId{1}, 1).num_blocks(), 15);
  EXPECT_TRUE(copies.empty());
}

TEST(KvCacheManager, AppendIsAllOrNothingAcrossGroups) {
  KvCacheManager m({CacheGroupConfig{.num_blocks = 8, .block_size = 4},
                    CacheGroupConfig{.num_blocks = 2, .block_size = 4}});
  m.add_sequence(SeqId{1});
  std::vector<GroupBlockCopy> copies;
  ASSERT_TRUE(m.append(SeqId{1}, 8, &copies));
  EXPECT_FALSE(m.can_append(SeqId{1}, 1));
  EXPECT_FALSE(m.append(SeqId{1}, 1, &copies));  // group 1 is full
  EXPECT_EQ(m.table(SeqId{1}, 0).num_tokens(), 8);
  EXPECT_EQ(m.allocator(0).num_free(), 6);  // group 0 took nothing
  m.check_integrity();
}

TEST(KvCacheManager, ForkSharesBlocksAndCopiesEachGroupsPartialTail) {
  KvCacheManager m(gemma_like());
  m.add_sequence(SeqId{1});
  std::vector<GroupBlockCopy> copies;
  ASSERT_TRUE(m.append(SeqId{1}, 6, &copies));
  m.fork(SeqId{1}, SeqId{2});
  m.check_integrity();
  ASSERT_TRUE(m.append(SeqId{2}, 1, &copies));
  ASSERT_EQ(copies.size(), 2u);
  EXPECT_EQ(copies[0].group, 0);
  EXPECT_EQ(copies[1].group, 1);
  EXPECT_EQ(copies[0].copy.src, m.table(SeqId{1}, 0).block(1));
  EXPECT_EQ(copies[0].copy.dst, m.table(SeqId{2}, 0).block(1));
  m.check_integrity();
  m.free_sequence(SeqId{1});
  m.free_sequence(SeqId{2});
  EXPECT_EQ(m.allocator(0).num_free(), 32);
  EXPECT_EQ(m.allocator(1).num_free(), 8);
}

TEST(KvCacheManager, TruncateAppliesToEveryGroup) {
  KvCacheManager m(gemma_like());
  m.add_sequence(SeqId{1});
  std::vector<GroupBlockCopy> copies;
  ASSERT_TRUE(m.append(SeqId{1}, 10, &copies));
  m.truncate(SeqId{1}, 5);
  EXPECT_EQ(m.table(SeqId{1}, 0).num_blocks(), 2);
  EXPECT_EQ(m.table(SeqId{1}, 1).num_blocks(), 2);
  m.check_integrity();
}

TEST(KvCacheManager, ValidateNamesTheBadGroupAndField) {
  EXPECT_TRUE(KvCacheManager::validate(gemma_like()).is_ok());
  Status empty = KvCacheManager::validate({});
  EXPECT_EQ(empty.code(), StatusCode::kInvalidArgument);
  Status bad_size = KvCacheManager::validate(
      {CacheGroupConfig{.num_blocks = 4, .block_size = 4}, CacheGroupConfig{4, 24, 0}});
  EXPECT_EQ(bad_size.message(), "cache group 1: block_size 24 is not a power of two in [1, 1024]");
  Status bad_blocks = KvCacheManager::validate({CacheGroupConfig{0, 16, 0}});
  EXPECT_EQ(bad_blocks.message(), "cache group 0: num_blocks 0 must be at least 1");
  Status bad_window = KvCacheManager::validate({CacheGroupConfig{4, 16, -1}});
  EXPECT_EQ(bad_window.message(), "cache group 0: window_tokens -1 is negative");
}

using KvCacheManagerDeathTest = ::testing::Test;

TEST_F(KvCacheManagerDeathTest, UnknownAndDuplicateSequencesAbort) {
  KvCacheManager m(gemma_like());
  std::vector<GroupBlockCopy> copies;
  EXPECT_DEATH((void)m.append(SeqId{3}, 1, &copies), "unknown sequence 3");
  m.add_sequence(SeqId{3});
  EXPECT_DEATH(m.add_sequence(SeqId{3}), "already exists");
  EXPECT_DEATH(m.fork(SeqId{3}, SeqId{3}), "already exists");
  EXPECT_DEATH(m.free_sequence(SeqId{4}), "unknown sequence 4");
}

TEST_F(KvCacheManagerDeathTest, InvalidConfigAborts) {
  EXPECT_DEATH(KvCacheManager m({CacheGroupConfig{4, 3, 0}}), "block_size 3");
}

}  // namespace
}  // namespace kvp

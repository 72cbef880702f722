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

std::vector<int32_t> iota_tokens(int32_t count, int32_t first) {
  std::vector<int32_t> tokens(count);  // [count]
  for (int32_t i = 0; i < count; ++i) tokens[i] = first + i;
  return tokens;
}

// A sequence of `tokens`, appended one token at a time (decode-like), registered.
void add_registered(KvCacheManager* m, SeqId id, const std::vector<int32_t>& tokens) {
  m->add_sequence(id);
  std::vector<GroupBlockCopy> copies;
  for (size_t i = 0; i < tokens.size(); ++i) ASSERT_TRUE(m->append(id, 1, &copies));
  m->register_prefix(id, tokens);
}

TEST(KvCacheManager, PrefixMatchSharesBlocksInEveryGroupAtTheLargestBlockSize) {
  KvCacheManager m({CacheGroupConfig{.num_blocks = 32, .block_size = 4},
                    CacheGroupConfig{.num_blocks = 32, .block_size = 8}},
                   /*prefix_salt=*/5);
  std::vector<int32_t> tokens = iota_tokens(30, 0);
  add_registered(&m, SeqId{1}, tokens);
  m.add_sequence(SeqId{2});
  std::vector<int32_t> prompt = iota_tokens(27, 0);
  prompt.push_back(500);
  // Matchable: tokens [0, 27). Group 0 hits 6 blocks (24), group 1 hits 3 blocks (24): 24 is a
  // multiple of both block sizes.
  EXPECT_EQ(m.match_prefix(SeqId{2}, prompt), 24);
  EXPECT_EQ(m.table(SeqId{2}, 0).num_blocks(), 6);
  EXPECT_EQ(m.table(SeqId{2}, 1).num_blocks(), 3);
  for (int32_t i = 0; i < 6; ++i) {
    EXPECT_EQ(m.table(SeqId{2}, 0).block(i), m.table(SeqId{1}, 0).block(i));
  }
  EXPECT_EQ(m.allocator(1).ref_count(m.table(SeqId{1}, 1).block(0)), 2);
  m.check_integrity();
  std::vector<GroupBlockCopy> copies;
  ASSERT_TRUE(m.append(SeqId{2}, 4, &copies));  // past the match: new blocks, no copies
  EXPECT_TRUE(copies.empty());
  m.check_integrity();
}

TEST(KvCacheManager, WindowGroupNeedsOnlyTheBlocksInsideTheWindow) {
  KvCacheManager m({CacheGroupConfig{.num_blocks = 32, .block_size = 4},
                    CacheGroupConfig{.num_blocks = 32, .block_size = 4, .window_tokens = 6}},
                   /*prefix_salt=*/5);
  std::vector<int32_t> tokens = iota_tokens(40, 0);
  add_registered(&m, SeqId{1}, tokens);
  // The last append (old length 39) kept positions >= 34: window blocks 8 and 9 only.
  EXPECT_EQ(m.table(SeqId{1}, 1).num_dropped_blocks(), 8);
  m.free_sequence(SeqId{1});  // blocks stay cached and evictable
  m.add_sequence(SeqId{2});
  std::vector<int32_t> prompt = tokens;
  prompt.insert(prompt.end(), {900, 901, 902});
  // Position 40 attends to (34, 40]: window blocks 8 (32..35) and 9 (36..39) suffice.
  EXPECT_EQ(m.match_prefix(SeqId{2}, prompt), 40);
  EXPECT_EQ(m.table(SeqId{2}, 0).num_held_blocks(), 10);
  EXPECT_EQ(m.table(SeqId{2}, 1).num_dropped_blocks(), 8);
  EXPECT_EQ(m.table(SeqId{2}, 1).num_held_blocks(), 2);
  m.check_integrity();
}

TEST(KvCacheManager, NoMatchWhenTheWindowBlocksWereDropped) {
  KvCacheManager m({CacheGroupConfig{.num_blocks = 32, .block_size = 4},
                    CacheGroupConfig{.num_blocks = 32, .block_size = 4, .window_tokens = 6}},
                   /*prefix_salt=*/5);
  add_registered(&m, SeqId{1}, iota_tokens(40, 0));
  m.add_sequence(SeqId{2});
  // Only 30 tokens in common: every candidate length needs window blocks that were dropped
  // (never registered) by sequence 1, so nothing is taken in any group.
  std::vector<int32_t> prompt = iota_tokens(30, 0);
  prompt.push_back(777);
  prompt.push_back(778);
  EXPECT_EQ(m.match_prefix(SeqId{2}, prompt), 0);
  EXPECT_EQ(m.table(SeqId{2}, 0).num_blocks(), 0);
  EXPECT_EQ(m.allocator(0).ref_count(m.table(SeqId{1}, 0).block(0)), 1);
  m.check_integrity();
}

TEST(KvCacheManager, AppendWithTokensRegistersWindowBlocksBeforeDroppingThem) {
  KvCacheManager m({CacheGroupConfig{.num_blocks = 32, .block_size = 4},
                    CacheGroupConfig{.num_blocks = 32, .block_size = 4, .window_tokens = 6}},
                   /*prefix_salt=*/5);
  std::vector<int32_t> tokens = iota_tokens(40, 0);
  m.add_sequence(SeqId{1});
  std::vector<GroupBlockCopy> copies;
  for (int32_t i = 0; i < 40; ++i) {
    ASSERT_TRUE(m.append(SeqId{1}, 1, &copies, std::span<const int32_t>(tokens).first(i)));
  }
  m.register_prefix(SeqId{1}, tokens);
  m.add_sequence(SeqId{2});
  // Only 30 tokens in common: position 28 attends to (22, 28], window blocks 5 and 6, which
  // sequence 1 dropped long ago but registered first. (Without tokens this match is 0: see
  // NoMatchWhenTheWindowBlocksWereDropped.)
  std::vector<int32_t> prompt = iota_tokens(30, 0);
  prompt.push_back(777);
  prompt.push_back(778);
  EXPECT_EQ(m.match_prefix(SeqId{2}, prompt), 28);
  EXPECT_EQ(m.table(SeqId{2}, 1).num_dropped_blocks(), 5);
  m.check_integrity();
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

TEST_F(KvCacheManagerDeathTest, PrefixCallsCheckTheirPreconditions) {
  KvCacheManager plain(gemma_like());
  plain.add_sequence(SeqId{1});
  std::vector<int32_t> tokens = iota_tokens(9, 0);
  EXPECT_DEATH((void)plain.match_prefix(SeqId{1}, tokens), "without prefix caching");
  KvCacheManager m(gemma_like(), /*prefix_salt=*/1);
  m.add_sequence(SeqId{1});
  std::vector<GroupBlockCopy> copies;
  ASSERT_TRUE(m.append(SeqId{1}, 2, &copies));
  EXPECT_DEATH((void)m.match_prefix(SeqId{1}, tokens), "that has tokens");
  EXPECT_DEATH(m.register_prefix(SeqId{1}, tokens), "register_prefix of 9 tokens");
  EXPECT_DEATH((void)m.append(SeqId{1}, 1, &copies, tokens), "given 9 token ids");
}

TEST_F(KvCacheManagerDeathTest, InvalidConfigAborts) {
  EXPECT_DEATH(KvCacheManager m({CacheGroupConfig{4, 3, 0}}), "block_size 3");
}

}  // namespace
}  // namespace kvp

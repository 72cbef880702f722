// Tests of PrefixCache: longest-prefix match of registered full blocks, chaining (a block only
// matches after the same prefix), salt separation, LRU eviction dropping entries, and errors.
#include "cache/prefix_cache.h"

#include <gtest/gtest.h>

#include <numeric>

#include "cache/block_table.h"

namespace kvp {
namespace {

std::vector<int32_t> iota_tokens(int32_t count, int32_t first) {
  std::vector<int32_t> tokens(count);  // [count]
  std::iota(tokens.begin(), tokens.end(), first);
  return tokens;
}

// Fills a table with `tokens` and registers its full blocks.
BlockTable make_registered(BlockAllocator* a, PrefixCache* cache,
                           const std::vector<int32_t>& tokens) {
  BlockTable t(a, cache->block_size());
  EXPECT_TRUE(t.append(static_cast<int32_t>(tokens.size()), nullptr));
  const size_t num_full = tokens.size() / cache->block_size();
  cache->register_blocks(tokens, t.blocks().first(num_full));
  return t;
}

TEST(PrefixCache, MatchesTheLongestRegisteredRunOfFullBlocks) {
  BlockAllocator a(16);
  PrefixCache cache(&a, 4, 7);
  std::vector<int32_t> tokens = iota_tokens(10, 100);  // 2 full blocks + 2 tokens
  BlockTable t = make_registered(&a, &cache, tokens);
  EXPECT_EQ(cache.num_entries(), 2);

  std::vector<int32_t> prompt = iota_tokens(13, 100);  // same 10 tokens, then more
  PrefixMatch m = cache.match(prompt);
  EXPECT_EQ(m.num_tokens, 8);
  ASSERT_EQ(m.blocks.size(), 2u);
  EXPECT_EQ(m.blocks[0], t.block(0));
  EXPECT_EQ(m.blocks[1], t.block(1));
  EXPECT_EQ(a.ref_count(t.block(0)), 2);  // retained for the caller
  for (BlockId b : m.blocks) a.release(b);
  cache.check_integrity();
  a.check_integrity();
}

TEST(PrefixCache, StopsAtTheFirstDifferingBlock) {
  BlockAllocator a(16);
  PrefixCache cache(&a, 4, 7);
  BlockTable t = make_registered(&a, &cache, iota_tokens(16, 0));
  std::vector<int32_t> prompt = iota_tokens(16, 0);
  prompt[9] = 999;  // block 2 differs
  EXPECT_EQ(cache.count_match(prompt), 8);
  PrefixMatch m = cache.match(prompt);
  EXPECT_EQ(m.num_tokens, 8);
  for (BlockId b : m.blocks) a.release(b);
}

TEST(PrefixCache, ABlockMatchesOnlyAfterTheSamePrefix) {
  BlockAllocator a(16);
  PrefixCache cache(&a, 4, 7);
  std::vector<int32_t> tokens = iota_tokens(8, 0);
  BlockTable t = make_registered(&a, &cache, tokens);
  // Block 1's tokens (4..7) behind another first block: no match at all, not even block 1.
  std::vector<int32_t> other = {50, 51, 52, 53, 4, 5, 6, 7};
  EXPECT_EQ(cache.count_match(other), 0);
  // Block 1's tokens as the first block: no match either (its hash chains the prefix).
  std::vector<int32_t> shifted = {4, 5, 6, 7};
  EXPECT_EQ(cache.count_match(shifted), 0);
}

TEST(PrefixCache, DifferentSaltsDoNotShareBlocks) {
  BlockAllocator a(16);
  BlockAllocator b(16);
  PrefixCache cache_a(&a, 4, 1);
  PrefixCache cache_b(&b, 4, 2);
  std::vector<int32_t> tokens = iota_tokens(8, 0);
  BlockTable t = make_registered(&b, &cache_b, tokens);
  BlockTable u(&a, 4);
  ASSERT_TRUE(u.append(8, nullptr));  // cache_a's pool holds the same tokens, unregistered
  // The same tokens registered under salt 2 are not found under salt 1.
  EXPECT_EQ(cache_b.count_match(tokens), 8);
  EXPECT_EQ(cache_a.count_match(tokens), 0);
}

TEST(PrefixCache, ReleasedBlocksStayMatchableUntilEvicted) {
  BlockAllocator a(4);
  PrefixCache cache(&a, 2, 7);
  std::vector<int32_t> tokens = iota_tokens(4, 0);
  { BlockTable t = make_registered(&a, &cache, tokens); }  // released: both blocks evictable
  EXPECT_EQ(a.num_evictable(), 2);
  EXPECT_EQ(cache.count_match(tokens), 4);
  // Two free blocks are used first; the third alloc evicts the LRU cached block (block 0).
  BlockTable filler(&a, 2);
  ASSERT_TRUE(filler.append(4, nullptr));
  EXPECT_EQ(cache.count_match(tokens), 4);
  ASSERT_TRUE(filler.append(2, nullptr));
  EXPECT_EQ(cache.num_entries(), 1);
  EXPECT_EQ(cache.count_match(tokens), 0);  // the first block is gone: chain broken
  EXPECT_EQ(cache.stats().num_evicted, 1);
  cache.check_integrity();
  a.check_integrity();
}

TEST(PrefixCache, DuplicateContentsInAnotherBlockStayUncached) {
  BlockAllocator a(8);
  PrefixCache cache(&a, 4, 7);
  std::vector<int32_t> tokens = iota_tokens(4, 0);
  BlockTable first = make_registered(&a, &cache, tokens);
  BlockTable second = make_registered(&a, &cache, tokens);
  EXPECT_EQ(cache.num_entries(), 1);
  EXPECT_TRUE(a.is_cached(first.block(0)));
  EXPECT_FALSE(a.is_cached(second.block(0)));
  cache.check_integrity();
}

TEST(PrefixCache, RegisteringAgainIsANoOp) {
  BlockAllocator a(8);
  PrefixCache cache(&a, 4, 7);
  std::vector<int32_t> tokens = iota_tokens(8, 0);
  BlockTable t = make_registered(&a, &cache, tokens);
  EXPECT_EQ(cache.register_blocks(tokens, t.blocks()), 0);
  EXPECT_EQ(cache.num_entries(), 2);
}

TEST(PrefixCache, StatisticsCountQueriedAndHitTokens) {
  BlockAllocator a(8);
  PrefixCache cache(&a, 4, 7);
  BlockTable t = make_registered(&a, &cache, iota_tokens(8, 0));
  PrefixMatch m = cache.match(iota_tokens(10, 0));
  for (BlockId b : m.blocks) a.release(b);
  PrefixMatch miss = cache.match(iota_tokens(6, 1));
  EXPECT_TRUE(miss.blocks.empty());
  PrefixCacheStats s = cache.stats();
  EXPECT_EQ(s.num_queries, 2);
  EXPECT_EQ(s.num_query_tokens, 16);
  EXPECT_EQ(s.num_hit_tokens, 8);
  EXPECT_EQ(s.num_registered, 2);
}

TEST(PrefixCache, ClearReturnsEvictableBlocksToTheFreeList) {
  BlockAllocator a(4);
  PrefixCache cache(&a, 2, 7);
  { BlockTable t = make_registered(&a, &cache, iota_tokens(4, 0)); }
  EXPECT_EQ(a.num_free(), 2);
  cache.clear();
  EXPECT_EQ(a.num_free(), 4);
  EXPECT_EQ(cache.num_entries(), 0);
  cache.check_integrity();
  a.check_integrity();
}

TEST(PrefixCache, ManyEntriesSurviveInterleavedEvictions) {
  // Exercises the open-addressing table's deletion with many colliding home slots.
  BlockAllocator a(64);
  PrefixCache cache(&a, 1, 3);
  for (int round = 0; round < 20; ++round) {
    std::vector<int32_t> tokens = iota_tokens(40, round * 1000);
    BlockTable t = make_registered(&a, &cache, tokens);
    cache.check_integrity();
    a.check_integrity();
    EXPECT_EQ(cache.count_match(tokens), 40);
  }
}

TEST(PrefixCache, LookupBlocksReportsEveryCachedBlockEvenAfterAMiss) {
  BlockAllocator a(16);
  PrefixCache cache(&a, 2, 7);
  std::vector<int32_t> tokens = iota_tokens(8, 0);  // 4 blocks
  BlockTable t(&a, 2);
  ASSERT_TRUE(t.append(8, nullptr));
  // Register only blocks 2 and 3 (as a window table would, its first entries dropped).
  EXPECT_EQ(cache.register_blocks(tokens, t.blocks(), /*first_block=*/2), 2);
  EXPECT_FALSE(a.is_cached(t.block(0)));
  EXPECT_TRUE(a.is_cached(t.block(2)));
  std::vector<std::optional<BlockId>> hits;
  cache.lookup_blocks(iota_tokens(9, 0), &hits);
  ASSERT_EQ(hits.size(), 4u);
  EXPECT_FALSE(hits[0].has_value());
  EXPECT_FALSE(hits[1].has_value());
  EXPECT_EQ(hits[2], t.block(2));
  EXPECT_EQ(hits[3], t.block(3));
  EXPECT_EQ(a.ref_count(t.block(2)), 1);    // lookup retains nothing
  EXPECT_EQ(cache.count_match(tokens), 0);  // a prefix match needs block 0
  // Block 2's entry chains the whole prefix: other first tokens miss it.
  std::vector<int32_t> other = tokens;
  other[0] = 99;
  cache.lookup_blocks(other, &hits);
  EXPECT_FALSE(hits[2].has_value());
  cache.check_integrity();
}

using PrefixCacheDeathTest = ::testing::Test;

TEST_F(PrefixCacheDeathTest, RegisterOfFreeBlockAborts) {
  BlockAllocator a(4);
  PrefixCache cache(&a, 2, 7);
  std::vector<int32_t> tokens = iota_tokens(2, 0);
  std::vector<BlockId> blocks{BlockId{0}};
  EXPECT_DEATH(cache.register_blocks(tokens, blocks), "not held");
}

TEST_F(PrefixCacheDeathTest, RegisterWithTooFewTokensAborts) {
  BlockAllocator a(4);
  PrefixCache cache(&a, 2, 7);
  std::vector<int32_t> tokens = iota_tokens(3, 0);
  std::vector<BlockId> blocks{BlockId{0}, BlockId{1}};
  EXPECT_DEATH(cache.register_blocks(tokens, blocks), "only 3 tokens");
}

}  // namespace
}  // namespace kvp

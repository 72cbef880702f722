// Tests of the pool simulator: hand-computed utilisation, waste and prefix hits for small
// deterministic configs, determinism, tier moves under pressure, and config validation.
#include "cache/pool_simulator.h"

#include <gtest/gtest.h>

namespace kvp {
namespace {

PoolSimConfig exact(int32_t block_size) {
  PoolSimConfig c;
  c.block_size = block_size;
  c.pool_blocks = 64;
  c.host_blocks = 64;
  c.bytes_per_block = 1000;
  c.agents = 1;
  c.turns = 1;
  c.concurrency = 1;
  c.system_prompt_tokens = 0;
  c.user_tokens = 10;
  c.reply_tokens = 10;
  c.jitter = 0;
  return c;
}

TEST(PoolSimulator, OneAgentOneTurnMatchesHandCount) {
  // 20 tokens in 16-token blocks: 2 blocks, 32 slots, 12 unfilled.
  Result<PoolSimResult> r = simulate_pool(exact(16));
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_DOUBLE_EQ(r->slot_waste_mean, 12.0 / 32.0);
  EXPECT_DOUBLE_EQ(r->utilisation_mean, 2.0 / 64.0);
  EXPECT_DOUBLE_EQ(r->utilisation_peak, 2.0 / 64.0);
  EXPECT_EQ(r->peak_used_bytes, 2000);
  EXPECT_EQ(r->pool_bytes, 64000);
  EXPECT_EQ(r->prompt_tokens, 10);
  EXPECT_EQ(r->prefix_hit_tokens, 0);
  ASSERT_EQ(r->sessions.size(), 1u);
  EXPECT_EQ(r->sessions[0].num_tokens, 20);
  EXPECT_EQ(r->sessions[0].final_tier, Tier::Resident);
}

TEST(PoolSimulator, LaterAgentsHitTheSharedSystemPrompt) {
  // 4 agents one at a time, system prompt 40 tokens, block 16: agents 2..4 each find
  // floor(40 / 16) = 2 full blocks = 32 tokens cached.
  PoolSimConfig c = exact(16);
  c.agents = 4;
  c.system_prompt_tokens = 40;
  Result<PoolSimResult> r = simulate_pool(c);
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->prompt_tokens, 4 * (40 + 10));
  EXPECT_EQ(r->prefix_hit_tokens, 3 * 32);
  EXPECT_DOUBLE_EQ(r->prefix_hit_rate, 96.0 / 200.0);
  // Each agent holds ceil(60/16) = 4 blocks, two of them shared: 2 + 4 * 2 = 10 blocks used.
  EXPECT_DOUBLE_EQ(r->utilisation_peak, 10.0 / 64.0);
}

TEST(PoolSimulator, SecondTurnReusesTheWholeHistory) {
  PoolSimConfig c = exact(16);
  c.turns = 2;
  Result<PoolSimResult> r = simulate_pool(c);
  ASSERT_TRUE(r.is_ok());
  // Turn 1: context 10, nothing reused. Turn 2: context 20 history + 10 new, 20 reused.
  EXPECT_EQ(r->context_tokens, 10 + 30);
  EXPECT_DOUBLE_EQ(r->context_reuse_rate, 20.0 / 40.0);
  EXPECT_EQ(r->sessions[0].num_tokens, 40);
}

TEST(PoolSimulator, SmallPoolMovesIdleSessionsDownTiers) {
  PoolSimConfig c = exact(16);
  c.agents = 6;
  c.turns = 4;
  c.pool_blocks = 12;  // each agent grows to ceil(80/16) = 5 blocks; 6 agents never fit
  c.host_blocks = 8;
  Result<PoolSimResult> r = simulate_pool(c);
  ASSERT_TRUE(r.is_ok());
  EXPECT_GT(r->offloads, 0);
  EXPECT_GT(r->saves_to_disk, 0);
  EXPECT_GT(r->resumes, 0);
  EXPECT_EQ(r->failed_turns, 0);
  EXPECT_LE(r->utilisation_peak, 1.0);
  int64_t offloads = 0;
  for (const PoolSimSession& s : r->sessions) {
    offloads += s.stats.num_offloads;
    EXPECT_EQ(s.num_tokens, 4 * 20);
  }
  EXPECT_EQ(offloads, r->offloads);
  EXPECT_EQ(r->bytes_transferred, r->blocks_transferred * 1000);
}

TEST(PoolSimulator, NoHostPoolSendsSessionsStraightToDisk) {
  PoolSimConfig c = exact(16);
  c.agents = 6;
  c.turns = 3;
  c.pool_blocks = 12;
  c.host_blocks = 0;
  Result<PoolSimResult> r = simulate_pool(c);
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->offloads, 0);
  EXPECT_GT(r->saves_to_disk, 0);
  EXPECT_GT(r->blocks_loaded_from_disk, 0);
}

TEST(PoolSimulator, SameSeedSameResultAndSeedMatters) {
  PoolSimConfig c;
  c.pool_blocks = 256;
  c.host_blocks = 128;
  c.agents = 12;
  c.turns = 6;
  Result<PoolSimResult> a = simulate_pool(c);
  Result<PoolSimResult> b = simulate_pool(c);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  EXPECT_EQ(a->slot_waste_mean, b->slot_waste_mean);
  EXPECT_EQ(a->utilisation_mean, b->utilisation_mean);
  EXPECT_EQ(a->offloads, b->offloads);
  c.seed = 2;
  Result<PoolSimResult> other = simulate_pool(c);
  ASSERT_TRUE(other.is_ok());
  EXPECT_NE(a->slot_waste_mean, other->slot_waste_mean);
}

TEST(PoolSimulator, WindowGroupHoldsOnlyTheWindowAfterDecode) {
  // Block 4, window 8: the prompt (10 tokens, one chunk) takes 3 window blocks; decoding 10
  // more one at a time drops blocks behind the window. At the end (20 tokens, next position
  // 20 attends to (12, 20]) blocks 3 and 4 are held; at most 3 were ever held.
  PoolSimConfig c = exact(4);
  c.window_tokens = 8;
  c.window_pool_blocks = 16;
  c.window_host_blocks = 16;
  c.window_bytes_per_block = 500;
  Result<PoolSimResult> r = simulate_pool(c);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_DOUBLE_EQ(r->utilisation_peak, 5.0 / 64.0);
  EXPECT_DOUBLE_EQ(r->window_utilisation_mean, 2.0 / 16.0);
  EXPECT_EQ(r->peak_used_bytes, 5 * 1000 + 3 * 500);
  EXPECT_EQ(r->pool_bytes, 64 * 1000 + 16 * 500);
}

TEST(PoolSimulator, WindowGroupSessionsMoveThroughTiersAndBytesFollowTheOps) {
  PoolSimConfig c = exact(4);
  c.agents = 6;
  c.turns = 4;
  c.pool_blocks = 40;  // each agent grows to 80 tokens = 20 blocks: 6 agents never fit
  c.host_blocks = 24;
  c.window_tokens = 8;
  c.window_pool_blocks = 32;
  c.window_host_blocks = 8;
  c.window_bytes_per_block = 500;
  Result<PoolSimResult> r = simulate_pool(c);
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->failed_turns, 0);
  EXPECT_GT(r->offloads, 0);
  EXPECT_GT(r->saves_to_disk, 0);
  EXPECT_GT(r->bytes_saved_to_disk, 0);
  EXPECT_GT(r->bytes_loaded_from_disk, 0);
  EXPECT_LE(r->window_utilisation_peak, 1.0);
  // Transfers move blocks of both sizes: the bytes lie between all-window and all-global.
  EXPECT_GE(r->bytes_transferred, r->blocks_transferred * 500);
  EXPECT_LE(r->bytes_transferred, r->blocks_transferred * 1000);
  for (const PoolSimSession& s : r->sessions) EXPECT_EQ(s.num_tokens, 4 * 20);
}

TEST(PoolSimulator, BadConfigIsAStatusNamingTheField) {
  PoolSimConfig c;
  c.block_size = 48;
  Result<PoolSimResult> r = simulate_pool(c);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "block_size 48 is not a power of two in [1, 1024]");
  c = PoolSimConfig{};
  c.agents = 0;
  EXPECT_EQ(simulate_pool(c).status().message(), "agents 0 < 1");
  c = PoolSimConfig{};
  c.jitter = 1.5;
  EXPECT_EQ(simulate_pool(c).status().message(), "jitter 1.5 is not in [0, 1]");
  c = PoolSimConfig{};
  c.window_tokens = 512;
  EXPECT_EQ(simulate_pool(c).status().message(), "window_pool_blocks 0 < 1 with window_tokens 512");
}

}  // namespace
}  // namespace kvp

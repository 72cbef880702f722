// Swap instead of recompute (EngineConfig::preemption): a running sequence preempted for room
// goes to the host tier and comes back with its KV, so the output is the transformers goldens'
// and no token is prefilled twice; recompute prefills again; the choice follows the cost model;
// a swapped request that is cancelled gives its host blocks back (or its session keeps them).
#include <gtest/gtest.h>

#include <map>

#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "engine/preemption_cost.h"

using namespace kvp::engine_test;  // NOLINT(google-build-using-namespace)

namespace kvp {
namespace {

struct PressureRun {
  std::map<int64_t, Outcome> out;
  std::map<int64_t, int> golden_of;  // request id -> golden prompt index
  int64_t prompt_tokens = 0;
  EngineStats stats;
};

// The four golden prompts with 32 tokens each in 24 blocks of 4 tokens: they cannot all fit.
PressureRun run_pressure(const char* model, Preemption preemption, uint64_t host_tier_bytes) {
  auto runner = load(model);
  CpuForwardBackend backend(runner);
  EngineConfig config = small_config(24);
  config.host_tier_bytes = host_tier_bytes;
  config.tier_watermark = 0;
  config.preemption = preemption;
  Engine engine(&backend, config);
  PressureRun run;
  for (int p = 0; p < 4; ++p) {
    auto prompt = golden_ids(model, "prompt_" + std::to_string(p));
    run.prompt_tokens += static_cast<int64_t>(prompt.size());
    auto id = engine.submit(greedy_request(prompt, 32));
    KVP_CHECK(id.is_ok(), "{}", id.status().to_string());
    run.golden_of[id->value] = p;
  }
  run.out = run_all(engine);
  run.stats = engine.stats();
  return run;
}

class PreemptionTest : public ::testing::TestWithParam<const char*> {};

TEST_P(PreemptionTest, SwappedSequencesKeepTheirOutputAndPrefillNothingTwice) {
  const PressureRun swap = run_pressure(GetParam(), Preemption::kSwap, 64 << 20);
  EXPECT_GT(swap.stats.num_preemptions, 0);
  EXPECT_EQ(swap.stats.num_preemption_swaps, swap.stats.num_preemptions);
  EXPECT_GT(swap.stats.num_swapped_in_tokens, 0);
  int64_t prefilled = 0;
  for (const auto& [id, p] : swap.golden_of) {
    EXPECT_EQ(swap.out.at(id).tokens, golden_ids(GetParam(), "greedy_" + std::to_string(p))) << p;
    prefilled += swap.out.at(id).usage.prefilled_tokens;
  }
  // every prompt token ran once; what came back from the host was not run again
  EXPECT_EQ(prefilled, swap.prompt_tokens);
  EXPECT_EQ(swap.stats.host_tier_bytes_used, 0u);
}

TEST_P(PreemptionTest, RecomputeRunsTheTokensAgain) {
  const PressureRun recompute = run_pressure(GetParam(), Preemption::kRecompute, 64 << 20);
  EXPECT_GT(recompute.stats.num_preemptions, 0);
  EXPECT_EQ(recompute.stats.num_preemption_swaps, 0);
  EXPECT_EQ(recompute.stats.num_swapped_in_tokens, 0);
  int64_t prefilled = 0;
  for (const auto& [id, p] : recompute.golden_of) {
    EXPECT_EQ(recompute.out.at(id).tokens, golden_ids(GetParam(), "greedy_" + std::to_string(p)))
        << p;
    prefilled += recompute.out.at(id).usage.prefilled_tokens;
  }
  EXPECT_GT(prefilled, recompute.prompt_tokens);
}

TEST_P(PreemptionTest, AutoKeepsTheOutput) {
  const PressureRun run = run_pressure(GetParam(), Preemption::kAuto, 64 << 20);
  EXPECT_GT(run.stats.num_preemptions, 0);
  for (const auto& [id, p] : run.golden_of) {
    EXPECT_EQ(run.out.at(id).tokens, golden_ids(GetParam(), "greedy_" + std::to_string(p))) << p;
  }
}

TEST_P(PreemptionTest, AHostTierTooSmallRecomputes) {
  // 1 KiB holds no sequence's blocks: every preemption recomputes
  const PressureRun run = run_pressure(GetParam(), Preemption::kSwap, 1024);
  EXPECT_GT(run.stats.num_preemptions, 0);
  EXPECT_EQ(run.stats.num_preemption_swaps, 0);
  for (const auto& [id, p] : run.golden_of) {
    EXPECT_EQ(run.out.at(id).tokens, golden_ids(GetParam(), "greedy_" + std::to_string(p))) << p;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, PreemptionTest, ::testing::Values("llama", "gemma3", "qwen3"));

// Steps until some sequence is swapped out; false if all finished first.
bool step_until_swapped(Engine& engine) {
  for (int i = 0; i < 1000 && engine.has_unfinished(); ++i) {
    engine.step();
    engine.check_integrity();
    if (engine.stats().num_preemption_swaps > 0) return true;
  }
  return false;
}

TEST(Preemption, CancelledWhileSwappedGivesTheHostBlocksBack) {
  auto runner = load("llama");
  CpuForwardBackend backend(runner);
  EngineConfig config = small_config(24);
  config.host_tier_bytes = 64 << 20;
  config.preemption = Preemption::kSwap;
  Engine engine(&backend, config);
  std::vector<RequestId> ids;
  for (int p = 0; p < 4; ++p) {
    auto id = engine.submit(greedy_request(golden_ids("llama", "prompt_" + std::to_string(p)), 32));
    ASSERT_TRUE(id.is_ok());
    ids.push_back(*id);
  }
  ASSERT_TRUE(step_until_swapped(engine));
  EXPECT_GT(engine.stats().host_tier_bytes_used, 0u);
  std::vector<EngineEvent> events;
  for (RequestId id : ids) engine.cancel(id, &events);
  run_all(engine);
  EXPECT_EQ(engine.stats().host_tier_bytes_used, 0u);
  engine.check_integrity();
}

TEST(Preemption, ASessionCancelledWhileSwappedKeepsItsKvInTheHostTier) {
  auto runner = load("llama");
  CpuForwardBackend backend(runner);
  EngineConfig config = small_config(24);
  config.host_tier_bytes = 64 << 20;
  config.tier_watermark = 0;
  config.preemption = Preemption::kSwap;
  Engine engine(&backend, config);
  std::vector<RequestId> ids;
  for (int p = 0; p < 4; ++p) {
    Request r = greedy_request(golden_ids("llama", "prompt_" + std::to_string(p)), 32);
    r.session = "agent" + std::to_string(p);
    auto id = engine.submit(std::move(r));
    ASSERT_TRUE(id.is_ok());
    ids.push_back(*id);
  }
  ASSERT_TRUE(step_until_swapped(engine));
  std::vector<EngineEvent> events;
  for (RequestId id : ids) engine.cancel(id, &events);
  run_all(engine);
  int on_host = 0;
  for (const EngineSessionInfo& info : engine.sessions()) {
    if (info.tier != SessionTier::kHost) continue;
    ++on_host;
    EXPECT_GT(info.num_kv_tokens, 0) << info.name;
  }
  EXPECT_GT(on_host, 0);
  EXPECT_GT(engine.stats().host_tier_bytes_used, 0u);
  // the next turn of every session runs from what it kept
  const int64_t restores = engine.stats().num_session_restores;
  for (int p = 0; p < 4; ++p) {
    Request r = greedy_request({5, 6, 7}, 4);
    r.session = "agent" + std::to_string(p);
    ASSERT_TRUE(engine.submit(std::move(r)).is_ok());
  }
  run_all(engine);
  EXPECT_GE(engine.stats().num_session_restores, restores + on_host);
}

TEST(PreemptionCostModel, SwapsUntilMeasuredThenPicksTheCheaper) {
  PreemptionCostModel model;
  EXPECT_TRUE(model.prefer_swap(uint64_t{1} << 30, 1));  // nothing measured: swap
  model.observe_copy(uint64_t{1} << 30, 1.0);            // 1 GiB/s
  EXPECT_TRUE(model.prefer_swap(uint64_t{1} << 30, 1));  // prefill rate unknown: swap
  model.observe_prefill(1000, 1.0);                      // 1000 tokens/s
  // 1 MiB: 2 ms of copies against 100 tokens = 100 ms of prefill
  EXPECT_TRUE(model.prefer_swap(uint64_t{1} << 20, 100));
  // 1 GiB: 2 s of copies against 10 tokens = 10 ms of prefill
  EXPECT_FALSE(model.prefer_swap(uint64_t{1} << 30, 10));
  EXPECT_DOUBLE_EQ(*model.swap_seconds(uint64_t{1} << 30), 2.0);
  EXPECT_DOUBLE_EQ(*model.recompute_seconds(500), 0.5);
}

TEST(PreemptionCostModel, KeepsAMovingAverageAndIgnoresTinySamples) {
  PreemptionCostModel model;
  model.observe_copy(1000, 1e-9);  // below the minimum size: latency, not rate
  EXPECT_FALSE(model.copy_bytes_per_second().has_value());
  model.observe_prefill(4, 1e-3);  // below the minimum tokens
  EXPECT_FALSE(model.prefill_tokens_per_second().has_value());
  model.observe_copy(uint64_t{1} << 30, 1.0);
  model.observe_copy(uint64_t{1} << 30, 0.5);  // 2 GiB/s
  const double gib = double(uint64_t{1} << 30);
  const double w = PreemptionCostModel::kWeight;
  EXPECT_DOUBLE_EQ(*model.copy_bytes_per_second(), (1 - w) * gib + w * 2 * gib);
  model.observe_copy(uint64_t{1} << 30, 0.0);  // no time: ignored
  EXPECT_DOUBLE_EQ(*model.copy_bytes_per_second(), (1 - w) * gib + w * 2 * gib);
}

TEST(PreemptionCostModel, TimesCopiesAndSteps) {
  PreemptionCostModel model;
  const uint64_t gib = uint64_t{1} << 30;
  EXPECT_FALSE(model.copy_seconds(gib).has_value());  // nothing measured
  EXPECT_FALSE(model.within_step(0.0));
  model.observe_copy(gib, 2.0);  // 0.5 GiB/s
  EXPECT_DOUBLE_EQ(*model.copy_seconds(gib / 4), 0.5);
  EXPECT_FALSE(model.within_step(0.0));  // step time not measured
  model.observe_step(0.010);             // steps of 10 ms
  model.observe_step(0.0);               // no time: ignored
  ASSERT_TRUE(model.step_seconds().has_value());
  EXPECT_DOUBLE_EQ(*model.step_seconds(), 0.010);
  EXPECT_TRUE(model.within_step(0.009));
  EXPECT_TRUE(model.within_step(-1.0));  // already past
  EXPECT_FALSE(model.within_step(0.011));
  model.observe_step(0.090);
  const double w = PreemptionCostModel::kWeight;
  EXPECT_DOUBLE_EQ(*model.step_seconds(), (1 - w) * 0.010 + w * 0.090);  // a moving average
  EXPECT_TRUE(model.within_step(0.011));
}

}  // namespace
}  // namespace kvp

// Engine equivalence with 8-bit KV (issue 17): in an int8 pool a request's greedy output is the
// same alone, batched with 31 others, after a prefix-cache hit, after preemption and recompute,
// and after its session is spilled to host memory or disk and restored, or saved and loaded
// into a fresh engine. Within one dtype the tokens are bit-exact: every path quantises each
// token's K and V once, the same way, where it enters the pool, and moves whole blocks (scales
// with them) afterwards. The reference is the request alone in a fresh int8 engine; how far
// int8 greedy output strays from the f32 goldens (transformers) is printed, not asserted.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <map>
#include <random>

#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "support/temp_dir.h"

using namespace kvp::engine_test;  // NOLINT(google-build-using-namespace)

namespace kvp {
namespace {

EngineConfig int8_config(int32_t num_blocks) {
  EngineConfig c = small_config(num_blocks);
  c.kv_dtype = DType::I8;
  return c;
}

// Greedy output of one request alone in a fresh int8 engine.
std::vector<int32_t> alone(const std::shared_ptr<ModelRunner>& runner,
                           const std::vector<int32_t>& prompt, int32_t max_tokens) {
  CpuForwardBackend backend(runner);
  Engine engine(&backend, int8_config(256));
  auto id = engine.submit(greedy_request(prompt, max_tokens));
  KVP_CHECK(id.is_ok(), "{}", id.status().to_string());
  return run_all(engine)[id->value].tokens;
}

std::vector<int32_t> golden_prompt(const char* model, int p) {
  return golden_ids(model, "prompt_" + std::to_string(p));
}

class EngineInt8Test : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    runner_ = load(GetParam());
    for (int p = 0; p < 4; ++p) alone_.push_back(alone(runner_, golden_prompt(GetParam(), p), 32));
  }
  std::shared_ptr<ModelRunner> runner_;
  std::vector<std::vector<int32_t>> alone_;  // [golden prompt] int8 greedy output alone
};

TEST_P(EngineInt8Test, AloneOutputIsReproducibleAndCloseToTheF32Golden) {
  for (int p = 0; p < 4; ++p) {
    EXPECT_EQ(alone(runner_, golden_prompt(GetParam(), p), 32), alone_[p]) << p;
    const auto golden = golden_ids(GetParam(), "greedy_" + std::to_string(p));
    size_t same_prefix = 0;
    while (same_prefix < golden.size() && same_prefix < alone_[p].size() &&
           golden[same_prefix] == alone_[p][same_prefix]) {
      ++same_prefix;
    }
    std::cout << "[ int8     ] " << GetParam() << " prompt " << p << ": first " << same_prefix
              << " of " << golden.size() << " greedy tokens equal the f32 golden\n";
  }
}

TEST_P(EngineInt8Test, BatchedWith31OthersMatchesAlone) {
  CpuForwardBackend backend(runner_);
  Engine engine(&backend, int8_config(1024));
  std::mt19937 rng(11);
  std::map<int64_t, int> golden_of;
  for (int i = 0; i < 32; ++i) {
    if (i % 8 == 3) {
      auto id = engine.submit(greedy_request(golden_prompt(GetParam(), i / 8), 32));
      ASSERT_TRUE(id.is_ok());
      golden_of[id->value] = i / 8;
    } else {
      std::vector<int32_t> prompt(1 + rng() % 60);
      for (int32_t& t : prompt) t = 3 + rng() % 250;
      ASSERT_TRUE(engine.submit(greedy_request(prompt, 1 + rng() % 40)).is_ok());
    }
  }
  auto out = run_all(engine);
  for (const auto& [id, p] : golden_of) EXPECT_EQ(out[id].tokens, alone_[p]) << p;
}

TEST_P(EngineInt8Test, PreemptedRequestsRecomputeToTheSameOutput) {
  CpuForwardBackend backend(runner_);
  Engine engine(&backend, int8_config(24));
  std::map<int64_t, int> golden_of;
  for (int p = 0; p < 4; ++p) {
    auto id = engine.submit(greedy_request(golden_prompt(GetParam(), p), 32));
    ASSERT_TRUE(id.is_ok()) << id.status().to_string();
    golden_of[id->value] = p;
  }
  auto out = run_all(engine);
  EXPECT_GT(engine.stats().num_preemptions, 0);
  for (const auto& [id, p] : golden_of) EXPECT_EQ(out[id].tokens, alone_[p]) << p;
}

TEST_P(EngineInt8Test, PrefixCacheHitKeepsOutput) {
  CpuForwardBackend backend(runner_);
  Engine engine(&backend, int8_config(256));
  const auto prompt = golden_prompt(GetParam(), 3);  // 45 tokens: 11 full blocks of 4
  auto first = engine.submit(greedy_request(prompt, 32));
  auto out1 = run_all(engine);
  auto second = engine.submit(greedy_request(prompt, 32));
  auto out2 = run_all(engine);
  EXPECT_EQ(out1[first->value].tokens, alone_[3]);
  EXPECT_EQ(out2[second->value].tokens, alone_[3]);
  EXPECT_GT(out2[second->value].usage.cached_tokens, 0);
}

INSTANTIATE_TEST_SUITE_P(Models, EngineInt8Test, ::testing::Values("llama", "gemma3", "qwen3"));

// ---- sessions through the tiers ----

using test::TempDir;

SessionTier tier_of(const Engine& engine, const std::string& name) {
  for (const EngineSessionInfo& s : engine.sessions()) {
    if (s.name == name) return s.tier;
  }
  KVP_CHECK(false, "no session {}", name);
  return SessionTier::kDevice;
}

enum class Move { kHost, kDisk, kSaveLoad };

class EngineInt8TierTest : public ::testing::TestWithParam<std::tuple<const char*, Move>> {};

// A session's first turn, then pressure (or a save and a fresh engine), then a second turn: its
// output equals the whole conversation as one request alone in an int8 engine.
TEST_P(EngineInt8TierTest, SessionMovedAndRestoredMatchesTheWholePromptAlone) {
  const auto [model, move] = GetParam();
  auto runner = load(model);
  TempDir dir(std::string(model) + "-" + std::to_string(static_cast<int>(move)));
  EngineConfig config = int8_config(128);
  if (move == Move::kHost) config.host_tier_bytes = 64 << 20;
  if (move == Move::kDisk) {
    config.disk_dir = dir.path().string();
    config.disk_tier_bytes = 64 << 20;
  }
  const auto turn1 = golden_prompt(model, 1);
  const auto prompt2 = golden_prompt(model, 2);
  const std::vector<int32_t> turn2(prompt2.begin(), prompt2.begin() + 3);

  auto backend = std::make_unique<CpuForwardBackend>(runner);
  auto engine = std::make_unique<Engine>(backend.get(), config);
  Request r1 = greedy_request(turn1, 8);
  r1.session = "agent";
  auto id1 = engine->submit(r1);
  ASSERT_TRUE(id1.is_ok());
  const std::vector<int32_t> reply1 = run_all(*engine)[id1->value].tokens;
  if (move == Move::kSaveLoad) {
    const std::filesystem::path file = dir.path() / "agent.kvc";
    ASSERT_TRUE(engine->save_session("agent", file).is_ok());
    engine.reset();
    backend = std::make_unique<CpuForwardBackend>(runner);
    engine = std::make_unique<Engine>(backend.get(), config);
    const Status loaded = engine->load_session("agent", file);
    ASSERT_TRUE(loaded.is_ok()) << loaded.to_string();
  } else {
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(engine->submit(greedy_request(std::vector<int32_t>(150, 10 + i), 20)).is_ok());
    }
    run_all(*engine);
    ASSERT_EQ(tier_of(*engine, "agent"),
              move == Move::kHost ? SessionTier::kHost : SessionTier::kDisk);
  }
  Request r2 = greedy_request(turn2, 16);
  r2.session = "agent";
  auto id2 = engine->submit(r2);
  ASSERT_TRUE(id2.is_ok());
  auto out2 = run_all(*engine);
  EXPECT_GT(out2[id2->value].usage.cached_tokens, 0);

  std::vector<int32_t> whole = turn1;
  whole.insert(whole.end(), reply1.begin(), reply1.end());
  whole.insert(whole.end(), turn2.begin(), turn2.end());
  EXPECT_EQ(out2[id2->value].tokens, alone(runner, whole, 16));
  engine->check_integrity();
}

INSTANTIATE_TEST_SUITE_P(ModelsAndMoves, EngineInt8TierTest,
                         ::testing::Combine(::testing::Values("llama", "gemma3"),
                                            ::testing::Values(Move::kHost, Move::kDisk,
                                                              Move::kSaveLoad)));

}  // namespace
}  // namespace kvp

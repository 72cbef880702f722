// Engine equivalence with 8-bit KV (issue 17), int8 and fp8 alike: in an 8-bit pool a request's
// greedy output is the same alone, batched with 31 others, after a prefix-cache hit, after
// preemption and recompute, and after its session is spilled to host memory or disk and
// restored, or saved and loaded into a fresh engine. Within one dtype the tokens are bit-exact:
// every path quantises each token's K and V once, the same way, where it enters the pool, and
// moves whole blocks (scales with them) afterwards. The reference is the request alone in a
// fresh engine of the same dtype; how far 8-bit greedy output strays from the f32 goldens
// (transformers) is printed, and the first greedy token must equal the golden's wherever the
// golden's two best next-token logits are more than kClearMargin apart (not a near-tie).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <random>

#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "support/temp_dir.h"

using namespace kvp::engine_test;  // NOLINT(google-build-using-namespace)

namespace kvp {
namespace {

EngineConfig kv8_config(DType kv_dtype, int32_t num_blocks) {
  EngineConfig c = small_config(num_blocks);
  c.kv_dtype = kv_dtype;
  return c;
}

// Greedy output of one request alone in a fresh engine of 8-bit dtype kv_dtype.
std::vector<int32_t> alone(const std::shared_ptr<ModelRunner>& runner, DType kv_dtype,
                           const std::vector<int32_t>& prompt, int32_t max_tokens) {
  CpuForwardBackend backend(runner);
  Engine engine(&backend, kv8_config(kv_dtype, 256));
  auto id = engine.submit(greedy_request(prompt, max_tokens));
  KVP_CHECK(id.is_ok(), "{}", id.status().to_string());
  return run_all(engine)[id->value].tokens;
}

std::vector<int32_t> golden_prompt(const char* model, int p) {
  return golden_ids(model, "prompt_" + std::to_string(p));
}

// Logit gaps at which 8-bit KV must not flip the f32 golden's first greedy token.
constexpr float kClearMargin = 0.05f;

// The gap between the two largest logits of the golden's next-token row after prompt p (the
// last row of logits_p [prompt_len][vocab] f32, from transformers).
float golden_top2_margin(const char* model, int p) {
  auto file = SafetensorsModel::open(std::string("tests/model/fixtures/tiny/") + model +
                                     "/golden.safetensors");
  KVP_CHECK(file.is_ok(), "{}", file.status().to_string());
  auto t = file->tensor("logits_" + std::to_string(p));
  KVP_CHECK(t.is_ok() && (*t)->dtype == DType::F32 && (*t)->shape.size() == 2, "logits_{}", p);
  const size_t vocab = (*t)->shape[1];
  std::vector<float> row(vocab);
  std::memcpy(row.data(), (*t)->data.data() + ((*t)->shape[0] - 1) * vocab * sizeof(float),
              vocab * sizeof(float));
  std::partial_sort(row.begin(), row.begin() + 2, row.end(), std::greater<>());
  return row[0] - row[1];
}

// Parameters: a tiny model and an 8-bit KV dtype.
class EngineKv8Test : public ::testing::TestWithParam<std::tuple<const char*, DType>> {
 protected:
  void SetUp() override {
    runner_ = load(model());
    for (int p = 0; p < 4; ++p) alone_.push_back(alone(runner_, dtype(), prompt(p), 32));
  }
  const char* model() const { return std::get<0>(GetParam()); }
  DType dtype() const { return std::get<1>(GetParam()); }
  EngineConfig config(int32_t num_blocks) const { return kv8_config(dtype(), num_blocks); }
  std::vector<int32_t> prompt(int p) const { return golden_prompt(model(), p); }
  std::shared_ptr<ModelRunner> runner_;
  std::vector<std::vector<int32_t>> alone_;  // [golden prompt] 8-bit greedy output alone
};

TEST_P(EngineKv8Test, AloneOutputIsReproducibleAndCloseToTheF32Golden) {
  for (int p = 0; p < 4; ++p) {
    EXPECT_EQ(alone(runner_, dtype(), prompt(p), 32), alone_[p]) << p;
    const auto golden = golden_ids(model(), "greedy_" + std::to_string(p));
    size_t same_prefix = 0;
    while (same_prefix < golden.size() && same_prefix < alone_[p].size() &&
           golden[same_prefix] == alone_[p][same_prefix]) {
      ++same_prefix;
    }
    std::cout << fmt::format(
        "[ {:<8} ] {} prompt {}: first {} of {} greedy tokens equal the "
        "f32 golden\n",
        dtype_name(dtype()), model(), p, same_prefix, golden.size());
    if (golden_top2_margin(model(), p) > kClearMargin) {
      EXPECT_GE(same_prefix, 1u) << "prompt " << p << ": the first token already differs";
    }
  }
}

TEST_P(EngineKv8Test, BatchedWith31OthersMatchesAlone) {
  CpuForwardBackend backend(runner_);
  Engine engine(&backend, config(1024));
  std::mt19937 rng(11);
  std::map<int64_t, int> golden_of;
  for (int i = 0; i < 32; ++i) {
    if (i % 8 == 3) {
      auto id = engine.submit(greedy_request(prompt(i / 8), 32));
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

TEST_P(EngineKv8Test, PreemptedRequestsRecomputeToTheSameOutput) {
  CpuForwardBackend backend(runner_);
  Engine engine(&backend, config(24));
  std::map<int64_t, int> golden_of;
  for (int p = 0; p < 4; ++p) {
    auto id = engine.submit(greedy_request(prompt(p), 32));
    ASSERT_TRUE(id.is_ok()) << id.status().to_string();
    golden_of[id->value] = p;
  }
  auto out = run_all(engine);
  EXPECT_GT(engine.stats().num_preemptions, 0);
  for (const auto& [id, p] : golden_of) EXPECT_EQ(out[id].tokens, alone_[p]) << p;
}

TEST_P(EngineKv8Test, PrefixCacheHitKeepsOutput) {
  CpuForwardBackend backend(runner_);
  Engine engine(&backend, config(256));
  const auto prompt3 = prompt(3);  // 45 tokens: 11 full blocks of 4
  auto first = engine.submit(greedy_request(prompt3, 32));
  auto out1 = run_all(engine);
  auto second = engine.submit(greedy_request(prompt3, 32));
  auto out2 = run_all(engine);
  EXPECT_EQ(out1[first->value].tokens, alone_[3]);
  EXPECT_EQ(out2[second->value].tokens, alone_[3]);
  EXPECT_GT(out2[second->value].usage.cached_tokens, 0);
}

// "llama_int8", "gemma3_fp8", ...
std::string model_and_dtype(const ::testing::TestParamInfo<std::tuple<const char*, DType>>& info) {
  return std::string(std::get<0>(info.param)) + "_" +
         std::string(dtype_name(std::get<1>(info.param)));
}

INSTANTIATE_TEST_SUITE_P(Models, EngineKv8Test,
                         ::testing::Combine(::testing::Values("llama", "gemma3", "qwen3"),
                                            ::testing::Values(DType::I8, DType::FP8)),
                         model_and_dtype);

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

class EngineKv8TierTest : public ::testing::TestWithParam<std::tuple<const char*, Move, DType>> {};

// A session's first turn, then pressure (or a save and a fresh engine), then a second turn: its
// output equals the whole conversation as one request alone in an engine of the same dtype.
TEST_P(EngineKv8TierTest, SessionMovedAndRestoredMatchesTheWholePromptAlone) {
  const auto [model, move, kv_dtype] = GetParam();
  auto runner = load(model);
  TempDir dir(std::string(model) + "-" + std::to_string(static_cast<int>(move)) + "-" +
              std::string(dtype_name(kv_dtype)));
  EngineConfig config = kv8_config(kv_dtype, 128);
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
  EXPECT_EQ(out2[id2->value].tokens, alone(runner, kv_dtype, whole, 16));
  engine->check_integrity();
}

INSTANTIATE_TEST_SUITE_P(ModelsAndMoves, EngineKv8TierTest,
                         ::testing::Combine(::testing::Values("llama", "gemma3"),
                                            ::testing::Values(Move::kHost, Move::kDisk,
                                                              Move::kSaveLoad),
                                            ::testing::Values(DType::I8, DType::FP8)));

}  // namespace
}  // namespace kvp

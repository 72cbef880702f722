// The engine's cache paths on the CUDA backend with the tiny transformers-made models, the
// mixture-of-experts ones among them: a session saved to a file after its first turn and loaded
// into a fresh engine, and a prompt whose first blocks another request left in the prefix cache,
// each give the greedy tokens of the whole conversation run alone in a fresh engine (bf16 KV, the
// same backend), prefilling only what they lack. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "model/cuda/cuda_forward_backend.h"
#include "model/model_config.h"
#include "model/safetensors_weights.h"
#include "support/gpu_skip.h"
#include "support/temp_dir.h"

namespace kvp::cuda {
namespace {

using engine_test::golden_ids;
using engine_test::greedy_request;
using engine_test::run_all;

std::unique_ptr<ForwardBackend> tiny_backend(const std::string& name) {
  const std::string dir = "tests/model/fixtures/tiny/" + name;
  auto spec = load_hf_config(dir + "/config.json");
  KVP_CHECK(spec.is_ok(), "{}", spec.status().to_string());
  auto weights = SafetensorsWeights::open(dir + "/model.safetensors");
  KVP_CHECK(weights.is_ok(), "{}", weights.status().to_string());
  auto backend = make_cuda_backend(*spec, **weights);
  KVP_CHECK(backend.is_ok(), "{}", backend.status().to_string());
  return std::move(backend).value();
}

EngineConfig gpu_config() {
  EngineConfig c = engine_test::small_config(256);  // blocks of 4 tokens
  c.kv_dtype = DType::BF16;
  return c;
}

// The greedy tokens of `prompt` as one request in a fresh engine.
std::vector<int32_t> alone(const std::string& name, const std::vector<int32_t>& prompt,
                           int32_t max_tokens) {
  auto backend = tiny_backend(name);
  Engine engine(backend.get(), gpu_config());
  auto id = engine.submit(greedy_request(prompt, max_tokens));
  KVP_CHECK(id.is_ok(), "{}", id.status().to_string());
  return run_all(engine)[id->value].tokens;
}

class CudaEngineTiny : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaEngineTiny, LoadedSessionAndPrefixHitGiveTheWholeConversationsTokens) {
  SKIP_WITHOUT_GPU();
  const std::string model = GetParam();
  const std::vector<int32_t> turn1 = golden_ids(model, "prompt_1");
  const std::vector<int32_t> prompt2 = golden_ids(model, "prompt_2");
  const std::vector<int32_t> turn2(prompt2.begin(), prompt2.begin() + 3);
  test::TempDir dir("cuda-session-" + model);
  const std::filesystem::path file = dir.path() / "agent.kvc";

  std::vector<int32_t> reply1;
  {
    auto backend = tiny_backend(model);
    Engine engine(backend.get(), gpu_config());
    Request r1 = greedy_request(turn1, 8);
    r1.session = "agent";
    auto id1 = engine.submit(r1);
    ASSERT_TRUE(id1.is_ok()) << id1.status().to_string();
    reply1 = run_all(engine)[id1->value].tokens;
    const Status saved = engine.save_session("agent", file);
    ASSERT_TRUE(saved.is_ok()) << saved.to_string();
    engine.check_integrity();
  }
  std::vector<int32_t> whole = turn1;
  whole.insert(whole.end(), reply1.begin(), reply1.end());
  whole.insert(whole.end(), turn2.begin(), turn2.end());
  const std::vector<int32_t> want = alone(model, whole, 16);
  ASSERT_EQ(want.size(), 16u);

  {  // the saved session, loaded into a fresh engine: only the new turn is prefilled
    auto backend = tiny_backend(model);
    Engine engine(backend.get(), gpu_config());
    const Status loaded = engine.load_session("agent", file);
    ASSERT_TRUE(loaded.is_ok()) << loaded.to_string();
    Request r2 = greedy_request(turn2, 16);
    r2.session = "agent";
    auto id2 = engine.submit(r2);
    ASSERT_TRUE(id2.is_ok()) << id2.status().to_string();
    const engine_test::Outcome out = run_all(engine)[id2->value];
    EXPECT_EQ(out.tokens, want) << model << ": loaded session";
    EXPECT_EQ(out.usage.prefilled_tokens, static_cast<int32_t>(turn2.size()));
    engine.check_integrity();
  }
  {  // the first turn and its reply in the prefix cache, left by another request
    auto backend = tiny_backend(model);
    Engine engine(backend.get(), gpu_config());
    const std::vector<int32_t> earlier(whole.begin(), whole.end() - turn2.size());
    auto first = engine.submit(greedy_request(earlier, 1));
    ASSERT_TRUE(first.is_ok()) << first.status().to_string();
    run_all(engine);
    auto id = engine.submit(greedy_request(whole, 16));
    ASSERT_TRUE(id.is_ok()) << id.status().to_string();
    const engine_test::Outcome out = run_all(engine)[id->value];
    EXPECT_EQ(out.tokens, want) << model << ": prefix hit";
    EXPECT_GT(out.usage.cached_tokens, 0) << model << ": no prefix hit";
    EXPECT_EQ(out.usage.cached_tokens + out.usage.prefilled_tokens,
              static_cast<int32_t>(whole.size()));
    std::printf(
        "[ engine  ] %s: loaded session and prefix hit (%d of %zu prompt tokens cached) "
        "give the whole conversation's 16 tokens\n",
        model.c_str(), out.usage.cached_tokens, whole.size());
    engine.check_integrity();
  }
}

INSTANTIATE_TEST_SUITE_P(Models, CudaEngineTiny,
                         ::testing::Values("llama", "gemma3", "qwen3", "qwen2_moe", "qwen3_moe",
                                           "gpt_oss"));

}  // namespace
}  // namespace kvp::cuda

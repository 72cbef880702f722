// Random-weight models (model/random_model.h): the named shapes against configs this project
// did not write (the Llama-3.1-8B config.json fixture, the SmolLM2-135M GGUF's metadata), and
// weights that are deterministic, finite and bounded.
#include "model/random_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "model/gguf_model.h"

namespace kvp {
namespace {

void expect_same_shape(const ModelSpec& got, const ModelSpec& want) {
  EXPECT_EQ(got.architecture, want.architecture);
  EXPECT_EQ(got.vocab_size, want.vocab_size);
  EXPECT_EQ(got.hidden_size, want.hidden_size);
  EXPECT_EQ(got.intermediate_size, want.intermediate_size);
  EXPECT_EQ(got.num_layers, want.num_layers);
  EXPECT_EQ(got.num_q_heads, want.num_q_heads);
  EXPECT_EQ(got.num_kv_heads, want.num_kv_heads);
  EXPECT_EQ(got.head_dim, want.head_dim);
  EXPECT_EQ(got.tie_word_embeddings, want.tie_word_embeddings);
  EXPECT_FLOAT_EQ(got.rms_norm_eps, want.rms_norm_eps);
  EXPECT_DOUBLE_EQ(got.rope_global.theta, want.rope_global.theta);
  EXPECT_EQ(got.sliding_window, want.sliding_window);
}

TEST(RandomModel, Llama3ShapeIsTheFixturesConfig) {
  auto shape = random_model_spec("llama3-8b");
  ASSERT_TRUE(shape.is_ok()) << shape.status().to_string();
  auto fixture = load_hf_config("tests/cache/fixtures/llama-3.1-8b.json");
  ASSERT_TRUE(fixture.is_ok()) << fixture.status().to_string();
  expect_same_shape(*shape, *fixture);
  EXPECT_EQ(shape->rope_global.scaling.factor, fixture->rope_global.scaling.factor);
  EXPECT_EQ(shape->eos_token_ids, fixture->eos_token_ids);
  // 8.0e9 parameters: 32 GB as f32
  EXPECT_NEAR(static_cast<double>(model_f32_weight_bytes(*shape)) / 4, 8.03e9, 0.01e9);
}

TEST(RandomModel, SmolLm2ShapeIsTheGgufsGeometry) {
  const std::string path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " not found (scripts/setup.sh)";
  auto shape = random_model_spec("smollm2-135m");
  ASSERT_TRUE(shape.is_ok()) << shape.status().to_string();
  auto file = GgufFile::open(path);
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  auto gguf = model_spec_from_gguf(*file);
  ASSERT_TRUE(gguf.is_ok()) << gguf.status().to_string();
  expect_same_shape(*shape, *gguf);
  // 134.5e6 parameters (embeddings tied)
  EXPECT_NEAR(static_cast<double>(model_f32_weight_bytes(*shape)) / 4, 134.5e6, 0.5e6);
}

// The mixture-of-experts shapes: their experts and routing as the model cards give them, and
// their parameter counts (every expert, the routers and Qwen1.5-MoE's shared expert counted)
// the cards' 30.5B, 14.3B and 20.9B.
TEST(RandomModel, MoeShapesAreTheModelCards) {
  auto qwen3 = random_model_spec("qwen3-30b-a3b");
  ASSERT_TRUE(qwen3.is_ok()) << qwen3.status().to_string();
  EXPECT_EQ(qwen3->architecture, Architecture::kQwen3Moe);
  EXPECT_EQ(qwen3->num_experts, 128);
  EXPECT_EQ(qwen3->num_experts_per_tok, 8);
  EXPECT_TRUE(qwen3->norm_topk_prob);
  EXPECT_EQ(qwen3->layer_is_moe, std::vector<bool>(48, true));
  EXPECT_NEAR(static_cast<double>(model_f32_weight_bytes(*qwen3)) / 4, 30.5e9, 0.05e9);
  auto qwen15 = random_model_spec("qwen1.5-moe-a2.7b");
  ASSERT_TRUE(qwen15.is_ok()) << qwen15.status().to_string();
  EXPECT_EQ(qwen15->architecture, Architecture::kQwen2Moe);
  EXPECT_EQ(qwen15->num_experts, 60);
  EXPECT_EQ(qwen15->num_experts_per_tok, 4);
  EXPECT_EQ(qwen15->shared_expert_intermediate_size, 5632);
  EXPECT_FALSE(qwen15->norm_topk_prob);
  EXPECT_NEAR(static_cast<double>(model_f32_weight_bytes(*qwen15)) / 4, 14.3e9, 0.05e9);
  // GPT-OSS-20B: the card's 20.9B parameters (21B in its title), windows on every other layer
  auto oss = random_model_spec("gpt-oss-20b");
  ASSERT_TRUE(oss.is_ok()) << oss.status().to_string();
  EXPECT_EQ(oss->architecture, Architecture::kGptOss);
  EXPECT_EQ(oss->num_experts, 32);
  EXPECT_EQ(oss->num_experts_per_tok, 4);
  EXPECT_EQ(oss->layer_is_moe, std::vector<bool>(24, true));
  EXPECT_EQ(oss->sliding_window, 128);
  std::vector<bool> every_other(24);
  for (int l = 0; l < 24; l += 2) every_other[l] = true;
  EXPECT_EQ(oss->layer_is_sliding, every_other);
  EXPECT_NEAR(static_cast<double>(model_f32_weight_bytes(*oss)) / 4, 20.9e9, 0.05e9);
}

TEST(RandomModel, UnknownShapesAreRefusedNamingTheKnownOnes) {
  auto shape = random_model_spec("gpt-5");
  EXPECT_EQ(shape.status().code(), StatusCode::kNotFound);
  EXPECT_NE(shape.status().message().find("gpt-5"), std::string::npos);
  EXPECT_NE(shape.status().message().find("llama3-8b, smollm2-135m"), std::string::npos)
      << shape.status().to_string();
}

TEST(RandomModel, WeightsAreDeterministicFiniteAndBounded) {
  const ModelSpec spec = random_model_spec("smollm2-135m").value();
  const RandomWeightSource a(spec, 7), b(spec, 7), other(spec, 8);
  const std::vector<int64_t> shape = {64, 576};
  const auto wa = a.read_f32("model.layers.0.mlp.up_proj.weight", shape).value();
  EXPECT_EQ(wa, b.read_f32("model.layers.0.mlp.up_proj.weight", shape).value());
  EXPECT_NE(wa, other.read_f32("model.layers.0.mlp.up_proj.weight", shape).value());
  EXPECT_NE(wa, a.read_f32("model.layers.1.mlp.up_proj.weight", shape).value());
  ASSERT_EQ(wa.size(), 64u * 576);
  const float bound = 1.0f / std::sqrt(576.0f);
  double sum_sq = 0;
  for (float x : wa) {
    ASSERT_TRUE(std::isfinite(x));
    ASSERT_LE(std::abs(x), bound);
    sum_sq += double{x} * x;
  }
  // uniform in ±bound: mean square bound² / 3
  EXPECT_NEAR(sum_sq / wa.size(), bound * bound / 3, 0.05 * bound * bound);
  const auto norm = a.read_f32("model.norm.weight", std::vector<int64_t>{576}).value();
  EXPECT_EQ(norm, std::vector<float>(576, 1.0f));
  EXPECT_FALSE(a.contains("lm_head.weight"));  // tied
  EXPECT_EQ(a.read_f32("lm_head.weight", shape).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace kvp

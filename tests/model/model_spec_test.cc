// ModelSpec from a Hugging Face config.json: the values that reach the model runner are bounded
// where they are read (common/limits.h) and validate() refuses what would run as garbage (nan
// rope bases, negative epsilons, token ids outside the vocabulary). Each case below was
// accepted, or threw an uncaught exception, before.
#include "model/model_spec.h"
#include "model/model_runner.h"

#include <gtest/gtest.h>

#include <fmt/format.h>
#include <unistd.h>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kvp {
namespace {

using nlohmann::json;

json tiny_llama() {
  return json::parse(R"({"model_type": "llama", "vocab_size": 256, "hidden_size": 64,
    "intermediate_size": 160, "num_hidden_layers": 3, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "bos_token_id": 1, "eos_token_id": 2})");
}

void expect_refused(const json& config, StatusCode code, const std::string& says) {
  auto spec = model_spec_from_hf_config(config, "config.json");
  ASSERT_FALSE(spec.is_ok()) << says;
  EXPECT_EQ(spec.status().code(), code) << spec.status().to_string();
  EXPECT_NE(spec.status().message().find(says), std::string::npos) << spec.status().to_string();
}

TEST(ModelSpecHf, ReadsTheContextLength) {
  auto spec = model_spec_from_hf_config(tiny_llama(), "config.json");
  ASSERT_TRUE(spec.is_ok()) << spec.status().to_string();
  EXPECT_EQ(spec->context_length, 1024);
  json no_context = tiny_llama();
  no_context.erase("max_position_embeddings");
  spec = model_spec_from_hf_config(no_context, "config.json");
  ASSERT_TRUE(spec.is_ok()) << spec.status().to_string();
  EXPECT_EQ(spec->context_length, 0);  // unknown: no limit
}

// 2147483648 became -2147483648 in get<int32_t>(), then a std::length_error.
TEST(ModelSpecHf, LayerCountsPast32BitsOrTheLimitAreRefused) {
  json j = tiny_llama();
  j["num_hidden_layers"] = 2147483648u;
  expect_refused(j, StatusCode::kInvalidArgument,
                 "config.json: field 'num_hidden_layers' = 2147483648 does not fit in 32 bits");
  j["num_hidden_layers"] = 5000;
  expect_refused(j, StatusCode::kUnsupported,
                 "config.json: 'num_hidden_layers' = 5000 is more than kvpool's limit of 4096 "
                 "layers");
  j = tiny_llama();
  j["vocab_size"] = 4294967297u;  // wrapped to 1
  expect_refused(j, StatusCode::kInvalidArgument, "'vocab_size' = 4294967297 does not fit");
}

TEST(ModelSpecHf, ContextLengthsBelowTheSmallestAreRefused) {
  for (int context : {0, 7}) {
    json j = tiny_llama();
    j["max_position_embeddings"] = context;
    expect_refused(j, StatusCode::kInvalidArgument,
                   "less than kvpool's smallest context of 16 tokens");
  }
}

TEST(ModelSpecHf, NonFiniteOrNonPositiveRopeAndEpsilonAreRefused) {
  for (const char* key : {"rope_theta", "rms_norm_eps"}) {
    for (double value : {std::nan(""), HUGE_VAL, 0.0, -1.0}) {
      SCOPED_TRACE(std::string(key) + " " + std::to_string(value));
      json j = tiny_llama();
      j[key] = value;
      expect_refused(j, StatusCode::kInvalidArgument, "must be a finite number > 0");
    }
  }
  json j = tiny_llama();
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", -5.0}};
  expect_refused(j, StatusCode::kInvalidArgument, "field 'rope_theta' = -5 must be a finite");
}

// "rope_scaling": 5 threw nlohmann's type_error out of the reader (operator[] on a number).
TEST(ModelSpecHf, RopeFieldsThatAreNoObjectsAreRefused) {
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    for (const json& value : {json(5), json("linear"), json::array({1, 2})}) {
      json j = tiny_llama();
      j[key] = value;
      expect_refused(j, StatusCode::kInvalidArgument,
                     std::string("field '") + key + "' is " + value.type_name());
    }
  }
}

// An eos id past the vocabulary indexed the sampler's logits row out of bounds.
TEST(ModelSpecHf, TokenIdsOutsideTheVocabularyAreRefused) {
  json j = tiny_llama();
  j["eos_token_id"] = json::array({2, 256});
  expect_refused(j, StatusCode::kInvalidArgument, "eos token id 256 outside the vocabulary of 256");
  j = tiny_llama();
  j["eos_token_id"] = 4294967298u;  // wrapped to 2
  expect_refused(j, StatusCode::kInvalidArgument, "eos_token_id 4294967298 is not a 32-bit");
  j = tiny_llama();
  j["bos_token_id"] = 300;
  expect_refused(j, StatusCode::kInvalidArgument, "bos token id 300 outside the vocabulary");
}

// A Qwen3-8B-shaped config.json, as its model card ships it (sizes cut down).
json tiny_qwen3() {
  return json::parse(R"({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"],
    "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
    "attention_bias": false, "max_position_embeddings": 40960, "rms_norm_eps": 1e-06,
    "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
    "use_sliding_window": false, "max_window_layers": 36, "tie_word_embeddings": true,
    "bos_token_id": 1, "eos_token_id": 2})");
}

TEST(ModelSpecHf, Qwen3HasPlainPerHeadQkNormsNoBiasesAndItsOwnHeadDim) {
  auto spec = model_spec_from_hf_config(tiny_qwen3(), "config.json");
  ASSERT_TRUE(spec.is_ok()) << spec.status().to_string();
  EXPECT_EQ(spec->architecture, Architecture::kQwen3);
  EXPECT_STREQ(architecture_name(spec->architecture), "qwen3");
  EXPECT_TRUE(spec->qk_norm);
  EXPECT_EQ(spec->norm_style, cpu::NormStyle::kPlain);
  EXPECT_FALSE(spec->qkv_bias);
  EXPECT_FALSE(spec->sandwich_norms);
  EXPECT_EQ(spec->head_dim, 32);  // not hidden / heads = 16
  EXPECT_FLOAT_EQ(spec->attention_scale, 1.0f / std::sqrt(32.0f));
  EXPECT_TRUE(spec->tie_word_embeddings);
  EXPECT_EQ(spec->rope_global.theta, 1e6);
  EXPECT_EQ(spec->rope_style, cpu::RopeStyle::kHalves);
  EXPECT_EQ(spec->layer_is_sliding, std::vector<bool>(2, false));
}

TEST(ModelSpecHf, Qwen3DefaultsFollowQwen3Config) {
  json j = tiny_qwen3();
  j.erase("head_dim");
  j.erase("tie_word_embeddings");
  j["hidden_size"] = 256;
  j["intermediate_size"] = 512;
  auto spec = model_spec_from_hf_config(j, "config.json");
  ASSERT_TRUE(spec.is_ok()) << spec.status().to_string();
  EXPECT_EQ(spec->head_dim, 128);  // Qwen3Config.head_dim, not 256 / 4
  EXPECT_FALSE(spec->tie_word_embeddings);
  j["attention_bias"] = true;
  spec = model_spec_from_hf_config(j, "config.json");
  ASSERT_TRUE(spec.is_ok()) << spec.status().to_string();
  EXPECT_TRUE(spec->qkv_bias);
}

TEST(ModelSpecHf, Qwen3SlidingWindowIsRefused) {
  json j = tiny_qwen3();
  j["use_sliding_window"] = true;
  j["sliding_window"] = 4096;
  expect_refused(j, StatusCode::kUnsupported,
                 "config.json: Qwen3 with use_sliding_window = true is not supported");
}

// As transformers 5.17 writes Qwen3MoeConfig (num_local_experts, not num_experts).
json tiny_qwen3_moe() {
  return json::parse(R"({"model_type": "qwen3_moe", "vocab_size": 256, "hidden_size": 64,
    "intermediate_size": 96, "moe_intermediate_size": 32, "num_local_experts": 4,
    "num_experts_per_tok": 2, "norm_topk_prob": true, "decoder_sparse_step": 1,
    "mlp_only_layers": [], "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-06, "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
    "tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": 2})");
}

TEST(ModelSpecHf, Qwen3MoeReadsItsExperts) {
  auto spec = model_spec_from_hf_config(tiny_qwen3_moe(), "config.json");
  ASSERT_TRUE(spec.is_ok()) << spec.status().to_string();
  EXPECT_EQ(spec->architecture, Architecture::kQwen3Moe);
  EXPECT_STREQ(architecture_name(spec->architecture), "qwen3_moe");
  EXPECT_TRUE(spec->qk_norm);
  EXPECT_FALSE(spec->qkv_bias);
  EXPECT_EQ(spec->num_experts, 4);
  EXPECT_EQ(spec->num_experts_per_tok, 2);
  EXPECT_EQ(spec->moe_intermediate_size, 32);
  EXPECT_TRUE(spec->norm_topk_prob);
  EXPECT_EQ(spec->layer_is_moe, std::vector<bool>(4, true));
  json j = tiny_qwen3_moe();  // Qwen's own configs say num_experts
  j.erase("num_local_experts");
  j["num_experts"] = 8;
  spec = model_spec_from_hf_config(j, "config.json");
  ASSERT_TRUE(spec.is_ok()) << spec.status().to_string();
  EXPECT_EQ(spec->num_experts, 8);
}

// Qwen3MoeDecoderLayer: experts unless listed in mlp_only_layers or (l + 1) % step != 0.
TEST(ModelSpecHf, Qwen3MoeDenseLayersFollowSparseStepAndMlpOnlyLayers) {
  json j = tiny_qwen3_moe();
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {3};
  auto spec = model_spec_from_hf_config(j, "config.json");
  ASSERT_TRUE(spec.is_ok()) << spec.status().to_string();
  EXPECT_EQ(spec->layer_is_moe, (std::vector<bool>{false, true, false, false}));
  j["mlp_only_layers"] = {4};
  expect_refused(j, StatusCode::kInvalidArgument, "mlp_only_layers entry 4 is not a layer of 4");
}

TEST(ModelSpecHf, Qwen3MoeBadExpertCountsAreRefused) {
  json j = tiny_qwen3_moe();
  j["num_experts_per_tok"] = 5;
  expect_refused(j, StatusCode::kInvalidArgument, "5 experts per token of 4 experts");
  j = tiny_qwen3_moe();
  j["moe_intermediate_size"] = 0;
  expect_refused(j, StatusCode::kInvalidArgument, "4 experts of intermediate size 0");
  j = tiny_qwen3_moe();
  j["num_local_experts"] = 5000;
  expect_refused(j, StatusCode::kUnsupported, "more than kvpool's limit of 4096 experts");
}

TEST(ModelSpecHf, Qwen2MoeReadsItsSharedExpertAndQwen2MoeConfigDefaults) {
  json j = tiny_qwen3_moe();
  j["model_type"] = "qwen2_moe";
  j.erase("head_dim");
  j.erase("num_local_experts");
  j.erase("norm_topk_prob");
  j["shared_expert_intermediate_size"] = 48;
  auto spec = model_spec_from_hf_config(j, "config.json");
  ASSERT_TRUE(spec.is_ok()) << spec.status().to_string();
  EXPECT_EQ(spec->architecture, Architecture::kQwen2Moe);
  EXPECT_TRUE(spec->qkv_bias);  // Qwen2MoeConfig.qkv_bias defaults to true
  EXPECT_FALSE(spec->qk_norm);
  EXPECT_EQ(spec->head_dim, 16);       // hidden / heads
  EXPECT_EQ(spec->num_experts, 60);    // Qwen2MoeConfig.num_experts
  EXPECT_FALSE(spec->norm_topk_prob);  // Qwen2MoeConfig.norm_topk_prob
  EXPECT_EQ(spec->shared_expert_intermediate_size, 48);
  j["qkv_bias"] = false;
  j["num_experts"] = 6;
  spec = model_spec_from_hf_config(j, "config.json");
  ASSERT_TRUE(spec.is_ok()) << spec.status().to_string();
  EXPECT_FALSE(spec->qkv_bias);
  EXPECT_EQ(spec->num_experts, 6);
}

// GptOssConfig's defaults: 128-token windows on even layers, YaRN (factor 32 over 4096 tokens,
// not truncated, theta 150000) whose attention factor 0.1 ln 32 + 1 scales q·k by its square,
// q/k/v/o biases, sinks, 128 experts of intermediate_size, top 4, clamped SwiGLU.
TEST(ModelSpecHf, GptOssDefaults) {
  const json j = json::parse(R"({"model_type": "gpt_oss", "vocab_size": 256, "hidden_size": 64,
    "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 1024})");
  auto spec = model_spec_from_hf_config(j, "config.json");
  ASSERT_TRUE(spec.is_ok()) << spec.status().to_string();
  EXPECT_EQ(spec->architecture, Architecture::kGptOss);
  EXPECT_STREQ(architecture_name(spec->architecture), "gpt_oss");
  EXPECT_EQ(spec->head_dim, 64);
  EXPECT_EQ(spec->sliding_window, 128);
  EXPECT_EQ(spec->layer_is_sliding, (std::vector<bool>{true, false, true, false}));
  EXPECT_TRUE(spec->qkv_bias);
  EXPECT_TRUE(spec->o_bias);
  EXPECT_TRUE(spec->attention_sinks);
  EXPECT_TRUE(spec->expert_bias);
  EXPECT_EQ(spec->moe_activation, cpu::Activation::kClampedSwiglu);
  EXPECT_EQ(spec->num_experts, 128);
  EXPECT_EQ(spec->num_experts_per_tok, 4);
  EXPECT_EQ(spec->moe_intermediate_size, 2880);
  EXPECT_TRUE(spec->norm_topk_prob);
  EXPECT_EQ(spec->layer_is_moe, std::vector<bool>(4, true));
  const cpu::RopeScaling& yarn = spec->rope_global.scaling;
  EXPECT_EQ(yarn.kind, cpu::RopeScaling::Kind::kYarn);
  EXPECT_EQ(spec->rope_global.theta, 150000.0);
  EXPECT_EQ(yarn.factor, 32.0);
  EXPECT_EQ(yarn.original_max_position_embeddings, 4096.0);
  EXPECT_FALSE(yarn.truncate);
  EXPECT_NEAR(yarn.attention_factor, 1.3465735902799727, 1e-12);
  EXPECT_NEAR(spec->attention_scale, 1.3465735902799727 * 1.3465735902799727 / 8, 1e-6);
  // transformers' inverse frequencies of this rope (every 8th of 32)
  const std::vector<float> inv = rope_inverse_frequencies(*spec, spec->rope_global);
  ASSERT_EQ(inv.size(), 32u);
  const double expected[] = {1.0, 0.05081327259540558, 0.0004564839182421565,
                             4.099978468730114e-06};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(inv[8 * i], expected[i], 1e-7 * expected[i]) << i;
}

// GPT-OSS-20B's own config.json (legacy rope_scaling) parses, except that its MXFP4 experts
// (quantization_config) are refused by name rather than missed tensor by tensor.
TEST(ModelSpecHf, GptOss20bConfigParsesAndItsMxfp4CheckpointIsRefused) {
  std::ifstream in("tests/cache/fixtures/gpt-oss-20b.json");
  json j = json::parse(in);
  expect_refused(j, StatusCode::kUnsupported, "OpenAI's MXFP4 experts");
  j.erase("quantization_config");
  auto spec = model_spec_from_hf_config(j, "config.json");
  ASSERT_TRUE(spec.is_ok()) << spec.status().to_string();
  EXPECT_EQ(spec->num_experts, 32);
  EXPECT_EQ(spec->num_experts_per_tok, 4);
  EXPECT_EQ(spec->sliding_window, 128);
  EXPECT_EQ(spec->num_layers, 24);
  EXPECT_TRUE(spec->layer_is_sliding[0]);
  EXPECT_FALSE(spec->layer_is_sliding[1]);
  EXPECT_EQ(spec->rope_global.scaling.kind, cpu::RopeScaling::Kind::kYarn);
  EXPECT_EQ(spec->rope_global.theta, 150000.0);
  EXPECT_FALSE(spec->rope_global.scaling.truncate);
  EXPECT_EQ(spec->rope_global.scaling.original_max_position_embeddings, 4096.0);
  EXPECT_EQ(spec->eos_token_ids, std::vector<int32_t>{200002});
}

// The tiny fixture's YaRN (16 original positions, factor 8, dim 16): bit for bit transformers'.
TEST(ModelSpecHf, GptOssYarnFrequenciesAreTransformersBits) {
  auto spec = load_hf_config("tests/model/fixtures/tiny/gpt_oss/config.json");
  ASSERT_TRUE(spec.is_ok()) << spec.status().to_string();
  const std::vector<float> inv = rope_inverse_frequencies(*spec, spec->rope_global);
  const std::vector<float> expected = {0x1.0p+0f,       0x1.cda7f4p-6f,  0x1.a04328p-8f,
                                       0x1.775504p-10f, 0x1.526d2cp-12f, 0x1.31265p-14f,
                                       0x1.132518p-16f, 0x1.f02e5p-19f};
  EXPECT_EQ(inv, expected);
  EXPECT_NEAR(spec->rope_global.scaling.attention_factor, 1.2079441541679836, 1e-12);
}

// transformers' generate also stops at generation_config.json's eos ids (GPT-OSS lists three).
TEST(ModelSpecHf, GenerationConfigEosIdsJoinTheConfigs) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / fmt::format("kvp_gen_config_{}", ::getpid());
  std::filesystem::create_directories(dir);
  json config = json::parse(R"({"model_type": "gpt_oss", "vocab_size": 256, "hidden_size": 64,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 1024, "eos_token_id": 2})");
  std::ofstream(dir / "config.json") << config.dump();
  auto spec = load_hf_config((dir / "config.json").string());
  ASSERT_TRUE(spec.is_ok()) << spec.status().to_string();
  EXPECT_EQ(spec->eos_token_ids, std::vector<int32_t>{2});
  std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": [7, 2, 5]})";
  spec = load_hf_config((dir / "config.json").string());
  ASSERT_TRUE(spec.is_ok()) << spec.status().to_string();
  EXPECT_EQ(spec->eos_token_ids, (std::vector<int32_t>{2, 7, 5}));
  std::filesystem::remove_all(dir);
}

TEST(ModelSpec, ValidateRefusesNonFiniteScalesAndCaps) {
  auto spec = model_spec_from_hf_config(tiny_llama(), "config.json");
  ASSERT_TRUE(spec.is_ok());
  ModelSpec s = *spec;
  s.attn_logit_softcap = std::nanf("");
  EXPECT_NE(s.validate().message().find("attention logit softcap = nan"), std::string::npos)
      << s.validate().to_string();
  s = *spec;
  s.rope_local.theta = -1;
  EXPECT_NE(s.validate().message().find("local rope theta = -1 must be a finite number > 0"),
            std::string::npos)
      << s.validate().to_string();
  s = *spec;
  s.context_length = 8;
  EXPECT_FALSE(s.validate().is_ok());
}

}  // namespace
}  // namespace kvp

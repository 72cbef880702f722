// Tests of ModelConfig: from the real GGUF models, compared with the metadata gguf.GGUFReader
// reports (dumped by tests/model/dump_gguf_info.py); from Hugging Face config.json texts written
// here (the inputs are the expected values; the defaults are the ones transformers documents).
#include "model/model_config.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace kvp {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// GGUFReader's metadata of `model`, or nullopt (with a skip) when the model is absent.
std::optional<json> reader_metadata(const std::string& model) {
  if (!fs::exists(model)) return std::nullopt;
  std::string dir = (fs::temp_directory_path() / "kvp_cfg_test_XXXXXX").string();
  KVP_CHECK(mkdtemp(dir.data()) != nullptr, "mkdtemp failed");
  const std::string command = ".venv/bin/python tests/model/dump_gguf_info.py " + model + " " + dir;
  const int rc = std::system(command.c_str());
  std::optional<json> out;
  if (rc == 0) {
    std::ifstream in(fs::path(dir) / "info.json");
    out = json::parse(in);
  }
  fs::remove_all(dir);
  KVP_CHECK(rc == 0, "{} failed (run scripts/setup.sh)", command);
  return out;
}

uint64_t meta_u(const json& info, const std::string& key) {
  return info["metadata"][key]["value"].get<uint64_t>();
}
float meta_f(const json& info, const std::string& key) {
  return info["metadata"][key]["value"].get<float>();
}

TEST(ModelConfigGguf, SmolLM2MatchesReaderMetadata) {
  const std::string model = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  auto info = reader_metadata(model);
  if (!info) GTEST_SKIP() << model << " is absent: run scripts/fetch_models.sh";
  auto file = GgufFile::open(model);
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  auto c = model_config_from_gguf(*file);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->architecture, "llama");
  EXPECT_EQ(c->num_layers, meta_u(*info, "llama.block_count"));
  EXPECT_EQ(c->hidden_size, meta_u(*info, "llama.embedding_length"));
  EXPECT_EQ(c->intermediate_size, meta_u(*info, "llama.feed_forward_length"));
  EXPECT_EQ(c->num_heads, meta_u(*info, "llama.attention.head_count"));
  EXPECT_EQ(c->num_kv_heads, meta_u(*info, "llama.attention.head_count_kv"));
  // No key_length in this file: head_dim defaults to hidden / heads.
  EXPECT_FALSE(info->at("metadata").contains("llama.attention.key_length"));
  EXPECT_EQ(c->head_dim, c->hidden_size / c->num_heads);
  EXPECT_EQ(c->rope_dim, meta_u(*info, "llama.rope.dimension_count"));
  EXPECT_EQ(c->vocab_size, meta_u(*info, "llama.vocab_size"));
  EXPECT_EQ(c->context_length, meta_u(*info, "llama.context_length"));
  EXPECT_EQ(c->rms_norm_eps, meta_f(*info, "llama.attention.layer_norm_rms_epsilon"));
  EXPECT_EQ(c->rope_freq_base, meta_f(*info, "llama.rope.freq_base"));
  EXPECT_EQ(c->sliding_window, 0u);
  bool has_output = false;
  for (const auto& t : (*info)["tensors"]) has_output |= t["name"] == "output.weight";
  EXPECT_EQ(c->tied_embeddings, !has_output);
}

TEST(ModelConfigGguf, Gemma3MatchesReaderMetadata) {
  const std::string model = "models/gemma-3-270m-q4_k_m.gguf";
  auto info = reader_metadata(model);
  if (!info) GTEST_SKIP() << model << " is absent: run scripts/fetch_models.sh";
  auto file = GgufFile::open(model);
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  auto c = model_config_from_gguf(*file);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->architecture, "gemma3");
  EXPECT_EQ(c->num_layers, meta_u(*info, "gemma3.block_count"));
  EXPECT_EQ(c->hidden_size, meta_u(*info, "gemma3.embedding_length"));
  EXPECT_EQ(c->num_heads, meta_u(*info, "gemma3.attention.head_count"));
  EXPECT_EQ(c->num_kv_heads, meta_u(*info, "gemma3.attention.head_count_kv"));
  EXPECT_EQ(c->head_dim, meta_u(*info, "gemma3.attention.key_length"));
  EXPECT_EQ(c->value_head_dim, meta_u(*info, "gemma3.attention.value_length"));
  EXPECT_EQ(c->sliding_window, meta_u(*info, "gemma3.attention.sliding_window"));
  EXPECT_EQ(c->rope_freq_base, meta_f(*info, "gemma3.rope.freq_base"));
  // No gemma3.vocab_size: the tokenizer's token count.
  EXPECT_FALSE(info->at("metadata").contains("gemma3.vocab_size"));
  EXPECT_EQ(c->vocab_size, info->at("metadata")["tokenizer.ggml.tokens"]["count"].get<uint64_t>());
  EXPECT_EQ(c->rope_dim, c->head_dim);
  EXPECT_NE(c->describe().find("gemma3: 18 layers"), std::string::npos) << c->describe();
}

TEST(ModelConfigHf, ReadsFieldsAndDefaults) {
  const json qwen = json::parse(R"({
    "model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24,
    "intermediate_size": 4864, "num_attention_heads": 14, "num_key_value_heads": 2,
    "vocab_size": 151936, "max_position_embeddings": 32768, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "sliding_window": null, "tie_word_embeddings": true})");
  auto c = model_config_from_hf(qwen, "config.json");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->architecture, "qwen2");
  EXPECT_EQ(c->num_layers, 24u);
  EXPECT_EQ(c->head_dim, 64u);  // 896 / 14
  EXPECT_EQ(c->num_kv_heads, 2u);
  EXPECT_EQ(c->rms_norm_eps, 1e-6f);
  EXPECT_EQ(c->rope_freq_base, 1e6f);
  EXPECT_EQ(c->sliding_window, 0u);
  EXPECT_TRUE(c->tied_embeddings);

  const json minimal = json::parse(R"({"model_type": "llama", "hidden_size": 64,
    "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100, "head_dim": 32})");
  c = model_config_from_hf(minimal, "config.json");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->num_kv_heads, 4u);
  EXPECT_EQ(c->head_dim, 32u);
  EXPECT_EQ(c->rope_freq_base, 10000.0f);
  EXPECT_FALSE(c->tied_embeddings);

  // transformers 5's rope_parameters; Qwen3's head_dim default (Qwen3Config: 128)
  const json qwen3 = json::parse(R"({"model_type": "qwen3", "hidden_size": 64,
    "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}})");
  c = model_config_from_hf(qwen3, "config.json");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->head_dim, 128u);
  EXPECT_EQ(c->rope_freq_base, 1e6f);
  const json gemma3 = json::parse(R"({"model_type": "gemma3_text", "hidden_size": 64,
    "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100, "head_dim": 32,
    "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 500000.0},
                        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}})");
  c = model_config_from_hf(gemma3, "config.json");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->rope_freq_base, 5e5f);
}

TEST(ModelConfigHf, MissingWrongAndInconsistentFieldsNameTheProblem) {
  json j = json::parse(R"({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 6, "num_key_value_heads": 4, "vocab_size": 100})");
  auto c = model_config_from_hf(j, "dir/config.json");
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("6 attention heads are not a multiple of 4"),
            std::string::npos)
      << c.status().message();
  j["num_key_value_heads"] = 3;
  j.erase("vocab_size");
  c = model_config_from_hf(j, "dir/config.json");
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_NE(c.status().message().find("dir/config.json: 'vocab_size' not found"),
            std::string::npos);
  j["vocab_size"] = "many";
  c = model_config_from_hf(j, "dir/config.json");
  EXPECT_EQ(c.status().code(), StatusCode::kMismatch);
  EXPECT_NE(c.status().message().find("'vocab_size' is \"many\""), std::string::npos);
  j["vocab_size"] = -1;
  EXPECT_EQ(model_config_from_hf(j, "x").status().code(), StatusCode::kMismatch);
  EXPECT_EQ(model_config_from_hf(json::array(), "x").status().code(), StatusCode::kInvalidArgument);
}

// num_hidden_layers 2^31 and friends: refused where they are read, naming the limit.
TEST(ModelConfigHf, ValuesPastTheLimitsAreRefusedNamingTheLimit) {
  const json base = json::parse(R"({"model_type": "llama", "hidden_size": 64,
    "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100,
    "max_position_embeddings": 1024})");
  json j = base;
  j["num_hidden_layers"] = 2147483648u;
  auto c = model_config_from_hf(j, "config.json");
  EXPECT_EQ(c.status().code(), StatusCode::kUnsupported);
  EXPECT_EQ(c.status().message(),
            "config.json: 'num_hidden_layers' = 2147483648 is more than kvpool's limit of 4096 "
            "layers");
  j = base;
  j["vocab_size"] = 1u << 30;
  EXPECT_NE(model_config_from_hf(j, "config.json")
                .status()
                .message()
                .find("'vocab_size' = 1073741824 is more than kvpool's limit of 16777216 tokens"),
            std::string::npos);
  for (int context : {0, 7}) {
    j = base;
    j["max_position_embeddings"] = context;
    c = model_config_from_hf(j, "config.json");
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << context;
    EXPECT_NE(c.status().message().find("less than kvpool's smallest context of 16 tokens"),
              std::string::npos)
        << c.status().to_string();
  }
  for (const char* key : {"rope_theta", "rms_norm_eps"}) {
    for (double value : {std::nan(""), 0.0, -1.0, HUGE_VAL}) {
      j = base;
      j[key] = value;
      c = model_config_from_hf(j, "config.json");
      EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << key << " " << value;
      EXPECT_NE(c.status().message().find("must be a finite number > 0"), std::string::npos)
          << c.status().to_string();
    }
  }
}

TEST(InspectModelFile, DescribesGgufAndItsConfig) {
  const std::string model = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!fs::exists(model)) GTEST_SKIP() << model << " is absent: run scripts/fetch_models.sh";
  auto text = inspect_model_file(model, 3);
  ASSERT_TRUE(text.is_ok()) << text.status().to_string();
  EXPECT_NE(text->find("GGUF v3, llama, 272 tensors"), std::string::npos) << *text;
  EXPECT_NE(text->find("... 269 more"), std::string::npos);
  EXPECT_NE(text->find("config: llama: 30 layers, hidden 576"), std::string::npos) << *text;
}

TEST(InspectModelFile, ShowsTheExpertsOfMixtureOfExpertsModels) {
  auto text = inspect_model_file("tests/model/fixtures/tiny/qwen2_moe");
  ASSERT_TRUE(text.is_ok()) << text.status().to_string();
  EXPECT_NE(text->find("config: qwen2_moe: 3 layers"), std::string::npos) << *text;
  // parameter counts of transformers' model (matrices only; inactive: 4 of 6 experts in 2 layers)
  EXPECT_NE(text->find(", experts 6 (2 per token) x ffn 32, shared ffn 48 in 2 layers, matrix "
                       "parameters 174976 (125824 active per token)"),
            std::string::npos)
      << *text;
  text = inspect_model_file("tests/model/fixtures/tiny/qwen3_moe");
  ASSERT_TRUE(text.is_ok()) << text.status().to_string();
  EXPECT_NE(text->find("matrix parameters 131584 (107008 active per token)"), std::string::npos)
      << *text;
  // GPT-OSS: experts of intermediate_size in every layer (biases not counted)
  text = inspect_model_file("tests/model/fixtures/tiny/gpt_oss");
  ASSERT_TRUE(text.is_ok()) << text.status().to_string();
  EXPECT_NE(text->find(", experts 4 (2 per token) x ffn 32, shared ffn 0 in 4 layers, matrix "
                       "parameters 181248 (132096 active per token)"),
            std::string::npos)
      << *text;
  text = inspect_model_file("tests/model/fixtures/tiny/qwen3");
  ASSERT_TRUE(text.is_ok()) << text.status().to_string();
  EXPECT_EQ(text->find("experts"), std::string::npos) << *text;
}

TEST(InspectModelFile, MissingAndNonModelFilesAreErrors) {
  EXPECT_EQ(inspect_model_file("/nonexistent/x.gguf").status().code(), StatusCode::kNotFound);
  std::string dir = (fs::temp_directory_path() / "kvp_inspect_XXXXXX").string();
  KVP_CHECK(mkdtemp(dir.data()) != nullptr, "mkdtemp failed");
  const std::string text_file = dir + "/notes.txt";
  std::ofstream(text_file) << "hello, not a model";
  auto result = inspect_model_file(text_file);
  EXPECT_EQ(result.status().code(), StatusCode::kCorruption) << result.status().to_string();
  EXPECT_NE(result.status().message().find(text_file), std::string::npos);
  // an empty .gguf is a damaged GGUF file, not "safetensors"
  const std::string empty_gguf = dir + "/empty.gguf";
  std::ofstream(empty_gguf).close();
  result = inspect_model_file(empty_gguf);
  EXPECT_EQ(result.status().code(), StatusCode::kCorruption) << result.status().to_string();
  EXPECT_NE(result.status().message().find("gguf '" + empty_gguf +
                                           "': file is 0 bytes, too short for a GGUF header"),
            std::string::npos)
      << result.status().to_string();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kvp

// The GGUF model path: the tokenizer built from a GGUF file's metadata against Hugging Face
// `tokenizers` on the real models, and clear errors for GGUF files kvpool cannot run (another
// architecture, a missing tensor, a misshapen one, no tokenizer) and for paths that are no model.
#include "model/gguf_model.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>

#include "common/limits.h"
#include "model/model_loader.h"
#include "support/gguf_builder.h"
#include "support/hf_tokenizer_reference.h"
#include "tokenizer/detokenizer.h"

namespace kvp {
namespace {

namespace fs = std::filesystem;

// tokenizer.ggml.* read by kvpool → kvpool's tokenizer, against HF tokenizers built by the
// reference script from the same metadata (with the gguf package), on the corpus and 400 random
// texts: ids with and without special tokens, special-token text taken literally, decoding.
class GgufTokenizerParity : public ::testing::TestWithParam<std::pair<const char*, const char*>> {};

TEST_P(GgufTokenizerParity, MetadataTokenizerMatchesHf) {
  const auto [model_path, reference] = GetParam();
  std::string why_not;
  bool missing = false;
  const fs::path dir = test::tokenizer_reference_dir(&why_not, &missing);
  if (dir.empty() && missing) GTEST_SKIP() << why_not;
  ASSERT_FALSE(dir.empty()) << why_not;
  auto tok = load_tokenizer(model_path);
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  const auto cases = test::read_tokenizer_cases(dir / reference / "expected.jsonl");
  ASSERT_EQ(cases.size(), test::count_corpus_lines() + 1 + test::kNumRandomCases);
  int failures = 0;
  for (size_t i = 0; i < cases.size() && failures < 5; ++i) {
    const test::TokenizerCase& c = cases[i];
    SCOPED_TRACE(fmt::format("case {}: \"{}\"", i, c.text.substr(0, 80)));
    auto ids = tok->encode(c.text);
    auto plain = tok->encode(c.text, {.add_special_tokens = false});
    auto literal = tok->encode(c.text, {.parse_special = false});
    ASSERT_TRUE(ids.is_ok() && plain.is_ok() && literal.is_ok());
    auto decoded = tok->decode(c.ids_plain);
    ASSERT_TRUE(decoded.is_ok());
    const bool ok = *ids == c.ids && *plain == c.ids_plain && *literal == c.ids_literal &&
                    *decoded == c.decoded;
    EXPECT_TRUE(ok);
    failures += ok ? 0 : 1;
  }
}

INSTANTIATE_TEST_SUITE_P(
    RealModels, GgufTokenizerParity,
    ::testing::Values(std::make_pair("models/SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2"),
                      std::make_pair("models/gemma-3-270m-q4_k_m.gguf", "gemma3")),
    [](const auto& info) { return std::string(info.param.second); });

// A damaged variant of the tiny Llama fixture, written by tests/model/make_tiny_gguf.py.
class GgufModelErrors : public ::testing::Test {
 protected:
  std::string make(const std::string& name, const std::string& flags) {
    if (!fs::exists(test::kPython)) return "";
    const std::string out =
        (fs::temp_directory_path() / fmt::format("kvp_bad_{}_{}.gguf", name, ::getpid())).string();
    const std::string command =
        fmt::format("{} tests/model/make_tiny_gguf.py tests/model/fixtures/tiny/llama {} {}",
                    test::kPython, out, flags);
    if (std::system(command.c_str()) != 0) return "";
    made_.push_back(out);
    return out;
  }
  void TearDown() override {
    for (const std::string& f : made_) fs::remove(f);
  }
  std::vector<std::string> made_;
};

TEST_F(GgufModelErrors, EachDefectIsNamed) {
  if (!fs::exists(test::kPython)) GTEST_SKIP() << test::kPython << " not found (scripts/setup.sh)";
  struct Case {
    std::string name, flags;
    StatusCode code;
    std::string expect;
  };
  const Case cases[] = {
      {"arch", "--arch mamba", StatusCode::kUnsupported, "architecture 'mamba'"},
      {"drop", "--drop blk.1.ffn_up.weight", StatusCode::kNotFound, "blk.1.ffn_up.weight"},
      {"transpose", "--transpose blk.2.ffn_down.weight", StatusCode::kMismatch,
       "blk.2.ffn_down.weight"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = make(c.name, c.flags);
    ASSERT_FALSE(path.empty()) << "make_tiny_gguf.py failed";
    auto runner = load_model(path, nullptr);
    ASSERT_FALSE(runner.is_ok());
    EXPECT_EQ(runner.status().code(), c.code) << runner.status().to_string();
    EXPECT_NE(runner.status().message().find(c.expect), std::string::npos)
        << runner.status().to_string();
    EXPECT_NE(runner.status().message().find(path), std::string::npos)
        << "the error names the file: " << runner.status().to_string();
  }
  // a GGUF without tokenizer.ggml.* runs (the tiny model) but has no tokenizer
  const std::string plain = make("plain", "");
  ASSERT_FALSE(plain.empty());
  EXPECT_TRUE(load_model(plain, nullptr).is_ok());
  auto tok = load_tokenizer(plain);
  EXPECT_FALSE(tok.is_ok());
  EXPECT_NE(tok.status().message().find("tokenizer.ggml.model"), std::string::npos)
      << tok.status().to_string();
}

// A small Llama's metadata (no tensors: the spec needs none), with one key set to a bad value
// by `bad` (added after the good keys; the good key of the same name is left out).
Result<ModelSpec> spec_with(const std::function<void(test::GgufBuilder&)>& bad,
                            std::string_view bad_key) {
  test::GgufBuilder b;
  b.str("general.architecture", "llama");
  const std::pair<const char*, uint32_t> u32s[] = {{"llama.block_count", 2},
                                                   {"llama.embedding_length", 64},
                                                   {"llama.feed_forward_length", 128},
                                                   {"llama.attention.head_count", 4},
                                                   {"llama.attention.head_count_kv", 2},
                                                   {"llama.context_length", 1024},
                                                   {"llama.vocab_size", 256}};
  for (const auto& [key, value] : u32s) {
    if (key != bad_key) b.u32(key, value);
  }
  if (bad_key != "llama.rope.freq_base") b.f32("llama.rope.freq_base", 10000.0f);
  if (bad_key != "llama.attention.layer_norm_rms_epsilon") {
    b.f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  }
  bad(b);
  auto file = b.open("m.gguf");
  KVP_CHECK(file.is_ok(), "{}", file.status().to_string());
  return model_spec_from_gguf(*file);
}

TEST(GgufModelSpec, ReadsTheContextLength) {
  auto spec = spec_with([](test::GgufBuilder&) {}, "");
  ASSERT_TRUE(spec.is_ok()) << spec.status().to_string();
  EXPECT_EQ(spec->context_length, 1024);
  EXPECT_EQ(spec->num_layers, 2);
}

// block_count 0x80000000 was cast to int32 and went negative: an uncaught std::length_error.
TEST(GgufModelSpec, LayerCountsOf2To31AndMoreAreRefusedNamingTheLimit) {
  for (uint32_t layers : {0x80000000u, 0xFFFFFFFFu, 4097u}) {
    SCOPED_TRACE(layers);
    auto spec = spec_with([&](test::GgufBuilder& b) { b.u32("llama.block_count", layers); },
                          "llama.block_count");
    ASSERT_FALSE(spec.is_ok());
    EXPECT_EQ(spec.status().code(), StatusCode::kUnsupported);
    EXPECT_EQ(spec.status().message(),
              fmt::format("gguf 'm.gguf': 'llama.block_count' = {} is more than kvpool's limit of "
                          "4096 layers",
                          layers));
  }
  // every other dimension has its limit too
  auto spec = spec_with([](test::GgufBuilder& b) { b.u32("llama.embedding_length", 1u << 31); },
                        "llama.embedding_length");
  EXPECT_NE(spec.status().message().find("'llama.embedding_length' = 2147483648 is more than "
                                         "kvpool's limit of 131072 hidden units"),
            std::string::npos)
      << spec.status().to_string();
}

TEST(GgufModelSpec, ContextLengthsOutsideTheLimitsAreRefused) {
  for (uint32_t context : {0u, 7u, 15u}) {
    auto spec = spec_with([&](test::GgufBuilder& b) { b.u32("llama.context_length", context); },
                          "llama.context_length");
    EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument) << context;
    EXPECT_NE(spec.status().message().find(
                  fmt::format("'llama.context_length' = {} is less than kvpool's smallest "
                              "context of 16 tokens",
                              context)),
              std::string::npos)
        << spec.status().to_string();
  }
  auto spec = spec_with([](test::GgufBuilder& b) { b.u32("llama.context_length", 0xFFFFFFFFu); },
                        "llama.context_length");
  EXPECT_EQ(spec.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(spec.status().message().find("'llama.context_length' = 4294967295 is more than "
                                         "kvpool's limit of 67108864 tokens of context"),
            std::string::npos)
      << spec.status().to_string();
  // absent: unknown, no limit
  spec = spec_with([](test::GgufBuilder&) {}, "llama.context_length");
  ASSERT_TRUE(spec.is_ok()) << spec.status().to_string();
  EXPECT_EQ(spec->context_length, 0);
}

TEST(GgufModelSpec, NonFiniteOrNonPositiveRopeBaseAndEpsilonAreRefused) {
  const float bad_values[] = {std::nanf(""), INFINITY, 0.0f, -1.0f};
  for (const char* key : {"llama.rope.freq_base", "llama.attention.layer_norm_rms_epsilon"}) {
    for (float value : bad_values) {
      SCOPED_TRACE(fmt::format("{} = {}", key, value));
      auto spec = spec_with([&](test::GgufBuilder& b) { b.f32(key, value); }, key);
      ASSERT_FALSE(spec.is_ok());
      EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument);
      EXPECT_NE(spec.status().message().find(
                    fmt::format("'{}' = {} must be a finite number > 0", key, value)),
                std::string::npos)
          << spec.status().to_string();
    }
  }
}

TEST(GgufModelSpec, EndOfSequenceIdsOutsideTheVocabularyAreRefused) {
  auto spec =
      spec_with([](test::GgufBuilder& b) { b.u32("tokenizer.ggml.eos_token_id", 256); }, "");
  EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(spec.status().message().find("tokenizer.ggml.eos_token_id = 256 is outside the "
                                         "vocabulary of 256 tokens"),
            std::string::npos)
      << spec.status().to_string();
}

TEST(ModelLoader, PathsThatAreNoModelAreRefused) {
  auto missing = load_model("/nonexistent/model.gguf", nullptr);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nonexistent/model.gguf"), std::string::npos);

  const fs::path text = fs::temp_directory_path() / fmt::format("kvp_text_{}.txt", ::getpid());
  std::ofstream(text) << "not a model\n";
  auto not_model = load_model(text.string(), nullptr);
  EXPECT_EQ(not_model.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(not_model.status().message().find("is not a GGUF file (12 bytes)"), std::string::npos)
      << not_model.status().to_string();
  EXPECT_FALSE(is_gguf_file(text.string()));
  fs::remove(text);

  auto no_tokenizer = load_tokenizer("tests/model/fixtures/tiny/llama");
  EXPECT_EQ(no_tokenizer.status().code(), StatusCode::kNotFound);
}

// GgufWeights maps every Hugging Face name the model code asks for; Llama's and Gemma's
// post-attention norms differ.
TEST(GgufWeights, MapsHuggingFaceNames) {
  GgufWeights llama(nullptr, Architecture::kLlama);
  GgufWeights gemma(nullptr, Architecture::kGemma3);
  EXPECT_EQ(llama.gguf_name("model.embed_tokens.weight"), "token_embd.weight");
  EXPECT_EQ(llama.gguf_name("lm_head.weight"), "output.weight");
  EXPECT_EQ(llama.gguf_name("model.layers.12.self_attn.k_proj.bias"), "blk.12.attn_k.bias");
  EXPECT_EQ(llama.gguf_name("model.layers.0.post_attention_layernorm.weight"),
            "blk.0.ffn_norm.weight");
  EXPECT_EQ(gemma.gguf_name("model.layers.0.post_attention_layernorm.weight"),
            "blk.0.post_attention_norm.weight");
  EXPECT_EQ(gemma.gguf_name("model.layers.3.pre_feedforward_layernorm.weight"),
            "blk.3.ffn_norm.weight");
  EXPECT_EQ(llama.gguf_name("model.layers.x.mlp.up_proj.weight"), "");
  EXPECT_EQ(llama.gguf_name("model.layers.1.mlp.experts.weight"), "");
  GgufWeights moe(nullptr, Architecture::kQwen2Moe);
  EXPECT_EQ(moe.gguf_name("model.layers.4.mlp.gate.weight"), "blk.4.ffn_gate_inp.weight");
  EXPECT_EQ(moe.gguf_name("model.layers.4.mlp.experts.down_proj"), "blk.4.ffn_down_exps.weight");
  EXPECT_EQ(moe.gguf_name("model.layers.4.mlp.shared_expert.up_proj.weight"),
            "blk.4.ffn_up_shexp.weight");
  EXPECT_EQ(moe.gguf_name("model.layers.4.mlp.shared_expert_gate.weight"),
            "blk.4.ffn_gate_inp_shexp.weight");
}

}  // namespace
}  // namespace kvp

// CacheSpec: geometry from the published config.json of six real models (tests/cache/fixtures),
// cache groups, sizes and pool plans against numbers worked out by hand here from the published
// geometry, and every error path of the config parser.
#include "cache/cache_spec.h"

#include <gtest/gtest.h>

#include <string>

namespace kvp {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

CacheSpec load_fixture(const std::string& name, int32_t block_size = 16) {
  Result<CacheSpec> spec = CacheSpec::from_hf_config_file(
      "tests/cache/fixtures/" + name, CacheSpecOptions{.kv_dtype = {}, .block_size = block_size});
  EXPECT_TRUE(spec.is_ok()) << spec.status().to_string();
  return std::move(spec).value();
}

std::vector<int32_t> range_where(int32_t n, bool (*pred)(int32_t)) {
  std::vector<int32_t> out;
  for (int32_t i = 0; i < n; ++i) {
    if (pred(i)) out.push_back(i);
  }
  return out;
}

// ---- the six fixtures ----

TEST(CacheSpecFixtures, Llama31_8BIsOneGlobalGroup) {
  const CacheSpec spec = load_fixture("llama-3.1-8b.json");
  EXPECT_EQ(spec.architecture(), "llama");
  EXPECT_EQ(spec.num_layers(), 32);
  EXPECT_EQ(spec.num_kv_heads(), 8);
  EXPECT_EQ(spec.head_dim(), 4096 / 32);  // no head_dim: hidden / heads
  EXPECT_EQ(spec.dtype(), DType::BF16);   // torch_dtype
  ASSERT_EQ(spec.num_groups(), 1);
  EXPECT_FALSE(spec.group(0).attention.is_windowed());
  EXPECT_EQ(spec.group(0).layers.size(), 32u);
  EXPECT_EQ(spec.kv_bytes_per_token(), 2u * 32 * 8 * 128 * 2);  // 131072
  EXPECT_EQ(spec.kv_bytes_per_token(), 131072u);
  EXPECT_EQ(spec.block_bytes(0), 131072u * 16);
  EXPECT_EQ(spec.seq_bytes(8192), 131072u * 8192);  // 1 GiB per 8K agent
  EXPECT_EQ(spec.blocks_per_seq(0, 8192), 512);
  EXPECT_EQ(spec.blocks_per_seq(0, 8193), 513);
}

TEST(CacheSpecFixtures, Qwen25_7BHas28GlobalLayersNot48) {
  const CacheSpec spec = load_fixture("qwen2.5-7b.json");
  EXPECT_EQ(spec.architecture(), "qwen2");
  EXPECT_EQ(spec.num_layers(), 28);  // ADR-002 says 48
  EXPECT_EQ(spec.num_kv_heads(), 4);
  EXPECT_EQ(spec.head_dim(), 3584 / 28);
  // sliding_window is 131072 but use_sliding_window is false: every layer is global.
  ASSERT_EQ(spec.num_groups(), 1);
  EXPECT_FALSE(spec.group(0).attention.is_windowed());
  EXPECT_EQ(spec.kv_bytes_per_token(), 2u * 28 * 4 * 128 * 2);  // 57344
}

TEST(CacheSpecFixtures, Gemma3_12BNestedTextConfigWithDefaultHeadDimAndPattern) {
  const CacheSpec spec = load_fixture("gemma-3-12b.json", 256);
  EXPECT_EQ(spec.architecture(), "gemma3_text");
  EXPECT_EQ(spec.num_layers(), 48);
  EXPECT_EQ(spec.num_kv_heads(), 8);
  // Absent head_dim is Gemma3TextConfig's 256, not hidden / heads = 3840 / 16 = 240.
  EXPECT_EQ(spec.head_dim(), 256);
  ASSERT_EQ(spec.num_groups(), 2);
  // sliding_window_pattern absent: transformers' default 6, layer i global iff (i + 1) % 6 == 0.
  EXPECT_EQ(spec.group(0).attention, LayerAttention::global());
  EXPECT_EQ(spec.group(0).layers, range_where(48, [](int32_t i) { return (i + 1) % 6 == 0; }));
  EXPECT_EQ(spec.group(0).layers.size(), 8u);
  EXPECT_EQ(spec.group(1).attention, LayerAttention::sliding(1024));
  EXPECT_EQ(spec.group(1).layers, range_where(48, [](int32_t i) { return (i + 1) % 6 != 0; }));
  EXPECT_EQ(spec.group_of_layer(5), 0);
  EXPECT_EQ(spec.index_in_group(5), 0);
  EXPECT_EQ(spec.index_in_group(11), 1);
  EXPECT_EQ(spec.group_of_layer(6), 1);
  EXPECT_EQ(spec.index_in_group(6), 5);  // layers 0-4 come first

  EXPECT_EQ(spec.kv_bytes_per_token(), 2u * 48 * 8 * 256 * 2);  // 393216
  // One 256-token block: 2 (K, V) * 8 heads * 256 dims * 2 bytes * 256 tokens = 2 MiB a layer.
  EXPECT_EQ(spec.block_bytes(0), 8u * 2 * kMiB);
  EXPECT_EQ(spec.block_bytes(1), 40u * 2 * kMiB);
  // 8K context: global 8192 / 256 = 32 blocks; window 1024: ceil(1024 / 256) + 1 = 5 blocks.
  EXPECT_EQ(spec.blocks_per_seq(0, 8192), 32);
  EXPECT_EQ(spec.blocks_per_seq(1, 8192), 5);
  EXPECT_EQ(spec.blocks_per_seq(1, 700), 3);  // fewer tokens than the window: no cap yet
  EXPECT_EQ(spec.seq_bytes(8192), uint64_t{32 * 16 + 5 * 80} * kMiB);  // 912 MiB
  EXPECT_EQ(spec.kept_tokens(5, 8192), 8192);
  EXPECT_EQ(spec.kept_tokens(0, 8192), 1024);
  EXPECT_EQ(spec.kept_tokens(0, 100), 100);
}

TEST(CacheSpecFixtures, Gemma3_270MReadsLayerTypes) {
  const CacheSpec spec = load_fixture("gemma-3-270m.json");
  EXPECT_EQ(spec.num_layers(), 18);
  EXPECT_EQ(spec.num_kv_heads(), 1);
  EXPECT_EQ(spec.head_dim(), 256);
  ASSERT_EQ(spec.num_groups(), 2);
  EXPECT_EQ(spec.group(0).layers, (std::vector<int32_t>{5, 11, 17}));
  EXPECT_EQ(spec.group(1).attention, LayerAttention::sliding(512));
  EXPECT_EQ(spec.group(1).layers.size(), 15u);
  EXPECT_EQ(spec.kv_bytes_per_token(), 2u * 18 * 1 * 256 * 2);  // 18432
  // Block size 16: window 512 holds at most 512 / 16 + 1 = 33 blocks.
  EXPECT_EQ(spec.blocks_per_seq(1, 8192), 33);
  EXPECT_EQ(spec.block_bytes(1), 2u * 1 * 256 * 2 * 16 * 15);
}

TEST(CacheSpecFixtures, Qwen15MoEIgnoresExpertsAndWindow) {
  const CacheSpec spec = load_fixture("qwen1.5-moe-a2.7b.json");
  EXPECT_EQ(spec.architecture(), "qwen2_moe");
  EXPECT_EQ(spec.num_layers(), 24);
  EXPECT_EQ(spec.num_kv_heads(), 16);
  EXPECT_EQ(spec.head_dim(), 2048 / 16);
  ASSERT_EQ(spec.num_groups(), 1);
  EXPECT_EQ(spec.kv_bytes_per_token(), 2u * 24 * 16 * 128 * 2);  // 196608
}

TEST(CacheSpecFixtures, GptOss20BAlternatesSliding128AndFull) {
  const CacheSpec spec = load_fixture("gpt-oss-20b.json");
  EXPECT_EQ(spec.architecture(), "gpt_oss");
  EXPECT_EQ(spec.num_layers(), 24);
  EXPECT_EQ(spec.num_kv_heads(), 8);
  EXPECT_EQ(spec.head_dim(), 64);
  ASSERT_EQ(spec.num_groups(), 2);
  EXPECT_EQ(spec.group(0).layers, range_where(24, [](int32_t i) { return i % 2 == 1; }));
  EXPECT_EQ(spec.group(1).attention, LayerAttention::sliding(128));
  EXPECT_EQ(spec.group(1).layers, range_where(24, [](int32_t i) { return i % 2 == 0; }));
  EXPECT_EQ(spec.kv_bytes_per_token(), 2u * 24 * 8 * 64 * 2);  // 49152
  // Window 128 at block size 16: 128 / 16 + 1 = 9 blocks; at 256: one block plus one = 2.
  EXPECT_EQ(spec.blocks_per_seq(1, 8192), 9);
  EXPECT_EQ(spec.with_block_size(256).blocks_per_seq(1, 8192), 2);
  EXPECT_EQ(spec.with_block_size(256).blocks_per_seq(1, 100), 1);
}

// ---- pool planning ----

TEST(CacheSpecPlan, SplitsBudgetInProportionToNeedAtTargetContext) {
  const CacheSpec spec = load_fixture("gemma-3-12b.json", 256);
  // Need at 8K: global 32 blocks of 16 MiB = 512 MiB, window 5 blocks of 80 MiB = 400 MiB.
  // 4 GiB: global gets floor(4096 * 32 / 912) = 143 blocks, window floor(4096 * 5 / 912) = 22.
  const PoolPlan plan = spec.plan_pool(uint64_t{4096} * kMiB, 8192);
  EXPECT_EQ(plan.seq_bytes, uint64_t{912} * kMiB);
  EXPECT_EQ(plan.blocks_per_seq, (std::vector<int64_t>{32, 5}));
  EXPECT_EQ(plan.num_blocks, (std::vector<int32_t>{143, 22}));
  EXPECT_EQ(plan.pool_bytes, (std::vector<uint64_t>{143 * 16 * kMiB, 22 * 80 * kMiB}));
  EXPECT_EQ(plan.num_seqs, 4);  // min(143 / 32, 22 / 5)
  EXPECT_LE(plan.pool_bytes[0] + plan.pool_bytes[1], uint64_t{4096} * kMiB);
}

TEST(CacheSpecPlan, SingleGroupTakesTheWholeBudget) {
  const CacheSpec spec = load_fixture("llama-3.1-8b.json", 16);
  const PoolPlan plan = spec.plan_pool(uint64_t{4096} * kMiB, 8192);
  // 4 GiB / (131072 * 16 bytes a block) = 2048 blocks; 8K needs 512: 4 agents.
  EXPECT_EQ(plan.num_blocks, (std::vector<int32_t>{2048}));
  EXPECT_EQ(plan.num_seqs, 4);
  EXPECT_EQ(spec.plan_pool(uint64_t{1} << 20, 8192).num_seqs, 0);  // 1 MiB: not one agent
}

// ---- explicit construction ----

TEST(CacheSpecCreate, RejectsBadGeometry) {
  auto make = [](int32_t layers, int32_t heads, int32_t dim, int32_t block,
                 std::vector<LayerAttention> attn) {
    return CacheSpec::create("t", layers, heads, dim, DType::F32, block, std::move(attn));
  };
  const std::vector<LayerAttention> two(2);
  EXPECT_TRUE(make(2, 1, 4, 16, two).is_ok());
  EXPECT_EQ(make(0, 1, 4, 16, {}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(make(2, 0, 4, 16, two).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(make(2, 1, 0, 16, two).status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(make(2, 1, 4, 24, two).status().message().find("power of two"), std::string::npos);
  EXPECT_EQ(make(2, 1, 4, 2048, two).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(make(3, 1, 4, 16, two).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(
      make(2, 1, 4, 16, {LayerAttention::global(), LayerAttention::sliding(0)}).status().code(),
      StatusCode::kInvalidArgument);
}

TEST(CacheSpecCreate, GroupLayoutAndBlockSizeChange) {
  const CacheSpec spec = CacheSpec::create("t", 3, 2, 8, DType::F16, 4,
                                           {LayerAttention::sliding(6), LayerAttention::global(),
                                            LayerAttention::sliding(6)})
                             .value();
  const KvLayout layout = spec.group_layout(1, 10);
  EXPECT_EQ(layout, (KvLayout{.num_layers = 2,
                              .num_blocks = 10,
                              .num_kv_heads = 2,
                              .block_size = 4,
                              .head_dim = 8,
                              .dtype = DType::F16}));
  const CacheSpec wider = spec.with_block_size(64);
  EXPECT_EQ(wider.block_size(), 64);
  EXPECT_EQ(wider.groups(), spec.groups());
  EXPECT_TRUE(wider.same_geometry(spec));
  EXPECT_NE(wider, spec);
}

TEST(CacheSpecCreate, SameGeometrySaysWhatDiffers) {
  auto make = [](int32_t heads, DType t, int32_t window) {
    return CacheSpec::create("t", 2, heads, 8, t, 16,
                             {LayerAttention::global(), LayerAttention::sliding(window)})
        .value();
  };
  std::string why;
  EXPECT_TRUE(make(2, DType::F16, 8).same_geometry(make(2, DType::F16, 8), &why));
  EXPECT_FALSE(make(2, DType::F16, 8).same_geometry(make(4, DType::F16, 8), &why));
  EXPECT_EQ(why, "num_kv_heads 2 vs 4");
  EXPECT_FALSE(make(2, DType::F16, 8).same_geometry(make(2, DType::BF16, 8), &why));
  EXPECT_EQ(why, "dtype f16 vs bf16");
  EXPECT_FALSE(make(2, DType::F16, 8).same_geometry(make(2, DType::F16, 9), &why));
  EXPECT_EQ(why, "layer 1 attention window 8 vs window 9");
}

// ---- config parsing rules beyond the fixtures ----

Result<CacheSpec> parse(const std::string& text, CacheSpecOptions options = {}) {
  return CacheSpec::from_hf_config_text(text, "cfg.json", options);
}

TEST(CacheSpecConfig, KvHeadsDefaultToAttentionHeads) {
  const CacheSpec spec =
      parse(R"({"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4,
                "hidden_size": 64})")
          .value();
  EXPECT_EQ(spec.num_kv_heads(), 4);
  EXPECT_EQ(spec.head_dim(), 16);
  EXPECT_EQ(spec.dtype(), DType::BF16);  // no torch_dtype
}

TEST(CacheSpecConfig, Gemma3DefaultsFillOmittedHeads) {
  // google/gemma-3-4b-it's text_config names neither head count: transformers uses 8 and 4.
  const CacheSpec spec = parse(R"({"model_type": "gemma3", "text_config": {
      "hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
      "num_hidden_layers": 34, "sliding_window": 1024}, "torch_dtype": "bfloat16"})")
                             .value();
  EXPECT_EQ(spec.num_kv_heads(), 4);
  EXPECT_EQ(spec.head_dim(), 256);
  ASSERT_EQ(spec.num_groups(), 2);
  EXPECT_EQ(spec.group(0).layers.size(), 5u);  // 5, 11, 17, 23, 29
  EXPECT_EQ(spec.group(1).layers.size(), 29u);
}

TEST(CacheSpecConfig, ExplicitPatternAppliesToAnyModel) {
  const CacheSpec spec =
      parse(R"({"model_type": "x", "num_hidden_layers": 4, "num_attention_heads": 2,
                "head_dim": 8, "sliding_window": 32, "sliding_window_pattern": 2})")
          .value();
  EXPECT_EQ(spec.layer_attention(),
            (std::vector<LayerAttention>{LayerAttention::sliding(32), LayerAttention::global(),
                                         LayerAttention::sliding(32), LayerAttention::global()}));
}

TEST(CacheSpecConfig, QwenSlidingWindowAppliesFromMaxWindowLayers) {
  const CacheSpec spec =
      parse(R"({"model_type": "qwen2", "num_hidden_layers": 4, "num_attention_heads": 2,
                "hidden_size": 16, "sliding_window": 64, "use_sliding_window": true,
                "max_window_layers": 3})")
          .value();
  EXPECT_EQ(spec.layer_attention(),
            (std::vector<LayerAttention>{LayerAttention::global(), LayerAttention::global(),
                                         LayerAttention::global(), LayerAttention::sliding(64)}));
}

TEST(CacheSpecConfig, UseSlidingWindowFalseOverridesLayerTypes) {
  const CacheSpec spec =
      parse(R"({"model_type": "qwen3", "num_hidden_layers": 2, "num_attention_heads": 2,
                "head_dim": 8, "sliding_window": 64, "use_sliding_window": false,
                "layer_types": ["full_attention", "sliding_attention"]})")
          .value();
  ASSERT_EQ(spec.num_groups(), 1);
  EXPECT_EQ(spec.group(0).attention, LayerAttention::global());
}

TEST(CacheSpecConfig, MistralStyleWindowCoversEveryLayerAndNullMeansNone) {
  const CacheSpec all =
      parse(R"({"model_type": "mistral", "num_hidden_layers": 3, "num_attention_heads": 4,
                "num_key_value_heads": 2, "hidden_size": 32, "sliding_window": 4096})")
          .value();
  ASSERT_EQ(all.num_groups(), 1);
  EXPECT_EQ(all.group(0).attention, LayerAttention::sliding(4096));
  const CacheSpec none =
      parse(R"({"model_type": "mistral", "num_hidden_layers": 3, "num_attention_heads": 4,
                "hidden_size": 32, "sliding_window": null})")
          .value();
  EXPECT_EQ(none.group(0).attention, LayerAttention::global());
}

TEST(CacheSpecConfig, DtypeFromConfigOrOptions) {
  const std::string text = R"({"model_type": "llama", "num_hidden_layers": 2,
      "num_attention_heads": 2, "hidden_size": 8, "torch_dtype": "float32"})";
  EXPECT_EQ(parse(text).value().dtype(), DType::F32);
  EXPECT_EQ(parse(text).value().kv_bytes_per_token(), 2u * 2 * 2 * 4 * 4);
  EXPECT_EQ(parse(text, {.kv_dtype = DType::F16}).value().dtype(), DType::F16);
  EXPECT_EQ(parse(text, {.kv_dtype = {}, .block_size = 128}).value().block_size(), 128);
}

// ---- errors name the file, the field and the reason ----

void expect_error(const Result<CacheSpec>& r, StatusCode code, const std::string& field,
                  const std::string& reason) {
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), code) << r.status().to_string();
  EXPECT_NE(r.status().message().find("'cfg.json'"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("'" + field + "'"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find(reason), std::string::npos) << r.status().message();
}

constexpr StatusCode kBad = StatusCode::kInvalidArgument;

TEST(CacheSpecConfigErrors, MissingOrMistypedCounts) {
  expect_error(parse(R"({"model_type": "llama", "num_attention_heads": 2, "hidden_size": 8})"),
               kBad, "num_hidden_layers", "missing");
  expect_error(parse(R"({"model_type": "llama", "num_hidden_layers": "32",
                         "num_attention_heads": 2, "hidden_size": 8})"),
               kBad, "num_hidden_layers", "must be an integer");
  expect_error(parse(R"({"model_type": "llama", "num_hidden_layers": 2.5,
                         "num_attention_heads": 2, "hidden_size": 8})"),
               kBad, "num_hidden_layers", "must be an integer");
  expect_error(parse(R"({"model_type": "llama", "num_hidden_layers": 0,
                         "num_attention_heads": 2, "hidden_size": 8})"),
               kBad, "num_hidden_layers", "got 0");
  expect_error(parse(R"({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 8})"), kBad,
               "num_attention_heads", "missing");
  expect_error(parse(R"({"model_type": "llama", "num_hidden_layers": 2,
                         "num_attention_heads": 2, "num_key_value_heads": -1,
                         "hidden_size": 8})"),
               kBad, "num_key_value_heads", "got -1");
  expect_error(parse(R"({"model_type": "llama", "num_hidden_layers": 2,
                         "num_attention_heads": 6, "num_key_value_heads": 4,
                         "hidden_size": 48})"),
               kBad, "num_key_value_heads", "does not divide");
  expect_error(parse(R"({"model_type": "llama", "num_hidden_layers": 2,
                         "num_attention_heads": 2, "hidden_size": 18446744073709551615})"),
               kBad, "hidden_size", "must be between");
}

TEST(CacheSpecConfigErrors, HeadDimUnderivable) {
  expect_error(parse(R"({"model_type": "llama", "num_hidden_layers": 2,
                         "num_attention_heads": 3})"),
               kBad, "hidden_size", "missing");
  expect_error(parse(R"({"model_type": "llama", "num_hidden_layers": 2,
                         "num_attention_heads": 3, "hidden_size": 10})"),
               kBad, "hidden_size", "not a multiple");
  expect_error(parse(R"({"model_type": "llama", "num_hidden_layers": 2,
                         "num_attention_heads": 2, "head_dim": 0})"),
               kBad, "head_dim", "got 0");
}

TEST(CacheSpecConfigErrors, NestingAndModelType) {
  expect_error(parse(R"({"model_type": "gemma3", "text_config": [1, 2]})"), kBad, "text_config",
               "must be an object");
  expect_error(parse(R"({"model_type": "gemma3", "text_config": {"model_type": "gemma3_text"}})"),
               kBad, "text_config.num_hidden_layers", "missing");
  expect_error(parse(R"({"num_hidden_layers": 2})"), kBad, "model_type", "missing");
  expect_error(parse(R"({"model_type": 7})"), kBad, "model_type", "must be a string");
  // architectures[0] names a config without model_type.
  EXPECT_EQ(parse(R"({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1,
                      "num_attention_heads": 1, "hidden_size": 4})")
                .value()
                .architecture(),
            "LlamaForCausalLM");
  const Result<CacheSpec> not_object = parse("[1]");
  EXPECT_EQ(not_object.status().code(), kBad);
  EXPECT_NE(not_object.status().message().find("not a JSON object"), std::string::npos);
}

TEST(CacheSpecConfigErrors, LayerTypes) {
  const std::string base = R"({"model_type": "x", "num_hidden_layers": 2,
      "num_attention_heads": 2, "head_dim": 8, )";
  expect_error(parse(base + R"("layer_types": ["full_attention"]})"), kBad, "layer_types",
               "has 1 entries for 2 layers");
  expect_error(parse(base + R"("layer_types": "full_attention"})"), kBad, "layer_types",
               "must be a list");
  expect_error(parse(base + R"("layer_types": ["full_attention", 3]})"), kBad, "layer_types[1]",
               "must be a string");
  expect_error(parse(base + R"("layer_types": ["full_attention", "linear_attention"]})"),
               StatusCode::kUnsupported, "layer_types[1]", "'linear_attention' is not supported");
  expect_error(parse(base + R"("layer_types": ["full_attention", "sliding_attention"]})"), kBad,
               "sliding_window", "missing");
  expect_error(parse(base + R"("layer_types": ["full_attention", "sliding_attention"],
                               "sliding_window": 0})"),
               kBad, "sliding_window", "got 0");
  expect_error(parse(base + R"("sliding_window": 8, "sliding_window_pattern": 0})"), kBad,
               "sliding_window_pattern", "got 0");
  expect_error(parse(base + R"("sliding_window": 8, "use_sliding_window": "no"})"), kBad,
               "use_sliding_window", "must be true or false");
}

TEST(CacheSpecConfigErrors, DtypeAndBlockSize) {
  const std::string text = R"({"model_type": "llama", "num_hidden_layers": 2,
      "num_attention_heads": 2, "hidden_size": 8, "torch_dtype": "float8_e4m3fn"})";
  expect_error(parse(text), StatusCode::kUnsupported, "torch_dtype", "'float8_e4m3fn'");
  EXPECT_TRUE(parse(text, {.kv_dtype = DType::BF16}).is_ok());  // the option wins
  const Result<CacheSpec> r = parse(R"({"model_type": "llama", "num_hidden_layers": 2,
      "num_attention_heads": 2, "hidden_size": 8})",
                                    {.kv_dtype = {}, .block_size = 3});
  EXPECT_EQ(r.status().code(), kBad);
  EXPECT_NE(r.status().message().find("block size"), std::string::npos);
}

TEST(CacheSpecConfigErrors, FilesAndJson) {
  const Result<CacheSpec> missing =
      CacheSpec::from_hf_config_file("tests/cache/fixtures/nope.json");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("nope.json"), std::string::npos);
  const Result<CacheSpec> broken = parse(R"({"model_type": "llama", )");
  EXPECT_EQ(broken.status().code(), StatusCode::kCorruption);
  EXPECT_NE(broken.status().message().find("'cfg.json': not valid JSON"), std::string::npos);
}

}  // namespace
}  // namespace kvp

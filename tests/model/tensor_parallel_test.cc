// Tensor parallelism's CPU emulation (model/tensor_parallel.h): the model split over N ranks on
// threads, partial outputs summed, must compute what the unsplit ModelRunner computes — on the
// tiny transformers-made models (llama, qwen2, gemma3 with its sliding layers and sandwich
// norms) and a random model with 4 kv heads for N = 4. Also: each rank's weights are exactly its
// rows or columns of the file's tensors, block images are the whole model's (a pool written at
// N = 2 reads back at N = 1 and the reverse), and bad sizes are refused without a hang.
#include "model/tensor_parallel.h"
#include "support/tensor_check.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "model/cpu_forward_backend.h"
#include "model/model_loader.h"
#include "model/random_model.h"

namespace kvp {
namespace {

using kvp::testing::argmax;
using kvp::testing::relative_error;

constexpr int32_t kBlockSize = 4;
constexpr int32_t kNumBlocks = 32;

OpenedModel open_tiny(const std::string& name) {
  auto model = open_model("tests/model/fixtures/tiny/" + name);
  KVP_CHECK(model.is_ok(), "{}", model.status().to_string());
  return std::move(model).value();
}

std::vector<KvLayout> layouts_of(const ForwardBackend& backend) {
  std::vector<KvLayout> layouts;
  for (int32_t g = 0; g < backend.num_cache_groups(); ++g) {
    layouts.push_back(backend.group_layout(g, kNumBlocks, kBlockSize, DType::F32));
  }
  return layouts;
}

// The unsplit model: ModelRunner over the same source, f32 products (as the split ranks' sliced
// matrices are f32).
std::unique_ptr<ForwardBackend> unsplit(const ModelSpec& spec, const WeightSource& source) {
  auto weights = load_model_weights(spec, source);
  KVP_CHECK(weights.is_ok(), "{}", weights.status().to_string());
  auto runner = std::make_shared<ModelRunner>(spec, std::move(weights).value(), nullptr);
  runner->set_act_precision(quant::ActPrecision::kF32);
  return std::make_unique<CpuForwardBackend>(std::move(runner));
}

std::unique_ptr<ForwardBackend> split(const ModelSpec& spec, const WeightSource& source,
                                      int32_t n) {
  auto backend = make_cpu_tensor_parallel_backend(spec, source, n);
  KVP_CHECK(backend.is_ok(), "{}", backend.status().to_string());
  auto& tp = static_cast<TensorParallelBackend&>(*backend.value());
  for (int32_t r = 0; r < n; ++r) {
    static_cast<CpuForwardBackend&>(tp.rank(r))
        .runner()
        .set_act_precision(quant::ActPrecision::kF32);
  }
  return std::move(backend).value();
}

// Sequences that each own a run of blocks: seq s uses blocks s * 8 … s * 8 + 7.
struct Sequences {
  std::vector<std::vector<int32_t>> tokens;  // every token fed so far, per sequence
  int32_t num_groups = 1;

  // One step: seq s brings new[s] (all of them new tokens), logits of each last row.
  ForwardBatch batch(const std::vector<std::vector<int32_t>>& fresh) {
    token_ids_.clear();
    query_start_ = {0};
    kv_lens_.clear();
    slots_.clear();
    tables_.clear();
    logit_rows_.clear();
    for (size_t s = 0; s < fresh.size(); ++s) {
      for (int32_t t : fresh[s]) {
        const int64_t pos = static_cast<int64_t>(tokens[s].size());
        tokens[s].push_back(t);
        token_ids_.push_back(t);
        slots_.push_back((static_cast<int64_t>(s) * 8 + pos / kBlockSize) * kBlockSize +
                         pos % kBlockSize);
      }
      query_start_.push_back(static_cast<int32_t>(token_ids_.size()));
      kv_lens_.push_back(static_cast<int32_t>(tokens[s].size()));
      for (int32_t b = 0; b < 8; ++b) tables_.push_back(static_cast<int32_t>(s) * 8 + b);
      logit_rows_.push_back(query_start_.back() - 1);
    }
    ForwardBatch b;
    b.token_ids = token_ids_;
    b.query_start = query_start_;
    b.kv_lens = kv_lens_;
    for (int32_t g = 0; g < num_groups; ++g) b.groups.push_back({slots_, tables_, 8});
    b.logit_rows = logit_rows_;
    return b;
  }

 private:
  std::vector<int32_t> token_ids_, query_start_, kv_lens_, tables_, logit_rows_;
  std::vector<int64_t> slots_;
};

float max_abs(std::span<const float> v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::abs(x));
  return m;
}

// Prompts (chunked: 5 then 4 tokens, and 7 tokens) then 12 greedy steps of two sequences on the
// unsplit and the split backend; logits agree within `tol` of the logits' scale, greedy tokens
// are equal, and the pools hold the same K and V.
void expect_split_equals_unsplit(const ModelSpec& spec, const WeightSource& source, int32_t n) {
  SCOPED_TRACE(::testing::Message() << "tensor parallel " << n);
  std::unique_ptr<ForwardBackend> one = unsplit(spec, source);
  std::unique_ptr<ForwardBackend> many = split(spec, source, n);
  ASSERT_EQ(many->num_cache_groups(), one->num_cache_groups());
  const std::vector<KvLayout> layouts = layouts_of(*one);
  ASSERT_EQ(layouts_of(*many), layouts) << "the split backend's layouts are the whole model's";
  ASSERT_TRUE(one->allocate_kv(layouts).is_ok());
  ASSERT_TRUE(many->allocate_kv(layouts).is_ok());

  const int32_t vocab = spec.vocab_size;
  Sequences a, b;
  a.tokens.resize(2);
  b.tokens.resize(2);
  a.num_groups = b.num_groups = one->num_cache_groups();
  std::vector<std::vector<int32_t>> fresh = {{3, 17, 5, 29, 11}, {7, 2, 19, 23, 31, 13, 4}};
  std::vector<float> expected(2 * vocab), logits(2 * vocab);
  for (int32_t step = 0; step < 14; ++step) {
    if (step == 1) fresh = {{8, 6, 40, 12}, {}};  // the second chunk of sequence 0's prompt
    std::vector<std::vector<int32_t>> now = fresh;
    if (now[1].empty()) now.pop_back();
    const size_t rows = now.size();
    ASSERT_TRUE(one->forward(a.batch(now), std::span(expected).first(rows * vocab)).is_ok());
    ASSERT_TRUE(many->forward(b.batch(now), std::span(logits).first(rows * vocab)).is_ok());
    for (size_t r = 0; r < rows; ++r) {
      const auto want = std::span<const float>(expected).subspan(r * vocab, vocab);
      const auto got = std::span<const float>(logits).subspan(r * vocab, vocab);
      float diff = 0;
      for (int32_t i = 0; i < vocab; ++i) diff = std::max(diff, std::abs(want[i] - got[i]));
      EXPECT_LE(diff, 1e-4f * std::max(1.0f, max_abs(want))) << "step " << step << " row " << r;
      EXPECT_EQ(argmax(got), argmax(want)) << "step " << step << " row " << r;
    }
    fresh = {{argmax(std::span<const float>(expected).first(vocab))},
             {argmax(std::span<const float>(expected).subspan(vocab, vocab))}};
  }
  // the same K and V in both pools, read as the whole model's block images
  for (int32_t g = 0; g < one->num_cache_groups(); ++g) {
    std::vector<BlockId> blocks;
    for (int32_t blk = 0; blk < kNumBlocks; ++blk) blocks.push_back(BlockId{blk});
    const size_t bytes = blocks.size() * layouts[g].block_size_bytes();
    std::vector<float> want(bytes / 4), got(bytes / 4);
    ASSERT_TRUE(one->read_blocks(g, blocks, std::as_writable_bytes(std::span(want))).is_ok());
    ASSERT_TRUE(many->read_blocks(g, blocks, std::as_writable_bytes(std::span(got))).is_ok());
    float diff = 0;
    for (size_t i = 0; i < want.size(); ++i) diff = std::max(diff, std::abs(want[i] - got[i]));
    EXPECT_LE(diff, 1e-4f * std::max(1.0f, max_abs(want))) << "group " << g;
    EXPECT_GT(max_abs(want), 0.0f) << "group " << g << ": nothing was written";
  }
}

TEST(TensorParallel, TinyModelsSplitInTwoComputeWhatTheUnsplitRunnerComputes) {
  for (const char* name : {"llama", "qwen2", "gemma3", "qwen3"}) {
    SCOPED_TRACE(name);
    const OpenedModel model = open_tiny(name);
    expect_split_equals_unsplit(model.spec, *model.weights, 2);
  }
}

TEST(TensorParallel, FourRanksComputeWhatTheUnsplitRunnerComputes) {
  // The tiny models have 2 kv heads: a llama-shaped random model with 8 heads, 4 kv heads
  ModelSpec spec = open_tiny("llama").spec;
  spec.num_q_heads = 8;
  spec.num_kv_heads = 4;
  spec.intermediate_size = 96;
  const RandomWeightSource source(spec, 7);
  expect_split_equals_unsplit(spec, source, 4);
  expect_split_equals_unsplit(spec, source, 2);
}

TEST(TensorParallel, EachRankHoldsItsRowsOrColumnsOfTheFilesTensors) {
  const OpenedModel model = open_tiny("qwen2");  // q/k/v biases too
  const ModelSpec& spec = model.spec;
  const int64_t hidden = spec.hidden_size, hd = spec.head_dim;
  const int64_t q_dim = spec.num_q_heads * hd, kv_dim = spec.num_kv_heads * hd;
  const int64_t inter = spec.intermediate_size;
  struct Case {
    std::string name;
    std::vector<int64_t> shape;  // whole
    int split_dim;               // -1: whole on every rank
  };
  const std::string p = "model.layers.1.";
  const std::vector<Case> cases = {
      {p + "self_attn.q_proj.weight", {q_dim, hidden}, 0},
      {p + "self_attn.k_proj.weight", {kv_dim, hidden}, 0},
      {p + "self_attn.v_proj.bias", {kv_dim}, 0},
      {p + "self_attn.o_proj.weight", {hidden, q_dim}, 1},
      {p + "mlp.gate_proj.weight", {inter, hidden}, 0},
      {p + "mlp.up_proj.weight", {inter, hidden}, 0},
      {p + "mlp.down_proj.weight", {hidden, inter}, 1},
      {p + "input_layernorm.weight", {hidden}, -1},
      {"model.embed_tokens.weight", {spec.vocab_size, hidden}, -1},
  };
  constexpr int32_t n = 2;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto whole = model.weights->read_f32(c.name, c.shape);
    ASSERT_TRUE(whole.is_ok()) << whole.status().to_string();
    const int64_t cols = c.shape.size() == 2 ? c.shape[1] : 1;
    for (int32_t r = 0; r < n; ++r) {
      std::vector<int64_t> shape = c.shape;
      if (c.split_dim >= 0) shape[c.split_dim] /= n;
      const ShardedWeightSource sharded(*model.weights, spec, {r, n});
      auto mine = sharded.read_f32(c.name, shape);
      ASSERT_TRUE(mine.is_ok()) << mine.status().to_string();
      const int64_t my_cols = shape.size() == 2 ? shape[1] : 1;
      ASSERT_EQ(mine->size(), static_cast<size_t>(shape[0] * my_cols));
      for (int64_t i = 0; i < shape[0]; ++i) {
        for (int64_t j = 0; j < my_cols; ++j) {
          const int64_t row = c.split_dim == 0 ? r * shape[0] + i : i;
          const int64_t col = c.split_dim == 1 ? r * my_cols + j : j;
          ASSERT_EQ((*mine)[i * my_cols + j], (*whole)[row * cols + col])
              << "rank " << r << " at " << i << ", " << j;
        }
      }
      // a matrix read as the runner reads it has the same values
      if (shape.size() == 2) {
        auto matrix = sharded.read_matrix(c.name, shape[0], shape[1]);
        ASSERT_TRUE(matrix.is_ok()) << matrix.status().to_string();
        EXPECT_EQ(matrix->matrix.rows, shape[0]);
        EXPECT_EQ(matrix->matrix.cols, shape[1]);
      }
    }
    // asking a rank for the whole tensor of a split one is an error, not a silent slice
    if (c.split_dim >= 0) {
      const ShardedWeightSource sharded(*model.weights, spec, {1, n});
      EXPECT_EQ(sharded.read_f32(c.name, c.shape).status().code(), StatusCode::kMismatch);
    }
  }
}

TEST(TensorParallel, BlockImagesAreTheWholeModelsAtAnyRankCount) {
  const OpenedModel model = open_tiny("gemma3");  // two cache groups
  std::unique_ptr<ForwardBackend> one = unsplit(model.spec, *model.weights);
  std::unique_ptr<ForwardBackend> many = split(model.spec, *model.weights, 2);
  const std::vector<KvLayout> layouts = layouts_of(*one);
  ASSERT_TRUE(one->allocate_kv(layouts).is_ok());
  ASSERT_TRUE(many->allocate_kv(layouts).is_ok());
  // KV written by the unsplit model (a cache file's content), moved into the split one and back
  Sequences seqs;
  seqs.tokens.resize(1);
  seqs.num_groups = one->num_cache_groups();
  std::vector<float> logits(model.spec.vocab_size), expected(model.spec.vocab_size);
  ASSERT_TRUE(one->forward(seqs.batch({{4, 8, 15, 16, 23, 42}}), logits).is_ok());
  const std::vector<BlockId> blocks = {BlockId{1}, BlockId{0}, BlockId{5}};  // any order
  for (int32_t g = 0; g < one->num_cache_groups(); ++g) {
    std::vector<std::byte> image(blocks.size() * layouts[g].block_size_bytes());
    std::vector<std::byte> back(image.size());
    ASSERT_TRUE(one->read_blocks(g, blocks, image).is_ok());
    ASSERT_TRUE(many->write_blocks(g, blocks, image).is_ok());
    ASSERT_TRUE(many->read_blocks(g, blocks, back).is_ok());
    EXPECT_EQ(0, std::memcmp(image.data(), back.data(), image.size())) << "group " << g;
    // each rank holds its kv heads of the image: rank 1's pool has the second half of each run
    auto& tp = static_cast<TensorParallelBackend&>(*many);
    std::vector<std::byte> rank_image(image.size() / 2);
    ASSERT_TRUE(tp.rank(1).read_blocks(g, blocks, rank_image).is_ok());
    const size_t half = static_cast<size_t>(layouts[g].block_stride() / 2) * 4;
    for (size_t run = 0; run < rank_image.size() / half; ++run) {
      EXPECT_EQ(0, std::memcmp(rank_image.data() + run * half, image.data() + run * 2 * half + half,
                               half))
          << "group " << g << " run " << run;
    }
  }
  // the split model continues the sequence from the moved KV as the unsplit one does
  Sequences a = seqs, b = seqs;
  ASSERT_TRUE(one->forward(a.batch({{7}}), expected).is_ok());
  ASSERT_TRUE(many->forward(b.batch({{7}}), logits).is_ok());
  float diff = 0;
  for (size_t i = 0; i < logits.size(); ++i)
    diff = std::max(diff, std::abs(logits[i] - expected[i]));
  EXPECT_LE(diff, 1e-4f * std::max(1.0f, max_abs(expected)));
}

// Experts are not split: a mixture-of-experts model over more than one rank is refused (the CPU
// and CUDA split backends both check this first), naming the architecture.
TEST(TensorParallel, MixtureOfExpertsModelsAreRefused) {
  for (const char* name : {"qwen2_moe", "qwen3_moe"}) {
    const OpenedModel model = open_tiny(name);
    const Status st = check_tensor_parallel(model.spec, 2);
    EXPECT_EQ(st.code(), StatusCode::kUnsupported) << name;
    EXPECT_NE(st.message().find(name), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("experts"), std::string::npos) << st.message();
    EXPECT_TRUE(check_tensor_parallel(model.spec, 1).is_ok()) << name;
  }
}

TEST(TensorParallel, SizesThatDoNotSplitAndBadBatchesAreRefused) {
  const OpenedModel model = open_tiny("llama");  // 4 heads, 2 kv heads, intermediate 160
  for (int32_t n : {0, 3, 4, 9}) {
    const Status st = check_tensor_parallel(model.spec, n);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << n;
    EXPECT_NE(st.message().find("tensor parallel"), std::string::npos) << st.message();
  }
  EXPECT_EQ(make_cpu_tensor_parallel_backend(model.spec, *model.weights, 4).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(check_tensor_parallel(model.spec, 2).is_ok());

  std::unique_ptr<ForwardBackend> many = split(model.spec, *model.weights, 2);
  ASSERT_TRUE(many->allocate_kv(layouts_of(*many)).is_ok());
  Sequences seqs;
  seqs.tokens.resize(1);
  std::vector<float> logits(model.spec.vocab_size);
  // a token outside the vocabulary: every rank refuses it before any all-reduce (no hang)
  EXPECT_EQ(many->forward(seqs.batch({{model.spec.vocab_size}}), logits).code(),
            StatusCode::kInvalidArgument);
  seqs.tokens[0].clear();
  // logits of the wrong size: refused before any rank starts
  std::vector<float> short_logits(model.spec.vocab_size - 1);
  EXPECT_EQ(many->forward(seqs.batch({{1}}), short_logits).code(), StatusCode::kInvalidArgument);
  seqs.tokens[0].clear();
  // and the backend still serves
  EXPECT_TRUE(many->forward(seqs.batch({{1, 2}}), logits).is_ok());
  // images of the wrong size
  std::vector<std::byte> image(7);
  EXPECT_EQ(many->read_blocks(0, std::vector<BlockId>{BlockId{0}}, image).code(),
            StatusCode::kInvalidArgument);
}

TEST(TensorParallel, RankGateTellsEveryRankWhetherAllAreReadyAndAbortReleasesWaiters) {
  RankGate gate(2);
  for (const std::pair<bool, bool>& readiness : {std::pair{true, true}, std::pair{true, false},
                                                 std::pair{false, false}, std::pair{true, true}}) {
    const bool a = readiness.first, b = readiness.second;
    bool got_b = false;
    std::thread other([&] { got_b = gate.arrive(b); });
    const bool got_a = gate.arrive(a);
    other.join();
    EXPECT_EQ(got_a, a && b);
    EXPECT_EQ(got_b, a && b);
  }
  // a rank waiting for one that failed is released by abort, and the gate stays closed
  bool waited = true;
  std::thread waiter([&] { waited = gate.arrive(true); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  gate.abort();
  waiter.join();
  EXPECT_FALSE(waited);
  EXPECT_FALSE(gate.arrive(true));
}

}  // namespace
}  // namespace kvp

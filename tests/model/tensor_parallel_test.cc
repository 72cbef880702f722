// Tensor parallelism's CPU emulation (model/tensor_parallel.h): the model split over N ranks on
// threads, partial outputs summed, must compute what the unsplit ModelRunner computes — on the
// tiny transformers-made models (llama, qwen2, gemma3 with its sliding layers and sandwich
// norms; qwen3_moe, qwen2_moe and gpt_oss with their experts split) and random models with 4 kv
// heads for N = 4. Also: each rank's weights are exactly its
// rows or columns of the file's tensors, block images are the whole model's (a pool written at
// N = 2 reads back at N = 1 and the reverse), and bad sizes are refused without a hang.
#include "model/tensor_parallel.h"
#include "support/tensor_check.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <thread>

#include <fmt/format.h>
#include <unistd.h>

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
      {"lm_head.weight", {spec.vocab_size, hidden}, 0},  // qwen2's is untied
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

// Each rank computes the logits of its share of the vocabulary where the ranks divide it (with
// those rows of the lm-head, or of a tied embedding); the backend joins them. Where they do not
// divide it, every rank keeps the whole head.
TEST(TensorParallel, RanksComputeTheirVocabularySharesOfTheLogits) {
  const ModelSpec spec = open_tiny("qwen2").spec;  // vocabulary 256
  for (int32_t r = 0; r < 2; ++r) {
    const ModelSpec local = shard_spec(spec, {r, 2});
    EXPECT_EQ(local.vocab_size, 256);  // the embedding stays whole
    EXPECT_EQ(local.logit_begin, 128 * r);
    EXPECT_EQ(local.logit_count, 128);
    EXPECT_EQ(local.logits_per_row(), 128);
  }
  ModelSpec odd = spec;
  odd.vocab_size = 255;
  EXPECT_EQ(shard_spec(odd, {1, 2}).logit_count, 0);
  EXPECT_EQ(shard_spec(odd, {1, 2}).logits_per_row(), 255);
  EXPECT_EQ(shard_slice(odd, {1, 2}, "lm_head.weight").kind, ShardSlice::Kind::kWhole);
  EXPECT_EQ(shard_spec(spec, {0, 1}).logit_count, 0);
  // an untied head (qwen2) and a tied one (llama) split, and an odd vocabulary kept whole: the
  // joined logits are the unsplit model's (expect_split_equals_unsplit's checks)
  for (const char* name : {"qwen2", "llama"}) {
    SCOPED_TRACE(name);
    const OpenedModel model = open_tiny(name);
    auto backend = make_cpu_tensor_parallel_backend(model.spec, *model.weights, 2);
    ASSERT_TRUE(backend.is_ok());
    auto& tp = static_cast<TensorParallelBackend&>(*backend.value());
    EXPECT_EQ(tp.rank(1).spec().logit_count, model.spec.vocab_size / 2);
    expect_split_equals_unsplit(model.spec, *model.weights, 2);
  }
  ModelSpec four = open_tiny("llama").spec;
  four.num_q_heads = 8;
  four.num_kv_heads = 4;
  four.vocab_size = 250;  // 250 % 4 != 0: each of the 4 ranks keeps the whole head
  ASSERT_EQ(shard_spec(four, {3, 4}).logit_count, 0);
  const RandomWeightSource source(four, 3);
  expect_split_equals_unsplit(four, source, 4);
}

// forward_into_rows writes each logit row at its stride and nothing between (the default, through
// a scratch: the CPU backend's), and refuses a stride or buffer that cannot hold the rows.
TEST(TensorParallel, ForwardIntoRowsWritesEachRowAtItsStride) {
  const OpenedModel model = open_tiny("qwen2");
  const int32_t vocab = model.spec.vocab_size;
  std::unique_ptr<ForwardBackend> a = unsplit(model.spec, *model.weights);
  std::unique_ptr<ForwardBackend> b = unsplit(model.spec, *model.weights);
  ASSERT_TRUE(a->allocate_kv(layouts_of(*a)).is_ok());
  ASSERT_TRUE(b->allocate_kv(layouts_of(*b)).is_ok());
  Sequences sa, sb;
  sa.tokens.resize(2);
  sb.tokens.resize(2);
  const std::vector<std::vector<int32_t>> fresh = {{3, 17, 5}, {7, 2}};
  std::vector<float> packed(2 * vocab);
  ASSERT_TRUE(a->forward(sa.batch(fresh), packed).is_ok());
  const size_t stride = vocab + 7;
  std::vector<float> strided(stride + vocab, -123.0f);
  ForwardBatch batch = sb.batch(fresh);
  EXPECT_EQ(b->forward_into_rows(batch, {}, strided, vocab - 1, {}).code(),
            StatusCode::kInvalidArgument);  // stride below a row
  EXPECT_EQ(
      b->forward_into_rows(batch, {}, std::span(strided).first(stride + vocab - 1), stride, {})
          .code(),
      StatusCode::kInvalidArgument);  // the last row does not fit
  ASSERT_TRUE(b->forward_into_rows(batch, {}, strided, stride, {}).is_ok());
  for (int32_t r = 0; r < 2; ++r) {
    for (int32_t v = 0; v < vocab; ++v) {
      ASSERT_EQ(strided[r * stride + v], packed[r * vocab + v]) << "row " << r << " id " << v;
    }
  }
  for (size_t i = vocab; i < stride; ++i) EXPECT_EQ(strided[i], -123.0f) << "between rows";
}

// The whole rows' summary from the shares' summaries: the first largest logit (the lower id on
// ties across shares), the log-sum-exp of all — as computed over the whole row here.
TEST(TensorParallel, RowSummariesOfVocabularySharesCombineIntoTheWholeRows) {
  constexpr int32_t kVocab = 96, kRanks = 3, kShare = kVocab / kRanks;
  std::vector<std::vector<float>> rows = {{}, {}, {}, {}};
  for (size_t i = 0; i < rows.size(); ++i) {
    for (int32_t v = 0; v < kVocab; ++v) rows[i].push_back(std::sin(0.37f * v * (i + 1)) * 5.0f);
  }
  rows[1][10] = rows[1][70] = 9.0f;  // a tie across shares 0 and 2: id 10 wins
  rows[2][40] = rows[2][41] = 9.5f;  // a tie within share 1: id 40
  rows[3].assign(kVocab, -2.0f);     // all equal: id 0
  const auto summarize = [](std::span<const float> row) {
    LogitRowSummary s;
    s.argmax = 0;
    for (size_t v = 1; v < row.size(); ++v) {
      if (row[v] > row[s.argmax]) s.argmax = static_cast<int32_t>(v);
    }
    s.max_logit = row[s.argmax];
    double sum = 0;
    for (float x : row) sum += std::exp(static_cast<double>(x) - s.max_logit);
    s.log_z = s.max_logit + static_cast<float>(std::log(sum));
    return s;
  };
  std::vector<std::vector<LogitRowSummary>> parts(kRanks);
  std::vector<int32_t> begins;
  for (int32_t r = 0; r < kRanks; ++r) {
    begins.push_back(r * kShare);
    for (const auto& row : rows) {
      parts[r].push_back(summarize(std::span(row).subspan(r * kShare, kShare)));
    }
  }
  std::vector<LogitRowSummary> combined(rows.size());
  combine_row_summaries(parts, begins, combined);
  for (size_t i = 0; i < rows.size(); ++i) {
    const LogitRowSummary want = summarize(rows[i]);
    EXPECT_EQ(combined[i].argmax, want.argmax) << "row " << i;
    EXPECT_EQ(combined[i].max_logit, want.max_logit) << "row " << i;
    EXPECT_NEAR(combined[i].log_z, want.log_z, 1e-5f) << "row " << i;
  }
  EXPECT_EQ(combined[1].argmax, 10);
  EXPECT_EQ(combined[2].argmax, 40);
  EXPECT_EQ(combined[3].argmax, 0);
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

// The tiny GPT-OSS's biases are all zero (as transformers initialises them): this source gives
// every bias of `base` small nonzero values, so that a bias added once per rank instead of once
// shows in the logits.
class NonzeroBiases final : public WeightSource {
 public:
  explicit NonzeroBiases(const WeightSource& base) : base_(base) {}
  bool contains(const std::string& name) const override { return base_.contains(name); }
  Result<std::vector<float>> read_f32(const std::string& name,
                                      std::span<const int64_t> shape) const override {
    KVP_ASSIGN_OR_RETURN(std::vector<float> values, base_.read_f32(name, shape));
    if (name.ends_with("bias")) {
      for (size_t i = 0; i < values.size(); ++i) {
        values[i] +=
            0.1f * std::sin(0.7f * static_cast<float>(i) + static_cast<float>(name.size()));
      }
    }
    return values;
  }
  Result<StoredMatrix> read_matrix(const std::string& name, int64_t rows,
                                   int64_t cols) const override {
    return base_.read_matrix(name, rows, cols);
  }
  Result<std::vector<StoredMatrix>> read_experts(int32_t layer, const std::string& projection,
                                                 int32_t num_experts, int64_t rows,
                                                 int64_t cols) const override {
    return base_.read_experts(layer, projection, num_experts, rows, cols);
  }
  std::string describe() const override { return base_.describe() + " (nonzero biases)"; }

 private:
  const WeightSource& base_;
};

// Experts split by their intermediate units (each rank runs every expert's share, the router
// whole): Qwen3-MoE, Qwen2-MoE (a shared expert with its sigmoid gate, a dense layer among the
// expert layers) and GPT-OSS (expert biases, the down bias and o_proj's bias added once after the
// sum, attention sinks split with their heads) compute what the unsplit model computes.
TEST(TensorParallel, MixtureOfExpertsModelsSplitInTwoComputeWhatTheUnsplitRunnerComputes) {
  for (const char* name : {"qwen3_moe", "qwen2_moe", "gpt_oss"}) {
    SCOPED_TRACE(name);
    const OpenedModel model = open_tiny(name);
    ASSERT_TRUE(model.spec.is_moe());
    expect_split_equals_unsplit(model.spec, *model.weights, 2);
  }
  const OpenedModel gpt_oss = open_tiny("gpt_oss");
  expect_split_equals_unsplit(gpt_oss.spec, NonzeroBiases(*gpt_oss.weights), 2);
}

TEST(TensorParallel, MixtureOfExpertsOverFourRanks) {
  // a Qwen3-MoE-shaped random model with 4 kv heads, and a shared expert to split as well
  ModelSpec spec = open_tiny("qwen2_moe").spec;
  spec.num_q_heads = 8;
  spec.num_kv_heads = 4;
  const RandomWeightSource source(spec, 11);
  expect_split_equals_unsplit(spec, source, 4);
}

// The Qwen3-MoE GGUF with Q8_0 experts (3-D tensors, written by the gguf package): a rank's gate
// and up are row slices of the mapped file, still Q8_0 (nothing copied); its down is the f32 of
// its columns; and the split model computes what the unsplit one does.
TEST(TensorParallel, QuantisedExpertsSplitInPlace) {
  const std::string python = ".venv/bin/python";
  if (!std::filesystem::exists(python)) GTEST_SKIP() << python << " not found (scripts/setup.sh)";
  const std::string out =
      (std::filesystem::temp_directory_path() / fmt::format("kvp_tp_moe_q8_{}.gguf", ::getpid()))
          .string();
  const std::string command = fmt::format(
      "{} tests/model/make_tiny_gguf.py tests/model/fixtures/tiny/qwen3_moe {} --expert-type Q8_0",
      python, out);
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  auto opened = open_model(out);
  std::filesystem::remove(out);  // the mapping keeps the bytes
  ASSERT_TRUE(opened.is_ok()) << opened.status().to_string();
  const ModelSpec& spec = opened->spec;
  const WeightSource& whole = *opened->weights;
  const int64_t inter = spec.moe_intermediate_size, hidden = spec.hidden_size;
  const int32_t experts = spec.num_experts;
  auto gate = whole.read_experts(0, "gate_proj", experts, inter, hidden);
  auto down = whole.read_experts(0, "down_proj", experts, hidden, inter);
  ASSERT_TRUE(gate.is_ok() && down.is_ok());
  ASSERT_EQ((*gate)[0].matrix.type, GgmlType::Q8_0);
  constexpr int32_t n = 2;
  const int64_t share = inter / n;
  for (int32_t r = 0; r < n; ++r) {
    const ShardedWeightSource sharded(whole, spec, {r, n});
    auto my_gate = sharded.read_experts(0, "gate_proj", experts, share, hidden);
    auto my_down = sharded.read_experts(0, "down_proj", experts, hidden, share);
    ASSERT_TRUE(my_gate.is_ok()) << my_gate.status().to_string();
    ASSERT_TRUE(my_down.is_ok()) << my_down.status().to_string();
    std::vector<float> want(static_cast<size_t>(inter)), got(static_cast<size_t>(share));
    for (int32_t e = 0; e < experts; ++e) {
      const quant::QuantMatrix& g = (*my_gate)[e].matrix;
      EXPECT_EQ(g.type, GgmlType::Q8_0);
      EXPECT_EQ(g.rows, share);
      EXPECT_EQ(g.data, (*gate)[e].matrix.row(r * share)) << "expert " << e;
      const quant::QuantMatrix& d = (*my_down)[e].matrix;
      ASSERT_EQ(d.type, GgmlType::F32);
      ASSERT_EQ(d.rows, hidden);
      ASSERT_EQ(d.cols, share);
      for (int64_t row = 0; row < hidden; ++row) {
        quant::dequantize_row((*down)[e].matrix, row, want.data());
        quant::dequantize_row(d, row, got.data());
        for (int64_t c = 0; c < share; ++c) {
          ASSERT_EQ(got[c], want[r * share + c]) << "expert " << e << " row " << row;
        }
      }
    }
  }
  expect_split_equals_unsplit(spec, whole, n);
}

// Element i of `mine` (shape `shape`, the share along `axis` starting at `begin`) is the whole's
// element with the same index but `begin` added along `axis`.
void expect_share_of(std::span<const float> whole, std::span<const float> mine,
                     const std::vector<int64_t>& shape, int32_t axis, int64_t begin, int32_t n) {
  int64_t outer = 1, inner = 1;
  for (int32_t d = 0; d < axis; ++d) outer *= shape[d];
  for (size_t d = axis + 1; d < shape.size(); ++d) inner *= shape[d];
  const int64_t count = shape[axis], whole_count = count * n;
  ASSERT_EQ(mine.size(), static_cast<size_t>(outer * count * inner));
  ASSERT_EQ(whole.size(), mine.size() * n);
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t c = 0; c < count; ++c) {
      for (int64_t i = 0; i < inner; ++i) {
        ASSERT_EQ(mine[(o * count + c) * inner + i],
                  whole[(o * whole_count + begin + c) * inner + i])
            << "at " << o << ", " << c << ", " << i;
      }
    }
  }
}

// GPT-OSS's tensors as transformers stores them: a rank's sinks are its heads'; of the experts'
// gate_up_proj [E][hidden][2 I] (gate and up units interleaved) it holds one run of 2 I / N
// columns, of down_proj [E][I][hidden] its I / N rows of each expert; the biases added after the
// sum over ranks (o_proj's, the experts' down) are rank 0's and zeros on the others.
TEST(TensorParallel, GptOssRanksHoldTheirSharesAndBiasesAddedAfterTheSumOnce) {
  const OpenedModel model = open_tiny("gpt_oss");
  const NonzeroBiases weights(*model.weights);
  const ModelSpec& spec = model.spec;
  const int64_t hidden = spec.hidden_size, inter = spec.moe_intermediate_size;
  const int64_t experts = spec.num_experts, heads = spec.num_q_heads;
  const std::string p = "model.layers.2.";
  struct Case {
    std::string name;
    std::vector<int64_t> shape;  // whole
    int32_t axis;                // -1: rank 0 holds it whole, the others zeros
  };
  const std::vector<Case> cases = {
      {p + "self_attn.sinks", {heads}, 0},
      {p + "mlp.experts.gate_up_proj", {experts, hidden, 2 * inter}, 2},
      {p + "mlp.experts.gate_up_proj_bias", {experts, 2 * inter}, 1},
      {p + "mlp.experts.down_proj", {experts, inter, hidden}, 1},
      {p + "mlp.experts.down_proj_bias", {experts, hidden}, -1},
      {p + "self_attn.o_proj.bias", {hidden}, -1},
  };
  constexpr int32_t n = 2;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto whole = weights.read_f32(c.name, c.shape);
    ASSERT_TRUE(whole.is_ok()) << whole.status().to_string();
    for (int32_t r = 0; r < n; ++r) {
      const ShardedWeightSource sharded(weights, spec, {r, n});
      std::vector<int64_t> shape = c.shape;
      if (c.axis >= 0) shape[c.axis] /= n;
      auto mine = sharded.read_f32(c.name, shape);
      ASSERT_TRUE(mine.is_ok()) << mine.status().to_string();
      if (c.axis >= 0) {
        expect_share_of(*whole, *mine, shape, c.axis, r * shape[c.axis], n);
        continue;
      }
      ASSERT_EQ(mine->size(), whole->size());
      EXPECT_GT(max_abs(*whole), 0.0f);
      EXPECT_EQ(max_abs(*mine), r == 0 ? max_abs(*whole) : 0.0f) << "rank " << r;
      if (r == 0) {
        EXPECT_EQ(*mine, *whole);
      }
    }
  }
}

TEST(TensorParallel, ExpertSizesThatDoNotSplitAreRefused) {
  ModelSpec spec = open_tiny("qwen2_moe").spec;  // 8 heads, 2 kv heads, experts 32, shared 48
  spec.num_kv_heads = 4;
  ASSERT_TRUE(check_tensor_parallel(spec, 4).is_ok());
  ModelSpec odd = spec;
  odd.moe_intermediate_size = 34;
  Status st = check_tensor_parallel(odd, 4);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("expert intermediate size 34"), std::string::npos) << st.message();
  EXPECT_TRUE(check_tensor_parallel(odd, 2).is_ok());
  odd = spec;
  odd.shared_expert_intermediate_size = 50;
  st = check_tensor_parallel(odd, 4);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("shared expert intermediate size 50"), std::string::npos)
      << st.message();
  // the dense intermediate size binds only where a layer has a dense MLP: qwen2_moe's layer 1
  odd = spec;
  odd.intermediate_size = 98;
  EXPECT_EQ(check_tensor_parallel(odd, 4).code(), StatusCode::kInvalidArgument);
  std::fill(odd.layer_is_moe.begin(), odd.layer_is_moe.end(), true);
  EXPECT_TRUE(check_tensor_parallel(odd, 4).is_ok());
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

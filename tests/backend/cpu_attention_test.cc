// cpu::paged_attention against reference_paged_attention (double precision, dense gather) on
// fresh random inputs in shuffled, non-contiguous block tables, over a sampled matrix of block
// sizes, head dims, GQA ratios, query lengths, KV lengths, windows, soft caps, dtypes and
// forced KV splits; plus 32K contexts and bad arguments. Outputs are poisoned with NaN before
// every call, so an element left unwritten shows as non-finite.
//
// 8-bit KV (int8, fp8): random f32 rows (of varied magnitude) are quantised into the pool; the
// reference reads the dequantised cache (value times its row's scale), so the kernels meet the
// f32 tolerance; and against attention over the original f32 rows they stay within a bound
// derived from the quantisation steps (Int8 / Fp8MixedBatchMatchesReference).
#include "backend/cpu_attention.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <iostream>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cache/kv_quant.h"
#include "support/kv8_check.h"
#include "support/tensor_check.h"

namespace kvp {
namespace {

struct SeqShape {
  int32_t q_len = 0;
  int32_t kv_len = 0;
};

struct CaseSpec {
  int32_t block_size = 16;
  int32_t head_dim = 64;
  int32_t num_kv_heads = 2;
  int32_t group = 1;  // query heads per KV head
  DType kv_dtype = DType::F32;
  DType q_dtype = DType::F32;
  AttentionParams params;  // num_q_heads filled in by the fixture
  std::vector<SeqShape> seqs;
};

std::string describe(const CaseSpec& c) {
  std::string seqs;
  for (const SeqShape& s : c.seqs) seqs += fmt::format(" ({},{})", s.q_len, s.kv_len);
  return fmt::format(
      "block {} head_dim {} kv_heads {} group {} kv {} q {} scale {} cap {} window {} seqs "
      "(q_len,kv_len):{}",
      c.block_size, c.head_dim, c.num_kv_heads, c.group, dtype_name(c.kv_dtype),
      dtype_name(c.q_dtype), c.params.scale, c.params.soft_cap, c.params.window, seqs);
}

// A two-layer pool (attention reads layer 1, so layer offsets matter) with random K/V, each
// sequence's blocks drawn from a random permutation of the pool, and random queries.
class PagedProblem {
 public:
  PagedProblem(const CaseSpec& spec, std::mt19937_64& rng) : spec_(spec) {
    params_ = spec.params;
    params_.num_q_heads = spec.num_kv_heads * spec.group;
    int32_t blocks_needed = 0;
    int32_t max_blocks = 1;
    for (const SeqShape& s : spec.seqs) {
      const int32_t n = (s.kv_len + spec.block_size - 1) / spec.block_size;
      blocks_needed += n;
      max_blocks = std::max(max_blocks, n + 1);  // one spare entry: tables longer than needed
    }
    layout_ = KvLayout{
        2, blocks_needed + 5, spec.num_kv_heads, spec.block_size, spec.head_dim, spec.kv_dtype};
    slab_.resize(layout_.size_bytes());
    if (is_kv8(spec.kv_dtype)) {
      fill_quantised(rng);
    } else {
      testing::fill_random(slab_.data(), spec.kv_dtype, static_cast<size_t>(layout_.size_elems()),
                           rng);
    }
    kv_ = paged_kv_for_layer(layout_, slab_.data(), 1);

    std::vector<int32_t> ids(static_cast<size_t>(layout_.num_blocks));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    const int32_t num_seqs = static_cast<int32_t>(spec.seqs.size());
    tables_.assign(size_t(num_seqs) * max_blocks, -1);
    query_start_.assign(1, 0);
    size_t next_id = 0;
    int32_t max_q = 0, max_kv = 0;
    for (int32_t i = 0; i < num_seqs; ++i) {
      const SeqShape& s = spec.seqs[size_t(i)];
      const int32_t n = (s.kv_len + spec.block_size - 1) / spec.block_size;
      for (int32_t b = 0; b < n; ++b) tables_[size_t(i) * max_blocks + b] = ids[next_id++];
      query_start_.push_back(query_start_.back() + s.q_len);
      kv_lens_.push_back(s.kv_len);
      max_q = std::max(max_q, s.q_len);
      max_kv = std::max(max_kv, s.kv_len);
    }
    batch_.num_seqs = num_seqs;
    batch_.num_tokens = query_start_.back();
    batch_.query_start = query_start_.data();
    batch_.kv_lens = kv_lens_.data();
    batch_.block_tables = tables_.data();
    batch_.max_blocks_per_seq = max_blocks;
    batch_.max_q_len = max_q;
    batch_.max_kv_len = max_kv;

    q_.resize(out_elems() * dtype_size_bytes(spec.q_dtype));
    testing::fill_random(q_.data(), spec.q_dtype, out_elems(), rng);
  }

  size_t out_elems() const {
    return size_t(batch_.num_tokens) * params_.num_q_heads * spec_.head_dim;
  }
  // The oracle's answer, in f32.
  std::vector<float> reference() const {
    std::vector<float> ref(out_elems(), std::numeric_limits<float>::quiet_NaN());
    if (spec_.q_dtype == DType::F32) {
      reference_paged_attention(params_, batch_, kv_, q_.data(), DType::F32, ref.data());
    } else {
      // The reference writes q's dtype; widen the query so its f32 output is not rounded.
      std::vector<float> q32(out_elems());
      for (size_t i = 0; i < q32.size(); ++i) q32[i] = load_as_f32(q_.data(), spec_.q_dtype, i);
      reference_paged_attention(params_, batch_, kv_, q32.data(), DType::F32, ref.data());
    }
    return ref;
  }
  // A NaN-poisoned output buffer of q's dtype.
  std::vector<std::byte> poisoned_out() const {
    std::vector<std::byte> out(out_elems() * dtype_size_bytes(spec_.q_dtype));
    for (size_t i = 0; i < out_elems(); ++i) {
      store_from_f32(out.data(), spec_.q_dtype, i, std::numeric_limits<float>::quiet_NaN());
    }
    return out;
  }

  // 8-bit only: the oracle's answer on the f32 rows before quantisation.
  std::vector<float> reference_unquantised() const {
    std::vector<float> ref(out_elems(), std::numeric_limits<float>::quiet_NaN());
    std::vector<float> q32(out_elems());
    for (size_t i = 0; i < q32.size(); ++i) q32[i] = load_as_f32(q_.data(), spec_.q_dtype, i);
    const PagedKv original =
        paged_kv_for_layer(original_layout_, const_cast<float*>(original_.data()), 1);
    reference_paged_attention(params_, batch_, original, q32.data(), DType::F32, ref.data());
    return ref;
  }
  // 8-bit only: per output row (token, query head), the bound on |out - out_unquantised| that
  // the quantisation steps of the keys and values the row sees allow (see
  // expect_kv8_within_quantisation_bound). [num_tokens * num_q_heads]
  std::vector<double> kv8_row_bounds() const {
    const double half_step = testing::kv8_max_half_step(layout_.dtype);  // in units of a scale
    const KvLayout& l = layout_;
    // Per pool row (block, head, token) of layer 1: K scale, V scale, max |v| of the original.
    const size_t num_rows = size_t(l.num_blocks) * l.num_kv_heads * l.block_size;
    std::vector<double> k_scale(num_rows), v_scale(num_rows), v_max(num_rows);
    for (int32_t block = 0; block < l.num_blocks; ++block) {
      for (int32_t head = 0; head < l.num_kv_heads; ++head) {
        for (int32_t token = 0; token < l.block_size; ++token) {
          const size_t i = (size_t(block) * l.num_kv_heads + head) * l.block_size + token;
          F16 k, v;
          std::memcpy(&k, slab_.data() + l.scale_offset(1, block, 0, head, token), sizeof k);
          std::memcpy(&v, slab_.data() + l.scale_offset(1, block, 1, head, token), sizeof v);
          k_scale[i] = f16_to_f32(k);
          v_scale[i] = f16_to_f32(v);
          const float* row =
              original_.data() + original_layout_.elem_offset(1, block, 1, head, token);
          for (int32_t d = 0; d < l.head_dim; ++d)
            v_max[i] = std::max(v_max[i], double(std::fabs(row[d])));
        }
      }
    }
    const int32_t num_q_heads = params_.num_q_heads;
    const int32_t group = num_q_heads / l.num_kv_heads;
    std::vector<double> bounds(size_t(batch_.num_tokens) * num_q_heads, 0.0);
    for (int32_t seq = 0; seq < batch_.num_seqs; ++seq) {
      const int32_t q_begin = query_start_[size_t(seq)];
      const int32_t q_len = query_start_[size_t(seq) + 1] - q_begin;
      const int32_t kv_len = kv_lens_[size_t(seq)];
      const int32_t* table = tables_.data() + size_t(seq) * batch_.max_blocks_per_seq;
      for (int32_t t = 0; t < q_len; ++t) {
        const int32_t pos = kv_len - q_len + t;
        const int32_t first = params_.window > 0 ? std::max(0, pos - params_.window + 1) : 0;
        for (int32_t h = 0; h < num_q_heads; ++h) {
          const size_t row = size_t(q_begin + t) * num_q_heads + h;
          double q_l1 = 0;
          for (int32_t d = 0; d < l.head_dim; ++d)
            q_l1 += std::fabs(load_as_f32(q_.data(), spec_.q_dtype, row * l.head_dim + d));
          double max_k_scale = 0, max_v_scale = 0, max_v = 0;
          for (int32_t j = first; j <= pos; ++j) {
            const size_t i =
                (size_t(table[j / l.block_size]) * l.num_kv_heads + h / group) * l.block_size +
                j % l.block_size;
            max_k_scale = std::max(max_k_scale, k_scale[i]);
            max_v_scale = std::max(max_v_scale, v_scale[i]);
            max_v = std::max(max_v, v_max[i]);
          }
          const double logit_error = double(params_.scale) * q_l1 * max_k_scale * half_step;
          bounds[row] = std::expm1(2 * logit_error) * max_v + max_v_scale * half_step;
        }
      }
    }
    return bounds;
  }

  const AttentionParams& params() const { return params_; }
  const AttentionBatch& batch() const { return batch_; }
  AttentionBatch& mutable_batch() { return batch_; }
  std::vector<int32_t>& tables() { return tables_; }
  const PagedKv& kv() const { return kv_; }
  const void* q() const { return q_.data(); }
  DType q_dtype() const { return spec_.q_dtype; }

 private:
  CaseSpec spec_;
  AttentionParams params_;
  KvLayout layout_;
  std::vector<std::byte> slab_;  // [2 layers][num_blocks][K,V][kv_heads][block_size][head_dim]
  PagedKv kv_;
  std::vector<int32_t> tables_;       // [num_seqs][max_blocks_per_seq], shuffled block ids
  std::vector<int32_t> query_start_;  // [num_seqs + 1]
  std::vector<int32_t> kv_lens_;      // [num_seqs]
  std::vector<std::byte> q_;          // [num_tokens][num_q_heads][head_dim] of q_dtype
  AttentionBatch batch_;
  // 8-bit: the f32 rows the pool was quantised from, in an f32 layout of the same geometry.
  KvLayout original_layout_;
  std::vector<float> original_;

  // Random f32 rows, each scaled by a random magnitude in [0.05, 4] (keys and values vary per
  // token), quantised row by row into the 8-bit pool.
  void fill_quantised(std::mt19937_64& rng) {
    original_layout_ = layout_;
    original_layout_.dtype = DType::F32;
    original_.resize(size_t(original_layout_.size_elems()));
    testing::fill_random(original_.data(), DType::F32, original_.size(), rng);
    std::uniform_real_distribution<float> magnitude(0.05f, 4.0f);
    const KvLayout& l = layout_;
    for (int32_t layer = 0; layer < l.num_layers; ++layer) {
      for (int32_t block = 0; block < l.num_blocks; ++block) {
        for (int32_t kv = 0; kv < 2; ++kv) {
          for (int32_t head = 0; head < l.num_kv_heads; ++head) {
            for (int32_t token = 0; token < l.block_size; ++token) {
              float* row =
                  original_.data() + original_layout_.elem_offset(layer, block, kv, head, token);
              const float m = magnitude(rng);
              for (int32_t d = 0; d < l.head_dim; ++d) row[d] *= m;
              F16 scale;
              quantize_kv8(l.dtype, row, l.head_dim,
                           reinterpret_cast<uint8_t*>(slab_.data() +
                                                      l.elem_offset(layer, block, kv, head, token)),
                           &scale);
              std::memcpy(slab_.data() + l.scale_offset(layer, block, kv, head, token), &scale,
                          sizeof scale);
            }
          }
        }
      }
    }
  }
};

// Output of q's dtype: f32 keeps the f32-accumulation bound whatever the KV dtype (the reference
// reads the same rounded KV values); a 16-bit output adds its own rounding.
double tolerance(DType out_dtype) {
  switch (out_dtype) {
    case DType::F32:
      return 1e-5;
    case DType::F16:
      return 2e-3;
    case DType::BF16:
      return 1e-2;
    case DType::I8:
    case DType::FP8:
      break;
  }
  return 0.0;
}

// Runs the fast kernel (and, if asked, the scalar baseline) in several configurations and
// compares each with the reference.
void expect_matches_reference(const CaseSpec& spec, std::mt19937_64& rng, bool also_scalar) {
  SCOPED_TRACE(describe(spec));
  PagedProblem problem(spec, rng);
  const std::vector<float> ref = problem.reference();
  ThreadPool pool(2);
  std::uniform_int_distribution<int32_t> split_dist(1, 97);
  struct Run {
    std::string name;
    ThreadPool* pool;
    cpu::AttentionTuning tuning;
  };
  std::vector<Run> runs = {
      {"1 thread, automatic", nullptr, {}},
      {"2 threads, automatic", &pool, {}},
      {"2 threads, split", &pool, {split_dist(rng), 16}},
      {"1 thread, split, 5-row tiles", nullptr, {split_dist(rng), 5}},
      // One-token tiles take bf16's paired path wherever the group fits one pass; this run
      // checks the PromoteTo path on the same tiles.
      {"1 thread, 1-token tiles, bf16 not paired", nullptr, {0, 1, true, false}},
  };
  testing::TensorDiff worst;
  for (const Run& run : runs) {
    SCOPED_TRACE(fmt::format("{} (split_keys {}, tile_rows {})", run.name, run.tuning.split_keys,
                             run.tuning.tile_rows));
    std::vector<std::byte> out = problem.poisoned_out();
    ASSERT_TRUE(cpu::paged_attention(problem.params(), problem.batch(), problem.kv(), problem.q(),
                                     problem.q_dtype(), out.data(), run.pool, run.tuning)
                    .is_ok());
    const testing::TensorDiff diff =
        testing::compare(out.data(), problem.q_dtype(), ref.data(), DType::F32, ref.size());
    EXPECT_EQ(diff.non_finite, 0u) << diff.describe();
    EXPECT_LE(diff.relative_error, tolerance(problem.q_dtype())) << diff.describe();
    if (diff.relative_error >= worst.relative_error) worst = diff;
  }
  std::cout << "[ worst    ] " << worst.describe() << "\n";
  if (also_scalar) {
    std::vector<std::byte> out = problem.poisoned_out();
    ASSERT_TRUE(cpu::paged_attention_scalar(problem.params(), problem.batch(), problem.kv(),
                                            problem.q(), problem.q_dtype(), out.data(), &pool)
                    .is_ok());
    const testing::TensorDiff diff =
        testing::compare(out.data(), problem.q_dtype(), ref.data(), DType::F32, ref.size());
    EXPECT_EQ(diff.non_finite, 0u) << "scalar: " << diff.describe();
    EXPECT_LE(diff.relative_error, tolerance(problem.q_dtype())) << "scalar: " << diff.describe();
  }
}

// ---- the sampled matrix: every (block size, head dim, GQA ratio), one mixed batch each ----

using MatrixParam = std::tuple<int32_t, int32_t, int32_t>;  // block size, head dim, group
class CpuAttentionMatrix : public ::testing::TestWithParam<MatrixParam> {};

// One mixed batch of the matrix; kv_dtype: forced, else rotated over f32, bf16, f16.
CaseSpec matrix_case(int32_t block_size, int32_t head_dim, int32_t group,
                     std::optional<DType> kv_dtype) {
  // A seed per combination: every combination sees its own inputs, reproducibly.
  const int32_t combo = block_size + head_dim / 64 + group;  // rotates the options below
  auto round_up = [&](int32_t x) { return (x + block_size - 1) / block_size * block_size; };
  CaseSpec spec;
  spec.block_size = block_size;
  spec.head_dim = head_dim;
  spec.group = group;
  spec.num_kv_heads = group == 8 ? 1 : 2;
  const DType kv_types[] = {DType::F32, DType::BF16, DType::F16};
  spec.kv_dtype = kv_dtype.value_or(kv_types[combo % 3]);
  spec.q_dtype = combo % 7 == 0 ? DType::BF16 : combo % 11 == 0 ? DType::F16 : DType::F32;
  // Logit spread: from near-uniform attention to sharp.
  spec.params.scale = (combo % 2 == 0 ? 1.0f : 3.0f) / std::sqrt(float(head_dim));
  spec.params.soft_cap = combo % 5 == 1 ? 2.0f : 0.0f;
  // Windows smaller than a block, larger than a block, or off.
  const int32_t window_kind = combo % 4;
  spec.params.window = window_kind == 1   ? std::max(1, block_size / 2)
                       : window_kind == 2 ? block_size + 3
                                          : 0;
  spec.seqs = {
      {1, round_up(200)},       // decode, kv_len at a block multiple
      {3, round_up(100) + 1},   // short chunk, one past a multiple
      {64, round_up(130) - 1},  // prefill chunk, one short of a multiple
      {64, 64},                 // empty prefix: the whole sequence is new
      {0, 5},                   // in the batch, but nothing to compute
      {1, 1},                   // first token
  };
  return spec;
}

// A seed per combination: every combination sees its own inputs, reproducibly.
uint64_t matrix_seed(int32_t block_size, int32_t head_dim, int32_t group) {
  return uint64_t(block_size) * 1000003u + uint64_t(head_dim) * 101u + group;
}

TEST_P(CpuAttentionMatrix, MixedBatchMatchesReference) {
  const auto [block_size, head_dim, group] = GetParam();
  std::mt19937_64 rng(matrix_seed(block_size, head_dim, group));
  const CaseSpec spec = matrix_case(block_size, head_dim, group, std::nullopt);
  std::cout << "[ sampled  ] " << describe(spec) << "\n";
  const int32_t combo = block_size + head_dim / 64 + group;
  expect_matches_reference(spec, rng, /*also_scalar=*/combo % 6 == 0);
}

// The same matrix with an 8-bit pool: against the reference on the dequantised cache (f32
// tolerance), and against the reference on the unquantised rows within the bound the
// quantisation steps allow, per output row over the keys it sees. With s_k the largest of their
// K scales and h the format's largest half step (int8 1/2, fp8 16, in units of a scale), a key
// element is off by at most h * s_k, so a logit by D = scale * |q|_1 * h * s_k (the soft cap only
// shrinks it); each probability then moves by a factor within e^(+-2D), and a value element is
// off by at most h * s_v (s_v the largest V scale):
//   |out - out_unquantised| <= (e^(2D) - 1) * max|v| + h * s_v.
void expect_kv8_matches_reference(int32_t block_size, int32_t head_dim, int32_t group,
                                  DType kv_dtype) {
  std::mt19937_64 rng(matrix_seed(block_size, head_dim, group) + 7);
  const CaseSpec spec = matrix_case(block_size, head_dim, group, kv_dtype);
  std::cout << "[ sampled  ] " << describe(spec) << "\n";
  expect_matches_reference(spec, rng, /*also_scalar=*/(block_size + group) % 3 == 0);

  PagedProblem problem(spec, rng);
  const std::vector<float> unquantised = problem.reference_unquantised();
  const std::vector<double> bounds = problem.kv8_row_bounds();
  std::vector<std::byte> out = problem.poisoned_out();
  ASSERT_TRUE(cpu::paged_attention(problem.params(), problem.batch(), problem.kv(), problem.q(),
                                   problem.q_dtype(), out.data(), nullptr)
                  .is_ok());
  double worst_ratio = 0;  // largest |difference| / its row's bound
  for (size_t i = 0; i < unquantised.size(); ++i) {
    const double got = load_as_f32(out.data(), problem.q_dtype(), i);
    const double bound = bounds[i / size_t(head_dim)];
    // f32 accumulation; a 16-bit output adds its own rounding
    const double slack =
        1e-5 + (problem.q_dtype() == DType::F32 ? 0.0 : std::fabs(unquantised[i]) / 128);
    const double difference = std::fabs(got - unquantised[i]);
    worst_ratio = std::max(worst_ratio, difference / (bound + slack));
    ASSERT_LE(difference, bound + slack) << "element " << i << " of row " << i / size_t(head_dim);
  }
  std::cout << fmt::format(
      "[ {:<8} ] largest difference from unquantised attention: {} of its "
      "row's quantisation bound\n",
      dtype_name(kv_dtype), worst_ratio);
}

TEST_P(CpuAttentionMatrix, Int8MixedBatchMatchesReference) {
  const auto [block_size, head_dim, group] = GetParam();
  expect_kv8_matches_reference(block_size, head_dim, group, DType::I8);
}

TEST_P(CpuAttentionMatrix, Fp8MixedBatchMatchesReference) {
  const auto [block_size, head_dim, group] = GetParam();
  expect_kv8_matches_reference(block_size, head_dim, group, DType::FP8);
}

INSTANTIATE_TEST_SUITE_P(BlockHeadGroup, CpuAttentionMatrix,
                         ::testing::Combine(::testing::Values(1, 8, 16, 32, 256),
                                            ::testing::Values(64, 128, 256),
                                            ::testing::Values(1, 4, 8)),
                         [](const ::testing::TestParamInfo<MatrixParam>& info) {
                           return fmt::format("block{}_dim{}_group{}", std::get<0>(info.param),
                                              std::get<1>(info.param), std::get<2>(info.param));
                         });

// ---- targeted cases ----

TEST(CpuAttention, WindowsAroundTheBlockSize) {
  std::mt19937_64 rng(7);
  for (int32_t window : {1, 2, 15, 16, 17, 40, 1000}) {
    CaseSpec spec;
    spec.block_size = 16;
    spec.head_dim = 64;
    spec.group = 4;
    spec.kv_dtype = DType::BF16;
    spec.params.scale = 0.3f;
    spec.params.window = window;
    spec.seqs = {{1, 97}, {20, 96}, {33, 33}};
    expect_matches_reference(spec, rng, /*also_scalar=*/window == 17);
  }
}

TEST(CpuAttention, SoftCapOnSharpLogits) {
  std::mt19937_64 rng(11);
  CaseSpec spec;
  spec.block_size = 8;
  spec.head_dim = 128;
  spec.group = 2;
  spec.params.scale = 1.0f;  // logits of several units: the cap changes the result a lot
  spec.params.soft_cap = 5.0f;
  spec.seqs = {{1, 300}, {7, 64}};
  expect_matches_reference(spec, rng, /*also_scalar=*/true);
}

TEST(CpuAttention, UnusualHeadDimAndGroup) {
  // head_dim not a multiple of the vector width; GQA ratio 3 and 16.
  std::mt19937_64 rng(13);
  for (int32_t group : {3, 16}) {
    CaseSpec spec;
    spec.block_size = 16;
    spec.head_dim = 72;
    spec.group = group;
    spec.kv_dtype = DType::F16;
    spec.params.scale = 0.2f;
    spec.seqs = {{1, 50}, {5, 41}};
    expect_matches_reference(spec, rng, /*also_scalar=*/false);
  }
}

// A GQA group of 3 (SmolLM2: 9 query heads on 3 KV heads) runs as one 3-row pass, a group of 7
// as a 4-row pass and a 3-row one: one-token tiles (bf16's paired path), tiles of several tokens
// (K and V widened once per chunk), every KV dtype, head dims of one and two paired passes.
TEST(CpuAttention, GroupsOfThreeAndSevenMatchReference) {
  std::mt19937_64 rng(43);
  for (int32_t group : {3, 7}) {
    for (DType kv_dtype : {DType::F32, DType::BF16, DType::F16, DType::I8, DType::FP8}) {
      for (int32_t head_dim : {64, 128}) {
        CaseSpec spec;
        spec.block_size = 16;
        spec.head_dim = head_dim;
        spec.num_kv_heads = group == 3 ? 3 : 1;
        spec.group = group;
        spec.kv_dtype = kv_dtype;
        spec.params.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
        spec.seqs = {{1, 70}, {1, 33}, {6, 40}};
        expect_matches_reference(spec, rng, /*also_scalar=*/false);
      }
    }
  }
}

TEST(CpuAttention, LongContextsUpTo32K) {
  std::mt19937_64 rng(17);
  for (DType kv_dtype : {DType::BF16, DType::F32}) {
    CaseSpec spec;
    spec.block_size = 16;
    spec.head_dim = 128;
    spec.num_kv_heads = 1;
    spec.group = 4;
    spec.kv_dtype = kv_dtype;
    spec.params.scale = 4.0f / std::sqrt(128.0f);
    spec.seqs = {{1, 32768}, {1, 32767}, {1, 16385}};
    std::cout << "[ sampled  ] " << describe(spec) << "\n";
    expect_matches_reference(spec, rng, /*also_scalar=*/false);
  }
  CaseSpec windowed;
  windowed.block_size = 256;
  windowed.head_dim = 64;
  windowed.group = 8;
  windowed.num_kv_heads = 1;
  windowed.kv_dtype = DType::BF16;
  windowed.params.scale = 0.25f;
  windowed.params.window = 4096;
  windowed.seqs = {{2, 32768}};
  expect_matches_reference(windowed, rng, /*also_scalar=*/false);
}

// GPT-OSS's attention sinks: per query head a logit that joins the softmax denominator only.
// Sinks below, among and far above the logits (the last makes every weight tiny), with and
// without a window, decode and prefill rows, forced splits, every KV dtype.
TEST(CpuAttention, SinksMatchReference) {
  std::mt19937_64 rng(41);
  const std::vector<float> sinks = {-3.0f, 0.0f, 0.7f, 2.5f, -0.4f, 30.0f, 1.0f, -20.0f};
  for (const DType kv_dtype : {DType::F32, DType::BF16, DType::F16, DType::I8, DType::FP8}) {
    for (int32_t window : {0, 8}) {
      CaseSpec spec;
      spec.block_size = kv_dtype == DType::BF16 ? 16 : 4;
      spec.head_dim = 64;
      spec.group = 4;
      spec.kv_dtype = kv_dtype;
      spec.params.scale = 0.4f;
      spec.params.window = window;
      spec.params.sinks = sinks.data();  // [num_kv_heads 2 * group 4]
      spec.seqs = {{1, 37}, {12, 30}, {9, 9}, {1, 1}};
      expect_matches_reference(spec, rng, /*also_scalar=*/true);
    }
  }
}

// The reference itself with sinks, against a softmax written out here: logits of the visible
// keys plus the sink as one more column, softmax, the sink's column dropped.
TEST(AttentionReference, SinksJoinTheDenominatorAndAreDropped) {
  std::mt19937_64 rng(43);
  const std::vector<float> sinks = {0.5f, -1.0f, 4.0f, 25.0f};
  CaseSpec spec;
  spec.block_size = 4;
  spec.head_dim = 8;
  spec.num_kv_heads = 2;
  spec.group = 2;
  spec.params.scale = 0.5f;
  spec.params.window = 5;
  spec.params.sinks = sinks.data();
  spec.seqs = {{3, 11}};
  PagedProblem problem(spec, rng);
  const std::vector<float> ref = problem.reference();
  const PagedKv& kv = problem.kv();
  const AttentionBatch& batch = problem.batch();
  const auto* q = static_cast<const float*>(problem.q());
  double largest = 0;
  for (int32_t t = 0; t < 3; ++t) {
    const int32_t pos = 11 - 3 + t;
    for (int32_t h = 0; h < 4; ++h) {
      const int32_t kvh = h / 2;
      std::vector<double> logits;
      std::vector<const float*> values;
      for (int32_t j = std::max(0, pos - 5 + 1); j <= pos; ++j) {
        const int64_t off = kv.row_offset(batch.block_tables[j / 4], kvh, j % 4);
        const float* key = static_cast<const float*>(kv.k) + off;
        double dot = 0;
        for (int32_t d = 0; d < 8; ++d) dot += double(q[(t * 4 + h) * 8 + d]) * key[d];
        logits.push_back(dot * 0.5);
        values.push_back(static_cast<const float*>(kv.v) + off);
      }
      logits.push_back(sinks[h]);
      const double top = *std::max_element(logits.begin(), logits.end());
      double denominator = 0;
      for (double x : logits) denominator += std::exp(x - top);
      for (int32_t d = 0; d < 8; ++d) {
        double expected = 0;
        for (size_t j = 0; j + 1 < logits.size(); ++j) {
          expected += std::exp(logits[j] - top) / denominator * values[j][d];
        }
        const double got = ref[(t * 4 + h) * 8 + d];
        largest = std::max(largest, std::fabs(got - expected));
        ASSERT_NEAR(got, expected, 1e-6) << "token " << t << " head " << h << " dim " << d;
      }
    }
  }
  std::cout << "[ sinks    ] largest difference from the written-out softmax: " << largest << "\n";
}

TEST(CpuAttention, EveryCompiledTargetMatchesReference) {
  // The kernel is compiled per x86 target; run each one this machine supports (SSE4, AVX2,
  // AVX-512, ...), not only the best, so an AVX2-only machine runs tested code.
  std::mt19937_64 rng(29);
  for (const int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    std::cout << "[ target   ] " << hwy::TargetName(target) << " -> kernel " << cpu::kernel_target()
              << "\n";
    EXPECT_STREQ(cpu::kernel_target(), hwy::TargetName(target));
    for (const DType kv_dtype : {DType::F32, DType::BF16, DType::F16, DType::I8, DType::FP8}) {
      CaseSpec spec;
      spec.block_size = 8;
      // 72: tails past the last vector
      spec.head_dim = kv_dtype == DType::F16 || is_kv8(kv_dtype) ? 72 : 128;
      spec.group = kv_dtype == DType::BF16 ? 3 : 4;
      spec.kv_dtype = kv_dtype;
      spec.params.scale = 0.3f;
      spec.params.soft_cap = kv_dtype == DType::F32 ? 4.0f : 0.0f;
      spec.params.window = kv_dtype == DType::F16 ? 11 : 0;
      spec.seqs = {{1, 77}, {9, 40}, {5, 5}};
      expect_matches_reference(spec, rng, /*also_scalar=*/false);
    }
  }
  hwy::SetSupportedTargetsForTest(0);  // back to the real CPU
}

TEST(CpuAttention, EmptyBatchWritesNothing) {
  std::mt19937_64 rng(19);
  CaseSpec spec;
  spec.seqs = {{0, 3}};
  PagedProblem problem(spec, rng);
  EXPECT_TRUE(cpu::paged_attention(problem.params(), problem.batch(), problem.kv(), nullptr,
                                   DType::F32, nullptr, nullptr)
                  .is_ok());
}

// ---- bad arguments: a clear error, not a crash ----

class CpuAttentionErrors : public ::testing::Test {
 protected:
  CpuAttentionErrors() : rng_(23), problem_(spec(), rng_), out_(problem_.poisoned_out()) {}
  static CaseSpec spec() {
    CaseSpec s;
    s.block_size = 8;
    s.group = 2;
    s.seqs = {{2, 20}, {1, 9}};
    return s;
  }
  Status run(const AttentionParams& params, const AttentionBatch& batch, const PagedKv& kv) {
    return cpu::paged_attention(params, batch, kv, problem_.q(), DType::F32, out_.data(), nullptr);
  }
  void expect_error(const Status& status, const std::string& fragment) {
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.to_string();
    EXPECT_NE(status.message().find(fragment), std::string::npos) << status.to_string();
  }
  std::mt19937_64 rng_;
  PagedProblem problem_;
  std::vector<std::byte> out_;
};

TEST_F(CpuAttentionErrors, HeadCountsThatDoNotDivide) {
  AttentionParams params = problem_.params();
  params.num_q_heads = 3;  // 2 KV heads
  expect_error(run(params, problem_.batch(), problem_.kv()), "not a positive multiple");
}

TEST_F(CpuAttentionErrors, BlockTableShorterThanKvLen) {
  AttentionBatch batch = problem_.batch();
  batch.max_blocks_per_seq = 2;  // sequence 0 needs 3 blocks for kv_len 20
  expect_error(run(problem_.params(), batch, problem_.kv()), "needs 3 blocks");
}

TEST_F(CpuAttentionErrors, BlockIdOutOfRange) {
  problem_.tables()[1] = problem_.kv().num_blocks;
  expect_error(run(problem_.params(), problem_.batch(), problem_.kv()), "outside the pool");
  problem_.tables()[1] = -1;
  expect_error(run(problem_.params(), problem_.batch(), problem_.kv()), "outside the pool");
}

TEST_F(CpuAttentionErrors, QueryLongerThanKv) {
  std::vector<int32_t> kv_lens = {1, 9};  // sequence 0 has q_len 2
  AttentionBatch batch = problem_.batch();
  batch.kv_lens = kv_lens.data();
  expect_error(run(problem_.params(), batch, problem_.kv()), "kv_len 1 < q_len 2");
}

TEST_F(CpuAttentionErrors, NullQuery) {
  expect_error(cpu::paged_attention(problem_.params(), problem_.batch(), problem_.kv(), nullptr,
                                    DType::F32, out_.data(), nullptr),
               "null");
}

TEST_F(CpuAttentionErrors, ErrorsLeaveTheOutputUntouched) {
  AttentionParams params = problem_.params();
  params.window = -1;
  expect_error(run(params, problem_.batch(), problem_.kv()), "window");
  const std::vector<std::byte> fresh = problem_.poisoned_out();
  EXPECT_EQ(std::memcmp(out_.data(), fresh.data(), fresh.size()), 0);
}

}  // namespace
}  // namespace kvp

// cuda::paged_attention against reference_paged_attention (double precision, backend/attention.h)
// on fresh random inputs: block sizes, head dims, GQA ratios, query lengths, kv_len at block
// multiples +-1, windows, soft cap, mixed batches, long contexts (split-KV), shuffled block
// tables. The output is poisoned with NaN first, so an unwritten element fails the check; so is
// every 16-bit K and V row no sequence holds (slots past a sequence's length in its last block,
// spare and released blocks), so a kernel that reads one and lets it into a sum fails too.
// 8-bit KV (int8, fp8 e4m3; every 8-bit test runs for both): the pool is written on the device by
// the quantising KV write (rows of random magnitude, so scales differ row to row), copied back,
// and the reference runs on those bytes (the dequantised cache).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backend/attention.h"
#include "backend/cuda/kv_pool.h"
#include "backend/cuda/paged_attention.h"
#include "backend/gpu/gpu_test_support.h"
#include "support/tensor_check.h"

namespace kvp::cuda {
namespace {

using testing::GpuTest;
using testing::to_device;
using testing::to_host;

struct SeqSpec {
  int32_t q_len;
  int32_t kv_len;
};

struct Case {
  int32_t num_q_heads = 8;
  int32_t num_kv_heads = 2;
  int32_t head_dim = 128;
  int32_t block_size = 16;
  DType dtype = DType::BF16;    // KV
  DType q_dtype = DType::BF16;  // q and out when dtype is 8-bit (else dtype)
  float soft_cap = 0.0f;
  int32_t window = 0;
  std::vector<SeqSpec> seqs;
  // With a window, leave the block-table entries before the first visible block at -1: the
  // kernels must never read them.
  bool release_blocks_behind_window = false;
  std::vector<float> sinks;  // [num_q_heads] attention sinks, or empty: none
};

std::string describe(const Case& c) {
  std::string s =
      fmt::format("q_heads {} kv_heads {} D {} block {} {}{} cap {} window {}{} seqs",
                  c.num_q_heads, c.num_kv_heads, c.head_dim, c.block_size, dtype_name(c.dtype),
                  is_kv8(c.dtype) ? fmt::format(" (q {})", dtype_name(c.q_dtype)) : std::string(),
                  c.soft_cap, c.window, c.sinks.empty() ? "" : " sinks");
  for (const SeqSpec& q : c.seqs) s += fmt::format(" ({},{})", q.q_len, q.kv_len);
  return s;
}

// An 8-bit pool of `layout` (one layer) written by cuda::kv_write from random rows of row_dtype,
// every slot of every block: row r of K (V) is uniform in [-m_r, m_r) with m_r = 2^u, u uniform
// in [-3, 3).
DeviceBuffer write_kv8_pool(const KvLayout& layout, DType row_dtype, std::mt19937_64& rng) {
  const int64_t num_slots = int64_t{layout.num_blocks} * layout.block_size;
  const int64_t row_elems = int64_t{layout.num_kv_heads} * layout.head_dim;
  const size_t elem = dtype_size_bytes(row_dtype);
  std::vector<uint8_t> k(num_slots * row_elems * elem), v(k.size());
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f), exponent(-3.0f, 3.0f);
  for (std::vector<uint8_t>* rows : {&k, &v}) {
    for (int64_t r = 0; r < num_slots * layout.num_kv_heads; ++r) {
      const float magnitude = std::exp2(exponent(rng));
      for (int32_t d = 0; d < layout.head_dim; ++d) {
        store_from_f32(rows->data(), row_dtype, r * layout.head_dim + d, magnitude * unit(rng));
      }
    }
  }
  std::vector<int64_t> slots(num_slots);
  std::iota(slots.begin(), slots.end(), int64_t{0});
  DeviceBuffer d_slab = DeviceBuffer::allocate(layout.size_bytes()).value();
  DeviceBuffer d_k = to_device(k), d_v = to_device(v), d_slots = to_device(slots);
  KvWrite write;
  write.k = d_k.data();
  write.v = d_v.data();
  write.slot_mapping = d_slots.as<int64_t>();
  write.num_tokens = static_cast<int32_t>(num_slots);
  const Status status = kv_write(paged_kv_for_layer(layout, d_slab.data(), 0), write, slots.data(),
                                 row_dtype, nullptr);
  EXPECT_TRUE(status.is_ok()) << status.to_string();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return d_slab;
}

// Puts the prefill and decode kernel choices back to Auto when a test leaves, also through a
// failed ASSERT, so that one failure does not move the tests after it onto other kernels.
struct AutoKernelsAfterwards {
  ~AutoKernelsAfterwards() {
    set_prefill_kernel(PrefillKernel::Auto);
    set_decode_kernel(DecodeKernel::Auto);
  }
};

// Builds random inputs, runs the reference and the GPU, and checks the GPU output.
void run_case(const Case& c, std::mt19937_64& rng) {
  SCOPED_TRACE(describe(c));
  const int32_t num_seqs = static_cast<int32_t>(c.seqs.size());
  std::vector<int32_t> query_start(num_seqs + 1, 0), kv_lens(num_seqs);
  int32_t max_q = 0, max_kv = 0, max_blocks = 1;
  for (int32_t i = 0; i < num_seqs; ++i) {
    query_start[i + 1] = query_start[i] + c.seqs[i].q_len;
    kv_lens[i] = c.seqs[i].kv_len;
    max_q = std::max(max_q, c.seqs[i].q_len);
    max_kv = std::max(max_kv, c.seqs[i].kv_len);
    max_blocks = std::max(max_blocks, (c.seqs[i].kv_len + c.block_size - 1) / c.block_size);
  }
  const int32_t num_tokens = query_start[num_seqs];
  // A pool with spare blocks, handed out in shuffled order.
  int32_t used_blocks = 0;
  for (const SeqSpec& s : c.seqs) used_blocks += (s.kv_len + c.block_size - 1) / c.block_size;
  const int32_t num_blocks = used_blocks + 3;
  std::vector<int32_t> order(num_blocks);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<int32_t> tables(static_cast<size_t>(num_seqs) * max_blocks, -1);
  int32_t next = 0;
  AttentionParams params;
  params.num_q_heads = c.num_q_heads;
  params.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  params.soft_cap = c.soft_cap;
  params.window = c.window;
  params.sinks = c.sinks.empty() ? nullptr : c.sinks.data();  // host: the reference's
  for (int32_t i = 0; i < num_seqs; ++i) {
    const int32_t blocks = (c.seqs[i].kv_len + c.block_size - 1) / c.block_size;
    const int32_t first_block =
        c.release_blocks_behind_window
            ? first_visible_key(params, c.seqs[i].kv_len, c.seqs[i].q_len) / c.block_size
            : 0;
    for (int32_t b = 0; b < blocks; ++b) {
      const int32_t id = order[next++];
      if (b >= first_block) tables[static_cast<size_t>(i) * max_blocks + b] = id;
    }
  }

  KvLayout layout{1, num_blocks, c.num_kv_heads, c.block_size, c.head_dim, c.dtype};
  const DType q_dtype = is_kv8(c.dtype) ? c.q_dtype : c.dtype;
  const size_t elem = dtype_size_bytes(q_dtype);
  std::vector<uint8_t> slab(layout.size_bytes());
  DeviceBuffer d_slab;
  if (is_kv8(c.dtype)) {
    d_slab = write_kv8_pool(layout, q_dtype, rng);
    slab = to_host<uint8_t>(d_slab.data(), layout.size_bytes());
  } else {
    kvp::testing::fill_random(slab.data(), c.dtype, static_cast<size_t>(layout.size_elems()), rng);
    // NaN (all ones in bf16 and f16) in every row no sequence holds
    std::vector<bool> held(static_cast<size_t>(num_blocks) * c.block_size, false);
    for (int32_t i = 0; i < num_seqs; ++i) {
      for (int32_t b = 0; b < max_blocks; ++b) {
        const int32_t id = tables[static_cast<size_t>(i) * max_blocks + b];
        for (int32_t t = 0; id >= 0 && t < c.block_size && b * c.block_size + t < kv_lens[i]; ++t) {
          held[static_cast<size_t>(id) * c.block_size + t] = true;
        }
      }
    }
    const PagedKv rows = paged_kv_for_layer(layout, slab.data(), 0);
    const size_t row_bytes = static_cast<size_t>(c.head_dim) * dtype_size_bytes(c.dtype);
    for (int32_t id = 0; id < num_blocks; ++id) {
      for (int32_t t = 0; t < c.block_size; ++t) {
        if (held[static_cast<size_t>(id) * c.block_size + t]) continue;
        for (int32_t h = 0; h < c.num_kv_heads; ++h) {
          const size_t at =
              static_cast<size_t>(rows.row_offset(id, h, t)) * dtype_size_bytes(c.dtype);
          std::fill_n(static_cast<uint8_t*>(rows.k) + at, row_bytes, uint8_t{0xff});
          std::fill_n(static_cast<uint8_t*>(rows.v) + at, row_bytes, uint8_t{0xff});
        }
      }
    }
    d_slab = to_device(slab);
  }
  const size_t q_elems = static_cast<size_t>(num_tokens) * c.num_q_heads * c.head_dim;
  std::vector<uint8_t> q(q_elems * elem), ref(q_elems * elem);
  kvp::testing::fill_random(q.data(), q_dtype, q_elems, rng, -2.0f, 2.0f);

  AttentionBatch host_batch;
  host_batch.num_seqs = num_seqs;
  host_batch.num_tokens = num_tokens;
  host_batch.query_start = query_start.data();
  host_batch.kv_lens = kv_lens.data();
  host_batch.block_tables = tables.data();
  host_batch.max_blocks_per_seq = max_blocks;
  host_batch.max_q_len = max_q;
  host_batch.max_kv_len = max_kv;
  const PagedKv host_kv = paged_kv_for_layer(layout, slab.data(), 0);
  ASSERT_TRUE(check_attention_args(params, host_batch, host_kv).is_ok());
  reference_paged_attention(params, host_batch, host_kv, q.data(), q_dtype, ref.data());

  DeviceBuffer d_q = to_device(q);
  DeviceBuffer d_out = DeviceBuffer::allocate(q_elems * elem + 16).value();
  DeviceBuffer d_start = to_device(query_start);
  DeviceBuffer d_kv_lens = to_device(kv_lens);
  DeviceBuffer d_tables = to_device(tables);
  AttentionBatch batch = host_batch;
  batch.query_start = d_start.as<int32_t>();
  batch.kv_lens = d_kv_lens.as<int32_t>();
  batch.block_tables = d_tables.as<int32_t>();
  const PagedKv kv = paged_kv_for_layer(layout, d_slab.data(), 0);
  DeviceBuffer d_sinks;
  if (!c.sinks.empty()) {
    d_sinks = to_device(c.sinks);
    params.sinks = d_sinks.as<float>();
  }
  AttentionWorkspace workspace;
  // Prefill rows run on the Hopper kernel and 16-bit decode rows on the tensor-core kernel where
  // the device and shape allow it: then the portable prefill kernel and the per-lane decode kernel
  // are checked as well, on the same inputs.
  const bool has_decode =
      std::any_of(c.seqs.begin(), c.seqs.end(), [](const SeqSpec& s) { return s.q_len == 1; });
  const bool other_prefill = max_q >= 2 && uses_hopper_prefill(c.dtype, c.head_dim);
  const bool other_decode =
      has_decode && !is_kv8(c.dtype) && uses_tensor_core_decode(c.dtype, c.head_dim);
  const int num_configs = other_prefill || other_decode ? 2 : 1;
  const AutoKernelsAfterwards reset;
  for (int config = 0; config < num_configs; ++config) {
    set_prefill_kernel(config == 0 ? PrefillKernel::Auto : PrefillKernel::Portable);
    // TensorCores, not Auto: Auto sends the small cases here to the per-lane kernel
    set_decode_kernel(config == 0 ? DecodeKernel::TensorCores : DecodeKernel::Lanes);
    const char* kernel_name = num_configs == 1 ? ""
                              : config == 0    ? "hopper prefill / tensor-core decode"
                                               : "portable prefill / per-lane decode";
    // Twice with one workspace: a reused workspace (split states of the first call) must not
    // leak into the second.
    for (int call = 0; call < 2; ++call) {
      KVP_ASSERT_CUDA(cudaMemset(d_out.data(), 0xff, q_elems * elem));  // NaN in bf16 and f16
      const Status status = paged_attention_checked(params, batch, host_batch, kv, d_q.data(),
                                                    q_dtype, d_out.data(), workspace, nullptr);
      ASSERT_TRUE(status.is_ok()) << status.to_string();
      KVP_ASSERT_CUDA(cudaDeviceSynchronize());
      const std::vector<uint8_t> out = to_host<uint8_t>(d_out.data(), q_elems * elem);
      const kvp::testing::TensorDiff diff =
          kvp::testing::compare(out.data(), q_dtype, ref.data(), q_dtype, q_elems);
      std::printf("%s %s call %d: %s\n", describe(c).c_str(), kernel_name, call,
                  diff.describe().c_str());
      const double tolerance = q_dtype == DType::BF16 ? 1e-2 : 5e-3;
      EXPECT_EQ(diff.non_finite, 0u) << kernel_name << " call " << call << ": " << diff.describe();
      EXPECT_LE(diff.relative_error, tolerance)
          << kernel_name << " call " << call << ": " << diff.describe();
    }
  }
}

// ---- the matrix: block size x head dim x GQA ratio x query length ----

using MatrixParam = std::tuple<int32_t, int32_t, int32_t, int32_t>;  // block, D, group, q_len

class PagedAttentionMatrix : public GpuTest, public ::testing::WithParamInterface<MatrixParam> {};

TEST_P(PagedAttentionMatrix, MatchesReferenceAtBlockBoundaries) {
  const auto [block_size, head_dim, group, q_len] = GetParam();
  std::mt19937_64 rng(
      std::hash<std::string>{}(::testing::UnitTest::GetInstance()->current_test_info()->name()) ^
      std::random_device{}());
  Case c;
  c.num_kv_heads = 2;
  c.num_q_heads = 2 * group;
  c.head_dim = head_dim;
  c.block_size = block_size;
  // kv_len at block multiples -1, 0, +1 (at least q_len), and one with no cached prefix.
  for (int32_t kv : {block_size - 1, block_size, block_size + 1, 2 * block_size + 1}) {
    c.seqs.push_back({q_len, std::max(q_len, std::max(kv, 1))});
  }
  c.seqs.push_back({q_len, q_len});
  if (block_size <= 8) c.seqs.push_back({q_len, 97});
  run_case(c, rng);
}

INSTANTIATE_TEST_SUITE_P(
    Grid, PagedAttentionMatrix,
    ::testing::Combine(::testing::Values(1, 8, 16, 32, 256), ::testing::Values(64, 128, 256),
                       ::testing::Values(1, 4, 8), ::testing::Values(1, 3, 64)),
    [](const ::testing::TestParamInfo<MatrixParam>& info) {
      return fmt::format("block{}_d{}_gqa{}_q{}", std::get<0>(info.param), std::get<1>(info.param),
                         std::get<2>(info.param), std::get<3>(info.param));
    });

// ---- 8-bit KV (int8, fp8): block sizes 16 and 32 x head dim x GQA 1 and 4 x query length ----

using Kv8MatrixParam = std::tuple<DType, int32_t, int32_t, int32_t, int32_t>;  // KV, MatrixParam

class PagedAttentionKv8Matrix : public GpuTest,
                                public ::testing::WithParamInterface<Kv8MatrixParam> {};

TEST_P(PagedAttentionKv8Matrix, MatchesReferenceOnTheWrittenPool) {
  const auto [kv_dtype, block_size, head_dim, group, q_len] = GetParam();
  std::mt19937_64 rng(
      std::hash<std::string>{}(::testing::UnitTest::GetInstance()->current_test_info()->name()) ^
      std::random_device{}());
  Case c;
  c.dtype = kv_dtype;
  c.num_kv_heads = 2;
  c.num_q_heads = 2 * group;
  c.head_dim = head_dim;
  c.block_size = block_size;
  for (int32_t kv : {block_size - 1, block_size, block_size + 1, 2 * block_size + 1, 300}) {
    c.seqs.push_back({q_len, std::max(q_len, kv)});
  }
  c.seqs.push_back({q_len, q_len});
  run_case(c, rng);
}

INSTANTIATE_TEST_SUITE_P(Grid, PagedAttentionKv8Matrix,
                         ::testing::Combine(::testing::Values(DType::I8, DType::FP8),
                                            ::testing::Values(16, 32),
                                            ::testing::Values(64, 128, 256),
                                            ::testing::Values(1, 4), ::testing::Values(1, 3, 64)),
                         [](const ::testing::TestParamInfo<Kv8MatrixParam>& info) {
                           return fmt::format("{}_block{}_d{}_gqa{}_q{}",
                                              dtype_name(std::get<0>(info.param)),
                                              std::get<1>(info.param), std::get<2>(info.param),
                                              std::get<3>(info.param), std::get<4>(info.param));
                         });

// ---- targeted cases ----

class PagedAttention : public GpuTest {
 protected:
  std::mt19937_64 rng_{std::random_device{}()};
};

TEST_F(PagedAttention, MixedBatchOfDecodePrefillAndEmptyQueries) {
  Case c;
  c.num_q_heads = 32;
  c.num_kv_heads = 8;
  c.seqs = {{1, 700}, {64, 64}, {0, 5}, {3, 129}, {1, 1}, {37, 300}, {1, 4097}};
  run_case(c, rng_);
}

TEST_F(PagedAttention, WindowSmallerAndLargerThanABlock) {
  for (int32_t window : {5, 40}) {
    for (int32_t q_len : {1, 3, 64}) {
      Case c;
      c.window = window;
      c.block_size = 16;
      c.release_blocks_behind_window = true;
      c.seqs = {{q_len, 200}, {q_len, std::max(q_len, 17)}, {q_len, q_len}};
      run_case(c, rng_);
    }
  }
}

TEST_F(PagedAttention, SoftCapWithWindowAndGqa) {
  Case c;
  c.num_q_heads = 16;
  c.num_kv_heads = 2;
  c.head_dim = 256;
  c.soft_cap = 5.0f;
  c.window = 33;
  c.block_size = 32;
  c.seqs = {{1, 300}, {64, 400}, {3, 3}};
  run_case(c, rng_);
}

TEST_F(PagedAttention, UnusualGqaRatiosAndBlockSizes) {
  for (const auto& [q_heads, kv_heads, block] :
       std::vector<std::tuple<int, int, int>>{{6, 2, 12}, {12, 1, 5}, {10, 5, 3}, {16, 1, 64}}) {
    Case c;
    c.num_q_heads = q_heads;
    c.num_kv_heads = kv_heads;
    c.block_size = block;
    c.seqs = {{1, 500}, {17, 90}, {2, 2}};
    run_case(c, rng_);
  }
}

TEST_F(PagedAttention, F16KvAndQueries) {
  Case c;
  c.dtype = DType::F16;
  c.seqs = {{1, 1000}, {64, 200}, {3, 40}};
  run_case(c, rng_);
}

TEST_F(PagedAttention, LongContextDecodeSplitsKv) {
  Case c;
  c.num_q_heads = 8;
  c.num_kv_heads = 2;
  c.seqs = {{1, 32768}, {1, 16385}, {1, 31}, {1, 4095}};
  run_case(c, rng_);
}

TEST_F(PagedAttention, LongContextPrefillChunk) {
  Case c;
  c.num_q_heads = 4;
  c.num_kv_heads = 1;
  c.seqs = {{64, 32768}, {3, 8193}};
  run_case(c, rng_);
}

TEST_F(PagedAttention, LongContextWindowedDecode) {
  Case c;
  c.window = 4096;
  c.release_blocks_behind_window = true;
  c.seqs = {{1, 32768}, {64, 20000}};
  run_case(c, rng_);
}

// The Hopper prefill kernel: it must run wherever it can (an H100 that silently fell back would
// leave it untested), over tiles of 128 rows and 128 keys: several row tiles per sequence, key
// tiles cut by the causal diagonal at every offset, a window cutting tiles, GQA 1 and 8, a soft
// cap, and sequences whose prefix ends inside a key tile.
TEST_F(PagedAttention, HopperPrefillRunsOnComputeCapability90) {
  const AutoKernelsAfterwards reset;
  int device = 0, major = 0, minor = 0;
  KVP_ASSERT_CUDA(cudaGetDevice(&device));
  KVP_ASSERT_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  KVP_ASSERT_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  const bool hopper = major == 9 && minor == 0;
  EXPECT_EQ(uses_hopper_prefill(DType::BF16, 128), hopper);
  EXPECT_EQ(uses_hopper_prefill(DType::F16, 64), hopper);
  EXPECT_FALSE(uses_hopper_prefill(DType::BF16, 256));
  EXPECT_EQ(uses_hopper_prefill(DType::I8, 128), hopper);
  EXPECT_EQ(uses_hopper_prefill(DType::FP8, 64), hopper);
  EXPECT_FALSE(uses_hopper_prefill(DType::FP8, 256));
  set_prefill_kernel(PrefillKernel::Portable);
  EXPECT_FALSE(uses_hopper_prefill(DType::BF16, 128));
}

// The tensor-core decode kernel takes 16-bit KV at head dims 64 and 128 unless the per-lane
// kernel is asked for, and 8-bit KV there either way (run_case checks both kernels' outputs).
TEST_F(PagedAttention, TensorCoreDecodeCoversHeadDims64And128) {
  const AutoKernelsAfterwards reset;
  EXPECT_TRUE(uses_tensor_core_decode(DType::BF16, 128));
  EXPECT_TRUE(uses_tensor_core_decode(DType::F16, 64));
  EXPECT_FALSE(uses_tensor_core_decode(DType::BF16, 256));
  EXPECT_TRUE(uses_tensor_core_decode(DType::I8, 128));
  set_decode_kernel(DecodeKernel::Lanes);
  EXPECT_FALSE(uses_tensor_core_decode(DType::BF16, 128));
  EXPECT_FALSE(uses_tensor_core_decode(DType::F16, 64));
  EXPECT_TRUE(uses_tensor_core_decode(DType::FP8, 64));
}

// Auto sends a call whose grid fits in one wave with splits of under 64 keys to the per-lane
// kernel (16-bit KV only), everything else where the tensor-core kernel covers the head dim;
// TensorCores and Lanes decide by the head dim alone. 32 q / 8 KV heads, d128, pages of 16.
TEST_F(PagedAttention, AutoDecodeTakesThePerLaneKernelForShortSplitsInOneWave) {
  const AutoKernelsAfterwards reset;
  AttentionParams params;
  params.num_q_heads = 32;
  params.scale = 0.088f;
  PagedKv kv;
  kv.k = kv.v = reinterpret_cast<void*>(256);  // never read: no launch
  kv.num_kv_heads = 8;
  kv.block_size = 16;
  kv.head_dim = 128;
  kv.num_blocks = 1 << 16;
  kv.block_pitch = int64_t{kv.num_kv_heads} * kv.block_size * kv.head_dim;
  const auto batch_of = [](int32_t seqs, int32_t ctx) {
    AttentionBatch b;
    b.num_seqs = b.num_tokens = seqs;
    b.max_q_len = 1;
    b.max_kv_len = ctx;
    return b;
  };
  for (const DType dtype : {DType::BF16, DType::F16, DType::I8}) {
    kv.dtype = dtype;
    const bool kv8 = is_kv8(dtype);
    // one sequence of 512 keys: 8 CTAs, split into 16 of 32 keys (short splits, one wave)
    EXPECT_EQ(decode_on_tensor_cores(params, batch_of(1, 512), kv), kv8) << dtype_name(dtype);
    // 1K keys: 16 splits of 64; 4K keys: 16 splits of 256
    EXPECT_TRUE(decode_on_tensor_cores(params, batch_of(1, 1024), kv)) << dtype_name(dtype);
    EXPECT_TRUE(decode_on_tensor_cores(params, batch_of(1, 4096), kv)) << dtype_name(dtype);
    // 256 sequences of 100 keys: splits are short but the grid takes several waves
    EXPECT_TRUE(decode_on_tensor_cores(params, batch_of(256, 100), kv)) << dtype_name(dtype);
    set_decode_kernel(DecodeKernel::TensorCores);
    EXPECT_TRUE(decode_on_tensor_cores(params, batch_of(1, 512), kv)) << dtype_name(dtype);
    set_decode_kernel(DecodeKernel::Lanes);
    EXPECT_EQ(decode_on_tensor_cores(params, batch_of(1, 4096), kv), kv8) << dtype_name(dtype);
    set_decode_kernel(DecodeKernel::Auto);
  }
  kv.dtype = DType::BF16;
  kv.head_dim = 256;
  kv.block_pitch = int64_t{kv.num_kv_heads} * kv.block_size * kv.head_dim;
  EXPECT_FALSE(decode_on_tensor_cores(params, batch_of(1, 4096), kv));
}

TEST_F(PagedAttention, PrefillTilesCutByTheDiagonalAndWindows) {
  for (const auto& [q_heads, kv_heads, head_dim, window, cap] :
       std::vector<std::tuple<int, int, int, int, float>>{{2, 2, 128, 0, 0.0f},
                                                          {32, 4, 128, 0, 0.0f},
                                                          {8, 1, 64, 0, 0.0f},
                                                          {8, 2, 128, 200, 0.0f},
                                                          {8, 2, 64, 129, 30.0f}}) {
    Case c;
    c.num_q_heads = q_heads;
    c.num_kv_heads = kv_heads;
    c.head_dim = head_dim;
    c.window = window;
    c.soft_cap = cap;
    c.release_blocks_behind_window = window > 0;
    c.seqs = {{600, 600}, {255, 1000}, {129, 129}, {2, 130}, {1, 300}, {300, 427}};
    run_case(c, rng_);
    c.dtype = DType::F16;
    run_case(c, rng_);
  }
}

// GPT-OSS's sinks: below, near and far above every logit (100: e^(100 - m) overflows f32, the
// case softmax_output_factor's second branch exists for), over decode rows with one KV split
// (short batches: the decode kernel writes out) and with several (a long sequence in the batch:
// every decode row goes through the merge), prefill rows, a window, and query heads of one KV
// group with different sinks.
TEST_F(PagedAttention, SinksJoinTheDenominatorInDecodeSplitDecodeAndPrefill) {
  Case c;
  c.num_q_heads = 8;
  c.num_kv_heads = 2;
  c.sinks = {-3.0f, 0.0f, 1.5f, 100.0f, 4.0f, -30.0f, 0.5f, 2.0f};
  for (int32_t head_dim : {64, 128}) {
    c.head_dim = head_dim;
    c.window = 0;
    c.seqs = {{1, 1}, {1, 17}, {1, 31}, {5, 5}};
    run_case(c, rng_);
    c.seqs = {{1, 1}, {1, 17}, {1, 700}, {1, 8193}, {64, 64}, {5, 300}, {37, 37}};
    run_case(c, rng_);
    c.window = 24;
    c.seqs = {{1, 9000}, {1, 20}, {40, 200}, {3, 3}};
    run_case(c, rng_);
  }
}

// ---- bad arguments ----

class PagedAttentionArgs : public GpuTest {};

TEST_F(PagedAttentionArgs, RejectsBadArgumentsBeforeLaunching) {
  KvLayout layout{1, 4, 2, 16, 128, DType::BF16};
  DeviceBuffer slab = DeviceBuffer::allocate(layout.size_bytes()).value();
  const PagedKv kv = paged_kv_for_layer(layout, slab.data(), 0);
  std::vector<int32_t> start = {0, 2}, kv_lens = {20}, tables = {0, 7};  // block 7 not in pool
  AttentionBatch host;
  host.num_seqs = 1;
  host.num_tokens = 2;
  host.query_start = start.data();
  host.kv_lens = kv_lens.data();
  host.block_tables = tables.data();
  host.max_blocks_per_seq = 2;
  host.max_q_len = 2;
  host.max_kv_len = 20;
  DeviceBuffer d_start = to_device(start), d_lens = to_device(kv_lens), d_tab = to_device(tables);
  AttentionBatch dev = host;
  dev.query_start = d_start.as<int32_t>();
  dev.kv_lens = d_lens.as<int32_t>();
  dev.block_tables = d_tab.as<int32_t>();
  DeviceBuffer q = DeviceBuffer::allocate(2 * 8 * 128 * 2).value();
  DeviceBuffer out = DeviceBuffer::allocate(2 * 8 * 128 * 2).value();
  AttentionParams params;
  params.num_q_heads = 8;
  AttentionWorkspace ws;

  Status s = paged_attention_checked(params, dev, host, kv, q.data(), DType::BF16, out.data(), ws,
                                     nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("block 7"), std::string::npos) << s.message();

  tables[1] = 1;
  s = paged_attention(params, dev, kv, q.data(), DType::F16, out.data(), ws, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.to_string();

  params.num_q_heads = 7;
  s = paged_attention(params, dev, kv, q.data(), DType::BF16, out.data(), ws, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  params.num_q_heads = 8;

  KvLayout odd = layout;
  odd.head_dim = 96;
  s = paged_attention(params, dev, paged_kv_for_layer(odd, slab.data(), 0), q.data(), DType::BF16,
                      out.data(), ws, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.to_string();

  kv_lens[0] = 1;  // kv_len < q_len
  s = paged_attention_checked(params, dev, host, kv, q.data(), DType::BF16, out.data(), ws,
                              nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();

  AttentionBatch other = host;
  other.max_q_len = 5;
  s = paged_attention_checked(params, dev, other, kv, q.data(), DType::BF16, out.data(), ws,
                              nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
}

// ---- 8-bit KV targeted cases, each for int8 and fp8 ----

class PagedAttentionKv8 : public GpuTest, public ::testing::WithParamInterface<DType> {
 protected:
  std::mt19937_64 rng_{std::random_device{}()};
};

TEST_P(PagedAttentionKv8, MixedBatchOfDecodePrefillAndEmptyQueries) {
  Case c;
  c.dtype = GetParam();
  c.num_q_heads = 32;
  c.num_kv_heads = 8;
  c.seqs = {{1, 700}, {64, 64}, {0, 5}, {3, 129}, {1, 1}, {37, 300}, {1, 4097}};
  run_case(c, rng_);
}

TEST_P(PagedAttentionKv8, WindowWithReleasedBlocks) {
  for (int32_t window : {5, 40}) {
    for (int32_t q_len : {1, 3, 64}) {
      Case c;
      c.dtype = GetParam();
      c.window = window;
      c.block_size = 16;
      c.release_blocks_behind_window = true;
      c.seqs = {{q_len, 200}, {q_len, std::max(q_len, 17)}, {q_len, q_len}};
      run_case(c, rng_);
    }
  }
}

TEST_P(PagedAttentionKv8, SoftCapWithWindowAndGqa) {
  Case c;
  c.dtype = GetParam();
  c.num_q_heads = 16;
  c.num_kv_heads = 2;
  c.head_dim = 256;
  c.soft_cap = 5.0f;
  c.window = 33;
  c.block_size = 32;
  c.seqs = {{1, 300}, {64, 400}, {3, 3}};
  run_case(c, rng_);
}

TEST_P(PagedAttentionKv8, KvWithF16Queries) {
  Case c;
  c.dtype = GetParam();
  c.q_dtype = DType::F16;
  c.seqs = {{1, 1000}, {64, 200}, {3, 40}};
  run_case(c, rng_);
}

TEST_P(PagedAttentionKv8, LongContextDecodeSplitsKvAndPrefillChunk) {
  Case c;
  c.dtype = GetParam();
  c.num_q_heads = 8;
  c.num_kv_heads = 2;
  c.seqs = {{1, 32768}, {1, 16385}, {1, 31}, {64, 20000}};
  run_case(c, rng_);
}

// The tensor-core decode kernel (head dims 64 and 128): every heads-per-CTA instantiation (GQA 2,
// 8, 16 = two CTAs of 8), block size 8 (a warp's 16-key group spans two blocks) and 24 (not a
// power of two), a soft cap, a window that starts inside a 16-key group, sinks, and splits.
TEST_P(PagedAttentionKv8, TensorCoreDecodeShapes) {
  for (int32_t head_dim : {64, 128}) {
    for (int32_t group : {2, 8, 16}) {
      for (int32_t block_size : {8, 24}) {
        Case c;
        c.dtype = GetParam();
        c.head_dim = head_dim;
        c.num_kv_heads = 2;
        c.num_q_heads = 2 * group;
        c.block_size = block_size;
        c.soft_cap = group == 8 ? 5.0f : 0.0f;
        c.window = group == 2 ? 37 : 0;
        c.release_blocks_behind_window = c.window > 0;
        if (group == 16) {
          for (int32_t h = 0; h < c.num_q_heads; ++h) c.sinks.push_back(0.25f * h - 2.0f);
        }
        c.seqs = {{1, 1}, {1, 15}, {1, 17}, {1, 33}, {1, 700}, {1, 5001}};
        run_case(c, rng_);
      }
    }
  }
}

TEST_P(PagedAttentionKv8, RefusesBlockSizesNotAMultipleOf8) {
  const KvLayout layout{1, 4, 2, 12, 128, GetParam()};
  DeviceBuffer slab = DeviceBuffer::allocate(layout.size_bytes()).value();
  AttentionParams params;
  params.num_q_heads = 8;
  AttentionBatch batch;
  const Status s = paged_attention(params, batch, paged_kv_for_layer(layout, slab.data(), 0),
                                   nullptr, DType::BF16, nullptr, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.to_string();
  EXPECT_EQ(DeviceKvPool::create(KvLayout{1, 4, 2, 12, 128, GetParam()}).status().code(),
            StatusCode::kUnsupported);
}

INSTANTIATE_TEST_SUITE_P(Kv8, PagedAttentionKv8, ::testing::Values(DType::I8, DType::FP8),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(dtype_name(info.param));
                         });

}  // namespace
}  // namespace kvp::cuda

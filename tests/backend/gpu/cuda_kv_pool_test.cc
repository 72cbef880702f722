// DeviceKvPool and kv_write: the KV write from a slot mapping (negative = skip), copy-on-write
// block copies in one launch, block moves to and from pinned host memory, each against the
// expected slab computed on the host from the layout formulas (cache/kv_layout.h).
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "backend/cuda/kv_pool.h"
#include "backend/gpu/gpu_test_support.h"
#include "cache/kv_quant.h"
#include "support/tensor_check.h"

namespace kvp::cuda {
namespace {

using testing::GpuTest;
using testing::to_device;
using testing::to_host;

class CudaKvPool : public GpuTest {
 protected:
  std::mt19937_64 rng_{std::random_device{}()};

  // A pool with random contents; `host` receives the same bytes.
  DeviceKvPool make_pool(const KvLayout& layout, std::vector<uint8_t>& host) {
    Result<DeviceKvPool> pool = DeviceKvPool::create(layout);
    EXPECT_TRUE(pool.is_ok()) << pool.status().to_string();
    host.resize(layout.size_bytes());
    kvp::testing::fill_random(host.data(), layout.dtype, static_cast<size_t>(layout.size_elems()),
                              rng_);
    EXPECT_EQ(cudaMemcpy(pool->slab(), host.data(), host.size(), cudaMemcpyHostToDevice),
              cudaSuccess);
    return std::move(pool).value();
  }
};

TEST_F(CudaKvPool, RejectsBadGeometry) {
  EXPECT_EQ(DeviceKvPool::create(KvLayout{1, 0, 2, 16, 128, DType::BF16}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(DeviceKvPool::create(KvLayout{1, 4, 2, 16, 128, DType::F32}).status().code(),
            StatusCode::kUnsupported);
}

TEST_F(CudaKvPool, KvWritePlacesRowsInTheirSlotsAndSkipsNegativeSlots) {
  for (const DType dtype : {DType::BF16, DType::F16}) {
    const KvLayout layout{2, 9, 3, 16, 64, dtype};
    std::vector<uint8_t> expected;
    DeviceKvPool pool = make_pool(layout, expected);
    const int32_t layer = 1;
    const int32_t num_tokens = 40;
    const size_t row_elems = size_t{3} * 64;
    const size_t elem = dtype_size_bytes(dtype);
    std::vector<uint8_t> k(num_tokens * row_elems * elem), v(k.size());
    kvp::testing::fill_random(k.data(), dtype, num_tokens * row_elems, rng_);
    kvp::testing::fill_random(v.data(), dtype, num_tokens * row_elems, rng_);
    std::vector<int64_t> slots(9 * 16);
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng_);
    slots.resize(num_tokens);
    slots[3] = -1;
    slots[17] = -5;
    for (int32_t t = 0; t < num_tokens; ++t) {
      if (slots[t] < 0) continue;
      const int32_t block = static_cast<int32_t>(slots[t] / 16);
      const int32_t in_block = static_cast<int32_t>(slots[t] % 16);
      for (int32_t h = 0; h < 3; ++h) {
        for (int32_t kv = 0; kv < 2; ++kv) {
          const auto& src = kv == 0 ? k : v;
          std::memcpy(expected.data() + layout.elem_offset(layer, block, kv, h, in_block) * elem,
                      src.data() + (t * row_elems + h * 64) * elem, 64 * elem);
        }
      }
    }
    DeviceBuffer d_k = to_device(k), d_v = to_device(v), d_slots = to_device(slots);
    KvWrite write{d_k.data(), d_v.data(), d_slots.as<int64_t>(), num_tokens};
    const Status s = kv_write(pool.layer(layer), write, slots.data(), nullptr);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    KVP_ASSERT_CUDA(cudaDeviceSynchronize());
    const std::vector<uint8_t> got = to_host<uint8_t>(pool.slab(), expected.size());
    EXPECT_TRUE(got == expected) << "slab differs after the KV write (" << dtype_name(dtype) << ")";

    slots[0] = 9 * 16;  // one past the pool
    const Status bad = kv_write(pool.layer(layer), write, slots.data(), nullptr);
    EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument) << bad.to_string();
  }
}

// ---- 8-bit pools (int8, fp8 e4m3): one test body per behaviour, run for each format ----

class CudaKvPoolKv8 : public CudaKvPool, public ::testing::WithParamInterface<DType> {};

// The quantising write's bytes (8-bit codes and f16 scales) equal quantize_kv8 of the pool's
// dtype on the host for the same rows widened to f32, bit for bit: random rows of random
// magnitude, an all-zero row, rows holding a NaN, an infinity, values near the f16 and bf16
// limits and tiny ones (f16 subnormal scales), a row whose maximum is 448 (scale 1: its values
// land on the e4m3 grid up to the largest code), one with an outlier 2^12 times its other values
// (fp8 subnormal codes), one of exact midpoints between neighbouring e4m3 values (ties to even),
// bf16 and f16 rows, two head dims and block sizes.
TEST_P(CudaKvPoolKv8, KvWriteMatchesHostQuantisationBitForBit) {
  const DType kv_dtype = GetParam();
  std::uniform_int_distribution<int> e4m3_code(0, 0x7d);  // up to 448's lower neighbour
  for (const auto& [row_dtype, head_dim, block_size] :
       std::vector<std::tuple<DType, int32_t, int32_t>>{
           {DType::BF16, 128, 16}, {DType::F16, 64, 32}, {DType::BF16, 256, 8}}) {
    SCOPED_TRACE(fmt::format("{} rows, head dim {}, block size {}", dtype_name(row_dtype), head_dim,
                             block_size));
    const int32_t num_blocks = 7, num_heads = 3, layer = 1;
    const KvLayout layout{2, num_blocks, num_heads, block_size, head_dim, kv_dtype};
    Result<DeviceKvPool> pool = DeviceKvPool::create(layout);
    ASSERT_TRUE(pool.is_ok()) << pool.status().to_string();
    KVP_ASSERT_CUDA(cudaMemset(pool->slab(), 0, layout.size_bytes()));
    std::vector<uint8_t> expected(layout.size_bytes(), 0);

    const int32_t num_tokens = num_blocks * block_size - 3;
    const size_t row_elems = size_t{num_heads} * head_dim;
    const size_t elem = dtype_size_bytes(row_dtype);
    std::vector<uint8_t> k(num_tokens * row_elems * elem), v(k.size());
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f), exponent(-20.0f, 14.0f);
    const float big = row_dtype == DType::F16 ? 65504.0f : 3.0e38f;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float inf = std::numeric_limits<float>::infinity();
    for (std::vector<uint8_t>* rows : {&k, &v}) {
      for (size_t r = 0; r < num_tokens * size_t{num_heads}; ++r) {
        const float magnitude = std::exp2(exponent(rng_));
        for (int32_t d = 0; d < head_dim; ++d) {
          float x = magnitude * unit(rng_);
          if (r == 5) x = 0.0f;                                    // all-zero row
          if (r == 7 && d == 3) x = nan;                           // NaN element
          if (r == 8 && d == 0) x = -inf;                          // infinite element
          if (r == 9) x = big * unit(rng_);                        // near the format's limit
          if (r == 10) x = 1e-7f * unit(rng_);                     // subnormal f16 scale
          if (r == 11) x = d == 0 ? 448.0f : 448.0f * unit(rng_);  // scale exactly 1
          if (r == 12) x = d == 1 ? -4096.0f * magnitude : x;      // outlier
          if (r == 13) {  // max 448 (scale 1), the rest midway between two e4m3 values
            const auto code = static_cast<uint8_t>(e4m3_code(rng_));
            const float mid =
                0.5f * (e4m3_to_f32(code) + e4m3_to_f32(static_cast<uint8_t>(code + 1)));
            x = d == 0 ? 448.0f : (unit(rng_) < 0.0f ? -mid : mid);
          }
          store_from_f32(rows->data(), row_dtype, r * head_dim + d, x);
        }
      }
    }
    std::vector<int64_t> slots(size_t{num_blocks} * block_size);
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng_);
    slots.resize(num_tokens);
    slots[2] = -1;
    std::vector<float> x(head_dim);
    for (int32_t t = 0; t < num_tokens; ++t) {
      if (slots[t] < 0) continue;
      const auto block = static_cast<int32_t>(slots[t] / block_size);
      const auto in_block = static_cast<int32_t>(slots[t] % block_size);
      for (int32_t h = 0; h < num_heads; ++h) {
        for (int32_t kv = 0; kv < 2; ++kv) {
          const auto& src = kv == 0 ? k : v;
          for (int32_t d = 0; d < head_dim; ++d) {
            x[d] = load_as_f32(src.data(), row_dtype, (t * row_elems) + h * head_dim + d);
          }
          F16 scale;
          quantize_kv8(kv_dtype, x.data(), head_dim,
                       reinterpret_cast<uint8_t*>(
                           expected.data() + layout.elem_offset(layer, block, kv, h, in_block)),
                       &scale);
          std::memcpy(expected.data() + layout.scale_offset(layer, block, kv, h, in_block), &scale,
                      sizeof scale);
        }
      }
    }
    DeviceBuffer d_k = to_device(k), d_v = to_device(v), d_slots = to_device(slots);
    KvWrite write{d_k.data(), d_v.data(), d_slots.as<int64_t>(), num_tokens};
    const Status s = kv_write(pool->layer(layer), write, slots.data(), row_dtype, nullptr);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    KVP_ASSERT_CUDA(cudaDeviceSynchronize());
    const std::vector<uint8_t> got = to_host<uint8_t>(pool->slab(), expected.size());
    size_t mismatches = 0, first = got.size();
    for (size_t i = 0; i < got.size(); ++i) {
      if (got[i] != expected[i]) {
        ++mismatches;
        first = std::min(first, i);
      }
    }
    EXPECT_EQ(mismatches, 0u) << "first differing byte " << first << " of " << got.size()
                              << (first < got.size()
                                      ? fmt::format(": got {} want {}", int{got[first]},
                                                    int{expected[first]})
                                      : std::string());
  }
}

TEST_P(CudaKvPoolKv8, KvWriteRefusesRowsOfAnotherDtype) {
  const KvLayout layout{1, 2, 1, 16, 64, GetParam()};
  Result<DeviceKvPool> pool = DeviceKvPool::create(layout);
  ASSERT_TRUE(pool.is_ok()) << pool.status().to_string();
  KvWrite write;
  const Status s = kv_write(pool->layer(0), write, nullptr, DType::F32, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.to_string();
}

INSTANTIATE_TEST_SUITE_P(Kv8, CudaKvPoolKv8, ::testing::Values(DType::I8, DType::FP8),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(dtype_name(info.param));
                         });

TEST_F(CudaKvPool, CopyBlocksCopiesEveryLayerInOneBatch) {
  const KvLayout layout{3, 12, 2, 8, 128, DType::BF16};
  std::vector<uint8_t> expected;
  DeviceKvPool pool = make_pool(layout, expected);
  const std::vector<BlockCopy> ops = {
      {BlockId{0}, BlockId{5}}, {BlockId{11}, BlockId{1}}, {BlockId{7}, BlockId{2}}};
  const size_t elem = 2;
  const size_t run = static_cast<size_t>(layout.block_pitch()) * elem;
  const std::vector<uint8_t> before = expected;
  for (const BlockCopy& op : ops) {
    for (int32_t layer = 0; layer < 3; ++layer) {
      std::memcpy(expected.data() + layout.block_offset(layer, op.dst.value, 0) * elem,
                  before.data() + layout.block_offset(layer, op.src.value, 0) * elem, run);
    }
  }
  Status s = pool.copy_blocks(ops, nullptr);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  // A second batch right away reuses the pinned staging.
  s = pool.copy_blocks(std::vector<BlockCopy>{{BlockId{3}, BlockId{4}}}, nullptr);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  for (int32_t layer = 0; layer < 3; ++layer) {
    std::memcpy(expected.data() + layout.block_offset(layer, 4, 0) * elem,
                expected.data() + layout.block_offset(layer, 3, 0) * elem, run);
  }
  KVP_ASSERT_CUDA(cudaDeviceSynchronize());
  EXPECT_TRUE(to_host<uint8_t>(pool.slab(), expected.size()) == expected);

  s = pool.copy_blocks(std::vector<BlockCopy>{{BlockId{3}, BlockId{12}}}, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  s = pool.copy_blocks(std::vector<BlockCopy>{{BlockId{3}, BlockId{3}}}, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
}

TEST_F(CudaKvPool, BlocksRoundTripThroughPinnedHostMemory) {
  const KvLayout layout{4, 10, 2, 16, 64, DType::F16};
  std::vector<uint8_t> expected;
  DeviceKvPool pool = make_pool(layout, expected);
  const std::vector<BlockId> out_blocks = {BlockId{8}, BlockId{2}, BlockId{5}};
  PinnedBuffer host = PinnedBuffer::allocate(out_blocks.size() * layout.block_size_bytes()).value();
  cudaStream_t stream = nullptr;
  KVP_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  Status s = pool.copy_blocks_to_host(out_blocks, host, stream);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  KVP_ASSERT_CUDA(cudaStreamSynchronize(stream));
  const size_t elem = 2;
  const size_t run = static_cast<size_t>(layout.block_pitch()) * elem;
  for (size_t i = 0; i < out_blocks.size(); ++i) {
    for (int32_t layer = 0; layer < 4; ++layer) {
      EXPECT_EQ(
          std::memcmp(host.as<uint8_t>() + i * layout.block_size_bytes() + layer * run,
                      expected.data() + layout.block_offset(layer, out_blocks[i].value, 0) * elem,
                      run),
          0)
          << "block " << out_blocks[i].value << " layer " << layer;
    }
  }
  // Restore into other blocks (a session coming back to a different place in the pool).
  const std::vector<BlockId> in_blocks = {BlockId{0}, BlockId{9}, BlockId{3}};
  s = pool.copy_blocks_from_host(host, in_blocks, stream);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  KVP_ASSERT_CUDA(cudaStreamSynchronize(stream));
  for (size_t i = 0; i < in_blocks.size(); ++i) {
    for (int32_t layer = 0; layer < 4; ++layer) {
      std::memcpy(expected.data() + layout.block_offset(layer, in_blocks[i].value, 0) * elem,
                  host.as<uint8_t>() + i * layout.block_size_bytes() + layer * run, run);
    }
  }
  EXPECT_TRUE(to_host<uint8_t>(pool.slab(), expected.size()) == expected);

  s = pool.copy_blocks_to_host(std::vector<BlockId>{BlockId{10}}, host, stream);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  PinnedBuffer small = PinnedBuffer::allocate(16).value();
  s = pool.copy_blocks_from_host(small, in_blocks, stream);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  KVP_ASSERT_CUDA(cudaStreamDestroy(stream));
}

}  // namespace
}  // namespace kvp::cuda

// DeviceKvPool and kv_write: the KV write from a slot mapping (negative = skip), copy-on-write
// block copies in one launch, block moves to and from pinned host memory, each against the
// expected slab computed on the host from the layout formulas (cache/kv_layout.h).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cuda/kv_pool.h"
#include "backend/gpu/gpu_test_support.h"
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

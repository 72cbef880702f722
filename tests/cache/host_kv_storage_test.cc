// HostKvStorage: slab sizes and alignment, typed views at the offsets DESIGN.md §3 gives
// (worked out by hand here), block copy, and gather / scatter through block tables of several
// block sizes, including a windowed group whose table has holes.
#include "cache/host_kv_storage.h"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace kvp {
namespace {

// 3 layers: 0 and 2 global, 1 windowed (6 tokens). 2 KV heads, head_dim 3, f32.
CacheSpec small_spec(int32_t block_size, DType dtype = DType::F32) {
  return CacheSpec::create(
             "test", 3, 2, 3, dtype, block_size,
             {LayerAttention::global(), LayerAttention::sliding(6), LayerAttention::global()})
      .value();
}

HostKvStorage make_storage(const CacheSpec& spec, std::vector<int32_t> num_blocks) {
  Result<HostKvStorage> s = HostKvStorage::create(spec, num_blocks);
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  return std::move(s).value();
}

std::vector<float> as_floats(std::span<const std::byte> bytes) {
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

void fill_random(std::span<std::byte> bytes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (size_t i = 0; i + sizeof(float) <= bytes.size(); i += sizeof(float)) {
    const float v = dist(rng);
    std::memcpy(bytes.data() + i, &v, sizeof(float));
  }
}

TEST(HostKvStorage, SlabsAreSizedByLayoutZeroedAndAligned) {
  const CacheSpec spec = small_spec(4);
  const HostKvStorage s = make_storage(spec, {5, 7});
  ASSERT_EQ(s.num_groups(), 2);
  // Group 0 (global): 2 layers * 5 blocks * 2 (K, V) * 2 heads * 4 tokens * 3 dims * 4 bytes.
  EXPECT_EQ(s.slab(0).size(), 2u * 5 * 2 * 2 * 4 * 3 * 4);
  // Group 1 (window): 1 layer * 7 blocks.
  EXPECT_EQ(s.slab(1).size(), 1u * 7 * 2 * 2 * 4 * 3 * 4);
  EXPECT_EQ(s.slab(0).size(), s.layout(0).size_bytes());
  for (int32_t g = 0; g < 2; ++g) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(s.slab(g).data()) % HostKvStorage::kAlignment, 0u);
    for (std::byte b : s.slab(g)) ASSERT_EQ(b, std::byte{0});
  }
}

TEST(HostKvStorage, CreateRejectsBadBlockCounts) {
  const CacheSpec spec = small_spec(4);
  EXPECT_EQ(HostKvStorage::create(spec, std::vector<int32_t>{5}).status().code(),
            StatusCode::kInvalidArgument);
  const Result<HostKvStorage> negative = HostKvStorage::create(spec, std::vector<int32_t>{5, -1});
  EXPECT_EQ(negative.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(negative.status().message().find("group 1"), std::string::npos);
  EXPECT_TRUE(HostKvStorage::create(spec, std::vector<int32_t>{0, 0}).is_ok());
  // 2^31 - 1 blocks of 64 MiB (64 layers, 8 x 128 bf16, 256 tokens): 2^57 bytes > 64 TiB.
  const CacheSpec big = CacheSpec::create("big", 64, 8, 128, DType::BF16, 256,
                                          std::vector<LayerAttention>(64, LayerAttention::global()))
                            .value();
  const Result<HostKvStorage> huge =
      HostKvStorage::create(big, std::vector<int32_t>{std::numeric_limits<int32_t>::max()});
  EXPECT_EQ(huge.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(huge.status().message().find("exceed"), std::string::npos);
}

TEST(HostKvStorage, HeadBlockViewSitsAtTheDesignOffset) {
  const CacheSpec spec = small_spec(4);
  HostKvStorage s = make_storage(spec, {5, 7});
  // Group 0, group-local layer 1 (model layer 2), block 2, V, head 1: a [4][3] span.
  std::span<float> view = s.head_block<float>(0, 1, BlockId{2}, 1, 1);
  ASSERT_EQ(view.size(), 12u);
  view[3 * 3 + 2] = 42.0f;  // token 3, dim 2
  // ((layer 1 * 5 blocks + block 2) * 2 + V) * (2 heads * 4 tokens * 3 dims)
  //   + (head 1 * 4 + token 3) * 3 + dim 2 = 15 * 24 + 23 = 383.
  const std::vector<float> slab = as_floats(s.slab(0));
  EXPECT_EQ(slab[383], 42.0f);
  for (size_t i = 0; i < slab.size(); ++i) {
    if (i != 383) {
      ASSERT_EQ(slab[i], 0.0f) << i;
    }
  }
  const HostKvStorage& cs = s;
  EXPECT_EQ(cs.head_block<float>(0, 1, BlockId{2}, 1, 1)[11], 42.0f);
}

TEST(HostKvStorage, TypedViewsOfHalfTypes) {
  HostKvStorage s = make_storage(small_spec(8, DType::BF16), {2, 2});
  std::span<Bf16> view = s.head_block<Bf16>(1, 0, BlockId{1}, 0, 0);
  EXPECT_EQ(view.size(), 8u * 3);
  view[0] = f32_to_bf16(1.5f);
  EXPECT_EQ(bf16_to_f32(s.head_block<Bf16>(1, 0, BlockId{1}, 0, 0)[0]), 1.5f);
}

TEST(HostKvStorageDeathTest, ViewOfTheWrongTypeOrBlockAborts) {
  HostKvStorage s = make_storage(small_spec(8, DType::BF16), {2, 2});
  EXPECT_DEATH(s.head_block<float>(0, 0, BlockId{0}, 0, 0), "view as f32 of a bf16 cache");
  EXPECT_DEATH(s.head_block<Bf16>(0, 0, BlockId{2}, 0, 0), "block 2 of 2");
}

TEST(HostKvStorage, CopyBlocksCopiesEveryLayerInOrder) {
  const CacheSpec spec = small_spec(4);
  HostKvStorage s = make_storage(spec, {6, 2});
  fill_random(s.slab(0), 1);
  const std::vector<float> before = as_floats(s.slab(0));
  // Block stride in floats: 2 heads * 4 tokens * 3 dims = 24; K and V of a block: 48.
  auto block_run = [&](const std::vector<float>& slab, int32_t layer, int32_t block) {
    const size_t begin = (static_cast<size_t>(layer) * 6 + block) * 48;
    return std::vector<float>(slab.begin() + begin, slab.begin() + begin + 48);
  };
  const std::vector<BlockCopy> ops = {
      {BlockId{1}, BlockId{4}}, {BlockId{4}, BlockId{5}}, {BlockId{3}, BlockId{3}}};
  s.copy_blocks(0, ops);
  const std::vector<float> after = as_floats(s.slab(0));
  for (int32_t layer = 0; layer < 2; ++layer) {
    EXPECT_EQ(block_run(after, layer, 4), block_run(before, layer, 1));
    EXPECT_EQ(block_run(after, layer, 5), block_run(before, layer, 1));  // 1 -> 4 -> 5
    for (int32_t b : {0, 1, 2, 3})
      EXPECT_EQ(block_run(after, layer, b), block_run(before, layer, b));
  }
  EXPECT_NE(block_run(before, 0, 4), block_run(before, 0, 1));  // the copy changed something
}

TEST(HostKvStorageDeathTest, CopyOutsideThePoolAborts) {
  HostKvStorage s = make_storage(small_spec(4), {6, 2});
  const std::vector<BlockCopy> to_outside = {{BlockId{0}, BlockId{6}}};
  EXPECT_DEATH(s.copy_blocks(0, to_outside), "copy to block 6 of 6");
  const std::vector<BlockCopy> from_outside = {{BlockId{-1}, BlockId{0}}};
  EXPECT_DEATH(s.copy_blocks(1, from_outside), "copy from block -1 of 2");
}

TEST(HostKvStorage, GatherReadsTheTableSlotsInTokenOrder) {
  const CacheSpec spec = small_spec(4);
  HostKvStorage s = make_storage(spec, {6, 2});
  // Element i of group 0's slab holds the value i.
  std::vector<float> ramp(s.slab(0).size() / sizeof(float));
  for (size_t i = 0; i < ramp.size(); ++i) ramp[i] = static_cast<float>(i);
  std::memcpy(s.slab(0).data(), ramp.data(), s.slab(0).size());

  const std::vector<BlockId> table = {BlockId{5}, BlockId{0}, BlockId{3}};
  const int64_t begin = 2, end = 11;  // tokens 2..10: blocks 5 (2,3), 0 (4..7), 3 (8..10)
  std::vector<std::byte> k(s.dense_bytes(end - begin)), v(k.size());
  s.gather_layer(2, table, begin, end, k, v);  // model layer 2 = group 0, local layer 1
  const std::vector<float> kf = as_floats(k), vf = as_floats(v);
  for (int64_t t = begin; t < end; ++t) {
    for (int32_t h = 0; h < 2; ++h) {
      for (int32_t d = 0; d < 3; ++d) {
        const int64_t block = table[t / 4].value;
        const int64_t k_index = ((1 * 6 + block) * 2 + 0) * 24 + (h * 4 + t % 4) * 3 + d;
        const size_t row = static_cast<size_t>(((t - begin) * 2 + h) * 3 + d);
        ASSERT_EQ(kf[row], static_cast<float>(k_index)) << t << " " << h << " " << d;
        ASSERT_EQ(vf[row], static_cast<float>(k_index + 24)) << t << " " << h << " " << d;
      }
    }
  }
}

// Scatter random dense K/V into pools of block sizes 1, 4 and 16, then gather it back.
TEST(HostKvStorage, ScatterThenGatherRoundTripsAcrossBlockSizes) {
  for (int32_t block_size : {1, 4, 16}) {
    const CacheSpec spec = small_spec(block_size);
    const int64_t num_tokens = 21;
    const int32_t blocks = static_cast<int32_t>((num_tokens + block_size - 1) / block_size);
    HostKvStorage s = make_storage(spec, {blocks * 2 + 1, blocks + 1});
    // Tables in reverse, odd block order, so logical and physical order differ.
    std::vector<BlockId> table0, table1;
    for (int32_t i = 0; i < blocks; ++i) table0.push_back(BlockId{2 * blocks - 2 * i});
    for (int32_t i = 0; i < blocks; ++i) table1.push_back(BlockId{blocks - i});
    for (int32_t layer = 0; layer < 3; ++layer) {
      const auto& table = spec.group_of_layer(layer) == 0 ? table0 : table1;
      std::vector<std::byte> k(s.dense_bytes(num_tokens)), v(k.size());
      fill_random(k, 10 + layer);
      fill_random(v, 20 + layer);
      s.scatter_layer(layer, table, 0, num_tokens, k, v);
      std::vector<std::byte> k2(k.size()), v2(v.size());
      s.gather_layer(layer, table, 0, num_tokens, k2, v2);
      EXPECT_EQ(k2, k) << "block size " << block_size << " layer " << layer;
      EXPECT_EQ(v2, v) << "block size " << block_size << " layer " << layer;
    }
  }
}

TEST(HostKvStorage, ScatterTouchesOnlyTheRangeSlots) {
  const CacheSpec spec = small_spec(4);
  HostKvStorage s = make_storage(spec, {4, 4});
  fill_random(s.slab(1), 3);
  const std::vector<float> before = as_floats(s.slab(1));
  // Windowed layer 1: tokens 5..9 of a 10-token sequence; entry 0 is a hole behind the window.
  const std::vector<BlockId> table = {BlockId{-1}, BlockId{2}, BlockId{0}};
  std::vector<std::byte> k(s.dense_bytes(5)), v(k.size());
  fill_random(k, 4);
  fill_random(v, 5);
  s.scatter_layer(1, table, 5, 10, k, v);
  const std::vector<float> after = as_floats(s.slab(1));
  size_t changed = 0;
  for (size_t i = 0; i < after.size(); ++i) {
    const size_t block = i / 48, in_block = i % 48, slot = in_block % 12 / 3;
    // Written: block 2 slots 1..3 (tokens 5..7) and block 0 slots 0..1 (tokens 8, 9).
    const bool written = (block == 2 && slot >= 1) || (block == 0 && slot <= 1);
    if (!written) {
      ASSERT_EQ(after[i], before[i]) << i;
    } else {
      changed += after[i] != before[i];
    }
  }
  EXPECT_EQ(changed, 5u * 2 * 2 * 3);  // 5 tokens, K and V, 2 heads, 3 dims
  std::vector<std::byte> k2(k.size()), v2(v.size());
  s.gather_layer(1, table, 5, 10, k2, v2);
  EXPECT_EQ(k2, k);
  EXPECT_EQ(v2, v);
}

TEST(HostKvStorageDeathTest, TablesThatDoNotCoverTheRangeAbort) {
  const CacheSpec spec = small_spec(4);
  HostKvStorage s = make_storage(spec, {4, 4});
  std::vector<std::byte> k(s.dense_bytes(8)), v(k.size());
  const std::vector<BlockId> short_table = {BlockId{0}};
  EXPECT_DEATH(s.gather_layer(0, short_table, 0, 8, k, v), "block table of 1 entries");
  const std::vector<BlockId> bad_id = {BlockId{0}, BlockId{9}};
  EXPECT_DEATH(s.gather_layer(0, bad_id, 0, 8, k, v), "block 9 of 4");
  const std::vector<BlockId> ok = {BlockId{0}, BlockId{1}};
  std::vector<std::byte> small(4);
  EXPECT_DEATH(s.scatter_layer(0, ok, 0, 8, small, v), "dense K/V");
}

}  // namespace
}  // namespace kvp

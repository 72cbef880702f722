// cpu::write_kv and cpu::copy_blocks: bytes land exactly where KvLayout's addressing says, and
// nothing else in the slab changes; bad slots and block ids are refused before any byte moves.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu_attention.h"
#include "support/kv8_check.h"
#include "support/tensor_check.h"

namespace kvp {
namespace {

// Element size of a dtype, for byte comparisons.
size_t elem(DType t) { return dtype_size_bytes(t); }

TEST(CpuWriteKv, RowsLandInTheirSlotsAndNothingElseChanges) {
  std::mt19937_64 rng(31);
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    for (int32_t block_size : {1, 16}) {
      const KvLayout layout{3, 9, 2, block_size, 64, dtype};
      std::vector<std::byte> slab(layout.size_bytes());
      testing::fill_random(slab.data(), dtype, size_t(layout.size_elems()), rng);
      const std::vector<std::byte> before = slab;
      const int32_t layer = 2;
      const PagedKv kv = paged_kv_for_layer(layout, slab.data(), layer);

      const int32_t num_tokens = 6;
      const size_t row_elems = size_t(layout.num_kv_heads) * layout.head_dim;
      std::vector<std::byte> k(num_tokens * row_elems * elem(dtype));  // [tokens][heads][dim]
      std::vector<std::byte> v(k.size());
      testing::fill_random(k.data(), dtype, num_tokens * row_elems, rng);
      testing::fill_random(v.data(), dtype, num_tokens * row_elems, rng);
      const int64_t num_slots = int64_t{layout.num_blocks} * block_size;
      // Distinct slots spread over the pool, one padding row.
      std::vector<int64_t> slots = {num_slots - 1, 0, -1, num_slots / 2, 3 % num_slots,
                                    num_slots - 2};
      const KvWrite write{k.data(), v.data(), slots.data(), num_tokens};
      ASSERT_TRUE(cpu::write_kv(write, kv).is_ok());

      std::vector<std::byte> expected = before;
      for (int32_t i = 0; i < num_tokens; ++i) {
        if (slots[size_t(i)] < 0) continue;
        const int32_t block = int32_t(slots[size_t(i)] / block_size);
        const int32_t token = int32_t(slots[size_t(i)] % block_size);
        for (int32_t h = 0; h < layout.num_kv_heads; ++h) {
          const size_t src = (size_t(i) * layout.num_kv_heads + h) * layout.head_dim * elem(dtype);
          for (int32_t which = 0; which < 2; ++which) {
            const size_t dst =
                size_t(layout.elem_offset(layer, block, which, h, token)) * elem(dtype);
            std::memcpy(expected.data() + dst, (which == 0 ? k : v).data() + src,
                        layout.head_dim * elem(dtype));
          }
        }
      }
      EXPECT_TRUE(slab == expected) << dtype_name(dtype) << " block " << block_size;
      EXPECT_FALSE(slab == before);
    }
  }
}

// 8-bit pools take f32 rows: each (token, head) row lands in its slot as codes whose values times
// the row's f16 scale (after the head's rows) are within half a grid step of the input, the
// scale covering max|x| without clipping; every other byte of the slab stays as it was.
TEST(CpuWriteKv, Kv8RowsAreQuantisedIntoTheirSlotsWithTheirScales) {
  std::mt19937_64 rng(37);
  std::uniform_real_distribution<float> value(-3.0f, 3.0f);
  for (DType dtype : {DType::I8, DType::FP8}) {
    const KvLayout layout{2, 7, 2, 16, 64, dtype};
    std::vector<std::byte> slab(layout.size_bytes());
    for (std::byte& b : slab) b = std::byte{0x5a};
    const int32_t layer = 1;
    const PagedKv kv = paged_kv_for_layer(layout, slab.data(), layer);
    const int32_t num_tokens = 4;
    const size_t row_elems = size_t(layout.num_kv_heads) * layout.head_dim;
    std::vector<float> k(num_tokens * row_elems), v(k.size());  // [tokens][heads][dim] f32
    for (float& x : k) x = value(rng);
    for (float& x : v) x = value(rng) * 0.01f;
    std::vector<int64_t> slots = {5, -1, 16 * 6 + 15, 17};
    ASSERT_TRUE(cpu::write_kv({k.data(), v.data(), slots.data(), num_tokens}, kv).is_ok());

    std::vector<bool> touched(slab.size(), false);
    for (int32_t i = 0; i < num_tokens; ++i) {
      if (slots[size_t(i)] < 0) continue;
      const int32_t block = int32_t(slots[size_t(i)] / 16);
      const int32_t token = int32_t(slots[size_t(i)] % 16);
      for (int32_t h = 0; h < layout.num_kv_heads; ++h) {
        for (int32_t which = 0; which < 2; ++which) {
          const float* x = (which == 0 ? k : v).data() + (size_t(i) * 2 + h) * layout.head_dim;
          const size_t row = size_t(layout.elem_offset(layer, block, which, h, token));
          const size_t scale_at = size_t(layout.scale_offset(layer, block, which, h, token));
          uint16_t bits = 0;
          std::memcpy(&bits, slab.data() + scale_at, 2);
          const double s = f16_to_f32(F16{bits});
          touched[scale_at] = touched[scale_at + 1] = true;
          double max_abs = 0;
          for (int32_t d = 0; d < layout.head_dim; ++d)
            max_abs = std::max(max_abs, double(std::fabs(x[d])));
          EXPECT_GE(s * testing::kv8_max_code(dtype), max_abs);
          EXPECT_LE(s, max_abs / testing::kv8_max_code(dtype) * (1 + 1.0 / 1024));
          for (int32_t d = 0; d < layout.head_dim; ++d) {
            touched[row + d] = true;
            const double got = testing::kv8_code_value(dtype, uint8_t(slab[row + d])) * s;
            ASSERT_LE(std::fabs(got - x[d]), testing::kv8_half_step(dtype, x[d] / s) * s * 1.0001)
                << dtype_name(dtype) << " token " << i << " head " << h << " kv " << which
                << " dim " << d;
          }
        }
      }
    }
    for (size_t b = 0; b < slab.size(); ++b) {
      if (!touched[b]) {
        ASSERT_EQ(slab[b], std::byte{0x5a}) << dtype_name(dtype) << " byte " << b;
      }
    }
  }
}

TEST(CpuWriteKv, SlotOutsideThePoolIsRefusedAndNothingIsWritten) {
  const KvLayout layout{1, 4, 1, 8, 64, DType::F32};
  std::vector<std::byte> slab(layout.size_bytes(), std::byte{0x5a});
  const PagedKv kv = paged_kv_for_layer(layout, slab.data(), 0);
  std::vector<float> k(2 * 64, 1.0f), v(2 * 64, 2.0f);
  std::vector<int64_t> slots = {0, 32};  // the pool has 32 slots
  const Status status = cpu::write_kv({k.data(), v.data(), slots.data(), 2}, kv);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("slot 32"), std::string::npos) << status.to_string();
  EXPECT_TRUE(
      std::all_of(slab.begin(), slab.end(), [](std::byte b) { return b == std::byte{0x5a}; }));
}

TEST(CpuCopyBlocks, CopiesEveryLayersKAndVAndNothingElse) {
  std::mt19937_64 rng(37);
  for (DType dtype : {DType::F32, DType::BF16}) {
    const KvLayout layout{4, 7, 2, 16, 64, dtype};
    std::vector<std::byte> slab(layout.size_bytes());
    testing::fill_random(slab.data(), dtype, size_t(layout.size_elems()), rng);
    const std::vector<std::byte> before = slab;
    const std::vector<BlockCopy> copies = {
        {BlockId{5}, BlockId{1}}, {BlockId{0}, BlockId{6}}, {BlockId{3}, BlockId{3}}};
    ASSERT_TRUE(cpu::copy_blocks(layout, slab.data(), copies).is_ok());

    std::vector<std::byte> expected = before;
    const size_t block_bytes = size_t(layout.block_stride()) * elem(dtype);
    for (const BlockCopy& c : copies) {
      for (int32_t layer = 0; layer < layout.num_layers; ++layer) {
        for (int32_t which = 0; which < 2; ++which) {
          std::memcpy(
              expected.data() +
                  size_t(layout.block_offset(layer, c.dst.value, which)) * elem(dtype),
              before.data() + size_t(layout.block_offset(layer, c.src.value, which)) * elem(dtype),
              block_bytes);
        }
      }
    }
    EXPECT_TRUE(slab == expected) << dtype_name(dtype);
    EXPECT_FALSE(slab == before);
  }
}

TEST(CpuCopyBlocks, BlockIdOutsideThePoolIsRefusedAndNothingIsCopied) {
  const KvLayout layout{2, 4, 1, 8, 64, DType::BF16};
  std::vector<std::byte> slab(layout.size_bytes());
  std::mt19937_64 rng(41);
  testing::fill_random(slab.data(), DType::BF16, size_t(layout.size_elems()), rng);
  const std::vector<std::byte> before = slab;
  for (const BlockCopy bad :
       {BlockCopy{BlockId{4}, BlockId{0}}, BlockCopy{BlockId{0}, BlockId{-1}}}) {
    const std::vector<BlockCopy> copies = {{BlockId{1}, BlockId{2}}, bad};
    const Status status = cpu::copy_blocks(layout, slab.data(), copies);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find("copy 1"), std::string::npos) << status.to_string();
    EXPECT_TRUE(slab == before);
  }
}

}  // namespace
}  // namespace kvp

// parallel_memcpy copies every byte, whatever the size (below one chunk, not a multiple of the
// chunk or of 64) and the thread count, and touches nothing beyond the destination range;
// parallel_memcpy_2d copies every row into its pitch and leaves the bytes between rows alone.
#include "common/parallel_memcpy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace kvp {
namespace {

TEST(ParallelMemcpy, CopiesEveryByteAtAnySizeAndThreadCount) {
  std::mt19937 gen(5);
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{4095}, kParallelMemcpyMinChunkBytes + 3,
                       9 * kParallelMemcpyMinChunkBytes + 77}) {
    std::vector<uint8_t> src(bytes);
    for (uint8_t& b : src) b = static_cast<uint8_t>(gen());
    for (int threads : {1, 2, 3, 8}) {
      std::vector<uint8_t> dst(bytes + 2, 0xA5);  // one guard byte each side
      parallel_memcpy(dst.data() + 1, src.data(), bytes, threads);
      EXPECT_EQ(dst.front(), 0xA5) << bytes << " bytes, " << threads << " threads";
      EXPECT_EQ(dst.back(), 0xA5) << bytes << " bytes, " << threads << " threads";
      EXPECT_TRUE(std::equal(src.begin(), src.end(), dst.begin() + 1))
          << bytes << " bytes, " << threads << " threads";
    }
  }
}

TEST(ParallelMemcpy, TwoDimensionalCopiesEveryRowAndNothingBetween) {
  std::mt19937 gen(9);
  // (rows, row bytes): below one chunk, many small rows, rows over a chunk altogether
  for (auto [rows, row_bytes] : {std::pair<size_t, size_t>{0, 8},
                                 {1, 3},
                                 {7, 1000},
                                 {64, 256 * 1024 + 4},
                                 {3, kParallelMemcpyMinChunkBytes}}) {
    const size_t src_pitch = row_bytes + 5, dst_pitch = 2 * row_bytes + 3;
    std::vector<uint8_t> src(rows * src_pitch);
    for (uint8_t& b : src) b = static_cast<uint8_t>(gen());
    for (int threads : {1, 2, 4, 8}) {
      std::vector<uint8_t> dst(rows * dst_pitch + 1, 0xA5);
      parallel_memcpy_2d(dst.data(), dst_pitch, src.data(), src_pitch, row_bytes, rows, threads);
      for (size_t r = 0; r < rows; ++r) {
        ASSERT_TRUE(std::equal(src.begin() + r * src_pitch, src.begin() + r * src_pitch + row_bytes,
                               dst.begin() + r * dst_pitch))
            << rows << " rows of " << row_bytes << ", " << threads << " threads, row " << r;
        for (size_t i = r * dst_pitch + row_bytes; i < (r + 1) * dst_pitch; ++i) {
          ASSERT_EQ(dst[i], 0xA5) << "byte " << i << " between rows was written";
        }
      }
      EXPECT_EQ(dst.back(), 0xA5);
    }
  }
}

}  // namespace
}  // namespace kvp

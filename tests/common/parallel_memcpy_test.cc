// parallel_memcpy copies every byte, whatever the size (below one chunk, not a multiple of the
// chunk or of 64) and the thread count, and touches nothing beyond the destination range.
#include "common/parallel_memcpy.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
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

}  // namespace
}  // namespace kvp

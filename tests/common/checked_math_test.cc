// checked_add / checked_mul / checked_product: exact results, and nullopt (never a wrapped
// value) one step past the type's range; check_limit names the field, the value and the limit.
#include "common/checked_math.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "common/limits.h"

namespace kvp {
namespace {

TEST(CheckedMath, ExactResultsAndNulloptPastTheRange) {
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  EXPECT_EQ(checked_add<uint64_t>(kMax - 1, 1), kMax);
  EXPECT_EQ(checked_add<uint64_t>(kMax, 1), std::nullopt);
  EXPECT_EQ(checked_mul<uint64_t>(uint64_t{1} << 32, (uint64_t{1} << 32) - 1),
            (uint64_t{1} << 63) + ((uint64_t{1} << 63) - (uint64_t{1} << 32)));
  EXPECT_EQ(checked_mul<uint64_t>(uint64_t{1} << 32, uint64_t{1} << 32), std::nullopt);
  // an f32 tensor of 2^62 elements: 2^64 bytes, one past the range (a GGUF wrap to "0 B")
  EXPECT_EQ(checked_mul<uint64_t>(uint64_t{1} << 62, 4), std::nullopt);
  EXPECT_EQ(checked_add<int32_t>(std::numeric_limits<int32_t>::max(), 1), std::nullopt);
  EXPECT_EQ(checked_mul<int64_t>(-1, std::numeric_limits<int64_t>::min()), std::nullopt);
}

TEST(CheckedMath, ProductOverflowsEvenWhenALaterFactorIsZero) {
  const std::vector<uint64_t> none;
  EXPECT_EQ(checked_product<uint64_t>(none), 1u);
  const std::vector<uint64_t> dims = {576, 49152};
  EXPECT_EQ(checked_product<uint64_t>(dims), 576u * 49152u);
  const std::vector<uint64_t> huge = {uint64_t{1} << 40, uint64_t{1} << 40, 0};
  EXPECT_EQ(checked_product<uint64_t>(huge), std::nullopt);
}

TEST(Limits, RefusalNamesTheFieldTheValueAndTheLimit) {
  EXPECT_TRUE(check_limit("x", "layers", limits::kLayers.max, limits::kLayers).is_ok());
  const Status s =
      check_limit("gguf 'm.gguf'", "'llama.block_count'", 2147483648u, limits::kLayers);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_EQ(s.message(),
            "gguf 'm.gguf': 'llama.block_count' = 2147483648 is more than kvpool's limit of 4096 "
            "layers");
}

}  // namespace
}  // namespace kvp

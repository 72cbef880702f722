// Conversions checked against the hardware's (x86 F16C instructions; elsewhere the compiler's
// _Float16, which clang 14 lacks on x86) and against exhaustive round trips.
#include "common/dtype.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace kvp {
namespace {

#if defined(__x86_64__)
__attribute__((target("f16c"))) float reference_f16_to_f32(uint16_t bits) {
  return _cvtsh_ss(bits);
}
__attribute__((target("f16c"))) uint16_t reference_f32_to_f16(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}
bool have_reference() {  // CPUID leaf 1, ECX bit 29
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
}
#else
float reference_f16_to_f32(uint16_t bits) {
  return static_cast<float>(std::bit_cast<_Float16>(bits));
}
uint16_t reference_f32_to_f16(float f) { return std::bit_cast<uint16_t>(static_cast<_Float16>(f)); }
bool have_reference() { return true; }
#endif

TEST(DType, F16ToF32MatchesHardwareForEveryPattern) {
  ASSERT_TRUE(have_reference()) << "this x86 CPU has no F16C instructions";
  for (uint32_t bits = 0; bits < 0x10000u; ++bits) {
    const uint16_t b = static_cast<uint16_t>(bits);
    const float expected = reference_f16_to_f32(b);
    const float got = f16_to_f32(F16{b});
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(got)) << bits;
    } else {
      ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(expected)) << bits;
    }
  }
}

TEST(DType, F32ToF16RoundsLikeHardwareOnRandomAndEdgeValues) {
  ASSERT_TRUE(have_reference()) << "this x86 CPU has no F16C instructions";
  std::mt19937 rng(1234);
  std::vector<float> values = {
      0.0f,  -0.0f,    1.0f,     65504.0f, 65520.0f,
      1e-8f, 5.96e-8f, 2.98e-8f, 6.1e-5f,  std::numeric_limits<float>::infinity(),
      1e9f};
  std::uniform_int_distribution<uint32_t> bits_dist;
  for (int i = 0; i < 200000; ++i) values.push_back(std::bit_cast<float>(bits_dist(rng)));
  for (float f : values) {
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
      continue;
    }
    const uint16_t expected = reference_f32_to_f16(f);
    ASSERT_EQ(f32_to_f16(f).bits, expected) << "value " << f;
  }
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f).bits, 0x3f80);
  // 1 + 2^-8 is halfway between two bf16 values: ties to the even one (1.0)
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)).bits, 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)).bits, 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  for (uint32_t bits = 0; bits < 0x10000u; bits += 7) {
    const Bf16 b{static_cast<uint16_t>(bits)};
    const float f = bf16_to_f32(b);
    if (!std::isnan(f)) {
      EXPECT_EQ(f32_to_bf16(f).bits, b.bits);
    }
  }
}

TEST(DType, ParsesNames) {
  EXPECT_EQ(parse_dtype("bfloat16"), DType::BF16);
  EXPECT_EQ(parse_dtype("f16"), DType::F16);
  EXPECT_EQ(parse_dtype("float32"), DType::F32);
  EXPECT_FALSE(parse_dtype("int8").has_value());
  EXPECT_FALSE(parse_dtype("fp8").has_value());
}

TEST(DType, KvCacheNamesAddInt8AndFp8) {
  EXPECT_EQ(parse_kv_cache_dtype("int8"), DType::I8);
  EXPECT_EQ(parse_kv_cache_dtype("i8"), DType::I8);
  EXPECT_EQ(parse_kv_cache_dtype("bf16"), DType::BF16);
  EXPECT_EQ(parse_kv_cache_dtype("fp8"), DType::FP8);
  EXPECT_EQ(parse_kv_cache_dtype("fp8_e4m3"), DType::FP8);
  EXPECT_EQ(parse_kv_cache_dtype("float8_e4m3fn"), DType::FP8);
  EXPECT_FALSE(parse_kv_cache_dtype("fp8_e5m2").has_value());
  EXPECT_EQ(dtype_name(DType::I8), "int8");
  EXPECT_EQ(dtype_name(DType::FP8), "fp8");
  EXPECT_EQ(dtype_size_bytes(DType::I8), 1u);
  EXPECT_EQ(dtype_size_bytes(DType::FP8), 1u);
  EXPECT_TRUE(is_kv8(DType::I8) && is_kv8(DType::FP8));
  EXPECT_FALSE(is_kv8(DType::BF16) || is_kv8(DType::F16) || is_kv8(DType::F32));
  // stored in cache files and fingerprints: the values never change
  EXPECT_EQ(static_cast<int>(DType::I8), 3);
  EXPECT_EQ(static_cast<int>(DType::FP8), 4);
}

}  // namespace
}  // namespace kvp

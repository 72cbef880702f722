// int8 KV quantisation (cache/kv_quant.h) against its contract, checked with arithmetic of the
// test's own: scale covers max|x| / 127 without clipping and is at most one f16 step above it;
// every value comes back within scale / 2; zero vectors and outliers; the dense vector format.
#include "cache/kv_quant.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "cache/kv_layout.h"

namespace kvp {
namespace {

// The f32 value of an f16 bit pattern, computed here for normal numbers only.
double f16_value(uint16_t bits) {
  const int exponent = (bits >> 10) & 0x1f;
  EXPECT_TRUE(exponent > 0 && exponent < 31) << "not a normal f16: " << bits;
  const double mantissa = 1.0 + double(bits & 0x3ff) / 1024.0;
  return ((bits & 0x8000) ? -1.0 : 1.0) * std::ldexp(mantissa, exponent - 15);
}

void expect_within_half_step(const std::vector<float>& x) {
  const int32_t head_dim = static_cast<int32_t>(x.size());
  std::vector<int8_t> q(x.size());
  F16 scale;
  quantize_kv_int8(x.data(), head_dim, q.data(), &scale);
  double max_abs = 0;
  for (float v : x) max_abs = std::max(max_abs, std::fabs(double(v)));
  const double s = f16_value(scale.bits);
  EXPECT_GE(s * 127, max_abs) << "clips";
  EXPECT_LE(s, max_abs / 127 * (1 + 1.0 / 1024)) << "more than one f16 step above max / 127";
  double worst = 0;
  for (size_t d = 0; d < x.size(); ++d) {
    EXPECT_GE(q[d], -127);
    const double error = std::fabs(double(q[d]) * s - x[d]);
    worst = std::max(worst, error / s);
    EXPECT_LE(error, s / 2 * (1 + 1e-6)) << "element " << d << " of " << x[d];
  }
  // and dequantize_kv_int8 gives q * scale
  std::vector<float> back(x.size());
  dequantize_kv_int8(q.data(), scale, head_dim, back.data());
  for (size_t d = 0; d < x.size(); ++d) EXPECT_EQ(double(back[d]), double(q[d]) * s);
}

TEST(KvQuant, RandomVectorsComeBackWithinHalfAStep) {
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  for (int32_t head_dim : {8, 64, 72, 128, 256}) {
    for (float magnitude : {0.05f, 0.1f, 1.0f, 37.0f, 3000.0f}) {  // normal f16 scales
      SCOPED_TRACE(::testing::Message() << "head_dim " << head_dim << " magnitude " << magnitude);
      std::vector<float> x(static_cast<size_t>(head_dim));
      for (float& v : x) v = value(rng) * magnitude;
      expect_within_half_step(x);
    }
  }
}

TEST(KvQuant, OutlierTakesTheFullRangeAndTheRestRoundToNearest) {
  std::vector<float> x(128, 0.01f);
  x[17] = -50.0f;  // a key's outlier channel
  std::vector<int8_t> q(x.size());
  F16 scale;
  quantize_kv_int8(x.data(), 128, q.data(), &scale);
  EXPECT_EQ(q[17], -127);
  EXPECT_EQ(q[0], 0);  // 0.01 is far below half a step of 50 / 127
  expect_within_half_step(x);
}

TEST(KvQuant, ZeroVectorHasScaleZero) {
  const std::vector<float> x(64, 0.0f);
  std::vector<int8_t> q(x.size(), 5);
  F16 scale{0x3c00};
  quantize_kv_int8(x.data(), 64, q.data(), &scale);
  EXPECT_EQ(scale.bits, 0);
  for (int8_t v : q) EXPECT_EQ(v, 0);
}

TEST(KvQuant, DenseVectorIsValuesThenScale) {
  EXPECT_EQ(kv_vector_bytes(DType::I8, 128), 130u);
  EXPECT_EQ(kv_vector_bytes(DType::BF16, 128), 256u);
  EXPECT_EQ(kv_vector_bytes(DType::F32, 8), 32u);
  std::vector<float> x = {1.0f, -2.0f, 3.0f, 127.0f};
  std::vector<std::byte> dense(kv_vector_bytes(DType::I8, 4));
  kv_vector_from_f32(x.data(), 4, DType::I8, dense.data());
  EXPECT_EQ(static_cast<int8_t>(dense[3]), 127);
  EXPECT_EQ(static_cast<int8_t>(dense[1]), -2);
  const uint16_t bits = uint16_t(uint16_t(dense[4]) | uint16_t(dense[5]) << 8);
  EXPECT_EQ(bits, 0x3c00);  // scale 1.0: max 127 / 127
  std::vector<float> back(4);
  kv_vector_to_f32(dense.data(), DType::I8, 4, back.data());
  EXPECT_EQ(back, x);
}

// The memory goal of issue 17: 8-bit KV, scales included, at most 0.52x the bytes of bf16; and
// the scales sit after their head's rows inside the block.
TEST(KvQuant, Int8BlocksAreUnder052OfBf16WithTheirScalesInside) {
  KvLayout bf16{2, 10, 8, 16, 128, DType::BF16};
  KvLayout int8 = bf16;
  int8.dtype = DType::I8;
  EXPECT_EQ(int8.size_bytes(), size_t{2} * 10 * 2 * 8 * 16 * (128 + 2));
  EXPECT_LE(double(int8.size_bytes()) / double(bf16.size_bytes()), 0.52);
  EXPECT_EQ(int8.head_pitch(), 16 * 130);
  EXPECT_EQ(int8.elem_offset(1, 3, 1, 2, 5),
            ((1 * 10 + 3) * 2 + 1) * 8 * 16 * 130 + 2 * 16 * 130 + 5 * 128);
  EXPECT_EQ(int8.scale_offset(1, 3, 1, 2, 5),
            ((1 * 10 + 3) * 2 + 1) * 8 * 16 * 130 + 2 * 16 * 130 + 16 * 128 + 2 * 5);
  EXPECT_EQ(int8.block_size_bytes() * 10, int8.size_bytes());
}

}  // namespace
}  // namespace kvp

// 8-bit KV quantisation (cache/kv_quant.h), int8 and fp8 alike, against its contract, checked
// with arithmetic of the test's own: the scale covers max|x| / kv8_max_value without clipping
// and is at most one f16 step above it; every value comes back within half a step of its
// format's grid (int8: scale / 2; fp8: half an e4m3 ulp times the scale); zero vectors and
// outliers; the dense vector format. The e4m3 conversions themselves are checked bit for bit
// against PyTorch's float8_e4m3fn (fixtures/e4m3_torch.bin, written by e4m3_reference.py).
#include "cache/kv_quant.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <vector>

#include "cache/kv_layout.h"
#include "support/kv8_check.h"

namespace kvp {
namespace {

// The f32 value of an f16 bit pattern, computed here for normal numbers only.
double f16_value(uint16_t bits) {
  const int exponent = (bits >> 10) & 0x1f;
  EXPECT_TRUE(exponent > 0 && exponent < 31) << "not a normal f16: " << bits;
  const double mantissa = 1.0 + double(bits & 0x3ff) / 1024.0;
  return ((bits & 0x8000) ? -1.0 : 1.0) * std::ldexp(mantissa, exponent - 15);
}

double code_value(DType dtype, uint8_t code) { return testing::kv8_code_value(dtype, code); }

class KvQuant : public ::testing::TestWithParam<DType> {
 protected:
  DType dtype() const { return GetParam(); }
  double max_code() const { return testing::kv8_max_code(dtype()); }

  void expect_within_half_step(const std::vector<float>& x) {
    const int32_t head_dim = static_cast<int32_t>(x.size());
    std::vector<uint8_t> q(x.size());
    F16 scale;
    quantize_kv8(dtype(), x.data(), head_dim, q.data(), &scale);
    double max_abs = 0;
    for (float v : x) max_abs = std::max(max_abs, std::fabs(double(v)));
    const double s = f16_value(scale.bits);
    EXPECT_GE(s * max_code(), max_abs) << "clips";
    EXPECT_LE(s, max_abs / max_code() * (1 + 1.0 / 1024)) << "more than one f16 step above";
    for (size_t d = 0; d < x.size(); ++d) {
      if (dtype() == DType::I8) {
        EXPECT_NE(q[d], 0x80) << "-128 is not a code";
      }
      const double error = std::fabs(code_value(dtype(), q[d]) * s - x[d]);
      EXPECT_LE(error, testing::kv8_half_step(dtype(), x[d] / s) * s * (1 + 1e-6))
          << "element " << d << " of " << x[d] << " code " << int(q[d]);
    }
    // and dequantize_kv8 gives value(q) * scale
    std::vector<float> back(x.size());
    dequantize_kv8(dtype(), q.data(), scale, head_dim, back.data());
    for (size_t d = 0; d < x.size(); ++d) {
      EXPECT_EQ(double(back[d]), code_value(dtype(), q[d]) * s) << "element " << d;
    }
  }
};

TEST_P(KvQuant, RandomVectorsComeBackWithinHalfAStep) {
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

TEST_P(KvQuant, OutlierTakesTheFullRangeAndTheRestRoundToNearest) {
  std::vector<float> x(128, 0.01f);
  x[17] = -50.0f;  // a key's outlier channel
  std::vector<uint8_t> q(x.size());
  F16 scale;
  quantize_kv8(dtype(), x.data(), 128, q.data(), &scale);
  EXPECT_EQ(code_value(dtype(), q[17]), -max_code());
  if (dtype() == DType::I8) {
    EXPECT_EQ(q[0], 0);  // 0.01 is far below half a step of 50 / 127
  } else {
    // 0.01 / (50 / 448) = 0.0896 is a normal e4m3 number: fp8 keeps small values int8 loses
    EXPECT_NEAR(code_value(dtype(), q[0]) * f16_value(scale.bits), 0.01, 0.01 / 16);
  }
  expect_within_half_step(x);
}

TEST_P(KvQuant, ZeroVectorHasScaleZero) {
  const std::vector<float> x(64, 0.0f);
  std::vector<uint8_t> q(x.size(), 5);
  F16 scale{0x3c00};
  quantize_kv8(dtype(), x.data(), 64, q.data(), &scale);
  EXPECT_EQ(scale.bits, 0);
  for (uint8_t v : q) EXPECT_EQ(v, 0);
}

TEST_P(KvQuant, NanBecomesZeroAndInfinitySaturates) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {std::nanf(""), 1.0f, -inf, 0.5f};
  std::vector<uint8_t> q(x.size());
  F16 scale;
  quantize_kv8(dtype(), x.data(), 4, q.data(), &scale);
  EXPECT_EQ(scale.bits, 0x7bff);  // the largest f16
  EXPECT_EQ(q[0], 0);
  EXPECT_EQ(code_value(dtype(), q[2]), -max_code());
}

TEST_P(KvQuant, DenseVectorIsValuesThenScale) {
  EXPECT_EQ(kv_vector_bytes(dtype(), 128), 130u);
  EXPECT_EQ(kv_vector_bytes(DType::BF16, 128), 256u);
  EXPECT_EQ(kv_vector_bytes(DType::F32, 8), 32u);
  const auto m = static_cast<float>(max_code());
  std::vector<float> x = {1.0f, -2.0f, 3.0f, m};  // each exact on both grids at scale 1
  std::vector<std::byte> dense(kv_vector_bytes(dtype(), 4));
  kv_vector_from_f32(x.data(), 4, dtype(), dense.data());
  EXPECT_EQ(code_value(dtype(), uint8_t(dense[3])), m);
  EXPECT_EQ(code_value(dtype(), uint8_t(dense[1])), -2.0);
  const uint16_t bits = uint16_t(uint16_t(dense[4]) | uint16_t(dense[5]) << 8);
  EXPECT_EQ(bits, 0x3c00);  // scale 1.0: max / kv8_max_value
  std::vector<float> back(4);
  kv_vector_to_f32(dense.data(), dtype(), 4, back.data());
  EXPECT_EQ(back, x);
}

// The memory goal of issue 17: 8-bit KV, scales included, at most 0.52x the bytes of bf16; and
// the scales sit after their head's rows inside the block.
TEST_P(KvQuant, BlocksAreUnder052OfBf16WithTheirScalesInside) {
  KvLayout bf16{2, 10, 8, 16, 128, DType::BF16};
  KvLayout kv8 = bf16;
  kv8.dtype = dtype();
  EXPECT_EQ(kv8.size_bytes(), size_t{2} * 10 * 2 * 8 * 16 * (128 + 2));
  EXPECT_LE(double(kv8.size_bytes()) / double(bf16.size_bytes()), 0.52);
  EXPECT_EQ(kv8.head_pitch(), 16 * 130);
  EXPECT_EQ(kv8.elem_offset(1, 3, 1, 2, 5),
            ((1 * 10 + 3) * 2 + 1) * 8 * 16 * 130 + 2 * 16 * 130 + 5 * 128);
  EXPECT_EQ(kv8.scale_offset(1, 3, 1, 2, 5),
            ((1 * 10 + 3) * 2 + 1) * 8 * 16 * 130 + 2 * 16 * 130 + 16 * 128 + 2 * 5);
  EXPECT_EQ(kv8.block_size_bytes() * 10, kv8.size_bytes());
}

INSTANTIATE_TEST_SUITE_P(Kv8, KvQuant, ::testing::Values(DType::I8, DType::FP8),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// fixtures/e4m3_torch.bin (e4m3_reference.py has the format): torch's codes and values.
struct TorchE4m3 {
  std::vector<uint8_t> from_f16;   // [65536]
  std::vector<uint8_t> from_bf16;  // [65536]
  std::vector<float> values;       // [256]
  std::vector<float> inputs;       // [n]
  std::vector<uint8_t> codes;      // [n]
};

TorchE4m3 load_torch_e4m3() {
  std::ifstream in("tests/cache/fixtures/e4m3_torch.bin", std::ios::binary);
  EXPECT_TRUE(in.good()) << "tests/cache/fixtures/e4m3_torch.bin (run from the repository root)";
  const std::vector<char> bytes{std::istreambuf_iterator<char>(in), {}};
  TorchE4m3 t;
  size_t at = 0;
  auto take = [&](auto& v, size_t count) {
    v.resize(count);
    const size_t n = count * sizeof(v[0]);
    if (at + n > bytes.size()) {
      ADD_FAILURE() << "fixture truncated";
      return;
    }
    std::memcpy(v.data(), bytes.data() + at, n);
    at += n;
  };
  take(t.from_f16, 65536);
  take(t.from_bf16, 65536);
  take(t.values, 256);
  std::vector<uint32_t> count;
  take(count, 1);
  take(t.inputs, count[0]);
  take(t.codes, count[0]);
  EXPECT_EQ(at, bytes.size());
  return t;
}

bool is_nan_code(uint8_t code) { return (code & 0x7f) == 0x7f; }

TEST(KvQuantE4m3, EncodesEveryF16AndBf16AsTorchDoes) {
  const TorchE4m3 t = load_torch_e4m3();
  int mismatches = 0;
  for (uint32_t i = 0; i < 65536; ++i) {
    const float from_f16 = f16_to_f32(F16{static_cast<uint16_t>(i)});
    const float from_bf16 = std::bit_cast<float>(i << 16);
    const float xs[2] = {from_f16, from_bf16};
    const uint8_t want[2] = {t.from_f16[i], t.from_bf16[i]};
    for (int k = 0; k < 2; ++k) {
      const uint8_t got = f32_to_e4m3(xs[k]);
      if (got != want[k] && mismatches++ < 10) {
        ADD_FAILURE() << (k == 0 ? "f16 " : "bf16 ") << std::hex << i << " = " << xs[k]
                      << ": kvpool 0x" << int(got) << ", torch 0x" << int(want[k]);
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(KvQuantE4m3, EncodesTiesTheirNeighboursAndSaturationAsTorchDoes) {
  const TorchE4m3 t = load_torch_e4m3();
  ASSERT_GT(t.inputs.size(), 10000u);
  int mismatches = 0;
  for (size_t i = 0; i < t.inputs.size(); ++i) {
    const uint8_t got = f32_to_e4m3(t.inputs[i]);
    if (got != t.codes[i] && mismatches++ < 10) {
      ADD_FAILURE() << std::hexfloat << t.inputs[i] << std::hex << ": kvpool 0x" << int(got)
                    << ", torch 0x" << int(t.codes[i]);
    }
  }
  EXPECT_EQ(mismatches, 0);
  // kv8_encode maps NaN to 0, as int8 does; saturation needs no NaN code
  EXPECT_EQ(kv8_encode(DType::FP8, std::nanf("")), 0);
  EXPECT_EQ(kv8_encode(DType::FP8, 1e9f), 0x7e);
}

TEST(KvQuantE4m3, DecodesEveryCodeAsTorchDoes) {
  const TorchE4m3 t = load_torch_e4m3();
  for (int code = 0; code < 256; ++code) {
    const float got = e4m3_to_f32(static_cast<uint8_t>(code));
    if (is_nan_code(static_cast<uint8_t>(code))) {
      EXPECT_TRUE(std::isnan(got) && std::isnan(t.values[code])) << code;
    } else {
      EXPECT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(t.values[code]))
          << "code " << code << ": kvpool " << got << ", torch " << t.values[code];
      EXPECT_EQ(kv8_decode(DType::FP8, static_cast<uint8_t>(code)), t.values[code]);
    }
  }
}

}  // namespace
}  // namespace kvp

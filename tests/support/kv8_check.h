// Test-side arithmetic of the 8-bit KV formats (cache/kv_quant.h), written from the formats'
// definitions rather than with kvpool's conversions, so tests can check those: the value of a
// code, and half the grid step around a value, in units of the row's scale.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "common/dtype.h"

namespace kvp::testing {

// int8: two's complement; fp8: OCP e4m3fn from its fields (a NaN code fails the test).
inline double kv8_code_value(DType dtype, uint8_t code) {
  if (dtype == DType::I8) return static_cast<int8_t>(code);
  const int exponent = (code >> 3) & 0xf;
  const int mantissa = code & 7;
  EXPECT_FALSE(exponent == 15 && mantissa == 7) << "NaN code " << int(code);
  const double magnitude =
      exponent == 0 ? std::ldexp(mantissa, -9) : std::ldexp(1.0 + mantissa / 8.0, exponent - 7);
  return (code & 0x80) ? -magnitude : magnitude;
}

// Half the distance between the grid points around v (v in units of the scale, |v| <= max).
inline double kv8_half_step(DType dtype, double v) {
  if (dtype == DType::I8) return 0.5;
  const double a = std::fabs(v);
  if (a < std::ldexp(1.0, -6)) return std::ldexp(1.0, -10);   // subnormal spacing 2^-9
  return std::ldexp(1.0, int(std::floor(std::log2(a))) - 4);  // 3 mantissa bits
}

// The largest kv8_half_step over the range: int8 0.5; fp8 16 (spacing 32 in [256, 448]).
inline double kv8_max_half_step(DType dtype) { return dtype == DType::I8 ? 0.5 : 16.0; }

// The largest code magnitude: 127, 448.
inline double kv8_max_code(DType dtype) { return dtype == DType::I8 ? 127.0 : 448.0; }

}  // namespace kvp::testing

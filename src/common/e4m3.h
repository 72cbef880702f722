// Round-to-nearest-even shifts and the OCP float8 e4m3fn encoder as integer arithmetic on an f32's
// bits, compiled for the host (f32_to_e4m3, common/dtype.h) and for CUDA devices (the fp8 KV write,
// kv_kernels.cu) from this one definition, so the device's codes equal the host's bit for bit.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define KVP_E4M3_HOST_DEVICE __host__ __device__
#else
#define KVP_E4M3_HOST_DEVICE
#endif

namespace kvp {

// value >> shift rounded to nearest, ties to even. requires: 1 <= shift <= 31.
KVP_E4M3_HOST_DEVICE constexpr uint32_t shift_right_nearest_even(uint32_t value, uint32_t shift) {
  uint32_t out = value >> shift;
  const uint32_t rem = value & ((1u << shift) - 1);
  const uint32_t halfway = 1u << (shift - 1);
  if (rem > halfway || (rem == halfway && (out & 1u))) ++out;
  return out;
}

// The e4m3 code of the f32 whose bits are u: round to nearest even, saturating at ±448 (±inf
// too); NaN gives the NaN code of its sign (0x7f / 0xff).
KVP_E4M3_HOST_DEVICE constexpr uint8_t e4m3_from_f32_bits(uint32_t u) {
  const auto sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);   // NaN
  if (abs >= 0x43e00000u) return static_cast<uint8_t>(sign | 0x7eu);  // >= 448, inf: 448
  if (abs < 0x3c800000u) {                // below 2^-6: subnormal (m * 2^-9) or zero
    if (abs <= 0x3a800000u) return sign;  // <= 2^-10, half the smallest subnormal: ties to 0
    const uint32_t exponent = abs >> 23;
    const uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    // value = mantissa * 2^(exponent-150); unit 2^-9; a result of 8 is 2^-6, the first normal
    return static_cast<uint8_t>(sign | shift_right_nearest_even(mantissa, 141 - exponent));
  }
  // Normal: exponent rebased from 127 to 7, top 3 mantissa bits; a carry out of the mantissa
  // moves to the next exponent, and below 448 it never reaches the NaN code.
  return static_cast<uint8_t>(sign | (shift_right_nearest_even(abs, 20) - ((127u - 7u) << 3)));
}

}  // namespace kvp

#undef KVP_E4M3_HOST_DEVICE

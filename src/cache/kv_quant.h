// 8-bit KV: one f16 scale per head vector (one token's K or V of one KV head) and 8-bit codes,
// in one of two formats (is_kv8):
//
//   int8 (DType::I8):  q[d] = round(x[d] / s) in [-127, 127]   s = max|x| / 127 rounded up to f16
//   fp8  (DType::FP8): q[d] = e4m3(x[d] / s), |q| <= 448        s = max|x| / 448 rounded up to f16
//                      (OCP float8 e4m3fn, round to nearest even, common/dtype.h f32_to_e4m3)
//   x[d] ~ value(q[d]) * s; int8: |error| <= s / 2; fp8: |error| <= s * ulp_e4m3(|x| / s) / 2
//
// Both round x * (1 / s) (a product, not a quotient, so every backend reproduces it), map NaN
// to 0 and saturate infinities. Conversions of head vectors between all KV dtypes are here too.
// Written once per token where K and V enter the pool (cpu::write_kv), so a block is never
// re-scaled as tokens arrive; read by the attention kernels (q · k = s * sum q[d] value(k8[d])).
// In the pool a head's run of a block holds its rows and then their scales (cache/kv_layout.h);
// in a dense vector (HostKvStorage gather/scatter, cache files) the scale follows its row:
//
//   dense 8-bit head vector = [head_dim] codes | f16 scale     (kv_vector_bytes = head_dim + 2)
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/dtype.h"

namespace kvp {

// Bytes of one dense head vector of `dtype`: head_dim elements, and the f16 scale for 8-bit KV.
constexpr size_t kv_vector_bytes(DType dtype, int32_t head_dim) {
  return static_cast<size_t>(head_dim) * dtype_size_bytes(dtype) + (is_kv8(dtype) ? 2 : 0);
}

// The largest code magnitude of an 8-bit KV format: 127 (int8), 448 (fp8).
// requires: is_kv8(dtype).
constexpr float kv8_max_value(DType dtype) { return dtype == DType::FP8 ? 448.0f : 127.0f; }

// The f16 scale of a vector whose largest magnitude is max_abs: max_abs / kv8_max_value rounded
// up, so that every |x| / scale <= kv8_max_value (no clipping); 0 for an all-zero vector.
inline F16 kv8_scale(DType dtype, float max_abs) {
  if (!(max_abs > 0.0f)) return F16{0};
  const float wanted = std::min(max_abs / kv8_max_value(dtype), 65504.0f);
  F16 s = f32_to_f16(wanted);
  if (f16_to_f32(s) < wanted && s.bits < 0x7bffu) ++s.bits;  // next f16 up (positive)
  return s;
}

// The code of v = x / scale: int8 rounds to nearest even and clamps to ±127, fp8 rounds to the
// nearest even e4m3 and saturates at ±448; NaN becomes 0.
inline uint8_t kv8_encode(DType dtype, float v) {
  if (std::isnan(v)) return 0;
  if (dtype == DType::FP8) return f32_to_e4m3(v);
  return static_cast<uint8_t>(static_cast<int8_t>(std::clamp(std::nearbyint(v), -127.0f, 127.0f)));
}
// The value of a code, before its row's scale.
inline float kv8_decode(DType dtype, uint8_t code) {
  return dtype == DType::FP8 ? e4m3_to_f32(code) : static_cast<float>(static_cast<int8_t>(code));
}

// q[d], scale of x[0..head_dim). A NaN element becomes 0; an infinite one saturates.
// requires: is_kv8(dtype).
inline void quantize_kv8(DType dtype, const float* x, int32_t head_dim, uint8_t* q, F16* scale) {
  float max_abs = 0.0f;
  for (int32_t d = 0; d < head_dim; ++d) max_abs = std::max(max_abs, std::fabs(x[d]));
  const F16 s = kv8_scale(dtype, max_abs);
  const float sf = f16_to_f32(s);
  const float inv = sf > 0.0f ? 1.0f / sf : 0.0f;
  for (int32_t d = 0; d < head_dim; ++d) q[d] = kv8_encode(dtype, x[d] * inv);
  *scale = s;
}

// x[d] = value(q[d]) * scale. requires: is_kv8(dtype).
inline void dequantize_kv8(DType dtype, const uint8_t* q, F16 scale, int32_t head_dim, float* x) {
  const float sf = f16_to_f32(scale);
  for (int32_t d = 0; d < head_dim; ++d) x[d] = kv8_decode(dtype, q[d]) * sf;
}

// One dense head vector (kv_vector_bytes layout) to f32, and back.
inline void kv_vector_to_f32(const std::byte* src, DType dtype, int32_t head_dim, float* x) {
  if (is_kv8(dtype)) {
    F16 scale;
    std::memcpy(&scale, src + head_dim, sizeof scale);
    dequantize_kv8(dtype, reinterpret_cast<const uint8_t*>(src), scale, head_dim, x);
    return;
  }
  for (int32_t d = 0; d < head_dim; ++d) x[d] = load_as_f32(src, dtype, static_cast<size_t>(d));
}
inline void kv_vector_from_f32(const float* x, int32_t head_dim, DType dtype, std::byte* dst) {
  if (is_kv8(dtype)) {
    F16 scale;
    quantize_kv8(dtype, x, head_dim, reinterpret_cast<uint8_t*>(dst), &scale);
    std::memcpy(dst + head_dim, &scale, sizeof scale);
    return;
  }
  for (int32_t d = 0; d < head_dim; ++d) store_from_f32(dst, dtype, static_cast<size_t>(d), x[d]);
}

}  // namespace kvp

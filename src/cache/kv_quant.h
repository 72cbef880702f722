// 8-bit KV: symmetric int8 with one f16 scale per head vector (one token's K or V of one KV
// head), and conversions of head vectors between the KV dtypes (f32, bf16, f16, int8).
//
//   scale s = max|x| / 127 rounded up to f16;  q[d] = round(x[d] / s) in [-127, 127]
//   x[d] ~ q[d] * s, |error| <= s / 2
//
// Written once per token where K and V enter the pool (cpu::write_kv), so a block is never
// re-scaled as tokens arrive; read by the attention kernels (q · k = s * sum q[d] k8[d]).
// In the pool a head's run of a block holds its rows and then their scales (cache/kv_layout.h);
// in a dense vector (HostKvStorage gather/scatter, cache files) the scale follows its row:
//
//   dense int8 head vector = [head_dim] int8 | f16 scale     (kv_vector_bytes = head_dim + 2)
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/dtype.h"

namespace kvp {

// Bytes of one dense head vector of `dtype`: head_dim elements, and the f16 scale for int8.
constexpr size_t kv_vector_bytes(DType dtype, int32_t head_dim) {
  return static_cast<size_t>(head_dim) * dtype_size_bytes(dtype) + (dtype == DType::I8 ? 2 : 0);
}

// The f16 scale of a vector whose largest magnitude is max_abs: max_abs / 127 rounded up, so
// that every |x| / scale <= 127 (no clipping); 0 for an all-zero vector.
inline F16 kv_int8_scale(float max_abs) {
  if (!(max_abs > 0.0f)) return F16{0};
  const float wanted = std::min(max_abs / 127.0f, 65504.0f);
  F16 s = f32_to_f16(wanted);
  if (f16_to_f32(s) < wanted && s.bits < 0x7bffu) ++s.bits;  // next f16 up (positive)
  return s;
}

// q[d], scale of x[0..head_dim). A NaN element becomes 0; an infinite one saturates.
inline void quantize_kv_int8(const float* x, int32_t head_dim, int8_t* q, F16* scale) {
  float max_abs = 0.0f;
  for (int32_t d = 0; d < head_dim; ++d) max_abs = std::max(max_abs, std::fabs(x[d]));
  const F16 s = kv_int8_scale(max_abs);
  const float sf = f16_to_f32(s);
  const float inv = sf > 0.0f ? 1.0f / sf : 0.0f;
  for (int32_t d = 0; d < head_dim; ++d) {
    const float r = std::nearbyint(x[d] * inv);
    q[d] = std::isnan(r) ? int8_t{0} : static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f));
  }
  *scale = s;
}

// x[d] = q[d] * scale.
inline void dequantize_kv_int8(const int8_t* q, F16 scale, int32_t head_dim, float* x) {
  const float sf = f16_to_f32(scale);
  for (int32_t d = 0; d < head_dim; ++d) x[d] = static_cast<float>(q[d]) * sf;
}

// One dense head vector (kv_vector_bytes layout) to f32, and back.
inline void kv_vector_to_f32(const std::byte* src, DType dtype, int32_t head_dim, float* x) {
  if (dtype == DType::I8) {
    F16 scale;
    std::memcpy(&scale, src + head_dim, sizeof scale);
    dequantize_kv_int8(reinterpret_cast<const int8_t*>(src), scale, head_dim, x);
    return;
  }
  for (int32_t d = 0; d < head_dim; ++d) x[d] = load_as_f32(src, dtype, static_cast<size_t>(d));
}
inline void kv_vector_from_f32(const float* x, int32_t head_dim, DType dtype, std::byte* dst) {
  if (dtype == DType::I8) {
    F16 scale;
    quantize_kv_int8(x, head_dim, reinterpret_cast<int8_t*>(dst), &scale);
    std::memcpy(dst + head_dim, &scale, sizeof scale);
    return;
  }
  for (int32_t d = 0; d < head_dim; ++d) store_from_f32(dst, dtype, static_cast<size_t>(d), x[d]);
}

}  // namespace kvp

// Element types of KV caches, activations and weights, and scalar conversions on the host.
// bf16 and f16 are stored as raw 16-bit patterns (Bf16, F16); conversions round to nearest even.
// I8 and FP8 are the 8-bit KV-cache-only types (is_kv8): rows of symmetric int8 or of OCP float8
// e4m3fn codes, each row with an f16 scale stored beside it in the block (cache/kv_layout.h,
// cache/kv_quant.h); an 8-bit value alone is not the number, so load_as_f32 / store_from_f32 do
// not take them. f32_to_e4m3 / e4m3_to_f32 convert single e4m3 codes.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace kvp {

// The values are stored in cache files and fingerprints: append, never renumber.
enum class DType : uint8_t { F32 = 0, F16 = 1, BF16 = 2, I8 = 3, FP8 = 4 };

// The 8-bit KV dtypes: one byte per value and an f16 scale per head vector (cache/kv_quant.h).
constexpr bool is_kv8(DType t) { return t == DType::I8 || t == DType::FP8; }

// Bytes of one element (of one stored value for I8 and FP8; its row's scale is counted by
// KvLayout).
constexpr size_t dtype_size_bytes(DType t) { return t == DType::F32 ? 4 : is_kv8(t) ? 1 : 2; }
constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "f32";
    case DType::F16:
      return "f16";
    case DType::BF16:
      return "bf16";
    case DType::I8:
      return "int8";
    case DType::FP8:
      return "fp8";
  }
  return "?";
}
// "f32" / "float32", "f16" / "float16" / "half", "bf16" / "bfloat16"; nullopt otherwise (int8 is
// not a tensor dtype: see parse_kv_cache_dtype).
std::optional<DType> parse_dtype(std::string_view name);
// parse_dtype's names, "int8" / "i8" and "fp8" / "fp8_e4m3" / "float8_e4m3fn": the dtypes a KV
// cache can hold.
std::optional<DType> parse_kv_cache_dtype(std::string_view name);

struct Bf16 {
  uint16_t bits;
};
struct F16 {
  uint16_t bits;
};

inline float bf16_to_f32(Bf16 x) { return std::bit_cast<float>(uint32_t{x.bits} << 16); }
inline Bf16 f32_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return Bf16{static_cast<uint16_t>((u >> 16) | 0x40)};  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return Bf16{static_cast<uint16_t>(u >> 16)};
}

float f16_to_f32(F16 x);
F16 f32_to_f16(float f);

// OCP float8 e4m3fn (1 sign, 4 exponent bits of bias 7, 3 mantissa bits; no infinities, NaN =
// 0x7f / 0xff, largest finite 448 = 0x7e). f32_to_e4m3 rounds to nearest even and saturates:
// finite values and infinities beyond ±448 become ±448; NaN becomes 0x7f (with the sign bit of
// the input), as PTX cvt.rn.satfinite.e4m3x2.f32 does.
uint8_t f32_to_e4m3(float f);
// Exact; 0x7f / 0xff give NaN.
float e4m3_to_f32(uint8_t code);

// Reads element i of a buffer of type t as float. requires: !is_kv8(t).
inline float load_as_f32(const void* data, DType t, size_t i) {
  switch (t) {
    case DType::I8:
    case DType::FP8:
      break;
    case DType::F32:
      return static_cast<const float*>(data)[i];
    case DType::F16:
      return f16_to_f32(static_cast<const F16*>(data)[i]);
    case DType::BF16:
      return bf16_to_f32(static_cast<const Bf16*>(data)[i]);
  }
  return 0.0f;
}
// Writes element i of a buffer of type t from float (rounded to nearest even).
// requires: !is_kv8(t).
inline void store_from_f32(void* data, DType t, size_t i, float v) {
  switch (t) {
    case DType::I8:
    case DType::FP8:
      break;
    case DType::F32:
      static_cast<float*>(data)[i] = v;
      break;
    case DType::F16:
      static_cast<F16*>(data)[i] = f32_to_f16(v);
      break;
    case DType::BF16:
      static_cast<Bf16*>(data)[i] = f32_to_bf16(v);
      break;
  }
}

}  // namespace kvp

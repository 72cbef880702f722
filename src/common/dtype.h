// Element types of KV caches, activations and weights, and scalar conversions on the host.
// bf16 and f16 are stored as raw 16-bit patterns (Bf16, F16); conversions round to nearest even.
// I8 is a KV-cache-only type: symmetric int8 rows, each with an f16 scale stored beside it in the
// block (cache/kv_layout.h, cache/kv_quant.h); an I8 value alone is not a number, so load_as_f32 /
// store_from_f32 do not take it.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace kvp {

enum class DType : uint8_t { F32 = 0, F16 = 1, BF16 = 2, I8 = 3 };

// Bytes of one element (of one stored value for I8; its row's scale is counted by KvLayout).
constexpr size_t dtype_size_bytes(DType t) { return t == DType::F32 ? 4 : t == DType::I8 ? 1 : 2; }
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
  }
  return "?";
}
// "f32" / "float32", "f16" / "float16" / "half", "bf16" / "bfloat16"; nullopt otherwise (int8 is
// not a tensor dtype: see parse_kv_cache_dtype).
std::optional<DType> parse_dtype(std::string_view name);
// parse_dtype's names and "int8" / "i8": the dtypes a KV cache can hold.
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

// Reads element i of a buffer of type t as float. requires: t is not I8.
inline float load_as_f32(const void* data, DType t, size_t i) {
  switch (t) {
    case DType::I8:
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
// requires: t is not I8.
inline void store_from_f32(void* data, DType t, size_t i, float v) {
  switch (t) {
    case DType::I8:
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

#include "common/dtype.h"

#include "common/e4m3.h"

namespace kvp {

std::optional<DType> parse_dtype(std::string_view name) {
  if (name == "f32" || name == "float32" || name == "float") return DType::F32;
  if (name == "f16" || name == "float16" || name == "half") return DType::F16;
  if (name == "bf16" || name == "bfloat16") return DType::BF16;
  return std::nullopt;
}

std::optional<DType> parse_kv_cache_dtype(std::string_view name) {
  if (name == "int8" || name == "i8") return DType::I8;
  if (name == "fp8" || name == "fp8_e4m3" || name == "float8_e4m3fn") return DType::FP8;
  return parse_dtype(name);
}

float f16_to_f32(F16 x) {
  const uint32_t sign = uint32_t{x.bits & 0x8000u} << 16;
  const uint32_t exponent = (x.bits >> 10) & 0x1fu;
  uint32_t mantissa = x.bits & 0x3ffu;
  uint32_t out;
  if (exponent == 0) {
    if (mantissa == 0) {
      out = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mantissa <<= 1;
      } while ((mantissa & 0x400u) == 0);
      out = sign | ((127 - 15 - e) << 23) | ((mantissa & 0x3ffu) << 13);
    }
  } else if (exponent == 0x1f) {
    out = sign | 0x7f800000u | (mantissa << 13);
  } else {
    out = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  }
  return std::bit_cast<float>(out);
}

F16 f32_to_f16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return F16{static_cast<uint16_t>(sign | 0x7e00u)};   // NaN
  if (abs >= 0x477ff000u) return F16{static_cast<uint16_t>(sign | 0x7c00u)};  // overflow -> inf
  if (abs < 0x38800000u) {  // result is subnormal or zero
    if (abs < 0x33000000u) return F16{static_cast<uint16_t>(sign)};
    const uint32_t exponent = abs >> 23;
    const uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    // value = mantissa * 2^(exponent-150); unit 2^-24
    return F16{static_cast<uint16_t>(sign | shift_right_nearest_even(mantissa, 126 - exponent))};
  }
  // The rebased exponent is a multiple of 2^10, so it can be subtracted after rounding.
  const uint32_t half = shift_right_nearest_even(abs, 13) - ((127u - 15u) << 10);
  return F16{static_cast<uint16_t>(sign | half)};
}

uint8_t f32_to_e4m3(float f) { return e4m3_from_f32_bits(std::bit_cast<uint32_t>(f)); }

float e4m3_to_f32(uint8_t code) {
  const uint32_t sign = uint32_t{code & 0x80u} << 24;
  const uint32_t exponent = (code >> 3) & 0xfu;
  const uint32_t mantissa = code & 0x7u;
  if (exponent == 0xf && mantissa == 0x7) return std::bit_cast<float>(sign | 0x7fc00000u);
  if (exponent == 0) {  // subnormal: mantissa * 2^-9, exact in f32
    const float magnitude = static_cast<float>(mantissa) * 0x1p-9f;
    return sign != 0 ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | ((exponent + 127 - 7) << 23) | (mantissa << 20));
}

}  // namespace kvp

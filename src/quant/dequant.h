// ggml tensor element types and their dequantisation to f32.
//
// Every ggml type stores a row of ne[0] elements as ne[0] / block_size blocks of type_size
// bytes. kvpool knows the size of every type the gguf package 0.19.0 knows (so any GGUF file can
// be listed and bounds-checked) and dequantises F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
// Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS and MXFP4, bit-exactly as gguf.quants.dequantize
// computes them (same f32 operations in the same order; see docs/weights.md).
//
// Block layouts (all little-endian; d, m, dmin are f16; "nibble" = 4 bits):
//   Q4_0 [18 B / 32]  d | qs[16]            x[j] = d*(lo(qs[j])-8), x[j+16] = d*(hi(qs[j])-8)
//   Q4_1 [20 B / 32]  d | m | qs[16]        x[j] = d*lo(qs[j]) + m, x[j+16] = d*hi(qs[j]) + m
//   Q5_0 [22 B / 32]  d | qh(u32) | qs[16]  5th bit of x[j] is bit j of qh; value d*(q-16)
//   Q5_1 [24 B / 32]  d | m | qh | qs[16]   value d*q + m
//   Q8_0 [34 B / 32]  d | qs[32] (int8)     x[j] = qs[j]*d
//   Q2_K [84 B / 256]  scales[16] (4-bit scale | 4-bit min) | qs[64] (2-bit) | d | dmin
//   Q3_K [110 B / 256] hmask[32] | qs[64] (2-bit) | scales[12] (16 x 6-bit, signed) | d
//   Q4_K [144 B / 256] d | dmin | scales[12] (8 x 6-bit scale + 6-bit min) | qs[128]
//   Q5_K [176 B / 256] d | dmin | scales[12] | qh[32] | qs[128]
//   Q6_K [210 B / 256] ql[128] | qh[64] | scales[16] (int8) | d
//   IQ4_NL [18 B / 32]   d | qs[16] (4-bit indices into a 16-level table)
//   IQ4_XS [136 B / 256] d | scales_h (u16) | scales_l[4] | qs[128]
//   MXFP4  [17 B / 32]   e (E8M0 exponent) | qs[16] (4-bit E2M1 codes)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kvp {

// Values are ggml's (they are stored in GGUF tensor infos). Gaps (4, 5, 31..33, 36..38) are
// types ggml removed; a file naming them is refused.
enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
  NVFP4 = 40,
  Q1_0 = 41,
};

struct GgmlTypeInfo {
  GgmlType type;
  std::string_view name;  // "Q4_K"
  uint32_t block_size;    // elements per block
  uint32_t type_size;     // bytes per block
  bool can_dequantize;    // kvpool converts it to f32
};

// The traits of raw type value `raw`, or nullptr if it is not a ggml type kvpool knows.
const GgmlTypeInfo* ggml_type_info(uint32_t raw);
// requires: `type` is a known enumerator.
const GgmlTypeInfo& ggml_type_info(GgmlType type);
inline std::string_view ggml_type_name(GgmlType type) { return ggml_type_info(type).name; }
inline bool can_dequantize(GgmlType type) { return ggml_type_info(type).can_dequantize; }

// Bytes that `num_elements` elements of `type` occupy.
// requires: num_elements % block_size == 0
size_t ggml_row_size_bytes(GgmlType type, size_t num_elements);

// Dequantises `num_elements` elements (one row, or several consecutive rows) to f32.
// requires: can_dequantize(type); num_elements % block_size == 0;
//   src: [ggml_row_size_bytes(type, num_elements)] bytes, any alignment;
//   dst: [num_elements] floats, not overlapping src. Writes dst only.
void dequantize(GgmlType type, const void* src, size_t num_elements, float* dst);

}  // namespace kvp

// Dequantisation of ggml blocks to f32. Each kernel follows gguf.quants' f32 arithmetic
// operation by operation (products before sums, no fused multiply-add) so the results match it
// bit for bit; loops are written over whole blocks so the compiler can vectorise them.
#include "quant/dequant.h"

#include <array>
#include <cstring>

#include "common/check.h"
#include "common/dtype.h"

namespace kvp {
namespace {

constexpr GgmlTypeInfo kTypes[] = {
    {GgmlType::F32, "F32", 1, 4, true},
    {GgmlType::F16, "F16", 1, 2, true},
    {GgmlType::Q4_0, "Q4_0", 32, 18, true},
    {GgmlType::Q4_1, "Q4_1", 32, 20, true},
    {GgmlType::Q5_0, "Q5_0", 32, 22, true},
    {GgmlType::Q5_1, "Q5_1", 32, 24, true},
    {GgmlType::Q8_0, "Q8_0", 32, 34, true},
    {GgmlType::Q8_1, "Q8_1", 32, 40, false},
    {GgmlType::Q2_K, "Q2_K", 256, 84, true},
    {GgmlType::Q3_K, "Q3_K", 256, 110, true},
    {GgmlType::Q4_K, "Q4_K", 256, 144, true},
    {GgmlType::Q5_K, "Q5_K", 256, 176, true},
    {GgmlType::Q6_K, "Q6_K", 256, 210, true},
    {GgmlType::Q8_K, "Q8_K", 256, 292, false},
    {GgmlType::IQ2_XXS, "IQ2_XXS", 256, 66, false},
    {GgmlType::IQ2_XS, "IQ2_XS", 256, 74, false},
    {GgmlType::IQ3_XXS, "IQ3_XXS", 256, 98, false},
    {GgmlType::IQ1_S, "IQ1_S", 256, 50, false},
    {GgmlType::IQ4_NL, "IQ4_NL", 32, 18, true},
    {GgmlType::IQ3_S, "IQ3_S", 256, 110, false},
    {GgmlType::IQ2_S, "IQ2_S", 256, 82, false},
    {GgmlType::IQ4_XS, "IQ4_XS", 256, 136, true},
    {GgmlType::I8, "I8", 1, 1, false},
    {GgmlType::I16, "I16", 1, 2, false},
    {GgmlType::I32, "I32", 1, 4, false},
    {GgmlType::I64, "I64", 1, 8, false},
    {GgmlType::F64, "F64", 1, 8, false},
    {GgmlType::IQ1_M, "IQ1_M", 256, 56, false},
    {GgmlType::BF16, "BF16", 1, 2, true},
    {GgmlType::TQ1_0, "TQ1_0", 256, 54, false},
    {GgmlType::TQ2_0, "TQ2_0", 256, 66, false},
    {GgmlType::MXFP4, "MXFP4", 32, 17, true},
    {GgmlType::NVFP4, "NVFP4", 64, 36, false},
    {GgmlType::Q1_0, "Q1_0", 128, 18, false},
};

// f16 -> f32 for all 65536 patterns: f16 data is converted by lookup (256 KiB, built once).
const std::array<float, 65536>& f16_table() {
  static const std::array<float, 65536> table = [] {
    std::array<float, 65536> t{};
    for (uint32_t i = 0; i < 65536; ++i) t[i] = f16_to_f32(F16{static_cast<uint16_t>(i)});
    return t;
  }();
  return table;
}

inline float f16_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return f16_table()[bits];
}

constexpr size_t kQK = 256;  // elements per K-quant super-block

// Unpacks Q4_K/Q5_K's 8 six-bit scales and mins. scales: [12] bytes; sc, mn: [8] (written).
void get_scale_min_k4(const uint8_t* scales, uint8_t* sc, uint8_t* mn) {
  // scales[12]: bytes 0..3 low 6 bits = sc[0..3], bytes 4..7 low 6 bits = mn[0..3],
  // bytes 8..11 low nibble = low 4 bits of sc[4..7], high nibble = low 4 bits of mn[4..7];
  // the top 2 bits of bytes 0..3 / 4..7 are bits 4..5 of sc[4..7] / mn[4..7].
  for (int j = 0; j < 4; ++j) {
    sc[j] = scales[j] & 0x3f;
    mn[j] = scales[4 + j] & 0x3f;
    sc[4 + j] = static_cast<uint8_t>((scales[8 + j] & 0x0f) | ((scales[j] >> 2) & 0x30));
    mn[4 + j] = static_cast<uint8_t>((scales[8 + j] >> 4) | ((scales[4 + j] >> 2) & 0x30));
  }
}

// Kernels: src / b: [n * 2] bytes or [num_blocks * type_size] bytes, any alignment;
// dst / y: [n] or [num_blocks * block_size] floats (written).
void dequant_f16(const uint8_t* src, size_t n, float* dst) {
  const auto& table = f16_table();
  for (size_t i = 0; i < n; ++i) {
    uint16_t bits;
    std::memcpy(&bits, src + 2 * i, 2);
    dst[i] = table[bits];
  }
}

void dequant_bf16(const uint8_t* src, size_t n, float* dst) {
  for (size_t i = 0; i < n; ++i) {
    uint16_t bits;
    std::memcpy(&bits, src + 2 * i, 2);
    uint32_t u = uint32_t{bits} << 16;
    std::memcpy(dst + i, &u, 4);
  }
}

void dequant_q4_0(const uint8_t* b, size_t num_blocks, float* y) {
  for (size_t i = 0; i < num_blocks; ++i, b += 18, y += 32) {
    const float d = f16_at(b);
    const uint8_t* qs = b + 2;  // [16]
    for (int j = 0; j < 16; ++j) {
      y[j] = d * static_cast<float>((qs[j] & 0x0f) - 8);
      y[j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
    }
  }
}

void dequant_q4_1(const uint8_t* b, size_t num_blocks, float* y) {
  for (size_t i = 0; i < num_blocks; ++i, b += 20, y += 32) {
    const float d = f16_at(b);
    const float m = f16_at(b + 2);
    const uint8_t* qs = b + 4;  // [16]
    for (int j = 0; j < 16; ++j) {
      const float p0 = d * static_cast<float>(qs[j] & 0x0f);
      const float p1 = d * static_cast<float>(qs[j] >> 4);
      y[j] = p0 + m;
      y[j + 16] = p1 + m;
    }
  }
}

// kBitsToBytes[x]: byte k is (bit k of x) << 4, so 8 fifth bits expand with one lookup.
constexpr std::array<uint64_t, 256> kBitsToBytes = [] {
  std::array<uint64_t, 256> table{};
  for (uint32_t x = 0; x < 256; ++x) {
    for (uint32_t k = 0; k < 8; ++k) table[x] |= uint64_t{((x >> k) & 1u) << 4} << (8 * k);
  }
  return table;
}();

// The 32 fifth bits of a Q5_0/Q5_1 block (bit j of a little-endian u32) as one byte each, so
// the element loop has no per-element variable shift and vectorises.
inline void expand_high_bits(const uint8_t* qh, uint8_t* bits) {
  for (int k = 0; k < 4; ++k) std::memcpy(bits + 8 * k, &kBitsToBytes[qh[k]], 8);
}

void dequant_q5_0(const uint8_t* b, size_t num_blocks, float* y) {
  for (size_t i = 0; i < num_blocks; ++i, b += 22, y += 32) {
    const float d = f16_at(b);
    uint8_t hb[32];  // [32] fifth bit of each element, already shifted to bit 4
    expand_high_bits(b + 2, hb);
    const uint8_t* qs = b + 6;  // [16]
    for (int j = 0; j < 16; ++j) {
      const int q0 = (qs[j] & 0x0f) | hb[j];
      const int q1 = (qs[j] >> 4) | hb[j + 16];
      y[j] = d * static_cast<float>(q0 - 16);
      y[j + 16] = d * static_cast<float>(q1 - 16);
    }
  }
}

void dequant_q5_1(const uint8_t* b, size_t num_blocks, float* y) {
  for (size_t i = 0; i < num_blocks; ++i, b += 24, y += 32) {
    const float d = f16_at(b);
    const float m = f16_at(b + 2);
    uint8_t hb[32];  // [32] fifth bit of each element, already shifted to bit 4
    expand_high_bits(b + 4, hb);
    const uint8_t* qs = b + 8;  // [16]
    for (int j = 0; j < 16; ++j) {
      const int q0 = (qs[j] & 0x0f) | hb[j];
      const int q1 = (qs[j] >> 4) | hb[j + 16];
      const float p0 = d * static_cast<float>(q0);
      const float p1 = d * static_cast<float>(q1);
      y[j] = p0 + m;
      y[j + 16] = p1 + m;
    }
  }
}

void dequant_q8_0(const uint8_t* b, size_t num_blocks, float* y) {
  for (size_t i = 0; i < num_blocks; ++i, b += 34, y += 32) {
    const float d = f16_at(b);
    const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);  // [32]
    for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(qs[j]) * d;
  }
}

// Q2_K: 16 sub-blocks of 16; element e = 128h + 32k + l holds bits 2k..2k+1 of qs[32h + l];
// sub-block s = e/16 has scale d*(scales[s] & 15) and offset dmin*(scales[s] >> 4).
void dequant_q2_k(const uint8_t* b, size_t num_blocks, float* y) {
  for (size_t i = 0; i < num_blocks; ++i, b += 84, y += kQK) {
    const uint8_t* scales = b;   // [16]
    const uint8_t* qs = b + 16;  // [64]
    const float d = f16_at(b + 80);
    const float dmin = f16_at(b + 82);
    for (int h = 0; h < 2; ++h) {
      for (int k = 0; k < 4; ++k) {
        for (int g = 0; g < 2; ++g) {  // two sub-blocks of 16 per 32 elements
          const int s = 8 * h + 2 * k + g;
          const float dl = d * static_cast<float>(scales[s] & 0x0f);
          const float ml = dmin * static_cast<float>(scales[s] >> 4);
          float* out = y + 16 * s;  // [16]
          for (int l = 0; l < 16; ++l) {
            const float p = dl * static_cast<float>((qs[32 * h + 16 * g + l] >> (2 * k)) & 3);
            out[l] = p - ml;
          }
        }
      }
    }
  }
}

// Q3_K: 16 sub-blocks of 16 with signed 6-bit scales: the low 4 bits of scale s are nibble s/8
// of scales[s % 8], the high 2 bits are bits 2*(s/4) of scales[8 + s % 4], minus 32. Element
// e = 128h + 32k + l has low bits 2k..2k+1 of qs[32h + l] and loses 4 when bit e/32 of
// hmask[l] is clear; its value is d*scale[e/16] * q.
void dequant_q3_k(const uint8_t* b, size_t num_blocks, float* y) {
  for (size_t i = 0; i < num_blocks; ++i, b += 110, y += kQK) {
    const uint8_t* hmask = b;        // [32]
    const uint8_t* qs = b + 32;      // [64]
    const uint8_t* packed = b + 96;  // [12]
    const float d = f16_at(b + 108);
    float dl[16];
    for (int s = 0; s < 16; ++s) {
      const int lo = (packed[s % 8] >> (4 * (s / 8))) & 0x0f;
      const int hi = (packed[8 + s % 4] >> (2 * (s / 4))) & 0x03;
      dl[s] = d * static_cast<float>((lo | (hi << 4)) - 32);
    }
    for (int h = 0; h < 2; ++h) {
      for (int k = 0; k < 4; ++k) {
        const int bit = 4 * h + k;          // hmask bit of these 32 elements
        float* out = y + 128 * h + 32 * k;  // [32]
        for (int l = 0; l < 32; ++l) {
          const int low = (qs[32 * h + l] >> (2 * k)) & 3;
          const int q = low - (((hmask[l] >> bit) & 1) ? 0 : 4);
          out[l] = dl[8 * h + 2 * k + l / 16] * static_cast<float>(q);
        }
      }
    }
  }
}

// IQ4_NL / IQ4_XS: 4-bit indices into a fixed non-linear table of int8 levels.
constexpr int8_t kIq4Levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                   1,    13,   25,  38,  53,  69,  89,  113};

// IQ4_NL [18 B / 32]: d | qs[16]; x[j] = d*level(lo(qs[j])), x[j+16] = d*level(hi(qs[j])).
void dequant_iq4_nl(const uint8_t* b, size_t num_blocks, float* y) {
  for (size_t i = 0; i < num_blocks; ++i, b += 18, y += 32) {
    const float d = f16_at(b);
    const uint8_t* qs = b + 2;  // [16]
    for (int j = 0; j < 16; ++j) {
      y[j] = d * static_cast<float>(kIq4Levels[qs[j] & 0x0f]);
      y[j + 16] = d * static_cast<float>(kIq4Levels[qs[j] >> 4]);
    }
  }
}

// MXFP4 (OCP microscaling, GPT-OSS's experts) [17 B / 32]: e (u8, an E8M0 exponent) | qs[16]
// (4-bit E2M1 codes); x[j] = d * level(lo(qs[j])), x[j+16] = d * level(hi(qs[j])) with the
// levels doubled to integers and d = 2^(e - 128), half the block's scale (ggml's
// ggml_e8m0_to_fp32_half: built from the bits, so e = 0 and 1 give subnormals exactly).
constexpr int8_t kMxfp4Levels[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

void dequant_mxfp4(const uint8_t* b, size_t num_blocks, float* y) {
  for (size_t i = 0; i < num_blocks; ++i, b += 17, y += 32) {
    const uint32_t e = b[0];
    const uint32_t bits = e < 2 ? uint32_t{0x00200000} << e : (e - 1) << 23;
    float d;
    std::memcpy(&d, &bits, sizeof d);
    const uint8_t* qs = b + 1;  // [16]
    for (int j = 0; j < 16; ++j) {
      y[j] = d * static_cast<float>(kMxfp4Levels[qs[j] & 0x0f]);
      y[j + 16] = d * static_cast<float>(kMxfp4Levels[qs[j] >> 4]);
    }
  }
}

// IQ4_XS [136 B / 256]: d | scales_h (u16) | scales_l[4] | qs[128]. Sub-block s (32 elements)
// has scale d*((nibble s%2 of scales_l[s/2]) | (bits 2s..2s+1 of scales_h) << 4) - 32) and
// takes the low then high nibbles of qs[16s .. 16s+15].
void dequant_iq4_xs(const uint8_t* b, size_t num_blocks, float* y) {
  for (size_t i = 0; i < num_blocks; ++i, b += 136, y += kQK) {
    const float d = f16_at(b);
    uint16_t scales_h;
    std::memcpy(&scales_h, b + 2, 2);
    const uint8_t* scales_l = b + 4;  // [4]
    const uint8_t* qs = b + 8;        // [128]
    for (int s = 0; s < 8; ++s) {
      const int lo = (scales_l[s / 2] >> (4 * (s % 2))) & 0x0f;
      const int hi = (scales_h >> (2 * s)) & 0x03;
      const float dl = d * static_cast<float>((lo | (hi << 4)) - 32);
      float* out = y + 32 * s;  // [32]
      for (int j = 0; j < 16; ++j) {
        out[j] = dl * static_cast<float>(kIq4Levels[qs[16 * s + j] & 0x0f]);
        out[j + 16] = dl * static_cast<float>(kIq4Levels[qs[16 * s + j] >> 4]);
      }
    }
  }
}

// Q4_K and Q5_K: 8 sub-blocks of 32; sub-block s has scale d*sc[s] and offset dmin*mn[s].
// Sub-blocks 2c and 2c+1 take the low and high nibbles of qs[32c .. 32c+31].
void dequant_q4_k(const uint8_t* b, size_t num_blocks, float* y) {
  for (size_t i = 0; i < num_blocks; ++i, b += 144, y += kQK) {
    const float d = f16_at(b);
    const float dmin = f16_at(b + 2);
    uint8_t sc[8], mn[8];
    get_scale_min_k4(b + 4, sc, mn);
    const uint8_t* qs = b + 16;  // [128]
    for (int c = 0; c < 4; ++c) {
      const float d_lo = d * static_cast<float>(sc[2 * c]);
      const float m_lo = dmin * static_cast<float>(mn[2 * c]);
      const float d_hi = d * static_cast<float>(sc[2 * c + 1]);
      const float m_hi = dmin * static_cast<float>(mn[2 * c + 1]);
      float* out = y + 64 * c;  // [64]
      for (int l = 0; l < 32; ++l) {
        const float p_lo = d_lo * static_cast<float>(qs[32 * c + l] & 0x0f);
        const float p_hi = d_hi * static_cast<float>(qs[32 * c + l] >> 4);
        out[l] = p_lo - m_lo;
        out[l + 32] = p_hi - m_hi;
      }
    }
  }
}

// Q5_K: as Q4_K, plus bit s of qh[l] is the fifth bit of element l of sub-block s.
void dequant_q5_k(const uint8_t* b, size_t num_blocks, float* y) {
  for (size_t i = 0; i < num_blocks; ++i, b += 176, y += kQK) {
    const float d = f16_at(b);
    const float dmin = f16_at(b + 2);
    uint8_t sc[8], mn[8];
    get_scale_min_k4(b + 4, sc, mn);
    const uint8_t* qh = b + 16;  // [32]
    const uint8_t* qs = b + 48;  // [128]
    for (int c = 0; c < 4; ++c) {
      const int s_lo = 2 * c;
      const int s_hi = 2 * c + 1;
      const float d_lo = d * static_cast<float>(sc[s_lo]);
      const float m_lo = dmin * static_cast<float>(mn[s_lo]);
      const float d_hi = d * static_cast<float>(sc[s_hi]);
      const float m_hi = dmin * static_cast<float>(mn[s_hi]);
      float* out = y + 64 * c;  // [64]
      for (int l = 0; l < 32; ++l) {
        const int q_lo = (qs[32 * c + l] & 0x0f) | (((qh[l] >> s_lo) & 1) << 4);
        const int q_hi = (qs[32 * c + l] >> 4) | (((qh[l] >> s_hi) & 1) << 4);
        const float p_lo = d_lo * static_cast<float>(q_lo);
        const float p_hi = d_hi * static_cast<float>(q_hi);
        out[l] = p_lo - m_lo;
        out[l + 32] = p_hi - m_hi;
      }
    }
  }
}

// Q6_K: two halves of 128 elements. In half h, element i (0..127) takes its low 4 bits from
// nibble i/64 of ql[64h + i%64] and its high 2 bits from bits 2*(i/32) of qh[32h + i%32];
// element e of the block has scale d*scales[e/16] and value scale*(q-32). The loop visits the
// four elements l, l+32, l+64, l+96 that share ql/qh bytes, so it vectorises over l.
void dequant_q6_k(const uint8_t* b, size_t num_blocks, float* y) {
  for (size_t i = 0; i < num_blocks; ++i, b += 210, y += kQK) {
    const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);  // [16]
    const float d = f16_at(b + 208);
    float ds[16];
    for (int s = 0; s < 16; ++s) ds[s] = d * static_cast<float>(scales[s]);
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = b + 64 * h;        // [64]
      const uint8_t* qh = b + 128 + 32 * h;  // [32]
      float* out = y + 128 * h;              // [128]
      const float* sc = ds + 8 * h;          // [8] scales of this half, one per 16 elements
      for (int g = 0; g < 2; ++g) {          // l in [16g, 16g + 16): one scale per quarter
        for (int l = 16 * g; l < 16 * g + 16; ++l) {
          const int q1 = ((ql[l] & 0x0f) | ((qh[l] & 0x03) << 4)) - 32;
          const int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 0x03) << 4)) - 32;
          const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 0x03) << 4)) - 32;
          const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 0x03) << 4)) - 32;
          out[l] = sc[g] * static_cast<float>(q1);
          out[l + 32] = sc[2 + g] * static_cast<float>(q2);
          out[l + 64] = sc[4 + g] * static_cast<float>(q3);
          out[l + 96] = sc[6 + g] * static_cast<float>(q4);
        }
      }
    }
  }
}

}  // namespace

const GgmlTypeInfo* ggml_type_info(uint32_t raw) {
  for (const GgmlTypeInfo& info : kTypes) {
    if (static_cast<uint32_t>(info.type) == raw) return &info;
  }
  return nullptr;
}

const GgmlTypeInfo& ggml_type_info(GgmlType type) {
  const GgmlTypeInfo* info = ggml_type_info(static_cast<uint32_t>(type));
  KVP_CHECK(info != nullptr, "unknown GgmlType {}", static_cast<uint32_t>(type));
  return *info;
}

size_t ggml_row_size_bytes(GgmlType type, size_t num_elements) {
  const GgmlTypeInfo& info = ggml_type_info(type);
  KVP_CHECK(num_elements % info.block_size == 0, "{} elements of {} are not whole blocks of {}",
            num_elements, info.name, info.block_size);
  return num_elements / info.block_size * info.type_size;
}

void dequantize(GgmlType type, const void* src, size_t num_elements, float* dst) {
  const GgmlTypeInfo& info = ggml_type_info(type);
  KVP_CHECK(info.can_dequantize, "dequantize: type {} is not supported", info.name);
  KVP_CHECK(num_elements % info.block_size == 0,
            "dequantize: {} elements of {} are not whole blocks", num_elements, info.name);
  const auto* b = static_cast<const uint8_t*>(src);
  const size_t num_blocks = num_elements / info.block_size;
  switch (type) {
    case GgmlType::F32:
      std::memcpy(dst, b, num_elements * 4);
      return;
    case GgmlType::F16:
      dequant_f16(b, num_elements, dst);
      return;
    case GgmlType::BF16:
      dequant_bf16(b, num_elements, dst);
      return;
    case GgmlType::Q4_0:
      dequant_q4_0(b, num_blocks, dst);
      return;
    case GgmlType::Q4_1:
      dequant_q4_1(b, num_blocks, dst);
      return;
    case GgmlType::Q5_0:
      dequant_q5_0(b, num_blocks, dst);
      return;
    case GgmlType::Q5_1:
      dequant_q5_1(b, num_blocks, dst);
      return;
    case GgmlType::Q8_0:
      dequant_q8_0(b, num_blocks, dst);
      return;
    case GgmlType::Q2_K:
      dequant_q2_k(b, num_blocks, dst);
      return;
    case GgmlType::IQ4_NL:
      dequant_iq4_nl(b, num_blocks, dst);
      return;
    case GgmlType::IQ4_XS:
      dequant_iq4_xs(b, num_blocks, dst);
      return;
    case GgmlType::MXFP4:
      dequant_mxfp4(b, num_blocks, dst);
      return;
    case GgmlType::Q3_K:
      dequant_q3_k(b, num_blocks, dst);
      return;
    case GgmlType::Q4_K:
      dequant_q4_k(b, num_blocks, dst);
      return;
    case GgmlType::Q5_K:
      dequant_q5_k(b, num_blocks, dst);
      return;
    case GgmlType::Q6_K:
      dequant_q6_k(b, num_blocks, dst);
      return;
    default:
      break;
  }
  KVP_CHECK(false, "dequantize: no kernel for {}", info.name);
}

}  // namespace kvp

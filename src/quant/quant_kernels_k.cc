// The integer kernels for the formats with super-blocks of 256 (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
// IQ4_XS): each format's view as q * d16 + m16 over 8 sub-blocks of 32 (quant_kernel-inl.h),
// compiled per Highway target. The scales are decoded once per super-block. Layouts: dequant.h.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "quant/quant_kernels_k.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// foreach_target must come first: it re-includes this file once per target.
#include <hwy/highway.h>

#include "quant/quant_kernel-inl.h"
#include "quant/quant_kernels.h"

HWY_BEFORE_NAMESPACE();
namespace kvp::quant::HWY_NAMESPACE {

// Q4_K / Q5_K's 8 six-bit scales and mins (dequant.cc's get_scale_min_k4).
HWY_INLINE void scale_min_k4(const uint8_t* scales, int* sc, int* mn) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = scales[j] & 0x3f;
    mn[j] = scales[4 + j] & 0x3f;
    sc[4 + j] = (scales[8 + j] & 0x0f) | ((scales[j] >> 2) & 0x30);
    mn[4 + j] = (scales[8 + j] >> 4) | ((scales[4 + j] >> 2) & 0x30);
  }
}

// Q2_K [84 B]: scales[16] | qs[64] | d | dmin. Sub-block s = 4h + k takes bits 2k..2k+1 of
// qs[32h .. 32h + 31]; 16-group g has w = d * (scales[g] & 15) * q - dmin * (scales[g] >> 4).
struct FmtQ2K {
  static constexpr int kSubs = 8;
  static constexpr size_t kBytes = 84;
  static constexpr bool kSigned = false;
  static constexpr bool kHasMin = true;
  static HWY_INLINE void header(const uint8_t* b, float* d16, float* m16) {
    const float d = f16_at(b + 80);
    const float dmin = f16_at(b + 82);
    for (int g = 0; g < 16; ++g) {
      d16[g] = d * static_cast<float>(b[g] & 0x0f);
      m16[g] = -(dmin * static_cast<float>(b[g] >> 4));
    }
  }
  static HWY_INLINE void unpack(const uint8_t* b, int s, uint8_t* q) {
    const uint8_t* qs = b + 16 + 32 * (s / 4);
    for (int l = 0; l < 32; ++l) q[l] = (qs[l] >> (2 * (s % 4))) & 3;
  }
#if KVP_QUANT_X86
  static HWY_INLINE __m256i load(const uint8_t* b, int s) {
    return shift_mask(load256(b + 16 + 32 * (s / 4)), 2 * (s % 4), 3);
  }
#endif
};

// Q3_K [110 B]: hmask[32] | qs[64] | scales[12] | d. Sub-block s = 4h + k: low bits 2k..2k+1
// of qs[32h + l], plus 4 where bit s of hmask[l] is set; w = d * scale[g] * (q - 4) with the
// signed 6-bit scale of 16-group g.
struct FmtQ3K {
  static constexpr int kSubs = 8;
  static constexpr size_t kBytes = 110;
  static constexpr bool kSigned = false;
  static constexpr bool kHasMin = true;
  static HWY_INLINE void header(const uint8_t* b, float* d16, float* m16) {
    const uint8_t* packed = b + 96;  // [12]
    const float d = f16_at(b + 108);
    for (int g = 0; g < 16; ++g) {
      const int lo = (packed[g % 8] >> (4 * (g / 8))) & 0x0f;
      const int hi = (packed[8 + g % 4] >> (2 * (g / 4))) & 0x03;
      d16[g] = d * static_cast<float>((lo | (hi << 4)) - 32);
      m16[g] = -4.0f * d16[g];
    }
  }
  static HWY_INLINE void unpack(const uint8_t* b, int s, uint8_t* q) {
    const uint8_t* qs = b + 32 + 32 * (s / 4);
    for (int l = 0; l < 32; ++l) {
      q[l] = static_cast<uint8_t>(((qs[l] >> (2 * (s % 4))) & 3) | (((b[l] >> s) & 1) << 2));
    }
  }
#if KVP_QUANT_X86
  static HWY_INLINE __m256i load(const uint8_t* b, int s) {
    return _mm256_or_si256(shift_mask(load256(b + 32 + 32 * (s / 4)), 2 * (s % 4), 3),
                           bit_select(load256(b), s, 4));
  }
#endif
};

// Q4_K [144 B]: d | dmin | scales[12] | qs[128]. Sub-block s takes the low (s even) or high
// nibbles of qs[32 (s/2) ..]; w = d * sc[s] * q - dmin * mn[s].
struct FmtQ4K {
  static constexpr int kSubs = 8;
  static constexpr size_t kBytes = 144;
  static constexpr bool kSigned = false;
  static constexpr bool kHasMin = true;
  static HWY_INLINE void header(const uint8_t* b, float* d16, float* m16) {
    const float d = f16_at(b);
    const float dmin = f16_at(b + 2);
    int sc[8], mn[8];
    scale_min_k4(b + 4, sc, mn);
    for (int s = 0; s < 8; ++s) {
      d16[2 * s] = d16[2 * s + 1] = d * static_cast<float>(sc[s]);
      m16[2 * s] = m16[2 * s + 1] = -(dmin * static_cast<float>(mn[s]));
    }
  }
  static HWY_INLINE void unpack(const uint8_t* b, int s, uint8_t* q) {
    const uint8_t* qs = b + 16 + 32 * (s / 2);
    for (int l = 0; l < 32; ++l) q[l] = (qs[l] >> (4 * (s % 2))) & 0x0f;
  }
#if KVP_QUANT_X86
  static HWY_INLINE __m256i load(const uint8_t* b, int s) {
    return shift_mask(load256(b + 16 + 32 * (s / 2)), 4 * (s % 2), 0x0f);
  }
#endif
};

// Q5_K [176 B]: d | dmin | scales[12] | qh[32] | qs[128]; as Q4_K plus bit s of qh[l] as bit 4.
struct FmtQ5K {
  static constexpr int kSubs = 8;
  static constexpr size_t kBytes = 176;
  static constexpr bool kSigned = false;
  static constexpr bool kHasMin = true;
  static HWY_INLINE void header(const uint8_t* b, float* d16, float* m16) {
    FmtQ4K::header(b, d16, m16);
  }
  static HWY_INLINE void unpack(const uint8_t* b, int s, uint8_t* q) {
    const uint8_t* qs = b + 48 + 32 * (s / 2);
    for (int l = 0; l < 32; ++l) {
      q[l] =
          static_cast<uint8_t>(((qs[l] >> (4 * (s % 2))) & 0x0f) | (((b[16 + l] >> s) & 1) << 4));
    }
  }
#if KVP_QUANT_X86
  static HWY_INLINE __m256i load(const uint8_t* b, int s) {
    return _mm256_or_si256(shift_mask(load256(b + 48 + 32 * (s / 2)), 4 * (s % 2), 0x0f),
                           bit_select(load256(b + 16), s, 0x10));
  }
#endif
};

// Q6_K [210 B]: ql[128] | qh[64] | scales[16] (int8) | d. Sub-block s = 4h + t: low 4 bits from
// nibble t/2 of ql[64h + 32 (t%2) + l], high 2 bits from bits 2t of qh[32h + l];
// w = d * scales[g] * (q - 32).
struct FmtQ6K {
  static constexpr int kSubs = 8;
  static constexpr size_t kBytes = 210;
  static constexpr bool kSigned = false;
  static constexpr bool kHasMin = true;
  static HWY_INLINE void header(const uint8_t* b, float* d16, float* m16) {
    const float d = f16_at(b + 208);
    for (int g = 0; g < 16; ++g) {
      d16[g] = d * static_cast<float>(static_cast<int8_t>(b[192 + g]));
      m16[g] = -32.0f * d16[g];
    }
  }
  static HWY_INLINE void unpack(const uint8_t* b, int s, uint8_t* q) {
    const int h = s / 4, t = s % 4;
    const uint8_t* ql = b + 64 * h + 32 * (t % 2);
    const uint8_t* qh = b + 128 + 32 * h;
    for (int l = 0; l < 32; ++l) {
      q[l] =
          static_cast<uint8_t>(((ql[l] >> (4 * (t / 2))) & 0x0f) | (((qh[l] >> (2 * t)) & 3) << 4));
    }
  }
#if KVP_QUANT_X86
  static HWY_INLINE __m256i load(const uint8_t* b, int s) {
    const int h = s / 4, t = s % 4;
    const __m256i lo = shift_mask(load256(b + 64 * h + 32 * (t % 2)), 4 * (t / 2), 0x0f);
    const __m256i hi = shift_mask(load256(b + 128 + 32 * h), 2 * t, 3);
    return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
  }
#endif
};

// IQ4_XS [136 B]: d | scales_h (u16) | scales_l[4] | qs[128]. Sub-block s: nibbles of
// qs[16s ..] index the IQ4 levels; w = d * (6-bit scale - 32) * level.
struct FmtIq4Xs {
  static constexpr int kSubs = 8;
  static constexpr size_t kBytes = 136;
  static constexpr bool kSigned = true;
  static constexpr bool kHasMin = false;
  static HWY_INLINE void header(const uint8_t* b, float* d16, float*) {
    const float d = f16_at(b);
    uint16_t scales_h;
    std::memcpy(&scales_h, b + 2, 2);
    for (int s = 0; s < 8; ++s) {
      const int lo = (b[4 + s / 2] >> (4 * (s % 2))) & 0x0f;
      const int hi = (scales_h >> (2 * s)) & 0x03;
      d16[2 * s] = d16[2 * s + 1] = d * static_cast<float>((lo | (hi << 4)) - 32);
    }
  }
  static HWY_INLINE void unpack(const uint8_t* b, int s, uint8_t* q) {
    unpack_nibbles(b + 8 + 16 * s, q);
    for (int j = 0; j < 32; ++j) q[j] = static_cast<uint8_t>(kIq4Levels[q[j]]);
  }
#if KVP_QUANT_X86
  static HWY_INLINE __m256i load(const uint8_t* b, int s) {
    const __m256i table =
        _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(kIq4Levels)));
    return _mm256_shuffle_epi8(table, nibbles_32(b + 8 + 16 * s));
  }
#endif
};

void block_rows_k(const RowRange& rr, const ActBlocks& a) {
  switch (rr.w->type) {
    case GgmlType::Q2_K:
      return block_rows<FmtQ2K>(rr, a);
    case GgmlType::Q3_K:
      return block_rows<FmtQ3K>(rr, a);
    case GgmlType::Q4_K:
      return block_rows<FmtQ4K>(rr, a);
    case GgmlType::Q5_K:
      return block_rows<FmtQ5K>(rr, a);
    case GgmlType::Q6_K:
      return block_rows<FmtQ6K>(rr, a);
    case GgmlType::IQ4_XS:
      return block_rows<FmtIq4Xs>(rr, a);
    default:
      break;
  }
}

}  // namespace kvp::quant::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvp::quant {

HWY_EXPORT(block_rows_k);

void block_rows_k(const RowRange& rr, const ActBlocks& a) {
  HWY_DYNAMIC_DISPATCH(block_rows_k)(rr, a);
}

}  // namespace kvp::quant
#endif

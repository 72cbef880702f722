// The formats with super-blocks of 256 (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) as the integer
// kernels see them, over activations quantised per 256 (quant_act.h's ActBlocksK): their
// decoders (header / unpack for the portable path, scales / load on x86) and the x86 helpers
// they share. Layouts: dequant.h. Included once per Highway target by the K kernels'
// foreach_target passes: quant_kernels_k.cc (tiles over the GGUF layout, decode) and
// quant_kernels_prefill.cc (tiles over weight rows repacked 8 at a time, prefill).
//
//
// Every format is seen as 16 groups of 16 weights with integer scales and mins:
//     w[j] = d * sc[g] * q[j] - dmin * mn[g]          g = j / 16
// q[j] an integer of at most 8 bits (unsigned; signed for IQ4_XS), sc[g] and mn[g] small integers
// (per 32 weights in Q4_K, Q5_K and IQ4_XS: equal for the two groups of a sub-block), d and dmin
// the super-block's f32 factors. With x[j] ~ dx * xq[j] (one dx per 256) the super-block's dot
// product is
//     dx * (d * sum_g sc[g] * sum_{j in g} q[j] xq[j]  -  dmin * sum_g mn[g] * bsums[g])
// and both sums are exact in int32: on x86, maddubs multiplies the byte pairs of a sub-block of
// 32 into int16, madd_epi16 multiplies those by the group's scale and adds pairs into int32, and
// the super-block's 8 sub-blocks add up in int32 lanes; the mins meet bsums in one madd_epi16.
// Formats whose offset shares d (Q3_K: q - 4, Q6_K: q - 32) fold it into the same int32, so a
// (weight row, activation row) pair costs 8 x (maddubs, madd, add) and one or two f32
// multiply-adds per super-block. The packed scales are decoded with vector shuffles and shifts
// once per super-block and weight row, and shared by the tile's activation rows.
//
// int32 range: |q| <= 127 and |xq| <= 127 give maddubs pairs of at most 32258 (no saturation),
// scales of at most 128 in magnitude give madd lanes of at most 8.3e6, 8 sub-blocks 6.6e7, and
// the offsets |mn| <= 32 * 128 with |bsums| <= 2032 at most 1.4e8 more: below 2^31.
#if defined(KVP_QUANT_FORMATS_K_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVP_QUANT_FORMATS_K_INL_H_
#undef KVP_QUANT_FORMATS_K_INL_H_
#else
#define KVP_QUANT_FORMATS_K_INL_H_
#endif

#include <hwy/highway.h>

#include <cstdint>
#include <cstring>
#include <utility>

#include "quant/quant_kernel-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvp::quant::HWY_NAMESPACE {
namespace k_path {

// How a format's mins enter: not at all, through d (an offset of q folded into the int32 sum),
// or through their own factor dmin (a second f32 multiply-add).
enum class MinKind { kNone, kOffset, kSeparate };

// f(std::integral_constant<int, s>) for s = 0..7: sub-block indices as compile-time constants,
// so shifts and shuffle patterns become immediates.
template <class F, int... S>
HWY_INLINE void for_each_sub_impl(F&& f, std::integer_sequence<int, S...>) {
  (f(std::integral_constant<int, S>{}), ...);
}
template <class F>
HWY_INLINE void for_each_sub(F&& f) {
  for_each_sub_impl(f, std::make_integer_sequence<int, 8>{});
}

// The integer view of one super-block, for the portable kernel: sc[g] and mn[g] per group of 16
// as above, d and dmin.
struct IntHeader {
  int32_t sc[16];
  int32_t mn[16];
  float d;
  float dmin;
};

// Q4_K / Q5_K's 8 six-bit scales and mins (dequant.cc's get_scale_min_k4).
HWY_INLINE void scale_min_k4(const uint8_t* scales, int* sc, int* mn) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = scales[j] & 0x3f;
    mn[j] = scales[4 + j] & 0x3f;
    sc[4 + j] = (scales[8 + j] & 0x0f) | ((scales[j] >> 2) & 0x30);
    mn[4 + j] = (scales[8 + j] >> 4) | ((scales[4 + j] >> 2) & 0x30);
  }
}

HWY_INLINE void header_k4(const uint8_t* b, IntHeader& h) {
  h.d = f16_at(b);
  h.dmin = f16_at(b + 2);
  int sc[8], mn[8];
  scale_min_k4(b + 4, sc, mn);
  for (int g = 0; g < 16; ++g) {
    h.sc[g] = sc[g / 2];
    h.mn[g] = mn[g / 2];
  }
}

#if KVP_QUANT_X86

// A super-block's decoded scales for the x86 kernel, per weight row.
struct KScales {
  __m256i sc;    // the format's layout for its scale<s>(): int16 [8] per sub-block in both
                 // 128-bit halves (scales per 32), or int8 [16] per group (scales per 16)
  __m256i mn16;  // int16 [16]: mn[g], the multipliers of bsums
  float d;
  float dmin;
};

// v << n (n > 0) or v >> -n in 16-bit lanes.
template <int kShift>
HWY_INLINE __m256i shift16(__m256i v) {
  if constexpr (kShift > 0) return _mm256_slli_epi16(v, kShift);
  if constexpr (kShift < 0) return _mm256_srli_epi16(v, -kShift);
  return v;
}

// Bits [kFrom, kFrom + kWidth) of every byte of v moved to [kTo, kTo + kWidth), the other bits
// cleared. A 16-bit shift carries bits across the bytes of a lane, but the bits kept come from
// the same byte (kFrom >= 0 and kFrom + kWidth <= 8).
template <int kFrom, int kTo, int kWidth>
HWY_INLINE __m256i move_bits(__m256i v) {
  return _mm256_and_si256(shift16<kTo - kFrom>(v),
                          _mm256_set1_epi8(static_cast<char>(((1 << kWidth) - 1) << kTo)));
}

// Scale of sub-block s as int16 [16] for madd_epi16, from per-32 scales (int16 [8] in both
// halves of sc): lane l of either half is sc[s].
template <int s>
HWY_INLINE __m256i scale_per32(const KScales& k) {
  return _mm256_shuffle_epi8(k.sc, _mm256_set1_epi16(static_cast<int16_t>(0x0100 + 0x0202 * s)));
}

// From per-16 scales (int8 [16] in the low half of sc): lanes 0..7 (the first 16 weights of the
// sub-block, maddubs' low half) get sc[2s], lanes 8..15 sc[2s + 1], sign-extended.
template <int s>
HWY_INLINE __m256i scale_per16(const KScales& k) {
  const __m128i pick = _mm_set_epi64x(0x0101010101010101LL * (2 * s + 1),  // bytes 8..15
                                      0x0101010101010101LL * (2 * s));     // bytes 0..7
  return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(_mm256_castsi256_si128(k.sc), pick));
}

// The f16 pair at p as (first, second) f32.
HWY_INLINE void f16_pair(const uint8_t* p, float& first, float& second) {
  uint32_t bits;
  std::memcpy(&bits, p, 4);
  const __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int32_t>(bits)));
  first = _mm_cvtss_f32(f);
  second = _mm_cvtss_f32(_mm_movehdup_ps(f));
}

// Q4_K / Q5_K's 12 bytes of packed 6-bit scales and mins at p as bytes [sc0..sc7, mn0..mn7]
// (scale_min_k4's formulas, 16 at once). Reads p[0..15].
HWY_INLINE __m128i scale_min_k4_bytes(const uint8_t* p) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  // sc[0..3] = p[0..3] & 63, low nibbles of sc[4..7] = p[8..11] & 15, mn[0..3] = p[4..7] & 63
  const __m128i low = _mm_and_si128(
      _mm_shuffle_epi8(v, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, -1, -1, -1, -1)),
      _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0));
  // low nibbles of mn[4..7] = p[8..11] >> 4
  const __m128i v4 = _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(0x0f));
  const __m128i mid = _mm_shuffle_epi8(
      v4, _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 8, 9, 10, 11));
  // bits 4..5 of sc[4..7] / mn[4..7] = bits 6..7 of p[0..3] / p[4..7]
  const __m128i v2 = _mm_and_si128(_mm_srli_epi16(v, 2), _mm_set1_epi8(0x30));
  const __m128i top =
      _mm_shuffle_epi8(v2, _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7));
  return _mm_or_si128(low, _mm_or_si128(mid, top));
}

HWY_INLINE KScales scales_k4(const uint8_t* b) {
  KScales k;
  const __m128i sm = scale_min_k4_bytes(b + 4);
  k.sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
  k.mn16 = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(
      sm, _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15)));
  f16_pair(b, k.d, k.dmin);
  return k;
}

// The sum of the 8 int32 lanes of v as f32 lanes times (scale) into acc.
HWY_INLINE __m256 fma_lanes(__m256i v, float scale, __m256 acc) {
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), _mm256_set1_ps(scale), acc);
}

#endif  // KVP_QUANT_X86

// Q2_K [84 B]: scales[16] | qs[64] | d | dmin. Sub-block s = 4h + k takes bits 2k..2k+1 of
// qs[32h .. 32h + 31]; group g has sc = scales[g] & 15, mn = scales[g] >> 4.
struct FmtQ2K {
  static constexpr size_t kBytes = 84;
  static constexpr bool kSigned = false;
  static constexpr MinKind kMin = MinKind::kSeparate;
  static HWY_INLINE void header(const uint8_t* b, IntHeader& h) {
    h.d = f16_at(b + 80);
    h.dmin = f16_at(b + 82);
    for (int g = 0; g < 16; ++g) {
      h.sc[g] = b[g] & 0x0f;
      h.mn[g] = b[g] >> 4;
    }
  }
  static HWY_INLINE void unpack(const uint8_t* b, int s, uint8_t* q) {
    const uint8_t* qs = b + 16 + 32 * (s / 4);
    for (int l = 0; l < 32; ++l) q[l] = (qs[l] >> (2 * (s % 4))) & 3;
  }
#if KVP_QUANT_X86
  static HWY_INLINE KScales scales(const uint8_t* b) {
    KScales k;
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
    k.sc = _mm256_castsi128_si256(_mm_and_si128(v, _mm_set1_epi8(0x0f)));
    k.mn16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(0x0f)));
    f16_pair(b + 80, k.d, k.dmin);
    return k;
  }
  template <int s>
  static HWY_INLINE __m256i scale(const KScales& k) {
    return scale_per16<s>(k);
  }
  template <int s>
  static HWY_INLINE __m256i load(const uint8_t* b) {
    return move_bits<2 * (s % 4), 0, 2>(load256(b + 16 + 32 * (s / 4)));
  }
#endif
};

// Q3_K [110 B]: hmask[32] | qs[64] | scales[12] | d. Sub-block s = 4h + k: low bits 2k..2k+1
// of qs[32h + l], plus 4 where bit s of hmask[l] is set; w = d * scale[g] * (q - 4) with the
// signed 6-bit scale of group g (low 4 bits: nibble g / 8 of scales[g % 8]; high 2 bits: bits
// 2 (g / 4) of scales[8 + g % 4]; minus 32). The offset is mn = 4 * scale through d.
struct FmtQ3K {
  static constexpr size_t kBytes = 110;
  static constexpr bool kSigned = false;
  static constexpr MinKind kMin = MinKind::kOffset;
  static HWY_INLINE void header(const uint8_t* b, IntHeader& h) {
    const uint8_t* packed = b + 96;  // [12]
    h.d = h.dmin = f16_at(b + 108);
    for (int g = 0; g < 16; ++g) {
      const int lo = (packed[g % 8] >> (4 * (g / 8))) & 0x0f;
      const int hi = (packed[8 + g % 4] >> (2 * (g / 4))) & 0x03;
      h.sc[g] = (lo | (hi << 4)) - 32;
      h.mn[g] = 4 * h.sc[g];
    }
  }
  static HWY_INLINE void unpack(const uint8_t* b, int s, uint8_t* q) {
    const uint8_t* qs = b + 32 + 32 * (s / 4);
    for (int l = 0; l < 32; ++l) {
      q[l] = static_cast<uint8_t>(((qs[l] >> (2 * (s % 4))) & 3) | (((b[l] >> s) & 1) << 2));
    }
  }
#if KVP_QUANT_X86
  static HWY_INLINE KScales scales(const uint8_t* b) {
    KScales k;
    // bytes 0..11 = scales[12], 12..13 = d: the 16 bytes ending at the block's end, shifted
    const __m128i v = _mm_srli_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 94)), 2);
    const __m128i m4 = _mm_set1_epi8(0x0f);
    // low 4 bits: groups 0..7 from the low nibbles of bytes 0..7, groups 8..15 the high ones
    const __m128i lo =
        _mm_unpacklo_epi64(_mm_and_si128(v, m4), _mm_and_si128(_mm_srli_epi16(v, 4), m4));
    // high 2 bits: dword 2 (bytes 8..11) shifted right by 0, 2, 4, 6 for groups 0-3, ..., 12-15
    const __m128i s01 = _mm_unpackhi_epi32(v, _mm_srli_epi16(v, 2));
    const __m128i s23 = _mm_unpackhi_epi32(_mm_srli_epi16(v, 4), _mm_srli_epi16(v, 6));
    const __m128i hi =
        _mm_and_si128(_mm_slli_epi16(_mm_unpacklo_epi64(s01, s23), 4), _mm_set1_epi8(0x30));
    const __m128i sc = _mm_sub_epi8(_mm_or_si128(lo, hi), _mm_set1_epi8(32));
    k.sc = _mm256_castsi128_si256(sc);
    k.mn16 = _mm256_slli_epi16(_mm256_cvtepi8_epi16(sc), 2);
    k.d = k.dmin = f16_at(b + 108);
    return k;
  }
  template <int s>
  static HWY_INLINE __m256i scale(const KScales& k) {
    return scale_per16<s>(k);
  }
  template <int s>
  static HWY_INLINE __m256i load(const uint8_t* b) {
    return _mm256_or_si256(move_bits<2 * (s % 4), 0, 2>(load256(b + 32 + 32 * (s / 4))),
                           move_bits<s, 2, 1>(load256(b)));
  }
#endif
};

// Q4_K [144 B]: d | dmin | scales[12] | qs[128]. Sub-block s takes the low (s even) or high
// nibbles of qs[32 (s/2) ..]; w = d * sc[s] * q - dmin * mn[s].
struct FmtQ4K {
  static constexpr size_t kBytes = 144;
  static constexpr bool kSigned = false;
  static constexpr MinKind kMin = MinKind::kSeparate;
  static HWY_INLINE void header(const uint8_t* b, IntHeader& h) { header_k4(b, h); }
  static HWY_INLINE void unpack(const uint8_t* b, int s, uint8_t* q) {
    const uint8_t* qs = b + 16 + 32 * (s / 2);
    for (int l = 0; l < 32; ++l) q[l] = (qs[l] >> (4 * (s % 2))) & 0x0f;
  }
#if KVP_QUANT_X86
  static HWY_INLINE KScales scales(const uint8_t* b) { return scales_k4(b); }
  template <int s>
  static HWY_INLINE __m256i scale(const KScales& k) {
    return scale_per32<s>(k);
  }
  template <int s>
  static HWY_INLINE __m256i load(const uint8_t* b) {
    return move_bits<4 * (s % 2), 0, 4>(load256(b + 16 + 32 * (s / 2)));
  }
#endif
};

// Q5_K [176 B]: d | dmin | scales[12] | qh[32] | qs[128]; as Q4_K plus bit s of qh[l] as bit 4.
struct FmtQ5K {
  static constexpr size_t kBytes = 176;
  static constexpr bool kSigned = false;
  static constexpr MinKind kMin = MinKind::kSeparate;
  static HWY_INLINE void header(const uint8_t* b, IntHeader& h) { header_k4(b, h); }
  static HWY_INLINE void unpack(const uint8_t* b, int s, uint8_t* q) {
    const uint8_t* qs = b + 48 + 32 * (s / 2);
    for (int l = 0; l < 32; ++l) {
      q[l] =
          static_cast<uint8_t>(((qs[l] >> (4 * (s % 2))) & 0x0f) | (((b[16 + l] >> s) & 1) << 4));
    }
  }
#if KVP_QUANT_X86
  static HWY_INLINE KScales scales(const uint8_t* b) { return scales_k4(b); }
  template <int s>
  static HWY_INLINE __m256i scale(const KScales& k) {
    return scale_per32<s>(k);
  }
  template <int s>
  static HWY_INLINE __m256i load(const uint8_t* b) {
    return _mm256_or_si256(move_bits<4 * (s % 2), 0, 4>(load256(b + 48 + 32 * (s / 2))),
                           move_bits<s, 4, 1>(load256(b + 16)));
  }
#endif
};

// Q6_K [210 B]: ql[128] | qh[64] | scales[16] (int8) | d. Sub-block s = 4h + t: low 4 bits from
// nibble t/2 of ql[64h + 32 (t%2) + l], high 2 bits from bits 2t of qh[32h + l];
// w = d * scales[g] * (q - 32): the offset is mn = 32 * scale through d.
struct FmtQ6K {
  static constexpr size_t kBytes = 210;
  static constexpr bool kSigned = false;
  static constexpr MinKind kMin = MinKind::kOffset;
  static HWY_INLINE void header(const uint8_t* b, IntHeader& h) {
    h.d = h.dmin = f16_at(b + 208);
    for (int g = 0; g < 16; ++g) {
      h.sc[g] = static_cast<int8_t>(b[192 + g]);
      h.mn[g] = 32 * h.sc[g];
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
  static HWY_INLINE KScales scales(const uint8_t* b) {
    KScales k;
    const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192));
    k.sc = _mm256_castsi128_si256(sc);
    k.mn16 = _mm256_slli_epi16(_mm256_cvtepi8_epi16(sc), 5);
    k.d = k.dmin = f16_at(b + 208);
    return k;
  }
  template <int s>
  static HWY_INLINE __m256i scale(const KScales& k) {
    return scale_per16<s>(k);
  }
  template <int s>
  static HWY_INLINE __m256i load(const uint8_t* b) {
    constexpr int h = s / 4, t = s % 4;
    return _mm256_or_si256(move_bits<4 * (t / 2), 0, 4>(load256(b + 64 * h + 32 * (t % 2))),
                           move_bits<2 * t, 4, 2>(load256(b + 128 + 32 * h)));
  }
#endif
};

// IQ4_XS [136 B]: d | scales_h (u16) | scales_l[4] | qs[128]. Sub-block s: nibbles of
// qs[16s ..] index the IQ4 levels; w = d * (6-bit scale - 32) * level, no mins.
struct FmtIq4Xs {
  static constexpr size_t kBytes = 136;
  static constexpr bool kSigned = true;
  static constexpr MinKind kMin = MinKind::kNone;
  static HWY_INLINE void header(const uint8_t* b, IntHeader& h) {
    h.d = f16_at(b);
    h.dmin = 0;
    uint16_t scales_h;
    std::memcpy(&scales_h, b + 2, 2);
    for (int g = 0; g < 16; ++g) {
      const int s = g / 2;
      const int lo = (b[4 + s / 2] >> (4 * (s % 2))) & 0x0f;
      const int hi = (scales_h >> (2 * s)) & 0x03;
      h.sc[g] = (lo | (hi << 4)) - 32;
      h.mn[g] = 0;
    }
  }
  static HWY_INLINE void unpack(const uint8_t* b, int s, uint8_t* q) {
    unpack_nibbles(b + 8 + 16 * s, q);
    for (int j = 0; j < 32; ++j) q[j] = static_cast<uint8_t>(kIq4Levels[q[j]]);
  }
#if KVP_QUANT_X86
  static HWY_INLINE KScales scales(const uint8_t* b) {
    KScales k;
    uint16_t scales_h;
    uint32_t scales_l;
    std::memcpy(&scales_h, b + 2, 2);
    std::memcpy(&scales_l, b + 4, 4);
    // int32 lane s: nibble s of scales_l | bits 2s..2s+1 of scales_h << 4, minus 32
    const __m256i lo =
        _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int32_t>(scales_l)),
                                           _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                         _mm256_set1_epi32(0x0f));
    const __m256i hi =
        _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(scales_h),
                                           _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
                         _mm256_set1_epi32(0x03));
    const __m256i sc32 =
        _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), _mm256_set1_epi32(32));
    // packs gives [s0..s3, s0..s3 | s4..s7, s4..s7] as int16; quads 0 and 2 are s0..s7
    k.sc = _mm256_permute4x64_epi64(_mm256_packs_epi32(sc32, sc32), 0x88);
    k.mn16 = _mm256_setzero_si256();
    k.d = f16_at(b);
    k.dmin = 0;
    return k;
  }
  template <int s>
  static HWY_INLINE __m256i scale(const KScales& k) {
    return scale_per32<s>(k);
  }
  template <int s>
  static HWY_INLINE __m256i load(const uint8_t* b) {
    const __m256i table =
        _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(kIq4Levels)));
    return _mm256_shuffle_epi8(table, nibbles_32(b + 8 + 16 * s));
  }
#endif
};

}  // namespace k_path
}  // namespace kvp::quant::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // KVP_QUANT_FORMATS_K_INL_H_

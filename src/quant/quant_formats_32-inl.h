// The formats with blocks of 32 (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL) as the integer kernels
// see them, w = d * q + m (quant_kernel-inl.h says how): unpack for the portable path,
// load_pair on x86. Layouts: dequant.h. Included once per Highway target by the 32-block
// kernels' foreach_target passes: quant_kernels_32.cc (decode tiles over the GGUF layout) and
// quant_kernels_prefill.cc (prefill tiles over weight rows repacked 8 at a time).
#if defined(KVP_QUANT_FORMATS_32_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVP_QUANT_FORMATS_32_INL_H_
#undef KVP_QUANT_FORMATS_32_INL_H_
#else
#define KVP_QUANT_FORMATS_32_INL_H_
#endif

#include <hwy/highway.h>

#include <cstdint>

#include "quant/quant_kernel-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvp::quant::HWY_NAMESPACE {

// q[j] |= 16 where bit j of the u32 at qh is set.
HWY_INLINE void add_fifth_bits(const uint8_t* qh, uint8_t* q) {
  for (int j = 0; j < 32; ++j) q[j] |= ((qh[j / 8] >> (j % 8)) & 1) << 4;
}

// Q4_0 [18 B]: d | qs[16]; w = d * (q - 8).
struct FmtQ4_0 {
  static constexpr size_t kBytes = 18;
  static constexpr int kMaxQ = 15;
  static constexpr bool kSigned = false;
  static constexpr bool kHasMin = true;
  static constexpr size_t kMinAt = 0;  // m = -8 d
  static constexpr float kMinScale = -8.0f;
  static HWY_INLINE void unpack(const uint8_t* b, uint8_t* q) { unpack_nibbles(b + 2, q); }
#if KVP_QUANT_X86
  static HWY_INLINE void load_pair(const uint8_t* b0, const uint8_t* b1, __m256i& lo, __m256i& hi) {
    nibbles_pair(b0 + 2, b1 + 2, lo, hi);
  }
#endif
};

// Q4_1 [20 B]: d | m | qs[16]; w = d * q + m.
struct FmtQ4_1 {
  static constexpr size_t kBytes = 20;
  static constexpr int kMaxQ = 15;
  static constexpr bool kSigned = false;
  static constexpr bool kHasMin = true;
  static constexpr size_t kMinAt = 2;
  static constexpr float kMinScale = 1.0f;
  static HWY_INLINE void unpack(const uint8_t* b, uint8_t* q) { unpack_nibbles(b + 4, q); }
#if KVP_QUANT_X86
  static HWY_INLINE void load_pair(const uint8_t* b0, const uint8_t* b1, __m256i& lo, __m256i& hi) {
    nibbles_pair(b0 + 4, b1 + 4, lo, hi);
  }
#endif
};

// Q5_0 [22 B]: d | qh (u32) | qs[16]; w = d * (q - 16), bit j of qh is bit 4 of q[j].
struct FmtQ5_0 {
  static constexpr size_t kBytes = 22;
  static constexpr int kMaxQ = 31;
  static constexpr bool kSigned = false;
  static constexpr bool kHasMin = true;
  static constexpr size_t kMinAt = 0;  // m = -16 d
  static constexpr float kMinScale = -16.0f;
  static HWY_INLINE void unpack(const uint8_t* b, uint8_t* q) {
    unpack_nibbles(b + 6, q);
    add_fifth_bits(b + 2, q);
  }
#if KVP_QUANT_X86
  static HWY_INLINE void load_pair(const uint8_t* b0, const uint8_t* b1, __m256i& lo, __m256i& hi) {
    five_bit_pair(b0 + 6, b1 + 6, b0 + 2, b1 + 2, lo, hi);
  }
#endif
};

// Q5_1 [24 B]: d | m | qh (u32) | qs[16]; w = d * q + m.
struct FmtQ5_1 {
  static constexpr size_t kBytes = 24;
  static constexpr int kMaxQ = 31;
  static constexpr bool kSigned = false;
  static constexpr bool kHasMin = true;
  static constexpr size_t kMinAt = 2;
  static constexpr float kMinScale = 1.0f;
  static HWY_INLINE void unpack(const uint8_t* b, uint8_t* q) {
    unpack_nibbles(b + 8, q);
    add_fifth_bits(b + 4, q);
  }
#if KVP_QUANT_X86
  static HWY_INLINE void load_pair(const uint8_t* b0, const uint8_t* b1, __m256i& lo, __m256i& hi) {
    five_bit_pair(b0 + 8, b1 + 8, b0 + 4, b1 + 4, lo, hi);
  }
#endif
};

// Q8_0 [34 B]: d | qs[32] (int8); w = d * q.
struct FmtQ8_0 {
  static constexpr size_t kBytes = 34;
  static constexpr int kMaxQ = 128;  // |q|
  static constexpr bool kSigned = true;
  static constexpr bool kHasMin = false;
  static constexpr size_t kMinAt = 0;
  static constexpr float kMinScale = 0.0f;
  static HWY_INLINE void unpack(const uint8_t* b, uint8_t* q) { std::memcpy(q, b + 2, 32); }
#if KVP_QUANT_X86
  static HWY_INLINE void load_pair(const uint8_t* b0, const uint8_t* b1, __m256i& lo, __m256i& hi) {
    lo = load_2x128(b0 + 2, b1 + 2);
    hi = load_2x128(b0 + 18, b1 + 18);
  }
#endif
};

// IQ4_NL [18 B]: d | qs[16] (4-bit indices); w = d * level[index].
struct FmtIq4Nl {
  static constexpr size_t kBytes = 18;
  static constexpr int kMaxQ = 127;  // |q|
  static constexpr bool kSigned = true;
  static constexpr bool kHasMin = false;
  static constexpr size_t kMinAt = 0;
  static constexpr float kMinScale = 0.0f;
  static HWY_INLINE void unpack(const uint8_t* b, uint8_t* q) {
    unpack_nibbles(b + 2, q);
    for (int j = 0; j < 32; ++j) q[j] = static_cast<uint8_t>(kIq4Levels[q[j]]);
  }
#if KVP_QUANT_X86
  static HWY_INLINE void load_pair(const uint8_t* b0, const uint8_t* b1, __m256i& lo, __m256i& hi) {
    const __m256i table =
        _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(kIq4Levels)));
    nibbles_pair(b0 + 2, b1 + 2, lo, hi);
    lo = _mm256_shuffle_epi8(table, lo);
    hi = _mm256_shuffle_epi8(table, hi);
  }
#endif
};

}  // namespace kvp::quant::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // KVP_QUANT_FORMATS_32_INL_H_

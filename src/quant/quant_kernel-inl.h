// The integer block kernel of the formats with blocks of 32 (quant_kernels_32.cc), and the x86
// helpers it shares with the K formats' kernel (quant_kernels_k.cc, which has its own tile over
// activations quantised per 256); included once per Highway target by their foreach_target
// passes.
//
// Every 32-block format is seen the same way: weight j of a block is
//     w = d * q[j] + m
// with q[j] an 8-bit integer (unsigned, or signed for kSigned formats), d the f16 the block
// starts with, and m (kHasMin formats) kMinScale times the f16 at byte kMinAt (Q4_0's -8 d,
// Q4_1's stored m). A format provides
//   load_pair(block0, block1, lo, hi)  the q of two blocks in two 256-bit registers, in the pair
//                                      layout of the activations (quant_act.h): lo holds
//                                      q0[0..16) | q1[0..16), hi q0[16..32) | q1[16..32)
//                                      (x86 targets)
//   unpack(block, q)                   the 32 q of one block as bytes (the portable path)
// and the kernel computes, per activation block b of 32 (quant_act.h: x ~ dx * xq),
//     sum_j w[j] x[j] ~ d * dx * sum_j q[j] xq[j] + m * sums[b]     (sums[b] = dx * sum_j xq[j])
// with exact int32 dot products (AVX-512 VNNI dpbusd, or AVX2 maddubs + madd) and f32 scaling,
// two blocks per register. Each pair of weight blocks is decoded once per tile and dotted with R
// activation rows, C weight rows at a time; the int8 work still grows with every activation row
// (docs/perf/model.md: batch 8 is compute-bound here). A single activation row (decode) has its
// own tile, row_tile, with less work per pair of blocks.
#if defined(KVP_QUANT_KERNEL_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVP_QUANT_KERNEL_INL_H_
#undef KVP_QUANT_KERNEL_INL_H_
#else
#define KVP_QUANT_KERNEL_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "quant/quant_act.h"
#include "quant/quant_kernels.h"

#undef KVP_QUANT_X86
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
#define KVP_QUANT_X86 1
#include <immintrin.h>
#else
#define KVP_QUANT_X86 0
#endif

HWY_BEFORE_NAMESPACE();
namespace kvp::quant::HWY_NAMESPACE {

// The f16 at p (any alignment) as f32.
HWY_INLINE float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
#if KVP_QUANT_X86
  return _cvtsh_ss(h);
#else
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    const float f = static_cast<float>(mant) * (1.0f / 16777216.0f);  // subnormal: mant * 2^-24
    std::memcpy(&bits, &f, 4);
    bits |= sign;
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
#endif
}

// IQ4_NL / IQ4_XS levels (dequant.cc's table).
alignas(16) constexpr int8_t kIq4Levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                               1,    13,   25,  38,  53,  69,  89,  113};

// Nibble pairs qs[16] as q[32]: low nibbles, then high nibbles.
HWY_INLINE void unpack_nibbles(const uint8_t* qs, uint8_t* q) {
  for (int j = 0; j < 16; ++j) {
    q[j] = qs[j] & 0x0f;
    q[j + 16] = qs[j] >> 4;
  }
}

#if KVP_QUANT_X86

HWY_INLINE __m256i load256(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// 16 bytes of nibble pairs -> 32 bytes: the low nibbles, then the high nibbles.
HWY_INLINE __m256i nibbles_32(const uint8_t* p) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i m = _mm_set1_epi8(0x0f);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
}

// Bytes of v shifted right by n within each byte, masked to `mask`.
HWY_INLINE __m256i shift_mask(__m256i v, int n, int mask) {
  return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(n)), _mm256_set1_epi8(mask));
}

// 0x?? where bit `bit` of each byte of v is set, else 0.
HWY_INLINE __m256i bit_select(__m256i v, int bit, int value) {
  const __m256i b = _mm256_set1_epi8(static_cast<char>(1 << bit));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, b), b), _mm256_set1_epi8(value));
}

// int32 lanes: lane i = sum of u[4i + l] * s[4i + l], l < 4; u unsigned (<= 128), s signed.
// maddubs cannot saturate: |u| <= 128 and |s| <= 127 give pairs of at most 32512.
HWY_INLINE __m256i dot_u8_i8(__m256i u, __m256i s) {
#if HWY_TARGET == HWY_AVX3_DL
  // Highway 1.0.3's AVX3_DL target also enables AVX-VNNI, so GCC would emit the VEX form of
  // vpdpbusd, which AVX-512 VNNI CPUs without AVX-VNNI (Zen 4, Ice Lake) fault on. The EVEX
  // form is asked for explicitly.
  __m256i acc = _mm256_setzero_si256();
  asm("%{evex%} vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
  return acc;
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

// Bytes ahead of the block being read that a kernel asks the cache for: about what one thread's
// share of the memory bandwidth (10-15 GB/s here) delivers in a miss latency (~150 ns), so the
// lines arrive as the kernel reaches them. The hardware prefetcher alone fell behind: with it,
// quant_matmul_bench at 1 row, 1 thread, went from 2.6 to 2.2 ms (Q4_K 14336 x 4096) and from
// 3.7 to 2.9 ms (Q6_K).
inline constexpr size_t kPrefetchBytes = 2048;

// Prefetches the kBytes-byte block kPrefetchBytes after p: a line each 64 bytes, so each line
// is asked for once or twice (blocks need not start on a line). Prefetches never fault, so
// reading past the matrix's end is harmless.
template <size_t kBytes>
HWY_INLINE void prefetch_ahead(const uint8_t* p) {
  for (size_t l = 0; l < kBytes; l += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetchBytes + l, _MM_HINT_T0);
  }
}

HWY_INLINE float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Two 16-byte loads as one register: [*lo | *hi].
HWY_INLINE __m256i load_2x128(const uint8_t* lo, const uint8_t* hi) {
  return _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(lo))),
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(hi)), 1);
}

// The nibble pairs of two blocks (qs0, qs1: 16 bytes each) as the pair layout of quant_act.h:
// lo = q0[0..16) | q1[0..16) (the low nibbles), hi = q0[16..32) | q1[16..32).
HWY_INLINE void nibbles_pair(const uint8_t* qs0, const uint8_t* qs1, __m256i& lo, __m256i& hi) {
  const __m256i v = load_2x128(qs0, qs1);
  const __m256i m = _mm256_set1_epi8(0x0f);
  lo = _mm256_and_si256(v, m);
  hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m);
}

// 0x10 in byte j of lo / hi where bit j (lo: j < 16 of qh0, then of qh1) or bit 16 + j (hi) of
// the little-endian u32s at qh0 and qh1 is set: the fifth bits of Q5_0 / Q5_1 in the pair layout.
HWY_INLINE void fifth_bits_pair(const uint8_t* qh0, const uint8_t* qh1, __m256i& lo, __m256i& hi) {
  uint32_t x0, x1;
  std::memcpy(&x0, qh0, 4);
  std::memcpy(&x1, qh1, 4);
  const __m256i v = _mm256_set1_epi64x(static_cast<int64_t>(uint64_t{x0} | uint64_t{x1} << 32));
  const __m256i all_but_bit = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);
  const __m256i ones = _mm256_set1_epi64x(-1);
  const __m256i five = _mm256_set1_epi8(0x10);
  const __m256i spread_lo = _mm256_shuffle_epi8(
      v, _mm256_set_epi64x(0x0505050505050505, 0x0404040404040404, 0x0101010101010101, 0));
  const __m256i spread_hi =
      _mm256_shuffle_epi8(v, _mm256_set_epi64x(0x0707070707070707, 0x0606060606060606,
                                               0x0303030303030303, 0x0202020202020202));
  lo = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_or_si256(spread_lo, all_but_bit), ones), five);
  hi = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_or_si256(spread_hi, all_but_bit), ones), five);
}

// The 5-bit values of two Q5_0 / Q5_1 blocks in the pair layout: nibbles_pair of qs0, qs1 with
// fifth_bits_pair of qh0, qh1 added in.
HWY_INLINE void five_bit_pair(const uint8_t* qs0, const uint8_t* qs1, const uint8_t* qh0,
                              const uint8_t* qh1, __m256i& lo, __m256i& hi) {
  __m256i lo5, hi5;
  nibbles_pair(qs0, qs1, lo, hi);
  fifth_bits_pair(qh0, qh1, lo5, hi5);
  lo = _mm256_or_si256(lo, lo5);
  hi = _mm256_or_si256(hi, hi5);
}

// The f16s at p0 and p1 as [*p0 x4 | *p1 x4] in f32.
HWY_INLINE __m256 f16_pair(const uint8_t* p0, const uint8_t* p1) {
  uint16_t h0, h1;
  std::memcpy(&h0, p0, 2);
  std::memcpy(&h1, p1, 2);
  const __m128i v = _mm_cvtsi32_si128(static_cast<int32_t>(uint32_t{h0} | uint32_t{h1} << 16));
  return _mm256_cvtph_ps(
      _mm_shuffle_epi8(v, _mm_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3)));
}

// A block of zeros of every format (d = 0, m = 0): the partner of an odd row's last block.
alignas(64) inline constexpr uint8_t kZeroBlock[64] = {};

// lo . xlo + hi . xhi in int32 lanes (dot_u8_i8's lanes), for u <= 64: maddubs pairs of at most
// 2 * 64 * 127 leave room to add the two halves in int16 and widen once.
HWY_INLINE __m256i dot2_small_u8_i8(__m256i lo, __m256i xlo, __m256i hi, __m256i xhi) {
#if HWY_TARGET == HWY_AVX3_DL
  return _mm256_add_epi32(dot_u8_i8(lo, xlo), dot_u8_i8(hi, xhi));
#else
  return _mm256_madd_epi16(
      _mm256_add_epi16(_mm256_maddubs_epi16(lo, xlo), _mm256_maddubs_epi16(hi, xhi)),
      _mm256_set1_epi16(1));
#endif
}

// The state of one tile of C weight rows x R activation rows (block_tile).
template <int C, int R>
struct BlockTile {
  int64_t num_blocks;
  const uint8_t* wr[C];  // weight row c, [num_blocks][Fmt::kBytes]
  const int8_t* xq[R];   // activation row r, [num_pairs][64]
  const float* xd[R];    // [num_pairs][8]
  const float* xs[R];    // [sum_stride]
  __m256 acc[C][R];
  __m128i mh[C];  // f16 giving m of the 8 blocks of the current group, lane = block % 8
};

// Blocks 2p and 2p + 1 (pair kPair of its group of 4) of every (weight row, activation row) pair
// of the tile: int32 dot products of both blocks in one register (lanes 0-3 block 2p, 4-7 block
// 2p + 1), one conversion and one multiply-add by d_w * d_x, which differ per half. The offsets'
// f16s go to mh, met in block_group.
template <class Fmt, int C, int R, int kPair>
HWY_INLINE void pair_step(BlockTile<C, R>& t, int64_t p) {
  __m256i lo[C], hi[C];
  __m256i lo_abs[C], hi_abs[C];  // kSigned: maddubs / dpbusd take one unsigned operand, so |q|
                                 // meets x with q's sign
  __m256 dw[C];
  for (int c = 0; c < C; ++c) {
    const uint8_t* blk0 = t.wr[c] + 2 * p * Fmt::kBytes;
    const uint8_t* blk1 = 2 * p + 1 < t.num_blocks ? blk0 + Fmt::kBytes : kZeroBlock;
    prefetch_ahead<2 * Fmt::kBytes>(blk0);
    Fmt::load_pair(blk0, blk1, lo[c], hi[c]);
    if constexpr (Fmt::kSigned) {
      lo_abs[c] = _mm256_sign_epi8(lo[c], lo[c]);
      hi_abs[c] = _mm256_sign_epi8(hi[c], hi[c]);
    }
    dw[c] = f16_pair(blk0, blk1);
    if constexpr (Fmt::kHasMin) {
      uint16_t m0, m1;
      std::memcpy(&m0, blk0 + Fmt::kMinAt, 2);
      std::memcpy(&m1, blk1 + Fmt::kMinAt, 2);
      t.mh[c] = _mm_insert_epi16(t.mh[c], m0, 2 * kPair);
      t.mh[c] = _mm_insert_epi16(t.mh[c], m1, 2 * kPair + 1);
    }
  }
  for (int r = 0; r < R; ++r) {
    const uint8_t* xp = reinterpret_cast<const uint8_t*>(t.xq[r] + 64 * p);
    const __m256i xlo = load256(xp);
    const __m256i xhi = load256(xp + 32);
    const __m256 dx = _mm256_loadu_ps(t.xd[r] + 8 * p);
    for (int c = 0; c < C; ++c) {
      __m256i dot;
      if constexpr (Fmt::kSigned) {
        dot = _mm256_add_epi32(dot_u8_i8(lo_abs[c], _mm256_sign_epi8(xlo, lo[c])),
                               dot_u8_i8(hi_abs[c], _mm256_sign_epi8(xhi, hi[c])));
      } else {
        static_assert(Fmt::kMaxQ <= 64, "dot2_small_u8_i8 adds the halves in int16");
        dot = dot2_small_u8_i8(lo[c], xlo, hi[c], xhi);
      }
      t.acc[c][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(dw[c], dx), t.acc[c][r]);
    }
  }
}

// Pairs [p0, p0 + sizeof...(kPairs)) (blocks 8 g .. 8 g + 7 for a whole group), then their
// offsets: sum_b m_b * sums_b as one multiply-add per (weight row, activation row) pair.
template <class Fmt, int C, int R, int... kPairs>
HWY_INLINE void block_group(BlockTile<C, R>& t, int64_t p0, std::integer_sequence<int, kPairs...>) {
  for (int c = 0; c < C; ++c) t.mh[c] = _mm_setzero_si128();
  (pair_step<Fmt, C, R, kPairs>(t, p0 + kPairs), ...);
  if constexpr (Fmt::kHasMin) {
    for (int c = 0; c < C; ++c) {
      const __m256 m = _mm256_mul_ps(_mm256_cvtph_ps(t.mh[c]), _mm256_set1_ps(Fmt::kMinScale));
      for (int r = 0; r < R; ++r) {
        t.acc[c][r] = _mm256_fmadd_ps(m, _mm256_loadu_ps(t.xs[r] + 2 * p0), t.acc[c][r]);
      }
    }
  }
}

// C weight rows (from o0) x R activation rows (from t0): y[t0 + r][o0 + c].
// Per pair of blocks and (weight row, activation row) pair: the int32 dot products, one
// conversion and one multiply-add; each (weight row, activation row) pair has its own
// accumulator, so the only dependency chain is one FMA per two blocks. The offsets m (formats
// with kHasMin) are kept out of that loop: their f16s are gathered in a register for 8 blocks and
// met with the activations' block sums (ActBlocks::sums) in one multiply-add per 8 blocks.
template <class Fmt, int C, int R>
HWY_NOINLINE void block_tile(const QuantMatrix& w, int64_t o0, const ActBlocks& a, int64_t t0,
                             float* y, int64_t ldy) {
  static_assert(kActSumGroup == 8, "block_group gathers the offsets of 4 pairs of blocks");
  BlockTile<C, R> t;
  t.num_blocks = w.cols / 32;
  for (int c = 0; c < C; ++c) {
    t.wr[c] = reinterpret_cast<const uint8_t*>(w.row(o0 + c));
    for (int r = 0; r < R; ++r) t.acc[c][r] = _mm256_setzero_ps();
  }
  for (int r = 0; r < R; ++r) {
    t.xq[r] = a.q_row(t0 + r);
    t.xd[r] = a.d_row(t0 + r);
    t.xs[r] = a.sums_row(t0 + r);
  }
  const int64_t num_pairs = (t.num_blocks + 1) / 2;
  int64_t p = 0;
  for (; p + 4 <= num_pairs; p += 4) {
    block_group<Fmt>(t, p, std::make_integer_sequence<int, 4>());
  }
  switch (num_pairs - p) {
    case 3:
      block_group<Fmt>(t, p, std::make_integer_sequence<int, 3>());
      break;
    case 2:
      block_group<Fmt>(t, p, std::make_integer_sequence<int, 2>());
      break;
    case 1:
      block_group<Fmt>(t, p, std::make_integer_sequence<int, 1>());
      break;
    default:
      break;
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) y[(t0 + r) * ldy + o0 + c] = hsum(t.acc[c][r]);
  }
}

// The f16 d of blocks b0 and b1 and the f16 their offset m is kMinScale times (the stored m of
// Q4_1 / Q5_1 at byte 2; d itself for Q4_0 / Q5_0) as f32 [d0, m0, d1, m1]: one conversion for
// both, in place of f16_pair and two word inserts.
template <class Fmt>
HWY_INLINE __m128 dm_pair(const uint8_t* b0, const uint8_t* b1) {
  static_assert(Fmt::kMinAt == 0 || Fmt::kMinAt == 2, "m's f16 sits beside d or is d");
  uint32_t w0, w1;
  if constexpr (Fmt::kMinAt == 2) {
    std::memcpy(&w0, b0, 4);
    std::memcpy(&w1, b1, 4);
  } else {
    uint16_t h0, h1;
    std::memcpy(&h0, b0, 2);
    std::memcpy(&h1, b1, 2);
    w0 = uint32_t{h0} * 0x10001u;
    w1 = uint32_t{h1} * 0x10001u;
  }
  return _mm_cvtph_ps(_mm_cvtsi64_si128(static_cast<int64_t>(uint64_t{w0} | uint64_t{w1} << 32)));
}

// Blocks 2p and 2p + 1 of C weight rows (wr[c]: [num_blocks][Fmt::kBytes]) against the one
// activation row (xq, xd, xs: quant_act.h's pair layout and sums). kOddTail: block 2p is the
// row's last, its partner the zero block. Each weight row is decoded, dotted and scaled before
// the next, so only its own registers are live; the offsets go to macc[c] in the [d, m, d, m]
// lanes of dm_pair (sums[b] in the m lanes, 0 in the d lanes).
template <class Fmt, int C, bool kOddTail>
HWY_INLINE void row_pair(const uint8_t* const* wr, int64_t p, const uint8_t* xq, const float* xd,
                         const float* xs, __m256* acc, __m128* macc) {
  const __m256i xlo = load256(xq + 64 * p);
  const __m256i xhi = load256(xq + 64 * p + 32);
  const __m256 dx = _mm256_loadu_ps(xd + 8 * p);
  __m128 sv = _mm_setzero_ps();
  if constexpr (Fmt::kHasMin) {
    // sums is zero past the last block, so the odd tail's partner reads 0.
    const __m128 s = _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(xs + 2 * p)));
    sv = _mm_unpacklo_ps(_mm_setzero_ps(), s);
    if constexpr (Fmt::kMinScale != 1.0f) sv = _mm_mul_ps(sv, _mm_set1_ps(Fmt::kMinScale));
  }
  for (int c = 0; c < C; ++c) {
    const uint8_t* blk0 = wr[c] + 2 * p * Fmt::kBytes;
    const uint8_t* blk1 = kOddTail ? kZeroBlock : blk0 + Fmt::kBytes;
    prefetch_ahead<2 * Fmt::kBytes>(blk0);
    __m256i lo, hi;
    Fmt::load_pair(blk0, blk1, lo, hi);
    __m256i dot;
    if constexpr (Fmt::kSigned) {
      dot = _mm256_add_epi32(dot_u8_i8(_mm256_sign_epi8(lo, lo), _mm256_sign_epi8(xlo, lo)),
                             dot_u8_i8(_mm256_sign_epi8(hi, hi), _mm256_sign_epi8(xhi, hi)));
    } else {
      static_assert(Fmt::kMaxQ <= 64, "dot2_small_u8_i8 adds the halves in int16");
      dot = dot2_small_u8_i8(lo, xlo, hi, xhi);
    }
    __m256 dw;
    if constexpr (Fmt::kHasMin) {
      const __m128 dm = dm_pair<Fmt>(blk0, blk1);
      dw = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(dm),
                                    _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2));
      macc[c] = _mm_fmadd_ps(dm, sv, macc[c]);
    } else {
      dw = f16_pair(blk0, blk1);
    }
    acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(dw, dx), acc[c]);
  }
}

// C weight rows (from o0) x the one activation row t0 (decode): y[t0][o0 + c]. The same sums as
// block_tile<Fmt, C, 1>, with its per-pair work cut down for a lone activation row: no
// bounds test per pair (the odd tail is its own step), one f16 conversion per pair for d and m,
// and each weight row finished before the next is decoded.
template <class Fmt, int C>
HWY_NOINLINE void row_tile(const QuantMatrix& w, int64_t o0, const ActBlocks& a, int64_t t0,
                           float* y) {
  const int64_t num_blocks = w.cols / 32;
  const uint8_t* wr[C];
  __m256 acc[C];
  __m128 macc[C];
  for (int c = 0; c < C; ++c) {
    wr[c] = reinterpret_cast<const uint8_t*>(w.row(o0 + c));
    acc[c] = _mm256_setzero_ps();
    macc[c] = _mm_setzero_ps();
  }
  const auto* xq = reinterpret_cast<const uint8_t*>(a.q_row(t0));
  const float* xd = a.d_row(t0);
  const float* xs = a.sums_row(t0);
  const int64_t num_full_pairs = num_blocks / 2;
  for (int64_t p = 0; p < num_full_pairs; ++p) {
    row_pair<Fmt, C, false>(wr, p, xq, xd, xs, acc, macc);
  }
  if (num_blocks % 2 != 0) row_pair<Fmt, C, true>(wr, num_full_pairs, xq, xd, xs, acc, macc);
  for (int c = 0; c < C; ++c) {
    y[o0 + c] = hsum(_mm256_add_ps(acc[c], _mm256_insertf128_ps(_mm256_setzero_ps(), macc[c], 0)));
  }
}

// Weight rows per tile when R activation rows share it: more rows where fewer activation rows
// leave registers free (AVX-512 targets have 32, AVX2 16). Eight activation rows take one weight
// row: its decoded pair of registers then serves 8 rows. Measured with 1 thread at 8 rows (thread
// CPU time, AVX2 on Zen 3), Q4_1 1536 x 576: 0.163 ms against 0.184 for two tiles of 2 x 4 and
// 0.189 for 2 x 8 (which spills accumulators); Q5_0 2048 x 640: 0.312 against 0.345.
template <int R>
constexpr int tile_weight_rows() {
  if constexpr (R >= 8) return 1;
  if constexpr (R <= 2) return 4;
  return HWY_TARGET == HWY_AVX2 ? 2 : 4;
}

#else  // !KVP_QUANT_X86: portable, one weight row and one activation row at a time

template <class Fmt, int C, int R>
HWY_NOINLINE void block_tile(const QuantMatrix& w, int64_t o0, const ActBlocks& a, int64_t t0,
                             float* y, int64_t ldy) {
  const int64_t num_blocks = w.cols / 32;
  for (int c = 0; c < C; ++c) {
    const auto* wr = reinterpret_cast<const uint8_t*>(w.row(o0 + c));
    for (int r = 0; r < R; ++r) {
      const float* xs = a.sums_row(t0 + r);
      float acc = 0;
      for (int64_t b = 0; b < num_blocks; ++b) {
        const uint8_t* blk = wr + b * Fmt::kBytes;
        uint8_t q[32];
        Fmt::unpack(blk, q);
        int32_t sum = 0;
        for (int j = 0; j < 32; ++j) {
          const int32_t qj = Fmt::kSigned ? int32_t{static_cast<int8_t>(q[j])} : int32_t{q[j]};
          sum += qj * int32_t{a.q_at(t0 + r, b, j)};
        }
        acc += static_cast<float>(sum) * (f16_at(blk) * a.d_at(t0 + r, b));
        if constexpr (Fmt::kHasMin) acc += Fmt::kMinScale * f16_at(blk + Fmt::kMinAt) * xs[b];
      }
      y[(t0 + r) * ldy + o0 + c] = acc;
    }
  }
}

template <int R>
constexpr int tile_weight_rows() {
  return 1;
}

template <class Fmt, int C>
HWY_INLINE void row_tile(const QuantMatrix& w, int64_t o0, const ActBlocks& a, int64_t t0,
                         float* y) {
  block_tile<Fmt, C, 1>(w, o0, a, t0, y, 0);
}

#endif  // KVP_QUANT_X86

// From this many bytes per weight row, a single activation row (decode) is tiled with one weight
// row at a time: a tile of C rows reads C separate streams, and the hardware prefetcher (here
// AMD Zen 3's) keeps one long stream far better fed than several; measured with
// quant_matmul_bench at 1 row: Q8_0 49152 x 576 (612 B rows) 2.2 ms instead of 4.5, Q4_K
// 14336 x 4096 2.5 ms instead of 4.0, one thread. Shorter rows lie close enough that C of them
// read like one stream, and C = 4 shares the tile's fixed work (576-column Q4_1 rows, 360 B:
// 0.071 ms instead of 0.084).
inline constexpr size_t kOneRowTileBytes = 512;
// Weight rows per decode tile (row_tile) below kOneRowTileBytes.
inline constexpr int kRowTileRows = 4;

template <class Fmt, int R>
HWY_INLINE void block_rows_r(const RowRange& rr, const ActBlocks& a, int64_t t0) {
  constexpr int kC = tile_weight_rows<R>();
  int64_t o = rr.row_begin;
  if constexpr (R == 1) {
    float* y = rr.y + t0 * rr.ldy;
    if (rr.w->row_bytes >= kOneRowTileBytes) {
      for (; o < rr.row_end; ++o) row_tile<Fmt, 1>(*rr.w, o, a, t0, y);
      return;
    }
    for (; o + kRowTileRows <= rr.row_end; o += kRowTileRows) {
      row_tile<Fmt, kRowTileRows>(*rr.w, o, a, t0, y);
    }
    for (; o < rr.row_end; ++o) row_tile<Fmt, 1>(*rr.w, o, a, t0, y);
    return;
  }
  for (; o + kC <= rr.row_end; o += kC) block_tile<Fmt, kC, R>(*rr.w, o, a, t0, rr.y, rr.ldy);
  for (; o < rr.row_end; ++o) block_tile<Fmt, 1, R>(*rr.w, o, a, t0, rr.y, rr.ldy);
}

// The rows of rr for every activation row, 8 activation rows per tile, then 4, then the rest: the
// weight rows of the range are read from memory for the first tile and from cache for the others.
template <class Fmt>
void block_rows(const RowRange& rr, const ActBlocks& a) {
  int64_t t = 0;
  for (; t + 8 <= rr.num_rows; t += 8) block_rows_r<Fmt, 8>(rr, a, t);
  for (; t + 4 <= rr.num_rows; t += 4) block_rows_r<Fmt, 4>(rr, a, t);
  switch (rr.num_rows - t) {
    case 3:
      block_rows_r<Fmt, 3>(rr, a, t);
      break;
    case 2:
      block_rows_r<Fmt, 2>(rr, a, t);
      break;
    case 1:
      block_rows_r<Fmt, 1>(rr, a, t);
      break;
    default:
      break;
  }
}

}  // namespace kvp::quant::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // KVP_QUANT_KERNEL_INL_H_

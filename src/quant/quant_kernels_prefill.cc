// The prefill kernels of the block formats: many activation rows against the same weight rows,
// so the weight rows are first repacked, N at a time, into a layout where one register holds 4
// consecutive weights of each of the N rows (llama.cpp's interleaved "x8" layouts do the same),
// and the tiles never decode again. Lane i of every vector is output row i, so nothing is summed
// across lanes and N outputs of an activation row are stored at once. N is 16 (512-bit
// registers, V16) on the AVX-512 targets and 8 (256-bit, V8) on AVX2; an AVX-512 item's rows
// past its last 16 take one panel of 8 if they can.
//
//   K formats (super-blocks of 256, activations per 256: ActBlocksK), per super-block:
//     PanelBlock<N>  q[64 chunks][N rows][4]  the format's integers, unpacked (load<s> of
//                                             quant_formats_k-inl.h, an 8 x 8 transpose of
//                                             32-bit lanes per sub-block and 8 rows)
//                    sc[16 groups][N rows]    each row's scale per 16 weights, as an int16 pair
//                    mn[8 pairs][N rows]      each row's (mn[2p], mn[2p + 1]), met by the bsums
//                    d[N], dmin[N]            each row's factors
//   32-block formats (activations per 32: ActBlocks), per block:
//     Panel32<N>     q[8 chunks][N rows][4], d[N], m[N]  (w = d q + m, quant_kernel-inl.h)
//
// A tile (N weight rows x R activation rows) does, per chunk, one load of the weights and, per
// activation row, a broadcast of its 4 int8 codes and one maddubs (or, on AVX-512 VNNI, one
// dpbusd). maddubs products of one chunk are at most 2 * 127 * qmax in int16: up to run<qmax>()
// chunks are added in int16 before madd_epi16 widens them with the group's scale (Q4_K, Q4_0: 8;
// Q5_K, Q5_0: 4; Q6_K: 2; signed formats: 1). With dpbusd, a K format's int32 sums per scale
// group are scaled in f32 instead (exact products). The integer sums are the decode tiles'
// (quant_formats_*-inl.h), so results equal theirs up to the order of f32 additions.
//
// Weight rows past the last whole panel of 8 go through the decode tiles (quant_kernels_k.cc,
// quant_kernels_32.cc), as does every row on targets without the x86 kernels.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "quant/quant_kernels_prefill.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// foreach_target must come first: it re-includes this file once per target.
#include <hwy/highway.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "quant/quant_formats_32-inl.h"
#include "quant/quant_formats_k-inl.h"
#include "quant/quant_kernel-inl.h"
#include "quant/quant_kernels.h"

HWY_BEFORE_NAMESPACE();
namespace kvp::quant::HWY_NAMESPACE {
namespace prefill {
using namespace k_path;  // NOLINT(google-build-using-namespace): the K formats

#if KVP_QUANT_X86

// The registers a panel's tile works in: V8, 256-bit, 8 weight rows per panel (every x86
// target); V16, 512-bit, 16 weight rows (AVX-512 targets). Lane i of every vector is weight row
// i of the panel.
struct V8 {
  static constexpr int kRows = 8;
  static constexpr int kTileRows = 4;  // activation rows per tile
  using I = __m256i;
  using F = __m256;
  static I zero() { return _mm256_setzero_si256(); }
  static F zero_ps() { return _mm256_setzero_ps(); }
  static I load(const void* p) { return _mm256_load_si256(reinterpret_cast<const I*>(p)); }
  static F load_ps(const float* p) { return _mm256_load_ps(p); }
  static I bcast32(const void* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
  }
  static F set1_ps(float v) { return _mm256_set1_ps(v); }
  static I add16(I a, I b) { return _mm256_add_epi16(a, b); }
  static I add32(I a, I b) { return _mm256_add_epi32(a, b); }
  static I sub32(I a, I b) { return _mm256_sub_epi32(a, b); }
  static I maddubs(I u, I s) { return _mm256_maddubs_epi16(u, s); }
  static I madd(I a, I b) { return _mm256_madd_epi16(a, b); }
  static I low16(I v) { return _mm256_srai_epi32(_mm256_slli_epi32(v, 16), 16); }
  static I ones16() { return _mm256_set1_epi16(1); }
  static I abs8(I v) { return _mm256_abs_epi8(v); }
  static I sign8(I x, I w) { return _mm256_sign_epi8(x, w); }  // x negated where w < 0
  static F cvt(I v) { return _mm256_cvtepi32_ps(v); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F sub_ps(F a, F b) { return _mm256_sub_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F fnmadd(F a, F b, F c) { return _mm256_fnmadd_ps(a, b, c); }
  static void storeu(float* p, F v) { _mm256_storeu_ps(p, v); }
#if HWY_TARGET == HWY_AVX3_DL
  // acc + the int32 sums of u[4i + l] * s[4i + l] (u unsigned, s signed), in the EVEX form that
  // AVX-512 VNNI CPUs without AVX-VNNI run (quant_kernel-inl.h's dot_u8_i8 says why).
  static I dpbusd(I acc, I u, I s) {
    asm("%{evex%} vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
    return acc;
  }
#endif
};

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
#define KVP_PREFILL_V16 1
struct V16 {
  static constexpr int kRows = 16;
  static constexpr int kTileRows = 4;  // 6 and 8 measured no faster (docs/perf/model.md)
  using I = __m512i;
  using F = __m512;
  static I zero() { return _mm512_setzero_si512(); }
  static F zero_ps() { return _mm512_setzero_ps(); }
  static I load(const void* p) { return _mm512_load_si512(p); }
  static F load_ps(const float* p) { return _mm512_load_ps(p); }
  static I bcast32(const void* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
  }
  static F set1_ps(float v) { return _mm512_set1_ps(v); }
  static I add16(I a, I b) { return _mm512_add_epi16(a, b); }
  static I add32(I a, I b) { return _mm512_add_epi32(a, b); }
  static I sub32(I a, I b) { return _mm512_sub_epi32(a, b); }
  static I maddubs(I u, I s) { return _mm512_maddubs_epi16(u, s); }
  static I madd(I a, I b) { return _mm512_madd_epi16(a, b); }
  static I low16(I v) { return _mm512_srai_epi32(_mm512_slli_epi32(v, 16), 16); }
  static I ones16() { return _mm512_set1_epi16(1); }
  static I abs8(I v) { return _mm512_abs_epi8(v); }
  // x negated where w < 0 (AVX-512 has no vpsignb; where w == 0 the product is 0 anyway)
  static I sign8(I x, I w) {
    return _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), _mm512_setzero_si512(), x);
  }
  static F cvt(I v) { return _mm512_cvtepi32_ps(v); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F sub_ps(F a, F b) { return _mm512_sub_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F fnmadd(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }
  static void storeu(float* p, F v) { _mm512_storeu_ps(p, v); }
#if HWY_TARGET == HWY_AVX3_DL
  // asm as in V8: the target's flags do not enable the 512-bit VNNI intrinsics (GCC 12)
  static I dpbusd(I acc, I u, I s) {
    asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
    return acc;
  }
#endif
};
using VWide = V16;  // the widest panel of the target
#else
#define KVP_PREFILL_V16 0
using VWide = V8;
#endif

// One super-block of a panel of N weight rows (the layout above).
template <int N>
struct alignas(4 * N) PanelBlock {
  static constexpr int kRows = N;
  uint8_t q[64][N][4];
  int16_t sc[16][N][2];
  int16_t mn[8][N][2];
  float d[N];
  float dmin[N];
};

// The largest |q| of a format's integers (IQ4_XS: its levels, signed).
template <class Fmt>
constexpr int q_max() {
  if constexpr (std::is_same_v<Fmt, FmtQ2K>) return 3;
  if constexpr (std::is_same_v<Fmt, FmtQ3K>) return 7;
  if constexpr (std::is_same_v<Fmt, FmtQ4K>) return 15;
  if constexpr (std::is_same_v<Fmt, FmtQ5K>) return 31;
  if constexpr (std::is_same_v<Fmt, FmtQ6K>) return 63;
  return 127;
}

// Chunks of 4 weights per scale: 8 where the format scales per 32, 4 where per 16.
template <class Fmt>
constexpr int group_chunks() {
  return std::is_same_v<Fmt, FmtQ4K> || std::is_same_v<Fmt, FmtQ5K> || std::is_same_v<Fmt, FmtIq4Xs>
             ? 8
             : 4;
}

// Chunks whose maddubs products add up in int16 without overflow (|xq| <= 127), at most `cap`.
constexpr int i16_run(int q_max, int cap) {
  return std::max(1, std::min(cap, 32767 / (2 * 127 * q_max)));
}

// The 8 x 8 transpose of 32-bit lanes: v[c] lane j becomes v[j] lane c.
HWY_INLINE void transpose_8x8_epi32(__m256i v[8]) {
  __m256i t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    u[4 * i] = _mm256_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int j = 0; j < 4; ++j) {
    v[j] = _mm256_permute2x128_si256(u[j], u[4 + j], 0x20);
    v[4 + j] = _mm256_permute2x128_si256(u[j], u[4 + j], 0x31);
  }
}

// Weight rows [o0, o0 + N) of w as num_blocks PanelBlock<N>s, 8 rows (one transpose) at a time.
template <class Fmt, int N>
void repack_panel(const QuantMatrix& w, int64_t o0, int64_t num_blocks, PanelBlock<N>* out) {
  const uint8_t* rows[N];
  for (int c = 0; c < N; ++c) rows[c] = reinterpret_cast<const uint8_t*>(w.row(o0 + c));
  for (int64_t b = 0; b < num_blocks; ++b) {
    PanelBlock<N>& p = out[b];
    const uint8_t* blk[N];
    for (int c = 0; c < N; ++c) {
      blk[c] = rows[c] + b * Fmt::kBytes;
      IntHeader h;
      Fmt::header(blk[c], h);
      for (int g = 0; g < 16; ++g) {
        p.sc[g][c][0] = p.sc[g][c][1] = static_cast<int16_t>(h.sc[g]);
        p.mn[g / 2][c][g % 2] = static_cast<int16_t>(h.mn[g]);
      }
      p.d[c] = h.d;
      p.dmin[c] = h.dmin;
    }
    for_each_sub([&](auto sub) {
      constexpr int s = decltype(sub)::value;
      for (int c0 = 0; c0 < N; c0 += 8) {
        __m256i v[8];
        for (int c = 0; c < 8; ++c) v[c] = Fmt::template load<s>(blk[c0 + c]);
        transpose_8x8_epi32(v);
        for (int j = 0; j < 8; ++j) {
          _mm256_store_si256(reinterpret_cast<__m256i*>(p.q[8 * s + j][c0]), v[j]);
        }
      }
    });
  }
}

// The panel's N weight rows x R activation rows from t0: y[(t0 + r) * ldy + c], c < N (y points
// at the panel's first output column).
template <class Fmt, int R, class V>
HWY_NOINLINE void panel_tile(const PanelBlock<V::kRows>* panel, int64_t num_blocks,
                             const ActBlocksK& a, int64_t t0, float* y, int64_t ldy) {
  using I = typename V::I;
  using F = typename V::F;
  constexpr int kGroup = group_chunks<Fmt>();
  constexpr int kRun = i16_run(q_max<Fmt>(), kGroup);
  const int8_t* xq[R];
  const float* xd[R];
  const int16_t* xs[R];
  F acc[R];
  for (int r = 0; r < R; ++r) {
    xq[r] = a.q_row(t0 + r);
    xd[r] = a.d_row(t0 + r);
    xs[r] = a.bsums_row(t0 + r);
    acc[r] = V::zero_ps();
  }
  for (int64_t b = 0; b < num_blocks; ++b) {
    const PanelBlock<V::kRows>& p = panel[b];
#if HWY_TARGET == HWY_AVX3_DL
    F fsum[R];  // the groups' int32 sums times their scales, in f32
    for (int r = 0; r < R; ++r) fsum[r] = V::zero_ps();
#else
    I isum[R];
    for (int r = 0; r < R; ++r) isum[r] = V::zero();
#endif
    for (int g = 0; g < 64 / kGroup; ++g) {
      const I sc = V::load(p.sc[g * kGroup / 4]);
#if HWY_TARGET == HWY_AVX3_DL
      // VNNI: dpbusd adds each chunk's products in int32, one instruction per activation row;
      // the group's scale (the low int16 of sc's pairs) then multiplies the sums in f32: a
      // convert and an FMA instead of vpmulld's two uops and an add. Exact: a group's sum times
      // its scale stays below 2^24 in every K format (largest: IQ4_XS 32 x 127 x 127 x 32, Q6_K
      // 16 x 63 x 127 x 128).
      I s32[R];
      for (int r = 0; r < R; ++r) s32[r] = V::zero();
      for (int k = 0; k < kGroup; ++k) {
        const int chunk = g * kGroup + k;
        const I wq = V::load(p.q[chunk]);
        const I wu = Fmt::kSigned ? V::abs8(wq) : wq;
        for (int r = 0; r < R; ++r) {
          I xv = V::bcast32(xq[r] + b * kActBlockK + 4 * chunk);
          if constexpr (Fmt::kSigned) xv = V::sign8(xv, wq);
          s32[r] = V::dpbusd(s32[r], wu, xv);
        }
      }
      const F scf = V::cvt(V::low16(sc));
      for (int r = 0; r < R; ++r) fsum[r] = V::fmadd(V::cvt(s32[r]), scf, fsum[r]);
#else
      for (int k0 = 0; k0 < kGroup; k0 += kRun) {
        I s16[R];
        for (int k = 0; k < kRun; ++k) {
          const int chunk = g * kGroup + k0 + k;
          const I wq = V::load(p.q[chunk]);
          for (int r = 0; r < R; ++r) {
            const I xv = V::bcast32(xq[r] + b * kActBlockK + 4 * chunk);
            // maddubs takes one unsigned operand: |q| times x with q's sign.
            const I prod =
                Fmt::kSigned ? V::maddubs(V::abs8(wq), V::sign8(xv, wq)) : V::maddubs(wq, xv);
            s16[r] = k == 0 ? prod : V::add16(s16[r], prod);
          }
        }
        for (int r = 0; r < R; ++r) isum[r] = V::add32(isum[r], V::madd(s16[r], sc));
      }
#endif
    }
    const F d = V::load_ps(p.d);
    F sum[R];  // the super-block's scaled sum per row
    for (int r = 0; r < R; ++r) {
#if HWY_TARGET == HWY_AVX3_DL
      sum[r] = fsum[r];
#else
      sum[r] = V::cvt(isum[r]);
#endif
    }
    if constexpr (Fmt::kMin == MinKind::kNone) {
      for (int r = 0; r < R; ++r) {
        acc[r] = V::fmadd(sum[r], V::mul(d, V::set1_ps(xd[r][b])), acc[r]);
      }
      continue;
    }
    I msum[R];
    for (int r = 0; r < R; ++r) msum[r] = V::zero();
    for (int q = 0; q < 8; ++q) {
      const I mn = V::load(p.mn[q]);
      for (int r = 0; r < R; ++r) {
        msum[r] = V::add32(msum[r], V::madd(mn, V::bcast32(xs[r] + 16 * b + 2 * q)));
      }
    }
    for (int r = 0; r < R; ++r) {
      const F dx = V::set1_ps(xd[r][b]);
      if constexpr (Fmt::kMin == MinKind::kOffset) {
        acc[r] = V::fmadd(V::sub_ps(sum[r], V::cvt(msum[r])), V::mul(d, dx), acc[r]);
      } else {
        acc[r] = V::fmadd(sum[r], V::mul(d, dx), acc[r]);
        acc[r] = V::fnmadd(V::cvt(msum[r]), V::mul(V::load_ps(p.dmin), dx), acc[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) V::storeu(y + (t0 + r) * ldy, acc[r]);
}

// One block of 32 of a panel of N weight rows (the layout above).
template <int N>
struct alignas(4 * N) Panel32 {
  static constexpr int kRows = N;
  uint8_t q[8][N][4];
  float d[N];
  float m[N];
};

// Weight rows [o0, o0 + N) of w (a 32-block format) as num_blocks Panel32<N>s.
template <class Fmt, int N>
void repack_panel_32(const QuantMatrix& w, int64_t o0, int64_t num_blocks, Panel32<N>* out) {
  const uint8_t* rows[N];
  for (int c = 0; c < N; ++c) rows[c] = reinterpret_cast<const uint8_t*>(w.row(o0 + c));
  auto factors = [](const uint8_t* blk, Panel32<N>& p, int c) {
    p.d[c] = f16_at(blk);
    p.m[c] = Fmt::kHasMin ? Fmt::kMinScale * f16_at(blk + Fmt::kMinAt) : 0.0f;
  };
  for (int64_t b = 0; b < num_blocks; b += 2) {
    const bool two = b + 1 < num_blocks;
    for (int c0 = 0; c0 < N; c0 += 8) {
      __m256i first[8], second[8];
      for (int c = 0; c < 8; ++c) {
        const uint8_t* b0 = rows[c0 + c] + b * Fmt::kBytes;
        const uint8_t* b1 = two ? b0 + Fmt::kBytes : b0;
        __m256i lo, hi;  // q0[0..16) | q1[0..16), q0[16..32) | q1[16..32)
        Fmt::load_pair(b0, b1, lo, hi);
        first[c] = _mm256_permute2x128_si256(lo, hi, 0x20);
        second[c] = _mm256_permute2x128_si256(lo, hi, 0x31);
        factors(b0, out[b], c0 + c);
        if (two) factors(b1, out[b + 1], c0 + c);
      }
      transpose_8x8_epi32(first);
      for (int j = 0; j < 8; ++j) {
        _mm256_store_si256(reinterpret_cast<__m256i*>(out[b].q[j][c0]), first[j]);
      }
      if (!two) continue;
      transpose_8x8_epi32(second);
      for (int j = 0; j < 8; ++j) {
        _mm256_store_si256(reinterpret_cast<__m256i*>(out[b + 1].q[j][c0]), second[j]);
      }
    }
  }
}

// As panel_tile, for a 32-block format: per block, the int32 sum of q xq per row, then
// acc += d dx sum + m sums[b] (sums[b] = dx sum_j xq[j], quant_act.h).
template <class Fmt, int R, class V>
HWY_NOINLINE void panel_tile_32(const Panel32<V::kRows>* panel, int64_t num_blocks,
                                const ActBlocks& a, int64_t t0, float* y, int64_t ldy) {
  using I = typename V::I;
  using F = typename V::F;
  const int8_t* xq[R];
  const float* xd[R];
  const float* xs[R];
  F acc[R];
  for (int r = 0; r < R; ++r) {
    xq[r] = a.q_row(t0 + r);
    xd[r] = a.d_row(t0 + r);
    xs[r] = a.sums_row(t0 + r);
    acc[r] = V::zero_ps();
  }
  for (int64_t b = 0; b < num_blocks; ++b) {
    const Panel32<V::kRows>& p = panel[b];
    // the pair layout of quant_act.h: chunk k (weights 4k..4k + 3) of block b
    const int64_t q_at = 64 * (b / 2) + 16 * (b % 2);
    auto chunk_at = [&](int r, int k) { return xq[r] + q_at + 32 * (k / 4) + 4 * (k % 4); };
    I s32[R];
    for (int r = 0; r < R; ++r) s32[r] = V::zero();
#if HWY_TARGET == HWY_AVX3_DL
    for (int k = 0; k < 8; ++k) {
      const I wq = V::load(p.q[k]);
      const I wu = Fmt::kSigned ? V::abs8(wq) : wq;
      for (int r = 0; r < R; ++r) {
        I xv = V::bcast32(chunk_at(r, k));
        if constexpr (Fmt::kSigned) xv = V::sign8(xv, wq);
        s32[r] = V::dpbusd(s32[r], wu, xv);
      }
    }
#else
    constexpr int kRun = i16_run(Fmt::kMaxQ, 8);
    for (int k0 = 0; k0 < 8; k0 += kRun) {
      I s16[R];
      for (int k = k0; k < k0 + kRun; ++k) {
        const I wq = V::load(p.q[k]);
        for (int r = 0; r < R; ++r) {
          const I xv = V::bcast32(chunk_at(r, k));
          const I prod =
              Fmt::kSigned ? V::maddubs(V::abs8(wq), V::sign8(xv, wq)) : V::maddubs(wq, xv);
          s16[r] = k == k0 ? prod : V::add16(s16[r], prod);
        }
      }
      for (int r = 0; r < R; ++r) s32[r] = V::add32(s32[r], V::madd(s16[r], V::ones16()));
    }
#endif
    const F d = V::load_ps(p.d);
    const int64_t d_at = 8 * (b / 2) + 4 * (b % 2);
    for (int r = 0; r < R; ++r) {
      acc[r] = V::fmadd(V::cvt(s32[r]), V::mul(d, V::set1_ps(xd[r][d_at])), acc[r]);
    }
    if constexpr (Fmt::kHasMin) {
      const F m = V::load_ps(p.m);
      for (int r = 0; r < R; ++r) acc[r] = V::fmadd(m, V::set1_ps(xs[r][b]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) V::storeu(y + (t0 + r) * ldy, acc[r]);
}

// Activation rows per pass over an item's panels: 64 rows of int8 codes (64 x cols bytes) stay
// in L2 beside the item's repacked rows while every panel reads them.
inline constexpr int64_t kActRowsPerPass = 64;

// The rows of rr: its whole panels of Panel::kRows rows repacked (repack(o0, panel) for each),
// then tiled over every activation row (tile(std::integral_constant<int, R>, panel, t0, y),
// R <= 4), and the rows past the last whole panel through `rest`.
template <int R, class Tile, class Panel>
void tile_rest(int64_t num_rows, Tile& tile, const Panel* panel, int64_t t, float* y) {
  if constexpr (R > 0) {
    if (num_rows == R) return tile(std::integral_constant<int, R>{}, panel, t, y);
    tile_rest<R - 1>(num_rows, tile, panel, t, y);
  }
}

template <int kTileRows, class Panel, class Repack, class Tile, class Rest>
void prefill_rows(const RowRange& rr, int64_t num_blocks, Repack repack, Tile tile, Rest rest) {
  constexpr int kRows = Panel::kRows;
  const int64_t num_panels = (rr.row_end - rr.row_begin) / kRows;
  // per pool thread, reused across calls (thread_local: the pool's threads live as long as it)
  thread_local std::vector<Panel> packed;
  if (packed.size() < static_cast<size_t>(num_panels * num_blocks)) {
    packed.resize(static_cast<size_t>(num_panels * num_blocks));
  }
  for (int64_t p = 0; p < num_panels; ++p) {
    repack(rr.row_begin + kRows * p, packed.data() + p * num_blocks);
  }
  for (int64_t t0 = 0; t0 < rr.num_rows; t0 += kActRowsPerPass) {
    const int64_t t1 = std::min(rr.num_rows, t0 + kActRowsPerPass);
    for (int64_t p = 0; p < num_panels; ++p) {
      const Panel* panel = packed.data() + p * num_blocks;
      float* y = rr.y + rr.row_begin + kRows * p;
      int64_t t = t0;
      for (; t + kTileRows <= t1; t += kTileRows) {
        tile(std::integral_constant<int, kTileRows>{}, panel, t, y);
      }
      tile_rest<kTileRows - 1>(t1 - t, tile, panel, t, y);
    }
  }
  if (rr.row_begin + kRows * num_panels < rr.row_end) {
    RowRange tail = rr;
    tail.row_begin = rr.row_begin + kRows * num_panels;
    rest(tail);
  }
}

// Panels of V's rows; the rows past them in 8-row panels (after 16-row ones), then the decode
// tiles.
template <class Fmt, class V>
void k_rows_prefill(const RowRange& rr, const ActBlocksK& a) {
  using Panel = PanelBlock<V::kRows>;
  const int64_t num_blocks = rr.w->cols / kActBlockK;
  prefill_rows<V::kTileRows, Panel>(
      rr, num_blocks,
      [&](int64_t o0, Panel* out) { repack_panel<Fmt>(*rr.w, o0, num_blocks, out); },
      [&](auto r, const Panel* panel, int64_t t, float* y) {
        panel_tile<Fmt, decltype(r)::value, V>(panel, num_blocks, a, t, y, rr.ldy);
      },
      [&](const RowRange& tail) {
        if constexpr (V::kRows > 8) {
          k_rows_prefill<Fmt, V8>(tail, a);
        } else {
          block_rows_k(tail, a);
        }
      });
}

template <class Fmt, class V>
void rows_prefill_32(const RowRange& rr, const ActBlocks& a) {
  using Panel = Panel32<V::kRows>;
  const int64_t num_blocks = rr.w->cols / kActBlock;
  prefill_rows<V::kTileRows, Panel>(
      rr, num_blocks,
      [&](int64_t o0, Panel* out) { repack_panel_32<Fmt>(*rr.w, o0, num_blocks, out); },
      [&](auto r, const Panel* panel, int64_t t, float* y) {
        panel_tile_32<Fmt, decltype(r)::value, V>(panel, num_blocks, a, t, y, rr.ldy);
      },
      [&](const RowRange& tail) {
        if constexpr (V::kRows > 8) {
          rows_prefill_32<Fmt, V8>(tail, a);
        } else {
          block_rows_32(tail, a);
        }
      });
}

#endif  // KVP_QUANT_X86

}  // namespace prefill

bool prefill_tiles_repack() { return KVP_QUANT_X86 != 0; }

void block_rows_k_prefill(const RowRange& rr, const ActBlocksK& a) {
#if KVP_QUANT_X86
  using namespace prefill;  // NOLINT(google-build-using-namespace): the formats
  switch (rr.w->type) {
    case GgmlType::Q2_K:
      return k_rows_prefill<FmtQ2K, VWide>(rr, a);
    case GgmlType::Q3_K:
      return k_rows_prefill<FmtQ3K, VWide>(rr, a);
    case GgmlType::Q4_K:
      return k_rows_prefill<FmtQ4K, VWide>(rr, a);
    case GgmlType::Q5_K:
      return k_rows_prefill<FmtQ5K, VWide>(rr, a);
    case GgmlType::Q6_K:
      return k_rows_prefill<FmtQ6K, VWide>(rr, a);
    case GgmlType::IQ4_XS:
      return k_rows_prefill<FmtIq4Xs, VWide>(rr, a);
    default:
      break;
  }
#endif
  block_rows_k(rr, a);
}

void block_rows_32_prefill(const RowRange& rr, const ActBlocks& a) {
#if KVP_QUANT_X86
  using namespace prefill;  // NOLINT(google-build-using-namespace)
  switch (rr.w->type) {
    case GgmlType::Q4_0:
      return rows_prefill_32<FmtQ4_0, VWide>(rr, a);
    case GgmlType::Q4_1:
      return rows_prefill_32<FmtQ4_1, VWide>(rr, a);
    case GgmlType::Q5_0:
      return rows_prefill_32<FmtQ5_0, VWide>(rr, a);
    case GgmlType::Q5_1:
      return rows_prefill_32<FmtQ5_1, VWide>(rr, a);
    case GgmlType::Q8_0:
      return rows_prefill_32<FmtQ8_0, VWide>(rr, a);
    case GgmlType::IQ4_NL:
      return rows_prefill_32<FmtIq4Nl, VWide>(rr, a);
    default:
      break;
  }
#endif
  block_rows_32(rr, a);
}

}  // namespace kvp::quant::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvp::quant {

HWY_EXPORT(prefill_tiles_repack);
HWY_EXPORT(block_rows_k_prefill);
HWY_EXPORT(block_rows_32_prefill);

void block_rows_k_prefill(const RowRange& rr, const ActBlocksK& a) {
  HWY_DYNAMIC_DISPATCH(block_rows_k_prefill)(rr, a);
}

bool prefill_tiles_repack() { return HWY_DYNAMIC_DISPATCH(prefill_tiles_repack)(); }

void block_rows_32_prefill(const RowRange& rr, const ActBlocks& a) {
  HWY_DYNAMIC_DISPATCH(block_rows_32_prefill)(rr, a);
}

}  // namespace kvp::quant
#endif

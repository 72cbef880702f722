// The prefill kernels of the block formats: many activation rows against the same weight rows,
// so the weight rows are first repacked, 8 at a time, into a layout where one 256-bit register
// holds 4 consecutive weights of each of the 8 rows (llama.cpp's interleaved "x8" layouts do the
// same), and the tiles never decode again. Lane i of every vector is output row i, so nothing is
// summed across lanes and 8 outputs of an activation row are stored at once.
//
//   K formats (super-blocks of 256, activations per 256: ActBlocksK), per super-block:
//     PanelBlock  q[64 chunks][8 rows][4]  the format's integers, unpacked (load<s> of
//                                          quant_formats_k-inl.h, an 8 x 8 transpose of 32-bit
//                                          lanes per sub-block)
//                 sc[16 groups][8 rows]    each row's scale per 16 weights, as an int16 pair
//                 mn[8 pairs][8 rows]      each row's (mn[2p], mn[2p + 1]), met by the bsums
//                 d[8], dmin[8]            each row's factors
//   32-block formats (activations per 32: ActBlocks), per block:
//     Panel32     q[8 chunks][8 rows][4], d[8], m[8]  (w = d q + m, quant_kernel-inl.h)
//
// A tile (8 weight rows x R activation rows) does, per chunk, one load of the weights and, per
// activation row, a broadcast of its 4 int8 codes and one maddubs (or, on AVX-512 VNNI, one
// dpbusd). maddubs products of one chunk are at most 2 * 127 * qmax in int16: up to run<qmax>()
// chunks are added in int16 before madd_epi16 widens them with the group's scale (Q4_K, Q4_0: 8;
// Q5_K, Q5_0: 4; Q6_K: 2; signed formats: 1). The integer sums are the decode tiles'
// (quant_formats_*-inl.h), so results equal theirs up to the order of f32 additions.
//
// Weight rows past the last whole 8 go through the decode tiles (quant_kernels_k.cc,
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

inline constexpr int kPanelRows = 8;  // weight rows per panel: the 8 int32 lanes of a register

// One super-block of a panel of 8 weight rows (the layout above).
struct alignas(32) PanelBlock {
  uint8_t q[64][kPanelRows][4];
  int16_t sc[16][kPanelRows][2];
  int16_t mn[8][kPanelRows][2];
  float d[kPanelRows];
  float dmin[kPanelRows];
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

// Weight rows [o0, o0 + 8) of w as num_blocks PanelBlocks.
template <class Fmt>
void repack_panel(const QuantMatrix& w, int64_t o0, int64_t num_blocks, PanelBlock* out) {
  const uint8_t* rows[kPanelRows];
  for (int c = 0; c < kPanelRows; ++c) rows[c] = reinterpret_cast<const uint8_t*>(w.row(o0 + c));
  for (int64_t b = 0; b < num_blocks; ++b) {
    PanelBlock& p = out[b];
    const uint8_t* blk[kPanelRows];
    for (int c = 0; c < kPanelRows; ++c) {
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
      __m256i v[kPanelRows];
      for (int c = 0; c < kPanelRows; ++c) v[c] = Fmt::template load<s>(blk[c]);
      transpose_8x8_epi32(v);
      for (int j = 0; j < 8; ++j) {
        _mm256_store_si256(reinterpret_cast<__m256i*>(p.q[8 * s + j]), v[j]);
      }
    });
  }
}

HWY_INLINE __m256i broadcast32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

HWY_INLINE __m256i load_aligned(const void* p) {
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(p));
}

#if HWY_TARGET == HWY_AVX3_DL
// acc + the int32 sums of u[4i + l] * s[4i + l] (u unsigned, s signed), in the EVEX form that
// AVX-512 VNNI CPUs without AVX-VNNI run (quant_kernel-inl.h's dot_u8_i8 says why).
HWY_INLINE __m256i dpbusd(__m256i acc, __m256i u, __m256i s) {
  asm("%{evex%} vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
  return acc;
}
#endif

// The panel's 8 weight rows x R activation rows from t0: y[(t0 + r) * ldy + c], c < 8 (y points
// at the panel's first output column).
template <class Fmt, int R>
HWY_NOINLINE void panel_tile(const PanelBlock* panel, int64_t num_blocks, const ActBlocksK& a,
                             int64_t t0, float* y, int64_t ldy) {
  constexpr int kGroup = group_chunks<Fmt>();
  constexpr int kRun = i16_run(q_max<Fmt>(), kGroup);
  const int8_t* xq[R];
  const float* xd[R];
  const int16_t* xs[R];
  __m256 acc[R];
  for (int r = 0; r < R; ++r) {
    xq[r] = a.q_row(t0 + r);
    xd[r] = a.d_row(t0 + r);
    xs[r] = a.bsums_row(t0 + r);
    acc[r] = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < num_blocks; ++b) {
    const PanelBlock& p = panel[b];
    __m256i isum[R];
    for (int r = 0; r < R; ++r) isum[r] = _mm256_setzero_si256();
    for (int g = 0; g < 64 / kGroup; ++g) {
      const __m256i sc = load_aligned(p.sc[g * kGroup / 4]);
#if HWY_TARGET == HWY_AVX3_DL
      // VNNI: dpbusd adds each chunk's products in int32, one instruction per activation row;
      // the group's scale then multiplies the int32 sums (the low int16 of sc's pairs).
      __m256i s32[R];
      for (int r = 0; r < R; ++r) s32[r] = _mm256_setzero_si256();
      for (int k = 0; k < kGroup; ++k) {
        const int chunk = g * kGroup + k;
        const __m256i wq = load_aligned(p.q[chunk]);
        const __m256i wu = Fmt::kSigned ? _mm256_sign_epi8(wq, wq) : wq;
        for (int r = 0; r < R; ++r) {
          __m256i xv = broadcast32(xq[r] + b * kActBlockK + 4 * chunk);
          if constexpr (Fmt::kSigned) xv = _mm256_sign_epi8(xv, wq);
          s32[r] = dpbusd(s32[r], wu, xv);
        }
      }
      const __m256i sc32 = _mm256_srai_epi32(_mm256_slli_epi32(sc, 16), 16);
      for (int r = 0; r < R; ++r) {
        isum[r] = _mm256_add_epi32(isum[r], _mm256_mullo_epi32(s32[r], sc32));
      }
      continue;
#endif
      for (int k0 = 0; k0 < kGroup; k0 += kRun) {
        __m256i s16[R];
        for (int k = 0; k < kRun; ++k) {
          const int chunk = g * kGroup + k0 + k;
          const __m256i wq = load_aligned(p.q[chunk]);
          for (int r = 0; r < R; ++r) {
            const __m256i xv = broadcast32(xq[r] + b * kActBlockK + 4 * chunk);
            __m256i prod;
            if constexpr (Fmt::kSigned) {
              // maddubs takes one unsigned operand: |q| times x with q's sign.
              prod = _mm256_maddubs_epi16(_mm256_sign_epi8(wq, wq), _mm256_sign_epi8(xv, wq));
            } else {
              prod = _mm256_maddubs_epi16(wq, xv);
            }
            s16[r] = k == 0 ? prod : _mm256_add_epi16(s16[r], prod);
          }
        }
        for (int r = 0; r < R; ++r) {
          isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(s16[r], sc));
        }
      }
    }
    const __m256 d = _mm256_load_ps(p.d);
    if constexpr (Fmt::kMin == MinKind::kNone) {
      for (int r = 0; r < R; ++r) {
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]),
                                 _mm256_mul_ps(d, _mm256_set1_ps(xd[r][b])), acc[r]);
      }
      continue;
    }
    __m256i msum[R];
    for (int r = 0; r < R; ++r) msum[r] = _mm256_setzero_si256();
    for (int q = 0; q < 8; ++q) {
      const __m256i mn = load_aligned(p.mn[q]);
      for (int r = 0; r < R; ++r) {
        msum[r] =
            _mm256_add_epi32(msum[r], _mm256_madd_epi16(mn, broadcast32(xs[r] + 16 * b + 2 * q)));
      }
    }
    for (int r = 0; r < R; ++r) {
      const __m256 dx = _mm256_set1_ps(xd[r][b]);
      if constexpr (Fmt::kMin == MinKind::kOffset) {
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(isum[r], msum[r])),
                                 _mm256_mul_ps(d, dx), acc[r]);
      } else {
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_mul_ps(d, dx), acc[r]);
        acc[r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum[r]),
                                  _mm256_mul_ps(_mm256_load_ps(p.dmin), dx), acc[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(y + (t0 + r) * ldy, acc[r]);
}

// One block of 32 of a panel of 8 weight rows (the layout above).
struct alignas(32) Panel32 {
  uint8_t q[8][kPanelRows][4];
  float d[kPanelRows];
  float m[kPanelRows];
};

// Weight rows [o0, o0 + 8) of w (a 32-block format) as num_blocks Panel32s.
template <class Fmt>
void repack_panel_32(const QuantMatrix& w, int64_t o0, int64_t num_blocks, Panel32* out) {
  const uint8_t* rows[kPanelRows];
  for (int c = 0; c < kPanelRows; ++c) rows[c] = reinterpret_cast<const uint8_t*>(w.row(o0 + c));
  auto factors = [](const uint8_t* blk, Panel32& p, int c) {
    p.d[c] = f16_at(blk);
    p.m[c] = Fmt::kHasMin ? Fmt::kMinScale * f16_at(blk + Fmt::kMinAt) : 0.0f;
  };
  for (int64_t b = 0; b < num_blocks; b += 2) {
    const bool two = b + 1 < num_blocks;
    __m256i first[kPanelRows], second[kPanelRows];
    for (int c = 0; c < kPanelRows; ++c) {
      const uint8_t* b0 = rows[c] + b * Fmt::kBytes;
      const uint8_t* b1 = two ? b0 + Fmt::kBytes : b0;
      __m256i lo, hi;  // q0[0..16) | q1[0..16), q0[16..32) | q1[16..32)
      Fmt::load_pair(b0, b1, lo, hi);
      first[c] = _mm256_permute2x128_si256(lo, hi, 0x20);
      second[c] = _mm256_permute2x128_si256(lo, hi, 0x31);
      factors(b0, out[b], c);
      if (two) factors(b1, out[b + 1], c);
    }
    transpose_8x8_epi32(first);
    for (int j = 0; j < 8; ++j)
      _mm256_store_si256(reinterpret_cast<__m256i*>(out[b].q[j]), first[j]);
    if (!two) continue;
    transpose_8x8_epi32(second);
    for (int j = 0; j < 8; ++j) {
      _mm256_store_si256(reinterpret_cast<__m256i*>(out[b + 1].q[j]), second[j]);
    }
  }
}

// As panel_tile, for a 32-block format: per block, the int32 sum of q xq per row, then
// acc += d dx sum + m sums[b] (sums[b] = dx sum_j xq[j], quant_act.h).
template <class Fmt, int R>
HWY_NOINLINE void panel_tile_32(const Panel32* panel, int64_t num_blocks, const ActBlocks& a,
                                int64_t t0, float* y, int64_t ldy) {
  const int8_t* xq[R];
  const float* xd[R];
  const float* xs[R];
  __m256 acc[R];
  for (int r = 0; r < R; ++r) {
    xq[r] = a.q_row(t0 + r);
    xd[r] = a.d_row(t0 + r);
    xs[r] = a.sums_row(t0 + r);
    acc[r] = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < num_blocks; ++b) {
    const Panel32& p = panel[b];
    // the pair layout of quant_act.h: chunk k (weights 4k..4k + 3) of block b
    const int64_t q_at = 64 * (b / 2) + 16 * (b % 2);
    auto chunk_at = [&](int r, int k) { return xq[r] + q_at + 32 * (k / 4) + 4 * (k % 4); };
    __m256i s32[R];
    for (int r = 0; r < R; ++r) s32[r] = _mm256_setzero_si256();
#if HWY_TARGET == HWY_AVX3_DL
    for (int k = 0; k < 8; ++k) {
      const __m256i wq = load_aligned(p.q[k]);
      const __m256i wu = Fmt::kSigned ? _mm256_sign_epi8(wq, wq) : wq;
      for (int r = 0; r < R; ++r) {
        __m256i xv = broadcast32(chunk_at(r, k));
        if constexpr (Fmt::kSigned) xv = _mm256_sign_epi8(xv, wq);
        s32[r] = dpbusd(s32[r], wu, xv);
      }
    }
#else
    constexpr int kRun = i16_run(Fmt::kMaxQ, 8);
    for (int k0 = 0; k0 < 8; k0 += kRun) {
      __m256i s16[R];
      for (int k = k0; k < k0 + kRun; ++k) {
        const __m256i wq = load_aligned(p.q[k]);
        for (int r = 0; r < R; ++r) {
          const __m256i xv = broadcast32(chunk_at(r, k));
          __m256i prod;
          if constexpr (Fmt::kSigned) {
            prod = _mm256_maddubs_epi16(_mm256_sign_epi8(wq, wq), _mm256_sign_epi8(xv, wq));
          } else {
            prod = _mm256_maddubs_epi16(wq, xv);
          }
          s16[r] = k == k0 ? prod : _mm256_add_epi16(s16[r], prod);
        }
      }
      for (int r = 0; r < R; ++r) {
        s32[r] = _mm256_add_epi32(s32[r], _mm256_madd_epi16(s16[r], _mm256_set1_epi16(1)));
      }
    }
#endif
    const __m256 d = _mm256_load_ps(p.d);
    const int64_t d_at = 8 * (b / 2) + 4 * (b % 2);
    for (int r = 0; r < R; ++r) {
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32[r]),
                               _mm256_mul_ps(d, _mm256_set1_ps(xd[r][d_at])), acc[r]);
    }
    if constexpr (Fmt::kHasMin) {
      const __m256 m = _mm256_load_ps(p.m);
      for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(xs[r][b]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(y + (t0 + r) * ldy, acc[r]);
}

// Activation rows per pass over an item's panels: 64 rows of int8 codes (64 x cols bytes) stay
// in L2 beside the item's repacked rows while every panel reads them.
inline constexpr int64_t kActRowsPerPass = 64;

// The rows of rr: its whole panels repacked (repack(o0, panel) for each), then tiled over every
// activation row (tile(std::integral_constant<int, R>, panel, t0, y), R <= 4), and the rows
// past the last whole panel through `rest` (the decode tiles).
template <class Panel, class Repack, class Tile, class Rest>
void prefill_rows(const RowRange& rr, int64_t num_blocks, Repack repack, Tile tile, Rest rest) {
  const int64_t num_panels = (rr.row_end - rr.row_begin) / kPanelRows;
  // per pool thread, reused across calls (thread_local: the pool's threads live as long as it)
  thread_local std::vector<Panel> packed;
  if (packed.size() < static_cast<size_t>(num_panels * num_blocks)) {
    packed.resize(static_cast<size_t>(num_panels * num_blocks));
  }
  for (int64_t p = 0; p < num_panels; ++p) {
    repack(rr.row_begin + kPanelRows * p, packed.data() + p * num_blocks);
  }
  for (int64_t t0 = 0; t0 < rr.num_rows; t0 += kActRowsPerPass) {
    const int64_t t1 = std::min(rr.num_rows, t0 + kActRowsPerPass);
    for (int64_t p = 0; p < num_panels; ++p) {
      const Panel* panel = packed.data() + p * num_blocks;
      float* y = rr.y + rr.row_begin + kPanelRows * p;
      int64_t t = t0;
      for (; t + 4 <= t1; t += 4) tile(std::integral_constant<int, 4>{}, panel, t, y);
      switch (t1 - t) {
        case 3:
          tile(std::integral_constant<int, 3>{}, panel, t, y);
          break;
        case 2:
          tile(std::integral_constant<int, 2>{}, panel, t, y);
          break;
        case 1:
          tile(std::integral_constant<int, 1>{}, panel, t, y);
          break;
        default:
          break;
      }
    }
  }
  if (rr.row_begin + kPanelRows * num_panels < rr.row_end) {
    RowRange tail = rr;
    tail.row_begin = rr.row_begin + kPanelRows * num_panels;
    rest(tail);
  }
}

template <class Fmt>
void k_rows_prefill(const RowRange& rr, const ActBlocksK& a) {
  const int64_t num_blocks = rr.w->cols / kActBlockK;
  prefill_rows<PanelBlock>(
      rr, num_blocks,
      [&](int64_t o0, PanelBlock* out) { repack_panel<Fmt>(*rr.w, o0, num_blocks, out); },
      [&](auto r, const PanelBlock* panel, int64_t t, float* y) {
        panel_tile<Fmt, decltype(r)::value>(panel, num_blocks, a, t, y, rr.ldy);
      },
      [&](const RowRange& tail) { block_rows_k(tail, a); });
}

template <class Fmt>
void rows_prefill_32(const RowRange& rr, const ActBlocks& a) {
  const int64_t num_blocks = rr.w->cols / kActBlock;
  prefill_rows<Panel32>(
      rr, num_blocks,
      [&](int64_t o0, Panel32* out) { repack_panel_32<Fmt>(*rr.w, o0, num_blocks, out); },
      [&](auto r, const Panel32* panel, int64_t t, float* y) {
        panel_tile_32<Fmt, decltype(r)::value>(panel, num_blocks, a, t, y, rr.ldy);
      },
      [&](const RowRange& tail) { block_rows_32(tail, a); });
}

#endif  // KVP_QUANT_X86

}  // namespace prefill

bool prefill_tiles_repack() { return KVP_QUANT_X86 != 0; }

void block_rows_k_prefill(const RowRange& rr, const ActBlocksK& a) {
#if KVP_QUANT_X86
  using namespace prefill;  // NOLINT(google-build-using-namespace): the formats
  switch (rr.w->type) {
    case GgmlType::Q2_K:
      return k_rows_prefill<FmtQ2K>(rr, a);
    case GgmlType::Q3_K:
      return k_rows_prefill<FmtQ3K>(rr, a);
    case GgmlType::Q4_K:
      return k_rows_prefill<FmtQ4K>(rr, a);
    case GgmlType::Q5_K:
      return k_rows_prefill<FmtQ5K>(rr, a);
    case GgmlType::Q6_K:
      return k_rows_prefill<FmtQ6K>(rr, a);
    case GgmlType::IQ4_XS:
      return k_rows_prefill<FmtIq4Xs>(rr, a);
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
      return rows_prefill_32<FmtQ4_0>(rr, a);
    case GgmlType::Q4_1:
      return rows_prefill_32<FmtQ4_1>(rr, a);
    case GgmlType::Q5_0:
      return rows_prefill_32<FmtQ5_0>(rr, a);
    case GgmlType::Q5_1:
      return rows_prefill_32<FmtQ5_1>(rr, a);
    case GgmlType::Q8_0:
      return rows_prefill_32<FmtQ8_0>(rr, a);
    case GgmlType::IQ4_NL:
      return rows_prefill_32<FmtIq4Nl>(rr, a);
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

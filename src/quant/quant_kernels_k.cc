// The decode-side integer kernels for the formats with super-blocks of 256 (Q2_K..Q6_K, IQ4_XS)
// over the GGUF layout in place: tiles of C weight rows x R activation rows, compiled per
// Highway target. The formats and the arithmetic: quant_formats_k-inl.h. Prefill (many
// activation rows) repacks weight rows first: quant_kernels_prefill.cc.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "quant/quant_kernels_k.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// foreach_target must come first: it re-includes this file once per target.
#include <hwy/highway.h>

#include <utility>

#include "quant/quant_formats_k-inl.h"
#include "quant/quant_kernel-inl.h"
#include "quant/quant_kernels.h"

HWY_BEFORE_NAMESPACE();
namespace kvp::quant::HWY_NAMESPACE {
namespace k_path {

#if KVP_QUANT_X86

// C weight rows (from o0) x R activation rows (from t0): y[t0 + r][o0 + c].
template <class Fmt, int C, int R>
HWY_NOINLINE void k_tile(const QuantMatrix& w, int64_t o0, const ActBlocksK& a, int64_t t0,
                         float* y, int64_t ldy) {
  const int64_t num_blocks = w.cols / kActBlockK;
  const uint8_t* wr[C];
  for (int c = 0; c < C; ++c) wr[c] = reinterpret_cast<const uint8_t*>(w.row(o0 + c));
  const int8_t* xq[R];
  const float* xd[R];
  const int16_t* xs[R];
  for (int r = 0; r < R; ++r) {
    xq[r] = a.q_row(t0 + r);
    xd[r] = a.d_row(t0 + r);
    xs[r] = a.bsums_row(t0 + r);
  }
  __m256 acc[C][R];
  for (int c = 0; c < C; ++c) {
    for (int r = 0; r < R; ++r) acc[c][r] = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < num_blocks; ++b) {
    const uint8_t* blk[C];
    KScales ks[C];
    for (int c = 0; c < C; ++c) {
      blk[c] = wr[c] + b * Fmt::kBytes;
      prefetch_ahead<Fmt::kBytes>(blk[c]);
      ks[c] = Fmt::scales(blk[c]);
    }
    __m256i isum[C][R];
    for (int c = 0; c < C; ++c) {
      for (int r = 0; r < R; ++r) isum[c][r] = _mm256_setzero_si256();
    }
    for_each_sub([&](auto sub) {
      constexpr int s = decltype(sub)::value;
      __m256i q[C];
      __m256i sc[C];
      for (int c = 0; c < C; ++c) {
        q[c] = Fmt::template load<s>(blk[c]);
        sc[c] = Fmt::template scale<s>(ks[c]);
      }
      for (int r = 0; r < R; ++r) {
        const __m256i xv =
            load256(reinterpret_cast<const uint8_t*>(xq[r] + b * kActBlockK + 32 * s));
        for (int c = 0; c < C; ++c) {
          __m256i p;
          if constexpr (Fmt::kSigned) {
            // maddubs takes one unsigned operand: |q| times x with q's sign.
            p = _mm256_maddubs_epi16(_mm256_sign_epi8(q[c], q[c]), _mm256_sign_epi8(xv, q[c]));
          } else {
            p = _mm256_maddubs_epi16(q[c], xv);
          }
          isum[c][r] = _mm256_add_epi32(isum[c][r], _mm256_madd_epi16(p, sc[c]));
        }
      }
    });
    for (int r = 0; r < R; ++r) {
      const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs[r] + 16 * b));
      const float dx = xd[r][b];
      for (int c = 0; c < C; ++c) {
        if constexpr (Fmt::kMin == MinKind::kNone) {
          acc[c][r] = fma_lanes(isum[c][r], ks[c].d * dx, acc[c][r]);
        } else if constexpr (Fmt::kMin == MinKind::kOffset) {
          const __m256i m = _mm256_madd_epi16(ks[c].mn16, bs);
          acc[c][r] = fma_lanes(_mm256_sub_epi32(isum[c][r], m), ks[c].d * dx, acc[c][r]);
        } else {
          const __m256i m = _mm256_madd_epi16(ks[c].mn16, bs);
          acc[c][r] = fma_lanes(isum[c][r], ks[c].d * dx, acc[c][r]);
          acc[c][r] = fma_lanes(m, -(ks[c].dmin * dx), acc[c][r]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) y[(t0 + r) * ldy + o0 + c] = hsum(acc[c][r]);
  }
}

// Weight rows per tile for R activation rows (AVX-512 targets have 32 registers, AVX2 16).
template <int R>
constexpr int k_tile_weight_rows() {
  if constexpr (R >= 8) return 1;
  if constexpr (R <= 2) return 4;
  return HWY_TARGET == HWY_AVX2 ? 2 : 4;
}

#else  // !KVP_QUANT_X86: portable, one weight row and one activation row at a time

template <class Fmt, int C, int R>
HWY_NOINLINE void k_tile(const QuantMatrix& w, int64_t o0, const ActBlocksK& a, int64_t t0,
                         float* y, int64_t ldy) {
  const int64_t num_blocks = w.cols / kActBlockK;
  for (int c = 0; c < C; ++c) {
    const auto* wr = reinterpret_cast<const uint8_t*>(w.row(o0 + c));
    for (int r = 0; r < R; ++r) {
      const int8_t* xq = a.q_row(t0 + r);
      const float* xd = a.d_row(t0 + r);
      const int16_t* xs = a.bsums_row(t0 + r);
      float acc = 0;
      for (int64_t b = 0; b < num_blocks; ++b) {
        IntHeader h;
        Fmt::header(wr + b * Fmt::kBytes, h);
        int32_t isum = 0;
        for (int s = 0; s < 8; ++s) {
          uint8_t q[32];
          Fmt::unpack(wr + b * Fmt::kBytes, s, q);
          const int8_t* x = xq + b * kActBlockK + 32 * s;
          for (int half = 0; half < 2; ++half) {
            int32_t dot = 0;
            for (int j = 16 * half; j < 16 * half + 16; ++j) {
              const int32_t qj = Fmt::kSigned ? int32_t{static_cast<int8_t>(q[j])} : int32_t{q[j]};
              dot += qj * int32_t{x[j]};
            }
            isum += h.sc[2 * s + half] * dot;
          }
        }
        int32_t msum = 0;
        for (int g = 0; g < 16; ++g) msum += h.mn[g] * int32_t{xs[16 * b + g]};
        if constexpr (Fmt::kMin == MinKind::kOffset) {
          acc += static_cast<float>(isum - msum) * (h.d * xd[b]);
        } else {
          acc += static_cast<float>(isum) * (h.d * xd[b]) -
                 static_cast<float>(msum) * (h.dmin * xd[b]);
        }
      }
      y[(t0 + r) * ldy + o0 + c] = acc;
    }
  }
}

template <int R>
constexpr int k_tile_weight_rows() {
  return 1;
}

#endif  // KVP_QUANT_X86

template <class Fmt, int R>
HWY_INLINE void k_rows_r(const RowRange& rr, const ActBlocksK& a, int64_t t0) {
  constexpr int kC = k_tile_weight_rows<R>();
  int64_t o = rr.row_begin;
  if (R == 1 && rr.w->row_bytes >= kOneRowTileBytes) {  // quant_kernel-inl.h says why
    for (; o < rr.row_end; ++o) k_tile<Fmt, 1, R>(*rr.w, o, a, t0, rr.y, rr.ldy);
    return;
  }
  for (; o + kC <= rr.row_end; o += kC) k_tile<Fmt, kC, R>(*rr.w, o, a, t0, rr.y, rr.ldy);
  for (; o < rr.row_end; ++o) k_tile<Fmt, 1, R>(*rr.w, o, a, t0, rr.y, rr.ldy);
}

// Up to this many int8 activation bytes (8 rows x cols), 8 activation rows share one weight
// row's super-blocks (as in quant_kernel-inl.h); past it the 8 rows' activations no longer stay
// in the 32 KiB L1 beside the weights. Measured with 1 thread at 8 rows (thread CPU time, AVX2 on
// Zen 3), 1 x 8 tiles against 2 x 4: Q4_K 640 x 2048 0.245 ms against 0.269, Q6_K 640 x 2048
// 0.245 against 0.284, but Q4_K 4096 x 4096 3.96 against 3.33.
inline constexpr int64_t kEightRowTileBytes = 16 << 10;

// The rows of rr for every activation row, 8 activation rows per tile (short rows), then 4, then
// the rest: the weight rows of the range are read from memory for the first tile and from cache
// for the others.
template <class Fmt>
void k_rows(const RowRange& rr, const ActBlocksK& a) {
  int64_t t = 0;
  if (8 * rr.w->cols <= kEightRowTileBytes) {
    for (; t + 8 <= rr.num_rows; t += 8) k_rows_r<Fmt, 8>(rr, a, t);
  }
  for (; t + 4 <= rr.num_rows; t += 4) k_rows_r<Fmt, 4>(rr, a, t);
  switch (rr.num_rows - t) {
    case 3:
      k_rows_r<Fmt, 3>(rr, a, t);
      break;
    case 2:
      k_rows_r<Fmt, 2>(rr, a, t);
      break;
    case 1:
      k_rows_r<Fmt, 1>(rr, a, t);
      break;
    default:
      break;
  }
}

}  // namespace k_path

void block_rows_k(const RowRange& rr, const ActBlocksK& a) {
  using namespace k_path;  // NOLINT(google-build-using-namespace): the formats of this file
  switch (rr.w->type) {
    case GgmlType::Q2_K:
      return k_rows<FmtQ2K>(rr, a);
    case GgmlType::Q3_K:
      return k_rows<FmtQ3K>(rr, a);
    case GgmlType::Q4_K:
      return k_rows<FmtQ4K>(rr, a);
    case GgmlType::Q5_K:
      return k_rows<FmtQ5K>(rr, a);
    case GgmlType::Q6_K:
      return k_rows<FmtQ6K>(rr, a);
    case GgmlType::IQ4_XS:
      return k_rows<FmtIq4Xs>(rr, a);
    default:
      break;
  }
}

}  // namespace kvp::quant::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvp::quant {

HWY_EXPORT(block_rows_k);

void block_rows_k(const RowRange& rr, const ActBlocksK& a) {
  HWY_DYNAMIC_DISPATCH(block_rows_k)(rr, a);
}

}  // namespace kvp::quant
#endif

// F32 / F16 / BF16 weights against f32 activations: the weight is widened to f32 in registers
// and multiply-added, so the result is the exact product up to f32 rounding and summation
// order. C weight rows x R activation rows per tile, each loaded vector used C or R times.
// Highway, compiled per target.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "quant/quant_kernels_float.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// foreach_target must come first: it re-includes this file once per target.
#include <hwy/highway.h>

#include <cstring>
#include <type_traits>

#include "common/dtype.h"
#include "quant/quant_kernels.h"

HWY_BEFORE_NAMESPACE();
namespace kvp::quant::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

template <typename T>
HWY_INLINE VF load_weights(DF df, const T* HWY_RESTRICT p) {
  if constexpr (std::is_same_v<T, float>) {
    return hn::LoadU(df, p);
  } else {
    const hn::Rebind<T, DF> dt;
    return hn::PromoteTo(df, hn::LoadU(dt, p));
  }
}

template <typename T>
HWY_INLINE float weight_at(const T* p, int64_t i) {
  if constexpr (std::is_same_v<T, float>) {
    return p[i];
  } else {
    uint16_t bits;
    std::memcpy(&bits, p + i, 2);
    if constexpr (std::is_same_v<T, hwy::bfloat16_t>) return bf16_to_f32(Bf16{bits});
    return f16_to_f32(F16{bits});
  }
}

// y[t0 + r][o0 + c] for C weight rows and R activation rows.
template <typename T, int C, int R>
HWY_NOINLINE void float_tile(const RowRange& rr, int64_t o0, int64_t t0, const float* x,
                             int64_t ldx) {
  const DF df;
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  const int64_t cols = rr.w->cols;
  const T* wr[C];
  for (int c = 0; c < C; ++c) wr[c] = reinterpret_cast<const T*>(rr.w->row(o0 + c));
  const float* xr[R];
  for (int r = 0; r < R; ++r) xr[r] = x + (t0 + r) * ldx;
  VF acc[C][R];
  for (int c = 0; c < C; ++c) {
    for (int r = 0; r < R; ++r) acc[c][r] = hn::Zero(df);
  }
  int64_t i = 0;
  for (; i + n <= cols; i += n) {
    VF wv[C];
    for (int c = 0; c < C; ++c) wv[c] = load_weights(df, wr[c] + i);
    for (int r = 0; r < R; ++r) {
      const VF xv = hn::LoadU(df, xr[r] + i);
      for (int c = 0; c < C; ++c) acc[c][r] = hn::MulAdd(wv[c], xv, acc[c][r]);
    }
  }
  for (int c = 0; c < C; ++c) {
    for (int r = 0; r < R; ++r) {
      float sum = hn::GetLane(hn::SumOfLanes(df, acc[c][r]));
      for (int64_t j = i; j < cols; ++j) sum += weight_at(wr[c], j) * xr[r][j];
      rr.y[(t0 + r) * rr.ldy + o0 + c] = sum;
    }
  }
}

template <typename T, int R>
HWY_INLINE void float_rows_r(const RowRange& rr, int64_t t0, const float* x, int64_t ldx) {
  constexpr int kC = R <= 2 ? 4 : 2;
  int64_t o = rr.row_begin;
  for (; o + kC <= rr.row_end; o += kC) float_tile<T, kC, R>(rr, o, t0, x, ldx);
  for (; o < rr.row_end; ++o) float_tile<T, 1, R>(rr, o, t0, x, ldx);
}

template <typename T>
void float_rows_t(const RowRange& rr, const float* x, int64_t ldx) {
  int64_t t = 0;
  for (; t + 4 <= rr.num_rows; t += 4) float_rows_r<T, 4>(rr, t, x, ldx);
  switch (rr.num_rows - t) {
    case 3:
      return float_rows_r<T, 3>(rr, t, x, ldx);
    case 2:
      return float_rows_r<T, 2>(rr, t, x, ldx);
    case 1:
      return float_rows_r<T, 1>(rr, t, x, ldx);
    default:
      break;
  }
}

void float_rows(const RowRange& rr, const float* x, int64_t ldx) {
  switch (rr.w->type) {
    case GgmlType::F32:
      return float_rows_t<float>(rr, x, ldx);
    case GgmlType::F16:
      return float_rows_t<hwy::float16_t>(rr, x, ldx);
    case GgmlType::BF16:
      return float_rows_t<hwy::bfloat16_t>(rr, x, ldx);
    default:
      break;
  }
}

}  // namespace kvp::quant::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvp::quant {

HWY_EXPORT(float_rows);

void float_rows(const RowRange& rr, const float* x, int64_t ldx) {
  HWY_DYNAMIC_DISPATCH(float_rows)(rr, x, ldx);
}

}  // namespace kvp::quant
#endif

// Highway implementation of sampler_kernels.h, compiled once per x86 target through
// foreach_target and picked at run time by HWY_DYNAMIC_DISPATCH. Tails shorter than a vector
// run the same arithmetic in scalar code.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "engine/sampler_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// foreach_target must come first: it re-includes this file once per target.
#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

#include "engine/sampler_kernels.h"

HWY_BEFORE_NAMESPACE();
namespace kvp::sampler_kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kMinExponent = -87.0f;
constexpr size_t kBlock = 4096;

float max_value(const float* values, size_t n) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  auto best = hn::Set(df, kNegInf);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto v = hn::LoadU(df, values + i);
    best = hn::Max(best, hn::IfThenElse(hn::IsNaN(v), hn::Set(df, kNegInf), v));
  }
  float m = hn::GetLane(hn::MaxOfLanes(df, best));
  for (; i < n; ++i) {
    if (values[i] > m) m = values[i];  // false for NaN
  }
  return m;
}

int32_t argmax(const float* values, size_t n) {
  if (n == 0) return 0;
  const float m = max_value(values, n);
  const DF df;
  const size_t lanes = hn::Lanes(df);
  const auto target = hn::Set(df, m);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const intptr_t hit = hn::FindFirstTrue(df, hn::Eq(hn::LoadU(df, values + i), target));
    if (hit >= 0) return static_cast<int32_t>(i + static_cast<size_t>(hit));
  }
  for (; i < n; ++i) {
    if (values[i] == m) return static_cast<int32_t>(i);
  }
  return 0;  // every value NaN
}

double exp_shifted(const float* values, size_t n, float shift, float* out) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  const auto shift_v = hn::Set(df, shift);
  const auto floor_v = hn::Set(df, kMinExponent);
  double total = 0.0;
  size_t i = 0;
  while (i + lanes <= n) {
    const size_t end = std::min(n, i + kBlock);
    auto acc = hn::Zero(df);
    for (; i + lanes <= end; i += lanes) {
      const auto x = hn::Max(hn::Sub(hn::LoadU(df, values + i), shift_v), floor_v);
      const auto e = hn::Exp(df, x);
      if (out != nullptr) hn::StoreU(e, df, out + i);
      acc = hn::Add(acc, e);
    }
    total += hn::GetLane(hn::SumOfLanes(df, acc));
  }
  for (; i < n; ++i) {
    const float e = std::exp(std::max(values[i] - shift, kMinExponent));
    if (out != nullptr) out[i] = e;
    total += e;
  }
  return total;
}

}  // namespace kvp::sampler_kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvp::sampler_kernels {

HWY_EXPORT(max_value);
HWY_EXPORT(argmax);
HWY_EXPORT(exp_shifted);

float max_value(std::span<const float> values) {
  return HWY_DYNAMIC_DISPATCH(max_value)(values.data(), values.size());
}

int32_t argmax(std::span<const float> values) {
  return HWY_DYNAMIC_DISPATCH(argmax)(values.data(), values.size());
}

double exp_shifted(std::span<const float> values, float shift, std::span<float> out) {
  return HWY_DYNAMIC_DISPATCH(exp_shifted)(values.data(), values.size(), shift,
                                           out.empty() ? nullptr : out.data());
}

}  // namespace kvp::sampler_kernels
#endif  // HWY_ONCE

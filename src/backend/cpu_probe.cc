// fma_probe (cpu_probe.h), compiled per Highway target and dispatched at run time.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend/cpu_probe.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// foreach_target must come first: it re-includes this file once per target.
#include <hwy/highway.h>

#include "backend/cpu_probe.h"

HWY_BEFORE_NAMESPACE();
namespace kvp::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Eight independent accumulators hide the FMA latency on every x86 core we target.
float fma_probe(int64_t iterations) {
  const hn::ScalableTag<float> df;
  auto a0 = hn::Set(df, 1.0f), a1 = hn::Set(df, 1.1f), a2 = hn::Set(df, 1.2f),
       a3 = hn::Set(df, 1.3f), a4 = hn::Set(df, 1.4f), a5 = hn::Set(df, 1.5f),
       a6 = hn::Set(df, 1.6f), a7 = hn::Set(df, 1.7f);
  const auto x = hn::Set(df, 0.999999f), y = hn::Set(df, 1e-7f);
  for (int64_t i = 0; i < iterations; ++i) {
    a0 = hn::MulAdd(a0, x, y);
    a1 = hn::MulAdd(a1, x, y);
    a2 = hn::MulAdd(a2, x, y);
    a3 = hn::MulAdd(a3, x, y);
    a4 = hn::MulAdd(a4, x, y);
    a5 = hn::MulAdd(a5, x, y);
    a6 = hn::MulAdd(a6, x, y);
    a7 = hn::MulAdd(a7, x, y);
  }
  const auto sum =
      hn::Add(hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)), hn::Add(hn::Add(a4, a5), hn::Add(a6, a7)));
  return hn::GetLane(hn::SumOfLanes(df, sum));
}

size_t fma_probe_lanes() { return hn::Lanes(hn::ScalableTag<float>()); }

}  // namespace kvp::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvp::cpu {
HWY_EXPORT(fma_probe);
HWY_EXPORT(fma_probe_lanes);
float fma_probe(int64_t iterations) { return HWY_DYNAMIC_DISPATCH(fma_probe)(iterations); }
size_t fma_probe_lanes() { return HWY_DYNAMIC_DISPATCH(fma_probe_lanes)(); }
}  // namespace kvp::cpu
#endif

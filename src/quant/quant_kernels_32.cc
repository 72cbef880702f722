// The integer kernels for the formats with blocks of 32 (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL):
// each format's view as d * q + m (quant_kernel-inl.h), compiled per Highway target.
// Layouts: dequant.h.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "quant/quant_kernels_32.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// foreach_target must come first: it re-includes this file once per target.
#include <hwy/highway.h>

#include "quant/quant_formats_32-inl.h"
#include "quant/quant_kernel-inl.h"
#include "quant/quant_kernels.h"

HWY_BEFORE_NAMESPACE();
namespace kvp::quant::HWY_NAMESPACE {

void block_rows_32(const RowRange& rr, const ActBlocks& a) {
  switch (rr.w->type) {
    case GgmlType::Q4_0:
      return block_rows<FmtQ4_0>(rr, a);
    case GgmlType::Q4_1:
      return block_rows<FmtQ4_1>(rr, a);
    case GgmlType::Q5_0:
      return block_rows<FmtQ5_0>(rr, a);
    case GgmlType::Q5_1:
      return block_rows<FmtQ5_1>(rr, a);
    case GgmlType::Q8_0:
      return block_rows<FmtQ8_0>(rr, a);
    case GgmlType::IQ4_NL:
      return block_rows<FmtIq4Nl>(rr, a);
    default:
      break;
  }
}

const char* block_kernel_target() { return hwy::TargetName(HWY_TARGET); }

}  // namespace kvp::quant::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvp::quant {

HWY_EXPORT(block_rows_32);
HWY_EXPORT(block_kernel_target);

void block_rows_32(const RowRange& rr, const ActBlocks& a) {
  HWY_DYNAMIC_DISPATCH(block_rows_32)(rr, a);
}
const char* block_kernel_target() { return HWY_DYNAMIC_DISPATCH(block_kernel_target)(); }

}  // namespace kvp::quant
#endif

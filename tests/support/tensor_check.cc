#include "support/tensor_check.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace kvp::testing {

void fill_random(void* data, DType t, size_t count, std::mt19937_64& rng, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  for (size_t i = 0; i < count; ++i) store_from_f32(data, t, i, dist(rng));
}

std::string TensorDiff::describe() const {
  return fmt::format("relative error {:.3e}, max |diff| {:.3e} at element {}, {} non-finite",
                     relative_error, max_abs_diff, worst_index, non_finite);
}

TensorDiff compare(const void* out, DType out_type, const void* ref, DType ref_type, size_t count) {
  TensorDiff diff;
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < count; ++i) {
    const double o = load_as_f32(out, out_type, i);
    const double r = load_as_f32(ref, ref_type, i);
    if (!std::isfinite(o)) {
      ++diff.non_finite;
      continue;
    }
    const double d = std::abs(o - r);
    num += d * d;
    den += r * r;
    if (d > diff.max_abs_diff) {
      diff.max_abs_diff = d;
      diff.worst_index = i;
    }
  }
  diff.relative_error = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return diff;
}

double relative_error(std::span<const float> got, std::span<const float> want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  return std::sqrt(num / den);
}

int32_t argmax(std::span<const float> row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

}  // namespace kvp::testing

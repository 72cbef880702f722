// Test helpers shared by kernel tests (llm.c's check_tensor): fresh random inputs and a
// comparison that reports the relative error and the worst element.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "common/dtype.h"

namespace kvp::testing {

// Fills `count` elements of dtype `t` with uniform values in [lo, hi) (never all zeros).
void fill_random(void* data, DType t, size_t count, std::mt19937_64& rng, float lo = -1.0f,
                 float hi = 1.0f);

struct TensorDiff {
  double relative_error = 0.0;  // ||out - ref|| / ||ref||
  double max_abs_diff = 0.0;
  size_t worst_index = 0;
  size_t non_finite = 0;  // NaN or Inf in out
  std::string describe() const;
};

// Compares `count` elements of two buffers (each of its own dtype).
TensorDiff compare(const void* out, DType out_type, const void* ref, DType ref_type, size_t count);

// ||got - want|| / ||want|| over two float rows (logits, activations); infinity if got holds a
// NaN or an infinity.
double relative_error(std::span<const float> got, std::span<const float> want);

// The first index of the largest value.
int32_t argmax(std::span<const float> row);

}  // namespace kvp::testing

// The placeholder matmul against matmul_reference; the block kernels' parity tests grow here.
#include "quant/quant_matmul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace kvp::quant {
namespace {

TEST(QuantMatmul, F32MatchesReference) {
  const int64_t rows = 37, cols = 67, n = 3;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> w(rows * cols), x(n * cols);
  for (float& v : w) v = u(rng);
  for (float& v : x) v = u(rng);
  const QuantMatrix m = make_matrix(GgmlType::F32, w.data(), rows, cols);
  std::vector<float> y(n * rows), ref(n * rows);
  ThreadPool pool(2);
  matmul(m, x.data(), n, cols, y.data(), rows, &pool);
  matmul_reference(m, x.data(), n, cols, ref.data(), rows);
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], ref[i], 1e-4f) << i;
}

}  // namespace
}  // namespace kvp::quant

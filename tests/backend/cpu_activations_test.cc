// cpu::gated_activation and cpu::soft_cap (vectorised with Highway's math) against the formulas
// of cpu_layer_ops.h evaluated in f64 with the C library, on every Highway target this build
// compiles and the CPU runs: within a few f32 ULP of the result's scale, over values from tiny to
// far past where exp and tanh saturate, and over lengths that leave a partial vector.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <random>
#include <vector>

#include "backend/cpu_layer_ops.h"

namespace kvp::cpu {
namespace {

double reference(double g, double u, Activation act) {
  switch (act) {
    case Activation::kSilu:
      return g / (1.0 + std::exp(-g)) * u;
    case Activation::kClampedSwiglu: {
      const double gc = std::min(g, double{kSwigluLimit});
      const double uc = std::clamp(u, -double{kSwigluLimit}, double{kSwigluLimit});
      return (uc + 1.0) * (gc / (1.0 + std::exp(-double{kSwigluAlpha} * gc)));
    }
    case Activation::kGeluTanh:
    default: {
      const double k = std::sqrt(2.0 / std::numbers::pi);
      return 0.5 * g * (1.0 + std::tanh(k * (g + 0.044715 * g * g * g))) * u;
    }
  }
}

// Values spread over magnitudes: most in [-4, 4], some tiny, some far out (exp overflows past
// 88, tanh saturates past 9), exact zeros.
std::vector<float> values(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t kind = rng() % 8;
    v[i] = kind == 0 ? u(rng) * 60.0f : kind == 1 ? u(rng) * 1e-6f : kind == 2 ? 0.0f : u(rng);
  }
  return v;
}

TEST(CpuActivations, GatedActivationsMatchTheFormulasOnEveryTarget) {
  std::mt19937 rng(3);
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    for (Activation act : {Activation::kSilu, Activation::kGeluTanh, Activation::kClampedSwiglu}) {
      for (int64_t dim : {1, 7, 16, 37, 640}) {
        const int64_t rows = 3;
        const std::vector<float> gate_up = values(static_cast<size_t>(rows * 2 * dim), rng);
        std::vector<float> out(static_cast<size_t>(rows * dim) + 1, 12345.0f);
        gated_activation(gate_up.data(), out.data(), rows, dim, act);
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t i = 0; i < dim; ++i) {
            const double g = gate_up[r * 2 * dim + i], u = gate_up[r * 2 * dim + dim + i];
            const double want = reference(g, u, act);
            // a few f32 ULP of the result or of g max(|u|, 1), the size of what it is made of
            // (the far tails, e^-57 g and below, need not keep their relative precision)
            const double scale =
                std::max(std::fabs(want), std::fabs(g) * std::max(std::fabs(u), 1.0)) + 1e-30;
            EXPECT_LE(std::fabs(out[r * dim + i] - want), 8 * 6e-8 * scale)
                << hwy::TargetName(target) << " act " << static_cast<int>(act) << " g " << g
                << " u " << u << " got " << out[r * dim + i] << " want " << want;
          }
        }
        EXPECT_EQ(out.back(), 12345.0f) << "wrote past the rows";
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

TEST(CpuActivations, SoftCapMatchesTanhOnEveryTarget) {
  std::mt19937 rng(4);
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    for (int64_t count : {1, 5, 16, 33, 1000}) {
      std::vector<float> x = values(static_cast<size_t>(count), rng);
      const std::vector<float> in = x;
      x.push_back(12345.0f);
      soft_cap(x.data(), count, 30.0f);
      for (int64_t i = 0; i < count; ++i) {
        const double want = 30.0 * std::tanh(double{in[i]} / 30.0);
        EXPECT_LE(std::fabs(x[i] - want), 8 * 6e-8 * std::fabs(want) + 1e-37)
            << hwy::TargetName(target) << " x " << in[i];
      }
      EXPECT_EQ(x.back(), 12345.0f);
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

}  // namespace
}  // namespace kvp::cpu

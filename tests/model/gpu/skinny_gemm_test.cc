// The few-rows matrix product (model/cuda/skinny_gemm.h) against a double-precision product of
// the same bf16 values written here, for every variant, 1…8 rows, f32 and bf16 outputs, and
// shapes whose columns are not whole steps of 32 and whose rows are not whole tiles of 16 or 32;
// guard values around y show nothing outside it is written. Skips without a CUDA device.
#include "model/cuda/skinny_gemm.h"
#include "support/gpu_skip.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/device_buffer.h"
#include "common/dtype.h"
#include "model/cuda/model_kernels.h"

namespace kvp::cuda {
namespace {

std::vector<Bf16> random_bf16(size_t count, std::mt19937_64& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<Bf16> v(count);
  for (Bf16& b : v) b = f32_to_bf16(dist(rng));
  return v;
}

struct Shape {
  int64_t in, out;
};

TEST(CudaSkinnyGemm, EveryVariantMatchesADoubleProduct) {
  SKIP_WITHOUT_GPU();
  constexpr int64_t kGuard = 64;  // f32 values on each side of y
  const float guard_value = 12345.0f;
  std::mt19937_64 rng(7);
  for (const Shape s : {Shape{8, 1}, Shape{24, 17}, Shape{576, 33}, Shape{1000, 100},
                        Shape{4104, 65}, Shape{264, 47}}) {
    const auto w = random_bf16(size_t(s.in * s.out), rng);
    const auto x = random_bf16(size_t(s.in * detail::kSkinnyMaxRows), rng);
    DeviceBuffer dw = DeviceBuffer::allocate(w.size() * 2).value();
    DeviceBuffer dx = DeviceBuffer::allocate(x.size() * 2).value();
    ASSERT_EQ(cudaMemcpy(dw.data(), w.data(), w.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dx.data(), x.data(), x.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
    const size_t y_floats = size_t(detail::kSkinnyMaxRows * s.out + 2 * kGuard);
    DeviceBuffer dy = DeviceBuffer::allocate(y_floats * 4).value();
    for (int64_t rows = 1; rows <= detail::kSkinnyMaxRows; ++rows) {
      // sums in double over the bf16 values, and each sum's scale (the sum of |x·w|)
      std::vector<double> want(size_t(rows * s.out)), scale(want.size());
      for (int64_t m = 0; m < rows; ++m) {
        for (int64_t o = 0; o < s.out; ++o) {
          double sum = 0, mag = 0;
          for (int64_t k = 0; k < s.in; ++k) {
            const double p =
                double(bf16_to_f32(x[size_t(m * s.in + k)])) * bf16_to_f32(w[size_t(o * s.in + k)]);
            sum += p;
            mag += std::abs(p);
          }
          want[size_t(m * s.out + o)] = sum;
          scale[size_t(m * s.out + o)] = mag;
        }
      }
      for (int variant = 0; variant < detail::kSkinnyVariants; ++variant) {
        for (bool y_f32 : {true, false}) {
          std::vector<float> init(y_floats, guard_value);
          ASSERT_EQ(cudaMemcpy(dy.data(), init.data(), y_floats * 4, cudaMemcpyHostToDevice),
                    cudaSuccess);
          std::byte* y = dy.as<std::byte>() + kGuard * 4;
          ASSERT_TRUE(detail::skinny_gemm_fits(dx.data(), dw.data(), rows, s.in, s.out));
          detail::SkinnyLaunch how;
          how.variant = variant;
          how.dependent = variant % 2 == 0;
          how.prefetch_bytes = variant == 0 ? 0 : 4096 << variant;
          ASSERT_EQ(detail::launch_skinny_gemm(dx.data(), dw.data(), y, y_f32, rows, s.in, s.out,
                                               nullptr, how),
                    cudaSuccess);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          std::vector<float> got(y_floats);
          ASSERT_EQ(cudaMemcpy(got.data(), dy.data(), y_floats * 4, cudaMemcpyDeviceToHost),
                    cudaSuccess);
          const size_t y_bytes = size_t(rows * s.out) * (y_f32 ? 4 : 2);
          // everything outside y keeps its guard bytes
          std::vector<std::byte> before(y_floats * 4);
          std::memcpy(before.data(), init.data(), before.size());
          std::vector<std::byte> after(y_floats * 4);
          std::memcpy(after.data(), got.data(), after.size());
          for (size_t b = 0; b < after.size(); ++b) {
            if (b >= size_t(kGuard * 4) && b < size_t(kGuard * 4) + y_bytes) continue;
            ASSERT_EQ(after[b], before[b]) << "byte " << b << " outside y written, in " << s.in
                                           << " out " << s.out << " rows " << rows;
          }
          double worst = 0;
          for (size_t i = 0; i < want.size(); ++i) {
            float v;
            if (y_f32) {
              std::memcpy(&v, after.data() + kGuard * 4 + i * 4, 4);
            } else {
              Bf16 b;
              std::memcpy(&b, after.data() + kGuard * 4 + i * 2, 2);
              v = bf16_to_f32(b);
            }
            // f32 accumulation of `in` products, plus bf16 rounding of the result
            const double bound =
                1e-5 * scale[i] + (y_f32 ? 0.0 : std::abs(want[i]) * 0x1p-8) + 1e-30;
            const double err = std::abs(double(v) - want[i]);
            worst = std::max(worst, err / bound);
            ASSERT_LE(err, bound) << "in " << s.in << " out " << s.out << " rows " << rows
                                  << " variant " << variant << (y_f32 ? " f32" : " bf16") << ": y["
                                  << i / s.out << "][" << i % s.out << "] = " << v << ", want "
                                  << want[i];
          }
          if (rows == detail::kSkinnyMaxRows && variant == 0 && y_f32) {
            std::printf("[ skinny  ] in %lld out %lld: largest error %.2f of its bound\n",
                        static_cast<long long>(s.in), static_cast<long long>(s.out), worst);
          }
        }
      }
    }
  }
}

// The runner's order: an RMS norm writes x (and lets its dependents start at once), the product
// launched as its programmatic dependent reads it. The product must see the norm's x, not the
// zeros x held before, on every repetition.
TEST(CudaSkinnyGemm, ADependentLaunchReadsWhatTheKernelBeforeItWrote) {
  SKIP_WITHOUT_GPU();
  constexpr int64_t kIn = 4096, kOut = 4096, kRows = 4;
  std::mt19937_64 rng(11);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> h(kRows * kIn), ones(kIn, 1.0f);
  for (float& v : h) v = dist(rng);
  const auto w = random_bf16(size_t(kIn * kOut), rng);
  DeviceBuffer dh = DeviceBuffer::allocate(h.size() * 4).value();
  DeviceBuffer dones = DeviceBuffer::allocate(ones.size() * 4).value();
  DeviceBuffer dw = DeviceBuffer::allocate(w.size() * 2).value();
  DeviceBuffer dx = DeviceBuffer::allocate(kRows * kIn * 2).value();
  DeviceBuffer dy = DeviceBuffer::allocate(kRows * kOut * 4).value();
  ASSERT_EQ(cudaMemcpy(dh.data(), h.data(), h.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dones.data(), ones.data(), kIn * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dw.data(), w.data(), w.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  std::vector<double> want;
  for (int rep = 0; rep < 20; ++rep) {
    ASSERT_EQ(cudaMemsetAsync(dx.data(), 0, kRows * kIn * 2, stream), cudaSuccess);
    ASSERT_EQ(detail::launch_rms_norm_rows(dh.as<float>(), nullptr, kRows, kIn, dones.as<float>(),
                                           1e-5f, dx.data(), stream),
              cudaSuccess);
    ASSERT_EQ(
        detail::launch_skinny_gemm(dx.data(), dw.data(), dy.data(), true, kRows, kIn, kOut, stream),
        cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    if (want.empty()) {
      std::vector<Bf16> x(kRows * kIn);
      ASSERT_EQ(cudaMemcpy(x.data(), dx.data(), x.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
      want.assign(kRows * kOut, 0.0);
      for (int64_t m = 0; m < kRows; ++m) {
        ASSERT_NE(bf16_to_f32(x[size_t(m * kIn)]), 0.0f);  // the norm wrote x
        for (int64_t o = 0; o < kOut; ++o) {
          double sum = 0;
          for (int64_t k = 0; k < kIn; ++k) {
            sum +=
                double(bf16_to_f32(x[size_t(m * kIn + k)])) * bf16_to_f32(w[size_t(o * kIn + k)]);
          }
          want[size_t(m * kOut + o)] = sum;
        }
      }
    }
    std::vector<float> y(kRows * kOut);
    ASSERT_EQ(cudaMemcpy(y.data(), dy.data(), y.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t i = 0; i < y.size(); ++i) {
      // |x·w| sums to about 4096 x 0.8 x 0.8 here; 1e-5 of it is far below a zero x's error
      ASSERT_NEAR(y[i], want[i], 0.03)
          << "repetition " << rep << ", y[" << i / kOut << "][" << i % kOut << "]";
    }
  }
  cudaStreamDestroy(stream);
}

TEST(CudaSkinnyGemm, RefusesWhatItDoesNotTake) {
  SKIP_WITHOUT_GPU();
  DeviceBuffer b = DeviceBuffer::allocate(4096).value();
  const std::byte* p = b.as<std::byte>();
  EXPECT_TRUE(detail::skinny_gemm_fits(p, p, 1, 64, 3));
  EXPECT_FALSE(detail::skinny_gemm_fits(p, p, 0, 64, 3));                           // no rows
  EXPECT_FALSE(detail::skinny_gemm_fits(p, p, detail::kSkinnyMaxRows + 1, 64, 3));  // too many
  EXPECT_FALSE(detail::skinny_gemm_fits(p, p, 1, 60, 3));      // not whole vectors
  EXPECT_FALSE(detail::skinny_gemm_fits(p + 2, p, 1, 64, 3));  // x misaligned
  EXPECT_FALSE(detail::skinny_gemm_fits(p, p + 8, 1, 64, 3));  // w misaligned
  EXPECT_FALSE(detail::skinny_gemm_fits(p, p, 1, 64, 0));      // no output rows
  std::byte* y = b.as<std::byte>() + 2048;
  EXPECT_EQ(detail::launch_skinny_gemm(p, p, y, true, 9, 64, 3, nullptr), cudaErrorInvalidValue);
  detail::SkinnyLaunch how;
  how.variant = detail::kSkinnyVariants;
  EXPECT_EQ(detail::launch_skinny_gemm(p, p, y, true, 1, 64, 3, nullptr, how),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // a refusal launches nothing
}

}  // namespace
}  // namespace kvp::cuda

// Fills device buffers with uniform pseudo-random bf16/f16 values (benchmarks and tests: fresh
// random inputs of many gigabytes without a host round trip). Counter-based: element i of seed s
// is a hash of (s, i), so the result does not depend on the launch shape.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include "backend/cuda/kernels.h"

namespace kvp::cuda::detail {
namespace {

__device__ __forceinline__ uint32_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

// Element i of the [rows][cols] block is element (row0 + i / cols) · full_cols + col0 + i % cols
// of the whole.
template <typename T>
__global__ void fill_uniform_kernel(T* data, int64_t rows, int64_t cols, int64_t full_cols,
                                    int64_t row0, int64_t col0, uint64_t seed, float lo, float hi) {
  const int64_t count = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t whole = (row0 + i / cols) * full_cols + col0 + i % cols;
    const float u = (mix(seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(whole)) >> 8) *
                    (1.0f / 16777216.0f);
    const float x = lo + (hi - lo) * u;
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      data[i] = __float2bfloat16_rn(x);
    } else {
      data[i] = __float2half_rn(x);
    }
  }
}

}  // namespace

cudaError_t launch_fill_uniform_rect(void* data, bool bf16, int64_t rows, int64_t cols,
                                     int64_t full_cols, int64_t row0, int64_t col0, uint64_t seed,
                                     float lo, float hi, cudaStream_t stream) {
  const int64_t count = rows * cols;
  if (count == 0) return cudaSuccess;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((count + 255) / 256, 4096));
  if (bf16) {
    fill_uniform_kernel<<<blocks, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(data), rows, cols,
                                                    full_cols, row0, col0, seed, lo, hi);
  } else {
    fill_uniform_kernel<<<blocks, 256, 0, stream>>>(static_cast<__half*>(data), rows, cols,
                                                    full_cols, row0, col0, seed, lo, hi);
  }
  return cudaGetLastError();
}

cudaError_t launch_fill_uniform(void* data, bool bf16, int64_t count, uint64_t seed, float lo,
                                float hi, cudaStream_t stream) {
  return launch_fill_uniform_rect(data, bf16, 1, count, count, 0, 0, seed, lo, hi, stream);
}

}  // namespace kvp::cuda::detail

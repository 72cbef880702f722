// The few-rows matrix product (skinny_gemm.h). One CTA owns 16·R output rows; its warps share
// the columns (a warp takes every kWarps-th step of 32 columns) and their partial sums meet in
// shared memory. In a step, lane (g, t) (g = lane / 4, t = lane % 4) loads 8 consecutive columns
// 8t…8t+7 of weight rows g and g + 8 and of x row g as one 16-byte vector each. An mma's k index
// may be any permutation of the columns as long as A and B use the same one: with A's fragment
// registers {(g, 2t..2t+1), (g+8, 2t..2t+1), (g, 2t+8..9), (g+8, 2t+8..9)} and B's {(2t..2t+1, g),
// (2t+8..9, g)}, logical k {2t, 2t+1, 2t+8, 2t+9} is physical column 8t + {0, 1, 2, 3} for the
// first mma and 8t + {4, 5, 6, 7} for the second, so the loaded vectors are the fragments as they
// are, with no shuffles. The accumulator's columns are x's rows (only the first `rows` are
// stored). Launched as a dependent (SkinnyLaunch::dependent), a CTA first asks L2 for the start
// of each of its weight rows, which needs nothing from the kernel before it, and waits for that
// kernel only before its first load of x.
#include <cuda_bf16.h>

#include <algorithm>
#include <climits>

#include "backend/cuda/dependent_launch.cuh"
#include "model/cuda/skinny_gemm.h"

namespace kvp::cuda::detail {
namespace {

constexpr int kWarps = 8;

// Weights are read once: past L1 (keep it for x), as one 16-byte vector.
__device__ __forceinline__ uint4 load_streaming(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

template <int R, int U, bool kOutF32>
__global__ void __launch_bounds__(kWarps * 32)
    skinny_gemm_kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                       void* __restrict__ y, int32_t rows, int32_t in, int32_t out,
                       int32_t prefetch_bytes) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t row_base = int64_t{blockIdx.x} * 16 * R;
  {
    // the first prefetch_bytes / (16 R) bytes of each row (the columns the loop reads first), in
    // 128-byte lines; then the kernel before this one must be done
    const int64_t row_bytes = int64_t{in} * 2;
    const int64_t lines = std::min<int64_t>(row_bytes, prefetch_bytes / (16 * R)) / 128;
    const int64_t my_rows = std::min<int64_t>(16 * R, out - row_base);
    const char* base = reinterpret_cast<const char*>(w + row_base * in);
    for (int64_t i = threadIdx.x; i < my_rows * lines; i += kWarps * 32) {
      asm volatile(
          "prefetch.global.L2 [%0];" ::"l"(base + (i / lines) * row_bytes + (i % lines) * 128));
    }
  }
  wait_for_prerequisites();
  allow_dependents();  // the kernel after this one may be scheduled; it waits for this one
  // rows past `out` load the last row again (in bounds) and are not stored
  const uint4* wp[R][2];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = std::min<int64_t>(row_base + 16 * r + 8 * h + g, out - 1);
      wp[r][h] = reinterpret_cast<const uint4*>(w + row * in);
    }
  }
  const bool has_x = g < rows;
  const uint4* xp = reinterpret_cast<const uint4*>(x + int64_t{has_x ? g : 0} * in);
  const int chunks = in / 8;  // 16-byte vectors in a row
  const int steps = (chunks + 3) / 4;
  float c[R][4] = {};
  for (int s0 = warp; s0 < steps; s0 += kWarps * U) {
    uint4 wv[U][R][2], xv[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int chunk = (s0 + u * kWarps) * 4 + t;
      const bool ok = chunk < chunks;
#pragma unroll
      for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          wv[u][r][h] = ok ? load_streaming(wp[r][h] + chunk) : make_uint4(0, 0, 0, 0);
        }
      }
      xv[u] = ok && has_x ? __ldg(xp + chunk) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const uint4& lo = wv[u][r][0];
        const uint4& hi = wv[u][r][1];
        mma_bf16(c[r], lo.x, hi.x, lo.y, hi.y, xv[u].x, xv[u].y);
        mma_bf16(c[r], lo.z, hi.z, lo.w, hi.w, xv[u].z, xv[u].w);
      }
    }
  }
  // c[r] = {(row g, x row 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1)} of tile r
  __shared__ float part[kWarps][R * 16][8];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    part[warp][16 * r + g][2 * t] = c[r][0];
    part[warp][16 * r + g][2 * t + 1] = c[r][1];
    part[warp][16 * r + g + 8][2 * t] = c[r][2];
    part[warp][16 * r + g + 8][2 * t + 1] = c[r][3];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < R * 16 * 8; i += kWarps * 32) {
    const int m = i / (R * 16), local = i % (R * 16);  // consecutive threads, consecutive rows
    const int64_t row = row_base + local;
    if (m >= rows || row >= out) continue;
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < kWarps; ++k) sum += part[k][local][m];
    if constexpr (kOutF32) {
      static_cast<float*>(y)[int64_t{m} * out + row] = sum;
    } else {
      static_cast<__nv_bfloat16*>(y)[int64_t{m} * out + row] = __float2bfloat16_rn(sum);
    }
  }
}

template <int R, int U>
cudaError_t launch(const void* x, const void* w, void* y, bool y_f32, int32_t rows, int32_t in,
                   int32_t out, cudaStream_t stream, const SkinnyLaunch& how) {
  const dim3 grid(static_cast<unsigned>((int64_t{out} + 16 * R - 1) / (16 * R)));
  const auto* xb = static_cast<const __nv_bfloat16*>(x);
  const auto* wb = static_cast<const __nv_bfloat16*>(w);
  const int32_t prefetch = std::max(how.prefetch_bytes, 0);
  return y_f32 ? launch_dependent(how.dependent, skinny_gemm_kernel<R, U, true>, grid,
                                  dim3(kWarps * 32), 0, stream, xb, wb, y, rows, in, out, prefetch)
               : launch_dependent(how.dependent, skinny_gemm_kernel<R, U, false>, grid,
                                  dim3(kWarps * 32), 0, stream, xb, wb, y, rows, in, out, prefetch);
}

}  // namespace

bool skinny_gemm_fits(const void* x, const void* w, int64_t rows, int64_t in, int64_t out) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return rows >= 1 && rows <= kSkinnyMaxRows && in >= 8 && in % 8 == 0 && in <= INT_MAX &&
         out >= 1 && out <= INT_MAX && aligned(x) && aligned(w);
}

cudaError_t launch_skinny_gemm(const void* x, const void* w, void* y, bool y_f32, int64_t rows,
                               int64_t in, int64_t out, cudaStream_t stream,
                               const SkinnyLaunch& how) {
  int variant = how.variant;
  if (!skinny_gemm_fits(x, w, rows, in, out) || variant < -1 || variant >= kSkinnyVariants) {
    return cudaErrorInvalidValue;
  }
  const auto r = static_cast<int32_t>(rows), i = static_cast<int32_t>(in),
             o = static_cast<int32_t>(out);
  if (variant == -1) variant = in <= 8192 ? 2 : 1;  // model_cuda_bench --gemm on the H100
  switch (variant) {
    case 0:
      return launch<1, 2>(x, w, y, y_f32, r, i, o, stream, how);
    case 1:
      return launch<1, 4>(x, w, y, y_f32, r, i, o, stream, how);
    case 2:
      return launch<1, 8>(x, w, y, y_f32, r, i, o, stream, how);
    case 3:
      return launch<2, 2>(x, w, y, y_f32, r, i, o, stream, how);
    default:
      return launch<2, 4>(x, w, y, y_f32, r, i, o, stream, how);
  }
}

}  // namespace kvp::cuda::detail

// The CUDA model runner's matrix product for few rows (decode steps, small batches):
// y[rows][out] = x[rows][in] · w[out][in]ᵀ with bf16 x and w, f32 accumulation, y in f32 or bf16.
// At a decode step's 1–8 rows cuBLAS picks split-K kernels plus a separate reduction; this kernel
// reads each weight row once, in one launch, with the rows of x riding along as the narrow side
// of a tensor-core product (the weights are the 16-row side of mma.sync m16n8k16, x the 8-column
// side), so its time is the weight bytes over the memory bandwidth. The runner
// (cuda_model_runner.cc) sends a product here when skinny_gemm_fits says so, else to cuBLAS.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvp::cuda::detail {

// The most rows of x one launch takes (one mma column tile).
inline constexpr int64_t kSkinnyMaxRows = 8;

// Whether launch_skinny_gemm takes this product: 1 <= rows <= kSkinnyMaxRows, in a multiple of 8
// (whole 16-byte vectors), in and out within int32, x and w 16-byte aligned.
bool skinny_gemm_fits(const void* x, const void* w, int64_t rows, int64_t in, int64_t out);

// How a launch divides its work: output rows per CTA and steps of 32 columns a lane has in
// flight, (16, 2), (16, 4), (16, 8), (32, 2), (32, 4) for variants 0…4.
inline constexpr int kSkinnyVariants = 5;

struct SkinnyLaunch {
  int variant = -1;  // -1: chosen by shape (what the runner uses); 0…4 force one
  // Launched as a programmatic dependent of the kernel before it in the stream (sm_90 and
  // later; backend/cuda/dependent_launch.cuh): its CTAs start while that kernel finishes,
  // prefetch up to prefetch_bytes of their weight rows into L2, then wait for it before reading x.
  bool dependent = true;
  int32_t prefetch_bytes = 64 << 10;  // per CTA
};

// requires: skinny_gemm_fits(x, w, rows, in, out). x [rows][in] bf16, w [out][in] bf16 (row
// major), y [rows][out] f32 when y_f32 else bf16.
cudaError_t launch_skinny_gemm(const void* x, const void* w, void* y, bool y_f32, int64_t rows,
                               int64_t in, int64_t out, cudaStream_t stream,
                               const SkinnyLaunch& how = {});

}  // namespace kvp::cuda::detail

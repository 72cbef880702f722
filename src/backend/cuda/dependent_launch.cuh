// Programmatic dependent launch (sm_90 and later), the device side. A kernel launched as a
// programmatic dependent of the one before it in the stream (the launch attribute
// cudaLaunchAttributeProgrammaticStreamSerialization) may start its CTAs as soon as every CTA of
// that one has called allow_dependents(), or exited; it does what does not depend on the earlier
// kernel (reading weights, prefetching them into L2) and then calls wait_for_prerequisites(),
// which returns once the earlier grid has completed and its writes are visible. Both are no-ops
// before sm_90 and for kernels launched normally, so a kernel may call them whatever launches it.
// Used by the decode step's matrix products (model/cuda/skinny_gemm.cu), whose weight reads need
// nothing from the kernel before them, by the kernels that precede them (norms, attention,
// activation), which let them start early, and by every kernel of a layer after them (qkv_post,
// the KV write, attention and its merge, residual_norm, gated_activation, row_summary): each
// waits first thing, so only its launch overlaps the end of the kernel before it.
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace kvp::cuda {

// Whether the current device runs programmatic dependent launches (compute capability 9+).
inline bool device_has_dependent_launch() {
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return major >= 9;
}

// kernel<<<grid, block, smem, stream>>>(args...), as a programmatic dependent of the kernel
// before it where `dependent` and the device allows; the kernel must call
// wait_for_prerequisites() before it reads what earlier kernels wrote or writes anything they read.
template <typename... Params, typename... Args>
cudaError_t launch_dependent(bool dependent, void (*kernel)(Params...), dim3 grid, dim3 block,
                             size_t smem, cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  if (dependent && device_has_dependent_launch()) {
    config.attrs = &attribute;
    config.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

__device__ __forceinline__ void allow_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void wait_for_prerequisites() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

}  // namespace kvp::cuda

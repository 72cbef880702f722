// Programmatic dependent launch (sm_90 and later), the device side. A kernel launched as a
// programmatic dependent of the one before it in the stream (the launch attribute
// cudaLaunchAttributeProgrammaticStreamSerialization) may start its CTAs as soon as every CTA of
// that one has called allow_dependents(), or exited; it does what does not depend on the earlier
// kernel (reading weights, prefetching them into L2) and then calls wait_for_prerequisites(),
// which returns once the earlier grid has completed and its writes are visible. Both are no-ops
// before sm_90 and for kernels launched normally, so a kernel may call them whatever launches it.
// Used by the decode step's matrix products (model/cuda/skinny_gemm.cu), whose weight reads need
// nothing from the kernel before them, and by the kernels that precede them (norms, attention,
// activation), which let them start early.
#pragma once

namespace kvp::cuda {

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

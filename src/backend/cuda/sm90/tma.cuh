// sm_90a only (.cu under backend/cuda/sm90): the tensor memory accelerator (TMA) and the
// shared-memory transaction barriers (mbarrier) it signals, as the Hopper attention kernels use
// them. One thread issues a tiled copy of a box of a global tensor (described by a CUtensorMap the
// host encoded, passed as a __grid_constant__ kernel parameter) into shared memory; the copy
// counts its bytes down on an mbarrier whose expected byte count a thread armed first; every
// thread that reads the data waits on the barrier's phase. Box elements outside the tensor (a
// negative coordinate, or one past its extent) arrive as zeros and still count their bytes.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace kvp::cuda::detail::sm90 {

__device__ __forceinline__ void mbarrier_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes the initialised barriers visible to the async proxy (the TMA unit) and the other threads
// (with the CTA barrier that follows).
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// Arrives (once) and adds `bytes` to the transactions the barrier's current phase waits for.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
// Arrives once (no transactions).
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Waits until the phase with parity `phase` has completed.
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t phase) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "wait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(bar),
      "r"(phase)
      : "memory");
}
// Copies the box at coordinates (c0, c1, c2) of a 3-D tensor into shared memory at dst (aligned
// as the map's swizzle requires), completing its bytes on barrier `bar`.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, uint32_t bar,
                                            int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

}  // namespace kvp::cuda::detail::sm90

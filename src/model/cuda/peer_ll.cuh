// The LL exchange of PeerAllReduce (peer_all_reduce.h), as device functions: PeerAllReduce's own
// kernel and the fused all-reduce + residual + norm of model_kernels.cu both use it.
//
//   ll_exchange(a, region, line, mine, epoch):  push lines [line, line + 2) of my floats (4) to
//   every peer's inbox, each float beside the epoch; pull_sum(...) then waits for the peers'
//   floats at the same lines and returns Σ over ranks in rank order (the same bits everywhere).
#pragma once

#include <cuda_runtime.h>

#include "model/cuda/peer_all_reduce_kernel.h"

namespace kvp::cuda::detail {

__device__ __forceinline__ void ll_store(PeerLine* p, float v0, float v1, uint32_t epoch) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p),
               "r"(__float_as_uint(v0)), "r"(epoch), "r"(__float_as_uint(v1)), "r"(epoch)
               : "memory");
}

// Waits until the line carries `epoch` in both halves; returns its two floats.
__device__ __forceinline__ float2 ll_wait(const PeerLine* p, uint32_t epoch) {
  uint32_t v0, f0, v1, f1;
  do {
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v0), "=r"(f0), "=r"(v1), "=r"(f1)
                 : "l"(p)
                 : "memory");
  } while (f0 != epoch || f1 != epoch);
  return make_float2(__uint_as_float(v0), __uint_as_float(v1));
}

// The first line of this call's parity: inbox regions are [parity][sender][lines].
__device__ __forceinline__ int64_t ll_region(const PeerAllReduceArgs& a, uint32_t epoch) {
  return a.lines * ((epoch & 1) * a.num_ranks);
}

// Sends `mine` (the 2 floats of line `line`) to every peer.
__device__ __forceinline__ void ll_push(const PeerAllReduceArgs& a, int64_t region, int64_t line,
                                        float2 mine, uint32_t epoch) {
  for (int32_t p = 0; p < a.num_ranks; ++p) {
    if (p != a.rank) ll_store(a.inbox[p] + region + a.rank * a.lines + line, mine.x, mine.y, epoch);
  }
}

// Σ over ranks, in rank order, of line `line`'s 2 floats (mine for my rank, the inbox's for the
// others, once they carry `epoch`).
__device__ __forceinline__ float2 ll_pull_sum(const PeerAllReduceArgs& a, int64_t region,
                                              int64_t line, float2 mine, uint32_t epoch) {
  float2 sum = make_float2(0.0f, 0.0f);
  for (int32_t r = 0; r < a.num_ranks; ++r) {
    const float2 v =
        r == a.rank ? mine : ll_wait(a.inbox[a.rank] + region + r * a.lines + line, epoch);
    sum.x += v.x;
    sum.y += v.y;
  }
  return sum;
}

}  // namespace kvp::cuda::detail

// PeerAllReduce's kernel (peer_all_reduce.h): a one-shot all-reduce in NCCL's LL style. Every
// block takes one chunk; its threads push their floats, each stored beside the call's epoch in
// one 8-byte word, straight into every peer's inbox, then read the peers' floats from their own
// inbox as their epochs appear, and sum in rank order. No fence and no separate flag: a float is
// there when its own flag is.
#include <algorithm>

#include "model/cuda/peer_all_reduce_kernel.h"

namespace kvp::cuda::detail {
namespace {

constexpr int32_t kLinesPerThread = static_cast<int32_t>(kPeerChunkFloats / 2 / kPeerThreads);

__device__ __forceinline__ void store_line(PeerLine* p, const PeerLine& l) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(l.value0),
               "r"(l.flag0), "r"(l.value1), "r"(l.flag1)
               : "memory");
}
__device__ __forceinline__ PeerLine load_line(const PeerLine* p) {
  PeerLine l;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(l.value0), "=r"(l.flag0), "=r"(l.value1), "=r"(l.flag1)
               : "l"(p)
               : "memory");
  return l;
}

__global__ void __launch_bounds__(kPeerThreads) peer_all_reduce_kernel(PeerAllReduceArgs a) {
  __shared__ uint32_t epoch_shared;
  const int64_t chunk = blockIdx.x;
  if (threadIdx.x == 0) epoch_shared = ++a.counters[chunk];
  __syncthreads();
  const uint32_t epoch = epoch_shared;
  const int64_t region = a.lines * ((epoch & 1) * a.num_ranks);  // this parity's regions
  const int64_t first_line = chunk * (kPeerChunkFloats / 2);
  float2 mine[kLinesPerThread];
  // push: line j of the chunk to every peer's inbox, region (parity, my rank)
#pragma unroll
  for (int32_t k = 0; k < kLinesPerThread; ++k) {
    const int64_t line = first_line + k * kPeerThreads + threadIdx.x;
    const int64_t i = 2 * line;
    mine[k].x = i < a.count ? a.data[i] : 0.0f;
    mine[k].y = i + 1 < a.count ? a.data[i + 1] : 0.0f;
    if (i >= a.count) continue;
    const PeerLine l{__float_as_uint(mine[k].x), epoch, __float_as_uint(mine[k].y), epoch};
    for (int32_t p = 0; p < a.num_ranks; ++p) {
      if (p != a.rank) store_line(a.inbox[p] + region + a.rank * a.lines + line, l);
    }
  }
  // pull from my own inbox, in rank order so that every rank sums the same floats the same way
#pragma unroll
  for (int32_t k = 0; k < kLinesPerThread; ++k) {
    const int64_t line = first_line + k * kPeerThreads + threadIdx.x;
    const int64_t i = 2 * line;
    if (i >= a.count) continue;
    float2 sum = make_float2(0.0f, 0.0f);
    for (int32_t r = 0; r < a.num_ranks; ++r) {
      float2 v = mine[k];
      if (r != a.rank) {
        const PeerLine* src = a.inbox[a.rank] + region + r * a.lines + line;
        PeerLine l = load_line(src);
        while (l.flag0 != epoch || l.flag1 != epoch) l = load_line(src);
        v = make_float2(__uint_as_float(l.value0), __uint_as_float(l.value1));
      }
      sum.x += v.x;
      sum.y += v.y;
    }
    a.data[i] = sum.x;
    if (i + 1 < a.count) a.data[i + 1] = sum.y;
  }
}

}  // namespace

cudaError_t launch_peer_all_reduce(const PeerAllReduceArgs& args, cudaStream_t stream) {
  if (args.count == 0) return cudaSuccess;
  const auto chunks = static_cast<unsigned>((args.count + kPeerChunkFloats - 1) / kPeerChunkFloats);
  peer_all_reduce_kernel<<<chunks, kPeerThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace kvp::cuda::detail

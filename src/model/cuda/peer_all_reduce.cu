// PeerAllReduce's kernel (peer_all_reduce.h): a one-shot all-reduce in NCCL's LL style
// (peer_ll.cuh). Every block takes one chunk; its threads push their floats, each stored beside the
// call's epoch in one 8-byte word, straight into every peer's inbox, then read the peers' floats
// from their own inbox as their epochs appear, and sum in rank order. No fence and no separate
// flag: a float is there when its own flag is.
#include <algorithm>

#include "model/cuda/peer_ll.cuh"

namespace kvp::cuda::detail {
namespace {

constexpr int32_t kLinesPerThread = static_cast<int32_t>(kPeerChunkFloats / 2 / kPeerThreads);

__global__ void __launch_bounds__(kPeerThreads) peer_all_reduce_kernel(PeerAllReduceArgs a) {
  __shared__ uint32_t epoch_shared;
  const int64_t chunk = blockIdx.x;
  if (threadIdx.x == 0) epoch_shared = ++a.counters[chunk];
  __syncthreads();
  const uint32_t epoch = epoch_shared;
  const int64_t region = ll_region(a, epoch);
  const int64_t first_line = chunk * (kPeerChunkFloats / 2);
  float2 mine[kLinesPerThread];
#pragma unroll
  for (int32_t k = 0; k < kLinesPerThread; ++k) {
    const int64_t line = first_line + k * kPeerThreads + threadIdx.x;
    const int64_t i = 2 * line;
    mine[k].x = i < a.count ? a.data[i] : 0.0f;
    mine[k].y = i + 1 < a.count ? a.data[i + 1] : 0.0f;
    if (i < a.count) ll_push(a, region, line, mine[k], epoch);
  }
#pragma unroll
  for (int32_t k = 0; k < kLinesPerThread; ++k) {
    const int64_t line = first_line + k * kPeerThreads + threadIdx.x;
    const int64_t i = 2 * line;
    if (i >= a.count) continue;
    const float2 sum = ll_pull_sum(a, region, line, mine[k], epoch);
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

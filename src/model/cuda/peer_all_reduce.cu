// PeerAllReduce's kernel (peer_all_reduce.h): one block per slice of the data, each block meeting
// the same block of every peer through flags in the peers' memory.
#include <algorithm>

#include "model/cuda/peer_all_reduce_kernel.h"

namespace kvp::cuda::detail {
namespace {

__device__ __forceinline__ void store_release(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t load_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__global__ void peer_all_reduce_kernel(PeerAllReduceArgs a) {
  __shared__ uint32_t epoch_shared;
  const int32_t block = blockIdx.x;
  const int64_t per = (a.count + gridDim.x - 1) / gridDim.x;
  const int64_t begin = std::min<int64_t>(a.count, block * per);
  const int64_t end = std::min<int64_t>(a.count, begin + per);
  if (threadIdx.x == 0) epoch_shared = ++a.counters[block];
  __syncthreads();
  const uint32_t epoch = epoch_shared;
  const int64_t half = (epoch & 1) * a.capacity;
  float* mine = a.staging[a.rank] + half;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) mine[i] = a.data[i];
  __syncthreads();  // this block's slice is written…
  if (threadIdx.x < a.num_ranks && threadIdx.x != a.rank) {
    __threadfence_system();  // …and visible to the peers before they see the flag
    store_release(a.flags[threadIdx.x] + block * kPeerMaxRanks + a.rank, epoch);
    const uint32_t* theirs = a.flags[a.rank] + block * kPeerMaxRanks + threadIdx.x;
    while (load_acquire(theirs) < epoch) {
    }
  }
  __syncthreads();  // every peer's slice of this block is written
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    float sum = 0.0f;
    for (int32_t r = 0; r < a.num_ranks; ++r) sum += __ldcv(a.staging[r] + half + i);
    a.data[i] = sum;
  }
}

}  // namespace

cudaError_t launch_peer_all_reduce(const PeerAllReduceArgs& args, cudaStream_t stream) {
  if (args.count == 0) return cudaSuccess;
  // ~8K floats a block: 1 block at batch 1 (hidden 4096), all 64 from 512K floats on
  const auto blocks =
      static_cast<unsigned>(std::clamp<int64_t>((args.count + 8191) / 8192, 1, kPeerMaxBlocks));
  peer_all_reduce_kernel<<<blocks, 512, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace kvp::cuda::detail

// The kernel of PeerAllReduce (peer_all_reduce.h) and its arguments: plain C++17 for nvcc
// (peer_all_reduce.cu includes only this).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvp::cuda::detail {

constexpr int32_t kPeerMaxRanks = 8;
constexpr int32_t kPeerMaxBlocks = 64;
struct PeerAllReduceArgs {
  float* data = nullptr;
  int64_t count = 0;
  int32_t rank = 0, num_ranks = 0;
  int64_t capacity = 0;                 // floats of one parity half of a staging buffer
  float* staging[kPeerMaxRanks] = {};   // every rank's [2][capacity]
  uint32_t* flags[kPeerMaxRanks] = {};  // every rank's [kPeerMaxBlocks][kPeerMaxRanks]
  uint32_t* counters = nullptr;         // mine [kPeerMaxBlocks]
};
cudaError_t launch_peer_all_reduce(const PeerAllReduceArgs& args, cudaStream_t stream);

}  // namespace kvp::cuda::detail

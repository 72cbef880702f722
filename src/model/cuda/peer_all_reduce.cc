// PeerAllReduce (peer_all_reduce.h): buffers, peer access, the launch.
#include "model/cuda/peer_all_reduce.h"

#include <algorithm>

#include "backend/cuda/cuda_status.h"

namespace kvp::cuda {

Result<std::shared_ptr<PeerAllReduce>> PeerAllReduce::create(std::span<const int> devices,
                                                             int64_t capacity) {
  const auto n = static_cast<int32_t>(devices.size());
  if (n < 2 || n > detail::kPeerMaxRanks) {
    return Status::invalid_argument("peer all-reduce over {} GPUs (2 to {})", n,
                                    detail::kPeerMaxRanks);
  }
  auto p = std::shared_ptr<PeerAllReduce>(new PeerAllReduce());
  p->capacity_ = std::min(capacity, detail::kPeerMaxChunks * detail::kPeerChunkFloats);
  const int64_t lines = (p->capacity_ + 1) / 2;
  p->devices_.assign(devices.begin(), devices.end());
  for (int32_t r = 0; r < n; ++r) {
    KVP_CUDA_RETURN_IF_ERROR(cudaSetDevice(devices[r]));
    for (int32_t q = 0; q < n; ++q) {
      if (q == r) continue;
      int can = 0;
      KVP_CUDA_RETURN_IF_ERROR(cudaDeviceCanAccessPeer(&can, devices[r], devices[q]));
      if (can == 0) {
        return Status::unsupported("cuda:{} cannot access cuda:{}'s memory (no peer access)",
                                   devices[r], devices[q]);
      }
      const cudaError_t e = cudaDeviceEnablePeerAccess(devices[q], 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();
      } else {
        KVP_CUDA_RETURN_IF_ERROR(e);
      }
    }
    const size_t inbox_bytes = size_t{2} * n * lines * sizeof(detail::PeerLine);
    const size_t counter_bytes = size_t{detail::kPeerMaxChunks} * 4;
    for (auto [inboxes, counters] :
         {std::pair{&p->inboxes_, &p->counters_}, std::pair{&p->row_inboxes_, &p->row_counters_}}) {
      KVP_ASSIGN_OR_RETURN(DeviceBuffer inbox, DeviceBuffer::allocate(inbox_bytes));
      KVP_ASSIGN_OR_RETURN(DeviceBuffer counter, DeviceBuffer::allocate(counter_bytes));
      // epochs start at 1: a zeroed inbox holds none
      KVP_CUDA_RETURN_IF_ERROR(cudaMemset(inbox.data(), 0, inbox_bytes));
      KVP_CUDA_RETURN_IF_ERROR(cudaMemset(counter.data(), 0, counter_bytes));
      inboxes->push_back(std::move(inbox));
      counters->push_back(std::move(counter));
    }
  }
  for (int32_t r = 0; r < n; ++r) {
    KVP_CUDA_RETURN_IF_ERROR(cudaSetDevice(devices[r]));
    KVP_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  }
  return p;
}

detail::PeerAllReduceArgs PeerAllReduce::args(int32_t rank,
                                              const std::vector<DeviceBuffer>& inboxes,
                                              const std::vector<DeviceBuffer>& counters) const {
  detail::PeerAllReduceArgs a;
  a.rank = rank;
  a.num_ranks = static_cast<int32_t>(devices_.size());
  a.lines = (capacity_ + 1) / 2;
  for (int32_t r = 0; r < a.num_ranks; ++r) a.inbox[r] = inboxes[r].as<detail::PeerLine>();
  a.counters = counters[rank].as<uint32_t>();
  return a;
}

detail::PeerAllReduceArgs PeerAllReduce::row_args(int32_t rank) const {
  return args(rank, row_inboxes_, row_counters_);
}

Status PeerAllReduce::run(int32_t rank, float* data, int64_t count, cudaStream_t stream) const {
  detail::PeerAllReduceArgs a = args(rank, inboxes_, counters_);
  a.data = data;
  a.count = count;
  return cuda_status(detail::launch_peer_all_reduce(a, stream), "peer_all_reduce_kernel");
}

}  // namespace kvp::cuda

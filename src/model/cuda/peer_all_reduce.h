// PeerAllReduce: the small all-reduces of a split model's steps done by one kernel per GPU over
// NVLink peer memory instead of NCCL, which costs ~15-20 µs a call at 16 KB on 2 H200s
// (docs/perf/tensor-parallel.md) and is paid twice a layer.
//
//   per call, rank r, on its stream (graph-capturable; one launch, one block per 2048 floats):
//     epoch = ++counter[chunk]            (in device memory: graph replays advance it too)
//     push: (float, epoch) pairs, 8 bytes each → every peer's inbox[parity][r]   (no fence)
//     pull: wait for each of my inbox[parity][p]'s pairs to carry the epoch, then
//           data = Σ_p data_p in rank order   (every rank gets the same bits)
//   parity = epoch & 1: a call never overwrites what a peer may still read from the previous
//   one (a rank reaches call k + 2 only after every peer has sent its data of call k + 1,
//   which each sends after finishing call k).
//
// The runner fuses the all-reduce with the residual add and RMS norm after it (row_args →
// detail::launch_residual_norm: one row a chunk, the same exchange, peer_ll.cuh), so a split
// decode step launches no kernel of its own for the all-reduce.
//
// NCCL's LL protocol is the model: the flag travels in the same 8-byte store as the data. The
// inbox is twice the bytes of the data (a flag per float), which is cheap at decode sizes; calls
// above capacity() floats go to NCCL. All ranks must make the same calls in the same order (the
// runner does: every rank runs the same step). Needs peer access between every pair of the GPUs
// (NVLink or PCIe P2P); create() says unsupported where there is none.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/cuda/device_buffer.h"
#include "common/status.h"
#include "model/cuda/peer_all_reduce_kernel.h"

namespace kvp::cuda {

class PeerAllReduce {
 public:
  // Buffers on each device of `devices` (one rank each, in order), peer access enabled between
  // them. capacity: floats of the largest call it takes (at most 2M; larger is clamped).
  static Result<std::shared_ptr<PeerAllReduce>> create(std::span<const int> devices,
                                                       int64_t capacity);

  int64_t capacity() const { return capacity_; }
  // Sums data [count] over the ranks in place, on rank's stream. requires: count <= capacity(),
  // the calling thread's current device is rank's.
  Status run(int32_t rank, float* data, int64_t count, cudaStream_t stream) const;
  // The arguments of the fused all-reduce + residual + norm (detail::launch_residual_norm), whose
  // chunks are rows: a second inbox and counters of their own, so that the two kinds of call
  // may follow each other in any order.
  detail::PeerAllReduceArgs row_args(int32_t rank) const;

 private:
  int64_t capacity_ = 0;
  std::vector<int> devices_;
  detail::PeerAllReduceArgs args(int32_t rank, const std::vector<DeviceBuffer>& inboxes,
                                 const std::vector<DeviceBuffer>& counters) const;

  // [rank]; the row_ ones for row_args' calls
  std::vector<DeviceBuffer> inboxes_, counters_, row_inboxes_, row_counters_;
};

}  // namespace kvp::cuda

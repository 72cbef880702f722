// PeerAllReduce: the small all-reduces of a split model's decode steps done by one kernel per GPU
// over NVLink peer memory instead of NCCL, which costs ~15-20 µs a call at 16 KB on 2 H200s
// (docs/perf/tensor-parallel.md) and is paid twice a layer.
//
//   per call, rank r, on its stream (graph-capturable; one launch):
//     copy data → my staging[parity]  → release: flag[peer][block][r] = epoch on every peer
//     → acquire: wait until flag[me][block][p] >= epoch for every peer p
//     → data = Σ_p staging_p[parity] in rank order (every rank gets the same bits)
//   epoch: a per-block counter in device memory, so CUDA graph replays advance it too; the
//   staging halves alternate by epoch parity, so a call never overwrites what a peer may still
//   read from the previous one.
//
// Calls above capacity() floats go to NCCL. All ranks must make the same calls in the same order
// (the runner does: every rank runs the same step). Needs peer access between every pair of the
// GPUs (NVLink or PCIe P2P); create() says unsupported where there is none.
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
  // them. capacity: floats of the largest call it takes.
  static Result<std::shared_ptr<PeerAllReduce>> create(std::span<const int> devices,
                                                       int64_t capacity);

  int64_t capacity() const { return capacity_; }
  // Sums data [count] over the ranks in place, on rank's stream. requires: count <= capacity(),
  // the calling thread's current device is rank's.
  Status run(int32_t rank, float* data, int64_t count, cudaStream_t stream) const;

 private:
  int64_t capacity_ = 0;
  std::vector<int> devices_;
  std::vector<DeviceBuffer> staging_, flags_, counters_;  // [rank]
};

}  // namespace kvp::cuda

// DeviceSampler: the host side of the CUDA sampler (sampler_kernels.h) for one stream. It owns
// the pinned staging and device buffers of a step's sample requests and results.
//
//   check (host) ─▶ reserve (grow buffers; may synchronize the stream)
//   ─▶ enqueue: requests | penalties | masked packed into pinned staging, one upload, the
//      kernel over the device logits, one download of [requests] DeviceSample (172 bytes each)
//   ─▶ (caller synchronizes the stream) ─▶ read_results
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>

#include "backend/cuda/device_buffer.h"
#include "common/status.h"
#include "model/forward_backend.h"

namespace kvp::cuda {

class DeviceSampler {
 public:
  // invalid_argument unless every request reads a row < num_rows, its ranges lie in the batch's
  // lists, every id is < vocab, penalty ids are distinct per request, num_logprobs in
  // [0, kMaxDeviceLogprobs], and num_results == requests.
  static Status check(const DeviceSampleBatch& batch, int32_t num_rows, int32_t vocab,
                      size_t num_results);
  // Grows the buffers for `batch` (synchronizing `stream` first when it must).
  Status reserve(const DeviceSampleBatch& batch, int32_t vocab, cudaStream_t stream);
  // Enqueues upload, kernel and download on `stream`; logits [rows][vocab] f32 on the device.
  // requires: reserve(batch) since the last change of size; the stream synchronized since the
  // last enqueue (the staging is reused).
  Status enqueue(const float* logits, int32_t vocab, const DeviceSampleBatch& batch,
                 cudaStream_t stream);
  // After the stream is synchronized: the results of the last enqueue.
  void read_results(std::span<DeviceSample> results) const;

 private:
  size_t staging_bytes(const DeviceSampleBatch& batch) const;

  PinnedBuffer staging_host_;  // requests | penalties | masked (8-aligned sections)
  DeviceBuffer staging_device_;
  DeviceBuffer scratch_;  // [requests][vocab] f32
  DeviceBuffer results_device_;
  PinnedBuffer results_host_;
  size_t num_results_ = 0;
};

}  // namespace kvp::cuda

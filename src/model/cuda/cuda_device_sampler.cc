#include "model/cuda/cuda_device_sampler.h"

#include <algorithm>
#include <cstring>
#include <unordered_set>

#include "backend/cuda/cuda_status.h"
#include "model/cuda/sampler_kernels.h"

namespace kvp::cuda {
namespace {

size_t align8(size_t n) { return (n + 7) & ~size_t{7}; }

}  // namespace

Status DeviceSampler::check(const DeviceSampleBatch& batch, int32_t num_rows, int32_t vocab,
                            size_t num_results) {
  if (num_results != batch.requests.size()) {
    return Status::invalid_argument("device sampling: {} results for {} requests", num_results,
                                    batch.requests.size());
  }
  for (int32_t t : batch.masked) {
    if (t < 0 || t >= vocab) {
      return Status::invalid_argument("device sampling: masked id {} outside the vocabulary of {}",
                                      t, vocab);
    }
  }
  std::unordered_set<int32_t> ids;
  for (const DeviceSampleRequest& r : batch.requests) {
    if (r.logit_row < 0 || r.logit_row >= num_rows) {
      return Status::invalid_argument("device sampling: logit row {} outside the {} rows",
                                      r.logit_row, num_rows);
    }
    if (r.num_logprobs < 0 || r.num_logprobs > kMaxDeviceLogprobs) {
      return Status::invalid_argument("device sampling: {} logprobs (at most {})", r.num_logprobs,
                                      kMaxDeviceLogprobs);
    }
    if (!(r.temperature >= 0.0f) || !(r.u >= 0.0 && r.u < 1.0)) {
      return Status::invalid_argument("device sampling: temperature {} or u {} out of range",
                                      r.temperature, r.u);
    }
    const auto in = [](int32_t begin, int32_t count, size_t size) {
      return begin >= 0 && count >= 0 && size_t(begin) + size_t(count) <= size;
    };
    if (!in(r.penalty_begin, r.penalty_count, batch.penalties.size()) ||
        !in(r.mask_begin, r.mask_count, batch.masked.size())) {
      return Status::invalid_argument("device sampling: a penalty or mask range outside its list");
    }
    ids.clear();
    for (int32_t e = 0; e < r.penalty_count; ++e) {
      const int32_t t = batch.penalties[size_t(r.penalty_begin + e)].token_id;
      if (t < 0 || t >= vocab || !ids.insert(t).second) {
        return Status::invalid_argument(
            "device sampling: penalty id {} outside the vocabulary of {} or repeated", t, vocab);
      }
    }
  }
  return Status::ok();
}

size_t DeviceSampler::staging_bytes(const DeviceSampleBatch& batch) const {
  return align8(batch.requests.size() * sizeof(DeviceSampleRequest)) +
         align8(batch.penalties.size() * sizeof(PenaltyToken)) +
         align8(batch.masked.size() * sizeof(int32_t));
}

Status DeviceSampler::reserve(const DeviceSampleBatch& batch, int32_t vocab, cudaStream_t stream) {
  const size_t n = batch.requests.size();
  const size_t staging = staging_bytes(batch);
  const size_t scratch = n * size_t(vocab) * sizeof(float);
  const size_t results = n * sizeof(DeviceSample);
  if (staging <= staging_host_.size_bytes() && scratch <= scratch_.size_bytes() &&
      results <= results_device_.size_bytes()) {
    return Status::ok();
  }
  KVP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));  // the old buffers may be in use
  if (staging > staging_host_.size_bytes()) {
    const size_t bytes = std::max<size_t>(2 * staging, 4096);
    KVP_ASSIGN_OR_RETURN(staging_host_, PinnedBuffer::allocate(bytes));
    KVP_ASSIGN_OR_RETURN(staging_device_, DeviceBuffer::allocate(bytes));
  }
  if (scratch > scratch_.size_bytes()) {
    KVP_ASSIGN_OR_RETURN(scratch_, DeviceBuffer::allocate(std::max<size_t>(n, 8) * vocab * 4));
  }
  if (results > results_device_.size_bytes()) {
    const size_t bytes = std::max<size_t>(n, 8) * sizeof(DeviceSample);
    KVP_ASSIGN_OR_RETURN(results_device_, DeviceBuffer::allocate(bytes));
    KVP_ASSIGN_OR_RETURN(results_host_, PinnedBuffer::allocate(bytes));
  }
  return Status::ok();
}

Status DeviceSampler::enqueue(const float* logits, int32_t vocab, const DeviceSampleBatch& batch,
                              cudaStream_t stream) {
  num_results_ = batch.requests.size();
  if (num_results_ == 0) return Status::ok();
  const size_t req_bytes = align8(batch.requests.size() * sizeof(DeviceSampleRequest));
  const size_t pen_bytes = align8(batch.penalties.size() * sizeof(PenaltyToken));
  auto* host = staging_host_.as<std::byte>();
  std::memcpy(host, batch.requests.data(), batch.requests.size() * sizeof(DeviceSampleRequest));
  std::memcpy(host + req_bytes, batch.penalties.data(),
              batch.penalties.size() * sizeof(PenaltyToken));
  std::memcpy(host + req_bytes + pen_bytes, batch.masked.data(),
              batch.masked.size() * sizeof(int32_t));
  KVP_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(staging_device_.data(), host, staging_bytes(batch),
                                           cudaMemcpyHostToDevice, stream));
  auto* dev = staging_device_.as<std::byte>();
  KVP_CUDA_RETURN_IF_ERROR(
      detail::launch_sample_rows(logits, vocab, reinterpret_cast<const DeviceSampleRequest*>(dev),
                                 static_cast<int32_t>(batch.requests.size()),
                                 reinterpret_cast<const PenaltyToken*>(dev + req_bytes),
                                 reinterpret_cast<const int32_t*>(dev + req_bytes + pen_bytes),
                                 scratch_.as<float>(), results_device_.as<DeviceSample>(), stream));
  KVP_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(results_host_.data(), results_device_.data(),
                                           num_results_ * sizeof(DeviceSample),
                                           cudaMemcpyDeviceToHost, stream));
  return Status::ok();
}

void DeviceSampler::read_results(std::span<DeviceSample> results) const {
  const size_t n = std::min(results.size(), num_results_);
  if (n > 0) std::memcpy(results.data(), results_host_.data(), n * sizeof(DeviceSample));
}

}  // namespace kvp::cuda

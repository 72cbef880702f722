// Launcher of the CUDA sampler (sampler_kernels.cu), callable from plain C++; returns
// cudaGetLastError() after the launch. Records and data flow: model/device_sample.h.
//
// Per request r (one CTA of 1024 threads): row = logits[requests[r].logit_row]; scratch row r =
// row with repetition/presence/frequency penalties (penalties[penalty_begin ..]), masked ids
// set to -inf, times 1/temperature; then the top-k boundary by a radix select over the values'
// ordered bits (k-th largest, ties by lower id as the CPU's nth_element order), the top-p
// boundary by a radix select over probability mass (the first token, most likely first, where
// the kept mass reaches top_p of the top-k set), min-p against the most likely token, and the
// draw: the first kept token in id order whose running mass exceeds u * kept mass (the CPU
// sampler walks the same order, so one u picks the same token on both up to rounding).
// Logprobs come from the raw row (log_softmax), as on the CPU.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "model/device_sample.h"

namespace kvp::cuda::detail {

// logits [rows][vocab] f32 (device); requests [num_requests], penalties, masked (device);
// scratch [num_requests][vocab] f32 (device, overwritten); results [num_requests] (device).
// requires: every logit_row, penalty and mask range and token id in range (checked on the host).
cudaError_t launch_sample_rows(const float* logits, int32_t vocab,
                               const DeviceSampleRequest* requests, int32_t num_requests,
                               const PenaltyToken* penalties, const int32_t* masked, float* scratch,
                               DeviceSample* results, cudaStream_t stream);

}  // namespace kvp::cuda::detail

// The records of sampling on the device (ForwardBackend::forward_sampled): what the host asks
// for one sampled token and what comes back. Plain structs shared by the host code (C++20) and
// the CUDA sampler kernels (model/cuda/sampler_kernels.cu, compiled as C++17 without fmt).
//
//   host: engine/device_sampling.cc builds a DeviceSampleRequest per sampled token (penalty list
//         from its TokenHistory, EOS/stop masks under min_tokens, u drawn from its SamplerRng)
//   device: one CTA per request reads its logits row, applies penalties, masks, temperature,
//         top-k, top-p and min-p, and draws the token at u of the kept mass (id order)
//   back: one DeviceSample per request (the id, its raw logprob, the top-n raw logprobs)
#pragma once

#include <cstdint>

namespace kvp {

inline constexpr int32_t kMaxDeviceLogprobs = 20;

// A token the sequence has seen (prompt or output): repetition penalty applies to every entry,
// presence and frequency penalties to entries with output_count > 0. One entry per distinct id.
struct PenaltyToken {
  int32_t token_id = 0;
  int32_t output_count = 0;  // occurrences in the output so far
};

struct DeviceSampleRequest {
  int32_t logit_row = 0;     // index into ForwardBatch::logit_rows (requests may share a row)
  float temperature = 1.0f;  // 0: argmax of the penalised, masked row (u unused)
  int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int32_t num_logprobs = 0;                      // 0..kMaxDeviceLogprobs
  int32_t penalty_begin = 0, penalty_count = 0;  // into the batch's PenaltyToken list
  int32_t mask_begin = 0, mask_count = 0;        // into the batch's masked ids (set to -inf)
  int32_t pad = 0;
  double u = 0.0;  // uniform in [0, 1), drawn on the host from the sequence's SamplerRng
};

struct DeviceSample {
  int32_t token_id = 0;
  float logprob = 0.0f;  // of token_id under log_softmax(raw logits)
  int32_t num_top = 0;   // entries of top_ids / top_logprobs, most likely first
  int32_t top_ids[kMaxDeviceLogprobs] = {};
  float top_logprobs[kMaxDeviceLogprobs] = {};
};

}  // namespace kvp

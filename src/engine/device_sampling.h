// The engine's side of sampling on the device (ForwardBackend::forward_sampled): turning one
// sequence's sampling parameters, TokenHistory, min_tokens masks and SamplerRng into a
// DeviceSampleRequest, and the DeviceSample that comes back into a SampledToken.
//
//   Engine::step ─▶ add_device_sample (penalty list: the distinct seen ids with their output
//   counts, only those the parameters use; u: one draw from the sequence's rng when
//   temperature > 0, as sample_token draws) ─▶ backend samples ─▶ to_sampled_token
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/sampler.h"
#include "model/forward_backend.h"

namespace kvp {

// The penalty entries the parameters need, ascending ids: every seen id (prompt or output) with
// its output count when repetition_penalty != 1; else the output's ids when a presence or
// frequency penalty is set; else none.
std::vector<PenaltyToken> penalty_tokens(const SamplingParams& params, const TokenHistory& history);

// Appends one request for logits row `logit_row` to `batch`; `masked` ids (EOS and stop ids under
// min_tokens) are set to -inf before sampling. Advances `rng` by one draw unless greedy.
// requires: validate_sampling_params(params).is_ok().
void add_device_sample(const SamplingParams& params, const TokenHistory& history,
                       std::span<const int32_t> masked, int32_t logit_row, SamplerRng& rng,
                       DeviceSampleBatch* batch);

SampledToken to_sampled_token(const DeviceSample& sample);

// The ids a sequence may not sample yet: EOS and stop ids while num_generated < min_tokens
// (repeats kept: setting -inf twice is harmless), else none.
std::vector<int32_t> min_tokens_mask(std::span<const int32_t> eos_ids,
                                     std::span<const int32_t> stop_ids, int32_t num_generated,
                                     int32_t min_tokens);

}  // namespace kvp

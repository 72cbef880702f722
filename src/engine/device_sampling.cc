#include "engine/device_sampling.h"

#include <algorithm>

namespace kvp {

std::vector<PenaltyToken> penalty_tokens(const SamplingParams& p, const TokenHistory& history) {
  std::vector<PenaltyToken> out;
  if (p.repetition_penalty != 1.0f) {
    out.reserve(history.seen_tokens().size());
    for (int32_t t : history.seen_tokens()) out.push_back({t, history.output_count(t)});
  } else if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    out.reserve(history.output_counts().size());
    for (const auto& [t, count] : history.output_counts()) out.push_back({t, count});
  }
  std::sort(out.begin(), out.end(),
            [](const PenaltyToken& a, const PenaltyToken& b) { return a.token_id < b.token_id; });
  return out;
}

void add_device_sample(const SamplingParams& p, const TokenHistory& history,
                       std::span<const int32_t> masked, int32_t logit_row, SamplerRng& rng,
                       DeviceSampleBatch* batch) {
  DeviceSampleRequest r;
  r.logit_row = logit_row;
  r.temperature = p.temperature;
  r.top_k = p.top_k;
  r.top_p = p.top_p;
  r.min_p = p.min_p;
  r.repetition_penalty = p.repetition_penalty;
  r.presence_penalty = p.presence_penalty;
  r.frequency_penalty = p.frequency_penalty;
  r.num_logprobs = p.num_logprobs;
  const std::vector<PenaltyToken> penalties = penalty_tokens(p, history);
  r.penalty_begin = static_cast<int32_t>(batch->penalties.size());
  r.penalty_count = static_cast<int32_t>(penalties.size());
  batch->penalties.insert(batch->penalties.end(), penalties.begin(), penalties.end());
  r.mask_begin = static_cast<int32_t>(batch->masked.size());
  r.mask_count = static_cast<int32_t>(masked.size());
  batch->masked.insert(batch->masked.end(), masked.begin(), masked.end());
  r.u = p.temperature > 0.0f ? sampler_uniform(rng) : 0.0;
  batch->requests.push_back(r);
}

SampledToken to_sampled_token(const DeviceSample& s) {
  SampledToken t;
  t.token_id = s.token_id;
  t.logprob = s.logprob;
  const int32_t n = std::clamp(s.num_top, 0, kMaxDeviceLogprobs);
  t.top_logprobs.reserve(n);
  for (int32_t i = 0; i < n; ++i) t.top_logprobs.push_back({s.top_ids[i], s.top_logprobs[i]});
  return t;
}

std::vector<int32_t> min_tokens_mask(std::span<const int32_t> eos_ids,
                                     std::span<const int32_t> stop_ids, int32_t num_generated,
                                     int32_t min_tokens) {
  std::vector<int32_t> out;
  if (num_generated >= min_tokens) return out;
  out.assign(eos_ids.begin(), eos_ids.end());
  out.insert(out.end(), stop_ids.begin(), stop_ids.end());
  return out;
}

}  // namespace kvp

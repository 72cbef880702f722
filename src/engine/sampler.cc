#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>

#include "engine/sampler_kernels.h"

namespace kvp {

Status validate_sampling_params(const SamplingParams& p) {
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature)) {
    return Status::invalid_argument("sampling: temperature {} must be a finite value >= 0",
                                    p.temperature);
  }
  if (p.top_k < 0) return Status::invalid_argument("sampling: top_k {} must be >= 0", p.top_k);
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
    return Status::invalid_argument("sampling: top_p {} must be in (0, 1]", p.top_p);
  }
  if (!(p.min_p >= 0.0f && p.min_p < 1.0f)) {
    return Status::invalid_argument("sampling: min_p {} must be in [0, 1)", p.min_p);
  }
  if (!(p.repetition_penalty > 0.0f) || !std::isfinite(p.repetition_penalty)) {
    return Status::invalid_argument("sampling: repetition_penalty {} must be > 0",
                                    p.repetition_penalty);
  }
  if (!(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f)) {
    return Status::invalid_argument("sampling: presence_penalty {} must be in [-2, 2]",
                                    p.presence_penalty);
  }
  if (!(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f)) {
    return Status::invalid_argument("sampling: frequency_penalty {} must be in [-2, 2]",
                                    p.frequency_penalty);
  }
  if (p.num_logprobs < 0 || p.num_logprobs > 20) {
    return Status::invalid_argument("sampling: num_logprobs {} must be in [0, 20]", p.num_logprobs);
  }
  return Status::ok();
}

TokenHistory::TokenHistory(std::span<const int32_t> prompt_tokens) {
  for (int32_t t : prompt_tokens) {
    if (seen_.emplace(t, true).second) seen_list_.push_back(t);
  }
}

void TokenHistory::add_output(int32_t token_id) {
  ++output_counts_[token_id];
  if (seen_.emplace(token_id, true).second) seen_list_.push_back(token_id);
}

int32_t TokenHistory::output_count(int32_t token_id) const {
  auto it = output_counts_.find(token_id);
  return it == output_counts_.end() ? 0 : it->second;
}

bool TokenHistory::seen(int32_t token_id) const { return seen_.contains(token_id); }

namespace {

// Logits after repetition, presence and frequency penalties (temperature not applied).
std::vector<float> penalized_logits(std::span<const float> logits, const SamplingParams& p,
                                    const TokenHistory& history) {
  std::vector<float> out(logits.begin(), logits.end());
  [[maybe_unused]] const auto vocab_size = static_cast<int64_t>(out.size());
  if (p.repetition_penalty != 1.0f) {
    for (int32_t t : history.seen_tokens()) {
      KVP_DCHECK(t >= 0 && t < vocab_size, "token {} outside vocab {}", t, vocab_size);
      float& l = out[t];
      l = l > 0.0f ? l / p.repetition_penalty : l * p.repetition_penalty;
    }
  }
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    for (const auto& [t, count] : history.output_counts()) {
      KVP_DCHECK(t >= 0 && t < vocab_size, "token {} outside vocab {}", t, vocab_size);
      out[t] -= p.presence_penalty + p.frequency_penalty * static_cast<float>(count);
    }
  }
  return out;
}

struct Candidate {
  int32_t token_id;
  float prob;
};

// The kept candidates with unnormalised probabilities (relative to the most likely token's 1),
// in id order. Sampling walks them in that order, as the CUDA sampler does
// (model/cuda/sampler_kernels.cu), so one uniform draw picks the same token on both.
std::vector<Candidate> truncated_candidates(std::span<const float> logits, const SamplingParams& p,
                                            const TokenHistory& history) {
  std::vector<float> scaled = penalized_logits(logits, p, history);
  const float inv_t = 1.0f / p.temperature;
  for (float& l : scaled) l *= inv_t;

  const auto vocab_size = static_cast<int32_t>(scaled.size());
  auto more_likely = [&](int32_t a, int32_t b) {
    return scaled[a] > scaled[b] || (scaled[a] == scaled[b] && a < b);
  };
  auto by_id = [](const Candidate& a, const Candidate& b) { return a.token_id < b.token_id; };
  std::vector<int32_t> ids;  // top-k's survivors (first num_kept); empty without top-k
  int32_t num_kept = vocab_size;
  if (p.top_k > 0 && p.top_k < vocab_size) {
    ids.resize(vocab_size);
    std::iota(ids.begin(), ids.end(), 0);
    std::nth_element(ids.begin(), ids.begin() + p.top_k, ids.end(), more_likely);
    num_kept = p.top_k;
  }
  // The most likely survivor; with top-k, the unnormalised mass of the survivors.
  float max_logit = -std::numeric_limits<float>::infinity();
  double total = 0.0;
  if (num_kept == vocab_size) {
    max_logit = sampler_kernels::max_value(scaled);
  } else {
    for (int32_t i = 0; i < num_kept; ++i) max_logit = std::max(max_logit, scaled[ids[i]]);
    for (int32_t i = 0; i < num_kept; ++i) total += std::exp(double(scaled[ids[i]]) - max_logit);
  }

  std::vector<Candidate> kept;
  if (p.top_p < 1.0f && num_kept == vocab_size) {
    // Top-p over the whole vocabulary, without sorting it: bucket the tokens by how much less
    // likely they are than the best (max_logit - logit, monotone in the logit), add up each
    // bucket's mass, and sort only the bucket where the running mass reaches top_p. The kept set
    // is the one a full most-likely-first sort would keep.
    constexpr int32_t kBuckets = 2048;
    constexpr float kRange = 87.0f;  // beyond it exp() is below float's normal range
    std::vector<float> probs(scaled.size());
    sampler_kernels::exp_shifted(scaled, max_logit, probs);
    std::vector<uint16_t> bucket_of(scaled.size());
    std::vector<double> bucket_mass(kBuckets, 0.0);
    double all_mass = 0.0;
    for (int32_t i = 0; i < vocab_size; ++i) {
      const float gap = (max_logit - scaled[i]) * (kBuckets / kRange);
      const int32_t b = gap < float(kBuckets - 1) ? static_cast<int32_t>(gap) : kBuckets - 1;
      bucket_of[i] = static_cast<uint16_t>(b);  // NaN logits land in the last bucket
      bucket_mass[b] += probs[i];
      all_mass += probs[i];
    }
    const double target = p.top_p * all_mass;
    double mass = 0.0;
    int32_t last = 0;  // the bucket where the mass reaches target
    while (last < kBuckets - 1 && mass + bucket_mass[last] < target) mass += bucket_mass[last++];
    std::vector<int32_t> boundary;
    kept.reserve(vocab_size);
    for (int32_t i = 0; i < vocab_size; ++i) {
      if (bucket_of[i] < last) {
        kept.push_back({i, probs[i]});
      } else if (bucket_of[i] == last) {
        boundary.push_back(i);
      }
    }
    std::sort(boundary.begin(), boundary.end(), more_likely);
    const auto split = static_cast<std::ptrdiff_t>(kept.size());
    for (int32_t id : boundary) {
      kept.push_back({id, probs[id]});
      mass += probs[id];
      if (mass >= target) break;
    }
    // the boundary's kept tokens back into id order (the rest already is)
    std::sort(kept.begin() + split, kept.end(), by_id);
    std::inplace_merge(kept.begin(), kept.begin() + split, kept.end(), by_id);
  } else if (p.top_p < 1.0f) {
    // top-k survivors, most likely first, until their mass reaches top_p
    std::sort(ids.begin(), ids.begin() + num_kept, more_likely);
    kept.reserve(num_kept);
    const double target = p.top_p * total;
    double mass = 0.0;
    for (int32_t i = 0; i < num_kept; ++i) {
      const float prob = static_cast<float>(std::exp(double(scaled[ids[i]]) - max_logit));
      kept.push_back({ids[i], prob});
      mass += prob;
      if (mass >= target) break;
    }
    std::sort(kept.begin(), kept.end(), by_id);
  } else if (num_kept == vocab_size) {
    // No truncation by mass: every token, in id order (no sort), probabilities in one pass.
    std::vector<float> probs(scaled.size());
    sampler_kernels::exp_shifted(scaled, max_logit, probs);
    kept.reserve(probs.size());
    for (int32_t i = 0; i < vocab_size; ++i) kept.push_back({i, probs[i]});
  } else {
    kept.reserve(num_kept);
    for (int32_t i = 0; i < num_kept; ++i) {
      kept.push_back({ids[i], static_cast<float>(std::exp(double(scaled[ids[i]]) - max_logit))});
    }
    std::sort(kept.begin(), kept.end(), by_id);
  }
  if (p.min_p > 0.0f) {
    // relative to the most likely token, whose unnormalised probability is exp(0) = 1
    const float threshold = p.min_p;
    std::erase_if(kept, [&](const Candidate& c) { return c.prob < threshold; });
  }
  return kept;
}

}  // namespace

double sampler_uniform(SamplerRng& rng) { return double(rng() >> 11) * 0x1.0p-53; }

std::vector<float> sampling_distribution(std::span<const float> logits, const SamplingParams& p,
                                         const TokenHistory& history) {
  KVP_CHECK(p.temperature > 0.0f, "sampling_distribution needs temperature > 0");
  std::vector<Candidate> kept = truncated_candidates(logits, p, history);
  double total = 0.0;
  for (const Candidate& c : kept) total += c.prob;
  std::vector<float> probs(logits.size(), 0.0f);
  for (const Candidate& c : kept) probs[c.token_id] = static_cast<float>(c.prob / total);
  return probs;
}

SampledToken sample_token(std::span<const float> logits, const SamplingParams& p,
                          const TokenHistory& history, SamplerRng& rng) {
  KVP_CHECK(!logits.empty(), "sample_token: empty logits");
  SampledToken result;
  if (p.temperature == 0.0f) {
    if (p.repetition_penalty == 1.0f && p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f) {
      result.token_id = sampler_kernels::argmax(logits);
    } else {
      result.token_id = sampler_kernels::argmax(penalized_logits(logits, p, history));
    }
  } else {
    std::vector<Candidate> kept = truncated_candidates(logits, p, history);
    double total = 0.0;
    for (const Candidate& c : kept) total += c.prob;
    const double target = sampler_uniform(rng) * total;
    double mass = 0.0;
    result.token_id = kept.back().token_id;
    for (const Candidate& c : kept) {
      mass += c.prob;
      if (target < mass) {
        result.token_id = c.token_id;
        break;
      }
    }
  }

  // logprobs under the raw model distribution
  const float max_logit = sampler_kernels::max_value(logits);
  const double log_z = max_logit + std::log(sampler_kernels::exp_shifted(logits, max_logit, {}));
  result.logprob = static_cast<float>(logits[result.token_id] - log_z);
  if (p.num_logprobs > 0) {
    const int32_t n = std::min<int32_t>(p.num_logprobs, static_cast<int32_t>(logits.size()));
    std::vector<int32_t> ids(logits.size());
    std::iota(ids.begin(), ids.end(), 0);
    std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    for (int32_t i = 0; i < n; ++i) {
      result.top_logprobs.push_back({ids[i], static_cast<float>(logits[ids[i]] - log_z)});
    }
  }
  return result;
}

}  // namespace kvp

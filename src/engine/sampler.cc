#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

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

int32_t argmax(std::span<const float> values) {
  // first maximum: ties go to the lowest id, NaN never wins
  int32_t best = 0;
  for (int32_t i = 1; i < static_cast<int32_t>(values.size()); ++i) {
    if (values[i] > values[best] || std::isnan(values[best])) best = i;
  }
  return best;
}

struct Candidate {
  int32_t token_id;
  float prob;
};

// The kept candidates with unnormalised probabilities, most likely first (ties: lower id).
std::vector<Candidate> truncated_candidates(std::span<const float> logits, const SamplingParams& p,
                                            const TokenHistory& history) {
  std::vector<float> scaled = penalized_logits(logits, p, history);
  const float inv_t = 1.0f / p.temperature;
  for (float& l : scaled) l *= inv_t;

  const auto vocab_size = static_cast<int32_t>(scaled.size());
  std::vector<int32_t> ids(vocab_size);
  std::iota(ids.begin(), ids.end(), 0);
  auto more_likely = [&](int32_t a, int32_t b) {
    return scaled[a] > scaled[b] || (scaled[a] == scaled[b] && a < b);
  };
  int32_t num_kept = vocab_size;
  if (p.top_k > 0 && p.top_k < vocab_size) {
    std::nth_element(ids.begin(), ids.begin() + p.top_k, ids.end(), more_likely);
    num_kept = p.top_k;
  }
  // Sort the survivors most likely first. With top-p alone, try the best 1024 first: their
  // mass almost always reaches top_p, and a full sort of a 256K vocabulary is costly.
  int32_t num_sorted = num_kept;
  if (p.top_k == 0 && p.top_p < 1.0f && num_kept > 1024) num_sorted = 1024;
  std::partial_sort(ids.begin(), ids.begin() + num_sorted, ids.begin() + num_kept, more_likely);

  const float max_logit = scaled[ids[0]];
  double total = 0.0;
  for (int32_t i = 0; i < num_kept; ++i) total += std::exp(double(scaled[ids[i]]) - max_logit);

  std::vector<Candidate> kept;
  kept.reserve(std::min(num_kept, 1024));
  if (p.top_p < 1.0f) {
    const double target = p.top_p * total;
    double mass = 0.0;
    for (int32_t i = 0; i < num_kept; ++i) {
      if (i == num_sorted) {  // the best 1024 were not enough: sort the rest
        std::sort(ids.begin() + num_sorted, ids.begin() + num_kept, more_likely);
        num_sorted = num_kept;
      }
      const float prob = static_cast<float>(std::exp(double(scaled[ids[i]]) - max_logit));
      kept.push_back({ids[i], prob});
      mass += prob;
      if (mass >= target) break;
    }
  } else {
    for (int32_t i = 0; i < num_kept; ++i) {
      kept.push_back({ids[i], static_cast<float>(std::exp(double(scaled[ids[i]]) - max_logit))});
    }
  }
  if (p.min_p > 0.0f) {
    // relative to the most likely token, whose unnormalised probability is exp(0) = 1
    const float threshold = p.min_p;
    auto first_dropped = std::find_if(kept.begin(), kept.end(),
                                      [&](const Candidate& c) { return c.prob < threshold; });
    kept.erase(first_dropped, kept.end());
  }
  return kept;
}

// A uniform double in [0, 1) from exactly one 64-bit draw (portable across standard libraries).
double uniform01(SamplerRng& rng) { return double(rng() >> 11) * 0x1.0p-53; }

}  // namespace

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
      result.token_id = argmax(logits);
    } else {
      result.token_id = argmax(penalized_logits(logits, p, history));
    }
  } else {
    std::vector<Candidate> kept = truncated_candidates(logits, p, history);
    double total = 0.0;
    for (const Candidate& c : kept) total += c.prob;
    const double target = uniform01(rng) * total;
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
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float l : logits) sum += std::exp(double(l) - max_logit);
  const double log_z = max_logit + std::log(sum);
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

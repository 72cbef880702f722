// Token sampling from one sequence's logits (issue "Engine": Sampler), on the CPU.
//
// Order of operations, as in Hugging Face transformers' logits processors and vLLM:
//   logits ─▶ repetition penalty ─▶ presence/frequency penalties ─▶ temperature
//          ─▶ top-k ─▶ top-p ─▶ min-p ─▶ sample (or argmax when temperature == 0)
// Logprobs (the chosen token's and the top-n) are reported from the model's raw distribution,
// log_softmax(logits), before any processing (vLLM's default), so they do not depend on the
// sampling parameters.
//
// Determinism: each sequence owns a SamplerRng seeded from its request's seed; one uniform
// draw per sampled token, so a request's output depends only on its logits and its seed, never
// on the batch it ran in.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/status.h"

namespace kvp {

struct SamplingParams {
  float temperature = 1.0f;         // 0: greedy (argmax); must be >= 0
  int32_t top_k = 0;                // 0: off; else keep the k most likely tokens
  float top_p = 1.0f;               // in (0, 1]; keep the smallest set whose mass >= top_p
  float min_p = 0.0f;               // in [0, 1); drop tokens with p < min_p * p_max
  float repetition_penalty = 1.0f;  // > 0; tokens seen in prompt or output: l > 0 ? l/r : l*r
  float presence_penalty = 0.0f;    // in [-2, 2]; subtracted once from tokens in the output
  float frequency_penalty = 0.0f;   // in [-2, 2]; subtracted per occurrence in the output
  std::optional<uint64_t> seed;     // same seed, same output; none: seeded from the engine
  int32_t num_logprobs = 0;         // top-n logprobs to report, 0..20
};

// Checks every field's range; the message names the field and the value.
Status validate_sampling_params(const SamplingParams& params);

// The tokens a sequence has seen, for penalties. Mutated by add_output().
class TokenHistory {
 public:
  TokenHistory() = default;
  explicit TokenHistory(std::span<const int32_t> prompt_tokens);

  void add_output(int32_t token_id);
  // Occurrences of token_id in the output so far (0 if none).
  int32_t output_count(int32_t token_id) const;
  bool seen(int32_t token_id) const;  // in prompt or output
  const std::unordered_map<int32_t, int32_t>& output_counts() const { return output_counts_; }
  const std::vector<int32_t>& seen_tokens() const { return seen_list_; }

 private:
  std::unordered_map<int32_t, int32_t> output_counts_;  // token id -> occurrences in output
  std::unordered_map<int32_t, bool> seen_;              // token id -> in prompt or output
  std::vector<int32_t> seen_list_;                      // distinct ids, first-seen order
};

using SamplerRng = std::mt19937_64;

struct TokenLogprob {
  int32_t token_id = 0;
  float logprob = 0.0f;
};

struct SampledToken {
  int32_t token_id = 0;
  float logprob = 0.0f;                    // of token_id under log_softmax(raw logits)
  std::vector<TokenLogprob> top_logprobs;  // num_logprobs entries, most likely first
};

// A uniform double in [0, 1) from exactly one 64-bit draw (portable across standard libraries):
// the draw sample_token makes per sampled token, and the u the engine hands a device sampler.
double sampler_uniform(SamplerRng& rng);

// Samples one token: the first kept token, in id order, whose running kept mass exceeds
// sampler_uniform(rng) times the kept mass. Does not modify `logits` or `history`; advances `rng`
// by one draw unless the choice is greedy. requires: validate_sampling_params(params).is_ok();
// logits not empty; every id in history
//           is < logits.size().
SampledToken sample_token(std::span<const float> logits,  // [vocab_size]
                          const SamplingParams& params, const TokenHistory& history,
                          SamplerRng& rng);

// The processed distribution before the draw, for tests and logging: probabilities over
// [vocab_size] after penalties, temperature, top-k, top-p and min-p (zeros for dropped tokens).
// requires: params.temperature > 0.
std::vector<float> sampling_distribution(std::span<const float> logits,
                                         const SamplingParams& params, const TokenHistory& history);

}  // namespace kvp

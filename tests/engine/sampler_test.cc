// Sampler behaviour: exact distributions on hand-computed cases, a naive reference for the
// truncations, a chi-square test of the draws, determinism by seed, and argument errors.
#include "engine/sampler.h"
#include "engine/sampler_kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

namespace kvp {
namespace {

std::vector<float> softmax(std::vector<double> logits) {
  const double m = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (double& l : logits) sum += (l = std::exp(l - m));
  std::vector<float> p;
  for (double l : logits) p.push_back(static_cast<float>(l / sum));
  return p;
}

TEST(Sampler, GreedyTakesArgmaxAndLowestIdOnTies) {
  SamplingParams p;
  p.temperature = 0;
  SamplerRng rng(1);
  std::vector<float> logits = {0.5f, 3.0f, -1.0f, 3.0f};
  EXPECT_EQ(sample_token(logits, p, TokenHistory{}, rng).token_id, 1);
}

TEST(Sampler, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 2.0f;
  SamplerRng rng(1);
  // token 0 seen: 4.0 -> 2.0, so token 1 (3.0) wins
  std::vector<float> logits = {4.0f, 3.0f, 1.0f};
  std::vector<int32_t> prompt = {0};
  EXPECT_EQ(sample_token(logits, p, TokenHistory(prompt), rng).token_id, 1);
  // negative seen logits get more negative: distribution check at temperature 1
  p.temperature = 1.0f;
  std::vector<float> neg = {-1.0f, -2.0f};
  auto probs = sampling_distribution(neg, p, TokenHistory(prompt));
  auto expected = softmax({-2.0, -2.0});
  EXPECT_NEAR(probs[0], expected[0], 1e-6);
  EXPECT_NEAR(probs[1], expected[1], 1e-6);
}

TEST(Sampler, PresenceAndFrequencyPenaltiesCountOutputOccurrences) {
  SamplingParams p;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  TokenHistory h(std::vector<int32_t>{2});  // in the prompt only: no presence/frequency penalty
  h.add_output(0);
  h.add_output(0);
  h.add_output(1);
  std::vector<float> logits = {1.0f, 1.0f, 1.0f};
  auto probs = sampling_distribution(logits, p, h);
  auto expected = softmax({1.0 - 0.5 - 0.5, 1.0 - 0.5 - 0.25, 1.0});
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(probs[i], expected[i], 1e-6) << i;
}

TEST(Sampler, TemperatureScalesLogits) {
  SamplingParams p;
  p.temperature = 0.5f;
  std::vector<float> logits = {0.0f, 1.0f, 2.0f};
  auto probs = sampling_distribution(logits, p, TokenHistory{});
  auto expected = softmax({0.0, 2.0, 4.0});
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(probs[i], expected[i], 1e-6);
}

TEST(Sampler, TopKTopPMinPMatchHandComputedSets) {
  // probabilities exactly 0.4, 0.3, 0.2, 0.1 (logits are their logs)
  std::vector<float> logits = {std::log(0.1f), std::log(0.4f), std::log(0.2f), std::log(0.3f)};
  SamplingParams p;
  p.top_k = 2;  // keeps 0.4 and 0.3
  auto probs = sampling_distribution(logits, p, TokenHistory{});
  EXPECT_NEAR(probs[1], 0.4 / 0.7, 1e-6);
  EXPECT_NEAR(probs[3], 0.3 / 0.7, 1e-6);
  EXPECT_EQ(probs[0], 0.0f);
  EXPECT_EQ(probs[2], 0.0f);

  p = SamplingParams{};
  p.top_p = 0.75f;  // 0.4 + 0.3 = 0.7 < 0.75, so 0.2 joins: {0.4, 0.3, 0.2}
  probs = sampling_distribution(logits, p, TokenHistory{});
  EXPECT_NEAR(probs[2], 0.2 / 0.9, 1e-6);
  EXPECT_EQ(probs[0], 0.0f);

  p = SamplingParams{};
  p.min_p = 0.6f;  // threshold 0.6 * 0.4 = 0.24: keeps 0.4 and 0.3
  probs = sampling_distribution(logits, p, TokenHistory{});
  EXPECT_NEAR(probs[1], 0.4 / 0.7, 1e-6);
  EXPECT_EQ(probs[2], 0.0f);
}

// Naive top-p over a full descending sort, written independently of the sampler's shortcut.
std::vector<float> naive_top_p(const std::vector<float>& logits, float top_p) {
  std::vector<double> l(logits.begin(), logits.end());
  auto p = softmax(l);
  std::vector<int> ids(p.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int a, int b) { return p[a] > p[b]; });
  std::vector<float> out(p.size(), 0.0f);
  double before = 0, kept = 0;
  for (int id : ids) {
    if (before >= top_p) break;
    out[id] = p[id];
    before += p[id];
    kept += p[id];
  }
  for (float& x : out) x = static_cast<float>(x / kept);
  return out;
}

TEST(Sampler, TopPOnLargeVocabularyMatchesNaiveFullSort) {
  std::mt19937 gen(7);
  for (float spread : {0.5f, 4.0f, 12.0f}) {  // flat to peaked: exercises the 1024-best shortcut
    std::normal_distribution<float> dist(0.0f, spread);
    std::vector<float> logits(50000);
    for (float& l : logits) l = dist(gen);
    for (float top_p : {0.5f, 0.9f, 0.99f}) {
      SamplingParams p;
      p.top_p = top_p;
      auto got = sampling_distribution(logits, p, TokenHistory{});
      auto want = naive_top_p(logits, top_p);
      double max_diff = 0;
      int kept_got = 0, kept_want = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        max_diff = std::max(max_diff, double(std::abs(got[i] - want[i])));
        kept_got += got[i] > 0;
        kept_want += want[i] > 0;
      }
      EXPECT_EQ(kept_got, kept_want) << "spread " << spread << " top_p " << top_p;
      EXPECT_LT(max_diff, 1e-6) << "spread " << spread << " top_p " << top_p;
    }
  }
}

TEST(Sampler, DrawsFollowTheDistribution) {
  // chi-square goodness of fit, 3 degrees of freedom; 16.27 is the 0.999 quantile
  std::vector<float> logits = {std::log(0.1f), std::log(0.4f), std::log(0.2f), std::log(0.3f)};
  const double expected[] = {0.1, 0.4, 0.2, 0.3};
  SamplingParams p;
  SamplerRng rng(42);
  const int kDraws = 100000;
  int counts[4] = {};
  for (int i = 0; i < kDraws; ++i) ++counts[sample_token(logits, p, TokenHistory{}, rng).token_id];
  double chi2 = 0;
  for (int i = 0; i < 4; ++i) {
    const double e = expected[i] * kDraws;
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  EXPECT_LT(chi2, 16.27);
}

TEST(Sampler, SameSeedSameTokensDifferentSeedDifferentTokens) {
  std::vector<float> logits(1000);
  std::mt19937 gen(3);
  std::normal_distribution<float> dist;
  for (float& l : logits) l = dist(gen);
  SamplingParams p;
  p.top_p = 0.95f;
  auto run = [&](uint64_t seed) {
    SamplerRng rng(seed);
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i)
      out.push_back(sample_token(logits, p, TokenHistory{}, rng).token_id);
    return out;
  };
  EXPECT_EQ(run(5), run(5));
  EXPECT_NE(run(5), run(6));
}

TEST(Sampler, LogprobsAreRawLogSoftmaxMostLikelyFirst) {
  std::vector<float> logits = {1.0f, 3.0f, 2.0f, -1.0f};
  SamplingParams p;
  p.temperature = 0;
  p.num_logprobs = 3;
  p.repetition_penalty = 1.5f;  // must not change reported logprobs
  SamplerRng rng(1);
  auto r = sample_token(logits, p, TokenHistory(std::vector<int32_t>{1}), rng);
  const double z = std::log(std::exp(1.0) + std::exp(3.0) + std::exp(2.0) + std::exp(-1.0));
  ASSERT_EQ(r.top_logprobs.size(), 3u);
  EXPECT_EQ(r.top_logprobs[0].token_id, 1);
  EXPECT_EQ(r.top_logprobs[1].token_id, 2);
  EXPECT_EQ(r.top_logprobs[2].token_id, 0);
  EXPECT_NEAR(r.top_logprobs[0].logprob, 3.0 - z, 1e-5);
  EXPECT_NEAR(r.top_logprobs[2].logprob, 1.0 - z, 1e-5);
  // penalty 1.5 on token 1: 3.0 / 1.5 = 2.0 ties with token 2; the lower id (1) wins
  EXPECT_EQ(r.token_id, 1);
  EXPECT_NEAR(r.logprob, 3.0 - z, 1e-5);
}

TEST(Sampler, RejectsOutOfRangeParameters) {
  auto bad = [](auto mutate) {
    SamplingParams p;
    mutate(p);
    return validate_sampling_params(p);
  };
  EXPECT_TRUE(validate_sampling_params(SamplingParams{}).is_ok());
  Status s = bad([](SamplingParams& p) { p.temperature = -1; });
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("temperature"), std::string::npos);
  EXPECT_FALSE(bad([](SamplingParams& p) { p.top_p = 0; }).is_ok());
  EXPECT_FALSE(bad([](SamplingParams& p) { p.top_p = 1.5f; }).is_ok());
  EXPECT_FALSE(bad([](SamplingParams& p) { p.top_k = -2; }).is_ok());
  EXPECT_FALSE(bad([](SamplingParams& p) { p.min_p = 1.0f; }).is_ok());
  EXPECT_FALSE(bad([](SamplingParams& p) { p.repetition_penalty = 0; }).is_ok());
  EXPECT_FALSE(bad([](SamplingParams& p) { p.presence_penalty = 3; }).is_ok());
  EXPECT_FALSE(bad([](SamplingParams& p) { p.frequency_penalty = -3; }).is_ok());
  EXPECT_FALSE(bad([](SamplingParams& p) { p.num_logprobs = 21; }).is_ok());
  EXPECT_FALSE(bad([](SamplingParams& p) { p.temperature = NAN; }).is_ok());
}

// The vectorised row passes against plain loops, at lengths around every vector width (tails),
// with ties, NaN and -inf placed in the vector part and in the tail.
TEST(SamplerKernels, MatchPlainLoopsAtEveryLengthWithTiesNanAndInfinities) {
  std::mt19937 gen(11);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  const float inf = std::numeric_limits<float>::infinity();
  for (size_t n : {1, 2, 3, 7, 15, 16, 17, 31, 33, 63, 65, 4095, 4096, 4097, 10007, 128256}) {
    std::vector<float> v(n);
    for (float& x : v) x = dist(gen);
    // a tie for the maximum: the first one must win
    const size_t a = n / 3, b = n - 1;
    v[a] = v[b] = 40.0f;
    if (n > 4) v[1] = std::numeric_limits<float>::quiet_NaN();
    if (n > 5) v[n - 2] = -inf;
    int32_t want_arg = 0;
    float want_max = -inf;
    for (size_t i = 0; i < n; ++i) {
      if (v[i] > want_max) want_max = v[i], want_arg = static_cast<int32_t>(i);
    }
    EXPECT_EQ(sampler_kernels::max_value(v), want_max) << n;
    EXPECT_EQ(sampler_kernels::argmax(v), want_arg) << n;

    std::vector<float> finite = v;
    if (n > 4) finite[1] = 0.5f;  // exp of NaN is NaN either way: compare on finite rows
    double want_sum = 0.0;
    for (float x : finite) want_sum += std::exp(double(x) - 40.0);
    std::vector<float> out(n);
    const double got_sum = sampler_kernels::exp_shifted(finite, 40.0f, out);
    EXPECT_NEAR(got_sum / want_sum, 1.0, 1e-6) << n;
    for (size_t i = 0; i < n; ++i) {
      const double want = std::exp(double(finite[i]) - 40.0);
      // x - shift is rounded to float first: relative error up to |x - shift| * 2^-24 (~5e-6)
      ASSERT_NEAR(out[i], want, 2e-5 * want + 1e-37) << n << " at " << i;
    }
  }
  const std::vector<float> nans(37, std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(sampler_kernels::argmax(nans), 0);
  EXPECT_EQ(sampler_kernels::max_value(nans), -inf);
}

}  // namespace
}  // namespace kvp

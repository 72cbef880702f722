// The CUDA sampler (model/cuda/sampler_kernels.h through cuda::DeviceSampler) against the
// definition of the sampling parameters and against the CPU sampler (engine/sampler.h):
//   distribution: 20k draws per parameter set on fixed logits, chi-square against the kept and
//                 renormalised probabilities computed here from the definition, and against the
//                 CPU sampler's own 20k draws (p < 1e-4 fails)
//   same u:       one u gives the same token on both, away from the CDF's steps
//   logprobs:     the raw log_softmax and its top-n equal the CPU's; penalties and min_tokens
//                 masks change the winner as on the CPU
//   end to end:   an engine on the CUDA tiny llama, sampled with seed 7, gives the same tokens
//                 twice, alone or in a batch
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine/device_sampling.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "model/cuda/cuda_device_sampler.h"
#include "model/cuda/cuda_forward_backend.h"
#include "model/model_config.h"
#include "model/safetensors_weights.h"
#include "support/gpu_skip.h"

namespace kvp::cuda {
namespace {

constexpr int kDraws = 20000;
// chi-square at p = 1e-4 through the Wilson-Hilferty normal approximation: z > 3.719 fails
constexpr double kZ = 3.719;

struct Case {
  std::string name;
  SamplingParams params;
  bool with_history = false;
};

std::vector<Case> cases() {
  std::vector<Case> c;
  auto add = [&](std::string name, auto edit, bool history = false) {
    SamplingParams p;
    edit(p);
    c.push_back({std::move(name), p, history});
  };
  add("temperature1", [](SamplingParams&) {});
  add("temperature0.7", [](SamplingParams& p) { p.temperature = 0.7f; });
  add("top_k10", [](SamplingParams& p) { p.top_k = 10; });
  add("top_p0.9", [](SamplingParams& p) { p.top_p = 0.9f; });
  add("min_p0.05", [](SamplingParams& p) { p.min_p = 0.05f; });
  add(
      "penalties",
      [](SamplingParams& p) {
        p.repetition_penalty = 1.3f;
        p.presence_penalty = 0.5f;
        p.frequency_penalty = 0.3f;
      },
      true);
  add("top_k5_top_p0.5", [](SamplingParams& p) {
    p.top_k = 5;
    p.top_p = 0.5f;
  });
  add(
      "combined",
      [](SamplingParams& p) {
        p.temperature = 0.8f;
        p.top_k = 50;
        p.top_p = 0.9f;
        p.min_p = 0.02f;
        p.repetition_penalty = 1.1f;
        p.presence_penalty = 0.2f;
      },
      true);
  add("top_k1", [](SamplingParams& p) { p.top_k = 1; });
  return c;
}

std::vector<float> fixed_logits(int32_t vocab, uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, scale);
  std::vector<float> l(vocab);
  for (float& x : l) x = n(rng);
  return l;
}

// Prompt and output tokens among the row's most likely (so that penalties move a large share of
// the mass) and a few others.
TokenHistory fixed_history(const std::vector<float>& logits) {
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + 6, ids.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  TokenHistory h(std::vector<int32_t>{ids[0], ids[3], 17, 40, 41, 99});
  for (int32_t t : {ids[1], ids[1], ids[2], ids[4], 17}) h.add_output(t);
  return h;
}

// The kept and renormalised probabilities from the definition: penalties, temperature; tokens
// most likely first (ties: lower id); the first top_k; of those the shortest prefix whose mass
// reaches top_p of theirs; then those with p >= min_p * p_max.
std::vector<double> expected_probs(const std::vector<float>& logits, const SamplingParams& p,
                                   const TokenHistory& h) {
  const auto vocab = static_cast<int32_t>(logits.size());
  std::vector<float> l = logits;
  for (int32_t t : h.seen_tokens()) {
    if (p.repetition_penalty != 1.0f) {
      l[t] = l[t] > 0.0f ? l[t] / p.repetition_penalty : l[t] * p.repetition_penalty;
    }
    const int32_t c = h.output_count(t);
    if (c > 0) l[t] -= p.presence_penalty + p.frequency_penalty * static_cast<float>(c);
  }
  const float inv_t = 1.0f / p.temperature;
  for (float& x : l) x *= inv_t;
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
  const double mx = l[order[0]];
  int32_t k = p.top_k > 0 ? std::min(p.top_k, vocab) : vocab;
  if (p.top_p < 1.0f) {
    double mass_k = 0.0;
    for (int32_t i = 0; i < k; ++i) mass_k += std::exp(double(l[order[i]]) - mx);
    const double target = double(p.top_p) * mass_k;
    double acc = 0.0;
    for (int32_t i = 0; i < k; ++i) {
      acc += std::exp(double(l[order[i]]) - mx);
      if (acc >= target) {
        k = i + 1;
        break;
      }
    }
  }
  std::vector<double> probs(vocab, 0.0);
  double total = 0.0;
  for (int32_t i = 0; i < k; ++i) {
    const double q = std::exp(double(l[order[i]]) - mx);
    if (q < p.min_p) continue;
    probs[order[i]] = q;
    total += q;
  }
  for (double& q : probs) q /= total;
  return probs;
}

// Draws on the GPU: one request per u, all on row 0 of `logits`.
std::vector<DeviceSample> gpu_draws(const std::vector<float>& logits, const SamplingParams& p,
                                    const TokenHistory& h, const std::vector<double>& us,
                                    const std::vector<int32_t>& masked = {}) {
  const auto vocab = static_cast<int32_t>(logits.size());
  DeviceSampleBatch batch;
  for (double u : us) {
    // a generator whose first draw is ignored: the request's u is set below
    SamplerRng unused(1);
    add_device_sample(p, h, masked, 0, unused, &batch);
    batch.requests.back().u = p.temperature > 0.0f ? u : 0.0;
  }
  auto dev = DeviceBuffer::allocate(logits.size() * 4).value();
  EXPECT_EQ(cudaMemcpy(dev.data(), logits.data(), logits.size() * 4, cudaMemcpyHostToDevice),
            cudaSuccess);
  DeviceSampler sampler;
  std::vector<DeviceSample> out(batch.requests.size());
  KVP_CHECK(DeviceSampler::check(batch, 1, vocab, out.size()).is_ok(), "bad batch");
  KVP_CHECK(sampler.reserve(batch, vocab, nullptr).is_ok(), "reserve");
  KVP_CHECK(sampler.enqueue(dev.as<const float>(), vocab, batch, nullptr).is_ok(), "enqueue");
  EXPECT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  sampler.read_results(out);
  return out;
}

// Pools categories with expected count < 5 into one; returns z of the chi-square statistic.
double goodness_z(const std::vector<int64_t>& counts, const std::vector<double>& probs, int n,
                  int64_t* outside) {
  double stat = 0.0, pooled_e = 0.0, pooled_o = 0.0;
  int df = -1;
  *outside = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double e = probs[i] * n;
    if (probs[i] == 0.0) {
      *outside += counts[i];
      continue;
    }
    if (e < 5.0) {
      pooled_e += e, pooled_o += double(counts[i]);
      continue;
    }
    stat += (double(counts[i]) - e) * (double(counts[i]) - e) / e;
    ++df;
  }
  if (pooled_e > 0.0) stat += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e, ++df;
  if (df <= 0) return 0.0;
  const double k = df;
  return (std::cbrt(stat / k) - (1.0 - 2.0 / (9.0 * k))) / std::sqrt(2.0 / (9.0 * k));
}

// Two samples of equal size from one distribution (homogeneity); bins with < 10 draws together
// are pooled.
double homogeneity_z(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  double stat = 0.0, pa = 0.0, pb = 0.0;
  int df = -1;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = double(a[i]), y = double(b[i]);
    if (x + y < 10.0) {
      pa += x, pb += y;
      continue;
    }
    stat += (x - y) * (x - y) / (x + y);
    ++df;
  }
  if (pa + pb > 0.0) stat += (pa - pb) * (pa - pb) / (pa + pb), ++df;
  if (df <= 0) return 0.0;
  const double k = df;
  return (std::cbrt(stat / k) - (1.0 - 2.0 / (9.0 * k))) / std::sqrt(2.0 / (9.0 * k));
}

TEST(CudaSampler, DistributionMatchesTheDefinitionAndTheCpuSampler) {
  SKIP_WITHOUT_GPU();
  // spread logits, and quantised ones whose ties straddle the top-k and top-p boundaries
  std::vector<std::vector<float>> rows = {fixed_logits(300, 11, 2.0f), fixed_logits(257, 5, 1.0f)};
  for (float& x : rows[1]) x = std::round(x * 2.0f) / 2.0f;
  for (size_t r = 0; r < rows.size(); ++r) {
    const std::vector<float>& logits = rows[r];
    for (const Case& c : cases()) {
      SCOPED_TRACE(c.name + " row " + std::to_string(r));
      const TokenHistory h = c.with_history ? fixed_history(logits) : TokenHistory();
      const std::vector<double> want = expected_probs(logits, c.params, h);
      SamplerRng rng(1234 + r);
      std::vector<double> us(kDraws);
      for (double& u : us) u = sampler_uniform(rng);
      const std::vector<DeviceSample> got = gpu_draws(logits, c.params, h, us);
      std::vector<int64_t> gpu(logits.size(), 0), cpu(logits.size(), 0);
      for (const DeviceSample& s : got) {
        ASSERT_GE(s.token_id, 0);
        ASSERT_LT(s.token_id, static_cast<int32_t>(logits.size()));
        ++gpu[s.token_id];
      }
      SamplerRng cpu_rng(777 + r);
      for (int i = 0; i < kDraws; ++i) ++cpu[sample_token(logits, c.params, h, cpu_rng).token_id];
      int64_t outside = 0;
      const double z = goodness_z(gpu, want, kDraws, &outside);
      EXPECT_EQ(outside, 0) << "the GPU drew tokens the definition drops";
      EXPECT_LT(z, kZ) << "GPU draws against the definition";
      int64_t cpu_outside = 0;
      EXPECT_LT(goodness_z(cpu, want, kDraws, &cpu_outside), kZ) << "CPU draws (sanity)";
      EXPECT_EQ(cpu_outside, 0);
      EXPECT_LT(homogeneity_z(gpu, cpu), kZ) << "GPU draws against the CPU sampler's";
    }
  }
}

// The CDF in id order of the kept probabilities: whether u lies within eps of a step.
bool near_step(const std::vector<double>& probs, double u, double eps) {
  double acc = 0.0;
  for (double q : probs) {
    if (q == 0.0) continue;
    acc += q;
    if (std::abs(acc - u) < eps) return true;
  }
  return false;
}

void expect_same_u_same_token(const std::vector<float>& logits, int draws, double eps) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name + " vocab " + std::to_string(logits.size()));
    const TokenHistory h = c.with_history ? fixed_history(logits) : TokenHistory();
    const std::vector<double> want = expected_probs(logits, c.params, h);
    SamplerRng rng(99);
    std::vector<double> us;
    std::vector<int32_t> cpu;
    for (int i = 0; i < draws; ++i) {
      SamplerRng peek = rng;
      us.push_back(sampler_uniform(peek));
      cpu.push_back(sample_token(logits, c.params, h, rng).token_id);
    }
    const std::vector<DeviceSample> got = gpu_draws(logits, c.params, h, us);
    int compared = 0;
    for (int i = 0; i < draws; ++i) {
      if (near_step(want, us[i], eps)) continue;
      ++compared;
      EXPECT_EQ(got[i].token_id, cpu[i]) << "u " << us[i];
    }
    EXPECT_GT(compared, draws / 2);
  }
}

TEST(CudaSampler, SameUniformGivesTheCpuSamplersToken) {
  SKIP_WITHOUT_GPU();
  expect_same_u_same_token(fixed_logits(300, 11, 2.0f), 500, 1e-6);
  // large vocabularies: several radix levels and warp segments of thousands of tokens; every
  // kept token is a step of the CDF in id order, so u is compared only 1e-6 away from any
  expect_same_u_same_token(fixed_logits(32000, 3, 6.0f), 200, 1e-6);
  expect_same_u_same_token(fixed_logits(128256, 4, 6.0f), 100, 1e-6);
}

TEST(CudaSampler, LogprobsAndTopNEqualTheCpus) {
  SKIP_WITHOUT_GPU();
  for (int32_t vocab : {300, 128256}) {
    const std::vector<float> logits = fixed_logits(vocab, 21, 2.5f);
    for (float temperature : {0.0f, 0.8f}) {
      SamplingParams p;
      p.temperature = temperature;
      p.num_logprobs = 20;
      SamplerRng rng(5);
      SamplerRng peek = rng;
      const double u = sampler_uniform(peek);
      const SampledToken cpu = sample_token(logits, p, TokenHistory(), rng);
      const DeviceSample gpu = gpu_draws(logits, p, TokenHistory(), {u})[0];
      EXPECT_EQ(gpu.token_id, cpu.token_id);
      EXPECT_NEAR(gpu.logprob, cpu.logprob, 1e-4);
      const SampledToken back = to_sampled_token(gpu);
      ASSERT_EQ(back.top_logprobs.size(), cpu.top_logprobs.size());
      for (size_t i = 0; i < cpu.top_logprobs.size(); ++i) {
        EXPECT_EQ(back.top_logprobs[i].token_id, cpu.top_logprobs[i].token_id) << i;
        EXPECT_NEAR(back.top_logprobs[i].logprob, cpu.top_logprobs[i].logprob, 1e-4) << i;
      }
    }
  }
}

TEST(CudaSampler, PenaltiesAndMasksChangeTheWinnerAsOnTheCpu) {
  SKIP_WITHOUT_GPU();
  std::vector<float> logits(64, 0.0f);
  logits[5] = 3.0f;   // the winner unpenalised
  logits[7] = 2.9f;   // after a repetition penalty on 5
  logits[11] = 2.5f;  // after presence and frequency penalties on 5 and 7
  TokenHistory seen_prompt(std::vector<int32_t>{5});
  TokenHistory in_output;
  in_output.add_output(5);
  in_output.add_output(7);
  struct Check {
    const char* name;
    SamplingParams p;
    const TokenHistory* h;
    std::vector<int32_t> masked;
    int32_t want;
  };
  SamplingParams rep;
  rep.temperature = 0.0f;
  rep.repetition_penalty = 1.5f;
  SamplingParams pres;
  pres.temperature = 0.0f;
  pres.presence_penalty = 0.6f;
  SamplingParams freq;
  freq.temperature = 0.0f;
  freq.frequency_penalty = 0.6f;
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  SamplingParams sharp;  // sampled, but so peaked that the winner is all but certain
  sharp.temperature = 0.01f;
  sharp.presence_penalty = 0.6f;
  const std::vector<Check> checks = {
      {"repetition", rep, &seen_prompt, {}, 7},
      {"presence", pres, &in_output, {}, 11},
      {"frequency", freq, &in_output, {}, 11},
      {"min_tokens mask", greedy, &in_output, {5}, 7},
      {"sampled presence", sharp, &in_output, {}, 11},
  };
  for (const Check& c : checks) {
    SCOPED_TRACE(c.name);
    std::vector<float> row = logits;
    for (int32_t t : c.masked) row[t] = -INFINITY;
    SamplerRng rng(3);
    SamplerRng peek = rng;
    const double u = sampler_uniform(peek);
    const SampledToken cpu = sample_token(row, c.p, *c.h, rng);
    EXPECT_EQ(cpu.token_id, c.want);
    const DeviceSample gpu = gpu_draws(logits, c.p, *c.h, {u}, c.masked)[0];
    EXPECT_EQ(gpu.token_id, c.want);
    // logprobs of the raw row (the CPU's row is the masked one: compare unmasked cases only)
    if (c.masked.empty()) {
      EXPECT_NEAR(gpu.logprob, cpu.logprob, 1e-4);
    }
  }
}

TEST(CudaSampler, BadBatchesAreRefused) {
  DeviceSampleBatch b;
  b.requests.resize(1);
  b.requests[0].logit_row = 2;
  EXPECT_FALSE(DeviceSampler::check(b, 2, 100, 1).is_ok());
  b.requests[0].logit_row = 1;
  EXPECT_TRUE(DeviceSampler::check(b, 2, 100, 1).is_ok());
  EXPECT_FALSE(DeviceSampler::check(b, 2, 100, 2).is_ok());
  b.penalties = {{3, 1}, {3, 0}};
  b.requests[0].penalty_count = 2;
  EXPECT_FALSE(DeviceSampler::check(b, 2, 100, 1).is_ok());  // repeated id
  b.penalties[1].token_id = 100;
  EXPECT_FALSE(DeviceSampler::check(b, 2, 100, 1).is_ok());  // outside the vocabulary
  b.penalties[1].token_id = 4;
  b.requests[0].num_logprobs = 21;
  EXPECT_FALSE(DeviceSampler::check(b, 2, 100, 1).is_ok());
}

// Not a check: the kernel's time per step (upload, kernel, download) at 128256 logits a row, for
// docs/perf/model-cuda.md ("GPU sampler").
TEST(CudaSamplerTiming, PrintsMicrosecondsPerStep) {
  SKIP_WITHOUT_GPU();
  constexpr int32_t kVocab = 128256;
  std::vector<float> logits;
  for (int r = 0; r < 64; ++r) {
    const std::vector<float> row = fixed_logits(kVocab, 100 + r, 2.0f);
    logits.insert(logits.end(), row.begin(), row.end());
  }
  auto dev = DeviceBuffer::allocate(logits.size() * 4).value();
  ASSERT_EQ(cudaMemcpy(dev.data(), logits.data(), logits.size() * 4, cudaMemcpyHostToDevice),
            cudaSuccess);
  struct Setting {
    const char* name;
    SamplingParams p;
  };
  std::vector<Setting> settings(4);
  settings[0].name = "temperature 0.8, top_p 0.95";
  settings[0].p.temperature = 0.8f;
  settings[0].p.top_p = 0.95f;
  settings[1].name = "temperature 1";
  settings[2].name = "top_k 50, top_p 0.9, presence 0.5";
  settings[2].p.top_k = 50;
  settings[2].p.top_p = 0.9f;
  settings[2].p.presence_penalty = 0.5f;
  settings[3].name = "greedy, 20 logprobs";
  settings[3].p.temperature = 0.0f;
  settings[3].p.num_logprobs = 20;
  const TokenHistory h = fixed_history(std::vector<float>(logits.begin(), logits.begin() + kVocab));
  cudaEvent_t start, stop;
  ASSERT_EQ(cudaEventCreate(&start), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&stop), cudaSuccess);
  for (const Setting& s : settings) {
    for (int32_t rows : {1, 8, 64}) {
      DeviceSampleBatch batch;
      SamplerRng rng(1);
      for (int32_t r = 0; r < rows; ++r) add_device_sample(s.p, h, {}, r, rng, &batch);
      DeviceSampler sampler;
      ASSERT_TRUE(sampler.reserve(batch, kVocab, nullptr).is_ok());
      for (int i = 0; i < 3; ++i) {
        ASSERT_TRUE(sampler.enqueue(dev.as<const float>(), kVocab, batch, nullptr).is_ok());
        ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
      }
      constexpr int kReps = 20;
      ASSERT_EQ(cudaEventRecord(start, nullptr), cudaSuccess);
      for (int i = 0; i < kReps; ++i) {
        ASSERT_TRUE(sampler.enqueue(dev.as<const float>(), kVocab, batch, nullptr).is_ok());
        ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
      }
      ASSERT_EQ(cudaEventRecord(stop, nullptr), cudaSuccess);
      ASSERT_EQ(cudaEventSynchronize(stop), cudaSuccess);
      float ms = 0.0f;
      ASSERT_EQ(cudaEventElapsedTime(&ms, start, stop), cudaSuccess);
      std::printf("gpu sampler, vocab %d, %s, %d rows: %.1f us a step\n", kVocab, s.name, rows,
                  1000.0 * ms / kReps);
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

// An engine on the CUDA tiny llama: the seeded sampled request's tokens, alone and in a batch.
std::map<int64_t, std::vector<int32_t>> run_engine(bool device_sampling,
                                                   const std::vector<Request>& requests) {
  const std::string dir = "tests/model/fixtures/tiny/llama";
  const ModelSpec spec = load_hf_config(dir + "/config.json").value();
  auto weights = SafetensorsWeights::open(dir + "/model.safetensors").value();
  auto backend = make_cuda_backend(spec, *weights).value();
  EngineConfig config;
  config.num_blocks = 256;
  config.block_size = 16;
  config.kv_dtype = DType::BF16;
  config.device_sampling = device_sampling;
  auto engine = Engine::create(backend.get(), config).value();
  std::vector<int64_t> ids;
  for (const Request& r : requests) ids.push_back(engine->submit(r).value().value);
  std::map<int64_t, std::vector<int32_t>> out;
  for (int guard = 0; engine->has_unfinished() && guard < 10000; ++guard) {
    for (EngineEvent& e : engine->step()) {
      if (e.kind == EngineEvent::Kind::kToken && e.sample_index == 0) {
        out[e.request_id.value].push_back(e.token_id);
      }
    }
  }
  std::map<int64_t, std::vector<int32_t>> by_index;
  for (size_t i = 0; i < ids.size(); ++i) by_index[int64_t(i)] = out[ids[i]];
  return by_index;
}

TEST(CudaSamplerEngine, SeedsReproduceAloneAndInABatch) {
  SKIP_WITHOUT_GPU();
  Request r;
  r.prompt_tokens = {1, 41, 29, 90, 28, 114, 205};  // the tiny llama's vocabulary is 256
  r.sampling.temperature = 0.8f;
  r.sampling.top_p = 0.95f;
  r.sampling.seed = 7;
  r.max_tokens = 24;
  r.ignore_eos = true;
  std::vector<Request> batch = {r};
  for (int i = 0; i < 5; ++i) {
    Request o = r;
    o.prompt_tokens.push_back(10 + i * 37);
    o.sampling.seed = 100 + i;
    o.sampling.top_k = i % 2 == 0 ? 20 : 0;
    o.sampling.presence_penalty = i == 3 ? 0.5f : 0.0f;
    o.sampling.num_logprobs = i == 4 ? 5 : 0;
    batch.push_back(o);
  }
  const auto alone1 = run_engine(true, {r});
  const auto alone2 = run_engine(true, {r});
  const auto batched = run_engine(true, batch);
  ASSERT_EQ(alone1.at(0).size(), 24u);
  EXPECT_EQ(alone1.at(0), alone2.at(0));
  EXPECT_EQ(alone1.at(0), batched.at(0));
  // the CPU sampler on the same logits: the same draws, so mostly the same tokens (a rounding
  // difference at a kept set's edge may part them; after that the texts differ)
  const auto cpu = run_engine(false, {r});
  size_t same = 0;
  while (same < cpu.at(0).size() && cpu.at(0)[same] == alone1.at(0)[same]) ++same;
  std::printf("device and CPU sampling agree on the first %zu of %zu tokens\n", same,
              cpu.at(0).size());
}

}  // namespace
}  // namespace kvp::cuda

// The engine's side of sampling on the device (engine/device_sampling.h): penalty lists, the
// one draw per sampled token, min_tokens masks; and an engine on a CPU backend that claims to
// sample "on the device" (by the definition, from the requests it is handed) giving the tokens
// the CPU sampler gives.
#include "engine/device_sampling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "engine/cpu_backend_wrapper.h"
#include "engine/engine.h"
#include "engine/engine_test_util.h"

using namespace kvp::engine_test;  // NOLINT(google-build-using-namespace)

namespace kvp {
namespace {

TEST(DeviceSampling, PenaltyListsHoldWhatTheParametersUse) {
  TokenHistory h(std::vector<int32_t>{9, 3, 9, 40});
  h.add_output(12);
  h.add_output(3);
  h.add_output(12);
  SamplingParams none;
  EXPECT_TRUE(penalty_tokens(none, h).empty());

  SamplingParams rep;
  rep.repetition_penalty = 1.2f;
  const std::vector<PenaltyToken> all = penalty_tokens(rep, h);
  ASSERT_EQ(all.size(), 4u);  // 3, 9, 12, 40: distinct, ascending, with output counts
  EXPECT_EQ(all[0].token_id, 3);
  EXPECT_EQ(all[0].output_count, 1);
  EXPECT_EQ(all[1].token_id, 9);
  EXPECT_EQ(all[1].output_count, 0);
  EXPECT_EQ(all[2].token_id, 12);
  EXPECT_EQ(all[2].output_count, 2);
  EXPECT_EQ(all[3].token_id, 40);

  SamplingParams presence;
  presence.presence_penalty = 0.5f;
  const std::vector<PenaltyToken> out = penalty_tokens(presence, h);
  ASSERT_EQ(out.size(), 2u);  // output tokens only
  EXPECT_EQ(out[0].token_id, 3);
  EXPECT_EQ(out[1].token_id, 12);
  EXPECT_EQ(out[1].output_count, 2);
}

TEST(DeviceSampling, RequestsTakeOneDrawWhenSampledAndNoneWhenGreedy) {
  TokenHistory h(std::vector<int32_t>{1, 2});
  h.add_output(2);
  SamplingParams p;
  p.temperature = 0.7f;
  p.top_k = 5;
  p.top_p = 0.9f;
  p.min_p = 0.1f;
  p.frequency_penalty = 0.4f;
  p.num_logprobs = 3;
  SamplerRng rng(42), twin(42);
  DeviceSampleBatch b;
  const std::vector<int32_t> mask = {0, 7};
  add_device_sample(p, h, mask, 3, rng, &b);
  add_device_sample(p, h, {}, 1, rng, &b);
  ASSERT_EQ(b.requests.size(), 2u);
  const DeviceSampleRequest& r = b.requests[0];
  EXPECT_EQ(r.logit_row, 3);
  EXPECT_EQ(r.top_k, 5);
  EXPECT_FLOAT_EQ(r.top_p, 0.9f);
  EXPECT_FLOAT_EQ(r.min_p, 0.1f);
  EXPECT_FLOAT_EQ(r.frequency_penalty, 0.4f);
  EXPECT_EQ(r.num_logprobs, 3);
  EXPECT_EQ(r.penalty_count, 1);
  EXPECT_EQ(b.penalties[r.penalty_begin].token_id, 2);
  EXPECT_EQ(r.mask_count, 2);
  EXPECT_EQ(b.masked[r.mask_begin + 1], 7);
  EXPECT_EQ(b.requests[1].mask_count, 0);
  EXPECT_EQ(b.requests[1].penalty_begin, 1);
  EXPECT_EQ(r.u, sampler_uniform(twin));  // the draw sample_token would make
  EXPECT_EQ(b.requests[1].u, sampler_uniform(twin));
  EXPECT_EQ(rng(), twin());

  SamplingParams greedy;
  greedy.temperature = 0.0f;
  SamplerRng g(5), g_twin(5);
  add_device_sample(greedy, h, {}, 0, g, &b);
  EXPECT_EQ(b.requests.back().u, 0.0);
  EXPECT_EQ(g(), g_twin());  // no draw
}

TEST(DeviceSampling, MinTokensMaskAndResults) {
  const std::vector<int32_t> eos = {2}, stops = {5, 6};
  EXPECT_EQ(min_tokens_mask(eos, stops, 0, 2), (std::vector<int32_t>{2, 5, 6}));
  EXPECT_TRUE(min_tokens_mask(eos, stops, 2, 2).empty());
  DeviceSample s;
  s.token_id = 4;
  s.logprob = -0.5f;
  s.num_top = 2;
  s.top_ids[0] = 4, s.top_ids[1] = 9;
  s.top_logprobs[0] = -0.5f, s.top_logprobs[1] = -1.5f;
  const SampledToken t = to_sampled_token(s);
  EXPECT_EQ(t.token_id, 4);
  ASSERT_EQ(t.top_logprobs.size(), 2u);
  EXPECT_EQ(t.top_logprobs[1].token_id, 9);
  EXPECT_FLOAT_EQ(t.top_logprobs[1].logprob, -1.5f);
}

// A CPU backend that samples "on the device": every row is computed on the host, then each
// request is drawn by the definition (sampling_distribution of its row, penalties rebuilt from
// its list, walked in id order at u), as the CUDA sampler does.
class HostSamplingBackend final : public engine_test::CpuBackendWrapper {
 public:
  using CpuBackendWrapper::CpuBackendWrapper;
  std::string device_name() const override { return "host-sampling test device"; }
  bool summarizes_logits() const override { return true; }
  Status forward_summarized(const ForwardBatch& b, std::span<const int32_t> full_rows,
                            std::span<float> logits,
                            std::span<LogitRowSummary> summaries) override {
    const int32_t vocab = spec().vocab_size;
    all_.resize(b.logit_rows.size() * vocab);
    KVP_RETURN_IF_ERROR(inner_.forward(b, all_));
    for (size_t r = 0; r < b.logit_rows.size(); ++r) {
      const float* row = all_.data() + r * vocab;
      const auto best = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
      double z = 0.0;
      for (int32_t i = 0; i < vocab; ++i) z += std::exp(double(row[i]) - row[best]);
      summaries[r] = {best, row[best], static_cast<float>(row[best] + std::log(z))};
    }
    for (size_t i = 0; i < full_rows.size(); ++i) {
      std::copy_n(all_.data() + size_t(full_rows[i]) * vocab, vocab, logits.data() + i * vocab);
    }
    return Status::ok();
  }
  bool samples_on_device() const override { return true; }
  Status forward_sampled(const ForwardBatch& b, std::span<const int32_t> full_rows,
                         std::span<float> logits, std::span<LogitRowSummary> summaries,
                         const DeviceSampleBatch& samples,
                         std::span<DeviceSample> results) override {
    KVP_RETURN_IF_ERROR(forward_summarized(b, full_rows, logits, summaries));
    const int32_t vocab = spec().vocab_size;
    ++num_sampled_steps;
    for (size_t i = 0; i < samples.requests.size(); ++i) {
      const DeviceSampleRequest& q = samples.requests[i];
      std::vector<float> row(all_.begin() + size_t(q.logit_row) * vocab,
                             all_.begin() + size_t(q.logit_row + 1) * vocab);
      const std::vector<float> raw = row;
      for (int32_t e = 0; e < q.mask_count; ++e) row[samples.masked[q.mask_begin + e]] = -INFINITY;
      std::vector<int32_t> seen;
      for (int32_t e = 0; e < q.penalty_count; ++e) {
        seen.push_back(samples.penalties[q.penalty_begin + e].token_id);
      }
      TokenHistory h(seen);
      for (int32_t e = 0; e < q.penalty_count; ++e) {
        const PenaltyToken& pt = samples.penalties[q.penalty_begin + e];
        for (int32_t c = 0; c < pt.output_count; ++c) h.add_output(pt.token_id);
      }
      SamplingParams p;
      p.temperature = q.temperature;
      p.top_k = q.top_k;
      p.top_p = q.top_p;
      p.min_p = q.min_p;
      p.repetition_penalty = q.repetition_penalty;
      p.presence_penalty = q.presence_penalty;
      p.frequency_penalty = q.frequency_penalty;
      p.num_logprobs = q.num_logprobs;
      SamplerRng unused(0);
      SampledToken t = sample_token(row, p, h, unused);  // greedy; logprobs of the masked row
      if (q.temperature > 0.0f) {
        const std::vector<float> probs = sampling_distribution(row, p, h);
        double acc = 0.0;
        for (int32_t id = 0; id < vocab; ++id) {
          if (probs[id] == 0.0f) continue;
          t.token_id = id;
          acc += probs[id];
          if (q.u < acc) break;
        }
      }
      DeviceSample& s = results[i];
      s.token_id = t.token_id;
      double z = 0.0;
      const float mx = *std::max_element(raw.begin(), raw.end());
      for (float x : raw) z += std::exp(double(x) - mx);
      s.logprob = static_cast<float>(raw[t.token_id] - (mx + std::log(z)));
      s.num_top = 0;
    }
    return Status::ok();
  }
  int num_sampled_steps = 0;

 private:
  std::vector<float> all_;
};

std::map<int64_t, Outcome> run_requests(ForwardBackend* backend, bool device_sampling,
                                        const std::vector<Request>& requests) {
  EngineConfig c = small_config(128);
  c.device_sampling = device_sampling;
  auto engine = Engine::create(backend, c);
  KVP_CHECK(engine.is_ok(), "{}", engine.status().to_string());
  for (const Request& r : requests) KVP_CHECK((*engine)->submit(r).is_ok(), "submit");
  return run_all(**engine);
}

TEST(DeviceSamplingEngine, SampledOnTheDeviceAsOnTheCpu) {
  auto runner = load("llama");
  const std::vector<int32_t> prompt = golden_ids("llama", "prompt_0");
  std::vector<Request> requests;
  for (int i = 0; i < 4; ++i) {
    Request r;
    r.prompt_tokens = prompt;
    r.prompt_tokens.push_back(10 + i);
    r.max_tokens = 12;
    r.ignore_eos = true;
    r.sampling.temperature = 0.9f;
    r.sampling.seed = 7 + i;
    r.sampling.top_p = i == 1 ? 0.9f : 1.0f;
    r.sampling.top_k = i == 2 ? 8 : 0;
    r.sampling.presence_penalty = i == 3 ? 0.8f : 0.0f;
    r.min_tokens = i == 0 ? 4 : 0;
    requests.push_back(r);
  }
  Request greedy = greedy_request(prompt, 6);
  greedy.sampling.repetition_penalty = 1.3f;  // greedy with a penalty: sampled on the device
  requests.push_back(greedy);
  CpuForwardBackend cpu(runner);
  HostSamplingBackend device(runner);
  const auto want = run_requests(&cpu, false, requests);
  const auto got = run_requests(&device, true, requests);
  EXPECT_GT(device.num_sampled_steps, 0);
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [id, outcome] : want) EXPECT_EQ(got.at(id).tokens, outcome.tokens) << id;
  // the flag sends every row back to the CPU sampler
  HostSamplingBackend off(runner);
  const auto cpu_path = run_requests(&off, false, requests);
  EXPECT_EQ(off.num_sampled_steps, 0);
  for (const auto& [id, outcome] : want) EXPECT_EQ(cpu_path.at(id).tokens, outcome.tokens) << id;
}

}  // namespace
}  // namespace kvp

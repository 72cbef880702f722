// The sampler on one logits row of Llama 3's vocabulary (128256), per call, next to the floor
// of copying the row once and the scalar double-precision log-sum-exp the
// vectorised pass replaced (what every call paid before, for the chosen token's logprob):
//   greedy                      argmax + logprob
//   temperature 0.8             every token's probability, one draw
//   top-p 0.9 / top-k 40        truncations
// Run: ./build/release/bench/sampler_bench --benchmark_repetitions=3
//        --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "engine/sampler.h"

namespace kvp {
namespace {

constexpr int32_t kVocab = 128256;

std::vector<float> make_row() {
  std::mt19937 gen(3);
  std::normal_distribution<float> dist(0.0f, 2.5f);
  std::vector<float> row(kVocab);
  for (float& x : row) x = dist(gen);
  return row;
}

void BM_Floor_CopyRow(benchmark::State& state) {
  const std::vector<float> row = make_row();
  std::vector<float> copy(row.size());
  for (auto _ : state) {
    std::copy(row.begin(), row.end(), copy.begin());
    benchmark::DoNotOptimize(copy.data());
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_Floor_CopyRow);

void BM_Baseline_ScalarDoubleLogSumExp(benchmark::State& state) {
  const std::vector<float> row = make_row();
  for (auto _ : state) {
    float m = row[0];
    for (float x : row) m = std::max(m, x);
    double sum = 0.0;
    for (float x : row) sum += std::exp(double(x) - m);
    benchmark::DoNotOptimize(sum);
  }
}
BENCHMARK(BM_Baseline_ScalarDoubleLogSumExp);

void run_sampler(benchmark::State& state, const SamplingParams& params) {
  const std::vector<float> row = make_row();
  const TokenHistory history;
  SamplerRng rng(1);
  for (auto _ : state) benchmark::DoNotOptimize(sample_token(row, params, history, rng));
}

void BM_Sample_Greedy(benchmark::State& state) {
  SamplingParams p;
  p.temperature = 0.0f;
  run_sampler(state, p);
}
BENCHMARK(BM_Sample_Greedy);

void BM_Sample_Temperature(benchmark::State& state) {
  SamplingParams p;
  p.temperature = 0.8f;
  run_sampler(state, p);
}
BENCHMARK(BM_Sample_Temperature);

void BM_Sample_TopP(benchmark::State& state) {
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_p = 0.9f;
  run_sampler(state, p);
}
BENCHMARK(BM_Sample_TopP);

void BM_Sample_TopK(benchmark::State& state) {
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_k = 40;
  run_sampler(state, p);
}
BENCHMARK(BM_Sample_TopK);

}  // namespace
}  // namespace kvp

BENCHMARK_MAIN();

// The CUDA forward backend against Hugging Face transformers' goldens (tests/model/fixtures/tiny,
// float32 eager attention; the same models from GGUF too) and against kvpool's CPU runner in f32,
// on the paged pool with shuffled block tables: prefill logits, teacher-forced and free greedy
// decoding, a mixed prefill + decode batch vs each sequence alone, block copies / reads / writes in
// the model's logical layout (the tiny models' head dims 16, 8 and 32 are padded to 64 on the
// device), and refusals of bad batches and KV dtypes. Skips without a CUDA device.
#include "model/cuda/cuda_forward_backend.h"
#include "support/gpu_skip.h"
#include "support/tensor_check.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <tuple>

#include "model/gguf_model.h"
#include "model/model_config.h"
#include "model/model_runner.h"
#include "model/random_model.h"
#include "model/safetensors_weights.h"
#include "nlohmann/json.hpp"

namespace kvp::cuda {
namespace {

using kvp::testing::argmax;
using kvp::testing::relative_error;

const char* kFixtures = "tests/model/fixtures/tiny/";

// bf16 weights and GEMM inputs (8 mantissa bits, relative rounding 2^-9 per value, accumulated
// over a few layers) against f32 references: relative L2 error of whole logit tensors.
constexpr double kBf16LogitTolerance = 3e-2;
// The same computation on the same device with another batch composition (GEMM tiling and
// attention split choices differ): only reduction order changes.
constexpr double kSameDeviceTolerance = 1e-2;
// A teacher-forced greedy step may pick another token than transformers only where the f32
// reference's top-2 margin is below this (a near-tie that bf16 rounding can flip).
constexpr float kNearTieMargin = 0.05f;
// fp8 KV, CUDA against the CPU fp8 runner: both quantise K/V, the GPU from bf16 rows, the CPU from
// f32 ones, so a value whose bf16 rounding crosses an e4m3 rounding boundary gets the neighbouring
// code. An e4m3 step is 1/16 to 1/8 of the value (mean ~1/11), int8's is max|x| / 127, ~1/42 of a
// typical |x| ~ max|x| / 3 of a head vector: a flipped code moves fp8 logits ~3-4x as far as
// int8's, so the fp8 bound and near-tie margin are the bf16 ones times 3. Measured on the H100
// (2026-11-26), worst step vs the CPU fp8 runner: llama 2.1e-2, qwen2 2.9e-2, gemma3 5.1e-2,
// qwen3 2.7e-2 (int8: 1.3e-2 to 2.0e-2); the first bound, x 5/3 = 5e-2, failed gemma3's 5.07e-2.
constexpr double kFp8KvLogitTolerance = kBf16LogitTolerance * 3;
constexpr float kFp8KvNearTieMargin = kNearTieMargin * 3;
// Mixture-of-experts models: where a token's k-th and (k+1)-th router probabilities are within
// bf16 rounding of each other, the GPU may route it to another expert than the f32 reference,
// and that row's logits move by far more than the bf16 tolerance. Such a row is allowed only at
// a position the fixture's router_gaps.json (scripts/moe_router_gaps.py --dump-gaps: an f64
// forward of the f32 fixture, matching the goldens to ~1e-6) marks as a near-tie: a router gap
// below kRouterNearTieGap in some layer. The flips measured on the H100 and H200 sat at gaps of
// 1e-4 to 8.9e-3; the same f64 forward with those experts swapped reproduces the GPU's rows to
// ~0.01. A flipped row must still be a sane logit row (below kRoutingFlipRowBound).
constexpr double kRouterNearTieGap = 1.5e-2;
constexpr double kRoutingFlipRowBound = 1.5;
// gpt_oss's tiny fixture has larger activations: the f64 forward with bf16 weights and bf16
// inputs to every product (moe_router_gaps.py --bf16-acts) is 3.8e-2 from the goldens on a
// 1-token prompt (no routing flip), where the other models sit near 1e-2.
double bf16_tolerance(const std::string& model) {
  return model == "gpt_oss" ? 5e-2 : kBf16LogitTolerance;
}

struct Tiny {
  ModelSpec spec;
  std::unique_ptr<WeightSource> weights;
  std::vector<std::vector<int32_t>> prompts, greedy;
  std::vector<std::vector<float>> logits;  // [prompt][len * vocab]
};

// The tiny models written as GGUF in llama.cpp's layout (tests/model/make_tiny_gguf.py, which the
// GPU packages run: scripts/gpu/tiny-gguf.sh).
const char* kTinyGguf = "tests/model/fixtures/tiny_gguf/";

// A fixture's spec and weights (from its safetensors, or from its GGUF twin when `gguf`) and
// transformers' goldens.
Tiny load_tiny(const std::string& name, bool gguf = false) {
  const std::string dir = kFixtures + name;
  Tiny t;
  if (gguf) {
    const std::string path = kTinyGguf + name + ".gguf";
    auto file = GgufFile::open(path);
    KVP_CHECK(file.is_ok(), "{} (written by scripts/gpu/tiny-gguf.sh into the GPU package)",
              file.status().to_string());
    auto shared = std::make_shared<const GgufFile>(std::move(file).value());
    t.spec = model_spec_from_gguf(*shared).value();
    t.weights = std::make_unique<GgufWeights>(shared, t.spec.architecture);
  } else {
    t.spec = load_hf_config(dir + "/config.json").value();
    t.weights = SafetensorsWeights::open(dir + "/model.safetensors").value();
  }
  auto golden = SafetensorsWeights::open(dir + "/golden.safetensors").value();
  for (int i = 0; golden->contains("prompt_" + std::to_string(i)); ++i) {
    const std::string s = std::to_string(i);
    t.prompts.push_back(read_int_tensor(golden->model(), "prompt_" + s).value());
    t.greedy.push_back(read_int_tensor(golden->model(), "greedy_" + s).value());
    const SafetensorsTensor* logits = *golden->model().tensor("logits_" + s);
    const std::vector<int64_t> shape(logits->shape.begin(), logits->shape.end());
    t.logits.push_back(golden->read_f32("logits_" + s, shape).value());
  }
  return t;
}

// [prompt][position] the smallest router probability gap over the MoE layers (router_gaps.json
// of an MoE fixture; empty for dense models).
std::vector<std::vector<double>> router_gaps(const std::string& name) {
  std::ifstream in(kFixtures + name + "/router_gaps.json");
  if (!in) return {};
  const auto j = nlohmann::json::parse(in);
  std::vector<std::vector<double>> gaps;
  for (int i = 0; j["min_gap_per_position"].contains("prompt_" + std::to_string(i)); ++i) {
    gaps.push_back(j["min_gap_per_position"]["prompt_" + std::to_string(i)]);
  }
  return gaps;
}

// Rows [rows][vocab] of got against want, row r at position first_position + r of the prompt's
// ids (prompt + greedy), in an MoE model: the rows together within the model's bf16 tolerance
// once routing flips are set aside, where a routing flip is a row outside the tolerance at a
// near-tie position (above); every other row within kRowToleranceFactor times the tolerance (one
// row's relative error swings more than the whole's: gpt_oss prompt 3 position 24, whose logits
// the f64 forward with bf16 weights and activations also puts furthest from the goldens among the
// rows without a flip, 4.7e-2, was 6.6e-2 on the H100). Returns the rows outside the tolerance.
constexpr double kRowToleranceFactor = 2.5;
int32_t expect_rows_within_tolerance(const std::string& model, int32_t prompt,
                                     int32_t first_position, std::span<const float> got,
                                     std::span<const float> want, int32_t vocab, const char* what) {
  static std::map<std::string, std::vector<std::vector<double>>> cache;
  if (!cache.count(model)) cache[model] = router_gaps(model);
  const auto& gaps = cache[model];
  const double tolerance = bf16_tolerance(model);
  const auto rows = static_cast<int32_t>(want.size() / vocab);
  int32_t over = 0;
  std::vector<float> kept_got, kept_want;  // the rows that are not routing flips
  for (int32_t r = 0; r < rows; ++r) {
    const auto g = got.subspan(size_t(r) * vocab, vocab);
    const auto w = want.subspan(size_t(r) * vocab, vocab);
    const double err = relative_error(g, w);
    const int32_t position = first_position + r;
    const double gap = size_t(prompt) < gaps.size() && size_t(position) < gaps[prompt].size()
                           ? gaps[prompt][position]
                           : INFINITY;
    const bool flip = err >= tolerance && gap < kRouterNearTieGap;
    if (!flip) {
      kept_got.insert(kept_got.end(), g.begin(), g.end());
      kept_want.insert(kept_want.end(), w.begin(), w.end());
    }
    if (err < tolerance) continue;
    ++over;
    std::printf("[ %s ] %s prompt %d position %d: row rel err %.3e, router gap %.2e%s\n", what,
                model.c_str(), prompt, position, err, gap, flip ? " (routing flip)" : "");
    EXPECT_LT(err, flip ? kRoutingFlipRowBound : kRowToleranceFactor * tolerance)
        << model << " " << what << " prompt " << prompt << " position " << position
        << ", router gap " << gap;
  }
  if (!kept_want.empty()) {
    EXPECT_LT(relative_error(kept_got, kept_want), tolerance)
        << model << " " << what << " prompt " << prompt << ": the rows without a routing flip";
  }
  return over;
}

// The goldens were generated with min_new_tokens: end-of-sequence logits are -inf at every step.
std::vector<float> masked(std::span<const float> row, const ModelSpec& spec) {
  std::vector<float> m(row.begin(), row.end());
  for (int32_t eos : spec.eos_token_ids) m[eos] = -INFINITY;
  return m;
}
float top2_margin(std::vector<float> row) {
  std::partial_sort(row.begin(), row.begin() + 2, row.end(), std::greater<float>());
  return row[0] - row[1];
}

// Block tables of `num_seqs` sequences per cache group, drawn from a shuffled pool so no
// sequence's blocks are contiguous.
struct Tables {
  int32_t block_size = 0, max_blocks = 0, num_blocks = 0;
  std::vector<std::vector<int32_t>> ids;  // [group][seq * max_blocks + i]

  Tables(int32_t num_groups, int32_t num_seqs, int32_t max_tokens, int32_t block_size_,
         uint64_t seed)
      : block_size(block_size_), max_blocks((max_tokens + block_size_ - 1) / block_size_) {
    num_blocks = num_seqs * max_blocks + 5;
    std::mt19937_64 rng(seed);
    for (int32_t g = 0; g < num_groups; ++g) {
      std::vector<int32_t> all(num_blocks);
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      all.resize(static_cast<size_t>(num_seqs) * max_blocks);
      ids.push_back(std::move(all));
    }
  }
};

// One step's batch: sequences `seqs` (indices into the tables) bring new_tokens[i] after
// kv_before[i] cached tokens; logits for every row.
struct Step {
  std::vector<int32_t> token_ids, query_start{0}, kv_lens, logit_rows, tables_flat;
  std::vector<std::vector<int64_t>> slots;
  std::vector<std::vector<int32_t>> tables;
  ForwardBatch batch;

  Step(const Tables& t, const std::vector<int32_t>& seqs,
       const std::vector<std::vector<int32_t>>& new_tokens, const std::vector<int32_t>& kv_before) {
    const size_t num_groups = t.ids.size();
    slots.resize(num_groups);
    tables.resize(num_groups);
    for (size_t i = 0; i < seqs.size(); ++i) {
      token_ids.insert(token_ids.end(), new_tokens[i].begin(), new_tokens[i].end());
      query_start.push_back(static_cast<int32_t>(token_ids.size()));
      kv_lens.push_back(kv_before[i] + static_cast<int32_t>(new_tokens[i].size()));
    }
    for (size_t g = 0; g < num_groups; ++g) {
      for (size_t i = 0; i < seqs.size(); ++i) {
        const int32_t* row = t.ids[g].data() + static_cast<size_t>(seqs[i]) * t.max_blocks;
        tables[g].insert(tables[g].end(), row, row + t.max_blocks);
        for (size_t k = 0; k < new_tokens[i].size(); ++k) {
          const int64_t pos = kv_before[i] + static_cast<int64_t>(k);
          slots[g].push_back(int64_t{row[pos / t.block_size]} * t.block_size + pos % t.block_size);
        }
      }
    }
    for (int32_t r = 0; r < static_cast<int32_t>(token_ids.size()); ++r) logit_rows.push_back(r);
    batch.token_ids = token_ids;
    batch.query_start = query_start;
    batch.kv_lens = kv_lens;
    batch.logit_rows = logit_rows;
    for (size_t g = 0; g < num_groups; ++g) {
      batch.groups.push_back({slots[g], tables[g], t.max_blocks});
    }
  }
};

// The CUDA backend and the CPU runner (f32 KV unless told) side by side over the same tables.
struct Pair {
  Tiny tiny;
  std::unique_ptr<ForwardBackend> gpu;
  std::unique_ptr<ModelRunner> cpu;
  std::vector<HostKvSlab> slabs;

  Pair(const std::string& name, const Tables& t, DType gpu_dtype = DType::BF16,
       DType cpu_dtype = DType::F32, bool gguf = false)
      : tiny(load_tiny(name, gguf)) {
    auto backend = make_cuda_backend(tiny.spec, *tiny.weights);
    KVP_CHECK(backend.is_ok(), "{}", backend.status().to_string());
    gpu = std::move(backend).value();
    std::vector<KvLayout> layouts;
    for (int32_t g = 0; g < gpu->num_cache_groups(); ++g) {
      layouts.push_back(gpu->group_layout(g, t.num_blocks, t.block_size, gpu_dtype));
    }
    const Status st = gpu->allocate_kv(layouts);
    KVP_CHECK(st.is_ok(), "{}", st.to_string());
    cpu = std::make_unique<ModelRunner>(tiny.spec,
                                        load_model_weights(tiny.spec, *tiny.weights).value());
    for (int32_t g = 0; g < cpu->num_cache_groups(); ++g) {
      HostKvSlab slab;
      slab.layout = cpu->group_layout(g, t.num_blocks, t.block_size, cpu_dtype);
      slab.bytes.assign(slab.layout.size_bytes(), std::byte{0});
      slabs.push_back(std::move(slab));
    }
  }
  int32_t vocab() const { return tiny.spec.vocab_size; }
  std::vector<float> run_gpu(Step& s) {
    std::vector<float> logits(s.logit_rows.size() * vocab());
    const Status st = gpu->forward(s.batch, logits);
    KVP_CHECK(st.is_ok(), "{}", st.to_string());
    return logits;
  }
  std::vector<float> run_cpu(Step& s) {
    std::vector<float> logits(s.logit_rows.size() * vocab());
    const Status st = cpu->forward(s.batch, slabs, logits);
    KVP_CHECK(st.is_ok(), "{}", st.to_string());
    return logits;
  }
};

// Cache groups of a spec (as the runners assign them).
int32_t groups_of(const ModelSpec& spec) {
  const auto sliding = std::count(spec.layer_is_sliding.begin(), spec.layer_is_sliding.end(), true);
  return sliding > 0 && sliding < static_cast<long>(spec.layer_is_sliding.size()) ? 2 : 1;
}

class CudaTinyModel : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaTinyModel, PrefillLogitsMatchTransformersAndCpuRunner) {
  SKIP_WITHOUT_GPU();
  const Tiny probe = load_tiny(GetParam());
  for (size_t p = 0; p < probe.prompts.size(); ++p) {
    const auto& prompt = probe.prompts[p];
    Tables t(groups_of(probe.spec), 1, static_cast<int32_t>(prompt.size()), 4, 17 + p);
    Pair pair(GetParam(), t);
    Step s(t, {0}, {prompt}, {0});
    const auto gpu = pair.run_gpu(s);
    const auto cpu = pair.run_cpu(s);
    const double err_hf = relative_error(gpu, probe.logits[p]);
    const double err_cpu = relative_error(gpu, cpu);
    std::printf(
        "[ prefill ] %s prompt %zu (%zu tokens): rel err vs transformers %.3e, vs cpu %.3e\n",
        GetParam(), p, prompt.size(), err_hf, err_cpu);
    if (!probe.spec.is_moe()) {
      EXPECT_LT(err_hf, kBf16LogitTolerance) << GetParam() << " prompt " << p;
      EXPECT_LT(err_cpu, kBf16LogitTolerance) << GetParam() << " prompt " << p;
      continue;
    }
    // row by row: a row outside the tolerance must be a routing flip at a near-tie
    const int32_t vocab = pair.vocab();
    expect_rows_within_tolerance(GetParam(), static_cast<int32_t>(p), 0, gpu, probe.logits[p],
                                 vocab, "prefill vs transformers");
    expect_rows_within_tolerance(GetParam(), static_cast<int32_t>(p), 0, gpu, cpu, vocab,
                                 "prefill vs cpu");
  }
}

// All prompts in one batch; prefill, then 31 decode steps fed with transformers' greedy tokens
// (teacher forcing), the CPU runner in lockstep. Every step's GPU argmax must equal
// transformers' token unless the CPU runner's f32 top-2 margin marks a near-tie.
TEST_P(CudaTinyModel, TeacherForcedGreedyAgreesWithTransformers) {
  SKIP_WITHOUT_GPU();
  const Tiny probe = load_tiny(GetParam());
  const int32_t n = static_cast<int32_t>(probe.prompts.size());
  const int32_t new_tokens = static_cast<int32_t>(probe.greedy[0].size());
  int32_t max_len = 0;
  for (const auto& p : probe.prompts) max_len = std::max<int32_t>(max_len, p.size() + new_tokens);
  Tables t(groups_of(probe.spec), n, max_len, 4, 5);
  Pair pair(GetParam(), t);
  const int32_t vocab = pair.vocab();
  std::vector<int32_t> seqs(n), cached(n, 0);
  std::iota(seqs.begin(), seqs.end(), 0);
  Step prefill(t, seqs, probe.prompts, cached);
  auto gpu = pair.run_gpu(prefill);
  auto cpu = pair.run_cpu(prefill);
  std::vector<size_t> last_row(n);
  for (int32_t i = 0; i < n; ++i) {
    last_row[i] = prefill.query_start[i + 1] - 1;
    cached[i] = static_cast<int32_t>(probe.prompts[i].size());
  }
  int32_t agree = 0, total = 0, near_ties = 0, rows_over = 0;
  double worst_err = 0, worst_row_err = 0;
  for (int32_t step = 0; step < new_tokens; ++step) {
    for (int32_t i = 0; i < n; ++i) {
      const auto g = masked(std::span(gpu).subspan(last_row[i] * vocab, vocab), probe.spec);
      const auto c = masked(std::span(cpu).subspan(last_row[i] * vocab, vocab), probe.spec);
      const int32_t want = probe.greedy[i][step];
      ++total;
      if (argmax(g) == want) {
        ++agree;
      } else {
        const float margin = top2_margin(c);
        EXPECT_LT(margin, kNearTieMargin)
            << GetParam() << " prompt " << i << " step " << step << ": gpu picks " << argmax(g)
            << ", transformers " << want << ", f32 margin " << margin;
        ++near_ties;
      }
    }
    if (step + 1 == new_tokens) break;
    std::vector<std::vector<int32_t>> next(n);
    for (int32_t i = 0; i < n; ++i) next[i] = {probe.greedy[i][step]};
    Step s(t, seqs, next, cached);
    gpu = pair.run_gpu(s);
    cpu = pair.run_cpu(s);
    worst_err = std::max(worst_err, relative_error(gpu, cpu));
    for (int32_t i = 0; i < n; ++i) {
      const auto g_row = std::span<const float>(gpu).subspan(size_t(i) * vocab, vocab);
      const auto c_row = std::span<const float>(cpu).subspan(size_t(i) * vocab, vocab);
      worst_row_err = std::max(worst_row_err, relative_error(g_row, c_row));
      if (probe.spec.is_moe()) {  // a row outside the tolerance: a routing flip at a near-tie
        rows_over += expect_rows_within_tolerance(GetParam(), i, cached[i], g_row, c_row, vocab,
                                                  "teacher decode vs cpu");
      }
      last_row[i] = i;
      cached[i] += 1;
    }
  }
  std::printf(
      "[ teacher ] %s: %d/%d greedy steps agree with transformers (%d near-ties), worst "
      "decode-step rel err vs cpu %.3e, worst row %.3e (%d rows over %.0e)\n",
      GetParam(), agree, total, near_ties, worst_err, worst_row_err, rows_over,
      bf16_tolerance(GetParam()));
  if (!probe.spec.is_moe()) {
    EXPECT_LT(worst_err, kBf16LogitTolerance);
  }
}

// Free-running greedy decoding, all prompts batched: reported, and checked against
// transformers' continuations up to the first step the f32 reference calls a near-tie.
// Every prompt in one batch, prefill then greedy decoding on the GPU alone, as many tokens as
// transformers' goldens hold; the model from its safetensors or its GGUF twin.
std::vector<std::vector<int32_t>> free_greedy(const std::string& name, const Tiny& probe,
                                              bool gguf) {
  const int32_t n = static_cast<int32_t>(probe.prompts.size());
  const int32_t new_tokens = static_cast<int32_t>(probe.greedy[0].size());
  int32_t max_len = 0;
  for (const auto& p : probe.prompts) max_len = std::max<int32_t>(max_len, p.size() + new_tokens);
  Tables t(groups_of(probe.spec), n, max_len, 16, 9);
  Pair pair(name, t, DType::BF16, DType::F32, gguf);
  const int32_t vocab = pair.vocab();
  std::vector<int32_t> seqs(n), cached(n, 0);
  std::iota(seqs.begin(), seqs.end(), 0);
  Step prefill(t, seqs, probe.prompts, cached);
  auto gpu = pair.run_gpu(prefill);
  std::vector<std::vector<int32_t>> out(n);
  std::vector<int32_t> next(n);
  for (int32_t i = 0; i < n; ++i) {
    next[i] = argmax(masked(std::span(gpu).subspan((prefill.query_start[i + 1] - 1) * vocab, vocab),
                            probe.spec));
    cached[i] = static_cast<int32_t>(probe.prompts[i].size());
  }
  for (int32_t step = 0; step < new_tokens; ++step) {
    std::vector<std::vector<int32_t>> tok(n);
    for (int32_t i = 0; i < n; ++i) {
      out[i].push_back(next[i]);
      tok[i] = {next[i]};
    }
    if (step + 1 == new_tokens) break;
    Step s(t, seqs, tok, cached);
    gpu = pair.run_gpu(s);
    for (int32_t i = 0; i < n; ++i) {
      cached[i] += 1;
      next[i] = argmax(masked(std::span(gpu).subspan(i * vocab, vocab), probe.spec));
    }
  }
  return out;
}

TEST_P(CudaTinyModel, FreeGreedyMatchesTransformersUntilANearTie) {
  SKIP_WITHOUT_GPU();
  const Tiny probe = load_tiny(GetParam());
  const int32_t n = static_cast<int32_t>(probe.prompts.size());
  int32_t max_len = 0;
  for (const auto& p : probe.prompts) {
    max_len = std::max<int32_t>(max_len, p.size() + probe.greedy[0].size());
  }
  const int32_t vocab = probe.spec.vocab_size;
  const std::vector<std::vector<int32_t>> out = free_greedy(GetParam(), probe, false);
  int32_t exact = 0;
  for (int32_t i = 0; i < n; ++i) {
    size_t first_diff = 0;
    while (first_diff < out[i].size() && out[i][first_diff] == probe.greedy[i][first_diff]) {
      ++first_diff;
    }
    if (first_diff == out[i].size()) {
      ++exact;
      continue;
    }
    // The first divergence must be a near-tie of the f32 reference: replay the golden prefix
    // through the CPU runner and read its margin at that step.
    Tables tc(groups_of(probe.spec), 1, max_len, 16, 11);
    Pair ref(GetParam(), tc);
    std::vector<int32_t> prefix = probe.prompts[i];
    prefix.insert(prefix.end(), probe.greedy[i].begin(), probe.greedy[i].begin() + first_diff);
    Step s(tc, {0}, {prefix}, {0});
    const auto c = ref.run_cpu(s);
    const float margin =
        top2_margin(masked(std::span(c).subspan((prefix.size() - 1) * vocab, vocab), probe.spec));
    std::printf("[ greedy  ] %s prompt %d: diverges at step %zu, f32 top-2 margin there %.4f\n",
                GetParam(), i, first_diff, margin);
    EXPECT_LT(margin, kNearTieMargin) << GetParam() << " prompt " << i << " step " << first_diff;
  }
  std::printf("[ greedy  ] %s: %d/%d prompts give transformers' 32 greedy tokens exactly\n",
              GetParam(), exact, n);
}

INSTANTIATE_TEST_SUITE_P(Architectures, CudaTinyModel,
                         ::testing::Values("llama", "qwen2", "gemma3", "qwen3", "qwen2_moe",
                                           "qwen3_moe", "gpt_oss"));

// The tiny models from their GGUF twins (llama.cpp's layout: Llama's permuted q/k rows, Gemma's
// 1 + w norms, the experts' 3-D tensors, GPT-OSS's split gate/up): the CUDA backend reads the
// same weights as from safetensors, so its prefill logits and greedy tokens are the safetensors
// backend's (same device, same bf16 values, same batches), and its logits transformers' within
// the bf16 tolerance.
class CudaTinyGguf : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaTinyGguf, LlamaCppLayoutGivesTheSafetensorsModel) {
  SKIP_WITHOUT_GPU();
  const Tiny probe = load_tiny(GetParam());
  const Tiny from_gguf = load_tiny(GetParam(), true);
  EXPECT_EQ(from_gguf.spec.architecture, probe.spec.architecture);
  EXPECT_EQ(from_gguf.spec.layer_is_sliding, probe.spec.layer_is_sliding);
  EXPECT_EQ(from_gguf.spec.num_experts, probe.spec.num_experts);
  EXPECT_EQ(from_gguf.spec.layer_is_moe, probe.spec.layer_is_moe);
  for (size_t p = 0; p < probe.prompts.size(); ++p) {
    const auto& prompt = probe.prompts[p];
    Tables t(groups_of(probe.spec), 1, static_cast<int32_t>(prompt.size()), 4, 41 + p);
    Pair hf(GetParam(), t), gguf(GetParam(), t, DType::BF16, DType::F32, true);
    Step s(t, {0}, {prompt}, {0});
    const auto from_hf = hf.run_gpu(s);
    const auto got = gguf.run_gpu(s);
    const double err_same = relative_error(got, from_hf);
    const double err_golden = relative_error(got, probe.logits[p]);
    std::printf(
        "[ gguf    ] %s prompt %zu: rel err vs the safetensors backend %.3e, vs "
        "transformers %.3e\n",
        GetParam(), p, err_same, err_golden);
    EXPECT_LT(err_same, 1e-6) << GetParam() << " prompt " << p;
    if (probe.spec.is_moe()) {
      expect_rows_within_tolerance(GetParam(), static_cast<int32_t>(p), 0, got, probe.logits[p],
                                   gguf.vocab(), "gguf prefill vs transformers");
    } else {
      EXPECT_LT(err_golden, kBf16LogitTolerance) << GetParam() << " prompt " << p;
    }
  }
  EXPECT_EQ(free_greedy(GetParam(), probe, true), free_greedy(GetParam(), probe, false))
      << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Architectures, CudaTinyGguf,
                         ::testing::Values("llama", "qwen2", "gemma3", "qwen3", "qwen2_moe",
                                           "qwen3_moe", "gpt_oss"));

// 8-bit KV (int8, fp8 e4m3) on both sides: the CUDA backend (bf16 K/V rows quantised by the KV
// write, 8-bit attention kernels) against the CPU runner's pool of the same dtype (f32 rows
// quantised), all prompts in one batch, prefill then 31 decode steps fed with transformers'
// greedy tokens. Every step's GPU argmax must equal the CPU 8-bit runner's unless the CPU's top-2
// margin marks a near-tie, and the logits must agree within the bf16 tolerance (fp8: see
// kFp8KvLogitTolerance).
class CudaKv8 : public ::testing::TestWithParam<std::tuple<const char*, DType>> {};

TEST_P(CudaKv8, TeacherForcedMatchesTheCpu8BitRunner) {
  SKIP_WITHOUT_GPU();
  const auto [arch, kv_dtype] = GetParam();
  const Tiny probe = load_tiny(arch);
  const int32_t n = static_cast<int32_t>(probe.prompts.size());
  const int32_t new_tokens = static_cast<int32_t>(probe.greedy[0].size());
  int32_t max_len = 0;
  for (const auto& p : probe.prompts) max_len = std::max<int32_t>(max_len, p.size() + new_tokens);
  Tables t(groups_of(probe.spec), n, max_len, 16, 23);
  Pair pair(arch, t, kv_dtype, kv_dtype);
  const int32_t vocab = pair.vocab();
  std::vector<int32_t> seqs(n), cached(n, 0);
  std::iota(seqs.begin(), seqs.end(), 0);
  Step prefill(t, seqs, probe.prompts, cached);
  auto gpu = pair.run_gpu(prefill);
  auto cpu = pair.run_cpu(prefill);
  double worst_err = relative_error(gpu, cpu);
  std::vector<size_t> last_row(n);
  for (int32_t i = 0; i < n; ++i) {
    last_row[i] = prefill.query_start[i + 1] - 1;
    cached[i] = static_cast<int32_t>(probe.prompts[i].size());
  }
  int32_t agree = 0, agree_hf = 0, total = 0;
  for (int32_t step = 0; step < new_tokens; ++step) {
    for (int32_t i = 0; i < n; ++i) {
      const auto g = masked(std::span(gpu).subspan(last_row[i] * vocab, vocab), probe.spec);
      const auto c = masked(std::span(cpu).subspan(last_row[i] * vocab, vocab), probe.spec);
      ++total;
      agree_hf += argmax(g) == probe.greedy[i][step];
      if (argmax(g) == argmax(c)) {
        ++agree;
      } else {
        const float margin = top2_margin(c);
        EXPECT_LT(margin, kv_dtype == DType::FP8 ? kFp8KvNearTieMargin : kNearTieMargin)
            << arch << " prompt " << i << " step " << step << ": gpu picks " << argmax(g)
            << ", cpu " << dtype_name(kv_dtype) << " " << argmax(c) << ", cpu margin " << margin;
      }
    }
    if (step + 1 == new_tokens) break;
    std::vector<std::vector<int32_t>> next(n);
    for (int32_t i = 0; i < n; ++i) next[i] = {probe.greedy[i][step]};
    Step s(t, seqs, next, cached);
    gpu = pair.run_gpu(s);
    cpu = pair.run_cpu(s);
    worst_err = std::max(worst_err, relative_error(gpu, cpu));
    for (int32_t i = 0; i < n; ++i) {
      last_row[i] = i;
      cached[i] += 1;
    }
  }
  const std::string name(dtype_name(kv_dtype));
  std::printf(
      "[ %s kv ] %s: %d/%d greedy steps agree with the cpu %s runner, %d/%d with "
      "transformers (f32 KV); worst step rel err vs cpu %s %.3e\n",
      name.c_str(), arch, agree, total, name.c_str(), agree_hf, total, name.c_str(), worst_err);
  EXPECT_LT(worst_err, kv_dtype == DType::FP8 ? kFp8KvLogitTolerance : kBf16LogitTolerance);
}

INSTANTIATE_TEST_SUITE_P(Architectures, CudaKv8,
                         ::testing::Combine(::testing::Values("llama", "qwen2", "gemma3", "qwen3"),
                                            ::testing::Values(DType::I8, DType::FP8)),
                         [](const ::testing::TestParamInfo<std::tuple<const char*, DType>>& info) {
                           return std::string(std::get<0>(info.param)) + "_" +
                                  std::string(dtype_name(std::get<1>(info.param)));
                         });

// A prefill and a decode in one batch give each sequence's logits as when it runs alone.
class CudaMixedBatch : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaMixedBatch, PrefillPlusDecodeEqualsEachAlone) {
  SKIP_WITHOUT_GPU();
  const Tiny probe = load_tiny(GetParam());
  const auto& a = probe.prompts[2];  // prefilled in the mixed step
  const auto& b = probe.prompts[3];  // prefilled first, decodes in the mixed step
  const int32_t b_next = probe.greedy[3][0];
  const int32_t max_len = static_cast<int32_t>(std::max(a.size(), b.size()) + 2);
  Tables t(groups_of(probe.spec), 2, max_len, 4, 77);
  Pair mixed(GetParam(), t);
  const int32_t vocab = mixed.vocab();
  Step b_prefill(t, {1}, {b}, {0});
  mixed.run_gpu(b_prefill);
  Step both(t, {0, 1}, {a, {b_next}}, {0, static_cast<int32_t>(b.size())});
  const auto got = mixed.run_gpu(both);

  Pair alone(GetParam(), t);
  Step a_alone(t, {0}, {a}, {0});
  const auto want_a = alone.run_gpu(a_alone);
  alone.run_gpu(b_prefill);
  Step b_alone(t, {1}, {{b_next}}, {static_cast<int32_t>(b.size())});
  const auto want_b = alone.run_gpu(b_alone);

  const double err_a = relative_error(std::span(got).first(a.size() * vocab), want_a);
  const double err_b = relative_error(std::span(got).subspan(a.size() * vocab, vocab), want_b);
  std::printf("[ mixed   ] %s: prefill rows rel err %.3e, decode row rel err %.3e\n", GetParam(),
              err_a, err_b);
  EXPECT_LT(err_a, kSameDeviceTolerance);
  EXPECT_LT(err_b, kSameDeviceTolerance);
}

INSTANTIATE_TEST_SUITE_P(Architectures, CudaMixedBatch,
                         ::testing::Values("llama", "gemma3", "qwen2_moe", "qwen3_moe", "gpt_oss"));

// Mixture-of-experts models, each prompt alone: prefilled in chunks of 5 tokens (each chunk
// attends to the cached ones), every chunk's logits against transformers', then 32 greedy tokens
// decoded alone (CUDA graphs), equal to transformers' up to the first near-tie of the f32 CPU
// runner.
class CudaMoeAlone : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaMoeAlone, ChunkedPrefillAndGreedyDecodeMatchTransformers) {
  SKIP_WITHOUT_GPU();
  const Tiny probe = load_tiny(GetParam());
  const int32_t new_tokens = static_cast<int32_t>(probe.greedy[0].size());
  constexpr int32_t kChunk = 5;
  int32_t exact = 0;
  for (size_t p = 0; p < probe.prompts.size(); ++p) {
    const auto& prompt = probe.prompts[p];
    const auto len = static_cast<int32_t>(prompt.size());
    Tables t(groups_of(probe.spec), 1, len + new_tokens, 4, 31 + p);
    Pair pair(GetParam(), t);
    const int32_t vocab = pair.vocab();
    std::vector<float> logits;
    for (int32_t begin = 0; begin < len; begin += kChunk) {
      const int32_t end = std::min(len, begin + kChunk);
      Step s(t, {0}, {std::vector<int32_t>(prompt.begin() + begin, prompt.begin() + end)}, {begin});
      const auto part = pair.run_gpu(s);
      logits.insert(logits.end(), part.begin(), part.end());
    }
    const double err = relative_error(logits, probe.logits[p]);
    std::printf(
        "[ chunked ] %s prompt %zu (%d tokens, chunks of %d): rel err vs transformers %.3e\n",
        GetParam(), p, len, kChunk, err);
    expect_rows_within_tolerance(GetParam(), static_cast<int32_t>(p), 0, logits, probe.logits[p],
                                 vocab, "chunked prefill vs transformers");
    std::vector<int32_t> out;
    int32_t next =
        argmax(masked(std::span(logits).subspan(size_t(len - 1) * vocab, vocab), probe.spec));
    for (int32_t step = 0; step < new_tokens; ++step) {
      out.push_back(next);
      if (step + 1 == new_tokens) break;
      Step s(t, {0}, {{next}}, {len + step});
      next = argmax(masked(pair.run_gpu(s), probe.spec));
    }
    size_t first_diff = 0;
    while (first_diff < out.size() && out[first_diff] == probe.greedy[p][first_diff]) ++first_diff;
    if (first_diff == out.size()) {
      ++exact;
      continue;
    }
    std::vector<int32_t> prefix = prompt;
    prefix.insert(prefix.end(), probe.greedy[p].begin(), probe.greedy[p].begin() + first_diff);
    Tables tc(groups_of(probe.spec), 1, static_cast<int32_t>(prefix.size()), 16, 11);
    Pair ref(GetParam(), tc);
    Step s(tc, {0}, {prefix}, {0});
    const auto c = ref.run_cpu(s);
    const float margin =
        top2_margin(masked(std::span(c).subspan((prefix.size() - 1) * vocab, vocab), probe.spec));
    std::printf("[ alone   ] %s prompt %zu: diverges at step %zu, f32 top-2 margin there %.4f\n",
                GetParam(), p, first_diff, margin);
    EXPECT_LT(margin, kNearTieMargin) << GetParam() << " prompt " << p << " step " << first_diff;
  }
  std::printf("[ alone   ] %s: %d/%zu prompts give transformers' greedy tokens exactly\n",
              GetParam(), exact, probe.prompts.size());
}

INSTANTIATE_TEST_SUITE_P(Architectures, CudaMoeAlone,
                         ::testing::Values("qwen2_moe", "qwen3_moe", "gpt_oss"));

// Prompt steps through the experts' GEMMs (model/cuda/moe_gemm.h): KVP_MOE_GEMM_MIN_TOKENS=1
// sends every eager step there (the tiny prompts are under the default threshold), one cuBLAS
// call per expert ("loop") and one grouped call per projection; each prompt whole and in chunks
// of 5, every row against transformers within the model's tolerance.
class CudaMoeGemm : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaMoeGemm, PromptStepsThroughExpertGemmsMatchTransformers) {
  SKIP_WITHOUT_GPU();
  struct Env {  // set for the runners made below, unset however the test ends
    Env() { setenv("KVP_MOE_GEMM_MIN_TOKENS", "1", 1); }
    ~Env() {
      unsetenv("KVP_MOE_GEMM_MIN_TOKENS");
      unsetenv("KVP_MOE_GEMM");
    }
  } env;
  const Tiny probe = load_tiny(GetParam());
  for (const char* mode : {"loop", "grouped"}) {
    setenv("KVP_MOE_GEMM", mode, 1);
    for (const int32_t chunk : {1 << 20, 5}) {
      for (size_t p = 0; p < probe.prompts.size(); ++p) {
        const auto& prompt = probe.prompts[p];
        const auto len = static_cast<int32_t>(prompt.size());
        Tables t(groups_of(probe.spec), 1, len, 4, 31 + p);
        Pair pair(GetParam(), t);
        std::vector<float> logits;
        for (int32_t begin = 0; begin < len; begin += chunk) {
          const int32_t end = std::min(len, begin + chunk);
          Step s(t, {0}, {std::vector<int32_t>(prompt.begin() + begin, prompt.begin() + end)},
                 {begin});
          const auto part = pair.run_gpu(s);
          logits.insert(logits.end(), part.begin(), part.end());
        }
        std::printf("[ moe gemm] %s %s prompt %zu (%d tokens, chunks of %d): rel err %.3e\n",
                    GetParam(), mode, p, len, std::min(chunk, len),
                    relative_error(logits, probe.logits[p]));
        expect_rows_within_tolerance(GetParam(), static_cast<int32_t>(p), 0, logits,
                                     probe.logits[p], pair.vocab(),
                                     "expert GEMM prefill vs transformers");
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Architectures, CudaMoeGemm,
                         ::testing::Values("qwen2_moe", "qwen3_moe", "gpt_oss"));

// Decode-only batches run as CUDA graphs (padded to 4 sequences here, and re-captured as the
// context crosses powers of two): the same steps eagerly give the same logits.
TEST(CudaForwardBackendGraphs, DecodeGraphsMatchEagerSteps) {
  SKIP_WITHOUT_GPU();
  for (const char* name : {"llama", "gemma3", "qwen3_moe", "gpt_oss"}) {
    const Tiny probe = load_tiny(name);
    const std::vector<int32_t> members = {1, 2, 3};  // 3 sequences: one padding sequence
    const int32_t steps = 24;
    int32_t max_len = 0;
    for (int32_t m : members) max_len = std::max<int32_t>(max_len, probe.prompts[m].size() + steps);
    Tables t(groups_of(probe.spec), 3, max_len, 8, 21);
    Pair graphs(name, t), eager(name, t);
    static_cast<CudaForwardBackend&>(*eager.gpu).runner().set_graphs_enabled(false);
    static_cast<CudaForwardBackend&>(*graphs.gpu).runner().set_graphs_enabled(true);
    std::vector<int32_t> seqs = {0, 1, 2}, cached(3, 0);
    std::vector<std::vector<int32_t>> prompts;
    for (int32_t m : members) prompts.push_back(probe.prompts[m]);
    Step prefill(t, seqs, prompts, cached);
    graphs.run_gpu(prefill);
    eager.run_gpu(prefill);
    for (int32_t i = 0; i < 3; ++i) cached[i] = static_cast<int32_t>(prompts[i].size());
    double worst = 0;
    for (int32_t step = 0; step < steps; ++step) {
      std::vector<std::vector<int32_t>> next;
      for (int32_t i = 0; i < 3; ++i) next.push_back({probe.greedy[members[i]][step]});
      Step s(t, seqs, next, cached);
      const auto a = graphs.run_gpu(s);
      const auto b = eager.run_gpu(s);
      worst = std::max(worst, relative_error(a, b));
      for (int32_t& c : cached) c += 1;
    }
    const int32_t captured = static_cast<CudaForwardBackend&>(*graphs.gpu).runner().num_graphs();
    std::printf("[ graphs  ] %s: %d decode graphs captured, worst rel err vs eager %.3e\n", name,
                captured, worst);
    EXPECT_GT(captured, 0) << name;
    EXPECT_LT(worst, kSameDeviceTolerance) << name;
  }
}

// forward_summarized's rows against forward's: every summary is the first maximum of its row and
// the row's log-sum-exp (double, computed here), and the rows asked for come back packed and
// equal to forward's. Checked on a prefill and a decode (graph) step of the tiny models, and on
// the SmolLM2-135M shape with random weights (vocabulary 49152: many elements per thread).
void check_summaries(ForwardBackend& gpu, Step& s, const std::vector<int32_t>& full_rows,
                     const char* what) {
  const size_t vocab = static_cast<size_t>(gpu.spec().vocab_size);
  const size_t rows = s.logit_rows.size();
  std::vector<float> all(rows * vocab), some(full_rows.size() * vocab);
  std::vector<LogitRowSummary> summaries(rows);
  ASSERT_TRUE(gpu.summarizes_logits());
  Status st = gpu.forward(s.batch, all);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  st = gpu.forward_summarized(s.batch, full_rows, some, summaries);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  double worst_log_z = 0;
  for (size_t r = 0; r < rows; ++r) {
    const float* row = all.data() + r * vocab;
    const size_t best = std::max_element(row, row + vocab) - row;
    double sum = 0.0;
    for (size_t i = 0; i < vocab; ++i) sum += std::exp(double(row[i]) - row[best]);
    const double log_z = row[best] + std::log(sum);
    EXPECT_EQ(summaries[r].argmax, static_cast<int32_t>(best)) << what << " row " << r;
    EXPECT_EQ(summaries[r].max_logit, row[best]) << what << " row " << r;
    worst_log_z = std::max(worst_log_z, std::abs(summaries[r].log_z - log_z) / std::abs(log_z));
  }
  EXPECT_LT(worst_log_z, 1e-5) << what;
  for (size_t i = 0; i < full_rows.size(); ++i) {
    const std::span<const float> want(all.data() + size_t(full_rows[i]) * vocab, vocab);
    const std::span<const float> got(some.data() + i * vocab, vocab);
    EXPECT_LT(relative_error(got, want), 1e-6) << what << " full row " << full_rows[i];
  }
  std::printf("[ summary ] %s: %zu rows, %zu copied, worst log_z rel err %.2e\n", what, rows,
              full_rows.size(), worst_log_z);
}

TEST(CudaForwardBackendSummaries, SummariesMatchTheLogitsTheyReduce) {
  SKIP_WITHOUT_GPU();
  for (const char* name : {"llama", "gemma3"}) {
    const Tiny probe = load_tiny(name);
    Tables t(groups_of(probe.spec), 3, 64, 8, 5);
    Pair pair(name, t);
    std::vector<int32_t> seqs = {0, 1, 2}, cached(3, 0);
    std::vector<std::vector<int32_t>> prompts = {probe.prompts[0], probe.prompts[1],
                                                 probe.prompts[2]};
    Step prefill(t, seqs, prompts, cached);
    check_summaries(*pair.gpu, prefill, {1, 4, 5}, name);
    for (int32_t i = 0; i < 3; ++i) cached[i] = static_cast<int32_t>(prompts[i].size());
    for (int32_t step = 0; step < 3; ++step) {  // decode steps run as graphs from the second
      Step decode(t, seqs, {{3 + step}, {7}, {11}}, cached);
      check_summaries(*pair.gpu, decode, {step % 3}, name);
      for (int32_t& c : cached) c += 1;
    }
  }
  auto spec = random_model_spec("smollm2-135m");
  ASSERT_TRUE(spec.is_ok()) << spec.status().to_string();
  auto gpu = make_random_cuda_backend(*spec, 3);
  ASSERT_TRUE(gpu.is_ok()) << gpu.status().to_string();
  Tables t(1, 4, 96, 16, 9);
  std::vector<KvLayout> layouts = {(*gpu)->group_layout(0, t.num_blocks, 16, DType::BF16)};
  ASSERT_TRUE((*gpu)->allocate_kv(layouts).is_ok());
  std::mt19937 gen(4);
  std::uniform_int_distribution<int32_t> token(0, spec->vocab_size - 1);
  std::vector<std::vector<int32_t>> prompts(4);
  for (int32_t i = 0; i < 4; ++i) prompts[i].resize(20 + 9 * i);
  for (auto& p : prompts) std::generate(p.begin(), p.end(), [&] { return token(gen); });
  Step prefill(t, {0, 1, 2, 3}, prompts, {0, 0, 0, 0});
  check_summaries(**gpu, prefill, {0, 30, 99}, "smollm2-135m shape");
}

std::vector<BlockId> block_ids(std::span<const int32_t> ids) {
  std::vector<BlockId> out;
  for (int32_t id : ids) out.push_back(BlockId{id});
  return out;
}

// Blocks leave the device in the model's logical layout (head_dim 16 while the device pads to
// 64): the image matches the CPU runner's bf16 pool element for element (within bf16 rounding),
// goes back in elsewhere bit for bit, copies bit for bit, and a decode over the moved blocks
// gives the same logits.
TEST(CudaForwardBackendBlocks, ReadWriteCopyRoundTripInLogicalLayout) {
  SKIP_WITHOUT_GPU();
  for (const char* name : {"llama", "gemma3"}) {
    const Tiny probe = load_tiny(name);
    const auto& prompt = probe.prompts[3];
    const int32_t len = static_cast<int32_t>(prompt.size());
    Tables t(groups_of(probe.spec), 3, len + 4, 4, 3);  // seq 0 used; seqs 1, 2: destinations
    Pair pair(name, t, DType::BF16, DType::BF16);
    Step s(t, {0}, {prompt}, {0});
    pair.run_gpu(s);
    pair.run_cpu(s);
    const int32_t used = (len + t.block_size - 1) / t.block_size;
    for (int32_t g = 0; g < pair.gpu->num_cache_groups(); ++g) {
      const KvLayout& layout = pair.gpu->kv_layout(g);
      ASSERT_EQ(layout.head_dim, probe.spec.head_dim) << "kv_layout must be logical";
      const auto src = block_ids(std::span(t.ids[g]).first(used));
      std::vector<std::byte> image(src.size() * layout.block_size_bytes());
      ASSERT_TRUE(pair.gpu->read_blocks(g, src, image).is_ok());
      // the CPU runner's bf16 slab, gathered the same way (only tokens < len were written)
      std::vector<float> got, want;
      const size_t row = layout.head_dim;
      for (size_t i = 0; i < src.size(); ++i) {
        for (int32_t l = 0; l < layout.num_layers; ++l) {
          for (int32_t kv = 0; kv < 2; ++kv) {
            for (int32_t h = 0; h < layout.num_kv_heads; ++h) {
              for (int32_t tok = 0; tok < layout.block_size; ++tok) {
                if (static_cast<int32_t>(i) * layout.block_size + tok >= len) continue;
                const int64_t img = int64_t(i) * layout.num_layers * layout.block_pitch() +
                                    int64_t(l) * layout.block_pitch() + kv * layout.block_stride() +
                                    (int64_t(h) * layout.block_size + tok) * row;
                const int64_t slab = pair.slabs[g].layout.elem_offset(l, src[i].value, kv, h, tok);
                for (size_t d = 0; d < row; ++d) {
                  got.push_back(load_as_f32(image.data(), DType::BF16, img + d));
                  want.push_back(load_as_f32(pair.slabs[g].bytes.data(), DType::BF16, slab + d));
                }
              }
            }
          }
        }
      }
      const double err = relative_error(got, want);
      std::printf("[ blocks  ] %s group %d: device KV image vs cpu bf16 pool rel err %.3e\n", name,
                  g, err);
      EXPECT_LT(err, kBf16LogitTolerance) << name << " group " << g;

      // write into seq 1's blocks, read back: bit for bit
      const auto dst = block_ids(std::span(t.ids[g]).subspan(t.max_blocks, used));
      ASSERT_TRUE(pair.gpu->write_blocks(g, dst, image).is_ok());
      std::vector<std::byte> back(image.size());
      ASSERT_TRUE(pair.gpu->read_blocks(g, dst, back).is_ok());
      EXPECT_EQ(back, image) << name << " group " << g << ": write_blocks/read_blocks";
      // copy into seq 2's blocks: bit for bit
      const auto copy_dst = block_ids(std::span(t.ids[g]).subspan(2 * t.max_blocks, used));
      std::vector<BlockCopy> ops;
      for (int32_t i = 0; i < used; ++i) ops.push_back({src[i], copy_dst[i], g});
      ASSERT_TRUE(pair.gpu->copy_blocks(g, ops).is_ok());
      ASSERT_TRUE(pair.gpu->read_blocks(g, copy_dst, back).is_ok());
      EXPECT_EQ(back, image) << name << " group " << g << ": copy_blocks";
    }
    // a decode step over the original, the written and the copied blocks: same logits
    const int32_t next = probe.greedy[3][0];
    std::vector<std::vector<float>> logits;
    for (int32_t seq = 0; seq < 3; ++seq) {
      Step d(t, {seq}, {{next}}, {len});
      logits.push_back(pair.run_gpu(d));
    }
    EXPECT_EQ(logits[1], logits[0]) << name << ": decode over written blocks";
    EXPECT_EQ(logits[2], logits[0]) << name << ": decode over copied blocks";
  }
}

std::vector<std::vector<std::byte>> snapshot(const ForwardBackend& backend, int32_t num_blocks) {
  std::vector<std::vector<std::byte>> out;
  std::vector<BlockId> all;
  for (int32_t b = 0; b < num_blocks; ++b) all.push_back(BlockId{b});
  for (int32_t g = 0; g < backend.num_cache_groups(); ++g) {
    std::vector<std::byte> image(all.size() * backend.kv_layout(g).block_size_bytes());
    KVP_CHECK(backend.read_blocks(g, all, image).is_ok(), "read_blocks");
    out.push_back(std::move(image));
  }
  return out;
}

TEST(CudaForwardBackendErrors, BadBatchesAreRefusedWithThePoolUnchanged) {
  SKIP_WITHOUT_GPU();
  const Tiny probe = load_tiny("llama");
  Tables t(1, 1, 16, 4, 1);
  Pair pair("llama", t);
  Step warm(t, {0}, {{5, 6, 7, 8, 9}}, {0});
  pair.run_gpu(warm);
  const auto before = snapshot(*pair.gpu, t.num_blocks);

  Step bad(t, {0}, {{5, 300}}, {5});  // 300 is outside the 256-token vocabulary
  std::vector<float> logits(bad.logit_rows.size() * pair.vocab());
  Status st = pair.gpu->forward(bad.batch, logits);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("token id 300"), std::string::npos) << st.message();

  Step bad_slot(t, {0}, {{5, 6}}, {5});
  bad_slot.slots[0][1] = int64_t{t.num_blocks} * t.block_size + 3;  // past the pool
  st = pair.gpu->forward(bad_slot.batch, logits);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();

  Step bad_table(t, {0}, {{5, 6}}, {5});
  bad_table.tables[0][0] = t.num_blocks + 7;  // block id outside the pool
  st = pair.gpu->forward(bad_table.batch, logits);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();

  Step short_kv(t, {0}, {{5, 6}}, {5});
  short_kv.kv_lens[0] = 1;  // fewer cached tokens than new ones
  st = pair.gpu->forward(short_kv.batch, logits);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();

  std::vector<float> small(3);
  Step ok(t, {0}, {{5, 6}}, {5});
  st = pair.gpu->forward(ok.batch, small);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();

  EXPECT_TRUE(snapshot(*pair.gpu, t.num_blocks) == before) << "a refused batch wrote the pool";

  std::vector<std::byte> image(pair.gpu->kv_layout(0).block_size_bytes());
  const BlockId outside{t.num_blocks};
  EXPECT_EQ(pair.gpu->write_blocks(0, std::span(&outside, 1), image).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(pair.gpu->read_blocks(0, std::span(&outside, 1), image).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(snapshot(*pair.gpu, t.num_blocks) == before);
}

TEST(CudaForwardBackendErrors, KvDtypeF32IsRefusedAndF16Runs) {
  SKIP_WITHOUT_GPU();
  const Tiny probe = load_tiny("qwen2");
  auto backend = make_cuda_backend(probe.spec, *probe.weights);
  ASSERT_TRUE(backend.is_ok()) << backend.status().to_string();
  ForwardBackend& gpu = **backend;
  EXPECT_TRUE(gpu.check_kv_dtype(DType::BF16).is_ok());
  EXPECT_TRUE(gpu.check_kv_dtype(DType::F16).is_ok());
  EXPECT_TRUE(gpu.check_kv_dtype(DType::I8).is_ok());
  EXPECT_TRUE(gpu.check_kv_dtype(DType::FP8).is_ok());
  const Status st = gpu.check_kv_dtype(DType::F32);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("f32"), std::string::npos) << st.message();
  const KvLayout f32 = gpu.group_layout(0, 8, 4, DType::F32);
  EXPECT_EQ(gpu.allocate_kv(std::span(&f32, 1)).code(), StatusCode::kInvalidArgument);
  KvLayout wrong = gpu.group_layout(0, 8, 4, DType::BF16);
  wrong.head_dim += 1;
  EXPECT_EQ(gpu.allocate_kv(std::span(&wrong, 1)).code(), StatusCode::kInvalidArgument);

  // an f16 pool gives transformers' logits too
  const auto& prompt = probe.prompts[2];
  Tables t(1, 1, static_cast<int32_t>(prompt.size()), 8, 4);
  Pair pair("qwen2", t, DType::F16);
  Step s(t, {0}, {prompt}, {0});
  const double err = relative_error(pair.run_gpu(s), probe.logits[2]);
  std::printf("[ f16 kv  ] qwen2 prompt 2: rel err vs transformers %.3e\n", err);
  EXPECT_LT(err, kBf16LogitTolerance);
}

}  // namespace
}  // namespace kvp::cuda

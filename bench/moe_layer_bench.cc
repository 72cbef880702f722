// The CPU mixture-of-experts layer (model/moe_layer.h) on one Qwen3-30B-A3B-shaped layer
// (hidden 2048, 128 experts of ffn 768, top 8) with random Q8_0 expert weights:
//
//   moe_layer_bench [--experts N] [--csv FILE]
//   variant 1  per token: each token runs its k experts alone (k expert reads per token, the
//              naive port of the per-token formula)
//   variant 2  grouped (moe_forward): tokens grouped by expert, each chosen expert runs once
//              over its tokens
//
// Per variant and token count (1, 8, 64, 512), one line: ms per layer call, the bytes of the
// distinct experts the step touches ÷ time (GB/s, next to the memcpy bandwidth of this run: the
// ceiling of a step that reads each touched expert once), and the read amplification of the
// variant (expert bytes it reads ÷ distinct expert bytes). Activations int8 at 1 and 8 tokens
// (decode: quant::ActPrecision::kInt8), the runner's default prefill precision at 64 and 512
// (kPrefill: int8 on x86, f32 panels elsewhere), as the runner does. Times: median of 5 runs of ≥
// 50 ms. Threads: 2 (the pool of this machine's cores).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/thread_pool.h"
#include "model/moe_layer.h"
#include "quant/quant_matmul.h"

namespace kvp {
namespace {

using Clock = std::chrono::steady_clock;

template <typename Fn>
double time_per_call(Fn&& fn) {
  fn();
  std::vector<double> runs;
  for (int run = 0; run < 5; ++run) {
    int64_t calls = 0;
    const auto start = Clock::now();
    double elapsed = 0;
    do {
      fn();
      ++calls;
      elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    } while (elapsed < 0.05);
    runs.push_back(elapsed / static_cast<double>(calls));
  }
  std::sort(runs.begin(), runs.end());
  return runs[runs.size() / 2];
}

double copy_bandwidth(ThreadPool* pool) {
  const size_t bytes = size_t{256} << 20;
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  const int threads = pool->num_threads();
  const double t = time_per_call([&] {
    pool->parallel_for(threads, [&](int64_t i, int) {
      const size_t chunk = bytes / threads;
      std::memcpy(dst.data() + i * chunk, src.data() + i * chunk, chunk);
    });
  });
  return double(bytes) / t / 1e9;
}

// Random Q8_0 blocks [rows][cols] with a small f16 scale in every block.
std::vector<uint8_t> random_q8_0(int64_t rows, int64_t cols, std::mt19937& rng) {
  const size_t bytes = ggml_row_size_bytes(GgmlType::Q8_0, static_cast<size_t>(cols)) * rows;
  std::vector<uint8_t> data(bytes);
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& b : data) b = static_cast<uint8_t>(byte(rng));
  const uint16_t scale = f32_to_f16(0.001f).bits;
  const size_t block = ggml_type_info(GgmlType::Q8_0).type_size;
  for (size_t b = 0; b < bytes / block; ++b) std::memcpy(data.data() + b * block, &scale, 2);
  return data;
}

// Variant 1: each token's experts one at a time.
void moe_per_token(const ExpertWeights& w, const MoeParams& params, const float* xn,
                   int64_t num_tokens, int64_t hidden, float* out, ThreadPool* pool,
                   quant::ActPrecision precision) {
  const int32_t num_experts = w.num_experts();
  const int64_t inter = w.intermediate();
  std::vector<float> logits(num_tokens * num_experts);
  quant::matmul(w.router, xn, num_tokens, hidden, logits.data(), num_experts, pool,
                quant::ActPrecision::kF32);
  std::vector<int32_t> ids(num_tokens * params.top_k);
  std::vector<float> weights(num_tokens * params.top_k);
  route_top_k(logits.data(), num_tokens, num_experts, params.top_k, params.normalize, ids.data(),
              weights.data());
  std::vector<float> gate_up(2 * inter), act(inter), y(hidden);
  std::fill(out, out + num_tokens * hidden, 0.0f);
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int32_t k = 0; k < params.top_k; ++k) {
      const int32_t e = ids[t * params.top_k + k];
      quant::matmul(std::span(w.gate_up).subspan(2 * e, 2), xn + t * hidden, 1, hidden,
                    gate_up.data(), 2 * inter, pool, precision);
      cpu::gated_activation(gate_up.data(), act.data(), 1, inter, params.activation);
      quant::matmul(w.down[e], act.data(), 1, inter, y.data(), hidden, pool, precision);
      for (int64_t j = 0; j < hidden; ++j)
        out[t * hidden + j] += weights[t * params.top_k + k] * y[j];
    }
  }
}

int run(int argc, char** argv) {
  int32_t num_experts = 128;
  const char* csv_path = nullptr;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--experts" && i + 1 < argc) {
      num_experts = std::stoi(argv[++i]);
    } else if (arg == "--csv" && i + 1 < argc) {
      csv_path = argv[++i];
    } else {
      std::fprintf(stderr, "usage: moe_layer_bench [--experts N] [--csv FILE]\n");
      return 2;
    }
  }
  const int64_t hidden = 2048, inter = 768;
  const MoeParams params{8, true, cpu::Activation::kSilu};
  std::mt19937 rng(1);
  // experts' gate and up stacked as GGUF stores them ([experts * 2 inter][hidden] here, gate then
  // up per expert), down [experts * hidden][inter]
  const std::vector<uint8_t> gate_up_bytes =
      random_q8_0(int64_t{num_experts} * 2 * inter, hidden, rng);
  const std::vector<uint8_t> down_bytes = random_q8_0(int64_t{num_experts} * hidden, inter, rng);
  std::vector<float> router(int64_t{num_experts} * hidden);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : router) x = normal(rng) * 0.02f;
  ExpertWeights w;
  w.router = quant::make_matrix(GgmlType::F32, router.data(), num_experts, hidden);
  const quant::QuantMatrix gate_up_all = quant::make_matrix(
      GgmlType::Q8_0, gate_up_bytes.data(), int64_t{num_experts} * 2 * inter, hidden);
  const quant::QuantMatrix down_all =
      quant::make_matrix(GgmlType::Q8_0, down_bytes.data(), int64_t{num_experts} * hidden, inter);
  for (int32_t e = 0; e < num_experts; ++e) {
    w.gate_up.push_back(quant::slice_rows(gate_up_all, int64_t{2} * e * inter, inter));
    w.gate_up.push_back(quant::slice_rows(gate_up_all, (int64_t{2} * e + 1) * inter, inter));
    w.down.push_back(quant::slice_rows(down_all, int64_t{e} * hidden, hidden));
  }
  ThreadPool pool(2);
  const double copy_gbs = copy_bandwidth(&pool);
  std::printf(
      "moe layer: hidden %lld, %d experts x ffn %lld, top %d, Q8_0 experts (%.2f GB); "
      "memcpy %.1f GB/s (2 threads)\n",
      static_cast<long long>(hidden), num_experts, static_cast<long long>(inter), params.top_k,
      double(w.size_bytes()) / 1e9, copy_gbs);
  FILE* csv = csv_path != nullptr ? std::fopen(csv_path, "w") : nullptr;
  if (csv != nullptr) std::fprintf(csv, "variant,tokens,ms,touched_gbs,copy_gbs,amplification\n");
  for (int64_t num_tokens : {1, 8, 64, 512}) {
    std::vector<float> x(num_tokens * hidden), out(num_tokens * hidden);
    for (float& v : x) v = normal(rng);
    const quant::ActPrecision precision =
        num_tokens <= 8 ? quant::ActPrecision::kInt8 : quant::ActPrecision::kPrefill;
    // the experts this step touches
    std::vector<float> logits(num_tokens * num_experts);
    quant::matmul(w.router, x.data(), num_tokens, hidden, logits.data(), num_experts, nullptr,
                  quant::ActPrecision::kF32);
    std::vector<int32_t> ids(num_tokens * params.top_k);
    std::vector<float> weights(ids.size());
    route_top_k(logits.data(), num_tokens, num_experts, params.top_k, true, ids.data(),
                weights.data());
    const std::set<int32_t> touched(ids.begin(), ids.end());
    const double touched_bytes = double(touched.size()) * double(w.expert_size_bytes(0));
    for (int variant : {1, 2}) {
      const double t = time_per_call([&] {
        if (variant == 1) {
          moe_per_token(w, params, x.data(), num_tokens, hidden, out.data(), &pool, precision);
        } else {
          moe_forward(w, params, x.data(), num_tokens, hidden, out.data(), &pool, precision);
        }
      });
      const double read_bytes =
          variant == 1 ? double(ids.size()) * double(w.expert_size_bytes(0)) : touched_bytes;
      std::printf(
          "variant %d %-9s tokens %4lld  %8.3f ms  %6.2f GB/s of touched experts "
          "(copy %.1f)  reads %.1fx the touched experts\n",
          variant, variant == 1 ? "per-token" : "grouped", static_cast<long long>(num_tokens),
          t * 1e3, touched_bytes / t / 1e9, copy_gbs, read_bytes / touched_bytes);
      if (csv != nullptr) {
        std::fprintf(csv, "%d,%lld,%.4f,%.3f,%.2f,%.2f\n", variant,
                     static_cast<long long>(num_tokens), t * 1e3, touched_bytes / t / 1e9, copy_gbs,
                     read_bytes / touched_bytes);
      }
    }
  }
  if (csv != nullptr) std::fclose(csv);
  return 0;
}

}  // namespace
}  // namespace kvp

int main(int argc, char** argv) { return kvp::run(argc, argv); }

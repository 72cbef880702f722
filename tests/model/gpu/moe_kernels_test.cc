// The CUDA mixture-of-experts kernels (model/cuda/moe_kernels.h) against host computations
// written here: routing (softmax, top-k with ties to the lower id, renormalisation) on logits
// with many exact ties, alone and fused with the grouping, the small steps' norm + router
// products, the counting sort by expert, and the experts' gated MLPs plus the
// weighted combine (silu, and GPT-OSS's biases and clamped SwiGLU) against a double-precision
// reference over the same bf16 values, with one
// expert chosen by every token, several sharing others, and some chosen by none; the same experts
// as GEMMs over the pairs gathered by expert (model/cuda/moe_gemm.h: one cuBLAS call per expert,
// and grouped), within the bound that rounding their activations to bf16 allows. Skips without a
// CUDA device.
#include "model/cuda/moe_kernels.h"
#include "model/cuda/moe_gemm.h"
#include "support/gpu_skip.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cuda/device_buffer.h"
#include "common/dtype.h"
#include "model/moe_layer.h"

namespace kvp::cuda {
namespace {

template <typename T>
DeviceBuffer to_device(const std::vector<T>& host) {
  DeviceBuffer b = DeviceBuffer::allocate(std::max<size_t>(host.size(), 1) * sizeof(T)).value();
  if (!host.empty()) {
    EXPECT_EQ(cudaMemcpy(b.data(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  return b;
}

template <typename T>
std::vector<T> to_host(const DeviceBuffer& b, size_t count) {
  std::vector<T> host(count);
  EXPECT_EQ(cudaMemcpy(host.data(), b.data(), count * sizeof(T), cudaMemcpyDeviceToHost),
            cudaSuccess);
  return host;
}

// Each token's top_k by probability, ties to the lower id, written from the definition: sort all
// experts by (probability desc, id asc) and take the first top_k.
void host_route(const std::vector<float>& logits, int32_t stride, int32_t num_tokens,
                int32_t num_experts, int32_t top_k, bool normalize, std::vector<int32_t>* ids,
                std::vector<float>* weights) {
  ids->assign(size_t(num_tokens) * top_k, -1);
  weights->assign(size_t(num_tokens) * top_k, 0.0f);
  for (int32_t t = 0; t < num_tokens; ++t) {
    const float* row = logits.data() + size_t(t) * stride;
    double max_logit = row[0];
    for (int32_t e = 1; e < num_experts; ++e) max_logit = std::max<double>(max_logit, row[e]);
    std::vector<double> p(num_experts);
    double sum = 0;
    for (int32_t e = 0; e < num_experts; ++e) sum += p[e] = std::exp(row[e] - max_logit);
    for (double& v : p) v /= sum;
    std::vector<int32_t> order(num_experts);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
    double chosen = 0;
    for (int32_t k = 0; k < top_k; ++k) chosen += p[order[k]];
    for (int32_t k = 0; k < top_k; ++k) {
      (*ids)[size_t(t) * top_k + k] = order[k];
      (*weights)[size_t(t) * top_k + k] =
          static_cast<float>(normalize ? p[order[k]] / chosen : p[order[k]]);
    }
  }
}

// The grouping (launch_moe_group, launch_moe_route_group) of `ids`: every pair listed once, under
// its expert; active = the experts with pairs in ascending id.
void expect_grouping(const std::vector<int32_t>& ids, int32_t num_experts,
                     const DeviceBuffer& d_offsets, const DeviceBuffer& d_pairs,
                     const DeviceBuffer& d_active, std::vector<int32_t>* offsets_out = nullptr) {
  const int32_t num_pairs = static_cast<int32_t>(ids.size());
  const auto offsets = to_host<int32_t>(d_offsets, num_experts + 1);
  const auto pairs = to_host<int32_t>(d_pairs, num_pairs);
  ASSERT_EQ(offsets[0], 0);
  ASSERT_EQ(offsets[num_experts], num_pairs);
  std::vector<int32_t> seen(num_pairs, 0);
  for (int32_t e = 0; e < num_experts; ++e) {
    for (int32_t i = offsets[e]; i < offsets[e + 1]; ++i) {
      ASSERT_EQ(ids[pairs[i]], e) << "pair " << pairs[i] << " listed under expert " << e;
      ++seen[pairs[i]];
    }
  }
  for (int32_t p = 0; p < num_pairs; ++p) ASSERT_EQ(seen[p], 1) << "pair " << p;
  const auto active = to_host<int32_t>(d_active, num_experts + 1);
  std::vector<int32_t> want_active;
  for (int32_t e = 0; e < num_experts; ++e) {
    if (offsets[e + 1] > offsets[e]) want_active.push_back(e);
  }
  ASSERT_EQ(active[0], static_cast<int32_t>(want_active.size()));
  EXPECT_EQ(std::vector<int32_t>(active.begin() + 1, active.begin() + 1 + active[0]), want_active);
  if (offsets_out != nullptr) *offsets_out = offsets;
}

struct RouteCase {
  int32_t num_experts, top_k;
  bool normalize;
};

// Logits on a grid of 1/16 in [-4, 4): many exact ties in every row, and distinct values far
// enough apart (a probability ratio of e^(1/16)) that rounding cannot reorder them. Token 0's
// logits are all equal (top-k = the k lowest ids), token 1's are equal in pairs.
TEST(CudaMoeRoute, TopKMatchesTheHostWithTiesToTheLowerId) {
  SKIP_WITHOUT_GPU();
  for (const RouteCase c : {RouteCase{60, 4, false}, RouteCase{128, 8, true},
                            RouteCase{6, 2, false}, RouteCase{4, 2, true}}) {
    const int32_t num_tokens = 37, stride = c.num_experts + 1;  // + a shared-gate column
    std::mt19937_64 rng(c.num_experts);
    std::uniform_int_distribution<int> grid(-64, 63);
    std::vector<float> logits(size_t(num_tokens) * stride);
    for (float& v : logits) v = grid(rng) / 16.0f;
    for (int32_t e = 0; e < stride; ++e) logits[e] = 0.5f;
    for (int32_t e = 0; e < c.num_experts; ++e) logits[stride + e] = float((c.num_experts - e) / 2);
    std::vector<int32_t> want_ids;
    std::vector<float> want_w;
    host_route(logits, stride, num_tokens, c.num_experts, c.top_k, c.normalize, &want_ids, &want_w);

    DeviceBuffer d_logits = to_device(logits);
    DeviceBuffer d_ids = DeviceBuffer::allocate(want_ids.size() * 4).value();
    DeviceBuffer d_w = DeviceBuffer::allocate(want_w.size() * 4).value();
    ASSERT_EQ(
        detail::launch_moe_route(d_logits.as<float>(), stride, num_tokens, c.num_experts, c.top_k,
                                 c.normalize, d_ids.as<int32_t>(), d_w.as<float>(), nullptr),
        cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto ids = to_host<int32_t>(d_ids, want_ids.size());
    const auto w = to_host<float>(d_w, want_w.size());
    // the CPU layer's routing (the oracle of the runners) agrees with both
    std::vector<float> dense(size_t(num_tokens) * c.num_experts);
    for (int32_t t = 0; t < num_tokens; ++t) {
      std::copy_n(logits.begin() + size_t(t) * stride, c.num_experts,
                  dense.begin() + size_t(t) * c.num_experts);
    }
    std::vector<int32_t> cpu_ids(want_ids.size());
    std::vector<float> cpu_w(want_w.size());
    route_top_k(dense.data(), num_tokens, c.num_experts, c.top_k, c.normalize, cpu_ids.data(),
                cpu_w.data());
    double worst = 0;
    size_t worst_at = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      ASSERT_EQ(ids[i], want_ids[i])
          << c.num_experts << " experts, token " << i / c.top_k << " slot " << i % c.top_k;
      ASSERT_EQ(cpu_ids[i], want_ids[i]) << "cpu route_top_k, token " << i / c.top_k;
      const double d = std::abs(double(w[i]) - want_w[i]);
      if (d > worst) worst = d, worst_at = i;
    }
    std::printf("[ route   ] %d experts top %d%s: ids equal, largest weight diff %.2e at %zu\n",
                c.num_experts, c.top_k, c.normalize ? " normalised" : "", worst, worst_at);
    EXPECT_LT(worst, 1e-6);

    // small steps: route and group in one launch, over the first tokens (the tied ones among
    // them), the same choices and weights, and the grouping of the host's ids
    for (const int32_t small : {1, 2, 9, detail::kMoeSmallStepTokens}) {
      const size_t n = size_t(small) * c.top_k;
      DeviceBuffer d_offsets = DeviceBuffer::allocate((c.num_experts + 1) * 4).value();
      DeviceBuffer d_pairs = DeviceBuffer::allocate(n * 4).value();
      DeviceBuffer d_active = DeviceBuffer::allocate((c.num_experts + 1) * 4).value();
      ASSERT_EQ(cudaMemset(d_ids.data(), 0xff, d_ids.size_bytes()), cudaSuccess);
      ASSERT_EQ(detail::launch_moe_route_group(
                    d_logits.as<float>(), stride, small, c.num_experts, c.top_k, c.normalize,
                    d_ids.as<int32_t>(), d_w.as<float>(), d_offsets.as<int32_t>(),
                    d_pairs.as<int32_t>(), d_active.as<int32_t>(), nullptr),
                cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto small_ids = to_host<int32_t>(d_ids, n);
      const auto small_w = to_host<float>(d_w, n);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(small_ids[i], want_ids[i]) << "fused, " << small << " tokens, pair " << i;
        ASSERT_LT(std::abs(double(small_w[i]) - want_w[i]), 1e-6) << "fused, pair " << i;
      }
      expect_grouping(std::vector<int32_t>(want_ids.begin(), want_ids.begin() + n), c.num_experts,
                      d_offsets, d_pairs, d_active);
    }
    EXPECT_EQ(detail::launch_moe_route_group(
                  d_logits.as<float>(), stride, detail::kMoeSmallStepTokens + 1, c.num_experts,
                  c.top_k, c.normalize, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr),
              cudaErrorInvalidValue)
        << "more tokens than the fused kernel takes";
  }
}

// The small steps' router (the f32 norm and the router's products in one kernel) against a
// double reference over the same f32 values; the bound is f32 accumulation over the magnitudes of
// the terms (|x / rms * w * router|), plus the norm's own rounding.
TEST(CudaMoeRouter, SmallStepNormAndProductsMatchADoubleReference) {
  SKIP_WITHOUT_GPU();
  struct Case {
    int32_t num_tokens, hidden, rows, num_bias;
  };
  for (const Case c : {Case{1, 2048, 129, 0}, Case{5, 2880, 32, 32}, Case{16, 36, 61, 60},
                       Case{detail::kMoeSmallStepTokens, 1024, 128, 0}}) {
    std::mt19937_64 rng(c.hidden + c.rows);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> x(size_t(c.num_tokens) * c.hidden), w(c.hidden),
        router(size_t(c.rows) * c.hidden), bias(std::max(c.num_bias, 1));
    for (float& v : x) v = 3 * u(rng);
    for (float& v : w) v = 1 + 0.5f * u(rng);
    for (float& v : router) v = u(rng) / std::sqrt(float(c.hidden));
    for (float& v : bias) v = u(rng);
    constexpr float kEps = 1e-6f;
    DeviceBuffer d_x = to_device(x), d_w = to_device(w), d_router = to_device(router),
                 d_bias = to_device(bias);
    DeviceBuffer d_logits = DeviceBuffer::allocate(size_t(c.num_tokens) * c.rows * 4).value();
    ASSERT_EQ(detail::launch_moe_router_small(
                  d_x.as<float>(), d_w.as<float>(), d_router.as<float>(),
                  c.num_bias > 0 ? d_bias.as<float>() : nullptr, c.num_bias, c.num_tokens, c.hidden,
                  c.rows, kEps, d_logits.as<float>(), nullptr),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto got = to_host<float>(d_logits, size_t(c.num_tokens) * c.rows);
    double worst_ratio = 0;
    for (int32_t t = 0; t < c.num_tokens; ++t) {
      const float* xt = x.data() + size_t(t) * c.hidden;
      double ss = 0;
      for (int32_t i = 0; i < c.hidden; ++i) ss += double(xt[i]) * xt[i];
      const double inv = 1 / std::sqrt(ss / c.hidden + kEps);
      for (int32_t r = 0; r < c.rows; ++r) {
        double want = 0, mag = 0;
        for (int32_t i = 0; i < c.hidden; ++i) {
          const double term = xt[i] * inv * w[i] * router[size_t(r) * c.hidden + i];
          want += term;
          mag += std::abs(term);
        }
        if (r < c.num_bias) want += bias[r];
        // f32: each term rounded twice, the scale (the sum of squares, rsqrt) a few ulps, and at
        // most hidden / 32 + log2(hidden) additions on any term's path (sequential per thread,
        // then a tree)
        const double tol = mag * 1e-7 * (8 + std::log2(double(c.hidden)) + c.hidden / 32.0) +
                           1e-7 * std::abs(want);
        const double d = std::abs(got[size_t(t) * c.rows + r] - want);
        worst_ratio = std::max(worst_ratio, d / tol);
        ASSERT_LE(d, tol) << "token " << t << " row " << r << " got " << got[size_t(t) * c.rows + r]
                          << " want " << want;
      }
    }
    std::printf("[ router  ] %d tokens, hidden %d, %d rows, %d biased: worst diff / bound %.3f\n",
                c.num_tokens, c.hidden, c.rows, c.num_bias, worst_ratio);
  }
  EXPECT_EQ(detail::launch_moe_router_small(nullptr, nullptr, nullptr, nullptr, 0,
                                            detail::kMoeSmallStepTokens + 1, 64, 4, 1e-6f, nullptr,
                                            nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(detail::launch_moe_router_small(nullptr, nullptr, nullptr, nullptr, 0, 1, 66, 4, 1e-6f,
                                            nullptr, nullptr),
            cudaErrorInvalidValue)
      << "hidden not a multiple of 4";
}

struct Experts {
  int32_t num_experts, top_k, hidden, inter, num_tokens;
  bool gpt_oss = false;  // GPT-OSS's expert biases and clamped SwiGLU, else silu without biases
};

// Tokens' experts: slot 0 is expert 2 for every token; the other slots cycle over {0, 1, 3, 7}
// (so 4, 5 and 6 receive nothing).
std::vector<int32_t> chosen_experts(const Experts& s) {
  const int32_t others[] = {0, 1, 3, 7};
  std::vector<int32_t> ids(size_t(s.num_tokens) * s.top_k);
  for (int32_t t = 0; t < s.num_tokens; ++t) {
    ids[size_t(t) * s.top_k] = 2;
    for (int32_t k = 1; k < s.top_k; ++k) ids[size_t(t) * s.top_k + k] = others[(t + k) % 4];
  }
  return ids;
}

std::vector<uint16_t> random_bf16(size_t count, float scale, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<uint16_t> out(count);
  for (uint16_t& v : out) v = f32_to_bf16(u(rng)).bits;
  return out;
}

double bf(uint16_t bits) { return bf16_to_f32(Bf16{bits}); }
constexpr double kBf16Eps = 1.0 / 256;  // bf16's unit roundoff (8 significant bits)

TEST(CudaMoeExperts, GatheredExpertsAndGroupedGemmsMatchADoubleReference) {
  SKIP_WITHOUT_GPU();
  cublasHandle_t handle = nullptr;
  ASSERT_EQ(cublasCreate(&handle), CUBLAS_STATUS_SUCCESS);
  for (const Experts s :
       {Experts{8, 2, 64, 32, 20}, Experts{8, 3, 512, 136, 13}, Experts{8, 4, 2048, 768, 3},
        // decode steps of 1, 2 and 4 tokens (the narrower chunks with more loads in
        // flight), rows whose 16-byte vectors leave a partial last round, GPT-OSS's 2880
        Experts{8, 3, 520, 136, 1}, Experts{8, 2, 2048, 768, 2}, Experts{8, 4, 256, 128, 4},
        Experts{8, 2, 64, 32, 3}, Experts{8, 4, 2880, 2880, 1, true},
        Experts{8, 2, 64, 32, 20, true}, Experts{8, 3, 512, 136, 13, true},
        Experts{16, 4, 256, 128, 200}, Experts{16, 4, 256, 128, 200, true}}) {
    std::mt19937_64 rng(s.hidden);
    const int32_t num_pairs = s.num_tokens * s.top_k;
    const auto x = random_bf16(size_t(s.num_tokens) * s.hidden, 1.0f, rng);
    const auto gate_up = random_bf16(size_t(s.num_experts) * 2 * s.inter * s.hidden,
                                     1.0f / std::sqrt(s.hidden), rng);
    const auto down =
        random_bf16(size_t(s.num_experts) * s.hidden * s.inter, 1.0f / std::sqrt(s.inter), rng);
    const auto ids = chosen_experts(s);
    std::uniform_real_distribution<float> u01(0.05f, 1.0f);
    std::vector<float> weights(num_pairs), shared(size_t(s.num_tokens) * s.hidden),
        shared_logits(size_t(s.num_tokens) * 3);
    for (float& v : weights) v = u01(rng);
    for (float& v : shared) v = u01(rng) - 0.5f;
    for (float& v : shared_logits) v = 4 * u01(rng) - 2;
    // GPT-OSS: biases up to +-10, so that many gate and up values pass the clamp limit (7)
    std::uniform_real_distribution<float> bias_dist(-10.0f, 10.0f);
    std::vector<float> gate_up_bias, down_bias;
    if (s.gpt_oss) {
      gate_up_bias.resize(size_t(s.num_experts) * 2 * s.inter);
      down_bias.resize(size_t(s.num_experts) * s.hidden);
      for (float& v : gate_up_bias) v = bias_dist(rng);
      for (float& v : down_bias) v = bias_dist(rng) * 0.1f;
    }

    // reference: double over the same bf16 values; experts added in ascending id, then shared.
    // gemm_bound: what the GEMM path's roundings to bf16 (moe_gemm.h: gate and up, the
    // activation, each expert's output; eps = 2^-8, bf16's unit roundoff) can move an output, to
    // first order: sum over slots of weight * (sum_r |down[j][r]| * (|act[r]| eps + dact[r]) +
    // |y| eps)
    std::vector<double> want(size_t(s.num_tokens) * s.hidden, 0.0);
    std::vector<double> gemm_bound(want.size(), 0.0);
    for (int32_t t = 0; t < s.num_tokens; ++t) {
      const uint16_t* xt = x.data() + size_t(t) * s.hidden;
      std::vector<int32_t> slots(s.top_k);
      std::iota(slots.begin(), slots.end(), 0);
      std::sort(slots.begin(), slots.end(),
                [&](int32_t a, int32_t b) { return ids[t * s.top_k + a] < ids[t * s.top_k + b]; });
      for (int32_t k : slots) {
        const int32_t e = ids[size_t(t) * s.top_k + k];
        // act of the products g, u (before the biases); dact: how far rounding g and u to bf16
        // can move it (the largest change over the corners g(1 +- eps), u(1 +- eps))
        const auto activate = [&](double gd, double ud, int32_t r) {
          if (s.gpt_oss) {  // cpu::gated_activation's kClampedSwiglu
            gd = std::min(gd + gate_up_bias[size_t(e) * 2 * s.inter + r], 7.0);
            ud = std::clamp(ud + gate_up_bias[size_t(e) * 2 * s.inter + s.inter + r], -7.0, 7.0);
            return (ud + 1) * (gd / (1 + std::exp(-1.702 * gd)));
          }
          return gd / (1 + std::exp(-gd)) * ud;
        };
        std::vector<double> act(s.inter), dact(s.inter);
        for (int32_t r = 0; r < s.inter; ++r) {
          const uint16_t* g = gate_up.data() + (size_t(e) * 2 * s.inter + r) * s.hidden;
          const uint16_t* up = g + size_t(s.inter) * s.hidden;
          double gd = 0, ud = 0;
          for (int32_t i = 0; i < s.hidden; ++i) {
            gd += bf(g[i]) * bf(xt[i]);
            ud += bf(up[i]) * bf(xt[i]);
          }
          act[r] = activate(gd, ud, r);
          for (const double sg : {-kBf16Eps, kBf16Eps}) {
            for (const double su : {-kBf16Eps, kBf16Eps}) {
              dact[r] =
                  std::max(dact[r], std::abs(activate(gd * (1 + sg), ud * (1 + su), r) - act[r]));
            }
          }
        }
        for (int32_t j = 0; j < s.hidden; ++j) {
          const uint16_t* d = down.data() + (size_t(e) * s.hidden + j) * s.inter;
          double y = 0, y_err = 0;
          for (int32_t r = 0; r < s.inter; ++r) {
            y += bf(d[r]) * act[r];
            // the activation rounded to bf16 after its inputs were
            y_err += std::abs(bf(d[r])) * ((std::abs(act[r]) + dact[r]) * kBf16Eps + dact[r]);
          }
          y_err += (std::abs(y) + y_err) * kBf16Eps;  // the expert's output rounded to bf16
          if (s.gpt_oss) y += down_bias[size_t(e) * s.hidden + j];
          want[size_t(t) * s.hidden + j] += weights[size_t(t) * s.top_k + k] * y;
          gemm_bound[size_t(t) * s.hidden + j] += weights[size_t(t) * s.top_k + k] * y_err;
        }
      }
      const double scale = 1 / (1 + std::exp(-double(shared_logits[size_t(t) * 3])));
      for (int32_t j = 0; j < s.hidden; ++j) {
        want[size_t(t) * s.hidden + j] += scale * shared[size_t(t) * s.hidden + j];
      }
    }

    DeviceBuffer d_x = to_device(x), d_gate_up = to_device(gate_up), d_down = to_device(down);
    DeviceBuffer d_ids = to_device(ids), d_w = to_device(weights), d_shared = to_device(shared);
    DeviceBuffer d_shared_logits = to_device(shared_logits);
    DeviceBuffer d_gate_up_bias, d_down_bias;
    if (s.gpt_oss) {
      d_gate_up_bias = to_device(gate_up_bias);
      d_down_bias = to_device(down_bias);
    }
    DeviceBuffer d_offsets = DeviceBuffer::allocate((s.num_experts + 1) * 4).value();
    DeviceBuffer d_pairs = DeviceBuffer::allocate(num_pairs * 4).value();
    DeviceBuffer d_active = DeviceBuffer::allocate((s.num_experts + 1) * 4).value();
    DeviceBuffer d_act = DeviceBuffer::allocate(size_t(num_pairs) * s.inter * 4).value();
    DeviceBuffer d_y = DeviceBuffer::allocate(size_t(num_pairs) * s.hidden * 4).value();
    DeviceBuffer d_out = DeviceBuffer::allocate(size_t(s.num_tokens) * s.hidden * 4).value();
    ASSERT_EQ(detail::launch_moe_group(d_ids.as<int32_t>(), num_pairs, s.num_experts,
                                       d_offsets.as<int32_t>(), d_pairs.as<int32_t>(),
                                       d_active.as<int32_t>(), nullptr),
              cudaSuccess);
    detail::MoeExpertArgs a{};
    a.x = d_x.data();
    a.gate_up = d_gate_up.data();
    a.down = d_down.data();
    a.offsets = d_offsets.as<int32_t>();
    a.pairs = d_pairs.as<int32_t>();
    a.active = d_active.as<int32_t>();
    a.num_pairs = num_pairs;
    a.num_experts = s.num_experts;
    a.top_k = s.top_k;
    a.hidden = s.hidden;
    a.inter = s.inter;
    a.activation = s.gpt_oss ? detail::MoeActivation::kClampedSwiglu : detail::MoeActivation::kSilu;
    a.swiglu_alpha = 1.702f;
    a.swiglu_limit = 7.0f;
    a.gate_up_bias = d_gate_up_bias.as<float>();  // null unless gpt_oss
    a.down_bias = d_down_bias.as<float>();
    a.act = d_act.as<float>();
    a.y = d_y.as<float>();
    a.expert_ids = d_ids.as<int32_t>();
    // the three paths in turn: the gathered kernels (decode), the GEMMs one expert at a time,
    // the grouped GEMMs (prompt steps, moe_gemm.h)
    const MoeGemmMode paths[] = {MoeGemmMode::kKernels, MoeGemmMode::kLoop, MoeGemmMode::kGrouped};
    std::vector<std::vector<float>> outs;
    bool grouped_refused = false;
    for (const MoeGemmMode path : paths) {
      ASSERT_EQ(cudaMemset(d_y.data(), 0xff, d_y.size_bytes()), cudaSuccess);  // NaN
      const int32_t* rows = nullptr;
      const float* combine_bias = nullptr;
      MoeGemmScratch scratch;
      if (path == MoeGemmMode::kKernels) {
        ASSERT_EQ(detail::launch_moe_experts(a, nullptr), cudaSuccess);
      } else {
        ASSERT_TRUE(scratch.allocate(num_pairs, s.num_experts, s.hidden, s.inter).is_ok());
        const Status st = enqueue_moe_experts_gemm(handle, a, path, &scratch, nullptr);
        ASSERT_TRUE(st.is_ok()) << st.to_string();
        rows = scratch.rows.as<int32_t>();
        combine_bias = a.down_bias;
        EXPECT_FALSE(scratch.grouped_refused)
            << "cuBLAS refused the grouped GEMM: " << cublasGetStatusString(scratch.refusal);
        grouped_refused = grouped_refused || scratch.grouped_refused;
      }
      ASSERT_EQ(
          detail::launch_moe_combine(d_y.data(), path != MoeGemmMode::kKernels, rows, combine_bias,
                                     d_ids.as<int32_t>(), d_w.as<float>(), s.num_tokens, s.top_k,
                                     s.hidden, d_shared.as<float>(), d_shared_logits.as<float>(), 3,
                                     d_out.as<float>(), nullptr),
          cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      outs.push_back(to_host<float>(d_out, want.size()));
    }
    std::printf("[ experts ] grouped GEMM %s\n",
                grouped_refused ? "REFUSED by this cuBLAS (loop used)" : "taken");

    std::vector<int32_t> offsets;
    expect_grouping(ids, s.num_experts, d_offsets, d_pairs, d_active, &offsets);
    if (HasFatalFailure()) return;
    EXPECT_EQ(offsets[3] - offsets[2], s.num_tokens) << "expert 2 has every token";
    EXPECT_EQ(offsets[7] - offsets[4], 0) << "experts 4, 5, 6 have none";

    double ref_max = 0;
    for (const double w : want) ref_max = std::max(ref_max, std::abs(w));
    const double f32_tol = 1e-4 * std::max(1.0, ref_max);
    const char* names[] = {"kernels", "GEMM loop", "grouped GEMM"};
    for (size_t path = 0; path < outs.size(); ++path) {
      const std::vector<float>& out = outs[path];
      // the kernels keep f32 from the products on; the GEMMs round to bf16 (gemm_bound)
      double worst = 0, worst_ratio = 0;
      size_t worst_at = 0;
      for (size_t i = 0; i < out.size(); ++i) {
        const double d = std::abs(out[i] - want[i]);  // NaN (a row never written) fails below
        const double tol = f32_tol + (path == 0 ? 0.0 : gemm_bound[i]);
        worst = std::max(worst, d);
        if (d / tol > worst_ratio) worst_ratio = d / tol, worst_at = i;
        ASSERT_LE(d, tol) << names[path] << ": token " << i / s.hidden << " col " << i % s.hidden
                          << " got " << out[i] << " want " << want[i];
      }
      std::printf(
          "[ experts ] %s: %d experts top %d, hidden %d, inter %d, %d tokens%s: largest |diff| "
          "%.2e, worst diff / tolerance %.3f at token %zu col %zu (max |ref| %.3f)\n",
          names[path], s.num_experts, s.top_k, s.hidden, s.inter, s.num_tokens,
          s.gpt_oss ? " (biases, clamped swiglu)" : "", worst, worst_ratio, worst_at / s.hidden,
          worst_at % s.hidden, ref_max);
    }
  }
  cublasDestroy(handle);
}

}  // namespace
}  // namespace kvp::cuda

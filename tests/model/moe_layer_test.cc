// The mixture-of-experts layer against a per-token reference written out here (softmax, top-k,
// each chosen expert's gated MLP, weighted sum), on random weights: grouped by expert it must
// give the same rows, with experts that receive no tokens and one expert that receives them all;
// and GPT-OSS's variant (biases, top-k of the logits then softmax, clamped SwiGLU).
#include "model/moe_layer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "support/tensor_check.h"

namespace kvp {
namespace {

TEST(RouteTopK, SoftmaxThenTopKMostProbableFirst) {
  // probabilities 0.1, 0.2, 0.3, 0.4
  const std::vector<float> logits = {0.0f, std::log(2.0f), std::log(3.0f), std::log(4.0f)};
  int32_t ids[2];
  float weights[2];
  route_top_k(logits.data(), 1, 4, 2, /*normalize=*/false, ids, weights);
  EXPECT_EQ(ids[0], 3);
  EXPECT_EQ(ids[1], 2);
  EXPECT_NEAR(weights[0], 0.4f, 1e-6f);
  EXPECT_NEAR(weights[1], 0.3f, 1e-6f);
  route_top_k(logits.data(), 1, 4, 2, /*normalize=*/true, ids, weights);
  EXPECT_NEAR(weights[0], 4.0f / 7.0f, 1e-6f);
  EXPECT_NEAR(weights[1], 3.0f / 7.0f, 1e-6f);
}

TEST(RouteTopK, TiesGoToTheLowerExpert) {
  const std::vector<float> logits = {0.5f, 1.0f, 1.0f, 1.0f, 0.5f, 1.0f};  // two tokens of 3
  std::vector<int32_t> ids(4);
  std::vector<float> weights(4);
  route_top_k(logits.data(), 2, 3, 2, true, ids.data(), weights.data());
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 2, 0, 2}));
  EXPECT_FLOAT_EQ(weights[0], 0.5f);
}

TEST(GroupByExpert, EachExpertListsItsTokensInOrder) {
  const std::vector<int32_t> ids = {2, 0, 0, 2, 2, 3};  // 3 tokens, top 2, 4 experts
  const std::vector<float> w = {0.6f, 0.4f, 0.7f, 0.3f, 0.9f, 0.1f};
  ExpertGroups g = group_by_expert(ids.data(), w.data(), 3, 4, 2);
  EXPECT_EQ(g.offsets, (std::vector<int32_t>{0, 2, 2, 5, 6}));  // expert 1: none
  EXPECT_EQ(g.token_rows, (std::vector<int32_t>{0, 1, 0, 1, 2, 2}));
  EXPECT_EQ(g.weights, (std::vector<float>{0.4f, 0.7f, 0.6f, 0.3f, 0.9f, 0.1f}));
}

struct Layer {
  std::vector<float> router;                 // [experts][hidden]
  std::vector<std::vector<float>> gate, up;  // [experts][inter][hidden]
  std::vector<std::vector<float>> down;      // [experts][hidden][inter]
  ExpertWeights weights;
};

Layer random_layer(int32_t num_experts, int64_t hidden, int64_t inter, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 0.3f);
  auto fill = [&](int64_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = normal(rng);
    return v;
  };
  Layer l;
  l.router = fill(num_experts * hidden);
  for (int32_t e = 0; e < num_experts; ++e) {
    l.gate.push_back(fill(inter * hidden));
    l.up.push_back(fill(inter * hidden));
    l.down.push_back(fill(hidden * inter));
  }
  return l;
}

// Views the layer's vectors; the experts' gate and up as slices of one stacked matrix, as GGUF
// stores them.
void view(Layer& l, int32_t num_experts, int64_t hidden, int64_t inter,
          std::vector<float>* stacked) {
  l.weights.router = quant::make_matrix(GgmlType::F32, l.router.data(), num_experts, hidden);
  stacked->clear();
  for (int32_t e = 0; e < num_experts; ++e) {
    stacked->insert(stacked->end(), l.gate[e].begin(), l.gate[e].end());
    stacked->insert(stacked->end(), l.up[e].begin(), l.up[e].end());
  }
  const quant::QuantMatrix all =
      quant::make_matrix(GgmlType::F32, stacked->data(), 2 * num_experts * inter, hidden);
  l.weights.gate_up.clear();
  l.weights.down.clear();
  for (int32_t e = 0; e < num_experts; ++e) {
    l.weights.gate_up.push_back(quant::slice_rows(all, 2 * e * inter, inter));
    l.weights.gate_up.push_back(quant::slice_rows(all, (2 * e + 1) * inter, inter));
    l.weights.down.push_back(quant::make_matrix(GgmlType::F32, l.down[e].data(), hidden, inter));
  }
}

// One token at a time, in double: softmax, the top_k largest (ties to the lower id), weighted
// sum of silu(gate x) * up x through down.
std::vector<float> reference(const Layer& l, const std::vector<float>& x, int64_t num_tokens,
                             int32_t num_experts, int64_t hidden, int64_t inter, int32_t top_k,
                             bool normalize, std::vector<int32_t>* tokens_per_expert) {
  std::vector<float> out(num_tokens * hidden, 0.0f);
  tokens_per_expert->assign(num_experts, 0);
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* xt = x.data() + t * hidden;
    std::vector<double> p(num_experts);
    double max_logit = -INFINITY, sum = 0;
    for (int32_t e = 0; e < num_experts; ++e) {
      double z = 0;
      for (int64_t i = 0; i < hidden; ++i) z += double{l.router[e * hidden + i]} * xt[i];
      p[e] = z;
      max_logit = std::max(max_logit, z);
    }
    for (double& v : p) sum += (v = std::exp(v - max_logit));
    for (double& v : p) v /= sum;
    std::vector<int32_t> order(num_experts);
    for (int32_t e = 0; e < num_experts; ++e) order[e] = e;
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
    double chosen = 0;
    for (int32_t k = 0; k < top_k; ++k) chosen += p[order[k]];
    std::vector<int32_t> picked(order.begin(), order.begin() + top_k);
    std::sort(picked.begin(), picked.end());
    for (int32_t e : picked) {
      ++(*tokens_per_expert)[e];
      const double w = normalize ? p[e] / chosen : p[e];
      std::vector<double> a(inter);
      for (int64_t j = 0; j < inter; ++j) {
        double g = 0, u = 0;
        for (int64_t i = 0; i < hidden; ++i) {
          g += double{l.gate[e][j * hidden + i]} * xt[i];
          u += double{l.up[e][j * hidden + i]} * xt[i];
        }
        a[j] = g / (1.0 + std::exp(-g)) * u;
      }
      for (int64_t o = 0; o < hidden; ++o) {
        double y = 0;
        for (int64_t j = 0; j < inter; ++j) y += double{l.down[e][o * inter + j]} * a[j];
        out[t * hidden + o] += static_cast<float>(w * y);
      }
    }
  }
  return out;
}

void expect_matches_reference(Layer& l, const std::vector<float>& x, int64_t num_tokens,
                              int32_t num_experts, int64_t hidden, int64_t inter, int32_t top_k,
                              bool normalize, std::vector<int32_t>* tokens_per_expert) {
  std::vector<float> stacked;
  view(l, num_experts, hidden, inter, &stacked);
  const std::vector<float> want =
      reference(l, x, num_tokens, num_experts, hidden, inter, top_k, normalize, tokens_per_expert);
  std::vector<float> got(num_tokens * hidden, NAN);
  ThreadPool pool(3);
  const MoeParams params{top_k, normalize, cpu::Activation::kSilu};
  moe_forward(l.weights, params, x.data(), num_tokens, hidden, got.data(), &pool,
              quant::ActPrecision::kF32);
  const double err = kvp::testing::relative_error(got, want);
  EXPECT_LT(err, 1e-5) << "relative error " << err << " over " << num_tokens << " tokens";
}

TEST(MoeForward, GroupedByExpertEqualsThePerTokenReference) {
  std::mt19937 rng(7);
  const int32_t num_experts = 6, top_k = 2;
  const int64_t hidden = 32, inter = 16;
  for (int64_t num_tokens : {1, 2, 13, 64}) {
    for (bool normalize : {false, true}) {
      Layer l = random_layer(num_experts, hidden, inter, rng);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::vector<float> x(num_tokens * hidden);
      for (float& v : x) v = normal(rng);
      std::vector<int32_t> counts;
      expect_matches_reference(l, x, num_tokens, num_experts, hidden, inter, top_k, normalize,
                               &counts);
    }
  }
}

// Router rows that send every token to expert 0 and none to expert 5 (positive activations: row
// 0 all +1, row 5 all -1). Expert 5's weights are NaN: a step that read them into any output
// would show it.
TEST(MoeForward, OneExpertTakesEveryTokenAndAnotherNone) {
  std::mt19937 rng(11);
  const int32_t num_experts = 6, top_k = 3;
  const int64_t hidden = 32, inter = 16, num_tokens = 20;
  Layer l = random_layer(num_experts, hidden, inter, rng);
  std::fill_n(l.router.begin(), hidden, 1.0f);
  std::fill_n(l.router.begin() + 5 * hidden, hidden, -1.0f);
  for (std::vector<float>* m : {&l.gate[5], &l.up[5], &l.down[5]}) {
    std::fill(m->begin(), m->end(), NAN);
  }
  std::uniform_real_distribution<float> uniform(0.1f, 1.0f);
  std::vector<float> x(num_tokens * hidden);
  for (float& v : x) v = uniform(rng);
  std::vector<int32_t> counts;
  expect_matches_reference(l, x, num_tokens, num_experts, hidden, inter, top_k, true, &counts);
  EXPECT_EQ(counts[0], num_tokens);
  EXPECT_EQ(counts[5], 0);
}

// GPT-OSS's experts, per token in double as transformers' GptOssMLP computes them: router logits
// with bias, top-k of the logits, softmax over those k; each chosen expert gate/up = W x + b,
// g = min(gate, 7), u = clamp(up, -7, 7), (u + 1) * g * sigmoid(1.702 g), down + bias. Gate and
// up are scaled so the clamp cuts a good share of them.
TEST(MoeForward, GptOssBiasesAndClampedSwigluEqualThePerTokenReference) {
  std::mt19937 rng(17);
  const int32_t num_experts = 5, top_k = 2;
  const int64_t hidden = 32, inter = 16, num_tokens = 23;
  Layer l = random_layer(num_experts, hidden, inter, rng);
  for (int32_t e = 0; e < num_experts; ++e) {
    for (float& v : l.gate[e]) v *= 8.0f;
    for (float& v : l.up[e]) v *= 8.0f;
  }
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto fill = [&](int64_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = normal(rng);
    return v;
  };
  const std::vector<float> router_bias = fill(num_experts);
  const std::vector<float> gate_up_bias = fill(num_experts * 2 * inter);  // [e][gate | up]
  const std::vector<float> down_bias = fill(num_experts * hidden);
  const std::vector<float> x = fill(num_tokens * hidden);

  std::vector<float> want(num_tokens * hidden, 0.0f);
  int64_t clipped = 0;
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* xt = x.data() + t * hidden;
    std::vector<double> logit(num_experts);
    for (int32_t e = 0; e < num_experts; ++e) {
      logit[e] = router_bias[e];
      for (int64_t i = 0; i < hidden; ++i) logit[e] += double{l.router[e * hidden + i]} * xt[i];
    }
    std::vector<int32_t> order(num_experts);
    for (int32_t e = 0; e < num_experts; ++e) order[e] = e;
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return logit[a] > logit[b]; });
    std::vector<int32_t> picked(order.begin(), order.begin() + top_k);
    double sum = 0;
    for (int32_t e : picked) sum += std::exp(logit[e] - logit[order[0]]);
    std::sort(picked.begin(), picked.end());
    for (int32_t e : picked) {
      const double w = std::exp(logit[e] - logit[order[0]]) / sum;
      std::vector<double> a(inter);
      for (int64_t j = 0; j < inter; ++j) {
        double g = gate_up_bias[e * 2 * inter + j], u = gate_up_bias[e * 2 * inter + inter + j];
        for (int64_t i = 0; i < hidden; ++i) {
          g += double{l.gate[e][j * hidden + i]} * xt[i];
          u += double{l.up[e][j * hidden + i]} * xt[i];
        }
        clipped += (g > 7.0) + (std::fabs(u) > 7.0);
        g = std::min(g, 7.0);
        u = std::clamp(u, -7.0, 7.0);
        a[j] = (u + 1.0) * g / (1.0 + std::exp(-1.702 * g));
      }
      for (int64_t o = 0; o < hidden; ++o) {
        double y = down_bias[e * hidden + o];
        for (int64_t j = 0; j < inter; ++j) y += double{l.down[e][o * inter + j]} * a[j];
        want[t * hidden + o] += static_cast<float>(w * y);
      }
    }
  }
  EXPECT_GT(clipped, num_tokens * top_k * inter / 10) << "the clamp is barely exercised";

  std::vector<float> stacked;
  view(l, num_experts, hidden, inter, &stacked);
  l.weights.router_bias = router_bias;
  l.weights.gate_up_bias = gate_up_bias;
  l.weights.down_bias = down_bias;
  std::vector<float> got(num_tokens * hidden, NAN);
  ThreadPool pool(2);
  const MoeParams params{top_k, /*normalize=*/true, cpu::Activation::kClampedSwiglu};
  moe_forward(l.weights, params, x.data(), num_tokens, hidden, got.data(), &pool,
              quant::ActPrecision::kF32);
  const double err = kvp::testing::relative_error(got, want);
  EXPECT_LT(err, 1e-5) << "relative error " << err << "; " << clipped << " values clipped";
}

}  // namespace
}  // namespace kvp

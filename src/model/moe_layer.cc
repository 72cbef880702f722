#include "model/moe_layer.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <span>

#include "common/check.h"

namespace kvp {

namespace {

// rows [num_rows][width] += bias [width], every row.
void add_row_bias(float* rows, int64_t num_rows, const float* bias, int64_t width) {
  for (int64_t r = 0; r < num_rows; ++r) {
    for (int64_t i = 0; i < width; ++i) rows[r * width + i] += bias[i];
  }
}

}  // namespace

size_t ExpertWeights::size_bytes() const {
  size_t n = router.size_bytes();
  for (int32_t e = 0; e < num_experts(); ++e) n += expert_size_bytes(e);
  for (const quant::QuantMatrix& m : shared_gate_up) n += m.size_bytes();
  return n + shared_down.size_bytes();
}

size_t ExpertWeights::expert_size_bytes(int32_t expert) const {
  return gate_up[2 * expert].size_bytes() + gate_up[2 * expert + 1].size_bytes() +
         down[expert].size_bytes();
}

void route_top_k(const float* router_logits, int64_t num_tokens, int32_t num_experts, int32_t top_k,
                 bool normalize, int32_t* expert_ids, float* weights) {
  KVP_CHECK(top_k > 0 && top_k <= num_experts, "route_top_k: top {} of {} experts", top_k,
            num_experts);
  std::vector<float> probs(num_experts);
  std::vector<int32_t> order(num_experts);
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* logits = router_logits + t * num_experts;
    const float max_logit = *std::max_element(logits, logits + num_experts);
    float sum = 0.0f;
    for (int32_t e = 0; e < num_experts; ++e) {
      probs[e] = std::exp(logits[e] - max_logit);
      sum += probs[e];
    }
    for (float& p : probs) p /= sum;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + top_k, order.end(), [&](int32_t a, int32_t b) {
      return probs[a] > probs[b] || (probs[a] == probs[b] && a < b);
    });
    int32_t* ids = expert_ids + t * top_k;
    float* w = weights + t * top_k;
    float chosen = 0.0f;
    for (int32_t k = 0; k < top_k; ++k) {
      ids[k] = order[k];
      w[k] = probs[order[k]];
      chosen += w[k];
    }
    if (normalize) {
      for (int32_t k = 0; k < top_k; ++k) w[k] /= chosen;
    }
  }
}

ExpertGroups group_by_expert(const int32_t* expert_ids, const float* weights, int64_t num_tokens,
                             int32_t num_experts, int32_t top_k) {
  ExpertGroups g;
  g.offsets.assign(num_experts + 1, 0);
  const int64_t num_pairs = num_tokens * top_k;
  for (int64_t i = 0; i < num_pairs; ++i) {
    KVP_DCHECK(expert_ids[i] >= 0 && expert_ids[i] < num_experts, "expert id {}", expert_ids[i]);
    ++g.offsets[expert_ids[i] + 1];
  }
  for (int32_t e = 0; e < num_experts; ++e) g.offsets[e + 1] += g.offsets[e];
  g.token_rows.resize(num_pairs);
  g.weights.resize(num_pairs);
  std::vector<int32_t> next(g.offsets.begin(), g.offsets.end() - 1);  // [num_experts]
  for (int64_t i = 0; i < num_pairs; ++i) {
    const int32_t slot = next[expert_ids[i]]++;
    g.token_rows[slot] = static_cast<int32_t>(i / top_k);
    g.weights[slot] = weights[i];
  }
  return g;
}

void moe_forward(const ExpertWeights& w, const MoeParams& params, const float* xn,
                 int64_t num_tokens, int64_t hidden, float* out, ThreadPool* pool,
                 quant::ActPrecision precision) {
  const int32_t num_experts = w.num_experts();
  const int64_t inter = w.intermediate();
  const int32_t top_k = params.top_k;
  std::vector<float> logits(num_tokens * num_experts);  // [num_tokens][num_experts]
  quant::matmul(w.router, xn, num_tokens, hidden, logits.data(), num_experts, pool,
                quant::ActPrecision::kF32);
  if (!w.router_bias.empty())
    add_row_bias(logits.data(), num_tokens, w.router_bias.data(), num_experts);
  std::vector<int32_t> ids(num_tokens * top_k);  // [num_tokens][top_k]
  std::vector<float> weights(num_tokens * top_k);
  route_top_k(logits.data(), num_tokens, num_experts, top_k, params.normalize, ids.data(),
              weights.data());
  const ExpertGroups groups =
      group_by_expert(ids.data(), weights.data(), num_tokens, num_experts, top_k);

  std::fill(out, out + num_tokens * hidden, 0.0f);
  std::vector<float> x_e, gate_up, act, y;  // [n_e][hidden], [n_e][2 inter], [n_e][inter]
  for (int32_t e = 0; e < num_experts; ++e) {
    const int32_t begin = groups.offsets[e], n = groups.offsets[e + 1] - begin;
    if (n == 0) continue;
    x_e.resize(static_cast<size_t>(n) * hidden);
    for (int32_t i = 0; i < n; ++i) {
      const float* row = xn + int64_t{groups.token_rows[begin + i]} * hidden;
      std::copy(row, row + hidden, x_e.data() + int64_t{i} * hidden);
    }
    gate_up.resize(static_cast<size_t>(n) * 2 * inter);
    act.resize(static_cast<size_t>(n) * inter);
    y.resize(static_cast<size_t>(n) * hidden);
    quant::matmul(std::span(w.gate_up).subspan(2 * e, 2), x_e.data(), n, hidden, gate_up.data(),
                  2 * inter, pool, precision);
    if (!w.gate_up_bias.empty()) {
      add_row_bias(gate_up.data(), n, w.gate_up_bias.data() + e * 2 * inter, 2 * inter);
    }
    cpu::gated_activation(gate_up.data(), act.data(), n, inter, params.activation);
    quant::matmul(w.down[e], act.data(), n, inter, y.data(), hidden, pool, precision);
    if (!w.down_bias.empty()) add_row_bias(y.data(), n, w.down_bias.data() + e * hidden, hidden);
    for (int32_t i = 0; i < n; ++i) {
      float* dst = out + int64_t{groups.token_rows[begin + i]} * hidden;
      const float* src = y.data() + int64_t{i} * hidden;
      const float weight = groups.weights[begin + i];
      for (int64_t j = 0; j < hidden; ++j) dst[j] += weight * src[j];
    }
  }
  if (w.shared_gate_up.empty()) return;
  const int64_t shared_inter = w.shared_down.cols;
  gate_up.resize(static_cast<size_t>(num_tokens) * 2 * shared_inter);
  act.resize(static_cast<size_t>(num_tokens) * shared_inter);
  y.resize(static_cast<size_t>(num_tokens) * hidden);
  quant::matmul(w.shared_gate_up, xn, num_tokens, hidden, gate_up.data(), 2 * shared_inter, pool,
                precision);
  cpu::gated_activation(gate_up.data(), act.data(), num_tokens, shared_inter, params.activation);
  quant::matmul(w.shared_down, act.data(), num_tokens, shared_inter, y.data(), hidden, pool,
                precision);
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* x = xn + t * hidden;
    float z = 0.0f;
    for (int64_t i = 0; i < hidden; ++i) z += w.shared_gate[i] * x[i];
    const float scale = 1.0f / (1.0f + std::exp(-z));
    for (int64_t j = 0; j < hidden; ++j) out[t * hidden + j] += scale * y[t * hidden + j];
  }
}

}  // namespace kvp

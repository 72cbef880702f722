// The mixture-of-experts MLP of a decoder layer (Qwen3-MoE, Qwen2-MoE, GPT-OSS) on the CPU: the
// router picks each token's top-k experts, tokens are grouped by expert, and each expert that
// received tokens runs its gated MLP once over all of them, so a step reads each chosen expert's
// weights once (a prefill of many tokens) and a decode step at batch 1 reads only the k experts it
// chose.
//
//   xn [num_tokens][hidden] ─ router ─▶ logits [num_tokens][num_experts]
//      ─ softmax, top-k (renormalised) ─▶ (expert id, weight) [num_tokens][k]
//      ─ group by expert ─▶ for expert e: rows of its tokens, gathered [n_e][hidden]
//      ─ gate_up_e, act, down_e ─▶ [n_e][hidden] ─ × weight, added to out[token] ─▶ out
//   (Qwen2-MoE) + sigmoid(shared_gate · xn) × shared expert(xn), every token
//   (GPT-OSS) the router and each expert's projections add their biases; the activation is
//   the clamped SwiGLU (cpu_layer_ops.h)
//
// Experts' matrices are views into the stored weights (quant::slice_rows of a 3-D GGUF tensor,
// or one safetensors tensor per expert): nothing is copied or converted per step.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cpu_layer_ops.h"
#include "common/thread_pool.h"
#include "quant/quant_matmul.h"

namespace kvp {

struct ExpertWeights {
  quant::QuantMatrix router;                // [num_experts][hidden]
  std::vector<quant::QuantMatrix> gate_up;  // [num_experts * 2]: expert e's gate at 2e, up at
                                            // 2e + 1, each [intermediate][hidden]
  std::vector<quant::QuantMatrix> down;     // [num_experts], each [hidden][intermediate]
  // Qwen2-MoE's shared expert, empty elsewhere: gate, up [shared_intermediate][hidden], down
  // [hidden][shared_intermediate], and its gate's weights [hidden].
  std::vector<quant::QuantMatrix> shared_gate_up;
  quant::QuantMatrix shared_down;
  std::vector<float> shared_gate;
  // GPT-OSS's biases, empty elsewhere: the router's [num_experts]; each expert's gate then up
  // [num_experts][2 * intermediate]; each expert's down [num_experts][hidden].
  std::vector<float> router_bias;
  std::vector<float> gate_up_bias;
  std::vector<float> down_bias;

  int32_t num_experts() const { return static_cast<int32_t>(down.size()); }
  int64_t intermediate() const { return down.empty() ? 0 : down.front().cols; }
  size_t size_bytes() const;  // router and every expert, the shared one included
  size_t expert_size_bytes(int32_t expert) const;
};

// Each token's top_k experts by probability (softmax of its router logits), most probable
// first; equal probabilities go to the lower expert id (torch.topk on the CPU leaves the order
// of ties unspecified: it returned [2, 3] for four equal values). weights are the
// probabilities, divided by their sum when `normalize` (Qwen3-MoE's norm_topk_prob).
//   router_logits [num_tokens][num_experts] → expert_ids, weights [num_tokens][top_k]
// requires: 0 < top_k <= num_experts.
void route_top_k(const float* router_logits, int64_t num_tokens, int32_t num_experts, int32_t top_k,
                 bool normalize, int32_t* expert_ids, float* weights);

// The (token, weight) pairs each expert received, grouped: expert e's are entries
// [offsets[e], offsets[e + 1]) of token_rows / weights, in token order.
struct ExpertGroups {
  std::vector<int32_t> offsets;     // [num_experts + 1]
  std::vector<int32_t> token_rows;  // [num_tokens * top_k]
  std::vector<float> weights;       // [num_tokens * top_k]
};
ExpertGroups group_by_expert(const int32_t* expert_ids, const float* weights, int64_t num_tokens,
                             int32_t num_experts, int32_t top_k);

struct MoeParams {
  int32_t top_k = 0;
  bool normalize = false;
  cpu::Activation activation = cpu::Activation::kSilu;
};

// out[t] = sum over t's experts e of weight_e * down_e(act(gate_e xn[t]) * up_e xn[t]), the
// experts' contributions added in ascending expert order (transformers' order), then the shared
// expert's when there is one. Overwrites out.
//   xn [num_tokens][hidden], out [num_tokens][hidden]; the router multiplies in f32, the experts
//   in `precision` (quant_matmul.h). Threads: the pool's, inside each matmul.
// requires: xn and out do not overlap.
void moe_forward(const ExpertWeights& w, const MoeParams& params, const float* xn,
                 int64_t num_tokens, int64_t hidden, float* out, ThreadPool* pool,
                 quant::ActPrecision precision);

}  // namespace kvp

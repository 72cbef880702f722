// Launchers of the CUDA mixture-of-experts kernels (moe_kernels.cu): routing, grouping of the
// (token, slot) pairs by expert, the experts' gated MLPs as gathered matrix-vector products that
// read only the chosen experts' weights, and the weighted sum. No host synchronisation anywhere:
// every count stays on the device, so decode steps that use them are captured in CUDA graphs.
//
//   logits [T][E (+1)] ─ route ─▶ expert_ids, weights [T][k]          (pair p = t * k + slot)
//   expert_ids ─ group (counting sort) ─▶ offsets [E + 1], pairs [T * k] grouped by expert
//   for each expert e with pairs, each tile of its rows (one CTA), the pairs of e in chunks:
//     gate_up rows · x[p / k] (+ bias) ─ act(gate, up) ─▶ act [T * k][inter] f32
//     down rows · act[p] (+ bias)                      ─▶ y   [T * k][hidden] f32
//   combine: out[t] = Σ_slot (ascending expert id) weight · y[t * k + slot]
//                     (+ sigmoid(shared_logit[t]) · shared[t])
// Steps of few tokens (decode) launch the f32 norm and the router's products as one kernel, and
// route + group as another.
//
// A CTA reads its weight rows once per chunk of (at most) kMoeChunkTokens pairs: at decode batch
// sizes (every expert picked by at most a few tokens) each chosen expert's weights are read once
// per step, whatever the number of tokens that picked it. Launchers return cudaGetLastError().
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvp::cuda::detail {

// Pairs of one expert that a CTA multiplies per pass over its weight rows, at most (steps of 1,
// 2 or 4 tokens take chunks of that size, with more loads in flight).
constexpr int32_t kMoeChunkTokens = 8;
// Steps of at most this many tokens may take the small-step kernels (launch_moe_router_small,
// launch_moe_route_group): fewer launches where the step's work is small.
constexpr int32_t kMoeSmallStepTokens = 16;
// Limits of the kernels (init checks them): experts per token, experts.
constexpr int32_t kMoeMaxTopK = 32;
constexpr int32_t kMoeMaxExperts = 1024;

// out [num_rows][hidden] f32 = x / rms(x) * w, x f32 [num_rows][hidden], w f32 [hidden]: the
// normalised MLP input in f32 for the router (the CPU routes in f32).
cudaError_t launch_rms_norm_f32(const float* x, const float* w, int32_t num_rows, int32_t hidden,
                                float eps, float* out, cudaStream_t stream);

// Per token t: probabilities = softmax(logits[t][0, num_experts)); its top_k experts by
// probability, most probable first, equal probabilities to the lower expert id (route_top_k in
// model/moe_layer.h); weights the probabilities, divided by their sum when `normalize`.
//   logits [num_tokens][logits_stride] f32 → expert_ids, weights [num_tokens][top_k]
// requires: 0 < top_k <= min(num_experts, kMoeMaxTopK), num_experts <= kMoeMaxExperts.
cudaError_t launch_moe_route(const float* logits, int32_t logits_stride, int32_t num_tokens,
                             int32_t num_experts, int32_t top_k, bool normalize,
                             int32_t* expert_ids, float* weights, cudaStream_t stream);

// Counting sort of the pairs by expert: expert e's pair indices are pairs[offsets[e],
// offsets[e + 1]) (in no particular order within an expert); active[0] is the number of experts
// with pairs, active[1 ...] those experts in ascending id. One CTA.
//   expert_ids [num_pairs] → offsets [num_experts + 1], pairs [num_pairs],
//                            active [1 + num_experts]
// requires: every id in [0, num_experts), num_experts <= kMoeMaxExperts.
cudaError_t launch_moe_group(const int32_t* expert_ids, int32_t num_pairs, int32_t num_experts,
                             int32_t* offsets, int32_t* pairs, int32_t* active,
                             cudaStream_t stream);

// Small steps, the two kernels above in one launch (one CTA): route every token, then group the
// pairs; the same outputs. requires also num_tokens <= kMoeSmallStepTokens.
cudaError_t launch_moe_route_group(const float* logits, int32_t logits_stride, int32_t num_tokens,
                                   int32_t num_experts, int32_t top_k, bool normalize,
                                   int32_t* expert_ids, float* weights, int32_t* offsets,
                                   int32_t* pairs, int32_t* active, cudaStream_t stream);

// Small steps, the router in one launch: launch_rms_norm_f32 and the product with the router's
// rows, plus a bias on the first num_bias logits (GPT-OSS's router bias; 0 for none):
//   logits[t][r] = (1 / rms(x[t])) * sum_i x[t][i] * norm_w[i] * router[r][i] (+ bias[r])
// (the norm's scale applied to the sum, not to each x: equal up to f32 rounding)
//   x [num_tokens][hidden] f32, router [rows][hidden] f32 → logits [num_tokens][rows] f32
// requires: hidden a multiple of 4, num_bias <= rows, num_tokens <= kMoeSmallStepTokens.
cudaError_t launch_moe_router_small(const float* x, const float* norm_w, const float* router,
                                    const float* bias, int32_t num_bias, int32_t num_tokens,
                                    int32_t hidden, int32_t rows, float eps, float* logits,
                                    cudaStream_t stream);

// The experts' gated activation act(gate, up): silu(g) * u, gelu_tanh(g) * u, or GPT-OSS's
// clamped SwiGLU (cpu::Activation::kClampedSwiglu: g = min(g, limit), u = clamp(u, -limit,
// limit), (u + 1) * g * sigmoid(alpha * g)).
enum class MoeActivation { kSilu, kGeluTanh, kClampedSwiglu };

struct MoeExpertArgs {
  const void* x;           // [num_tokens][hidden] bf16: the normalised MLP input
  const void* gate_up;     // [num_experts][2 * inter][hidden] bf16: expert e's gate, then up rows
  const void* down;        // [num_experts][hidden][inter] bf16
  const int32_t* offsets;  // [num_experts + 1] (launch_moe_group)
  const int32_t* pairs;    // [num_pairs] grouped by expert; token of pair p is p / top_k
  const int32_t* active;   // [1 + num_experts]: count, then the experts with pairs
  // [num_pairs] (launch_moe_route): read by the GEMM path, and by the kernels for steps of one
  // token (slot y is then pair y: no grouping needed)
  const int32_t* expert_ids;
  // GPT-OSS's biases, or null: [num_experts][2 * inter] f32, expert e's gate bias then up's,
  // added before the activation; [num_experts][hidden] f32, added to the down output
  const float* gate_up_bias;
  const float* down_bias;
  int32_t num_pairs, num_experts, top_k, hidden, inter;
  MoeActivation activation;
  float swiglu_alpha, swiglu_limit;  // kClampedSwiglu's constants
  float* act;                        // [num_pairs][inter] f32, written
  float* y;  // [num_pairs][hidden] f32, written: each pair's expert output (+ bias), unweighted
};
// Whether the expert kernels take these sizes (multiples of 8: rows are read 16 bytes a lane).
bool moe_experts_support(int32_t hidden, int32_t inter);
// The experts of every pair: two kernels (gate_up + activation, then down), grids over (row
// tile, min(num_experts, num_pairs)): the y-th CTA row takes the y-th expert with pairs, so a
// decode step launches CTAs for the experts it can touch, not for all of them.
cudaError_t launch_moe_experts(const MoeExpertArgs& args, cudaStream_t stream);

// Prompt steps (moe_gemm.h) run the experts as GEMMs over the pairs gathered by expert:
//   xg [num_pairs][hidden] bf16: row i = x[pairs[i] / top_k]; rows [num_pairs]: rows[pairs[i]] = i
//   (where pair p's output sits in the grouped y); row_expert [num_pairs]: expert_ids[pairs[i]].
cudaError_t launch_moe_gather(const void* x, const int32_t* pairs, const int32_t* expert_ids,
                              int32_t num_pairs, int32_t top_k, int32_t hidden, void* xg,
                              int32_t* rows, int32_t* row_expert, cudaStream_t stream);

// act [num_pairs][inter] bf16 = act(gate + bias, up + bias) of the GEMM's rows
// h [num_pairs][2 * inter] bf16 (gate columns, then up columns); biases of row i's expert
// row_expert[i] from gate_up_bias ([num_experts][2 * inter] f32) when it is not null.
cudaError_t launch_moe_gemm_activation(const void* h, const int32_t* row_expert,
                                       const float* gate_up_bias, int32_t num_pairs, int32_t inter,
                                       MoeActivation activation, float alpha, float limit,
                                       void* act, cudaStream_t stream);

// out [num_tokens][hidden] f32 = Σ over t's slots in ascending expert id of weights[t][slot] ·
// (y[row(t * top_k + slot)] + down_bias[expert]), then + sigmoid(shared_logits[t *
// shared_stride]) · shared[t] when shared is not null (the CPU layer's order of additions).
// y: [rows][hidden] f32 (launch_moe_experts), or bf16 when y_bf16 (the GEMM path); row(p) =
// rows[p], or p when rows is null; down_bias null: none (the expert kernels add it to y).
cudaError_t launch_moe_combine(const void* y, bool y_bf16, const int32_t* rows,
                               const float* down_bias, const int32_t* expert_ids,
                               const float* weights, int32_t num_tokens, int32_t top_k,
                               int32_t hidden, const float* shared, const float* shared_logits,
                               int32_t shared_stride, float* out, cudaStream_t stream);

}  // namespace kvp::cuda::detail

// The mixture-of-experts MLP of the CUDA model runner (Qwen2-MoE, Qwen3-MoE, GPT-OSS): its device
// weights, its per-step buffers, and how they are loaded or made up. The launch sequence is
// CudaModelRunner::enqueue_moe_mlp (cuda_moe_layer.cc), the kernels moe_kernels.h.
//
//   x (f32 residual) ─ rms_norm f32 ─ cuBLAS f32 GEMM router (+ bias) ─▶ logits [T][E (+1)]
//      ─ route (softmax, top-k, renormalise) ─▶ ids, weights [T][k] ─ group ─▶ pairs by expert
//   xn (bf16) ─ experts: gate_up (+ bias) · act · down (+ bias) per pair ─▶ y [T * k][hidden] f32
//      (decode: the gathered kernels of moe_kernels.h; eager prompt steps: grouped GEMMs over the
//      pairs gathered by expert, moe_gemm.h)
//   (Qwen2-MoE) xn ─ shared expert, the dense MLP path (cuBLAS) ─▶ shared [T][hidden] f32
//   combine ─▶ proj [T][hidden] f32 (the same slot the dense MLP's down output takes)
//
// The router runs in f32 as the CPU layer's does (model/moe_layer.h), so that both pick the
// same experts wherever the f32 probabilities are not within rounding of a tie; the experts run
// on bf16 weights with f32 accumulation, as the dense projections do.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>

#include "backend/cuda/device_buffer.h"
#include "common/status.h"
#include "model/model_spec.h"
#include "model/tensor_parallel.h"
#include "model/weight_source.h"

namespace kvp::cuda {

struct DeviceMoeWeights {
  // [num_experts + shared][hidden] f32: the router's rows, then (Qwen2-MoE, shared = 1) the
  // shared expert's gate row, so one GEMM gives both
  DeviceBuffer router;
  DeviceBuffer gate_up;  // [num_experts][2 * moe_intermediate][hidden] bf16: gate rows, up rows
  DeviceBuffer down;     // [num_experts][hidden][moe_intermediate] bf16
  // GPT-OSS's biases (spec.expert_bias), else empty: the router's [num_experts], the experts'
  // gate then up [num_experts][2 * moe_intermediate] and down [num_experts][hidden], all f32
  DeviceBuffer router_bias;
  DeviceBuffer gate_up_bias;
  DeviceBuffer down_bias;

  size_t size_bytes() const {
    return router.size_bytes() + gate_up.size_bytes() + down.size_bytes() +
           router_bias.size_bytes() + gate_up_bias.size_bytes() + down_bias.size_bytes();
  }
};

// Per-step buffers of the MoE layers (shared by all of them), sized for a number of tokens.
struct MoeBuffers {
  DeviceBuffer xn_f32;      // [tokens][hidden] f32: the router's input
  DeviceBuffer logits;      // [tokens][router_rows] f32
  DeviceBuffer expert_ids;  // [tokens][top_k] int32
  DeviceBuffer weights;     // [tokens][top_k] f32
  DeviceBuffer offsets;     // [num_experts + 1] int32
  DeviceBuffer active;      // [1 + num_experts] int32: count, experts with pairs
  DeviceBuffer pairs;       // [tokens * top_k] int32, grouped by expert
  DeviceBuffer act;         // [tokens * top_k][moe_intermediate] f32
  DeviceBuffer y;           // [tokens * top_k][hidden] f32
  DeviceBuffer shared;      // [tokens][hidden] f32 (Qwen2-MoE's shared expert) or empty

  // (Re)allocates every buffer for `num_tokens`; contents undefined.
  Status allocate(const ModelSpec& spec, int64_t num_tokens);
};

// Rows of the router matrix: the experts', plus one for a shared expert's gate.
int32_t moe_router_rows(const ModelSpec& spec);

// Whether the CUDA runner runs this model's experts: qwen2_moe, qwen3_moe and gpt_oss shapes
// within the kernels' limits.
Status check_moe_supported(const ModelSpec& spec);

// Layer `layer`'s router, experts and (Qwen2-MoE) shared expert from `source` (Hugging Face names;
// experts through WeightSource::read_experts, dequantised to f32 one expert at a time, converted
// to bf16, uploaded; GPT-OSS's router "mlp.router.{weight,bias}" and its experts and biases
// through read_gpt_oss_experts, the CPU runner's reader). The shared expert's gate and up go to
// shared_gate_up ([2 * shared_inter] [hidden] bf16, gate rows then up rows) and its down to
// shared_down ([hidden][shared_inter]), the dense MLP's buffers. requires: spec.layer_moe(layer).
Status load_moe_weights(const ModelSpec& spec, const WeightSource& source, int32_t layer,
                        DeviceMoeWeights* moe, DeviceBuffer* shared_gate_up,
                        DeviceBuffer* shared_down);

// Rows [row0, row0 + rows) x columns [col0, col0 + cols) of a whole [*][full_cols] matrix.
struct RandomRect {
  int64_t row0, rows, col0, cols;
};
// *out (allocated here) = the rectangles one after another, each holding the values the whole
// matrix filled uniformly in ±1/sqrt(full_cols) from `seed` has there (launch_fill_uniform_rect),
// in bf16: a rank's share of a random matrix equals that part of the whole one.
Status fill_random_rects(DeviceBuffer* out, int64_t full_cols, std::span<const RandomRect> rects,
                         uint64_t seed, cudaStream_t stream);

// Random weights of the same shapes made on the device (uniform in ±1/sqrt(fan-in); the router
// made on the host), deterministic in seed; *seed advances once per tensor. `spec` is the whole
// model's: rank shard.rank gets its share of every expert (shard_spec's intermediate rows of
// gate and up, columns of down), filled as the whole model's weights would be, so that split
// random models compute what the whole one does.
Status random_moe_weights(const ModelSpec& spec, TensorShard shard, uint64_t* seed,
                          cudaStream_t stream, DeviceMoeWeights* moe, DeviceBuffer* shared_gate_up,
                          DeviceBuffer* shared_down);

}  // namespace kvp::cuda

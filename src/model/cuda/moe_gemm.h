// The mixture-of-experts experts of prompt steps as GEMMs: the (token, slot) pairs gathered by
// expert, then per projection one cuBLAS grouped GEMM (or one GEMM per expert) over every expert
// that has pairs, on tensor cores. Decode steps keep the gathered matrix-vector kernels of
// moe_kernels.h, which need no host synchronisation and run inside CUDA graphs; this path copies
// the expert counts to the host once per layer (a stream synchronisation), so it is never
// captured.
//
//   offsets [E + 1] ─ D2H ─▶ host counts                      (launch_moe_group ran before)
//   x [T][hidden] bf16 ─ gather ─▶ xg [pairs][hidden] bf16 grouped by expert, rows, row_expert
//   per expert e with n_e pairs: h_e [n_e][2 inter] bf16 = xg_e · gate_up_eᵀ     (GEMM 1)
//   h ─ act(gate + bias, up + bias) ─▶ act [pairs][inter] bf16
//   per expert e: y_e [n_e][hidden] bf16 = act_e · down_eᵀ                        (GEMM 2)
//   y (grouped rows, bf16) ─ launch_moe_combine(rows, down_bias) ─▶ out f32
//
// Against the kernels (f32 from the products on) this rounds gate and up, the activation and
// each expert's output to bf16, with f32 accumulation inside the GEMMs: cuBLAS's grouped GEMM
// takes bf16 inputs only with a bf16 output (the dense MLP path rounds gate, up and the
// activation the same way).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/device_buffer.h"
#include "common/status.h"
#include "model/cuda/moe_kernels.h"

namespace kvp::cuda {

// How MoE steps of KVP_MOE_GEMM_MIN_TOKENS (16) tokens or more, prompt or decode, run the
// experts (cuda_model_runner.h): kKernels (never GEMMs), one cuBLAS call per expert and
// projection (kLoop), or one grouped call per projection (kGrouped; kLoop where cuBLAS refuses
// it, or where the experts with pairs have kMoeLoopMinRowsPerExpert rows or more on average).
enum class MoeGemmMode { kKernels, kLoop, kGrouped };
inline constexpr int64_t kMoeLoopMinRowsPerExpert = 256;

// The GEMM path's buffers, sized for a number of pairs.
struct MoeGemmScratch {
  DeviceBuffer gathered;       // [pairs][hidden] bf16
  DeviceBuffer rows;           // [pairs] int32: pair → its row of y
  DeviceBuffer row_expert;     // [pairs] int32
  DeviceBuffer h;              // [pairs][2 * inter] bf16
  DeviceBuffer act;            // [pairs][inter] bf16
  DeviceBuffer pointers;       // [6][num_experts] device pointers of the grouped calls
  PinnedBuffer offsets_host;   // [num_experts + 1] int32
  PinnedBuffer pointers_host;  // staging of `pointers`
  int64_t capacity_pairs = 0;
  bool grouped_refused = false;  // cuBLAS refused the grouped call once: loop from then on
  cublasStatus_t refusal = CUBLAS_STATUS_SUCCESS;  // what it said

  Status allocate(int64_t num_pairs, int32_t num_experts, int32_t hidden, int32_t inter);
};

// The experts of every pair of `a` (launch_moe_group has run on the stream): writes bf16 rows
// into a.y's memory in the gathered order, and scratch->rows, for launch_moe_combine(y,
// /*y_bf16=*/true, rows, a.down_bias, ...); a.act is not used. Synchronises `stream` once (the
// counts). cuBLAS runs on `handle`, whose stream must be `stream`. requires: mode != kKernels;
// scratch allocated for a.num_pairs.
Status enqueue_moe_experts_gemm(cublasHandle_t handle, const detail::MoeExpertArgs& a,
                                MoeGemmMode mode, MoeGemmScratch* scratch, cudaStream_t stream);

}  // namespace kvp::cuda

// Launchers of the CUDA model runner's fused non-attention kernels (model_kernels.cu), callable
// from plain C++: each returns cudaGetLastError() after its launch, and the runner turns it into
// a Status naming the kernel. The .cu file stays free of fmt (nvcc rejects its consteval format
// strings). Activations are row-major; "bf16" is __nv_bfloat16 and "f16" __half, passed as void*.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "model/cuda/peer_all_reduce_kernel.h"

namespace kvp::cuda::detail {

// x [num_tokens][hidden] f32 = table[token_ids[t]] * scale; table [vocab][hidden] bf16.
// requires: every token id in range (checked on the host copy).
cudaError_t launch_embed(const void* table, const int32_t* token_ids, int32_t num_tokens,
                         int32_t hidden, float scale, float* x, cudaStream_t stream);

// Whether launch_rms_norm_rows and launch_residual_norm take rows of `hidden` floats (a multiple
// of 4, at most 16384); they return cudaErrorInvalidValue otherwise.
bool row_kernels_support(int32_t hidden);

// out[r] (bf16) = x[rows ? rows[r] : r] / rms * w, for r < num_rows; x f32 [*][hidden],
// w f32 [hidden] (Gemma's 1 + w already folded in).
cudaError_t launch_rms_norm_rows(const float* x, const int32_t* rows, int32_t num_rows,
                                 int32_t hidden, const float* w, float eps, void* out,
                                 cudaStream_t stream);

// Per row: v = post_w ? rms_norm(proj) * post_w : proj; x += v; then, if next_w,
// xn (bf16) = rms_norm(x) * next_w. x, proj f32 [num_rows][hidden].
// With `reduce` (a split model's PeerAllReduce::row_args), proj is this GPU's partial sum and
// is first summed over the GPUs (each row one LL chunk): the all-reduce and the norm in one
// kernel. requires then: num_rows * hidden <= the PeerAllReduce's capacity.
cudaError_t launch_residual_norm(float* x, const float* proj, const float* post_w,
                                 const float* next_w, int32_t num_rows, int32_t hidden, float eps,
                                 void* xn, cudaStream_t stream,
                                 const PeerAllReduceArgs* reduce = nullptr);

struct QkvPostArgs {
  const float* qkv;          // [num_tokens][(num_q_heads + 2 num_kv_heads) * head_dim] f32
  const float* bias;         // [(num_q_heads + 2 num_kv_heads) * head_dim] or null
  const float* q_norm;       // [head_dim] or null (then k_norm is null too)
  const float* k_norm;       // [head_dim] or null
  const int32_t* positions;  // [num_tokens]
  const float* inv_freq;     // [rope_pairs]
  int32_t rope_pairs;        // rotated pairs per head (head_dim / 2)
  bool interleaved;          // pairs (2i, 2i+1) instead of (i, i + rope_pairs)
  int32_t num_tokens, num_q_heads, num_kv_heads, head_dim, padded_head_dim;
  float eps;
  bool out_bf16;  // else f16
  void* q;        // [num_tokens][num_q_heads][padded_head_dim], pad lanes zero
  void* k;        // [num_tokens][num_kv_heads][padded_head_dim]
  void* v;        // [num_tokens][num_kv_heads][padded_head_dim]
};
// Splits the fused projection into heads: + bias, q/k RMS norm, rope on q and k, conversion to
// the KV dtype, zero padding of head_dim to padded_head_dim. requires: head_dim <= 256.
cudaError_t launch_qkv_post(const QkvPostArgs& args, cudaStream_t stream);

// out [num_rows][dim] bf16 = act(gate) * up; gate_up [num_rows][2 * dim] bf16 (gate, then up).
cudaError_t launch_gated_activation(const void* gate_up, int64_t num_rows, int32_t dim, bool gelu,
                                    void* out, cudaStream_t stream);

// Per row r < num_rows of logits [num_rows][vocab] f32: summaries[r] = {argmax (first index of
// the largest value; NaN counts as -inf), max, max + log(sum exp(l - max))}. One CTA per row.
struct RowSummary {
  int32_t argmax;
  float max_logit;
  float log_z;
};
cudaError_t launch_row_summary(const float* logits, int32_t num_rows, int32_t vocab,
                               RowSummary* summaries, cudaStream_t stream);

// In place: x = cap * tanh(x / cap).
cudaError_t launch_soft_cap(float* x, int64_t count, float cap, cudaStream_t stream);

// In place: rows[r * stride + i] += bias[i] for r < num_rows, i < width (the CPU's bias after a
// projection, e.g. GPT-OSS's o projection and router). rows f32, bias [width] f32.
// requires: width > 0, stride >= width.
cudaError_t launch_add_row_bias(float* rows, int64_t num_rows, int32_t width, int32_t stride,
                                const float* bias, cudaStream_t stream);

// out (bf16) = in (f16), count elements.
cudaError_t launch_f16_to_bf16(const void* in, int64_t count, void* out, cudaStream_t stream);

}  // namespace kvp::cuda::detail

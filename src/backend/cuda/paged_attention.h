// cuda::paged_attention: the CUDA implementation of backend/attention.h's mixed-batch paged
// attention, same arguments as the reference and cpu::paged_attention plus a stream.
//
// One call may enqueue up to three kernels on `stream`, never a host round trip between them:
//   decode  (q_len == 1): one CTA per (sequence, KV head, query-head chunk, KV split); the query
//           heads of one KV group share every K/V load. With several splits (flash-decoding) each
//           CTA leaves a partial softmax state (max, sum, unnormalised accumulator) and
//   merge   combines the splits exactly (rescaling by exp(max_i - max)).
//   prefill (q_len >= 2): tensor-core flash attention over rows (token, query head of one
//           group), causal and window masks over the cached prefix plus the new tokens: wgmma
//           on Hopper (sm_90a) where it covers the shape, mma.sync m16n8k16 elsewhere.
// Each kernel reads q_len from the device metadata and skips the sequences of the other kind.
//
// Supported: KV and q/out both bf16 or both f16, or int8 / fp8 (e4m3) KV (cache/kv_layout.h:
// per-row f16 scales inside the block, block size a multiple of 8) with bf16 or f16 q/out; head_dim
// 64, 128 or 256, any block size, any GQA ratio, soft cap, window, attention sinks (params.sinks in
// device memory, applied where each row's softmax is finished: the decode write, the merge, the
// prefill write). fp32 accumulation throughout.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "backend/attention.h"
#include "backend/cuda/device_buffer.h"

namespace kvp::cuda {

// Scratch for the split-KV partial states. Grows on demand (a cudaMalloc, so never during a
// graph capture: run one call eagerly first). One workspace serves one stream at a time.
class AttentionWorkspace {
 public:
  // Ensures at least `size_bytes`; mutates the workspace.
  Status reserve(size_t size_bytes);
  void* data() const { return buffer_.data(); }
  size_t size_bytes() const { return buffer_.size_bytes(); }

 private:
  DeviceBuffer buffer_;
};

// Tuning knob for benchmarks: the fewest keys a decode split may get (default 32; <= 0 restores
// the default). Process-wide; changes the results only by rounding.
void set_decode_min_keys_per_split(int32_t min_keys);
// Tuning knob for benchmarks: scales the split count the library picks for a decode call (then
// clamped to 1 .. the most splits; default 1, <= 0 restores it). Process-wide.
void set_decode_split_factor(float factor);

// Which kernel runs prefill rows (benchmarks and tests compare them in one process): Auto takes
// the Hopper kernel (wgmma, sm90/prefill_attention_sm90.cu) on compute capability 9.0 devices
// where it covers the shape (head dim 64 or 128, any KV dtype) and the portable mma.sync kernel
// elsewhere; Portable always takes the mma.sync kernel. Process-wide; the default is Auto.
enum class PrefillKernel { Auto, Portable };
void set_prefill_kernel(PrefillKernel kernel);
// Whether prefill rows of a pool of this dtype and head dim run on the Hopper kernel on the
// current device under the current setting.
bool uses_hopper_prefill(DType kv_dtype, int32_t head_dim);

// Which kernel runs decode rows over a 16-bit pool: TensorCores takes the tensor-core kernel
// (decode_attention_mma.cu, mma.sync) at head dim 64 or 128 and the per-lane kernel
// (decode_attention.cu) at 256; Lanes always takes the per-lane kernel; Auto is TensorCores but
// for calls whose grid fits in one wave with splits of under 64 keys (batch 1 x 512, say), which
// take the per-lane kernel. 8-bit pools decode on the tensor-core kernel at 64 and 128 either
// way. Process-wide; the default is Auto.
enum class DecodeKernel { Auto, TensorCores, Lanes };
void set_decode_kernel(DecodeKernel kernel);
// Whether decode rows over a pool of this dtype and head dim may run on the tensor-core kernel
// under the current setting (under Auto, depending on the call's shape).
bool uses_tensor_core_decode(DType kv_dtype, int32_t head_dim);
// Whether the decode rows of this call run on the tensor-core kernel on the current device.
bool decode_on_tensor_cores(const AttentionParams& params, const AttentionBatch& batch,
                            const PagedKv& kv);

// Bytes of workspace a call with these arguments needs (0 when no split is used).
size_t attention_workspace_bytes(const AttentionParams& params, const AttentionBatch& batch,
                                 const PagedKv& kv);

// Checks what can be checked without reading the device metadata (geometry, dtypes, head_dim,
// non-null pointers, the host maxima) and launches. Batch pointers (query_start, kv_lens,
// block_tables) and q, out, kv are device pointers.
//   q, out : [batch.num_tokens][params.num_q_heads][kv.head_dim] of q_dtype (== kv.dtype, or
//            bf16 / f16 for an int8 / fp8 kv)
// requires: the device metadata satisfies check_attention_args (else results are undefined;
// use paged_attention_checked to validate a host copy first). Writes out, nothing else but
// the workspace.
Status paged_attention(const AttentionParams& params, const AttentionBatch& batch,
                       const PagedKv& kv, const void* q, DType q_dtype, void* out,
                       AttentionWorkspace& workspace, cudaStream_t stream);

// The same with a per-thread workspace owned by the library (one stream at a time per thread).
Status paged_attention(const AttentionParams& params, const AttentionBatch& batch,
                       const PagedKv& kv, const void* q, DType q_dtype, void* out,
                       cudaStream_t stream);

// Validates host_batch (a host copy of batch's metadata, same maxima) with check_attention_args,
// then runs paged_attention on the device batch.
Status paged_attention_checked(const AttentionParams& params, const AttentionBatch& batch,
                               const AttentionBatch& host_batch, const PagedKv& kv, const void* q,
                               DType q_dtype, void* out, AttentionWorkspace& workspace,
                               cudaStream_t stream);

}  // namespace kvp::cuda

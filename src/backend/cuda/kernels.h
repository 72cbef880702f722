// Internal launchers of the CUDA backend's kernels, callable from plain C++ (.cc) code: the
// argument block of the attention kernels and one launch_* per kernel family. Each launcher
// returns cudaGetLastError() after its launches (a bad configuration or an earlier fault); the
// public entry points (kv_pool.h, paged_attention.h) turn that into a Status naming the kernel.
// The .cu files stay free of fmt: nvcc's front end rejects its consteval format strings.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvp::cuda::detail {

// How the attention kernels read K/V: of q's dtype (Native), or 8-bit codes with an f16 scale per
// row (cache/kv_quant.h), symmetric int8 (Int8) or OCP float8 e4m3fn (Fp8).
enum class KvFormat : int8_t { Native, Int8, Fp8 };

// Most KV splits of one decode sequence (the merge kernel stages their states in shared memory).
constexpr int32_t kMaxDecodeSplits = 128;

struct AttentionKernelArgs {
  const void* q;                // [num_tokens][num_q_heads][head_dim]
  void* out;                    // [num_tokens][num_q_heads][head_dim]
  const int32_t* query_start;   // [num_seqs + 1] device
  const int32_t* kv_lens;       // [num_seqs] device
  const int32_t* block_tables;  // [num_seqs][max_blocks_per_seq] device
  int32_t max_blocks_per_seq;
  // layer K: block b, head h, token t at b*block_pitch + h*head_pitch + t*D elements
  // (bf16/f16: head_pitch = bs*D; int8 / fp8: head_pitch = bs*(D+2) bytes, the run's [bs] f16
  // scales after its rows, cache/kv_layout.h)
  const void* k;
  const void* v;        // layer V, same addressing
  int64_t block_pitch;  // elements (bytes for int8 / fp8)
  int32_t block_size;
  int32_t block_shift;  // log2(block_size) if a power of two, else -1
  int32_t num_kv_heads;
  int32_t num_q_heads;
  int32_t group;   // num_q_heads / num_kv_heads
  float qk_mul;    // soft cap off: scale*log2(e); on: scale/soft_cap
  float cap_log2;  // soft cap on: soft_cap*log2(e); off: 0
  int32_t window;  // 0: off
  int32_t num_seqs;
  // [num_q_heads] f32 device, natural-log units: attention sinks (AttentionParams::sinks), or
  // null. Applied only where a row's softmax is finished (output_factor, attention_device.cuh).
  const float* sinks;
  // decode only
  int32_t head_chunks;  // group / heads per CTA
  int32_t num_splits;   // KV splits per sequence; 1: write out directly
  float* partial_acc;   // [num_seqs][num_q_heads][num_splits][head_dim] unnormalised
  float* partial_ml;    // [num_seqs][num_q_heads][num_splits][2] (max, sum), log2 units
  // Hopper prefill only: blocks in the pool (the span of its tensor maps over K and V)
  int32_t num_blocks;
};

// bf16: q and out are bf16 (else f16); kv: K/V of q's dtype, or 8-bit with f16 scales. 8-bit
// requires block_size % 8 == 0 (16-byte aligned rows and scale runs). native_on_mma: 16-bit KV at
// head dim 64 or 128 runs on the tensor-core kernel (else on the per-lane one).
cudaError_t launch_decode_attention(const AttentionKernelArgs& args, bool bf16, KvFormat kv,
                                    int32_t head_dim, int32_t heads_per_cta, bool native_on_mma,
                                    cudaStream_t stream);
// CTAs of the decode kernel for (dtype, KV format, head_dim, heads per CTA) resident on one SM.
int decode_ctas_per_sm(bool bf16, KvFormat kv, int32_t head_dim, int32_t heads_per_cta,
                       bool native_on_mma);
// The tensor-core decode kernel (decode_attention_mma.cu): launch_decode_attention and
// decode_ctas_per_sm hand it the shapes it covers (head dim 64 or 128: 8-bit KV always, 16-bit KV
// when native_on_mma).
bool decode_mma_covers(KvFormat kv, int32_t head_dim, bool native_on_mma);
cudaError_t launch_decode_attention_mma(const AttentionKernelArgs& args, bool bf16, KvFormat kv,
                                        int32_t head_dim, int32_t heads_per_cta,
                                        cudaStream_t stream);
int decode_mma_ctas_per_sm(bool bf16, KvFormat kv, int32_t head_dim, int32_t heads_per_cta);
cudaError_t launch_merge_splits(const AttentionKernelArgs& args, bool bf16, int32_t head_dim,
                                cudaStream_t stream);
cudaError_t launch_prefill_attention(const AttentionKernelArgs& args, bool bf16, KvFormat kv,
                                     int32_t head_dim, int32_t max_q_len, cudaStream_t stream);
// The Hopper prefill kernel (sm90/prefill_attention_sm90.cu, wgmma, built for sm_90a only): the
// same contract as launch_prefill_attention where it covers the head dim (64 or 128; every KV
// format: 8-bit K/V are widened to f16 tiles in shared memory); launch it only on compute
// capability 9.0 devices.
bool prefill_attention_sm90_covers(KvFormat kv, int32_t head_dim);
cudaError_t launch_prefill_attention_sm90(const AttentionKernelArgs& args, bool bf16, KvFormat kv,
                                          int32_t head_dim, int32_t max_q_len, cudaStream_t stream);

// KV write: rows of k_new/v_new ([num_tokens][num_kv_heads][head_dim], 16-byte multiples) into
// the slots of slot_mapping ([num_tokens], negative = skip) of one layer's K and V.
cudaError_t launch_kv_write(const void* k_new, const void* v_new, const int64_t* slot_mapping,
                            int32_t num_tokens, void* k, void* v, int32_t num_kv_heads,
                            int32_t block_size, int32_t row_bytes, int64_t block_pitch_bytes,
                            int64_t num_slots, cudaStream_t stream);
// Quantising KV write into an 8-bit pool (kv: Int8 or Fp8): rows of k_new/v_new ([num_tokens]
// [num_kv_heads][head_dim] of bf16 if src_bf16, else f16) become 8-bit codes and an f16 scale
// per row, exactly as quantize_kv8 (cache/kv_quant.h) computes them from the same values widened
// to f32. block_pitch_bytes: from one block's K to the next; head runs are block_size *
// (head_dim + 2) bytes. requires: head_dim % 32 == 0, head_dim <= 256.
cudaError_t launch_kv_write_kv8(KvFormat kv, const void* k_new, const void* v_new, bool src_bf16,
                                const int64_t* slot_mapping, int32_t num_tokens, void* k, void* v,
                                int32_t num_kv_heads, int32_t block_size, int32_t head_dim,
                                int64_t block_pitch_bytes, int64_t num_slots, cudaStream_t stream);
// Block copy: ops [num_ops][2] (src, dst) in device memory; copies block_pitch_bytes from
// src to dst in each of num_layers layers, layer_stride_bytes apart.
cudaError_t launch_block_copy(void* slab, const int32_t* ops, int32_t num_ops, int32_t num_layers,
                              int64_t block_pitch_bytes, int64_t layer_stride_bytes,
                              cudaStream_t stream);

// Fills data ([count] of bf16 or f16) with values uniform in [lo, hi), a function of (seed, i).
cudaError_t launch_fill_uniform(void* data, bool bf16, int64_t count, uint64_t seed, float lo,
                                float hi, cudaStream_t stream);

// A [rows][cols] block of a [*][full_cols] matrix filled as launch_fill_uniform fills the whole:
// data[r][c] = the value of element (row0 + r) · full_cols + col0 + c of seed (a tensor-parallel
// rank's share of a random matrix equals that part of the unsplit one).
cudaError_t launch_fill_uniform_rect(void* data, bool bf16, int64_t rows, int64_t cols,
                                     int64_t full_cols, int64_t row0, int64_t col0, uint64_t seed,
                                     float lo, float hi, cudaStream_t stream);

}  // namespace kvp::cuda::detail

// Paged attention over a mixed batch (DESIGN.md §3 "Attention"), and the KV write.
// Every backend implements the same entry points with the same arguments:
//   cpu::paged_attention (backend/cpu_attention.h)   cuda::paged_attention (backend/cuda/…)
// and the reference below is the oracle every implementation is tested against.
//
// A batch holds num_seqs sequences. Sequence i brings q_len(i) = query_start[i+1] - query_start[i]
// new query tokens (1 for decode, more for a prefill chunk) and has kv_len(i) cached tokens, the
// new ones already written, so q_len(i) <= kv_len(i). Its query token t sits at position
//   p = kv_len(i) - q_len(i) + t
// and attends to key positions j with j <= p (causal) and, with a window W > 0, p - j < W.
//
//   q, out : [num_tokens][num_q_heads][head_dim], tokens of sequence i at rows
//            query_start[i] .. query_start[i+1]-1
//   block_tables : [num_seqs][max_blocks_per_seq]; key position j of sequence i lives in block
//            block_tables[i][j / block_size], token j % block_size
//   query head h reads KV head h / (num_q_heads / num_kv_heads) (grouped-query attention)
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "cache/block_ops.h"
#include "cache/kv_layout.h"
#include "cache/kv_quant.h"
#include "common/dtype.h"
#include "common/status.h"

namespace kvp {

// One layer's K and V inside a slab (cache/kv_layout.h), as kernels see them.
//   K of (block b, head h, token t) starts at element k + b * block_pitch + h * head_pitch() +
//   t * head_dim; 8-bit (is_kv8): its f16 scale is at byte k + b * block_pitch + scale_offset(h,
//   t).
struct PagedKv {
  void* k = nullptr;
  void* v = nullptr;
  int64_t block_pitch = 0;  // elements from one block's K to the next block's K
  int32_t num_blocks = 0;
  int32_t num_kv_heads = 0;
  int32_t block_size = 0;
  int32_t head_dim = 0;
  DType dtype = DType::BF16;

  // Elements of one head's run in a block (KvLayout::head_pitch).
  int64_t head_pitch() const {
    return int64_t{block_size} * head_dim + (is_kv8(dtype) ? int64_t{2} * block_size : 0);
  }
  // Element offset of (block, head, token)'s row from k (or v).
  int64_t row_offset(int64_t block, int32_t head, int32_t token) const {
    return block * block_pitch + head * head_pitch() + int64_t{token} * head_dim;
  }
  // 8-bit: byte offset of (block, head, token)'s f16 scale from k (or v).
  int64_t scale_offset(int64_t block, int32_t head, int32_t token) const {
    return block * block_pitch + head * head_pitch() + int64_t{block_size} * head_dim +
           int64_t{2} * token;
  }
};
// Element `elem` of K or V (base = kv.k or kv.v) as f32; for 8-bit KV the value of its code,
// not yet multiplied by its row's scale.
inline float kv_element(const PagedKv& kv, const void* base, int64_t elem) {
  if (is_kv8(kv.dtype)) return kv8_decode(kv.dtype, static_cast<const uint8_t*>(base)[elem]);
  return load_as_f32(base, kv.dtype, static_cast<size_t>(elem));
}
// The scale of (block, head, token)'s row of K or V: its f16 scale for 8-bit KV, 1 otherwise.
inline float kv_row_scale(const PagedKv& kv, const void* base, int64_t block, int32_t head,
                          int32_t token) {
  if (!is_kv8(kv.dtype)) return 1.0f;
  F16 scale;
  std::memcpy(&scale, static_cast<const std::byte*>(base) + kv.scale_offset(block, head, token),
              sizeof scale);
  return f16_to_f32(scale);
}

// requires: 0 <= layer < layout.num_layers; slab holds layout.size_bytes() bytes.
PagedKv paged_kv_for_layer(const KvLayout& layout, void* slab, int32_t layer);

struct AttentionParams {
  int32_t num_q_heads = 0;
  float scale = 1.0f;     // multiplies q·k
  float soft_cap = 0.0f;  // 0: off; else logit = soft_cap * tanh(scale * q·k / soft_cap)
  int32_t window = 0;     // 0: off; else key j is visible from position p iff p - j < window
  // GPT-OSS's attention sinks: [num_q_heads] logits, one per query head, that join each row's
  // softmax denominator (e^sink added to the sum of e^logit) and are then dropped, so a row's
  // weights sum to less than 1. Null: off. Host memory for the CPU backend, device memory for CUDA.
  const float* sinks = nullptr;
};

// The factor that turns a finished streaming-softmax state into the output row: o * factor,
// where o = sum_j e^(logit_j - m) v_j and l = sum_j e^(logit_j - m). Without a sink 1 / l; with
// sink logit s, 1 / (l + e^(s - m)), computed without overflow when s > m.
inline float softmax_output_factor(float m, float l, const float* sinks, int32_t q_head) {
  if (sinks == nullptr) return 1.0f / l;
  const float s = sinks[q_head];
  if (!(s > m)) return 1.0f / (l + std::exp(s - m));  // m = -inf never reaches here with l > 0
  const float a = std::exp(m - s);
  return a / (l * a + 1.0f);
}

// Batch metadata. Pointers are in the memory of the backend that runs the batch (host for the
// CPU backend, device for CUDA); the maxima are host values used to shape the work.
struct AttentionBatch {
  int32_t num_seqs = 0;
  int32_t num_tokens = 0;                 // query_start[num_seqs]
  const int32_t* query_start = nullptr;   // [num_seqs + 1], query_start[0] = 0, non-decreasing
  const int32_t* kv_lens = nullptr;       // [num_seqs]
  const int32_t* block_tables = nullptr;  // [num_seqs][max_blocks_per_seq]
  int32_t max_blocks_per_seq = 0;
  int32_t max_q_len = 0;   // >= every q_len
  int32_t max_kv_len = 0;  // >= every kv_len
};

// The first key position any query of a sequence can see: 0 without a window; with window W,
// that of its first query, max(0, kv_len - q_len - W + 1). Block-table entries before the
// block holding it are never read.
inline int32_t first_visible_key(const AttentionParams& params, int32_t kv_len, int32_t q_len) {
  if (params.window <= 0) return 0;
  const int32_t first = kv_len - q_len - params.window + 1;
  return first > 0 ? first : 0;
}

// Checks the arguments of an attention call whose batch metadata is in host memory: head counts
// that divide, q_len <= kv_len, block tables long enough for kv_len, block ids in range, maxima
// that hold, a supported head_dim. Entries before first_visible_key's block are not checked. Does
// not read q, out or the KV bytes.
Status check_attention_args(const AttentionParams& params, const AttentionBatch& batch,
                            const PagedKv& kv);

// The oracle (tests and benchmarks only): gathers each sequence's keys and values to dense
// arrays and computes a plain softmax in double precision. out has q's dtype.
// requires: check_attention_args(...) is ok; all pointers in host memory.
void reference_paged_attention(const AttentionParams& params, const AttentionBatch& batch,
                               const PagedKv& kv, const void* q, DType q_dtype, void* out);

// New tokens' K and V, to be written into their slots.
//   k, v : [num_tokens][num_kv_heads][head_dim] of dtype kv.dtype; f32 when kv.dtype is 8-bit
//          (is_kv8: each row is quantised on the way in, cache/kv_quant.h)
//   slot_mapping : [num_tokens]; slot = block * block_size + token_in_block; a negative slot
//                  means "skip this row" (padding)
struct KvWrite {
  const void* k = nullptr;
  const void* v = nullptr;
  const int64_t* slot_mapping = nullptr;
  int32_t num_tokens = 0;
};

// Checks a KV write whose slot mapping is in host memory: every slot is negative or inside the
// pool.
Status check_kv_write_args(const KvWrite& write, const PagedKv& kv);

}  // namespace kvp

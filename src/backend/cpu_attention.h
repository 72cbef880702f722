// The CPU backend's paged attention, KV write and block copy: the entry points of attention.h,
// implemented for host memory. cpu::paged_attention is the fast path (Highway kernels,
// multithreaded, split long contexts); cpu::paged_attention_scalar is the plain loop it
// replaced, kept as benchmark variant 1. Both are tested against reference_paged_attention.
//
// Work decomposition of paged_attention:
//
//   sequence s ── q tokens ─┬─ tile 0: tokens 0..T-1; per KV head h its G query heads (T*G rows)
//                           ├─ tile 1 ...
//   each (s, tile) ── keys it can see [kv_lo, kv_hi) ─┬─ split 0 ─┐ partial (m, l, o) per row
//                                                     ├─ split 1 ─┤
//                                                     └─ ...     ─┘
//   merged exactly: M = max_k m_k, L = sum_k l_k e^(m_k - M), out = sum_k o_k e^(m_k - M) / L
//   one work item = one (s, tile, split), run on the thread pool; inside it, per chunk of 32
//   keys, KV head 0, 1, ... in turn:
//
//     block b: [ K h0 | K h1 | ... | K h7 ][ V h0 | V h1 | ... | V h7 ]   (kv_layout.h)
//               ───────────────────▶        ───────────────────▶
//     so each block is read as two sequential runs (the hardware prefetcher follows them), and
//     the next (chunk, head) is software-prefetched. Each K/V row is read from the pool once
//     per tile and serves all T*G rows of its head.
//
// Splits are automatic when there are fewer tiles than 4 per thread (batch-1 decode of a long
// context): the key range is cut into pieces of at least 256 keys.
#pragma once

#include <cstdint>
#include <span>

#include "backend/attention.h"
#include "cache/block_ops.h"
#include "cache/kv_layout.h"
#include "common/status.h"
#include "common/thread_pool.h"

namespace kvp::cpu {

struct AttentionTuning {
  // Keys per work item: 0 picks it from the work and the thread count (no splits on one thread);
  // > 0 forces every item to cover at most this many keys (tests use it to exercise merges).
  int32_t split_keys = 0;
  // Query rows per tile (at least one token's GQA group).
  int32_t tile_rows = 16;
  // Software prefetch of the next KV head's rows in tiles of at most 8 rows per KV head
  // (decode); benchmarks turn it off to measure it.
  bool prefetch = true;
  // bf16 KV of decode tiles (at most 4 query rows per KV head) widened two vectors per load with
  // bit operations, q and o reordered to match; false widens with a shuffle per vector.
  // Benchmarks turn it off to measure it.
  bool pair_bf16 = true;
};

// Paged attention over a mixed batch (see attention.h for the arguments).
//   q, out : [batch.num_tokens][params.num_q_heads][kv.head_dim] of q_dtype (f32, bf16 or f16);
//            out is written, q is not modified. KV in f32, f16 or bf16.
// pool: null runs on the calling thread. Returns check_attention_args' error, or an error for a
// null q/out/KV pointer; on error nothing is written.
Status paged_attention(const AttentionParams& params, const AttentionBatch& batch,
                       const PagedKv& kv, const void* q, DType q_dtype, void* out, ThreadPool* pool,
                       const AttentionTuning& tuning = {});

// The simple version paged_attention replaced (benchmark variant 1): one query row at a time,
// scalar f32 online softmax, every key read once per query head. Same arguments and errors.
Status paged_attention_scalar(const AttentionParams& params, const AttentionBatch& batch,
                              const PagedKv& kv, const void* q, DType q_dtype, void* out,
                              ThreadPool* pool);

// Writes each new token's K and V rows into its slot (see KvWrite). Mutates the pool's bytes
// at the written slots only. Returns check_kv_write_args' error; on error nothing is written.
Status write_kv(const KvWrite& write, const PagedKv& kv);

// For each copy, every layer's K and V of block src into block dst of the slab, in list order.
// slab: layout.size_bytes() bytes; mutated at the dst blocks only. Errors (nothing copied): a
// non-positive layout, a null slab, a block id outside [0, layout.num_blocks).
Status copy_blocks(const KvLayout& layout, void* slab, std::span<const BlockCopy> copies);

// Highway target the kernels run on here ("AVX3_ZEN4", "AVX2", ...), for benchmark logs.
const char* kernel_target();

}  // namespace kvp::cpu

// The inner kernel of cpu::paged_attention (cpu_attention.cc): one work item is one tile of query
// rows (the query heads of one KV head for a few consecutive tokens of one sequence) against one
// range of that sequence's keys. It keeps an fp32 streaming-softmax state per row (running max m,
// running sum l, unnormalised output o) and folds the range in, chunk by chunk. Vectorised with
// Highway, dispatched at run time to the best target of the machine (cpu_attention_kernel.cc).
#pragma once

#include <cstdint>

#include "backend/attention.h"

namespace kvp::cpu {

// Key positions folded in per step: one chunk's K and V rows and its logits stay in L1/L2 and
// serve every row of the tile.
inline constexpr int32_t kChunkKeys = 32;

struct TileTask {
  const PagedKv* kv = nullptr;
  const int32_t* block_table = nullptr;  // [ceil(kv_end / block_size)] this sequence's blocks
  int32_t kv_head = 0;    // KV heads [kv_head, kv_head + num_heads), taken in turn per chunk
  int32_t num_heads = 1;  // so each block's K and V are read as one sequential run
  int32_t head_dim = 0;
  int32_t num_rows = 0;        // rows per head = num_tile_tokens * rows_per_token
  int32_t rows_per_token = 0;  // query heads per KV head (the GQA group)
  int32_t first_pos = 0;       // position of the tile's first token; row r is at
                               // first_pos + r / rows_per_token
  int32_t kv_begin = 0;        // keys [kv_begin, kv_end) of this work item
  int32_t kv_end = 0;
  int32_t window = 0;        // AttentionParams::window
  float soft_cap = 0.0f;     // AttentionParams::soft_cap
  bool prefetch = true;      // software-prefetch the next (chunk, head) while on this one
  bool pair_bf16 = true;     // bf16 KV of one-pass tiles widened in paired order (the kernel's
                             // load_pair); false widens with PromoteTo
  const float* q = nullptr;  // [num_heads][num_rows][head_dim] f32, multiplied by the scale
  // The state, read and updated (requires: initialised, m = -inf, l = 0, o = 0, before the
  // first range of a row):
  float* o = nullptr;  // [num_heads][num_rows][head_dim]
  float* m = nullptr;  // [num_heads][num_rows]
  float* l = nullptr;  // [num_heads][num_rows]
  // Scratch of at least tile_scratch_floats(num_heads, num_rows, head_dim) floats, 64-byte
  // aligned; mutated.
  float* scratch = nullptr;
};

inline int64_t tile_scratch_floats(int32_t num_heads, int32_t num_rows, int32_t head_dim) {
  // Logits / probabilities [num_heads][num_rows][kChunkKeys], then a chunk's K and V widened to
  // f32 [kChunkKeys][head_dim] each.
  return int64_t{num_heads} * num_rows * kChunkKeys + 2 * int64_t{kChunkKeys} * head_dim;
}

// Folds keys [kv_begin, kv_end) into the state of every row of the tile, honouring the causal
// mask and the window. Rows that see none of these keys are left unchanged.
void attend_tile(const TileTask& task);

// Name of the Highway target attend_tile dispatches to on this machine ("AVX3", "AVX2", ...).
const char* attend_tile_target();

}  // namespace kvp::cpu

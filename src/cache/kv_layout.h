// The physical layout of one cache group's KV slab (DESIGN.md §3), shared by every backend.
//
//   slab = one allocation per cache group:
//   ┌──────────── layer 0 ────────────┬──────────── layer 1 ────────────┬── …
//   │ blk0.K blk0.V blk1.K blk1.V … │ blk0.K blk0.V blk1.K blk1.V … │
//   └─────────────────────────────────┴─────────────────────────────────┴── …
//   blkB.K = [num_kv_heads][head_pitch]  (one KV head's block is one contiguous run)
//   f32 / bf16 / f16: head run = [block_size][head_dim] elements (head_pitch = block_size*head_dim)
//   int8 / fp8:       head run = [block_size][head_dim] 8-bit codes, then [block_size] f16 scales
//                     (head_pitch = block_size * (head_dim + 2) bytes); see cache/kv_quant.h
//
//   offset of K/V (kv = 0/1) of (layer, block, head, token, dim) =
//     ((layer * num_blocks + block) * 2 + kv) * block_stride
//       + head * head_pitch + token * head_dim + dim
//   with block_stride = num_kv_heads * head_pitch.
//
// Offsets and sizes count elements; for int8 and fp8 (is_kv8) an element is one byte, so an offset
// times dtype_size_bytes(dtype) is a byte offset for every dtype, and the scales sit inside the
// block (every whole-block byte move carries them).
//
// A slot is block * block_size + token_in_block; the slot mapping of a batch maps each new
// token to its slot. Kernels receive strides from here, not assumptions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"

namespace kvp {

struct KvLayout {
  int32_t num_layers = 0;
  int32_t num_blocks = 0;
  int32_t num_kv_heads = 0;
  int32_t block_size = 0;  // tokens per block
  int32_t head_dim = 0;
  DType dtype = DType::BF16;

  // Elements of one KV head's K (or V) run in one block: its rows, then (8-bit) its scales.
  int64_t head_pitch() const {
    return int64_t{block_size} * head_dim + (is_kv8(dtype) ? int64_t{2} * block_size : 0);
  }
  // Elements of one block's K (or V) in one layer: [num_kv_heads][head_pitch].
  int64_t block_stride() const { return int64_t{num_kv_heads} * head_pitch(); }
  // Elements between consecutive blocks of one layer's K (K and V alternate).
  int64_t block_pitch() const { return 2 * block_stride(); }
  int64_t layer_stride() const { return int64_t{num_blocks} * block_pitch(); }
  int64_t size_elems() const { return int64_t{num_layers} * layer_stride(); }
  size_t size_bytes() const { return static_cast<size_t>(size_elems()) * dtype_size_bytes(dtype); }
  // Bytes of one block across all layers, K and V.
  size_t block_size_bytes() const {
    return static_cast<size_t>(num_layers) * block_pitch() * dtype_size_bytes(dtype);
  }

  // Element offset of the first element of block `block`'s K (kv = 0) or V (kv = 1) in `layer`.
  int64_t block_offset(int32_t layer, int32_t block, int32_t kv) const {
    return (int64_t{layer} * num_blocks + block) * block_pitch() + kv * block_stride();
  }
  // Element offset of one token's head vector.
  int64_t elem_offset(int32_t layer, int32_t block, int32_t kv, int32_t head, int32_t token) const {
    return block_offset(layer, block, kv) + int64_t{head} * head_pitch() +
           int64_t{token} * head_dim;
  }
  // 8-bit only (is_kv8): byte offset of one token's f16 scale of a head vector.
  int64_t scale_offset(int32_t layer, int32_t block, int32_t kv, int32_t head,
                       int32_t token) const {
    return block_offset(layer, block, kv) + int64_t{head} * head_pitch() +
           int64_t{block_size} * head_dim + int64_t{2} * token;
  }

  friend bool operator==(const KvLayout&, const KvLayout&) = default;
};

}  // namespace kvp

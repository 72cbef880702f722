#include "backend/attention.h"

#include <cstddef>

namespace kvp {

PagedKv paged_kv_for_layer(const KvLayout& layout, void* slab, int32_t layer) {
  KVP_CHECK(layer >= 0 && layer < layout.num_layers, "layer {} of {}", layer, layout.num_layers);
  auto* base = static_cast<std::byte*>(slab);
  const size_t elem = dtype_size_bytes(layout.dtype);
  PagedKv kv;
  kv.k = base + static_cast<size_t>(layout.block_offset(layer, 0, 0)) * elem;
  kv.v = base + static_cast<size_t>(layout.block_offset(layer, 0, 1)) * elem;
  kv.block_pitch = layout.block_pitch();
  kv.num_blocks = layout.num_blocks;
  kv.num_kv_heads = layout.num_kv_heads;
  kv.block_size = layout.block_size;
  kv.head_dim = layout.head_dim;
  kv.dtype = layout.dtype;
  return kv;
}

Status check_attention_args(const AttentionParams& params, const AttentionBatch& batch,
                            const PagedKv& kv) {
  if (kv.num_kv_heads <= 0 || kv.head_dim <= 0 || kv.block_size <= 0 || kv.num_blocks <= 0) {
    return Status::invalid_argument(
        "attention: KV geometry must be positive (kv heads {}, head dim {}, block size {}, "
        "blocks {})",
        kv.num_kv_heads, kv.head_dim, kv.block_size, kv.num_blocks);
  }
  if (params.num_q_heads <= 0 || params.num_q_heads % kv.num_kv_heads != 0) {
    return Status::invalid_argument(
        "attention: {} query heads is not a positive multiple of {} KV heads", params.num_q_heads,
        kv.num_kv_heads);
  }
  if (params.window < 0) {
    return Status::invalid_argument("attention: window {} is negative", params.window);
  }
  if (params.soft_cap < 0.0f) {
    return Status::invalid_argument("attention: soft cap {} is negative", params.soft_cap);
  }
  if (batch.num_seqs < 0) {
    return Status::invalid_argument("attention: {} sequences", batch.num_seqs);
  }
  if (batch.num_seqs > 0 &&
      (batch.query_start == nullptr || batch.kv_lens == nullptr || batch.block_tables == nullptr)) {
    return Status::invalid_argument("attention: batch metadata pointer is null");
  }
  if (batch.num_seqs > 0 && batch.query_start[0] != 0) {
    return Status::invalid_argument("attention: query_start[0] is {}, not 0", batch.query_start[0]);
  }
  for (int32_t i = 0; i < batch.num_seqs; ++i) {
    const int32_t q_len = batch.query_start[i + 1] - batch.query_start[i];
    const int32_t kv_len = batch.kv_lens[i];
    if (q_len < 0) {
      return Status::invalid_argument("attention: sequence {} has a negative query length {}", i,
                                      q_len);
    }
    if (kv_len < q_len) {
      return Status::invalid_argument(
          "attention: sequence {} has kv_len {} < q_len {} (new tokens must be written first)", i,
          kv_len, q_len);
    }
    if (q_len > batch.max_q_len || kv_len > batch.max_kv_len) {
      return Status::invalid_argument(
          "attention: sequence {} (q_len {}, kv_len {}) exceeds the batch maxima ({}, {})", i,
          q_len, kv_len, batch.max_q_len, batch.max_kv_len);
    }
    const int64_t blocks_needed = (int64_t{kv_len} + kv.block_size - 1) / kv.block_size;
    if (blocks_needed > batch.max_blocks_per_seq) {
      return Status::invalid_argument(
          "attention: sequence {} needs {} blocks for kv_len {} but its block table holds {}", i,
          blocks_needed, kv_len, batch.max_blocks_per_seq);
    }
    const int32_t* table = batch.block_tables + int64_t{i} * batch.max_blocks_per_seq;
    // With a window, blocks wholly before the first query's window are never read (a windowed
    // cache group may already have released them), so their entries are not checked.
    const int64_t first_visible = first_visible_key(params, kv_len, q_len);
    for (int64_t b = first_visible / kv.block_size; b < blocks_needed; ++b) {
      if (table[b] < 0 || table[b] >= kv.num_blocks) {
        return Status::invalid_argument(
            "attention: sequence {} block table entry {} is block {}, outside the pool of {}", i, b,
            table[b], kv.num_blocks);
      }
    }
  }
  if (batch.num_seqs > 0 && batch.query_start[batch.num_seqs] != batch.num_tokens) {
    return Status::invalid_argument("attention: query_start[{}] = {} but num_tokens = {}",
                                    batch.num_seqs, batch.query_start[batch.num_seqs],
                                    batch.num_tokens);
  }
  return Status::ok();
}

Status check_kv_write_args(const KvWrite& write, const PagedKv& kv) {
  if (write.num_tokens < 0) {
    return Status::invalid_argument("kv write: {} tokens", write.num_tokens);
  }
  if (write.num_tokens > 0 &&
      (write.k == nullptr || write.v == nullptr || write.slot_mapping == nullptr)) {
    return Status::invalid_argument("kv write: null pointer");
  }
  const int64_t num_slots = int64_t{kv.num_blocks} * kv.block_size;
  for (int32_t i = 0; i < write.num_tokens; ++i) {
    if (write.slot_mapping[i] >= num_slots) {
      return Status::invalid_argument("kv write: token {} maps to slot {}, outside the pool of {}",
                                      i, write.slot_mapping[i], num_slots);
    }
  }
  return Status::ok();
}

}  // namespace kvp

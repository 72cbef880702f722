// CudaModelRunner::check_batch (cuda_model_runner.h): the host-side checks of a batch against the
// model, the pools and the caller's output spans, before anything is staged or launched.
#include <algorithm>
#include <string>

#include "backend/attention.h"
#include "model/cuda/cuda_model_runner.h"

namespace kvp::cuda {

Status CudaModelRunner::check_batch(const ForwardBatch& batch, std::span<DeviceKvPool> pools,
                                    const std::span<const int32_t>* full_rows,
                                    std::span<float> logits, size_t num_summaries,
                                    size_t row_stride) const {
  const auto num_tokens = static_cast<int64_t>(batch.token_ids.size());
  if (batch.query_start.empty() || batch.query_start.size() != batch.kv_lens.size() + 1) {
    return Status::invalid_argument("cuda forward: {} query starts for {} sequences",
                                    batch.query_start.size(), batch.kv_lens.size());
  }
  if (batch.query_start.back() != num_tokens) {
    return Status::invalid_argument(
        "cuda forward: query_start ends at {} but the batch has {} tokens",
        batch.query_start.back(), num_tokens);
  }
  for (int32_t t : batch.token_ids) {
    if (t < 0 || t >= spec_.vocab_size) {
      return Status::invalid_argument("cuda forward: token id {} outside the vocabulary of {}", t,
                                      spec_.vocab_size);
    }
  }
  for (int32_t row : batch.logit_rows) {
    if (row < 0 || row >= num_tokens) {
      return Status::invalid_argument("cuda forward: logit row {} outside the batch of {} tokens",
                                      row, num_tokens);
    }
  }
  size_t wanted_rows = batch.logit_rows.size();
  if (full_rows != nullptr) {
    wanted_rows = full_rows->size();
    for (size_t i = 0; i < full_rows->size(); ++i) {
      const int32_t r = (*full_rows)[i];
      if (r < 0 || r >= static_cast<int32_t>(batch.logit_rows.size()) ||
          (i > 0 && r <= (*full_rows)[i - 1])) {
        return Status::invalid_argument(
            "cuda forward: full row {} is not an increasing index into {} logit rows", r,
            batch.logit_rows.size());
      }
    }
    if (num_summaries != batch.logit_rows.size()) {
      return Status::invalid_argument("cuda forward: {} summaries for {} logit rows", num_summaries,
                                      batch.logit_rows.size());
    }
  }
  if (row_stride > 0) {
    KVP_RETURN_IF_ERROR(
        check_logit_rows(wanted_rows, spec_.logits_per_row(), row_stride, logits.size()));
  } else if (logits.size() != wanted_rows * static_cast<size_t>(spec_.logits_per_row())) {
    return Status::invalid_argument("cuda forward: logits buffer of {} floats, need {} x {}",
                                    logits.size(), wanted_rows, spec_.logits_per_row());
  }
  if (static_cast<int32_t>(batch.groups.size()) != num_cache_groups() ||
      static_cast<int32_t>(pools.size()) != num_cache_groups()) {
    return Status::invalid_argument(
        "cuda forward: {} batch groups and {} KV pools for {} cache groups", batch.groups.size(),
        pools.size(), num_cache_groups());
  }
  for (int32_t g = 0; g < num_cache_groups(); ++g) {
    const ForwardBatch::Group& group = batch.groups[g];
    const KvLayout& layout = pools[g].layout();
    if (layout.num_layers != static_cast<int32_t>(group_layers_[g].size()) ||
        layout.num_kv_heads != spec_.num_kv_heads || layout.head_dim != padded_head_dim_ ||
        (layout.dtype != DType::BF16 && layout.dtype != DType::F16 && !is_kv8(layout.dtype))) {
      return Status::invalid_argument(
          "cuda forward: KV pool of cache group {} does not fit the "
          "model (allocate_kv first)",
          g);
    }
    if (static_cast<int64_t>(group.slot_mapping.size()) != num_tokens) {
      return Status::invalid_argument(
          "cuda forward: group {} slot mapping has {} entries for {} tokens", g,
          group.slot_mapping.size(), num_tokens);
    }
    if (group.max_blocks_per_seq < 0 ||
        group.block_tables.size() != batch.kv_lens.size() * group.max_blocks_per_seq) {
      return Status::invalid_argument(
          "cuda forward: group {} block tables hold {} entries, need {} x {}", g,
          group.block_tables.size(), batch.kv_lens.size(), group.max_blocks_per_seq);
    }
    AttentionParams params;
    params.num_q_heads = spec_.num_q_heads;
    params.window = group_is_sliding(g) ? spec_.sliding_window : 0;
    AttentionBatch ab;
    ab.num_seqs = static_cast<int32_t>(batch.kv_lens.size());
    ab.num_tokens = static_cast<int32_t>(num_tokens);
    ab.query_start = batch.query_start.data();
    ab.kv_lens = batch.kv_lens.data();
    ab.block_tables = group.block_tables.data();
    ab.max_blocks_per_seq = group.max_blocks_per_seq;
    for (int32_t s = 0; s < ab.num_seqs; ++s) {
      ab.max_q_len = std::max(ab.max_q_len, batch.query_start[s + 1] - batch.query_start[s]);
      ab.max_kv_len = std::max(ab.max_kv_len, batch.kv_lens[s]);
    }
    const PagedKv kv = pools[g].layer(0);
    KVP_RETURN_IF_ERROR(check_attention_args(params, ab, kv));
    KvWrite write;
    write.k = write.v = kv.k;
    write.slot_mapping = group.slot_mapping.data();
    write.num_tokens = static_cast<int32_t>(num_tokens);
    KVP_RETURN_IF_ERROR(check_kv_write_args(write, kv));
  }
  return Status::ok();
}

}  // namespace kvp::cuda

// The oracle: dense gather, plain two-pass softmax in double precision (attention sinks join its
// denominator). Slow on purpose.
#include <cmath>
#include <limits>
#include <vector>

#include "backend/attention.h"

namespace kvp {

void reference_paged_attention(const AttentionParams& params, const AttentionBatch& batch,
                               const PagedKv& kv, const void* q, DType q_dtype, void* out) {
  const int32_t head_dim = kv.head_dim;
  const int32_t group = params.num_q_heads / kv.num_kv_heads;
  std::vector<double> keys, values, logits;
  for (int32_t s = 0; s < batch.num_seqs; ++s) {
    const int32_t q_begin = batch.query_start[s];
    const int32_t q_len = batch.query_start[s + 1] - q_begin;
    const int32_t kv_len = batch.kv_lens[s];
    const int32_t* table = batch.block_tables + int64_t{s} * batch.max_blocks_per_seq;
    for (int32_t kvh = 0; kvh < kv.num_kv_heads; ++kvh) {
      // gather this KV head's keys and values: [kv_len][head_dim]
      keys.assign(static_cast<size_t>(kv_len) * head_dim, 0.0);
      values.assign(static_cast<size_t>(kv_len) * head_dim, 0.0);
      for (int32_t j = first_visible_key(params, kv_len, q_len); j < kv_len; ++j) {
        const int64_t block = table[j / kv.block_size];
        const int32_t token = j % kv.block_size;
        const int64_t base = kv.row_offset(block, kvh, token);
        // 8-bit: the dequantised cache, value times its row's scale
        const double k_scale = kv_row_scale(kv, kv.k, block, kvh, token);
        const double v_scale = kv_row_scale(kv, kv.v, block, kvh, token);
        for (int32_t d = 0; d < head_dim; ++d) {
          keys[size_t(j) * head_dim + d] = k_scale * kv_element(kv, kv.k, base + d);
          values[size_t(j) * head_dim + d] = v_scale * kv_element(kv, kv.v, base + d);
        }
      }
      for (int32_t g = 0; g < group; ++g) {
        const int32_t h = kvh * group + g;
        for (int32_t t = 0; t < q_len; ++t) {
          const int64_t row = (int64_t{q_begin} + t) * params.num_q_heads + h;
          const int32_t pos = kv_len - q_len + t;
          const int32_t first = params.window > 0 ? std::max(0, pos - params.window + 1) : 0;
          logits.assign(static_cast<size_t>(pos + 1), -std::numeric_limits<double>::infinity());
          double max_logit = -std::numeric_limits<double>::infinity();
          for (int32_t j = first; j <= pos; ++j) {
            double dot = 0.0;
            for (int32_t d = 0; d < head_dim; ++d) {
              dot += double(load_as_f32(q, q_dtype, row * head_dim + d)) *
                     keys[size_t(j) * head_dim + d];
            }
            double logit = dot * params.scale;
            if (params.soft_cap > 0.0f)
              logit = params.soft_cap * std::tanh(logit / params.soft_cap);
            logits[j] = logit;
            max_logit = std::max(max_logit, logit);
          }
          double sum = 0.0;
          if (params.sinks != nullptr) {  // joins the denominator only
            const double sink = params.sinks[h];
            max_logit = std::max(max_logit, sink);  // no exponent overflows
            sum += std::exp(sink - max_logit);
          }
          for (int32_t j = first; j <= pos; ++j) sum += std::exp(logits[j] - max_logit);
          for (int32_t d = 0; d < head_dim; ++d) {
            double acc = 0.0;
            for (int32_t j = first; j <= pos; ++j) {
              acc += std::exp(logits[j] - max_logit) * values[size_t(j) * head_dim + d];
            }
            store_from_f32(out, q_dtype, row * head_dim + d, static_cast<float>(acc / sum));
          }
        }
      }
    }
  }
}

}  // namespace kvp

// ModelRunner: one forward pass of a decoder-only transformer over a packed, mixed batch
// (DESIGN.md §1), with every token's K and V written into, and read from, the paged pool.
//
//   tokens of all sequences, packed:   [ seq0: q_len0 tokens | seq1: q_len1 | … ]
//   per layer: norm → q,k,v → (q/k norm) → rope → write k,v to their slots (slot mapping of the
//              layer's cache group) → paged attention over each sequence's block table
//              (GPT-OSS: with each head's sink logit) → o → (+ residual) → norm → gated MLP,
//              or the mixture of experts of an MoE
//              layer (model/moe_layer.h) → (+ residual)
//   logits only for the rows asked for (usually each sequence's last token).
//
// Layers are assigned to cache groups: group 0 holds the global layers, group 1 the
// sliding-window layers (if any). Each group has its own KV slab (layout cache/kv_layout.h),
// block tables and slot mapping.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cache/kv_layout.h"
#include "common/status.h"
#include "common/thread_pool.h"
#include "model/model_spec.h"
#include "model/moe_layer.h"
#include "model/weight_source.h"
#include "quant/quant_matmul.h"

namespace kvp {

// A linear layer's weight in the format its file stores: one or more matrices of the same input
// width stacked as output rows (q, k, v; gate, up), each viewing memory kept alive by
// ModelWeights::keep_alive. y = x · [parts…]ᵀ is one quant::matmul call.
struct LinearWeight {
  std::vector<quant::QuantMatrix> parts;

  int64_t rows() const;  // output features: the parts' rows together
  size_t size_bytes() const;
};

struct LayerWeights {
  std::vector<float> attn_norm;       // [hidden]
  LinearWeight qkv;                   // q [q_heads * head_dim], k, v [kv_heads * head_dim] rows
  std::vector<float> qkv_bias;        // [(q_heads + 2 kv_heads) * head_dim] or empty
  std::vector<float> q_norm, k_norm;  // [head_dim] (Gemma 3, Qwen3) or empty
  LinearWeight o;                     // [hidden][q_heads * head_dim]
  std::vector<float> o_bias;          // [hidden] (GPT-OSS) or empty
  std::vector<float> sinks;           // [q_heads] attention sink logits (GPT-OSS) or empty
  std::vector<float> post_attn_norm;  // [hidden] (Gemma 3) or empty
  std::vector<float> mlp_norm;        // [hidden]
  LinearWeight gate_up;               // gate [intermediate] rows, then up [intermediate]
  LinearWeight down;                  // [hidden][intermediate]
  ExpertWeights experts;              // MoE layers (gate_up, down empty there), else empty
  std::vector<float> post_mlp_norm;   // [hidden] (Gemma 3) or empty
};

struct ModelWeights {
  quant::QuantMatrix embed;  // [vocab][hidden]
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;  // [hidden]
  quant::QuantMatrix lm_head;     // [vocab][hidden]; rows == 0 when tied to embed
  // What the matrices point into: file mappings (shared) and converted copies.
  std::vector<std::shared_ptr<const void>> keep_alive;
  int32_t experts_per_token = 0;  // experts a token runs per MoE layer (spec's top-k)

  // Bytes of the matrices by stored format ("Q4_1" → bytes), the lm-head counted once when
  // tied; and their sum. The small f32 tensors (norms, biases) are not counted.
  std::vector<std::pair<std::string, uint64_t>> matrix_bytes_by_format() const;
  uint64_t matrix_bytes() const;
  // Bytes of the matrices one decode step reads: every layer's and the lm-head (the embedding
  // table only when it is the lm-head; a lookup reads one row of it); of an MoE layer the
  // router and experts_per_token experts of average size.
  uint64_t decode_read_bytes() const;
};

// Called with (layers done, layers) as weights load.
using LoadProgress = std::function<void(int32_t, int32_t)>;

// Reads every weight of `spec` from `source` (Hugging Face tensor names): matrices as the source
// stores them (WeightSource::read_matrix), norms and biases as f32.
Result<ModelWeights> load_model_weights(const ModelSpec& spec, const WeightSource& source,
                                        const LoadProgress& progress = {});

// The KV storage of one cache group in host memory.
struct HostKvSlab {
  KvLayout layout;
  std::vector<std::byte> bytes;  // layout.size_bytes()
};

// The batch of one step. Spans point at host memory owned by the caller.
struct ForwardBatch {
  std::span<const int32_t> token_ids;    // [num_tokens]
  std::span<const int32_t> query_start;  // [num_seqs + 1]; sequence i's tokens are rows
                                         // query_start[i] .. query_start[i+1]-1
  std::span<const int32_t> kv_lens;      // [num_seqs] tokens cached after this step; the new
                                         // tokens sit at positions kv_len - q_len .. kv_len - 1
  struct Group {
    std::span<const int64_t> slot_mapping;  // [num_tokens]
    std::span<const int32_t> block_tables;  // [num_seqs][max_blocks_per_seq]
    int32_t max_blocks_per_seq = 0;
  };
  std::vector<Group> groups;            // one per cache group of the model
  std::span<const int32_t> logit_rows;  // token rows whose logits are wanted
};

// The cache groups of a model's layers: group 0 the global layers, group 1 the sliding-window
// ones (renumbered to 0 when every layer slides). The CPU and CUDA runners both use it, so their
// pools have the same groups.
struct CacheGroups {
  std::vector<std::vector<int32_t>> group_layers;  // [group] -> model layer indices
  std::vector<int32_t> layer_group;                // [layer] -> group
  std::vector<int32_t> layer_slot;                 // [layer] -> index within its group
};
CacheGroups assign_cache_groups(const ModelSpec& spec);

// The inverse frequencies of one of the spec's ropes (head_dim, theta and scaling; freq_factors
// divided out), as both runners rotate with them.
std::vector<float> rope_inverse_frequencies(const ModelSpec& spec, const RopeSpec& rope);

class ModelRunner {
 public:
  // pool: threads for attention (null: the calling thread only); not owned.
  ModelRunner(ModelSpec spec, ModelWeights weights, ThreadPool* pool = nullptr);

  const ModelSpec& spec() const { return spec_; }
  const ModelWeights& weights() const { return weights_; }
  // How steps of decode rows only multiply activations by block-format weights
  // (quant_matmul.h): int8 activations (default, as llama.cpp) or f32 (exact; tests against
  // references). A step with a prompt chunk (any sequence with more than one new token), of any
  // number of rows, multiplies in the prefill precision below. Prompts set up everything a
  // sequence attends to, and int8 activations there can move a near-tie: SmolLM2-135M with its
  // default system prompt answers "What is the capital of France?" with "L'Étoile, la
  // Marseillaise, ..." when its prompt is multiplied with int8 activations (llama.cpp, which does
  // so, gives the same words) and "The capital of France is Paris." in f32 (first token: "The"
  // -1.88, "L" -1.97 in f32; "L" -2.02, "The" -2.13 with int8); KVP_PREFILL_ACT=f32 gives the
  // latter. With kF32 here every step multiplies in f32.
  void set_act_precision(quant::ActPrecision precision) { precision_ = precision; }
  // How prompt steps multiply, when the runner's precision is kInt8 (below
  // quant::kPrefillMinRows rows the int8 products run the decode kernels, from there the prefill
  // tiles):
  //   kPrefill (default): int8 activations for the weight formats whose int8 tiles beat
  //                       dequantise + sgemm here (quant::prefill_prefers_int8), f32 for the rest
  //   kF32:               f32 for every format (exact up to summation order)
  //   kInt8All:           int8 for every block format (to compare the paths)
  // The default comes from the environment variable KVP_PREFILL_ACT (int8 = kPrefill | f32 |
  // int8-all), read once per process; unset or unknown (a warning on stderr): kPrefill.
  void set_prefill_act_precision(quant::ActPrecision precision) { prefill_precision_ = precision; }
  // Tensor parallelism (model/tensor_parallel.h): this runner is one rank of a split model and
  // all_reduce sums a buffer over the ranks in place; called on the attention output projection's
  // and the MLP down projection's partial outputs, before any norm or residual.
  void set_all_reduce(std::function<void(std::span<float>)> all_reduce) {
    all_reduce_ = std::move(all_reduce);
  }
  // Number of cache groups (1, or 2 with sliding-window layers) and the layers of each.
  int32_t num_cache_groups() const { return static_cast<int32_t>(group_layers_.size()); }
  const std::vector<int32_t>& group_layers(int32_t group) const { return group_layers_[group]; }
  // Whether group `group` holds sliding-window layers (window = spec().sliding_window).
  bool group_is_sliding(int32_t group) const;
  // The KV layout of one group for a pool of `num_blocks` blocks of `block_size` tokens.
  KvLayout group_layout(int32_t group, int32_t num_blocks, int32_t block_size, DType dtype) const;

  // Runs the batch: writes the new tokens' K and V into `slabs` (one per cache group) and
  // fills logits [logit_rows.size()][vocab_size]. Bad batches (sizes that disagree, token ids
  // outside the vocabulary, block tables or slots out of range) → invalid_argument, with
  // nothing written.
  Status forward(const ForwardBatch& batch, std::span<HostKvSlab> slabs, std::span<float> logits);

 private:
  Status check_batch(const ForwardBatch& batch, std::span<HostKvSlab> slabs,
                     std::span<float> logits) const;

  ModelSpec spec_;
  ModelWeights weights_;
  std::vector<std::vector<int32_t>> group_layers_;  // [group] -> model layer indices
  std::vector<int32_t> layer_group_;                // [layer] -> group
  std::vector<int32_t> layer_slot_;                 // [layer] -> index within its group
  std::vector<float> inv_freq_global_, inv_freq_local_;
  ThreadPool* pool_ = nullptr;
  quant::ActPrecision precision_ = quant::ActPrecision::kInt8;
  quant::ActPrecision prefill_precision_;             // set_prefill_act_precision
  std::function<void(std::span<float>)> all_reduce_;  // empty: not split
};

}  // namespace kvp

#include "model/model_runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "backend/attention.h"
#include "backend/cpu_attention.h"
#include "backend/cpu_layer_ops.h"

namespace kvp {

namespace {

Status read_into(const WeightSource& source, const std::string& name,
                 std::initializer_list<int64_t> shape, std::vector<float>* out) {
  KVP_ASSIGN_OR_RETURN(*out, source.read_f32(name, std::span(shape.begin(), shape.size())));
  return Status::ok();
}

// Appends matrix `name` [rows][cols] (as stored) to `linear`, keeping its memory alive in `w`.
Status add_part(const WeightSource& source, const std::string& name, int64_t rows, int64_t cols,
                LinearWeight* linear, ModelWeights* w) {
  KVP_ASSIGN_OR_RETURN(StoredMatrix m, source.read_matrix(name, rows, cols));
  linear->parts.push_back(m.matrix);
  w->keep_alive.push_back(std::move(m.keep_alive));
  return Status::ok();
}

Result<quant::QuantMatrix> read_matrix(const WeightSource& source, const std::string& name,
                                       int64_t rows, int64_t cols, ModelWeights* w) {
  KVP_ASSIGN_OR_RETURN(StoredMatrix m, source.read_matrix(name, rows, cols));
  w->keep_alive.push_back(std::move(m.keep_alive));
  return m.matrix;
}

// Experts as the source stacks them (read_stacked_experts or read_gpt_oss_experts), appended per
// expert to experts->gate_up (gate, up) and experts->down; their memory kept alive in w.
void add_stacked_experts(StackedExperts stacked, ExpertWeights* experts, ModelWeights* w) {
  for (size_t e = 0; e < stacked.down.size(); ++e) {
    experts->gate_up.push_back(stacked.gate[e].matrix);
    experts->gate_up.push_back(stacked.up[e].matrix);
    experts->down.push_back(stacked.down[e].matrix);
    for (StoredMatrix* m : {&stacked.gate[e], &stacked.up[e], &stacked.down[e]}) {
      w->keep_alive.push_back(std::move(m->keep_alive));
    }
  }
}

// Layer `layer`'s router "model.layers.N.mlp.gate.weight" [num_experts][hidden] and its
// experts' gate, up [moe_intermediate][hidden] and down [hidden][moe_intermediate].
Status load_experts(const ModelSpec& spec, const WeightSource& source, int32_t layer,
                    ExpertWeights* experts, ModelWeights* w) {
  const int64_t hidden = spec.hidden_size;
  const int32_t num_experts = spec.num_experts;
  KVP_ASSIGN_OR_RETURN(experts->router,
                       read_matrix(source, fmt::format("model.layers.{}.mlp.gate.weight", layer),
                                   num_experts, hidden, w));
  KVP_ASSIGN_OR_RETURN(
      StackedExperts stacked,
      read_stacked_experts(source, layer, num_experts, spec.moe_intermediate_size, hidden));
  add_stacked_experts(std::move(stacked), experts, w);
  if (spec.shared_expert_intermediate_size > 0) {
    const int64_t shared = spec.shared_expert_intermediate_size;
    const std::string p = fmt::format("model.layers.{}.mlp.shared_expert", layer);
    experts->shared_gate_up.clear();
    for (const char* name : {".gate_proj.weight", ".up_proj.weight"}) {
      KVP_ASSIGN_OR_RETURN(quant::QuantMatrix m, read_matrix(source, p + name, shared, hidden, w));
      experts->shared_gate_up.push_back(m);
    }
    KVP_ASSIGN_OR_RETURN(experts->shared_down,
                         read_matrix(source, p + ".down_proj.weight", hidden, shared, w));
    KVP_RETURN_IF_ERROR(read_into(source, p + "_gate.weight", {1, hidden}, &experts->shared_gate));
  }
  return Status::ok();
}

// GPT-OSS's layer `layer`: router "model.layers.N.mlp.router.{weight,bias}" and the experts with
// their biases (read_gpt_oss_experts: transformers' or GGUF's layout).
Status load_gpt_oss_experts(const ModelSpec& spec, const WeightSource& source, int32_t layer,
                            ExpertWeights* experts, ModelWeights* w) {
  const int64_t hidden = spec.hidden_size;
  const int64_t num_experts = spec.num_experts;
  const std::string p = fmt::format("model.layers.{}.mlp.", layer);
  KVP_ASSIGN_OR_RETURN(experts->router,
                       read_matrix(source, p + "router.weight", num_experts, hidden, w));
  KVP_RETURN_IF_ERROR(read_into(source, p + "router.bias", {num_experts}, &experts->router_bias));
  KVP_ASSIGN_OR_RETURN(
      GptOssExperts read,
      read_gpt_oss_experts(source, layer, spec.num_experts, spec.moe_intermediate_size, hidden));
  add_stacked_experts(std::move(read.stacked), experts, w);
  experts->gate_up_bias = std::move(read.gate_up_bias);
  experts->down_bias = std::move(read.down_bias);
  return Status::ok();
}

}  // namespace

int64_t LinearWeight::rows() const {
  int64_t n = 0;
  for (const quant::QuantMatrix& m : parts) n += m.rows;
  return n;
}

size_t LinearWeight::size_bytes() const {
  size_t n = 0;
  for (const quant::QuantMatrix& m : parts) n += m.size_bytes();
  return n;
}

std::vector<std::pair<std::string, uint64_t>> ModelWeights::matrix_bytes_by_format() const {
  std::vector<std::pair<std::string, uint64_t>> out;
  auto add = [&](const quant::QuantMatrix& m) {
    if (m.rows == 0) return;
    const std::string name(ggml_type_name(m.type));
    auto it = std::find_if(out.begin(), out.end(), [&](const auto& p) { return p.first == name; });
    if (it == out.end()) {
      out.emplace_back(name, m.size_bytes());
    } else {
      it->second += m.size_bytes();
    }
  };
  add(embed);
  add(lm_head);
  for (const LayerWeights& lw : layers) {
    for (const LinearWeight* l : {&lw.qkv, &lw.o, &lw.gate_up, &lw.down}) {
      for (const quant::QuantMatrix& m : l->parts) add(m);
    }
    if (lw.experts.num_experts() > 0) add(lw.experts.router);
    for (const quant::QuantMatrix& m : lw.experts.gate_up) add(m);
    for (const quant::QuantMatrix& m : lw.experts.down) add(m);
    for (const quant::QuantMatrix& m : lw.experts.shared_gate_up) add(m);
    add(lw.experts.shared_down);
  }
  return out;
}

uint64_t ModelWeights::matrix_bytes() const {
  uint64_t n = 0;
  for (const auto& [name, bytes] : matrix_bytes_by_format()) n += bytes;
  return n;
}

uint64_t ModelWeights::decode_read_bytes() const {
  uint64_t n = lm_head.rows == 0 ? embed.size_bytes() : lm_head.size_bytes();
  for (const LayerWeights& lw : layers) {
    n += lw.qkv.size_bytes() + lw.o.size_bytes() + lw.gate_up.size_bytes() + lw.down.size_bytes();
    const int32_t num_experts = lw.experts.num_experts();
    if (num_experts > 0) {
      uint64_t shared = lw.experts.shared_down.size_bytes();
      for (const quant::QuantMatrix& m : lw.experts.shared_gate_up) shared += m.size_bytes();
      const uint64_t routed = lw.experts.size_bytes() - lw.experts.router.size_bytes() - shared;
      n += lw.experts.router.size_bytes() + shared + routed * experts_per_token / num_experts;
    }
  }
  return n;
}

Result<ModelWeights> load_model_weights(const ModelSpec& spec, const WeightSource& source,
                                        const LoadProgress& progress) {
  const int64_t hidden = spec.hidden_size, head_dim = spec.head_dim;
  const int64_t q_dim = int64_t{spec.num_q_heads} * head_dim;
  const int64_t kv_dim = int64_t{spec.num_kv_heads} * head_dim;
  const int64_t inter = spec.intermediate_size;
  ModelWeights w;
  w.experts_per_token = spec.num_experts_per_tok;
  KVP_ASSIGN_OR_RETURN(
      w.embed, read_matrix(source, "model.embed_tokens.weight", spec.vocab_size, hidden, &w));
  KVP_RETURN_IF_ERROR(read_into(source, "model.norm.weight", {hidden}, &w.final_norm));
  if (!spec.tie_word_embeddings || source.contains("lm_head.weight")) {
    KVP_ASSIGN_OR_RETURN(w.lm_head,
                         read_matrix(source, "lm_head.weight", spec.logits_per_row(), hidden, &w));
  }
  w.layers.resize(spec.num_layers);
  std::vector<float> part;
  for (int32_t l = 0; l < spec.num_layers; ++l) {
    if (progress) progress(l, spec.num_layers);
    LayerWeights& lw = w.layers[l];
    const std::string p = fmt::format("model.layers.{}.", l);
    KVP_RETURN_IF_ERROR(read_into(source, p + "input_layernorm.weight", {hidden}, &lw.attn_norm));
    KVP_RETURN_IF_ERROR(
        add_part(source, p + "self_attn.q_proj.weight", q_dim, hidden, &lw.qkv, &w));
    KVP_RETURN_IF_ERROR(
        add_part(source, p + "self_attn.k_proj.weight", kv_dim, hidden, &lw.qkv, &w));
    KVP_RETURN_IF_ERROR(
        add_part(source, p + "self_attn.v_proj.weight", kv_dim, hidden, &lw.qkv, &w));
    if (spec.qkv_bias) {
      for (const char* name : {"q_proj", "k_proj", "v_proj"}) {
        const int64_t n = name[0] == 'q' ? q_dim : kv_dim;
        KVP_RETURN_IF_ERROR(read_into(source, p + "self_attn." + name + ".bias", {n}, &part));
        lw.qkv_bias.insert(lw.qkv_bias.end(), part.begin(), part.end());
      }
    }
    if (spec.qk_norm) {
      KVP_RETURN_IF_ERROR(read_into(source, p + "self_attn.q_norm.weight", {head_dim}, &lw.q_norm));
      KVP_RETURN_IF_ERROR(read_into(source, p + "self_attn.k_norm.weight", {head_dim}, &lw.k_norm));
    }
    KVP_RETURN_IF_ERROR(add_part(source, p + "self_attn.o_proj.weight", hidden, q_dim, &lw.o, &w));
    if (spec.o_bias) {
      KVP_RETURN_IF_ERROR(read_into(source, p + "self_attn.o_proj.bias", {hidden}, &lw.o_bias));
    }
    if (spec.attention_sinks) {
      KVP_RETURN_IF_ERROR(
          read_into(source, p + "self_attn.sinks", {int64_t{spec.num_q_heads}}, &lw.sinks));
    }
    if (spec.sandwich_norms) {
      KVP_RETURN_IF_ERROR(
          read_into(source, p + "post_attention_layernorm.weight", {hidden}, &lw.post_attn_norm));
      KVP_RETURN_IF_ERROR(
          read_into(source, p + "pre_feedforward_layernorm.weight", {hidden}, &lw.mlp_norm));
      KVP_RETURN_IF_ERROR(
          read_into(source, p + "post_feedforward_layernorm.weight", {hidden}, &lw.post_mlp_norm));
    } else {
      KVP_RETURN_IF_ERROR(
          read_into(source, p + "post_attention_layernorm.weight", {hidden}, &lw.mlp_norm));
    }
    if (spec.layer_moe(l)) {
      KVP_RETURN_IF_ERROR(spec.architecture == Architecture::kGptOss
                              ? load_gpt_oss_experts(spec, source, l, &lw.experts, &w)
                              : load_experts(spec, source, l, &lw.experts, &w));
      continue;
    }
    KVP_RETURN_IF_ERROR(
        add_part(source, p + "mlp.gate_proj.weight", inter, hidden, &lw.gate_up, &w));
    KVP_RETURN_IF_ERROR(add_part(source, p + "mlp.up_proj.weight", inter, hidden, &lw.gate_up, &w));
    KVP_RETURN_IF_ERROR(add_part(source, p + "mlp.down_proj.weight", hidden, inter, &lw.down, &w));
  }
  // one reference per distinct owner is enough (a GGUF file backs every matrix)
  std::sort(w.keep_alive.begin(), w.keep_alive.end());
  w.keep_alive.erase(std::unique(w.keep_alive.begin(), w.keep_alive.end()), w.keep_alive.end());
  if (progress) progress(spec.num_layers, spec.num_layers);
  return w;
}

CacheGroups assign_cache_groups(const ModelSpec& spec) {
  CacheGroups c;
  c.layer_group.resize(spec.num_layers);
  c.layer_slot.resize(spec.num_layers);
  for (int32_t l = 0; l < spec.num_layers; ++l) {
    const int32_t group = spec.layer_is_sliding[l] ? 1 : 0;
    if (c.group_layers.size() <= static_cast<size_t>(group)) c.group_layers.resize(group + 1);
    c.layer_group[l] = group;
    c.layer_slot[l] = static_cast<int32_t>(c.group_layers[group].size());
    c.group_layers[group].push_back(l);
  }
  // a model whose layers are all sliding keeps them in group 1 with group 0 empty: renumber
  if (c.group_layers[0].empty()) {
    c.group_layers.erase(c.group_layers.begin());
    for (int32_t& g : c.layer_group) g = 0;
  }
  return c;
}

std::vector<float> rope_inverse_frequencies(const ModelSpec& spec, const RopeSpec& rope) {
  std::vector<float> inv = cpu::rope_inverse_frequencies(spec.head_dim, rope.theta, rope.scaling);
  for (size_t i = 0; i < rope.freq_factors.size() && i < inv.size(); ++i) {
    inv[i] /= rope.freq_factors[i];
  }
  return inv;
}

namespace {

// KVP_PREFILL_ACT (model_runner.h: set_prefill_act_precision), read once per process.
quant::ActPrecision prefill_precision_from_env() {
  static const quant::ActPrecision precision = [] {
    const char* value = std::getenv("KVP_PREFILL_ACT");
    if (value == nullptr || std::string_view(value) == "int8") {
      return quant::ActPrecision::kPrefill;
    }
    if (std::string_view(value) == "f32") return quant::ActPrecision::kF32;
    if (std::string_view(value) == "int8-all") return quant::ActPrecision::kInt8All;
    std::fprintf(stderr, "kvpool: KVP_PREFILL_ACT=%s is not f32, int8 or int8-all; using int8\n",
                 value);
    return quant::ActPrecision::kPrefill;
  }();
  return precision;
}

}  // namespace

ModelRunner::ModelRunner(ModelSpec spec, ModelWeights weights, ThreadPool* pool)
    : spec_(std::move(spec)),
      weights_(std::move(weights)),
      pool_(pool),
      prefill_precision_(prefill_precision_from_env()) {
  KVP_CHECK(spec_.validate().is_ok(), "{}", spec_.validate().to_string());
  CacheGroups groups = assign_cache_groups(spec_);
  group_layers_ = std::move(groups.group_layers);
  layer_group_ = std::move(groups.layer_group);
  layer_slot_ = std::move(groups.layer_slot);
  inv_freq_global_ = rope_inverse_frequencies(spec_, spec_.rope_global);
  inv_freq_local_ = rope_inverse_frequencies(spec_, spec_.rope_local);
}

bool ModelRunner::group_is_sliding(int32_t group) const {
  return spec_.layer_is_sliding[group_layers_[group].front()];
}

KvLayout ModelRunner::group_layout(int32_t group, int32_t num_blocks, int32_t block_size,
                                   DType dtype) const {
  KvLayout layout;
  layout.num_layers = static_cast<int32_t>(group_layers_[group].size());
  layout.num_blocks = num_blocks;
  layout.num_kv_heads = spec_.num_kv_heads;
  layout.block_size = block_size;
  layout.head_dim = spec_.head_dim;
  layout.dtype = dtype;
  return layout;
}

Status ModelRunner::check_batch(const ForwardBatch& batch, std::span<HostKvSlab> slabs,
                                std::span<float> logits) const {
  const auto num_tokens = static_cast<int64_t>(batch.token_ids.size());
  if (batch.query_start.empty() || batch.query_start.size() != batch.kv_lens.size() + 1) {
    return Status::invalid_argument("forward: {} query starts for {} sequences",
                                    batch.query_start.size(), batch.kv_lens.size());
  }
  if (batch.query_start.back() != num_tokens) {
    return Status::invalid_argument("forward: query_start ends at {} but the batch has {} tokens",
                                    batch.query_start.back(), num_tokens);
  }
  for (int32_t t : batch.token_ids) {
    if (t < 0 || t >= spec_.vocab_size) {
      return Status::invalid_argument("forward: token id {} outside the vocabulary of {}", t,
                                      spec_.vocab_size);
    }
  }
  for (int32_t row : batch.logit_rows) {
    if (row < 0 || row >= num_tokens) {
      return Status::invalid_argument("forward: logit row {} outside the batch of {} tokens", row,
                                      num_tokens);
    }
  }
  if (logits.size() != batch.logit_rows.size() * static_cast<size_t>(spec_.logits_per_row())) {
    return Status::invalid_argument("forward: logits buffer of {} floats, need {} x {}",
                                    logits.size(), batch.logit_rows.size(), spec_.logits_per_row());
  }
  if (static_cast<int32_t>(batch.groups.size()) != num_cache_groups() ||
      static_cast<int32_t>(slabs.size()) != num_cache_groups()) {
    return Status::invalid_argument("forward: {} batch groups and {} slabs for {} cache groups",
                                    batch.groups.size(), slabs.size(), num_cache_groups());
  }
  for (int32_t g = 0; g < num_cache_groups(); ++g) {
    const ForwardBatch::Group& group = batch.groups[g];
    const KvLayout& layout = slabs[g].layout;
    if (layout.num_layers != static_cast<int32_t>(group_layers_[g].size()) ||
        layout.num_kv_heads != spec_.num_kv_heads || layout.head_dim != spec_.head_dim ||
        slabs[g].bytes.size() != layout.size_bytes()) {
      return Status::invalid_argument("forward: slab of cache group {} does not fit the model", g);
    }
    if (static_cast<int64_t>(group.slot_mapping.size()) != num_tokens) {
      return Status::invalid_argument("forward: group {} slot mapping has {} entries for {} tokens",
                                      g, group.slot_mapping.size(), num_tokens);
    }
    if (group.block_tables.size() != batch.kv_lens.size() * group.max_blocks_per_seq) {
      return Status::invalid_argument(
          "forward: group {} block tables hold {} entries, need {} x {}", g,
          group.block_tables.size(), batch.kv_lens.size(), group.max_blocks_per_seq);
    }
    // every attention call of this group sees the same metadata: check it once, up front
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
    ab.max_q_len = ab.max_kv_len = 0;
    for (int32_t s = 0; s < ab.num_seqs; ++s) {
      ab.max_q_len = std::max(ab.max_q_len, batch.query_start[s + 1] - batch.query_start[s]);
      ab.max_kv_len = std::max(ab.max_kv_len, batch.kv_lens[s]);
    }
    PagedKv kv = paged_kv_for_layer(layout, const_cast<std::byte*>(slabs[g].bytes.data()), 0);
    KVP_RETURN_IF_ERROR(check_attention_args(params, ab, kv));
    KvWrite write;
    write.k = write.v = slabs[g].bytes.data();
    write.slot_mapping = group.slot_mapping.data();
    write.num_tokens = static_cast<int32_t>(num_tokens);
    KVP_RETURN_IF_ERROR(check_kv_write_args(write, kv));
  }
  return Status::ok();
}

Status ModelRunner::forward(const ForwardBatch& batch, std::span<HostKvSlab> slabs,
                            std::span<float> logits) {
  KVP_RETURN_IF_ERROR(check_batch(batch, slabs, logits));
  const auto num_tokens = static_cast<int64_t>(batch.token_ids.size());
  const int32_t num_seqs = static_cast<int32_t>(batch.kv_lens.size());
  const int64_t hidden = spec_.hidden_size, head_dim = spec_.head_dim;
  const int64_t num_q_heads = spec_.num_q_heads, num_kv_heads = spec_.num_kv_heads;
  const int64_t q_dim = num_q_heads * head_dim, kv_dim = num_kv_heads * head_dim;
  const int64_t qkv_dim = q_dim + 2 * kv_dim, inter = spec_.intermediate_size;

  std::vector<int32_t> positions(num_tokens);  // [num_tokens]
  int32_t max_q_len = 0, max_kv_len = 0;
  for (int32_t s = 0; s < num_seqs; ++s) {
    const int32_t q_len = batch.query_start[s + 1] - batch.query_start[s];
    for (int32_t t = 0; t < q_len; ++t) {
      positions[batch.query_start[s] + t] = batch.kv_lens[s] - q_len + t;
    }
    max_q_len = std::max(max_q_len, q_len);
    max_kv_len = std::max(max_kv_len, batch.kv_lens[s]);
  }

  // A step of decode rows only multiplies in the runner's precision (int8 activations by
  // default), a step with a prompt chunk in the prefill precision (every product of the step, the
  // lm-head's few rows and the experts' groups included): see set_act_precision and
  // set_prefill_act_precision. A short chunk (a new turn after a prefix hit) in f32 would
  // dequantise every weight of the model for a few rows: 2.5 s for 2 tokens of a
  // Qwen1.5-MoE-A2.7B-shaped Q4_K file on 2 cores, against 0.1 s for a decode step.
  quant::ActPrecision precision = precision_;
  if (max_q_len > 1 && precision_ != quant::ActPrecision::kF32) precision = prefill_precision_;
  std::vector<float> x(num_tokens * hidden);           // [num_tokens][hidden] residual stream
  std::vector<float> xn(num_tokens * hidden);          // [num_tokens][hidden] normed
  std::vector<float> qkv(num_tokens * qkv_dim);        // [num_tokens][q_dim + 2 kv_dim]
  std::vector<float> q(num_tokens * q_dim);            // [num_tokens][q_heads][head_dim]
  std::vector<float> k(num_tokens * kv_dim);           // [num_tokens][kv_heads][head_dim]
  std::vector<float> v(num_tokens * kv_dim);           // [num_tokens][kv_heads][head_dim]
  std::vector<float> attn(num_tokens * q_dim);         // [num_tokens][q_heads][head_dim]
  std::vector<float> proj(num_tokens * hidden);        // [num_tokens][hidden]
  std::vector<float> gate_up(num_tokens * 2 * inter);  // [num_tokens][2 * intermediate]
  std::vector<float> act(num_tokens * inter);          // [num_tokens][intermediate]
  std::vector<std::byte> kv_staging;  // new K then V rows in the pool's dtype (non-f32 pools)

  for (int64_t t = 0; t < num_tokens; ++t) {
    float* row = x.data() + t * hidden;
    quant::dequantize_row(weights_.embed, batch.token_ids[t], row);
    if (spec_.embedding_scale != 1.0f) {
      for (int64_t i = 0; i < hidden; ++i) row[i] *= spec_.embedding_scale;
    }
  }
  const float eps = spec_.rms_norm_eps;
  for (int32_t l = 0; l < spec_.num_layers; ++l) {
    const LayerWeights& lw = weights_.layers[l];
    const int32_t g = layer_group_[l];
    const bool sliding = spec_.layer_is_sliding[l];
    cpu::rms_norm(x.data(), lw.attn_norm.data(), xn.data(), num_tokens, hidden, eps,
                  spec_.norm_style);
    quant::matmul(lw.qkv.parts, xn.data(), num_tokens, hidden, qkv.data(), qkv_dim, pool_,
                  precision);
    if (!lw.qkv_bias.empty()) {
      for (int64_t t = 0; t < num_tokens; ++t) {
        float* row = qkv.data() + t * qkv_dim;
        for (int64_t i = 0; i < qkv_dim; ++i) row[i] += lw.qkv_bias[i];
      }
    }
    for (int64_t t = 0; t < num_tokens; ++t) {
      const float* row = qkv.data() + t * qkv_dim;
      std::copy(row, row + q_dim, q.data() + t * q_dim);
      std::copy(row + q_dim, row + q_dim + kv_dim, k.data() + t * kv_dim);
      std::copy(row + q_dim + kv_dim, row + qkv_dim, v.data() + t * kv_dim);
    }
    if (spec_.qk_norm) {
      cpu::rms_norm(q.data(), lw.q_norm.data(), num_tokens * num_q_heads, head_dim, eps,
                    spec_.norm_style);
      cpu::rms_norm(k.data(), lw.k_norm.data(), num_tokens * num_kv_heads, head_dim, eps,
                    spec_.norm_style);
    }
    const std::vector<float>& inv_freq = sliding ? inv_freq_local_ : inv_freq_global_;
    cpu::apply_rope(q.data(), positions, num_q_heads, head_dim, inv_freq, spec_.rope_style);
    cpu::apply_rope(k.data(), positions, num_kv_heads, head_dim, inv_freq, spec_.rope_style);

    // K and V into their slots, then attention over the paged cache
    HostKvSlab& slab = slabs[g];
    PagedKv kv = paged_kv_for_layer(slab.layout, slab.bytes.data(), layer_slot_[l]);
    const ForwardBatch::Group& group = batch.groups[g];
    KvWrite write;
    write.k = k.data();
    write.v = v.data();
    write.slot_mapping = group.slot_mapping.data();
    write.num_tokens = static_cast<int32_t>(num_tokens);
    if (kv.dtype == DType::F32 || is_kv8(kv.dtype)) {  // 8-bit: quantised by write_kv
      KVP_RETURN_IF_ERROR(cpu::write_kv(write, kv));
    } else {  // the pool holds bf16/f16: convert the new rows first
      const size_t count = static_cast<size_t>(num_tokens * kv_dim);
      kv_staging.resize(2 * count * dtype_size_bytes(kv.dtype));
      for (size_t i = 0; i < count; ++i) {
        store_from_f32(kv_staging.data(), kv.dtype, i, k[i]);
        store_from_f32(kv_staging.data(), kv.dtype, count + i, v[i]);
      }
      write.k = kv_staging.data();
      write.v = kv_staging.data() + count * dtype_size_bytes(kv.dtype);
      KVP_RETURN_IF_ERROR(cpu::write_kv(write, kv));
    }
    AttentionParams params;
    params.num_q_heads = spec_.num_q_heads;
    params.scale = spec_.attention_scale;
    params.soft_cap = spec_.attn_logit_softcap;
    params.window = sliding ? spec_.sliding_window : 0;
    params.sinks = lw.sinks.empty() ? nullptr : lw.sinks.data();
    AttentionBatch ab;
    ab.num_seqs = num_seqs;
    ab.num_tokens = static_cast<int32_t>(num_tokens);
    ab.query_start = batch.query_start.data();
    ab.kv_lens = batch.kv_lens.data();
    ab.block_tables = group.block_tables.data();
    ab.max_blocks_per_seq = group.max_blocks_per_seq;
    ab.max_q_len = max_q_len;
    ab.max_kv_len = max_kv_len;
    KVP_RETURN_IF_ERROR(
        cpu::paged_attention(params, ab, kv, q.data(), DType::F32, attn.data(), pool_));

    quant::matmul(lw.o.parts, attn.data(), num_tokens, q_dim, proj.data(), hidden, pool_,
                  precision);
    // split over ranks, rank 0 holds the bias and the others zeros (tensor_parallel.h)
    if (!lw.o_bias.empty()) {
      for (int64_t t = 0; t < num_tokens; ++t) {
        for (int64_t i = 0; i < hidden; ++i) proj[t * hidden + i] += lw.o_bias[i];
      }
    }
    if (all_reduce_) all_reduce_(std::span(proj.data(), static_cast<size_t>(num_tokens * hidden)));
    if (!lw.post_attn_norm.empty()) {
      cpu::rms_norm(proj.data(), lw.post_attn_norm.data(), num_tokens, hidden, eps,
                    spec_.norm_style);
    }
    for (int64_t i = 0; i < num_tokens * hidden; ++i) x[i] += proj[i];

    cpu::rms_norm(x.data(), lw.mlp_norm.data(), xn.data(), num_tokens, hidden, eps,
                  spec_.norm_style);
    if (spec_.layer_moe(l)) {
      const MoeParams moe{spec_.num_experts_per_tok, spec_.norm_topk_prob, spec_.moe_activation};
      moe_forward(lw.experts, moe, xn.data(), num_tokens, hidden, proj.data(), pool_, precision);
    } else {
      quant::matmul(lw.gate_up.parts, xn.data(), num_tokens, hidden, gate_up.data(), 2 * inter,
                    pool_, precision);
      cpu::gated_activation(gate_up.data(), act.data(), num_tokens, inter, spec_.activation);
      quant::matmul(lw.down.parts, act.data(), num_tokens, inter, proj.data(), hidden, pool_,
                    precision);
    }
    if (all_reduce_) all_reduce_(std::span(proj.data(), static_cast<size_t>(num_tokens * hidden)));
    if (!lw.post_mlp_norm.empty()) {
      cpu::rms_norm(proj.data(), lw.post_mlp_norm.data(), num_tokens, hidden, eps,
                    spec_.norm_style);
    }
    for (int64_t i = 0; i < num_tokens * hidden; ++i) x[i] += proj[i];
  }

  const auto num_rows = static_cast<int64_t>(batch.logit_rows.size());
  std::vector<float> rows(num_rows * hidden);  // [num_rows][hidden]
  for (int64_t r = 0; r < num_rows; ++r) {
    std::copy_n(x.data() + batch.logit_rows[r] * hidden, hidden, rows.data() + r * hidden);
  }
  cpu::rms_norm(rows.data(), weights_.final_norm.data(), num_rows, hidden, eps, spec_.norm_style);
  // tied: the embedding's rows of this rank's logits (all of them unless split)
  const quant::QuantMatrix head =
      weights_.lm_head.rows != 0
          ? weights_.lm_head
          : quant::slice_rows(weights_.embed, spec_.logit_begin, spec_.logits_per_row());
  quant::matmul(head, rows.data(), num_rows, hidden, logits.data(), spec_.logits_per_row(), pool_,
                precision);
  if (spec_.final_logit_softcap > 0.0f) {
    cpu::soft_cap(logits.data(), static_cast<int64_t>(logits.size()), spec_.final_logit_softcap);
  }
  return Status::ok();
}

}  // namespace kvp

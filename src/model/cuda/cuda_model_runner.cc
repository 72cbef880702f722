// CudaModelRunner (cuda_model_runner.h): weight upload, batch checks and staging, the per-layer
// launch sequence.
#include "model/cuda/cuda_model_runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backend/attention.h"
#include "backend/cuda/cuda_status.h"
#include "backend/cuda/kernels.h"
#include "common/dtype.h"
#include "common/parallel_memcpy.h"
#include "model/cuda/cublas_status.h"
#include "model/cuda/model_kernels.h"

namespace kvp::cuda {
namespace {

constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

// The head dim the attention kernels run: the model's, or the next of 64, 128, 256.
int32_t padded_head_dim_for(int32_t head_dim) {
  for (int32_t d : {64, 128, 256}) {
    if (head_dim <= d) return d;
  }
  return head_dim;  // > 256: refused by init
}

size_t align8(size_t n) { return (n + 7) & ~size_t{7}; }

int32_t next_pow2(int32_t n) {
  int32_t p = 1;
  while (p < n) p *= 2;
  return p;
}

std::vector<uint16_t> to_bf16_bits(std::span<const float> values) {
  std::vector<uint16_t> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = f32_to_bf16(values[i]).bits;
  return out;
}

Status upload(DeviceBuffer* dst, size_t offset_bytes, const void* src, size_t bytes) {
  return cuda_status(cudaMemcpy(static_cast<std::byte*>(dst->data()) + offset_bytes, src, bytes,
                                cudaMemcpyHostToDevice),
                     "cudaMemcpy (weights)");
}

// Reads name with `shape` as f32 and appends it, as bf16, at *offset_bytes of dst.
Status upload_bf16(const WeightSource& source, const std::string& name,
                   std::initializer_list<int64_t> shape, DeviceBuffer* dst, size_t* offset_bytes) {
  KVP_ASSIGN_OR_RETURN(std::vector<float> values,
                       source.read_f32(name, std::span(shape.begin(), shape.size())));
  const std::vector<uint16_t> bits = to_bf16_bits(values);
  KVP_RETURN_IF_ERROR(upload(dst, *offset_bytes, bits.data(), bits.size() * 2));
  *offset_bytes += bits.size() * 2;
  return Status::ok();
}

// Reads a norm vector; Gemma's (1 + w) is folded in so the kernels multiply by one vector.
Result<DeviceBuffer> upload_norm(const WeightSource& source, const std::string& name, int64_t dim,
                                 cpu::NormStyle style) {
  const int64_t shape[] = {dim};
  KVP_ASSIGN_OR_RETURN(std::vector<float> values, source.read_f32(name, shape));
  if (style == cpu::NormStyle::kOnePlusW) {
    for (float& v : values) v += 1.0f;
  }
  KVP_ASSIGN_OR_RETURN(DeviceBuffer buffer, DeviceBuffer::allocate(values.size() * 4));
  KVP_RETURN_IF_ERROR(upload(&buffer, 0, values.data(), values.size() * 4));
  return buffer;
}

Result<DeviceBuffer> upload_f32(std::span<const float> values) {
  KVP_ASSIGN_OR_RETURN(DeviceBuffer buffer, DeviceBuffer::allocate(values.size() * 4));
  KVP_RETURN_IF_ERROR(upload(&buffer, 0, values.data(), values.size() * 4));
  return buffer;
}

}  // namespace

CudaModelRunner::~CudaModelRunner() {
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  clear_graphs();
  if (cublas_ != nullptr) cublasDestroy(cublas_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

bool CudaModelRunner::group_is_sliding(int32_t group) const {
  return spec_.layer_is_sliding[group_layers_[group].front()];
}

Status CudaModelRunner::init(const ModelSpec& spec, int device) {
  KVP_RETURN_IF_ERROR(spec.validate());
  if (spec.is_moe()) KVP_RETURN_IF_ERROR(check_moe_supported(spec));
  if (spec.head_dim > 256 || spec.head_dim % 2 != 0) {
    return Status::unsupported("cuda model runner: head dim {} (even and at most 256)",
                               spec.head_dim);
  }
  if (!detail::row_kernels_support(spec.hidden_size)) {
    return Status::unsupported("cuda model runner: hidden size {} (a multiple of 4, at most 16384)",
                               spec.hidden_size);
  }
  spec_ = spec;
  device_ = device;
  padded_head_dim_ = padded_head_dim_for(spec.head_dim);
  const char* graphs = std::getenv("KVP_CUDA_GRAPHS");
  graphs_enabled_ = graphs == nullptr || std::string(graphs) != "0";
  // "0": cuBLAS for every product; "plain": the skinny product launched without dependence
  const char* skinny = std::getenv("KVP_SKINNY_GEMM");
  skinny_gemm_ = skinny == nullptr || std::string(skinny) != "0";
  skinny_launch_.dependent = skinny == nullptr || std::string(skinny) != "plain";
  // MoE steps (moe_gemm.h): "kernels" never uses GEMMs, "loop" one cuBLAS call per expert; from
  // KVP_MOE_GEMM_MIN_TOKENS tokens a step, decode too (default 16, measured against 4, 32 and 64
  // on an H200: docs/perf/model-cuda.md, "Decode steps of 16+ sequences")
  if (spec.is_moe()) {
    const char* mode = std::getenv("KVP_MOE_GEMM");
    const std::string m = mode == nullptr ? "" : mode;
    moe_gemm_mode_ = m == "kernels" || m == "0" ? MoeGemmMode::kKernels
                     : m == "loop"              ? MoeGemmMode::kLoop
                                                : MoeGemmMode::kGrouped;
    const char* min_tokens = std::getenv("KVP_MOE_GEMM_MIN_TOKENS");
    moe_gemm_min_tokens_ = 16;
    if (min_tokens != nullptr && std::atoi(min_tokens) > 0) {
      moe_gemm_min_tokens_ = std::atoi(min_tokens);
    }
  }
  KVP_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  KVP_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  KVP_RETURN_IF_ERROR(cublas_status(cublasCreate(&cublas_), "cublasCreate"));
  KVP_RETURN_IF_ERROR(cublas_status(cublasSetStream(cublas_, stream_), "cublasSetStream"));
  KVP_ASSIGN_OR_RETURN(cublas_workspace_, DeviceBuffer::allocate(kCublasWorkspaceBytes));
  KVP_RETURN_IF_ERROR(
      cublas_status(cublasSetWorkspace(cublas_, cublas_workspace_.data(), kCublasWorkspaceBytes),
                    "cublasSetWorkspace"));

  CacheGroups groups = assign_cache_groups(spec_);  // as the CPU runner's
  group_layers_ = std::move(groups.group_layers);
  layer_group_ = std::move(groups.layer_group);
  layer_slot_ = std::move(groups.layer_slot);
  KVP_ASSIGN_OR_RETURN(inv_freq_global_,
                       upload_f32(rope_inverse_frequencies(spec_, spec_.rope_global)));
  KVP_ASSIGN_OR_RETURN(inv_freq_local_,
                       upload_f32(rope_inverse_frequencies(spec_, spec_.rope_local)));
  layers_.resize(spec_.num_layers);
  return Status::ok();
}

Result<std::unique_ptr<CudaModelRunner>> CudaModelRunner::load(const ModelSpec& spec,
                                                               const WeightSource& source,
                                                               const LoadProgress& progress,
                                                               int device) {
  std::unique_ptr<CudaModelRunner> r(new CudaModelRunner());
  KVP_RETURN_IF_ERROR(r->init(spec, device));
  const int64_t hidden = spec.hidden_size, head_dim = spec.head_dim, dp = r->padded_head_dim_;
  const int64_t q_dim = int64_t{spec.num_q_heads} * head_dim;
  const int64_t kv_dim = int64_t{spec.num_kv_heads} * head_dim;
  const int64_t inter = spec.intermediate_size;
  const cpu::NormStyle style = spec.norm_style;
  size_t offset = 0;
  KVP_ASSIGN_OR_RETURN(r->embed_, DeviceBuffer::allocate(spec.vocab_size * hidden * 2));
  KVP_RETURN_IF_ERROR(upload_bf16(source, "model.embed_tokens.weight", {spec.vocab_size, hidden},
                                  &r->embed_, &offset));
  KVP_ASSIGN_OR_RETURN(r->final_norm_, upload_norm(source, "model.norm.weight", hidden, style));
  if (!spec.tie_word_embeddings || source.contains("lm_head.weight")) {
    // split: this rank's vocabulary rows (shard_spec; the source gives only those)
    const int64_t head_rows = spec.logits_per_row();
    KVP_ASSIGN_OR_RETURN(r->lm_head_, DeviceBuffer::allocate(head_rows * hidden * 2));
    offset = 0;
    KVP_RETURN_IF_ERROR(
        upload_bf16(source, "lm_head.weight", {head_rows, hidden}, &r->lm_head_, &offset));
  }
  for (int32_t l = 0; l < spec.num_layers; ++l) {
    if (progress) progress(l, spec.num_layers);
    DeviceLayerWeights& lw = r->layers_[l];
    const std::string p = fmt::format("model.layers.{}.", l);
    KVP_ASSIGN_OR_RETURN(lw.attn_norm,
                         upload_norm(source, p + "input_layernorm.weight", hidden, style));
    KVP_ASSIGN_OR_RETURN(lw.qkv, DeviceBuffer::allocate((q_dim + 2 * kv_dim) * hidden * 2));
    offset = 0;
    KVP_RETURN_IF_ERROR(
        upload_bf16(source, p + "self_attn.q_proj.weight", {q_dim, hidden}, &lw.qkv, &offset));
    KVP_RETURN_IF_ERROR(
        upload_bf16(source, p + "self_attn.k_proj.weight", {kv_dim, hidden}, &lw.qkv, &offset));
    KVP_RETURN_IF_ERROR(
        upload_bf16(source, p + "self_attn.v_proj.weight", {kv_dim, hidden}, &lw.qkv, &offset));
    if (spec.qkv_bias) {
      std::vector<float> bias;
      for (const auto& [name, dim] :
           {std::pair{"q_proj", q_dim}, std::pair{"k_proj", kv_dim}, std::pair{"v_proj", kv_dim}}) {
        const int64_t shape[] = {dim};
        KVP_ASSIGN_OR_RETURN(std::vector<float> part,
                             source.read_f32(p + "self_attn." + name + ".bias", shape));
        bias.insert(bias.end(), part.begin(), part.end());
      }
      KVP_ASSIGN_OR_RETURN(lw.qkv_bias, upload_f32(bias));
    }
    if (spec.qk_norm) {
      // q/k norms use the model's norm style too (Gemma: 1 + w)
      KVP_ASSIGN_OR_RETURN(lw.q_norm,
                           upload_norm(source, p + "self_attn.q_norm.weight", head_dim, style));
      KVP_ASSIGN_OR_RETURN(lw.k_norm,
                           upload_norm(source, p + "self_attn.k_norm.weight", head_dim, style));
    }
    {
      // o: [hidden][q_heads * head_dim] → [hidden][q_heads * padded_head_dim] with zero columns
      const int64_t shape[] = {hidden, q_dim};
      KVP_ASSIGN_OR_RETURN(std::vector<float> o,
                           source.read_f32(p + "self_attn.o_proj.weight", shape));
      const int64_t padded_cols = int64_t{spec.num_q_heads} * dp;
      std::vector<uint16_t> bits(static_cast<size_t>(hidden * padded_cols), 0);
      for (int64_t row = 0; row < hidden; ++row) {
        for (int64_t h = 0; h < spec.num_q_heads; ++h) {
          for (int64_t d = 0; d < head_dim; ++d) {
            bits[row * padded_cols + h * dp + d] =
                f32_to_bf16(o[row * q_dim + h * head_dim + d]).bits;
          }
        }
      }
      KVP_ASSIGN_OR_RETURN(lw.o, DeviceBuffer::allocate(bits.size() * 2));
      KVP_RETURN_IF_ERROR(upload(&lw.o, 0, bits.data(), bits.size() * 2));
    }
    if (spec.o_bias) {
      const int64_t shape[] = {hidden};
      KVP_ASSIGN_OR_RETURN(std::vector<float> bias,
                           source.read_f32(p + "self_attn.o_proj.bias", shape));
      KVP_ASSIGN_OR_RETURN(lw.o_bias, upload_f32(bias));
    }
    if (spec.attention_sinks) {
      const int64_t shape[] = {spec.num_q_heads};
      KVP_ASSIGN_OR_RETURN(std::vector<float> sinks, source.read_f32(p + "self_attn.sinks", shape));
      KVP_ASSIGN_OR_RETURN(lw.sinks, upload_f32(sinks));
    }
    if (spec.sandwich_norms) {
      KVP_ASSIGN_OR_RETURN(
          lw.post_attn_norm,
          upload_norm(source, p + "post_attention_layernorm.weight", hidden, style));
      KVP_ASSIGN_OR_RETURN(
          lw.mlp_norm, upload_norm(source, p + "pre_feedforward_layernorm.weight", hidden, style));
      KVP_ASSIGN_OR_RETURN(
          lw.post_mlp_norm,
          upload_norm(source, p + "post_feedforward_layernorm.weight", hidden, style));
    } else {
      KVP_ASSIGN_OR_RETURN(
          lw.mlp_norm, upload_norm(source, p + "post_attention_layernorm.weight", hidden, style));
    }
    if (spec.layer_moe(l)) {
      KVP_RETURN_IF_ERROR(load_moe_weights(spec, source, l, &lw.moe, &lw.gate_up, &lw.down));
      continue;
    }
    KVP_ASSIGN_OR_RETURN(lw.gate_up, DeviceBuffer::allocate(2 * inter * hidden * 2));
    offset = 0;
    KVP_RETURN_IF_ERROR(
        upload_bf16(source, p + "mlp.gate_proj.weight", {inter, hidden}, &lw.gate_up, &offset));
    KVP_RETURN_IF_ERROR(
        upload_bf16(source, p + "mlp.up_proj.weight", {inter, hidden}, &lw.gate_up, &offset));
    KVP_ASSIGN_OR_RETURN(lw.down, DeviceBuffer::allocate(hidden * inter * 2));
    offset = 0;
    KVP_RETURN_IF_ERROR(
        upload_bf16(source, p + "mlp.down_proj.weight", {hidden, inter}, &lw.down, &offset));
  }
  if (progress) progress(spec.num_layers, spec.num_layers);
  r->weight_bytes_ = r->count_weight_bytes();
  return r;
}

Result<std::unique_ptr<CudaModelRunner>> CudaModelRunner::random(const ModelSpec& spec,
                                                                 uint64_t seed, int device,
                                                                 TensorShard shard) {
  std::unique_ptr<CudaModelRunner> r(new CudaModelRunner());
  KVP_RETURN_IF_ERROR(check_tensor_parallel(spec, shard.size));
  KVP_RETURN_IF_ERROR(r->init(shard_spec(spec, shard), device));
  // Every matrix is a share of the unsplit model's: parts of rows [row0, row0 + rows) and
  // columns [col0, col0 + cols) of a whole [*][full_cols] matrix, filled as the whole would be.
  const int64_t hidden = spec.hidden_size, dp = r->padded_head_dim_, hd = spec.head_dim;
  const int64_t n = shard.size, rank = shard.rank;
  const int64_t q_rows = spec.num_q_heads * hd, kv_rows = spec.num_kv_heads * hd;
  const int64_t inter = spec.intermediate_size;
  uint64_t stream_seed = seed;
  const auto random_matrix = [&](int64_t full_cols, std::initializer_list<RandomRect> parts,
                                 DeviceBuffer* out) {
    return fill_random_rects(out, full_cols, std::span(parts.begin(), parts.size()), stream_seed++,
                             r->stream_);
  };
  const std::vector<float> ones(static_cast<size_t>(std::max<int64_t>(hidden, hd)), 1.0f);
  const auto ones_of = [&](int64_t dim) {
    return upload_f32(std::span(ones).first(static_cast<size_t>(dim)));
  };
  KVP_RETURN_IF_ERROR(random_matrix(hidden, {{0, spec.vocab_size, 0, hidden}}, &r->embed_));
  if (!spec.tie_word_embeddings) {
    const ModelSpec& local = r->spec_;  // split: this rank's vocabulary rows
    KVP_RETURN_IF_ERROR(random_matrix(
        hidden, {{local.logit_begin, local.logits_per_row(), 0, hidden}}, &r->lm_head_));
  }
  KVP_ASSIGN_OR_RETURN(r->final_norm_, ones_of(hidden));
  const int64_t q_share = q_rows / n, kv_share = kv_rows / n, inter_share = inter / n;
  const int64_t o_cols = spec.num_q_heads * dp, o_share = o_cols / n;
  for (int32_t l = 0; l < spec.num_layers; ++l) {
    DeviceLayerWeights& lw = r->layers_[l];
    KVP_ASSIGN_OR_RETURN(lw.attn_norm, ones_of(hidden));
    KVP_ASSIGN_OR_RETURN(lw.mlp_norm, ones_of(hidden));
    KVP_RETURN_IF_ERROR(random_matrix(hidden,
                                      {{rank * q_share, q_share, 0, hidden},
                                       {q_rows + rank * kv_share, kv_share, 0, hidden},
                                       {q_rows + kv_rows + rank * kv_share, kv_share, 0, hidden}},
                                      &lw.qkv));
    // pad columns of o meet only zero attention lanes (v's pad lanes are zero): any value works
    KVP_RETURN_IF_ERROR(random_matrix(o_cols, {{0, hidden, rank * o_share, o_share}}, &lw.o));
    if (spec.layer_moe(l)) {
      KVP_RETURN_IF_ERROR(random_moe_weights(spec, shard, &stream_seed, r->stream_, &lw.moe,
                                             &lw.gate_up, &lw.down));
    } else {
      KVP_RETURN_IF_ERROR(random_matrix(hidden,
                                        {{rank * inter_share, inter_share, 0, hidden},
                                         {inter + rank * inter_share, inter_share, 0, hidden}},
                                        &lw.gate_up));
      KVP_RETURN_IF_ERROR(
          random_matrix(inter, {{0, hidden, rank * inter_share, inter_share}}, &lw.down));
    }
    if (spec.qkv_bias) {
      KVP_ASSIGN_OR_RETURN(lw.qkv_bias,
                           upload_f32(std::vector<float>((q_rows + 2 * kv_rows) / n, 0.0f)));
    }
    // GPT-OSS: zero biases and sinks (a sink of 0 still joins every softmax), so a benchmark
    // launches what the real model does
    if (spec.o_bias) {
      KVP_ASSIGN_OR_RETURN(lw.o_bias, upload_f32(std::vector<float>(hidden, 0.0f)));
    }
    if (spec.attention_sinks) {
      KVP_ASSIGN_OR_RETURN(lw.sinks, upload_f32(std::vector<float>(spec.num_q_heads / n, 0.0f)));
    }
    if (spec.qk_norm) {
      KVP_ASSIGN_OR_RETURN(lw.q_norm, ones_of(hd));
      KVP_ASSIGN_OR_RETURN(lw.k_norm, ones_of(hd));
    }
    if (spec.sandwich_norms) {
      KVP_ASSIGN_OR_RETURN(lw.post_attn_norm, ones_of(hidden));
      KVP_ASSIGN_OR_RETURN(lw.post_mlp_norm, ones_of(hidden));
    }
  }
  KVP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(r->stream_));
  r->weight_bytes_ = r->count_weight_bytes();
  return r;
}

size_t CudaModelRunner::count_weight_bytes() const {
  size_t bytes = embed_.size_bytes() + lm_head_.size_bytes() + final_norm_.size_bytes();
  for (const DeviceLayerWeights& lw : layers_) {
    for (const DeviceBuffer* b :
         {&lw.attn_norm, &lw.qkv, &lw.qkv_bias, &lw.q_norm, &lw.k_norm, &lw.o, &lw.o_bias,
          &lw.sinks, &lw.post_attn_norm, &lw.mlp_norm, &lw.gate_up, &lw.down, &lw.post_mlp_norm}) {
      bytes += b->size_bytes();
    }
    bytes += lw.moe.size_bytes();
  }
  return bytes;
}

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

Status CudaModelRunner::reserve(int64_t num_tokens, int64_t num_rows, size_t meta_bytes) {
  if (meta_host_.size_bytes() < meta_bytes) {
    KVP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    clear_graphs();  // graphs hold the old buffers' addresses
    KVP_ASSIGN_OR_RETURN(meta_host_, PinnedBuffer::allocate(2 * meta_bytes));
    KVP_ASSIGN_OR_RETURN(meta_device_, DeviceBuffer::allocate(2 * meta_bytes));
  }
  const int64_t hidden = spec_.hidden_size;
  // dense MLPs and (Qwen2-MoE) shared experts share xn_ and gate_up_
  const int64_t inter = std::max(spec_.intermediate_size, spec_.shared_expert_intermediate_size);
  const int64_t dp = padded_head_dim_;
  if (num_tokens > token_capacity_) {
    KVP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    clear_graphs();  // graphs hold the old buffers' addresses
    const int64_t t = std::max<int64_t>(num_tokens, 16);
    const int64_t qkv_dim = int64_t{spec_.num_q_heads + 2 * spec_.num_kv_heads} * spec_.head_dim;
    KVP_ASSIGN_OR_RETURN(x_, DeviceBuffer::allocate(t * hidden * 4));
    KVP_ASSIGN_OR_RETURN(xn_, DeviceBuffer::allocate(t * std::max(hidden, inter) * 2));
    KVP_ASSIGN_OR_RETURN(qkv_, DeviceBuffer::allocate(t * qkv_dim * 4));
    KVP_ASSIGN_OR_RETURN(q_, DeviceBuffer::allocate(t * spec_.num_q_heads * dp * 2));
    KVP_ASSIGN_OR_RETURN(k_, DeviceBuffer::allocate(t * spec_.num_kv_heads * dp * 2));
    KVP_ASSIGN_OR_RETURN(v_, DeviceBuffer::allocate(t * spec_.num_kv_heads * dp * 2));
    KVP_ASSIGN_OR_RETURN(attn_, DeviceBuffer::allocate(t * spec_.num_q_heads * dp * 2));
    KVP_ASSIGN_OR_RETURN(attn_bf16_, DeviceBuffer::allocate(t * spec_.num_q_heads * dp * 2));
    KVP_ASSIGN_OR_RETURN(proj_, DeviceBuffer::allocate(t * hidden * 4));
    KVP_ASSIGN_OR_RETURN(gate_up_, DeviceBuffer::allocate(t * 2 * inter * 2));
    if (spec_.is_moe()) KVP_RETURN_IF_ERROR(moe_buffers_.allocate(spec_, t));
    token_capacity_ = t;
  }
  if (num_rows > row_capacity_) {
    KVP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    clear_graphs();  // graphs hold the old buffers' addresses
    const int64_t r = std::max<int64_t>(num_rows, 8);
    KVP_ASSIGN_OR_RETURN(logits_, DeviceBuffer::allocate(r * spec_.logits_per_row() * 4));
    KVP_ASSIGN_OR_RETURN(logits_host_, PinnedBuffer::allocate(r * spec_.logits_per_row() * 4));
    KVP_ASSIGN_OR_RETURN(summaries_, DeviceBuffer::allocate(r * sizeof(detail::RowSummary)));
    KVP_ASSIGN_OR_RETURN(summaries_host_, PinnedBuffer::allocate(r * sizeof(detail::RowSummary)));
    row_capacity_ = r;
  }
  return Status::ok();
}

Status CudaModelRunner::gemm(const void* x, const void* w, void* y, bool y_f32, int64_t rows,
                             int64_t in, int64_t out, const char* what) {
  if (skinny_gemm_ && detail::skinny_gemm_fits(x, w, rows, in, out)) {
    return cuda_status(
        detail::launch_skinny_gemm(x, w, y, y_f32, rows, in, out, stream_, skinny_launch_), what);
  }
  // row-major y[rows][out] = x[rows][in] · w[out][in]ᵀ is column-major yᵀ = wᵀ(op T) · xᵀ
  const float alpha = 1.0f, beta = 0.0f;
  return cublas_status(
      cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(out), static_cast<int>(rows),
                   static_cast<int>(in), &alpha, w, CUDA_R_16BF, static_cast<int>(in), x,
                   CUDA_R_16BF, static_cast<int>(in), &beta, y, y_f32 ? CUDA_R_32F : CUDA_R_16BF,
                   static_cast<int>(out), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      what);
}

Status CudaModelRunner::forward(const ForwardBatch& batch, std::span<DeviceKvPool> pools,
                                std::span<float> logits) {
  return run(batch, pools, nullptr, logits, {});
}

Status CudaModelRunner::forward_summarized(const ForwardBatch& batch, std::span<DeviceKvPool> pools,
                                           std::span<const int32_t> full_rows,
                                           std::span<float> logits,
                                           std::span<LogitRowSummary> summaries) {
  return run(batch, pools, &full_rows, logits, summaries);
}

Status CudaModelRunner::forward_into_rows(const ForwardBatch& batch, std::span<DeviceKvPool> pools,
                                          std::span<const int32_t> full_rows,
                                          std::span<float> logits, size_t row_stride,
                                          std::span<LogitRowSummary> summaries) {
  return run(batch, pools, summaries.empty() ? nullptr : &full_rows, logits, summaries, nullptr, {},
             row_stride);
}

Status CudaModelRunner::forward_sampled(const ForwardBatch& batch, std::span<DeviceKvPool> pools,
                                        std::span<const int32_t> full_rows, std::span<float> logits,
                                        std::span<LogitRowSummary> summaries,
                                        const DeviceSampleBatch& samples,
                                        std::span<DeviceSample> results) {
  return run(batch, pools, &full_rows, logits, summaries, &samples, results);
}

Status CudaModelRunner::run(const ForwardBatch& batch, std::span<DeviceKvPool> pools,
                            const std::span<const int32_t>* full_rows, std::span<float> logits,
                            std::span<LogitRowSummary> summaries, const DeviceSampleBatch* samples,
                            std::span<DeviceSample> results, size_t row_stride) {
  KVP_RETURN_IF_ERROR(check_batch(batch, pools, full_rows, logits, summaries.size(), row_stride));
  const bool sampling = samples != nullptr && !samples->requests.empty();
  if (sampling && spec_.logit_count > 0) {
    return Status::unsupported(
        "cuda forward: a rank of a split model holds {} of {} logits and "
        "samples none",
        spec_.logit_count, spec_.vocab_size);
  }
  if (sampling) {
    KVP_RETURN_IF_ERROR(DeviceSampler::check(
        *samples, static_cast<int32_t>(batch.logit_rows.size()), spec_.vocab_size, results.size()));
  }
  KVP_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  const auto num_tokens = static_cast<int32_t>(batch.token_ids.size());
  const auto num_seqs = static_cast<int32_t>(batch.kv_lens.size());
  const auto num_rows = static_cast<int32_t>(batch.logit_rows.size());
  const int32_t num_groups = num_cache_groups();
  if (num_tokens == 0) return Status::ok();

  StepShape shape;
  for (int32_t s = 0; s < num_seqs; ++s) {
    shape.max_q_len = std::max(shape.max_q_len, batch.query_start[s + 1] - batch.query_start[s]);
    shape.max_kv_len = std::max(shape.max_kv_len, batch.kv_lens[s]);
  }
  // Decode-only batches run as CUDA graphs, keyed by a padded shape: sequences, logit rows and
  // block-table width rounded up to powers of two, max_kv_len to a power of two (an upper bound
  // is all the attention kernels need). Padding sequences bring token 0 with kv_len 1, a
  // skipped slot (-1) and block 0: their rows are computed and dropped.
  // a step ordered after copies layer by layer runs eagerly (a graph would wait for them whole),
  // as does one whose experts run as GEMMs (they read the expert counts on the host)
  const bool use_graph = graphs_enabled_ && shape.max_q_len == 1 && !layer_waits_pending_ &&
                         !moe_step_takes_gemms(num_tokens);
  shape.num_seqs = use_graph ? next_pow2(num_seqs) : num_seqs;
  shape.num_tokens = use_graph ? shape.num_seqs : num_tokens;
  shape.num_rows = use_graph ? next_pow2(std::max(num_rows, 1)) : num_rows;
  if (use_graph) shape.max_kv_len = next_pow2(std::max(shape.max_kv_len, 64));
  shape.kv_dtype = pools[0].layout().dtype;

  // metadata staging: int32 [tokens | positions | query_start | kv_lens | logit_rows |
  // block tables of each group], then (8-aligned) int64 slot mappings of each group
  size_t n32 =
      2 * size_t(shape.num_tokens) + (shape.num_seqs + 1) + shape.num_seqs + shape.num_rows;
  for (int32_t g = 0; g < num_groups; ++g) {
    const int32_t width = batch.groups[g].max_blocks_per_seq;
    shape.max_blocks[g] = use_graph ? next_pow2(std::max(width, 1)) : width;
    shape.table_offset[g] = n32;
    n32 += size_t(shape.num_seqs) * shape.max_blocks[g];
  }
  shape.bytes = align8(n32 * 4);
  for (int32_t g = 0; g < num_groups; ++g) {
    shape.slot_offset[g] = shape.bytes;
    shape.bytes += size_t(shape.num_tokens) * 8;
  }
  Status prepared = reserve(shape.num_tokens, shape.num_rows, shape.bytes);
  if (prepared.is_ok()) prepared = reserve_attention_workspace(shape, pools);
  if (prepared.is_ok() && sampling)
    prepared = sampler_.reserve(*samples, spec_.vocab_size, stream_);
  // an earlier call that failed midway may still be reading the staging buffer
  if (prepared.is_ok()) {
    prepared = cuda_status(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }
  if (gate_ && !gate_(prepared.is_ok()) && prepared.is_ok()) {
    return Status::internal("cuda forward: another GPU of the split model failed this step");
  }
  KVP_RETURN_IF_ERROR(prepared);

  std::byte* base = meta_host_.as<std::byte>();
  std::memset(base, 0, shape.bytes);
  int32_t* h32 = meta_host_.as<int32_t>();
  {
    int32_t* positions = h32 + shape.num_tokens;
    std::memcpy(h32, batch.token_ids.data(), size_t(num_tokens) * 4);
    for (int32_t s = 0; s < num_seqs; ++s) {
      const int32_t q_len = batch.query_start[s + 1] - batch.query_start[s];
      for (int32_t t = 0; t < q_len; ++t) {
        positions[batch.query_start[s] + t] = batch.kv_lens[s] - q_len + t;
      }
    }
    int32_t* query_start = h32 + 2 * shape.num_tokens;
    std::memcpy(query_start, batch.query_start.data(), size_t(num_seqs + 1) * 4);
    int32_t* kv_lens = query_start + shape.num_seqs + 1;
    std::memcpy(kv_lens, batch.kv_lens.data(), size_t(num_seqs) * 4);
    for (int32_t s = num_seqs; s < shape.num_seqs; ++s) {  // padding sequences (graphs only)
      query_start[s + 1] = query_start[s] + 1;
      kv_lens[s] = 1;
    }
    std::memcpy(kv_lens + shape.num_seqs, batch.logit_rows.data(), size_t(num_rows) * 4);
    for (int32_t g = 0; g < num_groups; ++g) {
      const ForwardBatch::Group& group = batch.groups[g];
      for (int32_t s = 0; s < num_seqs; ++s) {
        std::memcpy(h32 + shape.table_offset[g] + size_t(s) * shape.max_blocks[g],
                    group.block_tables.data() + size_t(s) * group.max_blocks_per_seq,
                    size_t(group.max_blocks_per_seq) * 4);
      }
      auto* slots = reinterpret_cast<int64_t*>(base + shape.slot_offset[g]);
      std::memcpy(slots, group.slot_mapping.data(), size_t(num_tokens) * 8);
      for (int32_t t = num_tokens; t < shape.num_tokens; ++t) slots[t] = -1;
    }
  }

  if (!use_graph) {
    KVP_RETURN_IF_ERROR(enqueue_step(shape, pools));
    KVP_RETURN_IF_ERROR(flush_layer_waits());  // layers the step did not reach (an error)
  } else {
    KVP_RETURN_IF_ERROR(flush_layer_waits());  // a graph waits for nothing inside it
    GraphKey key;
    key.num_seqs = shape.num_seqs;
    key.num_rows = shape.num_rows;
    key.max_kv_len = shape.max_kv_len;
    key.kv_dtype = shape.kv_dtype;
    for (int32_t g = 0; g < num_groups; ++g) {
      key.max_blocks[g] = shape.max_blocks[g];
      key.slab[g] = pools[g].slab();
      key.num_blocks[g] = pools[g].layout().num_blocks;
      key.block_size[g] = pools[g].layout().block_size;
    }
    auto it = std::find_if(graphs_.begin(), graphs_.end(),
                           [&](const GraphEntry& e) { return e.key == key; });
    bool replay = it != graphs_.end() && it->exec != nullptr;
    // split: a graph replays only where every rank has one (a rank whose capture failed runs
    // eagerly, meeting the others before each all-reduce, which graphs do not)
    if (gate_) replay = gate_(replay);
    if (replay) {
      KVP_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(it->exec, stream_));
    } else {
      // first time: run eagerly (which sizes every buffer and the attention workspace), then
      // capture the same launches for the next steps of this shape
      const bool known = it != graphs_.end();
      const void* workspace_before = attention_workspace_.data();
      KVP_RETURN_IF_ERROR(enqueue_step(shape, pools));
      KVP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
      if (attention_workspace_.data() != workspace_before) clear_graphs();
      if (!known || graphs_.empty()) {
        if (graphs_.size() >= kMaxGraphs) clear_graphs();
        capture(shape, pools, key);
      }
    }
  }
  // Sampled rows: drawn from the step's logits where they are (the stream was synchronized
  // before the step, so the sampler's staging is free).
  if (sampling) {
    KVP_RETURN_IF_ERROR(
        sampler_.enqueue(logits_.as<const float>(), spec_.vocab_size, *samples, stream_));
  }
  // The logits rows the caller wants, packed into the pinned staging buffer (the step left the
  // rows' summaries there already).
  const size_t row_bytes = size_t(spec_.logits_per_row()) * 4;
  if (full_rows == nullptr || full_rows->size() == size_t(num_rows)) {
    if (num_rows > 0) {
      KVP_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(logits_host_.data(), logits_.data(),
                                               num_rows * row_bytes, cudaMemcpyDeviceToHost,
                                               stream_));
    }
  } else {
    for (size_t i = 0; i < full_rows->size(); ++i) {
      KVP_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(logits_host_.as<std::byte>() + i * row_bytes,
                          logits_.as<const std::byte>() + size_t((*full_rows)[i]) * row_bytes,
                          row_bytes, cudaMemcpyDeviceToHost, stream_));
    }
  }
  KVP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  if (!logits.empty()) {
    copy_logits_out(logits, full_rows == nullptr ? size_t(num_rows) : full_rows->size(),
                    row_stride);
  }
  static_assert(sizeof(detail::RowSummary) == sizeof(LogitRowSummary));
  if (!summaries.empty()) {
    std::memcpy(summaries.data(), summaries_host_.data(),
                summaries.size() * sizeof(LogitRowSummary));
  }
  if (sampling) sampler_.read_results(results);
  return Status::ok();
}

Status CudaModelRunner::reserve_attention_workspace(const StepShape& shape,
                                                    std::span<DeviceKvPool> pools) {
  size_t bytes = 0;
  for (int32_t g = 0; g < num_cache_groups(); ++g) {
    AttentionParams params;
    params.num_q_heads = spec_.num_q_heads;
    params.scale = spec_.attention_scale;
    params.soft_cap = spec_.attn_logit_softcap;
    params.window = group_is_sliding(g) ? spec_.sliding_window : 0;
    AttentionBatch ab;
    ab.num_seqs = shape.num_seqs;
    ab.num_tokens = shape.num_tokens;
    ab.max_blocks_per_seq = shape.max_blocks[g];
    ab.max_q_len = shape.max_q_len;
    ab.max_kv_len = shape.max_kv_len;
    bytes = std::max(bytes, attention_workspace_bytes(params, ab, pools[g].layer(0)));
  }
  const void* before = attention_workspace_.data();
  KVP_RETURN_IF_ERROR(attention_workspace_.reserve(bytes));
  if (attention_workspace_.data() != before) clear_graphs();  // graphs hold its address
  return Status::ok();
}

Status CudaModelRunner::all_reduce(void* data, int64_t count) {
  if (nccl_ == nullptr) return Status::ok();
  return meet_around([&] {
    return peer_ != nullptr && count <= peer_->capacity()
               ? peer_->run(rank_, static_cast<float*>(data), count, stream_)
               : nccl_->all_reduce_sum(static_cast<float*>(data), count, comm_, stream_);
  });
}

Status CudaModelRunner::meet_around(const std::function<Status()>& launch) {
  // Launched eagerly (not captured), every rank first drains its stream and meets the others,
  // then launches its all-reduce and waits for it: CUDA loads a kernel lazily, at its first
  // launch, and waits for the device to idle while loading (under a process-wide lock, it
  // seems); a rank loading a kernel while its own all-reduce kernel waited for a peer blocked
  // the peer's launches — both hung (the 8B shape's first prefill on 2 H200s, NCCL or not).
  // So no kernel but the all-reduce is launched while one may be waiting. Costs two
  // synchronisations per all-reduce of eager steps (prefill); graph replays load nothing.
  const bool eager = !capturing_ && gate_;
  if (eager) {
    const Status drained = cuda_status(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    if (!gate_(drained.is_ok()) && drained.is_ok()) {
      return Status::internal("cuda forward: another GPU of the split model failed this step");
    }
    KVP_RETURN_IF_ERROR(drained);
  }
  KVP_RETURN_IF_ERROR(launch());
  if (eager) KVP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return Status::ok();
}

Status CudaModelRunner::reduce_residual_norm(const float* post_w, const float* next_w,
                                             int32_t num_tokens, float eps) {
  const int64_t count = int64_t{num_tokens} * spec_.hidden_size;
  const auto norm = [&](const detail::PeerAllReduceArgs* reduce) {
    return cuda_status(
        detail::launch_residual_norm(x_.as<float>(), proj_.as<float>(), post_w, next_w, num_tokens,
                                     spec_.hidden_size, eps, xn_.data(), stream_, reduce),
        "residual_norm_kernel");
  };
  if (nccl_ != nullptr && peer_ != nullptr && count <= peer_->capacity()) {
    const detail::PeerAllReduceArgs reduce = peer_->row_args(rank_);
    return meet_around([&] { return norm(&reduce); });
  }
  KVP_RETURN_IF_ERROR(all_reduce(proj_.data(), count));
  return norm(nullptr);
}

void CudaModelRunner::copy_logits_out(std::span<float> logits, size_t num_rows,
                                      size_t row_stride) const {
  // 64 x a 128K vocabulary is 33 MB: several threads (common/parallel_memcpy.h)
  const size_t row_bytes = size_t(spec_.logits_per_row()) * 4;
  if (row_stride == 0) {
    parallel_memcpy(logits.data(), logits_host_.data(), num_rows * row_bytes);
  } else {
    parallel_memcpy_2d(logits.data(), row_stride * 4, logits_host_.data(), row_bytes, row_bytes,
                       num_rows, 8);
  }
}

void CudaModelRunner::capture(const StepShape& shape, std::span<DeviceKvPool> pools,
                              const GraphKey& key) {
  GraphEntry entry;
  entry.key = key;
  if (cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal) == cudaSuccess) {
    capturing_ = true;
    const Status enqueued = enqueue_step(shape, pools);
    capturing_ = false;
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
    if (enqueued.is_ok() && ended == cudaSuccess && graph != nullptr &&
        cudaGraphInstantiate(&entry.exec, graph, 0) != cudaSuccess) {
      entry.exec = nullptr;
    }
    if (graph != nullptr) cudaGraphDestroy(graph);
  }
  // a failed capture is a missed optimisation, not an error: this shape stays eager (exec null)
  cudaGetLastError();
  graphs_.push_back(entry);
}

void CudaModelRunner::clear_graphs() {
  for (GraphEntry& e : graphs_) {
    if (e.exec != nullptr) cudaGraphExecDestroy(e.exec);
  }
  graphs_.clear();
}

Status CudaModelRunner::enqueue_step(const StepShape& shape, std::span<DeviceKvPool> pools) {
  const int64_t num_tokens = shape.num_tokens, num_rows = shape.num_rows;
  const int32_t num_seqs = shape.num_seqs;
  const std::array<size_t, 2>& slot_offset = shape.slot_offset;
  const std::array<size_t, 2>& table_offset = shape.table_offset;
  const int32_t max_q_len = shape.max_q_len, max_kv_len = shape.max_kv_len;
  KVP_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(meta_device_.data(), meta_host_.data(), shape.bytes,
                                           cudaMemcpyHostToDevice, stream_));
  const int32_t* d32 = meta_device_.as<const int32_t>();
  const int32_t* d_tokens = d32;
  const int32_t* d_positions = d32 + num_tokens;
  const int32_t* d_query_start = d32 + 2 * num_tokens;
  const int32_t* d_kv_lens = d_query_start + num_seqs + 1;
  const int32_t* d_logit_rows = d_kv_lens + num_seqs;

  const int64_t hidden = spec_.hidden_size, inter = spec_.intermediate_size;
  const int64_t dp = padded_head_dim_;
  const int64_t qkv_dim = int64_t{spec_.num_q_heads + 2 * spec_.num_kv_heads} * spec_.head_dim;
  const float eps = spec_.rms_norm_eps;
  const DType kv_dtype = shape.kv_dtype;
  // q, the new K/V rows and the attention output: bf16, or f16 with an f16 pool
  const DType act_dtype = kv_dtype == DType::F16 ? DType::F16 : DType::BF16;
  const auto T = static_cast<int32_t>(num_tokens);

  KVP_RETURN_IF_ERROR(
      cuda_status(detail::launch_embed(embed_.data(), d_tokens, T, spec_.hidden_size,
                                       spec_.embedding_scale, x_.as<float>(), stream_),
                  "embed_kernel"));
  KVP_RETURN_IF_ERROR(cuda_status(
      detail::launch_rms_norm_rows(x_.as<float>(), nullptr, T, spec_.hidden_size,
                                   layers_[0].attn_norm.as<float>(), eps, xn_.data(), stream_),
      "rms_norm_rows_kernel"));
  for (int32_t l = 0; l < spec_.num_layers; ++l) {
    const DeviceLayerWeights& lw = layers_[l];
    const int32_t g = layer_group_[l];
    const bool sliding = spec_.layer_is_sliding[l];
    KVP_RETURN_IF_ERROR(
        gemm(xn_.data(), lw.qkv.data(), qkv_.data(), true, num_tokens, hidden, qkv_dim, "qkv"));
    detail::QkvPostArgs qa{};
    qa.qkv = qkv_.as<float>();
    qa.bias = lw.qkv_bias.as<float>();
    qa.q_norm = lw.q_norm.as<float>();
    qa.k_norm = lw.k_norm.as<float>();
    qa.positions = d_positions;
    qa.inv_freq = (sliding ? inv_freq_local_ : inv_freq_global_).as<float>();
    qa.rope_pairs = spec_.head_dim / 2;
    qa.interleaved = spec_.rope_style == cpu::RopeStyle::kInterleaved;
    qa.num_tokens = T;
    qa.num_q_heads = spec_.num_q_heads;
    qa.num_kv_heads = spec_.num_kv_heads;
    qa.head_dim = spec_.head_dim;
    qa.padded_head_dim = padded_head_dim_;
    qa.eps = eps;
    qa.out_bf16 = act_dtype == DType::BF16;
    qa.q = q_.data();
    qa.k = k_.data();
    qa.v = v_.data();
    KVP_RETURN_IF_ERROR(cuda_status(detail::launch_qkv_post(qa, stream_), "qkv_post_kernel"));

    if (layer_waits_pending_) {  // this layer's blocks, still being copied in
      for (cudaEvent_t copied : layer_waits_[l]) {
        KVP_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, copied, 0));
      }
      layer_waits_[l].clear();
    }
    const PagedKv kv = pools[g].layer(layer_slot_[l]);
    KvWrite write;
    write.k = k_.data();
    write.v = v_.data();
    write.slot_mapping =
        reinterpret_cast<const int64_t*>(meta_device_.as<const std::byte>() + slot_offset[g]);
    write.num_tokens = T;
    KVP_RETURN_IF_ERROR(launch_kv_write(kv, write, act_dtype, stream_));  // 8-bit: quantises
    AttentionParams params;
    params.num_q_heads = spec_.num_q_heads;
    params.scale = spec_.attention_scale;
    params.soft_cap = spec_.attn_logit_softcap;
    params.window = sliding ? spec_.sliding_window : 0;
    params.sinks = lw.sinks.as<float>();  // null without sinks
    AttentionBatch ab;
    ab.num_seqs = num_seqs;
    ab.num_tokens = T;
    ab.query_start = d_query_start;
    ab.kv_lens = d_kv_lens;
    ab.block_tables = d32 + table_offset[g];
    ab.max_blocks_per_seq = shape.max_blocks[g];
    ab.max_q_len = max_q_len;
    ab.max_kv_len = max_kv_len;
    KVP_RETURN_IF_ERROR(paged_attention(params, ab, kv, q_.data(), act_dtype, attn_.data(),
                                        attention_workspace_, stream_));
    const void* attn_bf16 = attn_.data();
    if (kv_dtype == DType::F16) {
      KVP_RETURN_IF_ERROR(
          cuda_status(detail::launch_f16_to_bf16(attn_.data(), num_tokens * spec_.num_q_heads * dp,
                                                 attn_bf16_.data(), stream_),
                      "f16_to_bf16_kernel"));
      attn_bf16 = attn_bf16_.data();
    }
    KVP_RETURN_IF_ERROR(gemm(attn_bf16, lw.o.data(), proj_.data(), true, num_tokens,
                             spec_.num_q_heads * dp, hidden, "o_proj"));
    if (lw.o_bias.data() != nullptr) {  // split: rank 0's, zeros elsewhere (tensor_parallel.h)
      KVP_RETURN_IF_ERROR(cuda_status(
          detail::launch_add_row_bias(proj_.as<float>(), num_tokens, spec_.hidden_size,
                                      spec_.hidden_size, lw.o_bias.as<float>(), stream_),
          "add_row_bias_kernel"));
    }
    KVP_RETURN_IF_ERROR(
        reduce_residual_norm(lw.post_attn_norm.as<float>(), lw.mlp_norm.as<float>(), T, eps));
    if (spec_.layer_moe(l)) {
      KVP_RETURN_IF_ERROR(enqueue_moe_mlp(l, T));
    } else {
      KVP_RETURN_IF_ERROR(gemm(xn_.data(), lw.gate_up.data(), gate_up_.data(), false, num_tokens,
                               hidden, 2 * inter, "gate_up"));
      KVP_RETURN_IF_ERROR(cuda_status(
          detail::launch_gated_activation(gate_up_.data(), num_tokens, spec_.intermediate_size,
                                          spec_.activation == cpu::Activation::kGeluTanh,
                                          xn_.data(), stream_),
          "gated_activation_kernel"));
      KVP_RETURN_IF_ERROR(
          gemm(xn_.data(), lw.down.data(), proj_.data(), true, num_tokens, inter, hidden, "down"));
    }
    const float* next_norm =
        l + 1 < spec_.num_layers ? layers_[l + 1].attn_norm.as<float>() : nullptr;
    KVP_RETURN_IF_ERROR(reduce_residual_norm(lw.post_mlp_norm.as<float>(), next_norm, T, eps));
  }

  if (num_rows > 0) {
    KVP_RETURN_IF_ERROR(
        cuda_status(detail::launch_rms_norm_rows(x_.as<float>(), d_logit_rows,
                                                 static_cast<int32_t>(num_rows), spec_.hidden_size,
                                                 final_norm_.as<float>(), eps, xn_.data(), stream_),
                    "rms_norm_rows_kernel"));
    // tied: the embedding's rows of this rank's logits (all of them unless split)
    const void* head = lm_head_.data() != nullptr
                           ? lm_head_.data()
                           : embed_.as<const std::byte>() + size_t(spec_.logit_begin) * hidden * 2;
    KVP_RETURN_IF_ERROR(gemm(xn_.data(), head, logits_.data(), true, num_rows, hidden,
                             spec_.logits_per_row(), "lm_head"));
    const int64_t count = num_rows * spec_.logits_per_row();
    if (spec_.final_logit_softcap > 0.0f) {
      KVP_RETURN_IF_ERROR(cuda_status(
          detail::launch_soft_cap(logits_.as<float>(), count, spec_.final_logit_softcap, stream_),
          "soft_cap_kernel"));
    }
    auto* summaries = summaries_.as<detail::RowSummary>();
    KVP_RETURN_IF_ERROR(
        cuda_status(detail::launch_row_summary(logits_.as<float>(), static_cast<int32_t>(num_rows),
                                               spec_.logits_per_row(), summaries, stream_),
                    "row_summary_kernel"));
    KVP_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(summaries_host_.data(), summaries,
                                             num_rows * sizeof(detail::RowSummary),
                                             cudaMemcpyDeviceToHost, stream_));
  }
  return Status::ok();
}

}  // namespace kvp::cuda

// The CUDA runner's mixture-of-experts MLP (cuda_moe_layer.h): weights, buffers, and
// CudaModelRunner::enqueue_moe_mlp, the layer's launch sequence.
#include "model/cuda/cuda_moe_layer.h"

#include <fmt/format.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/kernels.h"
#include "common/dtype.h"
#include "model/cuda/cublas_status.h"
#include "model/cuda/cuda_model_runner.h"
#include "model/cuda/model_kernels.h"
#include "model/cuda/moe_kernels.h"
#include "quant/dequant.h"

namespace kvp::cuda {
namespace {

Status upload_bytes(DeviceBuffer* dst, size_t offset_bytes, const void* src, size_t bytes) {
  return cuda_status(cudaMemcpy(static_cast<std::byte*>(dst->data()) + offset_bytes, src, bytes,
                                cudaMemcpyHostToDevice),
                     "cudaMemcpy (expert weights)");
}

// A stored matrix (any format quant can dequantise) → bf16 at *offset_bytes of dst.
Status upload_matrix_bf16(const quant::QuantMatrix& m, const std::string& what, DeviceBuffer* dst,
                          size_t* offset_bytes) {
  if (!can_dequantize(m.type)) {
    return Status::unsupported("cuda model runner: {}: weight type {} cannot be converted", what,
                               ggml_type_name(m.type));
  }
  const size_t count = static_cast<size_t>(m.rows) * static_cast<size_t>(m.cols);
  std::vector<float> values(count);
  dequantize(m.type, m.data, count, values.data());
  std::vector<uint16_t> bits(count);
  for (size_t i = 0; i < count; ++i) bits[i] = f32_to_bf16(values[i]).bits;
  KVP_RETURN_IF_ERROR(upload_bytes(dst, *offset_bytes, bits.data(), count * 2));
  *offset_bytes += count * 2;
  return Status::ok();
}

Result<DeviceBuffer> upload_f32_buffer(const std::vector<float>& values) {
  KVP_ASSIGN_OR_RETURN(DeviceBuffer buffer, DeviceBuffer::allocate(values.size() * 4));
  KVP_RETURN_IF_ERROR(upload_bytes(&buffer, 0, values.data(), values.size() * 4));
  return buffer;
}

}  // namespace

int32_t moe_router_rows(const ModelSpec& spec) {
  return spec.num_experts + (spec.shared_expert_intermediate_size > 0 ? 1 : 0);
}

Status check_moe_supported(const ModelSpec& spec) {
  if (spec.architecture != Architecture::kQwen2Moe &&
      spec.architecture != Architecture::kQwen3Moe && spec.architecture != Architecture::kGptOss) {
    return Status::unsupported("cuda model runner: {}'s experts run on the CPU backend only",
                               architecture_name(spec.architecture));
  }
  if (spec.num_experts > detail::kMoeMaxExperts || spec.num_experts_per_tok > detail::kMoeMaxTopK) {
    return Status::unsupported("cuda model runner: {} experts, top {} (at most {} experts, top {})",
                               spec.num_experts, spec.num_experts_per_tok, detail::kMoeMaxExperts,
                               detail::kMoeMaxTopK);
  }
  if (!detail::moe_experts_support(spec.hidden_size, spec.moe_intermediate_size)) {
    return Status::unsupported(
        "cuda model runner: hidden size {} and expert intermediate size {} (multiples of 8)",
        spec.hidden_size, spec.moe_intermediate_size);
  }
  return Status::ok();
}

Status MoeBuffers::allocate(const ModelSpec& spec, int64_t num_tokens) {
  const int64_t hidden = spec.hidden_size, top_k = spec.num_experts_per_tok;
  const int64_t num_pairs = num_tokens * top_k;
  KVP_ASSIGN_OR_RETURN(xn_f32, DeviceBuffer::allocate(num_tokens * hidden * 4));
  KVP_ASSIGN_OR_RETURN(logits, DeviceBuffer::allocate(num_tokens * moe_router_rows(spec) * 4));
  KVP_ASSIGN_OR_RETURN(expert_ids, DeviceBuffer::allocate(num_pairs * 4));
  KVP_ASSIGN_OR_RETURN(weights, DeviceBuffer::allocate(num_pairs * 4));
  KVP_ASSIGN_OR_RETURN(offsets, DeviceBuffer::allocate((int64_t{spec.num_experts} + 1) * 4));
  KVP_ASSIGN_OR_RETURN(pairs, DeviceBuffer::allocate(num_pairs * 4));
  KVP_ASSIGN_OR_RETURN(active, DeviceBuffer::allocate((int64_t{spec.num_experts} + 1) * 4));
  KVP_ASSIGN_OR_RETURN(act, DeviceBuffer::allocate(num_pairs * spec.moe_intermediate_size * 4));
  KVP_ASSIGN_OR_RETURN(y, DeviceBuffer::allocate(num_pairs * hidden * 4));
  if (spec.shared_expert_intermediate_size > 0) {
    KVP_ASSIGN_OR_RETURN(shared, DeviceBuffer::allocate(num_tokens * hidden * 4));
  }
  return Status::ok();
}

Status load_moe_weights(const ModelSpec& spec, const WeightSource& source, int32_t layer,
                        DeviceMoeWeights* moe, DeviceBuffer* shared_gate_up,
                        DeviceBuffer* shared_down) {
  const int64_t hidden = spec.hidden_size, inter = spec.moe_intermediate_size;
  const int32_t num_experts = spec.num_experts;
  const std::string p = fmt::format("model.layers.{}.mlp.", layer);
  const bool gpt_oss = spec.architecture == Architecture::kGptOss;
  {
    const int64_t shape[] = {num_experts, hidden};
    KVP_ASSIGN_OR_RETURN(std::vector<float> router,
                         source.read_f32(p + (gpt_oss ? "router.weight" : "gate.weight"), shape));
    if (spec.shared_expert_intermediate_size > 0) {
      const int64_t gate_shape[] = {1, hidden};
      KVP_ASSIGN_OR_RETURN(std::vector<float> gate,
                           source.read_f32(p + "shared_expert_gate.weight", gate_shape));
      router.insert(router.end(), gate.begin(), gate.end());
    }
    KVP_ASSIGN_OR_RETURN(moe->router, DeviceBuffer::allocate(router.size() * 4));
    KVP_RETURN_IF_ERROR(upload_bytes(&moe->router, 0, router.data(), router.size() * 4));
  }
  StackedExperts stacked;
  if (gpt_oss) {
    const int64_t shape[] = {num_experts};
    KVP_ASSIGN_OR_RETURN(std::vector<float> router_bias, source.read_f32(p + "router.bias", shape));
    KVP_ASSIGN_OR_RETURN(GptOssExperts read,
                         read_gpt_oss_experts(source, layer, num_experts, inter, hidden));
    KVP_ASSIGN_OR_RETURN(moe->router_bias, upload_f32_buffer(router_bias));
    KVP_ASSIGN_OR_RETURN(moe->gate_up_bias, upload_f32_buffer(read.gate_up_bias));
    KVP_ASSIGN_OR_RETURN(moe->down_bias, upload_f32_buffer(read.down_bias));
    stacked = std::move(read.stacked);
  } else {
    KVP_ASSIGN_OR_RETURN(stacked, read_stacked_experts(source, layer, num_experts, inter, hidden));
  }
  auto& gate = stacked.gate;
  auto& up = stacked.up;
  auto& down = stacked.down;
  KVP_ASSIGN_OR_RETURN(moe->gate_up, DeviceBuffer::allocate(num_experts * 2 * inter * hidden * 2));
  KVP_ASSIGN_OR_RETURN(moe->down, DeviceBuffer::allocate(num_experts * hidden * inter * 2));
  size_t gate_up_offset = 0, down_offset = 0;
  for (int32_t e = 0; e < num_experts; ++e) {
    const std::string what = fmt::format("layer {} expert {}", layer, e);
    KVP_RETURN_IF_ERROR(upload_matrix_bf16(gate[e].matrix, what, &moe->gate_up, &gate_up_offset));
    KVP_RETURN_IF_ERROR(upload_matrix_bf16(up[e].matrix, what, &moe->gate_up, &gate_up_offset));
    KVP_RETURN_IF_ERROR(upload_matrix_bf16(down[e].matrix, what, &moe->down, &down_offset));
  }
  if (spec.shared_expert_intermediate_size > 0) {
    const int64_t shared = spec.shared_expert_intermediate_size;
    KVP_ASSIGN_OR_RETURN(*shared_gate_up, DeviceBuffer::allocate(2 * shared * hidden * 2));
    KVP_ASSIGN_OR_RETURN(*shared_down, DeviceBuffer::allocate(hidden * shared * 2));
    size_t offset = 0;
    for (const char* name : {"gate_proj", "up_proj"}) {
      const std::string full = p + "shared_expert." + name + ".weight";
      KVP_ASSIGN_OR_RETURN(StoredMatrix m, source.read_matrix(full, shared, hidden));
      KVP_RETURN_IF_ERROR(upload_matrix_bf16(m.matrix, full, shared_gate_up, &offset));
    }
    offset = 0;
    const std::string full = p + "shared_expert.down_proj.weight";
    KVP_ASSIGN_OR_RETURN(StoredMatrix m, source.read_matrix(full, hidden, shared));
    KVP_RETURN_IF_ERROR(upload_matrix_bf16(m.matrix, full, shared_down, &offset));
  }
  return Status::ok();
}

Status fill_random_rects(DeviceBuffer* out, int64_t full_cols, std::span<const RandomRect> rects,
                         uint64_t seed, cudaStream_t stream) {
  int64_t elems = 0;
  for (const RandomRect& r : rects) elems += r.rows * r.cols;
  KVP_ASSIGN_OR_RETURN(*out, DeviceBuffer::allocate(elems * 2));
  const float a = 1.0f / std::sqrt(static_cast<float>(full_cols));
  int64_t offset = 0;
  for (const RandomRect& r : rects) {
    KVP_RETURN_IF_ERROR(cuda_status(
        detail::launch_fill_uniform_rect(out->as<uint16_t>() + offset, true, r.rows, r.cols,
                                         full_cols, r.row0, r.col0, seed, -a, a, stream),
        "fill_uniform_kernel"));
    offset += r.rows * r.cols;
  }
  return Status::ok();
}

Status random_moe_weights(const ModelSpec& spec, TensorShard shard, uint64_t* seed,
                          cudaStream_t stream, DeviceMoeWeights* moe, DeviceBuffer* shared_gate_up,
                          DeviceBuffer* shared_down) {
  const int64_t hidden = spec.hidden_size, inter = spec.moe_intermediate_size;
  const int64_t num_experts = spec.num_experts, n = shard.size, rank = shard.rank;
  const auto fill = [&](DeviceBuffer* out, int64_t full_cols,
                        const std::vector<RandomRect>& rects) {
    return fill_random_rects(out, full_cols, rects, (*seed)++, stream);
  };
  // gate and up of expert e are rows [e * 2I, e * 2I + I) and [e * 2I + I, (e + 1) * 2I) of the
  // whole [E * 2I][hidden]; down is [E * hidden][I], a rank's columns of every row
  const int64_t share = inter / n;
  std::vector<RandomRect> gate_up;
  for (int64_t e = 0; e < num_experts; ++e) {
    gate_up.push_back({e * 2 * inter + rank * share, share, 0, hidden});
    gate_up.push_back({e * 2 * inter + inter + rank * share, share, 0, hidden});
  }
  KVP_RETURN_IF_ERROR(fill(&moe->gate_up, hidden, gate_up));
  KVP_RETURN_IF_ERROR(fill(&moe->down, inter, {{0, num_experts * hidden, rank * share, share}}));
  if (spec.expert_bias) {  // zero biases: the launches of the real model, the values of none
    KVP_ASSIGN_OR_RETURN(moe->router_bias,
                         upload_f32_buffer(std::vector<float>(num_experts, 0.0f)));
    KVP_ASSIGN_OR_RETURN(moe->gate_up_bias,
                         upload_f32_buffer(std::vector<float>(num_experts * 2 * share, 0.0f)));
    KVP_ASSIGN_OR_RETURN(moe->down_bias,
                         upload_f32_buffer(std::vector<float>(num_experts * hidden, 0.0f)));
  }
  if (spec.shared_expert_intermediate_size > 0) {
    const int64_t shared = spec.shared_expert_intermediate_size, mine = shared / n;
    KVP_RETURN_IF_ERROR(
        fill(shared_gate_up, hidden,
             {{rank * mine, mine, 0, hidden}, {shared + rank * mine, mine, 0, hidden}}));
    KVP_RETURN_IF_ERROR(fill(shared_down, shared, {{0, hidden, rank * mine, mine}}));
  }
  // the router in f32, made here: a splitmix64 stream of the seed
  std::vector<float> router(static_cast<size_t>(moe_router_rows(spec) * hidden));
  uint64_t state = (*seed)++ * 0x9e3779b97f4a7c15ull;
  const float a = 1.0f / std::sqrt(static_cast<float>(hidden));
  for (float& v : router) {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    v = (static_cast<float>(z >> 40) * (2.0f / 16777216.0f) - 1.0f) * a;
  }
  KVP_ASSIGN_OR_RETURN(moe->router, DeviceBuffer::allocate(router.size() * 4));
  return upload_bytes(&moe->router, 0, router.data(), router.size() * 4);
}

// The layer's routing: small steps (decode) launch the norm with the router's products, then
// routing with grouping; larger ones the f32 norm, cuBLAS's router GEMM, the bias, routing and
// grouping.
Status CudaModelRunner::enqueue_moe_route(int32_t layer, int32_t num_tokens) {
  const DeviceLayerWeights& lw = layers_[layer];
  const DeviceMoeWeights& mw = lw.moe;
  MoeBuffers& b = moe_buffers_;
  const int32_t hidden = spec_.hidden_size, top_k = spec_.num_experts_per_tok;
  const int32_t router_rows = moe_router_rows(spec_);
  if (num_tokens <= detail::kMoeSmallStepTokens) {
    KVP_RETURN_IF_ERROR(cuda_status(
        detail::launch_moe_router_small(
            x_.as<float>(), lw.mlp_norm.as<float>(), mw.router.as<float>(),
            mw.router_bias.as<float>(), mw.router_bias.data() != nullptr ? spec_.num_experts : 0,
            num_tokens, hidden, router_rows, spec_.rms_norm_eps, b.logits.as<float>(), stream_),
        "moe_router_small_kernel"));
    KVP_RETURN_IF_ERROR(cuda_status(
        detail::launch_moe_route_group(
            b.logits.as<float>(), router_rows, num_tokens, spec_.num_experts, top_k,
            spec_.norm_topk_prob, b.expert_ids.as<int32_t>(), b.weights.as<float>(),
            b.offsets.as<int32_t>(), b.pairs.as<int32_t>(), b.active.as<int32_t>(), stream_),
        "moe_route_group_kernel"));
    return Status::ok();
  }
  KVP_RETURN_IF_ERROR(cuda_status(
      detail::launch_rms_norm_f32(x_.as<float>(), lw.mlp_norm.as<float>(), num_tokens, hidden,
                                  spec_.rms_norm_eps, b.xn_f32.as<float>(), stream_),
      "rms_norm_f32_kernel"));
  {
    // row-major logits[T][router_rows] = xn_f32[T][hidden] · routerᵀ, f32 throughout
    const float alpha = 1.0f, beta = 0.0f;
    KVP_RETURN_IF_ERROR(cublas_status(
        cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, router_rows, num_tokens, hidden, &alpha,
                     mw.router.data(), CUDA_R_32F, hidden, b.xn_f32.data(), CUDA_R_32F, hidden,
                     &beta, b.logits.data(), CUDA_R_32F, router_rows, CUBLAS_COMPUTE_32F_PEDANTIC,
                     CUBLAS_GEMM_DEFAULT),
        "router"));
  }
  if (mw.router_bias.data() != nullptr) {
    KVP_RETURN_IF_ERROR(
        cuda_status(detail::launch_add_row_bias(b.logits.as<float>(), num_tokens, spec_.num_experts,
                                                router_rows, mw.router_bias.as<float>(), stream_),
                    "add_row_bias_kernel"));
  }
  KVP_RETURN_IF_ERROR(cuda_status(
      detail::launch_moe_route(b.logits.as<float>(), router_rows, num_tokens, spec_.num_experts,
                               top_k, spec_.norm_topk_prob, b.expert_ids.as<int32_t>(),
                               b.weights.as<float>(), stream_),
      "moe_route_kernel"));
  KVP_RETURN_IF_ERROR(
      cuda_status(detail::launch_moe_group(b.expert_ids.as<int32_t>(), num_tokens * top_k,
                                           spec_.num_experts, b.offsets.as<int32_t>(),
                                           b.pairs.as<int32_t>(), b.active.as<int32_t>(), stream_),
                  "moe_group_kernel"));
  return Status::ok();
}

Status CudaModelRunner::enqueue_moe_mlp(int32_t layer, int32_t num_tokens) {
  const DeviceLayerWeights& lw = layers_[layer];
  const DeviceMoeWeights& mw = lw.moe;
  MoeBuffers& b = moe_buffers_;
  const int32_t hidden = spec_.hidden_size, top_k = spec_.num_experts_per_tok;
  const int32_t router_rows = moe_router_rows(spec_);
  KVP_RETURN_IF_ERROR(enqueue_moe_route(layer, num_tokens));
  detail::MoeExpertArgs ea{};
  ea.x = xn_.data();
  ea.gate_up = mw.gate_up.data();
  ea.down = mw.down.data();
  ea.offsets = b.offsets.as<int32_t>();
  ea.pairs = b.pairs.as<int32_t>();
  ea.active = b.active.as<int32_t>();
  ea.num_pairs = num_tokens * top_k;
  ea.num_experts = spec_.num_experts;
  ea.top_k = top_k;
  ea.hidden = hidden;
  ea.inter = spec_.moe_intermediate_size;
  ea.gate_up_bias = mw.gate_up_bias.as<float>();  // null without biases
  ea.down_bias = mw.down_bias.as<float>();
  switch (spec_.moe_activation) {
    case cpu::Activation::kSilu:
      ea.activation = detail::MoeActivation::kSilu;
      break;
    case cpu::Activation::kGeluTanh:
      ea.activation = detail::MoeActivation::kGeluTanh;
      break;
    case cpu::Activation::kClampedSwiglu:
      ea.activation = detail::MoeActivation::kClampedSwiglu;
      break;
  }
  ea.swiglu_alpha = cpu::kSwigluAlpha;
  ea.swiglu_limit = cpu::kSwigluLimit;
  ea.expert_ids = b.expert_ids.as<int32_t>();
  ea.act = b.act.as<float>();
  ea.y = b.y.as<float>();
  // steps of enough tokens: GEMMs over the pairs gathered by expert (a host synchronisation, so
  // never in a graph); y is then in the gathered order, `rows` maps pairs to it, and combine adds
  // the bias
  const bool gemms = !capturing_ && moe_step_takes_gemms(num_tokens);
  const int32_t* rows = nullptr;
  const float* combine_bias = nullptr;
  if (gemms) {
    if (ea.num_pairs > moe_gemm_.capacity_pairs) {  // grown here, the first such step
      KVP_RETURN_IF_ERROR(moe_gemm_.allocate(ea.num_pairs, spec_.num_experts, hidden, ea.inter));
    }
    KVP_RETURN_IF_ERROR(enqueue_moe_experts_gemm(cublas_, ea, moe_gemm_mode_, &moe_gemm_, stream_));
    rows = moe_gemm_.rows.as<int32_t>();
    combine_bias = ea.down_bias;
  } else {
    KVP_RETURN_IF_ERROR(
        cuda_status(detail::launch_moe_experts(ea, stream_), "moe_experts_kernels"));
  }
  const float* shared = nullptr;
  if (spec_.shared_expert_intermediate_size > 0) {
    // the dense MLP path over the shared expert's weights; its activation overwrites xn_, which
    // the experts above have read (stream order)
    const int64_t shared_inter = spec_.shared_expert_intermediate_size;
    KVP_RETURN_IF_ERROR(gemm(xn_.data(), lw.gate_up.data(), gate_up_.data(), false, num_tokens,
                             hidden, 2 * shared_inter, "shared_gate_up"));
    KVP_RETURN_IF_ERROR(
        cuda_status(detail::launch_gated_activation(
                        gate_up_.data(), num_tokens, static_cast<int32_t>(shared_inter),
                        spec_.activation == cpu::Activation::kGeluTanh, xn_.data(), stream_),
                    "gated_activation_kernel"));
    KVP_RETURN_IF_ERROR(gemm(xn_.data(), lw.down.data(), b.shared.data(), true, num_tokens,
                             shared_inter, hidden, "shared_down"));
    shared = b.shared.as<float>();
  }
  return cuda_status(
      detail::launch_moe_combine(b.y.data(), /*y_bf16=*/gemms, rows, combine_bias,
                                 b.expert_ids.as<int32_t>(), b.weights.as<float>(), num_tokens,
                                 top_k, hidden, shared, b.logits.as<float>() + spec_.num_experts,
                                 router_rows, proj_.as<float>(), stream_),
      "moe_combine_kernel");
}

}  // namespace kvp::cuda

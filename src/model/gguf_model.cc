#include "model/gguf_model.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <algorithm>
#include <array>
#include <cmath>
#include <optional>

#include "common/limits.h"
#include "model/model_config.h"

namespace kvp {
namespace {

Result<Architecture> architecture_of(const GgufFile& file) {
  KVP_ASSIGN_OR_RETURN(std::string_view arch, file.get_string("general.architecture"));
  if (arch == "llama") return Architecture::kLlama;
  if (arch == "qwen2") return Architecture::kQwen2;
  if (arch == "qwen3") return Architecture::kQwen3;
  if (arch == "qwen3moe") return Architecture::kQwen3Moe;
  if (arch == "qwen2moe") return Architecture::kQwen2Moe;
  if (arch == "gemma3") return Architecture::kGemma3;
  if (arch == "gpt-oss") return Architecture::kGptOss;
  return Status::unsupported(
      "gguf '{}': architecture '{}' is not supported (llama, qwen2, qwen2moe, qwen3, qwen3moe, "
      "gpt-oss, gemma3)",
      file.path(), arch);
}

// `{arch}.rope.scaling.*`: linear, or yarn with original_context_length and the optional
// yarn_beta_fast / yarn_beta_slow / yarn_attn_factor (absent: transformers' 32, 1 and
// 0.1 ln(factor) + 1). llama3 comes as rope_freqs.weight.
Result<cpu::RopeScaling> rope_scaling_of(const GgufFile& file, std::string_view arch) {
  cpu::RopeScaling scaling;
  const std::string type_key = fmt::format("{}.rope.scaling.type", arch);
  if (file.find(type_key) == nullptr) return scaling;
  KVP_ASSIGN_OR_RETURN(std::string_view type, file.get_string(type_key));
  if (type == "none") return scaling;
  if (type != "linear" && type != "yarn") {
    return Status::unsupported("gguf '{}': rope scaling '{}' is not supported (linear, yarn)",
                               file.path(), type);
  }
  const auto positive = [&](std::string_view key, std::optional<float> fallback) -> Result<float> {
    const std::string full = fmt::format("{}.rope.scaling.{}", arch, key);
    if (fallback && file.find(full) == nullptr) return *fallback;
    KVP_ASSIGN_OR_RETURN(float v, file.get_f32(full));
    if (!std::isfinite(v) || !(v > 0.0f)) {
      return Status::invalid_argument("gguf '{}': {} = {} must be finite and > 0", file.path(),
                                      full, v);
    }
    return v;
  };
  KVP_ASSIGN_OR_RETURN(float factor, positive("factor", std::nullopt));
  scaling.factor = factor;
  if (type == "linear") {
    scaling.kind = cpu::RopeScaling::Kind::kLinear;
    return scaling;
  }
  scaling.kind = cpu::RopeScaling::Kind::kYarn;
  KVP_ASSIGN_OR_RETURN(int64_t original, file.get_integer(fmt::format(
                                             "{}.rope.scaling.original_context_length", arch)));
  if (original <= 0) {
    return Status::invalid_argument("gguf '{}': yarn original context length {}", file.path(),
                                    original);
  }
  scaling.original_max_position_embeddings = static_cast<double>(original);
  KVP_ASSIGN_OR_RETURN(float beta_fast, positive("yarn_beta_fast", 32.0f));
  KVP_ASSIGN_OR_RETURN(float beta_slow, positive("yarn_beta_slow", 1.0f));
  const float mscale = factor <= 1.0f ? 1.0f : 0.1f * std::log(factor) + 1.0f;
  KVP_ASSIGN_OR_RETURN(float attn_factor, positive("yarn_attn_factor", mscale));
  scaling.beta_fast = beta_fast;
  scaling.beta_slow = beta_slow;
  scaling.attention_factor = attn_factor;
  return scaling;
}

Result<std::optional<TokenId>> optional_id(const GgufFile& file, std::string_view key,
                                           size_t num_tokens) {
  if (file.find(key) == nullptr) return std::optional<TokenId>();
  KVP_ASSIGN_OR_RETURN(int64_t id, file.get_integer(key));
  if (id < 0 || static_cast<uint64_t>(id) >= num_tokens) {
    return Status::invalid_argument("gguf '{}': {} = {} is outside the vocabulary of {} tokens",
                                    file.path(), key, id, num_tokens);
  }
  return std::optional<TokenId>(static_cast<TokenId>(id));
}

Result<bool> optional_bool(const GgufFile& file, std::string_view key, bool fallback) {
  if (file.find(key) == nullptr) return fallback;
  return file.get_bool(key);
}

// {arch}.expert_count, expert_used_count, expert_feed_forward_length,
// expert_shared_feed_forward_length (qwen2moe), and expert_weights_norm (absent: as llama.cpp's
// graphs, qwen3moe renormalises, qwen2moe does not). A layer has experts where its router
// blk.N.ffn_gate_inp.weight exists.
Status experts_of(const GgufFile& file, const std::string& arch, ModelSpec* spec) {
  const auto u32 = [&](const std::string& key) -> Result<int32_t> {
    KVP_ASSIGN_OR_RETURN(int64_t v, file.get_integer(key));
    if (v < 0 || v > int64_t{limits::kExperts.max} * 1024) {
      return Status::invalid_argument("gguf '{}': {} = {} is out of range", file.path(), key, v);
    }
    return static_cast<int32_t>(v);
  };
  KVP_ASSIGN_OR_RETURN(spec->num_experts, u32(arch + ".expert_count"));
  KVP_ASSIGN_OR_RETURN(spec->num_experts_per_tok, u32(arch + ".expert_used_count"));
  KVP_ASSIGN_OR_RETURN(spec->moe_intermediate_size, u32(arch + ".expert_feed_forward_length"));
  const bool qwen2 = spec->architecture == Architecture::kQwen2Moe;
  KVP_ASSIGN_OR_RETURN(spec->norm_topk_prob,
                       optional_bool(file, arch + ".expert_weights_norm", !qwen2));
  if (qwen2) {
    KVP_ASSIGN_OR_RETURN(spec->shared_expert_intermediate_size,
                         u32(arch + ".expert_shared_feed_forward_length"));
  }
  spec->layer_is_moe.assign(spec->num_layers, false);
  for (int32_t l = 0; l < spec->num_layers; ++l) {
    spec->layer_is_moe[l] = file.tensor(fmt::format("blk.{}.ffn_gate_inp.weight", l)).is_ok();
  }
  return Status::ok();
}

}  // namespace

Result<ModelSpec> model_spec_from_gguf(const GgufFile& file) {
  KVP_ASSIGN_OR_RETURN(Architecture arch, architecture_of(file));
  KVP_ASSIGN_OR_RETURN(ModelConfig config, model_config_from_gguf(file));
  // llama.cpp's name of the architecture, its metadata keys' prefix
  const std::string arch_name = config.architecture;
  if (config.rope_dim != config.head_dim) {
    return Status::unsupported("gguf '{}': rope over {} of {} head dimensions is not supported",
                               file.path(), config.rope_dim, config.head_dim);
  }
  if (config.value_head_dim != config.head_dim) {
    return Status::unsupported("gguf '{}': value head dim {} differs from key head dim {}",
                               file.path(), config.value_head_dim, config.head_dim);
  }
  ModelSpec spec;
  spec.architecture = arch;
  spec.vocab_size = static_cast<int32_t>(config.vocab_size);
  spec.hidden_size = static_cast<int32_t>(config.hidden_size);
  spec.intermediate_size = static_cast<int32_t>(config.intermediate_size);
  spec.num_layers = static_cast<int32_t>(config.num_layers);
  spec.num_q_heads = static_cast<int32_t>(config.num_heads);
  spec.num_kv_heads = static_cast<int32_t>(config.num_kv_heads);
  spec.head_dim = static_cast<int32_t>(config.head_dim);
  spec.rms_norm_eps = config.rms_norm_eps;
  spec.context_length = static_cast<int32_t>(config.context_length);
  spec.tie_word_embeddings = config.tied_embeddings;
  spec.attention_scale = 1.0f / std::sqrt(static_cast<float>(spec.head_dim));
  spec.rope_global.theta = config.rope_freq_base;
  KVP_ASSIGN_OR_RETURN(spec.rope_global.scaling, rope_scaling_of(file, arch_name));
  spec.layer_is_sliding.assign(spec.num_layers, false);

  switch (arch) {
    case Architecture::kLlama:
      spec.rope_style = cpu::RopeStyle::kInterleaved;  // q/k rows permuted by the converter
      break;
    case Architecture::kQwen2:
      spec.qkv_bias = file.tensor("blk.0.attn_q.bias").is_ok();
      break;
    case Architecture::kQwen3:  // neox rope (no permuted rows), plain per-head q/k norms
      spec.qkv_bias = file.tensor("blk.0.attn_q.bias").is_ok();
      spec.qk_norm = true;
      break;
    case Architecture::kQwen3Moe:
      spec.qkv_bias = file.tensor("blk.0.attn_q.bias").is_ok();
      spec.qk_norm = true;
      KVP_RETURN_IF_ERROR(experts_of(file, arch_name, &spec));
      break;
    case Architecture::kQwen2Moe:
      spec.qkv_bias = file.tensor("blk.0.attn_q.bias").is_ok();
      KVP_RETURN_IF_ERROR(experts_of(file, arch_name, &spec));
      break;
    case Architecture::kGptOss:
      // llama.cpp's gpt-oss: q/k/v/o biases, sinks, biased router and experts, the clamped
      // SwiGLU, softmax over the top-k logits; windows on even layers (its swa pattern 2); YaRN
      // not truncated (GptOssConfig's truncate = false, which GGUF does not record)
      spec.qkv_bias = file.tensor("blk.0.attn_q.bias").is_ok();
      spec.o_bias = file.tensor("blk.0.attn_output.bias").is_ok();
      spec.attention_sinks = true;
      KVP_RETURN_IF_ERROR(experts_of(file, arch_name, &spec));
      spec.norm_topk_prob = true;
      spec.expert_bias = true;
      spec.moe_activation = cpu::Activation::kClampedSwiglu;
      spec.rope_global.scaling.truncate = false;
      spec.rope_local = spec.rope_global;
      spec.sliding_window = static_cast<int32_t>(config.sliding_window);
      for (int32_t l = 0; l < spec.num_layers; ++l) {
        spec.layer_is_sliding[l] = spec.sliding_window > 0 && l % 2 == 0;
      }
      break;
    case Architecture::kGemma3: {
      spec.activation = cpu::Activation::kGeluTanh;
      spec.norm_style = cpu::NormStyle::kPlain;  // stored as 1 + w
      spec.embedding_scale = std::sqrt(static_cast<float>(spec.hidden_size));
      spec.qk_norm = true;
      spec.sandwich_norms = true;
      // llama.cpp: Gemma 3 27B scales by (hidden / heads)^-½, every other size by head_dim^-½
      if (spec.num_layers == 62) {
        spec.attention_scale = 1.0f / std::sqrt(float(spec.hidden_size) / spec.num_q_heads);
      }
      spec.sliding_window = static_cast<int32_t>(config.sliding_window);
      spec.rope_local.theta = 10000.0;
      for (int32_t l = 0; l < spec.num_layers; ++l) {
        spec.layer_is_sliding[l] = spec.sliding_window > 0 && (l + 1) % 6 != 0;
      }
      break;
    }
  }
  if (spec.rope_global.scaling.kind == cpu::RopeScaling::Kind::kYarn) {
    // cos and sin scaled by the attention factor: q·k by its square
    const double factor = spec.rope_global.scaling.attention_factor;
    spec.attention_scale = static_cast<float>(spec.attention_scale * factor * factor);
  }
  if (spec.sliding_window > 0 && arch != Architecture::kGemma3 && arch != Architecture::kGptOss) {
    return Status::unsupported("gguf '{}': a sliding window on {} is not supported", file.path(),
                               arch_name);
  }
  if (auto freqs = file.tensor("rope_freqs.weight"); freqs.is_ok()) {
    const uint64_t n = (*freqs)->num_elements;
    if (n != static_cast<uint64_t>(spec.head_dim / 2)) {
      return Status::corruption("gguf '{}': rope_freqs.weight has {} values, expected {}",
                                file.path(), n, spec.head_dim / 2);
    }
    spec.rope_global.freq_factors.resize(n);
    KVP_RETURN_IF_ERROR(file.dequantize_tensor(**freqs, spec.rope_global.freq_factors));
  }

  // ids outside the vocabulary are refused by the tokenizer reader; here they only must fit
  const auto token_id = [&](std::string_view key) -> Result<int32_t> {
    KVP_ASSIGN_OR_RETURN(int64_t id, file.get_integer(key));
    if (id < 0 || id >= spec.vocab_size) {
      return Status::invalid_argument("gguf '{}': {} = {} is outside the vocabulary of {} tokens",
                                      file.path(), key, id, spec.vocab_size);
    }
    return static_cast<int32_t>(id);
  };
  if (file.find("tokenizer.ggml.bos_token_id") != nullptr) {
    KVP_ASSIGN_OR_RETURN(spec.bos_token_id, token_id("tokenizer.ggml.bos_token_id"));
  }
  if (file.find("tokenizer.ggml.eos_token_id") != nullptr) {
    KVP_ASSIGN_OR_RETURN(int32_t eos, token_id("tokenizer.ggml.eos_token_id"));
    spec.eos_token_ids.push_back(eos);
  }
  // chat models end a turn with their own token (transformers' generation_config lists it too)
  if (auto tokens = file.get_string_array("tokenizer.ggml.tokens"); tokens.is_ok()) {
    for (size_t i = 0; i < tokens->size(); ++i) {
      const std::string_view t = (*tokens)[i];
      if (t == "<end_of_turn>" || t == "<|im_end|>" || t == "<|eot_id|>" || t == "<|endoftext|>") {
        const auto id = static_cast<int32_t>(i);
        if (std::find(spec.eos_token_ids.begin(), spec.eos_token_ids.end(), id) ==
            spec.eos_token_ids.end()) {
          spec.eos_token_ids.push_back(id);
        }
      }
    }
  }
  KVP_RETURN_IF_ERROR(spec.validate());
  return spec;
}

Result<TokenizerVocab> tokenizer_vocab_from_gguf(const GgufFile& file) {
  TokenizerVocab vocab;
  KVP_ASSIGN_OR_RETURN(std::string_view model, file.get_string("tokenizer.ggml.model"));
  if (model == "gpt2") {
    vocab.model = TokenizerModel::kByteLevelBpe;
  } else if (model == "llama") {
    vocab.model = TokenizerModel::kSentencePieceBpe;
  } else {
    return Status::unsupported(
        "gguf '{}': tokenizer.ggml.model '{}' is not supported (gpt2, llama)", file.path(), model);
  }
  const bool spm = vocab.model == TokenizerModel::kSentencePieceBpe;
  if (file.find("tokenizer.ggml.pre") != nullptr) {
    KVP_ASSIGN_OR_RETURN(std::string_view pre, file.get_string("tokenizer.ggml.pre"));
    vocab.pre = std::string(pre);
  } else {
    vocab.pre = "default";
  }
  KVP_ASSIGN_OR_RETURN(std::vector<std::string_view> tokens,
                       file.get_string_array("tokenizer.ggml.tokens"));
  KVP_RETURN_IF_ERROR(check_limit(fmt::format("gguf '{}'", file.path()),
                                  "the tokenizer's token count", tokens.size(),
                                  limits::kVocabSize));
  vocab.tokens.assign(tokens.begin(), tokens.end());
  const size_t n = vocab.tokens.size();
  if (file.find("tokenizer.ggml.scores") != nullptr) {
    KVP_ASSIGN_OR_RETURN(vocab.scores, file.get_f32_array("tokenizer.ggml.scores"));
    if (vocab.scores.size() != n) {
      return Status::corruption("gguf '{}': {} tokenizer scores for {} tokens", file.path(),
                                vocab.scores.size(), n);
    }
  }
  if (file.find("tokenizer.ggml.token_type") != nullptr) {
    KVP_ASSIGN_OR_RETURN(std::vector<int32_t> types,
                         file.get_i32_array("tokenizer.ggml.token_type"));
    if (types.size() != n) {
      return Status::corruption("gguf '{}': {} token types for {} tokens", file.path(),
                                types.size(), n);
    }
    vocab.token_types.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      if (types[i] < 0 || types[i] > 6) {
        return Status::corruption("gguf '{}': token {} has unknown type {}", file.path(), i,
                                  types[i]);
      }
      vocab.token_types.push_back(static_cast<TokenType>(types[i]));
    }
  }
  if (file.find("tokenizer.ggml.merges") != nullptr) {
    KVP_ASSIGN_OR_RETURN(std::vector<std::string_view> merges,
                         file.get_string_array("tokenizer.ggml.merges"));
    vocab.merges.reserve(merges.size());
    for (size_t i = 0; i < merges.size(); ++i) {
      const std::string_view m = merges[i];
      // split at the first space after the first byte (llama.cpp does the same)
      const size_t space = m.size() > 1 ? m.find(' ', 1) : std::string_view::npos;
      if (space == std::string_view::npos) {
        return Status::corruption("gguf '{}': merge {} '{}' has no separating space", file.path(),
                                  i, m);
      }
      vocab.merges.emplace_back(std::string(m.substr(0, space)), std::string(m.substr(space + 1)));
    }
  }
  KVP_ASSIGN_OR_RETURN(vocab.bos_id, optional_id(file, "tokenizer.ggml.bos_token_id", n));
  KVP_ASSIGN_OR_RETURN(vocab.eos_id, optional_id(file, "tokenizer.ggml.eos_token_id", n));
  KVP_ASSIGN_OR_RETURN(vocab.pad_id, optional_id(file, "tokenizer.ggml.padding_token_id", n));
  KVP_ASSIGN_OR_RETURN(vocab.unk_id, optional_id(file, "tokenizer.ggml.unknown_token_id", n));
  // Byte-level BPE covers every byte; where a vocab lacks one, HF drops it rather than emit an
  // unknown token (the files still name one).
  if (!spm) vocab.unk_id.reset();
  KVP_ASSIGN_OR_RETURN(vocab.add_bos, optional_bool(file, "tokenizer.ggml.add_bos_token", spm));
  KVP_ASSIGN_OR_RETURN(vocab.add_eos, optional_bool(file, "tokenizer.ggml.add_eos_token", false));
  KVP_ASSIGN_OR_RETURN(vocab.add_space_prefix,
                       optional_bool(file, "tokenizer.ggml.add_space_prefix", spm));
  return vocab;
}

GgufWeights::GgufWeights(std::shared_ptr<const GgufFile> file, Architecture architecture)
    : file_(std::move(file)), architecture_(architecture) {}

std::string GgufWeights::gguf_name(const std::string& hf_name) const {
  if (hf_name == "model.embed_tokens.weight") return "token_embd.weight";
  if (hf_name == "model.norm.weight") return "output_norm.weight";
  if (hf_name == "lm_head.weight") return "output.weight";
  // "model.layers.<N>.<rest>"
  constexpr std::string_view kPrefix = "model.layers.";
  if (!hf_name.starts_with(kPrefix)) return "";
  const size_t digits_end = hf_name.find('.', kPrefix.size());
  if (digits_end == std::string::npos || digits_end == kPrefix.size()) return "";
  const std::string layer = hf_name.substr(kPrefix.size(), digits_end - kPrefix.size());
  if (!std::all_of(layer.begin(), layer.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return "";
  }
  const std::string rest = hf_name.substr(digits_end + 1);
  const bool gemma = architecture_ == Architecture::kGemma3;
  struct Pair {
    const char* hf;
    const char* gguf;
  };
  static constexpr Pair kCommon[] = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"self_attn.q_proj.bias", "attn_q.bias"},
      {"self_attn.k_proj.bias", "attn_k.bias"},
      {"self_attn.v_proj.bias", "attn_v.bias"},
      {"self_attn.q_norm.weight", "attn_q_norm.weight"},
      {"self_attn.k_norm.weight", "attn_k_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},
      {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
      {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
      {"mlp.gate.weight", "ffn_gate_inp.weight"},
      {"mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight"},
      {"mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight"},
      {"mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight"},
      {"mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight"},
      // the experts' stacked projections (read_experts)
      {"mlp.experts.gate_proj", "ffn_gate_exps.weight"},
      {"mlp.experts.up_proj", "ffn_up_exps.weight"},
      {"mlp.experts.down_proj", "ffn_down_exps.weight"},
      // GPT-OSS
      {"self_attn.o_proj.bias", "attn_output.bias"},
      {"self_attn.sinks", "attn_sinks.weight"},
      {"mlp.router.weight", "ffn_gate_inp.weight"},
      {"mlp.router.bias", "ffn_gate_inp.bias"},
      {"mlp.experts.gate_proj.bias", "ffn_gate_exps.bias"},
      {"mlp.experts.up_proj.bias", "ffn_up_exps.bias"},
      {"mlp.experts.down_proj.bias", "ffn_down_exps.bias"},
  };
  const char* mapped = nullptr;
  for (const Pair& p : kCommon) {
    if (rest == p.hf) mapped = p.gguf;
  }
  if (rest == "post_attention_layernorm.weight") {
    // Gemma: the norm after attention; Llama / Qwen2: the norm before the MLP; GPT-OSS: the norm
    // before the MLP, which llama.cpp names as Gemma's
    mapped = gemma || architecture_ == Architecture::kGptOss ? "post_attention_norm.weight"
                                                             : "ffn_norm.weight";
  }
  if (mapped == nullptr) return "";
  return fmt::format("blk.{}.{}", layer, mapped);
}

bool GgufWeights::contains(const std::string& name) const {
  const std::string g = gguf_name(name);
  return !g.empty() && file_->tensor(g).is_ok();
}

Result<const GgufTensor*> GgufWeights::find(const std::string& name,
                                            std::span<const int64_t> shape) const {
  const std::string g = gguf_name(name);
  if (g.empty()) {
    return Status::not_found("gguf '{}': no GGUF name for tensor '{}'", file_->path(), name);
  }
  auto tensor = file_->tensor(g);
  if (!tensor.is_ok()) {
    return Status::not_found("gguf '{}': tensor '{}' ('{}') is missing", file_->path(), g, name);
  }
  const GgufTensor& t = **tensor;
  // ggml lists dimensions innermost first; shape is outermost first. Outer dimensions of size 1
  // do not count (a [1][hidden] gate may be stored as [hidden], as llama.cpp reads Qwen2-MoE's)
  size_t file_dims = t.dims.size(), want_dims = shape.size();
  while (file_dims > 1 && t.dims[file_dims - 1] == 1) --file_dims;
  size_t outer = 0;
  while (want_dims - outer > 1 && shape[outer] == 1) ++outer;
  const bool same =
      file_dims == want_dims - outer &&
      std::equal(t.dims.rend() - file_dims, t.dims.rend(), shape.begin() + outer, shape.end(),
                 [](uint64_t a, int64_t b) { return b >= 0 && a == uint64_t(b); });
  if (!same) {
    std::vector<uint64_t> outer_first(t.dims.rbegin(), t.dims.rend());
    return Status::mismatch("gguf '{}': tensor '{}' has shape [{}], expected [{}]", file_->path(),
                            g, fmt::join(outer_first, ", "), fmt::join(shape, ", "));
  }
  return &t;
}

Result<std::vector<float>> GgufWeights::read_f32(const std::string& name,
                                                 std::span<const int64_t> shape) const {
  KVP_ASSIGN_OR_RETURN(const GgufTensor* t, find(name, shape));
  std::vector<float> out(t->num_elements);
  KVP_RETURN_IF_ERROR(file_->dequantize_tensor(*t, out));
  return out;
}

Result<StoredMatrix> GgufWeights::read_matrix(const std::string& name, int64_t rows,
                                              int64_t cols) const {
  const std::array<int64_t, 2> shape{rows, cols};
  KVP_ASSIGN_OR_RETURN(const GgufTensor* t, find(name, shape));
  if (!quant::matmul_supports(t->type)) return WeightSource::read_matrix(name, rows, cols);
  StoredMatrix m;
  m.matrix = quant::make_matrix(t->type, t->data.data(), rows, cols);
  m.keep_alive = file_;  // the mapping lives as long as the file
  return m;
}

Result<std::vector<StoredMatrix>> GgufWeights::read_experts(int32_t layer,
                                                            const std::string& projection,
                                                            int32_t num_experts, int64_t rows,
                                                            int64_t cols) const {
  const std::array<int64_t, 3> shape{num_experts, rows, cols};
  KVP_ASSIGN_OR_RETURN(
      const GgufTensor* t,
      find(fmt::format("model.layers.{}.mlp.experts.{}", layer, projection), shape));
  StoredMatrix all;  // [num_experts * rows][cols]
  if (quant::matmul_supports(t->type)) {
    all.matrix = quant::make_matrix(t->type, t->data.data(), num_experts * rows, cols);
    all.keep_alive = file_;
  } else {
    std::vector<float> values(t->num_elements);
    KVP_RETURN_IF_ERROR(file_->dequantize_tensor(*t, values));
    all = owned_f32_matrix(std::move(values), num_experts * rows, cols);
  }
  std::vector<StoredMatrix> experts(num_experts);
  for (int32_t e = 0; e < num_experts; ++e) {
    experts[e].matrix = quant::slice_rows(all.matrix, e * rows, rows);
    experts[e].keep_alive = all.keep_alive;
  }
  return experts;
}

}  // namespace kvp

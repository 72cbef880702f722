// ModelConfig from GGUF metadata or a Hugging Face config.json, with the formats' defaults.
#include "model/model_config.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "common/limits.h"

namespace kvp {
namespace {

// A u32-valued key given as any integer type, at most limit.max (checked here, where the value
// enters). `fallback` (if set) is used when absent.
Result<uint32_t> gguf_u32(const GgufFile& file, const std::string& key, const Limit& limit,
                          std::optional<uint32_t> fallback = std::nullopt) {
  const GgufValue* v = file.find(key);
  if (v == nullptr && fallback.has_value()) return *fallback;
  if (v != nullptr && v->type == GgufType::Array) {
    return Status::unsupported("gguf '{}': '{}' is a per-layer array; kvpool needs one value",
                               file.path(), key);
  }
  KVP_ASSIGN_OR_RETURN(int64_t x, file.get_integer(key));
  if (x < 0) {
    return Status::invalid_argument("gguf '{}': '{}' = {} is negative", file.path(), key, x);
  }
  KVP_RETURN_IF_ERROR(
      check_limit(fmt::format("gguf '{}'", file.path()), fmt::format("'{}'", key), x, limit));
  return static_cast<uint32_t>(x);
}

// A positive finite number (rope base, norm epsilon): nan, inf, 0 and negatives are refused.
Status check_positive(std::string_view source, std::string_view key, double value) {
  if (std::isfinite(value) && value > 0.0) return Status::ok();
  return Status::invalid_argument("{}: '{}' = {} must be a finite number > 0", source, key, value);
}

Result<float> gguf_f32(const GgufFile& file, const std::string& key, float fallback) {
  if (file.find(key) == nullptr) return fallback;
  KVP_ASSIGN_OR_RETURN(float x, file.get_f32(key));
  KVP_RETURN_IF_ERROR(check_positive(fmt::format("gguf '{}'", file.path()), key, x));
  return x;
}

// 0 (absent: unknown) or a context length in [kMinContextLength, kContextLength].
Status check_context_length(std::string_view source, std::string_view key, uint32_t value,
                            bool present) {
  if (!present) return Status::ok();
  if (value < limits::kMinContextLength) {
    return Status::invalid_argument(
        "{}: '{}' = {} is less than kvpool's smallest context of {} tokens", source, key, value,
        limits::kMinContextLength);
  }
  return Status::ok();  // the upper limit was checked where the value was read
}

Status check_consistent(const ModelConfig& c, std::string_view source) {
  if (c.num_layers == 0 || c.hidden_size == 0 || c.num_heads == 0 || c.num_kv_heads == 0 ||
      c.head_dim == 0 || c.vocab_size == 0) {
    return Status::invalid_argument("{}: a zero in layers/hidden/heads/kv heads/head_dim/vocab: {}",
                                    source, c.describe());
  }
  if (c.num_heads % c.num_kv_heads != 0) {
    return Status::invalid_argument("{}: {} attention heads are not a multiple of {} kv heads",
                                    source, c.num_heads, c.num_kv_heads);
  }
  if (c.rope_dim > c.head_dim) {
    return Status::invalid_argument("{}: rope dimension {} exceeds head_dim {}", source, c.rope_dim,
                                    c.head_dim);
  }
  return Status::ok();
}

}  // namespace

uint64_t ModelConfig::matrix_parameters(bool active_per_token) const {
  const uint64_t hidden = hidden_size;
  const uint64_t q_dim = uint64_t{num_heads} * head_dim;
  const uint64_t kv_dim = uint64_t{num_kv_heads} * (head_dim + value_head_dim);
  const uint64_t attention = hidden * (q_dim + kv_dim) + q_dim * hidden;
  const uint64_t experts_run = active_per_token ? num_experts_used : num_experts;
  const uint64_t moe = hidden * num_experts + experts_run * 3 * hidden * expert_intermediate_size +
                       3 * hidden * shared_expert_intermediate_size +
                       (shared_expert_intermediate_size > 0 ? hidden : 0);
  const uint64_t dense = 3 * hidden * intermediate_size;
  const uint64_t moe_layers = std::min(num_moe_layers, num_layers);
  return uint64_t{vocab_size} * hidden * (tied_embeddings ? 1 : 2) + num_layers * attention +
         moe_layers * moe + (num_layers - moe_layers) * dense;
}

std::string ModelConfig::describe() const {
  const auto billions = [](uint64_t n) {
    return n >= 1'000'000'000 ? fmt::format("{:.1f}B", n / 1e9) : fmt::format("{}", n);
  };
  const std::string experts =
      num_experts == 0
          ? ""
          : fmt::format(
                ", experts {} ({} per token) x ffn {}, shared ffn {} in {} layers, matrix "
                "parameters {} ({} active per token)",
                num_experts, num_experts_used, expert_intermediate_size,
                shared_expert_intermediate_size, num_moe_layers, billions(matrix_parameters(false)),
                billions(matrix_parameters(true)));
  return fmt::format(
      "{}: {} layers, hidden {}, ffn {}, heads {}/{} x {} (v {}), vocab {}, ctx {}, rms_eps {}, "
      "rope base {} dim {}, sliding window {}, tied embeddings {}{}",
      architecture, num_layers, hidden_size, intermediate_size, num_heads, num_kv_heads, head_dim,
      value_head_dim, vocab_size, context_length, rms_norm_eps, rope_freq_base, rope_dim,
      sliding_window, tied_embeddings ? "yes" : "no", experts);
}

Result<ModelConfig> model_config_from_gguf(const GgufFile& file) {
  ModelConfig c;
  KVP_ASSIGN_OR_RETURN(std::string_view arch, file.get_string("general.architecture"));
  c.architecture = std::string(arch);
  const std::string p = c.architecture + ".";
  using namespace limits;  // NOLINT(google-build-using-namespace)
  KVP_ASSIGN_OR_RETURN(c.num_layers, gguf_u32(file, p + "block_count", kLayers));
  KVP_ASSIGN_OR_RETURN(c.hidden_size, gguf_u32(file, p + "embedding_length", kHiddenSize));
  KVP_ASSIGN_OR_RETURN(c.intermediate_size,
                       gguf_u32(file, p + "feed_forward_length", kIntermediateSize, 0u));
  KVP_ASSIGN_OR_RETURN(c.num_heads, gguf_u32(file, p + "attention.head_count", kHeads));
  KVP_ASSIGN_OR_RETURN(c.num_kv_heads,
                       gguf_u32(file, p + "attention.head_count_kv", kHeads, c.num_heads));
  const uint32_t default_head_dim = c.num_heads == 0 ? 0 : c.hidden_size / c.num_heads;
  KVP_ASSIGN_OR_RETURN(c.head_dim,
                       gguf_u32(file, p + "attention.key_length", kHeadDim, default_head_dim));
  KVP_ASSIGN_OR_RETURN(c.value_head_dim,
                       gguf_u32(file, p + "attention.value_length", kHeadDim, c.head_dim));
  KVP_ASSIGN_OR_RETURN(c.context_length, gguf_u32(file, p + "context_length", kContextLength, 0u));
  const std::string source = fmt::format("gguf '{}'", file.path());
  KVP_RETURN_IF_ERROR(check_context_length(source, p + "context_length", c.context_length,
                                           file.find(p + "context_length") != nullptr));
  KVP_ASSIGN_OR_RETURN(c.rms_norm_eps,
                       gguf_f32(file, p + "attention.layer_norm_rms_epsilon", 1e-5f));
  KVP_ASSIGN_OR_RETURN(c.rope_freq_base, gguf_f32(file, p + "rope.freq_base", 10000.0f));
  KVP_ASSIGN_OR_RETURN(c.rope_dim,
                       gguf_u32(file, p + "rope.dimension_count", kHeadDim, c.head_dim));
  KVP_ASSIGN_OR_RETURN(c.sliding_window,
                       gguf_u32(file, p + "attention.sliding_window", kSlidingWindow, 0u));
  uint32_t num_tokens = 0;
  if (const GgufValue* tokens = file.find("tokenizer.ggml.tokens");
      tokens != nullptr && tokens->type == GgufType::Array &&
      tokens->count <= std::numeric_limits<uint32_t>::max()) {
    num_tokens = static_cast<uint32_t>(tokens->count);
  }
  KVP_ASSIGN_OR_RETURN(c.vocab_size, gguf_u32(file, p + "vocab_size", kVocabSize, num_tokens));
  KVP_RETURN_IF_ERROR(check_limit(source, "the vocabulary size", c.vocab_size, kVocabSize));
  c.tied_embeddings = !file.tensor("output.weight").is_ok();
  KVP_ASSIGN_OR_RETURN(c.num_experts, gguf_u32(file, p + "expert_count", kExperts, 0u));
  KVP_ASSIGN_OR_RETURN(c.num_experts_used, gguf_u32(file, p + "expert_used_count", kExperts, 0u));
  KVP_ASSIGN_OR_RETURN(c.expert_intermediate_size,
                       gguf_u32(file, p + "expert_feed_forward_length", kIntermediateSize, 0u));
  KVP_ASSIGN_OR_RETURN(
      c.shared_expert_intermediate_size,
      gguf_u32(file, p + "expert_shared_feed_forward_length", kIntermediateSize, 0u));
  for (uint32_t l = 0; c.num_experts > 0 && l < c.num_layers; ++l) {
    if (file.tensor(fmt::format("blk.{}.ffn_gate_inp.weight", l)).is_ok()) ++c.num_moe_layers;
  }
  KVP_RETURN_IF_ERROR(check_consistent(c, fmt::format("gguf '{}'", file.path())));
  return c;
}

namespace {

// A non-negative integer field of config.json, at most limit.max; `fallback` when absent or
// null.
Result<uint32_t> hf_u32(const nlohmann::json& j, std::string_view source, const char* key,
                        const Limit& limit, std::optional<uint32_t> fallback = std::nullopt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (fallback.has_value()) return *fallback;
    return Status::not_found("{}: '{}' not found", source, key);
  }
  // Parsed JSON holds non-negative integers as unsigned; built JSON may hold them as signed.
  if (!it->is_number_integer() || (!it->is_number_unsigned() && it->get<int64_t>() < 0)) {
    return Status::mismatch("{}: '{}' is {}, expected a non-negative integer", source, key,
                            it->dump());
  }
  KVP_RETURN_IF_ERROR(check_limit(source, fmt::format("'{}'", key), it->get<uint64_t>(), limit));
  return static_cast<uint32_t>(it->get<uint64_t>());
}

Result<float> hf_f32(const nlohmann::json& j, std::string_view source, const char* key,
                     float fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number()) {
    return Status::mismatch("{}: '{}' is {}, expected a number", source, key, it->dump());
  }
  const double x = it->get<double>();
  KVP_RETURN_IF_ERROR(check_positive(source, key, x));
  return static_cast<float>(x);
}

}  // namespace

Result<ModelConfig> model_config_from_hf(const nlohmann::json& j, std::string_view source) {
  if (!j.is_object()) return Status::invalid_argument("{}: config is not a JSON object", source);
  ModelConfig c;
  auto type = j.find("model_type");
  if (type == j.end() || !type->is_string()) {
    return Status::not_found("{}: 'model_type' not found (or not a string)", source);
  }
  c.architecture = type->get<std::string>();
  using namespace limits;  // NOLINT(google-build-using-namespace)
  KVP_ASSIGN_OR_RETURN(c.num_layers, hf_u32(j, source, "num_hidden_layers", kLayers));
  KVP_ASSIGN_OR_RETURN(c.hidden_size, hf_u32(j, source, "hidden_size", kHiddenSize));
  KVP_ASSIGN_OR_RETURN(c.intermediate_size,
                       hf_u32(j, source, "intermediate_size", kIntermediateSize, 0u));
  KVP_ASSIGN_OR_RETURN(c.num_heads, hf_u32(j, source, "num_attention_heads", kHeads));
  KVP_ASSIGN_OR_RETURN(c.num_kv_heads,
                       hf_u32(j, source, "num_key_value_heads", kHeads, c.num_heads));
  // Qwen3Config's head_dim defaults to 128, every other config's to hidden / heads
  const uint32_t default_head_dim = c.architecture == "qwen3" ? 128
                                    : c.num_heads == 0        ? 0
                                                              : c.hidden_size / c.num_heads;
  KVP_ASSIGN_OR_RETURN(c.head_dim, hf_u32(j, source, "head_dim", kHeadDim, default_head_dim));
  c.value_head_dim = c.head_dim;
  KVP_ASSIGN_OR_RETURN(c.vocab_size, hf_u32(j, source, "vocab_size", kVocabSize));
  KVP_ASSIGN_OR_RETURN(c.context_length,
                       hf_u32(j, source, "max_position_embeddings", kContextLength, 0u));
  auto context = j.find("max_position_embeddings");
  KVP_RETURN_IF_ERROR(check_context_length(source, "max_position_embeddings", c.context_length,
                                           context != j.end() && !context->is_null()));
  KVP_ASSIGN_OR_RETURN(c.rms_norm_eps, hf_f32(j, source, "rms_norm_eps", 1e-5f));
  KVP_ASSIGN_OR_RETURN(c.rope_freq_base, hf_f32(j, source, "rope_theta", 10000.0f));
  // transformers 5 moves rope_theta into rope_parameters (per layer type for Gemma 3: the global
  // layers' base is the one reported)
  if (auto rp = j.find("rope_parameters");
      !j.contains("rope_theta") && rp != j.end() && rp->is_object()) {
    const auto full = rp->find("full_attention");
    const nlohmann::json& global = full != rp->end() && full->is_object() ? *full : *rp;
    KVP_ASSIGN_OR_RETURN(c.rope_freq_base, hf_f32(global, source, "rope_theta", 10000.0f));
  }
  c.rope_dim = c.head_dim;
  KVP_ASSIGN_OR_RETURN(c.sliding_window, hf_u32(j, source, "sliding_window", kSlidingWindow, 0u));
  auto tie = j.find("tie_word_embeddings");
  c.tied_embeddings = tie != j.end() && tie->is_boolean() && tie->get<bool>();
  KVP_ASSIGN_OR_RETURN(c.num_experts, hf_u32(j, source, "num_local_experts", kExperts, 0u));
  if (j.contains("num_experts")) {
    KVP_ASSIGN_OR_RETURN(c.num_experts, hf_u32(j, source, "num_experts", kExperts, 0u));
  }
  KVP_ASSIGN_OR_RETURN(c.num_experts_used, hf_u32(j, source, "num_experts_per_tok", kExperts, 0u));
  KVP_ASSIGN_OR_RETURN(c.expert_intermediate_size,
                       hf_u32(j, source, "moe_intermediate_size", kIntermediateSize, 0u));
  KVP_ASSIGN_OR_RETURN(c.shared_expert_intermediate_size,
                       hf_u32(j, source, "shared_expert_intermediate_size", kIntermediateSize, 0u));
  if (c.architecture == "gpt_oss") {  // GptOssConfig: every layer's experts are intermediate_size
    KVP_ASSIGN_OR_RETURN(c.num_experts, hf_u32(j, source, "num_local_experts", kExperts, 128u));
    KVP_ASSIGN_OR_RETURN(c.num_experts_used,
                         hf_u32(j, source, "num_experts_per_tok", kExperts, 4u));
    c.expert_intermediate_size = c.intermediate_size;
  }
  if (c.num_experts > 0) {
    KVP_ASSIGN_OR_RETURN(uint32_t step, hf_u32(j, source, "decoder_sparse_step", kLayers, 1u));
    std::vector<bool> dense(c.num_layers, false);
    if (auto only = j.find("mlp_only_layers"); only != j.end() && only->is_array()) {
      for (const nlohmann::json& l : *only) {
        if (l.is_number_unsigned() && l.get<uint64_t>() < c.num_layers)
          dense[l.get<uint64_t>()] = true;
      }
    }
    for (uint32_t l = 0; step > 0 && l < c.num_layers; ++l) {
      if (!dense[l] && (l + 1) % step == 0) ++c.num_moe_layers;
    }
  }
  KVP_RETURN_IF_ERROR(check_consistent(c, source));
  return c;
}

Result<std::string> inspect_model_file(const std::string& path, size_t max_tensors) {
  char magic[4] = {};
  bool is_gguf = false;
  std::error_code ec;
  if (std::filesystem::is_regular_file(path, ec)) {
    std::ifstream in(path, std::ios::binary);
    is_gguf = in.read(magic, 4) && std::memcmp(magic, "GGUF", 4) == 0;
    // a file named .gguf is read as one, so a damaged one (even empty) gets GGUF's errors
    is_gguf = is_gguf || std::filesystem::path(path).extension() == ".gguf";
  }
  if (is_gguf) {
    KVP_ASSIGN_OR_RETURN(GgufFile file, GgufFile::open(path));
    auto config = model_config_from_gguf(file);
    return fmt::format("{}config: {}\n", file.describe(max_tensors),
                       config.is_ok() ? config->describe() : config.status().to_string());
  }
  KVP_ASSIGN_OR_RETURN(SafetensorsModel model, SafetensorsModel::open(path));
  std::string config_line = "no config.json";
  if (model.config() != nullptr) {
    auto config = model_config_from_hf(*model.config(), model.directory() + "/config.json");
    config_line = config.is_ok() ? config->describe() : config.status().to_string();
  }
  return fmt::format("{}config: {}\n", model.describe(max_tensors), config_line);
}

}  // namespace kvp

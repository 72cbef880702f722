#include "model/random_model.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <string_view>

namespace kvp {

namespace {

struct NamedConfig {
  const char* name;
  const char* config_json;
};

// Hugging Face config.json files, verbatim in the fields model_spec_from_hf_config reads
// (tests/model/random_model_test.cc checks them against the fixture and the GGUF file).
constexpr NamedConfig kConfigs[] = {
    {"llama3-8b", R"({
      "architectures": ["LlamaForCausalLM"], "model_type": "llama",
      "attention_bias": false, "mlp_bias": false, "hidden_act": "silu",
      "bos_token_id": 128000, "eos_token_id": 128001,
      "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
      "num_attention_heads": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
      "max_position_embeddings": 131072,
      "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 8192, "rope_type": "llama3"},
      "rope_theta": 500000.0, "tie_word_embeddings": false, "vocab_size": 128256})"},
    {"smollm2-135m", R"({
      "architectures": ["LlamaForCausalLM"], "model_type": "llama",
      "attention_bias": false, "mlp_bias": false, "hidden_act": "silu",
      "bos_token_id": 1, "eos_token_id": 2,
      "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
      "num_attention_heads": 9, "num_key_value_heads": 3, "rms_norm_eps": 1e-05,
      "max_position_embeddings": 8192, "rope_theta": 100000,
      "tie_word_embeddings": true, "vocab_size": 49152})"},
    {"qwen3-30b-a3b", R"({
      "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
      "attention_bias": false, "hidden_act": "silu", "bos_token_id": 151643,
      "eos_token_id": 151645, "hidden_size": 2048, "intermediate_size": 6144,
      "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
      "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": [],
      "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
      "head_dim": 128, "rms_norm_eps": 1e-06, "max_position_embeddings": 40960,
      "rope_theta": 1000000.0, "tie_word_embeddings": false, "vocab_size": 151936})"},
    {"qwen1.5-moe-a2.7b", R"({
      "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe",
      "hidden_act": "silu", "bos_token_id": 151643, "eos_token_id": 151643,
      "hidden_size": 2048, "intermediate_size": 5632, "moe_intermediate_size": 1408,
      "shared_expert_intermediate_size": 5632, "num_experts": 60, "num_experts_per_tok": 4,
      "norm_topk_prob": false, "decoder_sparse_step": 1, "mlp_only_layers": [],
      "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 16,
      "rms_norm_eps": 1e-06, "max_position_embeddings": 8192, "rope_theta": 1000000.0,
      "tie_word_embeddings": false, "vocab_size": 151936})"},
    // openai/gpt-oss-20b's config.json without its quantization_config (MXFP4 experts there,
    // bf16 here)
    {"gpt-oss-20b", R"({
      "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "attention_bias": true,
      "eos_token_id": 200002, "pad_token_id": 199999, "experts_per_token": 4, "head_dim": 64,
      "hidden_act": "silu", "hidden_size": 2880, "initial_context_length": 4096,
      "intermediate_size": 2880, "layer_types": [
        "sliding_attention", "full_attention", "sliding_attention", "full_attention",
        "sliding_attention", "full_attention", "sliding_attention", "full_attention",
        "sliding_attention", "full_attention", "sliding_attention", "full_attention",
        "sliding_attention", "full_attention", "sliding_attention", "full_attention",
        "sliding_attention", "full_attention", "sliding_attention", "full_attention",
        "sliding_attention", "full_attention", "sliding_attention", "full_attention"],
      "max_position_embeddings": 131072, "num_attention_heads": 64, "num_experts_per_tok": 4,
      "num_hidden_layers": 24, "num_key_value_heads": 8, "num_local_experts": 32,
      "rms_norm_eps": 1e-05, "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0,
      "factor": 32.0, "original_max_position_embeddings": 4096, "rope_type": "yarn",
      "truncate": false}, "rope_theta": 150000, "sliding_window": 128, "swiglu_limit": 7.0,
      "tie_word_embeddings": false, "vocab_size": 201088})"},
};

uint64_t splitmix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t hash_name(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (const char c : name) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

const std::vector<std::string>& random_model_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const NamedConfig& c : kConfigs) out.emplace_back(c.name);
    return out;
  }();
  return names;
}

Result<ModelSpec> random_model_spec(const std::string& name) {
  for (const NamedConfig& c : kConfigs) {
    if (name == c.name) {
      return model_spec_from_hf_config(nlohmann::json::parse(c.config_json),
                                       std::string("the ") + c.name + " shape");
    }
  }
  std::string known;
  for (const std::string& n : random_model_names()) known += (known.empty() ? "" : ", ") + n;
  return Status::not_found("random model '{}': unknown shape (known: {})", name, known);
}

uint64_t model_f32_weight_bytes(const ModelSpec& spec) {
  const uint64_t hidden = spec.hidden_size;
  const uint64_t q_dim = uint64_t(spec.num_q_heads) * spec.head_dim;
  const uint64_t kv_dim = uint64_t(spec.num_kv_heads) * spec.head_dim;
  const uint64_t attention = (q_dim + 2 * kv_dim) * hidden + hidden * q_dim + 4 * hidden;
  const uint64_t dense_mlp = 3 * uint64_t(spec.intermediate_size) * hidden;
  // a mixture-of-experts layer: router, experts, and (Qwen2-MoE) the shared expert and its gate
  const uint64_t shared = spec.shared_expert_intermediate_size;
  const uint64_t moe_mlp = uint64_t(spec.num_experts) * hidden +
                           3 * uint64_t(spec.num_experts) * spec.moe_intermediate_size * hidden +
                           (shared > 0 ? 3 * shared * hidden + hidden : 0);
  uint64_t layers = 0;
  for (int32_t l = 0; l < spec.num_layers; ++l) {
    layers += attention + (spec.layer_moe(l) ? moe_mlp : dense_mlp);
  }
  const uint64_t embeddings = uint64_t(spec.vocab_size) * hidden;
  const uint64_t elems = embeddings * (spec.tie_word_embeddings ? 1 : 2) + layers + hidden;
  return elems * sizeof(float);
}

bool RandomWeightSource::contains(const std::string& name) const {
  return name != "lm_head.weight" || !spec_.tie_word_embeddings;
}

Result<std::vector<float>> RandomWeightSource::read_f32(const std::string& name,
                                                        std::span<const int64_t> shape) const {
  if (!contains(name)) {
    return Status::not_found("random weights: no tensor '{}' (tied to the embedding)", name);
  }
  int64_t num_elems = 1;
  for (const int64_t dim : shape) {
    if (dim < 0) return Status::invalid_argument("random weights: '{}' of negative shape", name);
    num_elems *= dim;
  }
  std::vector<float> out(static_cast<size_t>(num_elems));
  if (ends_with(name, "norm.weight")) {
    const bool one_plus_w = spec_.norm_style == cpu::NormStyle::kOnePlusW;
    std::fill(out.begin(), out.end(), one_plus_w ? 0.0f : 1.0f);
    return out;
  }
  const int64_t columns = shape.empty() ? 1 : std::max<int64_t>(1, shape.back());
  const float scale = 1.0f / std::sqrt(static_cast<float>(columns));
  uint64_t state = seed_ ^ hash_name(name);
  for (float& x : out) {
    // 24 random bits -> [-1, 1)
    const float unit = static_cast<float>(splitmix64(&state) >> 40) * (2.0f / 16777216.0f) - 1.0f;
    x = unit * scale;
  }
  return out;
}

}  // namespace kvp

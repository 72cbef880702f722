#include "model/model_spec.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "common/limits.h"

namespace kvp {

using nlohmann::json;

const char* architecture_name(Architecture arch) {
  switch (arch) {
    case Architecture::kLlama:
      return "llama";
    case Architecture::kQwen2:
      return "qwen2";
    case Architecture::kGemma3:
      return "gemma3";
    case Architecture::kQwen3:
      return "qwen3";
    case Architecture::kQwen3Moe:
      return "qwen3_moe";
    case Architecture::kQwen2Moe:
      return "qwen2_moe";
    case Architecture::kGptOss:
      return "gpt_oss";
  }
  return "?";
}

namespace {

// A number the model multiplies or divides by: nan, inf, 0 and negatives are refused.
Status check_positive_finite(std::string_view field, double value) {
  if (std::isfinite(value) && value > 0.0) return Status::ok();
  return Status::invalid_argument("model spec: {} = {} must be a finite number > 0", field, value);
}

Status check_rope(std::string_view which, const RopeSpec& rope) {
  KVP_RETURN_IF_ERROR(check_positive_finite(fmt::format("{} rope theta", which), rope.theta));
  if (rope.scaling.kind != cpu::RopeScaling::Kind::kNone) {
    KVP_RETURN_IF_ERROR(
        check_positive_finite(fmt::format("{} rope scaling factor", which), rope.scaling.factor));
  }
  if (rope.scaling.kind == cpu::RopeScaling::Kind::kLlama3) {
    KVP_RETURN_IF_ERROR(check_positive_finite(fmt::format("{} rope low_freq_factor", which),
                                              rope.scaling.low_freq_factor));
    KVP_RETURN_IF_ERROR(check_positive_finite(fmt::format("{} rope high_freq_factor", which),
                                              rope.scaling.high_freq_factor));
    KVP_RETURN_IF_ERROR(
        check_positive_finite(fmt::format("{} rope original_max_position_embeddings", which),
                              rope.scaling.original_max_position_embeddings));
  }
  for (float f : rope.freq_factors) {
    KVP_RETURN_IF_ERROR(check_positive_finite(fmt::format("{} rope frequency factor", which), f));
  }
  return Status::ok();
}

}  // namespace

Status ModelSpec::validate() const {
  const std::string_view source = "model spec";
  using namespace limits;  // NOLINT(google-build-using-namespace)
  KVP_RETURN_IF_ERROR(check_limit(source, "vocab size", std::max(vocab_size, 0), kVocabSize));
  KVP_RETURN_IF_ERROR(check_limit(source, "hidden size", std::max(hidden_size, 0), kHiddenSize));
  KVP_RETURN_IF_ERROR(
      check_limit(source, "intermediate size", std::max(intermediate_size, 0), kIntermediateSize));
  KVP_RETURN_IF_ERROR(check_limit(source, "layers", std::max(num_layers, 0), kLayers));
  KVP_RETURN_IF_ERROR(check_limit(source, "heads", std::max(num_q_heads, 0), kHeads));
  KVP_RETURN_IF_ERROR(check_limit(source, "kv heads", std::max(num_kv_heads, 0), kHeads));
  KVP_RETURN_IF_ERROR(check_limit(source, "head dim", std::max(head_dim, 0), kHeadDim));
  KVP_RETURN_IF_ERROR(
      check_limit(source, "sliding window", std::max(sliding_window, 0), kSlidingWindow));
  KVP_RETURN_IF_ERROR(
      check_limit(source, "context length", std::max(context_length, 0), kContextLength));
  if (context_length < 0 ||
      (context_length > 0 && static_cast<uint64_t>(context_length) < limits::kMinContextLength)) {
    return Status::invalid_argument(
        "model spec: context length {} is less than kvpool's smallest context of {} tokens",
        context_length, limits::kMinContextLength);
  }
  // a model whose every layer has experts needs no dense intermediate size
  const bool all_moe =
      !layer_is_moe.empty() &&
      std::all_of(layer_is_moe.begin(), layer_is_moe.end(), [](bool b) { return b; });
  if (vocab_size <= 0 || hidden_size <= 0 || (intermediate_size <= 0 && !all_moe) ||
      intermediate_size < 0 || num_layers <= 0 || num_q_heads <= 0 || num_kv_heads <= 0 ||
      head_dim <= 0) {
    return Status::invalid_argument(
        "model spec: sizes must be positive (vocab {}, hidden {}, intermediate {}, layers {}, "
        "heads {}, kv heads {}, head dim {})",
        vocab_size, hidden_size, intermediate_size, num_layers, num_q_heads, num_kv_heads,
        head_dim);
  }
  if (num_q_heads % num_kv_heads != 0) {
    return Status::invalid_argument("model spec: {} attention heads not a multiple of {} kv heads",
                                    num_q_heads, num_kv_heads);
  }
  if (head_dim % 2 != 0) {
    return Status::invalid_argument("model spec: head dim {} is odd (rope needs pairs)", head_dim);
  }
  if (static_cast<int32_t>(layer_is_sliding.size()) != num_layers) {
    return Status::invalid_argument("model spec: {} layer types for {} layers",
                                    layer_is_sliding.size(), num_layers);
  }
  KVP_RETURN_IF_ERROR(check_positive_finite("rms_norm_eps", rms_norm_eps));
  KVP_RETURN_IF_ERROR(check_positive_finite("embedding scale", embedding_scale));
  if (attention_scale != 0.0f) {
    KVP_RETURN_IF_ERROR(check_positive_finite("attention scale", attention_scale));
  }
  for (const auto& [name, cap] : {std::pair{"attention logit softcap", attn_logit_softcap},
                                  std::pair{"final logit softcap", final_logit_softcap}}) {
    if (!std::isfinite(cap) || cap < 0.0f) {
      return Status::invalid_argument("model spec: {} = {} must be a finite number >= 0", name,
                                      cap);
    }
  }
  KVP_RETURN_IF_ERROR(check_rope("global", rope_global));
  KVP_RETURN_IF_ERROR(check_rope("local", rope_local));
  if (bos_token_id < -1 || bos_token_id >= vocab_size) {
    return Status::invalid_argument("model spec: bos token id {} outside the vocabulary of {}",
                                    bos_token_id, vocab_size);
  }
  for (int32_t eos : eos_token_ids) {
    if (eos < 0 || eos >= vocab_size) {
      return Status::invalid_argument("model spec: eos token id {} outside the vocabulary of {}",
                                      eos, vocab_size);
    }
  }
  for (const RopeSpec* rope : {&rope_global, &rope_local}) {
    if (!rope->freq_factors.empty() &&
        static_cast<int32_t>(rope->freq_factors.size()) != head_dim / 2) {
      return Status::invalid_argument("model spec: {} rope frequency factors for head dim {}",
                                      rope->freq_factors.size(), head_dim);
    }
    for (float f : rope->freq_factors) {
      if (!(f > 0.0f)) {
        return Status::invalid_argument("model spec: rope frequency factor {} is not positive", f);
      }
    }
  }
  for (bool sliding : layer_is_sliding) {
    if (sliding && sliding_window <= 0) {
      return Status::invalid_argument("model spec: a sliding layer needs sliding_window > 0");
    }
  }
  return validate_experts();
}

Status ModelSpec::validate_experts() const {
  using namespace limits;  // NOLINT(google-build-using-namespace)
  const std::string_view source = "model spec";
  if (num_experts == 0) {
    if (!layer_is_moe.empty()) {
      return Status::invalid_argument("model spec: mixture-of-experts layers without experts");
    }
    return Status::ok();
  }
  KVP_RETURN_IF_ERROR(check_limit(source, "experts", std::max(num_experts, 0), kExperts));
  KVP_RETURN_IF_ERROR(check_limit(source, "expert intermediate size",
                                  std::max(moe_intermediate_size, 0), kIntermediateSize));
  KVP_RETURN_IF_ERROR(check_limit(source, "shared expert intermediate size",
                                  std::max(shared_expert_intermediate_size, 0), kIntermediateSize));
  if (shared_expert_intermediate_size < 0) {
    return Status::invalid_argument("model spec: shared expert intermediate size {}",
                                    shared_expert_intermediate_size);
  }
  if (num_experts < 0 || moe_intermediate_size <= 0) {
    return Status::invalid_argument("model spec: {} experts of intermediate size {}", num_experts,
                                    moe_intermediate_size);
  }
  if (num_experts_per_tok <= 0 || num_experts_per_tok > num_experts) {
    return Status::invalid_argument("model spec: {} experts per token of {} experts",
                                    num_experts_per_tok, num_experts);
  }
  if (static_cast<int32_t>(layer_is_moe.size()) != num_layers) {
    return Status::invalid_argument("model spec: {} expert-layer flags for {} layers",
                                    layer_is_moe.size(), num_layers);
  }
  return Status::ok();
}

namespace {

// Typed field access with errors that name the file and the field.
class Fields {
 public:
  Fields(const json& j, const std::string& source) : j_(j), source_(source) {}

  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }

  // An integer that fits int32 (a wider one is refused here, before any cast can wrap it).
  Result<int32_t> int_field(const char* key) const {
    if (!has(key)) return Status::invalid_argument("{}: missing field '{}'", source_, key);
    const json& v = j_[key];
    if (!v.is_number_integer()) {
      return Status::invalid_argument("{}: field '{}' is not an integer", source_, key);
    }
    const bool fits = v.is_number_unsigned()
                          ? v.get<uint64_t>() <= uint64_t{std::numeric_limits<int32_t>::max()}
                          : v.get<int64_t>() >= std::numeric_limits<int32_t>::min() &&
                                v.get<int64_t>() <= std::numeric_limits<int32_t>::max();
    if (!fits) {
      return Status::invalid_argument("{}: field '{}' = {} does not fit in 32 bits", source_, key,
                                      v.dump());
    }
    return v.get<int32_t>();
  }
  // int_field, refused past limit.max (checked where the value enters).
  Result<int32_t> int_field(const char* key, const Limit& limit) const {
    KVP_ASSIGN_OR_RETURN(int32_t x, int_field(key));
    if (x > 0) KVP_RETURN_IF_ERROR(check_limit(source_, fmt::format("'{}'", key), x, limit));
    return x;
  }
  Result<int32_t> int_field(const char* key, const Limit& limit, int32_t fallback) const {
    return has(key) ? int_field(key, limit) : Result<int32_t>(fallback);
  }
  Result<int32_t> int_field(const char* key, int32_t fallback) const {
    return has(key) ? int_field(key) : Result<int32_t>(fallback);
  }
  Result<double> number_field(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    if (!j_[key].is_number()) {
      return Status::invalid_argument("{}: field '{}' is not a number", source_, key);
    }
    return j_[key].get<double>();
  }
  // number_field, refused unless finite and > 0 (rope bases, norm epsilon).
  Result<double> positive_field(const char* key, double fallback) const {
    KVP_ASSIGN_OR_RETURN(double x, number_field(key, fallback));
    if (!std::isfinite(x) || !(x > 0.0)) {
      return Status::invalid_argument("{}: field '{}' = {} must be a finite number > 0", source_,
                                      key, x);
    }
    return x;
  }
  Result<bool> bool_field(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!j_[key].is_boolean()) {
      return Status::invalid_argument("{}: field '{}' is not a boolean", source_, key);
    }
    return j_[key].get<bool>();
  }
  Result<std::string> string_field(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    if (!j_[key].is_string()) {
      return Status::invalid_argument("{}: field '{}' is not a string", source_, key);
    }
    return j_[key].get<std::string>();
  }

 private:
  const json& j_;
  const std::string& source_;
};

// One rope description: {"rope_type"|"type", "rope_theta", "factor", llama3 fields}.
Result<RopeSpec> parse_rope(const json& r, double default_theta, const std::string& source) {
  if (!r.is_object()) {
    return Status::invalid_argument("{}: a rope description is {}, expected an object", source,
                                    r.type_name());
  }
  RopeSpec rope;
  Fields f(r, source);
  KVP_ASSIGN_OR_RETURN(rope.theta, f.positive_field("rope_theta", default_theta));
  KVP_ASSIGN_OR_RETURN(std::string type, f.string_field("rope_type", ""));
  if (type.empty()) {
    KVP_ASSIGN_OR_RETURN(type, f.string_field("type", "default"));
  }
  if (type == "default") {
    rope.scaling.kind = cpu::RopeScaling::Kind::kNone;
  } else if (type == "linear") {
    rope.scaling.kind = cpu::RopeScaling::Kind::kLinear;
    KVP_ASSIGN_OR_RETURN(rope.scaling.factor, f.number_field("factor", 1.0));
  } else if (type == "llama3") {
    rope.scaling.kind = cpu::RopeScaling::Kind::kLlama3;
    KVP_ASSIGN_OR_RETURN(rope.scaling.factor, f.number_field("factor", 8.0));
    KVP_ASSIGN_OR_RETURN(rope.scaling.low_freq_factor, f.number_field("low_freq_factor", 1.0));
    KVP_ASSIGN_OR_RETURN(rope.scaling.high_freq_factor, f.number_field("high_freq_factor", 4.0));
    KVP_ASSIGN_OR_RETURN(rope.scaling.original_max_position_embeddings,
                         f.number_field("original_max_position_embeddings", 8192.0));
    if (rope.scaling.high_freq_factor <= rope.scaling.low_freq_factor) {
      return Status::invalid_argument("{}: llama3 rope needs high_freq_factor > low_freq_factor",
                                      source);
    }
  } else if (type == "yarn") {
    rope.scaling.kind = cpu::RopeScaling::Kind::kYarn;
    KVP_ASSIGN_OR_RETURN(rope.scaling.factor, f.positive_field("factor", 1.0));
    KVP_ASSIGN_OR_RETURN(rope.scaling.original_max_position_embeddings,
                         f.positive_field("original_max_position_embeddings", 4096.0));
    // transformers: `beta_fast or 32`, `beta_slow or 1` (0 and null take the default)
    KVP_ASSIGN_OR_RETURN(rope.scaling.beta_fast, f.number_field("beta_fast", 32.0));
    KVP_ASSIGN_OR_RETURN(rope.scaling.beta_slow, f.number_field("beta_slow", 1.0));
    if (rope.scaling.beta_fast == 0.0) rope.scaling.beta_fast = 32.0;
    if (rope.scaling.beta_slow == 0.0) rope.scaling.beta_slow = 1.0;
    KVP_RETURN_IF_ERROR(check_positive_finite("yarn beta_fast", rope.scaling.beta_fast));
    KVP_RETURN_IF_ERROR(check_positive_finite("yarn beta_slow", rope.scaling.beta_slow));
    KVP_ASSIGN_OR_RETURN(rope.scaling.truncate, f.bool_field("truncate", true));
    // the attention factor: given, else from mscale / mscale_all_dim, else 0.1 ln(factor) + 1
    const auto mscale = [](double scale, double m) {
      return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
    };
    KVP_ASSIGN_OR_RETURN(double m, f.number_field("mscale", 0.0));
    KVP_ASSIGN_OR_RETURN(double m_all, f.number_field("mscale_all_dim", 0.0));
    rope.scaling.attention_factor =
        m != 0.0 && m_all != 0.0
            ? mscale(rope.scaling.factor, m) / mscale(rope.scaling.factor, m_all)
            : mscale(rope.scaling.factor, 1.0);
    if (f.has("attention_factor")) {
      KVP_ASSIGN_OR_RETURN(rope.scaling.attention_factor,
                           f.positive_field("attention_factor", 1.0));
    }
  } else {
    return Status::unsupported(
        "{}: rope type '{}' is not supported (default, linear, llama3, yarn)", source, type);
  }
  return rope;
}

// The expert fields of Qwen3MoeConfig / Qwen2MoeConfig, with their defaults: num_experts 128 / 60
// (transformers 5 writes Qwen3-MoE's as num_local_experts), num_experts_per_tok 8 / 4,
// moe_intermediate_size 768 / 1408, Qwen2-MoE's shared_expert_intermediate_size 5632,
// norm_topk_prob false, decoder_sparse_step 1, mlp_only_layers []. Layer l has experts unless
// listed in mlp_only_layers or (l + 1) % decoder_sparse_step != 0.
Status parse_experts(const json& config, const std::string& source, ModelSpec* spec) {
  Fields f(config, source);
  using namespace limits;  // NOLINT(google-build-using-namespace)
  const bool qwen2 = spec->architecture == Architecture::kQwen2Moe;
  KVP_ASSIGN_OR_RETURN(spec->num_experts,
                       f.int_field("num_local_experts", kExperts, qwen2 ? 60 : 128));
  if (f.has("num_experts")) {
    KVP_ASSIGN_OR_RETURN(spec->num_experts, f.int_field("num_experts", kExperts));
  }
  KVP_ASSIGN_OR_RETURN(spec->num_experts_per_tok,
                       f.int_field("num_experts_per_tok", kExperts, qwen2 ? 4 : 8));
  KVP_ASSIGN_OR_RETURN(spec->moe_intermediate_size,
                       f.int_field("moe_intermediate_size", kIntermediateSize, qwen2 ? 1408 : 768));
  if (qwen2) {
    KVP_ASSIGN_OR_RETURN(spec->shared_expert_intermediate_size,
                         f.int_field("shared_expert_intermediate_size", kIntermediateSize, 5632));
  }
  KVP_ASSIGN_OR_RETURN(spec->norm_topk_prob, f.bool_field("norm_topk_prob", false));
  KVP_ASSIGN_OR_RETURN(int32_t sparse_step, f.int_field("decoder_sparse_step", kLayers, 1));
  if (sparse_step <= 0) {
    return Status::invalid_argument("{}: decoder_sparse_step {} must be positive", source,
                                    sparse_step);
  }
  std::vector<bool> dense(spec->num_layers, false);
  if (f.has("mlp_only_layers")) {
    const json& only = config["mlp_only_layers"];
    if (!only.is_array()) {
      return Status::invalid_argument("{}: 'mlp_only_layers' is not a list", source);
    }
    for (const json& l : only) {
      if (!l.is_number_integer() || l.get<int64_t>() < 0 || l.get<int64_t>() >= spec->num_layers) {
        return Status::invalid_argument("{}: mlp_only_layers entry {} is not a layer of {}", source,
                                        l.dump(), spec->num_layers);
      }
      dense[l.get<int64_t>()] = true;
    }
  }
  spec->layer_is_moe.assign(spec->num_layers, false);
  if (spec->num_experts == 0) {  // transformers: no layer has experts
    spec->layer_is_moe.clear();
    return Status::ok();
  }
  for (int32_t l = 0; l < spec->num_layers; ++l) {
    spec->layer_is_moe[l] = !dense[l] && (l + 1) % sparse_step == 0;
  }
  return Status::ok();
}

// layer_types: "sliding_attention" or "full_attention" per layer, into layer_is_sliding.
Status parse_layer_types(const json& config, const std::string& source, ModelSpec* spec) {
  const json& types = config["layer_types"];
  if (!types.is_array() || static_cast<int32_t>(types.size()) != spec->num_layers) {
    return Status::invalid_argument("{}: 'layer_types' must list {} layers", source,
                                    spec->num_layers);
  }
  for (int32_t i = 0; i < spec->num_layers; ++i) {
    const std::string t = types[i].is_string() ? types[i].get<std::string>() : "";
    if (t != "sliding_attention" && t != "full_attention") {
      return Status::invalid_argument("{}: layer_types[{}] = {} is not a known layer type", source,
                                      i, types[i].dump());
    }
    spec->layer_is_sliding[i] = t == "sliding_attention";
  }
  return Status::ok();
}

// GptOssConfig's fields and defaults: num_local_experts 128, num_experts_per_tok 4, experts of
// intermediate_size in every layer, sliding_window 128, layer_types alternating sliding (even
// layers) and full (odd layers).
Status parse_gpt_oss(const json& config, const std::string& source, ModelSpec* spec) {
  Fields f(config, source);
  using namespace limits;  // NOLINT(google-build-using-namespace)
  KVP_ASSIGN_OR_RETURN(spec->num_experts, f.int_field("num_local_experts", kExperts, 128));
  KVP_ASSIGN_OR_RETURN(spec->num_experts_per_tok, f.int_field("num_experts_per_tok", kExperts, 4));
  spec->moe_intermediate_size = spec->intermediate_size;
  spec->norm_topk_prob = true;  // softmax over the top-k logits
  spec->expert_bias = true;
  spec->moe_activation = cpu::Activation::kClampedSwiglu;
  spec->layer_is_moe.assign(spec->num_layers, true);
  KVP_ASSIGN_OR_RETURN(spec->sliding_window, f.int_field("sliding_window", kSlidingWindow, 128));
  if (f.has("layer_types")) return parse_layer_types(config, source, spec);
  for (int32_t i = 0; i < spec->num_layers; ++i) spec->layer_is_sliding[i] = (i + 1) % 2 != 0;
  return Status::ok();
}

}  // namespace

Result<ModelSpec> model_spec_from_hf_config(const json& root, const std::string& source) {
  if (!root.is_object()) return Status::invalid_argument("{}: not a JSON object", source);
  const json& config = root.contains("text_config") ? root["text_config"] : root;
  Fields f(config, source);
  Fields top(root, source);

  KVP_ASSIGN_OR_RETURN(std::string model_type, f.string_field("model_type", ""));
  if (model_type.empty()) {
    KVP_ASSIGN_OR_RETURN(model_type, top.string_field("model_type", ""));
  }
  ModelSpec spec;
  if (model_type == "llama") {
    spec.architecture = Architecture::kLlama;
  } else if (model_type == "qwen2") {
    spec.architecture = Architecture::kQwen2;
  } else if (model_type == "qwen3") {
    spec.architecture = Architecture::kQwen3;
  } else if (model_type == "qwen3_moe") {
    spec.architecture = Architecture::kQwen3Moe;
  } else if (model_type == "qwen2_moe") {
    spec.architecture = Architecture::kQwen2Moe;
  } else if (model_type == "gpt_oss") {
    spec.architecture = Architecture::kGptOss;
  } else if (model_type == "gemma3_text" || model_type == "gemma3") {
    spec.architecture = Architecture::kGemma3;
  } else {
    return Status::unsupported(
        "{}: model_type '{}' is not supported (llama, qwen2, qwen2_moe, qwen3, qwen3_moe, "
        "gpt_oss, gemma3_text)",
        source, model_type);
  }
  const bool gemma = spec.architecture == Architecture::kGemma3;
  // Qwen3-MoE's attention is Qwen3's
  const bool qwen3 =
      spec.architecture == Architecture::kQwen3 || spec.architecture == Architecture::kQwen3Moe;
  const bool qwen2_moe = spec.architecture == Architecture::kQwen2Moe;
  const bool gpt_oss = spec.architecture == Architecture::kGptOss;

  using namespace limits;  // NOLINT(google-build-using-namespace)
  KVP_ASSIGN_OR_RETURN(spec.vocab_size, f.int_field("vocab_size", kVocabSize));
  KVP_ASSIGN_OR_RETURN(spec.hidden_size, f.int_field("hidden_size", kHiddenSize));
  KVP_ASSIGN_OR_RETURN(spec.intermediate_size,
                       gpt_oss ? f.int_field("intermediate_size", kIntermediateSize, 2880)
                               : f.int_field("intermediate_size", kIntermediateSize));
  KVP_ASSIGN_OR_RETURN(spec.num_layers, f.int_field("num_hidden_layers", kLayers));
  KVP_ASSIGN_OR_RETURN(spec.num_q_heads, f.int_field("num_attention_heads", kHeads));
  KVP_ASSIGN_OR_RETURN(spec.num_kv_heads,
                       f.int_field("num_key_value_heads", kHeads, spec.num_q_heads));
  if (spec.num_q_heads <= 0) {
    return Status::invalid_argument("{}: num_attention_heads {} must be positive", source,
                                    spec.num_q_heads);
  }
  // Qwen3Config's head_dim defaults to 128, not hidden / heads (Qwen3MoeConfig's does not)
  // GptOssConfig's is 64
  const int32_t default_head_dim = spec.architecture == Architecture::kQwen3 ? 128
                                   : gpt_oss                                 ? 64
                                             : spec.hidden_size / spec.num_q_heads;
  KVP_ASSIGN_OR_RETURN(spec.head_dim, f.int_field("head_dim", kHeadDim, default_head_dim));
  if (spec.num_layers < 0) {
    return Status::invalid_argument("{}: num_hidden_layers {} must be positive", source,
                                    spec.num_layers);
  }
  KVP_ASSIGN_OR_RETURN(spec.context_length,
                       f.int_field("max_position_embeddings", kContextLength, 0));
  if (f.has("max_position_embeddings") &&
      (spec.context_length < 0 ||
       static_cast<uint64_t>(spec.context_length) < limits::kMinContextLength)) {
    return Status::invalid_argument(
        "{}: max_position_embeddings {} is less than kvpool's smallest context of {} tokens",
        source, spec.context_length, limits::kMinContextLength);
  }
  KVP_ASSIGN_OR_RETURN(double eps, f.positive_field("rms_norm_eps", 1e-6));
  spec.rms_norm_eps = static_cast<float>(eps);
  KVP_ASSIGN_OR_RETURN(spec.tie_word_embeddings, top.bool_field("tie_word_embeddings", gemma));
  if (f.has("tie_word_embeddings")) {
    KVP_ASSIGN_OR_RETURN(spec.tie_word_embeddings, f.bool_field("tie_word_embeddings", gemma));
  }
  KVP_ASSIGN_OR_RETURN(bool mlp_bias, f.bool_field("mlp_bias", false));
  if (mlp_bias) return Status::unsupported("{}: mlp_bias = true is not supported", source);
  if (spec.architecture == Architecture::kQwen2 || qwen2_moe || qwen3) {
    // Qwen2 always has q/k/v biases, Qwen2-MoE unless qkv_bias = false; Qwen3 has them only with
    // attention_bias = true
    spec.qkv_bias = true;
    if (qwen3) {
      KVP_ASSIGN_OR_RETURN(spec.qkv_bias, f.bool_field("attention_bias", false));
    }
    if (qwen2_moe) {
      KVP_ASSIGN_OR_RETURN(spec.qkv_bias, f.bool_field("qkv_bias", true));
    }
    spec.qk_norm = qwen3;  // plain x / rms * w, per head, before rope
    KVP_ASSIGN_OR_RETURN(bool sliding, f.bool_field("use_sliding_window", false));
    if (sliding) {
      return Status::unsupported("{}: {} with use_sliding_window = true is not supported", source,
                                 qwen3 ? "Qwen3" : "Qwen2");
    }
  } else if (gpt_oss) {
    // OpenAI's checkpoints store the experts as MXFP4 blocks and scales, which this reader does
    // not convert (their GGUF does load)
    if (top.has("quantization_config")) {
      return Status::unsupported(
          "{}: gpt_oss with a quantization_config (OpenAI's MXFP4 experts) is not supported from "
          "safetensors; use its GGUF or a dequantised checkpoint",
          source);
    }
    // GptOssConfig: attention_bias (default true) gives q, k, v and o their biases
    KVP_ASSIGN_OR_RETURN(spec.qkv_bias, f.bool_field("attention_bias", true));
    spec.o_bias = spec.qkv_bias;
    spec.attention_sinks = true;
  } else if (spec.architecture == Architecture::kLlama) {
    KVP_ASSIGN_OR_RETURN(bool attention_bias, f.bool_field("attention_bias", false));
    if (attention_bias) {
      return Status::unsupported("{}: Llama with attention_bias = true is not supported", source);
    }
  }

  spec.attention_scale = 1.0f / std::sqrt(static_cast<float>(spec.head_dim));
  spec.layer_is_sliding.assign(spec.num_layers, false);
  if (spec.architecture == Architecture::kQwen3Moe ||
      spec.architecture == Architecture::kQwen2Moe) {
    KVP_RETURN_IF_ERROR(parse_experts(config, source, &spec));
  }
  if (gpt_oss) KVP_RETURN_IF_ERROR(parse_gpt_oss(config, source, &spec));
  if (gemma) {
    spec.activation = cpu::Activation::kGeluTanh;
    spec.norm_style = cpu::NormStyle::kOnePlusW;
    spec.embedding_scale = std::sqrt(static_cast<float>(spec.hidden_size));
    KVP_ASSIGN_OR_RETURN(double scalar,
                         f.number_field("query_pre_attn_scalar", double(spec.head_dim)));
    spec.attention_scale = static_cast<float>(1.0 / std::sqrt(scalar));
    KVP_ASSIGN_OR_RETURN(double attn_cap, f.number_field("attn_logit_softcapping", 0.0));
    KVP_ASSIGN_OR_RETURN(double final_cap, f.number_field("final_logit_softcapping", 0.0));
    spec.attn_logit_softcap = static_cast<float>(attn_cap);
    spec.final_logit_softcap = static_cast<float>(final_cap);
    spec.qk_norm = true;
    spec.sandwich_norms = true;
    KVP_ASSIGN_OR_RETURN(spec.sliding_window, f.int_field("sliding_window", kSlidingWindow, 4096));
    if (f.has("layer_types")) {
      KVP_RETURN_IF_ERROR(parse_layer_types(config, source, &spec));
    } else {
      KVP_ASSIGN_OR_RETURN(int32_t pattern, f.int_field("sliding_window_pattern", kLayers, 6));
      if (pattern <= 0) {
        return Status::invalid_argument("{}: sliding_window_pattern {} must be positive", source,
                                        pattern);
      }
      for (int32_t i = 0; i < spec.num_layers; ++i) {
        spec.layer_is_sliding[i] = (i + 1) % pattern != 0;
      }
    }
  }

  // Rope: transformers 5 writes rope_parameters (per layer type for Gemma 3); older configs
  // write rope_theta / rope_scaling (and rope_local_base_freq for Gemma 3's sliding layers).
  if (f.has("rope_parameters")) {
    const json& rp = config["rope_parameters"];
    if (!rp.is_object()) {
      return Status::invalid_argument("{}: field 'rope_parameters' is {}, expected an object",
                                      source, rp.type_name());
    }
    if (gemma && rp.contains("full_attention")) {
      KVP_ASSIGN_OR_RETURN(spec.rope_global, parse_rope(rp["full_attention"], 1e6, source));
      if (rp.contains("sliding_attention")) {
        KVP_ASSIGN_OR_RETURN(spec.rope_local, parse_rope(rp["sliding_attention"], 1e4, source));
      }
    } else {
      KVP_ASSIGN_OR_RETURN(spec.rope_global, parse_rope(rp, gpt_oss ? 150000.0 : 10000.0, source));
      spec.rope_local = spec.rope_global;
    }
  } else {
    json legacy = f.has("rope_scaling") ? config["rope_scaling"] : json::object();
    if (!legacy.is_object()) {
      return Status::invalid_argument("{}: field 'rope_scaling' is {}, expected an object", source,
                                      legacy.type_name());
    }
    if (gpt_oss && !f.has("rope_scaling")) {  // GptOssConfig's default rope
      legacy = json{{"rope_type", "yarn"}, {"factor", 32.0},
                    {"beta_fast", 32.0},   {"beta_slow", 1.0},
                    {"truncate", false},   {"original_max_position_embeddings", 4096}};
    }
    const double default_theta = gemma ? 1e6 : gpt_oss ? 150000.0 : 10000.0;
    KVP_ASSIGN_OR_RETURN(double theta, f.positive_field("rope_theta", default_theta));
    legacy["rope_theta"] = theta;
    KVP_ASSIGN_OR_RETURN(spec.rope_global, parse_rope(legacy, theta, source));
    if (gemma) {
      KVP_ASSIGN_OR_RETURN(double local_theta, f.positive_field("rope_local_base_freq", 10000.0));
      spec.rope_local.theta = local_theta;
    } else {
      spec.rope_local = spec.rope_global;
    }
  }

  // YaRN scales cos and sin by its attention factor: q·k by its square. Both ropes are one
  // description except Gemma 3's, which has no YaRN.
  if (spec.rope_global.scaling.kind == cpu::RopeScaling::Kind::kYarn) {
    if (gemma) return Status::unsupported("{}: Gemma 3 with YaRN rope", source);
    const double factor = spec.rope_global.scaling.attention_factor;
    spec.attention_scale = static_cast<float>(spec.attention_scale * factor * factor);
  }

  KVP_ASSIGN_OR_RETURN(spec.bos_token_id, top.int_field("bos_token_id", -1));
  if (top.has("eos_token_id")) {
    const json& eos = root["eos_token_id"];
    // ids are checked against the vocabulary by validate(); here they must be integers that fit
    const auto push_id = [&](const json& e) -> Status {
      if (!e.is_number_integer() || e.get<int64_t>() < std::numeric_limits<int32_t>::min() ||
          (e.is_number_unsigned() ? e.get<uint64_t>() > uint64_t{INT32_MAX}
                                  : e.get<int64_t>() > INT32_MAX)) {
        return Status::invalid_argument("{}: eos_token_id {} is not a 32-bit integer", source,
                                        e.dump());
      }
      spec.eos_token_ids.push_back(e.get<int32_t>());
      return Status::ok();
    };
    if (eos.is_number_integer()) {
      KVP_RETURN_IF_ERROR(push_id(eos));
    } else if (eos.is_array()) {
      for (const json& e : eos) KVP_RETURN_IF_ERROR(push_id(e));
    } else {
      return Status::invalid_argument("{}: eos_token_id is neither an integer nor a list", source);
    }
  }
  KVP_RETURN_IF_ERROR(spec.validate());
  return spec;
}

Result<ModelSpec> load_hf_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::not_found("{}: cannot open", path);
  json config = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded()) return Status::corruption("{}: not valid JSON", path);
  // transformers' generate stops at generation_config.json's eos_token_id too (GPT-OSS lists
  // <|return|>, <|endoftext|> and <|call|> there): its ids join config.json's
  const std::filesystem::path generation =
      std::filesystem::path(path).parent_path() / "generation_config.json";
  if (std::ifstream gen_in(generation); gen_in && config.is_object()) {
    const json gen = json::parse(gen_in, nullptr, /*allow_exceptions=*/false);
    if (gen.is_object() && gen.contains("eos_token_id")) {
      json ids = json::array();
      const auto add = [&ids](const json& eos) {
        if (!eos.is_array()) {
          if (!eos.is_null() && std::find(ids.begin(), ids.end(), eos) == ids.end()) {
            ids.push_back(eos);
          }
          return;
        }
        for (const json& id : eos) {
          if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
        }
      };
      if (config.contains("eos_token_id")) add(config["eos_token_id"]);
      add(gen["eos_token_id"]);
      config["eos_token_id"] = ids;
    }
  }
  return model_spec_from_hf_config(config, path);
}

}  // namespace kvp

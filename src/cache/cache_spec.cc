// CacheSpec: geometry, cache groups and pool sizing; parsing of Hugging Face config.json files.
#include "cache/cache_spec.h"

#include "cache/kv_quant.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <limits>
#include <sstream>

#include "common/limits.h"

namespace kvp {
namespace {

using nlohmann::json;

constexpr auto kMaxLayers = static_cast<int32_t>(limits::kLayers.max);
constexpr auto kMaxHeads = static_cast<int32_t>(limits::kHeads.max);
constexpr auto kMaxHeadDim = static_cast<int32_t>(limits::kHeadDim.max);

bool valid_block_size(int32_t block_size) {
  return block_size >= 1 && block_size <= 1024 && (block_size & (block_size - 1)) == 0;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// What transformers' config classes fill in when a config.json leaves a field out, for the
// architectures whose defaults are not the generic ones (num_key_value_heads = heads,
// head_dim = hidden / heads, no window).
struct ArchDefaults {
  std::string_view model_type;
  int32_t num_attention_heads;
  int32_t num_key_value_heads;
  int32_t head_dim;
  int32_t sliding_window;
  int32_t sliding_window_pattern;  // layer i is global iff (i + 1) % pattern == 0
};
// Gemma3TextConfig, Gemma2Config, GptOssConfig.
constexpr ArchDefaults kArchDefaults[] = {
    {"gemma3_text", 8, 4, 256, 4096, 6},
    {"gemma3", 8, 4, 256, 4096, 6},
    {"gemma2", 8, 4, 256, 4096, 2},
    {"gpt_oss", 64, 8, 64, 128, 2},
};

const ArchDefaults* find_defaults(std::string_view model_type) {
  for (const ArchDefaults& d : kArchDefaults) {
    if (d.model_type == model_type) return &d;
  }
  return nullptr;
}

bool is_qwen_family(std::string_view model_type) {
  return model_type.starts_with("qwen2") || model_type.starts_with("qwen3");
}

// Reads fields of one JSON object, naming "<source>" and "<prefix><field>" in every error.
class FieldReader {
 public:
  FieldReader(const json& object, std::string_view source, std::string prefix)
      : object_(object), source_(source), prefix_(std::move(prefix)) {}

  bool has(std::string_view name) const {
    auto it = object_.find(name);
    return it != object_.end() && !it->is_null();
  }

  Status error(std::string_view name, std::string_view reason) const {
    return Status::invalid_argument("config '{}': field '{}{}': {}", source_, prefix_, name,
                                    reason);
  }
  Status unsupported(std::string_view name, std::string_view reason) const {
    return Status::unsupported("config '{}': field '{}{}': {}", source_, prefix_, name, reason);
  }

  // An integer in [lo, hi]; an error "missing" if the field is absent or null.
  Result<int32_t> int_in(std::string_view name, int32_t lo, int32_t hi) const {
    return int_in_or(name, lo, hi, nullptr);
  }
  // The same, but *fallback (if not null) for an absent or null field.
  Result<int32_t> int_in_or(std::string_view name, int32_t lo, int32_t hi,
                            const int32_t* fallback) const {
    auto it = object_.find(name);
    if (it == object_.end() || it->is_null()) {
      if (fallback != nullptr) return *fallback;
      return error(name, "missing");
    }
    if (!it->is_number_integer()) {
      return error(name, fmt::format("must be an integer, got {}", it->dump()));
    }
    const int64_t value = it->get<int64_t>();
    if (it->is_number_unsigned() &&
        it->get<uint64_t>() > uint64_t{std::numeric_limits<int64_t>::max()}) {
      return error(name, fmt::format("must be between {} and {}, got {}", lo, hi, it->dump()));
    }
    if (value < lo || value > hi) {
      return error(name, fmt::format("must be between {} and {}, got {}", lo, hi, value));
    }
    return static_cast<int32_t>(value);
  }

  Result<std::optional<bool>> optional_bool(std::string_view name) const {
    auto it = object_.find(name);
    if (it == object_.end() || it->is_null()) return std::optional<bool>{};
    if (!it->is_boolean())
      return error(name, fmt::format("must be true or false, got {}", it->dump()));
    return std::optional<bool>{it->get<bool>()};
  }

  Result<std::optional<std::string>> optional_string(std::string_view name) const {
    auto it = object_.find(name);
    if (it == object_.end() || it->is_null()) return std::optional<std::string>{};
    if (!it->is_string()) return error(name, fmt::format("must be a string, got {}", it->dump()));
    return std::optional<std::string>{it->get<std::string>()};
  }

  const json* find(std::string_view name) const {
    auto it = object_.find(name);
    return it == object_.end() || it->is_null() ? nullptr : &*it;
  }

 private:
  const json& object_;
  std::string_view source_;
  std::string prefix_;
};

Result<std::vector<LayerAttention>> parse_layer_attention(const FieldReader& cfg,
                                                          std::string_view model_type,
                                                          const ArchDefaults* defaults,
                                                          int32_t num_layers) {
  std::vector<LayerAttention> layers(num_layers, LayerAttention::global());
  const int32_t* default_window = defaults ? &defaults->sliding_window : nullptr;
  auto window = [&]() { return cfg.int_in_or("sliding_window", 1, 1 << 30, default_window); };

  // 0. A window switched off (Qwen2 family): transformers drops sliding_window, so even layers
  //    a layer_types list calls sliding attend globally.
  KVP_ASSIGN_OR_RETURN(const std::optional<bool> use_sliding,
                       cfg.optional_bool("use_sliding_window"));
  if (use_sliding && !*use_sliding) return layers;

  // 1. An explicit per-layer list.
  if (const json* types = cfg.find("layer_types")) {
    if (!types->is_array()) return cfg.error("layer_types", "must be a list of strings");
    if (static_cast<int64_t>(types->size()) != num_layers) {
      return cfg.error("layer_types",
                       fmt::format("has {} entries for {} layers (num_hidden_layers)",
                                   types->size(), num_layers));
    }
    for (int32_t i = 0; i < num_layers; ++i) {
      const json& t = (*types)[i];
      const std::string name = fmt::format("layer_types[{}]", i);
      if (!t.is_string()) return cfg.error(name, fmt::format("must be a string, got {}", t.dump()));
      const std::string kind = t.get<std::string>();
      if (kind == "full_attention") continue;
      if (kind == "sliding_attention") {
        KVP_ASSIGN_OR_RETURN(const int32_t w, window());
        layers[i] = LayerAttention::sliding(w);
        continue;
      }
      return cfg.unsupported(name, fmt::format("attention kind '{}' is not supported (kvpool "
                                               "knows full_attention and sliding_attention)",
                                               kind));
    }
    return layers;
  }

  // 2. A period: every P-th layer global, the others windowed (Gemma 2/3, GPT-OSS defaults).
  std::optional<int32_t> pattern;
  for (std::string_view key : {"sliding_window_pattern", "_sliding_window_pattern"}) {
    if (cfg.has(key)) {
      KVP_ASSIGN_OR_RETURN(pattern, cfg.int_in(key, 1, kMaxLayers));
      break;
    }
  }
  if (!pattern && defaults) pattern = defaults->sliding_window_pattern;
  if (pattern) {
    KVP_ASSIGN_OR_RETURN(const int32_t w, window());
    for (int32_t i = 0; i < num_layers; ++i) {
      if ((i + 1) % *pattern != 0) layers[i] = LayerAttention::sliding(w);
    }
    return layers;
  }

  // 3. No window at all.
  if (!cfg.has("sliding_window")) return layers;

  // 4. Qwen2 family: only layers from max_window_layers on slide (transformers' Qwen2Config).
  KVP_ASSIGN_OR_RETURN(const int32_t w, window());
  int32_t first_sliding = 0;
  if (is_qwen_family(model_type)) {
    constexpr int32_t kQwenMaxWindowLayers = 28;  // Qwen2Config's default
    KVP_ASSIGN_OR_RETURN(first_sliding,
                         cfg.int_in_or("max_window_layers", 0, kMaxLayers, &kQwenMaxWindowLayers));
  }
  // 5. Otherwise (Mistral style) every layer slides.
  for (int32_t i = first_sliding; i < num_layers; ++i) layers[i] = LayerAttention::sliding(w);
  return layers;
}

}  // namespace

std::string to_string(const LayerAttention& attention) {
  return attention.is_windowed() ? fmt::format("window {}", attention.window_tokens) : "global";
}

Result<CacheSpec> CacheSpec::create(std::string architecture, int32_t num_layers,
                                    int32_t num_kv_heads, int32_t head_dim, DType dtype,
                                    int32_t block_size,
                                    std::vector<LayerAttention> layer_attention) {
  if (num_layers < 1 || num_layers > kMaxLayers) {
    return Status::invalid_argument("cache spec: num_layers must be between 1 and {}, got {}",
                                    kMaxLayers, num_layers);
  }
  if (num_kv_heads < 1 || num_kv_heads > kMaxHeads) {
    return Status::invalid_argument("cache spec: num_kv_heads must be between 1 and {}, got {}",
                                    kMaxHeads, num_kv_heads);
  }
  if (head_dim < 1 || head_dim > kMaxHeadDim) {
    return Status::invalid_argument("cache spec: head_dim must be between 1 and {}, got {}",
                                    kMaxHeadDim, head_dim);
  }
  if (!valid_block_size(block_size)) {
    return Status::invalid_argument(
        "cache spec: block_size must be a power of two between 1 and 1024, got {}", block_size);
  }
  if (static_cast<int64_t>(layer_attention.size()) != num_layers) {
    return Status::invalid_argument("cache spec: {} layer attention entries for {} layers",
                                    layer_attention.size(), num_layers);
  }
  for (size_t i = 0; i < layer_attention.size(); ++i) {
    const LayerAttention& a = layer_attention[i];
    const bool ok = a.is_windowed() ? a.window_tokens > 0
                                    : a.kind == AttentionKind::Global && a.window_tokens == 0;
    if (!ok) {
      return Status::invalid_argument(
          "cache spec: layer {}: invalid attention (kind {}, window {})", i,
          static_cast<int>(a.kind), a.window_tokens);
    }
  }
  CacheSpec spec;
  spec.architecture_ = std::move(architecture);
  spec.num_layers_ = num_layers;
  spec.num_kv_heads_ = num_kv_heads;
  spec.head_dim_ = head_dim;
  spec.dtype_ = dtype;
  spec.block_size_ = block_size;
  spec.layer_attention_ = std::move(layer_attention);
  spec.build_groups();
  return spec;
}

void CacheSpec::build_groups() {
  groups_.clear();
  for (int32_t layer = 0; layer < num_layers_; ++layer) {
    const LayerAttention& a = layer_attention_[layer];
    auto it = std::find_if(groups_.begin(), groups_.end(),
                           [&](const CacheGroup& g) { return g.attention == a; });
    if (it == groups_.end()) {
      groups_.push_back(CacheGroup{a, {}});
      it = groups_.end() - 1;
    }
    it->layers.push_back(layer);
  }
  // Global first, then windows ascending.
  std::sort(groups_.begin(), groups_.end(), [](const CacheGroup& a, const CacheGroup& b) {
    if (a.attention.is_windowed() != b.attention.is_windowed()) return !a.attention.is_windowed();
    return a.attention.window_tokens < b.attention.window_tokens;
  });
  layer_group_.assign(num_layers_, 0);
  layer_in_group_.assign(num_layers_, 0);
  for (int32_t g = 0; g < num_groups(); ++g) {
    for (size_t i = 0; i < groups_[g].layers.size(); ++i) {
      layer_group_[groups_[g].layers[i]] = g;
      layer_in_group_[groups_[g].layers[i]] = static_cast<int32_t>(i);
    }
  }
}

Result<CacheSpec> CacheSpec::from_hf_config_json(const json& config, std::string_view source_name,
                                                 const CacheSpecOptions& options) {
  if (!config.is_object()) {
    return Status::invalid_argument("config '{}': not a JSON object", source_name);
  }
  const json* text = &config;
  std::string prefix;
  if (auto it = config.find("text_config"); it != config.end() && !it->is_null()) {
    if (!it->is_object()) {
      return Status::invalid_argument("config '{}': field 'text_config': must be an object",
                                      source_name);
    }
    text = &*it;
    prefix = "text_config.";
  }
  const FieldReader root(config, source_name, "");
  const FieldReader cfg(*text, source_name, prefix);

  // Architecture: the text model's model_type, else the outer one, else architectures[0].
  KVP_ASSIGN_OR_RETURN(std::optional<std::string> model_type, cfg.optional_string("model_type"));
  if (!model_type && text != &config) {
    KVP_ASSIGN_OR_RETURN(model_type, root.optional_string("model_type"));
  }
  if (!model_type) {
    const json* archs = root.find("architectures");
    if (archs && archs->is_array() && !archs->empty() && (*archs)[0].is_string()) {
      model_type = (*archs)[0].get<std::string>();
    }
  }
  if (!model_type || model_type->empty()) return cfg.error("model_type", "missing");
  const ArchDefaults* defaults = find_defaults(*model_type);
  auto fallback = [&](const int32_t ArchDefaults::*field) -> const int32_t* {
    return defaults ? &(defaults->*field) : nullptr;
  };

  KVP_ASSIGN_OR_RETURN(const int32_t num_layers, cfg.int_in("num_hidden_layers", 1, kMaxLayers));
  KVP_ASSIGN_OR_RETURN(const int32_t num_heads,
                       cfg.int_in_or("num_attention_heads", 1, kMaxHeads,
                                     fallback(&ArchDefaults::num_attention_heads)));
  const int32_t* kv_heads_default = fallback(&ArchDefaults::num_key_value_heads);
  if (kv_heads_default == nullptr) kv_heads_default = &num_heads;
  KVP_ASSIGN_OR_RETURN(const int32_t num_kv_heads,
                       cfg.int_in_or("num_key_value_heads", 1, kMaxHeads, kv_heads_default));
  if (num_heads % num_kv_heads != 0) {
    return cfg.error("num_key_value_heads", fmt::format("{} does not divide num_attention_heads {}",
                                                        num_kv_heads, num_heads));
  }
  int32_t head_dim = 0;
  if (cfg.has("head_dim") || defaults) {
    KVP_ASSIGN_OR_RETURN(
        head_dim, cfg.int_in_or("head_dim", 1, kMaxHeadDim, fallback(&ArchDefaults::head_dim)));
  } else {
    KVP_ASSIGN_OR_RETURN(const int32_t hidden,
                         cfg.int_in("hidden_size", 1, std::numeric_limits<int32_t>::max()));
    if (hidden % num_heads != 0) {
      return cfg.error("hidden_size",
                       fmt::format("{} is not a multiple of num_attention_heads {} (and no "
                                   "head_dim is given)",
                                   hidden, num_heads));
    }
    head_dim = hidden / num_heads;
    if (head_dim > kMaxHeadDim) {
      return cfg.error("hidden_size", fmt::format("gives head_dim {} > {}", head_dim, kMaxHeadDim));
    }
  }

  DType dtype = DType::BF16;
  if (options.kv_dtype) {
    dtype = *options.kv_dtype;
  } else {
    for (const FieldReader* r : {&cfg, &root}) {
      bool found = false;
      for (std::string_view key : {"torch_dtype", "dtype"}) {
        KVP_ASSIGN_OR_RETURN(const std::optional<std::string> name, r->optional_string(key));
        if (!name) continue;
        const std::optional<DType> parsed = parse_dtype(*name);
        if (!parsed) {
          return r->unsupported(key, fmt::format("'{}' is not a KV cache type kvpool supports "
                                                 "(float32, float16, bfloat16)",
                                                 *name));
        }
        dtype = *parsed;
        found = true;
        break;
      }
      if (found || text == &config) break;
    }
  }
  if (!valid_block_size(options.block_size)) {
    return Status::invalid_argument(
        "config '{}': block size must be a power of two between 1 and 1024, got {}", source_name,
        options.block_size);
  }

  KVP_ASSIGN_OR_RETURN(std::vector<LayerAttention> layer_attention,
                       parse_layer_attention(cfg, *model_type, defaults, num_layers));
  return create(*model_type, num_layers, num_kv_heads, head_dim, dtype, options.block_size,
                std::move(layer_attention));
}

Result<CacheSpec> CacheSpec::from_hf_config_text(std::string_view text,
                                                 std::string_view source_name,
                                                 const CacheSpecOptions& options) {
  json config = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded()) {
    return Status::corruption("config '{}': not valid JSON", source_name);
  }
  return from_hf_config_json(config, source_name, options);
}

Result<CacheSpec> CacheSpec::from_hf_config_file(const std::filesystem::path& path,
                                                 const CacheSpecOptions& options) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::not_found("config '{}': cannot open the file", path.string());
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return Status::io_error("config '{}': read failed", path.string());
  return from_hf_config_text(text.str(), path.string(), options);
}

CacheSpec CacheSpec::with_block_size(int32_t block_size) const {
  KVP_CHECK(valid_block_size(block_size), "block size {} is not a power of two in [1, 1024]",
            block_size);
  CacheSpec copy = *this;
  copy.block_size_ = block_size;
  return copy;
}

const CacheGroup& CacheSpec::group(int32_t group) const {
  KVP_CHECK(group >= 0 && group < num_groups(), "group {} of {}", group, num_groups());
  return groups_[group];
}

int32_t CacheSpec::group_of_layer(int32_t layer) const {
  KVP_CHECK(layer >= 0 && layer < num_layers_, "layer {} of {}", layer, num_layers_);
  return layer_group_[layer];
}

int32_t CacheSpec::index_in_group(int32_t layer) const {
  KVP_CHECK(layer >= 0 && layer < num_layers_, "layer {} of {}", layer, num_layers_);
  return layer_in_group_[layer];
}

KvLayout CacheSpec::group_layout(int32_t group, int32_t num_blocks) const {
  KVP_CHECK(num_blocks >= 0, "num_blocks {}", num_blocks);
  return KvLayout{.num_layers = static_cast<int32_t>(this->group(group).layers.size()),
                  .num_blocks = num_blocks,
                  .num_kv_heads = num_kv_heads_,
                  .block_size = block_size_,
                  .head_dim = head_dim_,
                  .dtype = dtype_};
}

uint64_t CacheSpec::layer_token_bytes() const {
  return uint64_t{2} * num_kv_heads_ * kv_vector_bytes(dtype_, head_dim_);
}

uint64_t CacheSpec::block_bytes(int32_t group) const {
  return layer_token_bytes() * block_size_ * this->group(group).layers.size();
}

int64_t CacheSpec::kept_tokens(int32_t layer, int64_t num_tokens) const {
  KVP_CHECK(layer >= 0 && layer < num_layers_, "layer {} of {}", layer, num_layers_);
  KVP_CHECK(num_tokens >= 0, "num_tokens {}", num_tokens);
  const LayerAttention& a = layer_attention_[layer];
  return a.is_windowed() ? std::min<int64_t>(num_tokens, a.window_tokens) : num_tokens;
}

int64_t CacheSpec::blocks_per_seq(int32_t group, int64_t num_tokens) const {
  KVP_CHECK(num_tokens >= 0, "num_tokens {}", num_tokens);
  const LayerAttention& a = this->group(group).attention;
  const int64_t blocks = ceil_div(num_tokens, block_size_);
  if (!a.is_windowed()) return blocks;
  return std::min(blocks, ceil_div(a.window_tokens, block_size_) + 1);
}

uint64_t CacheSpec::seq_bytes(int64_t num_tokens) const {
  uint64_t bytes = 0;
  for (int32_t g = 0; g < num_groups(); ++g) {
    bytes += static_cast<uint64_t>(blocks_per_seq(g, num_tokens)) * block_bytes(g);
  }
  return bytes;
}

PoolPlan CacheSpec::plan_pool(uint64_t budget_bytes, int64_t target_context_tokens) const {
  KVP_CHECK(target_context_tokens > 0, "target context {}", target_context_tokens);
  PoolPlan plan;
  plan.target_context_tokens = target_context_tokens;
  plan.seq_bytes = seq_bytes(target_context_tokens);
  plan.num_seqs = std::numeric_limits<int64_t>::max();
  for (int32_t g = 0; g < num_groups(); ++g) {
    const int64_t need_blocks = blocks_per_seq(g, target_context_tokens);
    // Group g's share of the budget is budget * need_g / seq_bytes with need_g =
    // need_blocks * block_bytes(g), i.e. budget * need_blocks / seq_bytes whole blocks.
    const unsigned __int128 blocks =
        static_cast<unsigned __int128>(budget_bytes) * need_blocks / plan.seq_bytes;
    const int32_t num_blocks = static_cast<int32_t>(
        std::min<unsigned __int128>(blocks, std::numeric_limits<int32_t>::max()));
    plan.blocks_per_seq.push_back(need_blocks);
    plan.num_blocks.push_back(num_blocks);
    plan.pool_bytes.push_back(static_cast<uint64_t>(num_blocks) * block_bytes(g));
    plan.num_seqs = std::min(plan.num_seqs, num_blocks / need_blocks);
  }
  return plan;
}

bool CacheSpec::same_geometry(const CacheSpec& other, std::string* why) const {
  auto differ = [&](std::string_view field, const auto& mine, const auto& theirs) {
    if (why) *why = fmt::format("{} {} vs {}", field, mine, theirs);
    return false;
  };
  if (num_layers_ != other.num_layers_) return differ("num_layers", num_layers_, other.num_layers_);
  if (num_kv_heads_ != other.num_kv_heads_) {
    return differ("num_kv_heads", num_kv_heads_, other.num_kv_heads_);
  }
  if (head_dim_ != other.head_dim_) return differ("head_dim", head_dim_, other.head_dim_);
  if (dtype_ != other.dtype_) return differ("dtype", dtype_name(dtype_), dtype_name(other.dtype_));
  for (int32_t i = 0; i < num_layers_; ++i) {
    if (layer_attention_[i] != other.layer_attention_[i]) {
      return differ(fmt::format("layer {} attention", i), to_string(layer_attention_[i]),
                    to_string(other.layer_attention_[i]));
    }
  }
  return true;
}

}  // namespace kvp

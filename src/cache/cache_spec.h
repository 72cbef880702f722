// CacheSpec: the KV-cache geometry of a model and the cache groups it implies (DESIGN.md §3).
//
// A spec says, for one model: how many layers, KV heads per layer, head dimension, the element
// type of the cache, the block size of the pool (tokens per block) and, per layer, the attention
// kind (global, or a sliding window of W tokens). Layers of the same attention kind share a cache
// group: one slab, one allocator, one block table per sequence.
//
//   Gemma 3 12B (48 layers, every 6th global, window 1024):
//     group 0  global       layers 5 11 17 23 29 35 41 47           ( 8 layers)
//     group 1  window 1024  layers 0-4 6-10 12-16 … 42-46            (40 layers)
//   GPT-OSS-20B (24 layers, alternating sliding 128 / full):
//     group 0  global       layers 1 3 5 … 23                        (12 layers)
//     group 1  window 128   layers 0 2 4 … 22                        (12 layers)
//
// Groups are ordered: the global group first (if any), then windowed groups by ascending window.
// A windowed group needs at most ceil(W / block_size) + 1 blocks per sequence, whatever the
// context: blocks wholly behind the window are freed.
//
// Built from a Hugging Face config.json (from_hf_config_*); every missing or invalid field is a
// Status naming the file and the field. Sizes are in bytes unless a name says otherwise.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cache/kv_layout.h"
#include "common/dtype.h"
#include "common/status.h"

namespace kvp {

enum class AttentionKind : uint8_t { Global = 0, SlidingWindow = 1 };

// The attention of one layer. window_tokens > 0 iff kind == SlidingWindow: a query at position p
// sees keys j with p - j < window_tokens.
struct LayerAttention {
  AttentionKind kind = AttentionKind::Global;
  int32_t window_tokens = 0;

  static LayerAttention global() { return {}; }
  static LayerAttention sliding(int32_t window_tokens) {
    return {AttentionKind::SlidingWindow, window_tokens};
  }
  bool is_windowed() const { return kind == AttentionKind::SlidingWindow; }
  friend bool operator==(const LayerAttention&, const LayerAttention&) = default;
};

// Layers of one attention kind; their K and V live in one slab (one KvLayout).
struct CacheGroup {
  LayerAttention attention;
  std::vector<int32_t> layers;  // model layer indices, ascending; group-local layer i = layers[i]
  friend bool operator==(const CacheGroup&, const CacheGroup&) = default;
};

// How a memory budget is split between the groups of a spec (CacheSpec::plan_pool).
struct PoolPlan {
  int64_t target_context_tokens = 0;
  std::vector<int64_t> blocks_per_seq;  // [num_groups] blocks one sequence needs at the target
  std::vector<int32_t> num_blocks;      // [num_groups] blocks in each group's pool
  std::vector<uint64_t> pool_bytes;     // [num_groups] num_blocks * block_bytes of the group
  uint64_t seq_bytes = 0;               // bytes one sequence needs at the target context
  int64_t num_seqs = 0;  // sequences of the target context that fit all group pools at once
};

// Options for building a spec from a config.json.
struct CacheSpecOptions {
  // Element type of the cache. nullopt: the config's "torch_dtype" / "dtype" if it names f32, f16
  // or bf16, else bf16.
  std::optional<DType> kv_dtype;
  int32_t block_size = 16;  // tokens per block; power of two in [1, 1024]
};

class CacheSpec {
 public:
  // Builds a spec from explicit geometry. Returns InvalidArgument naming the bad value if a count
  // is not positive, block_size is not a power of two in [1, 1024], layer_attention does not
  // have num_layers entries, or a window is not positive.
  static Result<CacheSpec> create(std::string architecture, int32_t num_layers,
                                  int32_t num_kv_heads, int32_t head_dim, DType dtype,
                                  int32_t block_size, std::vector<LayerAttention> layer_attention);

  // Parses a Hugging Face config.json. `source_name` names the config in errors.
  //   - a multimodal config's "text_config" object holds the text model's fields;
  //   - num_key_value_heads absent: num_attention_heads; head_dim absent: hidden_size /
  //     num_attention_heads; except where transformers' config class has its own defaults:
  //     Gemma 2/3 (8 heads, 4 KV heads, head_dim 256, window 4096, pattern 2 resp. 6) and
  //     GPT-OSS (64 heads, 8 KV heads, head_dim 64, window 128, pattern 2);
  //   - per-layer attention, first rule that applies:
  //       "use_sliding_window": false: all global;
  //       "layer_types" (full_attention | sliding_attention) with "sliding_window";
  //       Gemma 3 or "sliding_window_pattern" P: layer i is global iff (i + 1) % P == 0;
  //       no "sliding_window" (or null): all global;
  //       Qwen2 family with "use_sliding_window": true: layers >= "max_window_layers" slide;
  //       otherwise (Mistral style): every layer slides.
  //   MoE fields (experts, router) do not change the KV cache and are ignored.
  static Result<CacheSpec> from_hf_config_json(const nlohmann::json& config,
                                               std::string_view source_name,
                                               const CacheSpecOptions& options = {});
  static Result<CacheSpec> from_hf_config_text(std::string_view text, std::string_view source_name,
                                               const CacheSpecOptions& options = {});
  // NotFound if the file cannot be opened, Corruption if it is not JSON.
  static Result<CacheSpec> from_hf_config_file(const std::filesystem::path& path,
                                               const CacheSpecOptions& options = {});

  // The same geometry with another block size. requires: block_size valid (see create).
  CacheSpec with_block_size(int32_t block_size) const;

  // "llama", "qwen2", "gemma3_text", … (the config's model_type).
  const std::string& architecture() const { return architecture_; }
  int32_t num_layers() const { return num_layers_; }
  int32_t num_kv_heads() const { return num_kv_heads_; }
  int32_t head_dim() const { return head_dim_; }
  DType dtype() const { return dtype_; }
  int32_t block_size() const { return block_size_; }
  const std::vector<LayerAttention>& layer_attention() const { return layer_attention_; }

  int32_t num_groups() const { return static_cast<int32_t>(groups_.size()); }
  const std::vector<CacheGroup>& groups() const { return groups_; }
  const CacheGroup& group(int32_t group) const;
  int32_t group_of_layer(int32_t layer) const;  // requires: 0 <= layer < num_layers
  int32_t index_in_group(int32_t layer) const;  // position of `layer` in its group
  // The layout of a group's slab holding num_blocks blocks.
  KvLayout group_layout(int32_t group, int32_t num_blocks) const;

  // K and V of one token in one layer: 2 * num_kv_heads * head_dim elements.
  uint64_t layer_token_bytes() const;
  // K and V of one token in every layer.
  uint64_t kv_bytes_per_token() const { return layer_token_bytes() * num_layers_; }
  // K and V of one block in every layer of a group.
  uint64_t block_bytes(int32_t group) const;

  // Tokens a layer keeps of a sequence of num_tokens tokens: all of them for a global layer,
  // the last min(num_tokens, W) for a window of W. This is what a cache file stores.
  int64_t kept_tokens(int32_t layer, int64_t num_tokens) const;
  // Blocks a sequence of num_tokens tokens holds in a group: ceil(num_tokens / block_size), and
  // for a window of W at most ceil(W / block_size) + 1 (a window that straddles block edges).
  int64_t blocks_per_seq(int32_t group, int64_t num_tokens) const;
  // Bytes a sequence of num_tokens tokens holds across all groups.
  uint64_t seq_bytes(int64_t num_tokens) const;

  // Splits budget_bytes between the groups in proportion to what one sequence of
  // target_context_tokens needs in each (group g gets budget * need_g / sum of needs, rounded
  // down to whole blocks), so that the pools run out together for sequences of that length.
  // requires: target_context_tokens > 0.
  PoolPlan plan_pool(uint64_t budget_bytes, int64_t target_context_tokens) const;

  // Same geometry (layers, heads, head_dim, dtype, per-layer attention); ignores block size and
  // architecture. On a difference, `why` (if not null) says which field differs and how.
  bool same_geometry(const CacheSpec& other, std::string* why = nullptr) const;
  // This spec holding another KV dtype (cache files convert between dtypes on load).
  CacheSpec with_dtype(DType dtype) const {
    CacheSpec copy = *this;
    copy.dtype_ = dtype;
    return copy;
  }

  friend bool operator==(const CacheSpec&, const CacheSpec&) = default;

 private:
  CacheSpec() = default;
  void build_groups();

  std::string architecture_;
  int32_t num_layers_ = 0;
  int32_t num_kv_heads_ = 0;
  int32_t head_dim_ = 0;
  DType dtype_ = DType::BF16;
  int32_t block_size_ = 0;
  std::vector<LayerAttention> layer_attention_;  // [num_layers]
  std::vector<CacheGroup> groups_;
  std::vector<int32_t> layer_group_;     // [num_layers] group of each layer
  std::vector<int32_t> layer_in_group_;  // [num_layers] index of each layer within its group
};

std::string to_string(const LayerAttention& attention);  // "global" / "window 1024"

}  // namespace kvp

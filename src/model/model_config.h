// ModelConfig: the architecture hyper-parameters a model runner needs, read from GGUF metadata
// ("{arch}.block_count", ...) or from a Hugging Face config.json. Both readers apply the same
// defaults the formats define (kv heads = heads, head_dim = hidden / heads, rope over the whole
// head, rope base 10000, no sliding window) and check that the numbers are consistent.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "common/status.h"
#include "model/gguf_file.h"
#include "model/safetensors_file.h"

namespace kvp {

struct ModelConfig {
  std::string architecture;        // GGUF general.architecture / HF model_type: "llama", "gemma3"
  uint32_t num_layers = 0;         // block_count / num_hidden_layers
  uint32_t hidden_size = 0;        // embedding_length / hidden_size
  uint32_t intermediate_size = 0;  // feed_forward_length / intermediate_size
  uint32_t num_heads = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;        // per query/key head (attention.key_length / head_dim)
  uint32_t value_head_dim = 0;  // attention.value_length; = head_dim unless given
  uint32_t vocab_size = 0;      // {arch}.vocab_size, else the tokenizer's token count
  uint32_t context_length = 0;  // trained context (max_position_embeddings)
  float rms_norm_eps = 1e-5f;
  float rope_freq_base = 10000.0f;
  uint32_t rope_dim = 0;         // rotated dimensions per head; = head_dim unless given
  uint32_t sliding_window = 0;   // tokens; 0 = every layer attends globally
  bool tied_embeddings = false;  // GGUF: no output.weight tensor; HF: tie_word_embeddings
  // Mixture of experts (0 experts: dense): {arch}.expert_count / num_experts (num_local_experts),
  // expert_used_count / num_experts_per_tok, expert_feed_forward_length / moe_intermediate_size,
  // expert_shared_feed_forward_length / shared_expert_intermediate_size.
  uint32_t num_experts = 0;
  uint32_t num_experts_used = 0;
  uint32_t expert_intermediate_size = 0;
  uint32_t shared_expert_intermediate_size = 0;
  // Layers with experts (the others have a dense MLP of intermediate_size): GGUF, those with a
  // router blk.N.ffn_gate_inp.weight; HF, as Qwen3MoeDecoderLayer decides (decoder_sparse_step,
  // mlp_only_layers).
  uint32_t num_moe_layers = 0;

  // Parameters of the weight matrices (embeddings, lm-head unless tied, attention, MLPs,
  // routers and experts; not norms or biases): all of them, or those one token multiplies by
  // (num_experts_used of each layer's experts).
  uint64_t matrix_parameters(bool active_per_token) const;

  // "llama: 30 layers, hidden 576, ffn 1536, heads 9/3 x 64, vocab 49152, ctx 8192, ...", and
  // for a mixture of experts ", experts 128 (8 per token) x ffn 768, shared ffn 0 in 48 layers,
  // matrix parameters 30.4B (3.3B active per token)"
  std::string describe() const;
};

// Reads the config of a GGUF model. NotFound / Mismatch (from the getters) name the file and key;
// InvalidArgument when values are inconsistent (heads not a multiple of kv heads, zeros);
// Unsupported for per-layer arrays of head counts.
Result<ModelConfig> model_config_from_gguf(const GgufFile& file);

// Reads a Hugging Face config.json (already parsed); `source` names it in errors.
// tie_word_embeddings defaults to false when absent (transformers' default depends on the
// architecture: check for an lm_head tensor too).
Result<ModelConfig> model_config_from_hf(const nlohmann::json& config, std::string_view source);

// The `kvpool inspect PATH` text: for a GGUF file (recognised by its magic) its describe() and
// its ModelConfig; for a safetensors file, index or model directory the model's describe() and
// the config.json's ModelConfig. The config part says why when it cannot be read; opening
// errors are returned. Lists at most `max_tensors` tensors.
Result<std::string> inspect_model_file(const std::string& path, size_t max_tensors = SIZE_MAX);

}  // namespace kvp

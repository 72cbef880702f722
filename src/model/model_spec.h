// A decoder-only transformer's hyper-parameters, for the architectures kvpool runs:
// Llama (incl. Llama 3 rope scaling; SmolLM2 is a Llama), Qwen2 (q/k/v bias), Qwen3 (plain RMS
// norms of each q and k head, an explicit head_dim), Qwen3-MoE (Qwen3 attention, a routed
// mixture of experts in place of the MLP), Qwen2-MoE (Qwen2 attention, routed experts plus a
// gated shared expert), GPT-OSS (alternating sliding-window and global layers with attention
// sinks and q/k/v/o biases, YaRN rope, routed experts with biases and a clamped SwiGLU) and
// Gemma 3 (interleaved sliding-window and
// global layers, each with its own rope, q/k norms, pre- and post-norms, GELU-tanh, scaled
// embeddings). Read from a Hugging Face config.json (both the
// older rope_theta/rope_scaling fields and transformers 5's rope_parameters).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "backend/cpu_layer_ops.h"
#include "common/status.h"

namespace kvp {

// Values are mixed into the cache fingerprint (engine.cc): append, never reorder.
enum class Architecture { kLlama, kQwen2, kGemma3, kQwen3, kQwen3Moe, kQwen2Moe, kGptOss };
const char* architecture_name(Architecture arch);

struct RopeSpec {
  double theta = 10000.0;
  cpu::RopeScaling scaling;
  // Per-frequency divisors of the inverse frequencies (GGUF's rope_freqs.weight, how llama.cpp
  // stores Llama 3 scaling): [head_dim / 2] or empty.
  std::vector<float> freq_factors;
};

struct ModelSpec {
  Architecture architecture = Architecture::kLlama;
  int32_t vocab_size = 0;
  // A rank of a split model (tensor_parallel.h: shard_spec) computes the logits of vocabulary ids
  // [logit_begin, logit_begin + logit_count) only, with those rows of the lm-head; logit_count 0:
  // every id (any unsplit model). The embedding stays whole.
  int32_t logit_begin = 0;
  int32_t logit_count = 0;
  int32_t logits_per_row() const { return logit_count > 0 ? logit_count : vocab_size; }
  int32_t hidden_size = 0;
  int32_t intermediate_size = 0;
  int32_t num_layers = 0;
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  float rms_norm_eps = 1e-6f;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;
  bool o_bias = false;           // GPT-OSS: the attention output projection has a bias
  bool attention_sinks = false;  // GPT-OSS: a learned sink logit per q head (attention.h)
  cpu::Activation activation = cpu::Activation::kSilu;
  cpu::NormStyle norm_style = cpu::NormStyle::kPlain;
  cpu::RopeStyle rope_style = cpu::RopeStyle::kHalves;
  float embedding_scale = 1.0f;  // Gemma: sqrt(hidden_size)
  float attention_scale =
      0.0f;  // multiplies q·k: 1/sqrt(head_dim), Gemma: query_pre_attn_scalar^-½
  float attn_logit_softcap = 0.0f;     // 0: off
  float final_logit_softcap = 0.0f;    // 0: off
  bool qk_norm = false;                // Gemma 3, Qwen3: RMS norm of each q and k head
  bool sandwich_norms = false;         // Gemma 3: post-attention and pre/post-feedforward norms
  RopeSpec rope_global;                // rope of global layers
  RopeSpec rope_local;                 // rope of sliding-window layers (Gemma 3)
  int32_t sliding_window = 0;          // tokens; 0: no sliding layers
  std::vector<bool> layer_is_sliding;  // [num_layers]
  // Mixture of experts (Qwen3-MoE, Qwen2-MoE): a layer marked in layer_is_moe replaces its MLP by a
  // router over num_experts gated MLPs of moe_intermediate_size, of which each token runs the
  // num_experts_per_tok most probable (softmax over the router logits), weighted by their
  // probabilities (renormalised to sum 1 when norm_topk_prob). Other layers keep the dense MLP
  // of intermediate_size. num_experts == 0: a dense model, layer_is_moe empty.
  int32_t num_experts = 0;
  int32_t num_experts_per_tok = 0;
  int32_t moe_intermediate_size = 0;
  bool norm_topk_prob = false;
  std::vector<bool> layer_is_moe;  // [num_layers] or empty
  // Qwen2-MoE: every token of an MoE layer also runs a shared gated MLP of this size, its output
  // scaled by sigmoid(shared_expert_gate · x) and added to the experts'. 0: none.
  int32_t shared_expert_intermediate_size = 0;
  // GPT-OSS: the router and each expert's projections have biases, and experts use
  // moe_activation (kClampedSwiglu) instead of `activation`. Its routing (softmax over the top-k
  // logits) is norm_topk_prob's: the renormalised top-k probabilities are that softmax.
  bool expert_bias = false;
  cpu::Activation moe_activation = cpu::Activation::kSilu;

  bool is_moe() const { return num_experts > 0; }
  bool layer_moe(int32_t layer) const { return !layer_is_moe.empty() && layer_is_moe[layer]; }

  int32_t bos_token_id = -1;
  std::vector<int32_t> eos_token_ids;
  // Tokens of context the model was trained for (GGUF {arch}.context_length, config.json
  // max_position_embeddings): no request may need more. 0: unknown (random shapes), no limit.
  int32_t context_length = 0;

  // Checks internal consistency (positive sizes within common/limits.h, heads that divide,
  // layer list length, finite positive rope bases and norm epsilon, token ids in the
  // vocabulary). Errors name the field and the value.
  Status validate() const;

 private:
  Status validate_experts() const;  // the mixture-of-experts fields (part of validate)
};

// Parses a Hugging Face config.json (already read); `source` names the file in errors.
Result<ModelSpec> model_spec_from_hf_config(const nlohmann::json& config,
                                            const std::string& source);
// Reads and parses a config.json file.
Result<ModelSpec> load_hf_config(const std::string& path);

}  // namespace kvp

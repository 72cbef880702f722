// Models with random weights, for benchmarks of a model's shape without its weight files:
// the shapes kvpool knows by name, and a WeightSource that makes up every tensor.
//
//   "llama3-8b"     Llama-3.1-8B  (config.json as tests/cache/fixtures/llama-3.1-8b.json)
//   "smollm2-135m"  SmolLM2-135M  (config.json of HuggingFaceTB/SmolLM2-135M-Instruct; the same
//                                  geometry as models/SmolLM2-135M-Instruct.Q4_1.gguf)
//   "qwen3-30b-a3b" Qwen3-30B-A3B (config.json of Qwen/Qwen3-30B-A3B: 128 experts, top 8)
//   "qwen1.5-moe-a2.7b" Qwen1.5-MoE-A2.7B (config.json of Qwen/Qwen1.5-MoE-A2.7B: 60 experts,
//                                  top 4, a shared expert)
//   "gpt-oss-20b"   GPT-OSS-20B (config.json of openai/gpt-oss-20b: 32 experts, top 4,
//                                  128-token windows on every other layer, sinks, biases)
//
// Random weights give meaningless but finite logits: enough to time a forward pass and to
// exercise the engine, never to compare outputs across backends.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/model_spec.h"
#include "model/weight_source.h"

namespace kvp {

// The names random_model_spec knows, in the order of messages.
const std::vector<std::string>& random_model_names();

// The spec of a named shape. not_found naming the known shapes for any other name.
Result<ModelSpec> random_model_spec(const std::string& name);

// Bytes of the spec's weights as f32 (what a CPU ModelRunner holds).
uint64_t model_f32_weight_bytes(const ModelSpec& spec);

// Every tensor of `spec` (Hugging Face names), deterministic in (seed, name): norm weights are
// 0 (Gemma's 1 + w norms) or 1 (the others), other tensors uniform in ±1/sqrt(columns).
// lm_head.weight exists only when the spec does not tie it to the embedding.
class RandomWeightSource final : public WeightSource {
 public:
  RandomWeightSource(ModelSpec spec, uint64_t seed) : spec_(std::move(spec)), seed_(seed) {}

  bool contains(const std::string& name) const override;
  Result<std::vector<float>> read_f32(const std::string& name,
                                      std::span<const int64_t> shape) const override;
  std::string describe() const override { return "random weights"; }

 private:
  ModelSpec spec_;
  uint64_t seed_;
};

}  // namespace kvp

// The largest inputs kvpool accepts, named once. Every reader of outside input (GGUF,
// safetensors, config.json, tokenizer.json, cache files, requests) checks its numbers against
// these where they enter, and a refusal names the limit and the value:
//   "gguf 'm.gguf': 'llama.block_count' = 2147483648 is more than kvpool's limit of 4096 layers"
// The limits sit far above every published model (docs/reliability.md lists them with the
// largest values seen in the wild) and far below where int32 sizes, allocations or products of
// them could overflow: layers x heads x head_dim x block_size fits in int64 many times over.
#pragma once

#include <cstdint>
#include <string_view>

#include "common/status.h"

namespace kvp {

struct Limit {
  uint64_t max = 0;
  std::string_view unit;  // "layers": the message says "a limit of 4096 layers"
};

namespace limits {

// Model dimensions (ModelSpec, ModelConfig, cache specs and cache files).
inline constexpr Limit kLayers{4096, "layers"};
inline constexpr Limit kHiddenSize{1u << 17, "hidden units"};
inline constexpr Limit kIntermediateSize{1u << 20, "feed-forward units"};
inline constexpr Limit kHeads{4096, "heads"};
inline constexpr Limit kExperts{4096, "experts"};
inline constexpr Limit kHeadDim{8192, "dimensions per head"};
inline constexpr Limit kVocabSize{1u << 24, "tokens in a vocabulary"};
// Context length a model declares: at least kMinContextLength (a smaller one is a broken file,
// not a model), at most kContextLength (token positions are int32 throughout).
inline constexpr uint64_t kMinContextLength = 16;
inline constexpr Limit kContextLength{1u << 26, "tokens of context"};
inline constexpr Limit kSlidingWindow{1u << 30, "tokens of sliding window"};

// Weight files.
inline constexpr Limit kTensors{1u << 20, "tensors"};
inline constexpr Limit kMetadataKeys{1u << 16, "metadata keys"};
inline constexpr Limit kMetadataStringBytes{64u << 20, "bytes in a metadata string"};
inline constexpr Limit kMetadataArrayElements{1u << 26, "elements in a metadata array"};
inline constexpr Limit kMetadataArrayDepth{8, "levels of nested arrays"};
inline constexpr Limit kSafetensorsHeaderBytes{100u << 20, "bytes of safetensors header"};

// Cache files.
inline constexpr Limit kArchitectureNameBytes{255, "bytes of architecture name"};

}  // namespace limits

// ok when value <= limit.max; otherwise unsupported (valid, but more than kvpool takes)
//   "{source}: {field} = {value} is more than kvpool's limit of {max} {unit}".
inline Status check_limit(std::string_view source, std::string_view field, uint64_t value,
                          const Limit& limit) {
  if (value <= limit.max) return Status::ok();
  return Status::unsupported("{}: {} = {} is more than kvpool's limit of {} {}", source, field,
                             value, limit.max, limit.unit);
}

}  // namespace kvp

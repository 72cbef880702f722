// Where a model's weights come from: a named-tensor source that yields f32 copies.
// Implemented over safetensors files (Hugging Face naming) and GGUF files (llama.cpp naming);
// the model code asks for tensors by their Hugging Face names and the source maps them.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"

namespace kvp {

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // Whether a tensor of this (Hugging Face) name exists.
  virtual bool contains(const std::string& name) const = 0;
  // The tensor as f32, row-major, checked to have exactly `shape` (outermost first).
  // Missing tensor → not_found; other shape → mismatch; both name the file and the tensor.
  virtual Result<std::vector<float>> read_f32(const std::string& name,
                                              std::span<const int64_t> shape) const = 0;
  // A description for messages ("model.safetensors").
  virtual std::string describe() const = 0;
};

}  // namespace kvp

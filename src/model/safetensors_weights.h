// The WeightSource over a Hugging Face safetensors model (one file or shards): tensors by their
// Hugging Face names, converted to f32 and checked against the shape the model code expects.
#pragma once

#include <memory>
#include <string>

#include "model/safetensors_file.h"
#include "model/weight_source.h"

namespace kvp {

class SafetensorsWeights : public WeightSource {
 public:
  // `path`: a .safetensors file, a model.safetensors.index.json, or a directory holding either.
  static Result<std::unique_ptr<SafetensorsWeights>> open(const std::string& path);

  bool contains(const std::string& name) const override;
  Result<std::vector<float>> read_f32(const std::string& name,
                                      std::span<const int64_t> shape) const override;
  std::string describe() const override;

  const SafetensorsModel& model() const { return model_; }

 private:
  explicit SafetensorsWeights(SafetensorsModel model) : model_(std::move(model)) {}
  SafetensorsModel model_;
};

// Integer tensors (I32 or I64, e.g. token ids in golden files) as int32 values. Unsupported for
// other dtypes; InvalidArgument when a value does not fit in int32.
Result<std::vector<int32_t>> read_int_tensor(const SafetensorsModel& model, std::string_view name);

}  // namespace kvp

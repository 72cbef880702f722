// The WeightSource over a Hugging Face safetensors model (one file or shards): tensors by their
// Hugging Face names, checked against the shape the model code expects: matrices in place in
// the mapping when they are F32/F16/BF16, everything else converted to f32.
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
  // F32, F16 and BF16 matrices in place in the shards' mappings; others converted to f32.
  Result<StoredMatrix> read_matrix(const std::string& name, int64_t rows,
                                   int64_t cols) const override;
  std::string describe() const override;

  const SafetensorsModel& model() const { return *model_; }

 private:
  explicit SafetensorsWeights(std::shared_ptr<const SafetensorsModel> model)
      : model_(std::move(model)) {}
  // The tensor `name`, checked to have `shape` (outermost first).
  Result<const SafetensorsTensor*> find(const std::string& name,
                                        std::span<const int64_t> shape) const;

  std::shared_ptr<const SafetensorsModel> model_;  // shared with the matrices viewing it
};

// Integer tensors (I32 or I64, e.g. token ids in golden files) as int32 values. Unsupported for
// other dtypes; InvalidArgument when a value does not fit in int32.
Result<std::vector<int32_t>> read_int_tensor(const SafetensorsModel& model, std::string_view name);

}  // namespace kvp

#include "model/safetensors_weights.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <algorithm>
#include <array>
#include <cstring>
#include <limits>

namespace kvp {

Result<std::unique_ptr<SafetensorsWeights>> SafetensorsWeights::open(const std::string& path) {
  KVP_ASSIGN_OR_RETURN(SafetensorsModel model, SafetensorsModel::open(path));
  return std::unique_ptr<SafetensorsWeights>(
      new SafetensorsWeights(std::make_shared<const SafetensorsModel>(std::move(model))));
}

bool SafetensorsWeights::contains(const std::string& name) const {
  return model_->tensor(name).is_ok();
}

std::string SafetensorsWeights::describe() const { return model_->directory(); }

Result<const SafetensorsTensor*> SafetensorsWeights::find(const std::string& name,
                                                          std::span<const int64_t> shape) const {
  KVP_ASSIGN_OR_RETURN(const SafetensorsTensor* t, model_->tensor(name));
  const bool same = std::equal(t->shape.begin(), t->shape.end(), shape.begin(), shape.end(),
                               [](uint64_t a, int64_t b) { return b >= 0 && a == uint64_t(b); });
  if (!same) {
    return Status::mismatch("{}: tensor '{}' has shape {}, expected [{}]", describe(), name,
                            t->shape_string(), fmt::join(shape, ", "));
  }
  return t;
}

Result<std::vector<float>> SafetensorsWeights::read_f32(const std::string& name,
                                                        std::span<const int64_t> shape) const {
  KVP_ASSIGN_OR_RETURN(const SafetensorsTensor* t, find(name, shape));
  std::vector<float> out(t->num_elements);
  KVP_RETURN_IF_ERROR(model_->to_f32(name, out));
  return out;
}

Result<StoredMatrix> SafetensorsWeights::read_matrix(const std::string& name, int64_t rows,
                                                     int64_t cols) const {
  const std::array<int64_t, 2> shape{rows, cols};
  KVP_ASSIGN_OR_RETURN(const SafetensorsTensor* t, find(name, shape));
  if (!t->dtype.has_value()) return WeightSource::read_matrix(name, rows, cols);
  GgmlType type = GgmlType::F32;
  switch (*t->dtype) {
    case DType::F32:
      type = GgmlType::F32;
      break;
    case DType::F16:
      type = GgmlType::F16;
      break;
    case DType::BF16:
      type = GgmlType::BF16;
      break;
    case DType::I8:  // KV-cache-only dtypes; safetensors_file never yields them
    case DType::FP8:
      return WeightSource::read_matrix(name, rows, cols);
  }
  StoredMatrix m;
  m.matrix = quant::make_matrix(type, t->data.data(), rows, cols);
  m.keep_alive = model_;  // the shards' mappings live as long as the model
  return m;
}

Result<std::vector<int32_t>> read_int_tensor(const SafetensorsModel& model, std::string_view name) {
  KVP_ASSIGN_OR_RETURN(const SafetensorsTensor* t, model.tensor(name));
  const bool is64 = t->dtype_name == "I64";
  if (!is64 && t->dtype_name != "I32") {
    return Status::unsupported("{}: tensor '{}' is {}, not I32 or I64", model.directory(), name,
                               t->dtype_name);
  }
  std::vector<int32_t> out(t->num_elements);
  for (size_t i = 0; i < out.size(); ++i) {
    if (is64) {
      int64_t v;
      std::memcpy(&v, t->data.data() + i * 8, 8);  // the data need not be aligned
      if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max()) {
        return Status::invalid_argument("{}: tensor '{}' value {} does not fit in int32",
                                        model.directory(), name, v);
      }
      out[i] = static_cast<int32_t>(v);
    } else {
      std::memcpy(&out[i], t->data.data() + i * 4, 4);
    }
  }
  return out;
}

}  // namespace kvp

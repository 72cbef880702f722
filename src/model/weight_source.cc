#include "model/weight_source.h"

#include <fmt/format.h>

#include <array>

namespace kvp {

StoredMatrix owned_f32_matrix(std::vector<float> values, int64_t rows, int64_t cols) {
  auto owned = std::make_shared<const std::vector<float>>(std::move(values));
  StoredMatrix m;
  m.matrix = quant::make_matrix(GgmlType::F32, owned->data(), rows, cols);
  m.keep_alive = std::move(owned);
  return m;
}

Result<StoredMatrix> WeightSource::read_matrix(const std::string& name, int64_t rows,
                                               int64_t cols) const {
  const std::array<int64_t, 2> shape{rows, cols};
  KVP_ASSIGN_OR_RETURN(std::vector<float> values, read_f32(name, shape));
  return owned_f32_matrix(std::move(values), rows, cols);
}

Result<std::vector<StoredMatrix>> WeightSource::read_experts(int32_t layer,
                                                             const std::string& projection,
                                                             int32_t num_experts, int64_t rows,
                                                             int64_t cols) const {
  std::vector<StoredMatrix> experts;
  experts.reserve(num_experts);
  for (int32_t e = 0; e < num_experts; ++e) {
    KVP_ASSIGN_OR_RETURN(
        StoredMatrix m,
        read_matrix(fmt::format("model.layers.{}.mlp.experts.{}.{}.weight", layer, e, projection),
                    rows, cols));
    experts.push_back(std::move(m));
  }
  return experts;
}

Result<StackedExperts> read_stacked_experts(const WeightSource& source, int32_t layer,
                                            int32_t num_experts, int64_t inter, int64_t hidden) {
  StackedExperts e;
  KVP_ASSIGN_OR_RETURN(e.gate, source.read_experts(layer, "gate_proj", num_experts, inter, hidden));
  KVP_ASSIGN_OR_RETURN(e.up, source.read_experts(layer, "up_proj", num_experts, inter, hidden));
  KVP_ASSIGN_OR_RETURN(e.down, source.read_experts(layer, "down_proj", num_experts, hidden, inter));
  return e;
}

}  // namespace kvp

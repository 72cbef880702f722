#include "model/weight_source.h"

#include <fmt/format.h>

#include <algorithm>
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

Result<GptOssExperts> read_gpt_oss_experts(const WeightSource& source, int32_t layer,
                                           int32_t num_experts, int64_t inter, int64_t hidden) {
  const std::string p = fmt::format("model.layers.{}.mlp.experts.", layer);
  const int64_t experts = num_experts;
  GptOssExperts out;
  out.gate_up_bias.resize(static_cast<size_t>(experts * 2 * inter));
  if (!source.contains(p + "gate_up_proj")) {
    KVP_ASSIGN_OR_RETURN(out.stacked,
                         read_stacked_experts(source, layer, num_experts, inter, hidden));
    const std::array<int64_t, 2> inter_shape{experts, inter}, hidden_shape{experts, hidden};
    KVP_ASSIGN_OR_RETURN(std::vector<float> gate_bias,
                         source.read_f32(p + "gate_proj.bias", inter_shape));
    KVP_ASSIGN_OR_RETURN(std::vector<float> up_bias,
                         source.read_f32(p + "up_proj.bias", inter_shape));
    KVP_ASSIGN_OR_RETURN(out.down_bias, source.read_f32(p + "down_proj.bias", hidden_shape));
    for (int64_t e = 0; e < experts; ++e) {
      std::copy_n(gate_bias.data() + e * inter, inter, out.gate_up_bias.data() + e * 2 * inter);
      std::copy_n(up_bias.data() + e * inter, inter,
                  out.gate_up_bias.data() + e * 2 * inter + inter);
    }
    return out;
  }
  const std::array<int64_t, 3> gate_up_shape{experts, hidden, 2 * inter},
      down_shape{experts, inter, hidden};
  const std::array<int64_t, 2> gate_up_bias_shape{experts, 2 * inter},
      down_bias_shape{experts, hidden};
  KVP_ASSIGN_OR_RETURN(std::vector<float> gate_up,
                       source.read_f32(p + "gate_up_proj", gate_up_shape));
  KVP_ASSIGN_OR_RETURN(std::vector<float> gate_up_bias,
                       source.read_f32(p + "gate_up_proj_bias", gate_up_bias_shape));
  KVP_ASSIGN_OR_RETURN(std::vector<float> down, source.read_f32(p + "down_proj", down_shape));
  KVP_ASSIGN_OR_RETURN(out.down_bias, source.read_f32(p + "down_proj_bias", down_bias_shape));
  for (int64_t e = 0; e < experts; ++e) {
    const float* gu = gate_up.data() + e * hidden * 2 * inter;  // [hidden][2 * inter]
    const float* dn = down.data() + e * inter * hidden;         // [inter][hidden]
    std::vector<float> gate(inter * hidden), up(inter * hidden), down_t(hidden * inter);
    for (int64_t i = 0; i < inter; ++i) {
      for (int64_t h = 0; h < hidden; ++h) {
        gate[i * hidden + h] = gu[h * 2 * inter + 2 * i];
        up[i * hidden + h] = gu[h * 2 * inter + 2 * i + 1];
        down_t[h * inter + i] = dn[i * hidden + h];
      }
      out.gate_up_bias[e * 2 * inter + i] = gate_up_bias[e * 2 * inter + 2 * i];
      out.gate_up_bias[e * 2 * inter + inter + i] = gate_up_bias[e * 2 * inter + 2 * i + 1];
    }
    out.stacked.gate.push_back(owned_f32_matrix(std::move(gate), inter, hidden));
    out.stacked.up.push_back(owned_f32_matrix(std::move(up), inter, hidden));
    out.stacked.down.push_back(owned_f32_matrix(std::move(down_t), hidden, inter));
  }
  return out;
}

}  // namespace kvp

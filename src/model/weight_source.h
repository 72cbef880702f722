// Where a model's weights come from: a named-tensor source that yields f32 copies of small
// tensors (norms, biases) and, for matrices, the matrix in the format the file stores it.
// Implemented over safetensors files (Hugging Face naming) and GGUF files (llama.cpp naming);
// the model code asks for tensors by their Hugging Face names and the source maps them.
//
//   read_f32(name, shape)           → an owned f32 copy (dequantised or converted)
//   read_matrix(name, rows, cols)   → a quant::QuantMatrix viewing the file's mapping in place
//                                     (GGUF block formats, safetensors F32/F16/BF16), kept alive
//                                     by `keep_alive`; an owned f32 copy where no kernel exists
//   read_experts(layer, projection, …) → one matrix per expert of a mixture-of-experts layer:
//                                     Hugging Face's tensor per expert, or slices of GGUF's one
//                                     3-D tensor per projection (blk.N.ffn_gate_exps.weight)
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "quant/quant_matmul.h"

namespace kvp {

// A weight matrix [rows][cols] as the runner multiplies it: `matrix` points into memory that
// `keep_alive` owns (a file mapping, or converted bytes).
struct StoredMatrix {
  quant::QuantMatrix matrix;
  std::shared_ptr<const void> keep_alive;
};

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // Whether a tensor of this (Hugging Face) name exists.
  virtual bool contains(const std::string& name) const = 0;
  // The tensor as f32, row-major, checked to have exactly `shape` (outermost first).
  // Missing tensor → not_found; other shape → mismatch; both name the file and the tensor.
  virtual Result<std::vector<float>> read_f32(const std::string& name,
                                              std::span<const int64_t> shape) const = 0;
  // The matrix [rows][cols] in its stored format where quant::matmul has a kernel for it, else
  // converted to f32 once. Errors as read_f32. This default converts through read_f32.
  virtual Result<StoredMatrix> read_matrix(const std::string& name, int64_t rows,
                                           int64_t cols) const;
  // The matrices [rows][cols] of `num_experts` experts' projection `projection` ("gate_proj",
  // "up_proj", "down_proj") of layer `layer`, each in its stored format as read_matrix keeps it.
  // This default reads Hugging Face's per-expert tensors
  // "model.layers.{layer}.mlp.experts.{e}.{projection}.weight" through read_matrix.
  virtual Result<std::vector<StoredMatrix>> read_experts(int32_t layer,
                                                         const std::string& projection,
                                                         int32_t num_experts, int64_t rows,
                                                         int64_t cols) const;
  // A description for messages ("model.safetensors").
  virtual std::string describe() const = 0;
};

// An owned f32 matrix as a StoredMatrix. requires: values.size() == rows * cols.
StoredMatrix owned_f32_matrix(std::vector<float> values, int64_t rows, int64_t cols);

// Every routed expert's gate [inter][hidden], up [inter][hidden] and down [hidden][inter] of a
// mixture-of-experts layer (read_experts of each projection): what the CPU and CUDA runners load.
struct StackedExperts {
  std::vector<StoredMatrix> gate, up, down;  // [num_experts] each
};
Result<StackedExperts> read_stacked_experts(const WeightSource& source, int32_t layer,
                                            int32_t num_experts, int64_t inter, int64_t hidden);

// GPT-OSS's routed experts of layer `layer` and their biases, in StackedExperts' layout, from
// either form a source holds them in:
//   transformers' 3-D tensors "model.layers.N.mlp.experts.gate_up_proj" [num_experts][hidden]
//   [2 * inter] (multiplied from the left, x · W; column 2i is gate unit i, 2i + 1 up unit i),
//   gate_up_proj_bias [num_experts][2 * inter] likewise, down_proj [num_experts][inter][hidden],
//   down_proj_bias [num_experts][hidden]: converted once to owned f32 matrices;
//   or per-projection stacks (llama.cpp's GGUF gpt-oss, read_stacked_experts, in place) with
//   biases "mlp.experts.{gate,up,down}_proj.bias" [num_experts][rows].
// What the CPU and CUDA runners load; the router (mlp.router.{weight,bias}) is read apart.
struct GptOssExperts {
  StackedExperts stacked;
  std::vector<float> gate_up_bias;  // [num_experts][2 * inter]: expert e's gate bias, then up's
  std::vector<float> down_bias;     // [num_experts][hidden]
};
Result<GptOssExperts> read_gpt_oss_experts(const WeightSource& source, int32_t layer,
                                           int32_t num_experts, int64_t inter, int64_t hidden);

}  // namespace kvp

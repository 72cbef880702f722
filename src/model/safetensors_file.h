// Hugging Face safetensors weights: one file, or a sharded set through
// model.safetensors.index.json. Files are memory-mapped; tensors are read as f32 copies
// (F32, F16, BF16; I32 and I64 as raw bytes). Every header is validated before use: a truncated
// file, a header that is not JSON, offsets outside the data, a shape that does not match its byte
// size, or an unsupported dtype is refused with a Status naming the file and the tensor.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/weight_source.h"

namespace kvp {

// Float types are read as f32; integer tensors (token ids in golden files) are raw only.
enum class SafetensorsDType { kF32, kF16, kBF16, kI32, kI64 };

struct SafetensorsTensor {
  std::string name;
  SafetensorsDType dtype = SafetensorsDType::kF32;
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;  // into the mapped file
  size_t size_bytes = 0;
  int32_t file_index = 0;  // which shard
};

class SafetensorsModel : public WeightSource {
 public:
  // `path`: a .safetensors file, a model.safetensors.index.json, or a directory holding either.
  static Result<std::unique_ptr<SafetensorsModel>> open(const std::string& path);
  ~SafetensorsModel() override;

  bool contains(const std::string& name) const override;
  Result<std::vector<float>> read_f32(const std::string& name,
                                      std::span<const int64_t> shape) const override;
  std::string describe() const override { return description_; }

  const std::map<std::string, SafetensorsTensor>& tensors() const { return tensors_; }

 private:
  SafetensorsModel() = default;
  Status add_file(const std::string& path);

  struct Mapping {
    std::string path;
    void* address = nullptr;
    size_t size_bytes = 0;
  };
  std::vector<Mapping> files_;
  std::map<std::string, SafetensorsTensor> tensors_;
  std::string description_;
};

}  // namespace kvp

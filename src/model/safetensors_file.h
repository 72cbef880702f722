// Safetensors weight files: a single `*.safetensors` file (SafetensorsFile) and a Hugging Face
// model directory (SafetensorsModel): one file or shards listed by
// `model.safetensors.index.json`, plus `config.json`.
//
// File layout: u64 header_size (little-endian) | header_size bytes of JSON | data.
//   {"__metadata__": {"k": "v", ...},
//    "name": {"dtype": "F32", "shape": [rows, cols], "data_offsets": [begin, end]}, ...}
// Offsets are relative to the start of the data; shapes are row-major (the last dimension is
// contiguous). kvpool converts F32, F16 and BF16 to f32; tensors of the other safetensors dtypes
// are listed but converting them is an Unsupported Status.
//
// Opening validates everything: header size within the file (and at most 100 MiB), valid JSON of
// the right shape, known dtypes, shapes whose element count matches the byte range, byte ranges
// inside the data and not overlapping. Failures name the file (and tensor) and the reason.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/dtype.h"
#include "common/limits.h"
#include "common/status.h"
#include "model/mapped_file.h"

namespace kvp {

struct SafetensorsTensor {
  std::string name;
  std::string dtype_name;      // as in the file: "F32", "BF16", "I64", ...
  std::optional<DType> dtype;  // F32 / F16 / BF16; nullopt for the dtypes kvpool does not convert
  size_t element_size_bytes = 0;
  std::vector<uint64_t> shape;  // row-major; empty for a scalar
  uint64_t num_elements = 0;
  uint64_t data_begin = 0;  // offsets from the start of the data section
  uint64_t data_end = 0;
  std::span<const uint8_t> data;  // [data_end - data_begin] in the mapping

  // "[49152, 576]"
  std::string shape_string() const;
};

class SafetensorsFile {
 public:
  static constexpr uint64_t kMaxHeaderBytes = limits::kSafetensorsHeaderBytes.max;

  static Result<SafetensorsFile> open(const std::string& path);
  // Parses an already mapped (or in-memory) file; takes it over.
  static Result<SafetensorsFile> open(MappedFile file);

  const std::string& path() const { return file_.path(); }
  uint64_t data_offset() const { return data_offset_; }  // 8 + header size
  // Tensors sorted by name.
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  // NotFound naming the file and tensor when absent.
  Result<const SafetensorsTensor*> tensor(std::string_view name) const;
  // The "__metadata__" string map (empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Converts a tensor of this file to f32. Unsupported naming the dtype for non-float dtypes;
  // InvalidArgument when out.size() != num_elements. out: [num_elements]. Writes out only.
  Status to_f32(const SafetensorsTensor& tensor, std::span<float> out) const;

  // A readable summary: metadata and a tensor table.
  std::string describe(size_t max_tensors = SIZE_MAX) const;

 private:
  friend class SafetensorsParser;
  MappedFile file_;
  uint64_t data_offset_ = 0;
  std::vector<SafetensorsTensor> tensors_;
  std::unordered_map<std::string_view, size_t> index_;  // name -> index in tensors_
  std::map<std::string, std::string> metadata_;
};

// A model's safetensors weights: one file or shards, and config.json when present.
class SafetensorsModel {
 public:
  // `path` is a directory (holding model.safetensors.index.json or model.safetensors), an index
  // file, or a single .safetensors file. Opens every shard; config.json is read from the same
  // directory if it exists. With an index, exactly the tensors of its weight_map are the model's
  // (a shard's other tensors are ignored). Errors: NotFound (no weights, a missing shard),
  // Corruption (bad index, shard or config.json; a tensor the index names missing from its shard).
  static Result<SafetensorsModel> open(const std::string& path);

  const std::string& directory() const { return directory_; }
  const std::vector<SafetensorsFile>& shards() const { return shards_; }
  // All tensor names, sorted.
  std::vector<std::string_view> tensor_names() const;
  size_t num_tensors() const { return tensors_.size(); }
  // The tensor and the shard that holds it; NotFound naming the model and tensor.
  Result<const SafetensorsTensor*> tensor(std::string_view name) const;
  Status to_f32(std::string_view name, std::span<float> out) const;
  // config.json, or nullptr when the directory has none.
  const nlohmann::json* config() const { return config_ ? &*config_ : nullptr; }

  std::string describe(size_t max_tensors = SIZE_MAX) const;

 private:
  struct Location {
    size_t shard;
    const SafetensorsTensor* tensor;
  };
  std::string directory_;
  std::vector<SafetensorsFile> shards_;
  std::map<std::string, Location, std::less<>> tensors_;
  std::optional<nlohmann::json> config_;
};

}  // namespace kvp

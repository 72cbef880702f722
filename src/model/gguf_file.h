// GgufFile: a read-only view of a GGUF weight file (versions 2 and 3, little-endian), mapped into
// memory. Opening parses and validates the whole header: metadata key/values of every type
// (including arrays, arrays of strings and nested arrays), tensor infos, `general.alignment` and
// the data section. Any defect — bad magic, unsupported version, truncation, counts or lengths
// the file cannot hold, offsets or sizes outside the file, unknown tensor types — is a Status
// naming the file and the problem; nothing in the file can make the reader allocate more than
// the file could describe, or crash.
//
// File layout:
//   "GGUF" | u32 version | u64 tensor_count | u64 kv_count
//   kv_count   x { string key | u32 value_type | value }
//   tensor_count x { string name | u32 n_dims | u64 dims[n_dims] | u32 ggml_type | u64 offset }
//   padding to `general.alignment` (default 32)
//   data section: tensor i at data_offset + offset_i (offset_i a multiple of the alignment)
// string = u64 length | bytes (no terminator); array = u32 element_type | u64 count | elements.
//
// Strings and tensor data are views into the mapping: valid while the GgufFile lives.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "model/mapped_file.h"
#include "quant/dequant.h"

namespace kvp {

enum class GgufType : uint32_t {
  Uint8 = 0,
  Int8 = 1,
  Uint16 = 2,
  Int16 = 3,
  Uint32 = 4,
  Int32 = 5,
  Float32 = 6,
  Bool = 7,
  String = 8,
  Array = 9,
  Uint64 = 10,
  Int64 = 11,
  Float64 = 12,
};
// "uint32", "string", "array", ...
std::string_view gguf_type_name(GgufType type);

// One metadata value. Scalars are widened into one of u / i / f / b (by type); strings and
// arrays point into the mapped file.
struct GgufValue {
  GgufType type = GgufType::Uint8;
  uint64_t u = 0;        // Uint8, Uint16, Uint32, Uint64
  int64_t i = 0;         // Int8, Int16, Int32, Int64
  double f = 0.0;        // Float32 (exactly widened), Float64
  bool b = false;        // Bool
  std::string_view str;  // String
  // Array: element type and count; elements are stored by kind:
  GgufType element_type = GgufType::Uint8;
  uint64_t count = 0;
  std::span<const uint8_t> raw;           // fixed-size scalar elements: [count * size] bytes
  std::vector<std::string_view> strings;  // String elements: [count]
  std::vector<GgufValue> arrays;          // Array elements: [count]

  bool is_integer() const;
  // Scalar element `index` of a scalar array, widened like a scalar value.
  // requires: type == Array, element_type is a fixed-size scalar, index < count.
  GgufValue element(uint64_t index) const;
  // A short human form: 3, -1, 0.5, true, "text", [uint32 x 49152] or [1, 2, 3].
  std::string to_string(size_t max_elements = 8) const;
};

struct GgufKeyValue {
  std::string_view key;
  GgufValue value;
};

struct GgufTensor {
  std::string_view name;
  std::vector<uint64_t> dims;  // ggml order: dims[0] is the contiguous (row) dimension
  GgmlType type = GgmlType::F32;
  uint64_t offset = 0;  // from the start of the data section
  uint64_t num_elements = 0;
  uint64_t size_bytes = 0;
  std::span<const uint8_t> data;  // [size_bytes] in the mapping

  uint64_t row_elements() const { return dims.empty() ? 1 : dims[0]; }
  uint64_t num_rows() const { return row_elements() == 0 ? 0 : num_elements / row_elements(); }
  uint64_t row_size_bytes() const { return num_rows() == 0 ? 0 : size_bytes / num_rows(); }
  // "[576, 49152]"
  std::string shape_string() const;
};

class GgufFile {
 public:
  static constexpr uint32_t kDefaultAlignment = 32;

  // Maps and parses `path`. All validation happens here.
  static Result<GgufFile> open(const std::string& path);
  // Parses an already mapped (or in-memory) file; takes it over.
  static Result<GgufFile> open(MappedFile file);

  const std::string& path() const { return file_.path(); }
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // bytes from the start of the file
  uint64_t file_size_bytes() const { return file_.size_bytes(); }

  // Metadata, in file order.
  const std::vector<GgufKeyValue>& metadata() const { return metadata_; }
  // nullptr when absent.
  const GgufValue* find(std::string_view key) const;

  // Typed getters: NotFound naming the file and key when absent; Mismatch naming the key, its
  // type and the type asked for when the type differs. Integer getters accept exactly their
  // type; get_integer accepts any integer type whose value fits in int64.
  Result<uint8_t> get_u8(std::string_view key) const;
  Result<int8_t> get_i8(std::string_view key) const;
  Result<uint16_t> get_u16(std::string_view key) const;
  Result<int16_t> get_i16(std::string_view key) const;
  Result<uint32_t> get_u32(std::string_view key) const;
  Result<int32_t> get_i32(std::string_view key) const;
  Result<uint64_t> get_u64(std::string_view key) const;
  Result<int64_t> get_i64(std::string_view key) const;
  Result<float> get_f32(std::string_view key) const;
  Result<double> get_f64(std::string_view key) const;
  Result<bool> get_bool(std::string_view key) const;
  Result<std::string_view> get_string(std::string_view key) const;
  Result<int64_t> get_integer(std::string_view key) const;
  Result<std::vector<std::string_view>> get_string_array(std::string_view key) const;
  Result<std::vector<float>> get_f32_array(std::string_view key) const;
  Result<std::vector<int32_t>> get_i32_array(std::string_view key) const;
  // The array value itself (any element type).
  Result<const GgufValue*> get_array(std::string_view key) const;

  // Tensors, in file order.
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  // NotFound naming the file and the tensor when absent.
  Result<const GgufTensor*> tensor(std::string_view name) const;

  // Dequantises a whole tensor / row `row` (ne[0] elements) of it to f32.
  // Unsupported when the tensor's type has no dequantiser; InvalidArgument when `out` has the
  // wrong size or row >= num_rows(). out: [num_elements] / [row_elements()]. Writes out only.
  Status dequantize_tensor(const GgufTensor& tensor, std::span<float> out) const;
  Status dequantize_row(const GgufTensor& tensor, uint64_t row, std::span<float> out) const;

  // A readable summary (for `kvpool inspect`): format, version, alignment, the metadata (long
  // arrays and strings shortened), a tensor table (name, type, shape, offset, size) and a
  // per-type count. Does not modify the file.
  std::string describe(size_t max_tensors = SIZE_MAX) const;
  // One line: "GGUF v3, llama, 272 tensors (Q4_1 210, F32 61, Q8_0 1), 33 metadata keys, 93.8 MiB"
  std::string short_description() const;

 private:
  friend class GgufParser;
  template <typename T>
  Result<T> get_scalar(std::string_view key, GgufType want) const;
  Result<const GgufValue*> get_typed(std::string_view key, GgufType want) const;

  MappedFile file_;
  uint32_t version_ = 0;
  uint32_t alignment_ = kDefaultAlignment;
  uint64_t data_offset_ = 0;
  std::vector<GgufKeyValue> metadata_;
  std::unordered_map<std::string_view, size_t> metadata_index_;  // key -> index in metadata_
  std::vector<GgufTensor> tensors_;
  std::unordered_map<std::string_view, size_t> tensor_index_;  // name -> index in tensors_
};

}  // namespace kvp

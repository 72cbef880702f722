// GgufFile: parsing and validation of the GGUF header over a mapped file, typed metadata
// access, dequantisation of tensors and the inspect summary.
#include "model/gguf_file.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <type_traits>

#include "common/checked_math.h"
#include "common/limits.h"

namespace kvp {
namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as little-endian u32
constexpr uint32_t kMaxDims = 4;             // GGML_MAX_DIMS

// Bytes of one element of a fixed-size scalar type; 0 for String and Array.
size_t scalar_size_bytes(GgufType t) {
  switch (t) {
    case GgufType::Uint8:
    case GgufType::Int8:
    case GgufType::Bool:
      return 1;
    case GgufType::Uint16:
    case GgufType::Int16:
      return 2;
    case GgufType::Uint32:
    case GgufType::Int32:
    case GgufType::Float32:
      return 4;
    case GgufType::Uint64:
    case GgufType::Int64:
    case GgufType::Float64:
      return 8;
    case GgufType::String:
    case GgufType::Array:
      return 0;
  }
  return 0;
}

// The fewest bytes one value of type t can occupy (bounds array counts before allocating).
size_t min_value_size_bytes(GgufType t) {
  if (t == GgufType::String) return 8;  // length
  if (t == GgufType::Array) return 12;  // element type + count
  return scalar_size_bytes(t);
}

bool valid_gguf_type(uint32_t raw) { return raw <= static_cast<uint32_t>(GgufType::Float64); }

// Decodes a fixed-size scalar at p into a GgufValue of type t.
GgufValue decode_scalar(GgufType t, const uint8_t* p) {
  GgufValue v;
  v.type = t;
  switch (t) {
    case GgufType::Uint8:
      v.u = p[0];
      break;
    case GgufType::Int8:
      v.i = static_cast<int8_t>(p[0]);
      break;
    case GgufType::Bool:
      v.b = p[0] != 0;
      break;
    case GgufType::Uint16: {
      uint16_t x;
      std::memcpy(&x, p, 2);
      v.u = x;
      break;
    }
    case GgufType::Int16: {
      int16_t x;
      std::memcpy(&x, p, 2);
      v.i = x;
      break;
    }
    case GgufType::Uint32: {
      uint32_t x;
      std::memcpy(&x, p, 4);
      v.u = x;
      break;
    }
    case GgufType::Int32: {
      int32_t x;
      std::memcpy(&x, p, 4);
      v.i = x;
      break;
    }
    case GgufType::Float32: {
      float x;
      std::memcpy(&x, p, 4);
      v.f = x;
      break;
    }
    case GgufType::Uint64:
      std::memcpy(&v.u, p, 8);
      break;
    case GgufType::Int64:
      std::memcpy(&v.i, p, 8);
      break;
    case GgufType::Float64:
      std::memcpy(&v.f, p, 8);
      break;
    case GgufType::String:
    case GgufType::Array:
      KVP_CHECK(false, "decode_scalar of a non-scalar type");
      break;
  }
  return v;
}

std::string human_bytes(uint64_t bytes) {
  if (bytes >= (1ull << 30)) return fmt::format("{:.2f} GiB", bytes / double(1ull << 30));
  if (bytes >= (1ull << 20)) return fmt::format("{:.1f} MiB", bytes / double(1ull << 20));
  if (bytes >= (1ull << 10)) return fmt::format("{:.1f} KiB", bytes / double(1ull << 10));
  return fmt::format("{} B", bytes);
}

std::string shorten(std::string_view s, size_t max_chars) {
  std::string out;
  for (char c : s.substr(0, max_chars)) {
    if (c == '\n') {
      out += "\\n";
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
    } else {
      out += c;
    }
  }
  if (s.size() > max_chars) out += fmt::format("... ({} bytes)", s.size());
  return out;
}

}  // namespace

// Reads the header of a mapped file into a GgufFile, bounds-checking every read.
class GgufParser {
 public:
  explicit GgufParser(GgufFile& out) : out_(out), bytes_(out.file_.bytes()) {}

  Status parse() {
    const std::string& path = out_.path();
    if (bytes_.size() < 4) {
      return Status::corruption("gguf '{}': file is {} bytes, too short for a GGUF header", path,
                                bytes_.size());
    }
    uint32_t magic = 0;
    std::memcpy(&magic, bytes_.data(), 4);
    if (magic != kGgufMagic) {
      return Status::corruption(
          "gguf '{}': bad magic {:02x} {:02x} {:02x} {:02x} (expected 'GGUF')", path, bytes_[0],
          bytes_[1], bytes_[2], bytes_[3]);
    }
    pos_ = 4;
    uint32_t version = 0;
    KVP_RETURN_IF_ERROR(read_pod(&version, "the version"));
    if (version == 1) {
      return Status::unsupported("gguf '{}': GGUF version 1 is not supported (only 2 and 3)", path);
    }
    if ((version & 0xffff) == 0 && version != 0) {
      return Status::unsupported(
          "gguf '{}': big-endian GGUF (version field {:#x}) is not supported", path, version);
    }
    if (version != 2 && version != 3) {
      return Status::unsupported("gguf '{}': GGUF version {} is not supported (only 2 and 3)", path,
                                 version);
    }
    out_.version_ = version;
    uint64_t tensor_count = 0;
    uint64_t kv_count = 0;
    KVP_RETURN_IF_ERROR(read_pod(&tensor_count, "the tensor count"));
    KVP_RETURN_IF_ERROR(read_pod(&kv_count, "the metadata count"));
    // Every key/value takes at least 13 bytes and every tensor info at least 24: counts the rest
    // of the file cannot hold are refused before anything is allocated for them.
    if (kv_count > remaining() / 13) {
      return Status::corruption(
          "gguf '{}': metadata count {} is more than the {}-byte file can hold", path, kv_count,
          bytes_.size());
    }
    if (tensor_count > remaining() / 24) {
      return Status::corruption("gguf '{}': tensor count {} is more than the {}-byte file can hold",
                                path, tensor_count, bytes_.size());
    }
    const std::string source = fmt::format("gguf '{}'", path);
    KVP_RETURN_IF_ERROR(check_limit(source, "the metadata count", kv_count, limits::kMetadataKeys));
    KVP_RETURN_IF_ERROR(check_limit(source, "the tensor count", tensor_count, limits::kTensors));

    out_.metadata_.reserve(kv_count);
    for (uint64_t k = 0; k < kv_count; ++k) {
      KVP_RETURN_IF_ERROR(parse_key_value(k));
    }
    KVP_RETURN_IF_ERROR(read_alignment());

    out_.tensors_.reserve(tensor_count);
    for (uint64_t t = 0; t < tensor_count; ++t) {
      KVP_RETURN_IF_ERROR(parse_tensor_info(t));
    }
    const uint64_t align = out_.alignment_;
    const uint64_t data_offset = (pos_ + align - 1) / align * align;
    out_.data_offset_ = data_offset;
    return place_tensors();
  }

 private:
  size_t remaining() const { return bytes_.size() - pos_; }

  Status truncated(std::string_view what) const {
    return Status::corruption("gguf '{}': truncated at byte {} of {} while reading {}", out_.path(),
                              pos_, bytes_.size(), what);
  }

  template <typename T>
  Status read_pod(T* value, std::string_view what) {
    if (remaining() < sizeof(T)) return truncated(what);
    std::memcpy(value, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return Status::ok();
  }

  // Reads a string that fits in what is left of the file; false (nothing consumed) otherwise.
  bool try_read_string(std::string_view* s) {
    uint64_t length = 0;
    if (remaining() < 8) return false;
    std::memcpy(&length, bytes_.data() + pos_, 8);
    if (length > remaining() - 8 || length > limits::kMetadataStringBytes.max) return false;
    *s = std::string_view(reinterpret_cast<const char*>(bytes_.data() + pos_ + 8), length);
    pos_ += 8 + length;
    return true;
  }

  // A string must fit in what is left of the file.
  Status read_string(std::string_view* s, std::string_view what) {
    uint64_t length = 0;
    KVP_RETURN_IF_ERROR(read_pod(&length, what));
    if (length > remaining()) {
      return Status::corruption("gguf '{}': {} has length {} at byte {}, past the end of the file",
                                out_.path(), what, length, pos_ - 8);
    }
    KVP_RETURN_IF_ERROR(check_limit(fmt::format("gguf '{}'", out_.path()),
                                    fmt::format("the length of {}", what), length,
                                    limits::kMetadataStringBytes));
    *s = std::string_view(reinterpret_cast<const char*>(bytes_.data() + pos_), length);
    pos_ += length;
    return Status::ok();
  }

  Status read_type(GgufType* type, std::string_view what) {
    uint32_t raw = 0;
    KVP_RETURN_IF_ERROR(read_pod(&raw, what));
    if (!valid_gguf_type(raw)) {
      return Status::corruption("gguf '{}': {} is {}, not a GGUF value type (0..12)", out_.path(),
                                what, raw);
    }
    *type = static_cast<GgufType>(raw);
    return Status::ok();
  }

  Status parse_value(GgufType type, GgufValue* v, int depth, std::string_view key) {
    v->type = type;
    if (type == GgufType::String) {
      return read_string(&v->str, fmt::format("the string value of '{}'", key));
    }
    if (type != GgufType::Array) {
      const size_t size = scalar_size_bytes(type);
      if (remaining() < size) return truncated(fmt::format("the value of '{}'", key));
      *v = decode_scalar(type, bytes_.data() + pos_);
      pos_ += size;
      return Status::ok();
    }
    if (static_cast<uint64_t>(depth) >= limits::kMetadataArrayDepth.max) {
      return Status::unsupported(
          "gguf '{}': metadata '{}' nests arrays deeper than kvpool's limit "
          "of {} {}",
          out_.path(), key, limits::kMetadataArrayDepth.max, limits::kMetadataArrayDepth.unit);
    }
    KVP_RETURN_IF_ERROR(read_type(&v->element_type, fmt::format("the element type of '{}'", key)));
    KVP_RETURN_IF_ERROR(read_pod(&v->count, fmt::format("the element count of '{}'", key)));
    const size_t min_size = min_value_size_bytes(v->element_type);
    if (v->count > remaining() / min_size) {
      return Status::corruption(
          "gguf '{}': metadata '{}' claims {} {} elements, more than the {} bytes left can hold",
          out_.path(), key, v->count, gguf_type_name(v->element_type), remaining());
    }
    KVP_RETURN_IF_ERROR(check_limit(fmt::format("gguf '{}'", out_.path()),
                                    fmt::format("the element count of '{}'", key), v->count,
                                    limits::kMetadataArrayElements));
    if (v->element_type == GgufType::String) {
      v->strings.resize(v->count);
      for (uint64_t e = 0; e < v->count; ++e) {
        if (!try_read_string(&v->strings[e])) {
          return Status::corruption(
              "gguf '{}': string {} of array '{}' runs past the end of the file (byte {})",
              out_.path(), e, key, pos_);
        }
      }
    } else if (v->element_type == GgufType::Array) {
      v->arrays.resize(v->count);
      for (uint64_t e = 0; e < v->count; ++e) {
        KVP_RETURN_IF_ERROR(parse_value(GgufType::Array, &v->arrays[e], depth + 1, key));
      }
    } else {
      // count <= remaining() / min_size, so this fits; checked all the same
      const std::optional<uint64_t> size_bytes = checked_mul<uint64_t>(v->count, min_size);
      KVP_CHECK(size_bytes && *size_bytes <= remaining(), "array '{}' outgrew its bound", key);
      v->raw = bytes_.subspan(pos_, *size_bytes);
      pos_ += *size_bytes;
    }
    return Status::ok();
  }

  Status parse_key_value(uint64_t index) {
    GgufKeyValue kv;
    KVP_RETURN_IF_ERROR(read_string(&kv.key, fmt::format("the key of metadata entry {}", index)));
    GgufType type = GgufType::Uint8;
    KVP_RETURN_IF_ERROR(read_type(&type, fmt::format("the type of metadata '{}'", kv.key)));
    KVP_RETURN_IF_ERROR(parse_value(type, &kv.value, 0, kv.key));
    if (!out_.metadata_index_.emplace(kv.key, out_.metadata_.size()).second) {
      return Status::corruption("gguf '{}': metadata key '{}' appears twice", out_.path(), kv.key);
    }
    out_.metadata_.push_back(std::move(kv));
    return Status::ok();
  }

  Status read_alignment() {
    const GgufValue* v = out_.find("general.alignment");
    if (v == nullptr) return Status::ok();
    if (v->type != GgufType::Uint32) {
      return Status::corruption("gguf '{}': general.alignment is {}, expected uint32", out_.path(),
                                gguf_type_name(v->type));
    }
    if (v->u == 0 || (v->u & (v->u - 1)) != 0) {
      return Status::corruption("gguf '{}': general.alignment {} is not a power of two",
                                out_.path(), v->u);
    }
    out_.alignment_ = static_cast<uint32_t>(v->u);
    return Status::ok();
  }

  Status parse_tensor_info(uint64_t index) {
    GgufTensor t;
    KVP_RETURN_IF_ERROR(read_string(&t.name, fmt::format("the name of tensor {}", index)));
    const std::string where = fmt::format("tensor '{}'", t.name);
    uint32_t num_dims = 0;
    KVP_RETURN_IF_ERROR(read_pod(&num_dims, "the dimension count of " + where));
    if (num_dims > kMaxDims) {
      return Status::corruption("gguf '{}': {} has {} dimensions (at most {})", out_.path(), where,
                                num_dims, kMaxDims);
    }
    t.dims.resize(num_dims);
    for (uint32_t d = 0; d < num_dims; ++d) {
      KVP_RETURN_IF_ERROR(read_pod(&t.dims[d], "the dimensions of " + where));
      if (t.dims[d] > static_cast<uint64_t>(INT64_MAX)) {
        return Status::corruption("gguf '{}': {} dimension {} is {}, more than 2^63 - 1",
                                  out_.path(), where, d, t.dims[d]);
      }
    }
    const std::optional<uint64_t> product = checked_product<uint64_t>(t.dims);
    if (!product || *product > static_cast<uint64_t>(INT64_MAX)) {
      return Status::corruption("gguf '{}': {} has shape {}: more than 2^63 - 1 elements",
                                out_.path(), where, t.shape_string());
    }
    const uint64_t num_elements = *product;
    t.num_elements = num_elements;
    uint32_t raw_type = 0;
    KVP_RETURN_IF_ERROR(read_pod(&raw_type, "the type of " + where));
    const GgmlTypeInfo* info = ggml_type_info(raw_type);
    if (info == nullptr) {
      return Status::unsupported("gguf '{}': {} has unknown ggml type {}", out_.path(), where,
                                 raw_type);
    }
    t.type = info->type;
    KVP_RETURN_IF_ERROR(read_pod(&t.offset, "the data offset of " + where));
    const uint64_t row = t.row_elements();
    if (row % info->block_size != 0) {
      return Status::corruption(
          "gguf '{}': {} has rows of {} elements, not a multiple of {}'s "
          "block size {}",
          out_.path(), where, row, info->name, info->block_size);
    }
    // rows are whole blocks, so num_elements is a multiple of the block size; the byte size can
    // still pass 2^64 (an f32 tensor of 2^62 elements)
    const std::optional<uint64_t> size_bytes =
        checked_mul<uint64_t>(num_elements / info->block_size, info->type_size);
    if (!size_bytes) {
      return Status::corruption(
          "gguf '{}': {} of shape {} and type {} needs more than 2^64 - 1 bytes", out_.path(),
          where, t.shape_string(), info->name);
    }
    t.size_bytes = *size_bytes;
    if (!out_.tensor_index_.emplace(t.name, out_.tensors_.size()).second) {
      return Status::corruption("gguf '{}': tensor name '{}' appears twice", out_.path(), t.name);
    }
    out_.tensors_.push_back(std::move(t));
    return Status::ok();
  }

  Status place_tensors() {
    const uint64_t file_size = bytes_.size();
    const uint64_t data_offset = out_.data_offset_;
    for (GgufTensor& t : out_.tensors_) {
      if (t.offset % out_.alignment_ != 0) {
        return Status::corruption(
            "gguf '{}': tensor '{}' offset {} is not a multiple of the "
            "alignment {}",
            out_.path(), t.name, t.offset, out_.alignment_);
      }
      const std::optional<uint64_t> begin = checked_add(data_offset, t.offset);
      const std::optional<uint64_t> end =
          begin ? checked_add(*begin, t.size_bytes) : std::optional<uint64_t>();
      if (!end || *end > file_size) {
        return Status::corruption(
            "gguf '{}': tensor '{}' ({} bytes at data offset {}) lies past the end of the file "
            "({} bytes, data section at {}); the file is truncated or corrupt",
            out_.path(), t.name, t.size_bytes, t.offset, file_size, data_offset);
      }
      t.data = bytes_.subspan(*begin, t.size_bytes);
    }
    // Writers lay tensors out one after another; two sharing bytes means a corrupt offset.
    std::vector<const GgufTensor*> by_offset;
    for (const GgufTensor& t : out_.tensors_) {
      if (t.size_bytes > 0) by_offset.push_back(&t);
    }
    std::sort(by_offset.begin(), by_offset.end(),
              [](auto* a, auto* b) { return a->offset < b->offset; });
    for (size_t i = 1; i < by_offset.size(); ++i) {
      const GgufTensor& prev = *by_offset[i - 1];
      if (by_offset[i]->offset < prev.offset + prev.size_bytes) {
        return Status::corruption("gguf '{}': tensors '{}' and '{}' overlap", out_.path(),
                                  prev.name, by_offset[i]->name);
      }
    }
    return Status::ok();
  }

  GgufFile& out_;
  std::span<const uint8_t> bytes_;  // [file size] the mapping
  size_t pos_ = 0;                  // next byte to read
};

std::string_view gguf_type_name(GgufType type) {
  switch (type) {
    case GgufType::Uint8:
      return "uint8";
    case GgufType::Int8:
      return "int8";
    case GgufType::Uint16:
      return "uint16";
    case GgufType::Int16:
      return "int16";
    case GgufType::Uint32:
      return "uint32";
    case GgufType::Int32:
      return "int32";
    case GgufType::Float32:
      return "float32";
    case GgufType::Bool:
      return "bool";
    case GgufType::String:
      return "string";
    case GgufType::Array:
      return "array";
    case GgufType::Uint64:
      return "uint64";
    case GgufType::Int64:
      return "int64";
    case GgufType::Float64:
      return "float64";
  }
  return "?";
}

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufType::Uint8:
    case GgufType::Int8:
    case GgufType::Uint16:
    case GgufType::Int16:
    case GgufType::Uint32:
    case GgufType::Int32:
    case GgufType::Uint64:
    case GgufType::Int64:
      return true;
    default:
      return false;
  }
}

GgufValue GgufValue::element(uint64_t index) const {
  const size_t size = scalar_size_bytes(element_type);
  KVP_CHECK(type == GgufType::Array && size > 0 && index < count,
            "element({}) of a {} value with {} {} elements", index, gguf_type_name(type), count,
            gguf_type_name(element_type));
  return decode_scalar(element_type, raw.data() + index * size);
}

std::string GgufValue::to_string(size_t max_elements) const {
  switch (type) {
    case GgufType::Uint8:
    case GgufType::Uint16:
    case GgufType::Uint32:
    case GgufType::Uint64:
      return fmt::format("{}", u);
    case GgufType::Int8:
    case GgufType::Int16:
    case GgufType::Int32:
    case GgufType::Int64:
      return fmt::format("{}", i);
    case GgufType::Float32:
      return fmt::format("{}", static_cast<float>(f));
    case GgufType::Float64:
      return fmt::format("{}", f);
    case GgufType::Bool:
      return b ? "true" : "false";
    case GgufType::String:
      return fmt::format("\"{}\"", shorten(str, 60));
    case GgufType::Array:
      break;
  }
  if (count > max_elements) {
    return fmt::format("[{} x {}]", gguf_type_name(element_type), count);
  }
  std::string out = "[";
  for (uint64_t e = 0; e < count; ++e) {
    if (e > 0) out += ", ";
    if (element_type == GgufType::String) {
      out += fmt::format("\"{}\"", shorten(strings[e], 30));
    } else if (element_type == GgufType::Array) {
      out += arrays[e].to_string(max_elements);
    } else {
      out += element(e).to_string();
    }
  }
  return out + "]";
}

std::string GgufTensor::shape_string() const { return fmt::format("[{}]", fmt::join(dims, ", ")); }

Result<GgufFile> GgufFile::open(const std::string& path) {
  KVP_ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::open(path));
  return open(std::move(mapped));
}

Result<GgufFile> GgufFile::open(MappedFile mapped) {
  GgufFile file;
  file.file_ = std::move(mapped);
  KVP_RETURN_IF_ERROR(GgufParser(file).parse());
  return file;
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = metadata_index_.find(key);
  return it == metadata_index_.end() ? nullptr : &metadata_[it->second].value;
}

Result<const GgufValue*> GgufFile::get_typed(std::string_view key, GgufType want) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return Status::not_found("gguf '{}': metadata key '{}' not found", path(), key);
  if (v->type != want) {
    return Status::mismatch("gguf '{}': metadata key '{}' is {}, expected {}", path(), key,
                            gguf_type_name(v->type), gguf_type_name(want));
  }
  return v;
}

template <typename T>
Result<T> GgufFile::get_scalar(std::string_view key, GgufType want) const {
  KVP_ASSIGN_OR_RETURN(const GgufValue* v, get_typed(key, want));
  if constexpr (std::is_same_v<T, bool>) {
    return v->b;
  } else if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(v->f);
  } else if constexpr (std::is_signed_v<T>) {
    return static_cast<T>(v->i);
  } else {
    return static_cast<T>(v->u);
  }
}

Result<uint8_t> GgufFile::get_u8(std::string_view k) const {
  return get_scalar<uint8_t>(k, GgufType::Uint8);
}
Result<int8_t> GgufFile::get_i8(std::string_view k) const {
  return get_scalar<int8_t>(k, GgufType::Int8);
}
Result<uint16_t> GgufFile::get_u16(std::string_view k) const {
  return get_scalar<uint16_t>(k, GgufType::Uint16);
}
Result<int16_t> GgufFile::get_i16(std::string_view k) const {
  return get_scalar<int16_t>(k, GgufType::Int16);
}
Result<uint32_t> GgufFile::get_u32(std::string_view k) const {
  return get_scalar<uint32_t>(k, GgufType::Uint32);
}
Result<int32_t> GgufFile::get_i32(std::string_view k) const {
  return get_scalar<int32_t>(k, GgufType::Int32);
}
Result<uint64_t> GgufFile::get_u64(std::string_view k) const {
  return get_scalar<uint64_t>(k, GgufType::Uint64);
}
Result<int64_t> GgufFile::get_i64(std::string_view k) const {
  return get_scalar<int64_t>(k, GgufType::Int64);
}
Result<float> GgufFile::get_f32(std::string_view k) const {
  return get_scalar<float>(k, GgufType::Float32);
}
Result<double> GgufFile::get_f64(std::string_view k) const {
  return get_scalar<double>(k, GgufType::Float64);
}
Result<bool> GgufFile::get_bool(std::string_view k) const {
  return get_scalar<bool>(k, GgufType::Bool);
}
Result<std::string_view> GgufFile::get_string(std::string_view key) const {
  KVP_ASSIGN_OR_RETURN(const GgufValue* v, get_typed(key, GgufType::String));
  return v->str;
}

Result<int64_t> GgufFile::get_integer(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return Status::not_found("gguf '{}': metadata key '{}' not found", path(), key);
  if (!v->is_integer()) {
    return Status::mismatch("gguf '{}': metadata key '{}' is {}, expected an integer", path(), key,
                            gguf_type_name(v->type));
  }
  const bool is_unsigned = v->type == GgufType::Uint8 || v->type == GgufType::Uint16 ||
                           v->type == GgufType::Uint32 || v->type == GgufType::Uint64;
  if (!is_unsigned) return v->i;
  if (v->u > static_cast<uint64_t>(INT64_MAX)) {
    return Status::mismatch("gguf '{}': metadata key '{}' = {} does not fit in int64", path(), key,
                            v->u);
  }
  return static_cast<int64_t>(v->u);
}

Result<const GgufValue*> GgufFile::get_array(std::string_view key) const {
  return get_typed(key, GgufType::Array);
}

namespace {
Status check_element_type(const std::string& path, std::string_view key, const GgufValue& v,
                          GgufType want) {
  if (v.element_type != want) {
    return Status::mismatch("gguf '{}': metadata key '{}' is an array of {}, expected {}", path,
                            key, gguf_type_name(v.element_type), gguf_type_name(want));
  }
  return Status::ok();
}
}  // namespace

Result<std::vector<std::string_view>> GgufFile::get_string_array(std::string_view key) const {
  KVP_ASSIGN_OR_RETURN(const GgufValue* v, get_array(key));
  KVP_RETURN_IF_ERROR(check_element_type(path(), key, *v, GgufType::String));
  return v->strings;
}

Result<std::vector<float>> GgufFile::get_f32_array(std::string_view key) const {
  KVP_ASSIGN_OR_RETURN(const GgufValue* v, get_array(key));
  KVP_RETURN_IF_ERROR(check_element_type(path(), key, *v, GgufType::Float32));
  std::vector<float> out(v->count);
  if (v->count > 0) std::memcpy(out.data(), v->raw.data(), v->raw.size());
  return out;
}

Result<std::vector<int32_t>> GgufFile::get_i32_array(std::string_view key) const {
  KVP_ASSIGN_OR_RETURN(const GgufValue* v, get_array(key));
  KVP_RETURN_IF_ERROR(check_element_type(path(), key, *v, GgufType::Int32));
  std::vector<int32_t> out(v->count);
  if (v->count > 0) std::memcpy(out.data(), v->raw.data(), v->raw.size());
  return out;
}

Result<const GgufTensor*> GgufFile::tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  if (it == tensor_index_.end()) {
    return Status::not_found("gguf '{}': tensor '{}' not found", path(), name);
  }
  return &tensors_[it->second];
}

Status GgufFile::dequantize_tensor(const GgufTensor& t, std::span<float> out) const {
  if (!can_dequantize(t.type)) {
    return Status::unsupported(
        "gguf '{}': tensor '{}' has type {}, which kvpool cannot convert "
        "to f32",
        path(), t.name, ggml_type_name(t.type));
  }
  if (out.size() != t.num_elements) {
    return Status::invalid_argument("gguf '{}': tensor '{}' has {} elements, output holds {}",
                                    path(), t.name, t.num_elements, out.size());
  }
  if (t.num_elements > 0) dequantize(t.type, t.data.data(), t.num_elements, out.data());
  return Status::ok();
}

Status GgufFile::dequantize_row(const GgufTensor& t, uint64_t row, std::span<float> out) const {
  if (!can_dequantize(t.type)) {
    return Status::unsupported(
        "gguf '{}': tensor '{}' has type {}, which kvpool cannot convert "
        "to f32",
        path(), t.name, ggml_type_name(t.type));
  }
  if (row >= t.num_rows()) {
    return Status::invalid_argument("gguf '{}': tensor '{}' has {} rows, asked for row {}", path(),
                                    t.name, t.num_rows(), row);
  }
  if (out.size() != t.row_elements()) {
    return Status::invalid_argument("gguf '{}': tensor '{}' rows have {} elements, output holds {}",
                                    path(), t.name, t.row_elements(), out.size());
  }
  const uint64_t row_bytes = t.row_size_bytes();
  dequantize(t.type, t.data.data() + row * row_bytes, t.row_elements(), out.data());
  return Status::ok();
}

std::string GgufFile::short_description() const {
  std::map<std::string_view, size_t> by_type;
  std::vector<std::string_view> order;
  uint64_t tensor_bytes = 0;
  for (const GgufTensor& t : tensors_) {
    if (by_type[ggml_type_name(t.type)]++ == 0) order.push_back(ggml_type_name(t.type));
    tensor_bytes += t.size_bytes;
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](auto a, auto b) { return by_type[a] > by_type[b]; });
  std::vector<std::string> parts;
  for (auto name : order) parts.push_back(fmt::format("{} {}", name, by_type[name]));
  auto arch = get_string("general.architecture");
  return fmt::format("GGUF v{}, {}, {} tensors ({}), {} metadata keys, {} of tensor data", version_,
                     arch.is_ok() ? std::string(*arch) : std::string("unknown arch"),
                     tensors_.size(), fmt::join(parts, ", "), metadata_.size(),
                     human_bytes(tensor_bytes));
}

std::string GgufFile::describe(size_t max_tensors) const {
  std::string out = fmt::format("{}: {}\n", path(), short_description());
  out += fmt::format("alignment {}, data section at byte {} of {}\n", alignment_, data_offset_,
                     file_size_bytes());
  out += fmt::format("metadata ({}):\n", metadata_.size());
  for (const GgufKeyValue& kv : metadata_) {
    std::string type = std::string(gguf_type_name(kv.value.type));
    if (kv.value.type == GgufType::Array) {
      type = fmt::format("array<{}>", gguf_type_name(kv.value.element_type));
    }
    out += fmt::format("  {:<44} {:<15} {}\n", kv.key, type, kv.value.to_string());
  }
  out += fmt::format("tensors ({}):\n", tensors_.size());
  size_t shown = 0;
  for (const GgufTensor& t : tensors_) {
    if (shown++ == max_tensors) {
      out += fmt::format("  ... {} more\n", tensors_.size() - max_tensors);
      break;
    }
    out +=
        fmt::format("  {:<40} {:<6} {:<20} offset {:>11} {:>10}\n", t.name, ggml_type_name(t.type),
                    t.shape_string(), t.offset, human_bytes(t.size_bytes));
  }
  return out;
}

}  // namespace kvp

#include "model/safetensors_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "common/dtype.h"

namespace kvp {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::optional<SafetensorsDType> parse_tensor_dtype(const std::string& s) {
  if (s == "F32") return SafetensorsDType::kF32;
  if (s == "F16") return SafetensorsDType::kF16;
  if (s == "BF16") return SafetensorsDType::kBF16;
  if (s == "I32") return SafetensorsDType::kI32;
  if (s == "I64") return SafetensorsDType::kI64;
  return std::nullopt;
}

size_t element_size(SafetensorsDType t) {
  switch (t) {
    case SafetensorsDType::kF32:
    case SafetensorsDType::kI32:
      return 4;
    case SafetensorsDType::kI64:
      return 8;
    default:
      return 2;
  }
}

std::string shape_string(std::span<const int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

SafetensorsModel::~SafetensorsModel() {
  for (const Mapping& m : files_) {
    if (m.address != nullptr) munmap(m.address, m.size_bytes);
  }
}

Result<std::unique_ptr<SafetensorsModel>> SafetensorsModel::open(const std::string& path) {
  std::unique_ptr<SafetensorsModel> model(new SafetensorsModel());
  fs::path p(path);
  std::error_code ec;
  if (fs::is_directory(p, ec)) {
    if (fs::exists(p / "model.safetensors.index.json")) {
      p /= "model.safetensors.index.json";
    } else if (fs::exists(p / "model.safetensors")) {
      p /= "model.safetensors";
    } else {
      return Status::not_found("{}: no model.safetensors or model.safetensors.index.json", path);
    }
  }
  if (!fs::exists(p, ec)) return Status::not_found("{}: no such file", p.string());
  if (p.filename().string().ends_with(".index.json")) {
    std::ifstream in(p);
    json index = json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (index.is_discarded() || !index.is_object() || !index.contains("weight_map") ||
        !index["weight_map"].is_object()) {
      return Status::corruption("{}: not a safetensors index (no 'weight_map' object)", p.string());
    }
    std::set<std::string> shards;
    for (const auto& [tensor, shard] : index["weight_map"].items()) {
      if (!shard.is_string()) {
        return Status::corruption("{}: weight_map entry '{}' is not a file name", p.string(),
                                  tensor);
      }
      shards.insert(shard.get<std::string>());
    }
    for (const std::string& shard : shards) {
      KVP_RETURN_IF_ERROR(model->add_file((p.parent_path() / shard).string()));
    }
    for (const auto& [tensor, shard] : index["weight_map"].items()) {
      if (!model->tensors_.contains(tensor)) {
        return Status::corruption("{}: tensor '{}' is listed in {} but not found there", p.string(),
                                  tensor, shard.get<std::string>());
      }
    }
    model->description_ = p.string();
  } else {
    KVP_RETURN_IF_ERROR(model->add_file(p.string()));
    model->description_ = p.string();
  }
  return model;
}

Status SafetensorsModel::add_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::io_error("{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    ::close(fd);
    return Status::io_error("{}: cannot stat: {}", path, std::strerror(errno));
  }
  const auto file_size = static_cast<size_t>(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    return Status::corruption("{}: {} bytes is too short for a safetensors header", path,
                              file_size);
  }
  void* address = mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (address == MAP_FAILED) return Status::io_error("{}: mmap failed", path);
  files_.push_back({path, address, file_size});
  const auto file_index = static_cast<int32_t>(files_.size() - 1);
  const auto* bytes = static_cast<const std::byte*>(address);

  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes, 8);  // little-endian, as the format says
  if (header_size > file_size - 8) {
    return Status::corruption("{}: header of {} bytes runs past the end of the {}-byte file", path,
                              header_size, file_size);
  }
  const auto* header_begin = reinterpret_cast<const char*>(bytes + 8);
  json header = json::parse(header_begin, header_begin + header_size, nullptr, false);
  if (header.is_discarded() || !header.is_object()) {
    return Status::corruption("{}: header is not a JSON object", path);
  }
  const size_t data_begin = 8 + header_size;
  const size_t data_size = file_size - data_begin;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    if (!info.is_object() || !info.contains("dtype") || !info.contains("shape") ||
        !info.contains("data_offsets") || !info["dtype"].is_string() || !info["shape"].is_array() ||
        !info["data_offsets"].is_array() || info["data_offsets"].size() != 2) {
      return Status::corruption("{}: tensor '{}' has a malformed header entry", path, name);
    }
    SafetensorsTensor t;
    t.name = name;
    t.file_index = file_index;
    const std::string dtype = info["dtype"].get<std::string>();
    auto parsed = parse_tensor_dtype(dtype);
    if (!parsed) {
      return Status::unsupported(
          "{}: tensor '{}' has dtype {} (supported: F32, F16, BF16, I32, I64)", path, name, dtype);
    }
    t.dtype = *parsed;
    uint64_t count = 1;
    for (const json& d : info["shape"]) {
      if (!d.is_number_unsigned()) {
        return Status::corruption("{}: tensor '{}' has a non-integer dimension", path, name);
      }
      const uint64_t dim = d.get<uint64_t>();
      if (dim != 0 && count > (uint64_t{1} << 48) / dim) {
        return Status::corruption("{}: tensor '{}' has an absurd shape", path, name);
      }
      count *= dim;
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    const json& offsets = info["data_offsets"];
    if (!offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned()) {
      return Status::corruption("{}: tensor '{}' has non-integer data offsets", path, name);
    }
    const uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
    if (begin > end || end > data_size) {
      return Status::corruption("{}: tensor '{}' data [{}, {}) lies outside the {} data bytes",
                                path, name, begin, end, data_size);
    }
    if (end - begin != count * element_size(t.dtype)) {
      return Status::corruption("{}: tensor '{}' holds {} bytes but shape {} of {} needs {}", path,
                                name, end - begin, shape_string(t.shape), dtype,
                                count * element_size(t.dtype));
    }
    t.data = bytes + data_begin + begin;
    t.size_bytes = end - begin;
    if (tensors_.contains(name)) {
      return Status::corruption("{}: tensor '{}' appears in more than one file", path, name);
    }
    tensors_.emplace(name, std::move(t));
  }
  return Status::ok();
}

bool SafetensorsModel::contains(const std::string& name) const { return tensors_.contains(name); }

Result<std::vector<float>> SafetensorsModel::read_f32(const std::string& name,
                                                      std::span<const int64_t> shape) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return Status::not_found("{}: no tensor '{}'", description_, name);
  const SafetensorsTensor& t = it->second;
  if (!std::equal(t.shape.begin(), t.shape.end(), shape.begin(), shape.end())) {
    return Status::mismatch("{}: tensor '{}' has shape {}, expected {}", description_, name,
                            shape_string(t.shape), shape_string(shape));
  }
  const size_t count = t.size_bytes / element_size(t.dtype);
  std::vector<float> out(count);
  switch (t.dtype) {
    case SafetensorsDType::kF32:
      std::memcpy(out.data(), t.data, t.size_bytes);
      break;
    case SafetensorsDType::kF16:
      for (size_t i = 0; i < count; ++i) out[i] = load_as_f32(t.data, DType::F16, i);
      break;
    case SafetensorsDType::kBF16:
      for (size_t i = 0; i < count; ++i) out[i] = load_as_f32(t.data, DType::BF16, i);
      break;
    case SafetensorsDType::kI32:
    case SafetensorsDType::kI64:
      return Status::unsupported("{}: tensor '{}' holds integers, not weights", description_, name);
  }
  return out;
}

}  // namespace kvp

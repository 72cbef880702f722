// Safetensors parsing and validation, shard indexes and config.json.
#include "model/safetensors_file.h"

#include "common/checked_math.h"
#include "quant/dequant.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace kvp {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct DTypeEntry {
  std::string_view name;
  size_t size_bytes;
  std::optional<DType> dtype;
};

// Every dtype the safetensors format defines; kvpool converts the three float types.
constexpr DTypeEntry kDTypes[] = {
    {"F32", 4, DType::F32},    {"F16", 2, DType::F16},       {"BF16", 2, DType::BF16},
    {"F64", 8, std::nullopt},  {"I64", 8, std::nullopt},     {"U64", 8, std::nullopt},
    {"I32", 4, std::nullopt},  {"U32", 4, std::nullopt},     {"I16", 2, std::nullopt},
    {"U16", 2, std::nullopt},  {"I8", 1, std::nullopt},      {"U8", 1, std::nullopt},
    {"BOOL", 1, std::nullopt}, {"F8_E4M3", 1, std::nullopt}, {"F8_E5M2", 1, std::nullopt},
};

const DTypeEntry* find_dtype(std::string_view name) {
  for (const DTypeEntry& e : kDTypes) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

std::string human_bytes(uint64_t bytes) {
  if (bytes >= (1ull << 30)) return fmt::format("{:.2f} GiB", bytes / double(1ull << 30));
  if (bytes >= (1ull << 20)) return fmt::format("{:.1f} MiB", bytes / double(1ull << 20));
  if (bytes >= (1ull << 10)) return fmt::format("{:.1f} KiB", bytes / double(1ull << 10));
  return fmt::format("{} B", bytes);
}

// Reads a whole small text file (index, config). NotFound / IoError.
Result<std::string> read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (!fs::exists(path)) return Status::not_found("file '{}' does not exist", path);
    return Status::io_error("file '{}': cannot read", path);
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

// Parses the JSON header of a mapped safetensors file into a SafetensorsFile.
class SafetensorsParser {
 public:
  explicit SafetensorsParser(SafetensorsFile& out) : out_(out), bytes_(out.file_.bytes()) {}

  Status parse() {
    const std::string& path = out_.path();
    if (bytes_.size() < 8) {
      return Status::corruption("safetensors '{}': file is {} bytes, too short for the header size",
                                path, bytes_.size());
    }
    uint64_t header_size = 0;
    std::memcpy(&header_size, bytes_.data(), 8);
    if (header_size > SafetensorsFile::kMaxHeaderBytes) {
      return Status::corruption("safetensors '{}': header size {} is absurd (limit {} bytes)", path,
                                header_size, SafetensorsFile::kMaxHeaderBytes);
    }
    if (header_size > bytes_.size() - 8) {
      return Status::corruption(
          "safetensors '{}': header of {} bytes runs past the end of the {}-byte file", path,
          header_size, bytes_.size());
    }
    out_.data_offset_ = 8 + header_size;
    const auto* text = reinterpret_cast<const char*>(bytes_.data() + 8);
    json header = json::parse(text, text + header_size, nullptr, /*allow_exceptions=*/false);
    if (header.is_discarded()) {
      return Status::corruption("safetensors '{}': header is not valid JSON", path);
    }
    if (!header.is_object()) {
      return Status::corruption("safetensors '{}': header is JSON {}, expected an object", path,
                                header.type_name());
    }
    KVP_RETURN_IF_ERROR(check_limit(fmt::format("safetensors '{}'", path), "the tensor count",
                                    header.size(), limits::kTensors));
    const uint64_t data_size = bytes_.size() - out_.data_offset_;
    for (auto& [name, entry] : header.items()) {
      if (name == "__metadata__") {
        KVP_RETURN_IF_ERROR(parse_metadata(entry));
        continue;
      }
      KVP_RETURN_IF_ERROR(parse_tensor(name, entry, data_size));
    }
    std::sort(out_.tensors_.begin(), out_.tensors_.end(),
              [](const auto& a, const auto& b) { return a.name < b.name; });
    KVP_RETURN_IF_ERROR(check_overlaps());
    for (size_t i = 0; i < out_.tensors_.size(); ++i) {
      SafetensorsTensor& t = out_.tensors_[i];
      t.data = bytes_.subspan(out_.data_offset_ + t.data_begin, t.data_end - t.data_begin);
      out_.index_.emplace(t.name, i);  // names are final: views stay valid
    }
    return Status::ok();
  }

 private:
  Status parse_metadata(const json& entry) {
    if (!entry.is_object()) {
      return Status::corruption("safetensors '{}': __metadata__ is {}, expected an object",
                                out_.path(), entry.type_name());
    }
    for (const auto& [key, value] : entry.items()) {
      if (!value.is_string()) {
        return Status::corruption("safetensors '{}': __metadata__ '{}' is {}, expected a string",
                                  out_.path(), key, value.type_name());
      }
      out_.metadata_[key] = value.get<std::string>();
    }
    return Status::ok();
  }

  Status bad_tensor(const std::string& name, std::string_view why) const {
    return Status::corruption("safetensors '{}': tensor '{}': {}", out_.path(), name, why);
  }

  Status parse_tensor(const std::string& name, const json& entry, uint64_t data_size) {
    if (!entry.is_object()) return bad_tensor(name, "entry is not an object");
    auto dtype_it = entry.find("dtype");
    auto shape_it = entry.find("shape");
    auto offsets_it = entry.find("data_offsets");
    if (dtype_it == entry.end() || !dtype_it->is_string()) {
      return bad_tensor(name, "'dtype' is missing or not a string");
    }
    if (shape_it == entry.end() || !shape_it->is_array()) {
      return bad_tensor(name, "'shape' is missing or not an array");
    }
    if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
        !(*offsets_it)[0].is_number_unsigned() || !(*offsets_it)[1].is_number_unsigned()) {
      return bad_tensor(name, "'data_offsets' is not [begin, end] of non-negative integers");
    }
    SafetensorsTensor t;
    t.name = name;
    t.dtype_name = dtype_it->get<std::string>();
    const DTypeEntry* dtype = find_dtype(t.dtype_name);
    if (dtype == nullptr) {
      return Status::unsupported("safetensors '{}': tensor '{}' has unknown dtype '{}'",
                                 out_.path(), name, t.dtype_name);
    }
    t.dtype = dtype->dtype;
    t.element_size_bytes = dtype->size_bytes;
    uint64_t num_elements = 1;
    for (const json& dim : *shape_it) {
      if (!dim.is_number_unsigned()) {
        return bad_tensor(name, fmt::format("shape {} has a dimension that is not a non-negative "
                                            "integer",
                                            shape_it->dump()));
      }
      const uint64_t d = dim.get<uint64_t>();
      const std::optional<uint64_t> product = checked_mul(num_elements, d);
      if (!product) {
        return bad_tensor(
            name, fmt::format("shape {} has more than 2^64 - 1 elements", shape_it->dump()));
      }
      num_elements = *product;
      t.shape.push_back(d);
    }
    t.num_elements = num_elements;
    t.data_begin = (*offsets_it)[0].get<uint64_t>();
    t.data_end = (*offsets_it)[1].get<uint64_t>();
    if (t.data_begin > t.data_end || t.data_end > data_size) {
      return bad_tensor(name, fmt::format("data_offsets [{}, {}] are outside the {}-byte data",
                                          t.data_begin, t.data_end, data_size));
    }
    const std::optional<uint64_t> size_bytes =
        checked_mul<uint64_t>(num_elements, t.element_size_bytes);
    if (!size_bytes || *size_bytes != t.data_end - t.data_begin) {
      return bad_tensor(name, fmt::format("shape {} of {} needs {} elements x {} bytes, but "
                                          "data_offsets span {} bytes",
                                          shape_it->dump(), t.dtype_name, num_elements,
                                          t.element_size_bytes, t.data_end - t.data_begin));
    }
    out_.tensors_.push_back(std::move(t));
    return Status::ok();
  }

  Status check_overlaps() const {
    std::vector<const SafetensorsTensor*> by_offset;
    for (const auto& t : out_.tensors_) {
      if (t.data_end > t.data_begin) by_offset.push_back(&t);
    }
    std::sort(by_offset.begin(), by_offset.end(),
              [](auto* a, auto* b) { return a->data_begin < b->data_begin; });
    for (size_t i = 1; i < by_offset.size(); ++i) {
      if (by_offset[i]->data_begin < by_offset[i - 1]->data_end) {
        return Status::corruption("safetensors '{}': tensors '{}' and '{}' overlap", out_.path(),
                                  by_offset[i - 1]->name, by_offset[i]->name);
      }
    }
    return Status::ok();
  }

  SafetensorsFile& out_;
  std::span<const uint8_t> bytes_;  // [file size] the mapping
};

std::string SafetensorsTensor::shape_string() const {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  KVP_ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::open(path));
  return open(std::move(mapped));
}

Result<SafetensorsFile> SafetensorsFile::open(MappedFile mapped) {
  SafetensorsFile file;
  file.file_ = std::move(mapped);
  KVP_RETURN_IF_ERROR(SafetensorsParser(file).parse());
  return file;
}

Result<const SafetensorsTensor*> SafetensorsFile::tensor(std::string_view name) const {
  auto it = index_.find(name);
  if (it == index_.end()) {
    return Status::not_found("safetensors '{}': tensor '{}' not found", path(), name);
  }
  return &tensors_[it->second];
}

Status SafetensorsFile::to_f32(const SafetensorsTensor& t, std::span<float> out) const {
  if (!t.dtype.has_value()) {
    return Status::unsupported(
        "safetensors '{}': tensor '{}' has dtype {}; kvpool converts only "
        "F32, F16 and BF16",
        path(), t.name, t.dtype_name);
  }
  if (out.size() != t.num_elements) {
    return Status::invalid_argument(
        "safetensors '{}': tensor '{}' has {} elements, output holds {}", path(), t.name,
        t.num_elements, out.size());
  }
  // The ggml F32/F16/BF16 kernels are the same element-wise conversions.
  const GgmlType type = *t.dtype == DType::F32   ? GgmlType::F32
                        : *t.dtype == DType::F16 ? GgmlType::F16
                                                 : GgmlType::BF16;
  if (t.num_elements > 0) dequantize(type, t.data.data(), t.num_elements, out.data());
  return Status::ok();
}

std::string SafetensorsFile::describe(size_t max_tensors) const {
  uint64_t total = 0;
  for (const auto& t : tensors_) total += t.data.size();
  std::string out = fmt::format("{}: safetensors, {} tensors, {} of tensor data\n", path(),
                                tensors_.size(), human_bytes(total));
  for (const auto& [k, v] : metadata_) out += fmt::format("  {:<30} \"{}\"\n", k, v);
  size_t shown = 0;
  for (const auto& t : tensors_) {
    if (shown++ == max_tensors) {
      out += fmt::format("  ... {} more\n", tensors_.size() - max_tensors);
      break;
    }
    out += fmt::format("  {:<50} {:<7} {:<20} {:>10}\n", t.name, t.dtype_name, t.shape_string(),
                       human_bytes(t.data.size()));
  }
  return out;
}

Result<SafetensorsModel> SafetensorsModel::open(const std::string& path) {
  SafetensorsModel model;
  std::error_code ec;
  std::string index_path;
  std::vector<std::string> shard_paths;
  if (fs::is_directory(path, ec)) {
    model.directory_ = path;
    const fs::path index = fs::path(path) / "model.safetensors.index.json";
    const fs::path single = fs::path(path) / "model.safetensors";
    if (fs::exists(index, ec)) {
      index_path = index.string();
    } else if (fs::exists(single, ec)) {
      shard_paths.push_back(single.string());
    } else {
      return Status::not_found(
          "model directory '{}' has neither model.safetensors nor "
          "model.safetensors.index.json",
          path);
    }
  } else if (!fs::exists(path, ec)) {
    return Status::not_found("file '{}' does not exist", path);
  } else {
    model.directory_ = fs::path(path).parent_path().string();
    if (model.directory_.empty()) model.directory_ = ".";
    if (path.ends_with(".index.json")) {
      index_path = path;
    } else {
      shard_paths.push_back(path);
    }
  }

  // The index maps tensor names to shard file names in the same directory.
  std::map<std::string, std::string> weight_map;  // tensor -> shard file name
  if (!index_path.empty()) {
    KVP_ASSIGN_OR_RETURN(std::string text, read_text(index_path));
    json index = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (index.is_discarded() || !index.is_object()) {
      return Status::corruption("safetensors index '{}' is not a JSON object", index_path);
    }
    auto wm = index.find("weight_map");
    if (wm == index.end() || !wm->is_object()) {
      return Status::corruption("safetensors index '{}' has no 'weight_map' object", index_path);
    }
    std::map<std::string, size_t> shard_numbers;
    for (const auto& [tensor, shard] : wm->items()) {
      if (!shard.is_string()) {
        return Status::corruption("safetensors index '{}': weight_map['{}'] is not a string",
                                  index_path, tensor);
      }
      const std::string file = shard.get<std::string>();
      if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..") {
        return Status::corruption(
            "safetensors index '{}': shard name '{}' for '{}' is not a file "
            "name in the model directory",
            index_path, file, tensor);
      }
      weight_map[tensor] = file;
      if (shard_numbers.emplace(file, shard_paths.size()).second) {
        shard_paths.push_back((fs::path(model.directory_) / file).string());
      }
    }
  }

  for (const std::string& shard_path : shard_paths) {
    KVP_ASSIGN_OR_RETURN(SafetensorsFile shard, SafetensorsFile::open(shard_path));
    model.shards_.push_back(std::move(shard));
  }

  if (index_path.empty()) {
    for (const auto& t : model.shards_[0].tensors()) {
      model.tensors_.emplace(t.name, Location{0, &t});
    }
  } else {
    std::map<std::string, size_t> shard_of_file;
    for (size_t s = 0; s < shard_paths.size(); ++s) {
      shard_of_file[fs::path(shard_paths[s]).filename().string()] = s;
    }
    for (const auto& [tensor, file] : weight_map) {
      const size_t s = shard_of_file.at(file);
      auto found = model.shards_[s].tensor(tensor);
      if (!found.is_ok()) {
        return Status::corruption(
            "safetensors index '{}' puts tensor '{}' in '{}', which does "
            "not contain it",
            index_path, tensor, file);
      }
      model.tensors_.emplace(tensor, Location{s, *found});
    }
  }

  const fs::path config = fs::path(model.directory_) / "config.json";
  if (fs::exists(config, ec)) {
    KVP_ASSIGN_OR_RETURN(std::string text, read_text(config.string()));
    json parsed = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (parsed.is_discarded() || !parsed.is_object()) {
      return Status::corruption("config '{}' is not a JSON object", config.string());
    }
    model.config_ = std::move(parsed);
  }
  return model;
}

std::vector<std::string_view> SafetensorsModel::tensor_names() const {
  std::vector<std::string_view> names;
  names.reserve(tensors_.size());
  for (const auto& [name, loc] : tensors_) names.push_back(name);
  return names;
}

Result<const SafetensorsTensor*> SafetensorsModel::tensor(std::string_view name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return Status::not_found("safetensors model '{}': tensor '{}' not found", directory_, name);
  }
  return it->second.tensor;
}

Status SafetensorsModel::to_f32(std::string_view name, std::span<float> out) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return Status::not_found("safetensors model '{}': tensor '{}' not found", directory_, name);
  }
  return shards_[it->second.shard].to_f32(*it->second.tensor, out);
}

std::string SafetensorsModel::describe(size_t max_tensors) const {
  std::string out =
      fmt::format("{}: safetensors model, {} shard(s), {} tensors{}\n", directory_, shards_.size(),
                  tensors_.size(), config_ ? ", config.json" : ", no config.json");
  if (config_) {
    for (const char* key : {"architectures", "model_type", "hidden_size", "num_hidden_layers",
                            "num_attention_heads", "num_key_value_heads", "vocab_size"}) {
      auto it = config_->find(key);
      if (it != config_->end()) out += fmt::format("  config {:<22} {}\n", key, it->dump());
    }
  }
  size_t shown = 0;
  for (const auto& [name, loc] : tensors_) {
    if (shown++ == max_tensors) {
      out += fmt::format("  ... {} more\n", tensors_.size() - max_tensors);
      break;
    }
    out += fmt::format("  {:<50} {:<7} {:<20} {}\n", name, loc.tensor->dtype_name,
                       loc.tensor->shape_string(),
                       fs::path(shards_[loc.shard].path()).filename().string());
  }
  return out;
}

}  // namespace kvp

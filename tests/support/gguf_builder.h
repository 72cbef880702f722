// GgufBuilder: GGUF v3 bytes built in memory for tests — metadata of any scalar, string or
// string-array type and tensors with raw data — opened as a GgufFile without touching the disk.
//   auto file = GgufBuilder().str("general.architecture", "llama").u32("llama.block_count", 2)
//                   .open("tiny.gguf");
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "model/gguf_file.h"

namespace kvp::test {

class GgufBuilder {
 public:
  GgufBuilder& u32(std::string_view key, uint32_t v) { return scalar(key, GgufType::Uint32, v); }
  GgufBuilder& i32(std::string_view key, int32_t v) { return scalar(key, GgufType::Int32, v); }
  GgufBuilder& u64(std::string_view key, uint64_t v) { return scalar(key, GgufType::Uint64, v); }
  GgufBuilder& f32(std::string_view key, float v) { return scalar(key, GgufType::Float32, v); }
  GgufBuilder& boolean(std::string_view key, bool v) {
    return scalar(key, GgufType::Bool, static_cast<uint8_t>(v));
  }
  GgufBuilder& str(std::string_view key, std::string_view v) {
    begin_kv(key, GgufType::String);
    string(kv_, v);
    return *this;
  }
  GgufBuilder& strings(std::string_view key, const std::vector<std::string>& v) {
    begin_kv(key, GgufType::Array);
    pod(kv_, static_cast<uint32_t>(GgufType::String));
    pod(kv_, static_cast<uint64_t>(v.size()));
    for (const std::string& s : v) string(kv_, s);
    return *this;
  }
  // A tensor of ggml type `type` with dims (ggml order) and its bytes (padded to 32).
  GgufBuilder& tensor(std::string_view name, std::vector<uint64_t> dims, uint32_t type,
                      const std::vector<uint8_t>& data) {
    string(tensors_, name);
    pod(tensors_, static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) pod(tensors_, d);
    pod(tensors_, type);
    pod(tensors_, static_cast<uint64_t>(data_.size()));
    data_.insert(data_.end(), data.begin(), data.end());
    while (data_.size() % 32 != 0) data_.push_back(0);
    ++num_tensors_;
    return *this;
  }

  std::vector<uint8_t> bytes() const {
    std::vector<uint8_t> out;
    pod(out, uint32_t{0x46554747});
    pod(out, uint32_t{3});
    pod(out, num_tensors_);
    pod(out, num_kv_);
    out.insert(out.end(), kv_.begin(), kv_.end());
    out.insert(out.end(), tensors_.begin(), tensors_.end());
    while (out.size() % 32 != 0) out.push_back(0);
    out.insert(out.end(), data_.begin(), data_.end());
    return out;
  }
  Result<GgufFile> open(std::string name) const {
    return GgufFile::open(MappedFile::from_bytes(std::move(name), bytes()));
  }

 private:
  template <typename T>
  static void pod(std::vector<uint8_t>& out, T v) {
    const size_t at = out.size();
    out.resize(at + sizeof(T));
    std::memcpy(out.data() + at, &v, sizeof(T));
  }
  static void string(std::vector<uint8_t>& out, std::string_view s) {
    pod(out, static_cast<uint64_t>(s.size()));
    out.insert(out.end(), s.begin(), s.end());
  }
  void begin_kv(std::string_view key, GgufType type) {
    string(kv_, key);
    pod(kv_, static_cast<uint32_t>(type));
    ++num_kv_;
  }
  template <typename T>
  GgufBuilder& scalar(std::string_view key, GgufType type, T v) {
    begin_kv(key, type);
    pod(kv_, v);
    return *this;
  }

  std::vector<uint8_t> kv_;       // key/value records
  std::vector<uint8_t> tensors_;  // tensor infos
  std::vector<uint8_t> data_;     // the data section
  uint64_t num_kv_ = 0;
  uint64_t num_tensors_ = 0;
};

}  // namespace kvp::test

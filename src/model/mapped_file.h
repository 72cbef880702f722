// MappedFile: a read-only memory mapping of a whole file (RAII). Weight readers (GGUF,
// safetensors) parse headers from it and hand out spans that point into it, so a file of any
// size is opened without copying. The mapping lives exactly as long as the MappedFile; moving a
// MappedFile moves the mapping without changing its address.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"

namespace kvp {

class MappedFile {
 public:
  // Maps `path` read-only. NotFound if it does not exist, IoError if it cannot be read or mapped.
  // An empty file maps to an empty span (no mapping is made).
  static Result<MappedFile> open(const std::string& path);

  // Bytes held in memory under the name `path` (for tests and for files already read): behaves
  // like a mapping of a file with these contents.
  static MappedFile from_bytes(std::string path, std::vector<uint8_t> bytes);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  // [size_bytes] the whole file; valid while this object lives.
  std::span<const uint8_t> bytes() const { return {data_, size_bytes_}; }
  size_t size_bytes() const { return size_bytes_; }
  const std::string& path() const { return path_; }

 private:
  void reset();

  std::string path_;
  const uint8_t* data_ = nullptr;  // [size_bytes_] start of the mapping, or null when empty
  size_t size_bytes_ = 0;
  bool mapped_ = false;         // data_ is an mmap (else it points into owned_)
  std::vector<uint8_t> owned_;  // [size_bytes_] the bytes of from_bytes()
};

}  // namespace kvp

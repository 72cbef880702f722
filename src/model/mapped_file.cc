// MappedFile: mmap(2) of a whole file, read-only and private.
#include "model/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace kvp {

Result<MappedFile> MappedFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) return Status::not_found("file '{}' does not exist", path);
    return Status::io_error("file '{}': cannot open: {}", path, std::strerror(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return Status::io_error("file '{}': cannot stat: {}", path, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::io_error("file '{}' is not a regular file", path);
  }
  MappedFile file;
  file.path_ = path;
  file.size_bytes_ = static_cast<size_t>(st.st_size);
  if (file.size_bytes_ > 0) {
    void* p = ::mmap(nullptr, file.size_bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      return Status::io_error("file '{}': cannot map {} bytes: {}", path, file.size_bytes_,
                              std::strerror(err));
    }
    file.data_ = static_cast<const uint8_t*>(p);
    file.mapped_ = true;
  }
  ::close(fd);  // the mapping keeps the file referenced
  return file;
}

MappedFile MappedFile::from_bytes(std::string path, std::vector<uint8_t> bytes) {
  MappedFile file;
  file.path_ = std::move(path);
  file.owned_ = std::move(bytes);
  file.data_ = file.owned_.empty() ? nullptr : file.owned_.data();
  file.size_bytes_ = file.owned_.size();
  return file;
}

// Moving a vector keeps its buffer, so data_ stays valid for owned bytes too.
MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_bytes_(std::exchange(other.size_bytes_, 0)),
      mapped_(std::exchange(other.mapped_, false)),
      owned_(std::move(other.owned_)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    reset();
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_bytes_ = std::exchange(other.size_bytes_, 0);
    mapped_ = std::exchange(other.mapped_, false);
    owned_ = std::move(other.owned_);
  }
  return *this;
}

MappedFile::~MappedFile() { reset(); }

void MappedFile::reset() {
  if (mapped_) ::munmap(const_cast<uint8_t*>(data_), size_bytes_);
  mapped_ = false;
  owned_.clear();
  data_ = nullptr;
  size_bytes_ = 0;
}

}  // namespace kvp

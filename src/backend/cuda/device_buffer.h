// Owning handles for device and pinned host memory: one plain cudaMalloc / cudaMallocHost per
// buffer (never managed memory), freed in the destructor. Move-only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>

#include "backend/cuda/cuda_status.h"

namespace kvp::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // Allocates `size_bytes` of device memory (contents undefined).
  static Result<DeviceBuffer> allocate(size_t size_bytes) {
    DeviceBuffer buffer;
    if (size_bytes == 0) return buffer;
    void* ptr = nullptr;
    const cudaError_t err = cudaMalloc(&ptr, size_bytes);
    if (err != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free allocation error
      return Status::resource_exhausted("cuda: cudaMalloc of {} bytes failed: {}", size_bytes,
                                        cudaGetErrorString(err));
    }
    buffer.data_ = ptr;
    buffer.size_bytes_ = size_bytes;
    return buffer;
  }
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        size_bytes_(std::exchange(other.size_bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      reset();
      data_ = std::exchange(other.data_, nullptr);
      size_bytes_ = std::exchange(other.size_bytes_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { reset(); }

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t size_bytes() const { return size_bytes_; }

 private:
  void reset() {
    if (data_ != nullptr) cudaFree(data_);
    data_ = nullptr;
    size_bytes_ = 0;
  }
  void* data_ = nullptr;
  size_t size_bytes_ = 0;
};

// Page-locked host memory, so copies to and from the device run asynchronously on a stream.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  static Result<PinnedBuffer> allocate(size_t size_bytes) {
    PinnedBuffer buffer;
    if (size_bytes == 0) return buffer;
    void* ptr = nullptr;
    const cudaError_t err = cudaMallocHost(&ptr, size_bytes);
    if (err != cudaSuccess) {
      cudaGetLastError();
      return Status::resource_exhausted("cuda: cudaMallocHost of {} bytes failed: {}", size_bytes,
                                        cudaGetErrorString(err));
    }
    buffer.data_ = ptr;
    buffer.size_bytes_ = size_bytes;
    return buffer;
  }
  PinnedBuffer(PinnedBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        size_bytes_(std::exchange(other.size_bytes_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept {
    if (this != &other) {
      reset();
      data_ = std::exchange(other.data_, nullptr);
      size_bytes_ = std::exchange(other.size_bytes_, 0);
    }
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() { reset(); }

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t size_bytes() const { return size_bytes_; }

 private:
  void reset() {
    if (data_ != nullptr) cudaFreeHost(data_);
    data_ = nullptr;
    size_bytes_ = 0;
  }
  void* data_ = nullptr;
  size_t size_bytes_ = 0;
};

}  // namespace kvp::cuda

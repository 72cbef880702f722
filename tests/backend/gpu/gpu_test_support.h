// Shared by the GPU tests: a fixture that skips without a CUDA device, and device/host copies
// that fail the test on a CUDA error.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <vector>

#include "backend/cuda/device_buffer.h"

namespace kvp::cuda::testing {

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      cudaGetLastError();
      GTEST_SKIP() << "no CUDA device";
    }
  }
};

#define KVP_ASSERT_CUDA(call) ASSERT_EQ((call), cudaSuccess) << #call

// Device copy of a host vector (allocation failures abort the test through value()).
template <typename T>
DeviceBuffer to_device(const std::vector<T>& host) {
  DeviceBuffer buffer = DeviceBuffer::allocate(host.size() * sizeof(T) + 16).value();
  EXPECT_EQ(cudaMemcpy(buffer.data(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
            cudaSuccess);
  return buffer;
}

template <typename T>
std::vector<T> to_host(const void* device, size_t count) {
  std::vector<T> host(count);
  EXPECT_EQ(cudaMemcpy(host.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost),
            cudaSuccess);
  return host;
}

}  // namespace kvp::cuda::testing

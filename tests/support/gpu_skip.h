// For GPU tests (tests/*/gpu/): whether a CUDA device is present, and the skip macro of tests that
// need one. Header-only: only GPU test binaries (CUDA builds) include it.
#pragma once

#include <cuda_runtime_api.h>

namespace kvp::testing {

inline bool have_gpu() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return false;
  }
  return true;
}

}  // namespace kvp::testing

#define SKIP_WITHOUT_GPU() \
  if (!::kvp::testing::have_gpu()) GTEST_SKIP() << "no CUDA device"

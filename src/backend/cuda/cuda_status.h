// CUDA errors as Status values (STYLE.md "Errors" 4): every runtime call is checked and every
// kernel launch is followed by a launch-error check. Host code only.
#pragma once

#include <cuda_runtime_api.h>

#include "common/status.h"

namespace kvp::cuda {

// Status of a CUDA runtime result; `what` names the call.
inline Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::ok();
  return Status::internal("cuda: {} failed: {} ({})", what, cudaGetErrorString(err),
                          cudaGetErrorName(err));
}

// After a <<<...>>> launch: reports a bad configuration or an earlier asynchronous fault.
inline Status check_launch(const char* kernel_name) {
  return cuda_status(cudaGetLastError(), kernel_name);
}

}  // namespace kvp::cuda

// Returns a Status from the enclosing function when a CUDA call fails.
#define KVP_CUDA_RETURN_IF_ERROR(call) KVP_RETURN_IF_ERROR(::kvp::cuda::cuda_status((call), #call))

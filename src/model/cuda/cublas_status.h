// A cuBLAS return code as a Status: the one conversion the CUDA model runner's files share.
#pragma once

#include <cublas_v2.h>

#include "common/status.h"

namespace kvp::cuda {

inline Status cublas_status(cublasStatus_t st, const char* what) {
  if (st == CUBLAS_STATUS_SUCCESS) return Status::ok();
  return Status::internal("cublas: {} failed: {} ({})", what, cublasGetStatusString(st),
                          static_cast<int>(st));
}

}  // namespace kvp::cuda

// NcclLibrary: NCCL, loaded at run time (dlopen of libnccl.so.2) only when a model is split over
// GPUs (--tensor-parallel > 1), so kvpool on one GPU neither needs nor loads it. The GPU machines
// carry NCCL in the nvidia-nccl Python wheel, not in their CUDA toolkit; scripts/gpu/cuda-env.sh
// puts it on LD_LIBRARY_PATH (KVP_NCCL_LIBRARY names a file instead).
//
//   NcclLibrary::get()            → the loaded library, or unsupported naming what is missing
//   init_all(devices)             → one communicator per device, one process (ncclCommInitAll)
//   all_reduce_sum(data, n, comm, stream)   in place, f32, enqueued on stream (graph-capturable)
//
// NVLink multicast (NVLS) is turned off before the first communicator (NCCL_NVLS_ENABLE=0 unless
// the environment says otherwise): the GPU machines require it.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"

namespace kvp::cuda {

class NcclLibrary {
 public:
  // Loads the library once (thread-safe); later calls return the same one or the same error.
  static Result<const NcclLibrary*> get();

  // NCCL_VERSION_CODE style: 22105 for 2.21.5
  int version() const { return version_; }
  Result<std::vector<ncclComm_t>> init_all(std::span<const int> devices) const;
  void destroy(ncclComm_t comm) const;
  Status all_reduce_sum(float* data, int64_t count, ncclComm_t comm, cudaStream_t stream) const;

 private:
  NcclLibrary() = default;
  Status status(ncclResult_t result, const char* what) const;

  int version_ = 0;
  ncclResult_t (*get_version_)(int*) = nullptr;
  ncclResult_t (*comm_init_all_)(ncclComm_t*, int, const int*) = nullptr;
  ncclResult_t (*comm_destroy_)(ncclComm_t) = nullptr;
  ncclResult_t (*all_reduce_)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                              cudaStream_t) = nullptr;
  const char* (*error_string_)(ncclResult_t) = nullptr;
};

}  // namespace kvp::cuda

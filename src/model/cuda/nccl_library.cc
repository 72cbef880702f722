// NcclLibrary (nccl_library.h): dlopen, the few entry points kvpool calls, errors as Status.
#include "model/cuda/nccl_library.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <type_traits>

namespace kvp::cuda {

Result<const NcclLibrary*> NcclLibrary::get() {
  static std::once_flag once;
  static NcclLibrary* library = nullptr;
  static Status error = Status::ok();
  std::call_once(once, [] {
    const char* named = std::getenv("KVP_NCCL_LIBRARY");
    const std::string file = named != nullptr && *named != '\0' ? named : "libnccl.so.2";
    void* handle = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      error = Status::unsupported(
          "tensor parallelism needs NCCL: cannot load {} ({}); put the directory holding it on "
          "LD_LIBRARY_PATH (the nvidia-nccl Python wheel's nvidia/nccl/lib) or name the file in "
          "KVP_NCCL_LIBRARY",
          file, why != nullptr ? why : "no reason given");
      return;
    }
    auto* lib = new NcclLibrary();
    const auto bind = [&](auto* fn, const char* symbol) {
      *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(dlsym(handle, symbol));
      if (*fn == nullptr && error.is_ok()) {
        error = Status::unsupported("NCCL ({}) has no symbol {}", file, symbol);
      }
    };
    bind(&lib->get_version_, "ncclGetVersion");
    bind(&lib->comm_init_all_, "ncclCommInitAll");
    bind(&lib->comm_destroy_, "ncclCommDestroy");
    bind(&lib->all_reduce_, "ncclAllReduce");
    bind(&lib->error_string_, "ncclGetErrorString");
    if (!error.is_ok()) {
      delete lib;
      return;
    }
    lib->get_version_(&lib->version_);
    setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
    library = lib;  // kept for the life of the process, as the library stays loaded
  });
  if (library == nullptr) return error;
  return static_cast<const NcclLibrary*>(library);
}

Status NcclLibrary::status(ncclResult_t result, const char* what) const {
  if (result == ncclSuccess) return Status::ok();
  return Status::internal("nccl: {} failed: {} ({})", what, error_string_(result),
                          static_cast<int>(result));
}

Result<std::vector<ncclComm_t>> NcclLibrary::init_all(std::span<const int> devices) const {
  std::vector<ncclComm_t> comms(devices.size(), nullptr);
  KVP_RETURN_IF_ERROR(
      status(comm_init_all_(comms.data(), static_cast<int>(devices.size()), devices.data()),
             "ncclCommInitAll"));
  return comms;
}

void NcclLibrary::destroy(ncclComm_t comm) const {
  if (comm != nullptr) comm_destroy_(comm);
}

Status NcclLibrary::all_reduce_sum(float* data, int64_t count, ncclComm_t comm,
                                   cudaStream_t stream) const {
  return status(
      all_reduce_(data, data, static_cast<size_t>(count), ncclFloat32, ncclSum, comm, stream),
      "ncclAllReduce");
}

}  // namespace kvp::cuda

// CudaForwardBackend's session tier transfers (cuda_forward_backend.h): pinned host slabs, one
// 2-D DMA per run of consecutive blocks on the copy stream of its direction, an event per ticket.
#include <cuda_runtime_api.h>

#include <algorithm>

#include "backend/cuda/cuda_status.h"
#include "model/cuda/cuda_forward_backend.h"

namespace kvp::cuda {

namespace {

void* pinned_allocate(size_t bytes, void* /*context*/) {
  void* ptr = nullptr;
  // portable: pinned for every device's context (a split model's ranks share a host tier)
  if (cudaHostAlloc(&ptr, bytes, cudaHostAllocPortable) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return ptr;
}

void pinned_release(void* ptr, void* /*context*/) { cudaFreeHost(ptr); }

constexpr HostKvStorage::SlabAllocator kPinnedSlabs{pinned_allocate, pinned_release, nullptr};

}  // namespace

const HostKvStorage::SlabAllocator* CudaForwardBackend::host_slab_allocator() const {
  return &kPinnedSlabs;
}

Status CudaForwardBackend::ensure_copy_streams() {
  if (copy_streams_[0] != nullptr) return Status::ok();
  KVP_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&compute_mark_, cudaEventDisableTiming));
  for (cudaStream_t& stream : copy_streams_) {
    KVP_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  }
  return Status::ok();
}

void CudaForwardBackend::destroy_transfers() {
  if (compute_mark_ == nullptr) return;
  cudaSetDevice(runner_->device());
  for (cudaStream_t stream : copy_streams_) {
    if (stream != nullptr) cudaStreamSynchronize(stream);
  }
  for (const InFlight& f : in_flight_) cudaEventDestroy(f.done);
  for (cudaEvent_t e : spare_events_) cudaEventDestroy(e);
  in_flight_.clear();
  spare_events_.clear();
  cudaEventDestroy(compute_mark_);
  compute_mark_ = nullptr;
  for (cudaStream_t& stream : copy_streams_) {
    if (stream != nullptr) cudaStreamDestroy(stream);
    stream = nullptr;
  }
}

Result<uint64_t> CudaForwardBackend::start_transfers(int32_t group,
                                                     std::span<const BlockTransfer> ops,
                                                     HostKvStorage& host) {
  KVP_RETURN_IF_ERROR(check_group(group, "start_transfers"));
  const KvLayout& device = pools_[group].layout();
  if (device.head_dim != layouts_[group].head_dim) {
    return ForwardBackend::start_transfers(group, ops, host);  // padded pool: through images
  }
  bool to_host = true;
  KVP_RETURN_IF_ERROR(check_transfers(group, ops, host, &to_host));
  KVP_CUDA_RETURN_IF_ERROR(cudaSetDevice(runner_->device()));
  KVP_RETURN_IF_ERROR(ensure_copy_streams());
  cudaStream_t copy_stream = copy_streams_[to_host ? 1 : 0];
  // after the compute stream's queued work: a forward pass may still write a source block, or
  // read a destination block that was freed and handed out again
  KVP_CUDA_RETURN_IF_ERROR(cudaEventRecord(compute_mark_, runner_->stream()));
  KVP_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_stream, compute_mark_, 0));
  const KvLayout& slab = host.layout(group);
  const size_t elem = dtype_size_bytes(device.dtype);
  const size_t run_bytes = static_cast<size_t>(device.block_pitch()) * elem;  // K + V, one layer
  const size_t device_pitch = static_cast<size_t>(device.layer_stride()) * elem;
  const size_t host_pitch = static_cast<size_t>(slab.layer_stride()) * elem;
  auto* device_base = static_cast<std::byte*>(pools_[group].slab());
  std::byte* host_base = host.slab(group).data();
  for (size_t i = 0; i < ops.size();) {
    size_t n = 1;  // the run: ops i .. i + n - 1 consecutive on both sides
    while (i + n < ops.size() && ops[i + n].src.value == ops[i].src.value + int32_t(n) &&
           ops[i + n].dst.value == ops[i].dst.value + int32_t(n)) {
      ++n;
    }
    const int32_t pool_block = (to_host ? ops[i].src : ops[i].dst).value;
    const int32_t host_block = (to_host ? ops[i].dst : ops[i].src).value;
    std::byte* on_device = device_base + pool_block * run_bytes;
    std::byte* on_host = host_base + host_block * run_bytes;
    const cudaError_t err =
        to_host ? cudaMemcpy2DAsync(on_host, host_pitch, on_device, device_pitch, n * run_bytes,
                                    device.num_layers, cudaMemcpyDeviceToHost, copy_stream)
                : cudaMemcpy2DAsync(on_device, device_pitch, on_host, host_pitch, n * run_bytes,
                                    device.num_layers, cudaMemcpyHostToDevice, copy_stream);
    KVP_CUDA_RETURN_IF_ERROR(err);
    i += n;
  }
  InFlight flight;
  flight.ticket = ++last_ticket_;
  flight.to_host = to_host;
  if (spare_events_.empty()) {
    KVP_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&flight.done, cudaEventDisableTiming));
  } else {
    flight.done = spare_events_.back();
    spare_events_.pop_back();
  }
  const cudaError_t recorded = cudaEventRecord(flight.done, copy_stream);
  if (recorded != cudaSuccess) {
    spare_events_.push_back(flight.done);
    KVP_CUDA_RETURN_IF_ERROR(recorded);
  }
  in_flight_.push_back(flight);
  return flight.ticket;
}

std::deque<CudaForwardBackend::InFlight>::iterator CudaForwardBackend::in_flight(uint64_t ticket) {
  return std::find_if(in_flight_.begin(), in_flight_.end(),
                      [&](const InFlight& f) { return f.ticket == ticket; });
}

void CudaForwardBackend::retire_through(std::deque<InFlight>::iterator it) {
  const bool to_host = it->to_host;
  const uint64_t ticket = it->ticket;
  std::erase_if(in_flight_, [&](const InFlight& f) {
    if (f.to_host != to_host || f.ticket > ticket) return false;
    spare_events_.push_back(f.done);
    return true;
  });
}

Result<bool> CudaForwardBackend::transfers_done(uint64_t ticket) {
  auto it = in_flight(ticket);
  if (it == in_flight_.end()) return true;
  const cudaError_t err = cudaEventQuery(it->done);
  if (err == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  KVP_CUDA_RETURN_IF_ERROR(err);
  retire_through(it);
  return true;
}

Status CudaForwardBackend::wait_transfers(uint64_t ticket) {
  auto it = in_flight(ticket);
  if (it == in_flight_.end()) return Status::ok();
  KVP_CUDA_RETURN_IF_ERROR(cudaSetDevice(runner_->device()));
  KVP_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(it->done));
  retire_through(it);
  return Status::ok();
}

Status CudaForwardBackend::order_after_transfers(uint64_t ticket) {
  auto it = in_flight(ticket);
  if (it == in_flight_.end()) return Status::ok();
  KVP_CUDA_RETURN_IF_ERROR(cudaSetDevice(runner_->device()));
  // the wait is on the event's record as of now: recording it again for a later ticket (it goes
  // back to spare_events_ once retired) does not change what the stream waits for
  KVP_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(runner_->stream(), it->done, 0));
  return Status::ok();
}

}  // namespace kvp::cuda

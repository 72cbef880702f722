// CudaForwardBackend's session tier transfers (cuda_forward_backend.h): pinned host slabs, one
// 2-D DMA per run of consecutive blocks and layer chunk on the copy stream of its direction, an
// event per chunk; and the CudaModelRunner's layer waits on those events
// (wait_layers_before, flush_layer_waits: a step ordered after a copy, layer by layer).
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
  for (const InFlight& f : in_flight_) give_back_events(f);
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
  if (!to_host) {
    // a pool block given back while a copy out of it still reads it may be a destination here
    // (the compute stream's layer waits for such copies are not all on the stream yet)
    auto released = std::find_if(in_flight_.rbegin(), in_flight_.rend(),
                                 [](const InFlight& f) { return f.to_host && f.released; });
    if (released != in_flight_.rend()) {
      KVP_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_stream, released->done, 0));
    }
  }
  const KvLayout& slab = host.layout(group);
  const size_t elem = dtype_size_bytes(device.dtype);
  const size_t run_bytes = static_cast<size_t>(device.block_pitch()) * elem;  // K + V, one layer
  const size_t device_pitch = static_cast<size_t>(device.layer_stride()) * elem;
  const size_t host_pitch = static_cast<size_t>(slab.layer_stride()) * elem;
  auto* device_base = static_cast<std::byte*>(pools_[group].slab());
  std::byte* host_base = host.slab(group).data();
  struct Run {
    std::byte* on_device;
    std::byte* on_host;
    size_t bytes;
  };
  std::vector<Run> runs;  // ops i .. i + n - 1 consecutive on both sides
  for (size_t i = 0; i < ops.size();) {
    size_t n = 1;
    while (i + n < ops.size() && ops[i + n].src.value == ops[i].src.value + int32_t(n) &&
           ops[i + n].dst.value == ops[i].dst.value + int32_t(n)) {
      ++n;
    }
    const int32_t pool_block = (to_host ? ops[i].src : ops[i].dst).value;
    const int32_t host_block = (to_host ? ops[i].dst : ops[i].src).value;
    runs.push_back(
        {device_base + pool_block * run_bytes, host_base + host_block * run_bytes, n * run_bytes});
    i += n;
  }
  // Layer chunks, an event after each, so a step ordered after the ticket waits at each layer
  // only for that layer's blocks (into the pool: to land; out of it: to be read out before the
  // step writes blocks given back early); chunks of several layers where the runs are many (at
  // most ~kMaxCopies calls a ticket).
  constexpr size_t kMaxCopies = 2048;
  const int32_t num_layers = device.num_layers;
  const auto chunk = static_cast<int32_t>(std::clamp<size_t>(
      (runs.size() * size_t(num_layers) + kMaxCopies - 1) / kMaxCopies, 1, size_t(num_layers)));
  InFlight flight;
  flight.ticket = ++last_ticket_;
  flight.to_host = to_host;
  flight.group = group;
  const auto give_back_on_error = [&](cudaError_t err) {
    give_back_events(flight);
    return cuda_status(err, "cuda start_transfers");
  };
  for (int32_t first = 0; first < num_layers; first += chunk) {
    const int32_t layers = std::min(chunk, num_layers - first);
    const size_t at = size_t(first) * device_pitch, at_host = size_t(first) * host_pitch;
    for (const Run& run : runs) {
      const cudaError_t err = to_host
                                  ? cudaMemcpy2DAsync(run.on_host + at_host, host_pitch,
                                                      run.on_device + at, device_pitch, run.bytes,
                                                      layers, cudaMemcpyDeviceToHost, copy_stream)
                                  : cudaMemcpy2DAsync(run.on_device + at, device_pitch,
                                                      run.on_host + at_host, host_pitch, run.bytes,
                                                      layers, cudaMemcpyHostToDevice, copy_stream);
      if (err != cudaSuccess) return give_back_on_error(err);
    }
    Result<cudaEvent_t> event = take_event();
    if (!event.is_ok()) {
      give_back_events(flight);
      return event.status();
    }
    const cudaError_t recorded = cudaEventRecord(*event, copy_stream);
    if (recorded != cudaSuccess) {
      spare_events_.push_back(*event);
      return give_back_on_error(recorded);
    }
    flight.done = *event;
    flight.layer_done.insert(flight.layer_done.end(), layers, *event);
  }
  in_flight_.push_back(flight);
  return flight.ticket;
}

std::deque<CudaForwardBackend::InFlight>::iterator CudaForwardBackend::in_flight(uint64_t ticket) {
  return std::find_if(in_flight_.begin(), in_flight_.end(),
                      [&](const InFlight& f) { return f.ticket == ticket; });
}

Result<cudaEvent_t> CudaForwardBackend::take_event() {
  if (!spare_events_.empty()) {
    const cudaEvent_t event = spare_events_.back();
    spare_events_.pop_back();
    return event;
  }
  cudaEvent_t event = nullptr;
  KVP_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  return event;
}

void CudaForwardBackend::give_back_events(const InFlight& f) {
  // layers of a chunk share its event: each once (`done` is the last chunk's)
  for (size_t i = 0; i < f.layer_done.size(); ++i) {
    if (i == 0 || f.layer_done[i] != f.layer_done[i - 1]) spare_events_.push_back(f.layer_done[i]);
  }
}

void CudaForwardBackend::retire_through(std::deque<InFlight>::iterator it) {
  const bool to_host = it->to_host;
  const uint64_t ticket = it->ticket;
  // these copies are done: a step's pending layer waits on their events hold nothing up, and
  // must not name them once they are recorded for other copies
  std::vector<cudaEvent_t> done;
  for (const InFlight& f : in_flight_) {
    if (f.to_host == to_host && f.ticket <= ticket) {
      done.insert(done.end(), f.layer_done.begin(), f.layer_done.end());
    }
  }
  runner_->forget_layer_waits(done);
  std::erase_if(in_flight_, [&](const InFlight& f) {
    if (f.to_host != to_host || f.ticket > ticket) return false;
    give_back_events(f);
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
  // Each layer of the next step waits for that layer's blocks in every copy of the direction up
  // to the ticket: a sequence's copy is one ticket per cache group, and a layer of one group
  // waits only on its own group's events. (Earlier copies of the stream end before this one's,
  // so waiting on them too costs nothing.) Into the pool: the step reads what lands. Out of it:
  // the blocks were given back before the copy completes, the step writes them once read out,
  // and copies into the pool wait for the whole copy (start_transfers).
  const bool to_host = it->to_host;
  for (InFlight& f : in_flight_) {
    if (f.to_host != to_host || f.ticket > ticket) continue;
    runner_->wait_layers_before(f.group, f.layer_done);
    f.released = f.released || to_host;
  }
  return Status::ok();
}

void CudaModelRunner::wait_layers_before(int32_t group, std::span<const cudaEvent_t> per_slot) {
  layer_waits_.resize(layer_group_.size());
  for (size_t l = 0; l < layer_group_.size(); ++l) {
    if (layer_group_[l] == group) layer_waits_[l].push_back(per_slot[size_t(layer_slot_[l])]);
  }
  layer_waits_pending_ = true;
}

void CudaModelRunner::forget_layer_waits(std::span<const cudaEvent_t> done) {
  if (!layer_waits_pending_ || done.empty()) return;
  bool any = false;
  for (std::vector<cudaEvent_t>& waits : layer_waits_) {
    std::erase_if(
        waits, [&](cudaEvent_t e) { return std::find(done.begin(), done.end(), e) != done.end(); });
    any = any || !waits.empty();
  }
  layer_waits_pending_ = any;
}

Status CudaModelRunner::flush_layer_waits() {
  if (!layer_waits_pending_) return Status::ok();
  layer_waits_pending_ = false;
  Status st = Status::ok();
  for (std::vector<cudaEvent_t>& waits : layer_waits_) {
    for (cudaEvent_t copied : waits) {
      const cudaError_t err = cudaStreamWaitEvent(stream_, copied, 0);
      if (err != cudaSuccess && st.is_ok()) st = cuda_status(err, "cudaStreamWaitEvent");
    }
    waits.clear();
  }
  return st;
}

}  // namespace kvp::cuda

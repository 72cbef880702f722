// CudaForwardBackend: model/forward_backend.h on one CUDA device — a CudaModelRunner plus one
// cuda::DeviceKvPool per cache group. KVP_CUDA builds only (compile definition
// KVP_HAVE_CUDA_MODEL).
//
// Layouts: group_layout, kv_layout and the host block images of read_blocks/write_blocks are the
// model's LOGICAL layout (real head_dim), so cache files and session tiers do not depend on the
// device. When the runner pads head_dim (tiny models: head_dim < 64), the device pool holds
//   [layers][blocks][2][kv_heads][block_size][padded_head_dim]
// and read_blocks/write_blocks convert on the host (pad lanes written as zero).
//
// Tier transfers (cuda_tier_transfers.cc): host tier slabs are pinned (host_slab_allocator);
// start_transfers queues one cudaMemcpy2DAsync per run of consecutive blocks and chunk of layers
// (each slab's layer stride apart) on a copy stream of its direction (copies into the pool do not
// queue behind write-backs out of it: the device has a copy engine each way), after an event of
// the compute stream (so a block written by a queued forward pass is copied after it), and
// records an event after each chunk that transfers_done polls and order_after_transfers hands to
// the runner: its next eager step waits at each layer for that layer's blocks only
// (orders_by_layer). Into the pool: the step computes while the copy lands. Out of it: the
// engine gives the blocks back at once, the step that writes them computes while they are read
// out, and a later copy into the pool waits for the whole copy. A padded pool falls back to the
// base implementation (through block images).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/cuda/device_buffer.h"
#include "backend/cuda/kv_pool.h"
#include "model/cuda/cuda_model_runner.h"
#include "model/forward_backend.h"

namespace kvp::cuda {

class CudaForwardBackend final : public ForwardBackend {
 public:
  explicit CudaForwardBackend(std::unique_ptr<CudaModelRunner> runner);
  ~CudaForwardBackend() override;

  const ModelSpec& spec() const override { return runner_->spec(); }
  std::string device_name() const override;
  int32_t num_cache_groups() const override { return runner_->num_cache_groups(); }
  int32_t num_group_layers(int32_t group) const override;
  bool group_is_sliding(int32_t group) const override { return runner_->group_is_sliding(group); }
  KvLayout group_layout(int32_t group, int32_t num_blocks, int32_t block_size,
                        DType dtype) const override;
  Status check_kv_dtype(DType dtype) const override;
  Status allocate_kv(std::span<const KvLayout> layouts) override;
  const KvLayout& kv_layout(int32_t group) const override { return layouts_[group]; }
  Status forward(const ForwardBatch& batch, std::span<float> logits) override;
  bool summarizes_logits() const override { return true; }
  Status forward_summarized(const ForwardBatch& batch, std::span<const int32_t> full_rows,
                            std::span<float> logits, std::span<LogitRowSummary> summaries) override;
  // Out of the pinned staging straight into the strided rows (one host copy).
  Status forward_into_rows(const ForwardBatch& batch, std::span<const int32_t> full_rows,
                           std::span<float> logits, size_t row_stride,
                           std::span<LogitRowSummary> summaries) override;
  bool samples_on_device() const override { return true; }
  Status forward_sampled(const ForwardBatch& batch, std::span<const int32_t> full_rows,
                         std::span<float> logits, std::span<LogitRowSummary> summaries,
                         const DeviceSampleBatch& samples,
                         std::span<DeviceSample> results) override;
  Status copy_blocks(int32_t group, std::span<const BlockCopy> ops) override;
  Status read_blocks(int32_t group, std::span<const BlockId> blocks,
                     std::span<std::byte> image) const override;
  Status write_blocks(int32_t group, std::span<const BlockId> blocks,
                      std::span<const std::byte> image) override;
  const HostKvStorage::SlabAllocator* host_slab_allocator() const override;
  Result<uint64_t> start_transfers(int32_t group, std::span<const BlockTransfer> ops,
                                   HostKvStorage& host) override;
  Result<bool> transfers_done(uint64_t ticket) override;
  Status wait_transfers(uint64_t ticket) override;
  Status order_after_transfers(uint64_t ticket) override;
  bool orders_by_layer() const override { return true; }

  // For benchmarks and tests: the runner, and every pool filled with uniform values in [-1, 1).
  const CudaModelRunner& runner() const { return *runner_; }
  CudaModelRunner& runner() { return *runner_; }
  Status fill_kv_random(uint64_t seed);

 private:
  Status check_group(int32_t group, const char* what) const;
  Status reserve_staging(size_t bytes) const;

  std::unique_ptr<CudaModelRunner> runner_;
  std::vector<KvLayout> layouts_;    // logical, one per group (empty before allocate_kv)
  std::vector<DeviceKvPool> pools_;  // device, head_dim = runner_->padded_head_dim()
  mutable PinnedBuffer staging_;     // block images in the device layout

  // tier transfers
  struct InFlight {
    uint64_t ticket = 0;
    bool to_host = false;        // which copy stream
    cudaEvent_t done = nullptr;  // recorded on that stream after the ticket's copies
    // group, and [layer within the group] -> the event recorded after that layer's copies (the
    // chunk's; the last is `done`)
    int32_t group = 0;
    std::vector<cudaEvent_t> layer_done;
    // out of the pool, ordered after (order_after_transfers): its source blocks were given back
    // before it completed, so copies into the pool started later wait for it
    bool released = false;
  };
  Result<cudaEvent_t> take_event();
  void give_back_events(const InFlight& f);
  Status ensure_copy_streams();
  void destroy_transfers();
  // The in-flight entry of `ticket` (in_flight_.end(): retired, and with it every earlier ticket
  // of its direction). Its event completes after every earlier one of its stream.
  std::deque<InFlight>::iterator in_flight(uint64_t ticket);
  // Retires `it` and the in-flight tickets of its direction before it (their events are done).
  void retire_through(std::deque<InFlight>::iterator it);
  cudaStream_t copy_streams_[2] = {nullptr, nullptr};  // [to_host]: into the pool, out of it
  cudaEvent_t compute_mark_ = nullptr;  // the compute stream's work queued before a transfer
  std::deque<InFlight> in_flight_;      // tickets in order, both directions
  std::vector<cudaEvent_t> spare_events_;
};

// Loads `spec`'s weights from `source` onto `device` (bf16) and wraps them as a ForwardBackend.
// tensor_parallel > 1: split over GPUs device … device + tensor_parallel - 1 (a
// TensorParallelBackend of CudaForwardBackends joined by NCCL: model/tensor_parallel.h).
Result<std::unique_ptr<ForwardBackend>> make_cuda_backend(const ModelSpec& spec,
                                                          const WeightSource& source,
                                                          const LoadProgress& progress = {},
                                                          int device = 0,
                                                          int32_t tensor_parallel = 1);

// The same with random bf16 weights made on the device (benchmarks of shapes nobody downloads);
// split or not, the weights of one seed are the same model's.
Result<std::unique_ptr<ForwardBackend>> make_random_cuda_backend(const ModelSpec& spec,
                                                                 uint64_t seed, int device = 0,
                                                                 int32_t tensor_parallel = 1);

}  // namespace kvp::cuda

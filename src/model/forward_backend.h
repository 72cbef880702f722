// ForwardBackend: where a model's forward pass runs and where its paged KV pool lives.
//
//   CpuForwardBackend   (model/cpu_forward_backend.h): ModelRunner + one HostKvSlab per group
//   CudaForwardBackend  (model/cuda/cuda_forward_backend.h, KVP_CUDA builds only): the CUDA
//                       runner + one cuda::DeviceKvPool per group
//
// The engine owns the bookkeeping (block tables, prefix cache, sessions) and talks to the
// backend only through this interface: one forward pass per step, copy-on-write block copies,
// and whole-block moves between the pool and host memory (session tiers, cache files).
//
// Host block image (read_blocks / write_blocks), per moved block, one group:
//   [num_layers of the group][2 (K, V)][num_kv_heads][block_size][head_dim] of the pool's dtype
// i.e. for each layer the run of layout.block_pitch() elements that starts at
// layout.block_offset(layer, block, 0) (cache/kv_layout.h), layers back to back.
//
// Session tier transfers (start_transfers): whole blocks between the pool and a host slab of
// the same layout (HostKvStorage; the engine's host tier allocates it through
// host_slab_allocator, so a CUDA backend's copy engine reads and writes it directly, one DMA per
// run of consecutive blocks on a copy stream of its own). The base implementation copies at once
// through a block image (read_blocks / write_blocks).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cache/block_ops.h"
#include "cache/host_kv_storage.h"
#include "cache/kv_layout.h"
#include "common/dtype.h"
#include "common/ids.h"
#include "common/status.h"
#include "model/device_sample.h"
#include "model/model_runner.h"
#include "model/model_spec.h"

namespace kvp {

// One logits row reduced where it was computed (ForwardBackend::forward_summarized): all a
// greedy sample and its logprob need, so a greedy step copies 12 bytes a row instead of the
// vocabulary's logits.
struct LogitRowSummary {
  int32_t argmax = 0;      // first index of the largest logit (NaN never wins)
  float max_logit = 0.0f;  // logits[argmax]
  float log_z = 0.0f;      // log(sum_i exp(logits[i])) = max_logit + log(sum exp(l - max_logit))
};

// The tokens to sample on the device in one step (ForwardBackend::forward_sampled); each
// request's penalty and mask ranges index into the lists here. Records: model/device_sample.h.
struct DeviceSampleBatch {
  std::vector<DeviceSampleRequest> requests;
  std::vector<PenaltyToken> penalties;
  std::vector<int32_t> masked;
  void clear() { requests.clear(), penalties.clear(), masked.clear(); }
};

// The model's matrices as a backend holds them (0 where a backend does not say).
struct WeightFootprint {
  uint64_t resident_bytes = 0;     // every matrix once (a tied lm-head once)
  uint64_t decode_read_bytes = 0;  // the matrices one decode step reads (layers + lm-head)
  std::vector<std::pair<std::string, uint64_t>> by_format;  // ("Q4_1", bytes), …
};

// The completion side of ForwardBackend::start_transfers' tickets: all that the engine's tier
// moves (engine/tier_moves.h) ask of a backend once a copy is queued, so they are tested without
// a model.
class TransferTickets {
 public:
  virtual ~TransferTickets() = default;
  // For messages: "cpu", "cuda:0 (NVIDIA H100 80GB HBM3)".
  virtual std::string device_name() const = 0;
  // Whether every transfer up to `ticket` of its direction has completed (never blocks); an
  // error of the copies.
  virtual Result<bool> transfers_done(uint64_t ticket) = 0;
  // Blocks until every transfer up to `ticket` of its direction has completed.
  virtual Status wait_transfers(uint64_t ticket) = 0;
  // Orders every forward pass and block copy queued from now on after the transfers up to
  // `ticket` of its direction, without blocking where the device can (CUDA: the compute stream
  // waits on the ticket's event); their destinations may then be read by the next forward pass.
  // Their sources must still live until transfers_done(ticket).
  virtual Status order_after_transfers(uint64_t ticket) = 0;
  // Whether order_after_transfers holds each layer of the next forward pass back only until its
  // own layer's blocks have landed (CUDA), so a step ordered after a copy overlaps it; false: the
  // whole step runs after the copy.
  virtual bool orders_by_layer() const = 0;
};

class ForwardBackend : public TransferTickets {
 public:
  ~ForwardBackend() override = default;

  virtual const ModelSpec& spec() const = 0;
  // "cpu" or "cuda:0 (NVIDIA H100 80GB HBM3)": for messages and stats lines.
  std::string device_name() const override = 0;
  virtual WeightFootprint weight_footprint() const { return {}; }

  // Cache groups (1, or 2 with sliding-window layers), as ModelRunner defines them.
  virtual int32_t num_cache_groups() const = 0;
  virtual int32_t num_group_layers(int32_t group) const = 0;
  virtual bool group_is_sliding(int32_t group) const = 0;
  virtual KvLayout group_layout(int32_t group, int32_t num_blocks, int32_t block_size,
                                DType dtype) const = 0;
  // ok when the backend can hold KV of this dtype (CPU: f32, bf16, f16; CUDA: bf16, f16),
  // else invalid_argument naming the dtype and the backend.
  virtual Status check_kv_dtype(DType dtype) const = 0;

  // Allocates each group's KV storage (layouts[g] == group_layout(g, ...)), replacing any
  // earlier one. Contents start undefined. resource_exhausted when it does not fit.
  virtual Status allocate_kv(std::span<const KvLayout> layouts) = 0;
  virtual const KvLayout& kv_layout(int32_t group) const = 0;

  // One forward pass (model_runner.h's ForwardBatch; every span is host memory): writes the new
  // tokens' K and V into the pool and fills logits [logit_rows.size()][vocab_size] (host).
  // Bad batches → invalid_argument with nothing written. Returns when logits are filled.
  virtual Status forward(const ForwardBatch& batch, std::span<float> logits) = 0;

  // Whether forward_summarized is available: the backend reduces logits rows where it computed
  // them (CUDA), so rows that only need a greedy choice are never copied to the host.
  virtual bool summarizes_logits() const { return false; }
  // As forward, but fills summaries [logit_rows.size()] for every logit row, and logits
  // [full_rows.size()][vocab_size] only with the rows full_rows lists (indexes into
  // batch.logit_rows, strictly increasing). unsupported unless summarizes_logits().
  virtual Status forward_summarized(const ForwardBatch& batch, std::span<const int32_t> full_rows,
                                    std::span<float> logits, std::span<LogitRowSummary> summaries) {
    (void)batch, (void)full_rows, (void)logits, (void)summaries;
    return Status::unsupported("{}: logits summaries on the device", device_name());
  }

  // forward (summaries empty) or forward_summarized (summaries given) with logits row i written
  // at logits[i * row_stride], row_stride >= spec().logits_per_row(); what lies between rows is
  // left alone: a split model's ranks write their vocabulary shares straight into the joined rows
  // (tensor_parallel.h). This default goes through a scratch buffer; the CUDA backend copies out
  // of its pinned staging into place. Errors as forward's, and a stride or buffer too small.
  virtual Status forward_into_rows(const ForwardBatch& batch, std::span<const int32_t> full_rows,
                                   std::span<float> logits, size_t row_stride,
                                   std::span<LogitRowSummary> summaries);

  // Whether forward_sampled is available: the backend samples tokens where it computed the
  // logits (CUDA), so sampled rows never come to the host. The CPU backend says no: the engine
  // samples its rows with engine/sampler.h.
  virtual bool samples_on_device() const { return false; }
  // As forward_summarized, and draws samples.requests on the device: results[i] for
  // requests[i] (same size). Rows a request reads need not be in full_rows. invalid_argument for
  // a request outside the batch's logit rows, a token id outside the vocabulary, a penalty or
  // mask range outside its list, or more than kMaxDeviceLogprobs logprobs. unsupported unless
  // samples_on_device().
  virtual Status forward_sampled(const ForwardBatch& batch, std::span<const int32_t> full_rows,
                                 std::span<float> logits, std::span<LogitRowSummary> summaries,
                                 const DeviceSampleBatch& samples,
                                 std::span<DeviceSample> results) {
    (void)batch, (void)full_rows, (void)logits, (void)summaries, (void)samples, (void)results;
    return Status::unsupported("{}: sampling on the device", device_name());
  }

  // Copy-on-write copies within one group (every op's group == group). Ops must not overlap.
  virtual Status copy_blocks(int32_t group, std::span<const BlockCopy> ops) = 0;

  // Whole blocks of one group to and from a host image (layout in the header comment);
  // image.size() == blocks.size() * kv_layout(group).block_size_bytes(). Synchronous.
  virtual Status read_blocks(int32_t group, std::span<const BlockId> blocks,
                             std::span<std::byte> image) const = 0;
  virtual Status write_blocks(int32_t group, std::span<const BlockId> blocks,
                              std::span<const std::byte> image) = 0;

  // Where host tier slabs come from: null for plain host memory; a CUDA backend hands out
  // pinned memory its copy engine moves to and from directly.
  virtual const HostKvStorage::SlabAllocator* host_slab_allocator() const { return nullptr; }

  // Copies whole blocks of one group between the pool (Pool::Device) and `host` (Pool::Host),
  // all ops the same way. Returns a ticket (> 0, increasing); the copies may still run when it
  // returns, after everything queued before them (a forward pass writing a source block):
  // until transfers_done(ticket), sources must not be written, nor destinations used, and
  // `host` must live. Transfers of one direction complete in ticket order; the two directions
  // may overlap (a copy into the pool does not wait for an earlier one out of it). invalid_argument
  // (nothing copied) for mixed directions, ids outside either pool, or a host slab of another
  // layout.
  virtual Result<uint64_t> start_transfers(int32_t group, std::span<const BlockTransfer> ops,
                                           HostKvStorage& host);
  // TransferTickets (above): the base implementation completes its copies at once; ordering
  // waits; no layer-by-layer ordering.
  Result<bool> transfers_done(uint64_t ticket) override;
  Status wait_transfers(uint64_t ticket) override;
  Status order_after_transfers(uint64_t ticket) override { return wait_transfers(ticket); }
  bool orders_by_layer() const override { return false; }

 protected:
  // Checks ops for start_transfers; *to_host receives their direction.
  Status check_transfers(int32_t group, std::span<const BlockTransfer> ops,
                         const HostKvStorage& host, bool* to_host) const;
  uint64_t last_ticket_ = 0;  // of start_transfers

 private:
  std::vector<std::byte> transfer_image_;  // the base implementation's block image, reused
};

// ok when num_rows rows of per_row floats, one every row_stride floats, fit num_floats floats
// (row_stride >= per_row); else invalid_argument naming the numbers (forward_into_rows).
Status check_logit_rows(size_t num_rows, size_t per_row, size_t row_stride, size_t num_floats);

}  // namespace kvp

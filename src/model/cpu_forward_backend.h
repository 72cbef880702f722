// CpuForwardBackend: the ForwardBackend (model/forward_backend.h) of host memory. The forward
// pass is ModelRunner::forward; the KV pool is one HostKvSlab per cache group, laid out as
// cache/kv_layout.h says, so a block image (forward_backend.h) of block b is, per layer of the
// group, the run of layout.block_pitch() elements at layout.block_offset(layer, b, 0).
//
//   slab of group g:  [layer][block][K|V][kv_head][token][head_dim]
//   image of blocks {b0, b1}:  b0: layer 0 K|V, layer 1 K|V, …  then b1: layer 0 K|V, …
//
// Ownership: the runner (weights) is shared, the KV is not. Several backends may share one
// runner (one set of weights, one pool of KV each, e.g. two engines on one model); they must
// not run forward passes at the same time (ModelRunner::forward keeps no state between calls,
// but its thread pool is shared). Not thread-safe; the engine loop owns it.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/forward_backend.h"

namespace kvp {

class CpuForwardBackend final : public ForwardBackend {
 public:
  // requires: runner is not null.
  explicit CpuForwardBackend(std::shared_ptr<ModelRunner> runner);

  const ModelSpec& spec() const override { return runner_->spec(); }
  std::string device_name() const override { return "cpu"; }
  WeightFootprint weight_footprint() const override;

  int32_t num_cache_groups() const override { return runner_->num_cache_groups(); }
  int32_t num_group_layers(int32_t group) const override;
  bool group_is_sliding(int32_t group) const override;
  KvLayout group_layout(int32_t group, int32_t num_blocks, int32_t block_size,
                        DType dtype) const override;
  // f32, bf16 and f16.
  Status check_kv_dtype(DType dtype) const override;

  // invalid_argument (nothing changes): a layout count other than num_cache_groups(), a layout
  // that is not group_layout(g, ...) of its group, a dtype check_kv_dtype refuses.
  // resource_exhausted when the host memory cannot be had (the earlier KV is freed first, so
  // then none is allocated).
  Status allocate_kv(std::span<const KvLayout> layouts) override;
  // requires: allocate_kv succeeded, 0 <= group < num_cache_groups().
  const KvLayout& kv_layout(int32_t group) const override;

  Status forward(const ForwardBatch& batch, std::span<float> logits) override;
  // Errors (nothing copied): no KV allocated, a group out of range, an op of another group,
  // a block id outside the pool.
  Status copy_blocks(int32_t group, std::span<const BlockCopy> ops) override;
  // Errors (nothing read or written): no KV allocated, a group out of range, a block id outside
  // the pool, an image of another size.
  Status read_blocks(int32_t group, std::span<const BlockId> blocks,
                     std::span<std::byte> image) const override;
  Status write_blocks(int32_t group, std::span<const BlockId> blocks,
                      std::span<const std::byte> image) override;
  // Block for block and layer for layer between the pool and the host slab, at once (no image).
  Result<uint64_t> start_transfers(int32_t group, std::span<const BlockTransfer> ops,
                                   HostKvStorage& host) override;

  ModelRunner& runner() { return *runner_; }

 private:
  // ok when KV is allocated, group names one of its groups, every block id is in the pool and
  // image_bytes == blocks.size() * block_size_bytes(); `what` names the call in errors.
  Status check_blocks(const char* what, int32_t group, std::span<const BlockId> blocks,
                      size_t image_bytes) const;

  std::shared_ptr<ModelRunner> runner_;
  std::vector<HostKvSlab> slabs_;  // [num_cache_groups] once allocate_kv succeeded, else empty
};

}  // namespace kvp

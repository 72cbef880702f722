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
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "cache/block_ops.h"
#include "cache/kv_layout.h"
#include "common/dtype.h"
#include "common/ids.h"
#include "common/status.h"
#include "model/model_runner.h"
#include "model/model_spec.h"

namespace kvp {

class ForwardBackend {
 public:
  virtual ~ForwardBackend() = default;

  virtual const ModelSpec& spec() const = 0;
  // "cpu" or "cuda:0 (NVIDIA H100 80GB HBM3)": for messages and stats lines.
  virtual std::string device_name() const = 0;

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

  // Copy-on-write copies within one group (every op's group == group). Ops must not overlap.
  virtual Status copy_blocks(int32_t group, std::span<const BlockCopy> ops) = 0;

  // Whole blocks of one group to and from a host image (layout in the header comment);
  // image.size() == blocks.size() * kv_layout(group).block_size_bytes(). Synchronous.
  virtual Status read_blocks(int32_t group, std::span<const BlockId> blocks,
                             std::span<std::byte> image) const = 0;
  virtual Status write_blocks(int32_t group, std::span<const BlockId> blocks,
                              std::span<const std::byte> image) = 0;
};

}  // namespace kvp

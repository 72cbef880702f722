// Device memory for one cache group's KV slab (cache/kv_layout.h) and the byte moves the cache
// module asks for: KV write from a slot mapping, copy-on-write block copies (a batch in one
// launch), and whole-block moves between the device and pinned host memory (session offload).
//
//   slab (device, one cudaMalloc):  [num_layers][num_blocks][2 (K, V)][num_kv_heads][block_size]
//                                   [head_dim] of layout.dtype (int8 / fp8: each head run followed
//                                   by its [block_size] f16 scales, cache/kv_layout.h)
//   host block image (pinned):      [num_moved_blocks][num_layers][2][num_kv_heads][block_size]
//                                   [head_dim]  -- one block's layers back to back
//
// Every operation is asynchronous on the caller's stream; arguments are validated on the host
// before anything is enqueued.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>

#include "backend/attention.h"
#include "backend/cuda/device_buffer.h"
#include "cache/block_ops.h"
#include "cache/kv_layout.h"
#include "common/ids.h"

namespace kvp::cuda {

class DeviceKvPool {
 public:
  // requires nothing; returns invalid_argument for a non-positive geometry or an F32 dtype and
  // resource_exhausted when the device has no room. The slab's contents start undefined.
  static Result<DeviceKvPool> create(const KvLayout& layout);

  DeviceKvPool() = default;
  DeviceKvPool(DeviceKvPool&& other) noexcept;
  DeviceKvPool& operator=(DeviceKvPool&& other) noexcept;
  DeviceKvPool(const DeviceKvPool&) = delete;
  DeviceKvPool& operator=(const DeviceKvPool&) = delete;
  ~DeviceKvPool();

  const KvLayout& layout() const { return layout_; }
  void* slab() const { return slab_.data(); }  // [layout.size_elems()] of layout.dtype
  // requires: 0 <= layer < layout().num_layers.
  PagedKv layer(int32_t layer) const { return paged_kv_for_layer(layout_, slab_.data(), layer); }

  // Copies every layer's K and V of each op's src block into its dst block, all ops in one
  // launch. Ops must not overlap (no block is both a destination and a source, no destination
  // twice); the host copy of the ops is staged through pinned memory owned by the pool, so
  // `ops` may be freed on return. Mutates the pool's slab.
  Status copy_blocks(std::span<const BlockCopy> ops, cudaStream_t stream);

  // Moves whole blocks (all layers, K and V) between the slab and a pinned host image laid out
  // as in the header comment. `host` must hold blocks.size() * layout().block_size_bytes().
  // The copy is asynchronous: `host` must stay alive until the stream reaches it.
  Status copy_blocks_to_host(std::span<const BlockId> blocks, PinnedBuffer& host,
                             cudaStream_t stream) const;
  Status copy_blocks_from_host(const PinnedBuffer& host, std::span<const BlockId> blocks,
                               cudaStream_t stream);

 private:
  void destroy_event();
  Status check_block_ids(std::span<const BlockId> blocks, const char* what) const;

  KvLayout layout_;
  DeviceBuffer slab_;
  PinnedBuffer ops_host_;               // [ops capacity][2] int32 staging for copy_blocks
  DeviceBuffer ops_device_;             // [ops capacity][2] int32
  cudaEvent_t ops_uploaded_ = nullptr;  // recorded after the last upload of ops_host_
};

// Writes new tokens' K and V (device pointers in `write`, rows of row_dtype:
// [num_tokens][num_kv_heads][head_dim]) into their slots of one layer. row_dtype is kv.dtype for
// a bf16/f16 pool; an int8 / fp8 pool takes bf16 or f16 rows and quantises each (token, head) row
// as quantize_kv8 does for its dtype (cache/kv_quant.h), codes and f16 scale, bit for bit.
// host_slot_mapping is a host copy of write.slot_mapping ([write.num_tokens]); it is validated
// with check_kv_write_args before the launch. Negative slots are skipped. Mutates kv.
Status kv_write(const PagedKv& kv, const KvWrite& write, const int64_t* host_slot_mapping,
                DType row_dtype, cudaStream_t stream);
// The same with row_dtype = kv.dtype (bf16 for an int8 / fp8 pool).
Status kv_write(const PagedKv& kv, const KvWrite& write, const int64_t* host_slot_mapping,
                cudaStream_t stream);

// The launch alone, without the host-side validation (metadata already checked).
// requires: check_kv_write_args(write with the host slot mapping, kv).is_ok().
Status launch_kv_write(const PagedKv& kv, const KvWrite& write, DType row_dtype,
                       cudaStream_t stream);
// The same with row_dtype = kv.dtype (bf16 for an int8 / fp8 pool).
Status launch_kv_write(const PagedKv& kv, const KvWrite& write, cudaStream_t stream);

}  // namespace kvp::cuda

// ForwardBackend's defaults: session tier transfers as every backend can do them (synchronously,
// through a block image (read_blocks / write_blocks) and one memcpy per block and layer between
// the image and the host slab; backends that move blocks directly override start_transfers), and
// logits written into strided rows through a scratch buffer (forward_into_rows).
#include "model/forward_backend.h"

#include <cstring>
#include <vector>

#include "common/parallel_memcpy.h"

namespace kvp {

Status check_logit_rows(size_t num_rows, size_t per_row, size_t row_stride, size_t num_floats) {
  if (row_stride < per_row ||
      (num_rows > 0 && num_floats < (num_rows - 1) * row_stride + per_row)) {
    return Status::invalid_argument(
        "forward: {} logit rows of {} at a stride of {} do not fit a buffer of {} floats", num_rows,
        per_row, row_stride, num_floats);
  }
  return Status::ok();
}

Status ForwardBackend::forward_into_rows(const ForwardBatch& batch,
                                         std::span<const int32_t> full_rows,
                                         std::span<float> logits, size_t row_stride,
                                         std::span<LogitRowSummary> summaries) {
  const auto per_row = static_cast<size_t>(spec().logits_per_row());
  const size_t rows = summaries.empty() ? batch.logit_rows.size() : full_rows.size();
  KVP_RETURN_IF_ERROR(check_logit_rows(rows, per_row, row_stride, logits.size()));
  std::vector<float> scratch(rows * per_row);
  KVP_RETURN_IF_ERROR(summaries.empty() ? forward(batch, scratch)
                                        : forward_summarized(batch, full_rows, scratch, summaries));
  parallel_memcpy_2d(logits.data(), row_stride * 4, scratch.data(), per_row * 4, per_row * 4, rows,
                     4);
  return Status::ok();
}

Status ForwardBackend::check_transfers(int32_t group, std::span<const BlockTransfer> ops,
                                       const HostKvStorage& host, bool* to_host) const {
  if (group < 0 || group >= num_cache_groups() || group >= host.num_groups()) {
    return Status::invalid_argument("{}: transfers of cache group {} (the model has {})",
                                    device_name(), group, num_cache_groups());
  }
  const KvLayout& pool = kv_layout(group);
  const KvLayout& slab = host.layout(group);
  if (slab.num_layers != pool.num_layers || slab.num_kv_heads != pool.num_kv_heads ||
      slab.block_size != pool.block_size || slab.head_dim != pool.head_dim ||
      slab.dtype != pool.dtype) {
    return Status::invalid_argument("{}: transfers of group {} to a host slab of another layout",
                                    device_name(), group);
  }
  *to_host = ops.empty() || ops.front().src_pool == Pool::Device;
  for (size_t i = 0; i < ops.size(); ++i) {
    const BlockTransfer& op = ops[i];
    const bool down = op.src_pool == Pool::Device && op.dst_pool == Pool::Host;
    const bool up = op.src_pool == Pool::Host && op.dst_pool == Pool::Device;
    if ((!down && !up) || down != *to_host || op.group != group) {
      return Status::invalid_argument("{}: transfer {} of group {}: mixed directions or groups",
                                      device_name(), i, group);
    }
    const BlockId pool_block = down ? op.src : op.dst;
    const BlockId host_block = down ? op.dst : op.src;
    if (pool_block.value < 0 || pool_block.value >= pool.num_blocks || host_block.value < 0 ||
        host_block.value >= slab.num_blocks) {
      return Status::invalid_argument(
          "{}: transfer {} of group {}: pool block {} (of {}) / host block {} (of {})",
          device_name(), i, group, pool_block.value, pool.num_blocks, host_block.value,
          slab.num_blocks);
    }
  }
  return Status::ok();
}

Result<uint64_t> ForwardBackend::start_transfers(int32_t group, std::span<const BlockTransfer> ops,
                                                 HostKvStorage& host) {
  bool to_host = true;
  KVP_RETURN_IF_ERROR(check_transfers(group, ops, host, &to_host));
  const KvLayout& slab = host.layout(group);
  const size_t elem_bytes = dtype_size_bytes(slab.dtype);
  const size_t run_bytes = static_cast<size_t>(slab.block_pitch()) * elem_bytes;
  std::vector<BlockId> pool_blocks;
  for (const BlockTransfer& op : ops) pool_blocks.push_back(to_host ? op.src : op.dst);
  const size_t image_bytes = ops.size() * slab.block_size_bytes();
  if (transfer_image_.size() < image_bytes) transfer_image_.resize(image_bytes);
  const std::span<std::byte> image(transfer_image_.data(), image_bytes);
  std::byte* base = host.slab(group).data();
  if (to_host) KVP_RETURN_IF_ERROR(read_blocks(group, pool_blocks, image));
  for (size_t i = 0; i < ops.size(); ++i) {
    std::byte* run = image.data() + i * slab.num_layers * run_bytes;
    const int32_t host_block = (to_host ? ops[i].dst : ops[i].src).value;
    for (int32_t layer = 0; layer < slab.num_layers; ++layer, run += run_bytes) {
      std::byte* in_host = base + slab.block_offset(layer, host_block, 0) * elem_bytes;
      if (to_host) {
        std::memcpy(in_host, run, run_bytes);
      } else {
        std::memcpy(run, in_host, run_bytes);
      }
    }
  }
  if (!to_host) KVP_RETURN_IF_ERROR(write_blocks(group, pool_blocks, image));
  return ++last_ticket_;
}

Result<bool> ForwardBackend::transfers_done(uint64_t ticket) {
  (void)ticket;
  return true;
}

Status ForwardBackend::wait_transfers(uint64_t ticket) {
  (void)ticket;
  return Status::ok();
}

}  // namespace kvp

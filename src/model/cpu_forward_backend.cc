#include "model/cpu_forward_backend.h"

#include <cstring>
#include <new>
#include <utility>

#include "backend/cpu_attention.h"

namespace kvp {

CpuForwardBackend::CpuForwardBackend(std::shared_ptr<ModelRunner> runner)
    : runner_(std::move(runner)) {
  KVP_CHECK(runner_ != nullptr, "CpuForwardBackend needs a model runner");
}

WeightFootprint CpuForwardBackend::weight_footprint() const {
  const ModelWeights& w = runner_->weights();
  return {w.matrix_bytes(), w.decode_read_bytes(), w.matrix_bytes_by_format()};
}

int32_t CpuForwardBackend::num_group_layers(int32_t group) const {
  KVP_CHECK(group >= 0 && group < num_cache_groups(), "cache group {} of {}", group,
            num_cache_groups());
  return static_cast<int32_t>(runner_->group_layers(group).size());
}

bool CpuForwardBackend::group_is_sliding(int32_t group) const {
  KVP_CHECK(group >= 0 && group < num_cache_groups(), "cache group {} of {}", group,
            num_cache_groups());
  return runner_->group_is_sliding(group);
}

KvLayout CpuForwardBackend::group_layout(int32_t group, int32_t num_blocks, int32_t block_size,
                                         DType dtype) const {
  KVP_CHECK(group >= 0 && group < num_cache_groups(), "cache group {} of {}", group,
            num_cache_groups());
  return runner_->group_layout(group, num_blocks, block_size, dtype);
}

Status CpuForwardBackend::check_kv_dtype(DType dtype) const {
  switch (dtype) {
    case DType::F32:
    case DType::BF16:
    case DType::F16:
    case DType::I8:
    case DType::FP8:
      return Status::ok();
  }
  return Status::invalid_argument(
      "KV dtype {} is not one the cpu backend holds (f32, bf16, f16, int8, fp8)",
      static_cast<int>(dtype));
}

Status CpuForwardBackend::allocate_kv(std::span<const KvLayout> layouts) {
  if (static_cast<int32_t>(layouts.size()) != num_cache_groups()) {
    return Status::invalid_argument("cpu backend: {} KV layouts for a model of {} cache groups",
                                    layouts.size(), num_cache_groups());
  }
  for (int32_t g = 0; g < num_cache_groups(); ++g) {
    const KvLayout& layout = layouts[g];
    KVP_RETURN_IF_ERROR(check_kv_dtype(layout.dtype));
    if (layout.num_blocks < 1 || layout.block_size < 1) {
      return Status::invalid_argument(
          "cpu backend: group {} KV layout of {} blocks of {} tokens: both must be positive", g,
          layout.num_blocks, layout.block_size);
    }
    if (layout != group_layout(g, layout.num_blocks, layout.block_size, layout.dtype)) {
      return Status::invalid_argument(
          "cpu backend: group {} KV layout ({} layers, {} kv heads, head dim {}) is not the "
          "model's ({} layers, {} kv heads, head dim {})",
          g, layout.num_layers, layout.num_kv_heads, layout.head_dim, num_group_layers(g),
          spec().num_kv_heads, spec().head_dim);
    }
  }
  slabs_.clear();
  slabs_.shrink_to_fit();
  std::vector<HostKvSlab> slabs(layouts.size());
  try {
    for (size_t g = 0; g < layouts.size(); ++g) {
      slabs[g].layout = layouts[g];
      slabs[g].bytes.resize(layouts[g].size_bytes());
    }
  } catch (const std::bad_alloc&) {
    uint64_t total_bytes = 0;
    for (const KvLayout& layout : layouts) total_bytes += layout.size_bytes();
    return Status::resource_exhausted("cpu backend: no host memory for a KV pool of {} bytes",
                                      total_bytes);
  }
  slabs_ = std::move(slabs);
  return Status::ok();
}

const KvLayout& CpuForwardBackend::kv_layout(int32_t group) const {
  KVP_CHECK(group >= 0 && group < static_cast<int32_t>(slabs_.size()),
            "KV layout of group {}: {} groups allocated", group, slabs_.size());
  return slabs_[group].layout;
}

Status CpuForwardBackend::forward(const ForwardBatch& batch, std::span<float> logits) {
  if (slabs_.empty()) return Status::invalid_argument("cpu backend: forward before allocate_kv");
  return runner_->forward(batch, slabs_, logits);
}

Status CpuForwardBackend::copy_blocks(int32_t group, std::span<const BlockCopy> ops) {
  KVP_RETURN_IF_ERROR(check_blocks("copy blocks", group, {}, 0));
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].group != group) {
      return Status::invalid_argument(
          "cpu backend: copy blocks of group {}: copy {} is of group {}", group, i, ops[i].group);
    }
  }
  // cpu::copy_blocks checks every id before it copies anything
  return cpu::copy_blocks(slabs_[group].layout, slabs_[group].bytes.data(), ops);
}

Status CpuForwardBackend::check_blocks(const char* what, int32_t group,
                                       std::span<const BlockId> blocks, size_t image_bytes) const {
  if (slabs_.empty()) return Status::invalid_argument("cpu backend: {} before allocate_kv", what);
  if (group < 0 || group >= static_cast<int32_t>(slabs_.size())) {
    return Status::invalid_argument("cpu backend: {}: cache group {} of {}", what, group,
                                    slabs_.size());
  }
  const KvLayout& layout = slabs_[group].layout;
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (blocks[i].value < 0 || blocks[i].value >= layout.num_blocks) {
      return Status::invalid_argument(
          "cpu backend: {} of group {}: block {} (entry {}) is outside the pool of {}", what, group,
          blocks[i].value, i, layout.num_blocks);
    }
  }
  if (image_bytes != blocks.size() * layout.block_size_bytes()) {
    return Status::invalid_argument(
        "cpu backend: {} of group {}: an image of {} bytes for {} blocks of {} bytes", what, group,
        image_bytes, blocks.size(), layout.block_size_bytes());
  }
  return Status::ok();
}

Status CpuForwardBackend::read_blocks(int32_t group, std::span<const BlockId> blocks,
                                      std::span<std::byte> image) const {
  KVP_RETURN_IF_ERROR(check_blocks("read blocks", group, blocks, image.size()));
  const HostKvSlab& slab = slabs_[group];
  const size_t elem_bytes = dtype_size_bytes(slab.layout.dtype);
  const size_t run_bytes = static_cast<size_t>(slab.layout.block_pitch()) * elem_bytes;
  std::byte* out = image.data();
  for (const BlockId block : blocks) {
    for (int32_t layer = 0; layer < slab.layout.num_layers; ++layer) {
      std::memcpy(out,
                  slab.bytes.data() + slab.layout.block_offset(layer, block.value, 0) * elem_bytes,
                  run_bytes);
      out += run_bytes;
    }
  }
  return Status::ok();
}

Status CpuForwardBackend::write_blocks(int32_t group, std::span<const BlockId> blocks,
                                       std::span<const std::byte> image) {
  KVP_RETURN_IF_ERROR(check_blocks("write blocks", group, blocks, image.size()));
  HostKvSlab& slab = slabs_[group];
  const size_t elem_bytes = dtype_size_bytes(slab.layout.dtype);
  const size_t run_bytes = static_cast<size_t>(slab.layout.block_pitch()) * elem_bytes;
  const std::byte* in = image.data();
  for (const BlockId block : blocks) {
    for (int32_t layer = 0; layer < slab.layout.num_layers; ++layer) {
      std::memcpy(slab.bytes.data() + slab.layout.block_offset(layer, block.value, 0) * elem_bytes,
                  in, run_bytes);
      in += run_bytes;
    }
  }
  return Status::ok();
}

Result<uint64_t> CpuForwardBackend::start_transfers(int32_t group,
                                                    std::span<const BlockTransfer> ops,
                                                    HostKvStorage& host) {
  if (slabs_.empty()) return Status::invalid_argument("cpu backend: transfers before allocate_kv");
  bool to_host = true;
  KVP_RETURN_IF_ERROR(check_transfers(group, ops, host, &to_host));
  HostKvSlab& pool = slabs_[group];
  const KvLayout& slab = host.layout(group);
  const size_t elem_bytes = dtype_size_bytes(slab.dtype);
  const size_t run_bytes = static_cast<size_t>(slab.block_pitch()) * elem_bytes;
  std::byte* host_base = host.slab(group).data();
  for (const BlockTransfer& op : ops) {
    for (int32_t layer = 0; layer < slab.num_layers; ++layer) {
      std::byte* src =
          (op.src_pool == Pool::Device ? pool.bytes.data() : host_base) +
          (op.src_pool == Pool::Device ? pool.layout : slab).block_offset(layer, op.src.value, 0) *
              elem_bytes;
      std::byte* dst =
          (op.dst_pool == Pool::Device ? pool.bytes.data() : host_base) +
          (op.dst_pool == Pool::Device ? pool.layout : slab).block_offset(layer, op.dst.value, 0) *
              elem_bytes;
      std::memcpy(dst, src, run_bytes);
    }
  }
  return ++last_ticket_;
}

}  // namespace kvp

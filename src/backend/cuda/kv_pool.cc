// DeviceKvPool and the KV write entry point (see kv_pool.h); kernels in kv_kernels.cu.
#include "backend/cuda/kv_pool.h"

#include "backend/cuda/kernels.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace kvp::cuda {
namespace {

Status check_layout(const KvLayout& layout) {
  if (layout.num_layers <= 0 || layout.num_blocks <= 0 || layout.num_kv_heads <= 0 ||
      layout.block_size <= 0 || layout.head_dim <= 0) {
    return Status::invalid_argument(
        "cuda kv pool: geometry must be positive (layers {}, blocks {}, kv heads {}, block size "
        "{}, head dim {})",
        layout.num_layers, layout.num_blocks, layout.num_kv_heads, layout.block_size,
        layout.head_dim);
  }
  if (layout.dtype == DType::F32) {
    return Status::unsupported("cuda kv pool: dtype {} (bf16, f16, int8 and fp8 are supported)",
                               dtype_name(layout.dtype));
  }
  if (layout.head_dim % 8 != 0) {
    return Status::unsupported("cuda kv pool: head dim {} is not a multiple of 8", layout.head_dim);
  }
  // 8-bit rows and scale runs 16-byte aligned (kernels read them with 16-byte copies), and the
  // quantising write's warp-per-row shape
  if (is_kv8(layout.dtype) &&
      (layout.block_size % 8 != 0 || layout.head_dim % 32 != 0 || layout.head_dim > 256)) {
    return Status::unsupported(
        "cuda kv pool: {} needs a block size that is a multiple of 8 and a head dim that is a "
        "multiple of 32 up to 256 (block size {}, head dim {})",
        dtype_name(layout.dtype), layout.block_size, layout.head_dim);
  }
  return Status::ok();
}

}  // namespace

Result<DeviceKvPool> DeviceKvPool::create(const KvLayout& layout) {
  KVP_RETURN_IF_ERROR(check_layout(layout));
  DeviceKvPool pool;
  pool.layout_ = layout;
  KVP_ASSIGN_OR_RETURN(pool.slab_, DeviceBuffer::allocate(layout.size_bytes()));
  KVP_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&pool.ops_uploaded_, cudaEventDisableTiming));
  return pool;
}

DeviceKvPool::DeviceKvPool(DeviceKvPool&& other) noexcept
    : layout_(other.layout_),
      slab_(std::move(other.slab_)),
      ops_host_(std::move(other.ops_host_)),
      ops_device_(std::move(other.ops_device_)),
      ops_uploaded_(std::exchange(other.ops_uploaded_, nullptr)) {}

DeviceKvPool& DeviceKvPool::operator=(DeviceKvPool&& other) noexcept {
  if (this != &other) {
    destroy_event();
    layout_ = other.layout_;
    slab_ = std::move(other.slab_);
    ops_host_ = std::move(other.ops_host_);
    ops_device_ = std::move(other.ops_device_);
    ops_uploaded_ = std::exchange(other.ops_uploaded_, nullptr);
  }
  return *this;
}

DeviceKvPool::~DeviceKvPool() { destroy_event(); }

void DeviceKvPool::destroy_event() {
  if (ops_uploaded_ != nullptr) {
    cudaEventSynchronize(ops_uploaded_);  // the pinned staging must outlive its upload
    cudaEventDestroy(ops_uploaded_);
    ops_uploaded_ = nullptr;
  }
}

Status DeviceKvPool::check_block_ids(std::span<const BlockId> blocks, const char* what) const {
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (blocks[i].value < 0 || blocks[i].value >= layout_.num_blocks) {
      return Status::invalid_argument(
          "cuda kv pool: {} entry {} is block {}, outside the pool of {}", what, i, blocks[i].value,
          layout_.num_blocks);
    }
  }
  return Status::ok();
}

Status DeviceKvPool::copy_blocks(std::span<const BlockCopy> ops, cudaStream_t stream) {
  if (ops.empty()) return Status::ok();
  for (size_t i = 0; i < ops.size(); ++i) {
    for (const BlockId id : {ops[i].src, ops[i].dst}) {
      if (id.value < 0 || id.value >= layout_.num_blocks) {
        return Status::invalid_argument(
            "cuda block copy: op {} names block {}, outside the pool of {}", i, id.value,
            layout_.num_blocks);
      }
    }
    if (ops[i].src == ops[i].dst) {
      return Status::invalid_argument("cuda block copy: op {} copies block {} onto itself", i,
                                      ops[i].src.value);
    }
  }
  const size_t bytes = ops.size() * 2 * sizeof(int32_t);
  // The previous upload must have left the pinned staging before it is overwritten.
  KVP_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(ops_uploaded_));
  if (ops_host_.size_bytes() < bytes) {
    KVP_ASSIGN_OR_RETURN(ops_host_, PinnedBuffer::allocate(2 * bytes));
    KVP_ASSIGN_OR_RETURN(ops_device_, DeviceBuffer::allocate(2 * bytes));
  }
  int32_t* staged = ops_host_.as<int32_t>();  // [num_ops][2]
  for (size_t i = 0; i < ops.size(); ++i) {
    staged[2 * i] = ops[i].src.value;
    staged[2 * i + 1] = ops[i].dst.value;
  }
  KVP_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(ops_device_.data(), staged, bytes, cudaMemcpyHostToDevice, stream));
  KVP_CUDA_RETURN_IF_ERROR(cudaEventRecord(ops_uploaded_, stream));
  const int64_t elem = static_cast<int64_t>(dtype_size_bytes(layout_.dtype));
  return cuda_status(detail::launch_block_copy(slab_.data(), ops_device_.as<int32_t>(),
                                               static_cast<int32_t>(ops.size()), layout_.num_layers,
                                               layout_.block_pitch() * elem,
                                               layout_.layer_stride() * elem, stream),
                     "block_copy_kernel");
}

Status DeviceKvPool::copy_blocks_to_host(std::span<const BlockId> blocks, PinnedBuffer& host,
                                         cudaStream_t stream) const {
  KVP_RETURN_IF_ERROR(check_block_ids(blocks, "offload list"));
  const size_t block_bytes = layout_.block_size_bytes();
  if (host.size_bytes() < blocks.size() * block_bytes) {
    return Status::invalid_argument(
        "cuda kv pool: host image of {} bytes is too small for {} blocks of {} bytes",
        host.size_bytes(), blocks.size(), block_bytes);
  }
  const size_t elem = dtype_size_bytes(layout_.dtype);
  const size_t run_bytes = static_cast<size_t>(layout_.block_pitch()) * elem;     // K + V
  const size_t layer_bytes = static_cast<size_t>(layout_.layer_stride()) * elem;  // src pitch
  for (size_t i = 0; i < blocks.size(); ++i) {
    const auto* src = static_cast<const std::byte*>(slab_.data()) + blocks[i].value * run_bytes;
    auto* dst = host.as<std::byte>() + i * block_bytes;
    // one 2-D copy per block: num_layers rows of run_bytes, layer_stride apart on the device
    KVP_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(dst, run_bytes, src, layer_bytes, run_bytes,
                                               layout_.num_layers, cudaMemcpyDeviceToHost, stream));
  }
  return Status::ok();
}

Status DeviceKvPool::copy_blocks_from_host(const PinnedBuffer& host,
                                           std::span<const BlockId> blocks, cudaStream_t stream) {
  KVP_RETURN_IF_ERROR(check_block_ids(blocks, "restore list"));
  const size_t block_bytes = layout_.block_size_bytes();
  if (host.size_bytes() < blocks.size() * block_bytes) {
    return Status::invalid_argument(
        "cuda kv pool: host image of {} bytes is too small for {} blocks of {} bytes",
        host.size_bytes(), blocks.size(), block_bytes);
  }
  const size_t elem = dtype_size_bytes(layout_.dtype);
  const size_t run_bytes = static_cast<size_t>(layout_.block_pitch()) * elem;
  const size_t layer_bytes = static_cast<size_t>(layout_.layer_stride()) * elem;
  for (size_t i = 0; i < blocks.size(); ++i) {
    auto* dst = static_cast<std::byte*>(slab_.data()) + blocks[i].value * run_bytes;
    const auto* src = host.as<const std::byte>() + i * block_bytes;
    KVP_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(dst, layer_bytes, src, run_bytes, run_bytes,
                                               layout_.num_layers, cudaMemcpyHostToDevice, stream));
  }
  return Status::ok();
}

Status launch_kv_write(const PagedKv& kv, const KvWrite& write, DType row_dtype,
                       cudaStream_t stream) {
  if (is_kv8(kv.dtype)) {
    return cuda_status(
        detail::launch_kv_write_kv8(
            kv.dtype == DType::FP8 ? detail::KvFormat::Fp8 : detail::KvFormat::Int8, write.k,
            write.v, row_dtype == DType::BF16, write.slot_mapping, write.num_tokens, kv.k, kv.v,
            kv.num_kv_heads, kv.block_size, kv.head_dim, kv.block_pitch,
            int64_t{kv.num_blocks} * kv.block_size, stream),
        "kv_write_kv8_kernel");
  }
  const int64_t elem = static_cast<int64_t>(dtype_size_bytes(kv.dtype));
  return cuda_status(detail::launch_kv_write(
                         write.k, write.v, write.slot_mapping, write.num_tokens, kv.k, kv.v,
                         kv.num_kv_heads, kv.block_size, static_cast<int32_t>(kv.head_dim * elem),
                         kv.block_pitch * elem, int64_t{kv.num_blocks} * kv.block_size, stream),
                     "kv_write_kernel");
}

Status launch_kv_write(const PagedKv& kv, const KvWrite& write, cudaStream_t stream) {
  return launch_kv_write(kv, write, is_kv8(kv.dtype) ? DType::BF16 : kv.dtype, stream);
}

Status kv_write(const PagedKv& kv, const KvWrite& write, const int64_t* host_slot_mapping,
                cudaStream_t stream) {
  return kv_write(kv, write, host_slot_mapping, is_kv8(kv.dtype) ? DType::BF16 : kv.dtype, stream);
}

Status kv_write(const PagedKv& kv, const KvWrite& write, const int64_t* host_slot_mapping,
                DType row_dtype, cudaStream_t stream) {
  if (kv.dtype == DType::F32 || kv.head_dim % 8 != 0) {
    return Status::unsupported("cuda kv write: dtype {} with head dim {}", dtype_name(kv.dtype),
                               kv.head_dim);
  }
  const bool rows_ok = is_kv8(kv.dtype) ? (row_dtype == DType::BF16 || row_dtype == DType::F16) &&
                                              kv.head_dim % 32 == 0 && kv.head_dim <= 256
                                        : row_dtype == kv.dtype;
  if (!rows_ok) {
    return Status::unsupported("cuda kv write: {} rows into a {} pool with head dim {}",
                               dtype_name(row_dtype), dtype_name(kv.dtype), kv.head_dim);
  }
  if (write.num_tokens > 0 && host_slot_mapping == nullptr) {
    return Status::invalid_argument("cuda kv write: no host copy of the slot mapping to validate");
  }
  KvWrite host_view = write;
  host_view.slot_mapping = host_slot_mapping;
  KVP_RETURN_IF_ERROR(check_kv_write_args(host_view, kv));
  return launch_kv_write(kv, write, row_dtype, stream);
}

}  // namespace kvp::cuda

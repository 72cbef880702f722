// CudaForwardBackend (cuda_forward_backend.h): pools, block moves with layout conversion.
#include "model/cuda/cuda_forward_backend.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/kernels.h"
#include "common/parallel_memcpy.h"
#include "model/cuda/nccl_library.h"
#include "model/cuda/peer_all_reduce.h"
#include "model/tensor_parallel.h"

namespace kvp::cuda {

CudaForwardBackend::CudaForwardBackend(std::unique_ptr<CudaModelRunner> runner)
    : runner_(std::move(runner)) {}

CudaForwardBackend::~CudaForwardBackend() {
  if (runner_ != nullptr) cudaStreamSynchronize(runner_->stream());
  destroy_transfers();
}

std::string CudaForwardBackend::device_name() const {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, runner_->device()) != cudaSuccess) {
    cudaGetLastError();
    return fmt::format("cuda:{}", runner_->device());
  }
  return fmt::format("cuda:{} ({})", runner_->device(), prop.name);
}

int32_t CudaForwardBackend::num_group_layers(int32_t group) const {
  return static_cast<int32_t>(runner_->group_layers(group).size());
}

KvLayout CudaForwardBackend::group_layout(int32_t group, int32_t num_blocks, int32_t block_size,
                                          DType dtype) const {
  KvLayout layout;
  layout.num_layers = num_group_layers(group);
  layout.num_blocks = num_blocks;
  layout.num_kv_heads = runner_->spec().num_kv_heads;
  layout.block_size = block_size;
  layout.head_dim = runner_->spec().head_dim;
  layout.dtype = dtype;
  return layout;
}

Status CudaForwardBackend::check_kv_dtype(DType dtype) const {
  // int8 / fp8: the runner's K/V rows stay bf16 and are quantised by the KV write; attention
  // reads the 8-bit pool with bf16 queries (CudaModelRunner::forward)
  if (dtype == DType::BF16 || dtype == DType::F16 || is_kv8(dtype)) return Status::ok();
  return Status::invalid_argument(
      "KV dtype {} is not supported by the cuda backend (bf16, f16, int8, fp8)", dtype_name(dtype));
}

namespace {

// Copies `num_runs` head runs (cache/kv_layout.h: block_size rows, then the f16 scales for 8-bit)
// between a pool of head dim src_dim and one of dst_dim: rows are cut to dst_dim or extended
// with the zeros already in dst; 8-bit scales carry over (pad lanes are zero, so a padded row's
// scale is its logical row's).
void copy_head_runs(const std::byte* src, int32_t src_dim, std::byte* dst, int32_t dst_dim,
                    size_t num_runs, int32_t block_size, DType dtype) {
  const size_t elem = dtype_size_bytes(dtype);
  const size_t scale_bytes = is_kv8(dtype) ? 2 * static_cast<size_t>(block_size) : 0;
  const size_t src_run = static_cast<size_t>(block_size) * src_dim * elem + scale_bytes;
  const size_t dst_run = static_cast<size_t>(block_size) * dst_dim * elem + scale_bytes;
  const size_t row_bytes = static_cast<size_t>(std::min(src_dim, dst_dim)) * elem;
  for (size_t r = 0; r < num_runs; ++r) {
    const std::byte* s = src + r * src_run;
    std::byte* d = dst + r * dst_run;
    for (int32_t t = 0; t < block_size; ++t) {
      std::memcpy(d + t * dst_dim * elem, s + t * src_dim * elem, row_bytes);
    }
    if (scale_bytes > 0) {
      std::memcpy(d + static_cast<size_t>(block_size) * dst_dim, s + src_run - scale_bytes,
                  scale_bytes);
    }
  }
}

}  // namespace

Status CudaForwardBackend::allocate_kv(std::span<const KvLayout> layouts) {
  if (static_cast<int32_t>(layouts.size()) != num_cache_groups()) {
    return Status::invalid_argument("cuda allocate_kv: {} layouts for {} cache groups",
                                    layouts.size(), num_cache_groups());
  }
  for (int32_t g = 0; g < num_cache_groups(); ++g) {
    KVP_RETURN_IF_ERROR(check_kv_dtype(layouts[g].dtype));
    if (layouts[g].num_blocks <= 0 || layouts[g].block_size <= 0 ||
        layouts[g] !=
            group_layout(g, layouts[g].num_blocks, layouts[g].block_size, layouts[g].dtype)) {
      return Status::invalid_argument(
          "cuda allocate_kv: layout of cache group {} (layers {}, kv heads {}, head dim {}, "
          "blocks {}, block size {}) does not fit the model",
          g, layouts[g].num_layers, layouts[g].num_kv_heads, layouts[g].head_dim,
          layouts[g].num_blocks, layouts[g].block_size);
    }
  }
  KVP_CUDA_RETURN_IF_ERROR(cudaSetDevice(runner_->device()));
  KVP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(runner_->stream()));
  pools_.clear();  // free the old pools before the new ones take their room
  layouts_.clear();
  std::vector<DeviceKvPool> pools;
  for (const KvLayout& logical : layouts) {
    KvLayout device = logical;
    device.head_dim = runner_->padded_head_dim();
    KVP_ASSIGN_OR_RETURN(DeviceKvPool pool, DeviceKvPool::create(device));
    pools.push_back(std::move(pool));
  }
  pools_ = std::move(pools);
  layouts_.assign(layouts.begin(), layouts.end());
  return Status::ok();
}

Status CudaForwardBackend::check_group(int32_t group, const char* what) const {
  if (group < 0 || group >= static_cast<int32_t>(pools_.size())) {
    return Status::invalid_argument("cuda {}: cache group {} has no KV pool ({} allocated)", what,
                                    group, pools_.size());
  }
  return Status::ok();
}

Status CudaForwardBackend::forward(const ForwardBatch& batch, std::span<float> logits) {
  if (static_cast<int32_t>(pools_.size()) != num_cache_groups()) {
    return Status::invalid_argument("cuda forward: no KV pools (call allocate_kv first)");
  }
  return runner_->forward(batch, pools_, logits);
}

Status CudaForwardBackend::forward_summarized(const ForwardBatch& batch,
                                              std::span<const int32_t> full_rows,
                                              std::span<float> logits,
                                              std::span<LogitRowSummary> summaries) {
  if (static_cast<int32_t>(pools_.size()) != num_cache_groups()) {
    return Status::invalid_argument("cuda forward: no KV pools (call allocate_kv first)");
  }
  return runner_->forward_summarized(batch, pools_, full_rows, logits, summaries);
}

Status CudaForwardBackend::forward_into_rows(const ForwardBatch& batch,
                                             std::span<const int32_t> full_rows,
                                             std::span<float> logits, size_t row_stride,
                                             std::span<LogitRowSummary> summaries) {
  if (static_cast<int32_t>(pools_.size()) != num_cache_groups()) {
    return Status::invalid_argument("cuda forward: no KV pools (call allocate_kv first)");
  }
  return runner_->forward_into_rows(batch, pools_, full_rows, logits, row_stride, summaries);
}

Status CudaForwardBackend::forward_sampled(const ForwardBatch& batch,
                                           std::span<const int32_t> full_rows,
                                           std::span<float> logits,
                                           std::span<LogitRowSummary> summaries,
                                           const DeviceSampleBatch& samples,
                                           std::span<DeviceSample> results) {
  if (static_cast<int32_t>(pools_.size()) != num_cache_groups()) {
    return Status::invalid_argument("cuda forward: no KV pools (call allocate_kv first)");
  }
  return runner_->forward_sampled(batch, pools_, full_rows, logits, summaries, samples, results);
}

Status CudaForwardBackend::copy_blocks(int32_t group, std::span<const BlockCopy> ops) {
  KVP_RETURN_IF_ERROR(check_group(group, "copy_blocks"));
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].group != group) {
      return Status::invalid_argument("cuda copy_blocks: op {} is for group {}, not group {}", i,
                                      ops[i].group, group);
    }
  }
  KVP_CUDA_RETURN_IF_ERROR(cudaSetDevice(runner_->device()));
  KVP_RETURN_IF_ERROR(runner_->flush_layer_waits());  // after copies ordered into the pool
  KVP_RETURN_IF_ERROR(pools_[group].copy_blocks(ops, runner_->stream()));
  return cuda_status(cudaStreamSynchronize(runner_->stream()), "cudaStreamSynchronize");
}

Status CudaForwardBackend::reserve_staging(size_t bytes) const {
  if (staging_.size_bytes() >= bytes) return Status::ok();
  // geometric growth: a growing session's moves must not pin a new buffer every time
  const size_t grown = std::max(bytes, staging_.size_bytes() * 2);
  staging_ = PinnedBuffer();  // the old one is unpinned before the new one is pinned
  KVP_ASSIGN_OR_RETURN(staging_, PinnedBuffer::allocate(grown));
  return Status::ok();
}

Status CudaForwardBackend::read_blocks(int32_t group, std::span<const BlockId> blocks,
                                       std::span<std::byte> image) const {
  KVP_RETURN_IF_ERROR(check_group(group, "read_blocks"));
  const KvLayout& logical = layouts_[group];
  const KvLayout& device = pools_[group].layout();
  if (image.size() != blocks.size() * logical.block_size_bytes()) {
    return Status::invalid_argument("cuda read_blocks: image of {} bytes for {} blocks of {} bytes",
                                    image.size(), blocks.size(), logical.block_size_bytes());
  }
  if (blocks.empty()) return Status::ok();
  KVP_CUDA_RETURN_IF_ERROR(cudaSetDevice(runner_->device()));
  KVP_RETURN_IF_ERROR(runner_->flush_layer_waits());  // after copies ordered into the pool
  KVP_RETURN_IF_ERROR(reserve_staging(blocks.size() * device.block_size_bytes()));
  KVP_RETURN_IF_ERROR(pools_[group].copy_blocks_to_host(blocks, staging_, runner_->stream()));
  KVP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(runner_->stream()));
  if (device.head_dim == logical.head_dim) {
    parallel_memcpy(image.data(), staging_.data(), image.size());
    return Status::ok();
  }
  // [head runs]: drop each row's pad lanes
  const size_t runs = blocks.size() * logical.num_layers * 2 * logical.num_kv_heads;
  copy_head_runs(staging_.as<const std::byte>(), device.head_dim, image.data(), logical.head_dim,
                 runs, logical.block_size, logical.dtype);
  return Status::ok();
}

Status CudaForwardBackend::write_blocks(int32_t group, std::span<const BlockId> blocks,
                                        std::span<const std::byte> image) {
  KVP_RETURN_IF_ERROR(check_group(group, "write_blocks"));
  const KvLayout& logical = layouts_[group];
  const KvLayout& device = pools_[group].layout();
  if (image.size() != blocks.size() * logical.block_size_bytes()) {
    return Status::invalid_argument(
        "cuda write_blocks: image of {} bytes for {} blocks of {} bytes", image.size(),
        blocks.size(), logical.block_size_bytes());
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (blocks[i].value < 0 || blocks[i].value >= logical.num_blocks) {
      return Status::invalid_argument(
          "cuda write_blocks: entry {} is block {}, outside the pool of {}", i, blocks[i].value,
          logical.num_blocks);
    }
  }
  if (blocks.empty()) return Status::ok();
  KVP_CUDA_RETURN_IF_ERROR(cudaSetDevice(runner_->device()));
  KVP_RETURN_IF_ERROR(runner_->flush_layer_waits());  // after copies ordered into the pool
  KVP_RETURN_IF_ERROR(reserve_staging(blocks.size() * device.block_size_bytes()));
  if (device.head_dim == logical.head_dim) {
    parallel_memcpy(staging_.data(), image.data(), image.size());
  } else {
    std::memset(staging_.data(), 0, blocks.size() * device.block_size_bytes());
    const size_t runs = blocks.size() * logical.num_layers * 2 * logical.num_kv_heads;
    copy_head_runs(image.data(), logical.head_dim, staging_.as<std::byte>(), device.head_dim, runs,
                   logical.block_size, logical.dtype);
  }
  KVP_RETURN_IF_ERROR(pools_[group].copy_blocks_from_host(staging_, blocks, runner_->stream()));
  return cuda_status(cudaStreamSynchronize(runner_->stream()), "cudaStreamSynchronize");
}

Status CudaForwardBackend::fill_kv_random(uint64_t seed) {
  KVP_CUDA_RETURN_IF_ERROR(cudaSetDevice(runner_->device()));
  KVP_RETURN_IF_ERROR(runner_->flush_layer_waits());
  for (size_t g = 0; g < pools_.size(); ++g) {
    const KvLayout& layout = pools_[g].layout();
    // 8-bit: the slab's bytes as f16 values in [-1, 1): codes and f16 scales both bounded (an
    // e4m3 NaN code among them widens to a finite value in the CUDA kernels)
    const int64_t count = is_kv8(layout.dtype) ? layout.size_elems() / 2 : layout.size_elems();
    KVP_RETURN_IF_ERROR(
        cuda_status(detail::launch_fill_uniform(pools_[g].slab(), layout.dtype == DType::BF16,
                                                count, seed + g, -1.0f, 1.0f, runner_->stream()),
                    "fill_uniform_kernel"));
  }
  return cuda_status(cudaStreamSynchronize(runner_->stream()), "cudaStreamSynchronize");
}

namespace {

// The communicators of one split model, destroyed after the last rank that uses them.
struct NcclComms {
  const NcclLibrary* nccl = nullptr;
  std::vector<ncclComm_t> comms;
  ~NcclComms() {
    for (ncclComm_t c : comms) nccl->destroy(c);
  }
};

using MakeRank =
    std::function<Result<std::unique_ptr<CudaModelRunner>>(TensorShard shard, int device)>;

// Ranks on devices first_device … first_device + n - 1, joined by NCCL (tensor_parallel.h).
Result<std::unique_ptr<ForwardBackend>> make_split(const ModelSpec& spec, int first_device,
                                                   int32_t n, const MakeRank& make_rank) {
  KVP_RETURN_IF_ERROR(check_tensor_parallel(spec, n));
  int count = 0;
  KVP_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  if (first_device < 0 || first_device + n > count) {
    return Status::invalid_argument(
        "tensor parallel {} from cuda:{}: needs GPUs {} to {}, this machine has {}", n,
        first_device, first_device, first_device + n - 1, count);
  }
  KVP_ASSIGN_OR_RETURN(const NcclLibrary* nccl, NcclLibrary::get());
  std::vector<int> devices(static_cast<size_t>(n));
  for (int32_t r = 0; r < n; ++r) devices[r] = first_device + r;
  auto comms = std::make_shared<NcclComms>();
  comms->nccl = nccl;
  KVP_ASSIGN_OR_RETURN(comms->comms, nccl->init_all(devices));
  // Decode-sized all-reduces (up to 256 tokens of hidden over 2 GPUs) go over peer memory where the
  // GPUs have peer access (PeerAllReduce, one kernel in NCCL's LL style; docs/perf/
  // tensor-parallel.md), the rest through NCCL; KVP_TP_ALL_REDUCE=nccl sends them all to NCCL.
  // Over more than 2 GPUs every rank pushes each float to every peer, and the one-shot kernel
  // loses to NCCL's ring at batch sizes: on 4 H200s 24.3 µs against 16.8 for 1 MB, 8.1 against
  // 10.6 for 64 KB (docs/perf/tensor-parallel.md run 9), so there it takes up to 64 KB only.
  std::shared_ptr<const PeerAllReduce> peer;
  const char* choice = std::getenv("KVP_TP_ALL_REDUCE");
  if (choice == nullptr || std::string(choice) != "nccl") {
    const int64_t capacity = n == 2 ? int64_t{256} * spec.hidden_size : int64_t{16384};
    Result<std::shared_ptr<PeerAllReduce>> made = PeerAllReduce::create(devices, capacity);
    if (made.is_ok()) peer = std::move(made).value();
  }
  auto gate = std::make_shared<RankGate>(n);
  std::vector<std::unique_ptr<ForwardBackend>> ranks;
  for (int32_t r = 0; r < n; ++r) {
    KVP_ASSIGN_OR_RETURN(std::unique_ptr<CudaModelRunner> runner, make_rank({r, n}, devices[r]));
    runner->set_all_reduce(
        nccl, comms->comms[r], [gate](bool ready) { return gate->arrive(ready); }, comms);
    if (peer != nullptr) runner->set_peer_all_reduce(peer, r);
    ranks.push_back(std::make_unique<CudaForwardBackend>(std::move(runner)));
  }
  return std::unique_ptr<ForwardBackend>(
      std::make_unique<TensorParallelBackend>(spec, std::move(ranks), gate));
}

}  // namespace

Result<std::unique_ptr<ForwardBackend>> make_cuda_backend(const ModelSpec& spec,
                                                          const WeightSource& source,
                                                          const LoadProgress& progress, int device,
                                                          int32_t tensor_parallel) {
  if (tensor_parallel > 1) {
    return make_split(spec, device, tensor_parallel, [&](TensorShard shard, int d) {
      const ShardedWeightSource sharded(source, spec, shard);
      return CudaModelRunner::load(shard_spec(spec, shard), sharded, progress, d);
    });
  }
  KVP_ASSIGN_OR_RETURN(std::unique_ptr<CudaModelRunner> runner,
                       CudaModelRunner::load(spec, source, progress, device));
  return std::unique_ptr<ForwardBackend>(new CudaForwardBackend(std::move(runner)));
}

Result<std::unique_ptr<ForwardBackend>> make_random_cuda_backend(const ModelSpec& spec,
                                                                 uint64_t seed, int device,
                                                                 int32_t tensor_parallel) {
  if (tensor_parallel > 1) {
    return make_split(spec, device, tensor_parallel, [&](TensorShard shard, int d) {
      return CudaModelRunner::random(spec, seed, d, shard);
    });
  }
  KVP_ASSIGN_OR_RETURN(std::unique_ptr<CudaModelRunner> runner,
                       CudaModelRunner::random(spec, seed, device));
  return std::unique_ptr<ForwardBackend>(new CudaForwardBackend(std::move(runner)));
}

}  // namespace kvp::cuda

// cuda::paged_attention: argument checks, the split-KV decision and the launches (see
// paged_attention.h). The kernels live in decode_attention.cu, prefill_attention.cu and
// sm90/prefill_attention_sm90.cu.
#include "backend/cuda/paged_attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/kernels.h"

namespace kvp::cuda {
namespace {

constexpr int32_t kDefaultMinKeysPerSplit = 32;
std::atomic<int32_t> g_min_keys_per_split{kDefaultMinKeysPerSplit};
std::atomic<PrefillKernel> g_prefill_kernel{PrefillKernel::Auto};
std::atomic<DecodeKernel> g_decode_kernel{DecodeKernel::Auto};
std::atomic<float> g_decode_split_factor{1.0f};

// Heads of one KV group handled by one decode CTA: the largest of 8, 4, 2, 1 dividing the group.
int32_t decode_heads_per_cta(int32_t group) {
  for (int32_t h : {8, 4, 2}) {
    if (group % h == 0) return h;
  }
  return 1;
}

Result<int32_t> sm_count() {
  int device = 0;
  KVP_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  int count = 0;
  KVP_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  return count;
}

// How the kernels read a pool of this dtype.
detail::KvFormat kv_format(DType dtype) {
  return dtype == DType::I8    ? detail::KvFormat::Int8
         : dtype == DType::FP8 ? detail::KvFormat::Fp8
                               : detail::KvFormat::Native;
}

// Keys a decode row attends to at most (the window's, when there is one).
int32_t decode_span(const AttentionParams& params, const AttentionBatch& batch) {
  return params.window > 0 ? std::min(batch.max_kv_len, params.window) : batch.max_kv_len;
}

// Decode CTAs of one split: a CTA per (sequence, KV head, chunk of heads_per_cta query heads).
int64_t decode_ctas_per_split(const AttentionParams& params, const AttentionBatch& batch,
                              const PagedKv& kv, int32_t heads_per_cta) {
  return int64_t{batch.num_seqs} * kv.num_kv_heads *
         (params.num_q_heads / kv.num_kv_heads / heads_per_cta);
}

// Decode CTAs resident on the device at once, from the occupancy of the kernel that will run.
int64_t decode_resident_ctas(const PagedKv& kv, int32_t heads_per_cta, int32_t num_sms,
                             bool native_on_mma) {
  return int64_t{detail::decode_ctas_per_sm(kv.dtype != DType::F16, kv_format(kv.dtype),
                                            kv.head_dim, heads_per_cta, native_on_mma)} *
         num_sms;
}

// Splits per sequence for decode: as many as keep all CTAs in one wave (as many CTAs as are
// resident at once, from the occupancy of the kernel that will run), never fewer than
// min_keys_per_split keys per split, and about 32 at most for contexts up to 8K (16 on the
// tensor-core kernel over 16-bit KV, which also splits a grid that already covers half the SMs
// only into splits of 512 keys or more).
// native_on_mma: 16-bit KV on the tensor-core kernel (where it covers the head dim).
int32_t decode_splits(const AttentionParams& params, const AttentionBatch& batch, const PagedKv& kv,
                      int32_t num_sms, bool native_on_mma) {
  const int32_t group = params.num_q_heads / kv.num_kv_heads;
  const int32_t heads_per_cta = decode_heads_per_cta(group);
  const int64_t ctas = decode_ctas_per_split(params, batch, kv, heads_per_cta);
  const int32_t span = decode_span(params, batch);
  const detail::KvFormat format = kv_format(kv.dtype);
  const bool mma16 = format == detail::KvFormat::Native &&
                     detail::decode_mma_covers(format, kv.head_dim, native_on_mma);
  const int64_t by_occupancy =
      decode_resident_ctas(kv, heads_per_cta, num_sms, native_on_mma) / std::max<int64_t>(ctas, 1);
  int64_t min_keys = g_min_keys_per_split.load(std::memory_order_relaxed);
  // Tensor-core kernel, one CTA or more per two SMs: the merge costs more than shorter splits
  // save below 512 keys a split (H100, batch 16 x 512: one split 17.3 us, two 18.4 us; batch 16 x
  // 4K: two splits of 2048 keys 96.9 us, one 98.5 us; docs/perf/attention-cuda.md)
  if (mma16 && 2 * ctas >= num_sms) min_keys = std::max<int64_t>(min_keys, 512);
  const int64_t by_length = span / min_keys;
  // Short contexts: past ~32 splits (per-lane kernel) or ~16 (tensor-core kernel) the merge costs
  // more than the shorter splits save (H100, batch 1 x 4K: per-lane 32 splits 16.0 us, 64 splits
  // 17.2 us; tensor-core 16 splits 13.0 us, 32 splits 13.9 us).
  const int64_t by_merge = std::max<int64_t>(mma16 ? 16 : 32, span / 256);
  const double factor = g_decode_split_factor.load(std::memory_order_relaxed);
  return static_cast<int32_t>(std::clamp<int64_t>(
      std::llround(static_cast<double>(std::min({by_occupancy, by_length, by_merge})) * factor), 1,
      detail::kMaxDecodeSplits));
}

// The decode kernel and split count of one call.
struct DecodePlan {
  bool native_on_mma = false;  // 16-bit KV on the tensor-core kernel
  int32_t splits = 1;
};

// Auto's shortest tensor-core split when the whole grid fits in one wave: below it (splits of 32
// keys) the per-lane kernel, whose CTAs start sooner, is faster. H100, graph us, tensor cores /
// per-lane: batch 1 x 256 (8 splits of 32) 8.47 / 8.05, 1 x 512 (16 of 32) 8.35 / 8.12, 2 x 512
// 9.62 / 9.08, 4 x 256 9.58 / 9.31; but 1 x 1024 (16 of 64) 8.55 / 9.33, 2 x 1024 10.44 / 13.75,
// 4 x 512 10.46 / 12.96, 8 x 256 (4 of 64) 10.18 / 12.95 (docs/perf/gpu-decode-routing.md).
constexpr int64_t kMinTensorCoreSplitKeys = 64;

DecodePlan plan_decode(const AttentionParams& params, const AttentionBatch& batch,
                       const PagedKv& kv, int32_t num_sms) {
  const DecodeKernel mode = g_decode_kernel.load(std::memory_order_relaxed);
  DecodePlan plan;
  plan.native_on_mma = mode != DecodeKernel::Lanes;
  plan.splits = decode_splits(params, batch, kv, num_sms, plan.native_on_mma);
  const detail::KvFormat format = kv_format(kv.dtype);
  if (mode != DecodeKernel::Auto || format != detail::KvFormat::Native ||
      !detail::decode_mma_covers(format, kv.head_dim, true)) {
    return plan;
  }
  const int32_t heads_per_cta = decode_heads_per_cta(params.num_q_heads / kv.num_kv_heads);
  const int64_t grid = decode_ctas_per_split(params, batch, kv, heads_per_cta) * plan.splits;
  if (decode_span(params, batch) < kMinTensorCoreSplitKeys * plan.splits &&
      grid <= decode_resident_ctas(kv, heads_per_cta, num_sms, true)) {
    plan.native_on_mma = false;
    plan.splits = decode_splits(params, batch, kv, num_sms, false);
  }
  return plan;
}

Status check_launchable(const AttentionParams& params, const AttentionBatch& batch,
                        const PagedKv& kv, const void* q, DType q_dtype, const void* out) {
  if (kv.dtype != DType::BF16 && kv.dtype != DType::F16 && !is_kv8(kv.dtype)) {
    return Status::unsupported(
        "cuda attention: KV dtype {} (bf16, f16, int8 and fp8 are supported)",
        dtype_name(kv.dtype));
  }
  if (is_kv8(kv.dtype) ? (q_dtype != DType::BF16 && q_dtype != DType::F16) : q_dtype != kv.dtype) {
    return Status::unsupported("cuda attention: q dtype {} with KV dtype {}", dtype_name(q_dtype),
                               dtype_name(kv.dtype));
  }
  if (is_kv8(kv.dtype) && kv.block_size % 8 != 0) {
    return Status::unsupported(
        "cuda attention: {} KV needs a block size that is a multiple of 8 (got {})",
        dtype_name(kv.dtype), kv.block_size);
  }
  if (kv.head_dim != 64 && kv.head_dim != 128 && kv.head_dim != 256) {
    return Status::unsupported("cuda attention: head dim {} (64, 128 and 256 are supported)",
                               kv.head_dim);
  }
  if (kv.num_kv_heads <= 0 || kv.block_size <= 0 || kv.num_blocks <= 0) {
    return Status::invalid_argument(
        "cuda attention: KV geometry must be positive (kv heads {}, block size {}, blocks {})",
        kv.num_kv_heads, kv.block_size, kv.num_blocks);
  }
  if (params.num_q_heads <= 0 || params.num_q_heads % kv.num_kv_heads != 0) {
    return Status::invalid_argument(
        "cuda attention: {} query heads is not a positive multiple of {} KV heads",
        params.num_q_heads, kv.num_kv_heads);
  }
  if (params.window < 0 || params.soft_cap < 0.0f || !std::isfinite(params.scale)) {
    return Status::invalid_argument("cuda attention: window {}, soft cap {}, scale {}",
                                    params.window, params.soft_cap, params.scale);
  }
  if (batch.num_seqs < 0 || batch.num_tokens < 0 || batch.max_q_len < 0 || batch.max_kv_len < 0 ||
      batch.max_blocks_per_seq < 0) {
    return Status::invalid_argument("cuda attention: negative batch size field");
  }
  if (batch.num_seqs > 65535) {
    return Status::unsupported("cuda attention: {} sequences in one batch (at most 65535)",
                               batch.num_seqs);
  }
  if (batch.num_seqs > 0 &&
      (batch.query_start == nullptr || batch.kv_lens == nullptr || batch.block_tables == nullptr)) {
    return Status::invalid_argument("cuda attention: batch metadata pointer is null");
  }
  if (batch.num_tokens > 0 &&
      (q == nullptr || out == nullptr || kv.k == nullptr || kv.v == nullptr)) {
    return Status::invalid_argument("cuda attention: q, out, K or V pointer is null");
  }
  return Status::ok();
}

detail::AttentionKernelArgs make_args(const AttentionParams& params, const AttentionBatch& batch,
                                      const PagedKv& kv, const void* q, void* out) {
  constexpr float kLog2e = 1.4426950408889634f;
  detail::AttentionKernelArgs a{};
  a.q = q;
  a.out = out;
  a.query_start = batch.query_start;
  a.kv_lens = batch.kv_lens;
  a.block_tables = batch.block_tables;
  a.max_blocks_per_seq = batch.max_blocks_per_seq;
  a.k = kv.k;
  a.v = kv.v;
  a.block_pitch = kv.block_pitch;
  a.block_size = kv.block_size;
  a.num_blocks = kv.num_blocks;
  a.block_shift = -1;
  if ((kv.block_size & (kv.block_size - 1)) == 0) {
    a.block_shift = 0;
    while ((1 << a.block_shift) < kv.block_size) ++a.block_shift;
  }
  a.num_kv_heads = kv.num_kv_heads;
  a.num_q_heads = params.num_q_heads;
  a.group = params.num_q_heads / kv.num_kv_heads;
  if (params.soft_cap > 0.0f) {
    a.qk_mul = params.scale / params.soft_cap;
    a.cap_log2 = params.soft_cap * kLog2e;
  } else {
    a.qk_mul = params.scale * kLog2e;
    a.cap_log2 = 0.0f;
  }
  a.window = params.window;
  a.num_seqs = batch.num_seqs;
  a.sinks = params.sinks;
  return a;
}

// Whether the current device is compute capability 9.0, the one the sm_90a kernels run on.
bool device_is_sm90() {
  int device = 0;
  int major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    return false;
  }
  return major == 9 && minor == 0;
}

bool hopper_prefill(detail::KvFormat kv, int32_t head_dim) {
  return g_prefill_kernel.load(std::memory_order_relaxed) == PrefillKernel::Auto &&
         detail::prefill_attention_sm90_covers(kv, head_dim) && device_is_sm90();
}

}  // namespace

void set_prefill_kernel(PrefillKernel kernel) {
  g_prefill_kernel.store(kernel, std::memory_order_relaxed);
}

bool uses_hopper_prefill(DType kv_dtype, int32_t head_dim) {
  return hopper_prefill(kv_format(kv_dtype), head_dim);
}

void set_decode_kernel(DecodeKernel kernel) {
  g_decode_kernel.store(kernel, std::memory_order_relaxed);
}

bool uses_tensor_core_decode(DType kv_dtype, int32_t head_dim) {
  return detail::decode_mma_covers(
      kv_format(kv_dtype), head_dim,
      g_decode_kernel.load(std::memory_order_relaxed) != DecodeKernel::Lanes);
}

bool decode_on_tensor_cores(const AttentionParams& params, const AttentionBatch& batch,
                            const PagedKv& kv) {
  Result<int32_t> sms = sm_count();
  if (!sms.is_ok() || params.num_q_heads <= 0 || kv.num_kv_heads <= 0) return false;
  const DecodePlan plan = plan_decode(params, batch, kv, *sms);
  return detail::decode_mma_covers(kv_format(kv.dtype), kv.head_dim, plan.native_on_mma);
}

void set_decode_split_factor(float factor) {
  g_decode_split_factor.store(factor > 0.0f ? factor : 1.0f, std::memory_order_relaxed);
}

void set_decode_min_keys_per_split(int32_t min_keys) {
  g_min_keys_per_split.store(min_keys > 0 ? min_keys : kDefaultMinKeysPerSplit,
                             std::memory_order_relaxed);
}

Status AttentionWorkspace::reserve(size_t size_bytes) {
  if (buffer_.size_bytes() >= size_bytes) return Status::ok();
  buffer_ = DeviceBuffer();
  KVP_ASSIGN_OR_RETURN(buffer_, DeviceBuffer::allocate(size_bytes + size_bytes / 2));
  return Status::ok();
}

size_t attention_workspace_bytes(const AttentionParams& params, const AttentionBatch& batch,
                                 const PagedKv& kv) {
  if (batch.num_seqs == 0 || kv.num_kv_heads <= 0 || params.num_q_heads <= 0) return 0;
  Result<int32_t> sms = sm_count();
  if (!sms.is_ok()) return 0;
  const int32_t splits = plan_decode(params, batch, kv, *sms).splits;
  if (splits <= 1) return 0;
  return static_cast<size_t>(batch.num_seqs) * params.num_q_heads * splits *
         (static_cast<size_t>(kv.head_dim) + 2) * sizeof(float);
}

Status paged_attention(const AttentionParams& params, const AttentionBatch& batch,
                       const PagedKv& kv, const void* q, DType q_dtype, void* out,
                       AttentionWorkspace& workspace, cudaStream_t stream) {
  KVP_RETURN_IF_ERROR(check_launchable(params, batch, kv, q, q_dtype, out));
  if (batch.num_seqs == 0 || batch.num_tokens == 0) return Status::ok();
  detail::AttentionKernelArgs args = make_args(params, batch, kv, q, out);
  const bool bf16 = q_dtype == DType::BF16;
  const detail::KvFormat kv_kind = kv_format(kv.dtype);
  const int32_t heads_per_cta = decode_heads_per_cta(args.group);
  args.head_chunks = args.group / heads_per_cta;
  KVP_ASSIGN_OR_RETURN(const int32_t num_sms, sm_count());
  const DecodePlan plan = plan_decode(params, batch, kv, num_sms);
  args.num_splits = plan.splits;
  if (args.num_splits > 1) {
    const size_t rows = static_cast<size_t>(batch.num_seqs) * params.num_q_heads * args.num_splits;
    const size_t acc_bytes = rows * kv.head_dim * sizeof(float);
    KVP_RETURN_IF_ERROR(workspace.reserve(acc_bytes + rows * 2 * sizeof(float)));
    args.partial_acc = static_cast<float*>(workspace.data());
    args.partial_ml = reinterpret_cast<float*>(static_cast<char*>(workspace.data()) + acc_bytes);
  }
  KVP_RETURN_IF_ERROR(
      cuda_status(detail::launch_decode_attention(args, bf16, kv_kind, kv.head_dim, heads_per_cta,
                                                  plan.native_on_mma, stream),
                  "decode_attention_kernel"));
  if (args.num_splits > 1) {
    KVP_RETURN_IF_ERROR(cuda_status(detail::launch_merge_splits(args, bf16, kv.head_dim, stream),
                                    "merge_splits_kernel"));
  }
  if (batch.max_q_len >= 2) {
    if (hopper_prefill(kv_kind, kv.head_dim)) {
      KVP_RETURN_IF_ERROR(
          cuda_status(detail::launch_prefill_attention_sm90(args, bf16, kv_kind, kv.head_dim,
                                                            batch.max_q_len, stream),
                      "prefill_attention_sm90_kernel"));
    } else {
      KVP_RETURN_IF_ERROR(
          cuda_status(detail::launch_prefill_attention(args, bf16, kv_kind, kv.head_dim,
                                                       batch.max_q_len, stream),
                      "prefill_attention_kernel"));
    }
  }
  return Status::ok();
}

Status paged_attention(const AttentionParams& params, const AttentionBatch& batch,
                       const PagedKv& kv, const void* q, DType q_dtype, void* out,
                       cudaStream_t stream) {
  thread_local AttentionWorkspace workspace;
  return paged_attention(params, batch, kv, q, q_dtype, out, workspace, stream);
}

Status paged_attention_checked(const AttentionParams& params, const AttentionBatch& batch,
                               const AttentionBatch& host_batch, const PagedKv& kv, const void* q,
                               DType q_dtype, void* out, AttentionWorkspace& workspace,
                               cudaStream_t stream) {
  if (host_batch.num_seqs != batch.num_seqs || host_batch.num_tokens != batch.num_tokens ||
      host_batch.max_q_len != batch.max_q_len || host_batch.max_kv_len != batch.max_kv_len ||
      host_batch.max_blocks_per_seq != batch.max_blocks_per_seq) {
    return Status::invalid_argument(
        "cuda attention: the host copy of the batch metadata has other sizes than the batch");
  }
  KVP_RETURN_IF_ERROR(check_attention_args(params, host_batch, kv));
  return paged_attention(params, batch, kv, q, q_dtype, out, workspace, stream);
}

}  // namespace kvp::cuda

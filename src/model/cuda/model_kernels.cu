// The CUDA model runner's fused elementwise and per-row kernels (launchers in model_kernels.h).
// All of them are memory-bound and tiny next to the GEMMs; they exist to keep the intermediates
// in f32 where precision matters (residual stream, norms, rope) and to fuse what would otherwise
// be several passes over the same row into one launch.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>

#include "backend/cuda/dependent_launch.cuh"
#include "model/cuda/model_kernels.h"
#include "model/cuda/peer_ll.cuh"

namespace kvp::cuda::detail {
namespace {

constexpr int kRowThreads = 256;

__device__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__global__ void embed_kernel(const __nv_bfloat16* table, const int32_t* token_ids, int32_t hidden,
                             float scale, float* x) {
  const int64_t t = blockIdx.x;
  const __nv_bfloat16* row = table + int64_t{token_ids[t]} * hidden;
  for (int32_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    x[t * hidden + i] = __bfloat162float(row[i]) * scale;
  }
}

// The row kernels below give one CTA to a row and keep the row in registers: each thread holds
// up to kRowMaxVecs float4s (hidden <= 4 * 1024 * kRowMaxVecs), so a row is read once, every
// load of a thread is issued before the first reduction, and a decode step's single row finishes
// in a few memory latencies instead of a loop of dependent ones.
constexpr int kRowMaxThreads = 1024;
constexpr int kRowMaxVecs = 4;

// Sum over the CTA (any multiple of 32 threads up to 1024); every thread gets the result.
__device__ float block_sum_any(float v, float* scratch /* [32] */) {
  v = warp_sum(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  return warp_sum(lane < static_cast<int>(blockDim.x / 32) ? scratch[lane] : 0.0f);
}

__device__ float4 load4(const float* p, int32_t j) { return reinterpret_cast<const float4*>(p)[j]; }
__device__ float dot4(float4 a, float4 b) { return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w; }
__device__ float4 scale4(float4 a, float s, float4 w) {
  return make_float4(a.x * s * w.x, a.y * s * w.y, a.z * s * w.z, a.w * s * w.w);
}
__device__ void store_bf16x4(__nv_bfloat16* out, int32_t j, float4 v) {
  auto* o = reinterpret_cast<__nv_bfloat162*>(out) + 2 * int64_t{j};
  o[0] = __floats2bfloat162_rn(v.x, v.y);
  o[1] = __floats2bfloat162_rn(v.z, v.w);
}

template <int kVecs>
__global__ void __launch_bounds__(kRowMaxThreads)
    rms_norm_rows_kernel(const float* __restrict__ x, const int32_t* __restrict__ rows,
                         int32_t hidden, const float* __restrict__ w, float eps,
                         __nv_bfloat16* __restrict__ out) {
  allow_dependents();  // the product that reads `out` may start loading its weights
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  const float* in = x + int64_t{rows != nullptr ? rows[r] : static_cast<int32_t>(r)} * hidden;
  const int32_t vecs = hidden / 4;
  float4 v[kVecs];
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    const int32_t j = threadIdx.x + k * blockDim.x;
    v[k] = j < vecs ? load4(in, j) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    ss += dot4(v[k], v[k]);
  }
  const float inv = rsqrtf(block_sum_any(ss, scratch) / hidden + eps);
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    const int32_t j = threadIdx.x + k * blockDim.x;
    if (j < vecs) store_bf16x4(out + r * hidden, j, scale4(v[k], inv, load4(w, j)));
  }
}

template <int kVecs>
__global__ void __launch_bounds__(kRowMaxThreads)
    residual_norm_kernel(float* __restrict__ x, const float* __restrict__ proj,
                         const float* __restrict__ post_w, const float* __restrict__ next_w,
                         int32_t hidden, float eps, __nv_bfloat16* __restrict__ xn,
                         PeerAllReduceArgs reduce) {
  wait_for_prerequisites();  // launched as a dependent of the product that wrote proj
  allow_dependents();        // the product that reads `xn` may start loading its weights
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  float* xr = x + r * hidden;
  const float* pr = proj + r * hidden;
  const int32_t vecs = hidden / 4;
  const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float4 p[kVecs], s[kVecs];
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    const int32_t j = threadIdx.x + k * blockDim.x;
    p[k] = j < vecs ? load4(pr, j) : zero;
    s[k] = j < vecs ? load4(xr, j) : zero;
  }
  if (reduce.num_ranks > 1) {
    // proj is this GPU's partial sum: the all-reduce over the peers first (row r is chunk r,
    // its lines (r * hidden) / 2 on)
    __shared__ uint32_t epoch_shared;
    if (threadIdx.x == 0) epoch_shared = ++reduce.counters[r];
    __syncthreads();
    const uint32_t epoch = epoch_shared;
    const int64_t region = ll_region(reduce, epoch);
    const int64_t row_line = r * hidden / 2;
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int32_t j = threadIdx.x + k * blockDim.x;
      if (j >= vecs) continue;
      ll_push(reduce, region, row_line + 2 * j, make_float2(p[k].x, p[k].y), epoch);
      ll_push(reduce, region, row_line + 2 * j + 1, make_float2(p[k].z, p[k].w), epoch);
    }
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int32_t j = threadIdx.x + k * blockDim.x;
      if (j >= vecs) continue;
      const float2 lo =
          ll_pull_sum(reduce, region, row_line + 2 * j, make_float2(p[k].x, p[k].y), epoch);
      const float2 hi =
          ll_pull_sum(reduce, region, row_line + 2 * j + 1, make_float2(p[k].z, p[k].w), epoch);
      p[k] = make_float4(lo.x, lo.y, hi.x, hi.y);
    }
  }
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kVecs; ++k) ss += dot4(p[k], p[k]);
  if (post_w != nullptr) {
    const float post_inv = rsqrtf(block_sum_any(ss, scratch) / hidden + eps);
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int32_t j = threadIdx.x + k * blockDim.x;
      if (j < vecs) p[k] = scale4(p[k], post_inv, load4(post_w, j));
    }
  }
  ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    const int32_t j = threadIdx.x + k * blockDim.x;
    s[k] = make_float4(s[k].x + p[k].x, s[k].y + p[k].y, s[k].z + p[k].z, s[k].w + p[k].w);
    if (j < vecs) reinterpret_cast<float4*>(xr)[j] = s[k];
    ss += dot4(s[k], s[k]);
  }
  if (next_w == nullptr) return;
  const float inv = rsqrtf(block_sum_any(ss, scratch) / hidden + eps);
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    const int32_t j = threadIdx.x + k * blockDim.x;
    if (j < vecs) store_bf16x4(xn + r * hidden, j, scale4(s[k], inv, load4(next_w, j)));
  }
}

// Threads and float4s per thread for a row of `hidden` floats; false if the row kernels cannot
// take it (hidden not a multiple of 4, or above 4 * kRowMaxThreads * kRowMaxVecs).
bool row_shape(int32_t hidden, int* threads, int* vecs_per_thread) {
  if (hidden <= 0 || hidden % 4 != 0) return false;
  const int32_t vecs = hidden / 4;
  *threads = vecs < kRowMaxThreads ? (vecs + 31) / 32 * 32 : kRowMaxThreads;
  *vecs_per_thread = (vecs + *threads - 1) / *threads;
  return *vecs_per_thread <= kRowMaxVecs;
}

template <typename T>
__device__ T from_float(float v);
template <>
__device__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}

// One warp per head; a token's heads are spread over gridDim.y CTAs of kWarps heads each, so a
// decode step's few tokens still occupy many SMs. The head's vector is staged in shared memory so
// that rope can read the partner lane of each pair whatever head_dim is (pairs straddle lanes when
// head_dim < 64).
template <typename T>
__global__ void qkv_post_kernel(QkvPostArgs a) {
  wait_for_prerequisites();  // launched as a dependent of the qkv product
  constexpr int kWarps = kRowThreads / 32;
  __shared__ float stage[kWarps][256];
  const int32_t t = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t num_heads = a.num_q_heads + 2 * a.num_kv_heads;
  const int32_t D = a.head_dim, Dp = a.padded_head_dim;
  const float* row = a.qkv + int64_t{t} * num_heads * D;
  const int32_t pos = a.positions[t];
  float* s = stage[warp];
  for (int32_t h = blockIdx.y * kWarps + warp; h < num_heads; h += kWarps * gridDim.y) {
    const bool is_q = h < a.num_q_heads;
    const bool is_v = h >= a.num_q_heads + a.num_kv_heads;
    float ss = 0.0f;
    for (int32_t d = lane; d < D; d += 32) {
      float v = row[h * D + d];
      if (a.bias != nullptr) v += a.bias[h * D + d];
      s[d] = v;
      ss += v * v;
    }
    const float* norm_w = is_v ? nullptr : (is_q ? a.q_norm : a.k_norm);
    if (norm_w != nullptr) {
      const float inv = rsqrtf(warp_sum(ss) / D + a.eps);
      for (int32_t d = lane; d < D; d += 32) s[d] = s[d] * inv * norm_w[d];
    }
    __syncwarp();
    T* out;
    if (is_q) {
      out = static_cast<T*>(a.q) + (int64_t{t} * a.num_q_heads + h) * Dp;
    } else if (!is_v) {
      out = static_cast<T*>(a.k) + (int64_t{t} * a.num_kv_heads + (h - a.num_q_heads)) * Dp;
    } else {
      out = static_cast<T*>(a.v) +
            (int64_t{t} * a.num_kv_heads + (h - a.num_q_heads - a.num_kv_heads)) * Dp;
    }
    for (int32_t d = lane; d < Dp; d += 32) {
      float v = 0.0f;
      if (d < D) {
        v = s[d];
        if (!is_v && d < 2 * a.rope_pairs) {
          // pair index i and this element's role (first or second of the pair)
          const int32_t i = a.interleaved ? d / 2 : (d < a.rope_pairs ? d : d - a.rope_pairs);
          const bool first = a.interleaved ? (d % 2 == 0) : (d < a.rope_pairs);
          const int32_t partner = a.interleaved ? (first ? d + 1 : d - 1)
                                                : (first ? d + a.rope_pairs : d - a.rope_pairs);
          // the angle is a float32 product, as in Hugging Face's rotary embedding
          float sn, cs;
          sincosf(static_cast<float>(pos) * a.inv_freq[i], &sn, &cs);
          const float other = s[partner];
          v = first ? v * cs - other * sn : v * cs + other * sn;
        }
      }
      out[d] = from_float<T>(v);
    }
    __syncwarp();  // the stage is reused by the warp's next head
  }
}

// Running (max, first index of it, sum of exp(l - max)) of a part of a row; merged exactly
// like the split-KV softmax states of attention. idx == INT_MAX: nothing seen (-inf max).
struct RowState {
  float m;
  float s;
  int32_t idx;
};

__device__ void row_state_add(RowState& st, float x, int32_t i) {
  if (x > st.m) {  // false for NaN: NaN never becomes the maximum
    st.s = (st.idx == INT_MAX ? 0.0f : st.s * expf(st.m - x)) + 1.0f;
    st.m = x;
    st.idx = i;
  } else if (st.idx != INT_MAX) {
    st.s += expf(x - st.m);
  }
}

__device__ RowState row_state_merge(RowState a, RowState b) {
  if (b.idx == INT_MAX) return a;
  if (a.idx == INT_MAX) return b;
  const bool b_wins = b.m > a.m || (b.m == a.m && b.idx < a.idx);
  const RowState& w = b_wins ? b : a;
  const RowState& l = b_wins ? a : b;
  return {w.m, w.s + l.s * expf(l.m - w.m), w.idx};
}

__device__ RowState row_state_shfl(RowState st, int offset) {
  return {__shfl_xor_sync(0xffffffffu, st.m, offset), __shfl_xor_sync(0xffffffffu, st.s, offset),
          __shfl_xor_sync(0xffffffffu, st.idx, offset)};
}

// One CTA of kSummaryThreads per row, one pass over it (float4 loads when kVec4: many loads in
// flight per thread, which a decode step's few rows need to reach the memory system's rate).
constexpr int kSummaryThreads = 1024;

template <bool kVec4>
__global__ void __launch_bounds__(kSummaryThreads)
    row_summary_kernel(const float* __restrict__ logits, int32_t vocab,
                       RowSummary* __restrict__ summaries) {
  wait_for_prerequisites();  // launched as a dependent of the lm-head product
  __shared__ RowState partial[kSummaryThreads / 32];
  const float* row = logits + int64_t{blockIdx.x} * vocab;
  RowState st{-__int_as_float(0x7f800000), 0.0f, INT_MAX};
  if constexpr (kVec4) {
    const auto* row4 = reinterpret_cast<const float4*>(row);
    for (int32_t j = threadIdx.x; j < vocab / 4; j += kSummaryThreads) {
      const float4 v = row4[j];
      row_state_add(st, v.x, 4 * j);
      row_state_add(st, v.y, 4 * j + 1);
      row_state_add(st, v.z, 4 * j + 2);
      row_state_add(st, v.w, 4 * j + 3);
    }
  } else {
    for (int32_t i = threadIdx.x; i < vocab; i += kSummaryThreads) row_state_add(st, row[i], i);
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    st = row_state_merge(st, row_state_shfl(st, offset));
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) partial[warp] = st;
  __syncthreads();
  if (warp == 0) {
    st = partial[lane];  // kSummaryThreads / 32 == 32 warps
    for (int offset = 16; offset > 0; offset >>= 1) {
      st = row_state_merge(st, row_state_shfl(st, offset));
    }
    if (lane == 0) {
      summaries[blockIdx.x] = {st.idx == INT_MAX ? 0 : st.idx, st.m, st.m + logf(st.s)};
    }
  }
}

template <bool kGelu>
__global__ void gated_activation_kernel(const __nv_bfloat16* gate_up, int64_t num_rows, int32_t dim,
                                        __nv_bfloat16* out) {
  wait_for_prerequisites();  // launched as a dependent of the gate_up product
  allow_dependents();        // the down product may start loading its weights
  const int64_t count = num_rows * dim;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / dim, c = i % dim;
    const float g = __bfloat162float(gate_up[r * 2 * dim + c]);
    const float u = __bfloat162float(gate_up[r * 2 * dim + dim + c]);
    float a;
    if constexpr (kGelu) {
      const float k = 0.7978845608028654f;  // sqrt(2 / pi)
      a = 0.5f * g * (1.0f + tanhf(k * (g + 0.044715f * g * g * g)));
    } else {
      a = g / (1.0f + expf(-g));
    }
    out[i] = __float2bfloat16_rn(a * u);
  }
}

__global__ void soft_cap_kernel(float* x, int64_t count, float cap) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    x[i] = cap * tanhf(x[i] / cap);
  }
}

__global__ void add_row_bias_kernel(float* rows, int32_t width, int32_t stride, int64_t count,
                                    const float* bias) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    rows[i / width * stride + i % width] += bias[i % width];
  }
}

__global__ void f16_to_bf16_kernel(const __half* in, int64_t count, __nv_bfloat16* out) {
  wait_for_prerequisites();  // launched as a dependent of the attention's merge
  allow_dependents();        // the o product may start loading its weights
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = __float2bfloat16_rn(__half2float(in[i]));
  }
}

unsigned grid_for(int64_t count) {
  const int64_t blocks = (count + kRowThreads - 1) / kRowThreads;
  return static_cast<unsigned>(blocks < 8192 ? (blocks > 0 ? blocks : 1) : 8192);
}

}  // namespace

cudaError_t launch_embed(const void* table, const int32_t* token_ids, int32_t num_tokens,
                         int32_t hidden, float scale, float* x, cudaStream_t stream) {
  if (num_tokens == 0) return cudaGetLastError();
  embed_kernel<<<num_tokens, kRowThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(table),
                                                       token_ids, hidden, scale, x);
  return cudaGetLastError();
}

cudaError_t launch_rms_norm_rows(const float* x, const int32_t* rows, int32_t num_rows,
                                 int32_t hidden, const float* w, float eps, void* out,
                                 cudaStream_t stream) {
  int threads = 0, vecs = 0;
  if (!row_shape(hidden, &threads, &vecs)) return cudaErrorInvalidValue;
  if (num_rows == 0) return cudaGetLastError();
  auto* o = static_cast<__nv_bfloat16*>(out);
  switch (vecs) {
    case 1:
      rms_norm_rows_kernel<1><<<num_rows, threads, 0, stream>>>(x, rows, hidden, w, eps, o);
      break;
    case 2:
      rms_norm_rows_kernel<2><<<num_rows, threads, 0, stream>>>(x, rows, hidden, w, eps, o);
      break;
    case 3:
      rms_norm_rows_kernel<3><<<num_rows, threads, 0, stream>>>(x, rows, hidden, w, eps, o);
      break;
    default:
      rms_norm_rows_kernel<4><<<num_rows, threads, 0, stream>>>(x, rows, hidden, w, eps, o);
      break;
  }
  return cudaGetLastError();
}

cudaError_t launch_residual_norm(float* x, const float* proj, const float* post_w,
                                 const float* next_w, int32_t num_rows, int32_t hidden, float eps,
                                 void* xn, cudaStream_t stream, const PeerAllReduceArgs* reduce) {
  const PeerAllReduceArgs ar = reduce != nullptr ? *reduce : PeerAllReduceArgs{};
  int threads = 0, vecs = 0;
  if (!row_shape(hidden, &threads, &vecs)) return cudaErrorInvalidValue;
  if (num_rows == 0) return cudaGetLastError();
  auto* o = static_cast<__nv_bfloat16*>(xn);
  switch (vecs) {
    case 1:
      return launch_dependent(true, residual_norm_kernel<1>, dim3(num_rows), dim3(threads), 0,
                              stream, x, proj, post_w, next_w, hidden, eps, o, ar);
    case 2:
      return launch_dependent(true, residual_norm_kernel<2>, dim3(num_rows), dim3(threads), 0,
                              stream, x, proj, post_w, next_w, hidden, eps, o, ar);
    case 3:
      return launch_dependent(true, residual_norm_kernel<3>, dim3(num_rows), dim3(threads), 0,
                              stream, x, proj, post_w, next_w, hidden, eps, o, ar);
    default:
      return launch_dependent(true, residual_norm_kernel<4>, dim3(num_rows), dim3(threads), 0,
                              stream, x, proj, post_w, next_w, hidden, eps, o, ar);
  }
  return cudaGetLastError();
}

bool row_kernels_support(int32_t hidden) {
  int threads = 0, vecs = 0;
  return row_shape(hidden, &threads, &vecs);
}

cudaError_t launch_qkv_post(const QkvPostArgs& args, cudaStream_t stream) {
  if (args.num_tokens == 0) return cudaGetLastError();
  if (args.head_dim > 256 || args.padded_head_dim < args.head_dim) return cudaErrorInvalidValue;
  const int32_t num_heads = args.num_q_heads + 2 * args.num_kv_heads;
  const dim3 grid(static_cast<unsigned>(args.num_tokens),
                  static_cast<unsigned>((num_heads + kRowThreads / 32 - 1) / (kRowThreads / 32)));
  if (args.out_bf16) {
    return launch_dependent(true, qkv_post_kernel<__nv_bfloat16>, grid, dim3(kRowThreads), 0,
                            stream, args);
  }
  return launch_dependent(true, qkv_post_kernel<__half>, grid, dim3(kRowThreads), 0, stream, args);
}

cudaError_t launch_gated_activation(const void* gate_up, int64_t num_rows, int32_t dim, bool gelu,
                                    void* out, cudaStream_t stream) {
  const int64_t count = num_rows * dim;
  if (count == 0) return cudaGetLastError();
  const auto* in = static_cast<const __nv_bfloat16*>(gate_up);
  auto* o = static_cast<__nv_bfloat16*>(out);
  return launch_dependent(
      true, gelu ? gated_activation_kernel<true> : gated_activation_kernel<false>,
      dim3(grid_for(count)), dim3(kRowThreads), 0, stream, in, num_rows, dim, o);
}

cudaError_t launch_row_summary(const float* logits, int32_t num_rows, int32_t vocab,
                               RowSummary* summaries, cudaStream_t stream) {
  if (num_rows == 0) return cudaGetLastError();
  // rows start 16-byte aligned when vocab % 4 == 0
  return launch_dependent(
      true, vocab % 4 == 0 ? row_summary_kernel<true> : row_summary_kernel<false>, dim3(num_rows),
      dim3(kSummaryThreads), 0, stream, logits, vocab, summaries);
}

cudaError_t launch_soft_cap(float* x, int64_t count, float cap, cudaStream_t stream) {
  if (count == 0) return cudaGetLastError();
  soft_cap_kernel<<<grid_for(count), kRowThreads, 0, stream>>>(x, count, cap);
  return cudaGetLastError();
}

cudaError_t launch_add_row_bias(float* rows, int64_t num_rows, int32_t width, int32_t stride,
                                const float* bias, cudaStream_t stream) {
  if (width <= 0 || stride < width) return cudaErrorInvalidValue;
  const int64_t count = num_rows * width;
  if (count == 0) return cudaGetLastError();
  add_row_bias_kernel<<<grid_for(count), kRowThreads, 0, stream>>>(rows, width, stride, count,
                                                                   bias);
  return cudaGetLastError();
}

cudaError_t launch_f16_to_bf16(const void* in, int64_t count, void* out, cudaStream_t stream) {
  if (count == 0) return cudaGetLastError();
  return launch_dependent(true, f16_to_bf16_kernel, dim3(grid_for(count)), dim3(kRowThreads), 0,
                          stream, static_cast<const __half*>(in), count,
                          static_cast<__nv_bfloat16*>(out));
}

}  // namespace kvp::cuda::detail

// The CUDA model runner's fused elementwise and per-row kernels (launchers in model_kernels.h).
// All of them are memory-bound and tiny next to the GEMMs; they exist to keep the intermediates
// in f32 where precision matters (residual stream, norms, rope) and to fuse what would otherwise
// be several passes over the same row into one launch.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "model/cuda/model_kernels.h"

namespace kvp::cuda::detail {
namespace {

constexpr int kRowThreads = 256;

__device__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum over the CTA (kRowThreads threads); every thread gets the result.
__device__ float block_sum(float v, float* scratch) {
  v = warp_sum(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kRowThreads / 32; ++w) total += scratch[w];
  return total;
}

__global__ void embed_kernel(const __nv_bfloat16* table, const int32_t* token_ids, int32_t hidden,
                             float scale, float* x) {
  const int64_t t = blockIdx.x;
  const __nv_bfloat16* row = table + int64_t{token_ids[t]} * hidden;
  for (int32_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    x[t * hidden + i] = __bfloat162float(row[i]) * scale;
  }
}

__global__ void rms_norm_rows_kernel(const float* x, const int32_t* rows, int32_t hidden,
                                     const float* w, float eps, __nv_bfloat16* out) {
  __shared__ float scratch[kRowThreads / 32];
  const int64_t r = blockIdx.x;
  const float* in = x + int64_t{rows != nullptr ? rows[r] : static_cast<int32_t>(r)} * hidden;
  float ss = 0.0f;
  for (int32_t i = threadIdx.x; i < hidden; i += kRowThreads) ss += in[i] * in[i];
  const float inv = rsqrtf(block_sum(ss, scratch) / hidden + eps);
  for (int32_t i = threadIdx.x; i < hidden; i += kRowThreads) {
    out[r * hidden + i] = __float2bfloat16_rn(in[i] * inv * w[i]);
  }
}

__global__ void residual_norm_kernel(float* x, const float* proj, const float* post_w,
                                     const float* next_w, int32_t hidden, float eps,
                                     __nv_bfloat16* xn) {
  __shared__ float scratch[kRowThreads / 32];
  const int64_t r = blockIdx.x;
  float* xr = x + r * hidden;
  const float* pr = proj + r * hidden;
  float post_inv = 1.0f;
  if (post_w != nullptr) {
    float ss = 0.0f;
    for (int32_t i = threadIdx.x; i < hidden; i += kRowThreads) ss += pr[i] * pr[i];
    post_inv = rsqrtf(block_sum(ss, scratch) / hidden + eps);
  }
  float ss = 0.0f;
  for (int32_t i = threadIdx.x; i < hidden; i += kRowThreads) {
    const float v = post_w != nullptr ? pr[i] * post_inv * post_w[i] : pr[i];
    const float sum = xr[i] + v;
    xr[i] = sum;
    ss += sum * sum;
  }
  if (next_w == nullptr) return;
  const float inv = rsqrtf(block_sum(ss, scratch) / hidden + eps);
  // each thread re-reads only the elements it wrote itself: no barrier needed for x
  for (int32_t i = threadIdx.x; i < hidden; i += kRowThreads) {
    xn[r * hidden + i] = __float2bfloat16_rn(xr[i] * inv * next_w[i]);
  }
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

// One CTA per token, one warp per head. The head's vector is staged in shared memory so that
// rope can read the partner lane of each pair whatever head_dim is (pairs straddle lanes when
// head_dim < 64).
template <typename T>
__global__ void qkv_post_kernel(QkvPostArgs a) {
  constexpr int kWarps = kRowThreads / 32;
  __shared__ float stage[kWarps][256];
  const int32_t t = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t num_heads = a.num_q_heads + 2 * a.num_kv_heads;
  const int32_t D = a.head_dim, Dp = a.padded_head_dim;
  const float* row = a.qkv + int64_t{t} * num_heads * D;
  const int32_t pos = a.positions[t];
  float* s = stage[warp];
  for (int32_t h = warp; h < num_heads; h += kWarps) {
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

template <bool kGelu>
__global__ void gated_activation_kernel(const __nv_bfloat16* gate_up, int64_t num_rows, int32_t dim,
                                        __nv_bfloat16* out) {
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

__global__ void f16_to_bf16_kernel(const __half* in, int64_t count, __nv_bfloat16* out) {
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
  if (num_rows == 0) return cudaGetLastError();
  rms_norm_rows_kernel<<<num_rows, kRowThreads, 0, stream>>>(x, rows, hidden, w, eps,
                                                             static_cast<__nv_bfloat16*>(out));
  return cudaGetLastError();
}

cudaError_t launch_residual_norm(float* x, const float* proj, const float* post_w,
                                 const float* next_w, int32_t num_rows, int32_t hidden, float eps,
                                 void* xn, cudaStream_t stream) {
  if (num_rows == 0) return cudaGetLastError();
  residual_norm_kernel<<<num_rows, kRowThreads, 0, stream>>>(x, proj, post_w, next_w, hidden, eps,
                                                             static_cast<__nv_bfloat16*>(xn));
  return cudaGetLastError();
}

cudaError_t launch_qkv_post(const QkvPostArgs& args, cudaStream_t stream) {
  if (args.num_tokens == 0) return cudaGetLastError();
  if (args.head_dim > 256 || args.padded_head_dim < args.head_dim) return cudaErrorInvalidValue;
  if (args.out_bf16) {
    qkv_post_kernel<__nv_bfloat16><<<args.num_tokens, kRowThreads, 0, stream>>>(args);
  } else {
    qkv_post_kernel<__half><<<args.num_tokens, kRowThreads, 0, stream>>>(args);
  }
  return cudaGetLastError();
}

cudaError_t launch_gated_activation(const void* gate_up, int64_t num_rows, int32_t dim, bool gelu,
                                    void* out, cudaStream_t stream) {
  const int64_t count = num_rows * dim;
  if (count == 0) return cudaGetLastError();
  const auto* in = static_cast<const __nv_bfloat16*>(gate_up);
  auto* o = static_cast<__nv_bfloat16*>(out);
  if (gelu) {
    gated_activation_kernel<true>
        <<<grid_for(count), kRowThreads, 0, stream>>>(in, num_rows, dim, o);
  } else {
    gated_activation_kernel<false>
        <<<grid_for(count), kRowThreads, 0, stream>>>(in, num_rows, dim, o);
  }
  return cudaGetLastError();
}

cudaError_t launch_soft_cap(float* x, int64_t count, float cap, cudaStream_t stream) {
  if (count == 0) return cudaGetLastError();
  soft_cap_kernel<<<grid_for(count), kRowThreads, 0, stream>>>(x, count, cap);
  return cudaGetLastError();
}

cudaError_t launch_f16_to_bf16(const void* in, int64_t count, void* out, cudaStream_t stream) {
  if (count == 0) return cudaGetLastError();
  f16_to_bf16_kernel<<<grid_for(count), kRowThreads, 0, stream>>>(
      static_cast<const __half*>(in), count, static_cast<__nv_bfloat16*>(out));
  return cudaGetLastError();
}

}  // namespace kvp::cuda::detail

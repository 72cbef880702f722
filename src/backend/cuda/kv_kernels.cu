// KV write (plain and int8-quantising) and block copy kernels (launched by kv_pool.cc through
// kernels.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "backend/cuda/dependent_launch.cuh"
#include "backend/cuda/kernels.h"

namespace kvp::cuda::detail {
namespace {

// One thread moves 16 bytes; a row (one token of one head) is head_dim * 2 bytes, a multiple of
// 16 for every supported head_dim, so rows are copied as whole uint4 vectors.
__global__ void kv_write_kernel(const uint4* __restrict__ k_new,  // [num_tokens][kv_heads][row]
                                const uint4* __restrict__ v_new,  // same
                                const int64_t* __restrict__ slot_mapping,      // [num_tokens]
                                uint4* __restrict__ k, uint4* __restrict__ v,  // layer K, V
                                int32_t num_kv_heads, int32_t block_size, int32_t row_vecs,
                                int64_t block_pitch_vecs, int64_t num_slots) {
  wait_for_prerequisites();  // launched as a dependent of the kernel that wrote k_new, v_new
  allow_dependents();        // attention may be scheduled
  const int32_t token = blockIdx.x;
  const int64_t slot = slot_mapping[token];
  // negative slot: padding row; out-of-pool slots were rejected on the host, this guard keeps a
  // launch without validation from writing outside the slab.
  if (slot < 0 || slot >= num_slots) return;
  const int64_t block = slot / block_size;
  const int32_t in_block = static_cast<int32_t>(slot % block_size);
  const int32_t vecs_per_token = num_kv_heads * row_vecs;
  for (int32_t i = threadIdx.x; i < vecs_per_token; i += blockDim.x) {
    const int32_t head = i / row_vecs;
    const int32_t vec = i % row_vecs;
    const int64_t dst =
        block * block_pitch_vecs + (int64_t{head} * block_size + in_block) * row_vecs + vec;
    const int64_t src = int64_t{token} * vecs_per_token + i;
    k[dst] = k_new[src];
    v[dst] = v_new[src];
  }
}

// The f16 scale of a row whose largest magnitude is max_abs, bit for bit kv8_scale for int8
// (cache/kv_quant.h): max_abs / 127 (IEEE division) rounded to nearest f16, then one f16 step up
// if that fell below.
__device__ __forceinline__ uint16_t int8_scale_bits(float max_abs) {
  if (!(max_abs > 0.0f)) return 0;
  const float wanted = fminf(__fdiv_rn(max_abs, 127.0f), 65504.0f);
  uint16_t bits = __half_as_ushort(__float2half_rn(wanted));
  if (__half2float(__ushort_as_half(bits)) < wanted && bits < 0x7bffu) ++bits;
  return bits;
}

template <typename T>
__device__ __forceinline__ float to_f32(T x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(x);
  } else {
    return __half2float(x);
  }
}

constexpr int kWriteWarps = 4;

// grid (num_tokens), kWriteWarps warps; a warp quantises one (K|V, head) row at a time: lane
// holds elements lane, lane + 32, ... (at most 8), the row maximum is a warp reduction. The byte
// stores are narrow; this kernel moves one token's KV per CTA and is not on a bandwidth path.
template <typename T>
__global__ void __launch_bounds__(kWriteWarps * 32)
    kv_write_int8_kernel(const T* __restrict__ k_new,               // [num_tokens][kv_heads][D]
                         const T* __restrict__ v_new,               // same
                         const int64_t* __restrict__ slot_mapping,  // [num_tokens]
                         int8_t* __restrict__ k, int8_t* __restrict__ v, int32_t num_kv_heads,
                         int32_t block_size, int32_t head_dim, int64_t block_pitch_bytes,
                         int64_t num_slots) {
  wait_for_prerequisites();  // as kv_write_kernel
  allow_dependents();
  const int32_t token = blockIdx.x;
  const int64_t slot = slot_mapping[token];
  if (slot < 0 || slot >= num_slots) return;  // padding row (see kv_write_kernel)
  const int64_t block = slot / block_size;
  const int32_t in_block = static_cast<int32_t>(slot % block_size);
  const int32_t warp = threadIdx.x / 32;
  const int32_t lane = threadIdx.x % 32;
  const int64_t head_pitch = int64_t{block_size} * (head_dim + 2);
  for (int32_t row = warp; row < 2 * num_kv_heads; row += kWriteWarps) {
    const int32_t head = row >> 1;
    const T* src = ((row & 1) ? v_new : k_new) + (int64_t{token} * num_kv_heads + head) * head_dim;
    int8_t* run = ((row & 1) ? v : k) + block * block_pitch_bytes + head * head_pitch;
    float x[8];
    float max_abs = 0.0f;
#pragma unroll
    for (int32_t i = 0; i < 8; ++i) {
      const int32_t d = lane + 32 * i;
      x[i] = d < head_dim ? to_f32(src[d]) : 0.0f;
      max_abs = fmaxf(max_abs, fabsf(x[i]));  // fmaxf drops a NaN, as std::max does on the host
    }
#pragma unroll
    for (int32_t offset = 16; offset > 0; offset /= 2) {
      max_abs = fmaxf(max_abs, __shfl_xor_sync(0xffffffffu, max_abs, offset));
    }
    const uint16_t scale_bits = int8_scale_bits(max_abs);
    const float scale = __half2float(__ushort_as_half(scale_bits));
    const float inv = scale > 0.0f ? __fdiv_rn(1.0f, scale) : 0.0f;
#pragma unroll
    for (int32_t i = 0; i < 8; ++i) {
      const int32_t d = lane + 32 * i;
      if (d >= head_dim) break;
      const float r = rintf(__fmul_rn(x[i], inv));  // ties to even, as std::nearbyint
      run[int64_t{in_block} * head_dim + d] =
          isnan(r) ? int8_t{0} : static_cast<int8_t>(fminf(fmaxf(r, -127.0f), 127.0f));
    }
    if (lane == 0) {
      reinterpret_cast<uint16_t*>(run + int64_t{block_size} * head_dim)[in_block] = scale_bits;
    }
  }
}

// grid (num_ops, num_layers): each CTA copies one block's K and V of one layer, a contiguous run
// of block_pitch elements.
__global__ void block_copy_kernel(uint4* __restrict__ slab,
                                  const int32_t* __restrict__ ops,  // [num_ops][2] (src, dst)
                                  int64_t block_pitch_vecs, int64_t layer_stride_vecs) {
  const int32_t op = blockIdx.x;
  const int64_t layer_base = int64_t{blockIdx.y} * layer_stride_vecs;
  const uint4* src = slab + layer_base + int64_t{ops[2 * op]} * block_pitch_vecs;
  uint4* dst = slab + layer_base + int64_t{ops[2 * op + 1]} * block_pitch_vecs;
  for (int64_t i = threadIdx.x; i < block_pitch_vecs; i += blockDim.x) dst[i] = src[i];
}

}  // namespace

cudaError_t launch_kv_write(const void* k_new, const void* v_new, const int64_t* slot_mapping,
                            int32_t num_tokens, void* k, void* v, int32_t num_kv_heads,
                            int32_t block_size, int32_t row_bytes, int64_t block_pitch_bytes,
                            int64_t num_slots, cudaStream_t stream) {
  if (num_tokens == 0) return cudaSuccess;
  const int32_t row_vecs = row_bytes / 16;
  const int32_t threads = min(256, max(32, num_kv_heads * row_vecs));
  return launch_dependent(true, kv_write_kernel, dim3(num_tokens), dim3(threads), 0, stream,
                          static_cast<const uint4*>(k_new), static_cast<const uint4*>(v_new),
                          slot_mapping, static_cast<uint4*>(k), static_cast<uint4*>(v),
                          num_kv_heads, block_size, row_vecs, block_pitch_bytes / 16, num_slots);
}

cudaError_t launch_kv_write_int8(const void* k_new, const void* v_new, bool src_bf16,
                                 const int64_t* slot_mapping, int32_t num_tokens, void* k, void* v,
                                 int32_t num_kv_heads, int32_t block_size, int32_t head_dim,
                                 int64_t block_pitch_bytes, int64_t num_slots,
                                 cudaStream_t stream) {
  if (num_tokens == 0) return cudaSuccess;
  if (head_dim % 32 != 0 || head_dim > 256) return cudaErrorInvalidValue;
  if (src_bf16) {
    return launch_dependent(
        true, kv_write_int8_kernel<__nv_bfloat16>, dim3(num_tokens), dim3(kWriteWarps * 32), 0,
        stream, static_cast<const __nv_bfloat16*>(k_new), static_cast<const __nv_bfloat16*>(v_new),
        slot_mapping, static_cast<int8_t*>(k), static_cast<int8_t*>(v), num_kv_heads, block_size,
        head_dim, block_pitch_bytes, num_slots);
  }
  return launch_dependent(true, kv_write_int8_kernel<__half>, dim3(num_tokens),
                          dim3(kWriteWarps * 32), 0, stream, static_cast<const __half*>(k_new),
                          static_cast<const __half*>(v_new), slot_mapping, static_cast<int8_t*>(k),
                          static_cast<int8_t*>(v), num_kv_heads, block_size, head_dim,
                          block_pitch_bytes, num_slots);
}

cudaError_t launch_block_copy(void* slab, const int32_t* ops, int32_t num_ops, int32_t num_layers,
                              int64_t block_pitch_bytes, int64_t layer_stride_bytes,
                              cudaStream_t stream) {
  if (num_ops == 0) return cudaSuccess;
  block_copy_kernel<<<dim3(num_ops, num_layers), 256, 0, stream>>>(
      static_cast<uint4*>(slab), ops, block_pitch_bytes / 16, layer_stride_bytes / 16);
  return cudaGetLastError();
}

}  // namespace kvp::cuda::detail

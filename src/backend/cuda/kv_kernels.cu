// KV write (plain and 8-bit-quantising: int8, fp8 e4m3) and block copy kernels (launched by
// kv_pool.cc through kernels.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "backend/cuda/dependent_launch.cuh"
#include "backend/cuda/kernels.h"
#include "common/e4m3.h"

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

// The f16 scale of a row whose largest magnitude is max_abs, bit for bit kv8_scale
// (cache/kv_quant.h): max_abs / 127 (int8) or / 448 (fp8), IEEE division, rounded to nearest f16,
// then one f16 step up if that fell below.
template <KvFormat kKv>
__device__ __forceinline__ uint16_t kv8_scale_bits(float max_abs) {
  static_assert(kKv != KvFormat::Native, "8-bit formats only");
  if (!(max_abs > 0.0f)) return 0;
  constexpr float kMaxCode = kKv == KvFormat::Fp8 ? 448.0f : 127.0f;  // kv8_max_value
  const float wanted = fminf(__fdiv_rn(max_abs, kMaxCode), 65504.0f);
  uint16_t bits = __half_as_ushort(__float2half_rn(wanted));
  if (__half2float(__ushort_as_half(bits)) < wanted && bits < 0x7bffu) ++bits;
  return bits;
}

// The code of v = x / scale, bit for bit kv8_encode: int8 rounds to nearest even and clamps to
// ±127, fp8 is the host's e4m3 encoder itself (common/e4m3.h); NaN becomes 0.
template <KvFormat kKv>
__device__ __forceinline__ uint8_t kv8_encode(float v) {
  if (isnan(v)) return 0;
  if constexpr (kKv == KvFormat::Fp8) {
    return e4m3_from_f32_bits(__float_as_uint(v));
  } else {
    const float r = rintf(v);  // ties to even, as std::nearbyint
    return static_cast<uint8_t>(static_cast<int8_t>(fminf(fmaxf(r, -127.0f), 127.0f)));
  }
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
template <typename T, KvFormat kKv>
__global__ void __launch_bounds__(kWriteWarps * 32)
    kv_write_kv8_kernel(const T* __restrict__ k_new,               // [num_tokens][kv_heads][D]
                        const T* __restrict__ v_new,               // same
                        const int64_t* __restrict__ slot_mapping,  // [num_tokens]
                        uint8_t* __restrict__ k, uint8_t* __restrict__ v, int32_t num_kv_heads,
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
    uint8_t* run = ((row & 1) ? v : k) + block * block_pitch_bytes + head * head_pitch;
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
    const uint16_t scale_bits = kv8_scale_bits<kKv>(max_abs);
    const float scale = __half2float(__ushort_as_half(scale_bits));
    const float inv = scale > 0.0f ? __fdiv_rn(1.0f, scale) : 0.0f;
#pragma unroll
    for (int32_t i = 0; i < 8; ++i) {
      const int32_t d = lane + 32 * i;
      if (d >= head_dim) break;
      run[int64_t{in_block} * head_dim + d] = kv8_encode<kKv>(__fmul_rn(x[i], inv));
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

namespace {

template <typename T, KvFormat kKv>
cudaError_t launch_kv_write_kv8_typed(const void* k_new, const void* v_new,
                                      const int64_t* slot_mapping, int32_t num_tokens, void* k,
                                      void* v, int32_t num_kv_heads, int32_t block_size,
                                      int32_t head_dim, int64_t block_pitch_bytes,
                                      int64_t num_slots, cudaStream_t stream) {
  return launch_dependent(true, kv_write_kv8_kernel<T, kKv>, dim3(num_tokens),
                          dim3(kWriteWarps * 32), 0, stream, static_cast<const T*>(k_new),
                          static_cast<const T*>(v_new), slot_mapping, static_cast<uint8_t*>(k),
                          static_cast<uint8_t*>(v), num_kv_heads, block_size, head_dim,
                          block_pitch_bytes, num_slots);
}

}  // namespace

cudaError_t launch_kv_write_kv8(KvFormat kv, const void* k_new, const void* v_new, bool src_bf16,
                                const int64_t* slot_mapping, int32_t num_tokens, void* k, void* v,
                                int32_t num_kv_heads, int32_t block_size, int32_t head_dim,
                                int64_t block_pitch_bytes, int64_t num_slots, cudaStream_t stream) {
  if (num_tokens == 0) return cudaSuccess;
  if (head_dim % 32 != 0 || head_dim > 256 || kv == KvFormat::Native) return cudaErrorInvalidValue;
  const auto launch =
      src_bf16 ? (kv == KvFormat::Fp8 ? launch_kv_write_kv8_typed<__nv_bfloat16, KvFormat::Fp8>
                                      : launch_kv_write_kv8_typed<__nv_bfloat16, KvFormat::Int8>)
               : (kv == KvFormat::Fp8 ? launch_kv_write_kv8_typed<__half, KvFormat::Fp8>
                                      : launch_kv_write_kv8_typed<__half, KvFormat::Int8>);
  return launch(k_new, v_new, slot_mapping, num_tokens, k, v, num_kv_heads, block_size, head_dim,
                block_pitch_bytes, num_slots, stream);
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

// KV write and block copy kernels (launched by kv_pool.cc through kernels.h).
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
  kv_write_kernel<<<num_tokens, threads, 0, stream>>>(
      static_cast<const uint4*>(k_new), static_cast<const uint4*>(v_new), slot_mapping,
      static_cast<uint4*>(k), static_cast<uint4*>(v), num_kv_heads, block_size, row_vecs,
      block_pitch_bytes / 16, num_slots);
  return cudaGetLastError();
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

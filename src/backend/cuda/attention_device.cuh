// Internal to the CUDA attention kernels (.cu only): bf16/f16, int8 and fp8 (e4m3) conversions,
// cp.async and the per-device shared-memory limit, shared by the decode and prefill kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <mutex>
#include <type_traits>

#include "backend/cuda/kernels.h"

namespace kvp::cuda::detail {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte asynchronous copy; src_bytes = 0 fills the destination with zeros.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// 4- or 8-byte asynchronous copy (through L1); src_bytes = 0 fills with zeros.
template <int N>
__device__ __forceinline__ void cp_async_small(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(smem_addr(dst)), "l"(src),
               "n"(N), "r"(src_bytes));
}

// c += a (16x16, row) * b (16x8, col)
template <typename T>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}
// Four 8x8 matrices of 16-bit elements from shared memory: lanes 8i .. 8i+7 address matrix i's rows
// (16 bytes each), r[i] is lane (g, t)'s fragment of it: row g, columns 2t, 2t+1 (_trans: rows 2t,
// 2t+1 of column g, the fragment of the transpose).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

__device__ __forceinline__ uint32_t half2_bits(__half2 h) {
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Raises Kernel's dynamic shared-memory limit to `bytes` on the current device, once per device.
// The limit is an attribute of the kernel on each device (cudaFuncSetAttribute applies to the
// current one). Set once per process, a model split over GPUs launched a kernel on its second GPU
// with the default 48 KiB limit, the launch failed there, and the other GPU waited in its
// all-reduce forever.
template <auto Kernel>
cudaError_t set_smem_limit_once(int bytes) {
  constexpr int kMaxDevices = 64;  // CUDA devices one process may launch on
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  if (device < 0 || device >= kMaxDevices) return cudaErrorInvalidDevice;
  static std::mutex mutex;
  static bool attribute_set[kMaxDevices] = {};
  std::lock_guard<std::mutex> lock(mutex);
  if (!attribute_set[device]) {
    const cudaError_t e =
        cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e != cudaSuccess) return e;
    attribute_set[device] = true;
  }
  return cudaSuccess;
}

// 8 int8 values to f32 without the int-to-float unit (a quarter of the FMA rate on Hopper): each
// byte, biased to unsigned (x + 128, an xor of its sign bit), is placed by one byte permute as the
// low mantissa byte of 2^23 (0x4B000000), which is the float 2^23 + x + 128; one subtraction
// leaves x exactly.
__device__ __forceinline__ float i8_byte_to_f32(uint32_t biased, int byte) {
  return __int_as_float(static_cast<int>(__byte_perm(biased, 0x4B000000u, 0x7540u + byte))) -
         8388736.0f;  // 2^23 + 128
}
__device__ __forceinline__ void unpack8_i8(const uint2& raw, float (&f)[8]) {
  const uint32_t lo = raw.x ^ 0x80808080u, hi = raw.y ^ 0x80808080u;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[i] = i8_byte_to_f32(lo, i);
    f[4 + i] = i8_byte_to_f32(hi, i);
  }
}
// 8 int8 values as 4 half2, exactly (every int8 is a half): the biased byte under 0x64 is the
// half 1024 + x + 128, and one packed subtraction of 1152 leaves x.
__device__ __forceinline__ __half2 i8_pair_to_half2(uint32_t biased, uint32_t selector) {
  const uint32_t bits = __byte_perm(biased, 0x64646464u, selector);
  const __half2 bias = __halves2half2(__ushort_as_half(0x6480), __ushort_as_half(0x6480));
  return __hsub2(*reinterpret_cast<const __half2*>(&bits), bias);
}
__device__ __forceinline__ void unpack8_i8_half2(const uint2& raw, __half2 (&h)[4]) {
  const uint32_t lo = raw.x ^ 0x80808080u, hi = raw.y ^ 0x80808080u;
  h[0] = i8_pair_to_half2(lo, 0x4140u);  // bytes 0, 1
  h[1] = i8_pair_to_half2(lo, 0x4342u);  // bytes 2, 3
  h[2] = i8_pair_to_half2(hi, 0x4140u);
  h[3] = i8_pair_to_half2(hi, 0x4342u);
}

// 8 e4m3 codes as 4 half2 of their values / 256, exactly, by moving bits as the CPU kernel does:
// each code's sign goes to bit 15 of its half, its exponent and mantissa to bits 7..13, so an
// e4m3 exponent e (bias 7) reads as the f16 exponent e (bias 15) and subnormals stay subnormal.
// One byte permute puts two codes in the high bytes of a half2, a shift and two masks finish it.
// Works on every architecture (the hardware cvt.rn.f16x2.e4m3x2 needs sm_89).
__device__ __forceinline__ __half2 e4m3_pair_to_half2(uint32_t codes, uint32_t selector) {
  const uint32_t t = __byte_perm(codes, 0u, selector);  // code << 8 in each half
  const uint32_t bits = (t & 0x80008000u) | ((t >> 1) & 0x3f803f80u);
  return *reinterpret_cast<const __half2*>(&bits);
}
__device__ __forceinline__ void unpack8_e4m3_half2(const uint2& raw, __half2 (&h)[4]) {
  h[0] = e4m3_pair_to_half2(raw.x, 0x1404u);  // bytes 0, 1
  h[1] = e4m3_pair_to_half2(raw.x, 0x3424u);  // bytes 2, 3
  h[2] = e4m3_pair_to_half2(raw.y, 0x1404u);
  h[3] = e4m3_pair_to_half2(raw.y, 0x3424u);
}

// An 8-bit KV row's 8 codes as 4 half2, exactly: int8 values, or e4m3 values / 256. The row
// scale times kv8_code_unit gives the factor that turns these halves into the cached values.
template <KvFormat kKv>
__device__ __forceinline__ void unpack8_kv8_half2(const uint2& raw, __half2 (&h)[4]) {
  static_assert(kKv != KvFormat::Native, "8-bit formats only");
  if constexpr (kKv == KvFormat::Fp8) {
    unpack8_e4m3_half2(raw, h);
  } else {
    unpack8_i8_half2(raw, h);
  }
}
template <KvFormat kKv>
__host__ __device__ constexpr float kv8_code_unit() {
  return kKv == KvFormat::Fp8 ? 256.0f : 1.0f;
}

// The f16 scale of token j from the word holding the scales of tokens j & ~1 and j | 1.
__device__ __forceinline__ float scale_of(uint32_t word, int j) {
  return __half2float(__ushort_as_half(static_cast<uint16_t>((j & 1) ? word >> 16 : word)));
}

// Logit in log2 units from a raw dot product q.k (soft cap folded in).
__device__ __forceinline__ float scaled_logit(float dot, const AttentionKernelArgs& a) {
  return a.cap_log2 > 0.0f ? a.cap_log2 * tanhf(dot * a.qk_mul) : dot * a.qk_mul;
}

// softmax_output_factor (backend/attention.h) in the kernels' log2 units: the factor that turns a
// finished row state (max m and sum l of exp2(logit - m), logits in log2 units) of query head
// q_head into its output. The sink joins the denominator as exp2(sink * log2(e) - m); when it
// exceeds m the factor is computed as e^(m - s) / (l e^(m - s) + 1), which cannot overflow.
__device__ __forceinline__ float output_factor(float m, float l, const AttentionKernelArgs& a,
                                               int q_head) {
  if (a.sinks == nullptr) return 1.0f / l;
  const float s = a.sinks[q_head] * 1.4426950408889634f;  // log2(e)
  if (!(s > m)) return 1.0f / (l + exp2f(s - m));
  const float r = exp2f(m - s);
  return r / (l * r + 1.0f);
}

// Block-table index and offset in the block of key position j; a shift and a mask for the usual
// power-of-two block sizes, a division otherwise.
__device__ __forceinline__ int block_index(int j, const AttentionKernelArgs& a) {
  return a.block_shift >= 0 ? j >> a.block_shift : j / a.block_size;
}
__device__ __forceinline__ int index_in_block(int j, const AttentionKernelArgs& a) {
  return a.block_shift >= 0 ? j & (a.block_size - 1) : j % a.block_size;
}

// What one prefill CTA (grid: row tiles counted from the end, sequences, KV heads) works on: rows
// row0 .. row0 + kRows - 1 of its sequence and KV head (row r = token * G + g, query head
// kv_head * G + g, position first_pos + token), latest rows first so that the longest CTAs start
// earliest, and the key tiles of kKeys those rows see: from the first key the earliest row sees
// (window) to the last one the latest row sees (causal).
struct PrefillTile {
  int q_begin, q_len, num_rows, row0, kv_len, first_pos, pos_lo, pos_hi, key_begin, tile_first,
      num_tiles;
};
// False when the CTA has no rows: a decode sequence (q_len < 2, the decode kernel's) or a row tile
// past the sequence's rows.
template <int kRows, int kKeys>
__device__ __forceinline__ bool prefill_tile(const AttentionKernelArgs& a, PrefillTile& p) {
  const int seq = blockIdx.y;
  p.q_begin = a.query_start[seq];
  p.q_len = a.query_start[seq + 1] - p.q_begin;
  if (p.q_len < 2) return false;
  p.num_rows = p.q_len * a.group;
  p.row0 = (gridDim.x - 1 - blockIdx.x) * kRows;
  if (p.row0 >= p.num_rows) return false;
  p.kv_len = a.kv_lens[seq];
  p.first_pos = p.kv_len - p.q_len;
  p.pos_lo = p.first_pos + p.row0 / a.group;
  p.pos_hi = p.first_pos + min(p.num_rows - 1, p.row0 + kRows - 1) / a.group;
  p.key_begin = a.window > 0 ? max(0, p.pos_lo - a.window + 1) : 0;
  p.tile_first = p.key_begin / kKeys;
  p.num_tiles = (p.pos_hi + 1 + kKeys - 1) / kKeys - p.tile_first;
  return true;
}

// Where 16-byte chunk c of key j's row lies in one layer's 16-bit K or V (head dim D, head_offset
// = the KV head's run in a block): false, with off = 0, for a key outside [key_begin, kv_len).
// Keys before key_begin are masked for every row, and a windowed group may have released their
// blocks (table entry -1), so such keys are zero-filled instead of read. Zero-filled keys are
// masked: p = 0 times a zero V row stays 0 (never 0 * NaN).
template <int D>
__device__ __forceinline__ bool kv_chunk_offset(const AttentionKernelArgs& a, const int32_t* table,
                                                int64_t head_offset, int j, int c, int key_begin,
                                                int kv_len, int64_t& off) {
  const bool valid = j >= key_begin && j < kv_len;
  off = 0;
  if (valid) {
    off = int64_t{table[block_index(j, a)]} * a.block_pitch + head_offset +
          index_in_block(j, a) * D + c * 8;
  }
  return valid;
}

// Where 16-byte chunk c of prefill row `row` (PrefillTile: token row / G, query head
// kv_head * G + row % G) lies in q: false for a row past the sequence's num_rows, which reads as
// zeros (src then points at token 0's row, never read).
template <typename T, int D>
__device__ __forceinline__ bool q_chunk_source(const AttentionKernelArgs& a, const T* q,
                                               int q_begin, int num_rows, int kv_head, int row,
                                               int c, const T*& src) {
  const int G = a.group;
  const bool valid = row < num_rows;
  const int token = valid ? row / G : 0;
  const int head = kv_head * G + (valid ? row % G : 0);
  src = q + (int64_t{q_begin + token} * a.num_q_heads + head) * D + c * 8;
  return valid;
}

template <typename T>
__device__ __forceinline__ void unpack8(const uint4& raw, float (&f)[8]) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const auto* p = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 x = __bfloat1622float2(p[i]);
      f[2 * i] = x.x;
      f[2 * i + 1] = x.y;
    }
  } else {
    const auto* p = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 x = __half22float2(p[i]);
      f[2 * i] = x.x;
      f[2 * i + 1] = x.y;
    }
  }
}

template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 x = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&x);
  } else {
    const __half2 x = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&x);
  }
}

template <typename T>
__device__ __forceinline__ T from_float(float x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(x);
  } else {
    return __float2half_rn(x);
  }
}

// What one decode CTA (grid: splits, KV heads x head chunks, sequences) works on: query heads
// head0 .. head0 + G - 1 (KV head kv_head) of sequence seq, whose query is row q_row, the keys
// begin .. end - 1 of its split, and its row in the split partial states. False, for the CTA to
// return, on a prefill sequence (the prefill kernel's) and on an empty split (a short sequence
// in a batch split for a long one), whose partial states it marks empty.
struct DecodeSplit {
  int seq, kv_head, head0, q_row, begin, end;
  int64_t partial_row;
};
template <int G>
__device__ __forceinline__ bool decode_split(const AttentionKernelArgs& a, DecodeSplit& d) {
  d.kv_head = blockIdx.y / a.head_chunks;
  d.head0 = d.kv_head * a.group + (blockIdx.y % a.head_chunks) * G;
  d.seq = blockIdx.z;
  d.q_row = a.query_start[d.seq];
  const int kv_len = a.kv_lens[d.seq];  // loaded before the branch: both loads in flight at once
  if (a.query_start[d.seq + 1] - d.q_row != 1) return false;
  const int first = a.window > 0 ? max(0, kv_len - a.window) : 0;
  const int per_split = (kv_len - first + a.num_splits - 1) / a.num_splits;
  d.begin = first + static_cast<int>(blockIdx.x) * per_split;
  d.end = min(kv_len, d.begin + per_split);
  d.partial_row = (int64_t{d.seq} * a.num_q_heads + d.head0) * a.num_splits + blockIdx.x;
  if (d.begin >= d.end) {
    if (threadIdx.x < G) {
      a.partial_ml[2 * (d.partial_row + int64_t{threadIdx.x} * a.num_splits)] = -INFINITY;
      a.partial_ml[2 * (d.partial_row + int64_t{threadIdx.x} * a.num_splits) + 1] = 0.0f;
    }
    return false;
  }
  return true;
}

// Calls f(std::integral_constant<int, G>{}) for G = heads, the query heads one decode CTA takes
// (1, 2, 4 or 8: the decode kernels' instantiations); any other count returns `otherwise`.
template <typename R, typename F>
R dispatch_heads_per_cta(int32_t heads, R otherwise, F&& f) {
  switch (heads) {
    case 1:
      return f(std::integral_constant<int, 1>{});
    case 2:
      return f(std::integral_constant<int, 2>{});
    case 4:
      return f(std::integral_constant<int, 4>{});
    case 8:
      return f(std::integral_constant<int, 8>{});
    default:
      return otherwise;
  }
}

// The end of a decode CTA (decode_attention.cu, decode_attention_mma.cu): the online-softmax
// states of its kStreams token streams, in shared memory as s_acc [kStreams][G][D] (unnormalised),
// s_m and s_l [kStreams][G] (max and sum, log2 units), are merged into the output rows of query
// heads head0 .. head0 + G - 1 (one split) or into the split's partial state for
// merge_splits_kernel. Every thread of the CTA takes part.
template <typename T, int D, int G, int kStreams>
__device__ __forceinline__ void finish_decode_streams(const AttentionKernelArgs& a,
                                                      const float* s_acc, const float* s_m,
                                                      const float* s_l, int q_row, int head0,
                                                      int64_t partial_row) {
  for (int idx = threadIdx.x; idx < G * D; idx += blockDim.x) {
    const int g = idx / D;
    const int d = idx % D;
    float m_all = -INFINITY;
#pragma unroll
    for (int st = 0; st < kStreams; ++st) m_all = fmaxf(m_all, s_m[st * G + g]);
    float l_all = 0.0f, acc_all = 0.0f;
#pragma unroll
    for (int st = 0; st < kStreams; ++st) {
      const float m_st = s_m[st * G + g];
      const float w = m_st == -INFINITY ? 0.0f : exp2f(m_st - m_all);
      l_all = fmaf(w, s_l[st * G + g], l_all);
      acc_all = fmaf(w, s_acc[(st * G + g) * D + d], acc_all);
    }
    if (a.num_splits == 1) {
      static_cast<T*>(a.out)[(int64_t{q_row} * a.num_q_heads + head0 + g) * D + d] =
          from_float<T>(acc_all * output_factor(m_all, l_all, a, head0 + g));
    } else {
      const int64_t row = partial_row + int64_t{g} * a.num_splits;
      a.partial_acc[row * D + d] = acc_all;
      if (d == 0) {
        a.partial_ml[2 * row] = m_all;
        a.partial_ml[2 * row + 1] = l_all;
      }
    }
  }
}

}  // namespace kvp::cuda::detail

// Decode attention (q_len == 1) and the exact merge of split-KV partial states.
//
// decode_attention_kernel: grid (num_splits, num_kv_heads * head_chunks, num_seqs), 128 threads.
// A CTA owns one sequence's query heads head0 .. head0+G-1 (all reading one KV head) and one
// contiguous slice of the visible keys. The CTA is cut into kStreams token streams of kLanes
// lanes; a stream reads whole K and V rows (kLanes x 16 bytes), so each K/V byte is loaded once
// for all G heads, and runs its own online softmax over its tokens with no barrier. The streams
// are merged through shared memory at the end:
//
//   keys of the slice:  | s0 s0 s0 s0 | s1 s1 s1 s1 | ... | s7 s7 s7 s7 | s0 s0 ... (kUnroll = 4)
//
// merge_splits_kernel: grid (num_seqs, num_q_heads), head_dim threads; combines the partial
// (max, sum, accumulator) triples of the splits with weights exp2(max_i - max).
#include <cmath>

#include "backend/cuda/attention_device.cuh"

namespace kvp::cuda::detail {
namespace {

constexpr int kDecodeThreads = 128;

template <typename T, int D, int G>
__global__ void __launch_bounds__(kDecodeThreads)
    decode_attention_kernel(const AttentionKernelArgs a) {
  constexpr int kLanes = D / 8;                      // lanes per K/V row, 16 bytes each
  constexpr int kStreams = kDecodeThreads / kLanes;  // independent token streams per CTA
  constexpr int kUnroll = 4;                         // tokens per stream per step (loads in flight)
  constexpr int kStep = kStreams * kUnroll;

  const int split = blockIdx.x;
  const int kv_head = blockIdx.y / a.head_chunks;
  const int head0 = kv_head * a.group + (blockIdx.y % a.head_chunks) * G;
  const int seq = blockIdx.z;
  const int q_row = a.query_start[seq];
  if (a.query_start[seq + 1] - q_row != 1) return;  // prefill rows belong to the other kernel
  const int kv_len = a.kv_lens[seq];
  const int first = a.window > 0 ? max(0, kv_len - a.window) : 0;
  const int per_split = (kv_len - first + a.num_splits - 1) / a.num_splits;
  const int begin = first + split * per_split;
  const int end = min(kv_len, begin + per_split);
  const int64_t partial_row = (int64_t{seq} * a.num_q_heads + head0) * a.num_splits + split;

  if (begin >= end) {  // an empty split (short sequence in a batch split for a long one)
    if (threadIdx.x < G) {
      a.partial_ml[2 * (partial_row + int64_t{threadIdx.x} * a.num_splits)] = -INFINITY;
      a.partial_ml[2 * (partial_row + int64_t{threadIdx.x} * a.num_splits) + 1] = 0.0f;
    }
    return;
  }

  const int lane = threadIdx.x % kLanes;
  const int stream = threadIdx.x / kLanes;

  float q[G][8];  // this lane's 8 dims of each head, pre-multiplied by qk_mul
#pragma unroll
  for (int g = 0; g < G; ++g) {
    const uint4 raw =
        __ldg(reinterpret_cast<const uint4*>(static_cast<const T*>(a.q) +
                                             (int64_t{q_row} * a.num_q_heads + head0 + g) * D) +
              lane);
    unpack8<T>(raw, q[g]);
#pragma unroll
    for (int i = 0; i < 8; ++i) q[g][i] *= a.qk_mul;
  }
  const bool soft_cap = a.cap_log2 > 0.0f;
  float m[G], l[G], acc[G][8];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[g][i] = 0.0f;
  }

  const int32_t* table = a.block_tables + int64_t{seq} * a.max_blocks_per_seq;
  const int64_t head_offset = int64_t{kv_head} * a.block_size * D + lane * 8;
  const T* k_base = static_cast<const T*>(a.k) + head_offset;
  const T* v_base = static_cast<const T*>(a.v) + head_offset;

  // The loop bound is uniform over the CTA so every lane reaches every shuffle.
  for (int step = begin; step < end; step += kStep) {
    uint4 k_raw[kUnroll], v_raw[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int j = step + stream * kUnroll + u;
      if (j < end) {
        const int64_t off =
            int64_t{__ldg(table + j / a.block_size)} * a.block_pitch + (j % a.block_size) * D;
        k_raw[u] = __ldg(reinterpret_cast<const uint4*>(k_base + off));
        v_raw[u] = __ldg(reinterpret_cast<const uint4*>(v_base + off));
      } else {
        k_raw[u] = make_uint4(0, 0, 0, 0);
        v_raw[u] = make_uint4(0, 0, 0, 0);
      }
    }
    float s[kUnroll][G];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float kf[8];
      unpack8<T>(k_raw[u], kf);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i) dot = fmaf(q[g][i], kf[i], dot);
        s[u][g] = dot;
      }
    }
#pragma unroll
    for (int offset = kLanes / 2; offset > 0; offset /= 2) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
        for (int g = 0; g < G; ++g) s[u][g] += __shfl_xor_sync(0xffffffffu, s[u][g], offset);
      }
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float step_max = -INFINITY;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int j = step + stream * kUnroll + u;
        float x = soft_cap ? a.cap_log2 * tanhf(s[u][g]) : s[u][g];
        if (j >= end) x = -INFINITY;
        s[u][g] = x;
        step_max = fmaxf(step_max, x);
      }
      const float m_new = fmaxf(m[g], step_max);
      if (m_new == -INFINITY) continue;  // this stream has seen no key yet
      const float correction = exp2f(m[g] - m_new);
      m[g] = m_new;
      l[g] *= correction;
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[g][i] *= correction;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const float p = exp2f(s[u][g] - m_new);
        l[g] += p;
        float vf[8];
        unpack8<T>(v_raw[u], vf);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[g][i] = fmaf(p, vf[i], acc[g][i]);
      }
    }
  }

  // Merge the streams.
  __shared__ float s_m[kStreams][G];
  __shared__ float s_l[kStreams][G];
  __shared__ float s_acc[kStreams][G][D];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    if (lane == 0) {
      s_m[stream][g] = m[g];
      s_l[stream][g] = l[g];
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) s_acc[stream][g][lane * 8 + i] = acc[g][i];
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < G * D; idx += kDecodeThreads) {
    const int g = idx / D;
    const int d = idx % D;
    float m_all = -INFINITY;
#pragma unroll
    for (int st = 0; st < kStreams; ++st) m_all = fmaxf(m_all, s_m[st][g]);
    float l_all = 0.0f, acc_all = 0.0f;
#pragma unroll
    for (int st = 0; st < kStreams; ++st) {
      const float w = s_m[st][g] == -INFINITY ? 0.0f : exp2f(s_m[st][g] - m_all);
      l_all = fmaf(w, s_l[st][g], l_all);
      acc_all = fmaf(w, s_acc[st][g][d], acc_all);
    }
    if (a.num_splits == 1) {
      static_cast<T*>(a.out)[(int64_t{q_row} * a.num_q_heads + head0 + g) * D + d] =
          from_float<T>(acc_all / l_all);
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

template <typename T, int D>
__global__ void __launch_bounds__(D) merge_splits_kernel(const AttentionKernelArgs a) {
  const int seq = blockIdx.x;
  const int head = blockIdx.y;
  const int q_row = a.query_start[seq];
  if (a.query_start[seq + 1] - q_row != 1) return;
  const int64_t row0 = (int64_t{seq} * a.num_q_heads + head) * a.num_splits;
  float m_all = -INFINITY;
  for (int i = 0; i < a.num_splits; ++i) m_all = fmaxf(m_all, a.partial_ml[2 * (row0 + i)]);
  float l_all = 0.0f, acc_all = 0.0f;
  for (int i = 0; i < a.num_splits; ++i) {
    const float m_i = a.partial_ml[2 * (row0 + i)];
    if (m_i == -INFINITY) continue;  // empty split: its accumulator was never written
    const float w = exp2f(m_i - m_all);
    l_all = fmaf(w, a.partial_ml[2 * (row0 + i) + 1], l_all);
    acc_all = fmaf(w, a.partial_acc[(row0 + i) * D + threadIdx.x], acc_all);
  }
  static_cast<T*>(a.out)[(int64_t{q_row} * a.num_q_heads + head) * D + threadIdx.x] =
      from_float<T>(acc_all / l_all);
}

template <typename T, int D>
cudaError_t launch_decode_typed(const AttentionKernelArgs& args, int32_t heads_per_cta,
                                cudaStream_t stream) {
  const dim3 grid(args.num_splits, args.num_kv_heads * args.head_chunks, args.num_seqs);
  switch (heads_per_cta) {
    case 1:
      decode_attention_kernel<T, D, 1><<<grid, kDecodeThreads, 0, stream>>>(args);
      break;
    case 2:
      decode_attention_kernel<T, D, 2><<<grid, kDecodeThreads, 0, stream>>>(args);
      break;
    case 4:
      decode_attention_kernel<T, D, 4><<<grid, kDecodeThreads, 0, stream>>>(args);
      break;
    case 8:
      decode_attention_kernel<T, D, 8><<<grid, kDecodeThreads, 0, stream>>>(args);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_decode_dim(const AttentionKernelArgs& args, int32_t head_dim,
                              int32_t heads_per_cta, cudaStream_t stream) {
  switch (head_dim) {
    case 64:
      return launch_decode_typed<T, 64>(args, heads_per_cta, stream);
    case 128:
      return launch_decode_typed<T, 128>(args, heads_per_cta, stream);
    case 256:
      return launch_decode_typed<T, 256>(args, heads_per_cta, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

template <typename T>
cudaError_t launch_merge_dim(const AttentionKernelArgs& args, int32_t head_dim,
                             cudaStream_t stream) {
  const dim3 grid(args.num_seqs, args.num_q_heads);
  switch (head_dim) {
    case 64:
      merge_splits_kernel<T, 64><<<grid, 64, 0, stream>>>(args);
      break;
    case 128:
      merge_splits_kernel<T, 128><<<grid, 128, 0, stream>>>(args);
      break;
    case 256:
      merge_splits_kernel<T, 256><<<grid, 256, 0, stream>>>(args);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_decode_attention(const AttentionKernelArgs& args, bool bf16, int32_t head_dim,
                                    int32_t heads_per_cta, cudaStream_t stream) {
  return bf16 ? launch_decode_dim<__nv_bfloat16>(args, head_dim, heads_per_cta, stream)
              : launch_decode_dim<__half>(args, head_dim, heads_per_cta, stream);
}

cudaError_t launch_merge_splits(const AttentionKernelArgs& args, bool bf16, int32_t head_dim,
                                cudaStream_t stream) {
  return bf16 ? launch_merge_dim<__nv_bfloat16>(args, head_dim, stream)
              : launch_merge_dim<__half>(args, head_dim, stream);
}

}  // namespace kvp::cuda::detail

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
// K/V rows reach the registers through a per-thread cp.async ring (kDecodeStages deep) in shared
// memory, so two steps of loads are in flight while one is computed.
//
// 8-bit KV (kKv8: int8 or fp8 e4m3) at head dim 256 (64 and 128 go to the tensor-core kernel of
// decode_attention_mma.cu, which launch_decode_attention picks): a lane still owns 8 dims of a row
// (8 bytes), but the ring is filled per warp, not per thread: the warp's 32 threads copy all the K
// and V rows its streams need for a step in 16-byte pieces (4 per thread, the same bytes in flight
// per copy as the 16-bit path), and one lane per (token, K|V) copies the 4-byte word holding that
// token's f16 scale (the scales of tokens 2i and 2i+1 share a word). Each thread waits for its own
// copies, then __syncwarp makes the warp's copies visible to all its lanes. Rows are widened to
// half2 in registers (int8 values, or e4m3 values / 256 with the 256 folded into the scales); the
// K scale multiplies the reduced q.k dot, the V scale multiplies p (p * s_v * v8): no dequantised
// row is ever formed.
//
//   8-bit ring, one warp's part of one stage:  [K, V][kWarpTokens][D] bytes (2 KB for every D)
//   then, for all warps and stages:           [stage][warp][K, V][kWarpTokens] scale words
//
// merge_splits_kernel: grid (num_seqs, num_q_heads), 4 x head_dim threads; combines the partial
// (max, sum, accumulator) triples of the splits with weights exp2(max_i - max).
#include <cmath>

#include "backend/cuda/attention_device.cuh"
#include "backend/cuda/dependent_launch.cuh"

namespace kvp::cuda::detail {
namespace {

constexpr int kDecodeThreads = 128;
constexpr int kDecodeStages = 3;
constexpr int kDecodeUnroll = 4;  // tokens per stream per step

// The cp.async ring: [kDecodeStages][2][kDecodeUnroll][kDecodeThreads] x 16 bytes = 48 KB, the
// most a CTA gets without opting in; the stream merge reuses it. 8-bit: [kDecodeStages][warps]
// x 2 KB of rows and the scale words (26 KB), sized at 36 KB for the stream merge.
template <bool kKv8>
__host__ __device__ constexpr int decode_smem_bytes() {
  return kKv8 ? kDecodeStages * 2 * kDecodeUnroll * kDecodeThreads * (8 + 4)
              : kDecodeStages * 2 * kDecodeUnroll * kDecodeThreads * 16;
}

template <typename T, int D, int G, KvFormat kKv>
// Register budget: 4 CTAs per SM up to 4 heads per CTA (<= 128 registers), 2 with 8.
__global__ void __launch_bounds__(kDecodeThreads, G >= 8 ? 2 : 4)
    decode_attention_kernel(const AttentionKernelArgs a) {
  constexpr bool kKv8 = kKv != KvFormat::Native;
  wait_for_prerequisites();      // launched as a dependent of the KV write (or the prefill kernel)
  allow_dependents();            // the merge may be scheduled
  constexpr int kLanes = D / 8;  // lanes per K/V row, 8 dims (16 bytes, 8-bit: 8 bytes) each
  constexpr int kLaneBytes = kKv8 ? 8 : 16;
  constexpr int kElemBytes = kKv8 ? 1 : 2;
  // 8-bit: tokens a warp consumes per step, 16-byte pieces per 8-bit row
  constexpr int kWarpTokens = (32 / kLanes) * kDecodeUnroll;
  constexpr int kRowChunks = D / 16;
  constexpr int kWarpStageBytes = 2 * kWarpTokens * D;
  static_assert(!kKv8 || kWarpStageBytes == 2 * 32 * 4 * 8, "a warp copies 4 x 16 B per thread");
  constexpr int kStreams = kDecodeThreads / kLanes;  // independent token streams per CTA
  constexpr int kUnroll = kDecodeUnroll;
  constexpr int kStep = kStreams * kUnroll;

  DecodeSplit split;
  if (!decode_split<G>(a, split)) return;
  // copies, not structured bindings: the .cu files compile as C++17, whose lambdas cannot
  // capture those
  const int seq = split.seq, kv_head = split.kv_head, head0 = split.head0, q_row = split.q_row;
  const int begin = split.begin, end = split.end;
  const int64_t partial_row = split.partial_row;

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
  // 8-bit: q·k and p·v run in packed half2 (two products an instruction; int8 and e4m3 / 256
  // keys and values are exact halves, q·qk_mul and p·scale lose a half's 11-bit precision) with the
  // sums of eight dims (q·k) and of a step's kUnroll keys (p·v) carried into f32
  __half2 qh[kKv8 ? G : 1][4];
  if constexpr (kKv8) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
#pragma unroll
      for (int i = 0; i < 4; ++i) qh[g][i] = __floats2half2_rn(q[g][2 * i], q[g][2 * i + 1]);
    }
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
  // byte offsets: this head's run in a block, this lane's 8 dims in a row
  const int64_t head_run = int64_t{kv_head} * a.block_size * (kKv8 ? D + 2 : D) * kElemBytes;
  // 16-bit: this lane's 8 dims; int8: the head run itself (the warp copies whole rows)
  const int64_t lane_offset = kKv8 ? 0 : lane * kLaneBytes;
  const char* k_base = static_cast<const char*>(a.k) + head_run + lane_offset;
  const char* v_base = static_cast<const char*>(a.v) + head_run + lane_offset;
  const int64_t pitch_bytes = a.block_pitch * kElemBytes;
  const int64_t scale_run = int64_t{a.block_size} * D;  // 8-bit: from k_base to the scales
  const int num_steps = (end - begin + kStep - 1) / kStep;
  const int warp = threadIdx.x / 32;
  const int warp_lane = threadIdx.x % 32;
  // 8-bit: the warp's tokens (0 .. kWarpTokens-1 of this step) this thread copies: rows ta and tb
  // (K and V, 16-byte column ca and cb), and the scale word of token ts (K for lanes below
  // kWarpTokens, V above; lanes from 2 * kWarpTokens copy none)
  const int ta = warp_lane / kRowChunks, ca = warp_lane % kRowChunks;
  const int tb = (warp_lane + 32) / kRowChunks, cb = (warp_lane + 32) % kRowChunks;
  const int ts = warp_lane % kWarpTokens;
  const bool copies_scale = warp_lane < 2 * kWarpTokens;
  const char* scale_base = warp_lane < kWarpTokens ? k_base : v_base;

  // Each thread streams its own K/V chunks through a kDecodeStages-deep cp.async ring in shared
  // memory and reads back only what it copied itself, so the ring needs no barrier.
  //   ring: [kDecodeStages][2 (K, V)][kUnroll][kDecodeThreads] x kLaneBytes
  //   8-bit, after it: [kDecodeStages][2 (K, V)][kUnroll][kDecodeThreads] scale words
  extern __shared__ uint4 smem[];
  char* ring = reinterpret_cast<char*>(smem);
  uint32_t* scale_ring =
      reinterpret_cast<uint32_t*>(ring + kDecodeStages * 2 * kUnroll * kDecodeThreads * kLaneBytes);
  constexpr int kStageSlots = 2 * kUnroll * kDecodeThreads;
  constexpr int kWarps = kDecodeThreads / 32;
  auto token_of = [&](int step, int u) { return begin + step * kStep + stream * kUnroll + u; };
  // token of this thread's u-th copy: 16-bit, its own stream's tokens; 8-bit, ta, tb, ts
  auto copy_token = [&](int step, int u) {
    if constexpr (kKv8) {
      const int idx = u == 0 ? ta : u == 1 ? tb : ts;
      return begin + step * kStep + warp * kWarpTokens + idx;
    } else {
      return token_of(step, u);
    }
  };
  auto block_of = [&](int step, int u) -> int32_t {
    const int j = copy_token(step, u);
    return j < end ? __ldg(table + block_index(j, a)) : 0;
  };
  auto issue = [&](int step, const int32_t(&block)[kUnroll]) {
    const int first_slot = (step % kDecodeStages) * kStageSlots + threadIdx.x;
    char* slot = ring + int64_t{first_slot} * kLaneBytes;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if constexpr (kKv8) {
        if (u >= 3) continue;
        const int j = copy_token(step, u);
        const bool valid = j < end;
        const int in_block = valid ? index_in_block(j, a) : 0;
        const int64_t block_off = valid ? int64_t{block[u]} * pitch_bytes : 0;
        const int stage = step % kDecodeStages;
        char* warp_ring = ring + (stage * kWarps + warp) * kWarpStageBytes;
        if (u < 2) {
          const int t = u == 0 ? ta : tb;
          const int c = u == 0 ? ca : cb;
          const int64_t off = block_off + int64_t{in_block} * D + c * 16;
          cp_async16(warp_ring + t * D + c * 16, k_base + off, valid ? 16 : 0);
          cp_async16(warp_ring + (kWarpTokens + t) * D + c * 16, v_base + off, valid ? 16 : 0);
        } else if (copies_scale) {
          const int64_t word = block_off + scale_run + (in_block & ~1) * 2;
          cp_async_small<4>(scale_ring + (stage * kWarps + warp) * 2 * kWarpTokens + warp_lane,
                            scale_base + word, valid ? 4 : 0);
        }
      } else {
        const int j = token_of(step, u);
        const bool valid = j < end;  // also false past the last step
        const int64_t off =
            valid ? int64_t{block[u]} * pitch_bytes + int64_t{index_in_block(j, a)} * D * 2 : 0;
        cp_async16(slot + u * kDecodeThreads * 16, k_base + off, valid ? 16 : 0);
        cp_async16(slot + (kUnroll + u) * kDecodeThreads * 16, v_base + off, valid ? 16 : 0);
      }
    }
    cp_async_commit();
  };
  // Block-table entries are loaded one step before their copies are issued, so the dependent
  // table -> K/V chain never stalls the thread.
  int32_t block[kUnroll];
#pragma unroll
  for (int st = 0; st < kDecodeStages - 1; ++st) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) block[u] = block_of(st, u);
    issue(st, block);
  }
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) block[u] = block_of(kDecodeStages - 1, u);

  // The loop bound is uniform over the CTA so every lane reaches every shuffle.
  for (int i = 0; i < num_steps; ++i) {
    cp_async_wait<kDecodeStages - 2>();
    // 8-bit: the step's rows were copied by the whole warp. The barrier also keeps every lane's
    // reads of iteration i - 1 before the copies issued below overwrite that stage.
    if constexpr (kKv8) __syncwarp();
    const int first_slot = (i % kDecodeStages) * kStageSlots + threadIdx.x;
    uint4 k_raw[kUnroll], v_raw[kUnroll];
    float k_scale[kUnroll], v_scale[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if constexpr (kKv8) {
        const int stage = i % kDecodeStages;
        const int idx = (stream % (32 / kLanes)) * kUnroll + u;  // the warp's token
        const char* warp_ring = ring + (stage * kWarps + warp) * kWarpStageBytes;
        const uint2 k8 = *reinterpret_cast<const uint2*>(warp_ring + idx * D + lane * 8);
        const uint2 v8 =
            *reinterpret_cast<const uint2*>(warp_ring + (kWarpTokens + idx) * D + lane * 8);
        k_raw[u] = make_uint4(k8.x, k8.y, 0, 0);
        v_raw[u] = make_uint4(v8.x, v8.y, 0, 0);
        const uint32_t* words = scale_ring + (stage * kWarps + warp) * 2 * kWarpTokens;
        const int j = token_of(i, u);
        k_scale[u] = scale_of(words[idx], j) * kv8_code_unit<kKv>();
        v_scale[u] = scale_of(words[kWarpTokens + idx], j) * kv8_code_unit<kKv>();
      } else {
        const uint4* slot = reinterpret_cast<const uint4*>(ring) + first_slot;
        k_raw[u] = slot[u * kDecodeThreads];
        v_raw[u] = slot[(kUnroll + u) * kDecodeThreads];
        k_scale[u] = v_scale[u] = 1.0f;
      }
    }
    issue(i + kDecodeStages - 1, block);  // overwrites the slot read in iteration i - 1
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) block[u] = block_of(i + kDecodeStages, u);

    float s[kUnroll][G];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if constexpr (kKv8) {
        __half2 kh[4];
        unpack8_kv8_half2<kKv>(make_uint2(k_raw[u].x, k_raw[u].y), kh);
#pragma unroll
        for (int g = 0; g < G; ++g) {
          __half2 d = __hmul2(qh[g][0], kh[0]);
#pragma unroll
          for (int i = 1; i < 4; ++i) d = __hfma2(qh[g][i], kh[i], d);
          const float2 f = __half22float2(d);
          s[u][g] = f.x + f.y;
        }
      } else {
        float kf[8];
        unpack8<T>(k_raw[u], kf);
#pragma unroll
        for (int g = 0; g < G; ++g) {
          float dot = 0.0f;
#pragma unroll
          for (int e = 0; e < 8; ++e) dot = fmaf(q[g][e], kf[e], dot);
          s[u][g] = dot;
        }
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
    // 8-bit: each V row widened once for all G heads of the group (not per head)
    __half2 v_half[kKv8 ? kUnroll : 1][4];
    if constexpr (kKv8) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
        for (int g = 0; g < G; ++g) s[u][g] *= k_scale[u];
        unpack8_kv8_half2<kKv>(make_uint2(v_raw[u].x, v_raw[u].y), v_half[u]);
      }
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float step_max = -INFINITY;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        float x = soft_cap ? a.cap_log2 * tanhf(s[u][g]) : s[u][g];
        if (token_of(i, u) >= end) x = -INFINITY;
        s[u][g] = x;
        step_max = fmaxf(step_max, x);
      }
      const float m_new = fmaxf(m[g], step_max);
      if (m_new == -INFINITY) continue;  // this stream has seen no key yet
      const float correction = exp2f(m[g] - m_new);
      m[g] = m_new;
      l[g] *= correction;
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[g][e] *= correction;
      if constexpr (kKv8) {
        __half2 part[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) part[i] = __float2half2_rn(0.0f);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const float p = exp2f(s[u][g] - m_new);
          l[g] += p;
          const __half2 pv = __float2half2_rn(p * v_scale[u]);
#pragma unroll
          for (int i = 0; i < 4; ++i) part[i] = __hfma2(pv, v_half[u][i], part[i]);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float2 f = __half22float2(part[i]);
          acc[g][2 * i] += f.x;
          acc[g][2 * i + 1] += f.y;
        }
      } else {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const float p = exp2f(s[u][g] - m_new);
          l[g] += p;
          float vf[8];
          unpack8<T>(v_raw[u], vf);
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[g][e] = fmaf(p, vf[e], acc[g][e]);
        }
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // the ring is reused below

  // Merge the streams.
  static_assert(kStreams * G * (D + 2) * 4 <= decode_smem_bytes<kKv8>(),
                "merge area fits the ring");
  auto& s_acc = *reinterpret_cast<float(*)[kStreams][G][D]>(smem);
  auto& s_m =
      *reinterpret_cast<float(*)[kStreams][G]>(reinterpret_cast<float*>(smem) + kStreams * G * D);
  auto& s_l = *reinterpret_cast<float(*)[kStreams][G]>(reinterpret_cast<float*>(smem) +
                                                       kStreams * G * (D + 1));
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
  finish_decode_streams<T, D, G, kStreams>(a, &s_acc[0][0][0], &s_m[0][0], &s_l[0][0], q_row, head0,
                                           partial_row);
}

constexpr int kMergeParts = 4;  // thread groups that share one row's splits

template <typename T, int D>
__global__ void __launch_bounds__(kMergeParts* D) merge_splits_kernel(const AttentionKernelArgs a) {
  wait_for_prerequisites();  // launched as a dependent of decode_attention_kernel
  allow_dependents();        // the o product (model runner) may start loading its weights
  __shared__ float s_m[kMaxDecodeSplits];  // split maxima
  __shared__ float s_l[kMaxDecodeSplits];  // split sums
  __shared__ float s_w[kMaxDecodeSplits];  // split weights exp2(m_i - m_all)
  __shared__ float s_part[kMergeParts][D];
  const int seq = blockIdx.x;
  const int head = blockIdx.y;
  const int q_row = a.query_start[seq];
  if (a.query_start[seq + 1] - q_row != 1) return;
  const int64_t row0 = (int64_t{seq} * a.num_q_heads + head) * a.num_splits;
  const int tid = threadIdx.x;
  // All split states are read at once (one per thread), not one after another.
  if (tid < a.num_splits) {
    s_m[tid] = a.partial_ml[2 * (row0 + tid)];
    s_l[tid] = a.partial_ml[2 * (row0 + tid) + 1];
  }
  __syncthreads();
  float m_all = -INFINITY;
  for (int i = 0; i < a.num_splits; ++i) m_all = fmaxf(m_all, s_m[i]);
  if (tid < a.num_splits) s_w[tid] = s_m[tid] == -INFINITY ? 0.0f : exp2f(s_m[tid] - m_all);
  __syncthreads();
  const int d = tid % D;
  const int part = tid / D;
  float acc = 0.0f;
#pragma unroll 4
  for (int i = part; i < a.num_splits; i += kMergeParts) {
    // an empty split's accumulator was never written: skip it, never multiply it by 0
    if (s_w[i] > 0.0f) acc = fmaf(s_w[i], a.partial_acc[(row0 + i) * D + d], acc);
  }
  s_part[part][d] = acc;
  __syncthreads();
  if (part == 0) {
    float l_all = 0.0f;
    for (int i = 0; i < a.num_splits; ++i) l_all = fmaf(s_w[i], s_l[i], l_all);
#pragma unroll
    for (int p = 1; p < kMergeParts; ++p) acc += s_part[p][d];
    static_cast<T*>(a.out)[(int64_t{q_row} * a.num_q_heads + head) * D + d] =
        from_float<T>(acc * output_factor(m_all, l_all, a, head));
  }
}

// CTAs of one decode instantiation resident per SM (queried once, for the current device).
template <typename T, int D, int G, KvFormat kKv>
int decode_occupancy() {
  static const int ctas = [] {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &n, decode_attention_kernel<T, D, G, kKv>, kDecodeThreads,
            decode_smem_bytes<kKv != KvFormat::Native>()) != cudaSuccess) {
      cudaGetLastError();
      n = 1;
    }
    return n > 0 ? n : 1;
  }();
  return ctas;
}

template <typename T, int D, KvFormat kKv>
int decode_occupancy_typed(int32_t heads_per_cta) {
  return dispatch_heads_per_cta(
      heads_per_cta, 1, [](auto g) { return decode_occupancy<T, D, decltype(g)::value, kKv>(); });
}

template <typename T, int D>
int decode_occupancy_kv(KvFormat kv, int32_t heads_per_cta) {
  // 8-bit KV below head dim 256 runs on decode_attention_mma.cu's kernel (decode_ctas_per_sm asks
  // it first): this kernel is not instantiated for it
  if constexpr (D < 256) {
    return decode_occupancy_typed<T, D, KvFormat::Native>(heads_per_cta);
  } else {
    switch (kv) {
      case KvFormat::Int8:
        return decode_occupancy_typed<T, D, KvFormat::Int8>(heads_per_cta);
      case KvFormat::Fp8:
        return decode_occupancy_typed<T, D, KvFormat::Fp8>(heads_per_cta);
      default:
        return decode_occupancy_typed<T, D, KvFormat::Native>(heads_per_cta);
    }
  }
}

template <typename T, int D, int G, KvFormat kKv>
cudaError_t launch_decode_one(const AttentionKernelArgs& args, cudaStream_t stream) {
  const dim3 grid(args.num_splits, args.num_kv_heads * args.head_chunks, args.num_seqs);
  return launch_dependent(true, decode_attention_kernel<T, D, G, kKv>, grid, dim3(kDecodeThreads),
                          decode_smem_bytes<kKv != KvFormat::Native>(), stream, args);
}

template <typename T, int D, KvFormat kKv>
cudaError_t launch_decode_typed(const AttentionKernelArgs& args, int32_t heads_per_cta,
                                cudaStream_t stream) {
  return dispatch_heads_per_cta(heads_per_cta, cudaErrorInvalidValue, [&](auto g) {
    return launch_decode_one<T, D, decltype(g)::value, kKv>(args, stream);
  });
}

template <typename T, KvFormat kKv>
cudaError_t launch_decode_dim(const AttentionKernelArgs& args, int32_t head_dim,
                              int32_t heads_per_cta, cudaStream_t stream) {
  // 8-bit KV below head dim 256 runs on decode_attention_mma.cu's kernel
  // (launch_decode_attention sends it there first): this kernel is not instantiated for it
  constexpr bool kNative = kKv == KvFormat::Native;
  switch (head_dim) {
    case 64:
      if constexpr (kNative) return launch_decode_typed<T, 64, kKv>(args, heads_per_cta, stream);
      return cudaErrorInvalidValue;
    case 128:
      if constexpr (kNative) return launch_decode_typed<T, 128, kKv>(args, heads_per_cta, stream);
      return cudaErrorInvalidValue;
    case 256:
      return launch_decode_typed<T, 256, kKv>(args, heads_per_cta, stream);
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
      return launch_dependent(true, merge_splits_kernel<T, 64>, grid, dim3(kMergeParts * 64), 0,
                              stream, args);
    case 128:
      return launch_dependent(true, merge_splits_kernel<T, 128>, grid, dim3(kMergeParts * 128), 0,
                              stream, args);
    case 256:
      return launch_dependent(true, merge_splits_kernel<T, 256>, grid, dim3(kMergeParts * 256), 0,
                              stream, args);
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

template <KvFormat kKv>
cudaError_t launch_decode_kv(const AttentionKernelArgs& args, bool bf16, int32_t head_dim,
                             int32_t heads_per_cta, cudaStream_t stream) {
  return bf16 ? launch_decode_dim<__nv_bfloat16, kKv>(args, head_dim, heads_per_cta, stream)
              : launch_decode_dim<__half, kKv>(args, head_dim, heads_per_cta, stream);
}

}  // namespace

cudaError_t launch_decode_attention(const AttentionKernelArgs& args, bool bf16, KvFormat kv,
                                    int32_t head_dim, int32_t heads_per_cta, bool native_on_mma,
                                    cudaStream_t stream) {
  if (decode_mma_covers(kv, head_dim, native_on_mma)) {
    return launch_decode_attention_mma(args, bf16, kv, head_dim, heads_per_cta, stream);
  }
  switch (kv) {
    case KvFormat::Int8:
      return launch_decode_kv<KvFormat::Int8>(args, bf16, head_dim, heads_per_cta, stream);
    case KvFormat::Fp8:
      return launch_decode_kv<KvFormat::Fp8>(args, bf16, head_dim, heads_per_cta, stream);
    default:
      return launch_decode_kv<KvFormat::Native>(args, bf16, head_dim, heads_per_cta, stream);
  }
}

int decode_ctas_per_sm(bool bf16, KvFormat kv, int32_t head_dim, int32_t heads_per_cta,
                       bool native_on_mma) {
  if (decode_mma_covers(kv, head_dim, native_on_mma)) {
    return decode_mma_ctas_per_sm(bf16, kv, head_dim, heads_per_cta);
  }
  switch (head_dim) {
    case 64:
      return bf16 ? decode_occupancy_kv<__nv_bfloat16, 64>(kv, heads_per_cta)
                  : decode_occupancy_kv<__half, 64>(kv, heads_per_cta);
    case 128:
      return bf16 ? decode_occupancy_kv<__nv_bfloat16, 128>(kv, heads_per_cta)
                  : decode_occupancy_kv<__half, 128>(kv, heads_per_cta);
    default:
      return bf16 ? decode_occupancy_kv<__nv_bfloat16, 256>(kv, heads_per_cta)
                  : decode_occupancy_kv<__half, 256>(kv, heads_per_cta);
  }
}

cudaError_t launch_merge_splits(const AttentionKernelArgs& args, bool bf16, int32_t head_dim,
                                cudaStream_t stream) {
  return bf16 ? launch_merge_dim<__nv_bfloat16>(args, head_dim, stream)
              : launch_merge_dim<__half>(args, head_dim, stream);
}

}  // namespace kvp::cuda::detail

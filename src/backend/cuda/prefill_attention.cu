// Prefill / append attention (q_len >= 2) on tensor cores: flash attention with mma.sync
// m16n8k16 (bf16 or f16 operands, fp32 accumulators), paged K/V gathered through the block
// table with cp.async into a two-stage shared-memory ring.
//
// grid (row tiles, num_seqs, num_kv_heads), 128 threads = 4 warps. The rows of a sequence and
// KV head are its (token, query head of the group) pairs, token-major, so the G query heads that
// share a KV head share every K/V tile:
//
//   row r = token * G + g      (query head kv_head * G + g, position kv_len - q_len + token)
//   CTA tile = 128 rows (64 at head dim 256), warp w owns rows 32w .. 32w+31 (two m16 tiles)
//   key tile = 32 keys (64 at head dim 64), double-buffered
//
// Keys run from the first one the tile's earliest row sees (window) to the last one its latest
// row sees (causal; prefill_tile, attention_device.cuh); masking is applied only on the tiles
// where some row needs it.
//
// Shared memory tiles are [rows][head_dim] with the 16-byte chunk index XOR-swizzled by
// (row & 7), so the 8 row addresses of every ldmatrix fall in distinct banks.
//
// 8-bit KV (kKv8: int8 or fp8 e4m3): the cp.async ring holds the raw 8-bit rows and the 4-byte
// words of their f16 scales; after each tile lands, the CTA widens it to q's dtype (exact: int8
// |q8| <= 127, e4m3 values have 4 significant bits and |q8| <= 448) into one swizzled K and one V
// tile, so the MMA loops are unchanged. The scales never touch the
// operands: the K scale multiplies each score column after Q.K^T, the V scale multiplies each
// probability column after the row sums (P.diag(s_v).V8), both in f32.
#include <cmath>

#include "backend/cuda/attention_device.cuh"

namespace kvp::cuda::detail {
namespace {

constexpr int kPrefillWarps = 4;
constexpr int kPrefillThreads = kPrefillWarps * 32;

template <int D>
__device__ __forceinline__ int swizzle(int row, int chunk) {
  return row * D + ((chunk ^ (row & 7)) << 3);
}

template <int D>
__host__ __device__ constexpr int keys_per_tile() {
  return D >= 128 ? 32 : 64;
}
// m16 tiles per warp: two where the accumulators fit the registers, so every K/V fragment read
// from shared memory feeds two mma instead of one.
template <int D>
__host__ __device__ constexpr int mtiles_per_warp() {
  return D >= 256 ? 1 : 2;
}
template <int D>
__host__ __device__ constexpr int rows_per_cta() {
  return kPrefillWarps * 16 * mtiles_per_warp<D>();
}
// bf16/f16: Q tile + [2 stages][K, V][kBN][D]. 8-bit: Q tile + one widened K and V tile + the
// 8-bit ring [2][K, V][kBN][D] (as many bytes as the 16-bit ring) + scale words and scales.
template <int D, bool kKv8>
__host__ __device__ constexpr int prefill_smem_bytes() {
  return kKv8 ? (rows_per_cta<D>() * D + 2 * keys_per_tile<D>() * D) * 2 +
                    4 * keys_per_tile<D>() * D + 4 * keys_per_tile<D>() * 4
              : (rows_per_cta<D>() * D + 4 * keys_per_tile<D>() * D) * 2;
}

// 8 codes (8 bytes of shared memory) as their 8 values in T, exactly (fp8: the e4m3 values / 256
// as halves, times 256 in f32).
template <typename T, KvFormat kKv>
__device__ __forceinline__ uint4 widen8(const uint2 raw) {
  float f[8];
  if constexpr (kKv == KvFormat::Fp8) {
    __half2 h[4];
    unpack8_kv8_half2<kKv>(raw, h);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 x = __half22float2(h[i]);
      f[2 * i] = x.x * kv8_code_unit<kKv>();
      f[2 * i + 1] = x.y * kv8_code_unit<kKv>();
    }
  } else {
    unpack8_i8(raw, f);
  }
  return make_uint4(pack2<T>(f[0], f[1]), pack2<T>(f[2], f[3]), pack2<T>(f[4], f[5]),
                    pack2<T>(f[6], f[7]));
}

__device__ __forceinline__ void cp_async4(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(src_bytes));
}

template <typename T, int D, KvFormat kKv>
__global__ void __launch_bounds__(kPrefillThreads)
    prefill_attention_kernel(const AttentionKernelArgs a) {
  constexpr bool kKv8 = kKv != KvFormat::Native;
  constexpr int kBN = keys_per_tile<D>();
  constexpr int kMT = mtiles_per_warp<D>();
  constexpr int kRows = rows_per_cta<D>();
  constexpr int kChunks = D / 8;         // 16-byte chunks per row
  constexpr int kStages = kKv8 ? 1 : 2;  // stages of the 16-bit K/V tiles
  extern __shared__ uint4 smem_raw[];
  T* s_q = reinterpret_cast<T*>(smem_raw);  // [kRows][D]
  T* s_k = s_q + kRows * D;                 // [kStages][kBN][D]
  T* s_v = s_k + kStages * kBN * D;         // [kStages][kBN][D]
  // 8-bit only:
  int8_t* s_k8 = reinterpret_cast<int8_t*>(s_v + kStages * kBN * D);          // [2][kBN][D]
  int8_t* s_v8 = s_k8 + 2 * kBN * D;                                          // [2][kBN][D]
  uint32_t* s_scale_words = reinterpret_cast<uint32_t*>(s_v8 + 2 * kBN * D);  // [2][K,V][kBN/2]
  float* s_k_scale = reinterpret_cast<float*>(s_scale_words + 2 * kBN);       // [kBN]
  float* s_v_scale = s_k_scale + kBN;                                         // [kBN]

  const int seq = blockIdx.y;
  const int kv_head = blockIdx.z;
  PrefillTile tile_rows;
  if (!prefill_tile<kRows, kBN>(a, tile_rows)) return;
  // copies, not structured bindings: the .cu files compile as C++17, whose lambdas cannot
  // capture those
  const int q_begin = tile_rows.q_begin;
  const int num_rows = tile_rows.num_rows;
  const int row0 = tile_rows.row0;
  const int kv_len = tile_rows.kv_len;
  const int first_pos = tile_rows.first_pos;
  const int pos_lo = tile_rows.pos_lo;
  const int pos_hi = tile_rows.pos_hi;
  const int key_begin = tile_rows.key_begin;
  const int tile_first = tile_rows.tile_first;
  const int num_tiles = tile_rows.num_tiles;
  const int G = a.group;

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const T* q = static_cast<const T*>(a.q);
  const T* k = static_cast<const T*>(a.k);
  const T* v = static_cast<const T*>(a.v);
  const int32_t* table = a.block_tables + int64_t{seq} * a.max_blocks_per_seq;
  const int64_t head_offset = int64_t{kv_head} * a.block_size * (kKv8 ? D + 2 : D);

  // Q tile (rows past the sequence are zero-filled; they are computed but never stored).
  for (int i = tid; i < kRows * kChunks; i += kPrefillThreads) {
    const int r = i / kChunks;
    const int c = i % kChunks;
    const T* src;
    const bool valid = q_chunk_source<T, D>(a, q, q_begin, num_rows, kv_head, row0 + r, c, src);
    cp_async16(s_q + swizzle<D>(r, c), src, valid ? 16 : 0);
  }
  // 8-bit: raw rows (16-byte chunks of 16 values) and, per key pair, the scale words.
  auto load_kv8 = [&](int tile, int stage) {
    const int n0 = (tile_first + tile) * kBN;
    const auto* k8 = static_cast<const int8_t*>(a.k);  // int8 or e4m3 codes
    const auto* v8 = static_cast<const int8_t*>(a.v);
    int8_t* dk = s_k8 + stage * kBN * D;
    int8_t* dv = s_v8 + stage * kBN * D;
    for (int i = tid; i < kBN * (D / 16); i += kPrefillThreads) {
      const int r = i / (D / 16);
      const int c = i % (D / 16);
      const int j = n0 + r;
      int64_t off = 0;
      const bool valid = j >= key_begin && j < kv_len;  // as in load_kv
      if (valid) {
        off = int64_t{table[block_index(j, a)]} * a.block_pitch + head_offset +
              index_in_block(j, a) * D + c * 16;
      }
      cp_async16(dk + r * D + c * 16, k8 + off, valid ? 16 : 0);
      cp_async16(dv + r * D + c * 16, v8 + off, valid ? 16 : 0);
    }
    if (tid < kBN / 2) {
      // keys j, j + 1 (j even) share a block (block_size is even) and a scale word
      const int j = n0 + 2 * tid;
      const bool valid = j + 1 >= key_begin && j < kv_len;
      int64_t off = 0;
      if (valid) {
        off = int64_t{table[block_index(j, a)]} * a.block_pitch + head_offset +
              int64_t{a.block_size} * D + index_in_block(j, a) * 2;
      }
      cp_async4(s_scale_words + stage * kBN + tid, k8 + off, valid ? 4 : 0);
      cp_async4(s_scale_words + stage * kBN + kBN / 2 + tid, v8 + off, valid ? 4 : 0);
    }
  };
  // 8-bit: widens the landed stage into s_k / s_v and its scales into s_k_scale / s_v_scale
  // (0 for keys outside [key_begin, kv_len): their p is 0 and must stay 0, never 0 * NaN).
  auto widen_kv8 = [&](int tile, int stage) {
    const int n0 = (tile_first + tile) * kBN;
    const int8_t* sk = s_k8 + stage * kBN * D;
    const int8_t* sv = s_v8 + stage * kBN * D;
    for (int i = tid; i < kBN * kChunks; i += kPrefillThreads) {
      const int r = i / kChunks;
      const int c = i % kChunks;
      *reinterpret_cast<uint4*>(s_k + swizzle<D>(r, c)) =
          widen8<T, kKv>(*reinterpret_cast<const uint2*>(sk + r * D + c * 8));
      *reinterpret_cast<uint4*>(s_v + swizzle<D>(r, c)) =
          widen8<T, kKv>(*reinterpret_cast<const uint2*>(sv + r * D + c * 8));
    }
    if (tid < kBN) {
      const int j = n0 + tid;
      const bool valid = j >= key_begin && j < kv_len;
      const uint32_t kw = s_scale_words[stage * kBN + tid / 2];
      const uint32_t vw = s_scale_words[stage * kBN + kBN / 2 + tid / 2];
      const int shift = (tid & 1) * 16;  // n0 is even: key parity is tid's
      s_k_scale[tid] =
          valid ? __half2float(__ushort_as_half(static_cast<uint16_t>(kw >> shift))) : 0.0f;
      s_v_scale[tid] =
          valid ? __half2float(__ushort_as_half(static_cast<uint16_t>(vw >> shift))) : 0.0f;
    }
  };
  auto load_kv = [&](int tile, int stage) {
    if constexpr (kKv8) {
      load_kv8(tile, stage);
      return;
    }
    const int n0 = (tile_first + tile) * kBN;
    T* dk = s_k + stage * kBN * D;
    T* dv = s_v + stage * kBN * D;
    for (int i = tid; i < kBN * kChunks; i += kPrefillThreads) {
      const int r = i / kChunks;
      const int c = i % kChunks;
      int64_t off;
      const bool valid =
          kv_chunk_offset<D>(a, table, head_offset, n0 + r, c, key_begin, kv_len, off);
      cp_async16(dk + swizzle<D>(r, c), k + off, valid ? 16 : 0);
      cp_async16(dv + swizzle<D>(r, c), v + off, valid ? 16 : 0);
    }
  };
  load_kv(0, 0);
  cp_async_commit();

  // This thread's rows: m-tile mt, C fragment rows lane/4 (h = 0) and lane/4 + 8 (h = 1) of the
  // warp's rows warp*16*kMT + mt*16 ...
  const int warp_row0 = warp * 16 * kMT;
  int pos[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + warp_row0 + mt * 16 + lane / 4 + h * 8;
      pos[mt][h] = row < num_rows ? first_pos + row / G : pos_hi;
    }
  }
  float o[kMT][D / 8][4];
  float m[kMT][2], l[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int n = 0; n < D / 8; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.0f;
    m[mt][0] = m[mt][1] = -INFINITY;
    l[mt][0] = l[mt][1] = 0.0f;
  }
  const bool soft_cap = a.cap_log2 > 0.0f;

  for (int t = 0; t < num_tiles; ++t) {
    if (t + 1 < num_tiles) {
      load_kv(t + 1, (t + 1) & 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if constexpr (kKv8) {
      widen_kv8(t, t & 1);
      __syncthreads();
    }
    const T* tk = s_k + (kKv8 ? 0 : (t & 1) * kBN * D);
    const T* tv = s_v + (kKv8 ? 0 : (t & 1) * kBN * D);

    float s[kMT][kBN / 8][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int n = 0; n < kBN / 8; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0;
    }
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t qa[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        ldmatrix_x4(qa[mt],
                    s_q + swizzle<D>(warp_row0 + mt * 16 + (lane & 15), kk * 2 + (lane >> 4)));
      }
#pragma unroll
      for (int np = 0; np < kBN / 16; ++np) {
        uint32_t kb[4];
        ldmatrix_x4(kb, tk + swizzle<D>(np * 16 + (lane & 7) + ((lane >> 4) << 3),
                                        kk * 2 + ((lane >> 3) & 1)));
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma16816<T>(s[mt][2 * np], qa[mt], kb[0], kb[1]);
          mma16816<T>(s[mt][2 * np + 1], qa[mt], kb[2], kb[3]);
        }
      }
    }

    if constexpr (kKv8) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int n = 0; n < kBN / 8; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mt][n][e] *= s_k_scale[n * 8 + (lane % 4) * 2 + (e & 1)];
        }
      }
    }
    const int n0 = (tile_first + t) * kBN;
    const bool need_mask = n0 + kBN - 1 > pos_lo || (a.window > 0 && pos_hi - n0 >= a.window);
    // Without a soft cap the scores stay raw: the scale is folded into the exp2's FMA (mul > 0,
    // so maxima commute with it). The soft cap's tanh runs under a uniform branch.
    float mul = a.qk_mul;
    if (soft_cap) {
      mul = 1.0f;
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int n = 0; n < kBN / 8; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mt][n][e] = a.cap_log2 * tanhf(s[mt][n][e] * a.qk_mul);
        }
      }
    }
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int n = 0; n < kBN / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = s[mt][n][e];
          if (need_mask) {
            const int j = n0 + n * 8 + (lane % 4) * 2 + (e & 1);
            const int p = pos[mt][e >> 1];
            if (j > p || (a.window > 0 && p - j >= a.window)) x = -INFINITY;
          }
          s[mt][n][e] = x;
          tile_max[e >> 1] = fmaxf(tile_max[e >> 1], x);
        }
      }
      float base[2], correction[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
        tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
        const float m_new = fmaxf(m[mt][h], tile_max[h] * mul);
        base[h] = m_new == -INFINITY ? 0.0f : m_new;  // a row with no visible key yet
        correction[h] = exp2f(m[mt][h] - base[h]);
        m[mt][h] = m_new;
        l[mt][h] *= correction[h];
      }
      // Most tiles leave every row maximum of the warp unchanged: skip the accumulator rescale.
      if (__any_sync(0xffffffffu, correction[0] != 1.0f || correction[1] != 1.0f)) {
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
          o[mt][n][0] *= correction[0];
          o[mt][n][1] *= correction[0];
          o[mt][n][2] *= correction[1];
          o[mt][n][3] *= correction[1];
        }
      }
#pragma unroll
      for (int n = 0; n < kBN / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[mt][n][e] = exp2f(fmaf(s[mt][n][e], mul, -base[e >> 1]));
          l[mt][e >> 1] += s[mt][n][e];
        }
      }
      if constexpr (kKv8) {
#pragma unroll
        for (int n = 0; n < kBN / 8; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mt][n][e] *= s_v_scale[n * 8 + (lane % 4) * 2 + (e & 1)];
        }
      }
    }

    // O += P V, P straight from the score registers (C layout == A layout pairwise).
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      uint32_t pa[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        pa[mt][0] = pack2<T>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        pa[mt][1] = pack2<T>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        pa[mt][2] = pack2<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        pa[mt][3] = pack2<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, tv + swizzle<D>(kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                              dp * 2 + (lane >> 4)));
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma16816<T>(o[mt][2 * dp], pa[mt], vb[0], vb[1]);
          mma16816<T>(o[mt][2 * dp + 1], pa[mt], vb[2], vb[3]);
        }
      }
    }
    __syncthreads();  // the next iteration's loads overwrite this stage
  }

  T* out = static_cast<T*>(a.out);
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = l[mt][h];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const int row = row0 + warp_row0 + mt * 16 + lane / 4 + h * 8;
      if (row >= num_rows) continue;
      const float inv = output_factor(m[mt][h], sum, a, kv_head * G + row % G);
      T* dst = out + (int64_t{q_begin + row / G} * a.num_q_heads + kv_head * G + row % G) * D +
               (lane % 4) * 2;
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        *reinterpret_cast<uint32_t*>(dst + n * 8) =
            pack2<T>(o[mt][n][2 * h] * inv, o[mt][n][2 * h + 1] * inv);
      }
    }
  }
}

template <typename T, int D, KvFormat kKv>
cudaError_t launch_prefill_typed(const AttentionKernelArgs& args, int32_t max_q_len,
                                 cudaStream_t stream) {
  constexpr int kSmem = prefill_smem_bytes<D, kKv != KvFormat::Native>();
  if (const cudaError_t e = set_smem_limit_once<prefill_attention_kernel<T, D, kKv>>(kSmem);
      e != cudaSuccess) {
    return e;
  }
  const int64_t rows = int64_t{max_q_len} * args.group;
  const dim3 grid(static_cast<unsigned>((rows + rows_per_cta<D>() - 1) / rows_per_cta<D>()),
                  args.num_seqs, args.num_kv_heads);
  prefill_attention_kernel<T, D, kKv><<<grid, kPrefillThreads, kSmem, stream>>>(args);
  return cudaGetLastError();
}

template <typename T, KvFormat kKv>
cudaError_t launch_prefill_dim(const AttentionKernelArgs& args, int32_t head_dim, int32_t max_q_len,
                               cudaStream_t stream) {
  switch (head_dim) {
    case 64:
      return launch_prefill_typed<T, 64, kKv>(args, max_q_len, stream);
    case 128:
      return launch_prefill_typed<T, 128, kKv>(args, max_q_len, stream);
    case 256:
      return launch_prefill_typed<T, 256, kKv>(args, max_q_len, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

template <KvFormat kKv>
cudaError_t launch_prefill_kv(const AttentionKernelArgs& args, bool bf16, int32_t head_dim,
                              int32_t max_q_len, cudaStream_t stream) {
  return bf16 ? launch_prefill_dim<__nv_bfloat16, kKv>(args, head_dim, max_q_len, stream)
              : launch_prefill_dim<__half, kKv>(args, head_dim, max_q_len, stream);
}

}  // namespace

cudaError_t launch_prefill_attention(const AttentionKernelArgs& args, bool bf16, KvFormat kv,
                                     int32_t head_dim, int32_t max_q_len, cudaStream_t stream) {
  switch (kv) {
    case KvFormat::Int8:
      return launch_prefill_kv<KvFormat::Int8>(args, bf16, head_dim, max_q_len, stream);
    case KvFormat::Fp8:
      return launch_prefill_kv<KvFormat::Fp8>(args, bf16, head_dim, max_q_len, stream);
    default:
      return launch_prefill_kv<KvFormat::Native>(args, bf16, head_dim, max_q_len, stream);
  }
}

}  // namespace kvp::cuda::detail

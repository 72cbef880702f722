// Decode attention (q_len == 1) on tensor cores at head dim 64 or 128: over 16-bit KV (bf16 /
// f16, q's dtype) and over an 8-bit pool (int8 or fp8 e4m3, issue 17). Same grid and contract as
// decode_attention_kernel (decode_attention.cu), which keeps head dim 256 and, under
// set_decode_kernel(DecodeKernel::Lanes), 16-bit KV: grid (num_splits, num_kv_heads *
// head_chunks, num_seqs), 128 threads, a CTA owns query heads head0 .. head0+G-1 of one KV head
// and one slice of the keys, and writes the output rows (one split) or its split's partial state
// for merge_splits_kernel.
//
// Why a second kernel: the per-lane kernel reduces every q.k over 16 lanes by shuffles and redoes
// the softmax on all of them (~190 instructions a key on 8-bit rows, half the copy rate; 0.90-0.94
// of it on 16-bit rows at large batch x context). Here a warp takes 16 keys a step, and the CTA's
// G query heads are the rows of S and the columns of O^T in mma.sync m16n8k16:
//
//   S   [16 rows: heads][16 keys]   = Q [16][D] . K^T          (2 x D/16 mma; rows G..15 zero)
//   O^T [D][8 columns: heads]      += V^T [D][16 keys] . P^T   (D/16 mma; columns G..7 ignored)
//
// 16-bit KV: the rows land in shared memory as they are, 16-byte chunk c of row r at chunk
// c ^ (r & 7), and the fragments come by ldmatrix: K's B fragments (keys g, 8 + g; dims 2t, 2t+1
// | 2t+8, 2t+9 of each k16 step) by ldmatrix.x4, V^T's A fragments (dims g, g + 8; keys 2t, 2t+1
// | 2t+8, 2t+9) by ldmatrix.x4.trans of the same [key][dim] tile. Q's A fragment is q itself
// (qk_mul multiplies S in f32).
//
// 8-bit KV: K and V stay 8-bit in shared memory and are widened to f16 as the fragments are
// built. A fragment's dims may be any permutation of the head dims as long as both operands use
// it:
//   q.k: lane (g, t) = (lane / 4, lane % 4) reads dims t*D/4 .. t*D/4 + D/4 - 1 of its K rows
//        (keys g and 8 + g); k16 step c's slots {2t, 2t+1 | 2t+8, 2t+9} are dims t*D/4 + 4c +
//        {0, 1 | 2, 3}, and Q's A fragment (q * qk_mul in f16) is built the same way;
//   p.v: rows g and g + 8 of m-tile mt are dims g*D/16 + mt and (g+8)*D/16 + mt, so lane (g, t)
//        reads D/16-byte runs at those offsets of keys 2t, 2t+1 and 2t+8, 2t+9, and a byte
//        permute pairs two keys' bytes of one dim into the A fragment.
// The K scale multiplies S; the V scale multiplies p before it is packed (as the per-lane kernel
// does).
//
// Both: S's C fragment (head g, keys 2t, 2t+1 | 8+2t, 9+2t) is P^T's B fragment, so P never leaves
// the registers. O^T's accumulators hold heads 2t and 2t + 1, whose softmax corrections come from
// the lanes of rows 2t and 2t + 1 by shuffle.
//
// Each warp streams its own 16-key groups (16-aligned in the sequence; keys outside the split are
// zero-filled and masked) through a kStages-deep cp.async ring: the 32 lanes copy the group's K
// and V rows in 16-byte pieces and (8-bit) 16 lanes the 8 K and 8 V scale words (a word holds the
// f16 scales of keys 2i and 2i+1). The warps' (m, l, O) states merge through shared memory at the
// end.
//
//   one warp's stage, 16-bit: K [16][2D] bytes | V [16][2D] bytes                (8 KB at D 128)
//   one warp's stage, 8-bit:  K [16][D] bytes | V [16][D] bytes | K scale words [8] | V [8]
#include "backend/cuda/attention_device.cuh"
#include "backend/cuda/dependent_launch.cuh"

namespace kvp::cuda::detail {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kStages = 3;
constexpr int kGroupKeys = 16;  // keys a warp takes per step

// Bytes of one K (or V) row in the ring: D codes (8-bit) or D values of 2 bytes.
template <int D, bool kKv8>
__host__ __device__ constexpr int ring_row_bytes() {
  return kKv8 ? D : 2 * D;
}
template <int D, bool kKv8>
__host__ __device__ constexpr int warp_stage_bytes() {
  return 2 * kGroupKeys * ring_row_bytes<D, kKv8>() + (kKv8 ? 2 * 8 * 4 : 0);
}
template <int D, bool kKv8>
__host__ __device__ constexpr int mma_decode_smem_bytes() {
  return kStages * kWarps * warp_stage_bytes<D, kKv8>();
}

// Byte offset of 16-byte chunk c of row r in a 16-bit [16][D] tile: chunk c ^ (r & 7), so the 8
// row addresses of an ldmatrix (one chunk of 8 rows) fall in distinct banks.
template <int D>
__device__ __forceinline__ int tile16_byte(int r, int c) {
  return r * 2 * D + ((c ^ (r & 7)) << 4);
}

// 8-bit: byte offset of byte b of row r in a [16][D] tile of 16-byte chunks stored swizzled.
template <int D>
__device__ __forceinline__ int tile_byte(int r, int b) {
  const int x = D >= 128 ? (r & 7) : ((r >> 1) & (D / 16 - 1));
  return r * D + ((((b >> 4) ^ x)) << 4) + (b & 15);
}
template <int D>
__device__ __forceinline__ uint2 lds8(const char* tile, int r, int b) {
  return *reinterpret_cast<const uint2*>(tile + tile_byte<D>(r, b));
}

// kRun bytes (4 or 8) of row r from byte b as words.
template <int kRun, int D>
__device__ __forceinline__ void lds_run_d(const char* tile, int r, int b, uint32_t (&w)[kRun / 4]) {
  if constexpr (kRun == 8) {
    const uint2 x = lds8<D>(tile, r, b);
    w[0] = x.x;
    w[1] = x.y;
  } else {
    w[0] = *reinterpret_cast<const uint32_t*>(tile + tile_byte<D>(r, b));
  }
}
// The bytes of words a and b (4 dims of two keys) as (a0, b0, a1, b1 | a2, b2, a3, b3): pairs
// (key a, key b) of one dim, which unpack8_kv8_half2 widens into one half2 each.
__device__ __forceinline__ uint2 pair_bytes(uint32_t a, uint32_t b) {
  return make_uint2(__byte_perm(a, b, 0x5140), __byte_perm(a, b, 0x7362));
}

template <typename T, int D, int G, KvFormat kKv>
__global__ void __launch_bounds__(kThreads, 4) decode_mma_kernel(const AttentionKernelArgs a) {
  static_assert(D == 64 || D == 128, "head dim 64 or 128");
  static_assert(G >= 1 && G <= 8, "the heads are rows 0..7 of the m16 tile");
  wait_for_prerequisites();  // launched as a dependent of the KV write (or the prefill kernel)
  allow_dependents();        // the merge may be scheduled
  constexpr bool kKv8 = kKv != KvFormat::Native;
  constexpr int kRowBytes = ring_row_bytes<D, kKv8>();
  constexpr int kDq = D / 4;                               // 8-bit: K dims a lane reads per row
  constexpr int kRun = D / 16;                             // 8-bit: V bytes a lane reads per run
  constexpr int kSteps = D / 16;                           // k16 steps of q.k, m-tiles of O^T
  constexpr int kRowPieces = kRowBytes / 16;               // 16-byte pieces of a row
  constexpr int kLaneRows = kGroupKeys * kRowPieces / 32;  // rows a lane copies (K and V)
  // 8-bit: the unit of a code; 16-bit: qk_mul (Q's fragment is q as it is)
  const float unit = kKv8 ? kv8_code_unit<kKv>() : a.qk_mul;

  DecodeSplit split;
  if (!decode_split<G>(a, split)) return;
  // copies, not structured bindings: the .cu files compile as C++17, whose lambdas cannot
  // capture those
  const int seq = split.seq, kv_head = split.kv_head, head0 = split.head0, q_row = split.q_row;
  const int begin = split.begin, end = split.end;
  const int64_t partial_row = split.partial_row;

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;  // fragment row: query head head0 + g
  const int t = lane % 4;

  // Q's A fragments (rows 8..15 are the zero registers passed to mma). 16-bit: q's dims 16c + 2t,
  // 2t + 1 and 16c + 2t + 8, 2t + 9 as they are; 8-bit: q * qk_mul in f16 at the permuted dims.
  uint32_t qa[kSteps][2];
  if constexpr (kKv8) {
    float qf[kDq];
#pragma unroll
    for (int i = 0; i < kDq; ++i) qf[i] = 0.0f;
    if (g < G) {
      const uint4* src = reinterpret_cast<const uint4*>(
          static_cast<const T*>(a.q) + (int64_t{q_row} * a.num_q_heads + head0 + g) * D + t * kDq);
#pragma unroll
      for (int i = 0; i < kDq / 8; ++i) {
        float f[8];
        unpack8<T>(__ldg(src + i), f);
#pragma unroll
        for (int e = 0; e < 8; ++e) qf[8 * i + e] = f[e] * a.qk_mul;
      }
    }
#pragma unroll
    for (int c = 0; c < kSteps; ++c) {
      qa[c][0] = half2_bits(__floats2half2_rn(qf[4 * c], qf[4 * c + 1]));
      qa[c][1] = half2_bits(__floats2half2_rn(qf[4 * c + 2], qf[4 * c + 3]));
    }
  } else {
    const uint32_t* src = reinterpret_cast<const uint32_t*>(
        static_cast<const T*>(a.q) + (int64_t{q_row} * a.num_q_heads + head0 + g) * D);
#pragma unroll
    for (int c = 0; c < kSteps; ++c) {
      qa[c][0] = g < G ? __ldg(src + 8 * c + t) : 0u;
      qa[c][1] = g < G ? __ldg(src + 8 * c + t + 4) : 0u;
    }
  }

  const int32_t* table = a.block_tables + int64_t{seq} * a.max_blocks_per_seq;
  // bytes: a head's run in a block (8-bit: its rows, then its f16 scales), a block
  const int64_t head_run = int64_t{kv_head} * a.block_size * (kKv8 ? D + 2 : kRowBytes);
  const int64_t block_bytes = kKv8 ? a.block_pitch : a.block_pitch * 2;
  const char* k_base = static_cast<const char*>(a.k) + head_run;
  const char* v_base = static_cast<const char*>(a.v) + head_run;
  const int64_t scale_run = int64_t{a.block_size} * D;  // 8-bit: from a head run to its scales
  const int key0 = begin & ~(kGroupKeys - 1);
  constexpr int kCtaKeys = kWarps * kGroupKeys;
  const int num_steps = (end - key0 + kCtaKeys - 1) / kCtaKeys;  // uniform over the CTA
  auto group_key = [&](int step) { return key0 + (step * kWarps + warp) * kGroupKeys; };
  // This lane's copies: piece lane + 32 i of the group's K (and V) rows, i < kLaneRows, all in
  // 16-byte column `piece_col`; 8-bit: lanes below 16 also copy scale word `pair` of K (< 8) or V.
  const int piece_col = lane % kRowPieces;
  auto piece_row = [&](int i) { return (lane + 32 * i) / kRowPieces; };
  auto piece_at = [&](int r) {
    if constexpr (kKv8) {
      return tile_byte<D>(r, piece_col * 16);
    } else {
      return tile16_byte<D>(r, piece_col);
    }
  };
  const int pair = lane & 7;
  // 16-bit: the key row (of a 16-key group) and chunk parity this lane addresses in an ldmatrix.x4
  // (lanes 0-7 / 8-15 / 16-23 / 24-31: keys 0-7, 0-7, 8-15, 8-15 at chunks 2c, 2c + 1, 2c, 2c + 1)
  const int ld_row = (lane & 7) + ((lane >> 4) << 3);
  const int ld_chunk = (lane >> 3) & 1;

  extern __shared__ uint4 smem[];
  char* ring = reinterpret_cast<char*>(smem) + warp * kStages * warp_stage_bytes<D, kKv8>();

  // Block-table entries of a step's rows (and, 8-bit, of its scale pair), loaded a step ahead.
  int32_t blocks[kLaneRows + 1];
  auto load_blocks = [&](int step) {
    const int k0 = group_key(step);
#pragma unroll
    for (int i = 0; i < kLaneRows; ++i) {
      const int j = k0 + piece_row(i);
      blocks[i] = j >= begin && j < end ? __ldg(table + block_index(j, a)) : 0;
    }
    if constexpr (kKv8) {
      const int j = k0 + 2 * pair;  // keys j, j + 1 share a block (block sizes are even)
      blocks[kLaneRows] =
          lane < 16 && j + 1 >= begin && j < end ? __ldg(table + block_index(j, a)) : 0;
    }
  };
  auto issue = [&](int step) {
    char* stage = ring + (step % kStages) * warp_stage_bytes<D, kKv8>();
    const int k0 = group_key(step);
#pragma unroll
    for (int i = 0; i < kLaneRows; ++i) {
      const int r = piece_row(i);
      const int j = k0 + r;
      const bool valid = j >= begin && j < end;
      const int64_t off = valid ? int64_t{blocks[i]} * block_bytes +
                                      int64_t{index_in_block(j, a)} * kRowBytes + piece_col * 16
                                : 0;
      cp_async16(stage + piece_at(r), k_base + off, valid ? 16 : 0);
      cp_async16(stage + kGroupKeys * kRowBytes + piece_at(r), v_base + off, valid ? 16 : 0);
    }
    if constexpr (kKv8) {
      if (lane < 16) {
        const int j = k0 + 2 * pair;
        const bool valid = j + 1 >= begin && j < end;
        const int64_t off = valid ? int64_t{blocks[kLaneRows]} * block_bytes + scale_run +
                                        int64_t{index_in_block(j, a)} * 2
                                  : 0;
        cp_async_small<4>(stage + 2 * kGroupKeys * D + lane * 4, (lane < 8 ? k_base : v_base) + off,
                          valid ? 4 : 0);
      }
    }
    cp_async_commit();
  };

#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    load_blocks(st);
    issue(st);
  }
  load_blocks(kStages - 1);

  const bool soft_cap = a.cap_log2 > 0.0f;
  float m_run = -INFINITY;  // running max of head g (the same on the 4 lanes of a row)
  float l_run = 0.0f;       // this lane's part of the running sum of head g
  float o[kSteps][4];       // O^T's C fragments (m-tiles of 16 dims, columns = heads)
#pragma unroll
  for (int mt = 0; mt < kSteps; ++mt) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.0f;

  for (int step = 0; step < num_steps; ++step) {
    cp_async_wait<kStages - 2>();
    // The step's rows were copied by the whole warp; the barrier also keeps every lane's reads of
    // step - 1 before the copies issued next overwrite that stage.
    __syncwarp();
    issue(step + kStages - 1);
    load_blocks(step + kStages);
    const char* stage = ring + (step % kStages) * warp_stage_bytes<D, kKv8>();
    const char* v_tile = stage + kGroupKeys * kRowBytes;

    // S = Q K^T: n-tile 0 holds keys 0..7, n-tile 1 keys 8..15 (lane: key nt*8 + g's row).
    float s[2][4] = {};
    if constexpr (kKv8) {
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int c2 = 0; c2 < kSteps / 2; ++c2) {
          __half2 h[4];
          unpack8_kv8_half2<kKv>(lds8<D>(stage, nt * 8 + g, t * kDq + 8 * c2), h);
          const uint32_t a0[4] = {qa[2 * c2][0], 0u, qa[2 * c2][1], 0u};
          const uint32_t a1[4] = {qa[2 * c2 + 1][0], 0u, qa[2 * c2 + 1][1], 0u};
          mma16816<__half>(s[nt], a0, half2_bits(h[0]), half2_bits(h[1]));
          mma16816<__half>(s[nt], a1, half2_bits(h[2]), half2_bits(h[3]));
        }
      }
    } else {
#pragma unroll
      for (int c = 0; c < kSteps; ++c) {
        uint32_t kb[4];  // [n-tile 0: b0, b1 | n-tile 1: b0, b1]
        ldmatrix_x4(kb, stage + tile16_byte<D>(ld_row, 2 * c + ld_chunk));
        const uint32_t qf[4] = {qa[c][0], 0u, qa[c][1], 0u};
        mma16816<T>(s[0], qf, kb[0], kb[1]);
        mma16816<T>(s[1], qf, kb[2], kb[3]);
      }
    }

    // Online softmax of head g over the lane's keys 2t, 2t+1, 8+2t, 9+2t.
    const int k0 = group_key(step);
    float x[4] = {s[0][0], s[0][1], s[1][0], s[1][1]};
    float2 vs_lo = make_float2(1.0f, 1.0f), vs_hi = vs_lo;  // 8-bit: the V scales
    if constexpr (kKv8) {
      const uint32_t* words = reinterpret_cast<const uint32_t*>(stage + 2 * kGroupKeys * D);
      const float2 ks_lo = __half22float2(*reinterpret_cast<const __half2*>(&words[t]));
      const float2 ks_hi = __half22float2(*reinterpret_cast<const __half2*>(&words[4 + t]));
      vs_lo = __half22float2(*reinterpret_cast<const __half2*>(&words[8 + t]));
      vs_hi = __half22float2(*reinterpret_cast<const __half2*>(&words[12 + t]));
      x[0] *= ks_lo.x;
      x[1] *= ks_lo.y;
      x[2] *= ks_hi.x;
      x[3] *= ks_hi.y;
    }
    float step_max = -INFINITY;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int j = k0 + (i >> 1) * 8 + 2 * t + (i & 1);
      float xi = x[i] * unit;
      if (soft_cap) xi = a.cap_log2 * tanhf(xi);
      if (j < begin || j >= end) xi = -INFINITY;
      x[i] = xi;
      step_max = fmaxf(step_max, xi);
    }
    step_max = fmaxf(step_max, __shfl_xor_sync(0xffffffffu, step_max, 1));
    step_max = fmaxf(step_max, __shfl_xor_sync(0xffffffffu, step_max, 2));
    const float m_new = fmaxf(m_run, step_max);
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // no key seen yet: p = 0 below
    const float correction = exp2f(m_run - m_use);
    m_run = m_new;
    float p[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) p[i] = exp2f(x[i] - m_use);
    l_run = fmaf(l_run, correction, (p[0] + p[1]) + (p[2] + p[3]));
    // This lane's accumulator columns are heads 2t and 2t + 1, whose corrections live on the
    // lanes of rows 2t and 2t + 1.
    const float correction_lo = __shfl_sync(0xffffffffu, correction, 8 * t);
    const float correction_hi = __shfl_sync(0xffffffffu, correction, 8 * t + 4);
#pragma unroll
    for (int mt = 0; mt < kSteps; ++mt) {
      o[mt][0] *= correction_lo;
      o[mt][1] *= correction_hi;
      o[mt][2] *= correction_lo;
      o[mt][3] *= correction_hi;
    }

    if constexpr (kKv8) {
      // P^T's B fragment is S's C fragment (head g, keys 2t, 2t+1 | 8+2t, 9+2t), V scale folded
      // in.
      const float v_unit = kv8_code_unit<kKv>();
      const uint32_t pb0 =
          half2_bits(__floats2half2_rn(p[0] * vs_lo.x * v_unit, p[1] * vs_lo.y * v_unit));
      const uint32_t pb1 =
          half2_bits(__floats2half2_rn(p[2] * vs_hi.x * v_unit, p[3] * vs_hi.y * v_unit));
      // O^T += V^T P^T: m-tile mt's rows g and g + 8 are dims g*kRun + mt and (g+8)*kRun + mt,
      // so the lane reads runs of kRun bytes at g*kRun and (g+8)*kRun of keys 2t, 2t+1 (a0, a1)
      // and 2t+8, 2t+9 (a2, a3); a byte permute pairs two keys' bytes of one dim.
      uint32_t lo[4][kRun / 4], hi[4][kRun / 4];  // [key 2t, 2t+1, 2t+8, 2t+9][word of the run]
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int r = 2 * t + (k & 1) + (k >> 1) * 8;
        lds_run_d<kRun, D>(v_tile, r, g * kRun, lo[k]);
        lds_run_d<kRun, D>(v_tile, r, (g + 8) * kRun, hi[k]);
      }
#pragma unroll
      for (int w = 0; w < kRun / 4; ++w) {
        // [row g | g+8][keys 2t, 2t+1 | 2t+8, 2t+9] pairs of the word's 4 dims
        __half2 v_lo01[4], v_lo89[4], v_hi01[4], v_hi89[4];
        unpack8_kv8_half2<kKv>(pair_bytes(lo[0][w], lo[1][w]), v_lo01);
        unpack8_kv8_half2<kKv>(pair_bytes(lo[2][w], lo[3][w]), v_lo89);
        unpack8_kv8_half2<kKv>(pair_bytes(hi[0][w], hi[1][w]), v_hi01);
        unpack8_kv8_half2<kKv>(pair_bytes(hi[2][w], hi[3][w]), v_hi89);
#pragma unroll
        for (int d = 0; d < 4; ++d) {
          const uint32_t va[4] = {half2_bits(v_lo01[d]), half2_bits(v_hi01[d]),
                                  half2_bits(v_lo89[d]), half2_bits(v_hi89[d])};
          mma16816<__half>(o[4 * w + d], va, pb0, pb1);
        }
      }
    } else {
      const uint32_t pb0 = pack2<T>(p[0], p[1]);
      const uint32_t pb1 = pack2<T>(p[2], p[3]);
      // O^T += V^T P^T: m-tile mt's rows g and g + 8 are dims 16mt + g and 16mt + g + 8; the
      // transposing ldmatrix of V's [key][dim] chunks 2mt, 2mt + 1 gives V^T's A fragment.
#pragma unroll
      for (int mt = 0; mt < kSteps; ++mt) {
        uint32_t va[4];
        ldmatrix_x4_trans(va, v_tile + tile16_byte<D>(ld_row, 2 * mt + ld_chunk));
        mma16816<T>(o[mt], va, pb0, pb1);
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // the ring is reused below

  // Merge the warps. Lane (g, t) holds heads 2t (o[mt][0], o[mt][2]) and 2t + 1 (o[mt][1],
  // o[mt][3]) at m-tile rows g ([0], [1]) and g + 8 ([2], [3]): dims g*kRun + mt and
  // (g+8)*kRun + mt (8-bit), 16mt + g and 16mt + g + 8 (16-bit).
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 1);
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 2);
  static_assert(kWarps * G * (D + 2) * 4 <= mma_decode_smem_bytes<D, kKv8>(),
                "merge area fits the ring");
  float* s_acc = reinterpret_cast<float*>(smem);  // [kWarps][G][D]
  float* s_m = s_acc + kWarps * G * D;            // [kWarps][G]
  float* s_l = s_m + kWarps * G;                  // [kWarps][G]
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int head = 2 * t + h;
    if (head < G) {
      float* row = s_acc + (warp * G + head) * D;
#pragma unroll
      for (int mt = 0; mt < kSteps; ++mt) {
        const int lo = kKv8 ? g * kRun + mt : 16 * mt + g;
        const int hi = kKv8 ? (g + 8) * kRun + mt : 16 * mt + g + 8;
        row[lo] = o[mt][h];
        row[hi] = o[mt][2 + h];
      }
    }
  }
  if (g < G && t == 0) {
    s_m[warp * G + g] = m_run;
    s_l[warp * G + g] = l_run;
  }
  __syncthreads();
  finish_decode_streams<T, D, G, kWarps>(a, s_acc, s_m, s_l, q_row, head0, partial_row);
}

template <typename T, int D, int G, KvFormat kKv>
int occupancy() {
  static const int ctas = [] {
    int n = 0;
    constexpr int kBytes = mma_decode_smem_bytes<D, kKv != KvFormat::Native>();
    if (set_smem_limit_once<decode_mma_kernel<T, D, G, kKv>>(kBytes) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, decode_mma_kernel<T, D, G, kKv>, kThreads,
                                                      kBytes) != cudaSuccess) {
      cudaGetLastError();
      n = 1;
    }
    return n > 0 ? n : 1;
  }();
  return ctas;
}

template <typename T, int D, int G, KvFormat kKv>
cudaError_t launch_one(const AttentionKernelArgs& args, cudaStream_t stream) {
  constexpr auto kernel = decode_mma_kernel<T, D, G, kKv>;
  constexpr int kBytes = mma_decode_smem_bytes<D, kKv != KvFormat::Native>();
  if (const cudaError_t e = set_smem_limit_once<kernel>(kBytes); e != cudaSuccess) return e;
  const dim3 grid(args.num_splits, args.num_kv_heads * args.head_chunks, args.num_seqs);
  return launch_dependent(true, kernel, grid, dim3(kThreads), kBytes, stream, args);
}

// One entry per (dtype, head dim, heads per CTA) for a KV format: the launch, or the occupancy.
template <typename T, int D, KvFormat kKv>
cudaError_t launch_heads(const AttentionKernelArgs& args, int32_t heads_per_cta,
                         cudaStream_t stream) {
  return dispatch_heads_per_cta(heads_per_cta, cudaErrorInvalidValue, [&](auto g) {
    return launch_one<T, D, decltype(g)::value, kKv>(args, stream);
  });
}
template <typename T, int D, KvFormat kKv>
int occupancy_heads(int32_t heads_per_cta) {
  return dispatch_heads_per_cta(heads_per_cta, 1,
                                [](auto g) { return occupancy<T, D, decltype(g)::value, kKv>(); });
}

template <typename T, KvFormat kKv>
cudaError_t launch_dim(const AttentionKernelArgs& args, int32_t head_dim, int32_t heads_per_cta,
                       cudaStream_t stream) {
  return head_dim == 64    ? launch_heads<T, 64, kKv>(args, heads_per_cta, stream)
         : head_dim == 128 ? launch_heads<T, 128, kKv>(args, heads_per_cta, stream)
                           : cudaErrorInvalidValue;
}
template <typename T, KvFormat kKv>
int occupancy_dim(int32_t head_dim, int32_t heads_per_cta) {
  return head_dim == 64 ? occupancy_heads<T, 64, kKv>(heads_per_cta)
                        : occupancy_heads<T, 128, kKv>(heads_per_cta);
}

}  // namespace

bool decode_mma_covers(KvFormat kv, int32_t head_dim, bool native_on_mma) {
  return (kv != KvFormat::Native || native_on_mma) && (head_dim == 64 || head_dim == 128);
}

cudaError_t launch_decode_attention_mma(const AttentionKernelArgs& args, bool bf16, KvFormat kv,
                                        int32_t head_dim, int32_t heads_per_cta,
                                        cudaStream_t stream) {
  switch (kv) {
    case KvFormat::Fp8:
      return bf16 ? launch_dim<__nv_bfloat16, KvFormat::Fp8>(args, head_dim, heads_per_cta, stream)
                  : launch_dim<__half, KvFormat::Fp8>(args, head_dim, heads_per_cta, stream);
    case KvFormat::Int8:
      return bf16 ? launch_dim<__nv_bfloat16, KvFormat::Int8>(args, head_dim, heads_per_cta, stream)
                  : launch_dim<__half, KvFormat::Int8>(args, head_dim, heads_per_cta, stream);
    default:
      return bf16 ? launch_dim<__nv_bfloat16, KvFormat::Native>(args, head_dim, heads_per_cta,
                                                                stream)
                  : launch_dim<__half, KvFormat::Native>(args, head_dim, heads_per_cta, stream);
  }
}

int decode_mma_ctas_per_sm(bool bf16, KvFormat kv, int32_t head_dim, int32_t heads_per_cta) {
  switch (kv) {
    case KvFormat::Fp8:
      return bf16 ? occupancy_dim<__nv_bfloat16, KvFormat::Fp8>(head_dim, heads_per_cta)
                  : occupancy_dim<__half, KvFormat::Fp8>(head_dim, heads_per_cta);
    case KvFormat::Int8:
      return bf16 ? occupancy_dim<__nv_bfloat16, KvFormat::Int8>(head_dim, heads_per_cta)
                  : occupancy_dim<__half, KvFormat::Int8>(head_dim, heads_per_cta);
    default:
      return bf16 ? occupancy_dim<__nv_bfloat16, KvFormat::Native>(head_dim, heads_per_cta)
                  : occupancy_dim<__half, KvFormat::Native>(head_dim, heads_per_cta);
  }
}

}  // namespace kvp::cuda::detail

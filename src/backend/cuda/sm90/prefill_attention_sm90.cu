// Prefill / append attention (q_len >= 2) for Hopper (sm_90a): flash attention on wgmma, the
// warpgroup matrix multiply that reads its B operand (and Q) straight from shared memory, with K/V
// pages brought through the block table into a three-stage ring by TMA (one bulk copy per page,
// 16-bit KV) or gathered by cp.async (8-bit KV, and pools TMA cannot describe). Built only for
// sm_90a (its own library, kvp_backend_sm90); paged_attention.cc launches it on compute
// capability 9.0 devices for head dims 64 and 128 (bf16, f16, int8 and fp8 KV) and falls back to
// the mma.sync kernel (prefill_attention.cu) everywhere else.
//
// grid (row tiles, num_seqs, num_kv_heads), 256 threads = 2 warpgroups (+ a producer warpgroup
// for 16-bit KV, 384 threads). Rows are the (token,
// query head of the group) pairs of one sequence and KV head, token-major, as in the mma.sync
// kernel, so the G query heads sharing a KV head share every K/V tile:
//
//   row r = token * G + g      (query head kv_head * G + g, position kv_len - q_len + token)
//   CTA tile = 128 rows; warpgroup wg owns rows 64 wg .. 64 wg + 63
//   key tile = 128 keys, three stages (K and V of a tile share one)
//
// Per key tile each warpgroup computes S = Q K^T (wgmma, Q and K from shared memory), the
// online softmax on S in registers, and O += P V (wgmma, P from registers: the accumulator
// layout of S is, pairwise packed, the A-fragment layout; V from shared memory through the
// instruction's transpose). Iteration t issues S of tile t and P V of tile t - 1 together and
// runs the softmax of t while the tensor cores work through P V, so the stages hold K of t, V of
// t - 1 and the copies of t + 1. Causal and window masks, soft cap and sinks as in the mma.sync
// kernel.
//
// 16-bit KV, warp-specialised: a third warpgroup is the producer (setmaxnreg 24; the two
// consumer warpgroups take 240). Its warp 0 brings tile t into stage t % 3 as TMA copies, one
// 64-column box per page and panel (tensor maps over the pool's K and V, kv_tensor_maps), which
// arrive already swizzled and count their bytes on the stage's `full` mbarrier; it reads the
// block table a tile ahead, and reuses a stage once both consumers have arrived on its `empty`
// mbarrier (after their P V of the tile there). Rows of a page outside the CTA's keys arrive as
// the pool holds them: for such a boundary tile the producer waits for the copies and zeroes those
// V rows (zero_stale_v), signalling a barrier of its own. No CTA-wide barrier runs after the
// start, so the two consumers drift apart and one's softmax runs under the other's products.
// Measured on the H100 in one call (docs/perf/attention-cuda.md, "K/V pages by TMA"): 1.28-1.30x
// the same TMA copies issued by a consumer warp under one CTA barrier a tile, which was 1.17-1.28x
// the 16-byte cp.async gathers by every thread; without the producer warpgroup, decoupling the
// consumers with empty mbarriers measured 0.91-0.93x. The cp.async gathers remain for 8-bit KV
// and for pools TMA cannot describe (a block size that is not a multiple of 8 dividing 128, an
// unaligned pitch).
// 8-bit KV: every thread loads; one CTA barrier per key tile publishes the copies. A
// warp-specialised form with a cp.async producer (commit 4fd14b6) measured 0.92-0.99x and was
// removed.
//
// 8-bit KV (int8, fp8): the wgmma run in f16. Q is converted once with qk_mul folded in; each
// thread copies 16-byte chunks of raw 8-bit K and V rows (and each row's scale word) and widens
// exactly its own chunks, times the row scale, into f16 tiles, so the raw tiles need no barrier.
// Iteration t widens K of t + 1 and V of t while the tensor cores run S of t and P V of t - 1;
// the f16 tiles are two for K and two for V, and one barrier per tile publishes them.
//
// Shared memory holds every tile in wgmma's 128-byte-swizzle form: panels of 64 columns, each
// panel [rows][64] with 128-byte rows, the 16-byte chunk c of row r stored at chunk c ^ (r & 7).
// Q and K are K-major operands (descriptor stride 1024 bytes = 8 rows); V is an N-major operand
// (leading offset = one panel, stride 1024 bytes = 8 keys).
#include "backend/cuda/attention_device.cuh"
#include "backend/cuda/sm90/tma.cuh"
#include "backend/cuda/sm90/wgmma.cuh"

#include <cudaTypedefs.h>

#include <type_traits>

namespace kvp::cuda::detail {
namespace {

constexpr int kWarpgroups = 2;
constexpr int kThreads = kWarpgroups * 128;
constexpr int kRows = kWarpgroups * 64;  // query rows per CTA
constexpr int kKeys = 128;               // keys per tile
constexpr int kAlign = 1024;             // the 128-byte swizzle repeats every 8 rows

// Byte offset of 16-byte chunk `chunk` of row r in a swizzled tile of R rows.
template <int R>
__device__ __forceinline__ uint32_t tile_offset(int r, int chunk) {
  return (chunk >> 3) * (R * 128) + r * 128 + (((chunk & 7) ^ (r & 7)) << 4);
}

constexpr int kStages = 3;  // 16-bit KV: K/V tiles in shared memory

// 2^x in one MUFU instruction: subnormal results flush to zero, which a probability of 2^-126
// relative to its row's maximum can afford (exp2f adds a range check and two multiplies).
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// 8-bit KV: 16-byte chunks of 8-bit codes a thread copies per K (or V) tile, and the f16 tiles the
// wgmma reads (K and V of two tiles each), widened from one raw 8-bit K and V tile.
template <int D>
__host__ __device__ constexpr int kv8_thread_chunks() {
  return kKeys * (D / 16) / kThreads;
}
template <int D, bool kKv8>
__host__ __device__ constexpr int sm90_smem_bytes() {
  // 16-bit: Q + [stages][K, V]; 8-bit: Q + [2][K] + [2][V] (f16) + raw K, V + each thread's scale
  // words (a K and a V word per chunk); then the alignment
  // 16-bit: Q + [stages][K, V] + the stages' barriers (TMA copies)
  return kKv8 ? kRows * D * 2 + 4 * kKeys * D * 2 + 2 * kKeys * D +
                    kThreads * 2 * kv8_thread_chunks<D>() * 4 + kAlign
              : (kRows * D + kStages * 2 * kKeys * D) * 2 + (2 * kStages + 2) * 8 + kAlign;
}

// 16 8-bit codes (row r of an 8-bit tile, dims 16 c .. 16 c + 15) times the row's scale, as f16
// into chunks 2c and 2c + 1 of row r of a swizzled f16 tile: int8 exactly, e4m3 as value / 256
// with the 256 in the factor, then one rounding of the product to f16.
template <KvFormat kKv>
__device__ __forceinline__ void widen_chunk(uint8_t* tile, int r, int c, uint4 codes,
                                            __half2 factor) {
  __half2 lo[4], hi[4];
  unpack8_kv8_half2<kKv>(make_uint2(codes.x, codes.y), lo);
  unpack8_kv8_half2<kKv>(make_uint2(codes.z, codes.w), hi);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    lo[i] = __hmul2(lo[i], factor);
    hi[i] = __hmul2(hi[i], factor);
  }
  *reinterpret_cast<uint4*>(tile + tile_offset<kKeys>(r, 2 * c)) = *reinterpret_cast<uint4*>(lo);
  *reinterpret_cast<uint4*>(tile + tile_offset<kKeys>(r, 2 * c + 1)) =
      *reinterpret_cast<uint4*>(hi);
}

// T: q and out (bf16 or f16). kKv: the pool's KV; 16-bit KV is T, and the wgmma run in T; 8-bit
// KV runs them in f16 (type M): Q is converted with qk_mul folded in, K and V are widened with
// their row scales folded in. kTma (16-bit KV whose pages the tensor maps tm_k, tm_v describe,
// kv_tensor_maps): one warp brings each page of a tile in with TMA copies that signal the
// stage's mbarrier; else every thread gathers 16-byte chunks with cp.async.
template <typename T, int D, KvFormat kKv, bool kTma>
__global__ void __launch_bounds__(kTma ? kThreads + 128 : kThreads, 1)
    prefill_attention_sm90_kernel(const AttentionKernelArgs a,
                                  const __grid_constant__ CUtensorMap tm_k,
                                  const __grid_constant__ CUtensorMap tm_v) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr bool kKv8 = kKv != KvFormat::Native;
  using M = std::conditional_t<kKv8, __half, T>;
  // the 8-bit format the 8-bit code paths are compiled for (16-bit KV never runs them)
  constexpr KvFormat kWidened = kKv8 ? kKv : KvFormat::Int8;
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  constexpr uint32_t kQBytes = kRows * D * 2;
  constexpr uint32_t kTileBytes = kKeys * D * 2;  // one K or V tile
  constexpr uint32_t kRawBytes = kKeys * D;       // 8-bit: one raw K or V tile
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw_addr = smem_addr(smem_raw);
  const uint32_t base = (raw_addr + kAlign - 1) & ~static_cast<uint32_t>(kAlign - 1);
  uint8_t* smem = smem_raw + (base - raw_addr);
  // Q at base. 16-bit: then stage s, K at kQBytes + 2 s kTileBytes, V after it. 8-bit: then the
  // f16 K tiles 0 and 1, the f16 V tiles 2 and 3, raw K, raw V and the threads' scale words.
  static_assert(sm90_smem_bytes<D, kKv8>() <= 227 * 1024, "shared memory of one CTA on sm_90");

  const int seq = blockIdx.y;
  const int kv_head = blockIdx.z;
  PrefillTile tile_rows;
  if (!prefill_tile<kRows, kKeys>(a, tile_rows)) return;
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
  const int wg = tid / 128;
  const int warp = (tid / 32) % 4;  // within the warpgroup
  const int lane = tid % 32;
  const T* q = static_cast<const T*>(a.q);
  const T* k = static_cast<const T*>(a.k);
  const T* v = static_cast<const T*>(a.v);
  const int32_t* table = a.block_tables + int64_t{seq} * a.max_blocks_per_seq;
  const int64_t head_offset = int64_t{kv_head} * a.block_size * D;
  // 8-bit: Q carries qk_mul (the scores come out scaled)
  const float qk_mul = kKv8 ? 1.0f : a.qk_mul;

  // Q tile (rows past the sequence are zero-filled; they are computed but never stored).
  for (int i = tid; i < kRows * kChunks && (!kTma || tid < kThreads); i += kThreads) {
    const int r = i / kChunks;
    const int c = i % kChunks;
    const T* src;
    const bool valid = q_chunk_source<T, D>(a, q, q_begin, num_rows, kv_head, row0 + r, c, src);
    if constexpr (kKv8) {
      uint4 h = make_uint4(0, 0, 0, 0);
      if (valid) {
        float f[8];
        unpack8<T>(__ldg(reinterpret_cast<const uint4*>(src)), f);
        h = make_uint4(half2_bits(__floats2half2_rn(f[0] * a.qk_mul, f[1] * a.qk_mul)),
                       half2_bits(__floats2half2_rn(f[2] * a.qk_mul, f[3] * a.qk_mul)),
                       half2_bits(__floats2half2_rn(f[4] * a.qk_mul, f[5] * a.qk_mul)),
                       half2_bits(__floats2half2_rn(f[6] * a.qk_mul, f[7] * a.qk_mul)));
      }
      *reinterpret_cast<uint4*>(smem + tile_offset<kRows>(r, c)) = h;
    } else {
      cp_async16(smem + tile_offset<kRows>(r, c), src, valid ? 16 : 0);
    }
  }
  // 8-bit: this thread copies chunk kv8_col of K and V rows kv8_row(i), i < kv8_thread_chunks,
  // with the scale word of each, and widens exactly those chunks, so the raw tiles need no
  // barrier. Raw K holds tile t + 1 and raw V tile t while iteration t widens them.
  uint8_t* raw_k = smem + kQBytes + 4 * kTileBytes;
  uint8_t* raw_v = raw_k + kRawBytes;
  uint32_t* my_words = reinterpret_cast<uint32_t*>(raw_v + kRawBytes) +
                       tid * 2 * kv8_thread_chunks<D>();  // [chunk][K, V]
  constexpr int kRawChunks = D / 16;
  const int kv8_col = tid % kRawChunks;
  auto kv8_row = [&](int i) { return (tid + i * kThreads) / kRawChunks; };
  const int64_t kv8_head_run = int64_t{kv_head} * a.block_size * (D + 2);  // bytes
  // Issues the copies of K (is_k) or V of `tile` into the raw tile.
  auto load_raw = [&](int tile, bool is_k) {
    const int n0 = (tile_first + tile) * kKeys;
    const char* base_kv = static_cast<const char*>(is_k ? a.k : a.v) + kv8_head_run;
#pragma unroll
    for (int i = 0; i < kv8_thread_chunks<D>(); ++i) {
      const int r = kv8_row(i);
      const int j = n0 + r;
      const bool valid = j >= key_begin && j < kv_len;
      int64_t row = 0, word = 0;
      if (valid) {
        const int64_t block = int64_t{table[block_index(j, a)]} * a.block_pitch;
        row = block + int64_t{index_in_block(j, a)} * D + kv8_col * 16;
        word = block + int64_t{a.block_size} * D + (index_in_block(j, a) & ~1) * 2;
      }
      cp_async16((is_k ? raw_k : raw_v) + r * D + kv8_col * 16, base_kv + row, valid ? 16 : 0);
      cp_async_small<4>(my_words + 2 * i + (is_k ? 0 : 1), base_kv + word, valid ? 4 : 0);
    }
  };
  // Widens this thread's chunks of the raw K (is_k) or V tile of `tile` into the f16 tile `dst`.
  auto widen_raw = [&](int tile, bool is_k, uint8_t* dst) {
    const int n0 = (tile_first + tile) * kKeys;
#pragma unroll 1  // one chunk at a time: the accumulators leave few registers
    for (int i = 0; i < kv8_thread_chunks<D>(); ++i) {
      const int r = kv8_row(i);
      const uint4 codes =
          *reinterpret_cast<const uint4*>((is_k ? raw_k : raw_v) + r * D + kv8_col * 16);
      const uint32_t w = my_words[2 * i + (is_k ? 0 : 1)];
      const float scale = scale_of(w, n0 + r);
      widen_chunk<kWidened>(dst, r, kv8_col, codes,
                            __float2half2_rn(scale * kv8_code_unit<kWidened>()));
    }
  };
  // TMA (kTma, the producer's warp 0): the pages of `tile` into `stage`, K and V, one box of 64
  // columns x block_size keys per page and panel; a page no key of [key_begin, kv_len) lies in is
  // read at block -1, outside the map, which arrives as zeros.
  const uint32_t bars = base + kQBytes + kStages * 2 * kTileBytes;  // the mbarriers
  // The block of this lane's page of `tile` (-1: none), read a tile ahead of its copies so that
  // the table's latency is not in the copies' path.
  auto page_block = [&](int tile) {
    const int bs = a.block_size;
    const int j0 = (tile_first + tile) * kKeys + lane * bs;
    return tile < num_tiles && lane < kKeys / bs && j0 < kv_len && j0 + bs > key_begin
               ? table[block_index(j0, a)]
               : -1;
  };
  auto tma_tile = [&](int stage, int block) {
    const uint32_t bar = bars + 8 * stage;
    if (lane == 0) sm90::mbarrier_arrive_expect_tx(bar, 2 * kTileBytes);
    const int bs = a.block_size;
    if (lane < kKeys / bs) {
      const uint32_t dk = base + kQBytes + stage * 2 * kTileBytes + lane * bs * 128;
#pragma unroll
      for (int p = 0; p < D / 64; ++p) {
        sm90::tma_load_3d(dk + p * (kKeys * 128), &tm_k, bar, p * 64, kv_head * bs, block);
        sm90::tma_load_3d(dk + kTileBytes + p * (kKeys * 128), &tm_v, bar, p * 64, kv_head * bs,
                          block);
      }
    }
  };
  // TMA: a page that holds keys outside [key_begin, kv_len) brings them in as they lie in the
  // pool. Their scores are masked, so their probabilities are exactly 0, but 0 times a NaN or
  // infinite stale V is not: the producer's warp zeroes those V rows once the copies landed
  // (generic writes, fenced for the wgmma) and arrives on the tile's "V fixed" barrier, which the
  // consumers wait on before its P V. Only the first and the last tile can hold such rows.
  // Barriers: full[stage] at bars + 8 stage (one arrival, the copies' bytes), empty[stage] (one
  // arrival per consumer warpgroup), then "V fixed" of the first and of the last tile.
  const uint32_t empty_bars = bars + 8 * kStages;
  const uint32_t vfix_bars = bars + 16 * kStages;
  auto boundary = [&](int tile) {
    const int n0 = (tile_first + tile) * kKeys;
    return n0 < key_begin || n0 + kKeys > kv_len;
  };
  auto vfix_bar = [&](int tile) { return vfix_bars + (tile == 0 ? 0 : 8); };
  auto zero_stale_v = [&](int tile, int stage) {
    const int n0 = (tile_first + tile) * kKeys;
    uint8_t* dv = smem + kQBytes + stage * 2 * kTileBytes + kTileBytes;
    for (int i = lane; i < kKeys * kChunks; i += 32) {
      const int j = n0 + i / kChunks;
      if (j < key_begin || j >= kv_len) {
        *reinterpret_cast<uint4*>(dv + tile_offset<kKeys>(i / kChunks, i % kChunks)) =
            make_uint4(0, 0, 0, 0);
      }
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncwarp();
    if (lane == 0) sm90::mbarrier_arrive(vfix_bar(tile));
  };
  auto load_kv = [&](int tile, int stage) {
    const int n0 = (tile_first + tile) * kKeys;
    uint8_t* dk = smem + kQBytes + stage * 2 * kTileBytes;
    uint8_t* dv = dk + kTileBytes;
    for (int i = tid; i < kKeys * kChunks; i += kThreads) {
      const int r = i / kChunks;
      const int c = i % kChunks;
      int64_t off;
      const bool valid =
          kv_chunk_offset<D>(a, table, head_offset, n0 + r, c, key_begin, kv_len, off);
      cp_async16(dk + tile_offset<kKeys>(r, c), k + off, valid ? 16 : 0);
      cp_async16(dv + tile_offset<kKeys>(r, c), v + off, valid ? 16 : 0);
    }
  };
  // This thread's rows: accumulator rows lane/4 (h = 0) and lane/4 + 8 (h = 1) of its warp's 16.
  const int my_row0 = row0 + wg * 64 + warp * 16 + lane / 4;
  int pos[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = my_row0 + h * 8;
    pos[h] = row < num_rows ? first_pos + row / G : pos_hi;
  }
  // 64 x D accumulator of the warpgroup: o[4n + e], column 8n + 2(lane % 4) + e % 2
  float o[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.0f, 0.0f};
  const bool soft_cap = a.cap_log2 > 0.0f;
  const uint32_t q_addr = base + wg * 64 * 128;  // this warpgroup's 64 rows in each Q panel
  // 16-bit: stage t % 3 holds K then V of tile t; 8-bit: K of tile t in f16 tile t % 2, V in
  // f16 tile 2 + t % 2
  auto k_addr = [&](int tile) -> uint32_t {
    return kKv8 ? base + kQBytes + (tile % 2) * kTileBytes
                : base + kQBytes + (tile % kStages) * 2 * kTileBytes;
  };
  auto v_addr = [&](int tile) -> uint32_t {
    return kKv8 ? base + kQBytes + (2 + tile % 2) * kTileBytes : k_addr(tile) + kTileBytes;
  };

  // S = Q K^T of `tile` (64 x kKeys per warpgroup, D / 16 steps of k16), issued, not waited for.
  float s[kKeys / 2];
  auto issue_qk = [&](int tile) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t panel = kk / 4, within = (kk % 4) * 32;
      const uint64_t da = sm90::smem_desc_sw128(q_addr + panel * (kRows * 128) + within, 16, 1024);
      const uint64_t db =
          sm90::smem_desc_sw128(k_addr(tile) + panel * (kKeys * 128) + within, 16, 1024);
      sm90::wgmma_ss<kKeys, M>(s, da, db, kk > 0 ? 1 : 0);
    }
    sm90::wgmma_commit();
  };
  // O += P V of `tile`: P's accumulator pairs are its A fragments (keys 16 kk .. 16 kk + 15).
  uint32_t pa[kKeys / 16][4];
  auto issue_pv = [&](int tile) {
    const uint32_t va = v_addr(tile);
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      const uint64_t db = sm90::smem_desc_sw128(va + kk * 16 * 128, kKeys * 128, 1024);
      sm90::wgmma_rs<D, M>(o, pa[kk], db);
    }
    sm90::wgmma_commit();
  };
  // Online softmax of S (tile `tile`) in place: masks, the new row maxima, l, and the factor the
  // accumulator must be rescaled by before this tile's P V joins it.
  auto softmax = [&](int tile, float(&correction)[2]) {
    const int n0 = (tile_first + tile) * kKeys;
    const bool need_mask = n0 + kKeys - 1 > pos_lo || (a.window > 0 && pos_hi - n0 >= a.window);
    // Without a soft cap the scores stay raw: the scale is folded into the exp2's FMA (mul > 0,
    // so maxima commute with it). The soft cap's tanh runs under a uniform branch.
    float mul = qk_mul;
    if (soft_cap) {
      mul = 1.0f;
#pragma unroll
      for (int i = 0; i < kKeys / 2; ++i) s[i] = a.cap_log2 * tanhf(s[i] * qk_mul);
    }
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < kKeys / 2; ++i) {
      const int h = (i >> 1) & 1;
      float x = s[i];
      if (need_mask) {
        const int j = n0 + (i / 4) * 8 + (lane % 4) * 2 + (i & 1);
        if (j > pos[h] || (a.window > 0 && pos[h] - j >= a.window)) x = -INFINITY;
      }
      s[i] = x;
      tile_max[h] = fmaxf(tile_max[h], x);
    }
    float base_max[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
      tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
      const float m_new = fmaxf(m[h], tile_max[h] * mul);
      base_max[h] = m_new == -INFINITY ? 0.0f : m_new;  // a row with no visible key yet
      correction[h] = exp2f(m[h] - base_max[h]);
      m[h] = m_new;
      l[h] *= correction[h];
    }
#pragma unroll
    for (int i = 0; i < kKeys / 2; ++i) {
      const int h = (i >> 1) & 1;
      s[i] = exp2_ftz(fmaf(s[i], mul, -base_max[h]));
      l[h] += s[i];
    }
  };
  auto pack_p = [&] {
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      pa[kk][0] = pack2<M>(s[8 * kk + 0], s[8 * kk + 1]);
      pa[kk][1] = pack2<M>(s[8 * kk + 2], s[8 * kk + 3]);
      pa[kk][2] = pack2<M>(s[8 * kk + 4], s[8 * kk + 5]);
      pa[kk][3] = pack2<M>(s[8 * kk + 6], s[8 * kk + 7]);
    }
  };
  // Waits for this thread's copies of the tile in flight, then makes every thread's visible to the
  // tensor cores: cp.async writes through the generic proxy, wgmma reads through the async one.
  // The barrier also means every warpgroup is done with the previous iteration.
  // 16-bit (TMA): the consumers take turns issuing their wgmma (named barriers 2 + wg, FA3's
  // "pingpong"), so the tensor cores run one warpgroup's products while the other computes its
  // softmax, instead of both queueing products at once and then both waiting on exp2.
  auto my_turn = [&] {
    if constexpr (kTma) asm volatile("bar.sync %0, %1;\n" ::"r"(2 + wg), "n"(kThreads) : "memory");
  };
  auto pass_turn = [&] {
    if constexpr (kTma) {
      asm volatile("bar.arrive %0, %1;\n" ::"r"(3 - wg), "n"(kThreads) : "memory");
    }
  };
  auto tile_landed = [] {
    cp_async_wait<0>();
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
  };

  // 8-bit: iteration t widens K of t + 1 and V of t (their raw tiles were copied in iteration
  // t - 1) while the tensor cores run S of t and P V of t - 1, then copies K of t + 2 and V of
  // t + 1. The f16 tiles it writes are the ones iteration t - 1's wgmma read, which every
  // warpgroup waited for before the barrier that starts iteration t.
  auto kv8_step = [&](int t) {
    cp_async_wait<0>();
    if (t + 1 < num_tiles) widen_raw(t + 1, true, smem + kQBytes + ((t + 1) % 2) * kTileBytes);
    widen_raw(t, false, smem + kQBytes + (2 + t % 2) * kTileBytes);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // for the wgmma reads
    if (t + 2 < num_tiles) load_raw(t + 2, true);
    if (t + 1 < num_tiles) load_raw(t + 1, false);
    cp_async_commit();
  };

  // 16-bit: tile t's K and V sit in stage t % 3: iteration t reads K of t and V of t - 1 while
  // the copies of t + 1 land in the third stage.
  if constexpr (kKv8) {
    load_raw(0, true);
    load_raw(0, false);
    cp_async_commit();
    cp_async_wait<0>();
    widen_raw(0, true, smem + kQBytes);
    if (num_tiles > 1) load_raw(1, true);  // this thread's raw K chunks are free again
    cp_async_commit();
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // Q and K of tile 0
    __syncthreads();
  } else if constexpr (kTma) {
    if (tid == 0) {
      sm90::tma_prefetch_map(&tm_k);
      sm90::tma_prefetch_map(&tm_v);
      for (int st = 0; st < kStages; ++st) {
        sm90::mbarrier_init(bars + 8 * st, 1);
        sm90::mbarrier_init(empty_bars + 8 * st, kWarpgroups);
      }
      sm90::mbarrier_init(vfix_bars, 1);
      sm90::mbarrier_init(vfix_bars + 8, 1);
      sm90::fence_barrier_init();
    }
    __syncthreads();  // the only CTA-wide barrier
    if (wg == kWarpgroups) {
      // producer warpgroup: warp 0 copies tile t into stage t % kStages once both consumer
      // warpgroups are done with tile t - kStages; for a boundary tile it then waits for the
      // copies and zeroes the stale V rows.
      asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
      if (warp == 0) {
        int block = page_block(0);
        for (int t = 0; t < num_tiles; ++t) {
          const int stage = t % kStages;
          if (t >= kStages) sm90::mbarrier_wait(empty_bars + 8 * stage, (t / kStages - 1) & 1);
          tma_tile(stage, block);
          block = page_block(t + 1);
          if (boundary(t)) {
            sm90::mbarrier_wait(bars + 8 * stage, (t / kStages) & 1);
            zero_stale_v(t, stage);
          }
        }
      }
      return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
    cp_async_commit();
    cp_async_wait<0>();
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    asm volatile("bar.sync 1, %0;\n" ::"n"(kThreads) : "memory");  // Q, consumers only
    // warpgroup 0 goes first
    if (wg == 1) pass_turn();
    sm90::mbarrier_wait(bars, 0);
  } else {
    load_kv(0, 0);
    cp_async_commit();
    tile_landed();
    if (num_tiles > 1) {
      load_kv(1, 1 % kStages);
      cp_async_commit();
    }
  }
  my_turn();
  sm90::wgmma_fence();
  issue_qk(0);
  pass_turn();
  if constexpr (kKv8) kv8_step(0);
  sm90::wgmma_wait<0>();
  sm90::fence_operands(s);
  {
    float correction[2];
    softmax(0, correction);  // o is still zero: nothing to rescale
  }
  pack_p();
  for (int t = 1; t < num_tiles; ++t) {
    if constexpr (kKv8) {
      __syncthreads();  // K of t and V of t - 1 widened (and fenced) by every thread
    } else if constexpr (kTma) {
      sm90::mbarrier_wait(bars + 8 * (t % kStages), (t / kStages) & 1);
      if (boundary(t - 1)) sm90::mbarrier_wait(vfix_bar(t - 1), 0);
    } else {
      tile_landed();
      if (t + 1 < num_tiles) {
        load_kv(t + 1, (t + 1) % kStages);
        cp_async_commit();
      }
    }
    // The tensor cores run P V of t - 1 while this warpgroup computes the softmax of t.
    my_turn();
    sm90::wgmma_fence();
    issue_qk(t);
    issue_pv(t - 1);
    pass_turn();
    if constexpr (kKv8) kv8_step(t);
    sm90::wgmma_wait<1>();  // S of t (groups complete in order)
    sm90::fence_operands(s);
    float correction[2];
    softmax(t, correction);
    sm90::wgmma_wait<0>();  // P V of t - 1
    sm90::fence_operands(o);
    if constexpr (kTma) {
      if (tid % 128 == 0) sm90::mbarrier_arrive(empty_bars + 8 * ((t - 1) % kStages));
    }
    // Most tiles leave every row maximum of the warp unchanged: skip the accumulator rescale.
    if (__any_sync(0xffffffffu, correction[0] != 1.0f || correction[1] != 1.0f)) {
#pragma unroll
      for (int i = 0; i < D / 2; ++i) o[i] *= correction[(i >> 1) & 1];
    }
    pack_p();
  }
  // V of the last tile widened (8-bit) or zeroed where it must be (TMA) by every thread
  if constexpr (kKv8) __syncthreads();
  if constexpr (kTma) {
    if (boundary(num_tiles - 1)) sm90::mbarrier_wait(vfix_bar(num_tiles - 1), 0);
  }
  my_turn();
  sm90::wgmma_fence();
  issue_pv(num_tiles - 1);
  if (wg == 0) pass_turn();  // warpgroup 1's last turn is not waited for
  sm90::wgmma_wait<0>();
  sm90::fence_operands(o);

  T* out = static_cast<T*>(a.out);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float sum = l[h];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const int row = my_row0 + h * 8;
    if (row >= num_rows) continue;
    const float inv = output_factor(m[h], sum, a, kv_head * G + row % G);
    T* dst = out + (int64_t{q_begin + row / G} * a.num_q_heads + kv_head * G + row % G) * D +
             (lane % 4) * 2;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      *reinterpret_cast<uint32_t*>(dst + n * 8) =
          pack2<T>(o[4 * n + 2 * h] * inv, o[4 * n + 2 * h + 1] * inv);
    }
  }
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

// The driver's tensor-map encoder, found once through the runtime (no link to libcuda); null
// where the driver has none.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      fn = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

// Tensor maps over the pool's K and V for the TMA page copies (16-bit KV): each a 3-D tensor of
// [num_blocks][num_kv_heads * block_size][D] elements (a block's heads are consecutive runs of
// block_size rows), boxes of 64 columns (128 bytes: the swizzle's span) x block_size rows, stored
// with the 128-byte swizzle the tiles use. False where the pool's layout does not allow it: a
// block_size that is not a multiple of 8 dividing the key tile, unaligned pointers or pitch.
bool kv_tensor_maps(const AttentionKernelArgs& a, bool bf16, int32_t head_dim, CUtensorMap& k,
                    CUtensorMap& v) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  const int64_t pitch_bytes = a.block_pitch * 2;
  if (encode == nullptr || a.block_size < 8 || a.block_size % 8 != 0 || kKeys % a.block_size != 0 ||
      a.num_blocks <= 0 || pitch_bytes % 16 != 0 || reinterpret_cast<uintptr_t>(a.k) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(a.v) % 16 != 0) {
    return false;
  }
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(head_dim),
                              static_cast<cuuint64_t>(a.num_kv_heads) * a.block_size,
                              static_cast<cuuint64_t>(a.num_blocks)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(head_dim) * 2,
                                 static_cast<cuuint64_t>(pitch_bytes)};
  const cuuint32_t box[3] = {64, static_cast<cuuint32_t>(a.block_size), 1};
  const cuuint32_t unit[3] = {1, 1, 1};
  const CUtensorMapDataType type =
      bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  for (int i = 0; i < 2; ++i) {
    const CUresult r =
        encode(i == 0 ? &k : &v, type, 3, const_cast<void*>(i == 0 ? a.k : a.v), dims, strides, box,
               unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) return false;
  }
  return true;
}

template <typename T, int D, KvFormat kKv, bool kTma>
cudaError_t launch_kernel(const AttentionKernelArgs& args, int32_t max_q_len,
                          const CUtensorMap& tm_k, const CUtensorMap& tm_v, cudaStream_t stream) {
  constexpr int kSmem = sm90_smem_bytes<D, kKv != KvFormat::Native>();
  if (const cudaError_t e =
          set_smem_limit_once<prefill_attention_sm90_kernel<T, D, kKv, kTma>>(kSmem);
      e != cudaSuccess) {
    return e;
  }
  const int64_t rows = int64_t{max_q_len} * args.group;
  const dim3 grid(static_cast<unsigned>((rows + kRows - 1) / kRows), args.num_seqs,
                  args.num_kv_heads);
  prefill_attention_sm90_kernel<T, D, kKv, kTma>
      <<<grid, kTma ? kThreads + 128 : kThreads, kSmem, stream>>>(args, tm_k, tm_v);
  return cudaGetLastError();
}

template <typename T, int D, KvFormat kKv>
cudaError_t launch_typed(const AttentionKernelArgs& args, int32_t max_q_len, cudaStream_t stream) {
  CUtensorMap tm_k{}, tm_v{};
  if constexpr (kKv == KvFormat::Native) {
    if (kv_tensor_maps(args, std::is_same_v<T, __nv_bfloat16>, D, tm_k, tm_v)) {
      return launch_kernel<T, D, kKv, true>(args, max_q_len, tm_k, tm_v, stream);
    }
  }
  return launch_kernel<T, D, kKv, false>(args, max_q_len, tm_k, tm_v, stream);
}

template <KvFormat kKv>
cudaError_t launch_kv(const AttentionKernelArgs& args, bool bf16, int32_t head_dim,
                      int32_t max_q_len, cudaStream_t stream) {
  switch (head_dim) {
    case 64:
      return bf16 ? launch_typed<__nv_bfloat16, 64, kKv>(args, max_q_len, stream)
                  : launch_typed<__half, 64, kKv>(args, max_q_len, stream);
    case 128:
      return bf16 ? launch_typed<__nv_bfloat16, 128, kKv>(args, max_q_len, stream)
                  : launch_typed<__half, 128, kKv>(args, max_q_len, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

bool prefill_attention_sm90_covers(KvFormat, int32_t head_dim) {
  return head_dim == 64 || head_dim == 128;
}

cudaError_t launch_prefill_attention_sm90(const AttentionKernelArgs& args, bool bf16, KvFormat kv,
                                          int32_t head_dim, int32_t max_q_len,
                                          cudaStream_t stream) {
  switch (kv) {
    case KvFormat::Int8:
      return launch_kv<KvFormat::Int8>(args, bf16, head_dim, max_q_len, stream);
    case KvFormat::Fp8:
      return launch_kv<KvFormat::Fp8>(args, bf16, head_dim, max_q_len, stream);
    default:
      return launch_kv<KvFormat::Native>(args, bf16, head_dim, max_q_len, stream);
  }
}

}  // namespace kvp::cuda::detail

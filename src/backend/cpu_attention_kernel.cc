// Highway implementation of attend_tile (cpu_attention_kernel.h), compiled once per x86 target
// (SSE4, AVX2, AVX-512, ...) through foreach_target and picked at run time by
// HWY_DYNAMIC_DISPATCH, so one binary runs at full width on AVX2 and AVX-512 machines.
//
// Per chunk of kChunkKeys keys, K of every KV head of the item, then V of every head (the
// order a block stores them in):
//   1. S[r][t] = q_r · k_t for every active row: 4 rows x 4 keys per pass on AVX-512, 4 rows x 2
//      keys on narrower targets (16 registers), so a decode tile's GQA group of 4 is one pass
//      and each K vector loaded serves every row. bf16 K of a one-pass tile is widened in
//      registers in paired order (load_pair); f16, and bf16 of prefill tiles that take several
//      passes, are widened with PromoteTo (prefill once per chunk into an f32 scratch)
//   2. soft cap, causal/window mask, online softmax update of (m, l) and rescale of o
//   3. o_r += sum_t P[r][t] v_t: 4 rows x 4 (AVX-512) or 2 vectors of head_dim per pass, V
//      widened like K
// KV is read straight from the pool in its own dtype; everything accumulates in f32. 8-bit KV
// (cache/kv_quant.h) is widened in registers: int8 like f16 (int8 -> int32 -> f32), fp8 e4m3 by
// moving its bits into an f16 (e4m3 -> f16 -> f32, see load_row), and its per-row scales are
// applied per key, not per element: K's multiply the logits after step 1, V's the probabilities
// before step 3.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend/cpu_attention_kernel.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// foreach_target must come first: it re-includes this file once per target.
#include <hwy/cache_control.h>
#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "backend/cpu_attention_kernel.h"

HWY_BEFORE_NAMESPACE();
namespace kvp::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// One fp8 (OCP e4m3fn) code of a K or V row in the pool.
struct E4m3Code {
  uint8_t bits;
};
static_assert(sizeof(E4m3Code) == 1, "rows of codes are addressed as bytes");

// The 8-bit row types, whose rows carry an f16 scale (cache/kv_quant.h).
template <typename T>
constexpr bool kIsKv8 = std::is_same_v<T, int8_t> || std::is_same_v<T, E4m3Code>;

// An e4m3 code's bits moved into an f16: the sign to bit 15, exponent and mantissa to bits 7..13.
// The f16 exponent's bias is 15 against e4m3's 7, so the f16 is the code's value / 256, exactly,
// subnormals included (the NaN codes, which quantisation never writes, read as ±480 / 256).
// The 256 is folded into the row scales (kKv8ScaleFactor).
HWY_INLINE uint16_t e4m3_as_f16_bits(uint8_t code) {
  return static_cast<uint16_t>(((code & 0x80u) << 8) | ((code & 0x7fu) << 7));
}

// What an 8-bit row's scale is multiplied by before it scales logits or probabilities: 1 for
// int8 (load_row gives the values), 256 for fp8 (load_row gives value / 256).
template <typename T>
constexpr float kKv8ScaleFactor = std::is_same_v<T, E4m3Code> ? 256.0f : 1.0f;

// One vector of f32 from a K or V row of element type T (float, bfloat16_t, float16_t, or an
// 8-bit type: the values before the row's scale, which the caller applies; fp8 / 256).
template <typename T>
HWY_INLINE VF load_row(DF df, const T* HWY_RESTRICT p) {
  if constexpr (std::is_same_v<T, float>) {
    return hn::LoadU(df, p);
  } else if constexpr (std::is_same_v<T, int8_t>) {
    const hn::Rebind<int32_t, DF> di;
    const hn::Rebind<int8_t, DF> d8;
    return hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8, p)));
  } else if constexpr (std::is_same_v<T, E4m3Code>) {
    // e4m3_as_f16_bits a vector at a time: sign-extended to 16 bits, shifted left by 7 the sign
    // lands in bits 14 and 15; clearing bit 14 leaves the f16.
    const hn::Rebind<int16_t, DF> d16;
    const hn::Rebind<int8_t, DF> d8;
    const hn::Rebind<hwy::float16_t, DF> dh;
    const auto wide = hn::PromoteTo(d16, hn::LoadU(d8, reinterpret_cast<const int8_t*>(p)));
    const auto bits = hn::And(hn::ShiftLeft<7>(wide), hn::Set(d16, static_cast<int16_t>(0xbf80)));
    return hn::PromoteTo(df, hn::BitCast(dh, bits));
  } else {
    const hn::Rebind<T, DF> dt;
    return hn::PromoteTo(df, hn::LoadU(dt, p));
  }
}

// Element i of a K or V row as f32 (tails past the last full vector).
template <typename T>
HWY_INLINE float scalar_of(const T* p, int32_t i) {
  if constexpr (std::is_same_v<T, float>) {
    return p[i];
  } else if constexpr (std::is_same_v<T, int8_t>) {
    return static_cast<float>(p[i]);
  } else if constexpr (std::is_same_v<T, E4m3Code>) {
    return f16_to_f32(F16{e4m3_as_f16_bits(p[i].bits)});
  } else if constexpr (std::is_same_v<T, hwy::bfloat16_t>) {
    return bf16_to_f32(Bf16{std::bit_cast<uint16_t>(p[i])});
  } else {
    return f16_to_f32(F16{std::bit_cast<uint16_t>(p[i])});
  }
}

// bf16 in "paired order": one u32 lane of a K or V row holds elements 2i (low half) and 2i + 1
// (high half). As f32 they are the lane shifted left by 16 and the lane with its low half
// cleared: one load and two bit operations per 2 * lanes elements, no shuffle (PromoteTo costs a
// shuffle and a shift per lanes elements, on the same ports as the FMAs). The vectors come out
// in paired order: within each block of 2 * lanes elements the even ones, then the odd ones, so
// q is multiplied in that order and o accumulated in it (to_paired / from_paired).
HWY_INLINE void load_pair(DF df, const hwy::bfloat16_t* HWY_RESTRICT p, VF& even, VF& odd) {
  const hn::RebindToUnsigned<DF> du;
  const auto bits = hn::LoadU(du, reinterpret_cast<const uint32_t*>(p));
  even = hn::BitCast(df, hn::ShiftLeft<16>(bits));
  odd = hn::BitCast(df, hn::And(bits, hn::Set(du, 0xFFFF0000u)));
}

// dst = src in paired order; src and dst: [head_dim], head_dim a multiple of 2 * lanes.
HWY_INLINE void to_paired(int32_t lanes, int32_t head_dim, const float* HWY_RESTRICT src,
                          float* HWY_RESTRICT dst) {
  for (int32_t b = 0; b < head_dim; b += 2 * lanes) {
    for (int32_t i = 0; i < lanes; ++i) {
      dst[b + i] = src[b + 2 * i];
      dst[b + lanes + i] = src[b + 2 * i + 1];
    }
  }
}

// dst = src back from paired order.
HWY_INLINE void from_paired(int32_t lanes, int32_t head_dim, const float* HWY_RESTRICT src,
                            float* HWY_RESTRICT dst) {
  for (int32_t b = 0; b < head_dim; b += 2 * lanes) {
    for (int32_t i = 0; i < lanes; ++i) {
      dst[b + 2 * i] = src[b + i];
      dst[b + 2 * i + 1] = src[b + lanes + i];
    }
  }
}

#if HWY_TARGET != HWY_SCALAR
// Sums of 128-bit blocks down to one: lane i of the result is the sum of lane i of every block.
template <class D>
HWY_INLINE void store_block_sum(D d, hn::Vec<D> v, float* HWY_RESTRICT out) {
  if constexpr (hn::MaxLanes(D()) > 4) {
    const hn::Half<D> dh;
    store_block_sum(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)), out);
  } else {
    hn::StoreU(v, d, out);
  }
}

// out[t] = sum of the lanes of a[t], t < 4: a transpose-and-add tree, cheaper than four
// separate horizontal sums.
HWY_INLINE void sum_of_four(DF df, const VF* a, float* HWY_RESTRICT out) {
  const hn::Repartition<double, DF> dd;
  // Within each 128-bit block: [a0_0 + a0_2, a1_0 + a1_2, a0_1 + a0_3, a1_1 + a1_3] and so on.
  const VF s01 = hn::Add(hn::InterleaveLower(df, a[0], a[1]), hn::InterleaveUpper(df, a[0], a[1]));
  const VF s23 = hn::Add(hn::InterleaveLower(df, a[2], a[3]), hn::InterleaveUpper(df, a[2], a[3]));
  // Pairs of 64 bits: each block now holds partial sums [a0, a1, a2, a3].
  const auto d01 = hn::BitCast(dd, s01);
  const auto d23 = hn::BitCast(dd, s23);
  const VF blocks = hn::Add(hn::BitCast(df, hn::InterleaveLower(dd, d01, d23)),
                            hn::BitCast(df, hn::InterleaveUpper(dd, d01, d23)));
  store_block_sum(df, blocks, out);
}
#endif  // HWY_TARGET != HWY_SCALAR

// Query rows per pass: four, so one pass covers a decode tile's GQA group of 4 and every K and V
// vector loaded from the pool serves all of its rows (a group of 3, or a tile's last 3 rows, is
// one 3-row pass). Keys per logit pass and value vectors per output pass fit the register file:
// 4 x 4 accumulators on 512-bit targets (32 registers), 4 x 2 on narrower ones (16 registers).
constexpr int kRowGroup = 4;
constexpr int kKeyGroup = hn::MaxLanes(DF()) >= 16 ? 4 : 2;
constexpr int kValueVectors = hn::MaxLanes(DF()) >= 16 ? 4 : 2;

// s[r * s_stride + t] = q[r] · k[t] for r < kRows, t < kKeys. q, k: rows of head_dim floats.
// kPaired: T is bf16, q is in paired order and head_dim a multiple of 2 * lanes.
template <typename T, int kRows, int kKeys, bool kPaired>
HWY_INLINE void dot_rows_keys(DF df, const float* const* q, const T* const* k, int32_t head_dim,
                              float* HWY_RESTRICT s, int32_t s_stride) {
  const int32_t lanes = static_cast<int32_t>(hn::Lanes(df));
  VF acc[kRows][kKeys];
  for (int r = 0; r < kRows; ++r) {
    for (int t = 0; t < kKeys; ++t) acc[r][t] = hn::Zero(df);
  }
  int32_t d = 0;
  if constexpr (kPaired) {
    for (; d < head_dim; d += 2 * lanes) {
      VF even[kKeys], odd[kKeys];
      for (int t = 0; t < kKeys; ++t) load_pair(df, k[t] + d, even[t], odd[t]);
      for (int r = 0; r < kRows; ++r) {
        const VF q_even = hn::LoadU(df, q[r] + d);
        const VF q_odd = hn::LoadU(df, q[r] + d + lanes);
        for (int t = 0; t < kKeys; ++t) {
          acc[r][t] = hn::MulAdd(q_odd, odd[t], hn::MulAdd(q_even, even[t], acc[r][t]));
        }
      }
    }
  }
  for (; d + lanes <= head_dim; d += lanes) {
    VF kv[kKeys];
    for (int t = 0; t < kKeys; ++t) kv[t] = load_row(df, k[t] + d);
    for (int r = 0; r < kRows; ++r) {
      const VF qv = hn::LoadU(df, q[r] + d);
      for (int t = 0; t < kKeys; ++t) acc[r][t] = hn::MulAdd(qv, kv[t], acc[r][t]);
    }
  }
  const VF* flat = &acc[0][0];  // [kRows * kKeys], row-major
  int i = 0;
#if HWY_TARGET != HWY_SCALAR
  if constexpr (hn::MaxLanes(DF()) >= 4) {
    // Four dot products per transpose-and-add tree, whatever rows and keys they belong to; what
    // is left of a count not a multiple of 4 (3 rows x 2 keys: two) gets horizontal sums below.
    for (; i + 4 <= kRows * kKeys; i += 4) {
      float sums[4];
      sum_of_four(df, flat + i, sums);
      for (int j = 0; j < 4; ++j) s[(i + j) / kKeys * s_stride + (i + j) % kKeys] = sums[j];
    }
  }
#endif
  for (; i < kRows * kKeys; ++i) {
    s[i / kKeys * s_stride + i % kKeys] = hn::GetLane(hn::SumOfLanes(df, flat[i]));
  }
  for (int r = 0; r < kRows; ++r) {
    for (int t = 0; t < kKeys; ++t) {
      for (int32_t e = d; e < head_dim; ++e) s[r * s_stride + t] += q[r][e] * scalar_of(k[t], e);
    }
  }
}

// o[r][:] += sum_{t < num_keys} p[r][t] * v[t][:] for r < kRows.
// kPaired: T is bf16, o is in paired order and head_dim a multiple of kValueVectors * lanes.
template <typename T, int kRows, bool kPaired>
HWY_INLINE void accumulate_pv(DF df, float* const* o, const float* const* p, const T* const* v,
                              int32_t num_keys, int32_t head_dim) {
  const int32_t lanes = static_cast<int32_t>(hn::Lanes(df));
  int32_t d = 0;
  if constexpr (kPaired) {
    static_assert(kValueVectors % 2 == 0, "paired order takes vectors two at a time");
    for (; d < head_dim; d += kValueVectors * lanes) {
      VF acc[kRows][kValueVectors];
      for (int r = 0; r < kRows; ++r) {
        for (int c = 0; c < kValueVectors; ++c) acc[r][c] = hn::LoadU(df, o[r] + d + c * lanes);
      }
      for (int32_t t = 0; t < num_keys; ++t) {
        VF pt[kRows];
        for (int r = 0; r < kRows; ++r) pt[r] = hn::Set(df, p[r][t]);
        for (int c = 0; c < kValueVectors; c += 2) {
          VF even, odd;
          load_pair(df, v[t] + d + c * lanes, even, odd);
          for (int r = 0; r < kRows; ++r) {
            acc[r][c] = hn::MulAdd(pt[r], even, acc[r][c]);
            acc[r][c + 1] = hn::MulAdd(pt[r], odd, acc[r][c + 1]);
          }
        }
      }
      for (int r = 0; r < kRows; ++r) {
        for (int c = 0; c < kValueVectors; ++c) hn::StoreU(acc[r][c], df, o[r] + d + c * lanes);
      }
    }
  }
  for (; d + kValueVectors * lanes <= head_dim; d += kValueVectors * lanes) {
    VF acc[kRows][kValueVectors];
    for (int r = 0; r < kRows; ++r) {
      for (int c = 0; c < kValueVectors; ++c) acc[r][c] = hn::LoadU(df, o[r] + d + c * lanes);
    }
    for (int32_t t = 0; t < num_keys; ++t) {
      VF pt[kRows];
      for (int r = 0; r < kRows; ++r) pt[r] = hn::Set(df, p[r][t]);
      for (int c = 0; c < kValueVectors; ++c) {
        const VF vv = load_row(df, v[t] + d + c * lanes);
        for (int r = 0; r < kRows; ++r) acc[r][c] = hn::MulAdd(pt[r], vv, acc[r][c]);
      }
    }
    for (int r = 0; r < kRows; ++r) {
      for (int c = 0; c < kValueVectors; ++c) hn::StoreU(acc[r][c], df, o[r] + d + c * lanes);
    }
  }
  for (; d + lanes <= head_dim; d += lanes) {
    VF acc[kRows];
    for (int r = 0; r < kRows; ++r) acc[r] = hn::LoadU(df, o[r] + d);
    for (int32_t t = 0; t < num_keys; ++t) {
      const VF vv = load_row(df, v[t] + d);
      for (int r = 0; r < kRows; ++r) acc[r] = hn::MulAdd(hn::Set(df, p[r][t]), vv, acc[r]);
    }
    for (int r = 0; r < kRows; ++r) hn::StoreU(acc[r], df, o[r] + d);
  }
  for (; d < head_dim; ++d) {
    for (int r = 0; r < kRows; ++r) {
      float acc = o[r][d];
      for (int32_t t = 0; t < num_keys; ++t) acc += p[r][t] * scalar_of(v[t], d);
      o[r][d] = acc;
    }
  }
}

// Row pointers of one KV head's rows for the keys of a chunk, for K (kv_base = kv.k) or V.
// key_elem[t]: element offset of key t's row in KV head 0; head h adds h * head_pitch.
template <typename T>
HWY_INLINE void gather_rows(const TileTask& task, int32_t kv_head, const void* kv_base,
                            const int64_t* key_elem, int32_t num_keys, const T** rows) {
  const T* base = static_cast<const T*>(kv_base);
  const int64_t head_elem = int64_t{kv_head} * task.kv->head_pitch();
  for (int32_t t = 0; t < num_keys; ++t) rows[t] = base + key_elem[t] + head_elem;
}

// s[r * kChunkKeys + t] = q[r] · k[t] for rows [0, num_rows) (num_rows <= kRowGroup) and keys
// [0, num_keys). q: row pointers.
template <typename T, int kRows, bool kPaired>
HWY_INLINE void dot_rows(DF df, const float* const* q, const T* const* k, int32_t num_keys,
                         int32_t head_dim, float* HWY_RESTRICT s) {
  int32_t t = 0;
  for (; t + kKeyGroup <= num_keys; t += kKeyGroup)
    dot_rows_keys<T, kRows, kKeyGroup, kPaired>(df, q, k + t, head_dim, s + t, kChunkKeys);
  for (; t < num_keys; ++t)
    dot_rows_keys<T, kRows, 1, kPaired>(df, q, k + t, head_dim, s + t, kChunkKeys);
}

// Element offsets of the rows of keys [j0, j0 + num_keys) in KV head 0 (one division per chunk,
// not per key); key_scale (8-bit, else null): byte offsets of their scales in KV head 0.
HWY_INLINE void key_offsets(const TileTask& task, int32_t j0, int32_t num_keys,
                            int64_t* HWY_RESTRICT key_elem, int64_t* HWY_RESTRICT key_scale) {
  const PagedKv& kv = *task.kv;
  int32_t block_index = j0 / kv.block_size;
  int32_t in_block = j0 - block_index * kv.block_size;
  for (int32_t t = 0; t < num_keys; ++t) {
    key_elem[t] =
        task.block_table[block_index] * kv.block_pitch + int64_t{in_block} * task.head_dim;
    if (key_scale != nullptr)
      key_scale[t] = kv.scale_offset(task.block_table[block_index], 0, in_block);
    if (++in_block == kv.block_size) {
      in_block = 0;
      ++block_index;
    }
  }
}

// Prefetches one KV head's K and V rows of a chunk's keys. Blocks are scattered over the pool,
// so hardware prefetchers lose the stream at block boundaries; the kernel asks for the next
// (chunk, head) unit while it computes on the current one.
HWY_INLINE void prefetch_unit(const TileTask& task, const void* kv_base, int32_t kv_head,
                              const int64_t* key_elem, int32_t num_keys) {
  const PagedKv& kv = *task.kv;
  const size_t elem_bytes = dtype_size_bytes(kv.dtype);
  const size_t row_bytes = size_t(task.head_dim) * elem_bytes;
  const auto* base = static_cast<const std::byte*>(kv_base);
  const int64_t head_elem = int64_t{kv_head} * kv.head_pitch();
  for (int32_t t = 0; t < num_keys; ++t) {
    const size_t byte = size_t(key_elem[t] + head_elem) * elem_bytes;
    for (size_t line = 0; line < row_bytes; line += 64) {
      hwy::Prefetch(base + byte + line);
    }
  }
}

// s[r][t] = q[r] · k[t] for rows [row_begin, row_end), in passes of kRowGroup rows.
// q: [num_rows][head_dim]; s: [num_rows][kChunkKeys].
template <typename T, bool kPaired>
HWY_INLINE void logits_for_rows(DF df, const float* q, const T* const* k_rows, int32_t row_begin,
                                int32_t row_end, int32_t num_keys, int32_t head_dim, float* s) {
  for (int32_t r = row_begin; r < row_end; r += kRowGroup) {
    const int n = std::min<int32_t>(kRowGroup, row_end - r);
    const float* qr[kRowGroup];  // rows r.. of q; past the group's end, its last row
    for (int i = 0; i < kRowGroup; ++i) qr[i] = q + int64_t{r + std::min(i, n - 1)} * head_dim;
    float* s_rows = s + int64_t{r} * kChunkKeys;  // [n][kChunkKeys]
    if (n == kRowGroup) {
      dot_rows<T, kRowGroup, kPaired>(df, qr, k_rows, num_keys, head_dim, s_rows);
    } else if (n == 3) {  // a GQA group of 3 (SmolLM2) in one pass: each K vector widened once
      dot_rows<T, 3, kPaired>(df, qr, k_rows, num_keys, head_dim, s_rows);
    } else if (n == 2) {
      dot_rows<T, 2, kPaired>(df, qr, k_rows, num_keys, head_dim, s_rows);
    } else {
      dot_rows<T, 1, kPaired>(df, qr, k_rows, num_keys, head_dim, s_rows);
    }
  }
}

// o[r] += sum_t p[r][t] v[t] for rows [row_begin, row_end), in passes of kRowGroup rows.
// o: [num_rows][head_dim]; p: [num_rows][kChunkKeys].
template <typename T, bool kPaired>
HWY_INLINE void values_for_rows(DF df, float* o, const float* p, const T* const* v_rows,
                                int32_t row_begin, int32_t row_end, int32_t num_keys,
                                int32_t head_dim) {
  for (int32_t r = row_begin; r < row_end; r += kRowGroup) {
    const int n = std::min<int32_t>(kRowGroup, row_end - r);
    float* orows[kRowGroup];        // rows r.. of o (clamped like qr)
    const float* prows[kRowGroup];  // rows r.. of p
    for (int i = 0; i < kRowGroup; ++i) {
      orows[i] = o + int64_t{r + std::min(i, n - 1)} * head_dim;
      prows[i] = p + int64_t{r + std::min(i, n - 1)} * kChunkKeys;
    }
    if (n == kRowGroup) {
      accumulate_pv<T, kRowGroup, kPaired>(df, orows, prows, v_rows, num_keys, head_dim);
    } else if (n == 3) {
      accumulate_pv<T, 3, kPaired>(df, orows, prows, v_rows, num_keys, head_dim);
    } else if (n == 2) {
      accumulate_pv<T, 2, kPaired>(df, orows, prows, v_rows, num_keys, head_dim);
    } else {
      accumulate_pv<T, 1, kPaired>(df, orows, prows, v_rows, num_keys, head_dim);
    }
  }
}

// buf[t] = rows[t] widened to f32 ([num_keys][head_dim]); out[t] points at buf[t].
template <typename T>
HWY_INLINE void widen_rows(DF df, const T* const* rows, int32_t num_keys, int32_t head_dim,
                           float* HWY_RESTRICT buf, const float** out) {
  const int32_t lanes = static_cast<int32_t>(hn::Lanes(df));
  for (int32_t t = 0; t < num_keys; ++t) {
    float* dst = buf + int64_t{t} * head_dim;
    int32_t d = 0;
    for (; d + lanes <= head_dim; d += lanes) hn::StoreU(load_row(df, rows[t] + d), df, dst + d);
    for (; d < head_dim; ++d) dst[d] = scalar_of(rows[t], d);
    out[t] = dst;
  }
}

// 8-bit: scale[t] = the f16 scale of key t's row of one KV head (key_scale from key_offsets)
// times factor (kKv8ScaleFactor), widened a vector at a time; scale[t] = factor for t in
// [num_keys, kChunkKeys).
HWY_INLINE void gather_scales(DF df, const TileTask& task, int32_t kv_head, const void* kv_base,
                              const int64_t* key_scale, int32_t num_keys, float factor,
                              float* HWY_RESTRICT scale) {
  const hn::Rebind<hwy::float16_t, DF> dh;
  const auto* base =
      static_cast<const std::byte*>(kv_base) + int64_t{kv_head} * task.kv->head_pitch();
  uint16_t bits[kChunkKeys];  // the scales' f16 bit patterns, gathered from the blocks
  for (int32_t t = 0; t < num_keys; ++t) std::memcpy(&bits[t], base + key_scale[t], 2);
  std::fill(bits + num_keys, bits + kChunkKeys, uint16_t{0x3c00});  // 1.0
  const int32_t lanes = static_cast<int32_t>(hn::Lanes(df));
  for (int32_t t = 0; t < kChunkKeys; t += lanes) {
    const auto* h = reinterpret_cast<const hwy::float16_t*>(bits + t);
    hn::StoreU(hn::Mul(hn::PromoteTo(df, hn::LoadU(dh, h)), hn::Set(df, factor)), df, scale + t);
  }
}

// s[r][t] *= scale[t] for rows [row_begin, row_end), all kChunkKeys columns: an 8-bit row's
// scale, applied once per (query row, key) after its dot product rather than per element.
HWY_INLINE void scale_columns(DF df, float* s, const float* HWY_RESTRICT scale, int32_t row_begin,
                              int32_t row_end) {
  const int32_t lanes = static_cast<int32_t>(hn::Lanes(df));
  for (int32_t r = row_begin; r < row_end; ++r) {
    float* s_row = s + int64_t{r} * kChunkKeys;  // [kChunkKeys], aligned
    for (int32_t t = 0; t < kChunkKeys; t += lanes) {
      hn::Store(hn::Mul(hn::Load(df, s_row + t), hn::LoadU(df, scale + t)), df, s_row + t);
    }
  }
}

// kPaired: T is bf16, task.q and task.o are in paired order, the tile is one pass of rows
// (num_rows <= kRowGroup) and head_dim a multiple of kValueVectors * lanes.
template <typename T, bool kPaired>
void attend_tile_typed(const TileTask& task) {
  const DF df;
  const int32_t lanes = static_cast<int32_t>(hn::Lanes(df));
  const int32_t head_dim = task.head_dim;
  const int32_t group = task.rows_per_token;
  const int32_t num_tokens = task.num_rows / group;
  // [num_heads][num_rows][kChunkKeys] logits, then probabilities
  float* s_all = task.scratch;
  // [kChunkKeys][head_dim] widened K
  float* k_buf = s_all + int64_t{task.num_heads} * task.num_rows * kChunkKeys;
  float* v_buf = k_buf + int64_t{kChunkKeys} * head_dim;  // [kChunkKeys][head_dim] widened V
  const float* k_rows_f32[kChunkKeys];                    // [num_keys] -> rows of k_buf
  const float* v_rows_f32[kChunkKeys];                    // [num_keys] -> rows of v_buf
  const T* k_rows[kChunkKeys];        // [num_keys] -> K row [head_dim] in the pool
  const T* v_rows[kChunkKeys];        // [num_keys] -> V row [head_dim] in the pool
  int64_t key_elem[kChunkKeys];       // element offset of each key's row in KV head 0
  int64_t next_key_elem[kChunkKeys];  // the same for the next chunk (prefetch)
  constexpr bool kScaled = kIsKv8<T>;
  int64_t key_scale[kChunkKeys];          // 8-bit: byte offset of each key's scale in KV head 0
  HWY_ALIGN float row_scale[kChunkKeys];  // 8-bit: one head's K (then V) row scales of the chunk
  const PagedKv& kv = *task.kv;

  for (int32_t j0 = task.kv_begin; j0 < task.kv_end; j0 += kChunkKeys) {
    const int32_t num_keys = std::min(kChunkKeys, task.kv_end - j0);
    const int32_t j_last = j0 + num_keys - 1;
    // Tokens at positions p see keys [p - window + 1, p]; keep those that see any of
    // [j0, j_last]: p >= j0 and (no window or p - window + 1 <= j_last).
    int32_t tok_begin = std::max(0, j0 - task.first_pos);
    int32_t tok_end = num_tokens;
    if (task.window > 0) {
      const int64_t last_pos = int64_t{j_last} + task.window - 1;
      tok_end = static_cast<int32_t>(
          std::min<int64_t>(num_tokens, std::max<int64_t>(0, last_pos - task.first_pos + 1)));
    }
    if (tok_begin >= tok_end) continue;
    const int32_t row_begin = tok_begin * group;
    const int32_t row_end = tok_end * group;
    const bool widen_once = !std::is_same_v<T, float> && row_end - row_begin > kRowGroup;

    key_offsets(task, j0, num_keys, key_elem, kScaled ? key_scale : nullptr);
    const int32_t next_j0 = j0 + kChunkKeys;
    const int32_t next_num_keys = std::min(kChunkKeys, task.kv_end - next_j0);
    // K of every head first, then V of every head: a block stores [K, V][head][key], so each is
    // read in address order, two sequential runs (one per block of the chunk) instead of four.
    for (int32_t hh = 0; hh < task.num_heads; ++hh) {
      // The state of this head's rows.
      const int32_t kv_head = task.kv_head + hh;
      const float* q = task.q + int64_t{hh} * task.num_rows * head_dim;  // [num_rows][head_dim]
      float* o = task.o + int64_t{hh} * task.num_rows * head_dim;        // [num_rows][head_dim]
      float* m = task.m + int64_t{hh} * task.num_rows;                   // [num_rows]
      float* l = task.l + int64_t{hh} * task.num_rows;                   // [num_rows]
      float* s = s_all + int64_t{hh} * task.num_rows * kChunkKeys;       // [num_rows][kChunkKeys]
      if (task.prefetch) {
        if (hh + 1 < task.num_heads) {
          prefetch_unit(task, kv.k, kv_head + 1, key_elem, num_keys);
        } else {
          prefetch_unit(task, kv.v, task.kv_head, key_elem, num_keys);
        }
      }
      gather_rows(task, kv_head, kv.k, key_elem, num_keys, k_rows);

      // 1. logits. A tile of more than one row group widens the chunk's K once to f32, rather
      // than once per row group in registers.
      if (widen_once) {
        widen_rows(df, k_rows, num_keys, head_dim, k_buf, k_rows_f32);
        logits_for_rows<float, false>(df, q, k_rows_f32, row_begin, row_end, num_keys, head_dim, s);
      } else {
        logits_for_rows<T, kPaired>(df, q, k_rows, row_begin, row_end, num_keys, head_dim, s);
      }
      if constexpr (kScaled) {
        gather_scales(df, task, kv_head, kv.k, key_scale, num_keys, kKv8ScaleFactor<T>, row_scale);
        scale_columns(df, s, row_scale, row_begin, row_end);
      }

      // 2. cap, mask, online softmax
      const VF cap = hn::Set(df, task.soft_cap);
      const VF inv_cap = hn::Set(df, task.soft_cap > 0.0f ? 1.0f / task.soft_cap : 0.0f);
      for (int32_t r = row_begin; r < row_end; ++r) {
        float* s_row = s + int64_t{r} * kChunkKeys;  // [kChunkKeys]
        if (task.soft_cap > 0.0f) {
          for (int32_t t = 0; t < kChunkKeys; t += lanes) {
            const VF x = hn::Load(df, s_row + t);
            hn::Store(hn::Mul(cap, hn::Tanh(df, hn::Mul(x, inv_cap))), df, s_row + t);
          }
        }
        // Keys j0 + t with t in [t_begin, t_end) are visible: j <= pos and pos - j < window.
        const int32_t pos = task.first_pos + r / group;
        const int32_t t_end = std::clamp(pos - j0 + 1, 0, num_keys);
        const int32_t t_begin =
            task.window > 0 ? std::clamp(pos - task.window + 1 - j0, 0, t_end) : 0;
        std::fill(s_row, s_row + t_begin, kNegInf);
        std::fill(s_row + t_end, s_row + kChunkKeys, kNegInf);
        VF max_vec = hn::Set(df, kNegInf);
        for (int32_t t = 0; t < kChunkKeys; t += lanes) {
          max_vec = hn::Max(max_vec, hn::Load(df, s_row + t));
        }
        const float row_max = hn::GetLane(hn::MaxOfLanes(df, max_vec));
        const float m_old = m[r];
        const float m_new = std::max(m_old, row_max);
        if (m_new == kNegInf) {  // sees nothing yet: P = 0 keeps o unchanged
          std::fill(s_row, s_row + kChunkKeys, 0.0f);
          continue;
        }
        const VF m_vec = hn::Set(df, m_new);
        VF sum = hn::Zero(df);
        for (int32_t t = 0; t < kChunkKeys; t += lanes) {
          const VF p = hn::Exp(df, hn::Sub(hn::Load(df, s_row + t), m_vec));
          hn::Store(p, df, s_row + t);
          sum = hn::Add(sum, p);
        }
        const float alpha = std::exp(m_old - m_new);  // 0 when m_old is -inf
        l[r] = l[r] * alpha + hn::GetLane(hn::SumOfLanes(df, sum));
        m[r] = m_new;
        if (alpha != 1.0f) {
          float* o_row = o + int64_t{r} * head_dim;
          const VF a = hn::Set(df, alpha);
          int32_t d = 0;
          for (; d + lanes <= head_dim; d += lanes) {
            hn::StoreU(hn::Mul(a, hn::LoadU(df, o_row + d)), df, o_row + d);
          }
          for (; d < head_dim; ++d) o_row[d] *= alpha;
        }
      }
    }

    for (int32_t hh = 0; hh < task.num_heads; ++hh) {
      const int32_t kv_head = task.kv_head + hh;
      float* o = task.o + int64_t{hh} * task.num_rows * head_dim;   // [num_rows][head_dim]
      float* s = s_all + int64_t{hh} * task.num_rows * kChunkKeys;  // [num_rows][kChunkKeys]
      if (task.prefetch) {
        if (hh + 1 < task.num_heads) {
          prefetch_unit(task, kv.v, kv_head + 1, key_elem, num_keys);
        } else if (next_num_keys > 0) {
          key_offsets(task, next_j0, next_num_keys, next_key_elem, nullptr);
          prefetch_unit(task, kv.k, task.kv_head, next_key_elem, next_num_keys);
        }
      }
      // 3. values (8-bit: each probability times its V row's scale first)
      gather_rows(task, kv_head, kv.v, key_elem, num_keys, v_rows);
      if constexpr (kScaled) {
        gather_scales(df, task, kv_head, kv.v, key_scale, num_keys, kKv8ScaleFactor<T>, row_scale);
        scale_columns(df, s, row_scale, row_begin, row_end);
      }
      if (widen_once) {
        widen_rows(df, v_rows, num_keys, head_dim, v_buf, v_rows_f32);
        values_for_rows<float, false>(df, o, s, v_rows_f32, row_begin, row_end, num_keys, head_dim);
      } else {
        values_for_rows<T, kPaired>(df, o, s, v_rows, row_begin, row_end, num_keys, head_dim);
      }
    }
  }
}

// The bf16 kernel in paired order (load_pair): q and o are reordered into a per-thread buffer on
// the way in and o back on the way out, a few thousand floats against an item's keys x heads.
void attend_tile_paired(const TileTask& task) {
  const int32_t lanes = static_cast<int32_t>(hn::Lanes(DF()));
  const int32_t head_dim = task.head_dim;
  const int64_t num_vectors = int64_t{task.num_heads} * task.num_rows;  // rows of q and of o
  // [2][num_vectors][head_dim]: q, then o, in paired order. Only grows.
  thread_local std::vector<float> buffer;
  const size_t needed = size_t(2 * num_vectors * head_dim);
  if (buffer.size() < needed) buffer.resize(needed);
  float* q = buffer.data();
  float* o = q + num_vectors * head_dim;
  for (int64_t i = 0; i < num_vectors; ++i) {
    to_paired(lanes, head_dim, task.q + i * head_dim, q + i * head_dim);
    to_paired(lanes, head_dim, task.o + i * head_dim, o + i * head_dim);
  }
  TileTask paired = task;
  paired.q = q;
  paired.o = o;
  attend_tile_typed<hwy::bfloat16_t, true>(paired);
  for (int64_t i = 0; i < num_vectors; ++i) {
    from_paired(lanes, head_dim, o + i * head_dim, task.o + i * head_dim);
  }
}

void attend_tile(const TileTask& task) {
  const int32_t lanes = static_cast<int32_t>(hn::Lanes(DF()));
  switch (task.kv->dtype) {
    case DType::F32:
      return attend_tile_typed<float, false>(task);
    case DType::BF16:
      if (task.pair_bf16 && task.num_rows <= kRowGroup &&
          task.head_dim % (kValueVectors * lanes) == 0) {
        return attend_tile_paired(task);
      }
      return attend_tile_typed<hwy::bfloat16_t, false>(task);
    case DType::F16:
      return attend_tile_typed<hwy::float16_t, false>(task);
    case DType::I8:
      return attend_tile_typed<int8_t, false>(task);
    case DType::FP8:
      return attend_tile_typed<E4m3Code, false>(task);
  }
}

const char* attend_tile_target() { return hwy::TargetName(HWY_TARGET); }

}  // namespace kvp::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvp::cpu {

HWY_EXPORT(attend_tile);
HWY_EXPORT(attend_tile_target);

// Prefetches the K and V rows of keys [j0, j0 + num_keys) of the item's KV heads. Blocks are
// scattered over the pool, so the hardware prefetcher loses the stream at every block boundary;
// asking one chunk ahead keeps enough misses in flight to stream at memory bandwidth.
HWY_INLINE void prefetch_rows(const TileTask& task, int32_t j0, int32_t num_keys) {
  const PagedKv& kv = *task.kv;
  const size_t elem_bytes = dtype_size_bytes(kv.dtype);
  const size_t row_bytes = size_t(task.head_dim) * elem_bytes;
  const auto* k_base = static_cast<const std::byte*>(kv.k);
  const auto* v_base = static_cast<const std::byte*>(kv.v);
  for (int32_t t = 0; t < num_keys;) {
    // The keys of one block are one run of rows per head.
    const int32_t j = j0 + t;
    const int32_t in_block = j % kv.block_size;
    const int32_t run = std::min(num_keys - t, kv.block_size - in_block);
    const int64_t block = task.block_table[j / kv.block_size];
    for (int32_t h = task.kv_head; h < task.kv_head + task.num_heads; ++h) {
      const size_t byte = size_t(kv.row_offset(block, h, in_block)) * elem_bytes;
      for (size_t line = 0; line < size_t(run) * row_bytes; line += 64) {
        hwy::Prefetch(k_base + byte + line);
        hwy::Prefetch(v_base + byte + line);
      }
    }
    t += run;
  }
}

void attend_tile(const TileTask& task) { HWY_DYNAMIC_DISPATCH(attend_tile)(task); }
const char* attend_tile_target() { return HWY_DYNAMIC_DISPATCH(attend_tile_target)(); }

}  // namespace kvp::cpu
#endif

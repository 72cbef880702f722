// The kernel of Q4_1 rows repacked at load for decode (RowLayout::kDecodeGroup, quant_matmul.h),
// compiled per Highway target, and the repacking itself. In the file's layout each block of 32
// weights starts with its own d and m, so row_tile (quant_kernel-inl.h) spends a load, an f16
// conversion, a shuffle and a scaling on every pair of blocks; here d, m and the nibbles of 8
// blocks each lie together, so a group of 8 blocks costs two 8-wide f16 conversions, four
// 32-byte nibble loads, one reduction and one scaling.
//
//   row    [num_blocks / 8 groups of 160 B][num_blocks % 8 blocks of 20 B, the file's layout]
//   group  d[8] f16, blocks 0 2 4 6 1 3 5 7 | m[8] f16, blocks 0..7 | qs[8][16], blocks 0..7
//
// Per group of a weight row and the activation row (quant_act.h: pair p holds blocks 2p, 2p + 1):
//   s_p = maddubs(lo_p, xlo_p) + maddubs(hi_p, xhi_p)    int16; lanes 0-7 block 2p, 8-15 2p + 1
//   madd(hadd(hadd(s_0, s_1), hadd(s_2, s_3)), 1)        int32, one lane per block, in the
//                                                        order 0 2 4 6 1 3 5 7 (d's order)
//   acc += f32(that) * (d * dx) + m * sums               dx gathered in d's order per call
// The int16 words cannot overflow: q <= 15 and |xq| <= 127 make a maddubs word at most 3810 in
// magnitude, the two halves' sum 7620, the first hadd 15240, the second 30480 < 32767.
// The row's last num_blocks % 8 blocks go through row_tile's pair step (row_pair). Targets
// without the x86 kernels read the layout one block at a time.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "quant/quant_kernels_decode.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// foreach_target must come first: it re-includes this file once per target.
#include <hwy/highway.h>

#include <cstring>
#include <vector>

#include "common/check.h"
#include "quant/quant_formats_32-inl.h"
#include "quant/quant_kernel-inl.h"
#include "quant/quant_kernels.h"

#ifndef KVP_QUANT_DECODE_GROUP_ONCE_
#define KVP_QUANT_DECODE_GROUP_ONCE_
namespace kvp::quant::decode_group {

inline constexpr int64_t kGroupBlocks = 8;
inline constexpr size_t kGroupBytes = 160;  // 8 Q4_1 blocks of 20 B
inline constexpr size_t kQsAt = 32;         // the nibbles' offset in a group

// Where block k < 8 of a group keeps its d: the kernel's lanes come out in the order
// 0 2 4 6 1 3 5 7.
constexpr size_t d_slot(int k) { return static_cast<size_t>(k / 2 + 4 * (k % 2)); }

}  // namespace kvp::quant::decode_group
#endif

HWY_BEFORE_NAMESPACE();
namespace kvp::quant::HWY_NAMESPACE {
namespace decode_group {
using namespace kvp::quant::decode_group;  // NOLINT(google-build-using-namespace)

#if KVP_QUANT_X86

// s_p of the header: the int16 products of the pair of blocks whose nibbles are at qs (32 B:
// block 2p's 16, then 2p + 1's) with the activation pair at xq (64 B).
HWY_INLINE __m256i pair_sums(const uint8_t* qs, const uint8_t* xq) {
  const __m256i v = load256(qs);
  const __m256i mask = _mm256_set1_epi8(0x0f);
  const __m256i lo = _mm256_and_si256(v, mask);
  const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
  return _mm256_add_epi16(_mm256_maddubs_epi16(lo, load256(xq)),
                          _mm256_maddubs_epi16(hi, load256(xq + 32)));
}

// C weight rows (from o0) x one activation row (xq, xd, xs: quant_act.h; dxg: its block scales
// in d's order per group): y[o0 + c]. Each weight row's group is finished before the next row's.
template <int C>
HWY_NOINLINE void group_tile(const QuantMatrix& w, int64_t o0, const uint8_t* xq, const float* xd,
                             const float* xs, const float* dxg, float* y) {
  const int64_t num_blocks = w.cols / 32;
  const int64_t num_groups = num_blocks / kGroupBlocks;
  const uint8_t* wr[C];
  __m256 acc[C];
  __m128 macc[C];
  for (int c = 0; c < C; ++c) {
    wr[c] = reinterpret_cast<const uint8_t*>(w.row(o0 + c));
    acc[c] = _mm256_setzero_ps();
    macc[c] = _mm_setzero_ps();
  }
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t g = 0; g < num_groups; ++g) {
    const uint8_t* xg = xq + 4 * 64 * g;
    const __m256 dx = _mm256_loadu_ps(dxg + 8 * g);
    const __m256 sums = _mm256_loadu_ps(xs + 8 * g);
    for (int c = 0; c < C; ++c) {
      const uint8_t* grp = wr[c] + kGroupBytes * static_cast<size_t>(g);
      prefetch_ahead<kGroupBytes>(grp);
      const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(grp)));
      const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(grp + 16)));
      const uint8_t* qs = grp + kQsAt;
      const __m256i s01 = _mm256_hadd_epi16(pair_sums(qs, xg), pair_sums(qs + 32, xg + 64));
      const __m256i s23 =
          _mm256_hadd_epi16(pair_sums(qs + 64, xg + 128), pair_sums(qs + 96, xg + 192));
      const __m256i dot = _mm256_madd_epi16(_mm256_hadd_epi16(s01, s23), ones);
      acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(d, dx), acc[c]);
      acc[c] = _mm256_fmadd_ps(m, sums, acc[c]);
    }
  }
  // The tail's blocks are in the file's layout at the byte offset they have there (a group is
  // 8 blocks' bytes), so row_pair's indexing by pair holds.
  const int64_t num_full_pairs = num_blocks / 2;
  for (int64_t p = num_groups * kGroupBlocks / 2; p < num_full_pairs; ++p) {
    row_pair<FmtQ4_1, C, false>(wr, p, xq, xd, xs, acc, macc);
  }
  if (num_blocks % 2 != 0) row_pair<FmtQ4_1, C, true>(wr, num_full_pairs, xq, xd, xs, acc, macc);
  for (int c = 0; c < C; ++c) {
    y[o0 + c] = hsum(_mm256_add_ps(acc[c], _mm256_insertf128_ps(_mm256_setzero_ps(), macc[c], 0)));
  }
}

#else  // !KVP_QUANT_X86

// Weight row o x activation row t, a block at a time.
HWY_NOINLINE void group_row(const QuantMatrix& w, int64_t o, const ActBlocks& a, int64_t t,
                            float* y) {
  const int64_t num_blocks = w.cols / 32;
  const int64_t num_grouped = num_blocks / kGroupBlocks * kGroupBlocks;
  const auto* wr = reinterpret_cast<const uint8_t*>(w.row(o));
  const float* xs = a.sums_row(t);
  float acc = 0;
  for (int64_t b = 0; b < num_blocks; ++b) {
    const uint8_t *dp, *mp, *qs;
    if (b < num_grouped) {
      const uint8_t* grp = wr + kGroupBytes * static_cast<size_t>(b / kGroupBlocks);
      const int k = static_cast<int>(b % kGroupBlocks);
      dp = grp + 2 * d_slot(k);
      mp = grp + 16 + 2 * k;
      qs = grp + kQsAt + 16 * k;
    } else {
      dp = wr + FmtQ4_1::kBytes * static_cast<size_t>(b);
      mp = dp + 2;
      qs = dp + 4;
    }
    uint8_t q[32];
    unpack_nibbles(qs, q);
    int32_t sum = 0;
    for (int j = 0; j < 32; ++j) sum += int32_t{q[j]} * int32_t{a.q_at(t, b, j)};
    acc += static_cast<float>(sum) * (f16_at(dp) * a.d_at(t, b));
    acc += f16_at(mp) * xs[b];
  }
  y[o] = acc;
}

#endif  // KVP_QUANT_X86

}  // namespace decode_group

void block_rows_32_decode_group(const RowRange& rr, const ActBlocks& a) {
  using namespace decode_group;  // NOLINT(google-build-using-namespace)
  for (int64_t t = 0; t < rr.num_rows; ++t) {
    float* y = rr.y + t * rr.ldy;
    int64_t o = rr.row_begin;
#if KVP_QUANT_X86
    // [num_groups * 8] the activation row's block scales in d's order per group; per thread,
    // reused across calls.
    thread_local std::vector<float> dxg;
    const int64_t num_groups = a.num_blocks / kGroupBlocks;
    dxg.resize(static_cast<size_t>(num_groups * kGroupBlocks));
    for (int64_t g = 0; g < num_groups; ++g) {
      for (int k = 0; k < kGroupBlocks; ++k) {
        dxg[static_cast<size_t>(g * kGroupBlocks) + d_slot(k)] = a.d_at(t, g * kGroupBlocks + k);
      }
    }
    const auto* xq = reinterpret_cast<const uint8_t*>(a.q_row(t));
    const float* xd = a.d_row(t);
    const float* xs = a.sums_row(t);
    if (rr.w->row_bytes < kOneRowTileBytes) {
      for (; o + kRowTileRows <= rr.row_end; o += kRowTileRows) {
        group_tile<kRowTileRows>(*rr.w, o, xq, xd, xs, dxg.data(), y);
      }
    }
    for (; o < rr.row_end; ++o) group_tile<1>(*rr.w, o, xq, xd, xs, dxg.data(), y);
#else
    for (; o < rr.row_end; ++o) group_row(*rr.w, o, a, t, y);
#endif
  }
}

bool decode_group_kernel_is_vector() { return KVP_QUANT_X86 != 0; }

}  // namespace kvp::quant::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvp::quant {

HWY_EXPORT(block_rows_32_decode_group);
HWY_EXPORT(decode_group_kernel_is_vector);

void block_rows_32_decode_group(const RowRange& rr, const ActBlocks& a) {
  HWY_DYNAMIC_DISPATCH(block_rows_32_decode_group)(rr, a);
}
bool decode_group_kernel_is_vector() {
  return HWY_DYNAMIC_DISPATCH(decode_group_kernel_is_vector)();
}

bool decode_layout_pays(GgmlType type) {
  return type == GgmlType::Q4_1 && decode_group_kernel_is_vector();
}

QuantMatrix repack_for_decode(const QuantMatrix& w, std::byte* out) {
  using namespace decode_group;  // NOLINT(google-build-using-namespace)
  KVP_CHECK(w.type == GgmlType::Q4_1 && w.layout == RowLayout::kGgml,
            "repack_for_decode: {} matrix, not Q4_1 in the file's layout", ggml_type_name(w.type));
  const int64_t num_groups = w.cols / 32 / kGroupBlocks;
  const size_t grouped_bytes = kGroupBytes * static_cast<size_t>(num_groups);
  for (int64_t r = 0; r < w.rows; ++r) {
    const std::byte* src = w.row(r);
    std::byte* dst = out + static_cast<size_t>(r) * w.row_bytes;
    for (int64_t g = 0; g < num_groups; ++g) {
      std::byte* grp = dst + kGroupBytes * static_cast<size_t>(g);
      for (int k = 0; k < kGroupBlocks; ++k) {
        const std::byte* blk = src + 20 * static_cast<size_t>(g * kGroupBlocks + k);
        std::memcpy(grp + 2 * d_slot(k), blk, 2);
        std::memcpy(grp + 16 + 2 * k, blk + 2, 2);
        std::memcpy(grp + kQsAt + 16 * k, blk + 4, 16);
      }
    }
    std::memcpy(dst + grouped_bytes, src + grouped_bytes, w.row_bytes - grouped_bytes);
  }
  QuantMatrix m = w;
  m.data = out;
  m.layout = RowLayout::kDecodeGroup;
  return m;
}

void decode_group_row_to_ggml(const QuantMatrix& w, int64_t r, std::byte* out) {
  using namespace decode_group;  // NOLINT(google-build-using-namespace)
  const int64_t num_groups = w.cols / 32 / kGroupBlocks;
  const size_t grouped_bytes = kGroupBytes * static_cast<size_t>(num_groups);
  const std::byte* src = w.row(r);
  for (int64_t g = 0; g < num_groups; ++g) {
    const std::byte* grp = src + kGroupBytes * static_cast<size_t>(g);
    for (int k = 0; k < kGroupBlocks; ++k) {
      std::byte* blk = out + 20 * static_cast<size_t>(g * kGroupBlocks + k);
      std::memcpy(blk, grp + 2 * d_slot(k), 2);
      std::memcpy(blk + 2, grp + 16 + 2 * k, 2);
      std::memcpy(blk + 4, grp + kQsAt + 16 * k, 16);
    }
  }
  std::memcpy(out + grouped_bytes, src + grouped_bytes, w.row_bytes - grouped_bytes);
}

}  // namespace kvp::quant
#endif

// The kernels behind matmul (quant_matmul.h), one entry per format family, each compiled for
// every Highway target and dispatched at run time. They compute a range of output rows of one
// matrix for every activation row; matmul splits the rows over threads and prepares the
// activations. Internal to quant/.
#pragma once

#include <cstdint>

#include "quant/quant_act.h"
#include "quant/quant_matmul.h"

namespace kvp::quant {

// Output rows [row_begin, row_end) of w for activation rows [0, num_rows):
//   y[t * ldy + o] = sum_i x[t][i] * W[o][i]
struct RowRange {
  const QuantMatrix* w = nullptr;
  int64_t row_begin = 0;
  int64_t row_end = 0;
  int64_t num_rows = 0;
  float* y = nullptr;  // [num_rows][ldy]; columns [row_begin, row_end) written
  int64_t ldy = 0;
};

// Integer kernels over int8 activations (quant_act.h): weight blocks of 32 (Q4_0, Q4_1, Q5_0,
// Q5_1, Q8_0, IQ4_NL) over activations quantised per 32, super-blocks of 256 (Q2_K..Q6_K,
// IQ4_XS) over activations quantised per 256.
// requires: block_kernel_supports(w.type); acts.num_blocks * 32 (block_rows_32) or
//   acts.num_blocks * 256 (block_rows_k) == w.cols.
bool block_kernel_supports(GgmlType type);
void block_rows_32(const RowRange& range, const ActBlocks& acts);
void block_rows_k(const RowRange& range, const ActBlocksK& acts);
// The same products for many activation rows (prefill): the range's weight rows are repacked 8
// at a time, once per call, so each tile only loads and multiplies (quant_kernels_prefill.cc).
// Equal to block_rows_k / block_rows_32 up to the order of f32 additions.
void block_rows_k_prefill(const RowRange& range, const ActBlocksK& acts);
void block_rows_32_prefill(const RowRange& range, const ActBlocks& acts);
// Whether the target the kernels run on repacks (x86); elsewhere the *_prefill entries run the
// decode tiles.
bool prefill_tiles_repack();

// Q4_1 rows in RowLayout::kDecodeGroup (quant_matmul.h) for every activation row, one at a
// time (quant_kernels_decode.cc). requires: rr.w->type == Q4_1, rr.w->layout == kDecodeGroup;
// acts.num_blocks * 32 == w.cols.
void block_rows_32_decode_group(const RowRange& range, const ActBlocks& acts);
// Whether the target the kernels run on has the vector kernel of that layout (x86).
bool decode_group_kernel_is_vector();
// Row r of a kDecodeGroup matrix back in the file's layout: w.row_bytes bytes to out.
void decode_group_row_to_ggml(const QuantMatrix& w, int64_t r, std::byte* out);

// F32 / F16 / BF16 weights against f32 activations x [num_rows][ldx], multiply-add in f32.
void float_rows(const RowRange& range, const float* x, int64_t ldx);

// The Highway target the kernels run on now ("AVX3_DL", "AVX2", ...).
const char* block_kernel_target();

}  // namespace kvp::quant

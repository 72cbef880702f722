// Matrix products over weights kept in the format their file stores (GGUF block formats, and
// 16/32-bit floats): the CPU runner's linear layers, lm-head included.
//
//   QuantMatrix W [rows][cols] in a ggml type: row r is the row_bytes bytes at data + r*row_bytes
//   (ggml's layout: a row is cols / block_size blocks). Usually a view into a memory-mapped file.
//   matmul(W, x, y): y[t][o] = sum_i x[t][i] * W[o][i] for every activation row t, output o.
//
// Data flow inside matmul: the activation rows are prepared once per call for the weight's type
// (quantised per block to int8 with a scale where the fastest kernel of that type works so,
// kept in f32 otherwise), then the output rows are split over the thread pool; each thread
// reads its weight rows once and dots each with every activation row. Kernels are Highway,
// compiled for every x86/ARM target Highway builds and picked at run time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "common/thread_pool.h"
#include "quant/dequant.h"

namespace kvp::quant {

// How a matrix's rows hold their blocks.
//   kGgml:        the file's layout (dequant.h)
//   kDecodeGroup: Q4_1 only, repacked at load for one activation row (repack_for_decode): each
//                 row is groups of 8 blocks, then the row's last num_blocks % 8 blocks in the
//                 file's layout; same bytes per row as kGgml.
//                   group [160 B] = d[8] f16 | m[8] f16 | qs[8][16]
//                   d in block order 0 2 4 6 1 3 5 7 (the lanes in which the kernel's sums of
//                   a group come out), m and qs in block order
enum class RowLayout { kGgml, kDecodeGroup };

struct QuantMatrix {
  GgmlType type = GgmlType::F32;
  const std::byte* data = nullptr;  // rows * row_bytes bytes, any alignment; not owned
  int64_t rows = 0;
  int64_t cols = 0;      // a multiple of the type's block size
  size_t row_bytes = 0;  // ggml_row_size_bytes(type, cols)
  RowLayout layout = RowLayout::kGgml;

  const std::byte* row(int64_t r) const { return data + static_cast<size_t>(r) * row_bytes; }
  size_t size_bytes() const { return static_cast<size_t>(rows) * row_bytes; }
};

// A view of `rows` x `cols` of `type` at `data`. requires: cols % block_size == 0.
QuantMatrix make_matrix(GgmlType type, const void* data, int64_t rows, int64_t cols);

// Rows [row_begin, row_begin + num_rows) of w as a matrix of their own, viewing w's bytes in
// place (one expert of a 3-D expert tensor stored as [experts * rows][cols]).
// requires: 0 <= row_begin, num_rows >= 0, row_begin + num_rows <= w.rows.
QuantMatrix slice_rows(const QuantMatrix& w, int64_t row_begin, int64_t num_rows);

// Whether matmul has a kernel for this type (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
// Q2_K..Q6_K, IQ4_NL, IQ4_XS).
bool matmul_supports(GgmlType type);

// How activations meet block-format weights:
//   kInt8:    quantised to int8 with a scale per 32 (32-block formats) or per 256 (K formats), as
//             llama.cpp's Q8_0 / Q8_1 / Q8_K activations: below kPrefillMinRows activation rows
//             (decode) for every block format; from there as kPrefill. Integer dot products;
//             each product carries the rounding of the activation (error <= 1/254 of the
//             largest |x| of its block of 32 or 256 per element)
//   kF32:     the weights are dequantised to f32 and multiplied in f32 (by OpenBLAS sgemm over
//             dequantised panels): the same numbers as dequantise-then-f32 up to summation order
//   kPrefill: a prompt step's products: int8 activations (as kInt8, at any number of rows) for
//             the formats where prefill_prefers_int8(type), f32 (as kF32) for the others
//   kInt8All: int8 activations for every block format at every row count, whichever is faster:
//             for tests and benchmarks that compare the two prefill paths
// F32/F16/BF16 weights always multiply in f32.
enum class ActPrecision { kInt8, kF32, kPrefill, kInt8All };

// From this many activation rows a product counts as prefill (see ActPrecision).
inline constexpr int64_t kPrefillMinRows = 32;

// Whether kPrefill (and kInt8 from kPrefillMinRows rows) use int8 activations for `type`: true
// for every block format where the prefill tiles over repacked weight rows run (x86 targets),
// measured 3.8-5.7x faster than dequantise + sgemm at 512 activation rows (docs/perf/model.md,
// "Prefill on repacked weight rows").
bool prefill_prefers_int8(GgmlType type);

// y[t * ldy + o] = sum_i x[t * ldx + i] * W[o][i] for t < num_rows, o < w.rows. Overwrites y's
// w.rows columns of each row and nothing else. Threads: the pool's (null: the caller only).
// requires: matmul_supports(w.type); ldx >= w.cols; ldy >= w.rows; x and y do not overlap;
//   not called from inside a parallel_for of the same pool.
void matmul(const QuantMatrix& w, const float* x, int64_t num_rows, int64_t ldx, float* y,
            int64_t ldy, ThreadPool* pool, ActPrecision precision = ActPrecision::kInt8);
// Several matrices of the same cols stacked as output rows (q, k, v; gate, up), in one pass over
// the pool: part p's output o is column (rows of parts before p) + o of y. The parts may have
// different types. requires: as above for each part; ldy >= the sum of their rows.
void matmul(std::span<const QuantMatrix> parts, const float* x, int64_t num_rows, int64_t ldx,
            float* y, int64_t ldy, ThreadPool* pool, ActPrecision precision = ActPrecision::kInt8);

// Whether repack_for_decode's layout has a kernel that pays on the target the kernels run on
// (x86 targets) for `type` (Q4_1). Elsewhere the layout still works, through a portable loop.
bool decode_layout_pays(GgmlType type);

// w's rows in RowLayout::kDecodeGroup, written to out, and the matrix viewing out. Every
// function here (matmul at any number of rows and precision, dequantize_row, matmul_reference)
// takes either layout: matmul runs the layout's kernel on decode rows (int8 activations, below
// kPrefillMinRows rows; one activation row at a time), and the file layout's prefill kernels
// over a copy of each item's rows turned back.
// requires: w.type == Q4_1; w.layout == kGgml; out holds w.size_bytes() bytes and does not
// overlap w. Does not modify w.
QuantMatrix repack_for_decode(const QuantMatrix& w, std::byte* out);

// The exact product of the dequantised weights with x (f64 accumulation), one thread: the
// reference the kernels are tested against.
void matmul_reference(const QuantMatrix& w, const float* x, int64_t num_rows, int64_t ldx, float* y,
                      int64_t ldy);

// out[0..cols) = row r of W as f32 (an embedding lookup). requires: can_dequantize(w.type).
void dequantize_row(const QuantMatrix& w, int64_t r, float* out);

}  // namespace kvp::quant

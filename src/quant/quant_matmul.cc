// matmul's orchestration (quant_matmul.h): picks the kernel family per part, quantises the
// activation rows once per call into each int8 layout a part needs (blocks of 32 for the
// 32-block formats, of 256 for the K formats), cuts the output rows of
// all parts into items of a few KiB of weights, and runs the items in one parallel_for.
#include "quant/quant_matmul.h"

#include <cblas.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "common/check.h"
#include "quant/quant_act.h"
#include "quant/quant_kernels.h"

namespace kvp::quant {

QuantMatrix make_matrix(GgmlType type, const void* data, int64_t rows, int64_t cols) {
  QuantMatrix m;
  m.type = type;
  m.data = static_cast<const std::byte*>(data);
  m.rows = rows;
  m.cols = cols;
  m.row_bytes = ggml_row_size_bytes(type, static_cast<size_t>(cols));
  return m;
}

QuantMatrix slice_rows(const QuantMatrix& w, int64_t row_begin, int64_t num_rows) {
  KVP_CHECK(row_begin >= 0 && num_rows >= 0 && row_begin + num_rows <= w.rows,
            "slice_rows: rows [{}, {}) of a {}-row matrix", row_begin, row_begin + num_rows,
            w.rows);
  QuantMatrix m = w;
  m.data = w.row(row_begin);
  m.rows = num_rows;
  return m;
}

namespace {

bool is_float_type(GgmlType type) {
  return type == GgmlType::F32 || type == GgmlType::F16 || type == GgmlType::BF16;
}

bool is_k_type(GgmlType type) {
  switch (type) {
    case GgmlType::Q2_K:
    case GgmlType::Q3_K:
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
    case GgmlType::Q6_K:
    case GgmlType::IQ4_XS:
      return true;
    default:
      return false;
  }
}

// One item of work: output rows [row_begin, row_end) of part `part`.
struct Item {
  int32_t part;
  int64_t row_begin;
  int64_t row_end;
};

// Weight bytes per item: small enough that the rows of an item stay in L2 while every tile of 4
// activation rows reads them again, large enough that dispatch costs little and that a thread
// reads one long stretch of memory (items are handed out in order, so consecutive items go to
// different threads): at 1 activation row and 2 threads, Q4_K 14336 x 4096 took 1.4 ms with
// 64 KiB items against 2.4 ms with 16 KiB (quant_matmul_bench).
constexpr size_t kItemBytes = 64 << 10;
constexpr int64_t kItemRowMultiple = 4;  // whole weight-row tiles per item

// Weight rows per item on the prefill (panel) path: an f32 panel of this many rows is
// 64 x cols x 4 bytes (144 KiB at cols 576, 1 MiB at 4096), and the GEMM over it does
// num_rows x 64 x cols multiply-adds, enough for OpenBLAS's kernels to run at full rate.
constexpr int64_t kPanelRowsPerItem = 64;
// Rows per item on the panel and repacked paths are a multiple of this: the repacked path's
// panels of 8 weight rows (16 on AVX-512 targets, which take an 8-row panel for the rows past
// the last 16: block_rows_k_prefill).
constexpr int64_t kPanelRowMultiple = 8;

// Cuts every part into items of about kItemBytes (int8 and float kernels) or kPanelRowsPerItem
// rows (parts on the f32 panel or repacked int8 path: by_rows[p]), but at least 4 items per
// thread overall so the last items balance the threads.
void plan_items(std::span<const QuantMatrix> parts, int num_threads,
                const std::vector<bool>& by_rows, std::vector<Item>& items) {
  items.clear();
  size_t total_bytes = 0;
  int64_t total_rows = 0;
  for (const QuantMatrix& w : parts) {
    total_bytes += w.size_bytes();
    total_rows += w.rows;
  }
  const size_t min_items = static_cast<size_t>(4 * num_threads);
  const size_t item_bytes =
      std::max<size_t>(1, std::min(kItemBytes, total_bytes / std::max<size_t>(min_items, 1)));
  for (size_t p = 0; p < parts.size(); ++p) {
    const QuantMatrix& w = parts[p];
    int64_t rows_per_item = static_cast<int64_t>(item_bytes / std::max<size_t>(w.row_bytes, 1));
    int64_t multiple = kItemRowMultiple;
    if (by_rows[p]) {
      rows_per_item = std::min(kPanelRowsPerItem, total_rows / static_cast<int64_t>(min_items));
      multiple = kPanelRowMultiple;
    }
    rows_per_item = std::max<int64_t>(multiple, rows_per_item / multiple * multiple);
    for (int64_t r = 0; r < w.rows; r += rows_per_item) {
      items.push_back({static_cast<int32_t>(p), r, std::min(w.rows, r + rows_per_item)});
    }
  }
}

// From kPrefillMinRows activation rows (prefill), a part that does not take int8 activations
// dequantises its weight rows once per item into an f32 panel (F32 weights are used in place)
// and multiplies by it with OpenBLAS's sgemm, run single-threaded inside the item: measured
// (bench/quant/quant_matmul_bench) at about twice the rate of the Highway f32 kernel, and exact
// in f32 (no activation quantisation).
static_assert(kPrefillMinRows == 32, "docs/models.md and the runner describe 32 rows");

// OpenBLAS runs single-threaded inside our items (its own threads would fight the pool's).
void openblas_single_threaded() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

// y[t][o] = sum_i x[t][i] * panel[o][i]: [num_rows][ldx] x [panel_rows][cols]^T.
void sgemm_panel(const float* x, int64_t num_rows, int64_t ldx, const float* panel,
                 int64_t panel_rows, int64_t cols, float* y, int64_t ldy) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(num_rows),
              static_cast<blasint>(panel_rows), static_cast<blasint>(cols), 1.0f, x,
              static_cast<blasint>(ldx), panel, static_cast<blasint>(cols), 0.0f, y,
              static_cast<blasint>(ldy));
}

// Per calling thread: reused across calls, so a decode step allocates nothing.
struct Scratch {
  ActBuffer acts;
  ActBufferK acts_k;
  std::vector<Item> items;
  std::vector<int64_t> offsets;
  std::vector<bool> panels;    // [parts]: the part goes through f32 panels and sgemm
  std::vector<bool> repacked;  // [parts]: int8 prefill: block_rows_*_prefill
  std::vector<bool> by_rows;   // [parts]: panels or repacked, items of whole panels of rows
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

}  // namespace

bool block_kernel_supports(GgmlType type) {
  switch (type) {
    case GgmlType::Q4_0:
    case GgmlType::Q4_1:
    case GgmlType::Q5_0:
    case GgmlType::Q5_1:
    case GgmlType::Q8_0:
    case GgmlType::IQ4_NL:
      return true;
    default:
      return is_k_type(type);
  }
}

bool matmul_supports(GgmlType type) { return is_float_type(type) || block_kernel_supports(type); }

// The decode tiles at 512 activation rows were no faster than the f32 panels (docs/perf/model.md,
// "Prefill with int8 activations"); the repacked tiles of the x86 targets are 3-5x faster
// ("Prefill on repacked weight rows"), so every block format takes them where they run.
bool prefill_prefers_int8(GgmlType type) {
  return block_kernel_supports(type) && prefill_tiles_repack();
}

void dequantize_row(const QuantMatrix& w, int64_t r, float* out) {
  if (w.layout == RowLayout::kDecodeGroup) {
    // [row_bytes] the row back in the file's layout; per thread, reused across calls.
    thread_local std::vector<std::byte> row;
    row.resize(w.row_bytes);
    decode_group_row_to_ggml(w, r, row.data());
    dequantize(w.type, row.data(), static_cast<size_t>(w.cols), out);
    return;
  }
  dequantize(w.type, w.row(r), static_cast<size_t>(w.cols), out);
}

void matmul_reference(const QuantMatrix& w, const float* x, int64_t num_rows, int64_t ldx, float* y,
                      int64_t ldy) {
  std::vector<float> row(static_cast<size_t>(w.cols));
  for (int64_t o = 0; o < w.rows; ++o) {
    dequantize_row(w, o, row.data());
    for (int64_t t = 0; t < num_rows; ++t) {
      double acc = 0;
      for (int64_t i = 0; i < w.cols; ++i) acc += double{x[t * ldx + i]} * double{row[i]};
      y[t * ldy + o] = static_cast<float>(acc);
    }
  }
}

void matmul(const QuantMatrix& w, const float* x, int64_t num_rows, int64_t ldx, float* y,
            int64_t ldy, ThreadPool* pool, ActPrecision precision) {
  matmul(std::span<const QuantMatrix>(&w, 1), x, num_rows, ldx, y, ldy, pool, precision);
}

void matmul(std::span<const QuantMatrix> parts, const float* x, int64_t num_rows, int64_t ldx,
            float* y, int64_t ldy, ThreadPool* pool, ActPrecision precision) {
  if (parts.empty() || num_rows == 0) return;
  const int64_t cols = parts[0].cols;
  bool any_32 = false, any_k = false;
  for (const QuantMatrix& w : parts) {
    KVP_CHECK(matmul_supports(w.type), "matmul: no kernel for {}", ggml_type_name(w.type));
    KVP_CHECK(w.cols == cols, "matmul: parts of {} and {} columns", cols, w.cols);
    KVP_CHECK(w.layout == RowLayout::kGgml || w.type == GgmlType::Q4_1,
              "matmul: {} in the decode layout", ggml_type_name(w.type));
    any_k = any_k || is_k_type(w.type);
    any_32 = any_32 || (!is_float_type(w.type) && !is_k_type(w.type));
  }
  const bool any_block = any_32 || any_k;
  Scratch& s = scratch();
  const bool prefill = num_rows >= kPrefillMinRows;
  bool any_int8_32 = false, any_int8_k = false, any_panels = false;
  s.panels.assign(parts.size(), false);
  s.repacked.assign(parts.size(), false);
  for (size_t p = 0; p < parts.size(); ++p) {
    const GgmlType type = parts[p].type;
    bool int8 = false;
    switch (precision) {
      case ActPrecision::kInt8:
        int8 = !prefill || prefill_prefers_int8(type);
        break;
      case ActPrecision::kPrefill:
        int8 = prefill_prefers_int8(type);
        break;
      case ActPrecision::kInt8All:
        int8 = true;
        break;
      case ActPrecision::kF32:
        break;
    }
    int8 = int8 && !is_float_type(type);
    const bool f32_blocks = precision == ActPrecision::kF32 || precision == ActPrecision::kPrefill;
    s.panels[p] = !int8 && (prefill || (any_block && f32_blocks));
    s.repacked[p] = int8 && prefill;
    any_int8_k = any_int8_k || (int8 && is_k_type(type));
    any_int8_32 = any_int8_32 || (int8 && !is_k_type(type));
    any_panels = any_panels || s.panels[p];
  }
  ActBlocks acts;
  ActBlocksK acts_k;
  if (any_int8_32) acts = quantize_acts(x, num_rows, ldx, cols, s.acts);
  if (any_int8_k) acts_k = quantize_acts_k(x, num_rows, ldx, cols, s.acts_k);
  s.offsets.assign(parts.size(), 0);
  for (size_t p = 1; p < parts.size(); ++p) s.offsets[p] = s.offsets[p - 1] + parts[p - 1].rows;
  if (any_panels) openblas_single_threaded();
  s.by_rows.assign(parts.size(), false);
  for (size_t p = 0; p < parts.size(); ++p) s.by_rows[p] = s.panels[p] || s.repacked[p];
  plan_items(parts, pool != nullptr ? pool->num_threads() : 1, s.by_rows, s.items);
  const std::vector<Item>& items = s.items;
  const std::vector<int64_t>& offsets = s.offsets;
  const std::vector<bool>& panels = s.panels;
  const std::vector<bool>& repacked = s.repacked;
  parallel_for(pool, static_cast<int64_t>(items.size()), [&](int64_t i, int) {
    const Item& item = items[static_cast<size_t>(i)];
    const size_t p = static_cast<size_t>(item.part);
    const QuantMatrix& part = parts[p];
    RowRange rr;
    rr.row_begin = item.row_begin;
    rr.row_end = item.row_end;
    rr.num_rows = num_rows;
    rr.y = y + offsets[p];
    rr.ldy = ldy;
    // A decode-layout part's kernel takes decode rows one at a time (the item's weight rows
    // stay in L2 between them); the prefill kernels (repacked int8 panels, f32 panels) get the
    // item's rows back in the file's layout, a copy of the item's bytes.
    QuantMatrix file_rows;
    if (part.layout == RowLayout::kDecodeGroup && (panels[p] || repacked[p])) {
      // [item rows][row_bytes], per pool thread, reused across calls.
      thread_local std::vector<std::byte> file_bytes;
      file_bytes.resize(static_cast<size_t>(item.row_end - item.row_begin) * part.row_bytes);
      for (int64_t r = item.row_begin; r < item.row_end; ++r) {
        decode_group_row_to_ggml(
            part, r, file_bytes.data() + static_cast<size_t>(r - item.row_begin) * part.row_bytes);
      }
      file_rows =
          make_matrix(part.type, file_bytes.data(), item.row_end - item.row_begin, part.cols);
      rr.y += item.row_begin;
      rr.row_begin = 0;
      rr.row_end = file_rows.rows;
    }
    const QuantMatrix& w = file_rows.data != nullptr ? file_rows : part;
    rr.w = &w;
    if (w.layout == RowLayout::kDecodeGroup) {
      block_rows_32_decode_group(rr, acts);
    } else if (panels[p]) {
      const int64_t panel_rows = rr.row_end - rr.row_begin;
      float* out = rr.y + rr.row_begin;
      if (w.type == GgmlType::F32) {
        sgemm_panel(x, num_rows, ldx, reinterpret_cast<const float*>(w.row(rr.row_begin)),
                    panel_rows, cols, out, ldy);
        return;
      }
      // [panel_rows][cols] f32, per pool thread (thread_local: the pool's threads live as long
      // as the pool), reused across calls.
      thread_local std::vector<float> panel;
      if (panel.size() < static_cast<size_t>(panel_rows * cols)) {
        panel.resize(static_cast<size_t>(panel_rows * cols));
      }
      dequantize(w.type, w.row(rr.row_begin), static_cast<size_t>(panel_rows * cols), panel.data());
      sgemm_panel(x, num_rows, ldx, panel.data(), panel_rows, cols, out, ldy);
    } else if (is_float_type(w.type)) {
      float_rows(rr, x, ldx);
    } else if (repacked[p]) {
      if (is_k_type(w.type)) {
        block_rows_k_prefill(rr, acts_k);
      } else {
        block_rows_32_prefill(rr, acts);
      }
    } else if (is_k_type(w.type)) {
      block_rows_k(rr, acts_k);
    } else {
      block_rows_32(rr, acts);
    }
  });
}

}  // namespace kvp::quant

#include "quant/quant_matmul.h"

#include <algorithm>
#include <vector>

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

bool matmul_supports(GgmlType type) { return can_dequantize(type); }

void dequantize_row(const QuantMatrix& w, int64_t r, float* out) {
  dequantize(w.type, w.row(r), static_cast<size_t>(w.cols), out);
}

void matmul_reference(const QuantMatrix& w, const float* x, int64_t num_rows, int64_t ldx,
                      float* y, int64_t ldy) {
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

namespace {

// Placeholder until the block kernels land: dequantise each weight row once, dot it with every
// activation row.
void matmul_one(const QuantMatrix& w, const float* x, int64_t num_rows, int64_t ldx, float* y,
                int64_t ldy, ThreadPool* pool) {
  constexpr int64_t kRowsPerItem = 16;
  const int64_t items = (w.rows + kRowsPerItem - 1) / kRowsPerItem;
  const int threads = pool != nullptr ? pool->num_threads() : 1;
  std::vector<std::vector<float>> scratch(threads, std::vector<float>(w.cols));
  parallel_for(pool, items, [&](int64_t item, int thread) {
    float* row = scratch[thread].data();
    const int64_t end = std::min(w.rows, (item + 1) * kRowsPerItem);
    for (int64_t o = item * kRowsPerItem; o < end; ++o) {
      dequantize_row(w, o, row);
      for (int64_t t = 0; t < num_rows; ++t) {
        const float* xr = x + t * ldx;
        float acc = 0;
        for (int64_t i = 0; i < w.cols; ++i) acc += xr[i] * row[i];
        y[t * ldy + o] = acc;
      }
    }
  });
}

}  // namespace

void matmul(const QuantMatrix& w, const float* x, int64_t num_rows, int64_t ldx, float* y,
            int64_t ldy, ThreadPool* pool) {
  matmul_one(w, x, num_rows, ldx, y, ldy, pool);
}

void matmul(std::span<const QuantMatrix> parts, const float* x, int64_t num_rows, int64_t ldx,
            float* y, int64_t ldy, ThreadPool* pool) {
  int64_t offset = 0;
  for (const QuantMatrix& w : parts) {
    matmul_one(w, x, num_rows, ldx, y + offset, ldy, pool);
    offset += w.rows;
  }
}

}  // namespace kvp::quant

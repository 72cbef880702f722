// Activation rows quantised to int8 per block of 32 (llama.cpp's Q8 activations), the input of
// the integer kernels (quant_kernel-inl.h).
//
//   x [num_rows][ldx] f32  --quantize_acts-->  q [num_rows][row_stride] int8
//                                              d [num_rows][num_blocks] f32
//                                              s [num_rows][num_blocks][8] f32
// Block b of row t: d = max|x| / 127 over its 32 values, q[j] = round(x[j] / d) in [-127, 127],
// so |x[j] - d * q[j]| <= d / 2. s holds the sums of the quantised values times d of the two
// halves of 16, each divided by 4 and repeated 4 times ([lo, lo, lo, lo, hi, hi, hi, hi]): the
// kernels add weight offsets lane-wise with one multiply-add per block (an int32 lane of a
// 32-element dot covers 4 elements, so 4 lanes cover a half).
#pragma once

#include <cstdint>
#include <vector>

namespace kvp::quant {

inline constexpr int64_t kActBlock = 32;  // activation elements per int8 block

struct ActBlocks {
  int64_t num_rows = 0;
  int64_t num_blocks = 0;     // per row: cols / 32
  const int8_t* q = nullptr;  // [num_rows][num_blocks * 32]
  const float* d = nullptr;   // [num_rows][num_blocks]
  const float* s = nullptr;   // [num_rows][num_blocks][8]

  const int8_t* q_row(int64_t t) const { return q + t * num_blocks * kActBlock; }
  const float* d_row(int64_t t) const { return d + t * num_blocks; }
  const float* s_row(int64_t t) const { return s + t * num_blocks * 8; }
};

// Reusable storage for ActBlocks; grows, never shrinks.
struct ActBuffer {
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<float> s;
};

// Quantises rows [0, num_rows) of x (cols values each, row stride ldx) into buf and returns the
// view. requires: cols % 32 == 0; ldx >= cols. Overwrites buf.
ActBlocks quantize_acts(const float* x, int64_t num_rows, int64_t ldx, int64_t cols,
                        ActBuffer& buf);

}  // namespace kvp::quant

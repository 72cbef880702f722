// Activation rows quantised to int8 for the integer kernels, in two layouts:
// - per block of 32 (llama.cpp's Q8_0 / Q8_1 activations), for the weight formats with blocks of
//   32 (quant_kernel-inl.h);
// - per block of 256 with sums per 16 (llama.cpp's Q8_K), for the K formats' super-blocks of 256
//   (quant_kernels_k.cc).
//
// Blocks of 32, stored in pairs (blocks 2p and 2p + 1, the second zero where the row has an odd
// number of blocks) so that a 256-bit register holds the same half of two blocks:
//
//   x [num_rows][ldx] f32  --quantize_acts-->  q    [num_rows][num_pairs][64] int8
//                                              d    [num_rows][num_pairs][8] f32
//                                              sums [num_rows][sum_stride] f32
//   q of pair p: x_2p[0..16) | x_2p+1[0..16) | x_2p[16..32) | x_2p+1[16..32)
//   d of pair p: d_2p x4 | d_2p+1 x4
// Block b of row t: d = max|x| / 127 over its 32 values, q[j] = round(x[j] / d) in [-127, 127],
// so |x[j] - d * q[j]| <= d / 2. sums[b] = d * sum_j q[j], and sum_stride rounds num_blocks up
// to a multiple of 8 with zeros after the last block: the kernels meet the weights' per-block
// offsets (w = d_w * q_w + m) with one f32 multiply-add per 8 blocks, sum_b m_b * sums[b].
#pragma once

#include <cstdint>
#include <vector>

namespace kvp::quant {

inline constexpr int64_t kActBlock = 32;    // activation elements per int8 block
inline constexpr int64_t kActSumGroup = 8;  // ActBlocks::sum_stride is a multiple of this

struct ActBlocks {
  int64_t num_rows = 0;
  int64_t num_blocks = 0;       // per row: cols / 32
  int64_t num_pairs = 0;        // per row: (num_blocks + 1) / 2
  const int8_t* q = nullptr;    // [num_rows][num_pairs][64]
  const float* d = nullptr;     // [num_rows][num_pairs][8]
  int64_t sum_stride = 0;       // num_blocks rounded up to a multiple of 8
  const float* sums = nullptr;  // [num_rows][sum_stride], zero past num_blocks

  const int8_t* q_row(int64_t t) const { return q + t * num_pairs * 2 * kActBlock; }
  const float* d_row(int64_t t) const { return d + t * num_pairs * 8; }
  // Element j < 32 of block b of row t, and the block's d.
  int8_t q_at(int64_t t, int64_t b, int j) const {
    return q_row(t)[64 * (b / 2) + 32 * (j / 16) + 16 * (b % 2) + j % 16];
  }
  float d_at(int64_t t, int64_t b) const { return d_row(t)[8 * (b / 2) + 4 * (b % 2)]; }
  const float* sums_row(int64_t t) const { return sums + t * sum_stride; }
};

// Reusable storage for ActBlocks; grows, never shrinks.
struct ActBuffer {
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<float> sums;
};

// Quantises rows [0, num_rows) of x (cols values each, row stride ldx) into buf and returns the
// view. requires: cols % 32 == 0; ldx >= cols. Overwrites buf.
ActBlocks quantize_acts(const float* x, int64_t num_rows, int64_t ldx, int64_t cols,
                        ActBuffer& buf);

// Blocks of 256:
//
//   x [num_rows][ldx] f32  --quantize_acts_k-->  q     [num_rows][num_blocks * 256] int8
//                                                d     [num_rows][num_blocks] f32
//                                                bsums [num_rows][num_blocks][16] int16
// Block b of row t: d = max|x| / 127 over its 256 values, q[j] = round(x[j] / d) in [-127, 127],
// so |x[j] - d * q[j]| <= d / 2; bsums[g] = sum of q[16 g .. 16 g + 15] (|bsums| <= 2032). A K
// kernel accumulates a whole super-block in int32 and meets the weights' mins and offsets, which
// are constant per 16 or 32 weights, through bsums: one float multiply-add per super-block.
inline constexpr int64_t kActBlockK = 256;  // activation elements per int8 block of the K path

struct ActBlocksK {
  int64_t num_rows = 0;
  int64_t num_blocks = 0;          // per row: cols / 256
  const int8_t* q = nullptr;       // [num_rows][num_blocks * 256]
  const float* d = nullptr;        // [num_rows][num_blocks]
  const int16_t* bsums = nullptr;  // [num_rows][num_blocks][16]

  const int8_t* q_row(int64_t t) const { return q + t * num_blocks * kActBlockK; }
  const float* d_row(int64_t t) const { return d + t * num_blocks; }
  const int16_t* bsums_row(int64_t t) const { return bsums + t * num_blocks * 16; }
};

// Reusable storage for ActBlocksK; grows, never shrinks.
struct ActBufferK {
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<int16_t> bsums;
};

// As quantize_acts, per 256. requires: cols % 256 == 0; ldx >= cols. Overwrites buf.
ActBlocksK quantize_acts_k(const float* x, int64_t num_rows, int64_t ldx, int64_t cols,
                           ActBufferK& buf);

}  // namespace kvp::quant

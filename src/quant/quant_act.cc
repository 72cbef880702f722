// Activation quantisation to int8 blocks of 32 and of 256 (quant_act.h). Plain loops over one
// block: the compiler vectorises them, and the cost is small next to the matmul that reads the
// result.
#include "quant/quant_act.h"

#include <algorithm>
#include <cmath>

#include "common/check.h"

namespace kvp::quant {

namespace {

// round(v) for |v| <= 127.5 after clamping to [-127, 127]. |x * id| <= 127 up to rounding of id;
// the clamp keeps a stray 127.5 in range. Adding and subtracting 1.5 * 2^23 rounds to nearest
// even for |v| < 2^22 in plain f32 arithmetic, which vectorises where nearbyint is a library call
// (as std::min / std::max do where std::fmin / std::fmax, with their NaN rules, are calls).
inline int8_t round_to_int8(float v) {
  v = std::min(127.0f, std::max(-127.0f, v));
  return static_cast<int8_t>((v + 12582912.0f) - 12582912.0f);
}

}  // namespace

ActBlocks quantize_acts(const float* x, int64_t num_rows, int64_t ldx, int64_t cols,
                        ActBuffer& buf) {
  KVP_CHECK(cols % kActBlock == 0, "quantize_acts: {} columns are not blocks of 32", cols);
  const int64_t num_blocks = cols / kActBlock;
  const int64_t num_pairs = (num_blocks + 1) / 2;
  const size_t total_pairs = static_cast<size_t>(num_rows * num_pairs);
  if (buf.q.size() < total_pairs * 2 * kActBlock) buf.q.resize(total_pairs * 2 * kActBlock);
  if (buf.d.size() < total_pairs * 8) buf.d.resize(total_pairs * 8);
  const int64_t sum_stride = (num_blocks + kActSumGroup - 1) / kActSumGroup * kActSumGroup;
  if (buf.sums.size() < static_cast<size_t>(num_rows * sum_stride)) {
    buf.sums.resize(static_cast<size_t>(num_rows * sum_stride));
  }
  for (int64_t t = 0; t < num_rows; ++t) {
    const float* xr = x + t * ldx;
    for (int64_t b = 0; b < 2 * num_pairs; ++b) {
      const size_t pair = static_cast<size_t>(t * num_pairs + b / 2);
      int8_t* q = buf.q.data() + pair * 2 * kActBlock + 16 * (b % 2);  // halves at q, q + 32
      float* dp = buf.d.data() + pair * 8 + 4 * (b % 2);               // [4]
      if (b == num_blocks) {  // the missing second block of an odd row's last pair
        std::fill(q, q + 16, int8_t{0});
        std::fill(q + 32, q + 48, int8_t{0});
        std::fill(dp, dp + 4, 0.0f);
        break;
      }
      const float* xb = xr + b * kActBlock;  // [32]
      float amax = 0;
      for (int j = 0; j < kActBlock; ++j) amax = std::max(amax, std::fabs(xb[j]));
      const float d = amax / 127.0f;
      const float id = d != 0 ? 1.0f / d : 0.0f;
      int32_t sum = 0;
      for (int j = 0; j < kActBlock; ++j) {
        const int8_t v = round_to_int8(xb[j] * id);
        q[32 * (j / 16) + j % 16] = v;
        sum += v;
      }
      std::fill(dp, dp + 4, d);
      buf.sums[static_cast<size_t>(t * sum_stride + b)] = d * static_cast<float>(sum);
    }
    std::fill(buf.sums.begin() + t * sum_stride + num_blocks,
              buf.sums.begin() + (t + 1) * sum_stride, 0.0f);
  }
  ActBlocks a;
  a.num_rows = num_rows;
  a.num_blocks = num_blocks;
  a.num_pairs = num_pairs;
  a.q = buf.q.data();
  a.d = buf.d.data();
  a.sum_stride = sum_stride;
  a.sums = buf.sums.data();
  return a;
}

ActBlocksK quantize_acts_k(const float* x, int64_t num_rows, int64_t ldx, int64_t cols,
                           ActBufferK& buf) {
  KVP_CHECK(cols % kActBlockK == 0, "quantize_acts_k: {} columns are not blocks of 256", cols);
  const int64_t num_blocks = cols / kActBlockK;
  const size_t total_blocks = static_cast<size_t>(num_rows * num_blocks);
  if (buf.q.size() < total_blocks * kActBlockK) buf.q.resize(total_blocks * kActBlockK);
  if (buf.d.size() < total_blocks) buf.d.resize(total_blocks);
  if (buf.bsums.size() < total_blocks * 16) buf.bsums.resize(total_blocks * 16);
  for (int64_t t = 0; t < num_rows; ++t) {
    const float* xr = x + t * ldx;
    for (int64_t b = 0; b < num_blocks; ++b) {
      const float* xb = xr + b * kActBlockK;  // [256]
      const size_t blk = static_cast<size_t>(t * num_blocks + b);
      int8_t* q = buf.q.data() + blk * kActBlockK;  // [256]
      float amax = 0;
      for (int j = 0; j < kActBlockK; ++j) amax = std::max(amax, std::fabs(xb[j]));
      const float d = amax / 127.0f;
      const float id = d != 0 ? 1.0f / d : 0.0f;
      for (int j = 0; j < kActBlockK; ++j) q[j] = round_to_int8(xb[j] * id);
      int16_t* bsums = buf.bsums.data() + blk * 16;  // [16]
      for (int g = 0; g < 16; ++g) {
        int32_t sum = 0;
        for (int j = 16 * g; j < 16 * g + 16; ++j) sum += q[j];
        bsums[g] = static_cast<int16_t>(sum);
      }
      buf.d[blk] = d;
    }
  }
  ActBlocksK a;
  a.num_rows = num_rows;
  a.num_blocks = num_blocks;
  a.q = buf.q.data();
  a.d = buf.d.data();
  a.bsums = buf.bsums.data();
  return a;
}

}  // namespace kvp::quant

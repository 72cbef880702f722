// quantize_acts (blocks of 32) and quantize_acts_k (blocks of 256 with sums per 16) against what
// quant_act.h promises, computed here independently of the code under test: each block's step
// is its largest |x| / 127 (from the inputs, in f64), every value is within half a step of its
// int8 code times the step (the int8 rounding error, the only error the format has) and codes
// stay in [-127, 127], and the sums are the sums of the codes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "quant/quant_act.h"

namespace kvp::quant {
namespace {

// rows x ldx values in [-1, 1] with outliers up to 30, and in row 1 a block of zeros and a block
// with a single nonzero value (block_size apart).
std::vector<float> random_rows(int64_t num_rows, int64_t ldx, int64_t block_size,
                               std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(num_rows * ldx));
  for (float& v : x) v = u(rng) * (u(rng) > 0.9f ? 30.0f : 1.0f);
  if (num_rows > 1) {
    float* row = x.data() + ldx;
    std::fill(row, row + 2 * block_size, 0.0f);
    row[block_size + 7] = -3.5f;
  }
  return x;
}

// Checks one block: step d against max|x| / 127, |x - d q| <= d / 2, |q| <= 127, and the largest
// |x| coded as +-127. Returns the largest |x - d q| / (d / 2) (0 for an all-zero block).
double check_block(const float* x, const int8_t* q, float d, int64_t block_size, const char* what,
                   int64_t row, int64_t block) {
  double amax = 0;
  for (int64_t j = 0; j < block_size; ++j) amax = std::max(amax, std::fabs(double{x[j]}));
  const double want_d = amax / 127.0;
  EXPECT_NEAR(d, want_d, 1e-6 * want_d) << what << " row " << row << " block " << block;
  if (amax == 0) {
    for (int64_t j = 0; j < block_size; ++j) EXPECT_EQ(q[j], 0) << what << " element " << j;
    return 0;
  }
  double worst = 0;
  for (int64_t j = 0; j < block_size; ++j) {
    EXPECT_LE(std::abs(int{q[j]}), 127) << what << " row " << row << " element " << j;
    // half a step, plus the f32 rounding of x / d and of d itself
    const double err = std::fabs(double{x[j]} - double{d} * q[j]);
    const double bound = want_d / 2 + 4e-7 * std::fabs(double{x[j]});
    EXPECT_LE(err, bound) << what << " row " << row << " block " << block << " element " << j
                          << ": x " << x[j] << " q " << int{q[j]} << " d " << d;
    worst = std::max(worst, err / (want_d / 2));
    if (std::fabs(double{x[j]}) == amax) {
      EXPECT_EQ(std::abs(int{q[j]}), 127) << what;
    }
  }
  return worst;
}

TEST(QuantizeActsK, CodesAreWithinHalfAStepOfTheBlockMaximumOver127) {
  std::mt19937 rng(3);
  const int64_t num_rows = 3, cols = 768, ldx = cols + 9;
  const std::vector<float> x = random_rows(num_rows, ldx, kActBlockK, rng);
  ActBufferK buf;
  const ActBlocksK a = quantize_acts_k(x.data(), num_rows, ldx, cols, buf);
  ASSERT_EQ(a.num_rows, num_rows);
  ASSERT_EQ(a.num_blocks, cols / 256);
  double worst = 0;
  for (int64_t t = 0; t < num_rows; ++t) {
    for (int64_t b = 0; b < a.num_blocks; ++b) {
      const float* xb = x.data() + t * ldx + b * 256;
      const int8_t* q = a.q_row(t) + b * 256;
      worst = std::max(worst, check_block(xb, q, a.d_row(t)[b], 256, "Q8_K", t, b));
      for (int g = 0; g < 16; ++g) {
        int32_t sum = 0;
        for (int j = 16 * g; j < 16 * g + 16; ++j) sum += q[j];
        EXPECT_EQ(a.bsums_row(t)[16 * b + g], sum)
            << "row " << t << " block " << b << " group " << g;
      }
    }
  }
  std::printf("Q8_K: largest |x - d q| / (d / 2) %.4f\n", worst);
}

// The 256-block's step is set by its largest value, so values in a quiet part of the block get
// the coarse step too: the codes are the rounding of x / d with d the whole block's.
TEST(QuantizeActsK, OneOutlierSetsTheStepOfItsWholeBlock) {
  std::vector<float> x(512, 0.01f);
  x[300] = 127.0f;  // block 1's step is 1: its small values round to 0
  ActBufferK buf;
  const ActBlocksK a = quantize_acts_k(x.data(), 1, 512, 512, buf);
  EXPECT_FLOAT_EQ(a.d[0], 0.01f / 127.0f);
  EXPECT_FLOAT_EQ(a.d[1], 1.0f);
  EXPECT_EQ(a.q[0], 127);
  EXPECT_EQ(a.q[256], 0);
  EXPECT_EQ(a.q[300], 127);
  EXPECT_EQ(a.bsums[0], 16 * 127);
  EXPECT_EQ(a.bsums[16 + 2], 127);  // group 18 = values 288..303
  EXPECT_EQ(a.bsums[16], 0);
}

TEST(QuantizeActs, CodesAreWithinHalfAStepPairedAndSumsAreTheCodesTimesTheStep) {
  std::mt19937 rng(4);
  const int64_t num_rows = 4, cols = 160, ldx = cols + 3;  // 5 blocks: an odd last pair
  const std::vector<float> x = random_rows(num_rows, ldx, kActBlock, rng);
  ActBuffer buf;
  const ActBlocks a = quantize_acts(x.data(), num_rows, ldx, cols, buf);
  ASSERT_EQ(a.num_blocks, cols / 32);
  double worst = 0;
  for (int64_t t = 0; t < num_rows; ++t) {
    for (int64_t b = 0; b < a.num_blocks; ++b) {
      const float* xb = x.data() + t * ldx + b * 32;
      int8_t q[32];
      for (int j = 0; j < 32; ++j) q[j] = a.q_at(t, b, j);
      const float d = a.d_at(t, b);
      // the pair layout of quant_act.h, element by element
      const int8_t* pair = a.q_row(t) + 64 * (b / 2);
      for (int j = 0; j < 32; ++j) {
        EXPECT_EQ(pair[(j < 16 ? 0 : 32) + 16 * (b % 2) + j % 16], q[j]) << "block " << b;
      }
      for (int l = 0; l < 4; ++l) EXPECT_EQ(a.d_row(t)[8 * (b / 2) + 4 * (b % 2) + l], d);
      worst = std::max(worst, check_block(xb, q, d, 32, "Q8_0", t, b));
      int32_t sum = 0;
      for (int j = 0; j < 32; ++j) sum += q[j];
      EXPECT_FLOAT_EQ(a.sums_row(t)[b], d * static_cast<float>(sum))
          << "row " << t << " block " << b;
    }
    for (int64_t b = a.num_blocks; b < a.sum_stride; ++b) {
      EXPECT_EQ(a.sums_row(t)[b], 0.0f) << "row " << t << " padding " << b;
    }
    if (a.num_blocks % 2 == 1) {  // the last pair's missing block is zero
      for (int j = 0; j < 32; ++j) EXPECT_EQ(a.q_at(t, a.num_blocks, j), 0) << "row " << t;
      EXPECT_EQ(a.d_at(t, a.num_blocks), 0.0f) << "row " << t;
    }
  }
  EXPECT_EQ(a.sum_stride % kActSumGroup, 0);
  std::printf("Q8_0: largest |x - d q| / (d / 2) %.4f\n", worst);
}

}  // namespace
}  // namespace kvp::quant

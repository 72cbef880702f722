// matmul against matmul_reference (dequantise, then f64 dot products) for every supported type,
// on every Highway target this binary has and this CPU runs, over odd shapes.
//
// Error bound per output, derived from the kernels' arithmetic:
// - block formats quantise each activation block b to int8 with step dx_b = max|x| / 127 (blocks
//   of 32 for the 32-block formats, of 256 for the K formats), so each x_j moves by at most
//   dx_b / 2 and the product by sum_b dx_b / 2 * sum_{j in b} |w_j|; the int32 dot products are
//   exact, and the f32 conversion, scaling and summation add at most (2 * blocks of 32 + 8) *
//   2^-24 times the sum of the magnitudes of the terms added. A term is (d * q) * x or m * x with
//   |d * q| + |m| <= 3 max_{j in b} |w_j| (random blocks span their code range, so one weight of
//   each group of 16 or 32 is near its m), and |x| <= amax_b.
// - F32 / F16 / BF16 weights are exact in f32, so only the f32 summation of the products counts:
//   (cols + 8) * 2^-24 * sum_j |x_j w_j|.
// Both add the reference's own rounding to f32 (2^-24 |ref|).
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL 1  // as kvp_quant is built, so the AVX3_DL kernels are tested too
#endif
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "quant/quant_matmul.h"

namespace kvp::quant {
namespace {

constexpr double kU = 1.0 / (1 << 24);  // f32 unit roundoff

constexpr GgmlType kAllTypes[] = {GgmlType::F32,  GgmlType::F16,    GgmlType::BF16,  GgmlType::Q4_0,
                                  GgmlType::Q4_1, GgmlType::Q5_0,   GgmlType::Q5_1,  GgmlType::Q8_0,
                                  GgmlType::Q2_K, GgmlType::Q3_K,   GgmlType::Q4_K,  GgmlType::Q5_K,
                                  GgmlType::Q6_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS};

bool is_float_type(GgmlType t) {
  return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16;
}

// Activation values per int8 block for weights of type t: the K formats' super-block of 256
// (quant_act.h's quantize_acts_k), else 32.
int64_t act_block_size(GgmlType t) { return ggml_type_info(t).block_size == 256 ? 256 : 32; }

// Byte offsets of a block's f16 scale fields (d, m, dmin): random bytes there could be inf or
// NaN, so they get sane values.
std::vector<size_t> scale_offsets(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_1:
    case GgmlType::Q5_1:
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
      return {0, 2};
    case GgmlType::Q2_K:
      return {80, 82};
    case GgmlType::Q3_K:
      return {108};
    case GgmlType::Q6_K:
      return {208};
    default:
      return {0};
  }
}

// rows x cols of type t: random codes, scales of either sign and magnitude in [1e-3, 5e-2].
std::vector<uint8_t> random_matrix(GgmlType t, int64_t rows, int64_t cols, std::mt19937& rng) {
  const GgmlTypeInfo& info = ggml_type_info(t);
  const size_t bytes = ggml_row_size_bytes(t, static_cast<size_t>(cols)) * rows;
  std::vector<uint8_t> data(bytes);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  if (is_float_type(t)) {
    const size_t n = static_cast<size_t>(rows * cols);
    for (size_t i = 0; i < n; ++i) {
      const float v = value(rng);
      if (t == GgmlType::F32) {
        std::memcpy(data.data() + 4 * i, &v, 4);
      } else {
        const uint16_t bits = t == GgmlType::F16 ? f32_to_f16(v).bits : f32_to_bf16(v).bits;
        std::memcpy(data.data() + 2 * i, &bits, 2);
      }
    }
    return data;
  }
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& b : data) b = static_cast<uint8_t>(byte(rng));
  std::uniform_real_distribution<float> scale(1e-3f, 5e-2f);
  const size_t num_blocks = bytes / info.type_size;
  for (size_t b = 0; b < num_blocks; ++b) {
    for (size_t off : scale_offsets(t)) {
      const float s = (byte(rng) & 1 ? 1.0f : -1.0f) * scale(rng);
      const uint16_t bits = f32_to_f16(s).bits;
      std::memcpy(data.data() + b * info.type_size + off, &bits, 2);
    }
  }
  return data;
}

// Per output (t, o): the bound described at the top of the file.
std::vector<double> error_bounds(const QuantMatrix& w, const float* x, int64_t num_rows,
                                 int64_t ldx, const std::vector<float>& ref, int64_t ldy) {
  std::vector<double> bounds(static_cast<size_t>(num_rows * ldy), 0.0);
  std::vector<float> row(static_cast<size_t>(w.cols));
  const int64_t act_block = act_block_size(w.type);
  const int64_t num_blocks = w.cols / act_block;  // activation blocks
  for (int64_t o = 0; o < w.rows; ++o) {
    dequantize_row(w, o, row.data());
    for (int64_t t = 0; t < num_rows; ++t) {
      const float* xr = x + t * ldx;
      double bound = 0;
      if (is_float_type(w.type)) {
        double mag = 0;
        for (int64_t i = 0; i < w.cols; ++i) mag += std::fabs(double{xr[i]} * row[i]);
        bound = double(w.cols + 8) * kU * mag;
      } else {
        double quant = 0, mag = 0;
        for (int64_t b = 0; b < num_blocks; ++b) {
          double amax = 0, wsum = 0, wmax = 0;
          for (int64_t j = act_block * b; j < act_block * (b + 1); ++j) {
            amax = std::max(amax, double{std::fabs(xr[j])});
            wsum += std::fabs(row[j]);
            wmax = std::max(wmax, double{std::fabs(row[j])});
          }
          const double dx = amax / 127.0;
          quant += dx / 2 * wsum;
          mag += 3 * wmax * double(act_block) * amax * 1.01;
        }
        bound = quant + double(2 * w.cols / 32 + 8) * kU * mag;
      }
      bounds[static_cast<size_t>(t * ldy + o)] = bound + kU * std::fabs(ref[t * ldy + o]);
    }
  }
  return bounds;
}

struct Shape {
  int64_t rows;
  int64_t blocks;  // cols = blocks * block size (F32/F16/BF16: blocks * 32 + 3)
  int64_t num_rows;
};

// One activation row takes tiles of one weight row where rows are long (>= 512 bytes) and of
// several where short: {21, 4, 1} and {7, 40, 1} give each format both. {13, 9, 1..9} run
// every tile of 1..4 activation rows (and 2 x 4 + 1) with a weight-row count that is no
// multiple of the weight-row tile, and 9 and 17 blocks leave a partial group of the 8-block
// offset sums (quant_act.h).
constexpr Shape kShapes[] = {
    {1, 1, 1},  {5, 3, 3},  {37, 2, 7}, {67, 5, 17}, {130, 3, 64}, {9, 1, 70},  {21, 4, 1},
    {18, 2, 8}, {7, 40, 1}, {13, 9, 1}, {13, 9, 2},  {13, 9, 3},   {13, 9, 4},  {13, 9, 5},
    {13, 9, 6}, {13, 9, 7}, {13, 9, 8}, {13, 9, 9},  {11, 17, 1},  {11, 17, 8}, {6, 33, 5}};

int64_t cols_of(GgmlType t, int64_t blocks) {
  if (is_float_type(t)) return blocks * 32 + 3;  // not a multiple of any vector width
  return blocks * ggml_type_info(t).block_size;
}

// Runs matmul on every target and checks every output against its bound; returns the largest
// |y - ref| / bound seen. decode_layout: matmul reads the matrix repacked by repack_for_decode
// (the reference and the bound read the file's layout), followed by 256 bytes of 0xff (f16
// NaNs) that it must not read.
double check_type(GgmlType type, const Shape& shape, uint32_t seed,
                  ActPrecision precision = ActPrecision::kInt8, bool decode_layout = false) {
  std::mt19937 rng(seed);
  const int64_t cols = cols_of(type, shape.blocks);
  const int64_t ldx = cols + 5, ldy = shape.rows + 3;
  const std::vector<uint8_t> data = random_matrix(type, shape.rows, cols, rng);
  const QuantMatrix w_file = make_matrix(type, data.data(), shape.rows, cols);
  std::vector<std::byte> grouped(decode_layout ? w_file.size_bytes() + 256 : 0, std::byte{0xff});
  const QuantMatrix w = decode_layout ? repack_for_decode(w_file, grouped.data()) : w_file;
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(shape.num_rows * ldx));
  for (float& v : x) v = u(rng) * (u(rng) > 0.8f ? 8.0f : 1.0f);  // some outliers
  std::vector<float> ref(static_cast<size_t>(shape.num_rows * ldy), 0.0f);
  matmul_reference(w_file, x.data(), shape.num_rows, ldx, ref.data(), ldy);
  const std::vector<double> bounds = error_bounds(w_file, x.data(), shape.num_rows, ldx, ref, ldy);
  ThreadPool pool(2);
  double worst_overall = 0;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
      constexpr float kUntouched = 12345.0f;
      std::vector<float> y(ref.size(), kUntouched);
      matmul(w, x.data(), shape.num_rows, ldx, y.data(), ldy, p, precision);
      double worst = 0;  // largest |y - ref| / bound
      int64_t worst_at = 0;
      for (int64_t t = 0; t < shape.num_rows; ++t) {
        for (int64_t o = 0; o < ldy; ++o) {
          const size_t i = static_cast<size_t>(t * ldy + o);
          if (o >= shape.rows) {
            EXPECT_EQ(y[i], kUntouched) << "column " << o << " of row " << t << " was written";
            continue;
          }
          const double ratio = std::fabs(double{y[i]} - ref[i]) / std::max(bounds[i], 1e-30);
          if (!(ratio <= worst)) {  // NaN counts as worst
            worst = ratio;
            worst_at = static_cast<int64_t>(i);
          }
        }
      }
      EXPECT_LE(worst, 1.0) << ggml_type_name(type) << " on " << hwy::TargetName(target) << " "
                            << shape.rows << "x" << cols << " num_rows " << shape.num_rows
                            << (p ? " pool" : " no pool") << ": worst at " << worst_at << " y "
                            << y[worst_at] << " ref " << ref[worst_at] << " bound "
                            << bounds[worst_at];
      worst_overall = std::max(worst_overall, worst);
    }
  }
  hwy::SetSupportedTargetsForTest(0);
  return worst_overall;
}

class MatmulParity : public ::testing::TestWithParam<GgmlType> {};

TEST_P(MatmulParity, MatchesReferenceWithinDerivedBoundOnEveryTarget) {
  ASSERT_TRUE(matmul_supports(GetParam()));
  uint32_t seed = 1;
  double worst = 0;
  for (const Shape& shape : kShapes) worst = std::max(worst, check_type(GetParam(), shape, seed++));
  std::string targets;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    targets += std::string(" ") + hwy::TargetName(target);
  }
  std::printf("%s: largest |y - ref| / bound %.3g over targets%s\n",
              std::string(ggml_type_name(GetParam())).c_str(), worst, targets.c_str());
}

INSTANTIATE_TEST_SUITE_P(AllTypes, MatmulParity, ::testing::ValuesIn(kAllTypes),
                         [](const ::testing::TestParamInfo<GgmlType>& info) {
                           return std::string(ggml_type_name(info.param));
                         });

// The prefill path with int8 activations (ActPrecision::kInt8All: every block format, at 32+
// activation rows, whether or not kInt8 picks it for the format), within the same derived bound
// as decode: activation-row counts from 32 to 512 (passes of 64, tiles of 4 activation rows, then
// 1-3 left over), weight-row counts that are no multiple of the weight-row tile, 32-block
// rows whose length is no multiple of 256 (3, 9 and 17 blocks), and enough weight rows (130) for
// several items per thread. On AVX-512 targets panels are 16 weight rows, then 8, then the
// decode tiles: 100 and 300 weight rows make items of 24 and 64 rows with rows left past the
// last 16 (8 + 4 of 300's last 44, 8 of 100's items of 24 without a pool).
constexpr Shape kPrefillShapes[] = {{13, 9, 32},  {37, 3, 33}, {130, 2, 100}, {11, 17, 100},
                                    {21, 3, 512}, {5, 1, 33},  {100, 2, 40},  {300, 1, 36}};

class PrefillParity : public ::testing::TestWithParam<GgmlType> {};

TEST_P(PrefillParity, Int8PrefillMatchesReferenceWithinDerivedBoundOnEveryTarget) {
  uint32_t seed = 100;
  double worst = 0;
  for (const Shape& shape : kPrefillShapes) {
    worst = std::max(worst, check_type(GetParam(), shape, seed++, ActPrecision::kInt8All));
  }
  std::printf("%s prefill int8: largest |y - ref| / bound %.3g\n",
              std::string(ggml_type_name(GetParam())).c_str(), worst);
}

INSTANTIATE_TEST_SUITE_P(BlockTypes, PrefillParity,
                         ::testing::Values(GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0,
                                           GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q2_K,
                                           GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K,
                                           GgmlType::Q6_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS),
                         [](const ::testing::TestParamInfo<GgmlType>& info) {
                           return std::string(ggml_type_name(info.param));
                         });

// Q4_1 repacked for decode (RowLayout::kDecodeGroup: groups of 8 blocks, then the row's last
// blocks % 8 in the file's layout), against the reference over the file's layout: block counts
// below one group (1, 3), of whole groups (8, 16, 48: SmolLM2's 1536 columns), and with a tail of
// each parity (9, 17, 18: SmolLM2's 576 columns, 23); weight-row counts off a multiple of the
// 4-row tile; rows of 512+ bytes (one weight row a tile) from 26 blocks; 1, 2, 3, 5 and 8
// activation rows (the layout's kernel, a row at a time), 36 and 40 (the file layout's prefill
// kernels over rows turned back, int8 and f32 panels).
constexpr Shape kDecodeLayoutShapes[] = {
    {1, 1, 1},  {5, 3, 1},   {13, 8, 1},   {7, 9, 1},     {9, 16, 1},  {11, 17, 1},
    {6, 18, 1}, {21, 23, 1}, {5, 48, 1},   {67, 18, 1},   {13, 9, 3},  {37, 17, 40},
    {3, 26, 1}, {2, 33, 2},  {130, 18, 1}, {100, 18, 36}, {11, 18, 8}, {7, 23, 5}};

TEST(QuantMatmul, DecodeLayoutMatchesReferenceWithinDerivedBoundOnEveryTarget) {
  uint32_t seed = 300;
  double worst = 0;
  for (const Shape& shape : kDecodeLayoutShapes) {
    worst = std::max(worst, check_type(GgmlType::Q4_1, shape, seed++, ActPrecision::kInt8, true));
    if (shape.num_rows >= kPrefillMinRows) {
      worst = std::max(worst, check_type(GgmlType::Q4_1, shape, seed++, ActPrecision::kF32, true));
    }
  }
  std::printf("Q4_1 decode layout: largest |y - ref| / bound %.3g\n", worst);
}

// The layout's rows turn back into the file's exactly (embedding lookups of a tied lm-head).
TEST(QuantMatmul, DecodeLayoutDequantizesToTheFileRows) {
  std::mt19937 rng(31);
  for (int64_t blocks : {1, 8, 9, 18, 23}) {
    const int64_t rows = 5, cols = blocks * 32;
    const std::vector<uint8_t> data = random_matrix(GgmlType::Q4_1, rows, cols, rng);
    const QuantMatrix w = make_matrix(GgmlType::Q4_1, data.data(), rows, cols);
    std::vector<std::byte> grouped(w.size_bytes());
    const QuantMatrix g = repack_for_decode(w, grouped.data());
    EXPECT_EQ(g.layout, RowLayout::kDecodeGroup);
    if (blocks >= 8) {
      EXPECT_NE(std::memcmp(grouped.data(), data.data(), data.size()), 0);
    }
    std::vector<float> a(static_cast<size_t>(cols)), b(a.size());
    for (int64_t r = 0; r < rows; ++r) {
      dequantize_row(w, r, a.data());
      dequantize_row(g, r, b.data());
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
          << blocks << " blocks, row " << r;
    }
  }
}

// kF32 at prefill sizes stays the f32 panel path for every block format: exact up to f32
// summation, far inside the int8 bound, so the comparison uses the float types' bound.
TEST(QuantMatmul, F32PrefillIsTheExactPanelPath) {
  std::mt19937 rng(21);
  const int64_t rows = 37, num_rows = 40;
  for (GgmlType type : kAllTypes) {
    if (is_float_type(type)) continue;
    const int64_t cols = cols_of(type, 3);
    const std::vector<uint8_t> data = random_matrix(type, rows, cols, rng);
    const QuantMatrix w = make_matrix(type, data.data(), rows, cols);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(num_rows * cols));
    for (float& v : x) v = u(rng);
    std::vector<float> ref(static_cast<size_t>(num_rows * rows)), y(ref.size());
    matmul_reference(w, x.data(), num_rows, cols, ref.data(), rows);
    ThreadPool pool(2);
    matmul(w, x.data(), num_rows, cols, y.data(), rows, &pool, ActPrecision::kF32);
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t o = 0; o < rows; ++o) {
      dequantize_row(w, o, row.data());
      for (int64_t t = 0; t < num_rows; ++t) {
        double mag = 0;
        for (int64_t i = 0; i < cols; ++i) mag += std::fabs(double{x[t * cols + i]} * row[i]);
        const double bound = double(cols + 8) * kU * mag + kU * std::fabs(ref[t * rows + o]);
        EXPECT_LE(std::fabs(double{y[t * rows + o]} - ref[t * rows + o]), bound)
            << ggml_type_name(type) << " row " << t << " output " << o;
      }
    }
  }
}

// A row of an odd number of 32-blocks ends in half a pair: the kernels must pair its last block
// with zeros, not with the bytes after it. Here those bytes are f16 NaNs (0xff), so reading them
// would turn outputs into NaN; the outputs must equal those of the same matrix in a buffer of
// its own size, on every target.
TEST(QuantMatmul, OddBlockRowsNeverReadPastTheirLastBlock) {
  std::mt19937 rng(12);
  const int64_t rows = 5, cols = 9 * 32;
  for (GgmlType type : kAllTypes) {
    if (is_float_type(type) || act_block_size(type) != 32) continue;
    const std::vector<uint8_t> data = random_matrix(type, rows, cols, rng);
    std::vector<uint8_t> padded = data;
    padded.resize(data.size() + 256, 0xff);
    const QuantMatrix w = make_matrix(type, data.data(), rows, cols);
    const QuantMatrix w_padded = make_matrix(type, padded.data(), rows, cols);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (int64_t num_rows : {1, 3, 8}) {
      std::vector<float> x(static_cast<size_t>(num_rows * cols));
      for (float& v : x) v = u(rng);
      for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
        hwy::SetSupportedTargetsForTest(target);
        std::vector<float> y(static_cast<size_t>(num_rows * rows));
        std::vector<float> y_padded(y.size());
        matmul(w, x.data(), num_rows, cols, y.data(), rows, nullptr);
        matmul(w_padded, x.data(), num_rows, cols, y_padded.data(), rows, nullptr);
        for (size_t i = 0; i < y.size(); ++i) {
          EXPECT_EQ(y_padded[i], y[i]) << ggml_type_name(type) << " on " << hwy::TargetName(target)
                                       << " num_rows " << num_rows << " output " << i;
        }
      }
      hwy::SetSupportedTargetsForTest(0);
    }
  }
}

TEST(QuantMatmul, StackedPartsOfDifferentTypesFillTheirColumns) {
  std::mt19937 rng(11);
  const int64_t cols = 512, num_rows = 5, ldx = cols + 7;
  const GgmlType types[] = {GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::F16, GgmlType::Q6_K,
                            GgmlType::Q4_K};
  const int64_t rows[] = {13, 7, 5, 9, 4};
  std::vector<std::vector<uint8_t>> data;
  std::vector<QuantMatrix> parts;
  int64_t total_rows = 0;
  for (size_t p = 0; p < std::size(types); ++p) {
    data.push_back(random_matrix(types[p], rows[p], cols, rng));
    total_rows += rows[p];
  }
  for (size_t p = 0; p < std::size(types); ++p) {
    parts.push_back(make_matrix(types[p], data[p].data(), rows[p], cols));
  }
  const int64_t ldy = total_rows + 4;
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(num_rows * ldx));
  for (float& v : x) v = u(rng);
  std::vector<float> y(static_cast<size_t>(num_rows * ldy), -7.0f);
  ThreadPool pool(2);
  matmul(parts, x.data(), num_rows, ldx, y.data(), ldy, &pool);
  int64_t offset = 0;
  for (const QuantMatrix& w : parts) {
    std::vector<float> alone(static_cast<size_t>(num_rows * w.rows));
    matmul(w, x.data(), num_rows, ldx, alone.data(), w.rows, nullptr);
    for (int64_t t = 0; t < num_rows; ++t) {
      for (int64_t o = 0; o < w.rows; ++o) {
        EXPECT_EQ(y[t * ldy + offset + o], alone[t * w.rows + o])
            << ggml_type_name(w.type) << " row " << t << " output " << o;
      }
    }
    offset += w.rows;
  }
  for (int64_t t = 0; t < num_rows; ++t) {
    for (int64_t o = total_rows; o < ldy; ++o) EXPECT_EQ(y[t * ldy + o], -7.0f);
  }
}

}  // namespace
}  // namespace kvp::quant

// SafetensorsWeights, the WeightSource over safetensors: float dtypes at unaligned offsets read
// as f32, shapes checked, missing tensors and integer tensors named.
#include "model/safetensors_weights.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/dtype.h"

namespace kvp {
namespace {

namespace fs = std::filesystem;

class SafetensorsWeightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("kvp_st_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes a file: 8-byte little-endian header size, header, data.
  std::string write(const std::string& name, const std::string& header, const std::string& data) {
    const std::string path = (dir_ / name).string();
    std::ofstream out(path, std::ios::binary);
    const uint64_t size = header.size();
    out.write(reinterpret_cast<const char*>(&size), 8);
    out << header << data;
    return path;
  }

  fs::path dir_;
};

std::string bytes_of(const void* p, size_t n) {
  return std::string(static_cast<const char*>(p), n);
}

TEST_F(SafetensorsWeightsTest, ReadsF32F16Bf16AsF32) {
  const float f32[] = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -0.5f};
  F16 f16[3];
  Bf16 bf16[2];
  for (int i = 0; i < 3; ++i) f16[i] = f32_to_f16(f32[i]);
  for (int i = 0; i < 2; ++i) bf16[i] = f32_to_bf16(f32[i + 3]);
  const std::string data = bytes_of(f32, 24) + bytes_of(f16, 6) + bytes_of(bf16, 4);
  const std::string header = R"({"__metadata__":{"format":"pt"},)"
                             R"("a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
                             R"("b":{"dtype":"F16","shape":[3],"data_offsets":[24,30]},)"
                             R"("c":{"dtype":"BF16","shape":[1,2],"data_offsets":[30,34]}})";
  auto model = SafetensorsWeights::open(write("m.safetensors", header, data));
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  const int64_t a_shape[] = {2, 3}, b_shape[] = {3}, c_shape[] = {1, 2};
  auto a = (*model)->read_f32("a", a_shape);
  ASSERT_TRUE(a.is_ok());
  EXPECT_EQ(*a, std::vector<float>(f32, f32 + 6));
  auto b = (*model)->read_f32("b", b_shape);
  ASSERT_TRUE(b.is_ok());
  EXPECT_EQ(*b, (std::vector<float>{1.5f, -2.0f, 3.25f}));
  auto c = (*model)->read_f32("c", c_shape);
  ASSERT_TRUE(c.is_ok());
  EXPECT_EQ(*c, (std::vector<float>{0.0f, 7.0f}));

  auto wrong_shape = (*model)->read_f32("a", b_shape);
  EXPECT_EQ(wrong_shape.status().code(), StatusCode::kMismatch);
  EXPECT_NE(wrong_shape.status().message().find("[2, 3]"), std::string::npos);
  auto missing = (*model)->read_f32("zzz", b_shape);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_FALSE((*model)->contains("zzz"));
  EXPECT_TRUE((*model)->contains("c"));
}

TEST_F(SafetensorsWeightsTest, ReadsUnalignedIntegerTensorsAndRefusesFloatsAsIds) {
  const int64_t i64[] = {7, -3, 2147483647};
  const int32_t i32[] = {5, 6};
  const int64_t too_big[] = {int64_t{1} << 40};
  const float f[] = {1.0f};
  // one padding byte: every tensor starts at an odd offset
  const std::string data = std::string(1, '\0') + bytes_of(i64, 24) + bytes_of(i32, 8) +
                           bytes_of(too_big, 8) + bytes_of(f, 4);
  const std::string header = R"({"p":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                             R"("a":{"dtype":"I64","shape":[3],"data_offsets":[1,25]},)"
                             R"("b":{"dtype":"I32","shape":[2],"data_offsets":[25,33]},)"
                             R"("c":{"dtype":"I64","shape":[1],"data_offsets":[33,41]},)"
                             R"("d":{"dtype":"F32","shape":[1],"data_offsets":[41,45]}})";
  auto model = SafetensorsWeights::open(write("ids.safetensors", header, data));
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  EXPECT_EQ(*read_int_tensor((*model)->model(), "a"), (std::vector<int32_t>{7, -3, 2147483647}));
  EXPECT_EQ(*read_int_tensor((*model)->model(), "b"), (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(read_int_tensor((*model)->model(), "c").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(read_int_tensor((*model)->model(), "d").status().code(), StatusCode::kUnsupported);
}

}  // namespace
}  // namespace kvp

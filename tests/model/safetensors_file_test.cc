// The safetensors reader on hand-built files: every float dtype, sharded indexes, and each kind
// of damage refused with a message naming the file and the problem.
#include "model/safetensors_file.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/dtype.h"

namespace kvp {
namespace {

namespace fs = std::filesystem;

class SafetensorsTest : public ::testing::Test {
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

TEST_F(SafetensorsTest, ReadsF32F16Bf16AsF32) {
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
  auto model = SafetensorsModel::open(write("m.safetensors", header, data));
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
}

TEST_F(SafetensorsTest, OpensShardedIndexFromDirectory) {
  const float x[] = {1, 2}, y[] = {3, 4, 5};
  write("s1.safetensors", R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
        bytes_of(x, 8));
  write("s2.safetensors", R"({"y":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}})",
        bytes_of(y, 12));
  std::ofstream(dir_ / "model.safetensors.index.json")
      << R"({"metadata":{},"weight_map":{"x":"s1.safetensors","y":"s2.safetensors"}})";
  auto model = SafetensorsModel::open(dir_.string());
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  const int64_t shape[] = {3};
  EXPECT_EQ(*(*model)->read_f32("y", shape), (std::vector<float>{3, 4, 5}));
  EXPECT_TRUE((*model)->contains("x"));
}

TEST_F(SafetensorsTest, RefusesDamagedFilesNamingTheProblem) {
  const float x[] = {1, 2};
  const std::string good = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  struct Case {
    std::string header, data, expect;
  };
  const Case cases[] = {
      {good, bytes_of(x, 4), "outside"},  // truncated data
      {R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", bytes_of(x, 8), "needs 12"},
      {R"({"x":{"dtype":"I8","shape":[2],"data_offsets":[0,2]}})", bytes_of(x, 8), "dtype I8"},
      {R"({"x":{"dtype":"F32","shape":[2]}})", bytes_of(x, 8), "malformed"},
      {R"({"x": not json)", bytes_of(x, 8), "not a JSON object"},
      {R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", bytes_of(x, 8), "outside"},
  };
  int i = 0;
  for (const Case& c : cases) {
    const std::string path = write("bad" + std::to_string(i++) + ".safetensors", c.header, c.data);
    auto model = SafetensorsModel::open(path);
    ASSERT_FALSE(model.is_ok()) << c.header;
    EXPECT_NE(model.status().message().find(c.expect), std::string::npos)
        << model.status().to_string();
    EXPECT_NE(model.status().message().find(path), std::string::npos);
  }
  // a header size larger than the file
  const std::string path = (dir_ / "short.safetensors").string();
  std::ofstream(path, std::ios::binary) << std::string("\xff\xff\x00\x00\x00\x00\x00\x00{}", 10);
  auto model = SafetensorsModel::open(path);
  EXPECT_EQ(model.status().code(), StatusCode::kCorruption);
  EXPECT_EQ(SafetensorsModel::open((dir_ / "nope").string()).status().code(),
            StatusCode::kNotFound);
}

}  // namespace
}  // namespace kvp

// Tests of SafetensorsFile / SafetensorsModel: files written at test time by
// tests/model/make_safetensors_reference.py (numpy only, by hand from the format description),
// compared with numpy's f32 conversion bit for bit; hand-made broken headers; a truncation and
// corruption sweep; broken shard indexes and config files.
#include "model/safetensors_file.h"
#include "support/temp_dir.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <bit>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

namespace kvp {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using test::TempDir;

std::vector<uint8_t> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

std::vector<float> read_f32(const fs::path& path) {
  std::vector<uint8_t> bytes = read_bytes(path);
  std::vector<float> out(bytes.size() / 4);
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), out.size() * 4);
  return out;
}

void expect_bits_equal(const std::vector<float>& out, const std::vector<float>& ref,
                       const std::string& what) {
  ASSERT_EQ(out.size(), ref.size()) << what;
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(out[i]), std::bit_cast<uint32_t>(ref[i]))
        << what << " element " << i << ": got " << out[i] << ", numpy " << ref[i];
  }
}

class SafetensorsReference : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    const std::string command =
        ".venv/bin/python tests/model/make_safetensors_reference.py " + dir_->path().string();
    ASSERT_EQ(std::system(command.c_str()), 0) << command << " (run scripts/setup.sh)";
    std::ifstream in(dir_->path() / "expected.json");
    expected_ = new json(json::parse(in));
  }
  static void TearDownTestSuite() {
    delete expected_;
    delete dir_;
  }
  static fs::path root() { return dir_->path(); }

  // Checks every tensor of `prefix` ("single/" or "sharded/") in expected.json.
  static void expect_tensor_matches(const SafetensorsTensor& t, const json& e) {
    EXPECT_EQ(t.dtype_name, e["dtype"].get<std::string>());
    EXPECT_EQ(t.shape, e["shape"].get<std::vector<uint64_t>>());
    EXPECT_EQ(t.data_begin, e["data_offsets"][0].get<uint64_t>());
    EXPECT_EQ(t.data_end, e["data_offsets"][1].get<uint64_t>());
  }

  static TempDir* dir_;
  static json* expected_;
};
TempDir* SafetensorsReference::dir_ = nullptr;
json* SafetensorsReference::expected_ = nullptr;

TEST_F(SafetensorsReference, SingleFileMatchesHeaderAndNumpyValues) {
  const std::string path = (root() / "single" / "model.safetensors").string();
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  EXPECT_EQ(file->metadata().at("format"), "pt");
  size_t num_checked = 0;
  for (const auto& [key, e] : expected_->items()) {
    if (!key.starts_with("single/")) continue;
    const std::string name = key.substr(7);
    SCOPED_TRACE(name);
    auto t = file->tensor(name);
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    expect_tensor_matches(**t, e);
    std::vector<float> out((*t)->num_elements);
    Status s = file->to_f32(**t, out);
    if (name == "model.i64") {
      EXPECT_EQ(s.code(), StatusCode::kUnsupported);
      EXPECT_NE(s.message().find("dtype I64"), std::string::npos) << s.message();
      EXPECT_NE(s.message().find(path), std::string::npos);
    } else {
      ASSERT_TRUE(s.is_ok()) << s.to_string();
      expect_bits_equal(out, read_f32(root() / "ref" / (name + ".f32")), name);
    }
    ++num_checked;
  }
  EXPECT_EQ(num_checked, file->tensors().size());
  EXPECT_EQ(file->tensor("model.scalar").value()->num_elements, 1u);
  EXPECT_EQ(file->tensor("model.empty").value()->num_elements, 0u);
  EXPECT_EQ(file->tensor("nope").status().code(), StatusCode::kNotFound);
  std::vector<float> wrong(3);
  EXPECT_EQ(file->to_f32(*file->tensor("model.f32").value(), wrong).code(),
            StatusCode::kInvalidArgument);
  EXPECT_NE(file->describe().find("model.bf16"), std::string::npos);
}

TEST_F(SafetensorsReference, ModelDirectoryWithOneFileReadsConfig) {
  auto model = SafetensorsModel::open((root() / "single").string());
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  EXPECT_EQ(model->shards().size(), 1u);
  EXPECT_EQ(model->num_tensors(), 6u);
  ASSERT_NE(model->config(), nullptr);
  EXPECT_EQ((*model->config())["hidden_size"].get<int>(), 33);
  std::vector<float> out(7 * 33);
  ASSERT_TRUE(model->to_f32("model.f32", out).is_ok());
  expect_bits_equal(out, read_f32(root() / "ref" / "model.f32.f32"), "model.f32");
}

TEST_F(SafetensorsReference, ShardedModelFindsEachTensorInItsShard) {
  for (const fs::path& path :
       {root() / "sharded", root() / "sharded" / "model.safetensors.index.json"}) {
    SCOPED_TRACE(path.string());
    auto model = SafetensorsModel::open(path.string());
    ASSERT_TRUE(model.is_ok()) << model.status().to_string();
    EXPECT_EQ(model->shards().size(), 2u);
    ASSERT_NE(model->config(), nullptr);
    EXPECT_EQ((*model->config())["model_type"].get<std::string>(), "qwen2");
    size_t num_checked = 0;
    for (const auto& [key, e] : expected_->items()) {
      if (!key.starts_with("sharded/")) continue;
      const std::string name = key.substr(8);
      SCOPED_TRACE(name);
      auto t = model->tensor(name);
      ASSERT_TRUE(t.is_ok()) << t.status().to_string();
      expect_tensor_matches(**t, e);
      // The tensor's bytes lie in the shard the script wrote it to.
      const std::string shard = e["shard"].get<std::string>();
      bool in_shard = false;
      for (const SafetensorsFile& f : model->shards()) {
        if (fs::path(f.path()).filename() == shard) in_shard = f.tensor(name).is_ok();
      }
      EXPECT_TRUE(in_shard);
      std::vector<float> out((*t)->num_elements);
      ASSERT_TRUE(model->to_f32(name, out).is_ok());
      expect_bits_equal(out, read_f32(root() / "ref" / (name + ".f32")), name);
      ++num_checked;
    }
    EXPECT_EQ(num_checked, 6u);
    EXPECT_EQ(model->tensor_names().size(), 6u);
    EXPECT_EQ(model->tensor("layers.9.weight").status().code(), StatusCode::kNotFound);
    EXPECT_NE(model->describe().find("2 shard(s), 6 tensors, config.json"), std::string::npos)
        << model->describe();
  }
}

TEST_F(SafetensorsReference, TruncationAnywhereIsAnError) {
  const std::vector<uint8_t> bytes = read_bytes(root() / "single" / "model.safetensors");
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto file = SafetensorsFile::open(MappedFile::from_bytes(
        "cut.safetensors", std::vector<uint8_t>(bytes.begin(), bytes.begin() + n)));
    ASSERT_FALSE(file.is_ok()) << "truncated to " << n << " bytes but opened";
    EXPECT_EQ(file.status().code(), StatusCode::kCorruption) << file.status().to_string();
    EXPECT_NE(file.status().message().find("'cut.safetensors'"), std::string::npos);
  }
}

TEST_F(SafetensorsReference, CorruptedHeaderBytesAreAnErrorNeverACrash) {
  const std::vector<uint8_t> bytes = read_bytes(root() / "single" / "model.safetensors");
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);
  std::mt19937_64 rng(11);
  size_t num_rejected = 0;
  for (size_t pos = 0; pos < 8 + header_size; ++pos) {
    for (uint8_t value : {uint8_t{'9'}, uint8_t{'"'}, static_cast<uint8_t>(rng())}) {
      std::vector<uint8_t> copy = bytes;
      copy[pos] = value;
      auto file = SafetensorsFile::open(MappedFile::from_bytes("bad.safetensors", copy));
      if (!file.is_ok()) {
        ++num_rejected;
        continue;
      }
      for (const SafetensorsTensor& t : file->tensors()) {
        std::vector<float> out(t.num_elements);
        (void)file->to_f32(t, out);  // Unsupported for I64; must not fault for any dtype
      }
    }
  }
  EXPECT_GT(num_rejected, 100u);
}

// ---- hand-made headers ----

// A file whose header is `header` (verbatim) followed by `data_bytes` bytes of data.
std::vector<uint8_t> file_with_header(const std::string& header, size_t data_bytes) {
  std::vector<uint8_t> bytes(8 + header.size() + data_bytes, 0x3c);
  const uint64_t size = header.size();
  std::memcpy(bytes.data(), &size, 8);
  std::memcpy(bytes.data() + 8, header.data(), header.size());
  return bytes;
}

Status open_header(const std::string& header, size_t data_bytes) {
  auto file = SafetensorsFile::open(
      MappedFile::from_bytes("hand.safetensors", file_with_header(header, data_bytes)));
  if (file.is_ok()) return Status::ok();
  EXPECT_NE(file.status().message().find("'hand.safetensors'"), std::string::npos);
  return file.status();
}

void expect_error(const std::string& header, size_t data_bytes, StatusCode code,
                  std::string_view reason) {
  Status s = open_header(header, data_bytes);
  EXPECT_EQ(s.code(), code) << header << ": " << s.to_string();
  EXPECT_NE(s.message().find(reason), std::string::npos)
      << "'" << s.message() << "' does not say '" << reason << "'";
}

TEST(SafetensorsBadFile, HandMadeHeadersGetClearErrors) {
  const std::string ok = R"({"a": {"dtype": "F16", "shape": [2, 3], "data_offsets": [0, 12]}})";
  EXPECT_TRUE(open_header(ok, 12).is_ok());
  EXPECT_TRUE(open_header(R"({})", 0).is_ok());

  expect_error("{\"a\": ", 0, StatusCode::kCorruption, "not valid JSON");
  expect_error("[1, 2]", 0, StatusCode::kCorruption, "header is JSON array, expected an object");
  expect_error(R"({"a": 5})", 0, StatusCode::kCorruption, "tensor 'a': entry is not an object");
  expect_error(R"({"a": {"shape": [1], "data_offsets": [0, 2]}})", 2, StatusCode::kCorruption,
               "'dtype' is missing");
  expect_error(R"({"a": {"dtype": "F16", "data_offsets": [0, 2]}})", 2, StatusCode::kCorruption,
               "'shape' is missing");
  expect_error(R"({"a": {"dtype": "F16", "shape": [1], "data_offsets": [0]}})", 2,
               StatusCode::kCorruption, "'data_offsets' is not [begin, end]");
  expect_error(R"({"a": {"dtype": "F16", "shape": [1], "data_offsets": [-2, 0]}})", 2,
               StatusCode::kCorruption, "'data_offsets' is not [begin, end]");
  expect_error(R"({"a": {"dtype": "F16", "shape": [-1], "data_offsets": [0, 2]}})", 2,
               StatusCode::kCorruption, "not a non-negative integer");
  expect_error(R"({"a": {"dtype": "F16", "shape": [1.5], "data_offsets": [0, 2]}})", 2,
               StatusCode::kCorruption, "not a non-negative integer");
  expect_error(R"({"a": {"dtype": "F128", "shape": [1], "data_offsets": [0, 2]}})", 2,
               StatusCode::kUnsupported, "tensor 'a' has unknown dtype 'F128'");
  expect_error(R"({"a": {"dtype": "F16", "shape": [2, 3], "data_offsets": [0, 10]}})", 12,
               StatusCode::kCorruption, "needs 6 elements x 2 bytes, but data_offsets span 10");
  expect_error(R"({"a": {"dtype": "F16", "shape": [2, 3], "data_offsets": [0, 12]}})", 11,
               StatusCode::kCorruption, "data_offsets [0, 12] are outside the 11-byte data");
  expect_error(R"({"a": {"dtype": "F16", "shape": [0], "data_offsets": [4, 2]}})", 8,
               StatusCode::kCorruption, "are outside");
  expect_error(R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296],
                   "data_offsets": [0, 4]}})",
               4, StatusCode::kCorruption, "has more than 2^64 - 1 elements");
  expect_error(R"({"a": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]},
                   "b": {"dtype": "F16", "shape": [2], "data_offsets": [2, 6]}})",
               6, StatusCode::kCorruption, "tensors 'a' and 'b' overlap");
  expect_error(R"({"__metadata__": {"format": 1}})", 0, StatusCode::kCorruption,
               "__metadata__ 'format' is number, expected a string");
  expect_error(R"({"__metadata__": []})", 0, StatusCode::kCorruption,
               "__metadata__ is array, expected an object");
}

TEST(SafetensorsBadFile, HeaderSizesBeyondTheFileAreRefused) {
  std::vector<uint8_t> bytes = file_with_header("{}", 0);
  const uint64_t huge = uint64_t{1} << 40;
  std::memcpy(bytes.data(), &huge, 8);
  auto file = SafetensorsFile::open(MappedFile::from_bytes("huge.safetensors", bytes));
  EXPECT_EQ(file.status().code(), StatusCode::kCorruption);
  EXPECT_NE(file.status().message().find("header size 1099511627776 is absurd"), std::string::npos)
      << file.status().message();
  const uint64_t past = 3;
  std::memcpy(bytes.data(), &past, 8);
  file = SafetensorsFile::open(MappedFile::from_bytes("past.safetensors", bytes));
  EXPECT_NE(file.status().message().find("runs past the end"), std::string::npos)
      << file.status().message();
}

// ---- broken model directories ----

class SafetensorsBadModel : public SafetensorsReference {
 protected:
  void SetUp() override {
    fs::copy(root() / "sharded", dir_copy_.path(), fs::copy_options::recursive);
  }
  fs::path dir() const { return dir_copy_.path(); }
  fs::path index() const { return dir() / "model.safetensors.index.json"; }
  TempDir dir_copy_;
};

TEST_F(SafetensorsBadModel, MissingShardIsNotFound) {
  fs::remove(dir() / "model-00002-of-00002.safetensors");
  auto model = SafetensorsModel::open(dir().string());
  EXPECT_EQ(model.status().code(), StatusCode::kNotFound);
  EXPECT_NE(model.status().message().find("model-00002-of-00002.safetensors"), std::string::npos);
}

TEST_F(SafetensorsBadModel, IndexNamingATensorItsShardLacksIsCorruption) {
  write_text(index(), R"({"weight_map": {"layers.0.weight": "model-00002-of-00002.safetensors"}})");
  auto model = SafetensorsModel::open(dir().string());
  EXPECT_EQ(model.status().code(), StatusCode::kCorruption);
  EXPECT_NE(model.status().message().find("puts tensor 'layers.0.weight' in "
                                          "'model-00002-of-00002.safetensors', which does not"),
            std::string::npos)
      << model.status().message();
}

TEST_F(SafetensorsBadModel, BadIndexesAndConfigsAreCorruption) {
  const std::pair<std::string, std::string> cases[] = {
      {"not json", "is not a JSON object"},
      {R"({"metadata": {}})", "has no 'weight_map' object"},
      {R"({"weight_map": {"a": 3}})", "weight_map['a'] is not a string"},
      {R"({"weight_map": {"a": "../model-00001-of-00002.safetensors"}})",
       "is not a file name in the model directory"},
  };
  for (const auto& [text, reason] : cases) {
    write_text(index(), text);
    auto model = SafetensorsModel::open(dir().string());
    EXPECT_EQ(model.status().code(), StatusCode::kCorruption) << text;
    EXPECT_NE(model.status().message().find(reason), std::string::npos) << model.status().message();
    EXPECT_NE(model.status().message().find(index().string()), std::string::npos);
  }
  fs::copy_file(root() / "sharded" / "model.safetensors.index.json", index(),
                fs::copy_options::overwrite_existing);
  write_text(dir() / "config.json", "{\"hidden_size\": ");
  auto model = SafetensorsModel::open(dir().string());
  EXPECT_EQ(model.status().code(), StatusCode::kCorruption);
  EXPECT_NE(model.status().message().find("config.json' is not a JSON object"), std::string::npos)
      << model.status().message();
}

TEST_F(SafetensorsBadModel, DirectoryWithoutWeightsIsNotFound) {
  TempDir empty;
  auto model = SafetensorsModel::open(empty.path().string());
  EXPECT_EQ(model.status().code(), StatusCode::kNotFound);
  EXPECT_NE(model.status().message().find("neither model.safetensors nor"), std::string::npos);
  EXPECT_EQ(SafetensorsModel::open("/nonexistent/dir/model.safetensors").status().code(),
            StatusCode::kNotFound);
}

}  // namespace
}  // namespace kvp

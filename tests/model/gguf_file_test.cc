// Tests of GgufFile and the dequantisers against the gguf Python package (which kvpool did not
// write): tests/model/make_gguf_reference.py writes a GGUF file with GGUFWriter and the
// package's dequantised values at test time; dump_gguf_info.py reports what GGUFReader sees in
// the real models. Every comparison of dequantised values is bit-exact (see docs/weights.md).
// Hand-built broken files and a truncation/corruption sweep check that bad input is a Status.
#include "model/gguf_file.h"
#include "support/temp_dir.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <bit>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

namespace kvp {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using test::TempDir;

// Runs a reference script with the project's .venv (tests run from the repo root).
void run_python(const std::string& args) {
  const std::string command = ".venv/bin/python " + args;
  const int rc = std::system(command.c_str());
  ASSERT_EQ(rc, 0) << "reference script failed: " << command
                   << " (run scripts/setup.sh to create .venv)";
}

std::vector<uint8_t> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& path, const uint8_t* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
}

std::vector<float> read_f32(const fs::path& path) {
  std::vector<uint8_t> bytes = read_bytes(path);
  std::vector<float> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), out.size() * 4);
  return out;
}

json read_json(const fs::path& path) {
  std::ifstream in(path);
  return json::parse(in);
}

// Bit-exact comparison; on failure reports the count of differing elements and the first.
void expect_bits_equal(const std::vector<float>& out, const std::vector<float>& ref,
                       const std::string& what) {
  ASSERT_EQ(out.size(), ref.size()) << what;
  size_t num_diff = 0;
  size_t first = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (std::bit_cast<uint32_t>(out[i]) != std::bit_cast<uint32_t>(ref[i])) {
      if (num_diff++ == 0) first = i;
    }
  }
  EXPECT_EQ(num_diff, 0u) << what << ": " << num_diff << " of " << out.size()
                          << " elements differ; first at " << first << ": got " << out[first]
                          << " (0x" << std::hex << std::bit_cast<uint32_t>(out[first])
                          << "), gguf package " << ref[first] << " (0x"
                          << std::bit_cast<uint32_t>(ref[first]) << ")";
}

// "array,array,int32": the value's type, then its element types down to a scalar.
std::string type_chain(const GgufValue& v) {
  std::string out(gguf_type_name(v.type));
  const GgufValue* cur = &v;
  while (cur->type == GgufType::Array) {
    out.append(",").append(gguf_type_name(cur->element_type));
    if (cur->element_type != GgufType::Array || cur->arrays.empty()) break;
    cur = &cur->arrays[0];
    out.append(",").append(gguf_type_name(cur->element_type));
    if (cur->element_type != GgufType::Array) break;
  }
  return out;
}

std::string json_type_chain(const json& types) {
  std::string out;
  for (const auto& t : types) {
    if (!out.empty()) out += ",";
    std::string s = t.get<std::string>();
    for (char& c : s) c = static_cast<char>(std::tolower(c));
    out += s;
  }
  return out;
}

// Compares a scalar or string value with the JSON value the reader reported.
void expect_scalar_matches(const GgufValue& v, const json& ref, const std::string& key) {
  switch (v.type) {
    case GgufType::Uint8:
    case GgufType::Uint16:
    case GgufType::Uint32:
    case GgufType::Uint64:
      EXPECT_EQ(v.u, ref.get<uint64_t>()) << key;
      break;
    case GgufType::Int8:
    case GgufType::Int16:
    case GgufType::Int32:
    case GgufType::Int64:
      EXPECT_EQ(v.i, ref.get<int64_t>()) << key;
      break;
    case GgufType::Float32:
    case GgufType::Float64:
      EXPECT_EQ(v.f, ref.get<double>()) << key;
      break;
    case GgufType::Bool:
      EXPECT_EQ(v.b, ref.get<bool>()) << key;
      break;
    case GgufType::String:
      EXPECT_EQ(v.str, ref.get<std::string>()) << key;
      break;
    case GgufType::Array:
      FAIL() << key << " is an array";
  }
}

void expect_array_prefix_matches(const GgufValue& v, const json& ref, const std::string& key) {
  ASSERT_EQ(v.type, GgufType::Array) << key;
  ASSERT_LE(ref.size(), v.count) << key;
  for (size_t e = 0; e < ref.size(); ++e) {
    if (v.element_type == GgufType::String) {
      EXPECT_EQ(v.strings[e], ref[e].get<std::string>()) << key << "[" << e << "]";
    } else {
      expect_scalar_matches(v.element(e), ref[e], key + "[" + std::to_string(e) + "]");
    }
  }
}

// Tensor infos as GGUFReader reports them: name, type, dims, element count, bytes, offset.
void expect_tensors_match(const GgufFile& file, const json& ref_tensors) {
  ASSERT_EQ(file.tensors().size(), ref_tensors.size());
  for (size_t i = 0; i < ref_tensors.size(); ++i) {
    const GgufTensor& t = file.tensors()[i];
    const json& r = ref_tensors[i];
    SCOPED_TRACE(r["name"].get<std::string>());
    EXPECT_EQ(t.name, r["name"].get<std::string>());
    EXPECT_EQ(ggml_type_name(t.type), r["type"].get<std::string>());
    EXPECT_EQ(t.dims, r["dims"].get<std::vector<uint64_t>>());
    EXPECT_EQ(t.num_elements, r["n_elements"].get<uint64_t>());
    EXPECT_EQ(t.size_bytes, r["n_bytes"].get<uint64_t>());
    EXPECT_EQ(file.data_offset() + t.offset, r["data_offset"].get<uint64_t>());
    EXPECT_EQ(t.data.data() - file.tensors()[0].data.data(),
              static_cast<ptrdiff_t>(t.offset - file.tensors()[0].offset));
  }
  ASSERT_TRUE(file.tensor(ref_tensors[0]["name"].get<std::string>()).is_ok());
}

class GgufReference : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    run_python("tests/model/make_gguf_reference.py " + dir_->path().string());
    expected_ = new json(read_json(dir_->path() / "expected.json"));
  }
  static void TearDownTestSuite() {
    delete expected_;
    delete dir_;
  }
  void SetUp() override {
    auto file = GgufFile::open(path());
    ASSERT_TRUE(file.is_ok()) << file.status().to_string();
    file_ = std::make_unique<GgufFile>(std::move(file).value());
  }
  static std::string path() { return (dir_->path() / "quant.gguf").string(); }
  static const json& expected() { return *expected_; }

  static TempDir* dir_;
  static json* expected_;
  std::unique_ptr<GgufFile> file_;
};
TempDir* GgufReference::dir_ = nullptr;
json* GgufReference::expected_ = nullptr;

TEST_F(GgufReference, HeaderMatchesReader) {
  EXPECT_EQ(file_->version(), 3u);
  EXPECT_EQ(file_->alignment(), expected()["alignment"].get<uint32_t>());
  EXPECT_EQ(file_->data_offset(), expected()["data_offset"].get<uint64_t>());
}

TEST_F(GgufReference, MetadataOfEveryTypeMatchesReader) {
  const json& order = expected()["metadata_order"];
  ASSERT_EQ(file_->metadata().size(), order.size());
  for (size_t k = 0; k < order.size(); ++k) {
    const std::string key = order[k].get<std::string>();
    SCOPED_TRACE(key);
    EXPECT_EQ(file_->metadata()[k].key, key) << "metadata order";
    const GgufValue* v = file_->find(key);
    ASSERT_NE(v, nullptr);
    const json& ref = expected()["metadata"][key];
    EXPECT_EQ(type_chain(*v), json_type_chain(ref["types"]));
    if (v->type != GgufType::Array) {
      expect_scalar_matches(*v, ref["value"], key);
    } else if (ref.contains("value")) {
      EXPECT_EQ(v->count, ref["value"].size());
      expect_array_prefix_matches(*v, ref["value"], key);
    }
  }
}

TEST_F(GgufReference, NestedArraysHoldTheWrittenValues) {
  for (const auto& [key, written] : expected()["nested_written"].items()) {
    SCOPED_TRACE(key);
    const GgufValue* v = file_->find(key);
    ASSERT_NE(v, nullptr);
    ASSERT_EQ(v->element_type, GgufType::Array);
    ASSERT_EQ(v->arrays.size(), written.size());
    for (size_t a = 0; a < written.size(); ++a) {
      ASSERT_EQ(v->arrays[a].count, written[a].size());
      expect_array_prefix_matches(v->arrays[a], written[a], key);
    }
  }
}

TEST_F(GgufReference, TypedGettersReturnValuesAndNameFileAndKeyOnError) {
  EXPECT_EQ(*file_->get_u8("test.u8"), 200);
  EXPECT_EQ(*file_->get_i8("test.i8"), -100);
  EXPECT_EQ(*file_->get_u16("test.u16"), 60000);
  EXPECT_EQ(*file_->get_i16("test.i16"), -30000);
  EXPECT_EQ(*file_->get_u32("test.u32"), 4000000000u);
  EXPECT_EQ(*file_->get_i32("test.i32"), -2000000000);
  EXPECT_EQ(*file_->get_u64("test.u64"), UINT64_MAX);
  EXPECT_EQ(*file_->get_f32("test.f32"), 0.1f);
  EXPECT_EQ(*file_->get_f64("test.f64"), 1.0 / 3.0);
  EXPECT_TRUE(*file_->get_bool("test.bool_true"));
  EXPECT_FALSE(*file_->get_bool("test.bool_false"));
  EXPECT_EQ(*file_->get_string("general.architecture"), "kvptest");
  EXPECT_EQ(*file_->get_integer("test.i64"), -(int64_t{1} << 62) - 7);
  EXPECT_EQ(*file_->get_integer("test.u32"), 4000000000);
  EXPECT_EQ((*file_->get_string_array("test.arr.string"))[2], "ünï");
  EXPECT_EQ((*file_->get_f32_array("test.arr.f32"))[1], -1.25f);
  EXPECT_EQ((*file_->get_i32_array("test.arr.i32")).size(), 1005u);

  auto missing = file_->get_u32("no.such.key");
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find(path()), std::string::npos);
  EXPECT_NE(missing.status().message().find("'no.such.key'"), std::string::npos);

  auto wrong = file_->get_u32("test.string");
  ASSERT_FALSE(wrong.is_ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::kMismatch);
  EXPECT_NE(wrong.status().message().find(path()), std::string::npos);
  EXPECT_NE(wrong.status().message().find("'test.string' is string, expected uint32"),
            std::string::npos)
      << wrong.status().message();
  EXPECT_EQ(file_->get_integer("test.u64").status().code(), StatusCode::kMismatch);
  EXPECT_EQ(file_->get_integer("test.f32").status().code(), StatusCode::kMismatch);
  EXPECT_EQ(file_->get_f32_array("test.arr.i32").status().code(), StatusCode::kMismatch);
  EXPECT_EQ(file_->tensor("no.such.tensor").status().code(), StatusCode::kNotFound);
}

TEST_F(GgufReference, TensorInfosMatchReader) {
  expect_tensors_match(*file_, expected()["tensors"]);
}

TEST_F(GgufReference, DequantizeMatchesGgufPackageBitExactly) {
  for (const GgufTensor& t : file_->tensors()) {
    SCOPED_TRACE(std::string(t.name) + " " + std::string(ggml_type_name(t.type)));
    std::vector<float> out(t.num_elements);
    ASSERT_TRUE(file_->dequantize_tensor(t, out).is_ok());
    expect_bits_equal(out, read_f32(dir_->path() / (std::string(t.name) + ".f32")),
                      std::string(t.name));
  }
}

TEST_F(GgufReference, EveryDequantizableTypeIsCovered) {
  std::set<GgmlType> covered;
  for (const GgufTensor& t : file_->tensors()) covered.insert(t.type);
  for (GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q4_0,
                        GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
                        GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS,
                        GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::MXFP4}) {
    EXPECT_TRUE(can_dequantize(type)) << ggml_type_name(type);
    EXPECT_TRUE(covered.count(type)) << ggml_type_name(type) << " has no reference tensor";
  }
}

TEST_F(GgufReference, DequantizeRowMatchesSliceOfWholeTensor) {
  for (const GgufTensor& t : file_->tensors()) {
    SCOPED_TRACE(std::string(t.name));
    std::vector<float> whole(t.num_elements);
    ASSERT_TRUE(file_->dequantize_tensor(t, whole).is_ok());
    std::vector<float> row(t.row_elements());
    for (uint64_t r = 0; r < t.num_rows(); ++r) {
      ASSERT_TRUE(file_->dequantize_row(t, r, row).is_ok());
      ASSERT_EQ(std::memcmp(row.data(), whole.data() + r * t.row_elements(), row.size() * 4), 0)
          << "row " << r;
    }
    EXPECT_EQ(file_->dequantize_row(t, t.num_rows(), row).code(), StatusCode::kInvalidArgument);
    std::vector<float> short_row(t.row_elements() - 1);
    EXPECT_EQ(file_->dequantize_row(t, 0, short_row).code(), StatusCode::kInvalidArgument);
  }
}

TEST_F(GgufReference, TypeTableMatchesGgml) {
  size_t num_types = 0;
  for (const auto& [name, sizes] : expected()["type_sizes"].items()) {
    const uint32_t raw = expected()["type_values"][name].get<uint32_t>();
    const GgmlTypeInfo* info = ggml_type_info(raw);
    ASSERT_NE(info, nullptr) << name;
    EXPECT_EQ(info->name, name);
    EXPECT_EQ(info->block_size, sizes[0].get<uint32_t>()) << name;
    EXPECT_EQ(info->type_size, sizes[1].get<uint32_t>()) << name;
    ++num_types;
  }
  uint32_t known = 0;
  for (uint32_t raw = 0; raw < 256; ++raw) known += ggml_type_info(raw) != nullptr;
  EXPECT_EQ(known, num_types) << "kvpool knows a type the gguf package does not";
}

TEST_F(GgufReference, CustomAlignmentPlacesTensorsOnItsBoundaries) {
  auto file = GgufFile::open((dir_->path() / "aligned.gguf").string());
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  EXPECT_EQ(file->alignment(), 64u);
  EXPECT_EQ(file->data_offset() % 64, 0u);
  ASSERT_EQ(file->tensors().size(), 2u);
  const GgufTensor& b = *file->tensor("b").value();
  EXPECT_EQ(b.offset, 64u);
  std::vector<float> values(5);
  ASSERT_TRUE(file->dequantize_tensor(b, values).is_ok());
  EXPECT_EQ(values, (std::vector<float>{-0.0f, -1, -2, -3, -4}));
}

TEST_F(GgufReference, DescribeListsMetadataAndTensors) {
  const std::string text = file_->describe();
  const size_t num_tensors = expected()["tensors"].size();
  EXPECT_NE(text.find(fmt::format("GGUF v3, kvptest, {} tensors", num_tensors)), std::string::npos)
      << text;
  EXPECT_NE(text.find("test.u64"), std::string::npos);
  EXPECT_NE(text.find("18446744073709551615"), std::string::npos);
  EXPECT_NE(text.find("[int32 x 1005]"), std::string::npos);
  EXPECT_NE(text.find("[[1, 2], [3], [4, 5, 6]]"), std::string::npos) << text;
  EXPECT_NE(text.find("t.q6_k"), std::string::npos);
  EXPECT_NE(text.find("[512, 6]"), std::string::npos);
  EXPECT_NE(file_->describe(2).find(fmt::format("... {} more", num_tensors - 2)),
            std::string::npos);
}

// Truncating the file anywhere before the end of its last tensor is a Corruption naming the
// file; truncating only padding after it is still a valid file.
TEST_F(GgufReference, TruncationAnywhereIsAnErrorNeverACrash) {
  const std::vector<uint8_t> bytes = read_bytes(path());
  uint64_t data_end = 0;
  for (const GgufTensor& t : file_->tensors()) {
    data_end = std::max(data_end, file_->data_offset() + t.offset + t.size_bytes);
  }
  const std::string cut = "cut.gguf";
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= file_->data_offset() + 64; ++n) lengths.push_back(n);
  for (size_t n = file_->data_offset(); n < bytes.size(); n += 997) lengths.push_back(n);
  for (size_t n = data_end - 3; n < bytes.size(); ++n) lengths.push_back(n);
  for (size_t n : lengths) {
    auto file = GgufFile::open(
        MappedFile::from_bytes(cut, std::vector<uint8_t>(bytes.begin(), bytes.begin() + n)));
    if (n >= data_end) {
      EXPECT_TRUE(file.is_ok()) << n << ": " << file.status().to_string();
      continue;
    }
    ASSERT_FALSE(file.is_ok()) << "truncated to " << n << " bytes but opened";
    EXPECT_EQ(file.status().code(), StatusCode::kCorruption) << file.status().to_string();
    EXPECT_NE(file.status().message().find("'cut.gguf'"), std::string::npos);
  }
}

// Overwriting header bytes with random values must give either a valid file (whose tensors then
// dequantise without fault) or a Status; ASan/UBSan builds check that no read leaves the file.
TEST_F(GgufReference, CorruptedHeaderBytesAreAnErrorNeverACrash) {
  const fs::path fuzz_path = dir_->path() / "fuzz.gguf";
  const std::vector<uint8_t> bytes = read_bytes(fuzz_path);
  auto original = GgufFile::open(fuzz_path.string());
  ASSERT_TRUE(original.is_ok()) << original.status().to_string();
  ASSERT_EQ(original->metadata().size(), file_->metadata().size());
  std::mt19937_64 rng(7);
  size_t num_rejected = 0;
  size_t num_cases = 0;
  const std::string bad = "bad.gguf";
  for (size_t pos = 0; pos < original->data_offset(); ++pos) {
    for (uint8_t value : {uint8_t{0xff}, uint8_t{0x00}, static_cast<uint8_t>(rng())}) {
      if (bytes[pos] == value) continue;
      std::vector<uint8_t> copy = bytes;
      copy[pos] = value;
      ++num_cases;
      auto file = GgufFile::open(MappedFile::from_bytes(bad, std::move(copy)));
      if (!file.is_ok()) {
        ++num_rejected;
        EXPECT_NE(file.status().message().find("'bad.gguf'"), std::string::npos);
        continue;
      }
      // The first and last rows touch both ends of each tensor's data.
      for (const GgufTensor& t : file->tensors()) {
        if (!can_dequantize(t.type) || t.num_rows() == 0 || t.row_elements() > (1u << 20)) {
          continue;
        }
        std::vector<float> row(t.row_elements());
        EXPECT_TRUE(file->dequantize_row(t, 0, row).is_ok());
        EXPECT_TRUE(file->dequantize_row(t, t.num_rows() - 1, row).is_ok());
      }
    }
  }
  // Most single-byte changes hit string bytes or values; many hit lengths, counts and types.
  EXPECT_GT(num_rejected, 100u) << "of " << num_cases;
}

// ---- hand-built files: each defect gets its own clear Status ----

// Writes GGUF bytes little-endian, with knobs for the defects under test.
struct GgufBytes {
  std::vector<uint8_t> bytes;
  void u8(uint8_t x) { bytes.push_back(x); }
  void u32(uint32_t x) { raw(&x, 4); }
  void u64(uint64_t x) { raw(&x, 8); }
  void str(std::string_view s) {
    u64(s.size());
    raw(s.data(), s.size());
  }
  void raw(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    bytes.insert(bytes.end(), b, b + n);
  }
  void pad(size_t align) {
    while (bytes.size() % align != 0) u8(0);
  }
};

struct Knobs {
  uint32_t magic = 0x46554747;
  uint32_t version = 3;
  uint64_t tensor_count = 1;
  uint64_t kv_count = 2;
  uint64_t key_length = 7;  // of "general.name" prefix "general" is a lie when changed
  uint32_t value_type = 8;  // string
  uint64_t array_count = 3;
  uint32_t array_type = 4;  // uint32
  uint32_t num_dims = 2;
  uint64_t dim0 = 32;
  uint64_t dim1 = 2;
  uint32_t tensor_type = 0;  // F32
  uint64_t offset = 0;
  bool duplicate_key = false;
  int alignment = -1;           // -1: no general.alignment
  uint32_t alignment_type = 4;  // uint32
  size_t data_bytes = 256;      // 32 x 2 f32
  int64_t second_offset = -1;   // >= 0: a second tensor "v" (8 f32) at this offset
};

std::vector<uint8_t> build(const Knobs& k) {
  GgufBytes g;
  g.u32(k.magic);
  g.u32(k.version);
  g.u64(k.tensor_count + (k.second_offset >= 0 ? 1 : 0));
  g.u64(k.kv_count + (k.alignment >= 0 ? 1 : 0));
  g.u64(k.key_length);
  g.raw("general", 7);
  g.u32(k.value_type);
  g.str("kvp");
  g.str(k.duplicate_key ? "general" : "test.arr");
  g.u32(9);
  g.u32(k.array_type);
  g.u64(k.array_count);
  for (uint32_t v : {1u, 2u, 3u}) g.u32(v);
  if (k.alignment >= 0) {
    g.str("general.alignment");
    g.u32(k.alignment_type);
    g.u32(static_cast<uint32_t>(k.alignment));
  }
  g.str("w");
  g.u32(k.num_dims);
  g.u64(k.dim0);
  if (k.num_dims > 1) g.u64(k.dim1);
  for (uint32_t d = 2; d < k.num_dims && d < 8; ++d) g.u64(1);
  g.u32(k.tensor_type);
  g.u64(k.offset);
  if (k.second_offset >= 0) {
    g.str("v");
    g.u32(1);
    g.u64(8);
    g.u32(0);
    g.u64(static_cast<uint64_t>(k.second_offset));
  }
  g.pad(k.alignment > 0 ? static_cast<size_t>(k.alignment) : 32);
  for (size_t i = 0; i < k.data_bytes; ++i) g.u8(static_cast<uint8_t>(i));
  return g.bytes;
}

class GgufBadFile : public ::testing::Test {
 protected:
  // Opens the file built from `k`; returns its Status (ok when it opened).
  Status open(const Knobs& k) {
    const std::vector<uint8_t> bytes = build(k);
    write_bytes(path_, bytes.data(), bytes.size());
    auto file = GgufFile::open(path_.string());
    if (file.is_ok()) return Status::ok();
    EXPECT_NE(file.status().message().find(path_.string()), std::string::npos)
        << file.status().message();
    return file.status();
  }
  void expect_error(const Knobs& k, StatusCode code, std::string_view reason) {
    Status s = open(k);
    EXPECT_EQ(s.code(), code) << s.to_string();
    EXPECT_NE(s.message().find(reason), std::string::npos)
        << "'" << s.message() << "' does not say '" << reason << "'";
  }
  TempDir dir_;
  fs::path path_ = dir_.path() / "hand.gguf";
};

// 2^62 f32 elements are 2^64 bytes: the size wrapped to 0 ("0 B", and inspect exited 0).
TEST_F(GgufBadFile, TensorBytesPast2To64AreRefusedNotWrapped) {
  Knobs k;
  k.num_dims = 1;
  k.dim0 = uint64_t{1} << 62;
  expect_error(k, StatusCode::kCorruption,
               "tensor 'w' of shape [4611686018427387904] and type F32 needs more than 2^64 - 1 "
               "bytes");
  k.tensor_type = 1;  // F16: 2^63 bytes fit the arithmetic, not the file
  expect_error(k, StatusCode::kCorruption, "lies past the end of the file");
}

TEST_F(GgufBadFile, TheUnmodifiedFileOpens) {
  EXPECT_TRUE(open(Knobs{}).is_ok());
  Knobs v2;
  v2.version = 2;
  EXPECT_TRUE(open(v2).is_ok());
  Knobs aligned;
  aligned.alignment = 128;
  EXPECT_TRUE(open(aligned).is_ok());
  Knobs two;
  two.second_offset = 256;
  two.data_bytes = 256 + 32;
  EXPECT_TRUE(open(two).is_ok());
}

TEST_F(GgufBadFile, BadMagicAndVersions) {
  Knobs k;
  k.magic = 0x58554747;  // "GGUX"
  expect_error(k, StatusCode::kCorruption, "bad magic 47 47 55 58");
  k = {};
  k.version = 1;
  expect_error(k, StatusCode::kUnsupported, "version 1 is not supported");
  k.version = 4;
  expect_error(k, StatusCode::kUnsupported, "version 4 is not supported");
  k.version = 0x03000000;
  expect_error(k, StatusCode::kUnsupported, "big-endian");
  write_bytes(path_, reinterpret_cast<const uint8_t*>("GG"), 2);
  auto tiny = GgufFile::open(path_.string());
  EXPECT_EQ(tiny.status().code(), StatusCode::kCorruption);
}

TEST_F(GgufBadFile, AbsurdCountsAndLengthsAreRefusedBeforeAllocating) {
  Knobs k;
  k.tensor_count = uint64_t{1} << 60;
  expect_error(k, StatusCode::kCorruption, "tensor count 1152921504606846976 is more than");
  k = {};
  k.kv_count = UINT64_MAX - 1;
  expect_error(k, StatusCode::kCorruption, "metadata count");
  k = {};
  k.key_length = uint64_t{1} << 62;
  expect_error(k, StatusCode::kCorruption, "past the end of the file");
  k = {};
  k.array_count = uint64_t{1} << 61;
  expect_error(k, StatusCode::kCorruption, "'test.arr' claims 2305843009213693952 uint32 elements");
  k = {};
  k.array_type = 8;  // strings: the u32 payload reads as absurd string lengths
  expect_error(k, StatusCode::kCorruption, "string 0 of array 'test.arr'");
}

TEST_F(GgufBadFile, BadTypesAndDuplicates) {
  Knobs k;
  k.value_type = 13;
  expect_error(k, StatusCode::kCorruption, "not a GGUF value type");
  k = {};
  k.array_type = 77;
  expect_error(k, StatusCode::kCorruption, "element type of 'test.arr' is 77");
  k = {};
  k.tensor_type = 4;  // Q4_2, removed from ggml
  expect_error(k, StatusCode::kUnsupported, "tensor 'w' has unknown ggml type 4");
  k.tensor_type = 1000;
  expect_error(k, StatusCode::kUnsupported, "unknown ggml type 1000");
  k = {};
  k.duplicate_key = true;
  expect_error(k, StatusCode::kCorruption, "key 'general' appears twice");
}

TEST_F(GgufBadFile, BadShapesOffsetsAndAlignment) {
  Knobs k;
  k.num_dims = 5;
  expect_error(k, StatusCode::kCorruption, "'w' has 5 dimensions");
  k = {};
  k.dim0 = uint64_t{1} << 40;
  k.dim1 = uint64_t{1} << 40;
  expect_error(k, StatusCode::kCorruption, "'w' has shape [1099511627776, 1099511627776]");
  // the product passes 2^63 only at dimension 1, which is 2: the message names the shape,
  // not "dimension 1 is 2"
  k = {};
  k.dim0 = uint64_t{1} << 62;
  k.dim1 = 2;
  expect_error(k, StatusCode::kCorruption, "'w' has shape [4611686018427387904, 2]: more than");
  k = {};
  k.dim0 = 48;
  k.tensor_type = 8;  // Q8_0 rows must be multiples of 32
  expect_error(k, StatusCode::kCorruption, "not a multiple of Q8_0's block size 32");
  k = {};
  k.offset = 16;
  expect_error(k, StatusCode::kCorruption, "offset 16 is not a multiple of the alignment 32");
  k.offset = 64;
  expect_error(k, StatusCode::kCorruption, "lies past the end of the file");
  k.offset = UINT64_MAX - 31;
  expect_error(k, StatusCode::kCorruption, "lies past the end of the file");
  k = {};
  k.data_bytes = 255;
  expect_error(k, StatusCode::kCorruption, "lies past the end of the file");
  k = {};
  k.second_offset = 224;
  k.data_bytes = 256 + 32;
  expect_error(k, StatusCode::kCorruption, "tensors 'w' and 'v' overlap");
  k = {};
  k.alignment = 48;
  expect_error(k, StatusCode::kCorruption, "general.alignment 48 is not a power of two");
  k.alignment = 0;
  expect_error(k, StatusCode::kCorruption, "general.alignment 0 is not a power of two");
  k.alignment = 64;
  k.alignment_type = 5;  // int32
  expect_error(k, StatusCode::kCorruption, "general.alignment is int32, expected uint32");
}

TEST_F(GgufBadFile, DeeplyNestedArraysAreRefused) {
  GgufBytes g;
  g.u32(0x46554747);
  g.u32(3);
  g.u64(0);
  g.u64(1);
  g.str("deep");
  g.u32(9);
  for (int d = 0; d < 20; ++d) {
    g.u32(9);
    g.u64(1);
  }
  g.u32(4);
  g.u64(0);
  write_bytes(path_, g.bytes.data(), g.bytes.size());
  auto file = GgufFile::open(path_.string());
  ASSERT_FALSE(file.is_ok());
  EXPECT_NE(file.status().message().find("nests arrays deeper than"), std::string::npos)
      << file.status().message();
}

TEST(GgufOpen, MissingFileIsNotFound) {
  auto file = GgufFile::open("/nonexistent/model.gguf");
  EXPECT_EQ(file.status().code(), StatusCode::kNotFound);
  EXPECT_NE(file.status().message().find("/nonexistent/model.gguf"), std::string::npos);
}

// ---- the real models (fetched by scripts/fetch_models.sh) against GGUFReader ----

void check_real_model(const std::string& model) {
  if (!fs::exists(model)) {
    GTEST_SKIP() << model << " is absent: run scripts/fetch_models.sh";
  }
  TempDir dir;
  run_python("tests/model/dump_gguf_info.py " + model + " " + dir.path().string());
  const json info = read_json(dir.path() / "info.json");
  auto opened = GgufFile::open(model);
  ASSERT_TRUE(opened.is_ok()) << opened.status().to_string();
  const GgufFile& file = *opened;
  EXPECT_EQ(file.alignment(), info["alignment"].get<uint32_t>());
  EXPECT_EQ(file.data_offset(), info["data_offset"].get<uint64_t>());
  expect_tensors_match(file, info["tensors"]);

  ASSERT_EQ(file.metadata().size(), info["metadata"].size());
  for (const auto& [key, ref] : info["metadata"].items()) {
    SCOPED_TRACE(key);
    const GgufValue* v = file.find(key);
    ASSERT_NE(v, nullptr);
    EXPECT_EQ(type_chain(*v), json_type_chain(ref["types"]));
    if (v->type != GgufType::Array) {
      expect_scalar_matches(*v, ref["value"], key);
    } else {
      EXPECT_EQ(v->count, ref["count"].get<uint64_t>());
      if (ref.contains("first")) expect_array_prefix_matches(*v, ref["first"], key);
    }
  }

  ASSERT_FALSE(info["dequantized"].empty());
  for (const json& d : info["dequantized"]) {
    const std::string name = d["name"].get<std::string>();
    SCOPED_TRACE(name);
    const GgufTensor& t = *file.tensor(name).value();
    const std::vector<float> ref = read_f32(dir.path() / (name + ".rows.f32"));
    std::vector<float> out(d["rows"].get<size_t>() * t.row_elements());
    for (size_t r = 0; r < d["rows"].get<size_t>(); ++r) {
      ASSERT_TRUE(
          file.dequantize_row(t, r, std::span(out).subspan(r * t.row_elements(), t.row_elements()))
              .is_ok());
    }
    expect_bits_equal(out, ref, name + " " + std::string(ggml_type_name(t.type)));
  }
}

TEST(GgufRealModel, SmolLM2MatchesGgufReader) {
  check_real_model("models/SmolLM2-135M-Instruct.Q4_1.gguf");
}

TEST(GgufRealModel, Gemma3MatchesGgufReader) {
  check_real_model("models/gemma-3-270m-q4_k_m.gguf");
}

}  // namespace
}  // namespace kvp

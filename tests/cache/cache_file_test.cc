// Cache files: the bytes on disk against docs/cache-files.md (checksum computed here with xxhash
// itself), round trips that re-block between pools of block size 16, 256 and 1 with a windowed
// group, and every refusal (truncated, flipped byte, wrong magic, future version, other model,
// trailing bytes, tables too short) leaving the pool byte-for-byte as it was. KV dtypes: an 8-bit
// (int8, fp8) file round trips exactly; loading converts between dtypes within each direction's
// rounding (bf16 <-> int8 / fp8 and int8 <-> fp8 within the quantisation step, f32 -> bf16 -> f32
// within bf16 rounding); a
// corrupted scale is refused by the checksum, with or without a conversion.
#include "cache/cache_file.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iostream>
#include <limits>
#include <random>

#include "cache/kv_quant.h"
#include "support/kv8_check.h"
#include "support/temp_dir.h"

namespace kvp {
namespace {

namespace fs = std::filesystem;

using test::TempDir;

std::vector<std::byte> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(chars.size());
  std::memcpy(out.data(), chars.data(), chars.size());
  return out;
}

void write_bytes(const fs::path& path, std::span<const std::byte> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

void fill_random(std::span<std::byte> bytes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (std::byte& b : bytes) b = static_cast<std::byte>(rng() & 0xff);
}

// 4 layers: 0, 2 global; 1, 3 window 40. 2 KV heads, head_dim 8, bf16 unless told.
CacheSpec test_spec(int32_t block_size, DType dtype = DType::BF16) {
  return CacheSpec::create("testarch", 4, 2, 8, dtype, block_size,
                           {LayerAttention::global(), LayerAttention::sliding(40),
                            LayerAttention::global(), LayerAttention::sliding(40)})
      .value();
}

const ModelFingerprint kModel{"testarch", 0x1234'5678'9abc'def0ull};

// A sequence of num_tokens tokens with random dense K and V per layer (the truth every test
// compares against), held in a pool of some block size through tables with scrambled ids.
struct Sequence {
  int64_t num_tokens;
  std::vector<int32_t> token_ids;
  std::vector<std::vector<std::byte>> k, v;  // [layer] dense [kept][heads][head_dim]

  Sequence(const CacheSpec& spec, int64_t n, uint64_t seed) : num_tokens(n) {
    std::mt19937_64 rng(seed);
    for (int64_t i = 0; i < n; ++i) token_ids.push_back(static_cast<int32_t>(rng() % 200000));
    for (int32_t layer = 0; layer < spec.num_layers(); ++layer) {
      const size_t bytes = static_cast<size_t>(spec.kept_tokens(layer, n)) * spec.num_kv_heads() *
                           kv_vector_bytes(spec.dtype(), spec.head_dim());
      k.emplace_back(bytes);
      v.emplace_back(bytes);
      fill_random(k.back(), seed * 100 + 2 * layer);
      fill_random(v.back(), seed * 100 + 2 * layer + 1);
    }
  }
};

// A pool with room for one sequence of n tokens, other blocks filled with noise, and tables
// that use the pool's blocks from the top down (so logical and physical order differ).
struct Pool {
  HostKvStorage storage;
  std::vector<std::vector<BlockId>> tables;

  static Pool make(const CacheSpec& spec, int64_t n) {
    std::vector<int32_t> num_blocks;
    std::vector<std::vector<BlockId>> tables;
    for (int32_t g = 0; g < spec.num_groups(); ++g) {
      const int64_t entries = (n + spec.block_size() - 1) / spec.block_size();
      const int64_t used = spec.blocks_per_seq(g, n);
      const int32_t total = static_cast<int32_t>(used + 3);
      num_blocks.push_back(total);
      std::vector<BlockId> table(entries, BlockId{-1});  // holes behind a window stay -1
      for (int64_t i = 0; i < used; ++i) {
        table[entries - 1 - i] = BlockId{static_cast<int32_t>(total - 1 - i)};
      }
      tables.push_back(std::move(table));
    }
    Pool pool{HostKvStorage::create(spec, num_blocks).value(), std::move(tables)};
    for (int32_t g = 0; g < spec.num_groups(); ++g) fill_random(pool.storage.slab(g), 77 + g);
    return pool;
  }

  void put(const Sequence& seq) {
    const CacheSpec& spec = storage.spec();
    for (int32_t layer = 0; layer < spec.num_layers(); ++layer) {
      const int64_t kept = spec.kept_tokens(layer, seq.num_tokens);
      storage.scatter_layer(layer, tables[spec.group_of_layer(layer)], seq.num_tokens - kept,
                            seq.num_tokens, seq.k[layer], seq.v[layer]);
    }
  }

  // Compares the pool's copy of the sequence with the truth.
  void expect_holds(const Sequence& seq) const {
    const CacheSpec& spec = storage.spec();
    for (int32_t layer = 0; layer < spec.num_layers(); ++layer) {
      const int64_t kept = spec.kept_tokens(layer, seq.num_tokens);
      std::vector<std::byte> k(storage.dense_bytes(kept)), v(k.size());
      storage.gather_layer(layer, tables[spec.group_of_layer(layer)], seq.num_tokens - kept,
                           seq.num_tokens, k, v);
      EXPECT_EQ(k, seq.k[layer]) << "layer " << layer << " block size " << spec.block_size();
      EXPECT_EQ(v, seq.v[layer]) << "layer " << layer << " block size " << spec.block_size();
    }
  }

  std::vector<std::vector<std::byte>> snapshot() const {
    std::vector<std::vector<std::byte>> out;
    for (int32_t g = 0; g < storage.num_groups(); ++g) {
      out.emplace_back(storage.slab(g).begin(), storage.slab(g).end());
    }
    return out;
  }
};

template <typename T>
T load_le(const std::vector<std::byte>& bytes, size_t at) {
  T value;
  std::memcpy(&value, bytes.data() + at, sizeof(T));
  return value;
}

TEST(CacheFile, BytesFollowTheDocumentedFormat) {
  TempDir dir;
  const CacheSpec spec = test_spec(16);
  const Sequence seq(spec, 50, 1);
  Pool pool = Pool::make(spec, 50);
  pool.put(seq);
  const fs::path path = dir.path() / "a.kvc";
  ASSERT_TRUE(write_cache_file(path, kModel, pool.storage, seq.token_ids, pool.tables).is_ok());
  const std::vector<std::byte> b = read_bytes(path);

  EXPECT_EQ(std::memcmp(b.data(), "KVPCACHE", 8), 0);
  EXPECT_EQ(load_le<uint32_t>(b, 8), 1u);   // version
  EXPECT_EQ(load_le<uint32_t>(b, 12), 8u);  // strlen("testarch")
  EXPECT_EQ(std::memcmp(b.data() + 16, "testarch", 8), 0);
  EXPECT_EQ(load_le<uint64_t>(b, 24), kModel.weight_hash);
  EXPECT_EQ(load_le<uint32_t>(b, 32), 4u);  // layers
  EXPECT_EQ(load_le<uint32_t>(b, 36), 2u);  // KV heads
  EXPECT_EQ(load_le<uint32_t>(b, 40), 8u);  // head_dim
  EXPECT_EQ(load_le<uint32_t>(b, 44), 2u);  // bf16
  const uint32_t attention[8] = {0, 0, 1, 40, 0, 0, 1, 40};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(load_le<uint32_t>(b, 48 + 4 * i), attention[i]) << i;
  EXPECT_EQ(load_le<uint64_t>(b, 80), 50u);  // tokens
  const size_t tokens_at = 88;
  for (int i = 0; i < 50; ++i) ASSERT_EQ(load_le<int32_t>(b, tokens_at + 4 * i), seq.token_ids[i]);
  // Layer data: global layers keep 50 tokens, windowed ones the last 40; a row is 2 * 8 bf16.
  size_t at = tokens_at + 4 * 50;
  for (int32_t layer = 0; layer < 4; ++layer) {
    const size_t bytes = (layer % 2 == 0 ? 50u : 40u) * 2 * 8 * 2;
    ASSERT_EQ(seq.k[layer].size(), bytes);
    EXPECT_EQ(std::memcmp(b.data() + at, seq.k[layer].data(), bytes), 0) << layer;
    EXPECT_EQ(std::memcmp(b.data() + at + bytes, seq.v[layer].data(), bytes), 0) << layer;
    at += 2 * bytes;
  }
  ASSERT_EQ(b.size(), at + 8);
  EXPECT_EQ(b.size(), 11816u);  // the worked example in docs/cache-files.md
  EXPECT_EQ(load_le<uint64_t>(b, at), XXH3_64bits(b.data(), at));
}

TEST(CacheFile, LoadsIntoPoolsOfOtherBlockSizes) {
  TempDir dir;
  const int64_t n = 300;  // more than one 256-token block; windows keep tokens 260..299
  const Sequence seq(test_spec(16), n, 2);

  Pool p16 = Pool::make(test_spec(16), n);
  p16.put(seq);
  const fs::path f16 = dir.path() / "from16.kvc";
  ASSERT_TRUE(write_cache_file(f16, kModel, p16.storage, seq.token_ids, p16.tables).is_ok());

  // 16 -> 256
  Pool p256 = Pool::make(test_spec(256), n);
  std::vector<int32_t> tokens;
  const Status s256 = load_cache_file(f16, kModel, p256.storage, p256.tables, &tokens);
  ASSERT_TRUE(s256.is_ok()) << s256.to_string();
  EXPECT_EQ(tokens, seq.token_ids);
  p256.expect_holds(seq);

  // 256 -> 1
  const fs::path f256 = dir.path() / "from256.kvc";
  ASSERT_TRUE(write_cache_file(f256, kModel, p256.storage, seq.token_ids, p256.tables).is_ok());
  EXPECT_EQ(read_bytes(f256), read_bytes(f16));  // no block size in the file
  Pool p1 = Pool::make(test_spec(1), n);
  ASSERT_TRUE(load_cache_file(f256, kModel, p1.storage, p1.tables).is_ok());
  p1.expect_holds(seq);
}

TEST(CacheFile, ShortAndEmptySequencesRoundTrip) {
  TempDir dir;
  for (int64_t n : {0, 1, 39, 40, 41}) {
    const Sequence seq(test_spec(16), n, 3);
    Pool src = Pool::make(test_spec(16), n);
    src.put(seq);
    const fs::path path = dir.path() / fmt::format("n{}.kvc", n);
    ASSERT_TRUE(write_cache_file(path, kModel, src.storage, seq.token_ids, src.tables).is_ok());
    Pool dst = Pool::make(test_spec(4), n);
    const Result<CacheFile> file = CacheFile::read(path, kModel, dst.storage.spec());
    ASSERT_TRUE(file.is_ok()) << file.status().to_string();
    EXPECT_EQ(file->num_tokens(), n);
    EXPECT_EQ(file->group_token_begin(0), 0);
    EXPECT_EQ(file->group_token_begin(1), std::max<int64_t>(0, n - 40));
    ASSERT_TRUE(file->check_tables(dst.storage, dst.tables).is_ok());
    file->scatter_into(dst.storage, dst.tables);
    dst.expect_holds(seq);
  }
}

TEST(CacheFile, OverwritesAtomicallyAndLeavesNoTempFiles) {
  TempDir dir;
  const CacheSpec spec = test_spec(16);
  const fs::path path = dir.path() / "s.kvc";
  for (uint64_t seed : {4, 5}) {
    const Sequence seq(spec, 20, seed);
    Pool pool = Pool::make(spec, 20);
    pool.put(seq);
    ASSERT_TRUE(write_cache_file(path, kModel, pool.storage, seq.token_ids, pool.tables).is_ok());
    Pool back = Pool::make(spec, 20);
    ASSERT_TRUE(load_cache_file(path, kModel, back.storage, back.tables).is_ok());
    back.expect_holds(seq);
  }
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir.path())) {
    ++files;
    EXPECT_EQ(entry.path().filename(), "s.kvc");
  }
  EXPECT_EQ(files, 1);
}

TEST(CacheFile, WriteErrors) {
  TempDir dir;
  const CacheSpec spec = test_spec(16);
  const Sequence seq(spec, 20, 6);
  Pool pool = Pool::make(spec, 20);
  pool.put(seq);
  const Status no_dir = write_cache_file(dir.path() / "missing" / "x.kvc", kModel, pool.storage,
                                         seq.token_ids, pool.tables);
  EXPECT_EQ(no_dir.code(), StatusCode::kIoError);
  EXPECT_NE(no_dir.message().find("x.kvc"), std::string::npos);
  EXPECT_EQ(write_cache_file(dir.path() / "x.kvc", ModelFingerprint{"", 1}, pool.storage,
                             seq.token_ids, pool.tables)
                .code(),
            StatusCode::kInvalidArgument);
  std::vector<std::vector<BlockId>> short_tables = pool.tables;
  short_tables[0].pop_back();
  const Status short_table =
      write_cache_file(dir.path() / "x.kvc", kModel, pool.storage, seq.token_ids, short_tables);
  EXPECT_EQ(short_table.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(short_table.message().find("group 0"), std::string::npos);
  EXPECT_TRUE(fs::is_empty(dir.path()));
  // The target is a directory: the rename fails, the temporary file goes.
  fs::create_directory(dir.path() / "taken");
  const Status rename_failed =
      write_cache_file(dir.path() / "taken", kModel, pool.storage, seq.token_ids, pool.tables);
  EXPECT_EQ(rename_failed.code(), StatusCode::kIoError);
  EXPECT_NE(rename_failed.message().find("rename failed"), std::string::npos);
  EXPECT_TRUE(fs::is_empty(dir.path() / "taken"));
  int entries = 0;
  for (const auto& entry : fs::directory_iterator(dir.path())) entries += entry.exists();
  EXPECT_EQ(entries, 1);  // only "taken"
}

// ---- refusals leave the pool exactly as it was ----

class CacheFileRefusal : public ::testing::Test {
 protected:
  void SetUp() override {
    Pool src = Pool::make(test_spec(16), kTokens);
    src.put(seq_);
    ASSERT_TRUE(write_cache_file(good_, kModel, src.storage, seq_.token_ids, src.tables).is_ok());
    good_bytes_ = read_bytes(good_);
  }

  // Loads `bytes` (written to a file) into a noisy pool of block size 4; expects a refusal of
  // `code` whose message names the file and contains `reason`, and an untouched pool.
  void expect_refused(std::span<const std::byte> bytes, StatusCode code, const std::string& reason,
                      const ModelFingerprint& expected = kModel) {
    write_bytes(bad_, bytes);
    expect_refused_file(bad_, code, reason, expected, test_spec(4));
  }

  void expect_refused_file(const fs::path& path, StatusCode code, const std::string& reason,
                           const ModelFingerprint& expected, const CacheSpec& running) {
    Pool pool = Pool::make(running, kTokens);
    const auto before = pool.snapshot();
    const Status s = load_cache_file(path, expected, pool.storage, pool.tables);
    ASSERT_FALSE(s.is_ok());
    EXPECT_EQ(s.code(), code) << s.to_string();
    EXPECT_NE(s.message().find(path.filename().string()), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(reason), std::string::npos) << s.message();
    EXPECT_EQ(pool.snapshot(), before) << "the pool changed on: " << s.to_string();
  }

  static constexpr int64_t kTokens = 45;
  TempDir dir_;
  fs::path good_ = dir_.path() / "good.kvc";
  fs::path bad_ = dir_.path() / "bad.kvc";
  Sequence seq_{test_spec(16), kTokens, 9};
  std::vector<std::byte> good_bytes_;
};

TEST_F(CacheFileRefusal, TheGoodFileLoads) {
  Pool pool = Pool::make(test_spec(4), kTokens);
  ASSERT_TRUE(load_cache_file(good_, kModel, pool.storage, pool.tables).is_ok());
  pool.expect_holds(seq_);
}

TEST_F(CacheFileRefusal, Truncated) {
  const size_t header = 88;  // up to the token ids (see BytesFollowTheDocumentedFormat)
  for (size_t size : {size_t{0}, size_t{5}, size_t{8}, size_t{30}, header - 1}) {
    SCOPED_TRACE(size);
    expect_refused(std::span(good_bytes_).first(size), StatusCode::kCorruption,
                   "truncated: " + std::to_string(size) + " bytes end inside the header");
  }
  for (size_t size : {header, header + 100, good_bytes_.size() - 1}) {
    SCOPED_TRACE(size);
    expect_refused(
        std::span(good_bytes_).first(size), StatusCode::kCorruption,
        fmt::format("truncated: {} bytes, the header promises {}", size, good_bytes_.size()));
  }
}

TEST_F(CacheFileRefusal, FlippedBytes) {
  // Every byte of the header, the token ids and the checksum; every 37th byte of the KV data
  // (each file write costs disk time).
  std::vector<size_t> positions;
  const size_t data_begin = 88 + 4 * kTokens, checksum_at = good_bytes_.size() - 8;
  for (size_t i = 0; i < data_begin; ++i) positions.push_back(i);
  for (size_t i = data_begin; i < checksum_at; i += 37) positions.push_back(i);
  for (size_t i = checksum_at; i < good_bytes_.size(); ++i) positions.push_back(i);
  for (size_t i : positions) {
    std::vector<std::byte> bad = good_bytes_;
    bad[i] ^= std::byte{0x10};
    write_bytes(bad_, bad);
    Pool pool = Pool::make(test_spec(4), kTokens);
    const auto before = pool.snapshot();
    const Status s = load_cache_file(bad_, kModel, pool.storage, pool.tables);
    ASSERT_FALSE(s.is_ok()) << "flipped byte " << i << " was accepted";
    ASSERT_EQ(pool.snapshot(), before) << "flipped byte " << i;
    // Past the header, nothing but the checksum can tell.
    if (i >= 88) {
      ASSERT_NE(s.message().find("checksum mismatch"), std::string::npos) << s.message();
    }
  }
}

TEST_F(CacheFileRefusal, WrongMagic) {
  std::vector<std::byte> bad = good_bytes_;
  std::memcpy(bad.data(), "GGUF\3\0\0\0", 8);
  expect_refused(bad, StatusCode::kCorruption, "not a kvpool cache file (wrong magic)");
}

TEST_F(CacheFileRefusal, FutureVersion) {
  std::vector<std::byte> bad = good_bytes_;
  const uint32_t version = 2;
  std::memcpy(bad.data() + 8, &version, 4);
  // A consistent file of a newer format: its checksum is right.
  const uint64_t sum = XXH3_64bits(bad.data(), bad.size() - 8);
  std::memcpy(bad.data() + bad.size() - 8, &sum, 8);
  expect_refused(bad, StatusCode::kUnsupported, "format version 2 is newer");
}

// Every header value within its limit, but their product past 2^64: 4096 layers of 2^31 - 1
// tokens of 4096 x 8192 f32 values. The sum wrapped before and was compared as a small size.
TEST_F(CacheFileRefusal, HeaderSizesPast2To64AreRefusedNotWrapped) {
  std::vector<std::byte> bad;
  auto put = [&](const auto& value) {
    const auto* p = reinterpret_cast<const std::byte*>(&value);
    bad.insert(bad.end(), p, p + sizeof(value));
  };
  bad.resize(8);
  std::memcpy(bad.data(), "KVPCACHE", 8);
  put(uint32_t{1});                                    // version
  put(uint32_t{8});                                    // architecture name bytes
  for (char c : std::string("testarch")) put(c);       // architecture
  put(kModel.weight_hash);                             // weight hash
  put(uint32_t{4096});                                 // layers
  put(uint32_t{4096});                                 // KV heads
  put(uint32_t{8192});                                 // head_dim
  put(static_cast<uint32_t>(DType::F32));              // dtype
  for (int l = 0; l < 4096; ++l) put(uint64_t{0});     // global attention, no window
  put(uint64_t{std::numeric_limits<int32_t>::max()});  // tokens
  bad.resize(bad.size() + 64);
  expect_refused(bad, StatusCode::kCorruption, "the header promises more than 2^64 - 1 bytes");
}

TEST_F(CacheFileRefusal, TrailingBytes) {
  std::vector<std::byte> bad = good_bytes_;
  bad.push_back(std::byte{0});
  expect_refused(bad, StatusCode::kCorruption, "(trailing bytes)");
}

TEST_F(CacheFileRefusal, OtherModel) {
  expect_refused_file(good_, StatusCode::kMismatch, "made for architecture 'testarch', running 'x'",
                      ModelFingerprint{"x", kModel.weight_hash}, test_spec(4));
  expect_refused_file(good_, StatusCode::kMismatch, "made for weights 123456789abcdef0",
                      ModelFingerprint{"testarch", 7}, test_spec(4));
  const CacheSpec more_heads =
      CacheSpec::create("testarch", 4, 4, 8, DType::BF16, 4,
                        {LayerAttention::global(), LayerAttention::sliding(40),
                         LayerAttention::global(), LayerAttention::sliding(40)})
          .value();
  expect_refused_file(good_, StatusCode::kMismatch, "num_kv_heads 2 vs 4", kModel, more_heads);
  const CacheSpec other_window =
      CacheSpec::create("testarch", 4, 2, 8, DType::BF16, 4,
                        {LayerAttention::global(), LayerAttention::sliding(40),
                         LayerAttention::global(), LayerAttention::sliding(64)})
          .value();
  expect_refused_file(good_, StatusCode::kMismatch, "layer 3 attention window 40 vs window 64",
                      kModel, other_window);
}

TEST_F(CacheFileRefusal, MissingFileAndShortTables) {
  expect_refused_file(dir_.path() / "nope.kvc", StatusCode::kNotFound, "no such file", kModel,
                      test_spec(4));
  expect_refused_file(dir_.path(), StatusCode::kIoError, "is a directory", kModel, test_spec(4));
  Pool pool = Pool::make(test_spec(4), kTokens);
  pool.tables[1].back() = BlockId{1000};
  const auto before = pool.snapshot();
  const Status s = load_cache_file(good_, kModel, pool.storage, pool.tables);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("block table of group 1"), std::string::npos) << s.message();
  EXPECT_EQ(pool.snapshot(), before);
}

// ---- KV dtypes: 8-bit (int8, fp8) files, conversion on load ----

// Dense K and V per layer as f32 values (the truth of the conversion tests): random in [-2, 2],
// each head vector scaled by its own magnitude in [0.1, 8] (scales stay normal f16 numbers).
struct Values {
  std::vector<std::vector<float>> k, v;  // [layer] [kept][heads][head_dim]
  Values(const CacheSpec& spec, int64_t n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> value(-2.0f, 2.0f), magnitude(0.1f, 8.0f);
    for (int32_t layer = 0; layer < spec.num_layers(); ++layer) {
      const size_t count =
          static_cast<size_t>(spec.kept_tokens(layer, n)) * spec.num_kv_heads() * spec.head_dim();
      for (auto* out : {&k, &v}) {
        out->emplace_back(count);
        for (size_t i = 0; i < count; i += spec.head_dim()) {
          const float m = magnitude(rng);
          for (int32_t d = 0; d < spec.head_dim(); ++d) out->back()[i + d] = value(rng) * m;
        }
      }
    }
  }
};

// A Sequence of the spec's dtype holding `values`, each head vector stored from f32 (bf16/f16
// rounded, 8-bit quantised).
Sequence sequence_of(const CacheSpec& spec, int64_t n, const Values& values) {
  Sequence seq(spec, n, 5);
  const int32_t head_dim = spec.head_dim();
  const size_t vector_bytes = kv_vector_bytes(spec.dtype(), head_dim);
  for (int32_t layer = 0; layer < spec.num_layers(); ++layer) {
    for (int32_t which = 0; which < 2; ++which) {
      const std::vector<float>& in = which == 0 ? values.k[layer] : values.v[layer];
      std::vector<std::byte>& out = which == 0 ? seq.k[layer] : seq.v[layer];
      for (size_t i = 0; i * head_dim < in.size(); ++i) {
        kv_vector_from_f32(in.data() + i * head_dim, head_dim, spec.dtype(),
                           out.data() + i * vector_bytes);
      }
    }
  }
  return seq;
}

// The pool's sequence, read back: per layer K then V head vectors as stored (8-bit: the codes'
// values and the scale, read here byte by byte rather than through kv_quant.h).
struct StoredVector {
  std::vector<float> values;  // 8-bit: the codes' values, before the scale
  float scale = 1.0f;         // 8-bit only
};
std::vector<std::vector<StoredVector>> read_back(const Pool& pool, int64_t n) {
  const CacheSpec& spec = pool.storage.spec();
  const int32_t head_dim = spec.head_dim();
  const size_t vector_bytes = kv_vector_bytes(spec.dtype(), head_dim);
  std::vector<std::vector<StoredVector>> out;  // [layer * 2 + which][vector]
  for (int32_t layer = 0; layer < spec.num_layers(); ++layer) {
    const int64_t kept = spec.kept_tokens(layer, n);
    std::vector<std::byte> kv[2] = {std::vector<std::byte>(pool.storage.dense_bytes(kept)),
                                    std::vector<std::byte>(pool.storage.dense_bytes(kept))};
    pool.storage.gather_layer(layer, pool.tables[spec.group_of_layer(layer)], n - kept, n, kv[0],
                              kv[1]);
    for (const std::vector<std::byte>& dense : kv) {
      std::vector<StoredVector>& vectors = out.emplace_back();
      for (size_t at = 0; at < dense.size(); at += vector_bytes) {
        StoredVector sv;
        for (int32_t d = 0; d < head_dim; ++d) {
          if (is_kv8(spec.dtype())) {
            sv.values.push_back(static_cast<float>(
                testing::kv8_code_value(spec.dtype(), static_cast<uint8_t>(dense[at + d]))));
          } else {
            sv.values.push_back(load_as_f32(dense.data() + at, spec.dtype(), size_t(d)));
          }
        }
        if (is_kv8(spec.dtype())) {
          const uint16_t bits = static_cast<uint16_t>(uint16_t(dense[at + head_dim]) |
                                                      uint16_t(dense[at + head_dim + 1]) << 8);
          sv.scale = f16_to_f32(F16{bits});
        }
        vectors.push_back(std::move(sv));
      }
    }
  }
  return out;
}

// Writes `seq` from a pool of `from` and loads it into a fresh pool of `to` (block size 4).
Pool convert(const TempDir& dir, const Sequence& seq, DType from, DType to, int64_t n) {
  Pool src = Pool::make(test_spec(16, from), n);
  src.put(seq);
  const fs::path path = dir.path() / fmt::format("{}.kvc", dtype_name(from));
  KVP_CHECK(write_cache_file(path, kModel, src.storage, seq.token_ids, src.tables).is_ok(),
            "write");
  Pool dst = Pool::make(test_spec(4, to), n);
  std::vector<int32_t> tokens;
  const Status s = load_cache_file(path, kModel, dst.storage, dst.tables, &tokens);
  KVP_CHECK(s.is_ok(), "{}", s.to_string());
  KVP_CHECK(tokens == seq.token_ids, "tokens");
  return dst;
}

// Each test runs for int8 and fp8.
class CacheFileKv8 : public ::testing::TestWithParam<DType> {};

TEST_P(CacheFileKv8, FileRoundTripsExactlyWithItsScales) {
  const DType kv8 = GetParam();
  TempDir dir;
  const int64_t n = 300;
  const Sequence seq(test_spec(16, kv8), n, 21);  // random bytes: scales included
  Pool p16 = Pool::make(test_spec(16, kv8), n);
  p16.put(seq);
  const fs::path path = dir.path() / "kv8.kvc";
  ASSERT_TRUE(write_cache_file(path, kModel, p16.storage, seq.token_ids, p16.tables).is_ok());
  const std::vector<std::byte> b = read_bytes(path);
  EXPECT_EQ(load_le<uint32_t>(b, 44), kv8 == DType::I8 ? 3u : 4u);  // the dtype's code
  // per layer K and V of the kept tokens, a head vector of 8 values and a 2-byte scale
  EXPECT_EQ(b.size(), 88 + 4 * 300 + (300 + 40 + 300 + 40) * 2 * 2 * (8 + 2) + 8);
  Pool p256 = Pool::make(test_spec(256, kv8), n);
  ASSERT_TRUE(load_cache_file(path, kModel, p256.storage, p256.tables).is_ok());
  p256.expect_holds(seq);
  Pool p1 = Pool::make(test_spec(1, kv8), n);
  ASSERT_TRUE(load_cache_file(path, kModel, p1.storage, p1.tables).is_ok());
  p1.expect_holds(seq);
}

// bf16 -> 8-bit: each vector's scale is its largest |x| / kv8_max_value (rounded up to f16), and
// every value is within half a grid step of the bf16 value. 8-bit -> bf16: value * scale within
// bf16 rounding.
TEST_P(CacheFileKv8, Bf16ConvertsBothWaysWithinTheQuantisationStep) {
  const DType kv8 = GetParam();
  const auto max_code = static_cast<float>(testing::kv8_max_code(kv8));
  TempDir dir;
  const int64_t n = 45;
  const Values values(test_spec(16), n, 31);
  const Sequence bf16_seq = sequence_of(test_spec(16, DType::BF16), n, values);
  const auto bf16 = read_back(
      [&] {
        Pool p = Pool::make(test_spec(16, DType::BF16), n);
        p.put(bf16_seq);
        return p;
      }(),
      n);

  const Pool as_kv8 = convert(dir, bf16_seq, DType::BF16, kv8, n);
  const auto quantised = read_back(as_kv8, n);
  ASSERT_EQ(quantised.size(), bf16.size());
  double worst_steps = 0;
  for (size_t i = 0; i < quantised.size(); ++i) {
    ASSERT_EQ(quantised[i].size(), bf16[i].size());
    for (size_t j = 0; j < quantised[i].size(); ++j) {
      const StoredVector& q = quantised[i][j];
      float max_abs = 0;
      for (float x : bf16[i][j].values) max_abs = std::max(max_abs, std::fabs(x));
      EXPECT_GE(q.scale * max_code, max_abs) << "vector " << j << " clips";
      EXPECT_LE(q.scale, max_abs / max_code * (1.0f + 1.0f / 512)) << "vector " << j;
      for (size_t d = 0; d < q.values.size(); ++d) {
        const double x = bf16[i][j].values[d];
        const double step = testing::kv8_half_step(kv8, x / q.scale) * q.scale;
        const double error = std::fabs(double(q.values[d]) * q.scale - x);
        worst_steps = std::max(worst_steps, error / step);
        ASSERT_LE(error, step * (1 + 1e-5)) << "stream " << i << " vector " << j;
      }
    }
  }
  std::cout << "[ " << dtype_name(kv8) << "     ] largest error " << worst_steps << " half steps\n";

  // 8-bit -> bf16: the written 8-bit sequence, loaded into bf16
  const Sequence kv8_seq = sequence_of(test_spec(16, kv8), n, values);
  const auto kv8_src = read_back(
      [&] {
        Pool p = Pool::make(test_spec(16, kv8), n);
        p.put(kv8_seq);
        return p;
      }(),
      n);
  const auto back = read_back(convert(dir, kv8_seq, kv8, DType::BF16, n), n);
  for (size_t i = 0; i < back.size(); ++i) {
    for (size_t j = 0; j < back[i].size(); ++j) {
      for (size_t d = 0; d < back[i][j].values.size(); ++d) {
        const double exact = double(kv8_src[i][j].values[d]) * kv8_src[i][j].scale;
        ASSERT_LE(std::fabs(back[i][j].values[d] - exact), std::fabs(exact) / 256)
            << "stream " << i << " vector " << j;
      }
    }
  }
}

// int8 <-> fp8 on load: through f32, each within the target format's step of the source values.
TEST(CacheFileDtypes, Int8AndFp8ConvertIntoEachOther) {
  TempDir dir;
  const int64_t n = 45;
  const Values values(test_spec(16), n, 37);
  for (const auto& [from, to] : {std::pair{DType::I8, DType::FP8}, {DType::FP8, DType::I8}}) {
    SCOPED_TRACE(fmt::format("{} -> {}", dtype_name(from), dtype_name(to)));
    const Sequence seq = sequence_of(test_spec(16, from), n, values);
    Pool src_pool = Pool::make(test_spec(16, from), n);
    src_pool.put(seq);
    const auto src = read_back(src_pool, n);
    const auto got = read_back(convert(dir, seq, from, to, n), n);
    ASSERT_EQ(got.size(), src.size());
    for (size_t i = 0; i < got.size(); ++i) {
      for (size_t j = 0; j < got[i].size(); ++j) {
        for (size_t d = 0; d < got[i][j].values.size(); ++d) {
          const double x = double(src[i][j].values[d]) * src[i][j].scale;
          const double step = testing::kv8_half_step(to, x / got[i][j].scale) * got[i][j].scale;
          ASSERT_LE(std::fabs(double(got[i][j].values[d]) * got[i][j].scale - x), step * 1.0001)
              << "stream " << i << " vector " << j << " element " << d;
        }
      }
    }
  }
}

TEST(CacheFileDtypes, F32ToBf16AndBackWithinBf16Rounding) {
  TempDir dir;
  const int64_t n = 45;
  const Values values(test_spec(16), n, 41);
  const Sequence f32_seq = sequence_of(test_spec(16, DType::F32), n, values);
  const Pool as_bf16 = convert(dir, f32_seq, DType::F32, DType::BF16, n);
  const auto bf16 = read_back(as_bf16, n);
  for (int32_t layer = 0; layer < 4; ++layer) {
    for (int32_t which = 0; which < 2; ++which) {
      const std::vector<float>& truth = which == 0 ? values.k[layer] : values.v[layer];
      const std::vector<StoredVector>& got = bf16[size_t(layer) * 2 + which];
      for (size_t i = 0; i < truth.size(); ++i) {
        const float y = got[i / 8].values[i % 8];
        ASSERT_LE(std::fabs(y - truth[i]), std::fabs(truth[i]) / 256) << layer << " " << i;
      }
    }
  }
  // and back to f32: exactly the bf16 values
  Sequence bf16_seq(test_spec(16, DType::BF16), n, 5);
  for (int32_t layer = 0; layer < 4; ++layer) {
    const int64_t kept = test_spec(16).kept_tokens(layer, n);
    std::vector<std::byte> k(as_bf16.storage.dense_bytes(kept)), v(k.size());
    as_bf16.storage.gather_layer(layer, as_bf16.tables[test_spec(16).group_of_layer(layer)],
                                 n - kept, n, k, v);
    bf16_seq.k[layer] = k;
    bf16_seq.v[layer] = v;
  }
  bf16_seq.token_ids = f32_seq.token_ids;
  const auto f32 = read_back(convert(dir, bf16_seq, DType::BF16, DType::F32, n), n);
  ASSERT_EQ(f32.size(), bf16.size());
  for (size_t i = 0; i < f32.size(); ++i) {
    for (size_t j = 0; j < f32[i].size(); ++j) EXPECT_EQ(f32[i][j].values, bf16[i][j].values);
  }
}

TEST_P(CacheFileKv8, CorruptedScaleIsRefusedWithThePoolUntouched) {
  const DType kv8 = GetParam();
  TempDir dir;
  const int64_t n = 45;
  const Values values(test_spec(16), n, 51);
  const Sequence seq = sequence_of(test_spec(16, kv8), n, values);
  Pool src = Pool::make(test_spec(16, kv8), n);
  src.put(seq);
  const fs::path good = dir.path() / "good.kvc";
  ASSERT_TRUE(write_cache_file(good, kModel, src.storage, seq.token_ids, src.tables).is_ok());
  const std::vector<std::byte> bytes = read_bytes(good);
  // The scale of layer 0's first K vector: after the header, the token ids and its 8 values.
  const size_t scale_at = 88 + 4 * n + 8;
  for (size_t at : {scale_at, scale_at + 1}) {
    std::vector<std::byte> bad = bytes;
    bad[at] ^= std::byte{0x04};
    const fs::path path = dir.path() / "bad.kvc";
    write_bytes(path, bad);
    for (DType running : {kv8, DType::BF16}) {  // with and without a conversion
      Pool pool = Pool::make(test_spec(4, running), n);
      const auto before = pool.snapshot();
      const Status s = load_cache_file(path, kModel, pool.storage, pool.tables);
      EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.to_string();
      EXPECT_NE(s.message().find("checksum mismatch"), std::string::npos) << s.message();
      EXPECT_EQ(pool.snapshot(), before) << dtype_name(running);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kv8, CacheFileKv8, ::testing::Values(DType::I8, DType::FP8),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace kvp

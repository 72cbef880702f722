// FileWriter (engine/file_writer.h): cache files written on its thread read back as written
// (CacheFile, kvpool's own validating reader), in submission order with increasing ids; a write
// that cannot happen reports an error naming the file; wait and drain block until writes end.
#include "engine/file_writer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fmt/format.h>

namespace kvp {
namespace {

namespace fs = std::filesystem;

CacheSpec spec() {
  return CacheSpec::create("test", 2, 1, 4, DType::F32, 4,
                           {LayerAttention::global(), LayerAttention::global()})
      .value();
}

TEST(FileWriter, WritesReadBackInOrderAndFailuresNameTheFile) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("kvp-file-writer-{}", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  const CacheSpec s = spec();
  HostKvStorage storage = HostKvStorage::create(s, std::vector<int32_t>{2}).value();
  for (size_t i = 0; i < storage.slab(0).size() / sizeof(float); ++i) {
    reinterpret_cast<float*>(storage.slab(0).data())[i] = 0.25f * float(i);
  }
  const std::vector<std::vector<BlockId>> tables = {{BlockId{1}, BlockId{0}}};
  const ModelFingerprint fingerprint{"test", 42};
  FileWriter writer;
  std::vector<uint64_t> ids;
  for (int i = 0; i < 3; ++i) {
    FileWriter::Job job;
    job.path = dir / fmt::format("f{}.kvc", i);
    job.fingerprint = fingerprint;
    job.storage = &storage;
    job.tables = &tables;
    job.tokens = {1, 2, 3, 4, 5, 6, int32_t(i)};
    ids.push_back(writer.submit(std::move(job)));
  }
  FileWriter::Job bad;
  bad.path = dir / "no-such-folder" / "x.kvc";
  bad.fingerprint = fingerprint;
  bad.storage = &storage;
  bad.tables = &tables;
  bad.tokens = {1};
  const uint64_t bad_id = writer.submit(std::move(bad));
  EXPECT_LT(ids[0], ids[1]);
  EXPECT_LT(ids[2], bad_id);
  const Status failed = writer.wait(bad_id);  // the last: every earlier write has ended too
  EXPECT_FALSE(failed.is_ok());
  EXPECT_NE(failed.message().find("no-such-folder"), std::string::npos) << failed.to_string();
  writer.drain();
  auto done = writer.poll();
  ASSERT_EQ(done.size(), 3u);  // the waited-for one is not reported again
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(done[i].first, ids[i]);
    EXPECT_TRUE(done[i].second.is_ok()) << done[i].second.to_string();
    auto file = CacheFile::read(dir / fmt::format("f{}.kvc", i), fingerprint, s);
    ASSERT_TRUE(file.is_ok()) << file.status().to_string();
    EXPECT_EQ(file->num_tokens(), 7);
    EXPECT_EQ(file->token_ids().back(), int32_t(i));
    HostKvStorage back = HostKvStorage::create(s, std::vector<int32_t>{2}).value();
    ASSERT_TRUE(file->check_tables(back, tables).is_ok());
    file->scatter_into(back, tables);
    // tokens 0..6 over blocks 1, 0: every byte of both blocks but the last token of block 0
    const auto* a = reinterpret_cast<const float*>(storage.slab(0).data());
    const auto* b = reinterpret_cast<const float*>(back.slab(0).data());
    const KvLayout& l = storage.layout(0);
    for (int32_t layer = 0; layer < 2; ++layer) {
      for (int32_t t = 0; t < 7; ++t) {
        const int32_t block = tables[0][t / 4].value;
        for (int32_t kv = 0; kv < 2; ++kv) {
          const int64_t off = l.elem_offset(layer, block, kv, 0, t % 4);
          for (int32_t d = 0; d < 4; ++d) EXPECT_EQ(a[off + d], b[off + d]);
        }
      }
    }
  }
  EXPECT_TRUE(writer.poll().empty());
  fs::remove_all(dir);
}

// Removals run on the worker in submission order with the writes: a file written then removed
// is gone, one removed then written again at the same path exists, and nothing is reported.
TEST(FileWriter, RemovalsRunInOrderWithTheWrites) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("kvp-file-remove-{}", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  const CacheSpec s = spec();
  HostKvStorage storage = HostKvStorage::create(s, std::vector<int32_t>{1}).value();
  const std::vector<std::vector<BlockId>> tables = {{BlockId{0}}};
  const auto job = [&](const fs::path& path) {
    FileWriter::Job j;
    j.path = path;
    j.fingerprint = ModelFingerprint{"test", 7};
    j.storage = &storage;
    j.tables = &tables;
    j.tokens = {1, 2, 3};
    return j;
  };
  FileWriter writer;
  const fs::path gone = dir / "gone.kvc", again = dir / "again.kvc";
  const uint64_t first = writer.submit(job(gone));
  writer.remove(gone);
  writer.submit(job(again));
  writer.remove(again);
  const uint64_t last = writer.submit(job(again));
  writer.remove(dir / "never-written.kvc");  // best effort: no error, nothing reported
  writer.drain();
  EXPECT_FALSE(fs::exists(gone));
  EXPECT_TRUE(fs::exists(again));
  const auto done = writer.poll();
  ASSERT_EQ(done.size(), 3u);  // the writes only
  EXPECT_EQ(done.front().first, first);
  EXPECT_EQ(done.back().first, last);
  for (const auto& [id, status] : done) EXPECT_TRUE(status.is_ok()) << status.to_string();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kvp

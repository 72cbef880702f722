// Disk-tier faults (issue 15): while the engine runs, another process damages, truncates,
// empties, deletes or swaps the spill files of idle sessions. Every session's next turn must
// give exactly the reply of an undamaged run (the engine finds the file bad, drops the KV and
// recomputes the history), every fault is one tier error, the untouched session still comes
// back from disk, check_integrity() holds after every step (it aborted on a deleted file), and
// nothing is left in the spill directory.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_test_util.h"

using namespace kvp::engine_test;  // NOLINT(google-build-using-namespace)

namespace kvp {
namespace {

namespace fs = std::filesystem;

enum class Fault {
  kNone,
  kFlippedByte,    // one byte of the KV data changed (the checksum tells)
  kFlippedHeader,  // one byte of the header changed (the geometry or the name tells)
  kTruncated,      // cut to half its size
  kEmptied,        // 0 bytes
  kDeleted,
  kSwapped,    // exchanged with the next session's file (whose fault is kSwapped too)
  kDirectory,  // replaced by a directory of the same name
};

const char* fault_name(Fault f) {
  switch (f) {
    case Fault::kNone:
      return "none";
    case Fault::kFlippedByte:
      return "flipped byte";
    case Fault::kFlippedHeader:
      return "flipped header byte";
    case Fault::kTruncated:
      return "truncated";
    case Fault::kEmptied:
      return "emptied";
    case Fault::kDeleted:
      return "deleted";
    case Fault::kSwapped:
      return "swapped";
    case Fault::kDirectory:
      return "replaced by a directory";
  }
  return "?";
}

// One fault per session; the swapped pair is two sessions.
constexpr Fault kFaults[] = {Fault::kNone,      Fault::kFlippedByte, Fault::kFlippedHeader,
                             Fault::kTruncated, Fault::kEmptied,     Fault::kDeleted,
                             Fault::kSwapped,   Fault::kSwapped,     Fault::kDirectory};
constexpr int kSessions = static_cast<int>(std::size(kFaults));

void flip_byte(const fs::path& path, uintmax_t at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  const char c = static_cast<char>(f.get());
  f.seekp(static_cast<std::streamoff>(at));
  f.put(static_cast<char>(c ^ 0x5a));
}

// The spill files of the directory by session id: the engine names them
// kvpool-<pid>-<instance>-session-<id>-<n>.kvc (n: the engine's count of spill files), and ids
// count sessions from 1 in creation order.
std::map<int, fs::path> spill_files(const fs::path& dir) {
  std::map<int, fs::path> out;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    const size_t at = name.rfind("-session-");
    if (at == std::string::npos || !name.ends_with(".kvc")) continue;
    out[std::stoi(name.substr(at + 9))] = entry.path();
  }
  return out;
}

void apply(Fault fault, const fs::path& file, const fs::path& partner) {
  switch (fault) {
    case Fault::kNone:
      break;
    case Fault::kFlippedByte:
      flip_byte(file, fs::file_size(file) * 2 / 3);
      break;
    case Fault::kFlippedHeader:
      flip_byte(file, 12);  // the architecture name's length
      break;
    case Fault::kTruncated:
      fs::resize_file(file, fs::file_size(file) / 2);
      break;
    case Fault::kEmptied:
      fs::resize_file(file, 0);
      break;
    case Fault::kDeleted:
      fs::remove(file);
      break;
    case Fault::kSwapped: {
      const fs::path temp = file.string() + ".swap";
      fs::rename(file, temp);
      fs::rename(partner, file);
      fs::rename(temp, partner);
      break;
    }
    case Fault::kDirectory:
      fs::remove(file);
      fs::create_directory(file);
      break;
  }
}

std::vector<int32_t> first_turn(int session) {
  std::vector<int32_t> prompt;
  for (int i = 0; i < 18 + session; ++i) prompt.push_back(3 + (i * 7 + session * 13) % 250);
  return prompt;
}

class EngineTierFaultTest : public ::testing::TestWithParam<const char*> {};

TEST_P(EngineTierFaultTest, DamagedSpillFilesAreRecomputedToTheUndamagedReplies) {
  const char* model = GetParam();
  auto runner = load(model);
  const fs::path dir =
      fs::temp_directory_path() / ("kvp-tier-faults-" + std::to_string(::getpid()) + "-" + model);
  fs::remove_all(dir);
  EngineConfig config = small_config(128);
  config.disk_dir = dir.string();
  config.disk_tier_bytes = 64 << 20;
  CpuForwardBackend backend(runner);
  Engine engine(&backend, config);

  // turn 1 of every session, then other work that pushes them all out of the pool to disk
  std::vector<std::vector<int32_t>> history(kSessions);
  for (int s = 0; s < kSessions; ++s) {
    Request r = greedy_request(first_turn(s), 6);
    r.session = "agent" + std::to_string(s);
    auto id = engine.submit(r);
    ASSERT_TRUE(id.is_ok()) << id.status().to_string();
    auto out = run_all(engine);
    history[s] = first_turn(s);
    history[s].insert(history[s].end(), out[id->value].tokens.begin(), out[id->value].tokens.end());
  }
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(engine.submit(greedy_request(std::vector<int32_t>(150, 10 + i), 20)).is_ok());
  }
  run_all(engine);
  engine.settle_tier_moves();  // the spill files are written on a thread of their own
  for (const EngineSessionInfo& info : engine.sessions()) {
    ASSERT_EQ(info.tier, SessionTier::kDisk) << info.name;
  }
  std::map<int, fs::path> files = spill_files(dir);
  ASSERT_EQ(static_cast<int>(files.size()), kSessions);

  // the faults, from outside the engine; its own checks must not abort on them
  for (int s = 0; s < kSessions; ++s) {
    const fs::path partner = s + 1 < kSessions ? files[s + 2] : fs::path();
    if (kFaults[s] == Fault::kSwapped && s > 0 && kFaults[s - 1] == Fault::kSwapped) continue;
    apply(kFaults[s], files[s + 1], partner);
  }
  engine.check_integrity();

  // turn 2 of every session, all in one batch
  const EngineStats before = engine.stats();
  std::vector<std::pair<int64_t, std::vector<int32_t>>> turns(kSessions);
  for (int s = 0; s < kSessions; ++s) {
    const std::vector<int32_t> turn2 = {7, 8, static_cast<int32_t>(9 + s)};
    Request r = greedy_request(turn2, 8);
    r.session = "agent" + std::to_string(s);
    auto id = engine.submit(r);
    ASSERT_TRUE(id.is_ok()) << id.status().to_string();
    turns[s] = {id->value, turn2};
  }
  auto out = run_all(engine);  // check_integrity() after every step
  const EngineStats after = engine.stats();

  int num_faulted = 0;
  for (int s = 0; s < kSessions; ++s) {
    SCOPED_TRACE(fault_name(kFaults[s]));
    std::vector<int32_t> whole = history[s];
    whole.insert(whole.end(), turns[s].second.begin(), turns[s].second.end());
    CpuForwardBackend reference_backend(runner);
    Engine reference(&reference_backend, small_config(256));
    auto id = reference.submit(greedy_request(whole, 8));
    ASSERT_TRUE(id.is_ok());
    EXPECT_EQ(out[turns[s].first].tokens, run_all(reference)[id->value].tokens);
    num_faulted += kFaults[s] != Fault::kNone;
  }
  // each damaged file is one tier error and one eviction; the untouched one came back
  EXPECT_EQ(after.num_tier_errors - before.num_tier_errors, num_faulted);
  EXPECT_EQ(after.num_session_evictions - before.num_session_evictions, num_faulted);
  EXPECT_EQ(after.num_session_restores - before.num_session_restores, kSessions - num_faulted);
  EXPECT_EQ(after.disk_tier_bytes_used, 0u);
  // what is left in the directory is what the faults put there, not the engine's files
  for (const auto& entry : fs::directory_iterator(dir)) {
    EXPECT_TRUE(entry.is_directory()) << entry.path() << " left behind";
  }
  engine.check_integrity();
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Models, EngineTierFaultTest, ::testing::Values("llama", "gemma3"));

// A disk-tier directory that is a regular file made every spill fail: the tier was silently off.
TEST(EngineTierFaults, ADiskDirectoryThatIsAFileIsRefused) {
  const fs::path file = fs::temp_directory_path() / ("kvp-not-a-dir-" + std::to_string(::getpid()));
  std::ofstream(file) << "x";
  EngineConfig config = small_config(64);
  config.disk_dir = file.string();
  config.disk_tier_bytes = 1 << 20;
  const Status s = config.validate();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("the disk tier directory '" + file.string() + "' is not a directory"),
            std::string::npos)
      << s.to_string();
  fs::remove(file);
}

}  // namespace
}  // namespace kvp

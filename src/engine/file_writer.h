// FileWriter: writes cache files on a thread of its own, so that a session moving to the disk
// tier costs the engine loop only the copy out of the pool (docs/engine.md, "Session tiers").
//
//   engine loop ──submit(path, kv, tokens)──▶ queue ──worker: write_cache_file──▶ done list
//               ◀──────────────poll() / wait(id): statuses of finished writes──────┘
//
// The caller keeps the host copy alive and unchanged until its write is reported (poll or wait):
// the worker only reads it. Writes run in submission order; each is write_cache_file's temporary
// file + fsync + rename, so a crash leaves the old file or the new one. Files the engine no
// longer needs are removed here too (remove), in the same order: unlinking a big file waits on
// the file system's journal behind the writes' fsyncs, tens of milliseconds the engine loop
// would otherwise spend.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <mutex>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "cache/cache_file.h"
#include "cache/host_kv_storage.h"
#include "common/status.h"

namespace kvp {

class FileWriter {
 public:
  struct Job {
    std::filesystem::path path;
    ModelFingerprint fingerprint;
    const HostKvStorage* storage = nullptr;                     // read only, alive until reported
    const std::vector<std::vector<BlockId>>* tables = nullptr;  // the same
    std::vector<int32_t> tokens;
    bool remove = false;  // only remove `path` (FileWriter::remove)
  };

  FileWriter();
  ~FileWriter();  // finishes the queued writes
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;

  // Queues a write; returns its id (> 0, increasing).
  uint64_t submit(Job job);
  // Writes finished since the last poll: (id, status), in order.
  std::vector<std::pair<uint64_t, Status>> poll();
  // Blocks until write `id` has finished; its status (then no longer reported by poll).
  Status wait(uint64_t id);
  // Queues the removal of a file, after the writes queued before it (a later write to the same
  // path happens after it). Best effort: a file already gone or not removable is left as is;
  // nothing is reported.
  void remove(std::filesystem::path path);
  // Blocks until every queued write and removal has finished (poll reports the writes).
  void drain();
  // Writes and removals queued or under way.
  int64_t num_unfinished();

 private:
  void run();

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::pair<uint64_t, Job>> queue_;
  std::vector<std::pair<uint64_t, Status>> done_;
  uint64_t next_id_ = 1;
  int64_t num_unfinished_ = 0;  // queued or being written
  bool stop_ = false;
  std::thread worker_;  // last: starts after the members it uses
};

}  // namespace kvp

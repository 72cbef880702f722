// FileWriter (file_writer.h): one worker thread writing cache files in submission order.
#include "engine/file_writer.h"

#include <algorithm>

namespace kvp {

FileWriter::FileWriter() : worker_([this] { run(); }) {}

FileWriter::~FileWriter() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  worker_.join();
}

uint64_t FileWriter::submit(Job job) {
  uint64_t id = 0;
  {
    std::lock_guard lock(mutex_);
    id = next_id_++;
    ++num_unfinished_;
    queue_.emplace_back(id, std::move(job));
  }
  changed_.notify_all();
  return id;
}

void FileWriter::remove(std::filesystem::path path) {
  Job job;
  job.path = std::move(path);
  job.remove = true;
  {
    std::lock_guard lock(mutex_);
    ++num_unfinished_;
    queue_.emplace_back(0, std::move(job));  // id 0: not reported
  }
  changed_.notify_all();
}

std::vector<std::pair<uint64_t, Status>> FileWriter::poll() {
  std::lock_guard lock(mutex_);
  return std::exchange(done_, {});
}

Status FileWriter::wait(uint64_t id) {
  std::unique_lock lock(mutex_);
  for (;;) {
    auto it =
        std::find_if(done_.begin(), done_.end(), [id](const auto& d) { return d.first == id; });
    if (it != done_.end()) {
      Status st = std::move(it->second);
      done_.erase(it);
      return st;
    }
    changed_.wait(lock);
  }
}

void FileWriter::drain() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [this] { return num_unfinished_ == 0; });
}

int64_t FileWriter::num_unfinished() {
  std::lock_guard lock(mutex_);
  return num_unfinished_;
}

void FileWriter::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    changed_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_, nothing left
    auto [id, job] = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    if (job.remove) {
      std::error_code ec;
      std::filesystem::remove(job.path, ec);
      lock.lock();
      --num_unfinished_;
      changed_.notify_all();
      continue;
    }
    Status st = write_cache_file(job.path, job.fingerprint, *job.storage, job.tokens, *job.tables);
    lock.lock();
    done_.emplace_back(id, std::move(st));
    --num_unfinished_;
    changed_.notify_all();
  }
}

}  // namespace kvp

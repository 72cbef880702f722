#include "common/thread_pool.h"

#include "common/check.h"

namespace kvp {

ThreadPool::ThreadPool(int num_threads) {
  KVP_CHECK(num_threads >= 1, "thread pool of {} threads", num_threads);
  workers_.reserve(static_cast<size_t>(num_threads - 1));
  for (int t = 1; t < num_threads; ++t) workers_.emplace_back([this, t] { worker_loop(t); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& w : workers_) w.join();
}

void ThreadPool::drain(int thread) {
  for (;;) {
    const int64_t item = next_item_.fetch_add(1, std::memory_order_relaxed);
    if (item >= num_items_) return;
    fn_(ctx_, item, thread);
  }
}

void ThreadPool::run(int64_t num_items, ItemFn fn, void* ctx) {
  if (num_items <= 0) return;
  if (workers_.empty() || num_items == 1) {
    for (int64_t i = 0; i < num_items; ++i) fn(ctx, i, 0);
    return;
  }
  {
    std::lock_guard lock(mutex_);
    KVP_CHECK(active_workers_ == 0, "parallel_for called while another is running");
    fn_ = fn;
    ctx_ = ctx;
    num_items_ = num_items;
    next_item_.store(0, std::memory_order_relaxed);
    active_workers_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  wake_.notify_all();
  drain(0);
  std::unique_lock lock(mutex_);
  finished_.wait(lock, [this] { return active_workers_ == 0; });
}

void ThreadPool::worker_loop(int thread) {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    drain(thread);
    {
      std::lock_guard lock(mutex_);
      if (--active_workers_ == 0) finished_.notify_one();
    }
  }
}

}  // namespace kvp

#include "common/thread_pool.h"

#include <chrono>

#include "common/check.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace kvp {

namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Spins until done() or `micros` have passed; returns done().
template <typename Done>
bool spin_until(Done&& done, int micros) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(micros);
  for (int i = 1;; ++i) {
    if (done()) return true;
    cpu_relax();
    if (i % 64 == 0 && std::chrono::steady_clock::now() >= deadline) return done();
  }
}

}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  KVP_CHECK(num_threads >= 1, "thread pool of {} threads", num_threads);
  workers_.reserve(static_cast<size_t>(num_threads - 1));
  for (int t = 1; t < num_threads; ++t) workers_.emplace_back([this, t] { worker_loop(t); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  for (std::thread& w : workers_) w.join();
}

void ThreadPool::drain(int thread) {
  for (;;) {
    const uint64_t claim = cursor_.fetch_add(1, std::memory_order_acq_rel);
    const int64_t num_items = static_cast<int64_t>(claim >> 32);
    const int64_t item = static_cast<int64_t>(claim & 0xffffffffu);
    if (item >= num_items) return;
    fn_(ctx_, item, thread);
    if (done_items_.fetch_add(1, std::memory_order_acq_rel) + 1 == num_items) {
      std::lock_guard lock(mutex_);  // the caller checks `done` under the mutex before blocking
      finished_.notify_one();
    }
  }
}

void ThreadPool::run(int64_t num_items, ItemFn fn, void* ctx) {
  if (num_items <= 0) return;
  if (workers_.empty() || num_items == 1) {
    for (int64_t i = 0; i < num_items; ++i) fn(ctx, i, 0);
    return;
  }
  KVP_CHECK(num_items < (int64_t{1} << 31), "parallel_for over {} items", num_items);
  // Every claim of the previous job has failed or returned (done_items_ reached its count), so
  // no worker reads fn_ or ctx_ until the store below publishes them.
  fn_ = fn;
  ctx_ = ctx;
  done_items_.store(0, std::memory_order_relaxed);
  cursor_.store(static_cast<uint64_t>(num_items) << 32, std::memory_order_release);
  {
    std::lock_guard lock(mutex_);
    generation_.fetch_add(1, std::memory_order_release);  // wakes spinners and sleepers
  }
  wake_.notify_all();
  drain(0);
  const auto done = [&] { return done_items_.load(std::memory_order_acquire) == num_items; };
  if (spin_until(done, kSpinMicros)) return;
  std::unique_lock lock(mutex_);
  finished_.wait(lock, done);
}

void ThreadPool::worker_loop(int thread) {
  uint64_t seen = 0;
  for (;;) {
    const auto has_job = [&] { return generation_.load(std::memory_order_acquire) != seen; };
    if (!spin_until(has_job, kSpinMicros)) {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, has_job);
    }
    {
      std::lock_guard lock(mutex_);
      if (stop_) return;
    }
    seen = generation_.load(std::memory_order_acquire);
    drain(thread);
  }
}

}  // namespace kvp

// A small fixed pool of worker threads with a blocking parallel-for, for kernels (attention,
// GEMM) that split work into coarse independent items. The calling thread takes part, so a
// pool of N threads starts N - 1 workers. Not re-entrant: parallel_for must not be called from
// inside an item, and one pool runs one parallel_for at a time.
//
// A decode step calls parallel_for a few hundred times, microseconds apart, so waking a worker
// through a condition variable (tens of microseconds) would cost more than the work: workers
// and the caller first spin on an atomic for up to kSpinMicros, and only then block.
// The caller waits for the items, not for the workers: a worker that is asleep or descheduled
// when a job starts (another process on its core) takes no item, and the caller, which takes
// items too, does not wait for it to wake. Items are claimed from one atomic word that holds
// the job's item count beside the next item, so a worker that arrives after the job ended fails
// its claim (or takes an item of the next job) without reading a stale job.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace kvp {

class ThreadPool {
 public:
  // requires: num_threads >= 1. Starts num_threads - 1 workers.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Threads taking part in a parallel_for, the caller included.
  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(item, thread) once for every item in [0, num_items), spread over the threads;
  // thread is in [0, num_threads()) and no two concurrent calls share it (per-thread scratch).
  // Returns when every call has returned. Items are handed out one at a time, in order.
  template <typename Fn>
  void parallel_for(int64_t num_items, Fn&& fn) {
    using F = std::remove_reference_t<Fn>;
    run(
        num_items,
        [](void* ctx, int64_t item, int thread) { (*static_cast<F*>(ctx))(item, thread); },
        const_cast<void*>(static_cast<const void*>(&fn)));
  }

 private:
  using ItemFn = void (*)(void* ctx, int64_t item, int thread);
  void run(int64_t num_items, ItemFn fn, void* ctx);
  void worker_loop(int thread);
  // Claims and runs the current job's items until none is left.
  void drain(int thread);

  // How long a worker waiting for a job, or the caller waiting for the workers, spins before
  // it blocks.
  static constexpr int kSpinMicros = 100;

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;      // workers block here for a new job or stop
  std::condition_variable finished_;  // the caller blocks here for the job's last item
  // Bumped per job (and at stop) under mutex_, read by spinning workers without it.
  std::atomic<uint64_t> generation_{0};
  bool stop_ = false;  // guarded by mutex_
  // The current job: num_items << 32 | next item. Stored (release) after fn_ and ctx_ are
  // written; a claim (fetch_add) below num_items may read them until that item is done.
  std::atomic<uint64_t> cursor_{0};
  std::atomic<int64_t> done_items_{0};  // items of the current job that have returned
  ItemFn fn_ = nullptr;
  void* ctx_ = nullptr;
};

// Runs fn(item, 0) for every item on the calling thread when pool is null, else
// pool->parallel_for(num_items, fn).
template <typename Fn>
void parallel_for(ThreadPool* pool, int64_t num_items, Fn&& fn) {
  if (pool == nullptr) {
    for (int64_t i = 0; i < num_items; ++i) fn(i, 0);
  } else {
    pool->parallel_for(num_items, fn);
  }
}

}  // namespace kvp

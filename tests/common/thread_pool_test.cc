// ThreadPool: every item runs exactly once, on a thread index in range, for many jobs in a row.
#include "common/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

namespace kvp {
namespace {

TEST(ThreadPool, EveryItemRunsOnceOnAThreadInRange) {
  for (int num_threads : {1, 2, 5}) {
    ThreadPool pool(num_threads);
    EXPECT_EQ(pool.num_threads(), num_threads);
    for (int64_t num_items : {0, 1, 2, 7, 1000}) {
      std::vector<std::atomic<int>> calls(static_cast<size_t>(num_items));
      std::atomic<bool> bad_thread{false};
      pool.parallel_for(num_items, [&](int64_t item, int thread) {
        calls[static_cast<size_t>(item)].fetch_add(1);
        if (thread < 0 || thread >= num_threads) bad_thread = true;
      });
      for (int64_t i = 0; i < num_items; ++i) {
        EXPECT_EQ(calls[static_cast<size_t>(i)].load(), 1) << "item " << i;
      }
      EXPECT_FALSE(bad_thread.load());
    }
  }
}

TEST(ThreadPool, ManyJobsInARowAndConcurrentThreadsHaveDistinctIndices) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> in_use(3);
  std::atomic<int64_t> total{0};
  std::atomic<bool> shared_index{false};
  for (int job = 0; job < 500; ++job) {
    pool.parallel_for(16, [&](int64_t item, int thread) {
      if (in_use[static_cast<size_t>(thread)].fetch_add(1) != 0) shared_index = true;
      total += item;
      in_use[static_cast<size_t>(thread)].fetch_sub(1);
    });
  }
  EXPECT_EQ(total.load(), 500 * (15 * 16 / 2));
  EXPECT_FALSE(shared_index.load());
}

// More threads than items, jobs microseconds apart: workers often arrive after a job has ended
// and must then fail their claim or take an item of the next job, never rerun or skip one.
TEST(ThreadPool, ShortJobsWithMoreThreadsThanItemsRunEveryItemOnce) {
  ThreadPool pool(5);
  std::vector<std::atomic<int>> calls(3);
  for (int job = 0; job < 20000; ++job) {
    const int64_t num_items = 2 + job % 2;
    pool.parallel_for(num_items,
                      [&](int64_t item, int) { calls[static_cast<size_t>(item)].fetch_add(1); });
  }
  EXPECT_EQ(calls[0].load(), 20000);
  EXPECT_EQ(calls[1].load(), 20000);
  EXPECT_EQ(calls[2].load(), 10000);
}

TEST(ThreadPool, NullPoolRunsInline) {
  std::vector<int> seen;
  parallel_for(nullptr, 4, [&](int64_t item, int thread) {
    EXPECT_EQ(thread, 0);
    seen.push_back(static_cast<int>(item));
  });
  EXPECT_EQ(seen, (std::vector<int>{0, 1, 2, 3}));
}

}  // namespace
}  // namespace kvp

#include "common/parallel_memcpy.h"

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

namespace kvp {

void parallel_memcpy(void* dst, const void* src, size_t bytes, int max_threads) {
  const size_t num_threads =
      std::clamp<size_t>(bytes / kParallelMemcpyMinChunkBytes, 1, size_t(std::max(max_threads, 1)));
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
  if (num_threads == 1) {
    if (bytes > 0) std::memcpy(d, s, bytes);
    return;
  }
  const size_t chunk = (bytes / num_threads + 63) & ~size_t{63};
  std::vector<std::thread> threads;
  for (size_t i = 1; i < num_threads; ++i) {
    const size_t begin = std::min(bytes, i * chunk), end = std::min(bytes, (i + 1) * chunk);
    if (begin < end) threads.emplace_back([=] { std::memcpy(d + begin, s + begin, end - begin); });
  }
  std::memcpy(d, s, std::min(bytes, chunk));
  for (std::thread& t : threads) t.join();
}

void parallel_memcpy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                        size_t row_bytes, size_t rows, int max_threads) {
  const size_t num_threads = std::clamp<size_t>(row_bytes * rows / kParallelMemcpyMinChunkBytes, 1,
                                                std::min(rows, size_t(std::max(max_threads, 1))));
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
  const auto copy_rows = [=](size_t begin, size_t end) {
    for (size_t r = begin; r < end; ++r)
      std::memcpy(d + r * dst_pitch, s + r * src_pitch, row_bytes);
  };
  const size_t per_thread =
      (rows + std::max<size_t>(num_threads, 1) - 1) / std::max<size_t>(num_threads, 1);
  std::vector<std::thread> threads;
  for (size_t i = 1; i < num_threads; ++i) {
    const size_t begin = std::min(rows, i * per_thread), end = std::min(rows, (i + 1) * per_thread);
    if (begin < end) threads.emplace_back(copy_rows, begin, end);
  }
  copy_rows(0, std::min(rows, per_thread));
  for (std::thread& t : threads) t.join();
}

}  // namespace kvp

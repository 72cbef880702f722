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

}  // namespace kvp

// HostTier (host_tier.h): slabs and free lists of the host session tier.
#include "engine/host_tier.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "common/check.h"

namespace kvp {

HostTier::HostTier(HostKvStorage storage, bool populate)
    : storage_(std::move(storage)), populate_(populate) {
  for (int32_t g = 0; g < storage_.num_groups(); ++g) {
    const int32_t n = storage_.layout(g).num_blocks;
    std::vector<BlockId> ids;
    ids.reserve(n);
    for (int32_t b = n - 1; b >= 0; --b) ids.push_back(BlockId{b});  // block 0 goes out first
    free_.push_back(std::move(ids));
    if (populate_) populated_.emplace_back(static_cast<size_t>(n), false);
  }
}

void HostTier::populate(int32_t g, std::span<const BlockId> ids) {
#ifdef MADV_POPULATE_WRITE
  const KvLayout& layout = storage_.layout(g);
  const size_t elem = dtype_size_bytes(layout.dtype);
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const auto base = reinterpret_cast<uintptr_t>(storage_.slab(g).data());
  std::vector<bool>& done = populated_[g];
  for (size_t i = 0; i < ids.size() && populate_;) {
    if (done[ids[i].value]) {
      ++i;
      continue;
    }
    size_t n = 1;  // a run of consecutive blocks not populated yet
    while (i + n < ids.size() && ids[i + n].value == ids[i].value + int32_t(n) &&
           !done[ids[i + n].value]) {
      ++n;
    }
    for (int32_t layer = 0; layer < layout.num_layers && populate_; ++layer) {
      const uintptr_t begin = base + layout.block_offset(layer, ids[i].value, 0) * elem;
      const uintptr_t end = begin + n * layout.block_pitch() * elem;
      const uintptr_t first = begin / page * page, last = (end + page - 1) / page * page;
      // the contents stay as they are (other blocks share the edge pages): only mapped
      if (::madvise(reinterpret_cast<void*>(first), last - first, MADV_POPULATE_WRITE) != 0) {
        populate_ = false;  // an older kernel (EINVAL) or no memory now: copies fault instead
      }
    }
    for (size_t k = 0; k < n; ++k) done[ids[i + k].value] = true;
    i += n;
  }
#else
  (void)g;
  (void)ids;
  populate_ = false;
#endif
}

Result<std::unique_ptr<HostTier>> HostTier::create(const CacheSpec& spec, uint64_t budget_bytes,
                                                   const HostKvStorage::SlabAllocator* allocator) {
  if (budget_bytes == 0) return Status::invalid_argument("host tier: a budget of 0 bytes");
  std::vector<int32_t> num_blocks;
  for (int32_t g = 0; g < spec.num_groups(); ++g) {
    const uint64_t n = budget_bytes / spec.block_bytes(g);
    num_blocks.push_back(
        static_cast<int32_t>(std::min<uint64_t>(n, std::numeric_limits<int32_t>::max())));
  }
  auto storage =
      HostKvStorage::create(spec, num_blocks, HostKvStorage::Init::kUninitialized, allocator);
  if (!storage.is_ok()) {
    return Status(storage.status().code(), fmt::format("host tier of {} bytes: {}", budget_bytes,
                                                       storage.status().message()));
  }
  return std::unique_ptr<HostTier>(
      new HostTier(std::move(storage).value(), /*populate=*/allocator == nullptr));
}

std::optional<std::vector<std::vector<BlockId>>> HostTier::allocate(
    std::span<const int32_t> num_blocks) {
  KVP_CHECK(static_cast<int32_t>(num_blocks.size()) == storage_.num_groups(),
            "{} block counts for {} groups", num_blocks.size(), storage_.num_groups());
  for (int32_t g = 0; g < storage_.num_groups(); ++g) {
    if (num_blocks[g] > num_free(g)) return std::nullopt;
  }
  std::vector<std::vector<BlockId>> blocks(num_blocks.size());
  for (int32_t g = 0; g < storage_.num_groups(); ++g) {
    for (int32_t i = 0; i < num_blocks[g]; ++i) {
      blocks[g].push_back(free_[g].back());
      free_[g].pop_back();
    }
    if (populate_) populate(g, blocks[g]);
  }
  return blocks;
}

void HostTier::release(std::span<const std::vector<BlockId>> blocks) {
  KVP_CHECK(static_cast<int32_t>(blocks.size()) == storage_.num_groups(),
            "{} block lists for {} groups", blocks.size(), storage_.num_groups());
  for (int32_t g = 0; g < storage_.num_groups(); ++g) {
    // in reverse, so the next allocation takes them in ascending order: runs stay runs
    for (auto it = blocks[g].rbegin(); it != blocks[g].rend(); ++it) {
      const BlockId b = *it;
      KVP_CHECK(b.value >= 0 && b.value < storage_.layout(g).num_blocks &&
                    num_free(g) < storage_.layout(g).num_blocks,
                "host tier group {}: release of block {}", g, b.value);
      free_[g].push_back(b);
    }
  }
}

}  // namespace kvp

// HostTier (host_tier.h): slabs and free lists of the host session tier.
#include "engine/host_tier.h"

#include <algorithm>
#include <limits>

#include "common/check.h"

namespace kvp {

HostTier::HostTier(HostKvStorage storage) : storage_(std::move(storage)) {
  for (int32_t g = 0; g < storage_.num_groups(); ++g) {
    const int32_t n = storage_.layout(g).num_blocks;
    std::vector<BlockId> ids;
    ids.reserve(n);
    for (int32_t b = n - 1; b >= 0; --b) ids.push_back(BlockId{b});  // block 0 goes out first
    free_.push_back(std::move(ids));
  }
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
  return std::unique_ptr<HostTier>(new HostTier(std::move(storage).value()));
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

// HostTier: the memory of the session tier "host" (docs/engine.md, "Session tiers"). One slab
// per cache group (HostKvStorage in the pool's layout, from the backend's slab allocator: pinned
// memory on CUDA, so a move is one DMA per run of blocks) and a free list of its blocks per
// group. A session's host copy is a set of these blocks (HostKv, below); the engine charges
// their bytes to the tier's budget, so however the groups share it, the blocks in use never
// exceed the budget. A copy on its way to a file, or read from one, is a HostKv of a storage of
// its own. A copy out of the pool may still be landing in a HostKv (HostKv::land).
//
//   engine ──allocate(n blocks per group)──▶ block ids ──start_transfers(pool ⇄ slab)──▶ backend
//          ◀──────────────────────release(block ids)──────────────────────────────┘
//
// Each group's slab can hold the whole budget in that group's blocks (a model with sliding-window
// layers keeps few blocks of its window groups per session, and how many is not known ahead):
// on the CPU, pages never used are never touched; pinned memory on a GPU host is pinned whole,
// once per group. Pageable slabs have the pages of a block populated when it is first handed
// out (madvise MADV_POPULATE_WRITE, one call per run of blocks and layer): a copy into pages
// never touched runs at a fifth of memcpy's rate on this machine, faulting page by page, and
// populating them first costs about what the copy then does. Not thread-safe; the engine loop
// owns it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "cache/cache_spec.h"
#include "cache/host_kv_storage.h"
#include "common/ids.h"
#include "common/status.h"
#include "model/forward_backend.h"

namespace kvp {

class HostTier {
 public:
  // Slabs for budget_bytes of blocks of each group of spec. invalid_argument for a zero budget;
  // resource_exhausted when the memory cannot be had (the message names the bytes).
  static Result<std::unique_ptr<HostTier>> create(const CacheSpec& spec, uint64_t budget_bytes,
                                                  const HostKvStorage::SlabAllocator* allocator);

  HostKvStorage& storage() { return storage_; }
  const HostKvStorage& storage() const { return storage_; }
  int32_t num_free(int32_t group) const { return static_cast<int32_t>(free_[group].size()); }

  // num_blocks[g] blocks of each group g, or nullopt (nothing taken) when a group lacks them.
  std::optional<std::vector<std::vector<BlockId>>> allocate(std::span<const int32_t> num_blocks);
  // Gives blocks back. requires: each was allocated and not yet released.
  void release(std::span<const std::vector<BlockId>> blocks);

 private:
  HostTier(HostKvStorage storage, bool populate);
  // Populates the pages of group g's blocks in `ids` not populated before (runs of consecutive
  // ids: one madvise per layer). Stops trying where the kernel lacks MADV_POPULATE_WRITE.
  void populate(int32_t g, std::span<const BlockId> ids);

  HostKvStorage storage_;
  std::vector<std::vector<BlockId>> free_;    // [num_groups] stacks: the last freed goes out first
  bool populate_;                             // pageable slabs: populate blocks at first use
  std::vector<std::vector<bool>> populated_;  // [num_groups][num_blocks] when populate_
};

// A session's KV out of the pool, block for block: group g's live block i of the sequence is
// block tables[g][i] of storage(); entries behind a window are kNoBlock. The blocks are the host
// tier's (tier != null: given back when the copy goes) or those of a storage of its own (a cache
// file read, a copy on its way to a file), densely numbered.
struct HostKv {
  static constexpr BlockId kNoBlock{-1};
  explicit HostKv(HostKvStorage storage) : own(std::move(storage)) {}
  HostKv(HostTier* host_tier, std::vector<std::vector<BlockId>> blocks)
      : tier(host_tier), tier_blocks(std::move(blocks)) {}
  HostKv(const HostKv&) = delete;
  HostKv& operator=(const HostKv&) = delete;
  ~HostKv() {
    (void)land();  // the device is done writing its blocks before they go
    if (tier != nullptr) tier->release(tier_blocks);
  }
  HostKvStorage& storage() { return tier != nullptr ? tier->storage() : *own; }
  const HostKvStorage& storage() const { return tier != nullptr ? tier->storage() : *own; }
  // Waits for the copy still writing these blocks, if any (landing): before the host reads them.
  // Copies into the pool need no wait: the backend orders them after it.
  Status land() {
    if (landing == 0) return Status::ok();
    const Status st = landing_on->wait_transfers(landing);
    landing = 0;
    return st;
  }

  HostTier* tier = nullptr;
  std::vector<std::vector<BlockId>> tier_blocks;  // [num_groups] of tier's blocks
  std::optional<HostKvStorage> own;               // when tier is null
  std::vector<std::vector<BlockId>> tables;       // [num_groups][ceil(num_tokens / block_size)]
  int32_t num_tokens = 0;
  int32_t window_valid_from = 0;  // see Sequence::window_valid_from
  uint64_t size_bytes = 0;        // of its blocks
  // the bytes the copy out of the pool that filled it moved (less than size_bytes where it
  // extended a session's kept copy: Engine::start_copy_out)
  uint64_t copied_bytes = 0;
  // A copy out of the pool still writing these blocks (Engine::copy_out_to_host: its pool
  // blocks were given back at once, the backend ordering steps after it): ticket on landing_on
  // (outlives this), 0 once landed.
  TransferTickets* landing_on = nullptr;
  uint64_t landing = 0;
};

}  // namespace kvp

// KvCacheManager: every sequence's block tables across a model's cache groups.
//
// A model's layers fall into cache groups by attention kind (Gemma 3: one group of global
// layers, one of sliding-window layers). Each group has its own pool (BlockAllocator) and, per
// sequence, its own BlockTable:
//
//   seq 7:  group 0 (global, W=0)    [ 3 | 8 | 1 | 12 | 5 ]      grows with the sequence
//           group 1 (window W=1024)  [ - | - | 4 | 9 | 2 ]       "-" dropped behind the window
//
// Sequence operations apply to all groups at once: append is all-or-nothing across groups.
// With a prefix salt, each group also has a PrefixCache, and a new sequence can start from the
// longest prompt prefix that every group can serve: a global group needs every block of the
// prefix cached, a window group only the blocks inside the window of the first new token
// (earlier entries start out dropped). The prefix length is a multiple of every block size.
// Configuration comes from the caller (a CacheSpec adapter); validate() turns bad numbers into a
// Status. Bookkeeping only; never touches KV bytes.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "cache/block_allocator.h"
#include "cache/block_ops.h"
#include "cache/block_table.h"
#include "cache/prefix_cache.h"
#include "common/ids.h"
#include "common/status.h"

namespace kvp {

struct CacheGroupConfig {
  int32_t num_blocks = 0;     // blocks in this group's pool
  int32_t block_size = 16;    // tokens per block, a power of two in [1, 1024]
  int32_t window_tokens = 0;  // sliding window in tokens; 0 = global attention
};

// A copy-on-write in one group's pool.
struct GroupBlockCopy {
  int32_t group = 0;
  BlockCopy copy;
  friend bool operator==(const GroupBlockCopy&, const GroupBlockCopy&) = default;
};

class KvCacheManager {
 public:
  // Ok, or invalid_argument naming the group and the bad field.
  static Status validate(const std::vector<CacheGroupConfig>& groups);
  // requires: validate(groups).is_ok(). prefix_salt: enables prefix caching; the salt names
  // the model (and adapter) so caches of different models never match.
  explicit KvCacheManager(std::vector<CacheGroupConfig> groups,
                          std::optional<uint64_t> prefix_salt = std::nullopt);
  ~KvCacheManager();
  KvCacheManager(const KvCacheManager&) = delete;
  KvCacheManager& operator=(const KvCacheManager&) = delete;

  int32_t num_groups() const { return static_cast<int32_t>(configs_.size()); }
  const CacheGroupConfig& group_config(int32_t group) const { return configs_.at(group); }
  BlockAllocator& allocator(int32_t group) { return *allocators_.at(group); }
  const BlockAllocator& allocator(int32_t group) const { return *allocators_.at(group); }

  bool has_prefix_cache() const { return !caches_.empty(); }
  // requires: has_prefix_cache(). A SessionStore may share the pools and caches.
  const PrefixCache& prefix_cache(int32_t group) const { return *caches_.at(group); }
  PrefixCache* prefix_cache(int32_t group) { return caches_.at(group).get(); }

  bool has_sequence(SeqId seq_id) const { return sequences_.contains(seq_id); }
  int32_t num_sequences() const { return static_cast<int32_t>(sequences_.size()); }
  // An empty sequence. requires: !has_sequence(seq_id). Mutates.
  void add_sequence(SeqId seq_id);
  // Whether append(seq_id, num_tokens) would succeed now. Does not modify.
  bool can_append(SeqId seq_id, int32_t num_tokens) const;
  // Grows the sequence by num_tokens in every group, or (returning false) in none. Copies to run
  // before the KV writes are appended to *copies. With prefix caching, pass the sequence's
  // tokens so far (their KV written): full blocks a window group is about to drop are
  // registered first, so they stay matchable. requires: has_sequence, copies != nullptr,
  // tokens empty or of size num_tokens(seq_id). Mutates.
  bool append(SeqId seq_id, int32_t num_tokens, std::vector<GroupBlockCopy>* copies,
              std::span<const int32_t> tokens = {});
  // child shares every block of parent in every group. requires: has_sequence(parent),
  // !has_sequence(child). Mutates ref counts.
  void fork(SeqId parent, SeqId child);
  // requires: has_sequence and the table of every group can_truncate(num_tokens). Mutates.
  void truncate(SeqId seq_id, int32_t num_tokens);
  // Releases every block of the sequence and forgets it. requires: has_sequence. Mutates.
  void free_sequence(SeqId seq_id);

  // Starts an empty sequence from the longest cached prefix of tokens[0, n-1) that every group
  // can serve (the last prompt token is always computed). Returns the number of tokens whose
  // KV is now in place (0: nothing changed). requires: has_prefix_cache(), has_sequence,
  // num_tokens(seq_id) == 0. Mutates.
  int32_t match_prefix(SeqId seq_id, std::span<const int32_t> tokens);
  // Registers the sequence's full, held blocks in every group's prefix cache.
  // requires: has_prefix_cache(), tokens.size() == num_tokens(seq_id). Mutates.
  void register_prefix(SeqId seq_id, std::span<const int32_t> tokens);

  // requires: has_sequence, 0 <= group < num_groups(). Does not modify.
  const BlockTable& table(SeqId seq_id, int32_t group) const;

  // Gives an empty sequence the cached prefix `blocks` (each already retained for the caller,
  // as PrefixCache::match returns them) in a single-group manager.
  // requires: has_sequence, num_groups() == 1, num_tokens(seq_id) == 0,
  //           num_tokens == blocks.size() * block_size. Mutates.
  void adopt_prefix(SeqId seq_id, std::span<const BlockId> blocks, int32_t num_tokens);
  int32_t num_tokens(SeqId seq_id) const { return table(seq_id, 0).num_tokens(); }

  // Aborts unless every allocator is consistent, every table is, all tables of a sequence agree
  // on num_tokens, and each block's ref_count equals the number of tables holding it plus
  // extra_refs[group][block] (references held by others sharing the pools, e.g. a
  // SessionStore; empty: none). Does not modify.
  void check_integrity(std::span<const std::vector<int32_t>> extra_refs = {}) const;

 private:
  std::vector<BlockTable>& tables(SeqId seq_id);

  std::vector<CacheGroupConfig> configs_;                         // [num_groups]
  std::vector<std::unique_ptr<BlockAllocator>> allocators_;       // [num_groups]
  std::vector<std::unique_ptr<PrefixCache>> caches_;              // [num_groups] or empty
  std::unordered_map<SeqId, std::vector<BlockTable>> sequences_;  // tables: [num_groups]
};

}  // namespace kvp

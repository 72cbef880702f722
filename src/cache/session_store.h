// SessionStore: named sequences (agents) that outlive their requests and move between tiers.
//
//   Resident  ──offload──▶  Offloaded  ──save_to_disk──▶  OnDisk
//      ▲  └──────────────save_to_disk──────────────────────▲ │
//      └──────────────────── resume ◀────────────────────────┘
//
//   Resident:  the session's BlockTables hold device blocks (the device BlockAllocators).
//   Offloaded: BlockTables of host blocks (second BlockAllocators: the host pools).
//   OnDisk:    a cache file path and the token ids; no blocks held.
// A model with several cache groups (Gemma 3: global and sliding-window layers) has per group a
// device pool, a host pool, optionally a prefix cache, and per session a table; every move
// applies to all groups at once and its operations carry the group. Sliding-window groups move
// only the blocks inside the window (earlier entries stay dropped).
// The token ids are always kept. Every move returns the CacheOps (block_ops.h) a backend or host
// storage executes, in order, before the next KV write. resume() first takes the longest prefix
// still cached on device (the prefix cache) and moves back only the rest, so sessions sharing a
// system prompt share its device blocks.
//
// A session is active between begin() and end() (a request uses it) and idle otherwise; only
// idle sessions move down a tier. make_room() moves idle resident sessions down, least recently
// used first, until the device pool has the blocks asked for.
//
// Errors: session names come from users, so create() returns a Status for an empty or taken
// name and find() an optional; a SessionId the store never issued, or a call in the wrong state
// (append to an idle session, offload of an active one) is a programming error (KVP_CHECK).
// Running out of blocks is a value: the calls that allocate return false / nullopt.
// The store must be the only user of the host pool; the device pool is shared with other
// sequences. Not thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "cache/block_allocator.h"
#include "cache/block_ops.h"
#include "cache/block_table.h"
#include "cache/prefix_cache.h"
#include "common/ids.h"
#include "common/status.h"

namespace kvp {

enum class Tier : uint8_t { Resident, Offloaded, OnDisk };
const char* tier_name(Tier tier);

struct SessionStats {
  int64_t num_turns = 0;               // begin() calls
  int64_t num_offloads = 0;            // Resident -> Offloaded
  int64_t num_saves_to_disk = 0;       // -> OnDisk
  int64_t num_resumes = 0;             // Offloaded / OnDisk -> Resident
  int64_t num_blocks_transferred = 0;  // blocks moved device <-> host
  int64_t num_blocks_saved = 0;        // blocks written to disk
  int64_t num_blocks_loaded = 0;       // blocks read from disk
  int64_t num_prefix_hit_tokens = 0;   // tokens taken from the prefix cache (append + resume)
};

struct SessionInfo {
  SessionId id;
  std::string name;
  Tier tier = Tier::Resident;
  bool active = false;
  int32_t num_tokens = 0;
  int32_t num_device_blocks = 0;  // held in the device pool
  int32_t num_host_blocks = 0;    // held in the host pool
  SessionStats stats;
};

struct SessionStoreConfig {
  int32_t block_size = 16;  // of both pools; a power of two in [1, 1024]
  std::string disk_dir;     // cache files go to <disk_dir>/session-<id>.kvc
};

// One cache group's pools. device and host are not owned and outlive the store; prefix_cache
// belongs to device (same block size) and is either given for every group or for none.
struct SessionGroup {
  BlockAllocator* device = nullptr;
  PrefixCache* prefix_cache = nullptr;
  BlockAllocator* host = nullptr;
  int32_t block_size = 16;    // a power of two in [1, 1024]
  int32_t window_tokens = 0;  // sliding window; 0 = global attention
};

class SessionStore {
 public:
  // One global cache group. requires: device, host != nullptr (not owned, outlive the store);
  // prefix_cache may be nullptr (no sharing) and otherwise belongs to `device` with the same
  // block size.
  SessionStore(BlockAllocator* device, PrefixCache* prefix_cache, BlockAllocator* host,
               SessionStoreConfig config);
  // Several cache groups. requires: groups not empty, each valid as above.
  SessionStore(std::vector<SessionGroup> groups, std::string disk_dir);
  ~SessionStore();
  SessionStore(const SessionStore&) = delete;
  SessionStore& operator=(const SessionStore&) = delete;

  // A new empty, idle, resident session. invalid_argument if the name is empty or taken.
  Result<SessionId> create(std::string name);
  // The session with this name, if any. Does not modify.
  std::optional<SessionId> find(std::string_view name) const;
  int32_t num_groups() const { return static_cast<int32_t>(groups_.size()); }
  bool contains(SessionId session) const { return sessions_.contains(session); }
  int32_t num_sessions() const { return static_cast<int32_t>(sessions_.size()); }
  std::vector<SessionId> session_ids() const;  // in id order

  // Starts a turn: resumes the session to Resident if needed (making room) and marks it active.
  // false (session unchanged, other sessions possibly moved down) if the device pool cannot hold
  // it. requires: idle. Mutates.
  bool begin(SessionId session, std::vector<CacheOp>* ops);
  // Appends tokens to an active session. When the session is empty, the longest cached prefix
  // of tokens[0, n-1) is taken from the prefix cache (the last token is always computed).
  // The KV of every earlier token must be written by now (append, forward, append, ...): full
  // blocks that a window group drops are registered in its prefix cache first.
  // Returns the number of leading tokens whose KV is already in place (the caller computes the
  // rest), or nullopt (nothing changed) if the pool cannot hold them even after make_room.
  // requires: active. Mutates.
  std::optional<int32_t> append_tokens(SessionId session, std::span<const int32_t> tokens,
                                       std::vector<CacheOp>* ops);
  // Ends a turn: the session becomes idle and its full blocks are registered in the prefix
  // cache. requires: active. Mutates.
  void end(SessionId session);

  // Resident -> Offloaded. false (nothing changed) if the host pool lacks blocks.
  // requires: idle, Resident. Mutates.
  bool offload(SessionId session, std::vector<CacheOp>* ops);
  // Resident or Offloaded -> OnDisk (disk space is not tracked). requires: idle, not OnDisk.
  // Mutates.
  void save_to_disk(SessionId session, std::vector<CacheOp>* ops);
  // -> Resident, making room if needed; false (session unchanged) if the device pool cannot
  // hold it. requires: idle. Mutates.
  bool resume(SessionId session, std::vector<CacheOp>* ops);
  // Moves idle sessions (not `keep`) down a tier, least recently used first, until every
  // group's device pool can allocate num_blocks[group]; false if it still cannot. Mutates.
  bool make_room(std::span<const int32_t> num_blocks, std::vector<CacheOp>* ops,
                 std::optional<SessionId> keep = std::nullopt);
  // The same for a store of one group. requires: num_groups() == 1.
  bool make_room(int32_t num_blocks, std::vector<CacheOp>* ops,
                 std::optional<SessionId> keep = std::nullopt);
  // Forgets a session, releasing its blocks (and removing its cache file). requires: idle.
  // Mutates.
  void erase(SessionId session, std::vector<CacheOp>* ops);

  // Does not modify.
  SessionInfo info(SessionId session) const;
  std::span<const int32_t> tokens(SessionId session) const;
  // The device table of one group. requires: Resident, 0 <= group < num_groups().
  const BlockTable& table(SessionId session, int32_t group = 0) const;
  std::string cache_path(SessionId session) const;

  // refs[b] += number of this store's device tables of `group` holding device block b.
  // refs: [that group's device num_blocks]. Does not modify the store.
  void count_device_refs(std::vector<int32_t>* refs, int32_t group = 0) const;
  // Aborts unless each session's tier matches what it holds, token counts agree, tables are
  // consistent, host ref counts equal the host tables' references exactly and device ref counts
  // are at least the store's references. Does not modify.
  void check_integrity() const;

 private:
  struct Session {
    SessionId id;
    std::string name;
    Tier tier = Tier::Resident;
    bool active = false;
    bool has_file = false;
    uint64_t last_used = 0;
    std::vector<int32_t> tokens;            // [num_tokens]
    std::vector<BlockTable> device_tables;  // [num_groups]
    std::vector<BlockTable> host_tables;    // [num_groups]
    std::vector<int32_t> disk_first_block;  // [num_groups] first entry in the file (OnDisk)
    SessionStats stats;
  };

  Session& get(SessionId session);
  const Session& get(SessionId session) const;
  void touch(Session& s) { s.last_used = ++clock_; }
  // The idle session in `tier`, not `keep`, used least recently; nullptr if none.
  Session* least_recent(Tier tier, std::optional<SessionId> keep);
  // Registers the full blocks a window group is about to drop (their KV was computed by the
  // forward passes of earlier appends), so other sessions can still start from them.
  void register_behind_window(Session& s);
  bool offload(Session& s, std::vector<CacheOp>* ops);
  void save_to_disk(Session& s, std::vector<CacheOp>* ops);
  bool resume(Session& s, std::vector<CacheOp>* ops);

  // Whether every group's device pool can allocate num_blocks[group].
  bool can_allocate(std::span<const int32_t> num_blocks) const;
  std::vector<PrefixGroup> prefix_groups() const;
  bool has_windows() const;

  std::vector<SessionGroup> groups_;  // [num_groups]
  bool has_prefix_cache_ = false;
  std::string disk_dir_;
  std::map<SessionId, Session> sessions_;  // ordered: deterministic iteration
  std::unordered_map<std::string, SessionId> by_name_;
  int64_t next_id_ = 1;
  uint64_t clock_ = 0;
};

}  // namespace kvp

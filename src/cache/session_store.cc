// SessionStore: tier moves (offload, save to disk, resume), make_room, prefix sharing, across
// cache groups.
#include "cache/session_store.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>

namespace kvp {

const char* tier_name(Tier tier) {
  switch (tier) {
    case Tier::Resident:
      return "resident";
    case Tier::Offloaded:
      return "offloaded";
    case Tier::OnDisk:
      return "on disk";
  }
  return "?";
}

SessionStore::SessionStore(BlockAllocator* device, PrefixCache* prefix_cache, BlockAllocator* host,
                           SessionStoreConfig config)
    : SessionStore({SessionGroup{.device = device,
                                 .prefix_cache = prefix_cache,
                                 .host = host,
                                 .block_size = config.block_size,
                                 .window_tokens = 0}},
                   std::move(config.disk_dir)) {}

SessionStore::SessionStore(std::vector<SessionGroup> groups, std::string disk_dir)
    : groups_(std::move(groups)), disk_dir_(std::move(disk_dir)) {
  KVP_CHECK(!groups_.empty(), "SessionStore needs at least one cache group");
  has_prefix_cache_ = groups_[0].prefix_cache != nullptr;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const SessionGroup& group = groups_[g];
    KVP_CHECK(group.device != nullptr && group.host != nullptr,
              "SessionStore group {} needs a device and a host pool", g);
    KVP_CHECK(group.block_size >= 1 && group.block_size <= 1024 &&
                  std::has_single_bit(static_cast<uint32_t>(group.block_size)),
              "group {}: block_size {} is not a power of two in [1, 1024]", g, group.block_size);
    KVP_CHECK(group.window_tokens >= 0, "group {}: window_tokens {} is negative", g,
              group.window_tokens);
    KVP_CHECK((group.prefix_cache != nullptr) == has_prefix_cache_,
              "prefix caches must be given for every group or for none (group {})", g);
    KVP_CHECK(
        group.prefix_cache == nullptr || (group.prefix_cache->block_size() == group.block_size &&
                                          group.prefix_cache->allocator() == group.device),
        "group {}: the prefix cache belongs to another pool or block size", g);
  }
}

SessionStore::~SessionStore() { sessions_.clear(); }

SessionStore::Session& SessionStore::get(SessionId session) {
  auto it = sessions_.find(session);
  KVP_CHECK(it != sessions_.end(), "unknown session {}", session.value);
  return it->second;
}

const SessionStore::Session& SessionStore::get(SessionId session) const {
  auto it = sessions_.find(session);
  KVP_CHECK(it != sessions_.end(), "unknown session {}", session.value);
  return it->second;
}

bool SessionStore::can_allocate(std::span<const int32_t> num_blocks) const {
  for (int32_t g = 0; g < num_groups(); ++g) {
    if (!groups_[g].device->can_allocate(num_blocks[g])) return false;
  }
  return true;
}

std::vector<PrefixGroup> SessionStore::prefix_groups() const {
  std::vector<PrefixGroup> prefix;  // [num_groups]
  for (const SessionGroup& g : groups_) prefix.push_back({g.prefix_cache, g.window_tokens});
  return prefix;
}

bool SessionStore::has_windows() const {
  return std::any_of(groups_.begin(), groups_.end(),
                     [](const SessionGroup& g) { return g.window_tokens > 0; });
}

Result<SessionId> SessionStore::create(std::string name) {
  if (name.empty()) return Status::invalid_argument("session name is empty");
  if (by_name_.contains(name)) {
    return Status::invalid_argument("session name '{}' is already taken", name);
  }
  const SessionId id{next_id_++};
  Session s{.id = id,
            .name = name,
            .tokens = {},
            .device_tables = {},
            .host_tables = {},
            .disk_first_block = std::vector<int32_t>(groups_.size(), 0),
            .stats = {}};
  for (const SessionGroup& g : groups_) {
    s.device_tables.emplace_back(g.device, g.block_size, g.window_tokens);
    s.host_tables.emplace_back(g.host, g.block_size, g.window_tokens);
  }
  touch(s);
  sessions_.emplace(id, std::move(s));
  by_name_.emplace(std::move(name), id);
  return id;
}

std::optional<SessionId> SessionStore::find(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  if (it == by_name_.end()) return std::nullopt;
  return it->second;
}

std::vector<SessionId> SessionStore::session_ids() const {
  std::vector<SessionId> ids;  // [num_sessions]
  ids.reserve(sessions_.size());
  for (const auto& [id, s] : sessions_) ids.push_back(id);
  return ids;
}

std::string SessionStore::cache_path(SessionId session) const {
  return fmt::format("{}/session-{}.kvc", disk_dir_, session.value);
}

bool SessionStore::begin(SessionId session, std::vector<CacheOp>* ops) {
  Session& s = get(session);
  KVP_CHECK(!s.active, "session {} is already active", session.value);
  if (s.tier != Tier::Resident && !resume(s, ops)) return false;
  s.active = true;
  ++s.stats.num_turns;
  touch(s);
  return true;
}

std::optional<int32_t> SessionStore::append_tokens(SessionId session,
                                                   std::span<const int32_t> tokens,
                                                   std::vector<CacheOp>* ops) {
  Session& s = get(session);
  KVP_CHECK(s.active && s.tier == Tier::Resident, "append to session {} that is not active",
            session.value);
  const int32_t num_new = static_cast<int32_t>(tokens.size());
  int32_t num_cached = 0;
  if (s.tokens.empty() && has_prefix_cache_ && num_new > 1) {
    GroupPrefixMatch m = match_prefix_groups(prefix_groups(), tokens.first(num_new - 1));
    if (m.num_tokens > 0) {
      for (int32_t g = 0; g < num_groups(); ++g) {
        s.device_tables[g].adopt(m.num_dropped[g], m.blocks[g], m.num_tokens);
      }
    }
    num_cached = m.num_tokens;
  }
  const int32_t num_rest = num_new - num_cached;
  register_behind_window(s);
  std::vector<int32_t> needed(num_groups());  // [num_groups]
  for (int32_t g = 0; g < num_groups(); ++g) {
    s.device_tables[g].trim_window();
    needed[g] = s.device_tables[g].blocks_needed(num_rest);
  }
  if (!can_allocate(needed) && !make_room(needed, ops, session)) {
    if (num_cached > 0) {  // the tables were empty: give the adopted prefix hit back
      for (BlockTable& t : s.device_tables) t.free();
    }
    return std::nullopt;
  }
  std::vector<BlockCopy> copies;  // copies of one group's append
  for (int32_t g = 0; g < num_groups(); ++g) {
    copies.clear();
    const bool ok = s.device_tables[g].append(num_rest, &copies);
    KVP_CHECK(ok, "group {} could not append after making room", g);
    for (BlockCopy c : copies) {
      c.group = g;
      ops->push_back(c);
    }
  }
  s.tokens.insert(s.tokens.end(), tokens.begin(), tokens.end());
  s.stats.num_prefix_hit_tokens += num_cached;
  touch(s);
  return num_cached;
}

void SessionStore::register_behind_window(Session& s) {
  if (!has_prefix_cache_) return;
  const int32_t num_tokens = static_cast<int32_t>(s.tokens.size());
  for (int32_t g = 0; g < num_groups(); ++g) {
    const int32_t window = groups_[g].window_tokens;
    if (window == 0) continue;
    const BlockTable& t = s.device_tables[g];
    const int32_t block_size = groups_[g].block_size;
    const int32_t drop_until =
        std::min(std::max(0, num_tokens - window + 1), num_tokens) / block_size;
    if (drop_until > t.num_dropped_blocks()) {
      groups_[g].prefix_cache->register_blocks(s.tokens, t.blocks().first(drop_until),
                                               t.num_dropped_blocks());
    }
  }
}

void SessionStore::end(SessionId session) {
  Session& s = get(session);
  KVP_CHECK(s.active, "end of session {} that is not active", session.value);
  s.active = false;
  if (has_prefix_cache_) {
    for (int32_t g = 0; g < num_groups(); ++g) {
      const BlockTable& t = s.device_tables[g];
      const size_t num_full = s.tokens.size() / groups_[g].block_size;
      groups_[g].prefix_cache->register_blocks(s.tokens, t.blocks().first(num_full),
                                               t.num_dropped_blocks());
    }
  }
  touch(s);
}

bool SessionStore::offload(SessionId session, std::vector<CacheOp>* ops) {
  return offload(get(session), ops);
}

bool SessionStore::offload(Session& s, std::vector<CacheOp>* ops) {
  KVP_CHECK(!s.active && s.tier == Tier::Resident, "offload of session {} that is {} {}",
            s.id.value, s.active ? "active" : "idle", tier_name(s.tier));
  for (int32_t g = 0; g < num_groups(); ++g) {
    if (!groups_[g].host->can_allocate(s.device_tables[g].num_held_blocks())) return false;
  }
  for (int32_t g = 0; g < num_groups(); ++g) {
    BlockTable& dev = s.device_tables[g];
    std::vector<BlockId> host_blocks;  // [num_held_blocks]
    const bool ok = groups_[g].host->alloc_n(dev.num_held_blocks(), &host_blocks);
    KVP_CHECK(ok, "host pool of group {} could not allocate after can_allocate", g);
    const int32_t first = dev.num_dropped_blocks();
    for (int32_t i = first; i < dev.num_blocks(); ++i) {
      ops->push_back(
          BlockTransfer{Pool::Device, dev.block(i), Pool::Host, host_blocks[i - first], g});
    }
    s.host_tables[g].adopt(first, host_blocks, dev.num_tokens());
    s.stats.num_blocks_transferred += dev.num_held_blocks();
    dev.free();
  }
  s.tier = Tier::Offloaded;
  ++s.stats.num_offloads;
  return true;
}

void SessionStore::save_to_disk(SessionId session, std::vector<CacheOp>* ops) {
  save_to_disk(get(session), ops);
}

void SessionStore::save_to_disk(Session& s, std::vector<CacheOp>* ops) {
  KVP_CHECK(!s.active && s.tier != Tier::OnDisk, "save to disk of session {} that is {} {}",
            s.id.value, s.active ? "active" : "idle", tier_name(s.tier));
  const bool from_device = s.tier == Tier::Resident;
  for (int32_t g = 0; g < num_groups(); ++g) {
    BlockTable& t = from_device ? s.device_tables[g] : s.host_tables[g];
    const int32_t first = t.num_dropped_blocks();
    ops->push_back(
        SaveToDisk{.session = s.id,
                   .path = cache_path(s.id),
                   .src_pool = from_device ? Pool::Device : Pool::Host,
                   .blocks = std::vector<BlockId>(t.blocks().begin() + first, t.blocks().end()),
                   .token_ids = s.tokens,
                   .num_tokens = t.num_tokens(),
                   .first_position = first * groups_[g].block_size,
                   .group = g});
    s.disk_first_block[g] = first;
    s.stats.num_blocks_saved += t.num_held_blocks();
    t.free();
  }
  s.tier = Tier::OnDisk;
  s.has_file = true;
  ++s.stats.num_saves_to_disk;
}

bool SessionStore::resume(SessionId session, std::vector<CacheOp>* ops) {
  Session& s = get(session);
  KVP_CHECK(!s.active, "resume of active session {}", session.value);
  return resume(s, ops);
}

bool SessionStore::resume(Session& s, std::vector<CacheOp>* ops) {
  if (s.tier == Tier::Resident) return true;
  const int32_t num_tokens = static_cast<int32_t>(s.tokens.size());
  // Entries [first[g], num_blocks[g]) come back; with global groups only, the leading ones may
  // come from the prefix cache instead of the host or the file.
  std::vector<int32_t> first(num_groups());       // [num_groups] first entry held
  std::vector<int32_t> num_blocks(num_groups());  // [num_groups]
  for (int32_t g = 0; g < num_groups(); ++g) {
    const int32_t block_size = groups_[g].block_size;
    num_blocks[g] = (num_tokens + block_size - 1) / block_size;
    first[g] =
        s.tier == Tier::Offloaded ? s.host_tables[g].num_dropped_blocks() : s.disk_first_block[g];
  }
  GroupPrefixMatch m;
  if (has_prefix_cache_ && !has_windows()) {
    m = match_prefix_groups(prefix_groups(), s.tokens);
  }
  std::vector<int32_t> needed(num_groups());  // [num_groups]
  for (int32_t g = 0; g < num_groups(); ++g) {
    const int32_t num_cached_blocks = m.num_tokens / groups_[g].block_size;
    needed[g] = num_blocks[g] - std::max(first[g], num_cached_blocks);
  }
  if (!can_allocate(needed) && !make_room(needed, ops, s.id)) {
    if (m.num_tokens > 0) {
      for (int32_t g = 0; g < num_groups(); ++g) {
        for (BlockId b : m.blocks[g]) groups_[g].device->release(b);
      }
    }
    return false;
  }
  for (int32_t g = 0; g < num_groups(); ++g) {
    const int32_t block_size = groups_[g].block_size;
    const int32_t num_cached_blocks = m.num_tokens / block_size;
    const int32_t start = std::max(first[g], num_cached_blocks);  // first entry to move
    // [num_blocks - first] device blocks: the prefix hit, then the moved ones.
    std::vector<BlockId> blocks =
        m.num_tokens > 0 ? std::move(m.blocks[g]) : std::vector<BlockId>{};
    const bool ok = groups_[g].device->alloc_n(needed[g], &blocks);
    KVP_CHECK(ok, "device pool of group {} could not allocate {} blocks after making room", g,
              needed[g]);
    const int32_t table_first = m.num_tokens > 0 ? 0 : first[g];
    if (s.tier == Tier::Offloaded) {
      for (int32_t i = start; i < num_blocks[g]; ++i) {
        ops->push_back(BlockTransfer{Pool::Host, s.host_tables[g].block(i), Pool::Device,
                                     blocks[i - table_first], g});
      }
      s.stats.num_blocks_transferred += needed[g];
      s.host_tables[g].free();
    } else if (needed[g] > 0) {
      ops->push_back(LoadFromDisk{
          .session = s.id,
          .path = cache_path(s.id),
          .dst_pool = Pool::Device,
          .blocks = std::vector<BlockId>(blocks.begin() + (start - table_first), blocks.end()),
          .first_position = start * block_size,
          .num_tokens = num_tokens,
          .group = g});
      s.stats.num_blocks_loaded += needed[g];
    }
    s.device_tables[g].adopt(table_first, blocks, num_tokens);
  }
  s.stats.num_prefix_hit_tokens += m.num_tokens;
  s.tier = Tier::Resident;
  ++s.stats.num_resumes;
  touch(s);
  return true;
}

SessionStore::Session* SessionStore::least_recent(Tier tier, std::optional<SessionId> keep) {
  Session* best = nullptr;
  for (auto& [id, s] : sessions_) {
    if (s.active || s.tier != tier || (keep && id == *keep)) continue;
    if (best == nullptr || s.last_used < best->last_used) best = &s;
  }
  return best;
}

bool SessionStore::make_room(int32_t num_blocks, std::vector<CacheOp>* ops,
                             std::optional<SessionId> keep) {
  KVP_CHECK(num_groups() == 1, "make_room(int) on a store of {} groups", num_groups());
  const int32_t needed[] = {num_blocks};
  return make_room(needed, ops, keep);
}

bool SessionStore::make_room(std::span<const int32_t> num_blocks, std::vector<CacheOp>* ops,
                             std::optional<SessionId> keep) {
  KVP_CHECK(static_cast<int32_t>(num_blocks.size()) == num_groups(),
            "make_room with {} counts for {} groups", num_blocks.size(), num_groups());
  auto host_fits = [&](const Session& victim) {
    for (int32_t g = 0; g < num_groups(); ++g) {
      if (!groups_[g].host->can_allocate(victim.device_tables[g].num_held_blocks())) return false;
    }
    return true;
  };
  while (!can_allocate(num_blocks)) {
    Session* victim = least_recent(Tier::Resident, keep);
    if (victim == nullptr) return false;
    while (!host_fits(*victim)) {
      Session* cold = least_recent(Tier::Offloaded, keep);
      if (cold == nullptr) break;
      save_to_disk(*cold, ops);
    }
    if (!offload(*victim, ops)) save_to_disk(*victim, ops);
  }
  return true;
}

void SessionStore::erase(SessionId session, std::vector<CacheOp>* ops) {
  auto it = sessions_.find(session);
  KVP_CHECK(it != sessions_.end(), "unknown session {}", session.value);
  KVP_CHECK(!it->second.active, "erase of active session {}", session.value);
  if (it->second.has_file) ops->push_back(RemoveFile{cache_path(session)});
  by_name_.erase(it->second.name);
  sessions_.erase(it);  // tables release their blocks
}

SessionInfo SessionStore::info(SessionId session) const {
  const Session& s = get(session);
  SessionInfo info{.id = s.id,
                   .name = s.name,
                   .tier = s.tier,
                   .active = s.active,
                   .num_tokens = static_cast<int32_t>(s.tokens.size()),
                   .num_device_blocks = 0,
                   .num_host_blocks = 0,
                   .stats = s.stats};
  for (int32_t g = 0; g < num_groups(); ++g) {
    info.num_device_blocks += s.device_tables[g].num_held_blocks();
    info.num_host_blocks += s.host_tables[g].num_held_blocks();
  }
  return info;
}

std::span<const int32_t> SessionStore::tokens(SessionId session) const {
  return get(session).tokens;
}

const BlockTable& SessionStore::table(SessionId session, int32_t group) const {
  const Session& s = get(session);
  KVP_CHECK(s.tier == Tier::Resident, "table of session {} that is {}", session.value,
            tier_name(s.tier));
  KVP_CHECK(group >= 0 && group < num_groups(), "group {} of {}", group, num_groups());
  return s.device_tables[group];
}

void SessionStore::count_device_refs(std::vector<int32_t>* refs, int32_t group) const {
  for (const auto& [id, s] : sessions_) {
    const BlockTable& t = s.device_tables[group];
    for (int32_t i = t.num_dropped_blocks(); i < t.num_blocks(); ++i) ++(*refs)[t.block(i).value];
  }
}

void SessionStore::check_integrity() const {
  KVP_CHECK(by_name_.size() == sessions_.size(), "{} names for {} sessions", by_name_.size(),
            sessions_.size());
  for (const auto& [id, s] : sessions_) {
    auto name_it = by_name_.find(s.name);
    KVP_CHECK(name_it != by_name_.end() && name_it->second == id, "session {} name '{}' unmapped",
              id.value, s.name);
    KVP_CHECK(!s.active || s.tier == Tier::Resident, "active session {} is {}", id.value,
              tier_name(s.tier));
    KVP_CHECK(s.tier != Tier::OnDisk || s.has_file, "on-disk session {} has no file", id.value);
    const int32_t num_tokens = static_cast<int32_t>(s.tokens.size());
    for (int32_t g = 0; g < num_groups(); ++g) {
      const int32_t dev_tokens = s.device_tables[g].num_tokens();
      const int32_t host_tokens = s.host_tables[g].num_tokens();
      const int32_t want_dev = s.tier == Tier::Resident ? num_tokens : 0;
      const int32_t want_host = s.tier == Tier::Offloaded ? num_tokens : 0;
      KVP_CHECK(dev_tokens == want_dev && host_tokens == want_host,
                "{} session {} group {}: {} tokens, device table {}, host table {}",
                tier_name(s.tier), id.value, g, num_tokens, dev_tokens, host_tokens);
      s.device_tables[g].check_integrity();
      s.host_tables[g].check_integrity();
    }
  }
  for (int32_t g = 0; g < num_groups(); ++g) {
    const BlockAllocator& host = *groups_[g].host;
    const BlockAllocator& device = *groups_[g].device;
    std::vector<int32_t> host_refs(host.num_blocks(), 0);  // [host num_blocks]
    for (const auto& [id, s] : sessions_) {
      const BlockTable& t = s.host_tables[g];
      for (int32_t i = t.num_dropped_blocks(); i < t.num_blocks(); ++i)
        ++host_refs[t.block(i).value];
    }
    host.check_integrity();
    for (int32_t b = 0; b < host.num_blocks(); ++b) {
      KVP_CHECK(host_refs[b] == host.ref_count(BlockId{b}),
                "group {} host block {}: ref_count {} but {} session tables hold it", g, b,
                host.ref_count(BlockId{b}), host_refs[b]);
    }
    std::vector<int32_t> device_refs(device.num_blocks(), 0);  // [device num_blocks]
    count_device_refs(&device_refs, g);
    for (int32_t b = 0; b < device.num_blocks(); ++b) {
      KVP_CHECK(device_refs[b] <= device.ref_count(BlockId{b}),
                "group {} device block {}: ref_count {} but {} session tables hold it", g, b,
                device.ref_count(BlockId{b}), device_refs[b]);
    }
  }
}

}  // namespace kvp

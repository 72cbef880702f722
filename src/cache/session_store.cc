// SessionStore: tier moves (offload, save to disk, resume), make_room, prefix sharing.
#include "cache/session_store.h"

#include <fmt/format.h>

#include <algorithm>

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
    : device_(device), prefix_cache_(prefix_cache), host_(host), config_(std::move(config)) {
  KVP_CHECK(device != nullptr && host != nullptr, "SessionStore needs a device and a host pool");
  KVP_CHECK(prefix_cache == nullptr || prefix_cache->block_size() == config_.block_size,
            "prefix cache block size {} differs from the store's {}",
            prefix_cache ? prefix_cache->block_size() : 0, config_.block_size);
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

Result<SessionId> SessionStore::create(std::string name) {
  if (name.empty()) return Status::invalid_argument("session name is empty");
  if (by_name_.contains(name)) {
    return Status::invalid_argument("session name '{}' is already taken", name);
  }
  const SessionId id{next_id_++};
  Session s{.id = id,
            .name = name,
            .tokens = {},
            .device_table = BlockTable(device_, config_.block_size),
            .host_table = BlockTable(host_, config_.block_size),
            .stats = {}};
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
  std::vector<SessionId> ids;
  ids.reserve(sessions_.size());
  for (const auto& [id, s] : sessions_) ids.push_back(id);
  return ids;
}

std::string SessionStore::cache_path(SessionId session) const {
  return fmt::format("{}/session-{}.kvc", config_.disk_dir, session.value);
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
  BlockTable& t = s.device_table;
  int32_t num_cached = 0;
  if (t.num_tokens() == 0 && prefix_cache_ != nullptr && num_new > 1) {
    PrefixMatch m = prefix_cache_->match(tokens.first(num_new - 1));
    if (!m.blocks.empty()) t.adopt(0, m.blocks, m.num_tokens);
    num_cached = m.num_tokens;
  }
  const int32_t num_rest = num_new - num_cached;
  std::vector<BlockCopy> copies;
  bool ok = t.append(num_rest, &copies);
  if (!ok && make_room(t.blocks_needed(num_rest), ops, session)) ok = t.append(num_rest, &copies);
  if (!ok) {
    if (num_cached > 0) t.free();  // the table was empty: give the adopted prefix hit back
    return std::nullopt;
  }
  for (const BlockCopy& c : copies) ops->push_back(c);
  s.tokens.insert(s.tokens.end(), tokens.begin(), tokens.end());
  s.stats.num_prefix_hit_tokens += num_cached;
  touch(s);
  return num_cached;
}

void SessionStore::end(SessionId session) {
  Session& s = get(session);
  KVP_CHECK(s.active, "end of session {} that is not active", session.value);
  s.active = false;
  if (prefix_cache_ != nullptr) {
    const size_t num_full = s.tokens.size() / config_.block_size;
    prefix_cache_->register_blocks(s.tokens, s.device_table.blocks().first(num_full));
  }
  touch(s);
}

bool SessionStore::offload(SessionId session, std::vector<CacheOp>* ops) {
  return offload(get(session), ops);
}

bool SessionStore::offload(Session& s, std::vector<CacheOp>* ops) {
  KVP_CHECK(!s.active && s.tier == Tier::Resident, "offload of session {} that is {} {}",
            s.id.value, s.active ? "active" : "idle", tier_name(s.tier));
  const BlockTable& dev = s.device_table;
  std::vector<BlockId> host_blocks;
  if (!host_->alloc_n(dev.num_blocks(), &host_blocks)) return false;
  for (int32_t i = 0; i < dev.num_blocks(); ++i) {
    ops->push_back(BlockTransfer{Pool::Device, dev.block(i), Pool::Host, host_blocks[i]});
  }
  s.host_table.adopt(0, host_blocks, dev.num_tokens());
  s.stats.num_blocks_transferred += dev.num_blocks();
  s.device_table.free();
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
  BlockTable& t = s.tier == Tier::Resident ? s.device_table : s.host_table;
  SaveToDisk save{.session = s.id,
                  .path = cache_path(s.id),
                  .src_pool = s.tier == Tier::Resident ? Pool::Device : Pool::Host,
                  .blocks = std::vector<BlockId>(t.blocks().begin(), t.blocks().end()),
                  .token_ids = s.tokens,
                  .num_tokens = t.num_tokens()};
  s.stats.num_blocks_saved += t.num_blocks();
  ops->push_back(std::move(save));
  t.free();
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
  const int32_t block_size = config_.block_size;
  const int32_t num_tokens = static_cast<int32_t>(s.tokens.size());
  const int32_t num_blocks = (num_tokens + block_size - 1) / block_size;
  PrefixMatch m;
  if (prefix_cache_ != nullptr) {
    const int32_t num_full_tokens = num_tokens / block_size * block_size;
    m = prefix_cache_->match(std::span<const int32_t>(s.tokens).first(num_full_tokens));
  }
  const int32_t num_cached_blocks = static_cast<int32_t>(m.blocks.size());
  const int32_t num_needed = num_blocks - num_cached_blocks;
  if (!device_->can_allocate(num_needed) && !make_room(num_needed, ops, s.id)) {
    for (BlockId b : m.blocks) device_->release(b);
    return false;
  }
  std::vector<BlockId> blocks = std::move(m.blocks);  // [num_blocks] device blocks
  const bool ok = device_->alloc_n(num_needed, &blocks);
  KVP_CHECK(ok, "device pool could not allocate {} blocks after making room", num_needed);
  if (s.tier == Tier::Offloaded) {
    for (int32_t i = num_cached_blocks; i < num_blocks; ++i) {
      ops->push_back(BlockTransfer{Pool::Host, s.host_table.block(i), Pool::Device, blocks[i]});
    }
    s.stats.num_blocks_transferred += num_needed;
    s.host_table.free();
  } else {
    LoadFromDisk load{
        .session = s.id,
        .path = cache_path(s.id),
        .dst_pool = Pool::Device,
        .blocks = std::vector<BlockId>(blocks.begin() + num_cached_blocks, blocks.end()),
        .first_position = num_cached_blocks * block_size,
        .num_tokens = num_tokens};
    if (num_needed > 0) ops->push_back(std::move(load));
    s.stats.num_blocks_loaded += num_needed;
  }
  s.device_table.adopt(0, blocks, num_tokens);
  s.stats.num_prefix_hit_tokens += num_cached_blocks * block_size;
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
  while (!device_->can_allocate(num_blocks)) {
    Session* victim = least_recent(Tier::Resident, keep);
    if (victim == nullptr) return false;
    const int32_t num_victim_blocks = victim->device_table.num_blocks();
    while (!host_->can_allocate(num_victim_blocks)) {
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
  return SessionInfo{.id = s.id,
                     .name = s.name,
                     .tier = s.tier,
                     .active = s.active,
                     .num_tokens = static_cast<int32_t>(s.tokens.size()),
                     .num_device_blocks = s.device_table.num_held_blocks(),
                     .num_host_blocks = s.host_table.num_held_blocks(),
                     .stats = s.stats};
}

std::span<const int32_t> SessionStore::tokens(SessionId session) const {
  return get(session).tokens;
}

const BlockTable& SessionStore::table(SessionId session) const {
  const Session& s = get(session);
  KVP_CHECK(s.tier == Tier::Resident, "table of session {} that is {}", session.value,
            tier_name(s.tier));
  return s.device_table;
}

void SessionStore::count_device_refs(std::vector<int32_t>* refs) const {
  for (const auto& [id, s] : sessions_) {
    for (int32_t i = 0; i < s.device_table.num_blocks(); ++i) {
      ++(*refs)[s.device_table.block(i).value];
    }
  }
}

void SessionStore::check_integrity() const {
  KVP_CHECK(by_name_.size() == sessions_.size(), "{} names for {} sessions", by_name_.size(),
            sessions_.size());
  std::vector<int32_t> host_refs(host_->num_blocks(), 0);  // [host num_blocks]
  for (const auto& [id, s] : sessions_) {
    auto name_it = by_name_.find(s.name);
    KVP_CHECK(name_it != by_name_.end() && name_it->second == id, "session {} name '{}' unmapped",
              id.value, s.name);
    const int32_t num_tokens = static_cast<int32_t>(s.tokens.size());
    const int32_t dev_tokens = s.device_table.num_tokens();
    const int32_t host_tokens = s.host_table.num_tokens();
    switch (s.tier) {
      case Tier::Resident:
        KVP_CHECK(dev_tokens == num_tokens && host_tokens == 0,
                  "resident session {}: {} tokens, device table {}, host table {}", id.value,
                  num_tokens, dev_tokens, host_tokens);
        break;
      case Tier::Offloaded:
        KVP_CHECK(!s.active && dev_tokens == 0 && host_tokens == num_tokens,
                  "offloaded session {}: {} tokens, device table {}, host table {}", id.value,
                  num_tokens, dev_tokens, host_tokens);
        break;
      case Tier::OnDisk:
        KVP_CHECK(!s.active && s.has_file && dev_tokens == 0 && host_tokens == 0,
                  "on-disk session {}: device table {}, host table {}", id.value, dev_tokens,
                  host_tokens);
        break;
    }
    s.device_table.check_integrity();
    s.host_table.check_integrity();
    for (int32_t i = 0; i < s.host_table.num_blocks(); ++i) {
      ++host_refs[s.host_table.block(i).value];
    }
  }
  host_->check_integrity();
  for (int32_t b = 0; b < host_->num_blocks(); ++b) {
    KVP_CHECK(host_refs[b] == host_->ref_count(BlockId{b}),
              "host block {}: ref_count {} but {} session tables hold it", b,
              host_->ref_count(BlockId{b}), host_refs[b]);
  }
  std::vector<int32_t> device_refs(device_->num_blocks(), 0);  // [device num_blocks]
  count_device_refs(&device_refs);
  for (int32_t b = 0; b < device_->num_blocks(); ++b) {
    KVP_CHECK(device_refs[b] <= device_->ref_count(BlockId{b}),
              "device block {}: ref_count {} but {} session tables hold it", b,
              device_->ref_count(BlockId{b}), device_refs[b]);
  }
}

}  // namespace kvp

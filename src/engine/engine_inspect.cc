// The engine's read-only views: stats(), sessions() and check_integrity(), the invariant check
// over the sequences, the cache manager, the session tiers and the copies in flight.
#include <algorithm>

#include "engine/engine.h"
#include "engine/engine_internal.h"

namespace kvp {

EngineStats Engine::stats() const {
  EngineStats s = stats_;
  s.to_host = moves_.to_host();
  s.to_pool = moves_.to_pool();
  s.num_restores_joined_steps = moves_.num_joined_steps();
  s.num_copies_out_ordered = moves_.num_ordered_out();
  s.num_file_jobs_queued = file_writer_ ? file_writer_->num_unfinished() : 0;
  s.num_running = static_cast<int32_t>(scheduler_.running().size());
  s.num_waiting = static_cast<int32_t>(scheduler_.waiting().size());
  const BlockAllocator& a = cache_->allocator(0);
  s.num_blocks_total = a.num_blocks();
  s.num_blocks_used = a.num_blocks() - a.num_available();
  return s;
}

std::vector<EngineSessionInfo> Engine::sessions() const {
  std::vector<EngineSessionInfo> out;
  for (const auto& [name, session] : sessions_) {
    EngineSessionInfo info;
    info.name = name;
    info.num_tokens = static_cast<int32_t>(session->tokens.size());
    info.tier = session->tier();
    info.num_kv_tokens = session->num_computed;
    if (session->busy_seq && sequences_.contains(*session->busy_seq)) {
      const Sequence& s = *sequences_.at(*session->busy_seq);
      if (s.resident) {
        info.tier = SessionTier::kDevice;
        info.num_kv_tokens = s.num_computed;
      }
    }
    info.num_resident_tokens = info.tier == SessionTier::kDevice ? info.num_kv_tokens : 0;
    info.busy = session->busy;
    info.num_turns = session->num_turns;
    info.num_resumed_tokens = session->num_resumed_tokens;
    info.num_evictions = session->num_evictions;
    info.num_moves_to_host = session->num_moves_to_host;
    info.num_moves_to_disk = session->num_moves_to_disk;
    info.num_restores = session->num_restores;
    info.host_bytes = session->host ? session->host->size_bytes : 0;
    info.disk_bytes = session->disk_bytes;
    info.read_ahead = session->prefetch != nullptr;
    out.push_back(info);
  }
  return out;
}

void Engine::check_integrity() const {
  cache_->check_integrity();
  int32_t resident = 0;
  for (const auto& [id, s] : sequences_) {
    if (!s->resident) continue;
    ++resident;
    KVP_CHECK(cache_->has_sequence(id), "sequence {} resident but unknown to the cache", id.value);
    KVP_CHECK(cache_->num_tokens(id) == s->num_computed, "sequence {}: table {} vs computed {}",
              id.value, cache_->num_tokens(id), s->num_computed);
  }
  uint64_t host_bytes = 0, disk_bytes = 0;
  for (const auto& [name, session] : sessions_) {
    const int held = int{session->resident.has_value()} + int{session->host != nullptr} +
                     int{!session->file.empty()};
    KVP_CHECK(held <= 1, "session '{}' holds its KV in {} tiers", name, held);
    KVP_CHECK(held == 1 || session->num_computed == 0, "session '{}': {} KV tokens in no tier",
              name, session->num_computed);
    KVP_CHECK(session->num_computed <= static_cast<int32_t>(session->tokens.size()),
              "session '{}': KV of {} tokens, history of {}", name, session->num_computed,
              session->tokens.size());
    if (session->kept_copy) {
      KVP_CHECK(session->kept_copy->num_tokens <= static_cast<int32_t>(session->tokens.size()),
                "session '{}': kept copy of {} tokens, history of {}", name,
                session->kept_copy->num_tokens, session->tokens.size());
      host_bytes += session->kept_copy->size_bytes;
    }
    if (session->host) {
      KVP_CHECK(session->host->num_tokens == session->num_computed,
                "session '{}': host copy of {} tokens, {} computed", name,
                session->host->num_tokens, session->num_computed);
      host_bytes += session->host->size_bytes;
    }
    // A spill file may be deleted, truncated or replaced by another process at any time: that
    // is no broken invariant (restore_session finds out and recomputes), so only the engine's
    // own accounting is checked here, never the file.
    if (session->owns_file) disk_bytes += session->disk_bytes;
    if (!session->resident) continue;
    ++resident;
    KVP_CHECK(cache_->num_tokens(*session->resident) == session->num_computed,
              "session '{}': table {} vs computed {}", name, cache_->num_tokens(*session->resident),
              session->num_computed);
  }
  KVP_CHECK(resident == cache_->num_sequences(), "{} resident sequences, cache holds {}", resident,
            cache_->num_sequences());
  for (const auto& wb : moves_.write_backs()) host_bytes += wb->kv->size_bytes;  // reserved
  for (const auto& [id, r] : moves_.restores()) {
    KVP_CHECK(sequences_.count(id) > 0 && sequences_.at(id)->resident,
              "sequence {} restoring but not resident", id.value);
    if (r.charged) host_bytes += r.kv->size_bytes;
  }
  for (const auto& [id, kv] : swapped_) {
    KVP_CHECK(sequences_.count(id) > 0 && !sequences_.at(id)->resident,
              "swapped sequence {} is resident or unknown", id.value);
    host_bytes += kv->size_bytes;
  }
  if (disk_staging_) {
    // every staging block in use belongs to a copy on its way to a file (or restoring from it)
    std::vector<int64_t> held(cache_->num_groups(), 0);
    const auto count = [&](const HostKv* kv) {
      if (kv == nullptr || kv->tier != disk_staging_.get()) return;
      for (size_t g = 0; g < kv->tier_blocks.size(); ++g) held[g] += kv->tier_blocks[g].size();
    };
    for (const auto& [name, session] : sessions_) {
      if (session->writing) count(session->writing->kv.get());
      // blocks taken for a read in flight (only the blocks: the read writes the rest)
      if (session->prefetch) count(session->prefetch->staged.get());
      count(session->host.get());
    }
    for (const auto& w : orphan_writes_) count(w->kv.get());
    for (const auto& [id, r] : moves_.restores()) count(r.kv.get());
    for (int32_t g = 0; g < cache_->num_groups(); ++g) {
      const int64_t in_use =
          int64_t{disk_staging_->storage().layout(g).num_blocks} - disk_staging_->num_free(g);
      KVP_CHECK(in_use == held[g], "disk staging group {}: {} blocks in use, {} held", g, in_use,
                held[g]);
    }
  }
  KVP_CHECK(host_bytes == stats_.host_tier_bytes_used, "host tier holds {} bytes, counted {}",
            host_bytes, stats_.host_tier_bytes_used);
  KVP_CHECK(disk_bytes == stats_.disk_tier_bytes_used, "disk tier holds {} bytes, counted {}",
            disk_bytes, stats_.disk_tier_bytes_used);
  KVP_CHECK(host_bytes <= config_.host_tier_bytes, "host tier holds {} bytes, budget {}",
            host_bytes, config_.host_tier_bytes);
  KVP_CHECK(disk_bytes <= config_.disk_tier_bytes, "disk tier holds {} bytes, budget {}",
            disk_bytes, config_.disk_tier_bytes);
}

}  // namespace kvp

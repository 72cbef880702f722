// Engine session tiers: an idle session's KV moves between the pool, host memory and cache
// files (docs/engine.md, "Session tiers"), least recently used first, within byte budgets.
//
//   pool ──move_down──▶ host copy (HostKv) ──move_to_disk──▶ spill file ──make_disk_room──▶ none
//     │                    (host tier off or full) ─────────▲                 (recomputed on its
//     │                    (disk tier off or full) ───────────────────────────▶  next turn)
//     ◀──────────── restore_session: on the session's next admission ─────────┘ (host or disk)
//
// A host copy holds the session's live blocks block for block (same KvLayout as the pool): in
// the host tier's slabs (engine/host_tier.h; pinned on CUDA) or, for a copy on its way to a file,
// in a storage of its own. Moving out and in is ForwardBackend::start_transfers: on CUDA one DMA
// per run of consecutive blocks on a copy stream, on the CPU one memcpy per block and layer. A
// cache file re-blocks (docs/cache-files.md), so files are the same whichever backend wrote
// them. Coming back, the session first takes what the prefix cache holds of its tokens (a shared
// system prompt stays one set of blocks) and copies in only the rest. The copies in flight are
// held by TierMoves (tier_moves.h): a restore's sequence joins a step over its copy where the
// policy says so (order_restore), or the first step that starts after the host finds the copy
// done (settle_restore); a write-back frees the session's blocks when its copy is done
// (finish_write_backs). The disk side (spill files written, read ahead, removed; saved sessions)
// is engine_files.cc.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <new>

#include "engine/engine.h"
#include "engine/engine_internal.h"

namespace kvp {

uint64_t Engine::live_bytes(SeqId seq_id) const {
  uint64_t bytes = 0;
  for (int32_t g = 0; g < cache_->num_groups(); ++g) {
    const BlockTable& table = cache_->table(seq_id, g);
    bytes += uint64_t(table.num_blocks() - table.num_dropped_blocks()) * cache_spec_.block_bytes(g);
  }
  return bytes;
}

std::unique_ptr<HostKv> Engine::copy_out(SeqId seq_id, int32_t num_tokens, HostTier* tier,
                                         std::unique_ptr<HostKv> base) {
  const auto start = std::chrono::steady_clock::now();
  uint64_t ticket = 0;
  std::unique_ptr<HostKv> kv = start_copy_out(seq_id, num_tokens, tier, &ticket, std::move(base));
  if (kv == nullptr) return nullptr;
  if (!moves_.wait(ticket, kv->copied_bytes, start, /*into_pool=*/false).is_ok()) return nullptr;
  return kv;
}

std::unique_ptr<HostKv> Engine::copy_out_to_host(SeqId seq_id, int32_t num_tokens,
                                                 std::unique_ptr<HostKv> base) {
  if (take_now() != TierMoves::Take::kOrderAfter) {
    return copy_out(seq_id, num_tokens, host_tier_.get(), std::move(base));
  }
  uint64_t ticket = 0;
  std::unique_ptr<HostKv> kv =
      start_copy_out(seq_id, num_tokens, host_tier_.get(), &ticket, std::move(base));
  if (kv == nullptr) return nullptr;
  if (!moves_.order_out(ticket, *kv).is_ok()) {
    (void)backend_->wait_transfers(ticket);  // before its blocks go
    return nullptr;
  }
  return kv;
}

std::unique_ptr<HostKv> Engine::copy_out_for_file(SeqId seq_id, int32_t num_tokens) {
  if (disk_staging_) {
    std::unique_ptr<HostKv> kv = copy_out(seq_id, num_tokens, disk_staging_.get());
    if (kv) return kv;
  }
  return copy_out(seq_id, num_tokens, nullptr);
}

bool Engine::keeps_copies() const {
  return config_.keep_restored_copies && host_tier_ != nullptr && cache_->num_groups() == 1;
}

void Engine::drop_kept_copy(SessionState& session) {
  if (!session.kept_copy) return;
  stats_.host_tier_bytes_used -= session.kept_copy->size_bytes;
  session.kept_copy.reset();
}

std::unique_ptr<HostKv> Engine::take_kept_copy(SessionState& session, SeqId seq_id) {
  if (!session.kept_copy) return nullptr;
  std::unique_ptr<HostKv> kept = std::move(session.kept_copy);
  stats_.host_tier_bytes_used -= kept->size_bytes;
  const BlockTable& table = cache_->table(seq_id, 0);
  const bool extends = cache_->num_groups() == 1 && table.num_dropped_blocks() == 0 &&
                       kept->tier == host_tier_.get() && kept->tables.size() == 1 &&
                       kept->num_tokens <= cache_->num_tokens(seq_id) &&
                       std::find(kept->tables[0].begin(), kept->tables[0].end(),
                                 HostKv::kNoBlock) == kept->tables[0].end();
  return extends ? std::move(kept) : nullptr;
}

std::unique_ptr<HostKv> Engine::start_copy_out(SeqId seq_id, int32_t num_tokens, HostTier* tier,
                                               uint64_t* ticket, std::unique_ptr<HostKv> base) {
  if (base != nullptr) return extend_copy(seq_id, num_tokens, std::move(base), ticket);
  const int32_t num_groups = cache_->num_groups();
  std::vector<int32_t> num_blocks(num_groups);  // [num_groups] live blocks
  for (int32_t g = 0; g < num_groups; ++g) {
    const BlockTable& table = cache_->table(seq_id, g);
    num_blocks[g] = table.num_blocks() - table.num_dropped_blocks();
  }
  std::unique_ptr<HostKv> kv;
  if (tier != nullptr) {
    auto blocks = tier->allocate(num_blocks);
    if (!blocks) return nullptr;
    kv = std::make_unique<HostKv>(tier, std::move(*blocks));
  } else {
    // every byte is written below: each live block fills its host block
    auto storage =
        HostKvStorage::create(cache_spec_, num_blocks, HostKvStorage::Init::kUninitialized);
    if (!storage.is_ok()) return nullptr;
    kv = std::make_unique<HostKv>(std::move(storage).value());
  }
  kv->num_tokens = num_tokens;
  *ticket = 0;
  for (int32_t g = 0; g < num_groups; ++g) {
    const BlockTable& table = cache_->table(seq_id, g);
    std::vector<BlockId> host_table(table.num_blocks(), HostKv::kNoBlock);
    std::vector<BlockTransfer> ops;
    for (int32_t i = table.num_dropped_blocks(); i < table.num_blocks(); ++i) {
      const int32_t k = i - table.num_dropped_blocks();
      host_table[i] = tier != nullptr ? kv->tier_blocks[g][k] : BlockId{k};
      ops.push_back({Pool::Device, table.blocks()[i], Pool::Host, host_table[i], g});
    }
    auto started = backend_->start_transfers(g, ops, kv->storage());
    if (!started.is_ok()) {
      // earlier groups' copies may still run into kv's blocks: wait before they are freed
      (void)backend_->wait_transfers(*ticket);
      return nullptr;
    }
    *ticket = *started;
    kv->tables.push_back(std::move(host_table));
    kv->size_bytes += uint64_t(num_blocks[g]) * cache_spec_.block_bytes(g);
  }
  kv->copied_bytes = kv->size_bytes;
  moves_.queue(kv->size_bytes, /*into_pool=*/false);
  return kv;
}

std::unique_ptr<HostKv> Engine::extend_copy(SeqId seq_id, int32_t num_tokens,
                                            std::unique_ptr<HostKv> kv, uint64_t* ticket) {
  // one group, no blocks dropped (take_kept_copy): kv's blocks hold the sequence's first ones
  const BlockTable& table = cache_->table(seq_id, 0);
  const auto num_kept = static_cast<int32_t>(kv->tables[0].size());
  const int32_t first = kv->num_tokens / config_.block_size;  // a partial last block: again
  KVP_CHECK(num_kept <= table.num_blocks() && first <= num_kept,
            "a kept copy of {} blocks ({} tokens) for a sequence of {}", num_kept, kv->num_tokens,
            table.num_blocks());
  const std::vector<int32_t> num_new = {table.num_blocks() - num_kept};
  auto blocks = kv->tier->allocate(num_new);
  if (!blocks) return nullptr;
  kv->tier_blocks[0].insert(kv->tier_blocks[0].end(), (*blocks)[0].begin(), (*blocks)[0].end());
  kv->tables[0].insert(kv->tables[0].end(), (*blocks)[0].begin(), (*blocks)[0].end());
  std::vector<BlockTransfer> ops;
  for (int32_t i = first; i < table.num_blocks(); ++i) {
    ops.push_back({Pool::Device, table.blocks()[i], Pool::Host, kv->tables[0][i], 0});
  }
  *ticket = 0;
  if (!ops.empty()) {
    auto started = backend_->start_transfers(0, ops, kv->storage());
    if (!started.is_ok()) return nullptr;
    *ticket = *started;
  }
  kv->num_tokens = num_tokens;
  kv->size_bytes = uint64_t(table.num_blocks()) * cache_spec_.block_bytes(0);
  kv->copied_bytes = uint64_t(ops.size()) * cache_spec_.block_bytes(0);
  moves_.queue(kv->copied_bytes, /*into_pool=*/false);
  return kv;
}

void Engine::start_write_backs() {
  if (!host_tier_ || config_.tier_watermark <= 0) return;
  const auto watermark = static_cast<int32_t>(config_.tier_watermark * config_.num_blocks);
  int32_t coming = moves_.num_write_back_blocks();  // pool blocks the write-backs in flight free
  while (cache_->allocator(0).num_available() + coming < watermark) {
    std::vector<SessionState*> idle;
    std::vector<int64_t> last_used;
    for (auto& [name, session] : sessions_) {
      if (session->busy || !session->resident || session->writing_back ||
          session->num_computed == 0) {
        continue;
      }
      idle.push_back(session.get());
      last_used.push_back(session->last_used);
    }
    const std::optional<size_t> pick = Scheduler::pick_idle_session(last_used);
    if (!pick) return;
    SessionState* lru = idle[*pick];
    const SeqId seq_id = *lru->resident;
    std::unique_ptr<HostKv> base = take_kept_copy(*lru, seq_id);  // uncharged now
    if (!make_host_room(live_bytes(seq_id), lru)) return;
    auto wb = std::make_unique<TierMoves::WriteBack>();
    wb->start = std::chrono::steady_clock::now();
    wb->kv =
        start_copy_out(seq_id, lru->num_computed, host_tier_.get(), &wb->ticket, std::move(base));
    if (wb->kv == nullptr) return;  // the synchronous path will try again when room is needed
    wb->kv->window_valid_from = lru->window_valid_from;
    wb->session = lru->name;
    wb->session_id = lru->id;
    wb->seq = seq_id;
    const BlockTable& table = cache_->table(seq_id, 0);
    wb->num_blocks = table.num_blocks() - table.num_dropped_blocks();
    stats_.host_tier_bytes_used += wb->kv->size_bytes;  // reserved now
    lru->writing_back = true;
    coming += wb->num_blocks;
    moves_.start_write_back(std::move(wb));
  }
}

TierMoves::Take Engine::take_now() const {
  return config_.copy_out_overlap && backend_->orders_by_layer() ? TierMoves::Take::kOrderAfter
                                                                 : TierMoves::Take::kWait;
}

int32_t Engine::finish_write_backs(TierMoves::Take oldest) {
  int32_t freed = 0;
  // only the oldest is waited for (or ordered after)
  for (TierMoves::Take how = oldest;; how = TierMoves::Take::kIfDone) {
    std::unique_ptr<TierMoves::WriteBack> done = moves_.take_write_back(how);
    if (done == nullptr) break;
    stats_.host_tier_bytes_used -= done->kv->size_bytes;
    auto it = sessions_.find(done->session);
    SessionState* session =
        it != sessions_.end() && it->second->id == done->session_id ? it->second.get() : nullptr;
    if (session == nullptr) continue;
    session->writing_back = false;
    // the copy holds the session only if nothing touched it meanwhile
    if (session->busy || session->resident != done->seq || session->host ||
        session->num_computed != done->kv->num_tokens) {
      continue;
    }
    freed += done->num_blocks;
    cache_->free_sequence(done->seq);
    session->resident.reset();
    stats_.host_tier_bytes_used += done->kv->size_bytes;
    session->host = std::move(done->kv);
    ++session->num_moves_to_host;
    ++stats_.num_session_moves_to_host;
  }
  return freed;
}

bool Engine::copy_in(SeqId seq_id, std::span<const int32_t> tokens, HostKv& kv, int32_t* num_shared,
                     TierMoves::Restore* pending) {
  flush_copies();  // a block freed this step may be the source of a pending copy
  const int32_t num_tokens = kv.num_tokens;
  KVP_CHECK(static_cast<int32_t>(tokens.size()) >= num_tokens, "{} tokens for KV of {}",
            tokens.size(), num_tokens);
  KVP_CHECK(cache_->num_tokens(seq_id) == 0, "copy into sequence {} holding tokens", seq_id.value);
  int32_t num_matched = 0;
  if (cache_->has_prefix_cache())
    num_matched = cache_->match_prefix(seq_id, tokens.first(num_tokens));
  // Grow block by block and the last token alone: a window group then holds only the blocks of
  // the window of the next token (those the copy covers), never the whole history at once.
  std::vector<GroupBlockCopy> copies;
  for (int32_t done = num_matched; done < num_tokens;) {
    const int32_t step =
        done < num_tokens - 1
            ? std::min(config_.block_size - done % config_.block_size, num_tokens - 1 - done)
            : 1;
    if (!cache_->append(seq_id, step, &copies)) {
      cache_->free_sequence(seq_id);
      cache_->add_sequence(seq_id);
      return false;
    }
    done += step;
  }
  KVP_CHECK(copies.empty(), "fresh blocks needed {} copies", copies.size());
  const auto start = std::chrono::steady_clock::now();
  uint64_t ticket = 0, bytes = 0;
  for (int32_t g = 0; g < cache_->num_groups(); ++g) {
    const BlockTable& table = cache_->table(seq_id, g);
    const int32_t first = std::max(table.num_dropped_blocks(), num_matched / config_.block_size);
    std::vector<BlockTransfer> ops;
    for (int32_t i = first; i < table.num_blocks(); ++i) {
      KVP_CHECK(kv.tables[g][i] != HostKv::kNoBlock, "group {} entry {}: the host copy lacks it", g,
                i);
      ops.push_back({Pool::Host, kv.tables[g][i], Pool::Device, table.blocks()[i], g});
    }
    // fresh blocks of this engine's own table: a refusal is a broken backend or a bug
    auto started = backend_->start_transfers(g, ops, kv.storage());
    KVP_CHECK(started.is_ok(), "the {} backend refused a session's blocks: {}",
              backend_->device_name(), started.status().to_string());
    ticket = *started;
    bytes += ops.size() * cache_spec_.block_bytes(g);
  }
  *num_shared = num_matched;
  const auto expected_end = moves_.queue(bytes, /*into_pool=*/true);
  if (pending != nullptr) {
    pending->ticket = ticket;
    pending->bytes = bytes;
    pending->start = start;
    pending->expected_end = expected_end;
    return true;
  }
  const Status copied = moves_.wait(ticket, bytes, start, /*into_pool=*/true);
  KVP_CHECK(copied.is_ok(), "the {} backend failed to copy a session's blocks: {}",
            backend_->device_name(), copied.to_string());
  return true;
}

bool Engine::settle_restore(SeqId seq_id, bool wait) {
  if (!moves_.is_restoring(seq_id)) return true;
  std::optional<TierMoves::Restore> done = moves_.settle(seq_id, wait);
  if (!done) return false;
  SessionState* session = nullptr;
  if (done->session_copy) {
    const auto& name = requests_.at(seq(seq_id).request_id)->request.session;
    auto it = name ? sessions_.find(*name) : sessions_.end();
    if (it != sessions_.end() && it->second->busy_seq == seq_id) session = it->second.get();
  }
  if (session != nullptr && !session->kept_copy) {
    session->kept_copy = std::move(done->kv);  // still charged: the session's now
  } else if (done->charged) {
    stats_.host_tier_bytes_used -= done->kv->size_bytes;
  }
  note_kv_copy_done(seq_id);
  // its blocks hold their KV now: other sequences may share them through the prefix cache
  register_full_blocks(seq(seq_id));
  return true;
}

bool Engine::order_restore(SeqId seq_id, bool holds_up_others) {
  const Sequence& s = seq(seq_id);
  return moves_.join_step(seq_id, int64_t(s.tokens.size()) - s.num_computed, holds_up_others);
}

void Engine::settle_ordered_restores() {
  for (SeqId id : moves_.ordered()) settle_restore(id, false);
}

void Engine::keep_restoring(Sequence& s, TierMoves::Restore pending) {
  moves_.start_restore(s.id, std::move(pending));
  settle_restore(s.id, false);  // a backend that copies synchronously (the CPU's) is done
}

Engine::Restore Engine::restore_session(SessionState& session, Sequence& s, bool wait) {
  std::unique_ptr<HostKv> from_file;
  HostKv* kv = session.host      ? session.host.get()
               : session.writing ? session.writing->kv.get()  // its file is still being written
                                 : nullptr;
  std::vector<int32_t> file_tokens;
  if (kv == nullptr) {
    Result<std::unique_ptr<HostKv>> read = Status::not_found("not read");
    std::unique_ptr<HostKv> staged;
    if (session.prefetch) {
      // read since the request arrived (start_prefetch), on a thread of its own
      const auto start = std::chrono::steady_clock::now();
      read = session.prefetch->kv.get();
      file_tokens = std::move(session.prefetch->tokens);
      staged = std::move(session.prefetch->staged);
      const bool counted = session.prefetch->kept;
      session.prefetch.reset();
      if (read.is_ok() && !counted)
        stats_.file_reads.count_timed((*read ? read->get() : staged.get())->size_bytes, start);
    } else {
      staged = stage_file_read(session.num_computed);
      if (!staged && disk_staging_) ++stats_.num_file_reads_pageable;
      read = read_file(session.file, &file_tokens, staged.get());
    }
    if (read.is_ok() && *read == nullptr) read = std::move(staged);  // it went into the staging
    const bool same_history =
        read.is_ok() && file_tokens.size() <= session.tokens.size() &&
        std::equal(file_tokens.begin(), file_tokens.end(), session.tokens.begin()) &&
        static_cast<int32_t>(file_tokens.size()) == session.num_computed;
    if (!same_history) {
      // the file went missing or changed under us: the history is recomputed
      ++stats_.num_tier_errors;
      drop_kv(session);
      ++session.num_evictions;
      ++stats_.num_session_evictions;
      return Restore::kFailed;
    }
    from_file = std::move(read).value();
    kv = from_file.get();
  }
  // a copy from a spill file's writer source is waited for: the writer may free it when done
  const bool keep = !wait && (kv == session.host.get() || kv == from_file.get());
  int32_t num_shared = 0;
  TierMoves::Restore pending;
  if (!copy_in(s.id, s.tokens, *kv, &num_shared, keep ? &pending : nullptr)) {
    // what was read stays for the next try (the session's request is still waiting), not read
    // from the disk again
    if (from_file) keep_read(session, std::move(from_file), std::move(file_tokens));
    return Restore::kNoRoom;
  }
  s.num_computed = kv->num_tokens;
  s.num_registered_blocks = 0;
  s.window_valid_from = kv->window_valid_from;
  ++session.num_restores;
  session.num_resumed_tokens += s.num_computed;
  ++stats_.num_session_restores;
  stats_.num_restored_tokens += s.num_computed - num_shared;
  stats_.num_prefix_hit_tokens += num_shared;
  if (keep) {
    pending.charged = kv == session.host.get();  // its bytes stay charged until the copy is done
    pending.session_copy = pending.charged && keeps_copies();  // then kept (settle_restore)
    pending.kv = pending.charged ? std::move(session.host) : std::move(from_file);
    drop_kv(session);  // the pool holds it now (once the copy completes)
    keep_restoring(s, std::move(pending));
    return Restore::kDone;
  }
  register_full_blocks(s);  // now, so sessions restored in this step share what it brought
  std::unique_ptr<HostKv> kept =
      kv == session.host.get() && keeps_copies() ? std::move(session.host) : nullptr;
  drop_kv(session);                     // the pool holds it now
  session.kept_copy = std::move(kept);  // still charged
  return Restore::kDone;
}

void Engine::move_down(SessionState& session) {
  KVP_CHECK(session.resident && !session.host && session.file.empty(),
            "session '{}' is not (only) in the pool", session.name);
  const SeqId seq_id = *session.resident;
  const int32_t num_tokens = session.num_computed;
  const IdleSessionTiers tiers = Scheduler::tiers_for_idle_session(
      num_tokens, host_tier_ != nullptr, !config_.disk_dir.empty(), file_size_bytes(num_tokens),
      config_.disk_tier_bytes);
  std::unique_ptr<HostKv> kv;
  std::unique_ptr<HostKv> base = take_kept_copy(session, seq_id);  // uncharged now
  if (tiers.host && make_host_room(live_bytes(seq_id), &session)) {
    kv = copy_out_to_host(seq_id, num_tokens, std::move(base));
    if (kv) {
      kv->window_valid_from = session.window_valid_from;
      cache_->free_sequence(seq_id);
      session.resident.reset();
      stats_.host_tier_bytes_used += kv->size_bytes;
      session.host = std::move(kv);
      ++session.num_moves_to_host;
      ++stats_.num_session_moves_to_host;
      return;
    }
  }
  if (tiers.disk) {
    kv = copy_out_for_file(seq_id, num_tokens);
    if (kv) kv->window_valid_from = session.window_valid_from;
  }
  cache_->free_sequence(seq_id);
  session.resident.reset();
  if (kv) {
    move_to_disk(session, std::move(kv));
    return;
  }
  drop_kv(session);
  ++session.num_evictions;
  ++stats_.num_session_evictions;
}

bool Engine::make_host_room(uint64_t size_bytes, const SessionState* keep) {
  if (size_bytes > config_.host_tier_bytes) return false;
  while (stats_.host_tier_bytes_used + size_bytes > config_.host_tier_bytes) {
    // kept copies first (their sessions' KV is in the pool: only a later copy's saving is lost)
    SessionState* lru = nullptr;
    for (auto& [name, x] : sessions_) {
      if (!x->kept_copy || x.get() == keep) continue;
      if (lru == nullptr || x->last_used < lru->last_used) lru = x.get();
    }
    if (lru != nullptr) {
      drop_kept_copy(*lru);
      continue;
    }
    for (auto& [name, x] : sessions_) {
      if (x->busy || !x->host || x.get() == keep) continue;
      if (lru == nullptr || x->last_used < lru->last_used) lru = x.get();
    }
    if (lru == nullptr) return false;
    std::unique_ptr<HostKv> kv = std::move(lru->host);
    stats_.host_tier_bytes_used -= kv->size_bytes;
    move_to_disk(*lru, std::move(kv));
  }
  return true;
}

void Engine::drop_kv(SessionState& session) {
  drop_kept_copy(session);
  if (session.resident) {
    cache_->free_sequence(*session.resident);
    session.resident.reset();
  }
  if (session.host) {
    stats_.host_tier_bytes_used -= session.host->size_bytes;
    session.host.reset();
  }
  session.prefetch.reset();  // waits for a read in flight
  if (session.writing) {
    // still being written: removed when written (settle_file_writes), the engine goes on
    orphan_writes_.push_back(std::move(session.writing));
  } else if (session.owns_file) {
    remove_spill_file(session.file);
  }
  if (session.owns_file) stats_.disk_tier_bytes_used -= session.disk_bytes;
  session.file.clear();
  session.owns_file = false;
  session.disk_bytes = 0;
  session.num_computed = 0;
  session.window_valid_from = 0;
}

void Engine::truncate_session(SessionState& session, int32_t num_tokens) {
  KVP_CHECK(
      !session.busy && num_tokens >= 0 && num_tokens <= static_cast<int32_t>(session.tokens.size()),
      "truncate_session '{}' to {} tokens", session.name, num_tokens);
  session.tokens.resize(num_tokens);
  if (session.kept_copy && session.kept_copy->num_tokens > num_tokens) drop_kept_copy(session);
  if (session.num_computed <= num_tokens) return;
  bool truncated = false;
  if (session.resident) {
    truncated = true;
    for (int32_t g = 0; g < cache_->num_groups(); ++g) {
      truncated = truncated && cache_->table(*session.resident, g).can_truncate(num_tokens);
    }
    if (truncated) {
      cache_->truncate(*session.resident, num_tokens);
      session.num_computed = num_tokens;
    }
  }
  if (!truncated) drop_kv(session);
}

void Engine::settle_tier_moves() {
  moves_.land_all();
  while (!moves_.write_backs().empty()) finish_write_backs(TierMoves::Take::kWait);
  while (!moves_.restores().empty()) settle_restore(moves_.restores().begin()->first, true);
  if (!file_writer_) return;
  file_writer_->drain();
  settle_file_writes();  // may queue the removal of files written for sessions since dropped
  file_writer_->drain();
}

Status Engine::complete_kv(SessionState& session) {
  const int32_t num_tokens = static_cast<int32_t>(session.tokens.size());
  if (session.num_computed == num_tokens) return Status::ok();
  // into the pool (where the model can run), then the tokens without KV through the model
  Sequence s;
  s.id = SeqId(next_seq_id_++);
  s.tokens = session.tokens;
  s.resident = true;
  if (session.resident) {
    s.id = *session.resident;
    s.num_computed = session.num_computed;
    s.window_valid_from = session.window_valid_from;
    session.resident.reset();
    session.num_computed = 0;
  } else {
    cache_->add_sequence(s.id);
    if (session.host || !session.file.empty()) {
      Restore restored = restore_session(session, s);
      while (restored == Restore::kNoRoom && evict_idle_session()) {
        restored = restore_session(session, s);
      }
      if (restored == Restore::kNoRoom) {
        cache_->free_sequence(s.id);
        return Status::resource_exhausted(
            "session '{}': the pool cannot hold its {} tokens to finish its KV", session.name,
            session.num_computed);
      }
    }
  }
  // from here on the sequence holds the session's KV: on any outcome it goes back to the session
  auto give_back = [&] {
    session.resident = s.id;
    session.num_computed = s.num_computed;
    session.window_valid_from = s.window_valid_from;
  };
  while (s.num_computed < num_tokens) {
    const int32_t chunk = std::min(num_tokens - s.num_computed, config_.max_step_tokens);
    while (!cache_->can_append(s.id, chunk) && evict_idle_session()) {
    }
    if (!cache_->append(s.id, chunk, &pending_copies_, computed_tokens(s))) {
      give_back();
      return Status::resource_exhausted(
          "session '{}': the pool cannot hold its {} tokens to finish its KV", session.name,
          num_tokens);
    }
    const BatchEntry entry{s.id, &s.tokens, s.num_computed, chunk, true};
    std::vector<float> logits;
    run_model(std::span(&entry, 1), &logits);
    s.num_computed += chunk;
    stats_.num_prefill_tokens += chunk;
  }
  give_back();
  return Status::ok();
}

}  // namespace kvp

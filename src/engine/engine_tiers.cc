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
// (finish_write_backs).
#include <unistd.h>

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

Result<std::unique_ptr<HostKv>> Engine::read_file(const std::filesystem::path& path,
                                                  std::vector<int32_t>* tokens, HostKv* into) {
  const auto start = std::chrono::steady_clock::now();
  auto kv = load_file(path, tokens, into);
  if (kv.is_ok()) stats_.file_reads.count_timed((*kv ? kv->get() : into)->size_bytes, start);
  return kv;
}

std::vector<int32_t> Engine::file_blocks(int64_t num_tokens) const {
  const int32_t block_size = config_.block_size;
  const auto num_entries = static_cast<int32_t>((num_tokens + block_size - 1) / block_size);
  std::vector<int32_t> num_blocks;  // [num_groups]
  for (int32_t g = 0; g < cache_spec_.num_groups(); ++g) {
    const int64_t begin =
        num_tokens - cache_spec_.kept_tokens(cache_spec_.group(g).layers.front(), num_tokens);
    num_blocks.push_back(num_entries - static_cast<int32_t>(begin / block_size));
  }
  return num_blocks;
}

std::unique_ptr<HostKv> Engine::stage_file_read(int32_t num_tokens) {
  if (!disk_staging_ || num_tokens <= 0) return nullptr;
  auto blocks = disk_staging_->allocate(file_blocks(num_tokens));
  if (!blocks) return nullptr;
  auto kv = std::make_unique<HostKv>(disk_staging_.get(), std::move(*blocks));
  kv->num_tokens = num_tokens;  // what the blocks were taken for; the read fills the rest
  return kv;
}

Result<std::unique_ptr<HostKv>> Engine::load_file(const std::filesystem::path& path,
                                                  std::vector<int32_t>* tokens,
                                                  HostKv* into) const {
  auto file = CacheFile::read(path, fingerprint_, cache_spec_);
  if (!file.is_ok()) return file.status();
  const int32_t vocab = backend_->spec().vocab_size;
  for (int32_t t : file->token_ids()) {
    if (t < 0 || t >= vocab) {
      return Status::corruption("cache file '{}': token id {} outside the vocabulary of {}",
                                path.string(), t, vocab);
    }
  }
  const int64_t num_tokens = file->num_tokens();
  if (num_tokens > int64_t{config_.num_blocks} * config_.block_size) {
    return Status::invalid_argument("cache file '{}': {} tokens exceed the pool of {} blocks",
                                    path.string(), num_tokens, config_.num_blocks);
  }
  const int32_t block_size = config_.block_size;
  const int32_t num_entries = static_cast<int32_t>((num_tokens + block_size - 1) / block_size);
  const std::vector<int32_t> num_blocks = file_blocks(num_tokens);
  for (int32_t g = 0; g < cache_spec_.num_groups(); ++g) {
    if (num_blocks[g] != num_entries - file->group_token_begin(g) / block_size) {
      return Status::corruption("cache file '{}': group {} keeps tokens from {}, not the model's",
                                path.string(), g, file->group_token_begin(g));
    }
  }
  // the staging blocks only if they were taken for this many tokens (the file may have changed)
  const bool staged = into != nullptr && into->num_tokens == num_tokens && into->tables.empty() &&
                      into->tier_blocks.size() == num_blocks.size();
  std::unique_ptr<HostKv> own;
  HostKv* kv = into;
  if (!staged) {
    auto storage = HostKvStorage::create(cache_spec_, num_blocks);
    if (!storage.is_ok()) return storage.status();
    own = std::make_unique<HostKv>(std::move(storage).value());
    kv = own.get();
  }
  kv->num_tokens = static_cast<int32_t>(num_tokens);
  for (int32_t g = 0; g < cache_spec_.num_groups(); ++g) {
    const int32_t first = num_entries - num_blocks[g];
    std::vector<BlockId> table(num_entries, HostKv::kNoBlock);
    for (int32_t i = first; i < num_entries; ++i) {
      table[i] = staged ? kv->tier_blocks[g][i - first] : BlockId{i - first};
    }
    kv->tables.push_back(std::move(table));
    kv->size_bytes += uint64_t(num_blocks[g]) * cache_spec_.block_bytes(g);
    // a window group keeps the last W tokens: the block they start in is valid only in part
    const int64_t begin = file->group_token_begin(g);
    if (begin % block_size != 0) {
      kv->window_valid_from = std::max(kv->window_valid_from, static_cast<int32_t>(begin));
    }
  }
  Status tables_ok = file->check_tables(kv->storage(), kv->tables);
  KVP_CHECK(tables_ok.is_ok(), "{}", tables_ok.to_string());
  file->scatter_into(kv->storage(), kv->tables);
  if (tokens != nullptr) tokens->assign(file->token_ids().begin(), file->token_ids().end());
  return own;  // null when the KV went into `into`
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

void Engine::move_to_disk(SessionState& session, std::unique_ptr<HostKv> kv) {
  const uint64_t size_bytes = file_size_bytes(kv->num_tokens);
  session.num_computed = kv->num_tokens;
  session.window_valid_from = kv->window_valid_from;
  // the writer reads it: a copy still landing in it lands first (an error: it is dropped)
  if (!config_.disk_dir.empty() && kv->land().is_ok() && make_disk_room(size_bytes, &session)) {
    std::error_code ec;
    std::filesystem::create_directories(config_.disk_dir, ec);
    const std::filesystem::path path = spill_path(session);
    if (!file_writer_) file_writer_ = std::make_unique<FileWriter>();
    auto pending = std::make_unique<PendingWrite>();
    pending->start = std::chrono::steady_clock::now();
    pending->path = path;
    FileWriter::Job job;
    job.path = path;
    job.fingerprint = fingerprint_;
    job.storage = &kv->storage();
    job.tables = &kv->tables;
    job.tokens.assign(session.tokens.begin(), session.tokens.begin() + kv->num_tokens);
    pending->id = file_writer_->submit(std::move(job));
    pending->kv = std::move(kv);
    session.writing = std::move(pending);
    session.file = path;
    session.owns_file = true;
    session.disk_bytes = size_bytes;
    stats_.disk_tier_bytes_used += size_bytes;
    ++session.num_moves_to_disk;
    ++stats_.num_session_moves_to_disk;
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

bool Engine::make_disk_room(uint64_t size_bytes, const SessionState* keep) {
  if (size_bytes > config_.disk_tier_bytes) return false;
  while (stats_.disk_tier_bytes_used + size_bytes > config_.disk_tier_bytes) {
    SessionState* lru = nullptr;
    for (auto& [name, x] : sessions_) {
      if (x->busy || !x->owns_file || x.get() == keep) continue;
      if (lru == nullptr || x->last_used < lru->last_used) lru = x.get();
    }
    if (lru == nullptr) return false;
    drop_kv(*lru);
    ++lru->num_evictions;
    ++stats_.num_session_evictions;
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

void Engine::keep_read(SessionState& session, std::unique_ptr<HostKv> kv,
                       std::vector<int32_t> tokens) {
  auto kept = std::make_unique<Prefetch>();
  kept->kept = true;
  kept->tokens = std::move(tokens);
  std::promise<Result<std::unique_ptr<HostKv>>> ready;
  if (kv->tier != nullptr && kv->tier == disk_staging_.get()) {
    kept->staged = std::move(kv);  // where check_integrity counts staging blocks
    ready.set_value(std::unique_ptr<HostKv>());
  } else {
    ready.set_value(std::move(kv));
  }
  kept->kv = ready.get_future();
  session.prefetch = std::move(kept);
}

void Engine::start_prefetch(SessionState& session) {
  if (session.prefetch || session.host || session.writing || session.file.empty()) return;
  std::unique_ptr<HostKv> staged = stage_file_read(session.num_computed);
  if (!staged && disk_staging_ && session.num_computed > 0) {
    // pinned room is taken by spill copies still being written: read once they are (a read
    // into pageable memory would make its restore a synchronous copy), unless the staging tier
    // could never hold it
    const std::vector<int32_t> needed = file_blocks(session.num_computed);
    bool fits = true;
    for (size_t g = 0; g < needed.size(); ++g) {
      fits &= needed[g] <= disk_staging_->storage().layout(static_cast<int32_t>(g)).num_blocks;
    }
    if (fits) {
      if (std::find(deferred_reads_.begin(), deferred_reads_.end(), session.name) ==
          deferred_reads_.end()) {
        deferred_reads_.push_back(session.name);
        ++stats_.num_file_reads_deferred;
      }
      return;
    }
  }
  if (!staged && disk_staging_) ++stats_.num_file_reads_pageable;
  auto prefetch = std::make_unique<Prefetch>();
  Prefetch* p = prefetch.get();
  p->staged = std::move(staged);
  p->kv = std::async(std::launch::async, [this, p, path = session.file] {
    return load_file(path, &p->tokens, p->staged.get());
  });
  session.prefetch = std::move(prefetch);
}

void Engine::start_deferred_reads() {
  std::vector<std::string> names = std::move(deferred_reads_);
  deferred_reads_.clear();
  for (const std::string& name : names) {
    auto it = sessions_.find(name);
    // a request still waits for it (start_prefetch finds whether its KV is still in the file)
    if (it == sessions_.end() || !it->second->busy) continue;
    start_prefetch(*it->second);  // or put off again, in order
  }
}

void Engine::remove_spill_file(const std::filesystem::path& path) {
  if (file_writer_) {
    file_writer_->remove(path);  // off the engine loop, after the writes queued before
    return;
  }
  std::error_code ec;
  std::filesystem::remove(path, ec);
}

void Engine::settle_tier_moves() {
  moves_.land_all();
  while (!moves_.write_backs().empty()) finish_write_backs(TierMoves::Take::kWait);
  while (!moves_.restores().empty()) settle_restore(moves_.restores().begin()->first, true);
  if (!file_writer_) return;
  file_writer_->drain();
  settle_file_writes();
}

void Engine::settle_file_writes() {
  if (!file_writer_) return;
  for (auto& [id, status] : file_writer_->poll()) {
    auto orphan = std::find_if(orphan_writes_.begin(), orphan_writes_.end(),
                               [id = id](const auto& w) { return w->id == id; });
    if (orphan != orphan_writes_.end()) {
      remove_spill_file((*orphan)->path);
      orphan_writes_.erase(orphan);
      continue;
    }
    for (auto& [name, session] : sessions_) {
      if (!session->writing || session->writing->id != id) continue;
      std::unique_ptr<PendingWrite> done = std::move(session->writing);
      if (status.is_ok()) {
        stats_.file_writes.count_timed(session->disk_bytes, done->start);
        // a request waits for it (its session was moved down while it waited): read it back
        // from now on, not when it is admitted
        if (session->busy) start_prefetch(*session);
        break;
      }
      // the file could not be written: the KV goes, as when a read fails (unless a request is
      // using it, restored from the copy: then the pool holds it and only the file goes)
      ++stats_.num_tier_errors;
      stats_.disk_tier_bytes_used -= session->disk_bytes;
      session->file.clear();
      session->owns_file = false;
      session->disk_bytes = 0;
      if (!session->busy && !session->resident && !session->host) {
        session->num_computed = 0;
        session->window_valid_from = 0;
        ++session->num_evictions;
        ++stats_.num_session_evictions;
      }
      break;
    }
  }
}

uint64_t Engine::file_size_bytes(int32_t num_tokens) const {
  // docs/cache-files.md: 48 + A + 8L + 4N + sum over layers of 2 K_l H D E + 8
  uint64_t size_bytes = 48 + fingerprint_.architecture.size() +
                        8 * uint64_t(cache_spec_.num_layers()) + 4 * uint64_t(num_tokens) + 8;
  for (int32_t layer = 0; layer < cache_spec_.num_layers(); ++layer) {
    size_bytes += static_cast<uint64_t>(cache_spec_.kept_tokens(layer, num_tokens)) *
                  cache_spec_.layer_token_bytes();
  }
  return size_bytes;
}

std::filesystem::path Engine::spill_path(const SessionState& session) const {
  return std::filesystem::path(config_.disk_dir) /
         fmt::format("kvpool-{}-{}-session-{}.kvc", ::getpid(), instance_id_, session.id);
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

Status Engine::save_session(const std::string& name, const std::filesystem::path& path) {
  auto it = sessions_.find(name);
  if (it == sessions_.end()) {
    return Status::not_found("save session '{}': no such session", name);
  }
  SessionState& session = *it->second;
  if (session.busy) {
    return Status::invalid_argument("save session '{}': busy with a request", name);
  }
  if (session.tokens.empty()) {
    return Status::invalid_argument("save session '{}': it holds no tokens", name);
  }
  KVP_RETURN_IF_ERROR(complete_kv(session));
  std::unique_ptr<HostKv> copy;
  const HostKv* kv = session.host.get();
  if (session.resident) {
    copy = copy_out_for_file(*session.resident, session.num_computed);
    if (!copy) {
      return Status::resource_exhausted("save session '{}': no host memory for its KV", name);
    }
    kv = copy.get();
  } else if (session.writing) {
    kv = session.writing->kv.get();
  } else if (!session.file.empty()) {
    auto read = read_file(session.file, nullptr);
    if (!read.is_ok()) {
      return Status(read.status().code(),
                    fmt::format("save session '{}': {}", name, read.status().message()));
    }
    copy = std::move(read).value();
    kv = copy.get();
  }
  KVP_CHECK(kv != nullptr, "session '{}' has complete KV in no tier", name);
  if (session.host) KVP_RETURN_IF_ERROR(session.host->land());
  Status st = write_cache_file(path, fingerprint_, kv->storage(),
                               std::span(session.tokens).first(kv->num_tokens), kv->tables);
  if (!st.is_ok()) {
    return Status(st.code(), fmt::format("save session '{}': {}", name, st.message()));
  }
  return Status::ok();
}

Status Engine::load_session(const std::string& name, const std::filesystem::path& path) {
  if (name.empty()) return Status::invalid_argument("load session: empty session name");
  if (sessions_.contains(name)) {
    return Status::invalid_argument("load session '{}': a session of that name exists", name);
  }
  std::vector<int32_t> tokens;
  auto kv = read_file(path, &tokens);
  if (!kv.is_ok()) {
    return Status(kv.status().code(),
                  fmt::format("load session '{}': {}", name, kv.status().message()));
  }
  if (tokens.empty()) {
    return Status::invalid_argument("load session '{}': cache file '{}' holds no tokens", name,
                                    path.string());
  }
  auto session = std::make_unique<SessionState>();
  session->id = next_session_id_++;
  session->name = name;
  session->tokens = std::move(tokens);
  session->num_computed = (*kv)->num_tokens;
  session->window_valid_from = (*kv)->window_valid_from;
  session->last_used = ++session_clock_;
  // the copy just read goes to the host tier if it fits; otherwise the file is the disk tier
  if (make_host_room((*kv)->size_bytes, session.get())) {
    stats_.host_tier_bytes_used += (*kv)->size_bytes;
    session->host = std::move(kv).value();
  } else {
    session->file = std::filesystem::absolute(path);
  }
  sessions_.emplace(name, std::move(session));
  return Status::ok();
}

}  // namespace kvp

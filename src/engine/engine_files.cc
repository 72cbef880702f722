// Engine disk tier: spill files written on the FileWriter's thread, read back ahead of a
// waiting request's admission, removed when no longer needed; saved and loaded sessions
// (docs/engine.md, "Session tiers"; docs/cache-files.md for the format).
//
//   move_to_disk ──FileWriter::submit──▶ spill file ──settle_file_writes──▶ written (or error)
//   request arrives / file written for a waiting request ──start_prefetch──▶ read thread
//        └─(staging tier full)──▶ deferred_reads_ ──start_deferred_reads (each step)──┘
//   restore_session (engine_tiers.cc) ◀── the read (Prefetch), or read_file when none ran
//   drop_kv ──remove_spill_file──▶ FileWriter::remove (after the writes queued before it)
//
// Reads land in the pinned staging tier where the backend has one (disk_staging_, CUDA without
// a host tier), so a restore is one DMA per run of blocks; a read that would land in pageable
// memory instead waits for staging room, its request passed over meanwhile (kv_at_hand).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <future>

#include "engine/engine.h"
#include "engine/engine_internal.h"

namespace kvp {

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

std::filesystem::path Engine::spill_path(const SessionState& session) {
  return std::filesystem::path(config_.disk_dir) / fmt::format("kvpool-{}-{}-session-{}-{}.kvc",
                                                               ::getpid(), instance_id_, session.id,
                                                               ++num_spill_paths_);
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

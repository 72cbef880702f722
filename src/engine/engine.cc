#include "engine/engine.h"
#include "engine/engine_internal.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <limits>
#include <span>
#include <thread>

#include "engine/device_sampling.h"

namespace kvp {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kAborted:
      return "aborted";
  }
  return "?";
}

const char* session_tier_name(SessionTier tier) {
  switch (tier) {
    case SessionTier::kDevice:
      return "device";
    case SessionTier::kHost:
      return "host";
    case SessionTier::kDisk:
      return "disk";
    case SessionTier::kNone:
      return "none";
  }
  return "?";
}

namespace {

Result<CacheSpec> make_cache_spec(const ModelSpec& spec, const EngineConfig& config) {
  std::vector<LayerAttention> attention;
  for (int32_t l = 0; l < spec.num_layers; ++l) {
    attention.push_back(spec.layer_is_sliding[l] ? LayerAttention::sliding(spec.sliding_window)
                                                 : LayerAttention::global());
  }
  return CacheSpec::create(architecture_name(spec.architecture), spec.num_layers, spec.num_kv_heads,
                           spec.head_dim, config.kv_dtype, config.block_size, std::move(attention));
}

// The weight hash of a cache file: the caller's hash of the weights mixed with the model's
// hyper-parameters (two models of one geometry but another vocabulary or rope differ).
ModelFingerprint make_fingerprint(const ModelSpec& spec, const EngineConfig& config) {
  uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&h](uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0x100000001b3ull;
  };
  mix(static_cast<uint64_t>(spec.architecture));
  mix(static_cast<uint64_t>(spec.vocab_size));
  mix(static_cast<uint64_t>(spec.hidden_size));
  mix(static_cast<uint64_t>(spec.intermediate_size));
  mix(static_cast<uint64_t>(spec.num_q_heads));
  mix(std::bit_cast<uint64_t>(spec.rope_global.theta));
  mix(std::bit_cast<uint64_t>(spec.rope_local.theta));
  mix(std::bit_cast<uint32_t>(spec.rms_norm_eps));
  mix(config.model_weight_hash);
  return ModelFingerprint{architecture_name(spec.architecture), h};
}

// The cache spec of a config that passes Engine::check_config (aborts otherwise).
CacheSpec checked_cache_spec(const ForwardBackend& backend, const EngineConfig& config) {
  const Status config_ok = Engine::check_config(backend, config);
  KVP_CHECK(config_ok.is_ok(), "{}", config_ok.to_string());
  return make_cache_spec(backend.spec(), config).value();
}

}  // namespace

Status EngineConfig::validate() const {
  if (block_size < 1 || block_size > 1024 || (block_size & (block_size - 1)) != 0) {
    return Status::invalid_argument("engine: block size {} is not a power of two in [1, 1024]",
                                    block_size);
  }
  if (num_blocks < 1) return Status::invalid_argument("engine: {} blocks", num_blocks);
  if (max_num_seqs < 1) return Status::invalid_argument("engine: max_num_seqs {}", max_num_seqs);
  if (max_step_tokens < 1) {
    return Status::invalid_argument("engine: max_step_tokens {}", max_step_tokens);
  }
  if (!(tier_watermark >= 0.0 && tier_watermark <= 1.0)) {
    return Status::invalid_argument("engine: tier watermark {} outside [0, 1]", tier_watermark);
  }
  if (sampler_threads < 0) {
    return Status::invalid_argument("engine: sampler_threads {} (0: automatic)", sampler_threads);
  }
  if (disk_dir.empty() != (disk_tier_bytes == 0)) {
    return Status::invalid_argument(
        "engine: the disk tier needs both a directory ('{}') and a byte budget ({})", disk_dir,
        disk_tier_bytes);
  }
  // created on first use; a file of that name would make every spill fail, the tier silently off
  std::error_code ec;
  if (!disk_dir.empty() && std::filesystem::exists(disk_dir, ec) &&
      !std::filesystem::is_directory(disk_dir, ec)) {
    return Status::invalid_argument("engine: the disk tier directory '{}' is not a directory",
                                    disk_dir);
  }
  return Status::ok();
}

Status Engine::check_config(const ForwardBackend& backend, const EngineConfig& config) {
  KVP_RETURN_IF_ERROR(config.validate());
  Status dtype_ok = backend.check_kv_dtype(config.kv_dtype);
  if (!dtype_ok.is_ok()) {
    return Status::invalid_argument("engine: KV dtype on {}: {}", backend.device_name(),
                                    dtype_ok.message());
  }
  Result<CacheSpec> cache_spec = make_cache_spec(backend.spec(), config);
  if (!cache_spec.is_ok()) {
    return Status::invalid_argument("engine: the KV pool of this model: {}",
                                    cache_spec.status().message());
  }
  if (cache_spec->num_groups() != backend.num_cache_groups()) {
    return Status::invalid_argument("engine: the cache spec has {} groups, the backend {}",
                                    cache_spec->num_groups(), backend.num_cache_groups());
  }
  for (int32_t g = 0; g < backend.num_cache_groups(); ++g) {
    if (backend.group_layout(g, config.num_blocks, config.block_size, config.kv_dtype) !=
        cache_spec->group_layout(g, config.num_blocks)) {
      // host copies and cache files assume the cache spec's layout (block images)
      return Status::invalid_argument(
          "engine: group {}: the backend's KV layout differs from the cache spec's", g);
    }
  }
  return Status::ok();
}

Result<std::unique_ptr<Engine>> Engine::create(ForwardBackend* backend, EngineConfig config) {
  KVP_CHECK(backend != nullptr, "an engine needs a backend");
  KVP_RETURN_IF_ERROR(check_config(*backend, config));
  std::unique_ptr<Engine> engine(new Engine(backend, std::move(config), Unallocated{}));
  KVP_RETURN_IF_ERROR(engine->allocate_pool());
  return engine;
}

Engine::Engine(ForwardBackend* backend, EngineConfig config)
    : Engine(backend, std::move(config), Unallocated{}) {
  const Status allocated = allocate_pool();
  KVP_CHECK(allocated.is_ok(), "{}", allocated.to_string());
}

Engine::Engine(ForwardBackend* backend, EngineConfig config, Unallocated)
    : backend_(backend),
      config_(std::move(config)),
      cache_spec_(checked_cache_spec(*backend_, config_)),
      fingerprint_(make_fingerprint(backend_->spec(), config_)),
      moves_(backend_, &preemption_cost_,
             TierMoves::Policy{config_.restore_overlap, config_.restore_joins_step}),
      scheduler_(SchedulerConfig{config_.max_num_seqs, config_.max_step_tokens}) {
  static std::atomic<uint64_t> num_engines{0};
  instance_id_ = num_engines.fetch_add(1);
  int32_t sampler_threads = config_.sampler_threads;
  if (sampler_threads == 0) {
    sampler_threads = static_cast<int32_t>(std::min(8u, std::thread::hardware_concurrency()));
  }
  if (sampler_threads > 1) sampler_pool_ = std::make_unique<ThreadPool>(sampler_threads);
  std::vector<CacheGroupConfig> groups;
  for (int32_t g = 0; g < backend_->num_cache_groups(); ++g) {
    CacheGroupConfig group;
    group.num_blocks = config_.num_blocks;
    group.block_size = config_.block_size;
    group.window_tokens = backend_->group_is_sliding(g) ? backend_->spec().sliding_window : 0;
    groups.push_back(group);
  }
  std::optional<uint64_t> salt;
  if (config_.prefix_caching) {
    // the salt ties cached blocks to this model geometry and KV dtype
    const ModelSpec& spec = backend_->spec();
    salt = (uint64_t(spec.num_layers) << 40) ^ (uint64_t(spec.hidden_size) << 20) ^
           (uint64_t(spec.vocab_size) << 4) ^ uint64_t(config_.kv_dtype);
  }
  cache_ = std::make_unique<KvCacheManager>(groups, salt);
}

Status Engine::allocate_pool() {
  std::vector<KvLayout> layouts;
  for (int32_t g = 0; g < backend_->num_cache_groups(); ++g) {
    layouts.push_back(cache_spec_.group_layout(g, config_.num_blocks));
  }
  Status allocated = backend_->allocate_kv(layouts);
  if (!allocated.is_ok()) {
    return Status(
        allocated.code(),
        fmt::format("engine: a KV pool of {} blocks of {} tokens on {}: {}", config_.num_blocks,
                    config_.block_size, backend_->device_name(), allocated.message()));
  }
  if (config_.host_tier_bytes > 0) {
    auto tier =
        HostTier::create(cache_spec_, config_.host_tier_bytes, backend_->host_slab_allocator());
    if (!tier.is_ok()) {
      return Status(tier.status().code(), fmt::format("engine: {}", tier.status().message()));
    }
    host_tier_ = std::move(tier).value();
    probe_copy_rate();
  } else if (config_.disk_tier_bytes > 0 && backend_->host_slab_allocator() != nullptr) {
    // pinned staging for spill copies (where the backend has pinned memory): the pool's size
    // (any one session fits), at most the disk tier and 4 GiB
    uint64_t pool_bytes = 0;
    for (int32_t g = 0; g < cache_spec_.num_groups(); ++g) {
      pool_bytes += uint64_t(config_.num_blocks) * cache_spec_.block_bytes(g);
    }
    const uint64_t bytes = std::min({pool_bytes, config_.disk_tier_bytes, uint64_t{4} << 30});
    auto staging = HostTier::create(cache_spec_, bytes, backend_->host_slab_allocator());
    if (staging.is_ok()) disk_staging_ = std::move(staging).value();  // else pageable copies
  }
  return Status::ok();
}

Engine::~Engine() {
  swapped_.clear();  // host tier blocks, given back
  // tables release their blocks before the prefix cache and allocators go
  for (auto& [id, s] : sequences_) {
    if (s->resident) cache_->free_sequence(id);
  }
  for (auto& [name, session] : sessions_) drop_kv(*session);
  // spill files still being written: finished (they read host copies), then removed
  if (file_writer_) {
    for (const auto& w : orphan_writes_) {
      (void)file_writer_->wait(w->id);
      std::error_code ec;
      std::filesystem::remove(w->path, ec);
    }
    orphan_writes_.clear();
  }
}

int32_t Engine::total_tokens_needed(int32_t num_tokens) const {
  return (num_tokens + config_.block_size - 1) / config_.block_size;
}

Result<RequestId> Engine::submit(Request request) {
  const ModelSpec& spec = backend_->spec();
  SessionState* session = nullptr;
  if (request.session) {
    if (request.session->empty()) return Status::invalid_argument("request: empty session name");
    auto it = sessions_.find(*request.session);
    if (it != sessions_.end()) {
      session = it->second.get();
      if (session->busy) {
        return Status::invalid_argument("request: session '{}' is busy with another request",
                                        *request.session);
      }
    }
    if (request.n != 1) {
      return Status::invalid_argument("request: a session request takes n = 1, not {}", request.n);
    }
  }
  if (request.prompt_tokens.empty() && (session == nullptr || session->tokens.empty())) {
    return Status::invalid_argument("request: empty prompt");
  }
  for (int32_t t : request.prompt_tokens) {
    if (t < 0 || t >= spec.vocab_size) {
      return Status::invalid_argument("request: token id {} outside the vocabulary of {}", t,
                                      spec.vocab_size);
    }
  }
  if (request.max_tokens <= 0) {
    return Status::invalid_argument("request: max_tokens {} must be > 0", request.max_tokens);
  }
  for (int32_t t : request.stop_token_ids) {
    if (t < 0 || t >= spec.vocab_size) {
      return Status::invalid_argument("request: stop token id {} outside the vocabulary of {}", t,
                                      spec.vocab_size);
    }
  }
  if (!request.stop_strings.empty() && config_.tokenizer == nullptr) {
    return Status::invalid_argument("request: stop strings need an engine with a tokenizer");
  }
  for (const std::string& stop : request.stop_strings) {
    if (stop.empty()) return Status::invalid_argument("request: an empty stop string");
  }
  if (request.min_tokens < 0) {
    return Status::invalid_argument("request: min_tokens {} must be >= 0", request.min_tokens);
  }
  if (request.n < 1 || request.n > 64) {
    return Status::invalid_argument("request: n {} must be in [1, 64]", request.n);
  }
  KVP_RETURN_IF_ERROR(validate_sampling_params(request.sampling));
  // The part of a session's history the prompt repeats (prompt_includes_history).
  std::optional<int32_t> num_kept;
  if (request.prompt_includes_history && session != nullptr) {
    if (request.prompt_tokens.empty()) {
      return Status::invalid_argument("request: empty prompt (it holds the whole conversation)");
    }
    const auto& history_tokens = session->tokens;
    const size_t limit = std::min(history_tokens.size(), request.prompt_tokens.size() - 1);
    size_t common = 0;
    while (common < limit && history_tokens[common] == request.prompt_tokens[common]) ++common;
    num_kept = static_cast<int32_t>(common);
  }
  // The one check of a request against the model's context and the pool.
  const int64_t history =
      num_kept ? *num_kept : (session ? static_cast<int64_t>(session->tokens.size()) : 0);
  const int64_t num_prompt =
      static_cast<int64_t>(request.prompt_tokens.size()) - (num_kept ? *num_kept : 0);
  const int64_t needed = history + num_prompt + request.max_tokens;
  if (spec.context_length > 0 && needed > spec.context_length) {
    const std::string session_part = session && !num_kept
                                         ? fmt::format("session history of {} tokens + ", history)
                                         : std::string();
    return Status::invalid_argument(
        "request: {}prompt of {} tokens + max_tokens {} = {} exceeds the model's context of {} "
        "tokens",
        session_part, num_kept ? history + num_prompt : num_prompt, request.max_tokens, needed,
        spec.context_length);
  }
  if (history + num_prompt > std::numeric_limits<int32_t>::max() - int64_t{request.max_tokens}) {
    return Status::invalid_argument(
        "request: {} tokens of history and prompt + max_tokens {} "
        "pass 2^31 - 1 positions",
        history + num_prompt, request.max_tokens);
  }
  const auto total = static_cast<int32_t>(history + num_prompt);
  if (!backend_->group_is_sliding(0)) {
    const int64_t blocks = total_tokens_needed(total) +
                           int64_t{request.n} * (total_tokens_needed(request.max_tokens) + 1);
    if (blocks > config_.num_blocks) {
      return Status::invalid_argument(
          "request: {} prompt tokens and {} x {} output tokens need {} blocks, the pool has {}",
          total, request.n, request.max_tokens, blocks, config_.num_blocks);
    }
  }

  auto state = std::make_unique<RequestState>();
  state->id = RequestId(next_request_id_++);
  state->usage.prompt_tokens = static_cast<int32_t>(request.prompt_tokens.size());
  if (num_kept) {
    truncate_session(*session, *num_kept);
    request.prompt_tokens.erase(request.prompt_tokens.begin(),
                                request.prompt_tokens.begin() + *num_kept);
  }
  auto s = std::make_unique<Sequence>();
  s->request_id = state->id;
  if (session != nullptr) {
    s->tokens = session->tokens;
    if (session->resident) {
      s->id = *session->resident;
      s->resident = true;
      s->num_computed = session->num_computed;
      s->window_valid_from = session->window_valid_from;
      session->resident.reset();
      session->num_computed = 0;
      state->usage.cached_tokens = s->num_computed;
      session->num_resumed_tokens += s->num_computed;
    }
    // KV on the host or disk tier comes back when the sequence is admitted (admit_prefix); a
    // spill file is read from now on
    start_prefetch(*session);
    session->busy = true;
  } else if (request.session) {
    auto created = std::make_unique<SessionState>();
    created->id = next_session_id_++;
    created->name = *request.session;
    created->busy = true;
    session = created.get();
    sessions_.emplace(*request.session, std::move(created));
  }
  if (!s->resident) s->id = SeqId(next_seq_id_++);
  if (session != nullptr) session->busy_seq = s->id;
  s->tokens.insert(s->tokens.end(), request.prompt_tokens.begin(), request.prompt_tokens.end());
  s->num_prompt = static_cast<int32_t>(s->tokens.size());
  const uint64_t seed = request.sampling.seed.value_or(
      config_.seed ^ (0x9e3779b97f4a7c15ull * uint64_t(state->id.value)));
  s->rng.seed(seed);
  s->history = TokenHistory(s->tokens);
  state->seqs.push_back(s->id);
  state->request = std::move(request);
  stats_.num_prompt_tokens += state->usage.prompt_tokens;
  scheduler_.add(s->id);
  const RequestId id = state->id;
  sequences_.emplace(s->id, std::move(s));
  requests_.emplace(id, std::move(state));
  return id;
}

void Engine::register_full_blocks(Sequence& s) {
  if (!cache_->has_prefix_cache()) return;
  const int32_t num_full = s.num_computed / config_.block_size;
  if (num_full <= s.num_registered_blocks) return;
  const std::span<const int32_t> tokens = std::span(s.tokens).first(s.num_computed);
  if (s.window_valid_from == 0) {
    cache_->register_prefix(s.id, tokens);
  } else {
    // window blocks before the first one wholly valid stay out of the cache
    const int32_t first_valid = total_tokens_needed(s.window_valid_from);
    for (int32_t g = 0; g < cache_->num_groups(); ++g) {
      const BlockTable& table = cache_->table(s.id, g);
      const int32_t first = cache_->group_config(g).window_tokens == 0
                                ? 0
                                : std::max(table.num_dropped_blocks(), first_valid);
      cache_->prefix_cache(g)->register_blocks(tokens, table.blocks().first(num_full), first);
    }
  }
  s.num_registered_blocks = num_full;
}

std::span<const int32_t> Engine::computed_tokens(const Sequence& s) const {
  if (!cache_->has_prefix_cache() || s.window_valid_from > 0) return {};
  return std::span(s.tokens).first(s.num_computed);
}

void Engine::fork_samples(Sequence& parent) {
  RequestState& r = *requests_.at(parent.request_id);
  r.forked = true;
  const int32_t n = r.request.n;
  std::vector<SeqId> children;
  for (int32_t i = 1; i < n; ++i) {
    auto child = std::make_unique<Sequence>(parent);
    child->id = SeqId(next_seq_id_++);
    child->sample_index = i;
    child->rng.seed(r.request.sampling.seed.value_or(config_.seed) + 0x632be59bd9b4e019ull * i +
                    uint64_t(r.id.value));
    cache_->fork(parent.id, child->id);
    r.seqs.push_back(child->id);
    children.push_back(child->id);
    sequences_.emplace(child->id, std::move(child));
  }
  scheduler_.add_forks(parent.id, children);
}

void Engine::finish(Sequence& s, FinishReason reason, std::vector<EngineEvent>* events) {
  settle_restore(s.id, true);  // blocks being filled are not handed on under the copy
  RequestState& r = *requests_.at(s.request_id);
  s.finished = true;
  ++r.num_finished;
  EngineEvent e;
  e.kind = EngineEvent::Kind::kFinished;
  e.request_id = r.id;
  e.sample_index = s.sample_index;
  e.finish_reason = reason;
  scheduler_.remove(s.id);

  if (r.request.session) {
    SessionState& session = *sessions_.at(*r.request.session);
    session.tokens = s.tokens;
    session.busy = false;
    session.busy_seq.reset();
    session.last_used = ++session_clock_;
    ++session.num_turns;
    std::unique_ptr<HostKv> swapped = take_swapped(s.id);
    if (swapped && !s.resident && !session.host && session.file.empty()) {
      // cancelled while swapped out: the copy becomes the session's host tier
      session.num_computed = swapped->num_tokens;
      session.window_valid_from = swapped->window_valid_from;
      session.host = std::move(swapped);
    } else if (swapped) {
      stats_.host_tier_bytes_used -= swapped->size_bytes;
    }
    if (s.resident) {
      // a host or disk copy the sequence did not restore (it recomputed); a kept copy stays
      std::unique_ptr<HostKv> kept = std::move(session.kept_copy);
      drop_kv(session);
      session.kept_copy = std::move(kept);
      session.resident = s.id;
      session.num_computed = s.num_computed;
      session.window_valid_from = s.window_valid_from;
      s.resident = false;  // the session owns the table now
    } else if (!session.host && session.file.empty()) {
      session.num_computed = 0;
    }  // else: cancelled or aborted before admission; the host or disk copy stays
  } else if (s.resident) {
    cache_->free_sequence(s.id);
    s.resident = false;
  } else {
    drop_swapped(s.id);
  }
  if (r.num_finished == static_cast<int32_t>(r.seqs.size()) &&
      (r.forked || r.request.n == 1 || r.cancelled)) {
    e.usage = r.usage;
    e.times = r.times;
    e.request_finished = true;
    events->push_back(e);
    for (SeqId sid : r.seqs) sequences_.erase(sid);
    requests_.erase(r.id);
    return;
  }
  events->push_back(e);
}

bool Engine::cancel(RequestId request_id, std::vector<EngineEvent>* events) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return false;
  RequestState& r = *it->second;
  r.cancelled = true;
  const std::vector<SeqId> seqs = r.seqs;
  for (SeqId sid : seqs) {
    auto s = sequences_.find(sid);
    if (s != sequences_.end() && !s->second->finished) {
      finish(*s->second, FinishReason::kCancelled, events);
    }
  }
  return true;
}

void Engine::flush_copies() {
  for (int32_t g = 0; g < cache_->num_groups(); ++g) {
    std::vector<BlockCopy> group_copies;
    for (const GroupBlockCopy& c : pending_copies_) {
      if (c.group != g) continue;
      group_copies.push_back(c.copy);
      group_copies.back().group = g;  // the manager's copies name their group outside the op
    }
    if (!group_copies.empty()) {
      // the engine's own block ids: a refusal is a broken backend or a bug, not bad input
      Status st = backend_->copy_blocks(g, group_copies);
      KVP_CHECK(st.is_ok(), "copy-on-write refused by the {} backend: {}", backend_->device_name(),
                st.to_string());
    }
  }
  pending_copies_.clear();
}

void Engine::run_model(std::span<const BatchEntry> entries, std::vector<float>* logits,
                       const std::vector<int32_t>* full_rows,
                       std::vector<LogitRowSummary>* summaries, const DeviceSampleBatch* samples,
                       std::vector<DeviceSample>* sampled) {
  flush_copies();
  const int32_t num_groups = cache_->num_groups();
  std::vector<int32_t> token_ids, query_start = {0}, kv_lens, logit_rows;
  std::vector<std::vector<int64_t>> slots(num_groups);
  std::vector<std::vector<int32_t>> tables(num_groups);
  std::vector<int32_t> max_blocks(num_groups, 1);
  for (const BatchEntry& p : entries) {
    token_ids.insert(token_ids.end(), p.tokens->begin() + p.num_computed,
                     p.tokens->begin() + p.num_computed + p.num_tokens);
    query_start.push_back(static_cast<int32_t>(token_ids.size()));
    kv_lens.push_back(p.num_computed + p.num_tokens);
    if (p.wants_logits) logit_rows.push_back(query_start.back() - 1);
    for (int32_t g = 0; g < num_groups; ++g) {
      max_blocks[g] = std::max(max_blocks[g], cache_->table(p.id, g).num_blocks());
    }
  }
  for (int32_t g = 0; g < num_groups; ++g) {
    tables[g].assign(entries.size() * max_blocks[g], 0);
    for (size_t i = 0; i < entries.size(); ++i) {
      const BlockTable& table = cache_->table(entries[i].id, g);
      const size_t first = slots[g].size();
      slots[g].resize(first + entries[i].num_tokens);
      table.fill_slots(entries[i].num_computed, entries[i].num_tokens, slots[g].data() + first);
      // dropped entries (behind a window) stay 0: attention never reads them
      for (int32_t b = table.num_dropped_blocks(); b < table.num_blocks(); ++b) {
        tables[g][i * max_blocks[g] + b] = table.blocks()[b].value;
      }
    }
  }
  ForwardBatch batch;
  batch.token_ids = token_ids;
  batch.query_start = query_start;
  batch.kv_lens = kv_lens;
  for (int32_t g = 0; g < num_groups; ++g) {
    batch.groups.push_back({slots[g], tables[g], max_blocks[g]});
  }
  batch.logit_rows = logit_rows;
  const int32_t vocab = backend_->spec().vocab_size;
  // every row is written by the backend: no zero fill (a decode step of 64 sequences on a 128K
  // vocabulary is 33 MB); a reused buffer keeps its pages
  Status st;
  if (samples != nullptr && !samples->requests.empty()) {  // step() checked samples_on_device
    summaries->resize(logit_rows.size());
    logits->resize(full_rows->size() * vocab);
    sampled->resize(samples->requests.size());
    st = backend_->forward_sampled(batch, *full_rows, *logits, *summaries, *samples, *sampled);
  } else if (full_rows != nullptr && summaries != nullptr && backend_->summarizes_logits()) {
    summaries->resize(logit_rows.size());
    logits->resize(full_rows->size() * vocab);
    st = backend_->forward_summarized(batch, *full_rows, *logits, *summaries);
  } else {
    if (summaries != nullptr) summaries->clear();
    logits->resize(logit_rows.size() * vocab);
    st = backend_->forward(batch, *logits);
  }
  KVP_CHECK(st.is_ok(), "engine batch refused by the {} backend: {}", backend_->device_name(),
            st.to_string());
}

std::vector<EngineEvent> Engine::step() {
  moves_.begin_step();
  finish_write_backs(TierMoves::Take::kIfDone);
  settle_file_writes();
  start_deferred_reads();  // where written files made room in the staging tier
  std::vector<EngineEvent> events;
  // 1. and 2.: the plan; the blocks it runs are taken, preemptions and admissions made
  StepBooks books(*this, &events);
  const StepPlan plan = scheduler_.plan_step(books);
  if (plan.seqs.empty()) {
    // only copies into the pool are left to wait for: wait here, not in a spin of empty steps
    while (!moves_.restores().empty()) settle_restore(moves_.restores().begin()->first, true);
    start_write_backs();
    return events;
  }

  // 3. copy-on-write copies, then the forward pass
  std::vector<BatchEntry> entries;
  for (const ScheduledSeq& p : plan.seqs) {
    const Sequence& s = seq(p.id);
    entries.push_back({p.id, &s.tokens, s.num_computed, p.num_tokens, p.wants_logits});
  }
  // Rows whose requests take the greedy choice with no penalty, logprobs list or EOS masking
  // need only the row's summary where the backend can reduce rows itself (CUDA): their logits
  // never leave the device.
  // Where the backend samples on the device, the other rows are sampled there (a request's
  // first row that its n samples share comes back whole): u drawn here from the sequence's rng.
  std::vector<int32_t> full_rows;
  std::vector<int32_t> compact_row;  // [logit row] -> row in `logits`, -1: summary only,
                                     // -2 - i: sampled on the device as request i
  const bool on_device =
      config_.device_sampling && backend_->samples_on_device() && backend_->summarizes_logits();
  DeviceSampleBatch& samples = step_samples_;
  samples.clear();
  for (const ScheduledSeq& p : plan.seqs) {
    if (!p.wants_logits) continue;
    Sequence& s = seq(p.id);
    const RequestState& r = *requests_.at(s.request_id);
    const Request& request = r.request;
    const SamplingParams& sp = request.sampling;
    const bool greedy_only = sp.temperature == 0.0f && sp.repetition_penalty == 1.0f &&
                             sp.presence_penalty == 0.0f && sp.frequency_penalty == 0.0f &&
                             sp.num_logprobs == 0 && s.num_generated >= request.min_tokens;
    const bool shared_row =
        request.n > 1 && (!r.forked || (s.sample_index == 0 && s.num_generated == 0));
    if (greedy_only) {
      compact_row.push_back(-1);
    } else if (on_device && !shared_row) {
      compact_row.push_back(-2 - static_cast<int32_t>(samples.requests.size()));
      add_device_sample(sp, s.history,
                        min_tokens_mask(backend_->spec().eos_token_ids, request.stop_token_ids,
                                        s.num_generated, request.min_tokens),
                        static_cast<int32_t>(compact_row.size()) - 1, s.rng, &samples);
    } else {
      compact_row.push_back(static_cast<int32_t>(full_rows.size()));
      full_rows.push_back(static_cast<int32_t>(compact_row.size()) - 1);
    }
  }
  std::vector<float>& logits = step_logits_;
  std::vector<LogitRowSummary>& summaries = step_summaries_;
  const auto forward_start = std::chrono::steady_clock::now();
  for (const ScheduledSeq& p : plan.seqs) {
    RequestTimes& times = requests_.at(seq(p.id).request_id)->times;
    if (!times.first_step) times.first_step = forward_start;
  }
  run_model(entries, &logits, &full_rows, &summaries, on_device ? &samples : nullptr,
            &step_sampled_);
  observe_forward(entries, forward_start);
  if (summaries.empty()) {  // the backend copied every row
    for (size_t i = 0; i < compact_row.size(); ++i) compact_row[i] = static_cast<int32_t>(i);
  }
  const int32_t vocab = backend_->spec().vocab_size;
  ++stats_.num_steps;

  // 4. bookkeeping; then every row's samples, drawn in parallel (each sequence reads its row and
  // owns its history and generator); then the tokens, events and stops, in plan order.
  struct SampleJob {
    Sequence* seq;
    RequestState* request;
    std::span<const float> row;  // empty: greedy from the summary, or sampled on the device
    const LogitRowSummary* summary;
    const DeviceSample* sampled;
    SampledToken token;
  };
  std::vector<SampleJob> jobs;
  size_t logit_index = 0;
  for (const ScheduledSeq& p : plan.seqs) {
    Sequence& s = seq(p.id);
    RequestState& r = *requests_.at(s.request_id);
    const int32_t pending_before = static_cast<int32_t>(s.tokens.size()) - s.num_computed;
    if (pending_before > 1 || s.num_generated == 0) {
      stats_.num_prefill_tokens += p.num_tokens;
      r.usage.prefilled_tokens += p.num_tokens;
    } else {
      stats_.num_decode_tokens += p.num_tokens;
    }
    s.num_computed += p.num_tokens;
    register_full_blocks(s);
    if (!p.wants_logits) continue;
    const int32_t compact = compact_row[logit_index];
    const LogitRowSummary* summary = compact == -1 ? &summaries[logit_index] : nullptr;
    const DeviceSample* sampled = compact <= -2 ? &step_sampled_[size_t(-2 - compact)] : nullptr;
    const std::span<const float> row =
        compact < 0 ? std::span<const float>()
                    : std::span<const float>(logits.data() + size_t(compact) * vocab, vocab);
    ++logit_index;
    if (r.request.n > 1 && !r.forked) fork_samples(s);
    // the parent and (after a fork) its children sample from the same row
    std::vector<SeqId> samplers = {s.id};
    if (r.forked && s.sample_index == 0 && s.num_generated == 0) {
      samplers.assign(r.seqs.begin(), r.seqs.end());
    }
    for (SeqId sid : samplers) jobs.push_back({&seq(sid), &r, row, summary, sampled, {}});
  }
  parallel_for(
      jobs.size() > 1 ? sampler_pool_.get() : nullptr, static_cast<int64_t>(jobs.size()),
      [&](int64_t i, int) {
        SampleJob& job = jobs[i];
        if (job.summary != nullptr) {  // what sample_token's greedy path returns
          job.token.token_id = job.summary->argmax;
          job.token.logprob = job.summary->max_logit - job.summary->log_z;
          return;
        }
        if (job.sampled != nullptr) {  // drawn on the device with this sequence's u
          job.token = to_sampled_token(*job.sampled);
          return;
        }
        Sequence& x = *job.seq;
        const Request& request = job.request->request;
        std::span<const float> sample_row = job.row;
        std::vector<float> masked;
        if (x.num_generated < request.min_tokens) {
          masked.assign(job.row.begin(), job.row.end());
          for (int32_t t : min_tokens_mask(backend_->spec().eos_token_ids, request.stop_token_ids,
                                           x.num_generated, request.min_tokens)) {
            masked[t] = -INFINITY;
          }
          sample_row = masked;
        }
        job.token = sample_token(sample_row, request.sampling, x.history, x.rng);
      });

  std::vector<std::pair<SeqId, FinishReason>> to_finish;
  for (SampleJob& job : jobs) {
    Sequence& x = *job.seq;
    RequestState& r = *job.request;
    SampledToken& tok = job.token;
    const SeqId sid = x.id;
    x.tokens.push_back(tok.token_id);
    x.history.add_output(tok.token_id);
    ++x.num_generated;
    ++r.usage.completion_tokens;
    EngineEvent e;
    e.kind = EngineEvent::Kind::kToken;
    e.request_id = r.id;
    e.sample_index = x.sample_index;
    e.token_id = tok.token_id;
    e.logprob = tok.logprob;
    e.top_logprobs = std::move(tok.top_logprobs);
    events.push_back(std::move(e));
    const auto& eos = backend_->spec().eos_token_ids;
    const auto& stops = r.request.stop_token_ids;
    const bool stop =
        (!r.request.ignore_eos && std::find(eos.begin(), eos.end(), tok.token_id) != eos.end()) ||
        std::find(stops.begin(), stops.end(), tok.token_id) != stops.end() ||
        completes_stop_string(r, sid, tok.token_id);
    // finished below, after every sample of the step is drawn
    if (stop) {
      to_finish.emplace_back(sid, FinishReason::kStop);
    } else if (x.num_generated >= r.request.max_tokens) {
      to_finish.emplace_back(sid, FinishReason::kLength);
    }
  }
  settle_ordered_restores();  // the forward pass after their copies is done
  for (const auto& [sid, reason] : to_finish) finish(seq(sid), reason, &events);
  start_write_backs();  // finished sessions went idle: the next steps copy while computing
  return events;
}

bool Engine::completes_stop_string(RequestState& r, SeqId sid, int32_t token_id) {
  if (r.request.stop_strings.empty()) return false;
  RequestState::StopText& st = r.stop_text[sid];
  if (!st.detokenizer) {
    st.detokenizer = std::make_unique<IncrementalDetokenizer>(*config_.tokenizer);
  }
  Result<std::string> piece = st.detokenizer->push(token_id);
  if (!piece.is_ok()) return false;  // an id the tokenizer lacks cannot complete a string
  st.text += *piece;
  size_t longest = 0;
  for (const std::string& stop : r.request.stop_strings) {
    if (st.text.find(stop) != std::string::npos) return true;
    longest = std::max(longest, stop.size());
  }
  // keep only what a stop string could still end in
  if (st.text.size() >= longest) st.text.erase(0, st.text.size() - (longest - 1));
  return false;
}

Status Engine::delete_session(const std::string& name) {
  auto it = sessions_.find(name);
  if (it == sessions_.end()) return Status::not_found("session '{}' does not exist", name);
  if (it->second->busy) {
    return Status::invalid_argument("session '{}' is busy with a request", name);
  }
  drop_kv(*it->second);
  sessions_.erase(it);
  return Status::ok();
}

}  // namespace kvp

// Engine: continuous batching over the paged KV pool (DESIGN.md §1; issue "Engine";
// docs/engine.md).
//
//   submit(request) ─▶ waiting (FIFO) ─▶ admitted when its next chunk's blocks fit ─▶ running
//   step(): steps 1 and 2 are planned by the Scheduler (scheduler.h: the queues and the
//           decisions, over the engine's bookkeeping through Engine::StepBooks); the engine
//           executes the plan (3 and 4)
//           1. running sequences first, oldest first: each takes its pending tokens (1 when
//              decoding; a chunk while prefilling) within the step's token budget; when the
//              pool is short, idle sessions move down a tier first (host, disk, or dropped),
//              then waiting sequences give back their blocks, then the newest running
//              sequences are preempted (swapped to the host tier, or their blocks freed to be
//              recomputed later, hitting the prefix cache for their full blocks)
//           2. waiting sequences are admitted in order (no skipping ahead: no starvation):
//              a session's KV comes back from host or disk, else the prefix cache (every cache
//              group) gives what it has; while budget, sequence cap and blocks allow
//           3. copy-on-write block copies, one forward pass for the whole mixed batch, sampling
//              for sequences whose pending tokens are all computed
//           4. full blocks are registered in the prefix cache; finished sequences release their
//              blocks (registered ones stay cached), or stay with their session
// Sessions between requests sit in one tier (SessionTier): the pool, a host copy, a cache file,
// or none (recompute); save_session / load_session move them to and from files.
// The model runs behind a ForwardBackend (model/forward_backend.h), which also holds the KV
// bytes: the engine allocates the pool there, runs one forward pass per step, asks for the
// copy-on-write copies, and moves whole blocks to and from host memory as block images (session
// tiers, cache files). The engine itself holds only bookkeeping and host copies.
// One thread calls submit/step/cancel and the session calls (the engine loop); EngineFront
// (engine_front.h) is the thread-safe wrapper.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "cache/cache_file.h"
#include "cache/cache_spec.h"
#include "cache/kv_cache_manager.h"
#include "common/status.h"
#include "common/thread_pool.h"
#include "engine/file_writer.h"
#include "engine/host_tier.h"
#include "engine/preemption_cost.h"
#include "engine/request.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "engine/tier_moves.h"
#include "model/forward_backend.h"
#include "tokenizer/tokenizer.h"

namespace kvp {

struct EngineConfig {
  int32_t block_size = 16;        // tokens per KV block
  int32_t num_blocks = 1024;      // blocks per cache group
  DType kv_dtype = DType::F32;    // one the backend holds (ForwardBackend::check_kv_dtype)
  int32_t max_num_seqs = 64;      // sequences in one step
  int32_t max_step_tokens = 512;  // tokens in one step (decodes + prefill chunks)
  bool prefix_caching = true;     // every cache group (window groups: in-window blocks)
  uint64_t seed = 0;              // seeds requests that bring none (mixed with the request id)
  // Threads that sample a step's logits rows (one row per sequence, the caller included) and
  // copy the blocks of sessions moving between tiers; 0: min(8, hardware threads). Each sequence
  // has its own generator, so the output does not depend on this.
  int32_t sampler_threads = 0;
  // Sample on the backend's device where it can (ForwardBackend::samples_on_device: CUDA), so
  // sampled rows never come to the host; false: every sampled row goes to the CPU sampler. Same
  // seed, same tokens on one backend and setting, whatever the batch; the two samplers agree up
  // to rounding at the kept set's edges (docs/sampling.md).
  bool device_sampling = true;
  // Detokenizes samples for stop strings; not owned, outlives the engine. null: requests with
  // stop strings are refused.
  const Tokenizer* tokenizer = nullptr;

  // Session tiers (docs/engine.md). Under pool pressure an idle session leaves the pool, least
  // recently used first: to host memory while host_tier_bytes allow, else to a cache file in
  // disk_dir while disk_tier_bytes allow, else its KV is dropped (recomputed on its next turn).
  // A full tier makes room by moving its own least recently used idle session further down.
  uint64_t host_tier_bytes = 0;  // 0: no host tier
  // With a host tier: when fewer than this share of the pool's blocks are free after a step,
  // idle sessions (least recently used first) are written back to the host tier ahead of need,
  // their copies running while the next steps compute; their blocks are freed when the copy
  // completes. 0: only when a step needs the room (synchronously).
  double tier_watermark = 0.1;
  // true: a sequence whose KV is still being copied in from a tier joins the first step that the
  // copy is expected to end within (by the measured copy rate and step time), that step ordered
  // after the copy on the device. false: it waits for a step that starts after the copy is done.
  // Off by default: on an H100 it took no measurable time off an 8K-token restore and made the
  // other sequences' TPOT p95 ~2 % longer (docs/perf/engine.md, "Restores joining steps").
  bool restore_joins_step = false;
  // Where the backend orders steps after copies layer by layer (CUDA: each layer waits for its
  // own blocks, so the step computes while the copy lands), which restores join a step at once:
  // kAlone those that would hold up no other sequence (the step runs restores only);
  // kCopyBound those too, and those whose copy is expected to outlast their own prefill (by the
  // measured rates: the first token waits for the copy, not the compute); kAlways every one
  // (the other sequences' step then lasts until the copy lands); kOff none (they wait as
  // restore_joins_step says).
  // kCopyBound by default: on an H100 it took an idle 8K-token session's TTFT from 6.5x to
  // 11-12x below re-prefilling it, with the other sequences' TPOT p95 within 1.08x of no moves
  // (docs/perf/engine.md, "Restores overlapping their step layer by layer").
  RestoreOverlap restore_overlap = RestoreOverlap::kCopyBound;
  // A sequence whose blocks are needed now (a waiting request's session moved down a tier, a
  // running sequence swapped out) gives them back as soon as its copy to the host tier is
  // queued, where the backend orders steps after copies layer by layer (CUDA): the next step
  // writes them as each layer is read out, instead of starting after the whole copy. false:
  // the copy is waited for.
  bool copy_out_overlap = true;
  // A session restored from the host tier keeps its host copy there (charged to the tier, the
  // first thing dropped when it needs room) while its KV is in the pool, so its next move to the
  // host tier copies only the blocks added since (an agent's turn, not its whole history). For
  // models of one cache group (no sliding-window layers).
  bool keep_restored_copies = true;
  // With a host tier, a running sequence preempted for room is swapped there (copied out now,
  // back in at readmission) or recomputed. Without a host tier: always recomputed.
  Preemption preemption = Preemption::kAuto;
  std::string disk_dir;          // empty: no disk tier; created on first use
  uint64_t disk_tier_bytes = 0;  // > 0 iff disk_dir is set
  // Identifies the weights in cache files (e.g. a hash of the weight files), together with the
  // architecture and a hash of the model's hyper-parameters: files of other models are refused.
  uint64_t model_weight_hash = 0;

  Status validate() const;
};

// Where an idle session's KV is.
enum class SessionTier {
  kDevice,  // blocks in the engine's pool
  kHost,    // a copy in host memory (host tier)
  kDisk,    // a cache file (disk tier, or a file given to load_session)
  kNone,    // no KV: the history is recomputed on the next turn
};
const char* session_tier_name(SessionTier tier);

struct EngineStats {
  int64_t num_steps = 0;
  int64_t num_prefill_tokens = 0;  // tokens run with more than one pending
  int64_t num_decode_tokens = 0;
  int64_t num_preemptions = 0;
  int64_t num_preemption_swaps = 0;   // of which copied the KV to the host tier
  int64_t num_swapped_in_tokens = 0;  // tokens whose KV came back from such a swap
  int64_t num_session_evictions = 0;  // sessions whose KV was dropped (recompute)
  int64_t num_prefix_hit_tokens = 0;
  int64_t num_prompt_tokens = 0;  // submitted
  int32_t num_running = 0;
  int32_t num_waiting = 0;
  int32_t num_blocks_used = 0;   // group 0
  int32_t num_blocks_total = 0;  // group 0
  // session tiers
  int64_t num_session_moves_to_host = 0;  // device -> host
  int64_t num_session_moves_to_disk = 0;  // device or host -> disk
  int64_t num_session_restores = 0;       // host or disk -> device
  int64_t num_restored_tokens = 0;        // tokens whose KV came back from host or disk
  // restores that ran in a step while their copy was still in flight, the step's forward pass
  // ordered after the copy on the device (ForwardBackend::order_after_transfers)
  int64_t num_restores_joined_steps = 0;
  // copies out of the pool whose blocks were given back as soon as they were queued, the next
  // steps ordered after them on the device (EngineConfig::copy_out_overlap)
  int64_t num_copies_out_ordered = 0;
  int64_t num_tier_errors = 0;  // disk writes or reads that failed (the KV was dropped)
  // file reads into pageable memory although the engine has a pinned staging tier (it lacked
  // the room: the restore then copies from pageable memory); reads put off until it had room
  int64_t num_file_reads_pageable = 0;
  int64_t num_file_reads_deferred = 0;
  int64_t num_file_jobs_queued = 0;  // spill file writes and removals not yet finished
  uint64_t host_tier_bytes_used = 0;
  uint64_t disk_tier_bytes_used = 0;  // spill files the engine wrote
  // Byte moves of the tiers (MoveStats, tier_moves.h): pool -> host memory (host tier, or a copy
  // on its way to a file), host -> pool, file writes and reads.
  using Moves = MoveStats;
  Moves to_host, to_pool, file_writes, file_reads;
};

// (Not cache/session_store.h's SessionInfo: one name for two types would break the one-
// definition rule in a program that links both.)
struct EngineSessionInfo {
  std::string name;
  int32_t num_tokens = 0;                 // tokens in the session's history
  int32_t num_resident_tokens = 0;        // of which have KV in the pool (0 once moved out)
  int32_t num_kv_tokens = 0;              // of which have KV in some tier
  SessionTier tier = SessionTier::kNone;  // of its KV while idle (kDevice while a request runs
                                          // on it with blocks in the pool)
  bool busy = false;                      // a request is running on it
  int64_t num_turns = 0;
  int64_t num_resumed_tokens = 0;  // history tokens reused (pool or restored) by later turns
  int64_t num_evictions = 0;       // KV dropped
  int64_t num_moves_to_host = 0;
  int64_t num_moves_to_disk = 0;
  int64_t num_restores = 0;  // host or disk -> pool
  uint64_t host_bytes = 0;   // held in the host tier
  uint64_t disk_bytes = 0;   // of its cache file
  bool read_ahead = false;   // its cache file read, or being read, for a request waiting on it
};

class Engine {
 public:
  // Checks config (validate(), the backend's check_kv_dtype) and allocates the KV pool on the
  // backend. Errors: invalid_argument naming the option and the reason; resource_exhausted
  // when the backend cannot hold the pool.
  // backend: not owned, outlives the engine; one engine per backend at a time (the pool is the
  // backend's: a second engine's allocate_kv replaces the first's KV).
  static Result<std::unique_ptr<Engine>> create(ForwardBackend* backend, EngineConfig config);
  // As create, for callers whose config is known good: aborts on create's errors.
  Engine(ForwardBackend* backend, EngineConfig config);
  // create's checks short of allocating: config.validate(), then what depends on the backend
  // (its KV dtypes; its KV layouts must be the cache spec's, which block images assume).
  static Status check_config(const ForwardBackend& backend, const EngineConfig& config);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates and queues a request. Errors (invalid_argument / not_found): empty prompt
  // without a session, token ids outside the vocabulary, max_tokens <= 0, n < 1, bad sampling
  // parameters, a session that is busy, a request whose session history + prompt + max_tokens
  // exceeds the model's context (ModelSpec::context_length, when known; the message gives the
  // three numbers and the context), a request that could never fit the pool.
  Result<RequestId> submit(Request request);
  // Runs one scheduling step and returns its events (possibly none when idle).
  std::vector<EngineEvent> step();
  // Cancels a queued or running request: its samples finish with kCancelled at the next step
  // (events from this call are returned by it). Returns false for an unknown or finished id.
  bool cancel(RequestId request_id, std::vector<EngineEvent>* events);
  bool has_unfinished() const { return !requests_.empty(); }

  EngineStats stats() const;
  std::vector<EngineSessionInfo> sessions() const;
  // Forgets a session and releases its blocks, host copy and spill file. not_found for an
  // unknown name; invalid_argument while a request runs on it.
  Status delete_session(const std::string& name);
  // Writes an idle session's tokens and KV to a cache file (docs/cache-files.md) at `path`,
  // from whichever tier holds it; the session stays where it was. A last generated token
  // without KV yet is run through the model first (so the file holds the whole history).
  // not_found: unknown session; invalid_argument: busy, or empty; resource_exhausted: the pool
  // cannot hold it for that; io_error from the writer. Mutates only that session's KV.
  Status save_session(const std::string& name, const std::filesystem::path& path);
  // Creates session `name` from a cache file. The whole file is read and validated first
  // (format, checksum, model fingerprint and geometry, token ids); the session then sits on the
  // disk tier pointing at that file (never deleted by the engine) and its next request reads
  // the KV back instead of prefilling it. Errors name the session, the file and the reason:
  // invalid_argument (name empty or taken), not_found (no file), corruption, unsupported,
  // mismatch (another model). On error nothing changes.
  Status load_session(const std::string& name, const std::filesystem::path& path);

  // Aborts on any inconsistency between the engine's sequences, the cache manager and the
  // prefix cache (each sequence's table length, every block accounted for). Spill files are
  // not looked at: another process may delete or change them at any time, and the engine
  // recovers from that (num_tier_errors).
  void check_integrity() const;

  // Waits for the tier moves in flight — copies to the host tier ahead of need, copies into the
  // pool of restored or swapped-in sequences, spill files being written or removed — and takes
  // their outcomes (as the next step would); afterwards no file job is queued. For shutdown,
  // tests and anything that looks at spill files from outside.
  void settle_tier_moves();

 private:
  struct Sequence;
  struct RequestState;
  struct SessionState;
  enum class Restore { kDone, kNoRoom, kFailed };
  // One sequence's share of a forward pass.
  struct BatchEntry {
    SeqId id;
    const std::vector<int32_t>* tokens;  // the sequence's tokens; KV of [0, num_computed) exists
    int32_t num_computed = 0;
    int32_t num_tokens = 0;  // run tokens [num_computed, num_computed + num_tokens)
    bool wants_logits = false;
  };

  // config checked, pool not yet allocated (allocate_pool)
  struct Unallocated {};
  Engine(ForwardBackend* backend, EngineConfig config, Unallocated);
  // Allocates every cache group's KV on the backend.
  Status allocate_pool();

  int32_t total_tokens_needed(int32_t num_tokens) const;
  // Whether token_id, just sampled by sid, makes its text contain a stop string of r.
  bool completes_stop_string(RequestState& r, SeqId sid, int32_t token_id);
  // The scheduler's view of the engine for one step (engine_internal.h, engine_books.cc).
  class StepBooks;
  // Gives a waiting sequence its KV: a session's (restored from host or disk), else the prefix
  // cache's. false: the session's KV cannot be restored now for lack of blocks (retry later).
  bool admit_prefix(Sequence& seq);
  // Stamps the request of seq_id (if still there) with the time its KV copy into the pool ended.
  void note_kv_copy_done(SeqId seq_id);
  // Moves the least recently used idle session with blocks in the pool down a tier (host, disk
  // or dropped, as the budgets allow), after waiting for the oldest write-back in flight if
  // any. false when there is none.
  bool evict_idle_session();
  // Frees the blocks of a waiting sequence that holds some (the scheduler picks it): a resumed
  // session's history goes down a tier, other KV is swapped or dropped.
  void release_waiting(Sequence& seq);
  // Takes a running sequence out of the pool: swapped to the host tier (swap_out) or dropped
  // to be recomputed. The scheduler queues it first among the waiting.
  void preempt(SeqId seq_id);

  // swap-instead-of-recompute (engine_preemption.cc)
  // Copies s's KV to the host tier and frees its blocks, if the config and the cost model say
  // so and the tier has room. false: nothing changed.
  bool swap_out(Sequence& s);
  // Gives a sequence readmitted after a swap its KV back (the prefix cache first, then a copy
  // of the rest). false (s not resident) when the pool lacks the blocks now.
  bool swap_in(Sequence& s);
  // The host copy of a swapped sequence, taken out of swapped_ (null if it has none); its bytes
  // stay charged to the host tier while the caller holds it.
  std::unique_ptr<HostKv> take_swapped(SeqId id);
  // Forgets a swapped sequence's host copy (it is recomputed if it runs again).
  void drop_swapped(SeqId id);
  // Times a copy of pool blocks to the host tier and back, for the cost model's first rate.
  void probe_copy_rate();
  // Feeds the cost model a forward pass over `entries` that began at `start`: its time (the step
  // time), and its rate for prefill-heavy passes; not a pass ordered after a restore's copy.
  void observe_forward(std::span<const BatchEntry> entries,
                       std::chrono::steady_clock::time_point start);
  void finish(Sequence& seq, FinishReason reason, std::vector<EngineEvent>* events);
  // Registers the sequence's full blocks in the prefix caches when a new one filled up.
  void register_full_blocks(Sequence& seq);
  // The tokens whose KV is written (what KvCacheManager::append registers blocks with); empty
  // without prefix caching, or while some window blocks hold KV only in part (after a load).
  std::span<const int32_t> computed_tokens(const Sequence& seq) const;
  void fork_samples(Sequence& parent);
  Sequence& seq(SeqId id) { return *sequences_.at(id); }
  // Runs the pending copy-on-write copies on the backend (before any other write into the pool:
  // a block they read may be freed and handed out again within the step).
  void flush_copies();
  // Pending copies, then one forward pass; logits: [rows wanting logits][vocab].
  // One forward pass. With full_rows and summaries, on a backend that summarizes logits: every
  // row's summary, and logits only of full_rows (packed); otherwise every row's logits and
  // summaries left empty.
  void run_model(std::span<const BatchEntry> entries, std::vector<float>* logits,
                 const std::vector<int32_t>* full_rows = nullptr,
                 std::vector<LogitRowSummary>* summaries = nullptr,
                 const DeviceSampleBatch* samples = nullptr,
                 std::vector<DeviceSample>* sampled = nullptr);

  // session tiers (engine_tiers.cc)
  // The bytes of sequence seq_id's live blocks (what a host copy of it holds).
  uint64_t live_bytes(SeqId seq_id) const;
  // The session's KV copied out of the pool's blocks of sequence seq_id (which stays) into
  // blocks of `tier` (null: a storage of the copy's own) by the backend's transfers, waited
  // for. nullptr if the memory cannot be had or the backend cannot copy the blocks.
  // base: as start_copy_out's.
  std::unique_ptr<HostKv> copy_out(SeqId seq_id, int32_t num_tokens, HostTier* tier,
                                   std::unique_ptr<HostKv> base = nullptr);
  // A copy into the host tier of a sequence whose blocks the caller frees at once. Where the
  // backend orders steps after copies layer by layer and config_.copy_out_overlap: not waited
  // for, the steps from now on ordered after it (the next one writes the blocks as they are read
  // out) and the copy landing later (HostKv::land); else as copy_out.
  std::unique_ptr<HostKv> copy_out_to_host(SeqId seq_id, int32_t num_tokens,
                                           std::unique_ptr<HostKv> base = nullptr);
  // A copy of the sequence for a cache file: into the disk staging tier if it has the room,
  // else into pageable storage of its own. null when neither can be had.
  std::unique_ptr<HostKv> copy_out_for_file(SeqId seq_id, int32_t num_tokens);
  // As copy_out, not waited for: *ticket completes the copy (ForwardBackend::transfers_done).
  // base: the session's kept copy (take_kept_copy), in `tier`, of a prefix of the sequence's
  // tokens: it is extended (its blocks kept, the last one refilled where it was partial, new
  // blocks for the rest) and only the blocks after it are copied.
  std::unique_ptr<HostKv> start_copy_out(SeqId seq_id, int32_t num_tokens, HostTier* tier,
                                         uint64_t* ticket, std::unique_ptr<HostKv> base = nullptr);
  // The session's kept copy, no longer charged to the tier, when it can extend a copy of the
  // sequence seq_id (one cache group, no blocks dropped); else it is dropped and null returned.
  std::unique_ptr<HostKv> take_kept_copy(SessionState& session, SeqId seq_id);
  std::unique_ptr<HostKv> extend_copy(SeqId seq_id, int32_t num_tokens, std::unique_ptr<HostKv> kv,
                                      uint64_t* ticket);
  void drop_kept_copy(SessionState& session);
  bool keeps_copies() const;
  // Write-backs (EngineConfig::tier_watermark): starts copies of idle sessions to the host tier
  // while the pool's free blocks are below the watermark.
  void start_write_backs();
  // Completes the write-backs whose copies are done (and the oldest as `oldest` says: waited
  // for, or taken at once with the steps ordered after its copy): the session's blocks are
  // freed and its copy becomes its host tier, or, when the session changed meanwhile (a
  // request, a truncation), the copy is dropped. Returns the pool blocks freed.
  int32_t finish_write_backs(TierMoves::Take oldest);
  // How a step that needs room now takes a copy out of the pool still running: at once with the
  // steps ordered after it (copy_out_overlap, on a backend that orders by layer), else waited.
  TierMoves::Take take_now() const;
  // Takes the FileWriter's finished spill files: a failed one sends its session's KV to none
  // (recomputed), as a failed read does.
  void settle_file_writes();
  // A cache file, validated whole (and its token ids against the vocabulary), as a host copy;
  // *tokens (if not null) receives its token ids. Errors name the file and the reason.
  // With `into` (blocks of the disk staging tier, from stage_file_read) and a file of the
  // tokens they were taken for, the KV goes there and the result is null: a restore from it is
  // then one DMA per run of blocks, not a copy out of pageable memory.
  Result<std::unique_ptr<HostKv>> read_file(const std::filesystem::path& path,
                                            std::vector<int32_t>* tokens, HostKv* into = nullptr);
  // read_file without the stats: reads only what does not change (and writes only *into's
  // bytes and tables), so any thread may call it.
  Result<std::unique_ptr<HostKv>> load_file(const std::filesystem::path& path,
                                            std::vector<int32_t>* tokens,
                                            HostKv* into = nullptr) const;
  // Blocks of the disk staging tier for a spill file of num_tokens tokens to be read into, or
  // null (no staging tier, or not the room: the read goes to pageable memory).
  std::unique_ptr<HostKv> stage_file_read(int32_t num_tokens);
  // Blocks per cache group of a host copy of num_tokens tokens read from a cache file (a window
  // group keeps only the tokens its window can still see; CacheFile::group_token_begin).
  std::vector<int32_t> file_blocks(int64_t num_tokens) const;
  // Starts reading a disk-tier session's spill file on a thread, for its next admission: into
  // the staging tier, or, while that lacks the room (its spill copies not yet written), later
  // (start_deferred_reads; the scheduler passes the request over meanwhile, kv_at_hand).
  struct Prefetch;
  void start_prefetch(SessionState& session);
  // Starts the reads start_prefetch put off, in their order, that the staging tier has room
  // for now.
  void start_deferred_reads();
  // Removes a spill file the engine wrote, on the FileWriter's thread where there is one.
  void remove_spill_file(const std::filesystem::path& path);
  // A file's KV read for a restore that found no room in the pool, kept as the session's
  // prefetch (done) for its next try.
  void keep_read(SessionState& session, std::unique_ptr<HostKv> kv, std::vector<int32_t> tokens);
  // Fills an empty resident sequence with kv (the prefix cache first, so shared blocks stay
  // shared; then fresh blocks that receive the copy). false (the sequence empty again) when
  // the pool lacks blocks. Returns the tokens taken from the prefix cache in *num_shared.
  // pending null: the copy is waited for; else it is started and *pending says how to wait.
  bool copy_in(SeqId seq_id, std::span<const int32_t> tokens, HostKv& kv, int32_t* num_shared,
               TierMoves::Restore* pending = nullptr);
  // Restores an idle or waiting session's KV from host or disk into sequence seq (resident,
  // empty). kNoRoom: pool short (seq empty again); kFailed: the file was unreadable (KV dropped).
  // wait false: the copy is left running (moves_) when its source can be kept until done.
  Restore restore_session(SessionState& session, Sequence& seq, bool wait = true);
  // Completes seq_id's copy into the pool if it is done (wait: waits for it): the source goes,
  // the blocks are offered to the prefix cache. true when no copy of it is in flight any more.
  bool settle_restore(SeqId seq_id, bool wait);
  // Whether seq_id, its KV still being copied in, runs in this step (TierMoves::join_step).
  bool order_restore(SeqId seq_id, bool holds_up_others);
  // Completes the copies of the restores that ran in the step just taken (done by now).
  void settle_ordered_restores();
  // Hands a started copy into seq's blocks to moves_ (and completes it if already done).
  void keep_restoring(Sequence& seq, TierMoves::Restore pending);
  // Moves an idle session's KV (on the device in sequence *resident) down: host, disk or drop.
  void move_down(SessionState& session);
  // Puts a host copy on the disk tier (or drops it when the tier cannot take it).
  void move_to_disk(SessionState& session, std::unique_ptr<HostKv> kv);
  // Frees host-tier (disk-tier) bytes for `size_bytes` more by moving the least recently used
  // idle sessions there further down. false if the tier cannot hold that much.
  bool make_host_room(uint64_t size_bytes, const SessionState* keep);
  bool make_disk_room(uint64_t size_bytes, const SessionState* keep);
  // Forgets a session's KV in every tier (removing its spill file); the tokens stay.
  void drop_kv(SessionState& session);
  // Shortens an idle session's history to its first num_tokens tokens: KV past them is dropped
  // (the pool's blocks truncated where every group's table allows; otherwise, and in the host
  // and disk tiers, all of it: the prefix cache still serves the full blocks it holds).
  void truncate_session(SessionState& session, int32_t num_tokens);
  // Runs a session's tokens that have no KV yet through the model (for save_session).
  Status complete_kv(SessionState& session);
  uint64_t file_size_bytes(int32_t num_tokens) const;
  // A new spill file's path: the session's id and a number of its own per write, so that the
  // removal of an older file of the session (a write its session no longer needs, removed when
  // written, settle_file_writes) never takes a newer one written to the same name meanwhile.
  std::filesystem::path spill_path(const SessionState& session);

  ForwardBackend* backend_;
  EngineConfig config_;
  std::unique_ptr<KvCacheManager> cache_;
  CacheSpec cache_spec_;  // the pool's geometry, for host copies and cache files
  ModelFingerprint fingerprint_;
  std::map<RequestId, std::unique_ptr<RequestState>> requests_;
  std::unordered_map<SeqId, std::unique_ptr<Sequence>> sequences_;
  std::unique_ptr<HostTier> host_tier_;  // when config_.host_tier_bytes > 0; outlives sessions_
  // With a disk tier and no host tier: pinned blocks that spill copies go through (one DMA per
  // run instead of a pageable copy), held until the file is written. Full: pageable copies.
  std::unique_ptr<HostTier> disk_staging_;
  // sessions whose spill file is to be read into disk_staging_ once it has the room, in the
  // order their requests came (start_prefetch)
  std::vector<std::string> deferred_reads_;
  // KV of preempted sequences swapped to the host tier (its blocks: declared after host_tier_
  // so that it goes first)
  std::unordered_map<SeqId, std::unique_ptr<HostKv>> swapped_;
  PreemptionCostModel preemption_cost_;
  // the pool <-> host copies in flight: write-backs and restores (after host_tier_ and
  // disk_staging_, whose blocks they copy; after preemption_cost_, which they feed)
  TierMoves moves_;
  struct PendingWrite;
  // spill files whose sessions dropped them while they were written: removed when written
  std::vector<std::unique_ptr<PendingWrite>> orphan_writes_;
  std::map<std::string, std::unique_ptr<SessionState>> sessions_;
  Scheduler scheduler_;                         // the waiting and running queues; step plans
  std::vector<GroupBlockCopy> pending_copies_;  // copy-on-write copies of this step's appends
  std::unique_ptr<FileWriter> file_writer_;     // with a disk tier; after sessions_ (reads them)
  int64_t next_request_id_ = 1;
  int64_t next_seq_id_ = 1;
  int64_t next_session_id_ = 1;
  int64_t session_clock_ = 0;
  uint64_t instance_id_ = 0;      // names this engine's spill files
  uint64_t num_spill_paths_ = 0;  // spill_path's numbers
  EngineStats stats_;
  // Samples a step's rows, and copies blocks of sessions moving between tiers; null: the
  // calling thread does both.
  std::unique_ptr<ThreadPool> sampler_pool_;
  std::vector<float> step_logits_;  // step()'s logits rows, reused across steps
  std::vector<LogitRowSummary> step_summaries_;
  DeviceSampleBatch step_samples_;          // step()'s rows sampled on the device
  std::vector<DeviceSample> step_sampled_;  // and what came back
};

}  // namespace kvp

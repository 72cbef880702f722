// Engine: continuous batching over the paged KV pool (DESIGN.md §1; issue "Engine").
//
//   submit(request) ─▶ waiting (FIFO) ─▶ admitted when its next chunk's blocks fit ─▶ running
//   step(): 1. running sequences first, oldest first: each takes its pending tokens (1 when
//              decoding; a chunk while prefilling) within the step's token budget; when the
//              pool is short, idle sessions are evicted first, then the newest running
//              sequences are preempted (blocks freed; they recompute later, hitting the prefix
//              cache for their full blocks)
//           2. waiting sequences are admitted in order (no skipping ahead: no starvation),
//              after a prefix-cache lookup, while budget, sequence cap and blocks allow
//           3. copy-on-write block copies, one forward pass for the whole mixed batch, sampling
//              for sequences whose pending tokens are all computed
//           4. full blocks are registered in the prefix cache; finished sequences release their
//              blocks (registered ones stay cached), or stay with their session
// One thread calls submit/step/cancel (the engine loop); EngineFront (engine_front.h) is the
// thread-safe wrapper.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "cache/kv_cache_manager.h"
#include "cache/prefix_cache.h"
#include "common/status.h"
#include "engine/request.h"
#include "engine/sampler.h"
#include "model/model_runner.h"

namespace kvp {

struct EngineConfig {
  int32_t block_size = 16;    // tokens per KV block
  int32_t num_blocks = 1024;  // blocks per cache group
  DType kv_dtype = DType::F32;
  int32_t max_num_seqs = 64;      // sequences in one step
  int32_t max_step_tokens = 512;  // tokens in one step (decodes + prefill chunks)
  bool prefix_caching = true;     // models with one cache group only (see docs/engine.md)
  uint64_t seed = 0;              // seeds requests that bring none (mixed with the request id)

  Status validate() const;
};

struct EngineStats {
  int64_t num_steps = 0;
  int64_t num_prefill_tokens = 0;  // tokens run with more than one pending
  int64_t num_decode_tokens = 0;
  int64_t num_preemptions = 0;
  int64_t num_session_evictions = 0;
  int64_t num_prefix_hit_tokens = 0;
  int64_t num_prompt_tokens = 0;  // submitted
  int32_t num_running = 0;
  int32_t num_waiting = 0;
  int32_t num_blocks_used = 0;   // group 0
  int32_t num_blocks_total = 0;  // group 0
};

struct SessionInfo {
  std::string name;
  int32_t num_tokens = 0;           // tokens in the session's history
  int32_t num_resident_tokens = 0;  // of which have KV in the pool (0 once evicted)
  bool busy = false;                // a request is running on it
  int64_t num_turns = 0;
  int64_t num_resumed_tokens = 0;  // history tokens reused from the pool by later turns
  int64_t num_evictions = 0;
};

class Engine {
 public:
  // runner: not owned, outlives the engine. requires: config.validate() is ok.
  Engine(ModelRunner* runner, EngineConfig config);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates and queues a request. Errors (invalid_argument / not_found): empty prompt
  // without a session, token ids outside the vocabulary, max_tokens <= 0, n < 1, bad sampling
  // parameters, a session that is busy, a request that could never fit the pool.
  Result<RequestId> submit(Request request);
  // Runs one scheduling step and returns its events (possibly none when idle).
  std::vector<EngineEvent> step();
  // Cancels a queued or running request: its samples finish with kCancelled at the next step
  // (events from this call are returned by it). Returns false for an unknown or finished id.
  bool cancel(RequestId request_id, std::vector<EngineEvent>* events);
  bool has_unfinished() const { return !requests_.empty(); }

  EngineStats stats() const;
  std::vector<SessionInfo> sessions() const;
  // Forgets a session and releases its blocks. not_found for an unknown name; invalid_argument
  // while a request runs on it.
  Status delete_session(const std::string& name);

  // Aborts on any inconsistency between the engine's sequences, the cache manager and the
  // prefix cache (each sequence's table length, every block accounted for).
  void check_integrity() const;

 private:
  struct Sequence;
  struct RequestState;
  struct SessionState;

  int32_t total_tokens_needed(int32_t num_tokens) const;
  void admit_prefix(Sequence& seq);
  // Frees blocks until for_seq can append num_tokens: evicts idle sessions, then preempts the
  // newest running sequences at index >= first_unplanned, for_seq itself last. Returns false
  // when for_seq was preempted.
  bool make_room(SeqId for_seq, int32_t num_tokens, size_t first_unplanned);
  bool evict_idle_session();
  // Frees the blocks of the newest waiting sequence that holds some (a resumed session's, or
  // one preempted and re-queued), except `except`. Returns false when there is none.
  bool release_waiting(SeqId except);
  void preempt(SeqId seq_id);
  void finish(Sequence& seq, FinishReason reason, std::vector<EngineEvent>* events);
  void register_full_blocks(Sequence& seq);
  void fork_samples(Sequence& parent);
  Sequence& seq(SeqId id) { return *sequences_.at(id); }

  ModelRunner* runner_;
  EngineConfig config_;
  std::unique_ptr<KvCacheManager> cache_;
  std::unique_ptr<PrefixCache> prefix_cache_;  // null when off
  std::vector<HostKvSlab> slabs_;              // [num_cache_groups]
  std::map<RequestId, std::unique_ptr<RequestState>> requests_;
  std::unordered_map<SeqId, std::unique_ptr<Sequence>> sequences_;
  std::map<std::string, std::unique_ptr<SessionState>> sessions_;
  std::deque<SeqId> waiting_;
  std::vector<SeqId> running_;  // admission order, oldest first
  int64_t next_request_id_ = 1;
  int64_t next_seq_id_ = 1;
  int64_t session_clock_ = 0;
  EngineStats stats_;
};

}  // namespace kvp

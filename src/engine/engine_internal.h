// The Engine's private state types, shared by engine.cc, engine_tiers.cc and the other
// engine_*.cc files. Not an API.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cache/host_kv_storage.h"
#include "engine/engine.h"
#include "tokenizer/detokenizer.h"

namespace kvp {

struct Engine::Sequence {
  SeqId id;
  RequestId request_id;
  int32_t sample_index = 0;
  std::vector<int32_t> tokens;  // history + prompt + outputs; KV exists for [0, num_computed)
  int32_t num_computed = 0;
  int32_t num_prompt = 0;  // tokens before this request's first output
  int32_t num_generated = 0;
  int32_t num_registered_blocks = 0;  // full blocks already offered to the prefix cache
  bool resident = false;              // has a table in the cache manager
  bool finished = false;
  // Window groups hold KV for positions >= this only (a cache file keeps the last W tokens; the
  // block they start in is filled in part): such blocks are not offered to the prefix cache.
  int32_t window_valid_from = 0;
  SamplerRng rng;
  TokenHistory history;
};

struct Engine::RequestState {
  RequestId id;
  Request request;
  std::vector<SeqId> seqs;  // [n] once forked; the first is the parent
  int32_t num_finished = 0;
  bool forked = false;
  bool cancelled = false;
  Usage usage;
  RequestTimes times;
  // Stop strings: each sample's text so far, decoded incrementally (only when the request has
  // stop strings); text keeps the tail a stop string could still end in.
  struct StopText {
    std::unique_ptr<IncrementalDetokenizer> detokenizer;
    std::string text;
  };
  std::unordered_map<SeqId, StopText> stop_text;
};

// A cache file being written by the FileWriter from a host copy the engine keeps until then.
struct Engine::PendingWrite {
  uint64_t id = 0;  // FileWriter's
  std::unique_ptr<HostKv> kv;
  std::filesystem::path path;
  std::chrono::steady_clock::time_point start;
};

// A spill file being read ahead of its session's admission (Engine::start_prefetch).
struct Engine::Prefetch {
  // staging blocks the read fills (Engine::stage_file_read; null: it reads into pageable memory
  // of its own). Allocated and released on the engine thread; declared before kv, so that kv's
  // destructor waits for the read before these blocks go back.
  std::unique_ptr<HostKv> staged;
  std::vector<int32_t> tokens;  // written by the read, then read by the engine after kv.get()
  // the read: a host copy, or null when it went into `staged`
  std::future<Result<std::unique_ptr<HostKv>>> kv;
  bool kept = false;  // a read done before, kept by a restore that found no room (keep_read)
};

// An idle session's KV is in exactly one tier (tier()); a busy one's KV is in its request's
// sequence, or still in the host or disk tier until that sequence is admitted.
struct Engine::SessionState {
  int64_t id = 0;  // names its spill file
  std::string name;
  std::vector<int32_t> tokens;    // the conversation so far
  int32_t num_computed = 0;       // tokens[0, num_computed) have KV in the tier below
  std::optional<SeqId> resident;  // kDevice: the manager sequence holding the KV
  int32_t window_valid_from = 0;  // of resident's table (see Sequence::window_valid_from)
  std::unique_ptr<HostKv> host;   // kHost
  // Beside the pool's blocks (resident, or the busy sequence's): a copy in the host tier of the
  // KV of tokens[0, kept_copy->num_tokens), kept from its last restore from the host tier
  // (EngineConfig::keep_restored_copies), so its next move to the host tier copies only the
  // blocks after it. Charged to the tier; dropped first when the tier needs room, when the
  // history is cut below it, or with the session.
  std::unique_ptr<HostKv> kept_copy;
  std::filesystem::path file;  // kDisk
  // while its spill file is being written: the copy it is written from (restores use it)
  std::unique_ptr<PendingWrite> writing;
  std::unique_ptr<Prefetch> prefetch;  // its file read since a request for it arrived
  bool owns_file = false;              // a spill file (removed when no longer needed)
  uint64_t disk_bytes = 0;             // of an owned file
  bool busy = false;
  bool writing_back = false;      // a WriteBack of its resident blocks is in flight
  std::optional<SeqId> busy_seq;  // the sequence of the request running on it
  int64_t last_used = 0;
  int64_t num_turns = 0;
  int64_t num_resumed_tokens = 0;
  int64_t num_evictions = 0;
  int64_t num_moves_to_host = 0;
  int64_t num_moves_to_disk = 0;
  int64_t num_restores = 0;

  SessionTier tier() const {
    if (resident) return SessionTier::kDevice;
    if (host) return SessionTier::kHost;
    if (!file.empty()) return SessionTier::kDisk;
    return SessionTier::kNone;
  }
};

// The engine's bookkeeping as its Scheduler sees it during one step (scheduler.h): reads the
// sequences, the cache manager and the copies in flight, and makes the moves the scheduler asks
// for with the engine's own operations (engine_books.cc). Lives for one plan_step call.
class Engine::StepBooks final : public StepBookkeeping {
 public:
  // events: receives the events of sequences aborted while planning
  StepBooks(Engine& engine, std::vector<EngineEvent>* events) : e_(engine), events_(events) {}

  int32_t num_pending_tokens(SeqId id) const override;
  bool holds_blocks(SeqId id) const override;
  bool can_append(SeqId id, int32_t num_tokens) override;
  void append(SeqId id, int32_t num_tokens) override;
  bool ready_to_run(SeqId id, bool holds_up_others) override;
  bool is_restoring(SeqId id) const override;
  bool order_restore(SeqId id, bool holds_up_others) override;
  int32_t num_restoring_unplanned() const override;
  bool kv_at_hand(SeqId id) const override;
  bool admit(SeqId id) override;
  void recompute(SeqId id) override;
  bool evict_idle_session() override;
  void release(SeqId id) override;
  void preempt(SeqId id) override;
  void abort(SeqId id) override;

 private:
  Engine& e_;
  std::vector<EngineEvent>* events_;
};

}  // namespace kvp

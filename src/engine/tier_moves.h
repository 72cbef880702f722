// TierMoves: the engine's copies between the pool and host memory while they are in flight,
// from the moment the engine queues one on the backend (ForwardBackend::start_transfers) to its
// completion (docs/engine.md, "Session tiers"). The engine decides what moves and what a finished
// move means for its sessions; this component holds the copies meanwhile (and their host copies,
// kept alive until the device is done with them), says when each direction's queue is expected
// to drain, decides whether a sequence whose KV is still coming in joins a step, and counts every
// move in the engine's stats and the cost model's copy rate.
//
//   engine ──start_write_back──▶ write-backs: pool → host tier, oldest first
//                                   ──take_write_back (done, or the oldest waited for)──▶ engine
//   engine ──start_restore─────▶ restores: host → pool, by the sequence they fill
//                                   ──settle (done, or waited for)──▶ engine
//                                   ──join_step──▶ backend.order_after_transfers: the sequence
//                                                  runs in this step, over its copy
//   engine ──order_out (a copy out whose blocks it gives back now)──▶ backend.order_after_transfers
//                                   ──begin_step (found done)──▶ counted
//   engine ──wait (a copy it needs done now)──▶ timed, counted, the cost model's copy rate
//
// Copies of one direction complete in ticket order; the two directions overlap. Completion is
// asked of the backend through TransferTickets (model/forward_backend.h), so this class is tested
// without a model (tests/engine/tier_moves_test.cc). Byte budgets (the host tier's use) stay the
// engine's. Not thread-safe: the engine loop owns it.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/ids.h"
#include "common/status.h"
#include "engine/host_tier.h"
#include "engine/preemption_cost.h"
#include "model/forward_backend.h"

namespace kvp {

// Which restores join a step while their copy lands, where the backend orders steps after copies
// layer by layer (EngineConfig::restore_overlap has the full story).
enum class RestoreOverlap { kOff, kAlone, kCopyBound, kAlways };

// Byte moves of one kind (EngineStats::to_host, to_pool, file_writes, file_reads). count / bytes /
// seconds: moves timed from start to completion (waited for, or found done at once); overlapped:
// copies found complete by a later step while steps ran (their duration is not known, only that
// compute hid it). Every copy the device made counts, a write-back dropped because its session
// changed mid-copy too.
struct MoveStats {
  int64_t count = 0;
  uint64_t bytes = 0;
  double seconds = 0;
  int64_t overlapped = 0;
  uint64_t overlapped_bytes = 0;

  // Counts a move that began at `start`; returns its seconds.
  double count_timed(uint64_t bytes, std::chrono::steady_clock::time_point start);
  void count_overlapped(uint64_t bytes);
};

class TierMoves {
 public:
  using Clock = std::chrono::steady_clock;

  // A copy of an idle session's blocks to the host tier, running. The session stays in the pool
  // until it completes.
  struct WriteBack {
    std::string session;  // name; with session_id, to find it again (it may be gone)
    int64_t session_id = 0;
    SeqId seq;
    std::unique_ptr<HostKv> kv;  // the copy's destination
    uint64_t ticket = 0;
    int32_t num_blocks = 0;  // of the pool it frees (group 0)
    Clock::time_point start;
  };

  // A copy into the pool of a sequence's blocks (a session's restore, a swap-in), running: the
  // sequence is not planned until it completes or it joins a step (join_step).
  struct Restore {
    uint64_t ticket = 0;
    uint64_t bytes = 0;  // copied into the pool
    Clock::time_point start;
    // when it is expected to be done, after the copies queued before it (queue)
    std::optional<Clock::time_point> expected_end;
    std::unique_ptr<HostKv> kv;    // the source, kept until the copy completes
    bool charged = false;          // the engine counts kv's bytes in its host tier until then
    bool session_copy = false;     // kv is the session's host copy (it may keep it: kept_copy)
    bool ran_under_steps = false;  // found not done once: steps ran while it copied
    bool ordered = false;          // its sequence runs: the backend orders steps after the copy
  };

  struct Policy {
    RestoreOverlap overlap = RestoreOverlap::kCopyBound;
    // where a restore does not overlap its step: it joins when its copy is expected to end
    // within a step's time (EngineConfig::restore_joins_step)
    bool joins_within_step = false;
  };

  // transfers, cost: not owned, outlive this.
  TierMoves(TransferTickets* transfers, PreemptionCostModel* cost, Policy policy);
  // Waits for every copy in flight: their host copies go only after the device is done.
  ~TierMoves();
  TierMoves(const TierMoves&) = delete;
  TierMoves& operator=(const TierMoves&) = delete;

  // Counts a copy of `bytes` just queued on the backend after those in flight of its direction;
  // returns when it is expected to be done (nullopt while the copy rate is not measured).
  std::optional<Clock::time_point> queue(uint64_t bytes, bool into_pool);
  // Waits for a copy the caller needs done now (queued at `start`): its time is a copy's, for the
  // stats and the cost model, and every copy of its direction is done by then.
  Status wait(uint64_t ticket, uint64_t bytes, Clock::time_point start, bool into_pool);

  // copies out of the pool whose blocks the engine gives back at once
  // Orders the steps from now on after the copy out of the pool up to `ticket`, into `kv`, so
  // the engine may give its blocks back before it completes (where the backend orders by layer,
  // the next step writes them as each layer is read out; otherwise this waits for the copy). kv
  // then carries the ticket until it lands (HostKv::land). Counted when found done.
  Status order_out(uint64_t ticket, HostKv& kv);
  // A step begins: counts the copies ordered out that are done by now.
  void begin_step();
  // Waits for every copy ordered out and counts it.
  void land_all();
  int32_t num_landing() const { return static_cast<int32_t>(landing_.size()); }

  // write-backs
  void start_write_back(std::unique_ptr<WriteBack> write_back);
  const std::deque<std::unique_ptr<WriteBack>>& write_backs() const { return write_backs_; }
  // Pool blocks the write-backs in flight will free.
  int32_t num_write_back_blocks() const;
  // How take_write_back takes the oldest write-back: only if its copy is done, waited for, or
  // at once with the steps from now on ordered after its copy (as order_out: its pool blocks
  // may be given back now; its host copy lands later, HostKv::land).
  enum class Take { kIfDone, kWait, kOrderAfter };
  // The oldest write-back, taken as `how` says; null when none is in flight or (kIfDone) the
  // oldest is still running. Aborts on a copy error (the pool's blocks and the tier's are the
  // engine's own: a failure is a broken backend).
  std::unique_ptr<WriteBack> take_write_back(Take how);

  // restores
  void start_restore(SeqId seq, Restore restore);
  bool is_restoring(SeqId seq) const { return restores_.count(seq) > 0; }
  const std::unordered_map<SeqId, Restore>& restores() const { return restores_; }
  // Restores that have not joined a step (the scheduler holds them a place in the batch).
  int32_t num_unordered() const;
  // Whether some restore joined the step being taken, or the step is ordered after a copy out of
  // the pool (its time is then not a step's alone).
  bool any_ordered() const;
  // seq's copy, completed, if it is done (wait: waited for); nullopt while it runs. requires:
  // is_restoring(seq).
  std::optional<Restore> settle(SeqId seq, bool wait);
  // Whether seq, its KV still being copied in with pending_tokens tokens to run after it, runs in
  // this step: the backend then orders the step after the copy (once). The policy says which:
  // where the backend overlaps the copy layer by layer, kAlone: those that hold up no other
  // sequence of the step; kCopyBound: those, and those whose copy is expected to outlast their
  // own prefill (by the measured rate); kAlways: all. Otherwise (or kOff) joins_within_step:
  // those whose copy is expected to end within a step's time.
  bool join_step(SeqId seq, int64_t pending_tokens, bool holds_up_others);
  // The restores that joined the step just taken.
  std::vector<SeqId> ordered() const;

  const MoveStats& to_host() const { return to_host_; }
  const MoveStats& to_pool() const { return to_pool_; }
  int64_t num_joined_steps() const { return num_joined_steps_; }  // restores that joined a step
  int64_t num_ordered_out() const { return num_ordered_out_; }    // order_out calls that held

 private:
  void check(const Status& status, const char* what) const;

  TransferTickets* transfers_;
  PreemptionCostModel* cost_;
  Policy policy_;
  std::deque<std::unique_ptr<WriteBack>> write_backs_;  // oldest first
  std::unordered_map<SeqId, Restore> restores_;
  struct Landing {
    uint64_t ticket = 0;
    uint64_t bytes = 0;
  };
  std::deque<Landing> landing_;    // ordered out, oldest first
  bool step_ordered_out_ = false;  // since begin_step
  // when the copies queued are expected to be done, [0] out of the pool and [1] into it
  Clock::time_point queue_end_[2] = {};
  MoveStats to_host_, to_pool_;
  int64_t num_joined_steps_ = 0;
  int64_t num_ordered_out_ = 0;
};

}  // namespace kvp

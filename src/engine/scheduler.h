// Scheduler: the engine's step decisions, over bookkeeping alone (docs/engine.md, "Scheduling").
// It owns the waiting and running queues and decides, for one step, which running sequences take
// how many tokens, which waiting ones are admitted, and what gives way when the pool is short
// (an idle session down a tier, a waiting sequence's blocks, the newest running sequence); its
// static rules say whether a preempted sequence is swapped or recomputed, when a swapped one may
// come back, which idle session leaves the pool first and which tiers it may go to. It never sees a
// model, a backend or a KV byte: what it reads of the pool and the moves it asks for go through
// StepBookkeeping, which the engine implements over its KvCacheManager and tiers
// (Engine::StepBooks) and the tests over a few counters (tests/engine/scheduler_test.cc).
//
//   Engine::step ─plan_step(books)─▶ Scheduler ─reads, asks─▶ StepBookkeeping
//        │                              │                      num_pending_tokens, can_append,
//        │                              │                      append, admit, evict_idle_session,
//        │        StepPlan ◀────────────┘                      release, preempt, abort, …
//        └─▶ executes it: copy-on-write copies, one forward pass, sampling, finishing
//
// As vLLM v1's Scheduler.schedule() allocates slots through its KVCacheManager while it plans,
// the pool's blocks are taken while the plan is made, not after it: a move that frees blocks
// (an idle session sent down a tier, a preemption) changes what the next decision can fit, so
// decisions and moves interleave through StepBookkeeping; the plan records what was decided.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <vector>

#include "common/ids.h"
#include "engine/preemption_cost.h"

namespace kvp {

// What a running sequence that must leave the pool does with its KV (Scheduler::should_swap).
enum class Preemption {
  kAuto,       // swap where the cost model (engine/preemption_cost.h) prices it cheaper
  kSwap,       // swap whenever the host tier can hold it
  kRecompute,  // drop it; prefilled again at readmission (the prefix cache serves what it can)
};
const char* preemption_name(Preemption p);

struct SchedulerConfig {
  int32_t max_num_seqs = 64;      // sequences in one step (and restores waiting to join one)
  int32_t max_step_tokens = 512;  // tokens in one step (decodes + prefill chunks)
};

// One sequence's share of a step: tokens [num_computed, num_computed + num_tokens) run.
struct ScheduledSeq {
  SeqId id;
  int32_t num_tokens = 0;
  bool wants_logits = false;  // its pending tokens all run: it samples

  bool operator==(const ScheduledSeq&) const = default;
};

// Where an idle session's KV may go when it leaves the pool (Scheduler::tiers_for_idle_session),
// tried in this order; neither: dropped (recomputed on its next turn).
struct IdleSessionTiers {
  bool host = false;  // the host tier (which may still lack the room, or the copy fail)
  bool disk = false;  // a spill file on the disk tier

  bool operator==(const IdleSessionTiers&) const = default;
};

// What one step decided, in the order it was decided.
struct StepPlan {
  std::vector<ScheduledSeq> seqs;  // the forward pass's rows: running (oldest first), admitted
  std::vector<SeqId> admitted;     // waiting -> running (planned, or restoring: a later step)
  std::vector<SeqId> preempted;    // running -> first among the waiting, newest first
  std::vector<SeqId> released;     // waiting sequences that gave their blocks back
  std::vector<SeqId> recomputed;   // waiting: their tier KV could never fit, dropped
  std::vector<SeqId> aborted;      // a chunk that cannot fit the pool even alone
  int32_t num_idle_evictions = 0;  // idle sessions sent down a tier (or write-backs waited for)
  int32_t num_tokens = 0;          // sum of seqs' num_tokens (<= max_step_tokens)
};

// The engine's bookkeeping as the scheduler sees it, and the moves it asks for. Implemented by
// Engine::StepBooks (engine.cc); by a block-counting fake in tests. Sequences are the ones in the
// scheduler's queues.
class StepBookkeeping {
 public:
  virtual ~StepBookkeeping() = default;

  // Tokens of `id` without KV (a decode: 1; a prefill: what is left of its prompt).
  // does not modify anything
  virtual int32_t num_pending_tokens(SeqId id) const = 0;
  // Whether `id` holds blocks in the pool. does not modify anything
  virtual bool holds_blocks(SeqId id) const = 0;
  // Whether the pool can give `id` (holding blocks) the blocks for num_tokens more tokens.
  virtual bool can_append(SeqId id, int32_t num_tokens) = 0;
  // requires: can_append(id, num_tokens). Takes those blocks.
  virtual void append(SeqId id, int32_t num_tokens) = 0;

  // A running sequence whose KV may still be copied in: true when it can run in this step (the
  // copy is done, or the step is ordered after it). holds_up_others: the step has, or will
  // have, sequences that do not wait for a copy (ordering it after the copy would delay them).
  virtual bool ready_to_run(SeqId id, bool holds_up_others) = 0;
  // Whether `id`'s KV is being copied into the pool (a restore or a swap-in, started at its
  // admission). does not modify anything
  virtual bool is_restoring(SeqId id) const = 0;
  // requires: is_restoring(id). Whether it can join this step, the step ordered after its copy
  // (holds_up_others as for ready_to_run).
  virtual bool order_restore(SeqId id, bool holds_up_others) = 0;
  // Restores in flight that this step does not run: they hold their places under the cap.
  virtual int32_t num_restoring_unplanned() const = 0;

  // Whether a waiting sequence's KV, where it has some in a tier, can be copied into the pool
  // now: false while its session's cache file is still being read (admitting it would wait for
  // the read). does not modify anything
  virtual bool kv_at_hand(SeqId id) const = 0;
  // Gives a waiting sequence blocks of the KV it has somewhere: a session's (back from host or
  // disk), a swapped copy, the prefix cache's. false: that KV does not fit the pool now.
  virtual bool admit(SeqId id) = 0;
  // requires: !admit(id) with nothing else holding blocks. Drops the KV admit could not bring
  // back, then admits `id` to be recomputed (the prefix cache still serves what it can).
  virtual void recompute(SeqId id) = 0;
  // Frees pool blocks by moving an idle session down a tier (least recently used first, after
  // the write-backs in flight). false when there is none.
  virtual bool evict_idle_session() = 0;
  // requires: holds_blocks(id), id waiting. Gives its blocks back (its KV swapped, sent down a
  // tier with its session, or dropped).
  virtual void release(SeqId id) = 0;
  // requires: id running. Takes it out of the pool, swapped or recomputed (Scheduler::
  // should_swap); the scheduler queues it first among the waiting.
  virtual void preempt(SeqId id) = 0;
  // Finishes a waiting sequence whose chunk cannot fit the pool (aborted); it has left the queue.
  virtual void abort(SeqId id) = 0;
};

class Scheduler {
 public:
  explicit Scheduler(SchedulerConfig config) : config_(config) {}

  // Queues a new sequence last among the waiting.
  void add(SeqId id) { waiting_.push_back(id); }
  // Puts the forks of a running parent right after it, in order (they run as it does).
  // requires: parent running
  void add_forks(SeqId parent, std::span<const SeqId> children);
  // Takes a sequence out of whichever queue holds it (finished, cancelled); none: no-op.
  void remove(SeqId id);
  const std::deque<SeqId>& waiting() const { return waiting_; }
  const std::vector<SeqId>& running() const { return running_; }  // admission order, oldest first

  // Plans one step and takes its blocks through `books`:
  //   1. running sequences, oldest first, while the budget lasts: each takes min(pending,
  //      budget) tokens (a sequence whose KV is still being copied in and cannot join this
  //      step is passed over and keeps its place); when the pool is short, room comes from
  //      make_room's order
  //   2. waiting sequences, in order, while budget, max_num_seqs (this step's sequences and
  //      restores waiting to join one) and the pool allow; room from evict_idle_session, then
  //      the newest other waiting sequence that holds blocks, never from a running one. Stops
  //      at the first that does not fit; with nothing else holding blocks, a sequence whose
  //      tier KV cannot come back is recomputed, one whose chunk cannot fit even so is aborted.
  //      The one exception to the order: a sequence whose KV is still being read from disk
  //      (!kv_at_hand) is passed over, keeping its place, while any other sequence runs or is
  //      planned (the step would wait for the read); with none, it is admitted and waited for.
  // Mutates the queues and, through books, the pool.
  StepPlan plan_step(StepBookkeeping& books);

  // Whether a sequence preempted for room is swapped to the host tier (else recomputed):
  // never without a host tier, under kRecompute, or with no KV computed; always under kSwap;
  // under kAuto when the cost model prices 2 · live_bytes / copy rate below num_computed /
  // prefill rate, or lacks a rate. (The tier may still refuse the copy: then recomputed.)
  static bool should_swap(Preemption mode, bool has_host_tier, int32_t num_computed_tokens,
                          uint64_t live_bytes, const PreemptionCostModel& cost);
  // Whether a swapped sequence may come back into a pool group with num_available free blocks:
  // its num_needed blocks plus one for every running sequence (one let in to the last block is
  // the next step's victim again: out, in, out, ...). With nothing running, any room will do.
  static bool swap_in_fits(int32_t num_needed, int32_t num_available, int32_t num_running);
  // The idle session to leave the pool first: the least recently used (smallest last_used;
  // the first of equals). nullopt when there is none.
  static std::optional<size_t> pick_idle_session(std::span<const int64_t> last_used);
  // Where an idle session of num_tokens tokens of KV may go: the host tier where the engine has
  // one; the disk tier where it has one and the session's file (file_size_bytes) fits the
  // tier's whole budget; nowhere for a session without KV.
  static IdleSessionTiers tiers_for_idle_session(int32_t num_tokens, bool has_host_tier,
                                                 bool has_disk_tier, uint64_t file_size_bytes,
                                                 uint64_t disk_tier_bytes);

 private:
  // Frees blocks until for_seq can append num_tokens: an idle session down a tier, then the
  // newest waiting sequence holding blocks, then the newest running sequence at index >=
  // first_unplanned, for_seq itself last. false when for_seq was preempted.
  bool make_room(StepBookkeeping& books, SeqId for_seq, int32_t num_tokens, size_t first_unplanned,
                 StepPlan& plan);
  // Frees the blocks of the newest waiting sequence that holds some, except `except`.
  bool release_newest_waiting(StepBookkeeping& books, SeqId except, StepPlan& plan);
  // evict_idle_session, else release_newest_waiting.
  bool free_some_blocks(StepBookkeeping& books, SeqId for_seq, StepPlan& plan);
  void preempt(StepBookkeeping& books, SeqId id, StepPlan& plan);

  SchedulerConfig config_;
  std::deque<SeqId> waiting_;
  std::vector<SeqId> running_;  // admission order, oldest first
};

}  // namespace kvp

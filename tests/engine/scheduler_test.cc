// The Scheduler's plans alone (engine/scheduler.h), on scripted workloads over a block-counting
// fake of the engine's bookkeeping: no model, no backend, no KV. Each expected plan is derived in
// the test's comment from the rules: running sequences first, oldest first, within the token
// budget; admission in arrival order with no skipping ahead (but for a sequence whose KV is
// still being read from disk, while others run), under the budget and the sequence cap; room
// from idle sessions, then waiting sequences' blocks, then the newest running sequence; and the
// static rules for swap or recompute, swap-in room, the idle session to go and where it goes.
#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <map>
#include <optional>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/check.h"

namespace kvp {

// Readable failures: "{id 3, 4 tokens, logits}", "seq 3".
void PrintTo(SeqId id, std::ostream* os) { *os << "seq " << id.value; }
void PrintTo(const ScheduledSeq& s, std::ostream* os) {
  *os << "{id " << s.id.value << ", " << s.num_tokens << " tokens"
      << (s.wants_logits ? ", logits}" : "}");
}

namespace {

constexpr int32_t kBlockSize = 4;

int32_t blocks_of(int32_t num_tokens) { return (num_tokens + kBlockSize - 1) / kBlockSize; }

// A pool of num_blocks blocks of kBlockSize tokens and sequences that hold ceil(table tokens /
// kBlockSize) of them; idle sessions hold some blocks each, least recently used first. No
// prefix cache: an admitted sequence starts from nothing (or from a restored copy, scripted).
// execute() plays the engine's part after a plan: the planned tokens get KV, and a sequence
// that wanted logits samples one more token.
class FakeBooks final : public StepBookkeeping {
 public:
  struct Seq {
    int32_t num_tokens = 0;        // prompt + outputs
    int32_t num_computed = 0;      // with KV
    int32_t num_table_tokens = 0;  // what its blocks are for (computed + appended this step)
    bool resident = false;
    int32_t restore_tokens = 0;  // > 0: admission restores this many tokens' KV
    bool restoring = false;      // that copy is in flight
    bool ordered = false;        // a step runs it after its copy (join_restores_alone)
    bool reading = false;        // its KV is still being read from disk (before admission)
  };

  explicit FakeBooks(int32_t num_blocks) : num_blocks_(num_blocks), num_free_(num_blocks) {}

  // A new request's sequence of num_tokens prompt tokens (the caller queues it).
  void add_seq(SeqId id, int32_t num_tokens) { seqs_[id].num_tokens = num_tokens; }
  // A request on a session still in the pool: num_computed tokens of KV (and their blocks),
  // num_tokens in all.
  void add_resumed_seq(SeqId id, int32_t num_tokens, int32_t num_computed) {
    Seq& s = seqs_[id];
    s.num_tokens = num_tokens;
    s.num_computed = s.num_table_tokens = num_computed;
    s.resident = true;
    take(blocks_of(num_computed));
  }
  // A request whose session's KV (num_restored tokens) comes back from a tier at admission, the
  // copy left in flight until finish_restore.
  void add_restored_seq(SeqId id, int32_t num_tokens, int32_t num_restored) {
    seqs_[id].num_tokens = num_tokens;
    seqs_[id].restore_tokens = num_restored;
  }
  void finish_restore(SeqId id) { seqs_.at(id).restoring = false; }
  // A restored sequence whose KV is still being read from disk until finish_read; admitting it
  // before then waits for the read (counted by num_reads_waited).
  void add_reading_seq(SeqId id, int32_t num_tokens, int32_t num_restored) {
    add_restored_seq(id, num_tokens, num_restored);
    seqs_.at(id).reading = true;
  }
  void finish_read(SeqId id) { seqs_.at(id).reading = false; }
  int32_t num_reads_waited() const { return num_reads_waited_; }
  // From now on a restore joins a step when the scheduler says it holds up nobody (the engine
  // over a backend that overlaps copies layer by layer); before, restores never join early.
  void join_restores_alone() { join_alone_ = true; }
  // order_restore's questions so far: (sequence, holds_up_others)
  const std::vector<std::pair<SeqId, bool>>& order_asks() const { return order_asks_; }
  // An idle session holding num_blocks blocks, more recently used than those added before.
  void add_idle_session(int32_t num_blocks) {
    take(num_blocks);
    idle_sessions_.push_back(num_blocks);
  }
  // A finished sequence gives its blocks back and is forgotten.
  void finish(SeqId id) {
    drop(id);
    seqs_.erase(id);
  }
  // More tokens pending for a sequence (as a later chunk brings; scripted).
  void add_tokens(SeqId id, int32_t num_tokens) { seqs_.at(id).num_tokens += num_tokens; }

  void execute(const StepPlan& plan) {
    for (const ScheduledSeq& p : plan.seqs) {
      Seq& s = seqs_.at(p.id);
      s.num_computed += p.num_tokens;
      KVP_CHECK(s.num_computed == s.num_table_tokens, "seq {} ran what it did not append",
                p.id.value);
      if (p.wants_logits) ++s.num_tokens;
      if (s.ordered) s.restoring = s.ordered = false;  // the step waited for the copy
    }
  }

  // Every block is free, held by a sequence or held by an idle session.
  void check_integrity() const {
    int32_t held = 0;
    for (const auto& [id, s] : seqs_) held += s.resident ? blocks_of(s.num_table_tokens) : 0;
    for (int32_t b : idle_sessions_) held += b;
    KVP_CHECK(held + num_free_ == num_blocks_, "{} held + {} free != {}", held, num_free_,
              num_blocks_);
  }

  int32_t num_free_blocks() const { return num_free_; }
  int32_t num_idle_sessions() const { return static_cast<int32_t>(idle_sessions_.size()); }
  const Seq& seq(SeqId id) const { return seqs_.at(id); }
  // The moves the scheduler asked for, in order ("evict", "release 3", "preempt 2", "abort 1").
  const std::vector<std::string>& moves() const { return moves_; }

  int32_t num_pending_tokens(SeqId id) const override {
    return seqs_.at(id).num_tokens - seqs_.at(id).num_computed;
  }
  bool holds_blocks(SeqId id) const override { return seqs_.at(id).resident; }
  bool can_append(SeqId id, int32_t num_tokens) override {
    const Seq& s = seqs_.at(id);
    return s.resident && more_blocks(s, num_tokens) <= num_free_;
  }
  void append(SeqId id, int32_t num_tokens) override {
    KVP_CHECK(can_append(id, num_tokens), "append without room");
    Seq& s = seqs_.at(id);
    take(more_blocks(s, num_tokens));
    s.num_table_tokens += num_tokens;
  }
  bool ready_to_run(SeqId id, bool holds_up_others) override {
    return !seqs_.at(id).restoring || order_restore(id, holds_up_others);
  }
  bool is_restoring(SeqId id) const override { return seqs_.at(id).restoring; }
  bool order_restore(SeqId id, bool holds_up_others) override {
    Seq& s = seqs_.at(id);
    KVP_CHECK(s.restoring, "order_restore of seq {}, not restoring", id.value);
    if (s.ordered) return true;
    order_asks_.emplace_back(id, holds_up_others);
    s.ordered = join_alone_ && !holds_up_others;
    return s.ordered;
  }
  int32_t num_restoring_unplanned() const override {
    int32_t n = 0;
    for (const auto& [id, s] : seqs_) n += s.restoring && !s.ordered ? 1 : 0;
    return n;
  }
  bool kv_at_hand(SeqId id) const override { return !seqs_.at(id).reading; }
  bool admit(SeqId id) override {
    Seq& s = seqs_.at(id);
    if (s.resident) return true;
    if (s.reading) {  // the engine waits for the read here
      s.reading = false;
      ++num_reads_waited_;
    }
    if (s.restore_tokens > 0) {
      if (blocks_of(s.restore_tokens) > num_free_) return false;
      take(blocks_of(s.restore_tokens));
      s.num_computed = s.num_table_tokens = s.restore_tokens;
      s.restore_tokens = 0;
      s.restoring = true;
    } else {
      s.num_computed = s.num_table_tokens = 0;
    }
    s.resident = true;
    return true;
  }
  void recompute(SeqId id) override {
    moves_.push_back("recompute " + std::to_string(id.value));
    seqs_.at(id).restore_tokens = 0;
    KVP_CHECK(admit(id), "admission to recompute");
  }
  bool evict_idle_session() override {
    if (idle_sessions_.empty()) return false;
    num_free_ += idle_sessions_.front();
    idle_sessions_.pop_front();
    moves_.emplace_back("evict");
    return true;
  }
  void release(SeqId id) override {
    drop(id);
    moves_.push_back("release " + std::to_string(id.value));
  }
  void preempt(SeqId id) override {
    drop(id);
    moves_.push_back("preempt " + std::to_string(id.value));
  }
  void abort(SeqId id) override {
    drop(id);
    seqs_.erase(id);
    moves_.push_back("abort " + std::to_string(id.value));
  }

 private:
  int32_t more_blocks(const Seq& s, int32_t num_tokens) const {
    return blocks_of(s.num_table_tokens + num_tokens) - blocks_of(s.num_table_tokens);
  }
  void take(int32_t num_blocks) {
    KVP_CHECK(num_blocks <= num_free_, "{} blocks of {} free", num_blocks, num_free_);
    num_free_ -= num_blocks;
  }
  void drop(SeqId id) {
    Seq& s = seqs_.at(id);
    if (s.resident) num_free_ += blocks_of(s.num_table_tokens);
    s.resident = false;
    s.restoring = s.ordered = false;  // (the engine completes a copy before the blocks go)
    s.num_computed = s.num_table_tokens = 0;
  }

  int32_t num_blocks_;
  int32_t num_free_;
  std::map<SeqId, Seq> seqs_;
  std::deque<int32_t> idle_sessions_;  // blocks of each, least recently used first
  std::vector<std::string> moves_;
  bool join_alone_ = false;
  std::vector<std::pair<SeqId, bool>> order_asks_;
  int32_t num_reads_waited_ = 0;
};

const SeqId kA{1}, kB{2}, kC{3}, kD{4};

SchedulerConfig config(int32_t max_step_tokens, int32_t max_num_seqs = 64) {
  return SchedulerConfig{max_num_seqs, max_step_tokens};
}

// Plans a step, checks the fake's blocks, and runs the plan on the fake.
StepPlan step(Scheduler& scheduler, FakeBooks& books) {
  StepPlan plan = scheduler.plan_step(books);
  books.check_integrity();
  books.execute(plan);
  return plan;
}

std::vector<SeqId> waiting(const Scheduler& s) { return {s.waiting().begin(), s.waiting().end()}; }

TEST(Scheduler, DecodesComeFirstAndAPrefillChunkTakesTheRestOfTheBudget) {
  // budget 16: A (6) and B (6) are admitted whole and sample; C (40) gets the 4 tokens left.
  // Next step: A and B decode 1 each, C's next chunk is 16 - 2 = 14 (still no logits: 36 left).
  Scheduler scheduler(config(16));
  FakeBooks books(64);
  for (auto [id, n] : {std::pair{kA, 6}, {kB, 6}, {kC, 40}}) {
    books.add_seq(id, n);
    scheduler.add(id);
  }
  StepPlan plan = step(scheduler, books);
  EXPECT_EQ(plan.seqs, (std::vector<ScheduledSeq>{{kA, 6, true}, {kB, 6, true}, {kC, 4, false}}));
  EXPECT_EQ(plan.admitted, (std::vector<SeqId>{kA, kB, kC}));
  EXPECT_EQ(plan.num_tokens, 16);
  plan = step(scheduler, books);
  EXPECT_EQ(plan.seqs, (std::vector<ScheduledSeq>{{kA, 1, true}, {kB, 1, true}, {kC, 14, false}}));
  EXPECT_TRUE(plan.admitted.empty());
  EXPECT_EQ(scheduler.running(), (std::vector<SeqId>{kA, kB, kC}));
}

TEST(Scheduler, ALongPromptIsChunkedByTheBudgetAndOnlyItsLastChunkSamples) {
  // 20 tokens under a budget of 8: 8, 8, then 4 with logits; B behind it waits until A's
  // chunks leave budget (step 3: 8 - 4 = 4 tokens of B's 6).
  Scheduler scheduler(config(8));
  FakeBooks books(64);
  books.add_seq(kA, 20);
  books.add_seq(kB, 6);
  scheduler.add(kA);
  scheduler.add(kB);
  EXPECT_EQ(step(scheduler, books).seqs, (std::vector<ScheduledSeq>{{kA, 8, false}}));
  EXPECT_EQ(step(scheduler, books).seqs, (std::vector<ScheduledSeq>{{kA, 8, false}}));
  EXPECT_EQ(step(scheduler, books).seqs,
            (std::vector<ScheduledSeq>{{kA, 4, true}, {kB, 4, false}}));
  EXPECT_EQ(step(scheduler, books).seqs, (std::vector<ScheduledSeq>{{kA, 1, true}, {kB, 2, true}}));
}

TEST(Scheduler, AdmitsInArrivalOrderWithoutSkippingAhead) {
  // 10 blocks of 4: A (24 tokens, 6 blocks) fits; B (32 tokens, 8 blocks) does not fit the 4
  // left, and C (4 tokens, 1 block) waits behind it although it would fit.
  Scheduler scheduler(config(512));
  FakeBooks books(10);
  for (auto [id, n] : {std::pair{kA, 24}, {kB, 32}, {kC, 4}}) {
    books.add_seq(id, n);
    scheduler.add(id);
  }
  StepPlan plan = step(scheduler, books);
  EXPECT_EQ(plan.seqs, (std::vector<ScheduledSeq>{{kA, 24, true}}));
  EXPECT_EQ(waiting(scheduler), (std::vector<SeqId>{kB, kC}));
  // A's decode takes a 7th block (25 tokens); B still does not fit the 3 left, C still waits
  plan = step(scheduler, books);
  EXPECT_EQ(plan.seqs, (std::vector<ScheduledSeq>{{kA, 1, true}}));
  EXPECT_EQ(waiting(scheduler), (std::vector<SeqId>{kB, kC}));
  EXPECT_EQ(books.num_free_blocks(), 3);
}

TEST(Scheduler, TheSequenceCapLimitsAdmission) {
  Scheduler scheduler(config(512, /*max_num_seqs=*/2));
  FakeBooks books(64);
  for (SeqId id : {kA, kB, kC}) {
    books.add_seq(id, 4);
    scheduler.add(id);
  }
  EXPECT_EQ(step(scheduler, books).seqs, (std::vector<ScheduledSeq>{{kA, 4, true}, {kB, 4, true}}));
  EXPECT_EQ(waiting(scheduler), (std::vector<SeqId>{kC}));
  // the two running decode; C waits as long as both run
  EXPECT_EQ(step(scheduler, books).seqs, (std::vector<ScheduledSeq>{{kA, 1, true}, {kB, 1, true}}));
  EXPECT_EQ(waiting(scheduler), (std::vector<SeqId>{kC}));
  scheduler.remove(kA);  // finished
  EXPECT_EQ(step(scheduler, books).seqs, (std::vector<ScheduledSeq>{{kB, 1, true}, {kC, 4, true}}));
}

TEST(Scheduler, UnderPressureTheNewestRunningSequenceIsPreempted) {
  // 6 blocks of 4: A, B, C (8 tokens, 2 blocks each) fill the pool. Each decode then needs a
  // 3rd block: A's comes from preempting C (the newest; 2 blocks back), B takes the 2nd of them.
  // C waits first in line and does not fit again this step (9 tokens to recompute, 0 free).
  Scheduler scheduler(config(512));
  FakeBooks books(6);
  for (SeqId id : {kA, kB, kC}) {
    books.add_seq(id, 8);
    scheduler.add(id);
  }
  step(scheduler, books);
  EXPECT_EQ(books.num_free_blocks(), 0);
  StepPlan plan = step(scheduler, books);
  EXPECT_EQ(plan.seqs, (std::vector<ScheduledSeq>{{kA, 1, true}, {kB, 1, true}}));
  EXPECT_EQ(plan.preempted, (std::vector<SeqId>{kC}));
  EXPECT_EQ(books.moves(), (std::vector<std::string>{"preempt 3"}));
  EXPECT_EQ(scheduler.running(), (std::vector<SeqId>{kA, kB}));
  EXPECT_EQ(waiting(scheduler), (std::vector<SeqId>{kC}));
  EXPECT_EQ(books.seq(kC).num_computed, 0);  // recomputed at readmission
}

TEST(Scheduler, PreemptedSequencesWaitFirstInTheirAdmissionOrder) {
  // 6 blocks: A, B, C (4 tokens, 1 block each) run; then A's next chunk is scripted to 16 more
  // tokens: 21 tokens in 6 blocks, 5 more than its 1 with 3 free. C goes (4 free), then B (5):
  // newest first. They wait in front, in admission order (B, C), ahead of D, which came later.
  Scheduler scheduler(config(512));
  FakeBooks books(6);
  for (SeqId id : {kA, kB, kC}) {
    books.add_seq(id, 4);
    scheduler.add(id);
  }
  step(scheduler, books);
  books.add_seq(kD, 4);
  scheduler.add(kD);
  books.add_tokens(kA, 16);
  const StepPlan plan = step(scheduler, books);
  EXPECT_EQ(plan.seqs, (std::vector<ScheduledSeq>{{kA, 17, true}}));
  EXPECT_EQ(plan.preempted, (std::vector<SeqId>{kC, kB}));
  // B is first in line (5 tokens to recompute, 2 blocks, 0 free): nothing is admitted
  EXPECT_EQ(waiting(scheduler), (std::vector<SeqId>{kB, kC, kD}));
  EXPECT_TRUE(plan.admitted.empty());
}

TEST(Scheduler, ASequenceThatOutgrowsThePoolAloneIsPreemptedLast) {
  // A alone in 3 blocks: 12 tokens computed, the 13th needs a 4th block. Nothing else can give
  // way: A itself is preempted, and back in line it cannot fit alone (13 tokens, 4 blocks): the
  // scheduler aborts it rather than wait for room that never comes.
  Scheduler scheduler(config(512));
  FakeBooks books(3);
  books.add_seq(kA, 12);
  scheduler.add(kA);
  step(scheduler, books);
  const StepPlan plan = step(scheduler, books);
  EXPECT_TRUE(plan.seqs.empty());
  EXPECT_EQ(plan.preempted, (std::vector<SeqId>{kA}));
  EXPECT_EQ(plan.aborted, (std::vector<SeqId>{kA}));
  EXPECT_EQ(books.moves(), (std::vector<std::string>{"preempt 1", "abort 1"}));
  EXPECT_TRUE(scheduler.running().empty());
  EXPECT_TRUE(scheduler.waiting().empty());
}

TEST(Scheduler, AnAbortedChunkLetsTheNextInLineIn) {
  // 2 blocks: A (12 tokens, 3 blocks) can never fit, with nothing else holding blocks: aborted;
  // B (4 tokens) behind it is admitted in the same step.
  Scheduler scheduler(config(512));
  FakeBooks books(2);
  books.add_seq(kA, 12);
  books.add_seq(kB, 4);
  scheduler.add(kA);
  scheduler.add(kB);
  const StepPlan plan = step(scheduler, books);
  EXPECT_EQ(plan.aborted, (std::vector<SeqId>{kA}));
  EXPECT_EQ(plan.seqs, (std::vector<ScheduledSeq>{{kB, 4, true}}));
}

TEST(Scheduler, IdleSessionsGiveWayBeforeRunningSequences) {
  // 4 blocks, an idle session in 1. A (8 tokens, 2 blocks) and B (4 tokens, 1 block) fill the
  // rest. Both decodes then need a block: A's comes from the idle session; for B nothing is
  // left (no idle session, no waiting sequence with blocks, no running one newer than B): B
  // is preempted, and does not fit again this step (5 tokens, 2 blocks, 1 free).
  Scheduler scheduler(config(512));
  FakeBooks books(4);
  books.add_idle_session(1);
  books.add_seq(kA, 8);
  books.add_seq(kB, 4);
  scheduler.add(kA);
  scheduler.add(kB);
  step(scheduler, books);
  EXPECT_EQ(books.num_free_blocks(), 0);
  const StepPlan plan = step(scheduler, books);
  EXPECT_EQ(plan.seqs, (std::vector<ScheduledSeq>{{kA, 1, true}}));
  EXPECT_EQ(plan.num_idle_evictions, 1);
  EXPECT_EQ(plan.preempted, (std::vector<SeqId>{kB}));
  EXPECT_EQ(books.moves(), (std::vector<std::string>{"evict", "preempt 2"}));
  EXPECT_EQ(books.num_idle_sessions(), 0);
}

TEST(Scheduler, AWaitingSequencesBlocksGoBeforeARunningSequence) {
  // 4 blocks: A (8 tokens) runs in 2. Then W, a request on a session still in the pool (8
  // tokens of KV in 2 blocks, 4 new), arrives: 0 free. A's decode needs a 3rd block: W, waiting,
  // gives its 2 back (A is not preempted); A takes 1, and W, back to 12 tokens to compute (3
  // blocks, 1 free), is not admitted.
  Scheduler scheduler(config(512));
  FakeBooks books(4);
  books.add_seq(kA, 8);
  scheduler.add(kA);
  step(scheduler, books);
  books.add_resumed_seq(kB, 12, 8);
  scheduler.add(kB);
  EXPECT_EQ(books.num_free_blocks(), 0);
  const StepPlan plan = step(scheduler, books);
  EXPECT_EQ(plan.seqs, (std::vector<ScheduledSeq>{{kA, 1, true}}));
  EXPECT_EQ(plan.released, (std::vector<SeqId>{kB}));
  EXPECT_TRUE(plan.preempted.empty());
  EXPECT_EQ(books.moves(), (std::vector<std::string>{"release 2"}));
  EXPECT_EQ(waiting(scheduler), (std::vector<SeqId>{kB}));
}

TEST(Scheduler, ARestoreInFlightHoldsItsPlaceUnderTheCapUntilItsCopyIsDone) {
  // cap 2: R's KV (8 tokens) is copied in from a tier at admission; it runs once the copy is
  // done. Meanwhile it counts under the cap: B runs beside it, C waits. Then R decodes (9
  // tokens, 8 with KV: 1 pending) and C still waits (R and B make 2).
  Scheduler scheduler(config(512, /*max_num_seqs=*/2));
  FakeBooks books(64);
  const SeqId kR = kA;
  books.add_restored_seq(kR, 9, 8);
  books.add_seq(kB, 4);
  books.add_seq(kC, 4);
  for (SeqId id : {kR, kB, kC}) scheduler.add(id);
  StepPlan plan = step(scheduler, books);
  EXPECT_EQ(plan.seqs, (std::vector<ScheduledSeq>{{kB, 4, true}}));
  EXPECT_EQ(plan.admitted, (std::vector<SeqId>{kR, kB}));
  EXPECT_EQ(waiting(scheduler), (std::vector<SeqId>{kC}));
  plan = step(scheduler, books);  // the copy still in flight
  EXPECT_EQ(plan.seqs, (std::vector<ScheduledSeq>{{kB, 1, true}}));
  EXPECT_EQ(waiting(scheduler), (std::vector<SeqId>{kC}));
  books.finish_restore(kR);
  plan = step(scheduler, books);
  EXPECT_EQ(plan.seqs, (std::vector<ScheduledSeq>{{kR, 1, true}, {kB, 1, true}}));
  EXPECT_EQ(waiting(scheduler), (std::vector<SeqId>{kC}));
}

TEST(Scheduler, ARestoreJoinsAStepAtOnceOnlyWhereItHoldsUpNoSequenceThatWaitsForNoCopy) {
  // Restores may join a step when nothing else in it waits for no copy (join_restores_alone).
  Scheduler scheduler(config(512));
  FakeBooks books(64);
  books.join_restores_alone();
  // 1. R alone (9 tokens, 8 restored): admitted and run in the same step, after its copy.
  const SeqId kR = kA;
  books.add_restored_seq(kR, 9, 8);
  scheduler.add(kR);
  StepPlan plan = step(scheduler, books);
  EXPECT_EQ(plan.seqs, (std::vector<ScheduledSeq>{{kR, 1, true}}));
  EXPECT_EQ(plan.admitted, (std::vector<SeqId>{kR}));
  EXPECT_EQ(books.order_asks(), (std::vector<std::pair<SeqId, bool>>{{kR, false}}));
  // 2. R decoding (waits for no copy now), S restored (5 tokens, 4 restored): S would hold R
  // up, so it waits for a later step, its place kept.
  const SeqId kS = kB;
  books.add_restored_seq(kS, 5, 4);
  scheduler.add(kS);
  plan = step(scheduler, books);
  EXPECT_EQ(plan.seqs, (std::vector<ScheduledSeq>{{kR, 1, true}}));
  EXPECT_EQ(plan.admitted, (std::vector<SeqId>{kS}));
  EXPECT_EQ(books.order_asks().back(), (std::pair<SeqId, bool>{kS, true}));
  plan = step(scheduler, books);  // still copying, R still decoding: still held back
  EXPECT_EQ(plan.seqs, (std::vector<ScheduledSeq>{{kR, 1, true}}));
  EXPECT_EQ(books.order_asks().back(), (std::pair<SeqId, bool>{kS, true}));
  books.finish_restore(kS);
  plan = step(scheduler, books);
  EXPECT_EQ(plan.seqs, (std::vector<ScheduledSeq>{{kR, 1, true}, {kS, 1, true}}));
  // 3. R and S finish; two restores T and U come alone: both join one step (a restore that
  // waits for a copy is no sequence held up).
  books.finish(kR);
  books.finish(kS);
  scheduler.remove(kR);
  scheduler.remove(kS);
  const SeqId kT = kC, kU = kD;
  books.add_restored_seq(kT, 9, 8);
  books.add_restored_seq(kU, 13, 12);
  scheduler.add(kT);
  scheduler.add(kU);
  plan = step(scheduler, books);
  EXPECT_EQ(plan.seqs, (std::vector<ScheduledSeq>{{kT, 1, true}, {kU, 1, true}}));
  books.check_integrity();
}

TEST(Scheduler, ASequenceWhoseKvIsStillReadFromDiskIsPassedOverWhileOthersRun) {
  // A runs; R's session file (8 of 9 tokens) is still being read. Admitting R would make the
  // step wait for the read, so C, behind it, is admitted and R keeps its place in front.
  Scheduler scheduler(config(512));
  FakeBooks books(64);
  const SeqId kR = kB;
  books.add_seq(kA, 4);
  scheduler.add(kA);
  step(scheduler, books);
  books.add_reading_seq(kR, 9, 8);
  books.add_seq(kC, 4);
  scheduler.add(kR);
  scheduler.add(kC);
  StepPlan plan = step(scheduler, books);
  EXPECT_EQ(plan.seqs, (std::vector<ScheduledSeq>{{kA, 1, true}, {kC, 4, true}}));
  EXPECT_EQ(plan.admitted, (std::vector<SeqId>{kC}));
  EXPECT_EQ(waiting(scheduler), (std::vector<SeqId>{kR}));
  // still reading: passed over again; once read, admitted (its copy then in flight)
  plan = step(scheduler, books);
  EXPECT_EQ(plan.seqs, (std::vector<ScheduledSeq>{{kA, 1, true}, {kC, 1, true}}));
  EXPECT_EQ(waiting(scheduler), (std::vector<SeqId>{kR}));
  books.finish_read(kR);
  plan = step(scheduler, books);
  EXPECT_EQ(plan.admitted, (std::vector<SeqId>{kR}));
  EXPECT_TRUE(waiting(scheduler).empty());
  EXPECT_EQ(books.num_reads_waited(), 0);
}

TEST(Scheduler, ASequenceWhoseKvIsStillReadIsWaitedForWhenNothingElseRuns) {
  // Nothing runs: passing R over would leave the step empty, so R is admitted (the engine
  // waits for its read) ahead of C, in order.
  Scheduler scheduler(config(512));
  FakeBooks books(64);
  const SeqId kR = kA;
  books.add_reading_seq(kR, 9, 8);
  books.add_seq(kC, 4);
  scheduler.add(kR);
  scheduler.add(kC);
  const StepPlan plan = step(scheduler, books);
  EXPECT_EQ(plan.admitted, (std::vector<SeqId>{kR, kC}));
  EXPECT_EQ(books.num_reads_waited(), 1);
}

TEST(Scheduler, ATierCopyThatCanNeverFitIsDroppedAndRecomputed) {
  // 2 blocks: R's session KV (12 tokens, 3 blocks) cannot come back even with nothing else in
  // the pool: it is dropped and R is admitted to recompute, its first chunk within the pool
  // (budget 8: 2 blocks).
  Scheduler scheduler(config(8));
  FakeBooks books(2);
  books.add_restored_seq(kA, 13, 12);
  scheduler.add(kA);
  const StepPlan plan = step(scheduler, books);
  EXPECT_EQ(plan.recomputed, (std::vector<SeqId>{kA}));
  EXPECT_EQ(plan.seqs, (std::vector<ScheduledSeq>{{kA, 8, false}}));
  EXPECT_EQ(books.moves(), (std::vector<std::string>{"recompute 1"}));
}

TEST(Scheduler, ForksRunRightAfterTheirParent) {
  Scheduler scheduler(config(512));
  FakeBooks books(64);
  for (SeqId id : {kA, kB}) {
    books.add_seq(id, 4);
    scheduler.add(id);
  }
  step(scheduler, books);
  const SeqId kA1{11}, kA2{12};
  scheduler.add_forks(kA, std::vector<SeqId>{kA1, kA2});
  EXPECT_EQ(scheduler.running(), (std::vector<SeqId>{kA, kA1, kA2, kB}));
  scheduler.remove(kA1);
  EXPECT_EQ(scheduler.running(), (std::vector<SeqId>{kA, kA2, kB}));
}

TEST(Scheduler, RandomWorkloadsKeepTheBudgetTheCapTheOrderAndEveryBlock) {
  // Arrivals, idle sessions and restores at random; after every plan: the budget and the cap
  // hold, no sequence runs twice, the queues hold every live sequence once, nothing skipped
  // ahead (the waiting queue left is the one after step 1 less its first admitted or aborted
  // sequences), and every block is free or held. Every request finishes.
  std::mt19937 rng(7);
  auto uniform = [&](int32_t lo, int32_t hi) {
    return std::uniform_int_distribution<int32_t>(lo, hi)(rng);
  };
  constexpr int32_t kStepTokens = 24, kMaxSeqs = 5;
  Scheduler scheduler(config(kStepTokens, kMaxSeqs));
  FakeBooks books(32);
  std::map<SeqId, int32_t> outputs_left;
  int64_t next_id = 1;
  int32_t num_arrivals = 0, num_finished = 0, num_aborted = 0;
  int32_t num_preempted = 0, num_released = 0, num_evictions = 0, num_restores_held = 0;
  int32_t num_passed_over = 0;
  for (int32_t step_index = 0; step_index < 5000 && (num_arrivals < 200 || !outputs_left.empty());
       ++step_index) {
    if (num_arrivals < 200 && uniform(0, 2) == 0) {
      const SeqId id{next_id++};
      if (uniform(0, 7) == 0) {
        books.add_reading_seq(id, uniform(9, 40), 8);
      } else if (uniform(0, 3) == 0) {
        books.add_restored_seq(id, uniform(9, 40), 8);
      } else {
        books.add_seq(id, uniform(1, 40));
      }
      outputs_left[id] = uniform(1, 16);
      scheduler.add(id);
      ++num_arrivals;
    }
    if (uniform(0, 9) == 0 && books.num_free_blocks() >= 2) books.add_idle_session(2);
    for (const auto& [id, left] : outputs_left) {
      if (books.seq(id).restoring && uniform(0, 1) == 0) books.finish_restore(id);
      if (books.seq(id).reading && uniform(0, 3) == 0) books.finish_read(id);
    }
    std::set<SeqId> reading_before;
    for (SeqId id : scheduler.waiting()) {
      if (!books.kv_at_hand(id)) reading_before.insert(id);
    }
    const std::vector<SeqId> running_before = scheduler.running();
    const std::deque<SeqId> waiting_before = scheduler.waiting();
    const StepPlan plan = scheduler.plan_step(books);
    books.check_integrity();
    ASSERT_LE(plan.num_tokens, kStepTokens);
    ASSERT_LE(static_cast<int32_t>(plan.seqs.size()) + books.num_restoring_unplanned(), kMaxSeqs);
    std::vector<SeqId> planned;
    for (const ScheduledSeq& p : plan.seqs) {
      ASSERT_GT(p.num_tokens, 0);
      planned.push_back(p.id);
      ASSERT_NE(std::find(scheduler.running().begin(), scheduler.running().end(), p.id),
                scheduler.running().end());
    }
    std::sort(planned.begin(), planned.end());
    ASSERT_EQ(std::adjacent_find(planned.begin(), planned.end()), planned.end());
    std::vector<SeqId> queued(scheduler.running());
    queued.insert(queued.end(), scheduler.waiting().begin(), scheduler.waiting().end());
    std::sort(queued.begin(), queued.end());
    std::vector<SeqId> live;
    for (const auto& [id, left] : outputs_left) {
      if (std::find(plan.aborted.begin(), plan.aborted.end(), id) == plan.aborted.end()) {
        live.push_back(id);
      }
    }
    ASSERT_EQ(queued, live);
    // after step 1 the preempted wait in front, the last preempted first
    std::deque<SeqId> after_running = waiting_before;
    for (SeqId id : plan.preempted) after_running.push_front(id);
    // the queue keeps its order less what left it; only sequences still being read are
    // passed over (left ahead of one that left), and only while others run
    std::set<SeqId> taken(plan.admitted.begin(), plan.admitted.end());
    taken.insert(plan.aborted.begin(), plan.aborted.end());
    std::deque<SeqId> left, passed_over;
    bool after_last_taken = false;
    for (auto it = after_running.rbegin(); it != after_running.rend(); ++it) {
      after_last_taken = after_last_taken || taken.count(*it) > 0;
      if (taken.count(*it) > 0) continue;
      left.push_front(*it);
      if (after_last_taken) passed_over.push_front(*it);
    }
    ASSERT_EQ(scheduler.waiting(), left);
    for (SeqId id : passed_over) {
      ASSERT_EQ(reading_before.count(id), 1u) << "seq " << id.value << " was skipped";
      ASSERT_FALSE(plan.seqs.empty() && scheduler.running().empty());
    }
    num_passed_over += static_cast<int32_t>(passed_over.size());
    for (SeqId id : plan.aborted) outputs_left.erase(id);
    num_aborted += static_cast<int32_t>(plan.aborted.size());
    num_preempted += static_cast<int32_t>(plan.preempted.size());
    num_released += static_cast<int32_t>(plan.released.size());
    num_evictions += plan.num_idle_evictions;
    num_restores_held += books.num_restoring_unplanned();
    books.execute(plan);
    for (const ScheduledSeq& p : plan.seqs) {
      if (p.wants_logits && --outputs_left.at(p.id) == 0) {
        outputs_left.erase(p.id);
        scheduler.remove(p.id);
        books.finish(p.id);
        ++num_finished;
      }
    }
  }
  EXPECT_EQ(num_arrivals, 200);
  EXPECT_TRUE(outputs_left.empty());
  // no sequence outgrows the pool (40 + 16 tokens: 14 blocks of 32): none is aborted
  EXPECT_EQ(num_finished, 200);
  EXPECT_EQ(num_aborted, 0);
  // the workload reached every rule
  EXPECT_GT(num_preempted, 0);
  EXPECT_GT(num_released, 0);
  EXPECT_GT(num_evictions, 0);
  EXPECT_GT(num_restores_held, 0);
  EXPECT_GT(num_passed_over, 0);
  EXPECT_GT(books.num_reads_waited(), 0);
  std::printf(
      "random workload: %d preempted, %d released, %d idle evictions, %d restore-steps, %d "
      "passed over while read, %d reads waited for\n",
      num_preempted, num_released, num_evictions, num_restores_held, num_passed_over,
      books.num_reads_waited());
}

// Rates of 1 GiB/s for copies and 1000 tokens/s for prefill: swapping b bytes costs 2b / 2^30 s
// (out and back in), recomputing t tokens t / 1000 s.
PreemptionCostModel measured_cost() {
  PreemptionCostModel cost;
  cost.observe_copy(uint64_t{1} << 30, 1.0);
  cost.observe_prefill(1000, 1.0);
  return cost;
}

TEST(Scheduler, AutoSwapsWhenTheCostModelPricesTheCopyCheaper) {
  const PreemptionCostModel cost = measured_cost();
  // 64 MiB: 0.125 s of copies against 1 s of prefill for 1000 tokens: swap
  EXPECT_TRUE(Scheduler::should_swap(Preemption::kAuto, true, 1000, 64u << 20, cost));
  // 1 GiB: 2 s of copies against 1 s: recompute
  EXPECT_FALSE(Scheduler::should_swap(Preemption::kAuto, true, 1000, uint64_t{1} << 30, cost));
  // 256 MiB for 100 tokens: 0.5 s against 0.1 s: recompute
  EXPECT_FALSE(Scheduler::should_swap(Preemption::kAuto, true, 100, 256u << 20, cost));
  // rates not measured yet: swap
  EXPECT_TRUE(Scheduler::should_swap(Preemption::kAuto, true, 100, uint64_t{1} << 30,
                                     PreemptionCostModel()));
}

TEST(Scheduler, SwapAndRecomputeModesAndTheHostTierOverrideTheCostModel) {
  const PreemptionCostModel cost = measured_cost();
  const uint64_t gib = uint64_t{1} << 30;
  EXPECT_TRUE(Scheduler::should_swap(Preemption::kSwap, true, 1000, gib, cost));  // 2 s > 1 s
  EXPECT_FALSE(Scheduler::should_swap(Preemption::kRecompute, true, 1000, 64u << 20, cost));
  // no host tier, or no KV to keep: recompute whatever the mode
  EXPECT_FALSE(Scheduler::should_swap(Preemption::kSwap, false, 1000, 64u << 20, cost));
  EXPECT_FALSE(Scheduler::should_swap(Preemption::kAuto, false, 1000, 64u << 20, cost));
  EXPECT_FALSE(Scheduler::should_swap(Preemption::kSwap, true, 0, 0, cost));
}

TEST(Scheduler, ASwappedSequenceComesBackWithABlockToSpareForEachRunningOne) {
  // 4 blocks of its own + 1 per running sequence
  EXPECT_TRUE(Scheduler::swap_in_fits(4, 7, 3));
  EXPECT_FALSE(Scheduler::swap_in_fits(4, 7, 4));
  // with none running, any room will do (the pool's own check decides)
  EXPECT_TRUE(Scheduler::swap_in_fits(4, 3, 0));
  EXPECT_TRUE(Scheduler::swap_in_fits(4, 0, 0));
}

TEST(Scheduler, TheLeastRecentlyUsedIdleSessionGoesFirst) {
  EXPECT_EQ(Scheduler::pick_idle_session(std::vector<int64_t>{5, 2, 9, 3}),
            std::optional<size_t>(1));
  EXPECT_EQ(Scheduler::pick_idle_session(std::vector<int64_t>{7}), std::optional<size_t>(0));
  EXPECT_EQ(Scheduler::pick_idle_session(std::vector<int64_t>{}), std::nullopt);
}

TEST(Scheduler, AnIdleSessionGoesToTheHostTierThenToDiskWhereItsFileFits) {
  // 100 tokens whose file takes 5000 bytes; a disk tier of 4096 bytes cannot hold it at all
  using T = IdleSessionTiers;
  EXPECT_EQ(Scheduler::tiers_for_idle_session(100, true, true, 5000, 8192), (T{true, true}));
  EXPECT_EQ(Scheduler::tiers_for_idle_session(100, true, true, 5000, 4096), (T{true, false}));
  EXPECT_EQ(Scheduler::tiers_for_idle_session(100, false, true, 5000, 5000), (T{false, true}));
  EXPECT_EQ(Scheduler::tiers_for_idle_session(100, false, false, 5000, 0), (T{false, false}));
  // no KV: nothing to keep anywhere
  EXPECT_EQ(Scheduler::tiers_for_idle_session(0, true, true, 60, 8192), (T{false, false}));
}

}  // namespace
}  // namespace kvp

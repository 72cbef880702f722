// TierMoves alone (engine/tier_moves.h), over scripted tickets: no model, no pool. The backend
// here completes a ticket only when the test says so, as a GPU's copy stream finishes whenever it
// does; the checks are on what the engine relies on: completion in order, nothing taken before
// its copy is done, every move counted once (timed or overlapped), the cost model fed only with
// copies' own times, and which restores join a step under each policy.
#include "engine/tier_moves.h"

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <set>
#include <thread>

namespace kvp {
namespace {

using Clock = TierMoves::Clock;

class ScriptedTickets : public TransferTickets {
 public:
  std::string device_name() const override { return "scripted test device"; }
  Result<bool> transfers_done(uint64_t ticket) override {
    ++num_polls;
    if (fail) return Status::internal("the copy engine broke");
    return ticket <= completed;
  }
  Status wait_transfers(uint64_t ticket) override {
    waited.insert(ticket);
    if (fail) return Status::internal("the copy engine broke");
    completed = std::max(completed, ticket);
    return Status::ok();
  }
  Status order_after_transfers(uint64_t ticket) override {
    orders.push_back(ticket);
    return Status::ok();
  }
  bool orders_by_layer() const override { return by_layer; }

  uint64_t completed = 0;  // tickets up to this one are done
  bool by_layer = true;
  bool fail = false;
  int64_t num_polls = 0;
  std::set<uint64_t> waited;
  std::vector<uint64_t> orders;
};

std::unique_ptr<HostKv> host_copy(uint64_t bytes, int32_t num_tokens = 16) {
  auto kv = std::make_unique<HostKv>(nullptr, std::vector<std::vector<BlockId>>{});
  kv->size_bytes = bytes;
  kv->copied_bytes = bytes;
  kv->num_tokens = num_tokens;
  return kv;
}

std::unique_ptr<TierMoves::WriteBack> write_back(uint64_t ticket, int32_t num_blocks,
                                                 uint64_t bytes) {
  auto wb = std::make_unique<TierMoves::WriteBack>();
  wb->session = fmt::format("s{}", ticket);
  wb->session_id = static_cast<int64_t>(ticket);
  wb->seq = SeqId{static_cast<int64_t>(ticket)};
  wb->kv = host_copy(bytes);
  wb->ticket = ticket;
  wb->num_blocks = num_blocks;
  wb->start = Clock::now();
  return wb;
}

TierMoves::Restore restore(uint64_t ticket, uint64_t bytes,
                           std::optional<Clock::time_point> expected_end = std::nullopt) {
  TierMoves::Restore r;
  r.ticket = ticket;
  r.bytes = bytes;
  r.start = Clock::now();
  r.expected_end = expected_end;
  r.kv = host_copy(bytes);
  return r;
}

constexpr uint64_t kMiB = 1 << 20;

TEST(TierMoves, WriteBacksCompleteOldestFirstAndEachIsCountedOnce) {
  ScriptedTickets tickets;
  PreemptionCostModel cost;
  TierMoves moves(&tickets, &cost, {});
  moves.start_write_back(write_back(1, 3, kMiB));
  moves.start_write_back(write_back(2, 5, 2 * kMiB));
  moves.start_write_back(write_back(3, 7, 4 * kMiB));
  EXPECT_EQ(moves.num_write_back_blocks(), 15);

  // nothing done: nothing taken, whatever is asked
  EXPECT_EQ(moves.take_write_back(TierMoves::Take::kIfDone), nullptr);
  EXPECT_EQ(moves.write_backs().size(), 3u);

  // the oldest done: it alone comes out, found done by a poll (overlapped, not timed)
  tickets.completed = 1;
  std::unique_ptr<TierMoves::WriteBack> first = moves.take_write_back(TierMoves::Take::kIfDone);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->ticket, 1u);
  EXPECT_EQ(first->num_blocks, 3);
  EXPECT_EQ(moves.take_write_back(TierMoves::Take::kIfDone), nullptr);
  EXPECT_EQ(moves.num_write_back_blocks(), 12);
  EXPECT_EQ(moves.to_host().overlapped, 1);
  EXPECT_EQ(moves.to_host().overlapped_bytes, kMiB);
  EXPECT_EQ(moves.to_host().count, 0);

  // waited for: the oldest only, timed
  std::unique_ptr<TierMoves::WriteBack> second = moves.take_write_back(TierMoves::Take::kWait);
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(second->ticket, 2u);
  EXPECT_EQ(tickets.waited, std::set<uint64_t>{2});
  EXPECT_EQ(moves.to_host().count, 1);
  EXPECT_EQ(moves.to_host().bytes, 2 * kMiB);
  EXPECT_GE(moves.to_host().seconds, 0.0);
  // a write-back's time is not a copy's rate (it ran under steps): the cost model learns nothing
  EXPECT_FALSE(cost.copy_bytes_per_second());

  tickets.completed = 3;
  ASSERT_NE(moves.take_write_back(TierMoves::Take::kIfDone), nullptr);
  EXPECT_EQ(moves.take_write_back(TierMoves::Take::kIfDone), nullptr);
  EXPECT_EQ(moves.take_write_back(TierMoves::Take::kWait),
            nullptr);  // none in flight: nothing to wait for
  EXPECT_EQ(moves.to_host().overlapped, 2);
  EXPECT_EQ(moves.num_write_back_blocks(), 0);
}

TEST(TierMoves, AWaitedCopyIsTimedTeachesTheCopyRateAndDrainsItsDirectionsQueue) {
  ScriptedTickets tickets;
  PreemptionCostModel cost;
  TierMoves moves(&tickets, &cost, {});
  // no rate yet: no expected end
  EXPECT_FALSE(moves.queue(kMiB, /*into_pool=*/true));

  const Clock::time_point start = Clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  ASSERT_TRUE(moves.wait(7, 4 * kMiB, start, /*into_pool=*/true).is_ok());
  EXPECT_EQ(tickets.waited, std::set<uint64_t>{7});
  EXPECT_EQ(moves.to_pool().count, 1);
  EXPECT_EQ(moves.to_pool().bytes, 4 * kMiB);
  EXPECT_GE(moves.to_pool().seconds, 0.002);
  EXPECT_EQ(moves.to_host().count, 0);
  ASSERT_TRUE(cost.copy_bytes_per_second());
  // at most 4 MiB / 2 ms: the rate is the copy's bytes over its measured time
  EXPECT_LE(*cost.copy_bytes_per_second(), 4.0 * kMiB / 0.002);

  // copies queued one after another end one after another, each its expected time later
  const double per_copy = *cost.copy_seconds(8 * kMiB);
  const Clock::time_point before = Clock::now();
  const std::optional<Clock::time_point> a = moves.queue(8 * kMiB, true);
  const std::optional<Clock::time_point> b = moves.queue(8 * kMiB, true);
  ASSERT_TRUE(a && b);
  EXPECT_GE(std::chrono::duration<double>(*a - before).count(), per_copy * 0.999);
  EXPECT_NEAR(std::chrono::duration<double>(*b - *a).count(), per_copy, per_copy * 1e-3);
  // the other direction's queue is its own
  const std::optional<Clock::time_point> out = moves.queue(8 * kMiB, /*into_pool=*/false);
  ASSERT_TRUE(out);
  EXPECT_LT(*out, *b);
  // a copy waited for drains its direction: the next one starts from now
  ASSERT_TRUE(moves.wait(8, kMiB, Clock::now(), true).is_ok());
  const Clock::time_point now = Clock::now();
  const std::optional<Clock::time_point> c = moves.queue(8 * kMiB, true);
  ASSERT_TRUE(c);
  EXPECT_LT(*c, *b + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(per_copy)));
  EXPECT_GE(std::chrono::duration<double>(*c - now).count(), 0.0);

  // an error of the copy comes back, and nothing is counted
  tickets.fail = true;
  EXPECT_FALSE(moves.wait(9, kMiB, Clock::now(), true).is_ok());
  EXPECT_EQ(moves.to_pool().count, 2);
}

TEST(TierMoves, ARestoreComesBackOnlyWhenItsCopyIsDoneWithItsSource) {
  ScriptedTickets tickets;
  PreemptionCostModel cost;
  TierMoves moves(&tickets, &cost, {});
  moves.start_restore(SeqId{1}, restore(1, kMiB));
  moves.start_restore(SeqId{2}, restore(2, 2 * kMiB));
  EXPECT_TRUE(moves.is_restoring(SeqId{1}));
  EXPECT_FALSE(moves.is_restoring(SeqId{3}));
  EXPECT_EQ(moves.num_unordered(), 2);

  EXPECT_FALSE(moves.settle(SeqId{1}, false));  // running
  EXPECT_TRUE(moves.is_restoring(SeqId{1}));
  tickets.completed = 1;
  std::optional<TierMoves::Restore> done = moves.settle(SeqId{1}, false);
  ASSERT_TRUE(done);
  ASSERT_NE(done->kv, nullptr);  // the source, handed back to the engine to let go
  EXPECT_EQ(done->kv->size_bytes, kMiB);
  EXPECT_FALSE(moves.is_restoring(SeqId{1}));
  // found done after steps ran under it: overlapped, and the cost model learns no rate from it
  EXPECT_EQ(moves.to_pool().overlapped, 1);
  EXPECT_EQ(moves.to_pool().count, 0);
  EXPECT_FALSE(cost.copy_bytes_per_second());

  // waited for at once: timed, a copy's rate
  done = moves.settle(SeqId{2}, true);
  ASSERT_TRUE(done);
  EXPECT_TRUE(tickets.waited.count(2));
  EXPECT_EQ(moves.to_pool().count, 1);
  EXPECT_EQ(moves.to_pool().bytes, 2 * kMiB);
  EXPECT_TRUE(cost.copy_bytes_per_second());
  EXPECT_TRUE(moves.restores().empty());
}

// A cost model that knows a copy rate of 1 MiB/s, a prefill rate of 1000 tokens/s and steps of
// 10 ms.
PreemptionCostModel measured_cost() {
  PreemptionCostModel cost;
  cost.observe_copy(kMiB, 1.0);
  cost.observe_prefill(1000, 1.0);
  cost.observe_step(0.010);
  return cost;
}

struct JoinCase {
  RestoreOverlap overlap;
  bool by_layer;
  bool holds_up_others;
  int64_t pending_tokens;
  bool joins;
};

TEST(TierMoves, WhichRestoresJoinAStepFollowsThePolicy) {
  // one restore whose copy is expected to end 1 s from now: against 10 pending tokens (10 ms of
  // prefill) it is copy-bound; against 5000 (5 s) it is not
  const JoinCase cases[] = {
      {RestoreOverlap::kOff, true, false, 10, false},
      {RestoreOverlap::kAlone, true, false, 5000, true},
      {RestoreOverlap::kAlone, true, true, 10, false},
      {RestoreOverlap::kCopyBound, true, false, 5000, true},
      {RestoreOverlap::kCopyBound, true, true, 10, true},
      {RestoreOverlap::kCopyBound, true, true, 5000, false},
      {RestoreOverlap::kAlways, true, true, 5000, true},
      // a backend that runs the whole step after the copy: no overlap, whatever the policy
      {RestoreOverlap::kAlways, false, false, 10, false},
      {RestoreOverlap::kCopyBound, false, true, 10, false},
  };
  for (const JoinCase& c : cases) {
    SCOPED_TRACE(testing::Message()
                 << "overlap " << static_cast<int>(c.overlap) << " by_layer " << c.by_layer
                 << " holds_up_others " << c.holds_up_others << " pending " << c.pending_tokens);
    ScriptedTickets tickets;
    tickets.by_layer = c.by_layer;
    PreemptionCostModel cost = measured_cost();
    TierMoves moves(&tickets, &cost, {c.overlap, /*joins_within_step=*/false});
    const std::optional<Clock::time_point> end = moves.queue(kMiB, true);
    ASSERT_TRUE(end);
    moves.start_restore(SeqId{4}, restore(5, kMiB, end));
    EXPECT_EQ(moves.join_step(SeqId{4}, c.pending_tokens, c.holds_up_others), c.joins);
    EXPECT_EQ(tickets.orders, c.joins ? std::vector<uint64_t>{5} : std::vector<uint64_t>{});
    EXPECT_EQ(moves.any_ordered(), c.joins);
    EXPECT_EQ(moves.num_unordered(), c.joins ? 0 : 1);
    EXPECT_EQ(moves.num_joined_steps(), c.joins ? 1 : 0);
  }
}

TEST(TierMoves, WithoutOverlapARestoreJoinsOnlyWhenItsCopyEndsWithinAStep) {
  ScriptedTickets tickets;
  tickets.by_layer = false;
  PreemptionCostModel cost = measured_cost();  // steps of 10 ms
  TierMoves moves(&tickets, &cost, {RestoreOverlap::kCopyBound, /*joins_within_step=*/true});
  const auto in = [](double seconds) {
    return Clock::now() +
           std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  };
  moves.start_restore(SeqId{1}, restore(1, kMiB, in(5.0)));     // 5 s away
  moves.start_restore(SeqId{2}, restore(2, kMiB, in(-0.001)));  // due already
  moves.start_restore(SeqId{3}, restore(3, kMiB));              // no estimate
  EXPECT_FALSE(moves.join_step(SeqId{1}, 10, false));
  EXPECT_TRUE(moves.join_step(SeqId{2}, 10, true));
  EXPECT_FALSE(moves.join_step(SeqId{3}, 10, false));
  EXPECT_EQ(tickets.orders, std::vector<uint64_t>{2});
  EXPECT_EQ(moves.ordered(), std::vector<SeqId>{SeqId{2}});

  // joined once: asked again in the same step it is still in, with no second order
  EXPECT_TRUE(moves.join_step(SeqId{2}, 10, true));
  EXPECT_EQ(tickets.orders.size(), 1u);
  EXPECT_EQ(moves.num_joined_steps(), 1);

  // its step's time is in the copy's: settled after the step, it is overlapped, not timed
  tickets.completed = 2;
  ASSERT_TRUE(moves.settle(SeqId{2}, false));
  EXPECT_EQ(moves.to_pool().overlapped, 1);
  EXPECT_EQ(moves.to_pool().count, 0);
}

// A copy out of the pool whose blocks the engine gives back at once: the steps are ordered after
// it on the backend (not waited for), the step that ordered it is not a step's time alone, and
// it is counted once, as overlapped, when a later step finds it done.
TEST(TierMoves, ACopyOrderedOutIsNotWaitedForAndCountsWhenALaterStepFindsItDone) {
  ScriptedTickets tickets;
  PreemptionCostModel cost;
  TierMoves moves(&tickets, &cost, {});
  moves.begin_step();
  EXPECT_FALSE(moves.any_ordered());
  std::unique_ptr<HostKv> a = host_copy(3 * kMiB), b = host_copy(kMiB);
  ASSERT_TRUE(moves.order_out(5, *a).is_ok());
  ASSERT_TRUE(moves.order_out(6, *b).is_ok());
  EXPECT_EQ(a->landing, 5u);  // each copy lands when its ticket completes
  EXPECT_EQ(b->landing, 6u);
  EXPECT_EQ(a->landing_on, &tickets);
  EXPECT_EQ(tickets.orders, (std::vector<uint64_t>{5, 6}));
  EXPECT_TRUE(tickets.waited.empty());
  EXPECT_EQ(moves.num_landing(), 2);
  EXPECT_TRUE(moves.any_ordered());  // this step runs after them
  EXPECT_EQ(moves.to_host().count + moves.to_host().overlapped, 0);

  // the next step: none done yet, nothing counted; the step is not ordered after a new one
  moves.begin_step();
  EXPECT_FALSE(moves.any_ordered());
  EXPECT_EQ(moves.num_landing(), 2);
  EXPECT_EQ(moves.to_host().overlapped, 0);
  // the older done: it alone is counted
  tickets.completed = 5;
  moves.begin_step();
  EXPECT_EQ(moves.num_landing(), 1);
  EXPECT_EQ(moves.to_host().overlapped, 1);
  EXPECT_EQ(moves.to_host().overlapped_bytes, 3 * kMiB);
  // land_all waits for the rest (once, for the newest: a direction completes in order)
  moves.land_all();
  EXPECT_EQ(tickets.waited, std::set<uint64_t>{6});
  EXPECT_EQ(moves.num_landing(), 0);
  EXPECT_EQ(moves.to_host().overlapped, 2);
  EXPECT_EQ(moves.to_host().overlapped_bytes, 4 * kMiB);
  EXPECT_EQ(moves.to_host().count, 0);
  EXPECT_FALSE(cost.copy_bytes_per_second());  // no copy's own time was seen

  // an ordering the backend refuses comes back, and nothing is held
  struct Refusing final : ScriptedTickets {
    Status order_after_transfers(uint64_t) override { return Status::internal("no event"); }
  };
  Refusing refusing;
  TierMoves refused(&refusing, &cost, {});
  std::unique_ptr<HostKv> c = host_copy(kMiB);
  EXPECT_FALSE(refused.order_out(1, *c).is_ok());
  EXPECT_EQ(c->landing, 0u);
  EXPECT_EQ(refused.num_landing(), 0);
  EXPECT_FALSE(refused.any_ordered());
}

// A step that needs room now takes the oldest write-back at once, ordered after its copy: its
// blocks may be given back before the copy completes, its host copy carries the ticket, and it
// is counted once, when a later step finds it done. One already done is taken as done.
TEST(TierMoves, AWriteBackTakenOrderedAfterIsNotWaitedForAndCountsOnce) {
  ScriptedTickets tickets;
  PreemptionCostModel cost;
  TierMoves moves(&tickets, &cost, {});
  moves.start_write_back(write_back(1, 3, kMiB));
  moves.start_write_back(write_back(2, 5, 2 * kMiB));
  tickets.completed = 1;
  std::unique_ptr<TierMoves::WriteBack> done = moves.take_write_back(TierMoves::Take::kOrderAfter);
  ASSERT_NE(done, nullptr);
  EXPECT_EQ(done->ticket, 1u);
  EXPECT_TRUE(tickets.orders.empty());  // done: nothing to order after
  EXPECT_EQ(done->kv->landing, 0u);
  EXPECT_EQ(moves.to_host().overlapped, 1);

  std::unique_ptr<TierMoves::WriteBack> running =
      moves.take_write_back(TierMoves::Take::kOrderAfter);
  ASSERT_NE(running, nullptr);
  EXPECT_EQ(running->ticket, 2u);
  EXPECT_EQ(tickets.orders, std::vector<uint64_t>{2});
  EXPECT_TRUE(tickets.waited.empty());
  EXPECT_EQ(running->kv->landing, 2u);
  EXPECT_TRUE(moves.write_backs().empty());
  EXPECT_TRUE(moves.any_ordered());
  EXPECT_EQ(moves.to_host().overlapped, 1);  // not yet
  tickets.completed = 2;
  moves.begin_step();
  EXPECT_EQ(moves.to_host().overlapped, 2);
  EXPECT_EQ(moves.to_host().overlapped_bytes, 3 * kMiB);
  EXPECT_EQ(moves.to_host().count, 0);
  EXPECT_EQ(moves.num_landing(), 0);
  EXPECT_EQ(moves.take_write_back(TierMoves::Take::kOrderAfter), nullptr);  // none left
}

// A host copy a copy out of the pool is still landing in: land() waits for that copy once, and
// the copy waits for it as it goes (its blocks are given back only after the device wrote them).
TEST(TierMoves, AHostCopyStillLandingWaitsBeforeItIsReadAndBeforeItGoes) {
  ScriptedTickets tickets;
  std::unique_ptr<HostKv> kv = host_copy(kMiB);
  EXPECT_TRUE(kv->land().is_ok());  // nothing landing: no wait
  EXPECT_TRUE(tickets.waited.empty());
  kv->landing_on = &tickets;
  kv->landing = 4;
  EXPECT_TRUE(kv->land().is_ok());
  EXPECT_EQ(tickets.waited, std::set<uint64_t>{4});
  EXPECT_TRUE(kv->land().is_ok());  // landed: once
  EXPECT_EQ(tickets.waited.size(), 1u);

  kv->landing = 7;
  kv.reset();
  EXPECT_EQ(tickets.waited, (std::set<uint64_t>{4, 7}));

  // an error of the copy comes back from land()
  auto failed = host_copy(kMiB);
  failed->landing_on = &tickets;
  failed->landing = 8;
  tickets.fail = true;
  EXPECT_FALSE(failed->land().is_ok());
  EXPECT_EQ(failed->landing, 0u);  // not waited for again as it goes
  tickets.fail = false;
}

TEST(TierMoves, GoingAwayWaitsForEveryCopyInFlight) {
  ScriptedTickets tickets;
  PreemptionCostModel cost;
  {
    TierMoves moves(&tickets, &cost, {});
    moves.start_write_back(write_back(3, 1, kMiB));
    moves.start_restore(SeqId{9}, restore(4, kMiB));
    std::unique_ptr<HostKv> out = host_copy(kMiB);
    ASSERT_TRUE(moves.order_out(5, *out).is_ok());
    out->landing = 0;  // (this one's own wait is the HostKv test's)
  }
  // the host copies the device was still reading or writing went only after these
  EXPECT_EQ(tickets.waited, (std::set<uint64_t>{3, 4, 5}));
}

TEST(TierMovesDeathTest, ACopyErrorOfTheEnginesOwnBlocksIsABrokenBackend) {
  ScriptedTickets tickets;
  PreemptionCostModel cost;
  TierMoves moves(&tickets, &cost, {});
  moves.start_write_back(write_back(1, 1, kMiB));
  tickets.fail = true;
  EXPECT_DEATH(moves.take_write_back(TierMoves::Take::kIfDone),
               "scripted test device backend failed a write-back");
  tickets.fail = false;
  tickets.completed = 1;
}

}  // namespace
}  // namespace kvp

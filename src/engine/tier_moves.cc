// TierMoves (tier_moves.h): the pool <-> host copies in flight, their completion and their cost.
#include "engine/tier_moves.h"

#include <algorithm>
#include <utility>

namespace kvp {

namespace {

double seconds_until(TierMoves::Clock::time_point end) {
  return std::chrono::duration<double>(end - TierMoves::Clock::now()).count();
}

}  // namespace

double MoveStats::count_timed(uint64_t moved, std::chrono::steady_clock::time_point start) {
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ++count;
  bytes += moved;
  seconds += s;
  return s;
}

void MoveStats::count_overlapped(uint64_t moved) {
  ++overlapped;
  overlapped_bytes += moved;
}

TierMoves::TierMoves(TransferTickets* transfers, PreemptionCostModel* cost, Policy policy)
    : transfers_(transfers), cost_(cost), policy_(policy) {}

TierMoves::~TierMoves() {
  for (const auto& wb : write_backs_) (void)transfers_->wait_transfers(wb->ticket);
  for (const auto& [id, r] : restores_) (void)transfers_->wait_transfers(r.ticket);
  for (const Landing& l : landing_) (void)transfers_->wait_transfers(l.ticket);
}

void TierMoves::check(const Status& status, const char* what) const {
  KVP_CHECK(status.is_ok(), "the {} backend failed {}: {}", transfers_->device_name(), what,
            status.to_string());
}

std::optional<TierMoves::Clock::time_point> TierMoves::queue(uint64_t bytes, bool into_pool) {
  const std::optional<double> seconds = cost_->copy_seconds(bytes);
  if (!seconds) return std::nullopt;
  Clock::time_point& end = queue_end_[into_pool ? 1 : 0];
  end = std::max(end, Clock::now()) +
        std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(*seconds));
  return end;
}

Status TierMoves::wait(uint64_t ticket, uint64_t bytes, Clock::time_point start, bool into_pool) {
  KVP_RETURN_IF_ERROR(transfers_->wait_transfers(ticket));
  queue_end_[into_pool ? 1 : 0] = Clock::now();  // every copy of that direction so far is done
  // copies waited for from start to end: what the cost model prices
  MoveStats& moves = into_pool ? to_pool_ : to_host_;
  cost_->observe_copy(bytes, moves.count_timed(bytes, start));
  return Status::ok();
}

Status TierMoves::order_out(uint64_t ticket, HostKv& kv) {
  KVP_RETURN_IF_ERROR(transfers_->order_after_transfers(ticket));
  kv.landing_on = transfers_;
  kv.landing = ticket;
  landing_.push_back({ticket, kv.copied_bytes});
  step_ordered_out_ = true;
  ++num_ordered_out_;
  return Status::ok();
}

void TierMoves::begin_step() {
  step_ordered_out_ = false;
  while (!landing_.empty()) {
    Result<bool> done = transfers_->transfers_done(landing_.front().ticket);
    check(done.status(), "a copy out of the pool");
    if (!*done) return;
    // its duration is not known: the steps ordered after it ran under it
    to_host_.count_overlapped(landing_.front().bytes);
    landing_.pop_front();
  }
}

void TierMoves::land_all() {
  if (landing_.empty()) return;
  check(transfers_->wait_transfers(landing_.back().ticket), "a copy out of the pool");
  begin_step();
}

void TierMoves::start_write_back(std::unique_ptr<WriteBack> write_back) {
  write_backs_.push_back(std::move(write_back));
}

int32_t TierMoves::num_write_back_blocks() const {
  int32_t n = 0;
  for (const auto& wb : write_backs_) n += wb->num_blocks;
  return n;
}

std::unique_ptr<TierMoves::WriteBack> TierMoves::take_write_back(Take how) {
  if (write_backs_.empty()) return nullptr;
  WriteBack& wb = *write_backs_.front();
  if (how == Take::kWait) {
    check(transfers_->wait_transfers(wb.ticket), "a write-back");
    to_host_.count_timed(wb.kv->copied_bytes, wb.start);
  } else {
    Result<bool> done = transfers_->transfers_done(wb.ticket);
    check(done.status(), "a write-back");
    if (*done) {
      to_host_.count_overlapped(wb.kv->copied_bytes);
    } else if (how == Take::kOrderAfter) {
      check(order_out(wb.ticket, *wb.kv), "to order a step after a write-back");
    } else {
      return nullptr;
    }
  }
  std::unique_ptr<WriteBack> taken = std::move(write_backs_.front());
  write_backs_.pop_front();
  return taken;
}

void TierMoves::start_restore(SeqId seq, Restore restore) {
  const auto [it, added] = restores_.emplace(seq, std::move(restore));
  KVP_CHECK(added, "sequence {} is restoring already", seq.value);
}

int32_t TierMoves::num_unordered() const {
  int32_t n = 0;
  for (const auto& [id, r] : restores_) n += r.ordered ? 0 : 1;
  return n;
}

bool TierMoves::any_ordered() const {
  return step_ordered_out_ || std::any_of(restores_.begin(), restores_.end(),
                                          [](const auto& entry) { return entry.second.ordered; });
}

std::optional<TierMoves::Restore> TierMoves::settle(SeqId seq, bool wait) {
  auto it = restores_.find(seq);
  KVP_CHECK(it != restores_.end(), "sequence {} is not restoring", seq.value);
  Restore& r = it->second;
  if (wait) {
    check(transfers_->wait_transfers(r.ticket), "to copy a sequence's blocks");
  } else {
    Result<bool> done = transfers_->transfers_done(r.ticket);
    check(done.status(), "to copy a sequence's blocks");
    if (!*done) {
      r.ran_under_steps = true;
      return std::nullopt;
    }
  }
  // a copy's own time when it was waited for or done at once (a synchronous backend); one found
  // done by a later step says only that the steps hid it
  if (!r.ran_under_steps) {
    cost_->observe_copy(r.bytes, to_pool_.count_timed(r.bytes, r.start));
  } else {
    to_pool_.count_overlapped(r.bytes);
  }
  Restore done = std::move(r);
  restores_.erase(it);
  return done;
}

bool TierMoves::join_step(SeqId seq, int64_t pending_tokens, bool holds_up_others) {
  Restore& r = restores_.at(seq);
  if (r.ordered) return true;
  // over a copy that lands layer by layer the step computes under it (waiting instead, the host
  // finds the copy done and only then starts the step); alone, it delays nobody
  const auto copy_bound = [&] {
    const std::optional<double> rate = cost_->prefill_tokens_per_second();
    if (!r.expected_end || !rate) return false;
    return seconds_until(*r.expected_end) >= double(pending_tokens) / *rate;
  };
  bool overlaps = false;
  if (transfers_->orders_by_layer()) {
    switch (policy_.overlap) {
      case RestoreOverlap::kOff:
        break;
      case RestoreOverlap::kAlone:
        overlaps = !holds_up_others;
        break;
      case RestoreOverlap::kCopyBound:
        overlaps = !holds_up_others || copy_bound();
        break;
      case RestoreOverlap::kAlways:
        overlaps = true;
        break;
    }
  }
  if (!overlaps) {
    // later than a step's time, the step would hold up the other sequences it decodes for longer
    // than it saves this one (the next step starts when the host finds the copy done)
    if (!policy_.joins_within_step || !r.expected_end) return false;
    if (!cost_->within_step(seconds_until(*r.expected_end))) return false;
  }
  check(transfers_->order_after_transfers(r.ticket), "to order a step after a sequence's blocks");
  r.ordered = true;
  ++num_joined_steps_;
  r.ran_under_steps = true;  // the step's time is in its duration: not a copy's rate
  return true;
}

std::vector<SeqId> TierMoves::ordered() const {
  std::vector<SeqId> ids;
  for (const auto& [id, r] : restores_) {
    if (r.ordered) ids.push_back(id);
  }
  return ids;
}

}  // namespace kvp

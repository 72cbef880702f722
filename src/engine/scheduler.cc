// Scheduler: one step's plan over the engine's bookkeeping (scheduler.h). The queues change here;
// the pool changes only through StepBookkeeping's moves, in the order the rules ask for them.
#include "engine/scheduler.h"

#include <algorithm>

#include "common/check.h"

namespace kvp {

const char* preemption_name(Preemption p) {
  switch (p) {
    case Preemption::kAuto:
      return "auto";
    case Preemption::kSwap:
      return "swap";
    case Preemption::kRecompute:
      return "recompute";
  }
  return "?";
}

void Scheduler::add_forks(SeqId parent, std::span<const SeqId> children) {
  auto pos = std::find(running_.begin(), running_.end(), parent);
  KVP_CHECK(pos != running_.end(), "forks of sequence {}, which is not running", parent.value);
  for (SeqId child : children) pos = running_.insert(pos + 1, child);
}

void Scheduler::remove(SeqId id) {
  auto run_it = std::find(running_.begin(), running_.end(), id);
  if (run_it != running_.end()) running_.erase(run_it);
  auto wait_it = std::find(waiting_.begin(), waiting_.end(), id);
  if (wait_it != waiting_.end()) waiting_.erase(wait_it);
}

StepPlan Scheduler::plan_step(StepBookkeeping& books) {
  StepPlan plan;
  int32_t budget = config_.max_step_tokens;
  const auto take = [&](SeqId id, int32_t num_tokens, int32_t num_pending) {
    books.append(id, num_tokens);
    plan.seqs.push_back({id, num_tokens, num_tokens == num_pending});
    plan.num_tokens += num_tokens;
    budget -= num_tokens;
  };

  // whether a step that runs `id` after its copy would hold up sequences that wait for none:
  // any planned so far, or any other running one
  const auto holds_up_others = [&](SeqId id) {
    for (const ScheduledSeq& p : plan.seqs) {
      if (!books.is_restoring(p.id)) return true;
    }
    for (SeqId other : running_) {
      if (other != id && !books.is_restoring(other)) return true;
    }
    return false;
  };

  // 1. running sequences, oldest first
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    const SeqId id = running_[i];
    // its KV still being copied in: this step if the copy ends within it, else a later one
    if (!books.ready_to_run(id, holds_up_others(id))) {
      ++i;
      continue;
    }
    const int32_t pending = books.num_pending_tokens(id);
    const int32_t q = std::min(pending, budget);
    if (!make_room(books, id, q, i + 1, plan)) continue;  // `id` was preempted: running_[i] moved
    take(id, q, pending);
    ++i;
  }

  // 2. waiting sequences, in order, while they fit (restores not planned hold their places);
  // waiting_[0, next) are passed over in this step, their KV still being read from disk
  const auto num_seqs = [&] {
    return static_cast<int32_t>(plan.seqs.size()) + books.num_restoring_unplanned();
  };
  size_t next = 0;
  const auto leave_queue = [&] { waiting_.erase(waiting_.begin() + static_cast<ptrdiff_t>(next)); };
  while (budget > 0 && next < waiting_.size() && num_seqs() < config_.max_num_seqs) {
    const SeqId id = waiting_[next];
    if (!books.kv_at_hand(id) && (!plan.seqs.empty() || !running_.empty())) {
      ++next;  // its admission would hold the step up until the read ends
      continue;
    }
    bool admitted = books.admit(id);
    while (!admitted && free_some_blocks(books, id, plan)) admitted = books.admit(id);
    if (!admitted) {
      if (!plan.seqs.empty() || !running_.empty()) break;
      // nothing else holds blocks and the sequence's KV still does not fit: recompute it
      books.recompute(id);
      plan.recomputed.push_back(id);
    }
    const int32_t pending = books.num_pending_tokens(id);
    const int32_t q = std::min(pending, budget);
    // a restore still copying runs now if its copy ends within the step, else once its KV is in
    // (step 1 of a later step)
    if (books.is_restoring(id) &&
        !(books.can_append(id, q) && books.order_restore(id, holds_up_others(id)))) {
      leave_queue();
      running_.push_back(id);
      plan.admitted.push_back(id);
      continue;
    }
    bool fits = books.can_append(id, q);
    while (!fits && free_some_blocks(books, id, plan)) fits = books.can_append(id, q);
    if (!fits) {
      if (plan.seqs.empty() && running_.empty()) {
        // nothing else holds blocks: this chunk can never fit the pool
        leave_queue();
        plan.aborted.push_back(id);
        books.abort(id);
        continue;
      }
      break;
    }
    take(id, q, pending);
    leave_queue();
    running_.push_back(id);
    plan.admitted.push_back(id);
  }
  return plan;
}

bool Scheduler::make_room(StepBookkeeping& books, SeqId for_seq, int32_t num_tokens,
                          size_t first_unplanned, StepPlan& plan) {
  while (!books.can_append(for_seq, num_tokens)) {
    if (free_some_blocks(books, for_seq, plan)) continue;
    // preempt the newest running sequence not planned this step; for_seq itself last
    const SeqId victim = running_.size() > first_unplanned ? running_.back() : for_seq;
    preempt(books, victim, plan);
    if (victim == for_seq) return false;
  }
  return true;
}

bool Scheduler::free_some_blocks(StepBookkeeping& books, SeqId for_seq, StepPlan& plan) {
  if (books.evict_idle_session()) {
    ++plan.num_idle_evictions;
    return true;
  }
  return release_newest_waiting(books, for_seq, plan);
}

bool Scheduler::release_newest_waiting(StepBookkeeping& books, SeqId except, StepPlan& plan) {
  // newest first (an explicit reverse iterator: clang 14, the sanitizer build's compiler, cannot
  // use libstdc++ 12's views::reverse)
  for (auto it = waiting_.rbegin(); it != waiting_.rend(); ++it) {
    const SeqId id = *it;
    if (id == except || !books.holds_blocks(id)) continue;
    books.release(id);
    plan.released.push_back(id);
    return true;
  }
  return false;
}

void Scheduler::preempt(StepBookkeeping& books, SeqId id, StepPlan& plan) {
  books.preempt(id);
  running_.erase(std::find(running_.begin(), running_.end(), id));
  waiting_.push_front(id);
  plan.preempted.push_back(id);
}

bool Scheduler::should_swap(Preemption mode, bool has_host_tier, int32_t num_computed_tokens,
                            uint64_t live_bytes, const PreemptionCostModel& cost) {
  if (!has_host_tier || mode == Preemption::kRecompute || num_computed_tokens == 0) return false;
  return mode == Preemption::kSwap || cost.prefer_swap(live_bytes, num_computed_tokens);
}

bool Scheduler::swap_in_fits(int32_t num_needed, int32_t num_available, int32_t num_running) {
  return num_running == 0 || num_available >= num_needed + num_running;
}

std::optional<size_t> Scheduler::pick_idle_session(std::span<const int64_t> last_used) {
  std::optional<size_t> lru;
  for (size_t i = 0; i < last_used.size(); ++i) {
    if (!lru || last_used[i] < last_used[*lru]) lru = i;
  }
  return lru;
}

IdleSessionTiers Scheduler::tiers_for_idle_session(int32_t num_tokens, bool has_host_tier,
                                                   bool has_disk_tier, uint64_t file_size_bytes,
                                                   uint64_t disk_tier_bytes) {
  IdleSessionTiers tiers;
  if (num_tokens == 0) return tiers;
  tiers.host = has_host_tier;
  tiers.disk = has_disk_tier && file_size_bytes <= disk_tier_bytes;
  return tiers;
}

}  // namespace kvp

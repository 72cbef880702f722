// Engine::StepBooks: the engine's side of a step's planning. The Scheduler (scheduler.h) decides;
// the moves it asks for are made here with the engine's own operations: appending blocks,
// admitting a waiting sequence with the KV it has somewhere (a session's from host or disk, a
// swapped copy, the prefix cache's), moving an idle session down a tier, giving a waiting
// sequence's blocks back, preempting, aborting.
//
//   Scheduler::plan_step ──▶ StepBooks ─┬─▶ admit_prefix ──▶ restore_session / swap_in / prefix
//                                       ├─▶ evict_idle_session ──▶ finish_write_backs / move_down
//                                       ├─▶ release_waiting ──▶ move_down / swap_out / free
//                                       └─▶ preempt (engine_preemption.cc), finish (aborted)
#include <algorithm>
#include <chrono>
#include <future>
#include <optional>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_internal.h"

namespace kvp {

int32_t Engine::StepBooks::num_pending_tokens(SeqId id) const {
  const Sequence& s = *e_.sequences_.at(id);
  return static_cast<int32_t>(s.tokens.size()) - s.num_computed;
}

bool Engine::StepBooks::holds_blocks(SeqId id) const { return e_.sequences_.at(id)->resident; }

bool Engine::StepBooks::can_append(SeqId id, int32_t num_tokens) {
  return e_.cache_->can_append(id, num_tokens);
}

void Engine::StepBooks::append(SeqId id, int32_t num_tokens) {
  KVP_CHECK(e_.cache_->append(id, num_tokens, &e_.pending_copies_, e_.computed_tokens(e_.seq(id))),
            "append after can_append");
}

bool Engine::StepBooks::ready_to_run(SeqId id, bool holds_up_others) {
  return e_.settle_restore(id, false) || e_.order_restore(id, holds_up_others);
}

bool Engine::StepBooks::is_restoring(SeqId id) const { return e_.moves_.is_restoring(id); }

bool Engine::StepBooks::order_restore(SeqId id, bool holds_up_others) {
  return e_.order_restore(id, holds_up_others);
}

int32_t Engine::StepBooks::num_restoring_unplanned() const { return e_.moves_.num_unordered(); }

bool Engine::StepBooks::kv_at_hand(SeqId id) const {
  const Sequence& s = *e_.sequences_.at(id);
  const std::optional<std::string>& name = e_.requests_.at(s.request_id)->request.session;
  if (s.resident || !name) return true;
  const Prefetch* read = e_.sessions_.at(*name)->prefetch.get();
  if (read == nullptr) {  // not being read: at hand unless its read waits for staging room
    return std::find(e_.deferred_reads_.begin(), e_.deferred_reads_.end(), *name) ==
           e_.deferred_reads_.end();
  }
  return read->kv.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

bool Engine::StepBooks::admit(SeqId id) {
  Sequence& s = e_.seq(id);
  const auto start = std::chrono::steady_clock::now();  // before its KV starts coming back
  if (!e_.admit_prefix(s)) return false;
  RequestTimes& times = e_.requests_.at(s.request_id)->times;
  if (!times.admitted) times.admitted = start;
  return true;
}

void Engine::StepBooks::recompute(SeqId id) {
  Sequence& s = e_.seq(id);
  if (e_.swapped_.count(id) > 0) {
    e_.drop_swapped(id);
  } else {
    SessionState& session = *e_.sessions_.at(*e_.requests_.at(s.request_id)->request.session);
    e_.drop_kv(session);
    ++session.num_evictions;
    ++e_.stats_.num_session_evictions;
  }
  const auto start = std::chrono::steady_clock::now();
  KVP_CHECK(e_.admit_prefix(s), "admission without a session copy to restore");
  RequestTimes& times = e_.requests_.at(s.request_id)->times;
  if (!times.admitted) times.admitted = start;
}

bool Engine::StepBooks::evict_idle_session() { return e_.evict_idle_session(); }

void Engine::StepBooks::release(SeqId id) { e_.release_waiting(e_.seq(id)); }

void Engine::StepBooks::preempt(SeqId id) { e_.preempt(id); }

void Engine::StepBooks::abort(SeqId id) { e_.finish(e_.seq(id), FinishReason::kAborted, events_); }

void Engine::note_kv_copy_done(SeqId seq_id) {
  auto s = sequences_.find(seq_id);
  if (s == sequences_.end()) return;
  auto r = requests_.find(s->second->request_id);
  if (r == requests_.end()) return;
  RequestTimes& times = r->second->times;
  if (!times.kv_copy_done) times.kv_copy_done = std::chrono::steady_clock::now();
}

bool Engine::admit_prefix(Sequence& s) {
  if (!s.resident) {
    cache_->add_sequence(s.id);
    s.resident = true;
    s.num_computed = 0;
    s.num_registered_blocks = 0;
    s.window_valid_from = 0;
  }
  if (swapped_.count(s.id) > 0) return swap_in(s);
  RequestState& r = *requests_.at(s.request_id);
  if (s.num_computed == 0 && r.request.session) {
    SessionState& session = *sessions_.at(*r.request.session);
    if (session.host || !session.file.empty()) {
      const auto start = std::chrono::steady_clock::now();
      switch (restore_session(session, s, /*wait=*/false)) {
        case Restore::kDone:
          if (!r.times.kv_copy_start) r.times.kv_copy_start = start;
          if (!moves_.is_restoring(s.id)) note_kv_copy_done(s.id);  // copied at once
          if (s.num_generated == 0) {
            r.usage.cached_tokens = std::max(r.usage.cached_tokens, s.num_computed);
            r.usage.restored_tokens = std::max(r.usage.restored_tokens, s.num_computed);
          }
          return true;
        case Restore::kNoRoom:
          cache_->free_sequence(s.id);
          s.resident = false;
          return false;
        case Restore::kFailed:
          break;  // recompute, with what the prefix cache has
      }
    }
  }
  if (cache_->has_prefix_cache() && s.num_computed == 0) {
    // every group must serve the prefix (a window group: the blocks inside its window); the
    // last token always runs, to produce logits
    const int32_t num_hit = cache_->match_prefix(s.id, s.tokens);
    if (num_hit > 0) {
      s.num_computed = num_hit;
      s.num_registered_blocks = num_hit / config_.block_size;
      stats_.num_prefix_hit_tokens += num_hit;
      if (s.num_generated == 0) r.usage.cached_tokens = std::max(r.usage.cached_tokens, num_hit);
    }
  }
  return true;
}

bool Engine::evict_idle_session() {
  // a write-back in flight frees its blocks soonest: the oldest, waited for or ordered after
  while (!moves_.write_backs().empty()) {
    if (finish_write_backs(take_now()) > 0) return true;
  }
  std::vector<SessionState*> idle;
  std::vector<int64_t> last_used;
  for (auto& [name, session] : sessions_) {
    if (session->busy || !session->resident) continue;
    idle.push_back(session.get());
    last_used.push_back(session->last_used);
  }
  const std::optional<size_t> lru = Scheduler::pick_idle_session(last_used);
  if (!lru) return false;
  move_down(*idle[*lru]);
  return true;
}

void Engine::release_waiting(Sequence& s) {
  KVP_CHECK(s.resident, "sequence {} holds no blocks to release", s.id.value);
  const RequestState& r = *requests_.at(s.request_id);
  SessionState* session = r.request.session ? sessions_.at(*r.request.session).get() : nullptr;
  if (session != nullptr && s.num_computed > 0 &&
      s.num_computed <= static_cast<int32_t>(session->tokens.size()) &&
      (config_.host_tier_bytes > 0 || !config_.disk_dir.empty())) {
    // a resumed session's history: down a tier, not recomputed
    session->resident = s.id;
    session->num_computed = s.num_computed;
    session->window_valid_from = s.window_valid_from;
    move_down(*session);
  } else if (!swap_out(s)) {
    cache_->free_sequence(s.id);
  }
  s.resident = false;
  s.num_computed = 0;
  s.num_registered_blocks = 0;
  ++stats_.num_preemptions;
}

}  // namespace kvp

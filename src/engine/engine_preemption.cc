// Preemption of running sequences: swapped to the host tier or recomputed (EngineConfig::
// preemption, engine/preemption_cost.h; the choice is Scheduler::should_swap, the victim the
// scheduler's too). A swapped sequence waits first in line with its KV in
// swapped_; readmitted, it takes what the prefix cache holds of its tokens and copies in the
// rest, as a restored session does (Engine::copy_in).
//
//   running ──preempt──▶ swap_out: copy_out to host tier, free blocks ──▶ waiting (swapped_)
//                 └────▶ (no host tier / no room / recompute cheaper): free blocks ──▶ waiting
//   waiting ──admit_prefix──▶ swap_in: copy_in, drop the host copy ──▶ running
#include <algorithm>
#include <chrono>

#include "engine/engine.h"
#include "engine/engine_internal.h"

namespace kvp {

void Engine::preempt(SeqId seq_id) {
  settle_restore(seq_id, true);  // its blocks are being filled: not freed under the copy
  Sequence& s = seq(seq_id);
  if (!swap_out(s)) cache_->free_sequence(s.id);
  s.resident = false;
  s.num_computed = 0;
  s.num_registered_blocks = 0;
  ++requests_.at(s.request_id)->usage.num_preemptions;
  ++stats_.num_preemptions;
}

bool Engine::swap_out(Sequence& s) {
  const uint64_t bytes = s.resident ? live_bytes(s.id) : 0;
  if (!Scheduler::should_swap(config_.preemption, host_tier_ != nullptr, s.num_computed, bytes,
                              preemption_cost_)) {
    return false;
  }
  if (!make_host_room(bytes, nullptr)) return false;
  // the blocks are handed out again within this step: the steps are ordered after the copy
  std::unique_ptr<HostKv> kv = copy_out_to_host(s.id, s.num_computed);
  if (!kv) return false;
  kv->window_valid_from = s.window_valid_from;
  stats_.host_tier_bytes_used += kv->size_bytes;
  cache_->free_sequence(s.id);
  swapped_[s.id] = std::move(kv);
  ++stats_.num_preemption_swaps;
  return true;
}

bool Engine::swap_in(Sequence& s) {
  HostKv& kv = *swapped_.at(s.id);
  // Back only when the pool holds its blocks and one more for every running sequence: a
  // sequence let in to the last block is the next step's victim again (out, in, out, ...).
  // (Blocks the prefix cache still holds are counted as needed: an upper bound.) With nothing
  // running, any room will do. Every cache group is asked (a sliding-window group holds fewer
  // blocks of the sequence than the full one, in a pool of its own).
  bool room = true;
  const auto num_running = static_cast<int32_t>(scheduler_.running().size());
  for (size_t g = 0; g < kv.tables.size(); ++g) {
    int32_t needed = 0;
    for (BlockId b : kv.tables[g]) needed += b != HostKv::kNoBlock ? 1 : 0;
    room &= Scheduler::swap_in_fits(
        needed, cache_->allocator(static_cast<int32_t>(g)).num_available(), num_running);
  }
  if (!room) {
    cache_->free_sequence(s.id);
    s.resident = false;
    return false;
  }
  int32_t num_shared = 0;
  TierMoves::Restore pending;
  if (!copy_in(s.id, s.tokens, kv, &num_shared, &pending)) {
    cache_->free_sequence(s.id);
    s.resident = false;
    return false;
  }
  s.num_computed = kv.num_tokens;
  s.num_registered_blocks = 0;
  s.window_valid_from = kv.window_valid_from;
  stats_.num_swapped_in_tokens += kv.num_tokens - num_shared;
  stats_.num_prefix_hit_tokens += num_shared;
  // the copy runs while other sequences step; its source stays charged to the tier until done
  pending.kv = take_swapped(s.id);
  pending.charged = true;
  keep_restoring(s, std::move(pending));
  return true;
}

std::unique_ptr<HostKv> Engine::take_swapped(SeqId id) {
  auto it = swapped_.find(id);
  if (it == swapped_.end()) return nullptr;
  std::unique_ptr<HostKv> kv = std::move(it->second);
  swapped_.erase(it);
  return kv;
}

void Engine::drop_swapped(SeqId id) {
  std::unique_ptr<HostKv> kv = take_swapped(id);
  if (kv) stats_.host_tier_bytes_used -= kv->size_bytes;
}

void Engine::probe_copy_rate() {
  // about 8 MiB of group 0's blocks (fewer if the pool or tier is smaller), out and back in;
  // the pool is empty, so what the blocks hold does not matter
  const uint64_t block_bytes = cache_spec_.block_bytes(0);
  const int32_t n = static_cast<int32_t>(
      std::clamp<uint64_t>((8u << 20) / std::max<uint64_t>(block_bytes, 1), 1,
                           std::min<uint64_t>(config_.num_blocks, host_tier_->num_free(0))));
  std::vector<int32_t> counts(cache_->num_groups(), 0);
  counts[0] = n;
  auto blocks = host_tier_->allocate(counts);
  if (!blocks) return;
  std::vector<BlockTransfer> out, in;
  for (int32_t i = 0; i < n; ++i) {
    out.push_back({Pool::Device, BlockId{i}, Pool::Host, (*blocks)[0][i], 0});
    in.push_back({Pool::Host, (*blocks)[0][i], Pool::Device, BlockId{i}, 0});
  }
  // the first pass pays for first use (streams, page mappings); the next ones are timed, as many
  // as make the model's smallest copy to learn from (a small pool's probe is a few KB)
  const uint64_t pass_bytes = 2 * uint64_t(n) * block_bytes;
  const int timed = static_cast<int>(std::clamp<uint64_t>(
      (PreemptionCostModel::kMinCopyBytes + pass_bytes - 1) / std::max<uint64_t>(pass_bytes, 1), 1,
      64));
  std::chrono::steady_clock::time_point start;
  for (int pass = 0; pass <= timed; ++pass) {
    if (pass == 1) start = std::chrono::steady_clock::now();
    auto a = backend_->start_transfers(0, out, host_tier_->storage());
    if (!a.is_ok() || !backend_->wait_transfers(*a).is_ok()) break;
    auto b = backend_->start_transfers(0, in, host_tier_->storage());
    if (!b.is_ok() || !backend_->wait_transfers(*b).is_ok()) break;
    if (pass == timed) {
      preemption_cost_.observe_copy(
          timed * pass_bytes,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
  }
  host_tier_->release(*blocks);
}

void Engine::observe_forward(std::span<const BatchEntry> entries,
                             std::chrono::steady_clock::time_point start) {
  // a step ordered after a restore's copy also waited for it: it times neither steps nor prefill
  if (moves_.any_ordered()) return;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  preemption_cost_.observe_step(seconds);
  int64_t tokens = 0, prefill = 0;
  for (const BatchEntry& e : entries) {
    tokens += e.num_tokens;
    if (e.num_tokens > 1) prefill += e.num_tokens;
  }
  if (2 * prefill < tokens) return;  // mostly decodes: their cost is the weights' read
  preemption_cost_.observe_prefill(tokens, seconds);
}

}  // namespace kvp

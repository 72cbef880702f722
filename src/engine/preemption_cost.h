// Swap or recompute: the choice the engine makes for a running sequence it must take out of the
// pool (Engine::preempt, Scheduler::should_swap). Swapping copies the sequence's KV to the
// host tier now and back when it is readmitted; recomputing drops it and prefills the tokens
// again. The model compares the two in seconds from rates measured on this engine:
//
//   swap      = 2 · bytes / copy rate          (out now, in at readmission)
//   recompute = tokens / prefill rate
//
//   copies ──observe_copy(bytes, s)──┐
//                                    ├─▶ rates (moving averages) ─▶ prefer_swap(bytes, tokens)
//   prefill steps ─observe_prefill───┘
//
// The copy rate is first measured at start-up (a probe copy of pool blocks, Engine::
// allocate_pool) and both are kept current from every tier move and every prefill-heavy step.
//
// The same rates say when a sequence whose KV is still being copied into the pool may join a
// step (Engine::order_restore): when its copy is expected to end within a step's time, the
// step's forward pass is ordered after it, holding up the step's other sequences by at most
// about that long.
#pragma once

#include <cstdint>
#include <optional>

namespace kvp {

class PreemptionCostModel {
 public:
  // Weight of a new observation in the moving averages.
  static constexpr double kWeight = 0.25;
  // Smaller copies are dominated by per-call latency, smaller prefills by the weights' read:
  // neither says much about the rate of the moves the model prices.
  static constexpr uint64_t kMinCopyBytes = 256 * 1024;
  static constexpr int64_t kMinPrefillTokens = 32;

  // A copy of `bytes` between the pool and host memory that took `seconds`.
  void observe_copy(uint64_t bytes, double seconds);
  // A forward pass that prefilled `tokens` (and decoded few) in `seconds`.
  void observe_prefill(int64_t tokens, double seconds);
  // Any forward pass (decode or prefill) that took `seconds`.
  void observe_step(double seconds);

  std::optional<double> copy_bytes_per_second() const { return copy_rate_; }
  std::optional<double> prefill_tokens_per_second() const { return prefill_rate_; }
  std::optional<double> step_seconds() const { return step_seconds_; }

  // Estimated seconds of each choice for a sequence of `bytes` of live KV and `tokens` tokens;
  // nullopt while the rate it needs has not been measured.
  std::optional<double> swap_seconds(uint64_t bytes) const;
  std::optional<double> recompute_seconds(int64_t tokens) const;
  // Swap when it is estimated cheaper; with a rate not yet measured, swap (a copy of KV is
  // never slower than recomputing it by more than the copy itself, and it keeps the work done).
  bool prefer_swap(uint64_t bytes, int64_t tokens) const;
  // Seconds a copy of `bytes` is expected to take; nullopt while the rate is not measured.
  std::optional<double> copy_seconds(uint64_t bytes) const;
  // Whether `seconds` from now is within one step's time (false while it is not measured).
  bool within_step(double seconds) const;

 private:
  std::optional<double> copy_rate_;     // bytes per second
  std::optional<double> prefill_rate_;  // tokens per second
  std::optional<double> step_seconds_;
};

}  // namespace kvp

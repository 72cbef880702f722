#include "engine/preemption_cost.h"

namespace kvp {

namespace {

void blend(std::optional<double>& average, double sample) {
  average = average ? (1.0 - PreemptionCostModel::kWeight) * *average +
                          PreemptionCostModel::kWeight * sample
                    : sample;
}

}  // namespace

void PreemptionCostModel::observe_copy(uint64_t bytes, double seconds) {
  if (bytes < kMinCopyBytes || !(seconds > 0.0)) return;
  blend(copy_rate_, static_cast<double>(bytes) / seconds);
}

void PreemptionCostModel::observe_prefill(int64_t tokens, double seconds) {
  if (tokens < kMinPrefillTokens || !(seconds > 0.0)) return;
  blend(prefill_rate_, static_cast<double>(tokens) / seconds);
}

void PreemptionCostModel::observe_step(double seconds) {
  if (seconds > 0.0) blend(step_seconds_, seconds);
}

std::optional<double> PreemptionCostModel::swap_seconds(uint64_t bytes) const {
  const std::optional<double> one_way = copy_seconds(bytes);
  if (!one_way) return std::nullopt;
  return 2.0 * *one_way;
}

std::optional<double> PreemptionCostModel::recompute_seconds(int64_t tokens) const {
  if (!prefill_rate_) return std::nullopt;
  return static_cast<double>(tokens) / *prefill_rate_;
}

bool PreemptionCostModel::prefer_swap(uint64_t bytes, int64_t tokens) const {
  const std::optional<double> swap = swap_seconds(bytes);
  const std::optional<double> recompute = recompute_seconds(tokens);
  if (!swap || !recompute) return true;
  return *swap < *recompute;
}

std::optional<double> PreemptionCostModel::copy_seconds(uint64_t bytes) const {
  if (!copy_rate_) return std::nullopt;
  return static_cast<double>(bytes) / *copy_rate_;
}

bool PreemptionCostModel::within_step(double seconds) const {
  return step_seconds_ && seconds <= *step_seconds_;
}

}  // namespace kvp

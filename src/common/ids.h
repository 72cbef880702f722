// Distinct id types, so a BlockId cannot be passed where a SeqId is meant.
#pragma once

#include <cstdint>
#include <functional>

namespace kvp {

template <typename Tag, typename T = int32_t>
struct StrongId {
  using value_type = T;
  T value{};

  constexpr StrongId() = default;
  constexpr explicit StrongId(T v) : value(v) {}
  constexpr friend bool operator==(StrongId, StrongId) = default;
  constexpr friend auto operator<=>(StrongId, StrongId) = default;
};

using BlockId = StrongId<struct BlockIdTag, int32_t>;      // a block of one cache group's pool
using SeqId = StrongId<struct SeqIdTag, int64_t>;          // a sequence (request or fork)
using SessionId = StrongId<struct SessionIdTag, int64_t>;  // an agent's persistent sequence
using RequestId = StrongId<struct RequestIdTag, int64_t>;  // an engine request

}  // namespace kvp

template <typename Tag, typename T>
struct std::hash<kvp::StrongId<Tag, T>> {
  size_t operator()(kvp::StrongId<Tag, T> id) const noexcept { return std::hash<T>{}(id.value); }
};

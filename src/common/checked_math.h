// Overflow-checked size arithmetic for everything that turns numbers from outside (file
// headers, requests) into sizes: a result that does not fit its type is std::nullopt, never a
// wrapped value. Every parser computes element counts, byte sizes and offsets through these.
//
//   auto bytes = checked_mul<uint64_t>(num_elements, type_size);    // nullopt past 2^64 - 1
//   auto end = checked_add<uint64_t>(*bytes, offset);
//   auto count = checked_product<uint64_t>(dims);                    // nullopt on overflow
#pragma once

#include <concepts>
#include <optional>
#include <span>

namespace kvp {

template <std::integral T>
constexpr std::optional<T> checked_add(T a, T b) {
  T out;
  if (__builtin_add_overflow(a, b, &out)) return std::nullopt;
  return out;
}

template <std::integral T>
constexpr std::optional<T> checked_mul(T a, T b) {
  T out;
  if (__builtin_mul_overflow(a, b, &out)) return std::nullopt;
  return out;
}

// The product of `values` (1 for none); nullopt when a partial product overflows, even if a
// later factor is 0 (a shape that large is refused whatever follows it).
template <std::integral T>
constexpr std::optional<T> checked_product(std::span<const T> values) {
  T out = 1;
  for (T v : values) {
    if (__builtin_mul_overflow(out, v, &out)) return std::nullopt;
  }
  return out;
}

}  // namespace kvp

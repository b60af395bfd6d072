// Integer arithmetic on sizes, bytes and FLOP counts that never wraps: each operation either
// reports the overflow or stands in a value the caller chooses for it.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>

namespace jvpc::checked {

/// a + b, or nothing where it does not fit in int64.
inline std::optional<int64_t> add(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

/// a·b, or nothing where it does not fit in int64.
inline std::optional<int64_t> mul(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

/// The product of `xs`, or nothing where it does not fit in int64.
template <typename Ints>
std::optional<int64_t> product(const Ints& xs) {
  int64_t r = 1;
  for (int64_t x : xs)
    if (__builtin_mul_overflow(r, x, &r)) return std::nullopt;
  return r;
}

/// Saturating: a + b and a·b, or int64's largest value where they overflow (byte estimates, where
/// a value past 2^63 means "more than any limit").
inline int64_t add_saturating(int64_t a, int64_t b) { return add(a, b).value_or(std::numeric_limits<int64_t>::max()); }
inline int64_t mul_saturating(int64_t a, int64_t b) { return mul(a, b).value_or(std::numeric_limits<int64_t>::max()); }

}  // namespace jvpc::checked

// Overflow-checked integer arithmetic. Every byte count, token count and FLOP count that comes from
// user input passes through these: a result that does not fit is an error naming what overflowed,
// never a wrapped number that plans or copies nonsense.
#ifndef STOWAGE_BASE_CHECKED_MATH_H_
#define STOWAGE_BASE_CHECKED_MATH_H_

#include <optional>
#include <string_view>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace stowage {

template <typename T>
[[nodiscard]] constexpr std::optional<T> CheckedAdd(T a, T b) {
  static_assert(std::is_integral_v<T>);
  T out;
  if (__builtin_add_overflow(a, b, &out)) return std::nullopt;
  return out;
}

template <typename T>
[[nodiscard]] constexpr std::optional<T> CheckedSub(T a, T b) {
  static_assert(std::is_integral_v<T>);
  T out;
  if (__builtin_sub_overflow(a, b, &out)) return std::nullopt;
  return out;
}

template <typename T>
[[nodiscard]] constexpr std::optional<T> CheckedMul(T a, T b) {
  static_assert(std::is_integral_v<T>);
  T out;
  if (__builtin_mul_overflow(a, b, &out)) return std::nullopt;
  return out;
}

// ceil(a / b) for b > 0 without computing a + b - 1 (which wraps for a near the type's maximum).
template <typename T>
[[nodiscard]] constexpr T CeilDiv(T a, T b) {
  static_assert(std::is_unsigned_v<T>);
  return a / b + (a % b != 0 ? 1 : 0);
}

// The StatusOr forms name `what` (e.g. "activation bytes of layer 3") in the error.
template <typename T>
absl::StatusOr<T> AddOrError(T a, T b, std::string_view what) {
  if (auto r = CheckedAdd(a, b)) return *r;
  return absl::OutOfRangeError(absl::StrCat(std::string(what), " overflows (", a, " + ", b, ")"));
}

template <typename T>
absl::StatusOr<T> MulOrError(T a, T b, std::string_view what) {
  if (auto r = CheckedMul(a, b)) return *r;
  return absl::OutOfRangeError(absl::StrCat(std::string(what), " overflows (", a, " x ", b, ")"));
}

}  // namespace stowage

#endif  // STOWAGE_BASE_CHECKED_MATH_H_

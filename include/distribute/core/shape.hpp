// Shapes: a row-major list of dimension sizes, printed the way TF prints them: (4, 2, 3).
#pragma once

#include <cstdint>
#include <functional>  // (kept: headers that include this one use it)
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/error.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

using Shape = std::vector<std::int64_t>;

/// "(4, 2, 3)", "(3,)" and "()" as in Python.
DISTRIBUTE_DECL std::string shape_string(const Shape& shape);

namespace core::detail {
/// num_elements' error: a negative dimension, or a count beyond 64 bits.
[[noreturn]] DISTRIBUTE_DECL void throw_bad_shape(const Shape& shape);
}  // namespace core::detail

/// The bytes of `count` elements of `element_size` bytes, or false when that overflows 64 bits.
/// Every size and count read from the wire goes through this or checked_byte_size below.
[[nodiscard]] inline bool checked_mul(std::uint64_t count, std::uint64_t element_size, std::uint64_t& out) noexcept {
  return !__builtin_mul_overflow(count, element_size, &out);
}

/// The number of elements a shape holds (1 for a scalar), exactly: 0 when a dimension is 0,
/// whatever the others (2^62 x 4 x 0 holds none); nullopt for a negative dimension or a count
/// beyond 64-bit signed arithmetic.
[[nodiscard]] inline std::optional<std::uint64_t> checked_count(const Shape& shape) noexcept {
  bool negative = false, zero = false, overflows = false;
  std::uint64_t n = 1;
  for (std::int64_t d : shape) {
    negative = negative || d < 0;
    zero = zero || d == 0;
    if (d > 0 && !overflows) {
      overflows = !checked_mul(n, static_cast<std::uint64_t>(d), n) || n > static_cast<std::uint64_t>(INT64_MAX);
    }
  }
  if (negative) return std::nullopt;
  if (zero) return 0;
  if (overflows) return std::nullopt;
  return n;
}

/// Number of elements a shape holds (checked_count). A negative dimension or a product beyond
/// 64-bit signed arithmetic is InvalidArgument: shapes also arrive from the wire and from files.
inline std::int64_t num_elements(const Shape& shape) {
  const std::optional<std::uint64_t> n = checked_count(shape);
  if (!n) core::detail::throw_bad_shape(shape);
  return static_cast<std::int64_t>(*n);
}

/// The bytes a shape's elements take, checked: InvalidArgument naming `what` when a dimension is
/// negative or the count or the bytes exceed `limit` (default: what a size_t offset can address).
DISTRIBUTE_DECL std::size_t checked_byte_size(const Shape& shape, std::size_t element_size, const char* what,
                                              std::uint64_t limit = std::uint64_t{1} << 62);

/// Normalises an axis that may be negative (Python style) against a rank; throws naming both.
DISTRIBUTE_DECL std::size_t normalize_axis(std::int64_t axis, std::size_t rank, const char* what);

#if DISTRIBUTE_DETAIL_DEFINE  // compiled apart with DISTRIBUTE_SEPARATE_COMPILATION (version.hpp)
DISTRIBUTE_DECL std::string shape_string(const Shape& shape) {
  if (shape.size() == 1) return fmt::format("({},)", shape[0]);
  return fmt::format("({})", fmt::join(shape, ", "));
}

DISTRIBUTE_DECL void core::detail::throw_bad_shape(const Shape& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    if (d < 0) throw InvalidArgument(fmt::format("shape {} has a negative dimension", shape_string(shape)));
    if (__builtin_mul_overflow(n, d, &n)) break;
  }
  throw InvalidArgument(fmt::format("shape {}: its number of elements overflows 64 bits", shape_string(shape)));
}

DISTRIBUTE_DECL std::size_t checked_byte_size(const Shape& shape, std::size_t element_size, const char* what,
                                              std::uint64_t limit) {
  const std::uint64_t max_count = limit / (element_size ? element_size : 1);
  const std::optional<std::uint64_t> n = checked_count(shape);
  if (!n || *n > max_count) {
    throw InvalidArgument(fmt::format("{}: shape {} read from the wire is negative or too large", what, shape_string(shape)));
  }
  return static_cast<std::size_t>(*n * element_size);  // <= limit: checked above
}

DISTRIBUTE_DECL std::size_t normalize_axis(std::int64_t axis, std::size_t rank, const char* what) {
  const auto r = static_cast<std::int64_t>(rank);
  if (axis < -r || axis >= r) {
    throw InvalidArgument(fmt::format("{}: axis {} is out of range for a value of rank {} (valid: [{}, {}))",
                                      what, axis, rank, -r, r));
  }
  return static_cast<std::size_t>(axis < 0 ? axis + r : axis);
}
#endif  // DISTRIBUTE_DETAIL_DEFINE

DISTRIBUTE_END_NAMESPACE

// Shapes: a row-major list of dimension sizes, printed the way TF prints them: (4, 2, 3).
#pragma once

#include <cstdint>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/error.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

using Shape = std::vector<std::int64_t>;

/// Number of elements a shape holds (1 for a scalar).
inline std::int64_t num_elements(const Shape& shape) {
  return std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>{});
}

/// "(4, 2, 3)", "(3,)" and "()" as in Python.
inline std::string shape_string(const Shape& shape) {
  if (shape.size() == 1) return fmt::format("({},)", shape[0]);
  return fmt::format("({})", fmt::join(shape, ", "));
}

/// Normalises an axis that may be negative (Python style) against a rank; throws naming both.
inline std::size_t normalize_axis(std::int64_t axis, std::size_t rank, const char* what) {
  const auto r = static_cast<std::int64_t>(rank);
  if (axis < -r || axis >= r) {
    throw InvalidArgument(fmt::format("{}: axis {} is out of range for a value of rank {} (valid: [{}, {}))",
                                      what, axis, rank, -r, r));
  }
  return static_cast<std::size_t>(axis < 0 ? axis + r : axis);
}

DISTRIBUTE_END_NAMESPACE

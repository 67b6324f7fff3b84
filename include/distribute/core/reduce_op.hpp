// ReduceOp and its TF string forms.
#pragma once

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include <distribute/core/error.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

/// How values are combined across replicas.
enum class ReduceOp { Sum, Mean, Min, Max, Product };

/// The canonical (TF) spelling: "SUM", "MEAN", "MIN", "MAX", "PRODUCT".
constexpr std::string_view to_string(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::Sum: return "SUM";
    case ReduceOp::Mean: return "MEAN";
    case ReduceOp::Min: return "MIN";
    case ReduceOp::Max: return "MAX";
    case ReduceOp::Product: return "PRODUCT";
  }
  return "?";
}

/// A reduction as the code below the public entry points runs it. MEAN is not one: it is a SUM
/// and one division of the result, and each path turns it into that once, where it knows how
/// many values it averages (lower); below, `op()` is never Mean and `divisor()` > 1 asks for the
/// division, done once at the end.
class Reduction {
 public:
  /// MEAN over `count` values: SUM, then a division by `count`. Any other op: itself, no division.
  static constexpr Reduction lower(ReduceOp op, std::int64_t count) noexcept {
    return op == ReduceOp::Mean ? Reduction(ReduceOp::Sum, count) : Reduction(op, 1);
  }
  /// The op that combines `op`'s values, for a path that learns its divisor only at the end (and
  /// lowers then): Sum for Mean, else `op` itself.
  static constexpr ReduceOp combining(ReduceOp op) noexcept { return lower(op, 1).op(); }
  /// The same combination without the division: a part of a larger reduction whose owner divides.
  constexpr Reduction undivided() const noexcept { return Reduction(op_, 1); }

  constexpr ReduceOp op() const noexcept { return op_; }
  constexpr std::int64_t divisor() const noexcept { return divisor_; }
  constexpr bool divides() const noexcept { return divisor_ > 1; }

 private:
  constexpr Reduction(ReduceOp op, std::int64_t divisor) noexcept : op_(op), divisor_(divisor) {}
  ReduceOp op_;
  std::int64_t divisor_;
};

/// Parses TF's strings case-insensitively ("sum", "MEAN", "Max", ...).
DISTRIBUTE_DECL ReduceOp parse_reduce_op(std::string_view text);

#if DISTRIBUTE_DETAIL_DEFINE  // compiled apart with DISTRIBUTE_SEPARATE_COMPILATION (version.hpp)
DISTRIBUTE_DECL ReduceOp parse_reduce_op(std::string_view text) {
  std::string upper(text);
  std::transform(upper.begin(), upper.end(), upper.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Min, ReduceOp::Max, ReduceOp::Product}) {
    if (upper == to_string(op)) return op;
  }
  throw InvalidArgument(fmt::format(
      "unknown reduce op '{}': expected one of SUM, MEAN, MIN, MAX, PRODUCT (any case)", text));
}

#endif  // DISTRIBUTE_DETAIL_DEFINE
DISTRIBUTE_END_NAMESPACE

template <>
struct fmt::formatter<distribute::ReduceOp> : fmt::formatter<std::string_view> {
  template <class Ctx>
  auto format(distribute::ReduceOp op, Ctx& ctx) const {
    return fmt::formatter<std::string_view>::format(distribute::to_string(op), ctx);
  }
};

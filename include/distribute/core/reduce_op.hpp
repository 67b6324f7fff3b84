// ReduceOp and its TF string forms.
#pragma once

#include <algorithm>
#include <cctype>
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

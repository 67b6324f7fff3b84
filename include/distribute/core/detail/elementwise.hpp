// Element-wise combination kernels shared by every reduction path. The op switch sits outside
// the loops so each loop is a plain vectorisable pass.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <fmt/format.h>

#include <distribute/core/dtype.hpp>
#include <distribute/core/error.hpp>
#include <distribute/core/reduce_op.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace detail {

/// acc[i] = acc[i] (op) src[i]; Mean accumulates as Sum (the division comes once, at the end).
template <class T>
void combine(T* __restrict acc, const T* __restrict src, std::size_t n, ReduceOp op) noexcept {
  if constexpr (std::is_same_v<T, bool>) {
    const bool any = op == ReduceOp::Sum || op == ReduceOp::Max || op == ReduceOp::Mean;
    if (any) {
      for (std::size_t i = 0; i < n; ++i) acc[i] = acc[i] || src[i];
    } else {
      for (std::size_t i = 0; i < n; ++i) acc[i] = acc[i] && src[i];
    }
  } else {
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Mean:
        for (std::size_t i = 0; i < n; ++i) acc[i] = static_cast<T>(acc[i] + src[i]);
        break;
      case ReduceOp::Min:
        for (std::size_t i = 0; i < n; ++i) acc[i] = std::min(acc[i], src[i]);
        break;
      case ReduceOp::Max:
        for (std::size_t i = 0; i < n; ++i) acc[i] = std::max(acc[i], src[i]);
        break;
      case ReduceOp::Product:
        for (std::size_t i = 0; i < n; ++i) acc[i] = static_cast<T>(acc[i] * src[i]);
        break;
    }
  }
}

/// acc[i] /= divisor (integer division truncates, as C++ and TF's integer mean do).
template <class T>
void divide(T* acc, std::size_t n, std::int64_t divisor) noexcept {
  if constexpr (!std::is_same_v<T, bool>) {
    const T d = static_cast<T>(divisor);
    for (std::size_t i = 0; i < n; ++i) acc[i] = static_cast<T>(acc[i] / d);
  }
}

/// Mean of booleans has no meaning; every other op is defined for every element type.
inline void check_op_for_dtype(ReduceOp op, DType dtype, const char* where) {
  if (op == ReduceOp::Mean && dtype == DType::Bool) {
    throw InvalidArgument(fmt::format("{}: MEAN is not defined for bool values", where));
  }
}

}  // namespace detail
DISTRIBUTE_END_NAMESPACE

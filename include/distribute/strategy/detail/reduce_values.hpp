// Cross-replica reduction of per-replica components on the calling thread (strategy.reduce).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/detail/elementwise.hpp>
#include <distribute/core/error.hpp>
#include <distribute/core/shape.hpp>
#include <distribute/core/tensor.hpp>
#include <distribute/core/tensor_traits.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace detail {

/// Element-wise reduction of equally shaped components; Mean divides by their number.
template <TensorLike U>
U reduce_components(ReduceOp op, const std::vector<const U*>& parts) {
  using E = element_t<U>;
  check_op_for_dtype(op, dtype_of<E>(), "reduce");
  if (parts.empty()) throw InvalidArgument("reduce: there are no values to reduce");
  const Shape shape = shape_of(*parts.front());
  for (std::size_t r = 1; r < parts.size(); ++r) {
    if (shape_of(*parts[r]) != shape) {
      throw InvalidArgument(fmt::format(
          "reduce: replica 0's value has shape {} but replica {}'s has shape {}; values of different batch sizes "
          "need an axis (reduce(op, value, 0))",
          shape_string(shape), r, shape_string(shape_of(*parts[r]))));
    }
  }
  U out = *parts.front();
  const std::size_t n = element_count(out);
  for (std::size_t r = 1; r < parts.size(); ++r) combine(tensor_traits<U>::data(out), tensor_traits<U>::data(*parts[r]), n, op);
  if (op == ReduceOp::Mean) divide(tensor_traits<U>::data(out), n, static_cast<std::int64_t>(parts.size()));
  return out;
}

/// Reduces each component along `axis` and then across components. Components may differ in
/// size along `axis` (an uneven last batch); Mean divides by the total count along it.
template <TensorLike U>
Tensor<element_t<U>> reduce_components_along(ReduceOp op, const std::vector<const U*>& parts, std::int64_t axis_arg) {
  using E = element_t<U>;
  check_op_for_dtype(op, dtype_of<E>(), "reduce");
  if (parts.empty()) throw InvalidArgument("reduce: there are no values to reduce");
  const Shape first = shape_of(*parts.front());
  const std::size_t axis = normalize_axis(axis_arg, first.size(), "reduce");
  Shape out_shape = first;
  out_shape.erase(out_shape.begin() + static_cast<std::ptrdiff_t>(axis));
  for (std::size_t r = 1; r < parts.size(); ++r) {
    Shape s = shape_of(*parts[r]);
    bool ok = s.size() == first.size();
    for (std::size_t d = 0; ok && d < s.size(); ++d) ok = d == axis || s[d] == first[d];
    if (!ok) {
      throw InvalidArgument(fmt::format(
          "reduce: replica 0's value has shape {} but replica {}'s has shape {}; they may only differ along axis {}",
          shape_string(first), r, shape_string(s), axis));
    }
  }
  std::int64_t outer = 1, inner = 1;
  for (std::size_t d = 0; d < axis; ++d) outer *= first[d];
  for (std::size_t d = axis + 1; d < first.size(); ++d) inner *= first[d];
  const auto inner_n = static_cast<std::size_t>(inner);

  Tensor<E> out = Tensor<E>::zeros(out_shape);
  std::int64_t total = 0;
  bool have_any = false;
  for (const U* part : parts) {
    const std::int64_t len = shape_of(*part)[axis];
    const E* src = tensor_traits<U>::data(*part);
    for (std::int64_t k = 0; k < len; ++k) {
      for (std::int64_t o = 0; o < outer; ++o) {
        E* dst = out.data() + o * inner;
        const E* row = src + (o * len + k) * inner;
        if (!have_any) std::copy(row, row + inner_n, dst);
        else combine(dst, row, inner_n, op);
      }
      have_any = true;
    }
    total += len;
  }
  if (!have_any) {
    if (op == ReduceOp::Min || op == ReduceOp::Max || op == ReduceOp::Mean) {
      throw InvalidArgument(fmt::format("reduce: {} along axis {} over zero elements is undefined", op, axis));
    }
    if (op == ReduceOp::Product) std::fill(out.begin(), out.end(), E{1});
  }
  if (op == ReduceOp::Mean) divide(out.data(), out.size(), total);
  return out;
}

}  // namespace detail
DISTRIBUTE_END_NAMESPACE

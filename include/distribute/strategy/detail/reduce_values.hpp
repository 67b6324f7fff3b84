// Cross-replica reduction of per-replica components on the calling thread (strategy.reduce).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/detail/cross_worker.hpp>
#include <distribute/core/detail/elementwise.hpp>
#include <distribute/core/error.hpp>
#include <distribute/core/memory_space.hpp>
#include <distribute/core/shape.hpp>
#include <distribute/core/tensor.hpp>
#include <distribute/core/tensor_traits.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace detail {

/// Element-wise reduction of equally shaped components (and, with a link, of every other
/// worker's); Mean divides by the total number of components.
template <TensorLike U>
U reduce_components(ReduceOp op, const std::vector<const U*>& parts, CrossWorkerLink* link = nullptr) {
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
  const ReduceOp combine_op = op == ReduceOp::Mean ? ReduceOp::Sum : op;
  U out = *parts.front();
  if constexpr (memory_space_v<U> == MemorySpace::device) {  // Thrust device memory (backends/cuda)
    return device_ops<U>::reduce(std::move(out), parts, op, link);
  }
  const std::size_t n = element_count(out);
  for (std::size_t r = 1; r < parts.size(); ++r) {
    combine(tensor_traits<U>::data(out), tensor_traits<U>::data(*parts[r]), n, combine_op);
  }
  auto components = static_cast<std::int64_t>(parts.size());
  if (link) {
    link->all_reduce(tensor_traits<U>::data(out), n, dtype_of<E>(), combine_op);
    components *= link->num_workers();
  }
  if (op == ReduceOp::Mean) divide(tensor_traits<U>::data(out), n, components);
  return out;
}

/// Reduces each component along `axis` and then across components (and workers). Components
/// may differ in size along `axis` (an uneven last batch); Mean divides by the total count along it.
template <TensorLike U>
Tensor<element_t<U>> reduce_components_along(ReduceOp op, const std::vector<const U*>& parts, std::int64_t axis_arg,
                                             CrossWorkerLink* link = nullptr) {
  if constexpr (memory_space_v<U> == MemorySpace::device) {  // on host copies (backends/cuda)
    const auto host = device_ops<U>::host_copies(parts);
    return reduce_components_along(op, host.pointers(), axis_arg, link);
  }
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

  // Start from the op's identity so that a replica (or worker) with no rows changes nothing.
  const ReduceOp combine_op = op == ReduceOp::Mean ? ReduceOp::Sum : op;
  E identity{};
  if (combine_op == ReduceOp::Min) identity = std::numeric_limits<E>::max();
  if (combine_op == ReduceOp::Max) identity = std::numeric_limits<E>::lowest();
  if (combine_op == ReduceOp::Product) identity = E{1};
  Tensor<E> out = Tensor<E>::full(out_shape, identity);
  std::int64_t total = 0;
  for (const U* part : parts) {
    const std::int64_t len = shape_of(*part)[axis];
    const E* src = tensor_traits<U>::data(*part);
    for (std::int64_t o = 0; o < outer; ++o) {
      E* dst = out.data() + o * inner;
      for (std::int64_t k = 0; k < len; ++k) combine(dst, src + (o * len + k) * inner, inner_n, combine_op);
    }
    total += len;
  }
  if (link) {
    link->all_reduce(out.data(), out.size(), dtype_of<E>(), combine_op);
    link->all_reduce(&total, 1, DType::I64, ReduceOp::Sum);
  }
  if (total == 0 && (op == ReduceOp::Min || op == ReduceOp::Max || op == ReduceOp::Mean)) {
    throw InvalidArgument(fmt::format("reduce: {} along axis {} over zero elements is undefined", op, axis));
  }
  if (op == ReduceOp::Mean) divide(out.data(), out.size(), total);
  return out;
}

}  // namespace detail
DISTRIBUTE_END_NAMESPACE

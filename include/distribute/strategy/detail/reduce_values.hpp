// Cross-replica reduction of per-replica components on the calling thread (strategy.reduce).
#pragma once

#include <algorithm>
#include <cstring>
#include <memory>
#include <type_traits>
#include <cstdint>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/detail/cross_worker.hpp>
#include <distribute/core/detail/elementwise.hpp>
#include <distribute/core/detail/half_convert.hpp>
#include <distribute/core/detail/host_operands.hpp>
#include <distribute/core/detail/reduce_components.hpp>
#include <distribute/core/error.hpp>
#include <distribute/core/memory_space.hpp>
#include <distribute/core/shape.hpp>
#include <distribute/core/tensor.hpp>
#include <distribute/core/tensor_traits.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace detail {

/// What reduce(op, value, axis) returns for components of type U: a Tensor of the element type
/// for compile-time types, U itself for run-time ones.
template <class U>
auto reduced_type_tag() {
  if constexpr (StaticTensorLike<U>) return std::type_identity<Tensor<element_t<U>>>{};
  else return std::type_identity<U>{};
}
template <TensorLike U>
using reduced_t = typename decltype(reduced_type_tag<U>())::type;

/// Reduces each component along `axis` and then across components (and workers). Components
/// may differ in size along `axis` (an uneven last batch); Mean divides by the total count along it.
template <TensorLike U>
reduced_t<U> reduce_components_along(ReduceOp op, const std::vector<const U*>& parts, std::int64_t axis_arg,
                                     CrossWorkerLink* link = nullptr) {
  if constexpr (memory_space_v<U> == MemorySpace::device) {  // on host copies (backends/cuda)
    const auto host = device_ops<U>::host_copies(parts);
    return reduce_components_along(op, host.pointers(), axis_arg, link);
  } else {
    if (parts.empty()) throw InvalidArgument("reduce: there are no values to reduce");
    const Shape first = shape_of(*parts.front());
    const std::size_t axis = normalize_axis(axis_arg, first.size(), "reduce");
    HostOperands in = component_operands(parts, axis);
    const DType dtype = in[0].dtype;
    check_op_for_dtype(op, dtype, "reduce");
    Shape out_shape = first;
    out_shape.erase(out_shape.begin() + static_cast<std::ptrdiff_t>(axis));
    std::int64_t outer = 1, inner = 1;
    for (std::size_t d = 0; d < axis; ++d) outer *= first[d];
    for (std::size_t d = axis + 1; d < first.size(); ++d) inner *= first[d];
    const auto inner_n = static_cast<std::size_t>(inner);
    const auto out_n = static_cast<std::size_t>(num_elements(out_shape));

    RowMajorResult<reduced_t<U>> result;
    void* out = result.allocate(dtype, out_shape);
    const ReduceOp combine_op = op == ReduceOp::Mean ? ReduceOp::Sum : op;
    std::int64_t total = 0;
    visit_value_dtype<U>(dtype, [&](auto t) {
      using T = decltype(t);
      // 16-bit floats accumulate in float32 and round once at the end.
      using Acc = std::conditional_t<is_half_v<T>, float, T>;
      // Start from the op's identity so that a replica (or worker) with no rows changes nothing.
      Acc identity{};
      if (combine_op == ReduceOp::Min) identity = std::numeric_limits<Acc>::has_infinity ? std::numeric_limits<Acc>::infinity() : std::numeric_limits<Acc>::max();
      if (combine_op == ReduceOp::Max) identity = std::numeric_limits<Acc>::has_infinity ? -std::numeric_limits<Acc>::infinity() : std::numeric_limits<Acc>::lowest();
      if (combine_op == ReduceOp::Product) identity = Acc{1};
      // (arrays, not std::vector: Acc may be bool)
      std::unique_ptr<Acc[]> acc(new Acc[out_n]), row(new Acc[inner_n]);
      std::fill(acc.get(), acc.get() + out_n, identity);
      for (std::size_t p = 0; p < parts.size(); ++p) {
        const std::int64_t len = in[p].shape[axis];
        const T* src = static_cast<const T*>(in[p].data);
        for (std::int64_t o = 0; o < outer; ++o) {
          Acc* dst = acc.get() + o * inner;
          for (std::int64_t k = 0; k < len; ++k) {
            const T* r = src + (o * len + k) * inner;
            if constexpr (is_half_v<T>) {
              widen(r, row.get(), inner_n);
              combine(dst, row.get(), inner_n, combine_op);
            } else {
              combine(dst, r, inner_n, combine_op);
            }
          }
        }
        total += len;
      }
      if (link) {
        link->all_reduce(acc.get(), out_n, dtype_of<Acc>(), combine_op, shapes_digest(out_shape));
        link->all_reduce(&total, 1, DType::I64, ReduceOp::Sum);
      }
      if (total == 0 && (op == ReduceOp::Min || op == ReduceOp::Max || op == ReduceOp::Mean)) {
        throw InvalidArgument(fmt::format("reduce: {} along axis {} over zero elements is undefined", op, axis));
      }
      if (op == ReduceOp::Mean) divide(acc.get(), out_n, total);
      if constexpr (is_half_v<T>) narrow(acc.get(), static_cast<T*>(out), out_n);
      else if (out_n) std::memcpy(out, acc.get(), out_n * sizeof(T));
    });
    return result.take();
  }
}

}  // namespace detail
DISTRIBUTE_END_NAMESPACE

// Cross-replica reduction of per-replica components on the calling thread (strategy.reduce).
#pragma once

#include <algorithm>
#include <cstring>
#include <memory>
#include <type_traits>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <distribute/core/cross_worker.hpp>
#include <distribute/core/elementwise.hpp>
#include <distribute/core/half_convert.hpp>
#include <distribute/core/host_operands.hpp>
#include <distribute/core/reduce_components.hpp>
#include <distribute/core/error.hpp>
#include <distribute/core/memory_space.hpp>
#include <distribute/core/shape.hpp>
#include <distribute/core/tensor.hpp>
#include <distribute/core/tensor_traits.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace strategy::detail {

/// What reduce(op, value, axis) returns for components of type U: a Tensor of the element type
/// for compile-time types, U itself for run-time ones.
template <class U>
auto reduced_type_tag() {
  if constexpr (StaticTensorLike<U>) return std::type_identity<Tensor<element_t<U>>>{};
  else return std::type_identity<U>{};
}
template <TensorLike U>
using reduced_t = typename decltype(reduced_type_tag<U>())::type;

/// The start of a reduction of type Acc combined with `combine_op` (never Mean): a replica, or a
/// worker, with no rows changes nothing.
template <class Acc>
Acc reduction_identity(ReduceOp combine_op) {
  if (combine_op == ReduceOp::Min) return std::numeric_limits<Acc>::has_infinity ? std::numeric_limits<Acc>::infinity() : std::numeric_limits<Acc>::max();
  if (combine_op == ReduceOp::Max) return std::numeric_limits<Acc>::has_infinity ? -std::numeric_limits<Acc>::infinity() : std::numeric_limits<Acc>::lowest();
  if (combine_op == ReduceOp::Product) return Acc{1};
  return Acc{};
}

/// The end of a reduction over `total` elements (all workers'): Mean lowered, now that its count
/// is known (the values were combined with Reduction::combining), its division, and the store.
/// Over zero elements Mean is NaN for floating types, as in TF (0/0); integers have no NaN, and
/// Min/Max (which TF's strategy.reduce does not offer) have no value: InvalidArgument.
template <class T, class Acc>
void finish_reduction(ReduceOp op, Acc* acc, void* out, std::size_t out_n, std::int64_t total, std::string_view along) {
  if (total == 0 && (op == ReduceOp::Min || op == ReduceOp::Max || (op == ReduceOp::Mean && !std::is_floating_point_v<Acc>))) {
    throw InvalidArgument(fmt::format("reduce: {} of {} {} over zero elements is undefined{}", op, to_string(dtype_of<T>()),
                                      along, op == ReduceOp::Mean ? " (TF gives NaN; an integer has none)" : ""));
  }
  if (op == ReduceOp::Mean && total == 0) std::fill(acc, acc + out_n, std::numeric_limits<Acc>::quiet_NaN());
  if (const Reduction red = Reduction::lower(op, total); red.divides()) core::divide(acc, out_n, red.divisor());
  if constexpr (core::is_half_v<T>) core::narrow(acc, static_cast<T*>(out), out_n);
  else if (out_n) std::memcpy(out, acc, out_n * sizeof(T));
}

/// Reduces each component along `axis` and then across components (and workers). Components
/// may differ in size along `axis` (an uneven last batch); Mean divides by the total count along it.
template <TensorLike U>
reduced_t<U> reduce_components_along(ReduceOp op, const std::vector<const U*>& parts, std::int64_t axis_arg,
                                     core::CrossWorkerLink* link = nullptr) {
  if constexpr (memory_space_v<U> == MemorySpace::device) {  // on host copies (backends/cuda)
    const auto host = core::device_ops<U>::host_copies(parts);
    return reduce_components_along(op, host.pointers(), axis_arg, link);
  } else {
    if (parts.empty()) throw InvalidArgument("reduce: there are no values to reduce");
    const Shape first = shape_of(*parts.front());
    const std::size_t axis = normalize_axis(axis_arg, first.size(), "reduce");
    core::HostOperands in = core::component_operands(parts, axis);
    const DType dtype = in[0].dtype;
    core::check_op_for_dtype(op, dtype, "reduce");
    Shape out_shape = first;
    out_shape.erase(out_shape.begin() + static_cast<std::ptrdiff_t>(axis));
    std::int64_t outer = 1, inner = 1;
    for (std::size_t d = 0; d < axis; ++d) outer *= first[d];
    for (std::size_t d = axis + 1; d < first.size(); ++d) inner *= first[d];
    const auto inner_n = static_cast<std::size_t>(inner);
    const auto out_n = static_cast<std::size_t>(num_elements(out_shape));

    core::RowMajorResult<reduced_t<U>> result;
    void* out = result.allocate(dtype, out_shape);
    const ReduceOp combine_op = Reduction::combining(op);
    std::int64_t total = 0;
    visit_value_dtype<U>(dtype, [&](auto t) {
      using T = decltype(t);
      // 16-bit floats accumulate in float32 and round once at the end.
      using Acc = std::conditional_t<core::is_half_v<T>, float, T>;
      // (arrays, not std::vector: Acc may be bool)
      std::unique_ptr<Acc[]> acc(new Acc[out_n]), row(new Acc[inner_n]);
      std::fill(acc.get(), acc.get() + out_n, reduction_identity<Acc>(combine_op));
      for (std::size_t p = 0; p < parts.size(); ++p) {
        const std::int64_t len = in[p].shape[axis];
        const T* src = static_cast<const T*>(in[p].data);
        for (std::int64_t o = 0; o < outer; ++o) {
          Acc* dst = acc.get() + o * inner;
          for (std::int64_t k = 0; k < len; ++k) {
            const T* r = src + (o * len + k) * inner;
            if constexpr (core::is_half_v<T>) {
              core::widen(r, row.get(), inner_n);
              core::combine(dst, row.get(), inner_n, combine_op);
            } else {
              core::combine(dst, r, inner_n, combine_op);
            }
          }
        }
        total += len;
      }
      if (link) {
        link->all_reduce(acc.get(), out_n, dtype_of<Acc>(), combine_op, core::shapes_digest(out_shape));
        link->all_reduce(&total, 1, DType::I64, ReduceOp::Sum);
      }
      finish_reduction<T>(op, acc.get(), out, out_n, total, fmt::format("along axis {}", axis));
    });
    return result.take();
  }
}

/// Reduces each component over every axis in `axes_arg` (TF's tuple axis; negative axes count
/// from the end; none: across components only) and then across components (and workers).
/// Components may differ along the reduced axes; Mean divides by the total element count.
template <TensorLike U>
reduced_t<U> reduce_components_over(ReduceOp op, const std::vector<const U*>& parts,
                                    std::span<const std::int64_t> axes_arg, core::CrossWorkerLink* link = nullptr) {
  if constexpr (memory_space_v<U> == MemorySpace::device) {  // on host copies (backends/cuda)
    const auto host = core::device_ops<U>::host_copies(parts);
    return reduce_components_over(op, host.pointers(), axes_arg, link);
  } else {
    if (parts.empty()) throw InvalidArgument("reduce: there are no values to reduce");
    const Shape first = shape_of(*parts.front());
    const std::size_t rank = first.size();
    std::vector<bool> reduced(rank, false);
    for (std::int64_t a : axes_arg) {
      const std::size_t axis = normalize_axis(a, rank, "reduce");
      if (reduced[axis]) {
        throw InvalidArgument(fmt::format("reduce: axis {} is listed twice in ({}); each axis may be reduced once", axis,
                                          fmt::join(axes_arg, ", ")));
      }
      reduced[axis] = true;
    }
    if (axes_arg.size() == 1) return reduce_components_along(op, parts, axes_arg[0], link);
    core::HostOperands in("reduce");
    for (const U* p : parts) in.add(view_of(*p), true);
    for (std::size_t r = 1; r < parts.size(); ++r) {
      bool ok = in[r].dtype == in[0].dtype && in[r].shape.size() == rank;
      for (std::size_t d = 0; ok && d < rank; ++d) ok = reduced[d] || in[r].shape[d] == first[d];
      if (!ok) {
        throw InvalidArgument(fmt::format("reduce: replica 0's value is {} of shape {} but replica {}'s is {} of shape {}; "
                                          "they may only differ along the reduced axes ({})",
                                          to_string(in[0].dtype), shape_string(first), r, to_string(in[r].dtype),
                                          shape_string(in[r].shape), fmt::join(axes_arg, ", ")));
      }
    }
    const DType dtype = in[0].dtype;
    core::check_op_for_dtype(op, dtype, "reduce");
    Shape out_shape;
    for (std::size_t d = 0; d < rank; ++d) {
      if (!reduced[d]) out_shape.push_back(first[d]);
    }
    const auto out_n = static_cast<std::size_t>(num_elements(out_shape));
    core::RowMajorResult<reduced_t<U>> result;
    void* out = result.allocate(dtype, out_shape);
    const ReduceOp combine_op = Reduction::combining(op);
    std::int64_t total = 0;
    visit_value_dtype<U>(dtype, [&](auto t) {
      using T = decltype(t);
      using Acc = std::conditional_t<core::is_half_v<T>, float, T>;
      std::unique_ptr<Acc[]> acc(new Acc[out_n]);
      std::fill(acc.get(), acc.get() + out_n, reduction_identity<Acc>(combine_op));
      for (std::size_t p = 0; p < parts.size(); ++p) {
        const Shape& shape = in[p].shape;
        // Each element's place in the output: an odometer over the component's indices, where a
        // reduced axis moves no output position.
        std::vector<std::int64_t> out_stride(rank, 0), index(rank, 0);
        std::int64_t stride = 1, count = 1;
        for (std::size_t d = rank; d-- > 0;) {
          if (reduced[d]) {
            count *= shape[d];
          } else {
            out_stride[d] = stride;
            stride *= shape[d];
          }
        }
        const T* src = static_cast<const T*>(in[p].data);
        const std::int64_t n = num_elements(shape);
        std::int64_t o = 0;
        for (std::int64_t e = 0; e < n; ++e) {
          Acc x;
          if constexpr (core::is_half_v<T>) core::widen(src + e, &x, 1);
          else x = src[e];
          core::combine(acc.get() + o, &x, 1, combine_op);
          for (std::size_t d = rank; d-- > 0;) {  // next index; o follows
            o += out_stride[d];
            if (++index[d] < shape[d]) break;
            o -= out_stride[d] * shape[d];
            index[d] = 0;
          }
        }
        total += count;
      }
      if (link) {
        link->all_reduce(acc.get(), out_n, dtype_of<Acc>(), combine_op, core::shapes_digest(out_shape));
        link->all_reduce(&total, 1, DType::I64, ReduceOp::Sum);
      }
      finish_reduction<T>(op, acc.get(), out, out_n, total, fmt::format("over axes ({})", fmt::join(axes_arg, ", ")));
    });
    return result.take();
  }
}

#if DISTRIBUTE_DETAIL_INSTANTIATE  // compiled once with DISTRIBUTE_SEPARATE_COMPILATION (version.hpp)
#define DISTRIBUTE_DETAIL_REDUCE_ALONG(T)                                                                      \
  DISTRIBUTE_DETAIL_EXTERN template reduced_t<T> reduce_components_along<T>(ReduceOp, const std::vector<const T*>&, \
                                                                             std::int64_t, core::CrossWorkerLink*);     \
  DISTRIBUTE_DETAIL_EXTERN template reduced_t<T> reduce_components_over<T>(ReduceOp, const std::vector<const T*>&,  \
                                                                            std::span<const std::int64_t>,        \
                                                                            core::CrossWorkerLink*);
DISTRIBUTE_DETAIL_FOR_COMMON_VALUE_TYPES(DISTRIBUTE_DETAIL_REDUCE_ALONG)
#undef DISTRIBUTE_DETAIL_REDUCE_ALONG
#endif

}  // namespace strategy::detail
DISTRIBUTE_END_NAMESPACE

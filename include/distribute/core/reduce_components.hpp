// Element-wise reduction of equally shaped values on the calling thread: the components of a
// distributed value (strategy.reduce) or a sync-on-read variable's copies, and with a link every
// other worker's.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/detail/common_types.hpp>
#include <distribute/core/cross_worker.hpp>
#include <distribute/core/elementwise.hpp>
#include <distribute/core/host_operands.hpp>
#include <distribute/core/error.hpp>
#include <distribute/core/memory_space.hpp>
#include <distribute/core/tensor_traits.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace core {

/// The components' views, as contiguous host buffers, after checking they agree in dtype (and in
/// shape, except along `free_axis` when given).
template <TensorLike U>
HostOperands component_operands(const std::vector<const U*>& parts, std::optional<std::size_t> free_axis) {
  if (parts.empty()) throw InvalidArgument("reduce: there are no values to reduce");
  HostOperands in("reduce");
  for (const U* p : parts) in.add(view_of(*p), true);
  const BufferRef& first = in[0];
  for (std::size_t r = 1; r < parts.size(); ++r) {
    const BufferRef& b = in[r];
    bool ok = b.dtype == first.dtype && b.shape.size() == first.shape.size();
    for (std::size_t d = 0; ok && d < b.shape.size(); ++d) ok = (free_axis && d == *free_axis) || b.shape[d] == first.shape[d];
    if (ok) continue;
    if (free_axis) {
      throw InvalidArgument(fmt::format("reduce: replica 0's value is {} of shape {} but replica {}'s is {} of shape {}; "
                                        "they may only differ along axis {}",
                                        to_string(first.dtype), shape_string(first.shape), r, to_string(b.dtype),
                                        shape_string(b.shape), *free_axis));
    }
    throw InvalidArgument(fmt::format(
        "reduce: replica 0's value is {} of shape {} but replica {}'s is {} of shape {}; values of different batch "
        "sizes need an axis (reduce(op, value, 0))",
        to_string(first.dtype), shape_string(first.shape), r, to_string(b.dtype), shape_string(b.shape)));
  }
  return in;
}

/// Element-wise reduction of equally shaped components (and, with a link, of every other
/// worker's); Mean divides by the total number of components. 16-bit floats accumulate the local
/// components in float32 and round once.
template <TensorLike U>
U reduce_components(ReduceOp op, const std::vector<const U*>& parts, CrossWorkerLink* link = nullptr) {
  if constexpr (memory_space_v<U> == MemorySpace::device) {  // Thrust device memory (backends/cuda)
    check_op_for_dtype(op, dtype_of<element_t<U>>(), "reduce");
    if (parts.empty()) throw InvalidArgument("reduce: there are no values to reduce");
    return device_ops<U>::reduce(clone_value(*parts.front()), parts, op, link);
  } else {
    HostOperands in = component_operands(parts, std::nullopt);
    const DType dtype = in[0].dtype;
    check_op_for_dtype(op, dtype, "reduce");
    RowMajorResult<U> result;
    void* out = result.allocate(dtype, in[0].shape);
    const std::size_t n = in[0].count();
    const auto components = static_cast<std::int64_t>(parts.size()) * (link ? link->num_workers() : 1);
    const Reduction red = Reduction::lower(op, components);
    visit_value_dtype<U>(dtype, [&](auto t) {
      using T = decltype(t);
      std::vector<const void*> sources;
      for (const BufferRef& b : in.buffers()) sources.push_back(b.data);
      if (!link) return reduce_many<T>(static_cast<T*>(out), sources, n, red);
      reduce_many<T>(static_cast<T*>(out), sources, n, red.undivided());
      link->all_reduce(out, n, dtype, red.op(), shapes_digest(in[0].shape));
      if (red.divides()) divide(static_cast<T*>(out), n, red.divisor());
    });
    return result.take();
  }
}

#if DISTRIBUTE_DETAIL_INSTANTIATE  // compiled once with DISTRIBUTE_SEPARATE_COMPILATION (version.hpp)
#define DISTRIBUTE_DETAIL_REDUCE_COMPONENTS(T) \
  DISTRIBUTE_DETAIL_EXTERN template T reduce_components<T>(ReduceOp, const std::vector<const T*>&, CrossWorkerLink*);
DISTRIBUTE_DETAIL_FOR_COMMON_VALUE_TYPES(DISTRIBUTE_DETAIL_REDUCE_COMPONENTS)
#undef DISTRIBUTE_DETAIL_REDUCE_COMPONENTS
#endif

}  // namespace core
DISTRIBUTE_END_NAMESPACE

// ReplicaContext's values as the operands of its collectives (core/context.hpp): which are
// reduced out of place (an lvalue in host memory that owns its elements: read where it is, the
// result written into a new value) and which in their own memory, and the operand each becomes.
#pragma once

#include <type_traits>
#include <utility>

#include <distribute/core/host_operands.hpp>
#include <distribute/core/memory_space.hpp>
#include <distribute/core/shape.hpp>
#include <distribute/core/tensor_traits.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

namespace core::detail {

/// An lvalue is copied (deeply, for handle types such as torch::Tensor), an rvalue moved.
template <class V>
std::remove_cvref_t<V> owned(V&& v) {
  if constexpr (std::is_lvalue_reference_v<V>) return clone_value(v);
  else return std::move(v);
}

// Whether all_reduce reduces an argument of type V (as forwarded) out of place: an lvalue in host
// memory that owns it. A view type or a device value is copied (owned()) and reduced in place.
template <class V>
constexpr bool out_of_place_v = std::is_lvalue_reference_v<V> && !is_view_v<std::remove_cvref_t<V>> &&
                                memory_space_v<std::remove_cvref_t<V>> == MemorySpace::host;

// The same for one value: a run-time-typed lvalue whose elements are in device memory is copied
// (owned()), so that it meets the errors every other device value does.
template <class V>
bool out_of_place(const std::remove_reference_t<V>& v) {
  if constexpr (!out_of_place_v<V>) return false;
  else if constexpr (DynamicTensorLike<std::remove_cvref_t<V>>) return view_of(v).memory == MemorySpace::host;
  else return true;
}

// all_reduce's result for one argument: a new value of the lvalue's dtype and shape (left in
// `shape`) for the collective to write, else owned() (an rvalue moved in and reduced in its own
// memory).
template <class V>
std::remove_cvref_t<V> result_value(V&& v, [[maybe_unused]] Shape& shape) {
  if constexpr (out_of_place_v<V>) {
    if (out_of_place<V>(v)) {
      shape = shape_of(v);
      return make_value<std::remove_cvref_t<V>>(value_dtype(v), shape);
    }
  }
  return owned(std::forward<V>(v));
}

/// A value as one operand of a collective, in place (read_only: read, never written).
template <class U>
void add_operand(HostOperands& operands, U& v, bool read_only = false) {
  if constexpr (memory_space_v<U> == MemorySpace::device) {  // see core/memory_space.hpp
    BufferRef ref{tensor_traits<U>::data(v), dtype_of<element_t<U>>(), tensor_traits<U>::shape(v)};
    ref.memory = MemorySpace::device;
    ref.device = device_ops<U>::access();
    operands.add(std::move(ref));
  } else {
    operands.add(view_of(v), read_only);
  }
}

// Adds the result `out` of argument `in` to the collective's operands; `shape`: what
// result_value left.
template <class V, class R>
void add_result_operand(HostOperands& operands, const std::remove_reference_t<V>& in, R& out,
                        [[maybe_unused]] Shape&& shape, bool read_source) {
  using T = std::remove_cvref_t<V>;
  if (!out_of_place<V>(in)) return add_operand(operands, out);
  if constexpr (StaticTensorLike<T> && !requires { tensor_traits<T>::strides(in); }) {
    // Row-major contiguous host memory, by its type: no views to build.
    operands.add_out_of_place(tensor_traits<T>::data(in),
                              BufferRef{tensor_traits<T>::data(out), dtype_of<element_t<T>>(), std::move(shape)},
                              read_source);
  } else {
    operands.add_out_of_place(view_of(in), view_of(out), read_source);
  }
}

}  // namespace core::detail

DISTRIBUTE_END_NAMESPACE

// tensor_traits<U>: the customisation point that tells the library how to see a value as a tensor.
//
// A type the library reduces, gathers or sends describes itself in one of two forms.
//
// Compile-time element type (std::vector, Eigen, xtensor):
//
//   template <> struct distribute::tensor_traits<MyVec> {
//     using value_type = float;                                  // an Element (see dtype.hpp)
//     static ds::Shape shape(const MyVec&);                      // logical dims, row-major order
//     static const float* data(const MyVec&);
//     static float* data(MyVec&);
//     static MyVec make(const ds::Shape&);                       // a zeroed value (laid out as strides() says)
//   };
//   Optional: `static ds::Strides strides(const MyVec&)` when the elements are not row-major
//   contiguous (a column-major matrix: {1, rows}); without it they must be.
//
// Run-time element type (torch::Tensor, DLPack):
//
//   template <> struct distribute::tensor_traits<Dyn> {
//     static ds::TensorView view(const Dyn&);                    // data, dtype, shape, strides, memory
//     static Dyn make(ds::DType, const ds::Shape&);              // a zeroed value of that dtype and shape
//   };
//
// Optional in both: `static constexpr bool is_view = true` for types that refer to memory they do
// not own (Eigen::Map): the library never copies or makes one, so pass them as rvalues to work in
// that memory, and say a gathered_type; `static U clone(const U&)`, an independent deep copy, for types whose copy
// constructor shares the elements (handles such as torch::Tensor); `using gathered_type = ...`
// (what gather/all_gather return; default Tensor<value_type>, or U itself for run-time types);
// `static constexpr ds::MemorySpace memory = ...` (compile-time form; default host; `device`
// for values in the Thrust device system's memory, see core/memory_space.hpp).
#pragma once

#include <array>
#include <concepts>
#include <cstddef>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include <distribute/core/detail/huge_pages.hpp>
#include <distribute/core/dtype.hpp>
#include <distribute/core/memory_space.hpp>
#include <distribute/core/shape.hpp>
#include <distribute/core/tensor.hpp>
#include <distribute/core/tensor_view.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

/// Primary template: deliberately empty, so that a type without a specialisation fails the
/// TensorLike concept with a readable message instead of a backtrace.
template <class U>
struct tensor_traits {};

/// A value whose element type is known at compile time (tensor_traits<U>::value_type).
template <class U>
concept StaticTensorLike = requires(const U& cu, U& u, const Shape& s) {
  typename tensor_traits<U>::value_type;
  requires Element<typename tensor_traits<U>::value_type>;
  { tensor_traits<U>::shape(cu) } -> std::convertible_to<Shape>;
  { tensor_traits<U>::data(cu) } -> std::same_as<const typename tensor_traits<U>::value_type*>;
  { tensor_traits<U>::data(u) } -> std::same_as<typename tensor_traits<U>::value_type*>;
  { tensor_traits<U>::make(s) } -> std::same_as<U>;
};

/// A value whose element type is known only at run time (tensor_traits<U>::view gives it).
template <class U>
concept DynamicTensorLike = !StaticTensorLike<U> && requires(const U& cu, DType d, const Shape& s) {
  { tensor_traits<U>::view(cu) } -> std::same_as<TensorView>;
  { tensor_traits<U>::make(d, s) } -> std::same_as<U>;
};

/// A value the library can reduce, gather and send: it has a complete tensor_traits specialisation.
template <class U>
concept TensorLike = StaticTensorLike<U> || DynamicTensorLike<U>;

template <StaticTensorLike U>
using element_t = typename tensor_traits<U>::value_type;

namespace core::detail {
template <class U>
auto gathered_type_tag() {
  if constexpr (requires { typename tensor_traits<U>::gathered_type; }) {
    return std::type_identity<typename tensor_traits<U>::gathered_type>{};
  } else if constexpr (StaticTensorLike<U>) {
    return std::type_identity<Tensor<element_t<U>>>{};
  } else {
    return std::type_identity<U>{};
  }
}
template <class U>
constexpr MemorySpace memory_of() {
  if constexpr (requires { tensor_traits<U>::memory; }) return tensor_traits<U>::memory;
  else return MemorySpace::host;
}
}  // namespace core::detail

/// What gather/all_gather return for components of type U (a concatenation along an axis).
template <TensorLike U>
using gathered_t = typename decltype(core::detail::gathered_type_tag<U>())::type;

/// Where U's elements live, when its type says (compile-time form); run-time types say it in
/// their view, and the library's device paths are for compile-time types.
template <TensorLike U>
inline constexpr MemorySpace memory_space_v = core::detail::memory_of<U>();

/// Whether U refers to memory it does not own (tensor_traits<U>::is_view).
template <class U>
inline constexpr bool is_view_v = [] {
  if constexpr (requires { tensor_traits<U>::is_view; }) return bool(tensor_traits<U>::is_view);
  else return false;
}();

/// The run-time description of a value's memory.
template <TensorLike U>
TensorView view_of(const U& u) {
  if constexpr (StaticTensorLike<U>) {
    using E = element_t<U>;
    TensorView v{const_cast<E*>(tensor_traits<U>::data(u)), dtype_of<E>(), tensor_traits<U>::shape(u)};
    if constexpr (requires { tensor_traits<U>::strides(u); }) {
      v.strides = tensor_traits<U>::strides(u);
      check_view(v, typeid(U));
    }
    v.memory = memory_space_v<U>;
    return v;
  } else {
    TensorView v = tensor_traits<U>::view(u);
    check_view(v, typeid(U));
    return v;
  }
}

template <TensorLike U>
Shape shape_of(const U& u) {
  if constexpr (StaticTensorLike<U>) return tensor_traits<U>::shape(u);
  else return tensor_traits<U>::view(u).shape;
}

template <TensorLike U>
std::size_t element_count(const U& u) {
  return static_cast<std::size_t>(num_elements(shape_of(u)));
}

/// The element type of a value (known at compile time for StaticTensorLike types).
template <TensorLike U>
DType value_dtype(const U& u) {
  if constexpr (StaticTensorLike<U>) return dtype_of<element_t<U>>();
  else return tensor_traits<U>::view(u).dtype;
}

/// A zeroed value of U with `dtype` and `shape`. A compile-time type holds
/// one dtype: asking it for another is an InvalidArgument naming both.
template <TensorLike U>
U make_value(DType dtype, const Shape& shape) {
  static_assert(!is_view_v<U>, "this operation makes a new value of a view type (tensor_traits<U>::is_view), which "
                               "cannot own memory: give the view type a gathered_type, or use an owning type");
  if constexpr (StaticTensorLike<U>) {
    if (dtype != dtype_of<element_t<U>>()) {
      throw InvalidArgument(fmt::format("cannot hold {} values in a value of element type {}", to_string(dtype),
                                        to_string(dtype_of<element_t<U>>())));
    }
    return tensor_traits<U>::make(shape);
  } else {
    U out = tensor_traits<U>::make(dtype, shape);
    const TensorView v = tensor_traits<U>::view(out);
    if (v.dtype != dtype || v.shape != shape) {
      throw InvalidArgument(fmt::format("tensor_traits<{}>::make({}, {}) returned {}; it must return a value of "
                                        "that dtype and shape",
                                        core::type_name(typeid(U)), to_string(dtype), shape_string(shape), describe(v)));
    }
    return out;
  }
}

/// visit_dtype for values of U: a compile-time type has one dtype, so `f` is instantiated for it
/// alone rather than for every DType (what a program that uses one element type pays to compile).
template <TensorLike U, class F>
decltype(auto) visit_value_dtype([[maybe_unused]] DType dtype, F&& f) {
  if constexpr (StaticTensorLike<U>) return f(dtype_type_t<dtype_of<element_t<U>>()>{});
  else return visit_dtype(dtype, std::forward<F>(f));
}

/// An independent copy of `u` (its own elements), through tensor_traits<U>::clone where the type's
/// copy constructor shares them.
template <TensorLike U>
U clone_value(const U& u) {
  static_assert(!is_view_v<U>, "a view type (tensor_traits<U>::is_view, e.g. Eigen::Map) cannot be copied into memory "
                               "of its own: pass it as an rvalue (std::move(view)) to work in the memory it views");
  if constexpr (requires { { tensor_traits<U>::clone(u) } -> std::same_as<U>; }) return tensor_traits<U>::clone(u);
  else return u;
}

// ---- built-in specialisations -------------------------------------------------------------

/// Arithmetic scalars are rank-0 tensors.
template <class T>
  requires Element<T>
struct tensor_traits<T> {
  using value_type = T;
  static Shape shape(const T&) { return {}; }
  static const T* data(const T& v) { return &v; }
  static T* data(T& v) { return &v; }
  static T make(const Shape& s) {
    if (!s.empty()) throw InvalidArgument(fmt::format("cannot hold shape {} in a scalar", shape_string(s)));
    return T{};
  }
};

/// std::vector<T> is a rank-1 tensor; gathering vectors gives a vector.
template <class T>
  requires(Element<T> && !std::is_same_v<T, bool>)
struct tensor_traits<std::vector<T>> {
  using value_type = T;
  using gathered_type = std::vector<T>;
  static Shape shape(const std::vector<T>& v) { return {static_cast<std::int64_t>(v.size())}; }
  static const T* data(const std::vector<T>& v) { return v.data(); }
  static T* data(std::vector<T>& v) { return v.data(); }
  static std::vector<T> make(const Shape& s) {
    if (s.size() != 1) {
      throw InvalidArgument(fmt::format("cannot hold shape {} in a std::vector (rank 1); use ds::Tensor", shape_string(s)));
    }
    // Huge pages asked for before the zeros are written (see core/detail/huge_pages.hpp): the
    // result of an all-reduce of lvalues is made here.
    std::vector<T> out;
    out.reserve(static_cast<std::size_t>(s[0]));
    core::detail::advise_huge_pages(out.data(), out.capacity() * sizeof(T));
    out.resize(static_cast<std::size_t>(s[0]));
    return out;
  }
  /// The copy all_reduce makes of an lvalue: huge pages asked for before it is written (see
  /// core/detail/huge_pages.hpp), which makes a 64 MiB copy ~3x cheaper on a fresh mapping.
  static std::vector<T> clone(const std::vector<T>& v) {
    std::vector<T> out;
    out.reserve(v.size());
    core::detail::advise_huge_pages(out.data(), v.size() * sizeof(T));
    out.assign(v.begin(), v.end());
    return out;
  }
};

/// std::array<T, N> is a rank-1 tensor of N elements.
template <class T, std::size_t N>
  requires Element<T>
struct tensor_traits<std::array<T, N>> {
  using value_type = T;
  static Shape shape(const std::array<T, N>&) { return {static_cast<std::int64_t>(N)}; }
  static const T* data(const std::array<T, N>& v) { return v.data(); }
  static T* data(std::array<T, N>& v) { return v.data(); }
  static std::array<T, N> make(const Shape& s) {
    if (s != Shape{static_cast<std::int64_t>(N)}) {
      throw InvalidArgument(fmt::format("cannot hold shape {} in a std::array of {}", shape_string(s), N));
    }
    return std::array<T, N>{};
  }
};

template <class T>
struct tensor_traits<Tensor<T>> {
  using value_type = T;
  using gathered_type = Tensor<T>;
  static Shape shape(const Tensor<T>& t) { return t.shape(); }
  static const T* data(const Tensor<T>& t) { return t.data(); }
  static T* data(Tensor<T>& t) { return t.data(); }
  static Tensor<T> make(const Shape& s) { return Tensor<T>::zeros(s); }
};

DISTRIBUTE_END_NAMESPACE

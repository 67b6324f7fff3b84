// tensor_traits<U>: the customisation point that tells the library how to see a value as a tensor.
//
// A type the library reduces, gathers or sends must describe itself through a specialisation:
//
//   template <> struct distribute::tensor_traits<MyVec> {
//     using value_type = float;                                  // an arithmetic element type
//     static ds::Shape shape(const MyVec&);                      // row-major dims
//     static const float* data(const MyVec&);                    // contiguous elements
//     static float* data(MyVec&);
//     static MyVec make(const ds::Shape&);                       // a zeroed value of that shape
//   };
//
// Optional members: `using gathered_type = ...` (what gather/all_gather return; default Tensor<T>)
// and `static constexpr ds::MemorySpace memory = ...` (default host; `device` for values in the
// Thrust device system's memory, see core/memory_space.hpp and backends/cuda/device_tensor.hpp).
#pragma once

#include <array>
#include <concepts>
#include <cstddef>
#include <type_traits>
#include <vector>

#include <distribute/core/dtype.hpp>
#include <distribute/core/memory_space.hpp>
#include <distribute/core/shape.hpp>
#include <distribute/core/tensor.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

/// Primary template: deliberately empty, so that a type without a specialisation fails the
/// TensorLike concept with a readable message instead of a backtrace.
template <class U>
struct tensor_traits {};

/// A value the library can reduce, gather and send: it has a complete tensor_traits specialisation.
template <class U>
concept TensorLike = requires(const U& cu, U& u, const Shape& s) {
  typename tensor_traits<U>::value_type;
  requires Element<typename tensor_traits<U>::value_type>;
  { tensor_traits<U>::shape(cu) } -> std::convertible_to<Shape>;
  { tensor_traits<U>::data(cu) } -> std::same_as<const typename tensor_traits<U>::value_type*>;
  { tensor_traits<U>::data(u) } -> std::same_as<typename tensor_traits<U>::value_type*>;
  { tensor_traits<U>::make(s) } -> std::same_as<U>;
};

template <TensorLike U>
using element_t = typename tensor_traits<U>::value_type;

namespace detail {
template <class U>
struct gathered_type_of {
  using type = Tensor<element_t<U>>;
};
template <class U>
  requires requires { typename tensor_traits<U>::gathered_type; }
struct gathered_type_of<U> {
  using type = typename tensor_traits<U>::gathered_type;
};
template <class U>
constexpr MemorySpace memory_of() {
  if constexpr (requires { tensor_traits<U>::memory; }) return tensor_traits<U>::memory;
  else return MemorySpace::host;
}
}  // namespace detail

/// What gather/all_gather return for components of type U (a concatenation along an axis).
template <TensorLike U>
using gathered_t = typename detail::gathered_type_of<U>::type;

template <TensorLike U>
inline constexpr MemorySpace memory_space_v = detail::memory_of<U>();

template <TensorLike U>
Shape shape_of(const U& u) { return tensor_traits<U>::shape(u); }

template <TensorLike U>
std::size_t element_count(const U& u) {
  return static_cast<std::size_t>(num_elements(tensor_traits<U>::shape(u)));
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
    return std::vector<T>(static_cast<std::size_t>(s[0]));
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

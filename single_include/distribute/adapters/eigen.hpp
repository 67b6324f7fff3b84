// distribute 0.1.0: <distribute/adapters/eigen.hpp> for the single-header edition.
// SPDX-License-Identifier: Apache-2.0
//
// GENERATED FILE, DO NOT EDIT. It is produced from include/distribute/ by
//   python3 tools/amalgamate.py
// Edit the headers under include/ and regenerate.
// Eigen values as tensors: Eigen::Matrix and Eigen::Array of either storage order, Eigen::Map
// over either, and Eigen::Tensor / Eigen::TensorMap of either layout. Include it after (or
// instead of) Eigen; the umbrella header does not.
//
//   #include <distribute/distribute.hpp>
//   #include <distribute/adapters/eigen.hpp>
//   Eigen::MatrixXf g = ...;
//   g = ctx.all_reduce(ds::ReduceOp::Mean, std::move(g));
//
// Shapes are logical: a matrix is (rows, cols) whatever its storage order, a vector with one
// compile-time dimension of 1 (VectorXf, RowVector3f) is rank 1, and gather/reduce along an axis
// give the row-major result (column-major memory is described by strides). Maps and TensorMaps
// are views of someone else's memory: pass them as rvalues to reduce that memory in place;
// gather results come back as ds::Tensor. Eigen::half and Eigen::bfloat16 are float16/bfloat16.
#pragma once

#include <cstdint>
#include <type_traits>

#include <Eigen/Core>
#include <unsupported/Eigen/CXX11/Tensor>

#include <fmt/format.h>

#include <distribute/distribute.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

template <>
struct element_dtype<Eigen::half> {
  static constexpr DType value = DType::F16;
};
template <>
struct element_dtype<Eigen::bfloat16> {
  static constexpr DType value = DType::BF16;
};

namespace adapters::eigen {

/// Matrix or Array: rank 1 when one dimension is 1 at compile time, else rank 2.
template <class M>
struct dense_layout {
  static constexpr bool is_vector = M::RowsAtCompileTime == 1 || M::ColsAtCompileTime == 1;
  static constexpr bool row_major = (M::Flags & Eigen::RowMajorBit) != 0;

  static Shape shape(const M& m) {
    if constexpr (is_vector) return {static_cast<std::int64_t>(m.size())};
    else return {static_cast<std::int64_t>(m.rows()), static_cast<std::int64_t>(m.cols())};
  }
  /// In elements; honours a Map's inner and outer strides.
  static Strides strides(const M& m) {
    if constexpr (is_vector) {
      return {static_cast<std::int64_t>(m.innerStride())};
    } else if constexpr (row_major) {
      return {static_cast<std::int64_t>(m.outerStride()), static_cast<std::int64_t>(m.innerStride())};
    } else {
      return {static_cast<std::int64_t>(m.innerStride()), static_cast<std::int64_t>(m.outerStride())};
    }
  }
  /// Rows and columns of a value of `s`, checked against the type's fixed dimensions.
  static std::pair<Eigen::Index, Eigen::Index> dims(const Shape& s) {
    Eigen::Index rows = 0, cols = 0;
    if constexpr (is_vector) {
      if (s.size() != 1) {
        throw InvalidArgument(fmt::format("cannot hold shape {} in an Eigen vector (rank 1)", shape_string(s)));
      }
      rows = M::RowsAtCompileTime == 1 ? 1 : static_cast<Eigen::Index>(s[0]);
      cols = M::RowsAtCompileTime == 1 ? static_cast<Eigen::Index>(s[0]) : 1;
    } else {
      if (s.size() != 2) {
        throw InvalidArgument(fmt::format("cannot hold shape {} in an Eigen matrix (rank 2)", shape_string(s)));
      }
      rows = static_cast<Eigen::Index>(s[0]);
      cols = static_cast<Eigen::Index>(s[1]);
    }
    if ((M::RowsAtCompileTime != Eigen::Dynamic && rows != M::RowsAtCompileTime) ||
        (M::ColsAtCompileTime != Eigen::Dynamic && cols != M::ColsAtCompileTime)) {
      throw InvalidArgument(fmt::format("cannot hold shape {} in a fixed-size Eigen type of {}x{}", shape_string(s),
                                        static_cast<int>(M::RowsAtCompileTime), static_cast<int>(M::ColsAtCompileTime)));
    }
    return {rows, cols};
  }
};

template <class M>
struct dense_traits {
  using value_type = typename M::Scalar;
  static Shape shape(const M& m) { return dense_layout<M>::shape(m); }
  static Strides strides(const M& m) { return dense_layout<M>::strides(m); }
  static const value_type* data(const M& m) { return m.data(); }
  static value_type* data(M& m) { return m.data(); }
  static M make(const Shape& s) {
    const auto [rows, cols] = dense_layout<M>::dims(s);
    M m(rows, cols);
    m.setZero();
    return m;
  }
};

/// Maps: views of memory they do not own (no make(); gather gives a ds::Tensor).
template <class M>
struct map_traits {
  using value_type = std::remove_const_t<typename M::Scalar>;
  using gathered_type = Tensor<value_type>;
  static constexpr bool is_view = true;
  static Shape shape(const M& m) { return dense_layout<M>::shape(m); }
  static Strides strides(const M& m) { return dense_layout<M>::strides(m); }
  static const value_type* data(const M& m) { return m.data(); }
  static value_type* data(M& m) { return const_cast<value_type*>(m.data()); }
  static M make(const Shape& s);  // never defined: the library does not create views
};

template <class T>
struct tensor_layout {
  static constexpr int rank = T::NumDimensions;
  static constexpr bool row_major = (static_cast<int>(T::Layout) == static_cast<int>(Eigen::RowMajor));
  static Shape shape(const T& t) {
    Shape s(static_cast<std::size_t>(rank));
    for (int d = 0; d < rank; ++d) s[static_cast<std::size_t>(d)] = static_cast<std::int64_t>(t.dimension(d));
    return s;
  }
  static Strides strides(const T& t) {
    Strides st(static_cast<std::size_t>(rank));
    std::int64_t step = 1;
    for (int k = 0; k < rank; ++k) {
      const int d = row_major ? rank - 1 - k : k;
      st[static_cast<std::size_t>(d)] = step;
      step *= t.dimension(d) > 0 ? static_cast<std::int64_t>(t.dimension(d)) : 1;
    }
    return st;
  }
};

template <class T>
struct tensor_module_traits {
  using value_type = typename T::Scalar;
  static Shape shape(const T& t) { return tensor_layout<T>::shape(t); }
  static Strides strides(const T& t) { return tensor_layout<T>::strides(t); }
  static const value_type* data(const T& t) { return t.data(); }
  static value_type* data(T& t) { return t.data(); }
  static T make(const Shape& s) {
    if (s.size() != static_cast<std::size_t>(tensor_layout<T>::rank)) {
      throw InvalidArgument(fmt::format("cannot hold shape {} in an Eigen::Tensor of rank {}", shape_string(s),
                                        tensor_layout<T>::rank));
    }
    Eigen::DSizes<Eigen::Index, tensor_layout<T>::rank> dims;
    for (int d = 0; d < tensor_layout<T>::rank; ++d) dims[d] = static_cast<Eigen::Index>(s[static_cast<std::size_t>(d)]);
    T t(dims);
    t.setZero();
    return t;
  }
};

template <class T>
struct tensor_map_traits {
  using value_type = std::remove_const_t<typename T::Scalar>;
  using gathered_type = Tensor<value_type>;
  static constexpr bool is_view = true;
  static Shape shape(const T& t) { return tensor_layout<T>::shape(t); }
  static Strides strides(const T& t) { return tensor_layout<T>::strides(t); }
  static const value_type* data(const T& t) { return t.data(); }
  static value_type* data(T& t) { return const_cast<value_type*>(t.data()); }
  static T make(const Shape& s);  // never defined: the library does not create views
};

}  // namespace adapters::eigen

template <class S, int R, int C, int O, int MR, int MC>
  requires Element<S>
struct tensor_traits<Eigen::Matrix<S, R, C, O, MR, MC>> : adapters::eigen::dense_traits<Eigen::Matrix<S, R, C, O, MR, MC>> {};

template <class S, int R, int C, int O, int MR, int MC>
  requires Element<S>
struct tensor_traits<Eigen::Array<S, R, C, O, MR, MC>> : adapters::eigen::dense_traits<Eigen::Array<S, R, C, O, MR, MC>> {};

template <class P, int MapOptions, class StrideType>
  requires Element<std::remove_const_t<typename P::Scalar>>
struct tensor_traits<Eigen::Map<P, MapOptions, StrideType>>
    : adapters::eigen::map_traits<Eigen::Map<P, MapOptions, StrideType>> {};

template <class S, int N, int O, class I>
  requires Element<S>
struct tensor_traits<Eigen::Tensor<S, N, O, I>> : adapters::eigen::tensor_module_traits<Eigen::Tensor<S, N, O, I>> {};

template <class P, int MapOptions, template <class> class MakePointer>
  requires Element<std::remove_const_t<typename P::Scalar>>
struct tensor_traits<Eigen::TensorMap<P, MapOptions, MakePointer>>
    : adapters::eigen::tensor_map_traits<Eigen::TensorMap<P, MapOptions, MakePointer>> {};

DISTRIBUTE_END_NAMESPACE

// Two value types as users bring them, for the tensor tests:
//  - DynTensor: dtype known only at run time, copies share their elements (as torch::Tensor's
//    do), strided views; described through tensor_traits' run-time form.
//  - ColMajor: a column-major float matrix (as Eigen's default), described through the
//    compile-time form with strides().
#pragma once

#include <cstddef>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <vector>

#include <distribute/core/tensor_traits.hpp>

namespace test_types {
namespace ds = distribute;

struct DynTensor {
  ds::DType dtype = ds::DType::F32;
  ds::Shape shape;
  ds::Strides strides;  // empty: row-major contiguous
  std::shared_ptr<std::vector<std::byte>> storage = std::make_shared<std::vector<std::byte>>();
  std::int64_t offset = 0;  // in elements

  template <class T>
  static DynTensor of(ds::Shape shape, std::initializer_list<T> values) {
    DynTensor t;
    t.dtype = ds::dtype_of<T>();
    t.shape = std::move(shape);
    t.storage->resize(values.size() * sizeof(T));
    std::memcpy(t.storage->data(), values.begin(), t.storage->size());
    return t;
  }

  std::byte* data() const { return storage->data() + offset * static_cast<std::int64_t>(ds::size_of(dtype)); }

  /// Element i in row-major logical order.
  template <class T>
  T get(std::size_t i) const {
    const ds::Strides st = strides.empty() ? ds::row_major_strides(shape) : strides;
    std::int64_t at = 0;
    for (std::size_t d = shape.size(); d-- > 0;) {
      at += static_cast<std::int64_t>(i % static_cast<std::size_t>(shape[d])) * st[d];
      i /= static_cast<std::size_t>(shape[d]);
    }
    T v;
    std::memcpy(&v, data() + at * static_cast<std::int64_t>(sizeof(T)), sizeof(T));
    return v;
  }

  /// A rank-2 view of the same elements with the axes swapped.
  DynTensor transposed() const {
    DynTensor t = *this;
    const ds::Strides st = strides.empty() ? ds::row_major_strides(shape) : strides;
    t.shape = {shape[1], shape[0]};
    t.strides = {st[1], st[0]};
    return t;
  }
};

struct ColMajor {
  std::int64_t rows = 0, cols = 0;
  std::vector<float> data;  // column after column

  static ColMajor from_rows(std::initializer_list<std::initializer_list<float>> rows) {
    ColMajor m;
    m.rows = static_cast<std::int64_t>(rows.size());
    m.cols = static_cast<std::int64_t>(rows.begin()->size());
    m.data.resize(static_cast<std::size_t>(m.rows * m.cols));
    std::int64_t r = 0;
    for (auto row : rows) {
      std::int64_t c = 0;
      for (float v : row) m.data[static_cast<std::size_t>(c++ * m.rows + r)] = v;
      ++r;
    }
    return m;
  }
  float at(std::int64_t r, std::int64_t c) const { return data[static_cast<std::size_t>(c * rows + r)]; }
};

}  // namespace test_types

template <>
struct distribute::tensor_traits<test_types::DynTensor> {
  static TensorView view(const test_types::DynTensor& t) { return {t.data(), t.dtype, t.shape, t.strides}; }
  static test_types::DynTensor make(DType dtype, const Shape& shape) {
    test_types::DynTensor t;
    t.dtype = dtype;
    t.shape = shape;
    t.storage->resize(static_cast<std::size_t>(num_elements(shape)) * size_of(dtype));
    return t;
  }
  static test_types::DynTensor clone(const test_types::DynTensor& t) {
    test_types::DynTensor out = make(t.dtype, t.shape);
    copy_to_contiguous(view(t), out.data());
    return out;
  }
};

template <>
struct distribute::tensor_traits<test_types::ColMajor> {
  using value_type = float;
  static Shape shape(const test_types::ColMajor& m) { return {m.rows, m.cols}; }
  static Strides strides(const test_types::ColMajor& m) { return {1, m.rows}; }
  static const float* data(const test_types::ColMajor& m) { return m.data.data(); }
  static float* data(test_types::ColMajor& m) { return m.data.data(); }
  static test_types::ColMajor make(const Shape& s) {
    if (s.size() != 2) throw InvalidArgument("ColMajor holds rank-2 values");
    test_types::ColMajor m;
    m.rows = s[0];
    m.cols = s[1];
    m.data.assign(static_cast<std::size_t>(s[0] * s[1]), 0.0f);
    return m;
  }
};

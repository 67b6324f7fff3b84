// IndexedSlices<T>: some rows of a tensor (TF's tf.IndexedSlices): `indices` into the first axis
// of a dense tensor of `dense_shape`, and `values` holding one row per index. The gradient of an
// embedding lookup is one: only the rows the lookup read, so a table of millions of rows sends and
// updates batch x width elements, not the table.
//
// Not TensorLike, on purpose: a collective or an update that took it for a dense tensor would do
// the wrong thing without a word. Its parts are: values() is a T (any host TensorLike that owns its
// elements: ds::Tensor<float>, std::vector<double>, torch::Tensor...), indices() a
// std::vector<std::int64_t>. Duplicate indices are allowed, as in TF: to_dense() adds them up,
// deduplicated() sums them into one row each.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/dtype.hpp>
#include <distribute/core/error.hpp>
#include <distribute/core/row_updates.hpp>
#include <distribute/core/shape.hpp>
#include <distribute/core/tensor_traits.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

template <class T>
class IndexedSlices {
  static_assert(TensorLike<T>, "ds::IndexedSlices<T>: T (the values' type) needs a ds::tensor_traits specialisation");
  static_assert(!is_view_v<T>, "ds::IndexedSlices<T>: T must own its elements (not a view type)");
  static_assert(memory_space_v<T> == MemorySpace::host, "ds::IndexedSlices<T>: T must live in host memory");

 public:
  using values_type = T;

  /// Rows `values` (shape [indices.size()] + dense_shape[1:], row-major) at `indices` of a dense
  /// tensor of `dense_shape` (rank >= 1). InvalidArgument naming what is wrong: an index outside
  /// [0, dense_shape[0]) (and its position), a row count that differs from the indices', a row of
  /// another shape than dense_shape[1:].
  IndexedSlices(std::vector<std::int64_t> indices, T values, Shape dense_shape)
      : indices_(std::move(indices)), values_(std::move(values)), dense_shape_(std::move(dense_shape)) {
    check();
  }

  /// The gradient of `embedding_lookup(table, ids)`: `gradient` has shape ids.shape + row shape
  /// (the rows the lookup returned), `dense_shape` is the table's. The ids are flattened, and the
  /// gradient's rows follow them (TF's gradient of tf.gather).
  template <TensorLike I>
    requires std::is_integral_v<element_t<I>>
  static IndexedSlices from_lookup(const I& ids, T gradient, Shape dense_shape) {
    const auto* id = tensor_traits<I>::data(ids);
    std::vector<std::int64_t> indices(id, id + element_count(ids));
    if (dense_shape.empty()) {
      throw InvalidArgument("IndexedSlices::from_lookup: the dense shape is a scalar; a lookup reads rows of a table of "
                            "rank >= 1");
    }
    Shape rows = shape_of(ids);
    rows.insert(rows.end(), dense_shape.begin() + 1, dense_shape.end());
    const Shape got = shape_of(gradient);
    if (got != rows) {
      throw InvalidArgument(fmt::format("IndexedSlices::from_lookup: a gradient of shape {} for ids of shape {} into a "
                                        "table of shape {}; it must have shape {}",
                                        shape_string(got), shape_string(shape_of(ids)), shape_string(dense_shape),
                                        shape_string(rows)));
    }
    Shape flat{static_cast<std::int64_t>(indices.size())};
    flat.insert(flat.end(), dense_shape.begin() + 1, dense_shape.end());
    if (flat != got) gradient = reshaped(gradient, flat);
    return IndexedSlices(std::move(indices), std::move(gradient), std::move(dense_shape));
  }

  const std::vector<std::int64_t>& indices() const noexcept { return indices_; }
  const T& values() const& noexcept { return values_; }
  T values() && noexcept { return std::move(values_); }
  const Shape& dense_shape() const noexcept { return dense_shape_; }
  DType dtype() const { return value_dtype(values_); }
  /// How many rows it holds (duplicates counted).
  std::size_t size() const noexcept { return indices_.size(); }
  /// Elements per row: the product of dense_shape[1:].
  std::size_t row_elements() const noexcept {
    std::size_t e = 1;
    for (std::size_t d = 1; d < dense_shape_.size(); ++d) e *= static_cast<std::size_t>(dense_shape_[d]);
    return e;
  }
  std::size_t row_bytes() const { return row_elements() * size_of(dtype()); }
  /// The values' elements, row after row.
  const std::byte* value_bytes() const { return static_cast<const std::byte*>(view_of(values_).data); }

  /// The dense tensor: zeros, with each row added at its index (duplicates add up).
  T to_dense() const {
    T out = make_value<T>(dtype(), dense_shape_);
    auto* dst = static_cast<std::byte*>(view_of(out).data);
    const std::size_t rb = row_bytes();
    for (std::size_t i = 0; i < indices_.size(); ++i) {
      core::combine_bytes(dtype(), core::RowOp::Add, dst + static_cast<std::size_t>(indices_[i]) * rb,
                          value_bytes() + i * rb, row_elements());
    }
    return out;
  }

  /// One row per distinct index, in the order each first appears, holding the sum of that index's
  /// rows added in order from zero (TF's deduplication before a sparse optimizer update: tf.unique
  /// then unsorted_segment_sum). Row i of the result is row indices()[i] of to_dense(), bitwise.
  IndexedSlices deduplicated() const {
    std::unordered_map<std::int64_t, std::size_t> slot;
    slot.reserve(indices_.size());
    std::vector<std::int64_t> unique;
    std::vector<std::size_t> target(indices_.size());
    for (std::size_t i = 0; i < indices_.size(); ++i) {
      auto [it, fresh] = slot.try_emplace(indices_[i], unique.size());
      if (fresh) unique.push_back(indices_[i]);
      target[i] = it->second;
    }
    Shape shape = dense_shape_;
    shape[0] = static_cast<std::int64_t>(unique.size());
    T summed = make_value<T>(dtype(), shape);
    auto* dst = static_cast<std::byte*>(view_of(summed).data);
    const std::size_t rb = row_bytes();
    for (std::size_t i = 0; i < indices_.size(); ++i) {
      core::combine_bytes(dtype(), core::RowOp::Add, dst + target[i] * rb, value_bytes() + i * rb, row_elements());
    }
    return IndexedSlices(std::move(unique), std::move(summed), dense_shape_, Checked{});
  }

  /// The same indices, values, dense shape and dtype (the values compared bitwise).
  friend bool operator==(const IndexedSlices& a, const IndexedSlices& b) {
    if (a.indices_ != b.indices_ || a.dense_shape_ != b.dense_shape_ || a.dtype() != b.dtype()) return false;
    const std::size_t n = a.indices_.size() * a.row_bytes();
    return n == 0 || std::memcmp(a.value_bytes(), b.value_bytes(), n) == 0;
  }

 private:
  struct Checked {};
  IndexedSlices(std::vector<std::int64_t> indices, T values, Shape dense_shape, Checked)
      : indices_(std::move(indices)), values_(std::move(values)), dense_shape_(std::move(dense_shape)) {}

  static T reshaped(const T& v, const Shape& shape) {
    T out = make_value<T>(value_dtype(v), shape);
    const TensorView from = view_of(v);
    if (from.bytes()) std::memcpy(view_of(out).data, from.data, from.bytes());
    return out;
  }

  void check() const {
    if (dense_shape_.empty()) {
      throw InvalidArgument("IndexedSlices: the dense shape is a scalar; slices index the first axis of a tensor of "
                            "rank >= 1");
    }
    for (auto d : dense_shape_) {
      if (d < 0) throw InvalidArgument(fmt::format("IndexedSlices: dense shape {} has a negative dimension", shape_string(dense_shape_)));
    }
    const TensorView v = view_of(values_);
    if (!v.contiguous()) {
      throw InvalidArgument(fmt::format("IndexedSlices: the values ({}) must be row-major contiguous; pass a contiguous "
                                        "copy",
                                        describe(v)));
    }
    if (v.shape.empty() || v.shape[0] != static_cast<std::int64_t>(indices_.size())) {
      throw InvalidArgument(fmt::format("IndexedSlices: {} indices but values of shape {}: there must be one row of "
                                        "values per index",
                                        indices_.size(), shape_string(v.shape)));
    }
    if (v.shape.size() != dense_shape_.size() || !std::equal(v.shape.begin() + 1, v.shape.end(), dense_shape_.begin() + 1)) {
      throw InvalidArgument(fmt::format("IndexedSlices: rows of shape {} do not fit dense shape {}; each row must have "
                                        "shape {}",
                                        shape_string(Shape(v.shape.begin() + 1, v.shape.end())), shape_string(dense_shape_),
                                        shape_string(Shape(dense_shape_.begin() + 1, dense_shape_.end()))));
    }
    for (std::size_t i = 0; i < indices_.size(); ++i) {
      if (indices_[i] < 0 || indices_[i] >= dense_shape_[0]) {
        throw InvalidArgument(fmt::format("IndexedSlices: index {} (at position {}) is out of range [0, {}) of dense "
                                          "shape {}",
                                          indices_[i], i, dense_shape_[0], shape_string(dense_shape_)));
      }
    }
  }

  std::vector<std::int64_t> indices_;
  T values_;
  Shape dense_shape_;
};

template <class T>
IndexedSlices(std::vector<std::int64_t>, T, Shape) -> IndexedSlices<T>;

/// InvalidArgument unless `slices` are rows of a variable of `shape` (rank >= 1) and `dtype`: `what`
/// names the call ("scatter_add"), `whose` the variable ("variable 'v'").
template <class T>
void check_slices_fit(const IndexedSlices<T>& slices, const Shape& shape, DType dtype, std::string_view what,
                      std::string_view whose) {
  if (slices.dtype() != dtype) {
    throw InvalidArgument(fmt::format("{}: {} rows into {} of {}", what, to_string(slices.dtype()), whose, to_string(dtype)));
  }
  const Shape& dense = slices.dense_shape();
  if (dense.size() != shape.size() || !std::equal(dense.begin() + 1, dense.end(), shape.begin() + 1)) {
    throw InvalidArgument(fmt::format("{}: rows of shape {} into {}, whose rows have shape {}", what,
                                      shape_string(Shape(dense.begin() + 1, dense.end())), whose,
                                      shape_string(Shape(shape.begin() + 1, shape.end()))));
  }
  if (dense[0] != shape[0]) {
    throw InvalidArgument(fmt::format("{}: IndexedSlices of dense shape {} into {} of shape {}", what, shape_string(dense),
                                      whose, shape_string(shape)));
  }
}

DISTRIBUTE_END_NAMESPACE

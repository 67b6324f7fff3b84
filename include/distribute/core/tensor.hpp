// Tensor<T>: a dense row-major array with a shape.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <distribute/core/dtype.hpp>
#include <distribute/core/error.hpp>
#include <distribute/core/shape.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

template <class T>
class Tensor {
  static_assert(Element<T>, "ds::Tensor<T>: T must be an element type (float, int32_t, ds::bfloat16, ...)");
  static_assert(!std::is_same_v<T, bool>, "ds::Tensor<bool> is not supported; use ds::Tensor<std::uint8_t>");

 public:
  using value_type = T;

  /// An empty rank-1 tensor of shape (0,).
  Tensor() : shape_{0} {}

  /// A tensor of `shape` holding `data` in row-major order; the sizes must agree.
  Tensor(Shape shape, std::vector<T> data) : shape_(std::move(shape)), data_(std::move(data)) {
    for (auto d : shape_) {
      if (d < 0) throw InvalidArgument(fmt::format("Tensor: negative dimension in shape {}", shape_string(shape_)));
    }
    if (num_elements(shape_) != static_cast<std::int64_t>(data_.size())) {
      throw InvalidArgument(fmt::format("Tensor: shape {} holds {} elements but {} values were given",
                                        shape_string(shape_), num_elements(shape_), data_.size()));
    }
  }

  /// A rank-1 tensor holding `values`.
  Tensor(std::initializer_list<T> values) : shape_{static_cast<std::int64_t>(values.size())}, data_(values) {}

  static Tensor zeros(Shape shape) { return full(std::move(shape), T{}); }
  static Tensor full(Shape shape, T value) {
    auto n = num_elements(shape);
    if (n < 0) throw InvalidArgument(fmt::format("Tensor: negative dimension in shape {}", shape_string(shape)));
    return Tensor(std::move(shape), std::vector<T>(static_cast<std::size_t>(n), value));
  }
  static Tensor scalar(T value) { return Tensor(Shape{}, std::vector<T>{value}); }

  const Shape& shape() const noexcept { return shape_; }
  std::size_t rank() const noexcept { return shape_.size(); }
  std::int64_t dim(std::size_t axis) const { return shape_.at(axis); }
  std::size_t size() const noexcept { return data_.size(); }
  bool empty() const noexcept { return data_.empty(); }

  T* data() noexcept { return data_.data(); }
  const T* data() const noexcept { return data_.data(); }
  const std::vector<T>& values() const& noexcept { return data_; }
  std::vector<T> values() && noexcept { return std::move(data_); }

  T* begin() noexcept { return data_.data(); }
  T* end() noexcept { return data_.data() + data_.size(); }
  const T* begin() const noexcept { return data_.data(); }
  const T* end() const noexcept { return data_.data() + data_.size(); }

  /// Flat (row-major) element access.
  T& operator[](std::size_t i) noexcept { return data_[i]; }
  const T& operator[](std::size_t i) const noexcept { return data_[i]; }

  /// Multi-index access, bounds-checked: t.at(1, 2).
  template <class... I>
    requires(std::is_integral_v<I> && ...)
  T& at(I... index) { return data_[offset({static_cast<std::int64_t>(index)...})]; }
  template <class... I>
    requires(std::is_integral_v<I> && ...)
  const T& at(I... index) const { return data_[offset({static_cast<std::int64_t>(index)...})]; }

  /// The same elements under another shape with as many elements.
  Tensor reshape(Shape shape) const& { return Tensor(std::move(shape), data_); }
  Tensor reshape(Shape shape) && { return Tensor(std::move(shape), std::move(data_)); }

  friend bool operator==(const Tensor&, const Tensor&) = default;

 private:
  std::size_t offset(std::initializer_list<std::int64_t> index) const {
    if (index.size() != shape_.size()) {
      throw InvalidArgument(fmt::format("Tensor::at: {} indices given for a tensor of rank {}", index.size(), rank()));
    }
    std::int64_t flat = 0;
    std::size_t axis = 0;
    for (auto i : index) {
      if (i < 0 || i >= shape_[axis]) {
        throw InvalidArgument(fmt::format("Tensor::at: index {} is out of range for axis {} of shape {}", i, axis,
                                          shape_string(shape_)));
      }
      flat = flat * shape_[axis] + i;
      ++axis;
    }
    return static_cast<std::size_t>(flat);
  }

  Shape shape_;
  std::vector<T> data_;
};

namespace core::detail {
// Prints nested brackets, eliding the middle of long dimensions as numpy does.
template <class T, class Out>
Out format_tensor_data(Out out, const T* data, const Shape& shape, std::size_t axis) {
  if (axis == shape.size()) {
    if constexpr (std::is_arithmetic_v<T>) return fmt::format_to(out, "{}", data[0]);
    else return fmt::format_to(out, "{}", static_cast<float>(data[0]));  // 16-bit floats
  }
  const std::int64_t n = shape[axis];
  std::int64_t stride = 1;
  for (std::size_t a = axis + 1; a < shape.size(); ++a) stride *= shape[a];
  constexpr std::int64_t edge = 3;
  out = fmt::format_to(out, "[");
  for (std::int64_t i = 0; i < n; ++i) {
    if (n > 2 * edge + 1 && i == edge) {
      out = fmt::format_to(out, "..., ");
      i = n - edge - 1;
      continue;
    }
    out = format_tensor_data(out, data + i * stride, shape, axis + 1);
    if (i + 1 < n) out = fmt::format_to(out, ", ");
  }
  return fmt::format_to(out, "]");
}
}  // namespace core::detail

DISTRIBUTE_END_NAMESPACE

// Printed by the formatter below (with shape and dtype), not as a generic range.
template <class T, class Char>
struct fmt::is_range<distribute::Tensor<T>, Char> : std::false_type {};

/// fmt::format("{}", t) → "Tensor<float32>(shape=(2, 2), [[1, 2], [3, 4]])".
template <class T>
struct fmt::formatter<distribute::Tensor<T>> {
  constexpr auto parse(format_parse_context& ctx) { return ctx.begin(); }
  template <class Ctx>
  auto format(const distribute::Tensor<T>& t, Ctx& ctx) const {
    auto out = fmt::format_to(ctx.out(), "Tensor<{}>(shape={}, ", distribute::to_string(distribute::dtype_of<T>()),
                              distribute::shape_string(t.shape()));
    if (t.size() == 0 && t.rank() > 0) {
      out = fmt::format_to(out, "[]");
    } else {
      out = distribute::core::detail::format_tensor_data(out, t.data(), t.shape(), 0);
    }
    return fmt::format_to(out, ")");
  }
};

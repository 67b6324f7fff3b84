// How elements stack into batches (Dataset::batch), how a batch splits into row ranges
// (rebatching for the replicas) and how a tensor splits into its rows (from_tensor_slices).
//
//   element                         batch of n
//   arithmetic scalar T             Tensor<T> of shape (n,)
//   Tensor<T> of shape s            Tensor<T> of shape (n, s...)   every element must have shape s
//   std::vector<T>, std::array<T,k> Tensor<T> of shape (n, k)      (arithmetic T, not bool)
//   std::pair / std::tuple          the pair / tuple of the components' batches
//   anything else U (std::string)   std::vector<U>
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/dtype.hpp>
#include <distribute/core/error.hpp>
#include <distribute/core/shape.hpp>
#include <distribute/core/tensor.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace data::detail {

template <class T>
concept NumericElement = Element<T> && !std::is_same_v<T, bool>;

// ---- stacking: n elements → one batch ------------------------------------------------------

/// Primary template: elements that are not tensors are collected into a std::vector.
template <class T>
struct batch_traits {
  using type = std::vector<T>;
  static type stack(std::vector<T>&& elements, std::string_view) { return std::move(elements); }
};

template <class T>
using batch_t = typename batch_traits<T>::type;

/// Stacks equally shaped rows (each given as shape + contiguous data) along a new axis 0.
template <class E, class Row>
Tensor<E> stack_rows(const std::vector<Row>& rows, std::string_view what, auto&& shape_of_row, auto&& data_of_row) {
  if (rows.empty()) return Tensor<E>(Shape{0}, {});
  const Shape first = shape_of_row(rows.front());
  const auto row_size = static_cast<std::size_t>(num_elements(first));
  std::vector<E> out;
  out.reserve(row_size * rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (i > 0) {
      Shape s = shape_of_row(rows[i]);
      if (s != first) {
        throw InvalidArgument(fmt::format("{}: element 0 of the batch has shape {} but element {} has shape {}; a batch "
                                          "stacks elements of one shape",
                                          what, shape_string(first), i, shape_string(s)));
      }
    }
    const E* p = data_of_row(rows[i]);
    out.insert(out.end(), p, p + row_size);
  }
  Shape shape{static_cast<std::int64_t>(rows.size())};
  shape.insert(shape.end(), first.begin(), first.end());
  return Tensor<E>(std::move(shape), std::move(out));
}

template <NumericElement T>
struct batch_traits<T> {
  using type = Tensor<T>;
  static type stack(std::vector<T>&& elements, std::string_view) {
    const auto n = static_cast<std::int64_t>(elements.size());
    return Tensor<T>(Shape{n}, std::move(elements));
  }
};

template <class E>
struct batch_traits<Tensor<E>> {
  using type = Tensor<E>;
  static type stack(std::vector<Tensor<E>>&& elements, std::string_view what) {
    return stack_rows<E>(
        elements, what, [](const Tensor<E>& t) { return t.shape(); }, [](const Tensor<E>& t) { return t.data(); });
  }
};

template <NumericElement E>
struct batch_traits<std::vector<E>> {
  using type = Tensor<E>;
  static type stack(std::vector<std::vector<E>>&& elements, std::string_view what) {
    return stack_rows<E>(
        elements, what, [](const std::vector<E>& v) { return Shape{static_cast<std::int64_t>(v.size())}; },
        [](const std::vector<E>& v) { return v.data(); });
  }
};

template <NumericElement E, std::size_t N>
struct batch_traits<std::array<E, N>> {
  using type = Tensor<E>;
  static type stack(std::vector<std::array<E, N>>&& elements, std::string_view what) {
    return stack_rows<E>(
        elements, what, [](const std::array<E, N>&) { return Shape{static_cast<std::int64_t>(N)}; },
        [](const std::array<E, N>& v) { return v.data(); });
  }
};

// Tuples and pairs batch component by component; a component's shape error names it.
template <class Tuple, class Out, std::size_t... I>
Out stack_components(std::vector<Tuple>&& elements, std::string_view what, std::index_sequence<I...>) {
  auto column = [&]<std::size_t K>(std::integral_constant<std::size_t, K>) {
    using C = std::tuple_element_t<K, Tuple>;
    std::vector<C> values;
    values.reserve(elements.size());
    for (auto& e : elements) values.push_back(std::move(std::get<K>(e)));
    return batch_traits<C>::stack(std::move(values), fmt::format("{} (component {})", what, K));
  };
  return Out(column(std::integral_constant<std::size_t, I>{})...);
}

template <class A, class B>
struct batch_traits<std::pair<A, B>> {
  using type = std::pair<batch_t<A>, batch_t<B>>;
  static type stack(std::vector<std::pair<A, B>>&& elements, std::string_view what) {
    return stack_components<std::pair<A, B>, type>(std::move(elements), what, std::index_sequence<0, 1>{});
  }
};

template <class... C>
struct batch_traits<std::tuple<C...>> {
  using type = std::tuple<batch_t<C>...>;
  static type stack(std::vector<std::tuple<C...>>&& elements, std::string_view what) {
    return stack_components<std::tuple<C...>, type>(std::move(elements), what, std::index_sequence_for<C...>{});
  }
};

// ---- slicing: a batch → rows [begin, end) of it ----------------------------------------------

/// Primary template: not a batch (no axis 0 to split along).
template <class B>
struct slice_traits {};

/// A batch: something with rows along axis 0 that can be cut into row ranges.
template <class B>
concept Sliceable = requires(const B& b, std::int64_t i) {
  { slice_traits<B>::rows(b, std::string_view{}) } -> std::same_as<std::int64_t>;
  { slice_traits<B>::slice(b, i, i) } -> std::same_as<B>;
};

template <class E>
struct slice_traits<Tensor<E>> {
  static std::int64_t rows(const Tensor<E>& t, std::string_view what) {
    if (t.rank() == 0) {
      throw InvalidArgument(fmt::format("{}: a tensor of shape () has no axis 0 to split", what));
    }
    return t.shape()[0];
  }
  static Tensor<E> slice(const Tensor<E>& t, std::int64_t begin, std::int64_t end) {
    Shape shape = t.shape();
    const std::int64_t stride = num_elements(Shape(shape.begin() + 1, shape.end()));
    shape[0] = end - begin;
    return Tensor<E>(std::move(shape), std::vector<E>(t.data() + begin * stride, t.data() + end * stride));
  }
};

template <class U>
struct slice_traits<std::vector<U>> {
  static std::int64_t rows(const std::vector<U>& v, std::string_view) { return static_cast<std::int64_t>(v.size()); }
  static std::vector<U> slice(const std::vector<U>& v, std::int64_t begin, std::int64_t end) {
    return std::vector<U>(v.begin() + begin, v.begin() + end);
  }
};

template <class Tuple, std::size_t... I>
std::int64_t common_rows(const Tuple& t, std::string_view what, std::index_sequence<I...>) {
  const std::int64_t rows[] = {slice_traits<std::tuple_element_t<I, Tuple>>::rows(std::get<I>(t), what)...};
  for (std::size_t k = 1; k < sizeof...(I); ++k) {
    if (rows[k] != rows[0]) {
      throw InvalidArgument(fmt::format("{}: component 0 has {} rows but component {} has {}; the components of an "
                                        "element must agree along axis 0",
                                        what, rows[0], k, rows[k]));
    }
  }
  return rows[0];
}

template <class A, class B>
  requires(Sliceable<A> && Sliceable<B>)
struct slice_traits<std::pair<A, B>> {
  static std::int64_t rows(const std::pair<A, B>& p, std::string_view what) {
    return common_rows(p, what, std::index_sequence<0, 1>{});
  }
  static std::pair<A, B> slice(const std::pair<A, B>& p, std::int64_t begin, std::int64_t end) {
    return {slice_traits<A>::slice(p.first, begin, end), slice_traits<B>::slice(p.second, begin, end)};
  }
};

template <class... C>
  requires(Sliceable<C> && ...)
struct slice_traits<std::tuple<C...>> {
  static std::int64_t rows(const std::tuple<C...>& t, std::string_view what) {
    return common_rows(t, what, std::index_sequence_for<C...>{});
  }
  static std::tuple<C...> slice(const std::tuple<C...>& t, std::int64_t begin, std::int64_t end) {
    return std::apply([&](const auto&... c) { return std::tuple<C...>(slice_traits<C>::slice(c, begin, end)...); }, t);
  }
};

/// A batch with no rows and the same inner shape as `b` (what a replica without data gets).
template <Sliceable B>
B empty_like(const B& b) {
  return slice_traits<B>::slice(b, 0, 0);
}

// ---- unstacking: a tensor → its rows (from_tensor_slices) ------------------------------------

template <class C>
struct unstack_traits {};

template <class E>
struct unstack_traits<Tensor<E>> {
  using element_type = Tensor<E>;
  static element_type row(const Tensor<E>& t, std::int64_t i) {
    Shape rest(t.shape().begin() + 1, t.shape().end());
    const std::int64_t stride = num_elements(rest);
    return Tensor<E>(std::move(rest), std::vector<E>(t.data() + i * stride, t.data() + (i + 1) * stride));
  }
};

template <class U>
struct unstack_traits<std::vector<U>> {
  using element_type = U;
  static element_type row(const std::vector<U>& v, std::int64_t i) { return v[static_cast<std::size_t>(i)]; }
};

template <class A, class B>
struct unstack_traits<std::pair<A, B>> {
  using element_type = std::pair<typename unstack_traits<A>::element_type, typename unstack_traits<B>::element_type>;
  static element_type row(const std::pair<A, B>& p, std::int64_t i) {
    return {unstack_traits<A>::row(p.first, i), unstack_traits<B>::row(p.second, i)};
  }
};

template <class... C>
struct unstack_traits<std::tuple<C...>> {
  using element_type = std::tuple<typename unstack_traits<C>::element_type...>;
  static element_type row(const std::tuple<C...>& t, std::int64_t i) {
    return std::apply([&](const auto&... c) { return element_type(unstack_traits<C>::row(c, i)...); }, t);
  }
};

}  // namespace data::detail
DISTRIBUTE_END_NAMESPACE

// distribute 0.1.0: <distribute/adapters/xtensor.hpp> for the single-header edition.
// SPDX-License-Identifier: Apache-2.0
//
// GENERATED FILE, DO NOT EDIT. It is produced from include/distribute/ by
//   python3 tools/amalgamate.py
// Edit the headers under include/ and regenerate.
// xtensor containers as values the library reduces, gathers and holds in variables:
// xt::xarray<T, L> and xt::xtensor<T, N, L> (any element type ds::Element accepts), row-major,
// column-major or dynamic layout.
//
//   xt::xtensor<float, 2> g = ...;
//   g = ctx.all_reduce(ds::ReduceOp::Mean, std::move(g));
//   ds::Tensor<float> all = strategy.gather(per_replica, 0);   // gathers give ds::Tensor<T>
//
// The library reads xtensor's own strides, so a column-major array goes through every collective
// in its logical (row-major) element order and is written back in its own layout.
//
// Needs <xtensor/xarray.hpp> and <xtensor/xtensor.hpp> (Debian: libxtensor-dev); not included
// by <distribute/distribute.hpp>.
#pragma once

#include <xtensor/xarray.hpp>
#include <xtensor/xtensor.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <fmt/format.h>

#include <distribute/distribute.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace adapters::detail {

/// What both container kinds share: shape and strides come from the container itself.
template <class C>
struct xtensor_container_traits {
  using value_type = typename C::value_type;

  static Shape shape(const C& c) {
    Shape out(c.shape().size());
    std::transform(c.shape().begin(), c.shape().end(), out.begin(), [](auto d) { return static_cast<std::int64_t>(d); });
    return out;
  }
  // xtensor reports 0 for axes of size 1, which a TensorView accepts (any stride there).
  static Strides strides(const C& c) {
    Strides out(c.strides().size());
    std::transform(c.strides().begin(), c.strides().end(), out.begin(), [](auto s) { return static_cast<std::int64_t>(s); });
    return out;
  }
  static const value_type* data(const C& c) { return c.data() + c.data_offset(); }
  static value_type* data(C& c) { return c.data() + c.data_offset(); }

  /// A zeroed container in the layout its type names (row-major where that is dynamic).
  static C make(const Shape& s) {
    typename C::shape_type shape;
    xt::resize_container(shape, s.size());
    for (std::size_t d = 0; d < s.size(); ++d) {
      if (s[d] < 0) throw InvalidArgument(fmt::format("xtensor: negative dimension in shape {}", shape_string(s)));
      shape[d] = static_cast<typename C::shape_type::value_type>(s[d]);
    }
    constexpr xt::layout_type layout =
        C::static_layout == xt::layout_type::dynamic ? xt::layout_type::row_major : C::static_layout;
    return C(shape, value_type{}, layout);
  }
};

}  // namespace adapters::detail

template <class EC, xt::layout_type L, class SC>
  requires Element<typename EC::value_type>
struct tensor_traits<xt::xarray_container<EC, L, SC, xt::xtensor_expression_tag>>
    : adapters::detail::xtensor_container_traits<xt::xarray_container<EC, L, SC, xt::xtensor_expression_tag>> {};

template <class EC, std::size_t N, xt::layout_type L>
  requires Element<typename EC::value_type>
struct tensor_traits<xt::xtensor_container<EC, N, L, xt::xtensor_expression_tag>>
    : adapters::detail::xtensor_container_traits<xt::xtensor_container<EC, N, L, xt::xtensor_expression_tag>> {
  using container = xt::xtensor_container<EC, N, L, xt::xtensor_expression_tag>;
  static container make(const Shape& s) {
    if (s.size() != N) {
      throw InvalidArgument(fmt::format("cannot hold shape {} (rank {}) in an xt::xtensor of rank {}; use xt::xarray "
                                        "or ds::Tensor",
                                        shape_string(s), s.size(), N));
    }
    return adapters::detail::xtensor_container_traits<container>::make(s);
  }
};

DISTRIBUTE_END_NAMESPACE

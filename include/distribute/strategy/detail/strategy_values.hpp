// What a synchronous strategy's methods take: how a value is told apart (made by a strategy, a
// variable's copies, a plain value), unwrapped for one replica and checked against the replica
// count, and the types run() and reduce() derive from it.
#pragma once

#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

#include <fmt/format.h>

#include <distribute/core/error.hpp>
#include <distribute/core/tensor_traits.hpp>
#include <distribute/core/values.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

namespace strategy::detail {

template <class R>
struct run_result {
  template <class S>
  using type = PerReplica<R, S>;
};

// Components of a PerReplica argument for replica i, a Mirrored's local copy, anything else as is.
template <class S, class A>
decltype(auto) unwrap_for_replica(A& arg, std::size_t i) {
  using D = std::remove_cvref_t<A>;
  if constexpr (core::is_per_replica<D>::value || core::is_mirrored<D>::value) {
    static_assert(std::is_same_v<typename D::strategy_type, S>,
                  "a distributed value made by one strategy type was passed to a strategy of another type; "
                  "values are tied to the strategy type that produced them");
    return arg[i];
  } else {
    return static_cast<const D&>(arg);
  }
}

template <class S, class A>
void check_arity(const A& arg, std::size_t replicas, std::size_t position) {
  using D = std::remove_cvref_t<A>;
  if constexpr (core::is_per_replica<D>::value || core::is_mirrored<D>::value) {
    if (arg.size() != replicas) {
      throw InvalidArgument(fmt::format("run: argument {} has {} components but the strategy has {} local replicas",
                                        position, arg.size(), replicas));
    }
  }
}

/// A value a strategy made (PerReplica, Mirrored, Sharded): it names the strategy's type.
template <class V>
concept made_by_a_strategy = requires { typename V::strategy_type; };
/// A variable, read through its local copies.
template <class V>
concept variable_copies = !made_by_a_strategy<V> && requires(const V& v) { v.values(); v.read_value(); };
/// A value with a component per local replica: made by a strategy, or a variable's copies.
template <class V>
concept replica_components = made_by_a_strategy<V> || variable_copies<V>;
/// Not a value another strategy type made (values are tied to the strategy type that made them).
template <class V, class S>
concept not_of_another_strategy = !made_by_a_strategy<V> || std::is_same_v<typename V::strategy_type, S>;

/// A distributed value of strategy S (PerReplica, Mirrored, a variable's copies) whose
/// components live in host memory: batch_reduce_to can pack it with others.
template <class V, class S>
concept packable_distributed_value =
    replica_components<V> && not_of_another_strategy<V, S> &&
    requires(const V& v) {
      requires TensorLike<std::remove_cvref_t<decltype(v.values().front())>>;
      requires memory_space_v<std::remove_cvref_t<decltype(v.values().front())>> == MemorySpace::host;
    };

/// The type of a value's components: the element of a distributed value or variable, else V.
template <class V>
struct component_of {
  using type = V;
};
template <class V>
  requires requires(const V& v) { v.values().front(); }
struct component_of<V> {
  using type = std::remove_cvref_t<decltype(std::declval<const V&>().values().front())>;
};

template <class T>
struct is_tuple : std::false_type {};
template <class... T>
struct is_tuple<std::tuple<T...>> : std::true_type {};

}  // namespace strategy::detail

DISTRIBUTE_END_NAMESPACE

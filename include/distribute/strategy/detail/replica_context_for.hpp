// ReplicaContextFor<S>: the replica context `run` of strategy S hands to a step function, with
// merge_call (values merged across the replicas as PerReplica<T, S>).
#pragma once

#include <cstddef>
#include <exception>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <distribute/collective/validate.hpp>
#include <distribute/core/context.hpp>
#include <distribute/core/values.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

/// The replica context `run` hands to a step function of strategy S. Adds merge_call, whose
/// merged values are PerReplica<T, S> that S's reduce/update accept.
template <class S>
class ReplicaContextFor : public ReplicaContext {
 public:
  /// `strategy` is S's AnyStrategy base: S makes its contexts while its own constructor runs, and
  /// a reference to S itself may not be formed before S is constructed. Used as S afterwards.
  ReplicaContextFor(AnyStrategy& strategy, core::ReplicaGroup& group, core::ReplicaCollectives& collectives,
                    int local_id, int global_id, std::string device)
      : ReplicaContext(strategy, group, collectives, local_id, global_id, std::move(device)) {}

  S& strategy() const noexcept { return static_cast<S&>(ReplicaContext::strategy()); }

  /// Runs fn once, in cross-replica context, with each argument merged across the replicas
  /// into a PerReplica; fn may take the strategy first. Every replica receives fn's result.
  template <class F, class... A>
  auto merge_call(F&& fn, A&&... args) {
    using Args = std::tuple<std::decay_t<A>...>;
    constexpr bool takes_strategy = std::is_invocable_v<F&, S&, PerReplica<std::decay_t<A>, S>...>;
    using R = typename std::conditional_t<takes_strategy,
                                          std::invoke_result<F&, S&, PerReplica<std::decay_t<A>, S>...>,
                                          std::invoke_result<F&, PerReplica<std::decay_t<A>, S>...>>::type;
    using Stored = std::conditional_t<std::is_void_v<R>, bool, std::decay_t<R>>;
    struct Outcome {
      std::optional<Stored> value;
      std::exception_ptr error;
    };
    drain_async();
    Args mine(std::forward<A>(args)...);
    Outcome outcome;
    auto& g = group();
    core::CollectiveCall call{core::CollectiveKind::MergeCall};
    call.merge_type = &typeid(Args);
    call.merge_args = &mine;
    call.merge_outcome = &outcome;
    // Replica 0 runs fn while the others wait in the exchange; its outcome is read after it.
    collective::exchange(g, local_replica_id(), call, [&] {
      if (local_replica_id() != 0) return;
      try {
        core::ReplicaContextSwitch cross_replica(nullptr);
        ScopeGuard in_scope(strategy());
        auto merged = merge_args<Args>(std::index_sequence_for<A...>{});
        auto invoke = [&](auto&&... m) -> decltype(auto) {
          if constexpr (takes_strategy) return fn(strategy(), std::move(m)...);
          else return fn(std::move(m)...);
        };
        if constexpr (std::is_void_v<R>) {
          std::apply(invoke, std::move(merged));
          outcome.value.emplace(true);
        } else {
          outcome.value.emplace(std::apply(invoke, std::move(merged)));
        }
      } catch (...) {
        outcome.error = std::current_exception();
      }
    });
    const Outcome& root = *static_cast<const Outcome*>(g.slot(0).merge_outcome);
    std::exception_ptr error = root.error;
    std::optional<Stored> result;
    if (!error) result = root.value;
    g.arrive_and_wait(local_replica_id(), call.kind);  // replica 0's outcome stays alive until read
    if (error) std::rethrow_exception(error);
    if constexpr (!std::is_void_v<R>) return std::move(*result);
  }

 private:
  template <class Args, std::size_t... I>
  auto merge_args(std::index_sequence<I...>) {
    auto& g = group();
    auto component = [&]<std::size_t K>(std::integral_constant<std::size_t, K>) {
      using T = std::tuple_element_t<K, Args>;
      std::vector<T> values;
      values.reserve(static_cast<std::size_t>(g.size()));
      for (int r = 0; r < g.size(); ++r) values.push_back(std::get<K>(*static_cast<Args*>(g.slot(r).merge_args)));
      return PerReplica<T, S>(std::move(values));
    };
    return std::make_tuple(component(std::integral_constant<std::size_t, I>{})...);
  }
};

DISTRIBUTE_END_NAMESPACE

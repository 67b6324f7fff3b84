// StrategyExtended<S>: strategy.extended(), the lower-level members of a strategy (TF's
// StrategyExtended). Included by sync_strategy.hpp after SyncStrategy, whose privates it reads.
#pragma once

#include <cstddef>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/error.hpp>
#include <distribute/strategy/detail/sync_strategy.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

/// strategy.extended(): the lower-level members of a strategy, as TF's StrategyExtended.
template <class S>
class StrategyExtended {
 public:
  explicit StrategyExtended(S& strategy) noexcept : strategy_(&strategy) {}

  std::vector<std::string> worker_devices() const { return strategy_->worker_devices(); }

  /// True if `var` was created in this strategy's scope.
  template <class T>
  bool variable_created_in_scope(const Variable<T>& var) const noexcept {
    return var.is_distributed() && var.strategy_id() == strategy_->id();
  }

  /// Applies fn(copy, args...) to each copy of `var` in cross-replica context (with PerReplica /
  /// Mirrored arguments unwrapped per copy), or to the local copy in replica context.
  template <class T, class F, class... A>
  void update(Variable<T>& var, F&& fn, A&&... args) {
    if (var.is_distributed() && var.strategy_id() != strategy_->id()) {
      throw InvalidArgument(fmt::format("extended().update: variable '{}' was not created in this {}'s scope",
                                        var.name(), strategy_->name()));
    }
    var.apply_to_copies([&](T& copy, [[maybe_unused]] int i) {
      fn(copy, strategy::detail::unwrap_for_replica<S>(args, static_cast<std::size_t>(i))...);
    });
  }

  /// Variables created while the returned guard lives are placed with `var`. Every replica holds
  /// every variable in these strategies, so this only checks `var` belongs here.
  template <class T>
  [[nodiscard]] ScopeGuard colocate_vars_with(const Variable<T>& var) {
    if (var.is_distributed() && var.strategy_id() != strategy_->id()) {
      throw InvalidArgument(fmt::format("colocate_vars_with: variable '{}' was not created in this {}'s scope",
                                        var.name(), strategy_->name()));
    }
    return ScopeGuard(*strategy_);
  }

  /// ReplicaContext::all_reduce_async of the calling replica of this strategy: inside a step
  /// function only (in cross-replica context, batch_reduce_to reduces distributed values).
  template <class... U>
    requires(sizeof...(U) > 0)
  auto all_reduce_async(ReduceOpArg op, U&&... values) {
    ReplicaContext* ctx = core::thread_context().replica;
    if (ctx == nullptr || ctx->strategy().id() != strategy_->id()) {
      throw InvalidArgument(fmt::format("extended().all_reduce_async: call it inside a step function of this {} "
                                        "(replica context); in cross-replica context batch_reduce_to reduces "
                                        "distributed values",
                                        strategy_->name()));
    }
    return ctx->all_reduce_async(op, std::forward<U>(values)...);
  }

  /// Reduces several distributed values in one call; returns a tuple of the results. Across
  /// workers, values in host memory travel in packs (CommunicationOptions::bytes_per_pack, the
  /// rule of collective/packing.hpp): one cross-worker collective per pack, not per value.
  template <class... V>
  auto batch_reduce_to(ReduceOpArg op, const V&... values) {
    if constexpr (sizeof...(V) > 1 && (strategy::detail::packable_distributed_value<V, S> && ...)) {
      if (strategy_->link_) return strategy::detail::reduce_in_packs(strategy_->site(), op.op, values...);
    }
    return std::make_tuple(strategy_->reduce(op, values)...);
  }

 private:
  S* strategy_;
};

DISTRIBUTE_END_NAMESPACE

// The default strategy (what get_strategy() returns outside any scope) and the free context
// functions: get_strategy, has_strategy, get_replica_context, in_cross_replica_context.
#pragma once

#include <string_view>

#include <distribute/backends/host/host.hpp>
#include <distribute/collective/shared_memory.hpp>
#include <distribute/core/context.hpp>
#include <distribute/strategy/detail/sync_strategy.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

/// One replica on the calling thread; variables created under it are plain.
class DefaultStrategy : public SyncStrategy<DefaultStrategy, host, SharedMemoryAllReduce> {
  using Base = SyncStrategy<DefaultStrategy, host, SharedMemoryAllReduce>;

 public:
  DefaultStrategy() : Base(host::devices(1, "DefaultStrategy")) {}
  std::string_view name() const noexcept override { return "DefaultStrategy"; }
  core::VariablePlacement variable_placement() const override {
    return {core::PlacementKind::Plain, {}, 1, 0};
  }
  /// TF's default replica context: replica 0 of 1, in effect outside any scope.
  ReplicaContext& default_replica_context() noexcept { return replica_context(0); }
};

/// The process-wide default strategy.
inline DefaultStrategy& default_strategy() {
  static DefaultStrategy strategy;
  return strategy;
}

/// The strategy current on this thread: the innermost scope's, the one running this replica, or
/// the default strategy.
inline AnyStrategy& get_strategy() {
  if (AnyStrategy* s = core::current_strategy_or_null()) return *s;
  return default_strategy();
}

/// True inside a (non-default) strategy's scope or step function.
inline bool has_strategy() {
  AnyStrategy* s = core::current_strategy_or_null();
  return s != nullptr && s != static_cast<AnyStrategy*>(&default_strategy());
}

/// The replica context in a step function; null in cross-replica context (inside a scope,
/// outside run); the default replica context outside any scope.
inline ReplicaContext* get_replica_context() {
  auto& tc = core::thread_context();
  if (tc.replica) return tc.replica;
  if (!tc.scopes.empty()) return nullptr;
  return &default_strategy().default_replica_context();
}

/// True inside a scope but outside any step function (or inside merge_call's function).
inline bool in_cross_replica_context() {
  auto& tc = core::thread_context();
  return tc.replica == nullptr && !tc.scopes.empty();
}

DISTRIBUTE_END_NAMESPACE

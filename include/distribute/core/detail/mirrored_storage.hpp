// ON_WRITE copies, one per local replica, kept identical by updates: in replica context an update
// with SUM or MEAN aggregation is all-reduced and applied by every replica to its own copy,
// ONLY_FIRST_REPLICA applies replica 0's value, and NONE changes the local copy only (the caller
// keeps the copies identical, e.g. by all-reducing first), as in TF 2.
#pragma once

#include <cstddef>
#include <string>
#include <utility>

#include <distribute/core/context.hpp>
#include <distribute/core/detail/placed_storage.hpp>
#include <distribute/core/detail/variable_copies.hpp>
#include <distribute/core/detail/variable_storage.hpp>
#include <distribute/core/reduce_op.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace core::detail {

template <class T>
class MirroredStorage final : public LocalCopies<T> {
 public:
  MirroredStorage(VariableSpec spec, const VariablePlacement& placement, std::string strategy_name, T& initial_value)
      : LocalCopies<T>(std::move(spec), placement, std::move(strategy_name), initial_value, placement.devices.size()) {}

 protected:
  std::size_t copy_of(const ReplicaContext& ctx) const override {
    return static_cast<std::size_t>(ctx.local_replica_id());
  }

  void update_in_replica(ReplicaContext& ctx, VariableUpdate kind, const T& value) override {
    T& local = this->mutable_copies()[copy_of(ctx)];
    switch (this->spec().aggregation) {
      case VariableAggregation::None: apply_update(kind, local, value); break;
      case VariableAggregation::Sum: apply_update(kind, local, ctx.all_reduce(ReduceOp::Sum, value)); break;
      case VariableAggregation::Mean: apply_update(kind, local, ctx.all_reduce(ReduceOp::Mean, value)); break;
      case VariableAggregation::OnlyFirstReplica: apply_update(kind, local, ctx.broadcast(value, 0)); break;
    }
  }
};

}  // namespace core::detail
DISTRIBUTE_END_NAMESPACE

// One copy that every replica computes with (on the host, or on the only compute device). In
// replica context the replicas' updates are aggregated and applied once, on replica 0, while the
// others wait; with NONE or ONLY_FIRST_REPLICA the replicas' values are identical by contract
// (e.g. all-reduced gradients), so replica 0's is applied.
#pragma once

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
class CentralStorage final : public LocalCopies<T> {
 public:
  CentralStorage(VariableSpec spec, const VariablePlacement& placement, std::string strategy_name, T& initial_value)
      : LocalCopies<T>(std::move(spec), placement, std::move(strategy_name), initial_value, 1) {}

 protected:
  void update_in_replica(ReplicaContext& ctx, VariableUpdate kind, const T& value) override {
    T& copy = this->mutable_copies().front();
    switch (this->spec().aggregation) {
      case VariableAggregation::Sum: {
        T sum = ctx.all_reduce(ReduceOp::Sum, value);
        ctx.run_once([&] { apply_update(kind, copy, sum); });
        return;
      }
      case VariableAggregation::Mean: {
        T mean = ctx.all_reduce(ReduceOp::Mean, value);
        ctx.run_once([&] { apply_update(kind, copy, mean); });
        return;
      }
      case VariableAggregation::None:
      case VariableAggregation::OnlyFirstReplica:
        ctx.run_once([&] { apply_update(kind, copy, value); });
        return;
    }
  }
};

}  // namespace core::detail
DISTRIBUTE_END_NAMESPACE

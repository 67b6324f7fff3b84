// ON_READ copies, one per local replica (metrics, batch-norm statistics): each replica updates its
// own copy with no communication; a cross-replica read aggregates the copies (and, with a link,
// the other workers'), and a cross-replica update reaches every copy.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/context.hpp>
#include <distribute/core/detail/placed_storage.hpp>
#include <distribute/core/reduce_components.hpp>
#include <distribute/core/detail/variable_copies.hpp>
#include <distribute/core/detail/variable_storage.hpp>
#include <distribute/core/error.hpp>
#include <distribute/core/reduce_op.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace core::detail {

template <class T>
class SyncOnReadStorage final : public LocalCopies<T> {
 public:
  SyncOnReadStorage(VariableSpec spec, const VariablePlacement& placement, std::string strategy_name, T& initial_value)
      : LocalCopies<T>(std::move(spec), placement, std::move(strategy_name), initial_value, placement.devices.size()) {}

 protected:
  std::size_t copy_of(const ReplicaContext& ctx) const override {
    return static_cast<std::size_t>(ctx.local_replica_id());
  }

  void update_in_replica(ReplicaContext& ctx, VariableUpdate kind, const T& value) override {
    apply_update(kind, this->mutable_copies()[copy_of(ctx)], value);
  }

  void update_cross_replica(VariableUpdate kind, const T& value) override {
    if (this->spec().aggregation != VariableAggregation::Sum) {
      LocalCopies<T>::update_cross_replica(kind, value);
      return;
    }
    if (kind != VariableUpdate::Assign) {
      throw InvalidArgument(fmt::format("variable '{}': {} of a sync-on-read variable with SUM aggregation is not "
                                        "supported in cross-replica context; use assign",
                                        this->spec().name, update_name(kind)));
    }
    // Each copy holds value / N so that the cross-replica sum reads back `value`.
    const T share = share_of(value, this->placement().num_replicas_in_sync);
    for (auto& c : this->mutable_copies()) apply_update(kind, c, share);
  }

  T read_cross_replica() const override {
    const auto& copies = this->copies();
    switch (this->spec().aggregation) {
      case VariableAggregation::OnlyFirstReplica: return clone_value(copies.front());
      case VariableAggregation::None:
        throw InvalidArgument(fmt::format("variable '{}': a cross-replica read of a sync-on-read variable needs an "
                                          "aggregation (SUM, MEAN or ONLY_FIRST_REPLICA), not NONE",
                                          this->spec().name));
      case VariableAggregation::Sum:
      case VariableAggregation::Mean: {
        std::vector<const T*> parts;
        parts.reserve(copies.size());
        for (const T& c : copies) parts.push_back(&c);
        const auto op = this->spec().aggregation == VariableAggregation::Mean ? ReduceOp::Mean : ReduceOp::Sum;
        return reduce_components(op, parts, this->placement().link);  // Mean: by every replica in sync
      }
    }
    return clone_value(copies.front());
  }
};

}  // namespace core::detail
DISTRIBUTE_END_NAMESPACE

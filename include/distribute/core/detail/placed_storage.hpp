// What the storages of strategy-placed variables share: the placement the strategy chose, the
// check that a replica using the variable belongs to that strategy, and, for the storages whose
// copies live in this process, the split between replica context (this replica's copy) and
// cross-replica context (every copy).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/context.hpp>
#include <distribute/core/detail/variable_copies.hpp>
#include <distribute/core/detail/variable_storage.hpp>
#include <distribute/core/error.hpp>
#include <distribute/core/tensor_traits.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace core::detail {

template <class T>
class PlacedStorage : public VariableStorage<T> {
 public:
  /// `strategy_name`: the placing strategy's, for messages.
  PlacedStorage(VariableSpec spec, VariablePlacement placement, std::string strategy_name)
      : VariableStorage<T>(std::move(spec)), placement_(std::move(placement)), strategy_name_(std::move(strategy_name)) {}

  const std::vector<std::string>& devices() const noexcept override { return placement_.devices; }
  std::uint64_t strategy_id() const noexcept override { return placement_.strategy_id; }
  const std::string& device() const override {
    const ReplicaContext* ctx = replica();
    return placement_.devices[ctx ? copy_of(*ctx) : 0];
  }

 protected:
  const VariablePlacement& placement() const noexcept { return placement_; }

  /// This thread's replica context, or nullptr in cross-replica context. A replica of another
  /// strategy is InvalidArgument: its replica ids do not index this variable's copies.
  ReplicaContext* replica() const {
    ReplicaContext* ctx = thread_context().replica;
    if (ctx && ctx->strategy().id() != placement_.strategy_id) {
      throw InvalidArgument(fmt::format("variable '{}' belongs to {} (strategy #{}) but is used in a replica of {} "
                                        "(strategy #{})",
                                        this->spec().name, strategy_name_, placement_.strategy_id,
                                        ctx->strategy().name(), ctx->strategy().id()));
    }
    return ctx;
  }

  /// The copy a replica uses: the only one unless the storage keeps one per replica.
  virtual std::size_t copy_of(const ReplicaContext&) const { return 0; }

 private:
  VariablePlacement placement_;
  std::string strategy_name_;
};

/// Copies held in this process (one per local replica, or one that the replicas share). A replica
/// reads and changes its copy; cross-replica context reads the primary copy and updates every
/// copy, unless the placement says otherwise.
template <class T>
class LocalCopies : public PlacedStorage<T> {
 public:
  LocalCopies(VariableSpec spec, VariablePlacement placement, std::string strategy_name, T& initial_value,
              std::size_t count)
      : PlacedStorage<T>(std::move(spec), std::move(placement), std::move(strategy_name)),
        copies_(make_copies(initial_value, count, this->placement().devices, this->placement().link)) {}

  const std::vector<T>& copies() const noexcept final { return copies_; }

  T read() const final {
    if (const ReplicaContext* ctx = this->replica()) return clone_value(copies_[this->copy_of(*ctx)]);
    return read_cross_replica();
  }

  void apply_to_copies(CopyVisitor<T> fn) final {
    if (const ReplicaContext* ctx = this->replica()) {
      const std::size_t c = this->copy_of(*ctx);
      fn(copies_[c], static_cast<int>(c));
      return;
    }
    for (std::size_t c = 0; c < copies_.size(); ++c) fn(copies_[c], static_cast<int>(c));
  }

  // As TF: no row updates of sync-on-read variables; in replica context only with NONE
  // aggregation, where each replica updates its own copy (all-reduce the rows first to keep the
  // copies equal), or replica 0 the one copy that all replicas share.
  void scatter(RowOp op, std::span<const std::int64_t> rows, std::span<const std::byte> values) final {
    const std::string_view what = scatter_name(op);
    if (this->spec().synchronization == VariableSynchronization::OnRead) {
      throw InvalidArgument(fmt::format("{}: variable '{}' is ON_READ (sync-on-read), whose copies are aggregated when "
                                        "read; TF supports no scatter on those either",
                                        what, this->spec().name));
    }
    ReplicaContext* ctx = this->replica();
    if (!ctx) {
      for (auto& c : copies_) scatter_into(c, op, rows, values);
      return;
    }
    if (this->spec().aggregation != VariableAggregation::None) {
      throw InvalidArgument(fmt::format("{}: variable '{}' has {} aggregation; in replica context a scatter is only "
                                        "supported with NONE aggregation, as in TF (all-reduce the IndexedSlices first, "
                                        "or update in cross-replica context)",
                                        what, this->spec().name, to_string(this->spec().aggregation)));
    }
    if (copies_.size() == 1 && ctx->strategy().num_local_replicas() > 1) {
      ctx->run_once([&] { scatter_into(copies_.front(), op, rows, values); });  // replica 0's rows, once
      return;
    }
    scatter_into(copies_[this->copy_of(*ctx)], op, rows, values);
  }

  void gather(std::span<const std::int64_t> rows, std::span<std::byte> out) const final {
    if (this->spec().synchronization == VariableSynchronization::OnRead) return gather_from(read(), rows, out);
    const ReplicaContext* ctx = this->replica();
    gather_from(copies_[ctx ? this->copy_of(*ctx) : 0], rows, out);
  }

 protected:
  void update_checked(VariableUpdate kind, const T& value) final {
    if (ReplicaContext* ctx = this->replica()) {
      update_in_replica(*ctx, kind, value);
    } else {
      update_cross_replica(kind, value);
    }
  }

  virtual T read_cross_replica() const { return clone_value(copies_.front()); }
  virtual void update_in_replica(ReplicaContext& ctx, VariableUpdate kind, const T& value) = 0;
  virtual void update_cross_replica(VariableUpdate kind, const T& value) {
    for (auto& c : copies_) apply_update(kind, c, value);
  }

  std::vector<T>& mutable_copies() noexcept { return copies_; }

 private:
  std::vector<T> copies_;
};

}  // namespace core::detail
DISTRIBUTE_END_NAMESPACE

// Variable<T>: state that a strategy places when it is created in the strategy's scope.
//
// A Variable is a handle: copies share the same state, as Python references to a tf.Variable do.
// Placement happens once, at construction, from the scope current on this thread:
//   outside any scope         plain: one copy, safe to use from any thread
//   Mirrored/OneDevice scope  one copy per local replica (ON_WRITE: kept identical by updates;
//                             ON_READ: each replica updates its own copy, cross-replica reads aggregate)
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/context.hpp>
#include <distribute/core/detail/elementwise.hpp>
#include <distribute/core/detail/host_operands.hpp>
#include <distribute/core/detail/reduce_components.hpp>
#include <distribute/core/device.hpp>
#include <distribute/core/error.hpp>
#include <distribute/core/memory_space.hpp>
#include <distribute/core/tensor_traits.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

enum class VariableSynchronization { Auto, OnWrite, OnRead, None };
enum class VariableAggregation { None, Sum, Mean, OnlyFirstReplica };

constexpr std::string_view to_string(VariableSynchronization s) noexcept {
  switch (s) {
    case VariableSynchronization::Auto: return "AUTO";
    case VariableSynchronization::OnWrite: return "ON_WRITE";
    case VariableSynchronization::OnRead: return "ON_READ";
    case VariableSynchronization::None: return "NONE";
  }
  return "?";
}
constexpr std::string_view to_string(VariableAggregation a) noexcept {
  switch (a) {
    case VariableAggregation::None: return "NONE";
    case VariableAggregation::Sum: return "SUM";
    case VariableAggregation::Mean: return "MEAN";
    case VariableAggregation::OnlyFirstReplica: return "ONLY_FIRST_REPLICA";
  }
  return "?";
}

struct VariableOptions {
  std::string name = "Variable";
  /// Unset means TF's default: true, except for ON_READ variables (false).
  std::optional<bool> trainable = std::nullopt;
  VariableSynchronization synchronization = VariableSynchronization::Auto;
  VariableAggregation aggregation = VariableAggregation::None;
};

template <class T>
class Variable {
  static_assert(TensorLike<T>, "ds::Variable<T>: T needs a ds::tensor_traits specialisation (see TensorLike)");

 public:
  using value_type = T;

  /// Creates the variable; inside a strategy's scope the strategy places it.
  explicit Variable(T initial_value, VariableOptions options = {}) : state_(std::make_shared<State>()) {
    auto& s = *state_;
    s.name = std::move(options.name);
    s.aggregation = options.aggregation;
    s.synchronization = options.synchronization == VariableSynchronization::Auto ? VariableSynchronization::OnWrite
                                                                                : options.synchronization;
    s.trainable = options.trainable.value_or(s.synchronization != VariableSynchronization::OnRead);
    if (s.aggregation == VariableAggregation::Mean && !is_floating(value_dtype(initial_value))) {
      throw InvalidArgument(fmt::format("variable '{}': MEAN aggregation needs a floating-point variable, not {}", s.name,
                                        to_string(value_dtype(initial_value))));
    }
    if (s.synchronization == VariableSynchronization::OnRead && options.trainable.value_or(false)) {
      throw InvalidArgument(fmt::format(
          "variable '{}': synchronization ON_READ is only for non-trainable variables, but trainable=true was given",
          s.name));
    }
    AnyStrategy* strategy = detail::current_strategy_or_null();
    if (strategy) {
      if (detail::thread_context().replica && strategy->num_local_replicas() > 1) {
        throw InvalidArgument(fmt::format(
            "variable '{}' created inside a step function of {}: create variables in cross-replica context "
            "(inside scope(), outside run())",
            s.name, strategy->name()));
      }
      s.placement = strategy->variable_placement();
      s.strategy_name = std::string(strategy->name());
      if (s.placement.kind == detail::PlacementKind::CentralStorage &&
          s.synchronization == VariableSynchronization::OnRead) {
        // Sync-on-read state (metrics, batch-norm statistics) stays per replica, as in TF.
        s.placement.kind = detail::PlacementKind::Replicated;
        s.placement.devices = s.placement.replica_devices;
      }
    }
    if (s.placement.kind == detail::PlacementKind::Plain) {
      s.placement.devices = {"/job:localhost/replica:0/task:0/device:CPU:0"};
    } else if (s.synchronization == VariableSynchronization::None) {
      throw InvalidArgument(fmt::format(
          "variable '{}': synchronization NONE is not supported inside the scope of {}; use AUTO, ON_WRITE or ON_READ",
          s.name, s.strategy_name));
    }
    if (s.placement.kind == detail::PlacementKind::Remote) {
      create_remote(std::move(initial_value));
      return;
    }
    const std::size_t copies =
        s.placement.kind == detail::PlacementKind::Replicated ? s.placement.devices.size() : std::size_t{1};
    if constexpr (memory_space_v<T> == MemorySpace::device) {  // each copy on its replica's device (backends/cuda)
      s.copies = detail::device_ops<T>::place_copies(initial_value, copies, s.placement.devices, s.placement.link);
      return;
    }
    if (s.placement.link) {
      // Every worker starts from the chief's value (workers create variables in the same order).
      detail::HostOperands value("Variable");
      value.add(view_of(initial_value));
      s.placement.link->broadcast(value[0].data, value[0].bytes(), 0);
      value.write_back();
    }
    s.copies.reserve(copies);
    for (std::size_t c = 0; c < copies; ++c) s.copies.push_back(clone_value(initial_value));
  }

  /// A handle to a variable that already lives on a ps task (what a worker gets when a scheduled
  /// function receives a variable as an argument). `shape_template` gives the shape; its values
  /// are not used. Used by ps/; programs create variables with the other constructor.
  static Variable attach_remote(std::string name, T shape_template, detail::RemoteHandle handle) {
    static_assert(memory_space_v<T> == MemorySpace::host, "ps variables hold host memory");
    Variable v;
    auto& s = *v.state_;
    s.name = std::move(name);
    s.strategy_name = "ParameterServerStrategy";
    s.placement.kind = detail::PlacementKind::Remote;
    s.placement.devices = {DeviceSpec{"ps", 0, handle.task, "CPU", 0}.to_string()};
    s.placement.remote = std::move(handle);
    s.copies = {std::move(shape_template)};
    return v;
  }

  /// Where a ps variable lives (nullptr for every other placement).
  const detail::RemoteHandle* remote_handle() const noexcept {
    return state_->placement.kind == detail::PlacementKind::Remote ? &state_->placement.remote : nullptr;
  }

  const std::string& name() const noexcept { return state_->name; }
  bool trainable() const noexcept { return state_->trainable; }
  VariableSynchronization synchronization() const noexcept { return state_->synchronization; }
  VariableAggregation aggregation() const noexcept { return state_->aggregation; }
  Shape shape() const { return shape_of(state_->copies.front()); }
  /// True when the variable was placed by a strategy (mirrored, sync-on-read, central...).
  bool is_distributed() const noexcept { return state_->placement.kind != detail::PlacementKind::Plain; }
  bool is_sync_on_read() const noexcept { return state_->synchronization == VariableSynchronization::OnRead; }
  /// Id of the strategy that placed it (0 for plain variables).
  std::uint64_t strategy_id() const noexcept { return state_->placement.strategy_id; }

  /// This replica's device in replica context, else the primary copy's.
  const std::string& device() const {
    int i = local_index();
    return state_->placement.devices[static_cast<std::size_t>(i < 0 ? 0 : i)];
  }
  const std::vector<std::string>& devices() const noexcept { return state_->placement.devices; }

  /// The per-replica copies (one for a plain variable). Read them in cross-replica context.
  /// For handle types (torch::Tensor) these share the variable's memory.
  const std::vector<T>& values() const noexcept { return state_->copies; }

  /// In replica context the local copy; in cross-replica context the primary copy (ON_WRITE) or
  /// the aggregate of all copies (ON_READ).
  T read_value() const {
    auto& s = *state_;
    if (s.placement.kind == detail::PlacementKind::Remote) return read_remote();
    int i = local_index();
    if (i == kPlain) {
      std::lock_guard lock(s.mutex);
      return clone_value(s.copies.front());
    }
    if (i >= 0) return clone_value(s.copies[static_cast<std::size_t>(i)]);
    if (s.synchronization != VariableSynchronization::OnRead) return clone_value(s.copies.front());
    return aggregate_copies();
  }

  void assign(const T& value) { update(Update::Assign, value); }
  void assign_add(const T& delta) { update(Update::Add, delta); }
  void assign_sub(const T& delta) { update(Update::Sub, delta); }

  /// Applies fn(copy) to the copy (or copies) the caller may change: the local copy in replica
  /// context, every copy in cross-replica context. Used by strategy.extended().update().
  template <class F>
  void apply_to_copies(F&& fn) {
    auto& s = *state_;
    if (s.placement.kind == detail::PlacementKind::Remote) {  // read, change, write back
      T value = read_remote();
      fn(value, 0);
      update(Update::Assign, value);
      return;
    }
    int i = local_index();
    if (i == kPlain) {
      std::lock_guard lock(s.mutex);
      fn(s.copies.front(), 0);
    } else if (i >= 0) {
      fn(s.copies[static_cast<std::size_t>(i)], i);
    } else {
      for (std::size_t c = 0; c < s.copies.size(); ++c) fn(s.copies[c], static_cast<int>(c));
    }
  }

  friend bool operator==(const Variable& a, const Variable& b) noexcept { return a.state_ == b.state_; }

 private:
  enum class Update { Assign, Add, Sub };
  static constexpr int kCrossReplica = -1;
  static constexpr int kPlain = -2;

  Variable() : state_(std::make_shared<State>()) {}

  void create_remote(T initial_value) {
    if constexpr (memory_space_v<T> != MemorySpace::host) {
      throw InvalidArgument(fmt::format("variable '{}': ps variables hold host memory; create a host-valued variable "
                                        "(std::vector, ds::Tensor, a scalar) in ParameterServerStrategy's scope",
                                        state_->name));
    } else {
      auto& s = *state_;
      auto& r = s.placement.remote;
      r.key += "/" + s.name;  // the strategy's unique prefix, and the name for messages
      detail::HostOperands value("Variable");
      value.add(view_of(initial_value), true);
      r.store->create(r.task, r.key, value[0].dtype, value[0].shape, bytes_of(value[0]));
      s.copies.clear();
      s.copies.push_back(std::move(initial_value));  // kept for its dtype and shape: the value lives on the ps
    }
  }

  static std::span<const std::byte> bytes_of(const detail::BufferRef& b) {
    return {static_cast<const std::byte*>(b.data), b.bytes()};
  }

  T read_remote() const {
    if constexpr (memory_space_v<T> == MemorySpace::host) {
      const auto& r = state_->placement.remote;
      detail::RowMajorResult<T> out;
      const DType dtype = value_dtype(state_->copies.front());
      const Shape s = shape();
      void* p = out.allocate(dtype, s);
      r.store->read(r.task, r.key, dtype, {static_cast<std::byte*>(p), static_cast<std::size_t>(num_elements(s)) * size_of(dtype)});
      return out.take();
    } else {
      throw InvalidArgument("ps variables hold host memory");
    }
  }

  struct State {
    std::string name;
    std::string strategy_name;
    bool trainable = true;
    VariableSynchronization synchronization = VariableSynchronization::OnWrite;
    VariableAggregation aggregation = VariableAggregation::None;
    detail::VariablePlacement placement;
    std::vector<T> copies;
    mutable std::mutex mutex;  // guards plain variables, which any thread may touch
  };

  // kPlain for plain variables, kCrossReplica outside a step, else the local replica index.
  int local_index() const {
    const auto& s = *state_;
    if (s.placement.kind == detail::PlacementKind::Plain) return kPlain;
    ReplicaContext* ctx = detail::thread_context().replica;
    if (!ctx) return kCrossReplica;
    if (ctx->strategy().id() != s.placement.strategy_id) {
      throw InvalidArgument(fmt::format("variable '{}' belongs to {} (strategy #{}) but is used in a replica of {} "
                                        "(strategy #{})",
                                        s.name, s.strategy_name, s.placement.strategy_id, ctx->strategy().name(),
                                        ctx->strategy().id()));
    }
    if (s.placement.kind != detail::PlacementKind::Replicated) return 0;
    return ctx->local_replica_id();
  }

  void check_shape(const T& value, const char* what) const {
    const DType mine = value_dtype(state_->copies.front()), theirs = value_dtype(value);
    if (shape_of(value) != shape() || mine != theirs) {
      throw InvalidArgument(fmt::format("{}: a {} value of shape {} does not match variable '{}' ({} of shape {})", what,
                                        to_string(theirs), shape_string(shape_of(value)), name(), to_string(mine),
                                        shape_string(shape())));
    }
  }

  static void apply(Update kind, T& target, const T& value) {
    if constexpr (memory_space_v<T> == MemorySpace::device) {  // Thrust device memory (backends/cuda)
      if (kind == Update::Assign) detail::device_ops<T>::assign(target, value);
      else if (kind == Update::Add) detail::device_ops<T>::add(target, value);
      else detail::device_ops<T>::sub(target, value);
      return;
    }
    detail::HostOperands ops("Variable");
    ops.add(view_of(target));
    ops.add(view_of(value), true);
    const std::size_t n = ops[0].count();
    visit_dtype(ops[0].dtype, [&](auto t) {
      using E = decltype(t);
      E* dst = static_cast<E*>(ops[0].data);
      const E* src = static_cast<const E*>(ops[1].data);
      switch (kind) {
        case Update::Assign:
          for (std::size_t i = 0; i < n; ++i) dst[i] = src[i];
          break;
        case Update::Add:
          for (std::size_t i = 0; i < n; ++i) dst[i] = static_cast<E>(dst[i] + src[i]);
          break;
        case Update::Sub:
          for (std::size_t i = 0; i < n; ++i) dst[i] = static_cast<E>(dst[i] - src[i]);
          break;
      }
    });
    ops.write_back();
  }

  void update(Update kind, const T& value) {
    static constexpr const char* names[] = {"assign", "assign_add", "assign_sub"};
    const char* what = names[static_cast<int>(kind)];
    check_shape(value, what);
    auto& s = *state_;
    if (s.placement.kind == detail::PlacementKind::Remote) {
      if constexpr (memory_space_v<T> == MemorySpace::host) {
        const auto& r = s.placement.remote;
        detail::HostOperands v("Variable");
        v.add(view_of(value), true);
        r.store->update(r.task, r.key, static_cast<detail::RemoteUpdate>(kind), v[0].dtype, bytes_of(v[0]));
      }
      return;
    }
    const int i = local_index();
    if (i == kPlain) {
      std::lock_guard lock(s.mutex);
      apply(kind, s.copies.front(), value);
      return;
    }
    if (i == kCrossReplica) {
      update_cross_replica(kind, value, what);
      return;
    }
    ReplicaContext& ctx = *detail::thread_context().replica;
    if (s.placement.kind == detail::PlacementKind::CentralStorage) {
      // One copy for all replicas: aggregate the replicas' values, apply once on replica 0
      // while the others wait. With NONE (or ONLY_FIRST_REPLICA) the replicas' values are
      // identical by contract (e.g. all-reduced gradients), so replica 0's is applied.
      switch (s.aggregation) {
        case VariableAggregation::Sum: {
          T sum = ctx.all_reduce(ReduceOp::Sum, value);
          ctx.run_once([&] { apply(kind, s.copies.front(), sum); });
          return;
        }
        case VariableAggregation::Mean: {
          T mean = ctx.all_reduce(ReduceOp::Mean, value);
          ctx.run_once([&] { apply(kind, s.copies.front(), mean); });
          return;
        }
        case VariableAggregation::None:
        case VariableAggregation::OnlyFirstReplica:
          ctx.run_once([&] { apply(kind, s.copies.front(), value); });
          return;
      }
    }
    auto& local = s.copies[static_cast<std::size_t>(i)];
    if (s.synchronization == VariableSynchronization::OnRead || s.aggregation == VariableAggregation::None) {
      apply(kind, local, value);  // local copy only; the caller keeps mirrored copies identical
      return;
    }
    switch (s.aggregation) {
      case VariableAggregation::Sum: apply(kind, local, ctx.all_reduce(ReduceOp::Sum, value)); break;
      case VariableAggregation::Mean: apply(kind, local, ctx.all_reduce(ReduceOp::Mean, value)); break;
      case VariableAggregation::OnlyFirstReplica: apply(kind, local, ctx.broadcast(value, 0)); break;
      case VariableAggregation::None: break;
    }
  }

  void update_cross_replica(Update kind, const T& value, const char* what) {
    auto& s = *state_;
    if (s.synchronization == VariableSynchronization::OnRead && s.aggregation == VariableAggregation::Sum) {
      if (kind != Update::Assign) {
        throw InvalidArgument(fmt::format("variable '{}': {} of a sync-on-read variable with SUM aggregation is not "
                                          "supported in cross-replica context; use assign",
                                          s.name, what));
      }
      // Each copy holds value / N so that the cross-replica sum reads back `value`.
      T share = clone_value(value);
      if constexpr (memory_space_v<T> == MemorySpace::device) {  // Thrust device memory (backends/cuda)
        detail::device_ops<T>::divide(share, s.placement.num_replicas_in_sync);
        for (auto& c : s.copies) apply(kind, c, share);
        return;
      }
      detail::HostOperands ops("Variable");
      ops.add(view_of(share));
      visit_dtype(ops[0].dtype, [&](auto t) {
        detail::divide(static_cast<decltype(t)*>(ops[0].data), ops[0].count(), s.placement.num_replicas_in_sync);
      });
      ops.write_back();
      for (auto& c : s.copies) apply(kind, c, share);
      return;
    }
    for (auto& c : s.copies) apply(kind, c, value);
  }

  T aggregate_copies() const {
    const auto& s = *state_;
    switch (s.aggregation) {
      case VariableAggregation::OnlyFirstReplica: return clone_value(s.copies.front());
      case VariableAggregation::None:
        throw InvalidArgument(fmt::format("variable '{}': a cross-replica read of a sync-on-read variable needs an "
                                          "aggregation (SUM, MEAN or ONLY_FIRST_REPLICA), not NONE",
                                          s.name));
      case VariableAggregation::Sum:
      case VariableAggregation::Mean: {
        if constexpr (memory_space_v<T> == MemorySpace::device) {  // Thrust device memory (backends/cuda)
          const auto op = s.aggregation == VariableAggregation::Mean ? ReduceOp::Mean : ReduceOp::Sum;
          return detail::device_ops<T>::reduce(s.copies.front(), s.copies, op, s.placement.link);
        }
        std::vector<const T*> copies;
        for (const T& c : s.copies) copies.push_back(&c);
        const auto op = s.aggregation == VariableAggregation::Mean ? ReduceOp::Mean : ReduceOp::Sum;
        return detail::reduce_components(op, copies, s.placement.link);  // Mean: by every replica in sync
      }
    }
    return clone_value(s.copies.front());
  }

  std::shared_ptr<State> state_;
};

DISTRIBUTE_END_NAMESPACE

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
    if (s.aggregation == VariableAggregation::Mean && !std::is_floating_point_v<element_t<T>>) {
      throw InvalidArgument(fmt::format("variable '{}': MEAN aggregation needs a floating-point variable, not {}", s.name,
                                        to_string(dtype_of<element_t<T>>())));
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
      auto* p = tensor_traits<T>::data(initial_value);
      s.placement.link->broadcast(p, element_count(initial_value) * sizeof(element_t<T>), 0);
    }
    s.copies.assign(copies, initial_value);
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
  const std::vector<T>& values() const noexcept { return state_->copies; }

  /// In replica context the local copy; in cross-replica context the primary copy (ON_WRITE) or
  /// the aggregate of all copies (ON_READ).
  T read_value() const {
    auto& s = *state_;
    if (s.placement.kind == detail::PlacementKind::Remote) return read_remote();
    int i = local_index();
    if (i == kPlain) {
      std::lock_guard lock(s.mutex);
      return s.copies.front();
    }
    if (i >= 0) return s.copies[static_cast<std::size_t>(i)];
    if (s.synchronization != VariableSynchronization::OnRead) return s.copies.front();
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
      r.store->create(r.task, r.key, dtype_of<element_t<T>>(), shape_of(initial_value), bytes_of(initial_value));
      s.copies = {std::move(initial_value)};  // kept for its shape only: the value lives on the ps
    }
  }

  static std::span<const std::byte> bytes_of(const T& v) {
    return {reinterpret_cast<const std::byte*>(tensor_traits<T>::data(v)), element_count(v) * sizeof(element_t<T>)};
  }

  T read_remote() const {
    if constexpr (memory_space_v<T> == MemorySpace::host) {
      const auto& r = state_->placement.remote;
      T out = tensor_traits<T>::make(shape());
      r.store->read(r.task, r.key, dtype_of<element_t<T>>(),
                    {reinterpret_cast<std::byte*>(tensor_traits<T>::data(out)), element_count(out) * sizeof(element_t<T>)});
      return out;
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
    if (shape_of(value) != shape()) {
      throw InvalidArgument(fmt::format("{}: value of shape {} does not match variable '{}' of shape {}", what,
                                        shape_string(shape_of(value)), name(), shape_string(shape())));
    }
  }

  static void apply(Update kind, T& target, const T& value) {
    if constexpr (memory_space_v<T> == MemorySpace::device) {  // Thrust device memory (backends/cuda)
      if (kind == Update::Assign) detail::device_ops<T>::assign(target, value);
      else if (kind == Update::Add) detail::device_ops<T>::add(target, value);
      else detail::device_ops<T>::sub(target, value);
      return;
    }
    using E = element_t<T>;
    E* dst = tensor_traits<T>::data(target);
    const E* src = tensor_traits<T>::data(value);
    const std::size_t n = element_count(target);
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
  }

  void update(Update kind, const T& value) {
    static constexpr const char* names[] = {"assign", "assign_add", "assign_sub"};
    const char* what = names[static_cast<int>(kind)];
    check_shape(value, what);
    auto& s = *state_;
    if (s.placement.kind == detail::PlacementKind::Remote) {
      if constexpr (memory_space_v<T> == MemorySpace::host) {
        const auto& r = s.placement.remote;
        r.store->update(r.task, r.key, static_cast<detail::RemoteUpdate>(kind), dtype_of<element_t<T>>(), bytes_of(value));
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
      T share = value;
      if constexpr (memory_space_v<T> == MemorySpace::device) {  // Thrust device memory (backends/cuda)
        detail::device_ops<T>::divide(share, s.placement.num_replicas_in_sync);
        for (auto& c : s.copies) apply(kind, c, share);
        return;
      }
      using E = element_t<T>;
      E* p = tensor_traits<T>::data(share);
      const auto n = static_cast<E>(s.placement.num_replicas_in_sync);
      for (std::size_t k = 0; k < element_count(share); ++k) p[k] = static_cast<E>(p[k] / n);
      for (auto& c : s.copies) apply(kind, c, share);
      return;
    }
    for (auto& c : s.copies) apply(kind, c, value);
  }

  T aggregate_copies() const {
    const auto& s = *state_;
    switch (s.aggregation) {
      case VariableAggregation::OnlyFirstReplica: return s.copies.front();
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
        T out = s.copies.front();
        for (std::size_t c = 1; c < s.copies.size(); ++c) {
          detail::combine(tensor_traits<T>::data(out), tensor_traits<T>::data(s.copies[c]), element_count(out),
                          ReduceOp::Sum);
        }
        if (s.placement.link) {
          s.placement.link->all_reduce(tensor_traits<T>::data(out), element_count(out), dtype_of<element_t<T>>(),
                                       ReduceOp::Sum);
        }
        if (s.aggregation == VariableAggregation::Mean) {
          const auto replicas = s.placement.link ? std::int64_t{s.placement.num_replicas_in_sync}
                                                 : static_cast<std::int64_t>(s.copies.size());
          detail::divide(tensor_traits<T>::data(out), element_count(out), replicas);
        }
        return out;
      }
    }
    return s.copies.front();
  }

  std::shared_ptr<State> state_;
};

DISTRIBUTE_END_NAMESPACE

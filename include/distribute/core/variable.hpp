// Variable<T>: state that a strategy places when it is created in the strategy's scope.
//
// A Variable is a handle: copies share the same state, as Python references to a tf.Variable do.
// Placement happens once, at construction, from the scope current on this thread: outside any
// scope the variable is plain (one copy, safe to use from any thread); inside one, the strategy's
// placement picks a storage (core/detail/variable_factory.hpp): one ON_WRITE copy per local
// replica, ON_READ copies that cross-replica reads aggregate, one central copy the replicas update
// once per step, or a value on a ps task. Variable<T> itself only forwards to that storage.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <distribute/core/remote_store.hpp>
#include <distribute/core/detail/variable_factory.hpp>
#include <distribute/core/detail/variable_storage.hpp>
#include <distribute/core/dtype.hpp>
#include <distribute/core/memory_space.hpp>
#include <distribute/core/shape.hpp>
#include <distribute/core/tensor_traits.hpp>
#include <distribute/core/variable_options.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

template <class T>
class Variable {
  static_assert(TensorLike<T>, "ds::Variable<T>: T needs a ds::tensor_traits specialisation (see TensorLike)");

 public:
  using value_type = T;

  /// Creates the variable; inside a strategy's scope the strategy places it.
  explicit Variable(T initial_value, VariableOptions options = {})
      : storage_(core::detail::make_variable_storage(std::move(initial_value), std::move(options))) {}

  /// A handle to a variable that already lives on a ps task (what a worker gets when a scheduled
  /// function receives a variable as an argument). `shape_template` gives the shape; its values
  /// are not used. Used by ps/; programs create variables with the other constructor.
  static Variable attach_remote(std::string name, T shape_template, core::RemoteHandle handle) {
    static_assert(memory_space_v<T> == MemorySpace::host, "ps variables hold host memory");
    // Only the parameter-server strategy puts variables on ps tasks; the name is for messages.
    return Variable(core::detail::attach_remote_storage(std::move(name), std::move(shape_template), std::move(handle),
                                                  "ParameterServerStrategy"));
  }

  /// Where a ps variable lives (nullptr for every other placement).
  const core::RemoteHandle* remote_handle() const noexcept { return storage_->remote_handle(); }

  const std::string& name() const noexcept { return storage_->spec().name; }
  bool trainable() const noexcept { return storage_->spec().trainable; }
  VariableSynchronization synchronization() const noexcept { return storage_->spec().synchronization; }
  VariableAggregation aggregation() const noexcept { return storage_->spec().aggregation; }
  Shape shape() const { return storage_->shape(); }
  /// The element type (TF's `Variable.dtype`); for run-time types, the one it was created with.
  DType dtype() const { return value_dtype(storage_->copies().front()); }
  /// True when the variable was placed by a strategy (mirrored, sync-on-read, central...).
  bool is_distributed() const noexcept { return storage_->is_distributed(); }
  bool is_sync_on_read() const noexcept { return synchronization() == VariableSynchronization::OnRead; }
  /// Id of the strategy that placed it (0 for plain variables).
  std::uint64_t strategy_id() const noexcept { return storage_->strategy_id(); }

  /// This replica's device in replica context, else the primary copy's.
  const std::string& device() const { return storage_->device(); }
  const std::vector<std::string>& devices() const noexcept { return storage_->devices(); }

  /// The per-replica copies (one for a plain variable). Read them in cross-replica context.
  /// For handle types (torch::Tensor) these share the variable's memory.
  const std::vector<T>& values() const noexcept { return storage_->copies(); }

  /// In replica context the local copy; in cross-replica context the primary copy (ON_WRITE) or
  /// the aggregate of all copies (ON_READ).
  T read_value() const { return storage_->read(); }

  void assign(const T& value) { storage_->update(core::detail::VariableUpdate::Assign, value); }
  void assign_add(const T& delta) { storage_->update(core::detail::VariableUpdate::Add, delta); }
  void assign_sub(const T& delta) { storage_->update(core::detail::VariableUpdate::Sub, delta); }

  /// Applies fn(copy, index) to the copy (or copies) the caller may change: the local copy in
  /// replica context, every copy in cross-replica context. Used by strategy.extended().update().
  template <class F>
  void apply_to_copies(F&& fn) {
    storage_->apply_to_copies(core::detail::CopyVisitor<T>(fn));
  }

  friend bool operator==(const Variable& a, const Variable& b) noexcept { return a.storage_ == b.storage_; }

 private:
  explicit Variable(std::shared_ptr<core::detail::VariableStorage<T>> storage) : storage_(std::move(storage)) {}

  std::shared_ptr<core::detail::VariableStorage<T>> storage_;
};

DISTRIBUTE_END_NAMESPACE

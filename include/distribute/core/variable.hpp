// Variable<T>: state that a strategy places when it is created in the strategy's scope.
//
// A Variable is a handle: copies share the same state, as Python references to a tf.Variable do.
// Placement happens once, at construction, from the scope current on this thread: outside any
// scope the variable is plain (one copy, safe to use from any thread); inside one, the strategy's
// placement picks a storage (core/detail/variable_factory.hpp): one ON_WRITE copy per local
// replica, ON_READ copies that cross-replica reads aggregate, one central copy the replicas update
// once per step, or a value on a ps task. Variable<T> itself only forwards to that storage.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/remote_store.hpp>
#include <distribute/core/detail/variable_factory.hpp>
#include <distribute/core/detail/variable_storage.hpp>
#include <distribute/core/dtype.hpp>
#include <distribute/core/error.hpp>
#include <distribute/core/host_operands.hpp>
#include <distribute/core/indexed_slices.hpp>
#include <distribute/core/initializer.hpp>
#include <distribute/core/row_updates.hpp>
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
      : storage_(core::detail::make_variable_storage(core::detail::InitialValue<T>(std::move(initial_value)),
                                                     std::move(options))) {}

  /// Creates a variable of `shape` filled by `init` (TF: tf.Variable(initializer(shape))). On a ps
  /// task the ps task fills it, so nothing but the shape is sent (a table of millions of rows is
  /// never built here); any other placement fills it here. InvalidArgument when `init` cannot make
  /// values of T's element type.
  Variable(Shape shape, const Initializer& init, VariableOptions options = {})
    requires StaticTensorLike<T>
      : storage_(core::detail::make_variable_storage(
            core::detail::InitialValue<T>(dtype_of<element_t<T>>(), std::move(shape), init), std::move(options))) {}

  /// A handle to a variable that already lives on a ps task (what a worker gets when a scheduled
  /// function receives a variable as an argument). Used by ps/; programs create variables with the
  /// other constructors.
  static Variable attach_remote(std::string name, DType dtype, Shape shape, core::RemoteHandle handle) {
    static_assert(memory_space_v<T> == MemorySpace::host, "ps variables hold host memory");
    // Only the parameter-server strategy puts variables on ps tasks; the name is for messages.
    return Variable(core::detail::attach_remote_storage<T>(std::move(name), dtype, std::move(shape), std::move(handle),
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
  DType dtype() const { return storage_->dtype(); }
  /// True when the variable was placed by a strategy (mirrored, sync-on-read, central...).
  bool is_distributed() const noexcept { return storage_->is_distributed(); }
  bool is_sync_on_read() const noexcept { return synchronization() == VariableSynchronization::OnRead; }
  /// Id of the strategy that placed it (0 for plain variables).
  std::uint64_t strategy_id() const noexcept { return storage_->strategy_id(); }

  /// This replica's device in replica context, else the primary copy's.
  const std::string& device() const { return storage_->device(); }
  const std::vector<std::string>& devices() const noexcept { return storage_->devices(); }

  /// The per-replica copies (one for a plain variable; none for a variable on a ps task, whose
  /// value is there: read_value()). Read them in cross-replica context. For handle types
  /// (torch::Tensor) these share the variable's memory.
  const std::vector<T>& values() const noexcept { return storage_->copies(); }

  /// In replica context the local copy; in cross-replica context the primary copy (ON_WRITE) or
  /// the aggregate of all copies (ON_READ).
  T read_value() const { return storage_->read(); }

  void assign(const T& value) { storage_->update(core::detail::VariableUpdate::Assign, value); }
  void assign_add(const T& delta) { storage_->update(core::detail::VariableUpdate::Add, delta); }
  void assign_sub(const T& delta) { storage_->update(core::detail::VariableUpdate::Sub, delta); }

  /// TF's scatter_add: row `slices.indices()[i]` += row i of `slices.values()`, for each i in order
  /// (duplicate indices all add). On a ps task only the rows travel and the ps task applies them
  /// under its lock, so concurrent writers never lose each other's rows (inside a scheduled
  /// function, with the closure's other updates, once). In cross-replica context every copy; in
  /// replica context the replica's own copy (NONE aggregation only, as in TF). InvalidArgument for a
  /// scalar variable, rows of another dtype or shape, slices of another dense shape, an ON_READ
  /// variable (TF refuses those too), or a plain variable updated by several replicas.
  template <class U>
  void scatter_add(const IndexedSlices<U>& slices) { scatter(core::RowOp::Add, slices); }
  /// TF's scatter_sub: row -= value.
  template <class U>
  void scatter_sub(const IndexedSlices<U>& slices) { scatter(core::RowOp::Sub, slices); }
  /// TF's scatter_update: row = value (with duplicate indices the last one stays).
  template <class U>
  void scatter_update(const IndexedSlices<U>& slices) { scatter(core::RowOp::Update, slices); }
  /// TF's scatter_min: row = min(row, value), elementwise.
  template <class U>
  void scatter_min(const IndexedSlices<U>& slices) { scatter(core::RowOp::Min, slices); }
  /// TF's scatter_max: row = max(row, value), elementwise.
  template <class U>
  void scatter_max(const IndexedSlices<U>& slices) { scatter(core::RowOp::Max, slices); }

  /// TF's sparse_read: rows `indices` of the value along axis 0, shape indices.shape + shape[1:]
  /// (duplicates repeated). On a ps task only those rows travel. InvalidArgument naming an index
  /// outside [0, rows) and its position, or for a scalar variable.
  template <TensorLike I, class U = T>  // U: the result's type is only formed when called
    requires std::is_integral_v<element_t<I>>
  gathered_t<U> sparse_read(const I& indices) const {
    const Shape shape = this->shape();
    require_rows("sparse_read", shape);
    const auto* id = tensor_traits<I>::data(indices);
    const std::size_t n = element_count(indices);
    std::vector<std::int64_t> rows(id, id + n);
    for (std::size_t p = 0; p < n; ++p) {
      if (rows[p] < 0 || rows[p] >= shape[0]) {
        throw InvalidArgument(fmt::format("sparse_read: index {} (at position {}) is out of range [0, {}) of variable "
                                          "'{}'",
                                          rows[p], p, shape[0], name()));
      }
    }
    Shape out_shape = shape_of(indices);
    out_shape.insert(out_shape.end(), shape.begin() + 1, shape.end());
    core::RowMajorResult<gathered_t<U>> out;
    void* p = out.allocate(dtype(), out_shape);
    storage_->gather(rows, {static_cast<std::byte*>(p), static_cast<std::size_t>(num_elements(out_shape)) * size_of(dtype())});
    return out.take();
  }

  /// Applies fn(copy, index) to the copy (or copies) the caller may change: the local copy in
  /// replica context, every copy in cross-replica context. Used by strategy.extended().update().
  template <class F>
  void apply_to_copies(F&& fn) {
    storage_->apply_to_copies(core::detail::CopyVisitor<T>(fn));
  }

  friend bool operator==(const Variable& a, const Variable& b) noexcept { return a.storage_ == b.storage_; }

 private:
  void require_rows(std::string_view what, const Shape& shape) const {
    if (shape.empty()) throw InvalidArgument(fmt::format("{}: variable '{}' is a scalar and has no rows", what, name()));
  }

  template <class U>
  void scatter(core::RowOp op, const IndexedSlices<U>& slices) {
    const std::string_view what = core::scatter_name(op);
    const Shape shape = this->shape();
    require_rows(what, shape);
    const std::string whose = fmt::format("variable '{}'", name());
    check_slices_fit(slices, shape, dtype(), what, whose);
    core::check_row_op(op, dtype(), whose);
    storage_->scatter(op, slices.indices(), {slices.value_bytes(), slices.size() * slices.row_bytes()});
  }

  explicit Variable(std::shared_ptr<core::detail::VariableStorage<T>> storage) : storage_(std::move(storage)) {}

  std::shared_ptr<core::detail::VariableStorage<T>> storage_;
};

DISTRIBUTE_END_NAMESPACE

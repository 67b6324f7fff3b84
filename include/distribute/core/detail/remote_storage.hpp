// A variable whose value lives on a ps task: every read and update is a call to that task through
// the RemoteVariableStore the placement names (implemented outside core/). This process keeps
// only the variable's dtype and shape. Host memory only: the store moves bytes.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <distribute/core/context.hpp>
#include <distribute/core/host_operands.hpp>
#include <distribute/core/initializer.hpp>
#include <distribute/core/row_updates.hpp>
#include <distribute/core/detail/placed_storage.hpp>
#include <distribute/core/remote_store.hpp>
#include <distribute/core/detail/variable_storage.hpp>
#include <distribute/core/memory_space.hpp>
#include <distribute/core/tensor_traits.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace core::detail {

template <class T>
class RemoteStorage final : public PlacedStorage<T> {
  static_assert(memory_space_v<T> == MemorySpace::host, "ps variables hold host memory");
  static_assert(static_cast<int>(RemoteUpdate::Assign) == static_cast<int>(VariableUpdate::Assign) &&
                    static_cast<int>(RemoteUpdate::Add) == static_cast<int>(VariableUpdate::Add) &&
                    static_cast<int>(RemoteUpdate::Sub) == static_cast<int>(VariableUpdate::Sub),
                "RemoteUpdate is VariableUpdate on the wire");

 public:
  /// Creates the value on the placement's ps task. The key gets the variable's name appended
  /// (after the strategy's unique prefix) so that the ps task's messages can name it.
  static std::shared_ptr<RemoteStorage> create(VariableSpec spec, VariablePlacement placement, std::string strategy_name,
                                               const T& initial_value) {
    placement.remote.key += "/" + spec.name;
    HostOperands value("Variable");
    value.add(view_of(initial_value), true);
    const RemoteHandle& r = placement.remote;
    r.store->create(r.task, r.key, value[0].dtype, value[0].shape, bytes_of(value[0]));
    return std::make_shared<RemoteStorage>(std::move(spec), std::move(placement), std::move(strategy_name), value[0].dtype,
                                           value[0].shape);
  }

  /// Creates the value on the placement's ps task, filled there by `init` (nothing is sent but
  /// the shape).
  static std::shared_ptr<RemoteStorage> create_initialized(VariableSpec spec, VariablePlacement placement,
                                                           std::string strategy_name, DType dtype, Shape shape,
                                                           const Initializer& init) {
    placement.remote.key += "/" + spec.name;
    const RemoteHandle& r = placement.remote;
    r.store->create_initialized(r.task, r.key, dtype, shape, init);
    return std::make_shared<RemoteStorage>(std::move(spec), std::move(placement), std::move(strategy_name), dtype,
                                           std::move(shape));
  }

  /// A handle to a value that lives on a ps task. This process keeps only its dtype and shape.
  RemoteStorage(VariableSpec spec, VariablePlacement placement, std::string strategy_name, DType dtype, Shape shape)
      : PlacedStorage<T>(std::move(spec), std::move(placement), std::move(strategy_name)), dtype_(dtype),
        shape_(std::move(shape)) {}

  /// None: the value is on the ps task (read() fetches it).
  const std::vector<T>& copies() const noexcept override { return no_copies_; }
  const RemoteHandle* remote_handle() const noexcept override { return &this->placement().remote; }
  Shape shape() const override { return shape_; }
  DType dtype() const override { return dtype_; }

  T read() const override {
    const RemoteHandle& r = this->placement().remote;
    RowMajorResult<T> out;
    void* p = out.allocate(dtype_, shape_);
    r.store->read(r.task, r.key, dtype_, {static_cast<std::byte*>(p), static_cast<std::size_t>(num_elements(shape_)) * size_of(dtype_)});
    return out.take();
  }

  /// Reads the value, lets fn change it, writes it back.
  void apply_to_copies(CopyVisitor<T> fn) override {
    T value = read();
    fn(value, 0);
    this->update(VariableUpdate::Assign, value);
  }

  /// Only the rows travel; the ps task applies them under its lock, so concurrent writers of one
  /// variable never lose each other's rows.
  void scatter(RowOp op, std::span<const std::int64_t> rows, std::span<const std::byte> values) override {
    const RemoteHandle& r = this->placement().remote;
    RowsUpdate u;
    u.kind = scatter_update_of(op);
    u.dtype = dtype_;
    u.rows = rows;
    u.values = values;
    r.store->update_rows(r.task, r.key, u);
  }

  void gather(std::span<const std::int64_t> rows, std::span<std::byte> out) const override {
    const RemoteHandle& r = this->placement().remote;
    const std::size_t row_bytes = rows.empty() ? 0 : out.size() / rows.size();
    r.store->read_rows(r.task, r.key, dtype_, rows, row_bytes, out);
  }

 protected:
  void update_checked(VariableUpdate kind, const T& value) override {
    const RemoteHandle& r = this->placement().remote;
    HostOperands v("Variable");
    v.add(view_of(value), true);
    r.store->update(r.task, r.key, static_cast<RemoteUpdate>(kind), v[0].dtype, bytes_of(v[0]));
  }

 private:
  static std::span<const std::byte> bytes_of(const BufferRef& b) {
    return {static_cast<const std::byte*>(b.data), b.bytes()};
  }

  DType dtype_;
  Shape shape_;
  std::vector<T> no_copies_;
};

}  // namespace core::detail
DISTRIBUTE_END_NAMESPACE

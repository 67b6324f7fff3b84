// The interface between Variable<T> and where its value is kept. Each placement implements it
// (plain, mirrored, sync-on-read, central, remote); Variable<T> picks one at construction and then
// only forwards to it, so a new placement is a new storage class, not a change to the façade.
#pragma once

#include <cstdint>
#include <cstddef>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/remote_store.hpp>
#include <distribute/core/dtype.hpp>
#include <distribute/core/error.hpp>
#include <distribute/core/row_updates.hpp>
#include <distribute/core/shape.hpp>
#include <distribute/core/tensor_traits.hpp>
#include <distribute/core/variable_options.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace core::detail {

/// What a variable is, whatever its placement: VariableOptions with the defaults resolved.
struct VariableSpec {
  std::string name;
  bool trainable = true;
  VariableSynchronization synchronization = VariableSynchronization::OnWrite;
  VariableAggregation aggregation = VariableAggregation::None;
};

enum class VariableUpdate { Assign, Add, Sub };

/// The member that makes an update, for messages.
constexpr const char* update_name(VariableUpdate kind) noexcept {
  switch (kind) {
    case VariableUpdate::Assign: return "assign";
    case VariableUpdate::Add: return "assign_add";
    case VariableUpdate::Sub: return "assign_sub";
  }
  return "?";
}

/// A non-owning reference to a callable fn(T& copy, int copy_index), so that the storages'
/// virtual apply_to_copies can take any lambda without allocating.
template <class T>
class CopyVisitor {
 public:
  template <class F>
    requires(!std::is_same_v<std::remove_cvref_t<F>, CopyVisitor>)
  explicit CopyVisitor(F& fn) noexcept
      : fn_(const_cast<void*>(static_cast<const void*>(std::addressof(fn)))),
        call_([](void* f, T& copy, int index) { (*static_cast<F*>(f))(copy, index); }) {}

  void operator()(T& copy, int index) const { call_(fn_, copy, index); }

 private:
  void* fn_;
  void (*call_)(void*, T&, int);
};

template <class T>
class VariableStorage {
 public:
  explicit VariableStorage(VariableSpec spec) : spec_(std::move(spec)) {}
  virtual ~VariableStorage() = default;
  VariableStorage(const VariableStorage&) = delete;
  VariableStorage& operator=(const VariableStorage&) = delete;

  const VariableSpec& spec() const noexcept { return spec_; }

  /// The copies this process holds: one per local replica, or one. A storage whose value lives
  /// elsewhere holds one value of the variable's dtype and shape.
  virtual const std::vector<T>& copies() const noexcept = 0;
  /// Where each copy lives, as TF device strings.
  virtual const std::vector<std::string>& devices() const noexcept = 0;
  /// This replica's device in replica context, else the primary copy's.
  virtual const std::string& device() const = 0;
  /// False only for a variable no strategy placed.
  virtual bool is_distributed() const noexcept { return true; }
  /// Id of the strategy that placed it (0 when none did).
  virtual std::uint64_t strategy_id() const noexcept = 0;
  /// Where the value lives when it is on a ps task, else nullptr.
  virtual const RemoteHandle* remote_handle() const noexcept { return nullptr; }

  /// The value as the calling context sees it (Variable::read_value).
  virtual T read() const = 0;
  /// fn(copy, index) on each copy the caller may change (Variable::apply_to_copies).
  virtual void apply_to_copies(CopyVisitor<T> fn) = 0;

  /// Assigns, adds or subtracts `value` after checking it has the variable's dtype and shape.
  void update(VariableUpdate kind, const T& value) {
    check_value(value, update_name(kind));
    update_checked(kind, value);
  }

  /// Row `rows[i]` (op)= row i of `values`, for each i in order (TF's scatter_*): the rows are in
  /// range, `values` holds rows.size() rows of the variable's dtype and row shape (the caller
  /// checked them against shape() and dtype()).
  virtual void scatter(RowOp op, std::span<const std::int64_t> rows, std::span<const std::byte> values) = 0;
  /// Rows `rows` (in range) as the calling context sees them, one after the other, into `out`.
  virtual void gather(std::span<const std::int64_t> rows, std::span<std::byte> out) const = 0;

  virtual Shape shape() const { return shape_of(copies().front()); }
  virtual DType dtype() const { return value_dtype(copies().front()); }

 protected:
  virtual void update_checked(VariableUpdate kind, const T& value) = 0;

 private:
  void check_value(const T& value, const char* what) const {
    const DType mine = dtype(), theirs = value_dtype(value);
    if (shape_of(value) != shape() || mine != theirs) {
      throw InvalidArgument(fmt::format("{}: a {} value of shape {} does not match variable '{}' ({} of shape {})", what,
                                        to_string(theirs), shape_string(shape_of(value)), spec_.name, to_string(mine),
                                        shape_string(shape())));
    }
  }

  VariableSpec spec_;
};

/// scatter() on one copy, whatever its layout (a strided copy is staged row-major and written back).
template <class T>
void scatter_into(T& copy, RowOp op, std::span<const std::int64_t> rows, std::span<const std::byte> values) {
  const TensorView v = view_of(copy);
  const auto apply = [&](std::byte* data) {
    const std::size_t row_bytes = static_cast<std::size_t>(num_elements(v.shape) / (v.shape[0] ? v.shape[0] : 1)) * size_of(v.dtype);
    scatter_rows(v.dtype, op, {data, v.bytes()}, row_bytes, std::as_bytes(rows), values);
  };
  if (v.contiguous()) return apply(static_cast<std::byte*>(v.data));
  std::vector<std::byte> staged(v.bytes());
  copy_to_contiguous(v, staged.data());
  apply(staged.data());
  copy_from_contiguous(staged.data(), v);
}

/// gather() from one copy, whatever its layout.
template <class T>
void gather_from(const T& copy, std::span<const std::int64_t> rows, std::span<std::byte> out) {
  const TensorView v = view_of(copy);
  const std::size_t row_bytes = static_cast<std::size_t>(num_elements(v.shape) / (v.shape[0] ? v.shape[0] : 1)) * size_of(v.dtype);
  std::vector<std::byte> staged;
  const std::byte* data = static_cast<const std::byte*>(v.data);
  if (!v.contiguous()) {
    staged.resize(v.bytes());
    copy_to_contiguous(v, staged.data());
    data = staged.data();
  }
  for (std::size_t i = 0; i < rows.size(); ++i) {
    std::memcpy(out.data() + i * row_bytes, data + static_cast<std::size_t>(rows[i]) * row_bytes, row_bytes);
  }
}

}  // namespace core::detail
DISTRIBUTE_END_NAMESPACE

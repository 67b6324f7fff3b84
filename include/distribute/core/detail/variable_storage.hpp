// The interface between Variable<T> and where its value is kept. Each placement implements it
// (plain, mirrored, sync-on-read, central, remote); Variable<T> picks one at construction and then
// only forwards to it, so a new placement is a new storage class, not a change to the façade.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/remote_store.hpp>
#include <distribute/core/dtype.hpp>
#include <distribute/core/error.hpp>
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

  Shape shape() const { return shape_of(copies().front()); }
  DType dtype() const { return value_dtype(copies().front()); }

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

}  // namespace core::detail
DISTRIBUTE_END_NAMESPACE

// The one place a variable's placement is decided: from the options and the placement that the
// strategy current on this thread asks for, which storage holds the variable.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include <fmt/format.h>

#include <distribute/core/context.hpp>
#include <distribute/core/detail/common_types.hpp>
#include <distribute/core/detail/central_storage.hpp>
#include <distribute/core/detail/mirrored_storage.hpp>
#include <distribute/core/detail/plain_storage.hpp>
#include <distribute/core/detail/remote_storage.hpp>
#include <distribute/core/remote_store.hpp>
#include <distribute/core/detail/sync_on_read_storage.hpp>
#include <distribute/core/detail/variable_storage.hpp>
#include <distribute/core/device.hpp>
#include <distribute/core/dtype.hpp>
#include <distribute/core/error.hpp>
#include <distribute/core/host_operands.hpp>
#include <distribute/core/initializer.hpp>
#include <distribute/core/memory_space.hpp>
#include <distribute/core/tensor_traits.hpp>
#include <distribute/core/variable_options.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace core::detail {

/// The options with TF's defaults filled in (AUTO is ON_WRITE; ON_READ variables are not
/// trainable unless asked), checked against the variable's dtype.
DISTRIBUTE_DECL VariableSpec resolve_variable_spec(VariableOptions options, DType dtype);

#if DISTRIBUTE_DETAIL_DEFINE  // compiled apart with DISTRIBUTE_SEPARATE_COMPILATION (version.hpp)
DISTRIBUTE_DECL VariableSpec resolve_variable_spec(VariableOptions options, DType dtype) {
  VariableSpec spec;
  spec.name = std::move(options.name);
  spec.aggregation = options.aggregation;
  spec.synchronization = options.synchronization == VariableSynchronization::Auto ? VariableSynchronization::OnWrite
                                                                                   : options.synchronization;
  spec.trainable = options.trainable.value_or(spec.synchronization != VariableSynchronization::OnRead);
  if (spec.aggregation == VariableAggregation::Mean && !is_floating(dtype)) {
    throw InvalidArgument(fmt::format("variable '{}': MEAN aggregation needs a floating-point variable, not {}",
                                      spec.name, to_string(dtype)));
  }
  if (spec.synchronization == VariableSynchronization::OnRead && options.trainable.value_or(false)) {
    throw InvalidArgument(fmt::format(
        "variable '{}': synchronization ON_READ is only for non-trainable variables, but trainable=true was given",
        spec.name));
  }
  return spec;
}

#endif  // DISTRIBUTE_DETAIL_DEFINE
/// A new variable's first value: given, or made from a shape by an initializer, which a ps task
/// runs itself (nothing but the shape is sent) and any other placement runs here.
template <class T>
class InitialValue {
 public:
  InitialValue(T value) : dtype_(value_dtype(value)), value_(std::move(value)) {}  // NOLINT: implicit on purpose
  InitialValue(DType dtype, Shape shape, const Initializer& init) : dtype_(dtype), shape_(std::move(shape)), init_(init) {}

  DType dtype() const noexcept { return dtype_; }
  /// The initializer, or nullptr when the value was given.
  const Initializer* initializer() const noexcept { return init_ ? &*init_ : nullptr; }
  const Shape& shape() const noexcept { return shape_; }
  /// The value given.
  const T& value() const { return *value_; }
  /// The value: the one given, or one made and filled here.
  T take() {
    if (value_) return std::move(*value_);
    T out = make_value<T>(dtype_, shape_);
    HostOperands ops("Variable");
    ops.add(view_of(out));
    init_->fill(dtype_, {static_cast<std::byte*>(ops[0].data), ops[0].bytes()});
    ops.write_back();
    return out;
  }

 private:
  DType dtype_;
  Shape shape_;
  std::optional<T> value_;
  std::optional<Initializer> init_;
};

/// The storage for a new variable: plain outside any scope, else the one the current strategy's
/// placement names.
template <class T>
std::shared_ptr<VariableStorage<T>> make_variable_storage(InitialValue<T> initial, VariableOptions options) {
  VariableSpec spec = resolve_variable_spec(std::move(options), initial.dtype());
  if (const Initializer* init = initial.initializer()) init->check_dtype(initial.dtype(), fmt::format("variable '{}'", spec.name));
  AnyStrategy* strategy = current_strategy_or_null();
  if (!strategy) {
    T value = initial.take();
    return std::make_shared<PlainStorage<T>>(std::move(spec), value);
  }
  if (thread_context().replica && strategy->num_local_replicas() > 1) {
    throw InvalidArgument(fmt::format(
        "variable '{}' created inside a step function of {}: create variables in cross-replica context "
        "(inside scope(), outside run())",
        spec.name, strategy->name()));
  }
  VariablePlacement placement = strategy->variable_placement();
  std::string strategy_name(strategy->name());
  if (placement.kind != PlacementKind::Plain && spec.synchronization == VariableSynchronization::None) {
    throw InvalidArgument(fmt::format(
        "variable '{}': synchronization NONE is not supported inside the scope of {}; use AUTO, ON_WRITE or ON_READ",
        spec.name, strategy_name));
  }
  if (placement.kind == PlacementKind::Remote) {
    if constexpr (memory_space_v<T> != MemorySpace::host) {
      throw InvalidArgument(fmt::format("variable '{}': ps variables hold host memory; create a host-valued variable "
                                        "(std::vector, ds::Tensor, a scalar) in {}'s scope",
                                        spec.name, strategy_name));
    } else {
      if (const Initializer* init = initial.initializer()) {
        return RemoteStorage<T>::create_initialized(std::move(spec), std::move(placement), std::move(strategy_name),
                                                    initial.dtype(), initial.shape(), *init);
      }
      return RemoteStorage<T>::create(std::move(spec), std::move(placement), std::move(strategy_name), initial.value());
    }
  }
  T initial_value = initial.take();
  const bool on_read = spec.synchronization == VariableSynchronization::OnRead;
  switch (placement.kind) {
    case PlacementKind::Replicated:
      if (on_read) return std::make_shared<SyncOnReadStorage<T>>(std::move(spec), placement, std::move(strategy_name), initial_value);
      return std::make_shared<MirroredStorage<T>>(std::move(spec), placement, std::move(strategy_name), initial_value);
    case PlacementKind::CentralStorage:
      if (on_read) {  // sync-on-read state (metrics, batch-norm statistics) stays per replica, as in TF
        placement.devices = placement.replica_devices;
        return std::make_shared<SyncOnReadStorage<T>>(std::move(spec), placement, std::move(strategy_name), initial_value);
      }
      return std::make_shared<CentralStorage<T>>(std::move(spec), placement, std::move(strategy_name), initial_value);
    case PlacementKind::Remote:
    case PlacementKind::Plain: break;
  }
  return std::make_shared<PlainStorage<T>>(std::move(spec), initial_value);  // a strategy that places nothing
}

/// The storage of a variable that already lives on ps task `handle.task` (what a worker gets for
/// a variable passed to a scheduled function); `owner_name` names the placing strategy in messages.
template <class T>
std::shared_ptr<VariableStorage<T>> attach_remote_storage(std::string name, DType dtype, Shape shape, RemoteHandle handle,
                                                          std::string owner_name) {
  VariableSpec spec;
  spec.name = std::move(name);
  VariablePlacement placement;
  placement.kind = PlacementKind::Remote;
  placement.devices = {DeviceSpec{"ps", 0, handle.task, "CPU", 0}.to_string()};
  placement.remote = std::move(handle);
  return std::make_shared<RemoteStorage<T>>(std::move(spec), std::move(placement), std::move(owner_name), dtype,
                                            std::move(shape));
}

#if DISTRIBUTE_DETAIL_INSTANTIATE  // compiled once with DISTRIBUTE_SEPARATE_COMPILATION (version.hpp)
#define DISTRIBUTE_DETAIL_VARIABLE_STORAGE(T)                                                                \
  DISTRIBUTE_DETAIL_EXTERN template std::shared_ptr<VariableStorage<T>> make_variable_storage<T>(InitialValue<T>, VariableOptions);
DISTRIBUTE_DETAIL_FOR_COMMON_VALUE_TYPES(DISTRIBUTE_DETAIL_VARIABLE_STORAGE)
#undef DISTRIBUTE_DETAIL_VARIABLE_STORAGE
#endif

}  // namespace core::detail
DISTRIBUTE_END_NAMESPACE

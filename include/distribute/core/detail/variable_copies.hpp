// What the storages do to the copies of a variable they hold: make them, apply an update to one,
// and split a value into equal shares. Host values go through their run-time views (staged in
// row-major order when their layout is not); device values through core::device_ops.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <distribute/core/cross_worker.hpp>
#include <distribute/core/elementwise.hpp>
#include <distribute/core/host_operands.hpp>
#include <distribute/core/detail/variable_storage.hpp>
#include <distribute/core/memory_space.hpp>
#include <distribute/core/tensor_traits.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace core::detail {

/// `count` copies of `initial`, copy c on devices[c]. With a link, every worker starts from the
/// chief's value (workers create variables in the same order).
template <class T>
std::vector<T> make_copies(T& initial, std::size_t count, const std::vector<std::string>& devices,
                           CrossWorkerLink* link) {
  if constexpr (memory_space_v<T> == MemorySpace::device) {  // each copy on its replica's device (backends/cuda)
    return device_ops<T>::place_copies(initial, count, devices, link);
  } else {
    if (link) {
      HostOperands value("Variable");
      value.add(view_of(initial));
      link->broadcast(value[0].data, value[0].bytes(), 0);
      value.write_back();
    }
    std::vector<T> out;
    out.reserve(count);
    for (std::size_t c = 0; c < count; ++c) out.push_back(clone_value(initial));
    return out;
  }
}

/// target = value, target += value or target -= value, element-wise.
template <class T>
void apply_update(VariableUpdate kind, T& target, const T& value) {
  if constexpr (memory_space_v<T> == MemorySpace::device) {  // Thrust device memory (backends/cuda)
    if (kind == VariableUpdate::Assign) device_ops<T>::assign(target, value);
    else if (kind == VariableUpdate::Add) device_ops<T>::add(target, value);
    else device_ops<T>::sub(target, value);
  } else {
    HostOperands ops("Variable");
    ops.add(view_of(target));
    ops.add(view_of(value), true);
    const std::size_t n = ops[0].count();
    visit_value_dtype<T>(ops[0].dtype, [&](auto t) {
      using E = decltype(t);
      E* dst = static_cast<E*>(ops[0].data);
      const E* src = static_cast<const E*>(ops[1].data);
      switch (kind) {
        case VariableUpdate::Assign:
          for (std::size_t i = 0; i < n; ++i) dst[i] = src[i];
          break;
        case VariableUpdate::Add:
          for (std::size_t i = 0; i < n; ++i) dst[i] = static_cast<E>(dst[i] + src[i]);
          break;
        case VariableUpdate::Sub:
          for (std::size_t i = 0; i < n; ++i) dst[i] = static_cast<E>(dst[i] - src[i]);
          break;
      }
    });
    ops.write_back();
  }
}

/// value / parts, element-wise: one copy's share when the copies must add up to `value`.
template <class T>
T share_of(const T& value, int parts) {
  T share = clone_value(value);
  if constexpr (memory_space_v<T> == MemorySpace::device) {  // Thrust device memory (backends/cuda)
    device_ops<T>::divide(share, parts);
  } else {
    HostOperands ops("Variable");
    ops.add(view_of(share));
    visit_value_dtype<T>(ops[0].dtype, [&](auto t) { divide(static_cast<decltype(t)*>(ops[0].data), ops[0].count(), parts); });
    ops.write_back();
  }
  return share;
}

}  // namespace core::detail
DISTRIBUTE_END_NAMESPACE

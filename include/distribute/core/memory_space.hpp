// MemorySpace: where a value's elements live, and the hooks that let host-generic code reach
// values in device memory without knowing the device system.
//
// "Device" means Thrust's device system, a compile-time choice: CUDA under nvcc, OpenMP or the
// sequential CPP system in CPU builds (-DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP/_CPP). The
// same device-shaped code therefore runs in CPU tests, as Thrust's own OpenMP/CPP systems intend.
#pragma once

#include <cstddef>

#include <distribute/version.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

/// Where a value's elements live: host memory, or the memory of the Thrust device system.
enum class MemorySpace { host, device };

namespace core {

/// How a type-erased collective reaches a buffer in device memory. Carried by a BufferRef whose
/// memory is `device`; supplied by core::device_ops (backends/cuda/device_ops.hpp).
struct DeviceMemoryAccess {
  /// Copies `bytes` bytes; either side may be host or device memory (CUDA: cudaMemcpyDefault).
  void (*copy)(void* dst, const void* src, std::size_t bytes);
};

/// The element-wise operations on values in device memory (combine, divide, copies to other
/// devices and to the host). Core code names it only inside
/// `if constexpr (memory_space_v<U> == MemorySpace::device)`, so a host-only program never needs
/// its definition. It is defined, for every U, by <distribute/backends/cuda/device_ops.hpp>,
/// which the headers of device value types (backends/cuda/device_tensor.hpp) include: a value type
/// whose tensor_traits say `memory = MemorySpace::device` must come with that header.
template <class U>
struct device_ops;

}  // namespace core

DISTRIBUTE_END_NAMESPACE

// The cross-device ops a strategy uses when it names none, chosen per backend in one place.
#pragma once

#include <distribute/collective/nccl.hpp>
#include <distribute/collective/shared_memory.hpp>
#include <distribute/version.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

struct cuda;  // backends/cuda/cuda.hpp

/// A backend tag's own choice (`Backend::default_cross_device_ops`, for backends a program defines),
/// else shared memory, which also serves device buffers through host copies.
template <class Backend>
struct default_cross_device_ops {
  using type = SharedMemoryAllReduce;
};
template <class Backend>
  requires requires { typename Backend::default_cross_device_ops; }
struct default_cross_device_ops<Backend> {
  using type = typename Backend::default_cross_device_ops;
};
#if DISTRIBUTE_HAS_NCCL
/// GPUs of one process all-reduce with NCCL where nvcc found it (collective/nccl.hpp).
template <>
struct default_cross_device_ops<cuda> {
  using type = NcclAllReduce;
};
#endif
template <class Backend>
using default_cross_device_ops_t = typename default_cross_device_ops<Backend>::type;

DISTRIBUTE_END_NAMESPACE

// Which Thrust device system this translation unit compiles for, and the macros the device code
// of the library needs in every system.
//
// The device system is Thrust's compile-time choice (THRUST_DEVICE_SYSTEM): CUDA under nvcc,
// or OpenMP / sequential C++ in a CPU build, where "device memory" is host memory and the same
// device-shaped code runs without a GPU (that is how the CPU tests exercise it).
#pragma once

#include <distribute/version.hpp>  // first: under nvcc it configures fmt before fmt is included

#include <thrust/detail/config.h>


#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA && !defined(__CUDACC__)
#error "distribute: Thrust's device system is CUDA, which needs nvcc (or clang in CUDA mode). Compile this file " \
       "with nvcc, or choose a CPU device system for the device-shaped code: " \
       "-DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP -fopenmp, or -DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_CPP."
#endif

/// 1 when device memory is CUDA memory (pointers need cudaMemcpy, kernels run on a current GPU).
#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
#define DISTRIBUTE_THRUST_CUDA 1
#else
#define DISTRIBUTE_THRUST_CUDA 0
#endif

/// Functors that Thrust calls on the device are host-and-device functions under a CUDA compiler.
#if defined(__CUDACC__)
#define DISTRIBUTE_HOST_DEVICE __host__ __device__
#else
#define DISTRIBUTE_HOST_DEVICE
#endif

// nvcc: fmt 9 turns its constexpr code off under __NVCC__ and nvcc's front end then rejects fmt's
// compile-time format-string checks in every fmt::format call. <distribute/version.hpp> turns it
// back on when a distribute header comes before fmt; if fmt came first, ask for the flag.
#if defined(__NVCC__) && defined(FMT_VERSION) && FMT_VERSION < 100000 && !FMT_USE_CONSTEXPR
#error "distribute: compile with -DFMT_USE_CONSTEXPR=1 under nvcc (fmt 9 disables its constexpr paths for nvcc, " \
       "and its compile-time format checks then fail), or include a distribute header before any fmt header."
#endif

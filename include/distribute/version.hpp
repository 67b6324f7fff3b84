// Version macros and the versioned inline ABI namespace.
#pragma once

#define DISTRIBUTE_VERSION_MAJOR 0
#define DISTRIBUTE_VERSION_MINOR 1
#define DISTRIBUTE_VERSION_PATCH 0
#define DISTRIBUTE_VERSION_STRING "0.1.0"

// nvcc: fmt (9) switches its constexpr code off under __NVCC__, and nvcc's front end then rejects
// the compile-time format-string checks of every fmt::format call in our headers. nvcc 12+
// handles that code, so turn it back on when a distribute header comes before fmt (the CUDA
// targets also pass -DFMT_USE_CONSTEXPR=1 for files that include fmt first).
#if defined(__NVCC__) && !defined(FMT_USE_CONSTEXPR) && !defined(FMT_CORE_H_) && !defined(FMT_BASE_H_)
#define FMT_USE_CONSTEXPR 1
#endif

// nvcc: cudafe mangles Boost.Asio's variable templates (static_query_v...) into host code g++
// rejects as soon as a timer or socket is made (net/, so MultiWorkerMirroredStrategy<ds::cuda>).
// Asio's class-template fallback for them compiles; it must be chosen before Asio is included.
#if defined(__NVCC__) && !defined(BOOST_ASIO_DISABLE_VARIABLE_TEMPLATES)
#define BOOST_ASIO_DISABLE_VARIABLE_TEMPLATES 1
#endif

// nvcc: Boost.System's error_code::assign(e, &BOOST_CURRENT_LOCATION) (Beast's BOOST_BEAST_ASSIGN_EC,
// observe/metrics_server.hpp) finds no overload through nvcc's front end; without source
// locations error codes are the same, less where they were set.
#if defined(__NVCC__) && !defined(BOOST_DISABLE_CURRENT_LOCATION)
#define BOOST_DISABLE_CURRENT_LOCATION 1
#endif

// Every public name lives in distribute::v0 so that two incompatible builds of the
// library linked into one program fail to link instead of silently mixing layouts.
#define DISTRIBUTE_BEGIN_NAMESPACE \
  namespace distribute {           \
  inline namespace v0 {
#define DISTRIBUTE_END_NAMESPACE \
  }                              \
  }

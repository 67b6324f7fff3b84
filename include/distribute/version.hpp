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
// net/metrics_server.hpp) finds no overload through nvcc's front end; without source
// locations error codes are the same, less where they were set.
#if defined(__NVCC__) && !defined(BOOST_DISABLE_CURRENT_LOCATION)
#define BOOST_DISABLE_CURRENT_LOCATION 1
#endif

// Header-only by default: every definition is in the headers, inline. With
// DISTRIBUTE_SEPARATE_COMPILATION defined for every translation unit of a program, the headers give
// the library's non-template code as declarations and its templates' common instantiations as
// `extern template`, and one translation unit compiles them all: the one that includes
// <distribute/src.hpp> first (the CMake target distribute::compiled and meson's
// distribute_compiled_dep build it). Each translation unit then parses and compiles only what it
// uses. In a header:
//   DISTRIBUTE_DECL            on the declaration and the definition of a non-template function
//                              (inline when header-only; an ordinary function when compiled apart)
//   #if DISTRIBUTE_DETAIL_DEFINE     around definitions of non-template code (true when header-only,
//                              and in the translation unit of <distribute/src.hpp>)
//   #if DISTRIBUTE_DETAIL_INSTANTIATE  around `DISTRIBUTE_DETAIL_EXTERN template ...;` lines: an
//                              explicit instantiation declaration in the program's translation units,
//                              its definition in the one of <distribute/src.hpp>
#if defined(DISTRIBUTE_SEPARATE_COMPILATION)
#define DISTRIBUTE_DECL
#define DISTRIBUTE_DETAIL_INSTANTIATE 1
#if defined(DISTRIBUTE_DETAIL_SOURCE)
#define DISTRIBUTE_DETAIL_DEFINE 1
#define DISTRIBUTE_DETAIL_EXTERN
#else
#define DISTRIBUTE_DETAIL_DEFINE 0
#define DISTRIBUTE_DETAIL_EXTERN extern
#endif
#else
#define DISTRIBUTE_DECL inline
#define DISTRIBUTE_DETAIL_DEFINE 1
#define DISTRIBUTE_DETAIL_INSTANTIATE 0
#define DISTRIBUTE_DETAIL_EXTERN extern
#endif

// Every public name lives in distribute::v0 so that two incompatible builds of the
// library linked into one program fail to link instead of silently mixing layouts.
#define DISTRIBUTE_BEGIN_NAMESPACE \
  namespace distribute {           \
  inline namespace v0 {
#define DISTRIBUTE_END_NAMESPACE \
  }                              \
  }

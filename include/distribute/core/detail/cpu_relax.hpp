// A spin-wait hint, for loops that poll memory another thread or process writes.
#pragma once

#include <distribute/version.hpp>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

DISTRIBUTE_BEGIN_NAMESPACE
namespace detail {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace detail
DISTRIBUTE_END_NAMESPACE

// A spin-wait hint, for loops that poll memory another thread or process writes.
#pragma once

#include <distribute/version.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace core {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();  // _mm_pause without <immintrin.h>, 60k lines every program would parse
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace core
DISTRIBUTE_END_NAMESPACE

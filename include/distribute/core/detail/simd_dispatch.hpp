// Vectorisable loops at -O2, and the run-time choice of AVX2 code on x86-64: shared by the
// reduction kernels (elementwise.hpp) and the 16-bit float conversions (half_convert.hpp).
#pragma once

#include <cstddef>

#include <distribute/version.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace core::detail {

/// body(i) for i in [0, n). The loop is cut into fixed blocks and a tail because GCC before 13
/// vectorises at -O2 only loops that need no scalar remainder: a plain loop over n stayed scalar
/// there (4x slower on the reductions of a network all-reduce, which are on its critical path);
/// blocks of a known size are vectorised at -O2 as at -O3.
template <std::size_t kBlock = 16, class Body>
inline void for_each_blocked(std::size_t n, Body body) noexcept {
  std::size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    for (std::size_t j = 0; j < kBlock; ++j) body(i + j);
  }
  for (; i < n; ++i) body(i);
}

// On x86-64 the same loop is also compiled for AVX2 and picked at run time where the CPU has it:
// a build without -march gets SSE2 only, and the reductions of a network all-reduce sit on its
// critical path (twice as fast here; docs/performance.md, multi-worker section).
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDA_ARCH__)
#define DISTRIBUTE_X86_AVX2_DISPATCH 1
inline bool cpu_has_avx2() noexcept {
  static const bool has = __builtin_cpu_supports("avx2") != 0;
  return has;
}
#endif

}  // namespace core::detail
DISTRIBUTE_END_NAMESPACE

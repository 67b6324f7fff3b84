// Element-wise combination kernels shared by every reduction path. The op switch sits outside
// the loops so each loop is a plain vectorisable pass.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <fmt/format.h>

#include <span>

#include <distribute/core/half_convert.hpp>
#include <distribute/core/detail/simd_dispatch.hpp>
#include <distribute/core/dtype.hpp>
#include <distribute/core/error.hpp>
#include <distribute/core/reduce_op.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace core {

/// acc[i] = f(acc[i], src[i]) for every i, vectorisable at -O2 (for_each_blocked).
template <class T, class F>
inline void apply_pairwise_portable(T* __restrict acc, const T* __restrict src, std::size_t n, F f) noexcept {
  core::detail::for_each_blocked(n, [=](std::size_t i) { acc[i] = f(acc[i], src[i]); });
}

#if defined(DISTRIBUTE_X86_AVX2_DISPATCH)
// Blocks of 32: whole ymm registers for every element type. The loop is inlined here, so it is
// compiled for AVX2 too.
template <class T, class F>
__attribute__((target("avx2"))) void apply_pairwise_avx2(T* __restrict acc, const T* __restrict src, std::size_t n,
                                                         F f) noexcept {
  core::detail::for_each_blocked<32>(n, [=](std::size_t i) { acc[i] = f(acc[i], src[i]); });
}
#endif

/// acc[i] = f(acc[i], src[i]) for every i, with the widest vectors the CPU has (see above).
template <class T, class F>
inline void apply_pairwise(T* __restrict acc, const T* __restrict src, std::size_t n, F f) noexcept {
#if defined(DISTRIBUTE_X86_AVX2_DISPATCH)
  if (n >= 64 && core::detail::cpu_has_avx2()) return apply_pairwise_avx2(acc, src, n, f);
#endif
  apply_pairwise_portable(acc, src, n, f);
}

// 16-bit floats are reduced in float32 blocks of this many elements (on the stack).
inline constexpr std::size_t kHalfBlock = 256;

/// acc[i] = acc[i] (op) src[i], for a lowered reduction's op: never Mean (see Reduction).
/// 16-bit floats are computed in float32 and rounded once per element.
template <class T>
void combine(T* __restrict acc, const T* __restrict src, std::size_t n, ReduceOp op) noexcept {
  if constexpr (std::is_same_v<T, bfloat16>) {
    // One fused pass on the bits (widen, combine in float32, round): bfloat16 <-> float32 are
    // integer shifts, which vectorise with the rest.
    auto* a = reinterpret_cast<std::uint16_t*>(acc);
    const auto* b = reinterpret_cast<const std::uint16_t*>(src);
    auto fused = [&](auto f) {
      apply_pairwise(a, b, n, [f](std::uint16_t x, std::uint16_t y) {
        return float_to_bf16_bits(f(bf16_bits_to_float(x), bf16_bits_to_float(y)));
      });
    };
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Mean:  // lowered to Sum before it reaches here; summed all the same
        fused([](float x, float y) { return x + y; });
        break;
      case ReduceOp::Min: fused([](float x, float y) { return (x < y || x != x) ? x : y; }); break;
      case ReduceOp::Max: fused([](float x, float y) { return (x > y || x != x) ? x : y; }); break;
      case ReduceOp::Product: fused([](float x, float y) { return x * y; }); break;
    }
  } else if constexpr (is_half_v<T>) {
    float a[kHalfBlock], b[kHalfBlock];
    for (std::size_t i = 0; i < n; i += kHalfBlock) {
      const std::size_t len = std::min(kHalfBlock, n - i);
      widen(acc + i, a, len);
      widen(src + i, b, len);
      combine(a, b, len, op);
      narrow(a, acc + i, len);
    }
  } else if constexpr (std::is_same_v<T, bool>) {
    if (op == ReduceOp::Sum || op == ReduceOp::Max) {  // logical or; Min and Product: logical and
      for (std::size_t i = 0; i < n; ++i) acc[i] = acc[i] || src[i];
    } else {
      for (std::size_t i = 0; i < n; ++i) acc[i] = acc[i] && src[i];
    }
  } else {
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Mean:  // lowered to Sum before it reaches here; summed all the same
        apply_pairwise(acc, src, n, [](T a, T b) { return static_cast<T>(a + b); });
        break;
      // For floats a NaN on either side wins, whichever replica holds it (as TF's minimum/maximum).
      case ReduceOp::Min:
        apply_pairwise(acc, src, n, [](T a, T b) { return (a < b || a != a) ? a : b; });
        break;
      case ReduceOp::Max:
        apply_pairwise(acc, src, n, [](T a, T b) { return (a > b || a != a) ? a : b; });
        break;
      case ReduceOp::Product:
        apply_pairwise(acc, src, n, [](T a, T b) { return static_cast<T>(a * b); });
        break;
    }
  }
}

/// acc[i] /= divisor (integer division truncates, as C++ and TF's integer mean do).
template <class T>
void divide(T* acc, std::size_t n, std::int64_t divisor) noexcept {
  if constexpr (is_half_v<T>) {
    float a[kHalfBlock];
    const auto d = static_cast<float>(divisor);
    for (std::size_t i = 0; i < n; i += kHalfBlock) {
      const std::size_t len = std::min(kHalfBlock, n - i);
      widen(acc + i, a, len);
      for (std::size_t j = 0; j < len; ++j) a[j] /= d;
      narrow(a, acc + i, len);
    }
  } else if constexpr (!std::is_same_v<T, bool>) {
    const T d = static_cast<T>(divisor);
    core::detail::for_each_blocked(n, [=](std::size_t i) { acc[i] = static_cast<T>(acc[i] / d); });
  }
}

/// dst[i] = src_0[i] (op) src_1[i] (op) ..., where src_k = (const T*)srcs[k] + offset, divided by
/// r.divisor() when r divides. `dst` may be src_0. 16-bit floats accumulate the whole reduction in
/// float32 and round once. (Untyped source pointers: one vector type serves every T.)
template <class T>
void reduce_many(T* dst, std::span<const void* const> srcs, std::size_t n, Reduction r,
                 std::size_t offset = 0) noexcept {
  if (srcs.empty() || n == 0) return;
  const ReduceOp op = r.op();
  const std::int64_t divisor = r.divisor();
  auto src = [&](std::size_t k) { return static_cast<const T*>(srcs[k]) + offset; };
  if (srcs.size() == 1 && !r.divides()) {  // nothing to combine or round
    if (dst != src(0)) std::copy(src(0), src(0) + n, dst);
    return;
  }
  if constexpr (is_half_v<T>) {
    float acc[kHalfBlock], next[kHalfBlock];
    const auto d = static_cast<float>(divisor);
    for (std::size_t i = 0; i < n; i += kHalfBlock) {
      const std::size_t len = std::min(kHalfBlock, n - i);
      widen(src(0) + i, acc, len);
      for (std::size_t k = 1; k < srcs.size(); ++k) {
        widen(src(k) + i, next, len);
        combine(acc, next, len, op);
      }
      if (r.divides()) {
        for (std::size_t j = 0; j < len; ++j) acc[j] /= d;
      }
      narrow(acc, dst + i, len);
    }
  } else {
    if (dst != src(0)) std::copy(src(0), src(0) + n, dst);
    for (std::size_t k = 1; k < srcs.size(); ++k) combine(dst, src(k), n, op);
    if (r.divides()) divide(dst, n, divisor);
  }
}

[[noreturn]] DISTRIBUTE_DECL void throw_mean_of_bool(const char* where);

/// Mean of booleans has no meaning; every other op is defined for every element type.
inline void check_op_for_dtype(ReduceOp op, DType dtype, const char* where) {
  if (op == ReduceOp::Mean && dtype == DType::Bool) throw_mean_of_bool(where);
}

#if DISTRIBUTE_DETAIL_DEFINE  // compiled apart with DISTRIBUTE_SEPARATE_COMPILATION (version.hpp)
DISTRIBUTE_DECL void throw_mean_of_bool(const char* where) {
  throw InvalidArgument(fmt::format("{}: MEAN is not defined for bool values", where));
}
#endif

}  // namespace core
DISTRIBUTE_END_NAMESPACE

// Block conversions between 16-bit floats and float32, for the reductions that accumulate
// float16/bfloat16 in float32 (elementwise.hpp). bfloat16 is integer shifts, which compilers
// vectorise; float16 uses the CPU's F16C instructions where it has them (picked at run time,
// as the AVX2 reduction kernels are) and the exact scalar conversion otherwise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <distribute/core/detail/simd_dispatch.hpp>
#include <distribute/core/half.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace core {

template <class T>
inline constexpr bool is_half_v = std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>;

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDA_ARCH__)
#define DISTRIBUTE_X86_F16C_DISPATCH 1
// The compilers' F16C builtins on vector types, rather than <immintrin.h>: that header is 47k
// lines, which every translation unit including the library would pay for.
typedef short half_lanes8 __attribute__((vector_size(16)));
typedef float float_lanes8 __attribute__((vector_size(32)));

__attribute__((target("avx,f16c"))) inline void f16_widen_f16c(const std::uint16_t* src, float* dst,
                                                                std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    half_lanes8 h;
    std::memcpy(&h, src + i, sizeof h);
    const float_lanes8 f = __builtin_ia32_vcvtph2ps256(h);
    std::memcpy(dst + i, &f, sizeof f);
  }
  for (; i < n; ++i) dst[i] = half_bits::f16_to_float(src[i]);
}

__attribute__((target("avx,f16c"))) inline void f16_narrow_f16c(const float* src, std::uint16_t* dst,
                                                                 std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    float_lanes8 f;
    std::memcpy(&f, src + i, sizeof f);
    const half_lanes8 h = __builtin_ia32_vcvtps2ph256(f, 0);  // 0: round to nearest even
    std::memcpy(dst + i, &h, sizeof h);
  }
  for (; i < n; ++i) dst[i] = half_bits::f16_from_float(src[i]);
}

inline bool cpu_has_f16c() noexcept {
  // CPUID leaf 1, ECX bit 29 (F16C): clang's __builtin_cpu_supports knows no "f16c". "avx" also
  // checks that the OS saves the YMM registers.
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    __asm__("cpuid" : "=a"(eax), "=b"(ebx), "=c"(ecx), "=d"(edx) : "a"(1u), "c"(0u));
    return (ecx & (1u << 29)) != 0 && __builtin_cpu_supports("avx") != 0;
  }();
  return has;
}
#endif

// bfloat16 <-> float32 are integer shifts (rounding to nearest even on the way down), written as
// blocked loops so that they vectorise at -O2, and compiled for AVX2 too.
inline float bf16_bits_to_float(std::uint16_t b) noexcept {
  const std::uint32_t w = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &w, sizeof f);
  return f;
}
inline std::uint16_t float_to_bf16_bits(float f) noexcept {
  std::uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const std::uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const std::uint32_t nan = (x >> 16) | 0x40u;
  return static_cast<std::uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}
inline void bf16_widen_portable(const std::uint16_t* __restrict src, float* __restrict dst, std::size_t n) noexcept {
  core::detail::for_each_blocked(n, [=](std::size_t i) { dst[i] = bf16_bits_to_float(src[i]); });
}
inline void bf16_narrow_portable(const float* __restrict src, std::uint16_t* __restrict dst, std::size_t n) noexcept {
  core::detail::for_each_blocked(n, [=](std::size_t i) { dst[i] = float_to_bf16_bits(src[i]); });
}
#if defined(DISTRIBUTE_X86_AVX2_DISPATCH)
__attribute__((target("avx2"))) inline void bf16_widen_avx2(const std::uint16_t* __restrict src, float* __restrict dst,
                                                             std::size_t n) noexcept {
  core::detail::for_each_blocked<32>(n, [=](std::size_t i) { dst[i] = bf16_bits_to_float(src[i]); });
}
__attribute__((target("avx2"))) inline void bf16_narrow_avx2(const float* __restrict src, std::uint16_t* __restrict dst,
                                                              std::size_t n) noexcept {
  core::detail::for_each_blocked<32>(n, [=](std::size_t i) { dst[i] = float_to_bf16_bits(src[i]); });
}
#endif

/// dst[i] = float(src[i]) for a 16-bit float type H.
template <class H>
void widen(const H* src, float* dst, std::size_t n) noexcept {
  static_assert(is_half_v<H>);
  const auto* bits = reinterpret_cast<const std::uint16_t*>(src);
  if constexpr (std::is_same_v<H, bfloat16>) {
#if defined(DISTRIBUTE_X86_AVX2_DISPATCH)
    if (core::detail::cpu_has_avx2()) return bf16_widen_avx2(bits, dst, n);
#endif
    bf16_widen_portable(bits, dst, n);
  } else {
#if defined(DISTRIBUTE_X86_F16C_DISPATCH)
    if (cpu_has_f16c()) return f16_widen_f16c(bits, dst, n);
#endif
    for (std::size_t i = 0; i < n; ++i) dst[i] = half_bits::f16_to_float(bits[i]);
  }
}

/// dst[i] = H(src[i]), rounded to nearest even.
template <class H>
void narrow(const float* src, H* dst, std::size_t n) noexcept {
  static_assert(is_half_v<H>);
  auto* bits = reinterpret_cast<std::uint16_t*>(dst);
  if constexpr (std::is_same_v<H, bfloat16>) {
#if defined(DISTRIBUTE_X86_AVX2_DISPATCH)
    if (core::detail::cpu_has_avx2()) return bf16_narrow_avx2(src, bits, n);
#endif
    bf16_narrow_portable(src, bits, n);
  } else {
#if defined(DISTRIBUTE_X86_F16C_DISPATCH)
    if (cpu_has_f16c()) return f16_narrow_f16c(src, bits, n);
#endif
    for (std::size_t i = 0; i < n; ++i) bits[i] = half_bits::f16_from_float(src[i]);
  }
}

}  // namespace core
DISTRIBUTE_END_NAMESPACE

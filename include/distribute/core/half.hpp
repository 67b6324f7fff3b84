// The 16-bit floating-point element types: ds::float16 (IEEE binary16, TF's float16) and
// ds::bfloat16 (the upper half of a float32, TF's bfloat16).
//
// Where the compiler has C++23's std::float16_t / std::bfloat16_t they are those types; otherwise
// they are small types of the library's own: 16 bits of storage, converted to and from float with
// round-to-nearest-even, and arithmetic carried out in float (each operation rounds once). The
// library's reductions do not go through these operators: they accumulate whole reductions in
// float32 and round once at the end (core/elementwise.hpp).
#pragma once

#include <bit>
#include <cstdint>
#include <limits>

#include <distribute/version.hpp>

#if defined(__STDCPP_FLOAT16_T__) || defined(__STDCPP_BFLOAT16_T__)
#include <stdfloat>
#endif

DISTRIBUTE_BEGIN_NAMESPACE
namespace half_bits {

/// float → binary16 bits, round to nearest even; NaN stays NaN (quiet), overflow gives ±inf.
constexpr std::uint16_t f16_from_float(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t a = x & 0x7fffffffu;
  if (a >= 0x7f800000u) return static_cast<std::uint16_t>(sign | (a > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  const std::uint32_t e = a >> 23;
  if (e < 113) {  // below 2^-14: a subnormal binary16 (or zero), m * 2^-24
    if (e < 101) return sign;  // below 2^-26: rounds to zero
    const std::uint32_t m = (a & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126 - e;  // 14..25
    std::uint32_t q = m >> shift;
    const std::uint32_t rem = m & ((1u << shift) - 1u), halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (q & 1u))) ++q;
    return static_cast<std::uint16_t>(sign | q);
  }
  std::uint32_t h = ((e - 112) << 10) | ((a >> 13) & 0x3ffu);
  const std::uint32_t rem = a & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry into the exponent is right
  return static_cast<std::uint16_t>(sign | h);
}

/// binary16 bits → float (exact).
constexpr float f16_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (m << 13));
  if (e == 0) {
    const float v = static_cast<float>(m) * 0x1p-24f;
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | ((e + 112) << 23) | (m << 13));
}

/// float → bfloat16 bits, round to nearest even; NaN stays NaN (quiet).
constexpr std::uint16_t bf16_from_float(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

constexpr float bf16_to_float(std::uint16_t b) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

/// The library's own 16-bit float: storage plus float conversions; Traits names the encoding.
template <class Traits>
class float16_storage {
 public:
  constexpr float16_storage() noexcept = default;
  // Narrowing is explicit, as for std::float16_t: float16(x), static_cast<bfloat16>(x).
  constexpr explicit float16_storage(float f) noexcept : bits_(Traits::from_float(f)) {}
  constexpr explicit float16_storage(double d) noexcept : float16_storage(static_cast<float>(d)) {}
  constexpr explicit float16_storage(int i) noexcept : float16_storage(static_cast<float>(i)) {}
  constexpr explicit float16_storage(std::int64_t i) noexcept : float16_storage(static_cast<float>(i)) {}
  constexpr operator float() const noexcept { return Traits::to_float(bits_); }  // NOLINT: widening is exact

  static constexpr float16_storage from_bits(std::uint16_t b) noexcept {
    float16_storage h;
    h.bits_ = b;
    return h;
  }
  constexpr std::uint16_t bits() const noexcept { return bits_; }

  friend constexpr float16_storage operator+(float16_storage a, float16_storage b) noexcept {
    return float16_storage(float(a) + float(b));
  }
  friend constexpr float16_storage operator-(float16_storage a, float16_storage b) noexcept {
    return float16_storage(float(a) - float(b));
  }
  friend constexpr float16_storage operator*(float16_storage a, float16_storage b) noexcept {
    return float16_storage(float(a) * float(b));
  }
  friend constexpr float16_storage operator/(float16_storage a, float16_storage b) noexcept {
    return float16_storage(float(a) / float(b));
  }
  constexpr float16_storage operator-() const noexcept { return from_bits(static_cast<std::uint16_t>(bits_ ^ 0x8000u)); }
  constexpr float16_storage& operator+=(float16_storage b) noexcept { return *this = *this + b; }
  constexpr float16_storage& operator-=(float16_storage b) noexcept { return *this = *this - b; }
  constexpr float16_storage& operator*=(float16_storage b) noexcept { return *this = *this * b; }
  constexpr float16_storage& operator/=(float16_storage b) noexcept { return *this = *this / b; }
  // As floats compare: NaN is unequal to everything, -0 == +0.
  friend constexpr bool operator==(float16_storage a, float16_storage b) noexcept { return float(a) == float(b); }
  friend constexpr bool operator<(float16_storage a, float16_storage b) noexcept { return float(a) < float(b); }
  friend constexpr bool operator>(float16_storage a, float16_storage b) noexcept { return float(a) > float(b); }
  friend constexpr bool operator<=(float16_storage a, float16_storage b) noexcept { return float(a) <= float(b); }
  friend constexpr bool operator>=(float16_storage a, float16_storage b) noexcept { return float(a) >= float(b); }

 private:
  std::uint16_t bits_ = 0;
};

struct binary16_encoding {
  static constexpr std::uint16_t from_float(float f) noexcept { return f16_from_float(f); }
  static constexpr float to_float(std::uint16_t b) noexcept { return f16_to_float(b); }
};
struct bfloat16_encoding {
  static constexpr std::uint16_t from_float(float f) noexcept { return bf16_from_float(f); }
  static constexpr float to_float(std::uint16_t b) noexcept { return bf16_to_float(b); }
};

}  // namespace half_bits

#if defined(__STDCPP_FLOAT16_T__)
using float16 = std::float16_t;
#else
using float16 = half_bits::float16_storage<half_bits::binary16_encoding>;
#endif
#if defined(__STDCPP_BFLOAT16_T__)
using bfloat16 = std::bfloat16_t;
#else
using bfloat16 = half_bits::float16_storage<half_bits::bfloat16_encoding>;
#endif
static_assert(sizeof(float16) == 2 && sizeof(bfloat16) == 2);

/// The bits of a 16-bit float value, and a value from bits (for either representation).
template <class H>
constexpr std::uint16_t to_bits(H h) noexcept {
  return std::bit_cast<std::uint16_t>(h);
}
template <class H>
constexpr H from_bits(std::uint16_t b) noexcept {
  return std::bit_cast<H>(b);
}

DISTRIBUTE_END_NAMESPACE

// numeric_limits for the library's own types (std::float16_t has its own).
template <class Traits>
class std::numeric_limits<distribute::half_bits::float16_storage<Traits>> {
  using H = distribute::half_bits::float16_storage<Traits>;
  static constexpr bool binary16 = std::is_same_v<Traits, distribute::half_bits::binary16_encoding>;

 public:
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = true;
  static constexpr bool is_integer = false;
  static constexpr bool is_exact = false;
  static constexpr bool has_infinity = true;
  static constexpr bool has_quiet_NaN = true;
  static constexpr bool is_iec559 = binary16;
  static constexpr int digits = binary16 ? 11 : 8;
  static constexpr int radix = 2;
  static constexpr H min() noexcept { return H::from_bits(binary16 ? 0x0400 : 0x0080); }
  static constexpr H max() noexcept { return H::from_bits(binary16 ? 0x7bff : 0x7f7f); }
  static constexpr H lowest() noexcept { return H::from_bits(binary16 ? 0xfbff : 0xff7f); }
  static constexpr H epsilon() noexcept { return H::from_bits(binary16 ? 0x1400 : 0x3c00); }
  static constexpr H infinity() noexcept { return H::from_bits(binary16 ? 0x7c00 : 0x7f80); }
  static constexpr H quiet_NaN() noexcept { return H::from_bits(binary16 ? 0x7e00 : 0x7fc0); }
  static constexpr H denorm_min() noexcept { return H::from_bits(1); }
};

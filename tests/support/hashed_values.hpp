// Deterministic test inputs from a hash of (stream, index): splitmix64, cheap even at -O0, where a
// <random> engine with a distribution per element or libm took most of some suites' time.
#pragma once

#include <cstddef>
#include <cstdint>

namespace test_support {

/// splitmix64: a well-mixed 64-bit value of x.
constexpr std::uint64_t splitmix64(std::uint64_t x) noexcept {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// 64 hashed bits, one value per (stream, index): a rank or replica, and an element.
constexpr std::uint64_t hashed_bits(std::uint64_t stream, std::size_t index) noexcept {
  return splitmix64((stream << 40) ^ static_cast<std::uint64_t>(index));
}

/// A double in [-1, 1) that uses every bit of its mantissa, one per (stream, index).
constexpr double hashed_unit(std::uint64_t stream, std::size_t index) noexcept {
  return static_cast<double>(hashed_bits(stream, index) >> 11) * 0x1.0p-52 - 1.0;
}

}  // namespace test_support

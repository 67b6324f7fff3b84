// Initializer: how a variable's first value is made from its shape, instead of being passed
// (TF's tf.keras.initializers: Zeros, Constant, RandomUniform, RandomNormal). A variable placed on
// a ps task is filled by the ps task itself, so a table of ten million rows is never built on the
// coordinator nor sent; the same variable placed in this process is filled here.
//
// Random values are a function of (seed, the element's position in the whole variable): shards
// hold the same numbers whatever the shard count, and whichever process fills them.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include <fmt/format.h>

#include <distribute/core/dtype.hpp>
#include <distribute/core/error.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

class Initializer {
 public:
  enum class Kind : std::uint8_t { Constant = 0, RandomUniform = 1, RandomNormal = 2 };

  /// Every element 0 (TF's Zeros).
  static Initializer zeros() { return Initializer(Kind::Constant, 0.0, 0.0, 0); }
  /// Every element `value` (TF's Constant); it must be exact in the variable's dtype when that is
  /// an integer type.
  static Initializer constant(double value) { return checked(Kind::Constant, value, 0.0, 0); }
  /// Uniform in [minval, maxval) (TF's RandomUniform; Keras's Embedding uses (-0.05, 0.05)).
  static Initializer random_uniform(double minval = -0.05, double maxval = 0.05, std::uint64_t seed = 0) {
    return checked(Kind::RandomUniform, minval, maxval, seed);
  }
  /// Normal with `mean` and `stddev` (TF's RandomNormal).
  static Initializer random_normal(double mean = 0.0, double stddev = 0.05, std::uint64_t seed = 0) {
    return checked(Kind::RandomNormal, mean, stddev, seed);
  }
  /// What the wire carries; InvalidArgument for a bad kind or parameters (from a stranger).
  static Initializer from_parts(std::uint8_t kind, double a, double b, std::uint64_t seed, std::uint64_t offset) {
    if (kind > static_cast<std::uint8_t>(Kind::RandomNormal)) {
      throw InvalidArgument(fmt::format("Initializer: unknown kind {}", kind));
    }
    return checked(static_cast<Kind>(kind), a, b, seed).from(offset);
  }

  /// The values this one gives from element `first_element` on: what a shard that starts there
  /// holds (a shard of rows [r, ...) of width w starts at element r * w).
  Initializer from(std::uint64_t first_element) const {
    Initializer out = *this;
    out.offset_ += first_element;
    return out;
  }

  Kind kind() const noexcept { return kind_; }
  /// constant: the value; random_uniform: minval, maxval; random_normal: mean, stddev.
  double a() const noexcept { return a_; }
  double b() const noexcept { return b_; }
  std::uint64_t seed() const noexcept { return seed_; }
  /// The element of the whole variable that the first element it fills is.
  std::uint64_t offset() const noexcept { return offset_; }

  /// InvalidArgument (naming `what`) when this initializer cannot make values of `dtype`.
  void check_dtype(DType dtype, std::string_view what) const {
    if (kind_ != Kind::Constant && !is_floating(dtype)) {
      throw InvalidArgument(fmt::format("{}: {} makes floating-point values, and {} is {}", what, describe(), what,
                                        to_string(dtype)));
    }
    if (kind_ == Kind::Constant && !is_floating(dtype)) {
      const bool exact = visit_dtype(dtype, [&](auto zero) {
        using E = decltype(zero);
        if constexpr (std::is_same_v<E, bool>) return a_ == 0.0 || a_ == 1.0;
        else {
          const double lo = static_cast<double>(std::numeric_limits<E>::lowest());
          const double hi = static_cast<double>(std::numeric_limits<E>::max());
          return a_ >= lo && a_ <= hi && static_cast<double>(static_cast<E>(a_)) == a_;
        }
      });
      if (!exact) throw InvalidArgument(fmt::format("{}: {} is not a {} value", what, describe(), to_string(dtype)));
    }
  }

  /// Writes its elements [first_element, first_element + out.size() / size_of(dtype)) into `out`
  /// (check_dtype first).
  void fill(DType dtype, std::span<std::byte> out, std::uint64_t first_element = 0) const {
    visit_dtype(dtype, [&](auto zero) {
      using E = decltype(zero);
      const std::size_t n = out.size() / sizeof(E);
      constexpr std::size_t kBlock = 256;
      E block[kBlock];
      for (std::size_t at = 0; at < n; at += kBlock) {
        const std::size_t m = n - at < kBlock ? n - at : kBlock;
        for (std::size_t j = 0; j < m; ++j) block[j] = element<E>(offset_ + first_element + at + j);
        std::memcpy(out.data() + at * sizeof(E), block, m * sizeof(E));
      }
    });
  }

  /// "random_uniform(-0.05, 0.05, seed=3)", for messages.
  std::string describe() const {
    switch (kind_) {
      case Kind::Constant: return fmt::format("constant({})", a_);
      case Kind::RandomUniform: return fmt::format("random_uniform({}, {}, seed={})", a_, b_, seed_);
      case Kind::RandomNormal: return fmt::format("random_normal({}, {}, seed={})", a_, b_, seed_);
    }
    return "?";
  }

  friend bool operator==(const Initializer&, const Initializer&) = default;

 private:
  Initializer(Kind kind, double a, double b, std::uint64_t seed) : kind_(kind), a_(a), b_(b), seed_(seed) {}

  static Initializer checked(Kind kind, double a, double b, std::uint64_t seed) {
    const Initializer init(kind, a, b, seed);
    if (!std::isfinite(a) || !std::isfinite(b)) {
      throw InvalidArgument(fmt::format("Initializer: {} has a parameter that is not finite", init.describe()));
    }
    if (kind == Kind::RandomUniform && !(a < b)) {
      throw InvalidArgument(fmt::format("Initializer: {} needs minval < maxval", init.describe()));
    }
    if (kind == Kind::RandomNormal && b < 0) {
      throw InvalidArgument(fmt::format("Initializer: {} needs stddev >= 0", init.describe()));
    }
    return init;
  }

  // splitmix64's finaliser: a well-mixed 64-bit value of (seed, counter).
  static std::uint64_t mix(std::uint64_t seed, std::uint64_t counter) noexcept {
    std::uint64_t z = seed * 0x9e3779b97f4a7c15ULL + counter * 0xbf58476d1ce4e5b9ULL + 0x94d049bb133111ebULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // In [0, 1), 53 random bits.
  static double unit(std::uint64_t bits) noexcept { return static_cast<double>(bits >> 11) * 0x1.0p-53; }

  template <class E>
  E element(std::uint64_t i) const noexcept {
    double v = a_;
    if (kind_ == Kind::RandomUniform) {
      v = a_ + (b_ - a_) * unit(mix(seed_, i));
      if (v >= b_) v = a_;  // rounding at the top end
    } else if (kind_ == Kind::RandomNormal) {  // Box-Muller on two draws of this element
      const double u1 = 1.0 - unit(mix(seed_, 2 * i)), u2 = unit(mix(seed_, 2 * i + 1));
      v = a_ + b_ * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    }
    if constexpr (std::is_same_v<E, bool>) return v != 0.0;
    else return static_cast<E>(v);
  }

  Kind kind_;
  double a_, b_;
  std::uint64_t seed_;
  std::uint64_t offset_ = 0;
};

DISTRIBUTE_END_NAMESPACE

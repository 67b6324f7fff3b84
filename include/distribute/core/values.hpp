// Distributed values: PerReplica, Mirrored and Sharded, each tied to the strategy type S that
// made it, so that a value of one strategy handed to another is a compile error.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <distribute/core/error.hpp>
#include <distribute/core/shape.hpp>
#include <distribute/core/tensor.hpp>
#include <distribute/core/tensor_traits.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

/// One component per local replica, in replica order.
template <class T, class S>
class PerReplica {
 public:
  using value_type = T;
  using strategy_type = S;

  PerReplica() = default;
  explicit PerReplica(std::vector<T> values) : values_(std::move(values)) {}

  std::size_t size() const noexcept { return values_.size(); }
  T& operator[](std::size_t i) { return values_.at(i); }
  const T& operator[](std::size_t i) const { return values_.at(i); }
  const std::vector<T>& values() const& noexcept { return values_; }
  std::vector<T>& values() & noexcept { return values_; }
  std::vector<T> values() && noexcept { return std::move(values_); }
  auto begin() const noexcept { return values_.begin(); }
  auto end() const noexcept { return values_.end(); }

  friend bool operator==(const PerReplica&, const PerReplica&) = default;

 private:
  std::vector<T> values_;
};

/// One logical value kept identical on every replica.
template <class T, class S>
class Mirrored {
 public:
  using value_type = T;
  using strategy_type = S;

  Mirrored() = default;
  explicit Mirrored(std::vector<T> values) : values_(std::move(values)) {
    if (values_.empty()) throw InvalidArgument("Mirrored: needs at least one copy");
  }

  const T& primary() const { return values_.front(); }
  std::size_t size() const noexcept { return values_.size(); }
  const T& operator[](std::size_t i) const { return values_.at(i); }
  const std::vector<T>& values() const noexcept { return values_; }

  friend bool operator==(const Mirrored&, const Mirrored&) = default;

 private:
  std::vector<T> values_;
};

/// One logical value split into shards along axis 0.
template <class T, class S>
class Sharded {
 public:
  using value_type = T;
  using strategy_type = S;

  Sharded() = default;
  /// Shards must agree on every dimension but the first.
  explicit Sharded(std::vector<T> shards) : shards_(std::move(shards)) {
    if constexpr (TensorLike<T>) {
      for (std::size_t i = 0; i < shards_.size(); ++i) {
        const Shape s = shape_of(shards_[i]);
        const Shape s0 = shape_of(shards_[0]);
        if (s.empty() || s.size() != s0.size() || !std::equal(s.begin() + 1, s.end(), s0.begin() + 1)) {
          throw InvalidArgument(fmt::format("Sharded: shard {} has shape {} which does not stack with shard 0's {}", i,
                                            shape_string(s), shape_string(s0)));
        }
      }
    }
  }

  const std::vector<T>& shards() const noexcept { return shards_; }
  std::size_t num_shards() const noexcept { return shards_.size(); }

  /// The logical (concatenated) shape.
  Shape shape() const
    requires TensorLike<T>
  {
    if (shards_.empty()) return {0};
    Shape s = shape_of(shards_.front());
    s[0] = 0;
    for (const auto& shard : shards_) s[0] += shape_of(shard)[0];
    return s;
  }

  /// The shards concatenated along axis 0 (a Tensor of their element type).
  auto to_tensor() const
    requires TensorLike<T>
  {
    Shape s = shape();
    std::vector<element_t<T>> out;
    out.reserve(static_cast<std::size_t>(num_elements(s)));
    for (const auto& shard : shards_) {
      const auto* p = tensor_traits<T>::data(shard);
      out.insert(out.end(), p, p + element_count(shard));
    }
    return Tensor<element_t<T>>(std::move(s), std::move(out));
  }

 private:
  std::vector<T> shards_;
};

namespace core {
template <class V>
struct is_per_replica : std::false_type {};
template <class T, class S>
struct is_per_replica<PerReplica<T, S>> : std::true_type {};
template <class V>
struct is_mirrored : std::false_type {};
template <class T, class S>
struct is_mirrored<Mirrored<T, S>> : std::true_type {};
}  // namespace core

/// True for PerReplica and Mirrored values (those `run` unwraps per replica).
template <class V>
concept DistributedValue = core::is_per_replica<std::remove_cvref_t<V>>::value ||
                           core::is_mirrored<std::remove_cvref_t<V>>::value;

DISTRIBUTE_END_NAMESPACE

// Printed by the formatters below, not as generic ranges.
template <class T, class S, class Char>
struct fmt::is_range<distribute::PerReplica<T, S>, Char> : std::false_type {};

/// fmt::format("{}", per_replica) → "PerReplica{0: ..., 1: ...}" as TF prints it.
template <class T, class S>
struct fmt::formatter<distribute::PerReplica<T, S>> {
  constexpr auto parse(format_parse_context& ctx) { return ctx.begin(); }
  template <class Ctx>
  auto format(const distribute::PerReplica<T, S>& v, Ctx& ctx) const {
    auto out = fmt::format_to(ctx.out(), "PerReplica{{");
    for (std::size_t i = 0; i < v.size(); ++i) out = fmt::format_to(out, "{}{}: {}", i ? ", " : "", i, v[i]);
    return fmt::format_to(out, "}}");
  }
};

template <class T, class S>
struct fmt::formatter<distribute::Mirrored<T, S>> {
  constexpr auto parse(format_parse_context& ctx) { return ctx.begin(); }
  template <class Ctx>
  auto format(const distribute::Mirrored<T, S>& v, Ctx& ctx) const {
    auto out = fmt::format_to(ctx.out(), "Mirrored{{");
    for (std::size_t i = 0; i < v.size(); ++i) out = fmt::format_to(out, "{}{}: {}", i ? ", " : "", i, v[i]);
    return fmt::format_to(out, "}}");
  }
};

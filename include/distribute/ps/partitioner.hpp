// Variable partitioners (TF's tf.distribute.experimental.partitioners) and the "div" rule that
// turns a shard count into row ranges.
//
// A partitioner looks at a variable's shape and dtype and answers, as TF does, with one entry per
// dimension: how many shards along that axis (only axis 0 is ever split by
// ParameterServerStrategy). The three built-in ones follow TF's algorithms:
//
//   FixedShardsPartitioner(n)      min(n, rows)
//   MinSizePartitioner(min, max)   as many shards as keep each >= min bytes, at most max (and rows)
//   MaxSizePartitioner(max, cap)   as few shards as keep each <= max bytes, at most cap (0: no cap)
//
// Two deliberate differences: a scalar (rank 0) has no axis to split and gets an empty list, and
// an axis of size 0 gets 1 shard (TF would return 0 or divide by zero there).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <distribute/core/dtype.hpp>
#include <distribute/core/error.hpp>
#include <distribute/core/shape.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

/// Shards per axis, one entry per dimension of the partitioned shape (TF's partition list).
using Partitions = std::vector<std::int64_t>;

/// Any callable `(shape, dtype) -> Partitions`: the built-in partitioners or a user's own.
using VariablePartitioner = std::function<Partitions(const Shape&, DType)>;

namespace ps::detail {

inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

inline void check_positive(std::int64_t value, const char* partitioner, const char* argument) {
  if (value < 1) {
    throw InvalidArgument(fmt::format("{}: {} must be positive, got {}", partitioner, argument, value));
  }
}

/// TF reports shapes of partially known rank here; ours are always known, but negative sizes are
/// still a caller error.
inline void check_partitionable(const Shape& shape, std::size_t axis, const char* partitioner) {
  for (auto d : shape) {
    if (d < 0) throw InvalidArgument(fmt::format("{}: shape {} has a negative dimension", partitioner, shape_string(shape)));
  }
  if (axis >= shape.size()) {
    throw InvalidArgument(fmt::format("{}: axis {} is out of range for shape {} (rank {})", partitioner, axis,
                                      shape_string(shape), shape.size()));
  }
}

/// One shard on every axis but `axis`, which gets `shards`.
inline Partitions partitions_on_axis(const Shape& shape, std::size_t axis, std::int64_t shards) {
  Partitions p(shape.size(), 1);
  p[axis] = shards;
  return p;
}

}  // namespace ps::detail

/// A fixed number of shards along `axis`, but never more shards than rows.
class FixedShardsPartitioner {
 public:
  explicit FixedShardsPartitioner(std::int64_t num_shards) : num_shards_(num_shards) {
    ps::detail::check_positive(num_shards, "FixedShardsPartitioner", "num_shards");
  }

  Partitions operator()(const Shape& shape, DType /*dtype*/, std::size_t axis = 0) const {
    if (shape.empty()) return {};
    ps::detail::check_partitionable(shape, axis, "FixedShardsPartitioner");
    return ps::detail::partitions_on_axis(shape, axis, std::max<std::int64_t>(1, std::min(num_shards_, shape[axis])));
  }

  std::int64_t num_shards() const noexcept { return num_shards_; }

 private:
  std::int64_t num_shards_;
};

/// Shards of at least `min_shard_bytes` each, as many as that allows, at most `max_shards` (TF's
/// min_max_variable_partitioner). `bytes_per_string` is TF's size estimate for string elements;
/// kept for the same signature, and used once the library has string tensors.
class MinSizePartitioner {
 public:
  explicit MinSizePartitioner(std::int64_t min_shard_bytes = 256 << 10, std::int64_t max_shards = 1,
                              std::int64_t bytes_per_string = 16)
      : min_shard_bytes_(min_shard_bytes), max_shards_(max_shards), bytes_per_string_(bytes_per_string) {
    ps::detail::check_positive(min_shard_bytes, "MinSizePartitioner", "min_shard_bytes");
    ps::detail::check_positive(max_shards, "MinSizePartitioner", "max_shards");
    ps::detail::check_positive(bytes_per_string, "MinSizePartitioner", "bytes_per_string");
  }

  Partitions operator()(const Shape& shape, DType dtype, std::size_t axis = 0) const {
    if (shape.empty()) return {};
    ps::detail::check_partitionable(shape, axis, "MinSizePartitioner");
    const std::int64_t total_bytes = num_elements(shape) * static_cast<std::int64_t>(size_of(dtype));
    // ceil(total / min) shards keep each at least min bytes; the axis and max_shards cap it.
    const std::int64_t by_size = ps::detail::ceil_div(total_bytes, min_shard_bytes_);
    const std::int64_t shards = std::max<std::int64_t>(1, std::min({shape[axis], max_shards_, by_size}));
    return ps::detail::partitions_on_axis(shape, axis, shards);
  }

  std::int64_t min_shard_bytes() const noexcept { return min_shard_bytes_; }
  std::int64_t max_shards() const noexcept { return max_shards_; }
  std::int64_t bytes_per_string() const noexcept { return bytes_per_string_; }

 private:
  std::int64_t min_shard_bytes_;
  std::int64_t max_shards_;
  std::int64_t bytes_per_string_;
};

/// Shards of at most `max_shard_bytes` each, as few as that allows (TF's
/// variable_axis_size_partitioner). A single row larger than the limit still gets its own shard.
/// `max_shards` (0: no limit) takes precedence over the byte limit.
class MaxSizePartitioner {
 public:
  explicit MaxSizePartitioner(std::int64_t max_shard_bytes, std::int64_t max_shards = 0, std::int64_t bytes_per_string = 16)
      : max_shard_bytes_(max_shard_bytes), max_shards_(max_shards), bytes_per_string_(bytes_per_string) {
    ps::detail::check_positive(max_shard_bytes, "MaxSizePartitioner", "max_shard_bytes");
    if (max_shards < 0) {
      throw InvalidArgument(
          fmt::format("MaxSizePartitioner: max_shards must be positive (or 0 for no limit), got {}", max_shards));
    }
    ps::detail::check_positive(bytes_per_string, "MaxSizePartitioner", "bytes_per_string");
  }

  Partitions operator()(const Shape& shape, DType dtype, std::size_t axis = 0) const {
    if (shape.empty()) return {};
    ps::detail::check_partitionable(shape, axis, "MaxSizePartitioner");
    const std::int64_t rows = shape[axis];
    if (rows == 0) return ps::detail::partitions_on_axis(shape, axis, 1);
    const std::int64_t bytes_per_row = num_elements(shape) / rows * static_cast<std::int64_t>(size_of(dtype));
    // How many rows fit in one shard (at least one), then how many shards hold all rows.
    const std::int64_t rows_per_shard = bytes_per_row == 0 ? rows : std::max<std::int64_t>(1, max_shard_bytes_ / bytes_per_row);
    std::int64_t shards = ps::detail::ceil_div(rows, rows_per_shard);
    if (max_shards_ > 0) shards = std::min(shards, max_shards_);
    return ps::detail::partitions_on_axis(shape, axis, shards);
  }

  std::int64_t max_shard_bytes() const noexcept { return max_shard_bytes_; }
  std::int64_t max_shards() const noexcept { return max_shards_; }
  std::int64_t bytes_per_string() const noexcept { return bytes_per_string_; }

 private:
  std::int64_t max_shard_bytes_;
  std::int64_t max_shards_;
  std::int64_t bytes_per_string_;
};

/// The number of axis-0 shards a partitioner's answer asks for, checked as ParameterServerStrategy
/// does: one entry per dimension, every entry but the first 1, the first positive. Clamped to the
/// number of rows; a scalar is never split (1).
inline std::int64_t shards_along_first_axis(const Partitions& partitions, const Shape& shape) {
  if (shape.empty()) return 1;
  const bool well_formed = partitions.size() == shape.size() && partitions[0] >= 1 &&
                           std::all_of(partitions.begin() + 1, partitions.end(), [](std::int64_t p) { return p == 1; });
  if (!well_formed) {
    throw InvalidArgument(fmt::format(
        "variable partitioner returned [{}] for shape {}; it must return one entry per dimension, a positive first "
        "entry and 1 for every other axis (only axis 0 can be partitioned)",
        fmt::join(partitions, ", "), shape_string(shape)));
  }
  return std::max<std::int64_t>(1, std::min(partitions[0], shape[0]));
}

/// The "div" rule: rows are split into contiguous shards as even as possible, the first
/// rows % shards shards taking one row more. 13 rows over 5 shards: 3, 3, 3, 2, 2.
inline std::vector<std::int64_t> shard_row_counts(std::int64_t rows, std::int64_t shards) {
  if (rows < 0) throw InvalidArgument(fmt::format("shard_row_counts: rows must not be negative, got {}", rows));
  if (shards < 1) throw InvalidArgument(fmt::format("shard_row_counts: shards must be positive, got {}", shards));
  if (shards > std::max<std::int64_t>(rows, 1)) {
    throw InvalidArgument(fmt::format("shard_row_counts: cannot split {} rows into {} shards; every shard needs a row",
                                      rows, shards));
  }
  const std::int64_t base = rows / shards;
  const std::int64_t extra = rows % shards;
  std::vector<std::int64_t> counts(static_cast<std::size_t>(shards), base);
  for (std::int64_t i = 0; i < extra; ++i) ++counts[static_cast<std::size_t>(i)];
  return counts;
}

/// Where each shard starts under the div rule, plus `rows` at the end: 13 over 5 gives
/// 0, 3, 6, 9, 11, 13 (shard i holds rows [offsets[i], offsets[i + 1])).
inline std::vector<std::int64_t> shard_row_offsets(std::int64_t rows, std::int64_t shards) {
  const auto counts = shard_row_counts(rows, shards);
  std::vector<std::int64_t> offsets{0};
  for (auto c : counts) offsets.push_back(offsets.back() + c);
  return offsets;
}

DISTRIBUTE_END_NAMESPACE

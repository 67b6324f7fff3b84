// Dataset options: how strategy.distribute_dataset shards a dataset across worker processes.
#pragma once

#include <string_view>

#include <fmt/format.h>

#include <distribute/version.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace data {

/// How distribute_dataset splits the input across workers (TF's tf.data.experimental.AutoShardPolicy).
/// It only matters with more than one worker; inside one process the global batch is always split
/// among the local replicas.
enum class AutoShardPolicy {
  /// File when the dataset reads files and there are at least as many files as workers, else Data.
  Auto,
  /// Worker w reads the files i with i % num_workers == w (each file is read by one worker only).
  /// InvalidArgument when the dataset reads no files or fewer files than there are workers.
  File,
  /// Every worker reads the whole dataset and keeps its replicas' slices of each global batch.
  Data,
  /// No sharding: every worker reads (and trains on) everything.
  Off,
};

constexpr std::string_view to_string(AutoShardPolicy p) noexcept {
  switch (p) {
    case AutoShardPolicy::Auto: return "AUTO";
    case AutoShardPolicy::File: return "FILE";
    case AutoShardPolicy::Data: return "DATA";
    case AutoShardPolicy::Off: return "OFF";
  }
  return "?";
}

/// What Dataset::with_options attaches to a dataset; transformations keep the options of the
/// dataset they start from.
struct Options {
  AutoShardPolicy auto_shard_policy = AutoShardPolicy::Auto;

  friend bool operator==(const Options&, const Options&) = default;
};

}  // namespace data
DISTRIBUTE_END_NAMESPACE

template <>
struct fmt::formatter<distribute::data::AutoShardPolicy> : fmt::formatter<std::string_view> {
  template <class Ctx>
  auto format(distribute::data::AutoShardPolicy p, Ctx& ctx) const {
    return fmt::formatter<std::string_view>::format(distribute::data::to_string(p), ctx);
  }
};

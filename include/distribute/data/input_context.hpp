// InputContext: what distribute_datasets_from_function tells the function that builds one input
// pipeline (TF's tf.distribute.InputContext).
#pragma once

#include <cstdint>

#include <fmt/format.h>

#include <distribute/core/error.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

/// One input pipeline's place among all of them: there is one pipeline per worker, and the
/// pipeline's dataset should be batched per replica and sharded by the function itself.
struct InputContext {
  /// How many input pipelines (workers) there are.
  int num_input_pipelines = 1;
  /// Which one this is, in [0, num_input_pipelines).
  int input_pipeline_id = 0;
  /// Replicas over all workers whose gradients are aggregated each step.
  int num_replicas_in_sync = 1;

  /// The batch each replica should get for a global batch of `global_batch_size`; throws
  /// InvalidArgument unless the replicas divide it evenly.
  std::int64_t get_per_replica_batch_size(std::int64_t global_batch_size) const {
    if (num_replicas_in_sync < 1 || global_batch_size % num_replicas_in_sync != 0) {
      throw InvalidArgument(fmt::format(
          "InputContext::get_per_replica_batch_size: the global batch size {} is not divisible by "
          "num_replicas_in_sync {}",
          global_batch_size, num_replicas_in_sync));
    }
    return global_batch_size / num_replicas_in_sync;
  }

  friend bool operator==(const InputContext&, const InputContext&) = default;
};

DISTRIBUTE_END_NAMESPACE

// ParameterServerStrategy (the in-process part): validates a parameter-server cluster and places
// the variables created in its scope on ps tasks, round-robin, optionally partitioned into
// ShardedVariables by a partitioner.
//
// What is not here yet: the variables are stored in this (the coordinator's) process, with device
// strings that name their ps task; the ps variable service, ClusterCoordinator and remote
// functions come next (docs/parameter-server.md).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <distribute/cluster/cluster_resolver.hpp>
#include <distribute/cluster/tf_config.hpp>
#include <distribute/core/context.hpp>
#include <distribute/core/error.hpp>
#include <distribute/ps/partitioner.hpp>
#include <distribute/ps/placement.hpp>
#include <distribute/ps/sharded_variable.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

namespace detail {

/// Checks the cluster has what parameter-server training needs: one chief (the coordinator), at
/// least one ps and one worker, and no job besides those and an evaluator. Returns the ps count.
inline int check_parameter_server_cluster(const ClusterSpec& spec) {
  constexpr std::string_view what = "ParameterServerStrategy";
  if (spec.empty()) {
    throw ClusterConfigError(fmt::format("{}: the cluster spec is empty; parameter-server training needs a 'chief' "
                                         "(the coordinator), at least one 'ps' and at least one 'worker' task",
                                         what));
  }
  const auto jobs = fmt::format("{}", fmt::join(spec.jobs(), ", "));
  for (const auto& job : spec.jobs()) {
    if (job != "chief" && job != "ps" && job != "worker" && job != "evaluator") {
      throw ClusterConfigError(fmt::format("{}: the cluster has a job '{}'; the allowed jobs are 'chief', 'ps', 'worker' "
                                           "and 'evaluator'",
                                           what, job));
    }
  }
  if (cluster_job_size(spec, "ps") < 1) {
    throw ClusterConfigError(fmt::format("{}: the cluster (jobs: {}) has no 'ps' task; there must be at least one "
                                         "parameter server",
                                         what, jobs));
  }
  if (cluster_job_size(spec, "worker") < 1) {
    throw ClusterConfigError(
        fmt::format("{}: the cluster (jobs: {}) has no 'worker' task; there must be at least one worker", what, jobs));
  }
  const int chiefs = cluster_job_size(spec, "chief");
  if (chiefs != 1) {
    throw ClusterConfigError(fmt::format("{}: the cluster (jobs: {}) has {} 'chief' tasks; it needs exactly one, the "
                                         "coordinator",
                                         what, jobs, chiefs));
  }
  return cluster_job_size(spec, "ps");
}

}  // namespace detail

class ParameterServerStrategy final : public AnyStrategy, public detail::PartitionsVariables {
 public:
  /// `resolver` defaults to TFConfigClusterResolver (the TF_CONFIG environment variable). Without
  /// a `partitioner` variables are never split. ClusterConfigError when the cluster lacks a chief,
  /// a ps or a worker task.
  explicit ParameterServerStrategy(std::shared_ptr<ClusterResolver> resolver = nullptr,
                                   VariablePartitioner partitioner = {})
      : resolver_(resolver ? std::move(resolver) : std::make_shared<TFConfigClusterResolver>()),
        partitioner_(std::move(partitioner)),
        placement_(detail::check_parameter_server_cluster(resolver_->cluster_spec())) {}

  std::string_view name() const noexcept override { return "ParameterServerStrategy"; }
  /// One replica per worker, and workers do not synchronise (asynchronous training).
  int num_replicas_in_sync() const noexcept override { return 1; }
  int num_local_replicas() const noexcept override { return 1; }
  /// As in TF: the worker's device, without job and task (a function runs on whichever worker the
  /// coordinator picks).
  std::vector<std::string> worker_devices() const override { return {"/device:CPU:0"}; }

  /// Makes the strategy current: variables created under the guard go to ps tasks round-robin,
  /// and ShardedVariables are split by the partitioner.
  [[nodiscard]] ScopeGuard scope() { return ScopeGuard(*this); }

  const ClusterResolver* cluster_resolver() const noexcept { return resolver_.get(); }
  const VariablePartitioner& variable_partitioner() const noexcept { return partitioner_; }
  int num_ps() const noexcept { return placement_.num_ps(); }
  int num_workers() const { return resolver_->cluster_spec().num_tasks("worker"); }

  /// The next ps task in turn. One copy, held here for now and reported on its ps task. It uses
  /// the one-copy (central storage) placement core/ knows: in cross-replica context, which is
  /// where the coordinator works, reads and updates go to that copy.
  detail::VariablePlacement variable_placement() const override {
    std::string device = placement_.next_device();
    return {detail::PlacementKind::CentralStorage, {device}, 1, id(), {device}};
  }

  /// Shards for a ShardedVariable created in scope: what the partitioner says on axis 0, 1 without
  /// a partitioner or for a scalar (TF never partitions those).
  std::int64_t num_shards_for(const Shape& shape, DType dtype) const override {
    if (!partitioner_ || shape.empty()) return 1;
    return shards_along_first_axis(partitioner_(shape, dtype), shape);
  }

 private:
  std::shared_ptr<ClusterResolver> resolver_;
  VariablePartitioner partitioner_;
  mutable RoundRobinPlacement placement_;  // placing a variable takes the next turn
};

DISTRIBUTE_END_NAMESPACE

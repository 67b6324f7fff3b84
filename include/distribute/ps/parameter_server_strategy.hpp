// ParameterServerStrategy: validates a parameter-server cluster, connects to its ps tasks, and
// places the variables created in its scope on them, round-robin, optionally partitioned into
// ShardedVariables by a partitioner. Functions run on workers through a ClusterCoordinator
// (ps/cluster_coordinator.hpp).
#pragma once

#include <cstdint>
#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
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
#include <distribute/ps/detail/ps_client.hpp>
#include <distribute/ps/partitioner.hpp>
#include <distribute/ps/placement.hpp>
#include <distribute/ps/sharded_variable.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

namespace ps::detail {

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
  if (cluster::cluster_job_size(spec, "ps") < 1) {
    throw ClusterConfigError(fmt::format("{}: the cluster (jobs: {}) has no 'ps' task; there must be at least one "
                                         "parameter server",
                                         what, jobs));
  }
  if (cluster::cluster_job_size(spec, "worker") < 1) {
    throw ClusterConfigError(
        fmt::format("{}: the cluster (jobs: {}) has no 'worker' task; there must be at least one worker", what, jobs));
  }
  const int chiefs = cluster::cluster_job_size(spec, "chief");
  if (chiefs != 1) {
    throw ClusterConfigError(fmt::format("{}: the cluster (jobs: {}) has {} 'chief' tasks; it needs exactly one, the "
                                         "coordinator",
                                         what, jobs, chiefs));
  }
  return cluster::cluster_job_size(spec, "ps");
}

}  // namespace ps::detail

struct ParameterServerOptions {
  /// Connect to the ps tasks, which then hold the variables. false: placement only, the values
  /// stay in this process (unit tests and single-process debugging; no coordinator).
  bool connect = true;
  /// How long the constructor waits for every ps task to answer (they may still be starting).
  std::chrono::milliseconds connect_timeout{60000};
  /// Shared secret (see net::CommunicatorOptions::cluster_token).
  std::optional<std::string> cluster_token = std::nullopt;
};

class ParameterServerStrategy final : public AnyStrategy, public ps::detail::PartitionsVariables {
 public:
  /// `resolver` defaults to TFConfigClusterResolver (the TF_CONFIG environment variable). Without
  /// a `partitioner` variables are never split. ClusterConfigError when the cluster lacks a chief,
  /// a ps or a worker task.
  /// With `options.connect` (the default) the constructor waits until every ps task answers, and
  /// throws PeerFailure naming the one that did not within `options.connect_timeout`.
  explicit ParameterServerStrategy(std::shared_ptr<ClusterResolver> resolver = nullptr,
                                   VariablePartitioner partitioner = {}, ParameterServerOptions options = {})
      : resolver_(resolver ? std::move(resolver) : std::make_shared<TFConfigClusterResolver>()),
        partitioner_(std::move(partitioner)),
        options_(std::move(options)),
        placement_(ps::detail::check_parameter_server_cluster(resolver_->cluster_spec())),
        session_(ps::detail::random_id()) {
    if (options_.connect) {
      ps::detail::RpcOptions rpc;
      rpc.cluster_token = options_.cluster_token;
      rpc.connect_timeout = options_.connect_timeout;
      store_ = std::make_shared<ps::detail::PsClientStore>(resolver_->cluster_spec(), rpc);
      store_->connect_all(options_.connect_timeout);
    }
  }

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

  /// The next ps task in turn. Connected: the value lives on that ps task (reads and updates are
  /// calls to it). Not connected: one copy held here, reported on its ps task.
  core::VariablePlacement variable_placement() const override {
    const int task = placement_.next_task();
    std::string device = ps_device_string(task);
    if (!store_) return {core::PlacementKind::CentralStorage, {device}, 1, id(), {device}};
    core::VariablePlacement p{core::PlacementKind::Remote, {device}, 1, id(), {device}};
    p.remote = {store_, task, fmt::format("{:016x}.{}", session_, ++variables_created_)};
    return p;
  }

  /// True when the variables live on the ps tasks (options.connect).
  bool connected() const noexcept { return store_ != nullptr; }
  const ParameterServerOptions& options() const noexcept { return options_; }
  /// Ids this coordinator's closures are committed under (differs per strategy object).
  std::uint64_t session_id() const noexcept { return session_; }
  /// The ps tasks' client (connected strategies only): used by the ClusterCoordinator.
  const std::shared_ptr<ps::detail::PsClientStore>& ps_store() const noexcept { return store_; }

  /// Shards for a ShardedVariable created in scope: what the partitioner says on axis 0, 1 without
  /// a partitioner or for a scalar (TF never partitions those).
  std::int64_t num_shards_for(const Shape& shape, DType dtype) const override {
    if (!partitioner_ || shape.empty()) return 1;
    return shards_along_first_axis(partitioner_(shape, dtype), shape);
  }

 private:
  std::shared_ptr<ClusterResolver> resolver_;
  VariablePartitioner partitioner_;
  ParameterServerOptions options_;
  mutable RoundRobinPlacement placement_;  // placing a variable takes the next turn
  std::uint64_t session_;
  mutable std::atomic<std::uint64_t> variables_created_{0};
  std::shared_ptr<ps::detail::PsClientStore> store_;
};

DISTRIBUTE_END_NAMESPACE

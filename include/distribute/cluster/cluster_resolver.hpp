// ClusterResolver: where this process sits in the cluster; SimpleClusterResolver for explicit specs.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <distribute/cluster/cluster_spec.hpp>
#include <distribute/cluster/detail/env.hpp>
#include <distribute/core/error.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

/// Environment variables handed to a resolver instead of the process environment (tests, or a
/// program that computes them). Lookups by string_view do not allocate.
using EnvVars = cluster::detail::EnvMap;

/// Device type → count, as TF's num_accelerators() ({"GPU": 2}); empty for host-only tasks.
using AcceleratorCounts = std::map<std::string, int>;

namespace cluster {

inline std::string cluster_tasks_phrase(std::int64_t n) { return fmt::format("{} task{}", n, n == 1 ? "" : "s"); }

/// Checks that task (type, id) exists in `spec`. An evaluator may be missing from the cluster
/// (TF runs it beside the training cluster), with any index (TF's resolvers accept any).
/// `type_label`/`id_label` name the fields ("TF_CONFIG: task.type"), `cluster_name` the spec.
inline void check_task_in_cluster(const ClusterSpec& spec, std::string_view type, std::int64_t id,
                                  std::string_view type_label, std::string_view id_label, std::string_view cluster_name) {
  if (type.empty()) throw ClusterConfigError(fmt::format("{} is empty", type_label));
  if (id < 0) throw ClusterConfigError(fmt::format("{} {} is negative", id_label, id));
  if (!spec.has_job(type)) {
    if (type == "evaluator") {
      if (id > cluster::detail::kMaxTaskIndex) {
        throw ClusterConfigError(fmt::format("{} {} is out of range (at most {})", id_label, id, cluster::detail::kMaxTaskIndex));
      }
      return;
    }
    throw ClusterConfigError(fmt::format("{} '{}' has no job in {} (jobs: {})", type_label, type, cluster_name,
                                         spec.empty() ? std::string("none") : fmt::format("{}", fmt::join(spec.jobs(), ", "))));
  }
  auto indices = spec.task_indices(type);
  bool dense = indices.empty() || indices.back() + 1 == static_cast<int>(indices.size());
  if (dense && id >= static_cast<std::int64_t>(indices.size())) {
    throw ClusterConfigError(fmt::format("{} {} is out of range for job '{}' with {}", id_label, id, type,
                                         cluster_tasks_phrase(static_cast<std::int64_t>(indices.size()))));
  }
  if (!dense && !spec.has_task(type, static_cast<int>(std::min<std::int64_t>(id, cluster::detail::kMaxTaskIndex + 1)))) {
    throw ClusterConfigError(fmt::format("{} {} is not a task of job '{}' (task indices: {})", id_label, id, type,
                                         fmt::join(indices, ", ")));
  }
}

inline int cluster_job_size(const ClusterSpec& spec, std::string_view job) {
  return spec.has_job(job) ? spec.num_tasks(job) : 0;
}

}  // namespace cluster

/// Where this process sits in a cluster: the cluster's spec, this task's type and index, the
/// RPC layer and local accelerators. Resolvers read it from somewhere (TF_CONFIG, Slurm, a
/// launcher's environment) once, at construction, and validate it there, so the getters are
/// cheap and cannot fail. Users may derive their own.
///
/// The helpers below follow TF's multi_worker_util. A cluster with an empty spec is local mode:
/// one process, which is worker 0 and the chief.
class ClusterResolver {
 public:
  virtual ~ClusterResolver() = default;

  virtual const ClusterSpec& cluster_spec() const = 0;
  /// "chief", "worker", "ps" or "evaluator" (custom resolvers may use other job names).
  virtual std::string task_type() const = 0;
  virtual int task_id() const = 0;
  /// "grpc" and the like; empty when the configuration names none.
  virtual std::string rpc_layer() const = 0;
  virtual AcceleratorCounts num_accelerators() const = 0;
  /// TF's free-form environment string ("cloud", "google"); empty unless configured.
  virtual std::string environment() const { return {}; }

  /// The chief task; without a chief job, worker 0. The evaluator also counts as chief of its
  /// own work, as in TF (it writes its own summaries).
  bool is_chief() const {
    if (cluster_spec().empty()) return true;  // local mode: the one process
    const auto type = task_type();
    if (type == "chief" || type == "evaluator") return true;
    return type == "worker" && task_id() == 0 && cluster::cluster_job_size(cluster_spec(), "chief") == 0;
  }

  /// The number of tasks that run replicas in sync: chief + workers (1 in local mode). For the
  /// evaluator, the evaluators (it trains with nobody). ClusterConfigError for other tasks.
  int worker_count() const {
    const auto& spec = cluster_spec();
    const auto type = task_type();
    if (spec.empty()) return 1;
    if (type == "evaluator") return std::max(1, cluster::cluster_job_size(spec, "evaluator"));
    if (type != "chief" && type != "worker") {
      throw ClusterConfigError(
          fmt::format("ClusterResolver::worker_count: task type '{}' runs no replicas; only chief and worker tasks do", type));
    }
    return cluster::cluster_job_size(spec, "chief") + cluster::cluster_job_size(spec, "worker");
  }

  /// This task's position among the tasks that run replicas: the chief is 0 and worker i is
  /// i + 1 when there is a chief, else i (TF's id_in_cluster). ClusterConfigError for the
  /// evaluator and for ps tasks, which have no replicas.
  int id_in_cluster() const {
    const auto& spec = cluster_spec();
    if (spec.empty()) return 0;  // local mode: the one process, whatever task it was named
    const auto type = task_type();
    if (type == "chief") return 0;
    if (type == "worker") return task_id() + cluster::cluster_job_size(spec, "chief");
    if (type == "evaluator") {
      throw ClusterConfigError(
          "ClusterResolver::id_in_cluster: task type 'evaluator' has no id in the cluster; it runs beside training");
    }
    throw ClusterConfigError(fmt::format(
        "ClusterResolver::id_in_cluster: task type '{}' has no id in the cluster; only chief and worker tasks do", type));
  }

  /// The global id of local replica `local_id` when every task runs `local_replicas`:
  /// id_in_cluster() * local_replicas + local_id.
  int global_replica_id(int local_replicas, int local_id) const {
    if (local_replicas < 1 || local_id < 0 || local_id >= local_replicas) {
      throw InvalidArgument(fmt::format(
          "ClusterResolver::global_replica_id: local replica {} is out of range for {} local replicas", local_id,
          local_replicas));
    }
    return id_in_cluster() * local_replicas + local_id;
  }

  /// TF's ClusterResolver.master() (TFConfigClusterResolver's rule): the session master when the
  /// configuration names one; "" for a cluster of at most one task; else the address of task
  /// (task_type, task_id) — this task unless given — as "rpc_layer://host:port" when there is
  /// an RPC layer. InvalidArgument when that task is not in the cluster.
  std::string master(std::optional<std::string> task_type = {}, std::optional<int> task_id = {},
                     std::optional<std::string> rpc_layer = {}) const {
    if (auto session = session_master()) return *session;
    const auto& spec = cluster_spec();
    const auto jobs = spec.jobs();
    if (jobs.empty() || (jobs.size() == 1 && spec.task_indices(jobs.front()) == std::vector<int>{0})) return {};
    const std::string type = task_type ? *task_type : this->task_type();
    const int id = task_id ? *task_id : this->task_id();
    if (!spec.has_job(type)) {
      throw InvalidArgument(fmt::format("ClusterResolver::master: job '{}' is not in the cluster (jobs: {})", type,
                                        fmt::join(jobs, ", ")));
    }
    const std::string layer = rpc_layer ? *rpc_layer : this->rpc_layer();
    const std::string& address = spec.task_address(type, id);
    return layer.empty() ? address : fmt::format("{}://{}", layer, address);
  }

  /// A master address that overrides master()'s rule (TF_CONFIG's "session_master"); none by default.
  virtual std::optional<std::string> session_master() const { return std::nullopt; }

  /// The address everyone rendezvous with: the chief's, else worker 0's. Empty in local mode
  /// (an empty spec), where there is nobody to connect to.
  std::string master_address() const {
    const auto& spec = cluster_spec();
    if (spec.empty()) return {};
    if (cluster::cluster_job_size(spec, "chief") > 0) return spec.task_address("chief", spec.task_indices("chief").front());
    if (spec.has_task("worker", 0)) return spec.task_address("worker", 0);
    throw ClusterConfigError(fmt::format("ClusterResolver::master_address: the cluster (jobs: {}) has neither a chief nor worker 0",
                                         fmt::join(spec.jobs(), ", ")));
  }

 protected:
  ClusterResolver() = default;
  ClusterResolver(const ClusterResolver&) = default;
  ClusterResolver(ClusterResolver&&) = default;
  ClusterResolver& operator=(const ClusterResolver&) = default;
  ClusterResolver& operator=(ClusterResolver&&) = default;
};

/// A resolver for a spec the program already has (TF's SimpleClusterResolver). The task must
/// exist in the spec unless the spec is empty (local mode); ClusterConfigError otherwise.
class SimpleClusterResolver : public ClusterResolver {
 public:
  SimpleClusterResolver(ClusterSpec cluster_spec, std::string task_type, int task_id, std::string rpc_layer = "grpc",
                        AcceleratorCounts num_accelerators = {}, std::string environment = {})
      : spec_(std::move(cluster_spec)),
        task_type_(std::move(task_type)),
        task_id_(task_id),
        rpc_layer_(std::move(rpc_layer)),
        accelerators_(std::move(num_accelerators)),
        environment_(std::move(environment)) {
    if (task_type_.empty()) throw ClusterConfigError("SimpleClusterResolver: task_type is empty");
    if (task_id_ < 0) throw ClusterConfigError(fmt::format("SimpleClusterResolver: task_id {} is negative", task_id_));
    if (!spec_.empty()) {
      cluster::check_task_in_cluster(spec_, task_type_, task_id_, "SimpleClusterResolver: task_type",
                                    "SimpleClusterResolver: task_id", "the cluster spec");
    }
    for (const auto& [device, count] : accelerators_) {
      if (count < 0) {
        throw ClusterConfigError(fmt::format("SimpleClusterResolver: num_accelerators['{}'] is {}, negative", device, count));
      }
    }
  }

  const ClusterSpec& cluster_spec() const override { return spec_; }
  std::string task_type() const override { return task_type_; }
  int task_id() const override { return task_id_; }
  std::string rpc_layer() const override { return rpc_layer_; }
  AcceleratorCounts num_accelerators() const override { return accelerators_; }
  std::string environment() const override { return environment_; }

 private:
  ClusterSpec spec_;
  std::string task_type_;
  int task_id_;
  std::string rpc_layer_;
  AcceleratorCounts accelerators_;
  std::string environment_;
};

DISTRIBUTE_END_NAMESPACE

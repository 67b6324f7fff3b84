// SlurmClusterResolver: the cluster of a Slurm job step (srun), as TF's SlurmClusterResolver.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <map>
#include <numeric>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <distribute/cluster/address.hpp>
#include <distribute/cluster/cluster_resolver.hpp>
#include <distribute/cluster/cluster_spec.hpp>
#include <distribute/cluster/detail/env.hpp>
#include <distribute/cluster/detail/slurm_hostlist.hpp>
#include <distribute/core/error.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

/// What SlurmClusterResolver builds from the step. Defaults match TF's.
struct SlurmOptions {
  /// Job name → number of tasks, filled in name order by SLURM_PROCID (TF sorts the jobs):
  /// {{"ps", 1}, {"worker", 3}} makes rank 0 the ps and ranks 1..3 workers 0..2. The counts
  /// must add up to the step's tasks. Empty: every task is a worker.
  std::map<std::string, int> jobs;
  /// Task k on a node listens on port_base + k.
  int port_base = 8888;
  /// GPUs on each node. Unset: counted from SLURM_STEP_GPUS, else SLURM_JOB_GPUS, else 0.
  std::optional<int> gpus_per_node;
  /// GPUs for each task. Unset: gpus_per_node / (most tasks on one node).
  std::optional<int> gpus_per_task;
  std::string rpc_layer = "grpc";
};

namespace cluster::detail {

/// Expands Slurm's tasks-per-node list: "2(x3),1" → 2, 2, 2, 1.
inline std::vector<int> slurm_expand_tasks_per_node(std::string_view text, std::string_view label) {
  auto fail = [&](const std::string& why) -> std::vector<int> {
    throw ClusterConfigError(fmt::format("{} '{}' is not a valid tasks-per-node list: {}", label, text, why));
  };
  if (text.empty()) return fail("it is empty");
  std::vector<int> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t comma = std::min(text.find(',', start), text.size());
    std::string_view part = text.substr(start, comma - start);
    std::string_view count_text = part;
    std::int64_t repeat = 1;
    if (auto paren = part.find('('); paren != std::string_view::npos) {
      count_text = part.substr(0, paren);
      std::string_view rep = part.substr(paren);
      auto r = rep.size() > 3 && rep.substr(0, 2) == "(x" && rep.back() == ')' ? slurm_number(rep.substr(2, rep.size() - 3))
                                                                                 : std::nullopt;
      if (!r || *r < 1) return fail(fmt::format("'{}' is not N or N(xR) with R >= 1", part));
      repeat = *r;
    }
    auto n = slurm_number(count_text);
    if (!n) return fail(fmt::format("'{}' is not N or N(xR) with decimal numbers", part));
    if (static_cast<std::int64_t>(out.size()) + repeat > kSlurmMaxCount || *n > kSlurmMaxCount) {
      return fail(fmt::format("it names more than {} nodes or tasks", kSlurmMaxCount));
    }
    out.insert(out.end(), static_cast<std::size_t>(repeat), static_cast<int>(*n));
    start = comma + 1;
  }
  return out;
}

/// The number of GPU ids in a list such as "0,1,3" or "0-3" (SLURM_STEP_GPUS, SLURM_JOB_GPUS).
inline int slurm_count_gpus(std::string_view text, std::string_view label) {
  if (text.empty()) return 0;
  std::int64_t count = 0;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t comma = std::min(text.find(',', start), text.size());
    std::string_view item = text.substr(start, comma - start);
    std::size_t dash = item.find('-');
    auto lo = slurm_number(item.substr(0, dash));
    auto hi = dash == std::string_view::npos ? lo : slurm_number(item.substr(dash + 1));
    if (!lo || !hi || *hi < *lo) {
      throw ClusterConfigError(fmt::format("{}='{}' is not a list of GPU ids: item '{}'", label, text, item));
    }
    count += *hi - *lo + 1;
    if (count > kSlurmMaxCount) throw ClusterConfigError(fmt::format("{}='{}' names too many GPUs", label, text));
    start = comma + 1;
  }
  return static_cast<int>(count);
}

}  // namespace cluster::detail

/// Builds the cluster of a Slurm job step from the variables srun sets in every task:
/// SLURM_PROCID (this task's rank), SLURM_STEP_NUM_TASKS, SLURM_STEP_NODELIST (e.g.
/// "node[01-03,07]") and SLURM_STEP_TASKS_PER_NODE (e.g. "2(x3),1"). As in TF, ranks are laid
/// out node by node in node-list order (Slurm's default block distribution): the k-th task on
/// host h gets address h:(port_base + k), and the ranks fill the jobs in name order.
///
/// Missing or malformed variables, counts that disagree, or ports past 65535 throw
/// ClusterConfigError naming the variable. Unlike TF, this does not set CUDA_VISIBLE_DEVICES
/// (changing the environment of a running process is unsafe); gpu_allocation() says which GPU
/// ids this task should use.
class SlurmClusterResolver : public ClusterResolver {
 public:
  /// Every task a worker, ports from 8888, the process environment.
  SlurmClusterResolver() : SlurmClusterResolver(SlurmOptions{}) {}
  /// TF's positional form: `SlurmClusterResolver({{"ps", 1}, {"worker", 3}}, 9000)`.
  explicit SlurmClusterResolver(std::map<std::string, int> jobs, int port_base = 8888) {
    SlurmOptions options;
    options.jobs = std::move(jobs);
    options.port_base = port_base;
    init(std::move(options), cluster::detail::EnvReader{});
  }
  explicit SlurmClusterResolver(SlurmOptions options) { init(std::move(options), cluster::detail::EnvReader{}); }
  /// Reads the variables from `env` instead of the process environment.
  SlurmClusterResolver(SlurmOptions options, const EnvVars& env) { init(std::move(options), cluster::detail::EnvReader{&env}); }

  /// "node[01-03,07]" → node01, node02, node03, node07; "a,b[1-2]" → a, b1, b2. Zero padding
  /// follows the low end of a range. ClusterConfigError on malformed lists.
  static std::vector<std::string> expand_hostlist(std::string_view hostlist) {
    return cluster::detail::slurm_expand_hostlist(hostlist, "hostlist");
  }
  /// "2(x3),1" → 2, 2, 2, 1. ClusterConfigError on malformed lists.
  static std::vector<int> expand_tasks_per_node(std::string_view tasks_per_node) {
    return cluster::detail::slurm_expand_tasks_per_node(tasks_per_node, "tasks-per-node list");
  }

  const ClusterSpec& cluster_spec() const override { return spec_; }
  std::string task_type() const override { return task_type_; }
  int task_id() const override { return task_id_; }
  std::string rpc_layer() const override { return rpc_layer_; }
  /// {"GPU": gpus per task}, or {} without GPUs.
  AcceleratorCounts num_accelerators() const override {
    return gpus_per_task_ > 0 ? AcceleratorCounts{{"GPU", gpus_per_task_}} : AcceleratorCounts{};
  }

  /// SLURM_PROCID.
  int rank() const { return rank_; }
  /// The step's nodes, expanded, in order, and how many tasks each runs.
  const std::vector<std::string>& hosts() const { return hosts_; }
  const std::vector<int>& tasks_per_node() const { return tasks_per_node_; }
  /// This task's GPU ids on its node ("2,3"), what TF would put in CUDA_VISIBLE_DEVICES; empty
  /// without GPUs.
  const std::string& gpu_allocation() const { return gpu_allocation_; }

 private:
  void init(SlurmOptions options, const cluster::detail::EnvReader& env) {
    constexpr std::string_view who = "SlurmClusterResolver";
    constexpr std::string_view hint = " (is this process a task of a Slurm step, started by srun?)";
    rpc_layer_ = std::move(options.rpc_layer);
    rank_ = cluster::detail::require_env_int(env, who, "SLURM_PROCID", 0, INT_MAX, hint);
    const int num_tasks = cluster::detail::require_env_int(env, who, "SLURM_STEP_NUM_TASKS", 1, cluster::detail::kSlurmMaxCount, hint);
    auto require = [&](std::string_view name) {
      auto v = env.get(name);
      if (!v) throw ClusterConfigError(fmt::format("{}: environment variable {} is not set{}", who, name, hint));
      return *v;
    };
    const std::string nodelist = require("SLURM_STEP_NODELIST");
    const std::string tasks_text = require("SLURM_STEP_TASKS_PER_NODE");
    hosts_ = cluster::detail::slurm_expand_hostlist(nodelist, "SlurmClusterResolver: SLURM_STEP_NODELIST");
    tasks_per_node_ = cluster::detail::slurm_expand_tasks_per_node(tasks_text, "SlurmClusterResolver: SLURM_STEP_TASKS_PER_NODE");

    if (hosts_.size() != tasks_per_node_.size()) {
      throw ClusterConfigError(fmt::format(
          "{}: SLURM_STEP_TASKS_PER_NODE='{}' describes {} nodes but SLURM_STEP_NODELIST='{}' has {}", who, tasks_text,
          tasks_per_node_.size(), nodelist, hosts_.size()));
    }
    const std::int64_t listed = std::accumulate(tasks_per_node_.begin(), tasks_per_node_.end(), std::int64_t{0});
    if (listed != num_tasks) {
      throw ClusterConfigError(fmt::format("{}: SLURM_STEP_TASKS_PER_NODE='{}' adds up to {} tasks but SLURM_STEP_NUM_TASKS={}",
                                           who, tasks_text, listed, num_tasks));
    }
    if (rank_ >= num_tasks) {
      throw ClusterConfigError(fmt::format("{}: SLURM_PROCID={} is out of range for SLURM_STEP_NUM_TASKS={}", who, rank_, num_tasks));
    }

    auto jobs = options.jobs.empty() ? std::map<std::string, int>{{"worker", num_tasks}} : std::move(options.jobs);
    std::int64_t asked = 0;
    for (const auto& [job, count] : jobs) {
      if (count < 0) throw ClusterConfigError(fmt::format("{}: jobs['{}'] is {}, negative", who, job, count));
      asked += count;
    }
    if (asked != num_tasks) {
      std::vector<std::string> parts;
      for (const auto& [job, count] : jobs) parts.push_back(fmt::format("{}: {}", job, count));
      throw ClusterConfigError(fmt::format("{}: jobs ask for {} tasks ({}) but the Slurm step has SLURM_STEP_NUM_TASKS={}", who,
                                           asked, fmt::join(parts, ", "), num_tasks));
    }

    const int max_per_node = *std::max_element(tasks_per_node_.begin(), tasks_per_node_.end());
    if (options.port_base < 1 || options.port_base > 65535 ||
        static_cast<std::int64_t>(options.port_base) + std::max(max_per_node, 1) - 1 > 65535) {
      throw ClusterConfigError(fmt::format("{}: port_base {} with up to {} tasks on a node gives ports outside [1, 65535]", who,
                                           options.port_base, max_per_node));
    }

    // GPUs: each task on a node gets its own consecutive block of gpus_per_task ids.
    int gpus_per_node = 0;
    if (options.gpus_per_node) {
      gpus_per_node = *options.gpus_per_node;
    } else if (auto step = env.get("SLURM_STEP_GPUS")) {
      gpus_per_node = cluster::detail::slurm_count_gpus(*step, "SlurmClusterResolver: SLURM_STEP_GPUS");
    } else if (auto job = env.get("SLURM_JOB_GPUS")) {
      gpus_per_node = cluster::detail::slurm_count_gpus(*job, "SlurmClusterResolver: SLURM_JOB_GPUS");
    }
    if (gpus_per_node < 0) throw ClusterConfigError(fmt::format("{}: gpus_per_node {} is negative", who, gpus_per_node));
    gpus_per_task_ = options.gpus_per_task.value_or(max_per_node > 0 ? gpus_per_node / max_per_node : 0);
    if (gpus_per_task_ < 0) throw ClusterConfigError(fmt::format("{}: gpus_per_task {} is negative", who, gpus_per_task_));
    if (static_cast<std::int64_t>(gpus_per_task_) * max_per_node > gpus_per_node) {
      throw ClusterConfigError(fmt::format("{}: {} GPUs per task for up to {} tasks on a node need {} GPUs but nodes have {}", who,
                                           gpus_per_task_, max_per_node,
                                           static_cast<std::int64_t>(gpus_per_task_) * max_per_node, gpus_per_node));
    }

    // Addresses in rank order: node by node, port_base + k for the k-th task on a node.
    std::vector<std::string> addresses;
    int local_offset = 0;
    for (std::size_t h = 0; h < hosts_.size(); ++h) {
      for (int k = 0; k < tasks_per_node_[h]; ++k) {
        if (static_cast<int>(addresses.size()) == rank_) local_offset = k;
        addresses.push_back(HostPort{hosts_[h], options.port_base + k}.to_string());
      }
    }
    std::vector<std::string> ids;
    for (int g = 0; g < gpus_per_task_; ++g) ids.push_back(std::to_string(local_offset * gpus_per_task_ + g));
    gpu_allocation_ = fmt::format("{}", fmt::join(ids, ","));

    cluster::detail::ClusterJobs cluster;
    int first = 0;
    for (const auto& [job, count] : jobs) {
      auto& tasks = cluster[job];
      for (int i = 0; i < count; ++i) tasks[i] = addresses[static_cast<std::size_t>(first + i)];
      if (rank_ >= first && rank_ < first + count) {
        task_type_ = job;
        task_id_ = rank_ - first;
      }
      first += count;
    }
    // Bad job names in `jobs`, or a node listed twice, are reported as ours, not ClusterSpec's.
    cluster::detail::validate_cluster_jobs(cluster, who, "");
    spec_ = ClusterSpec::from_sparse(std::move(cluster));
  }

  ClusterSpec spec_;
  std::string task_type_;
  int task_id_ = 0;
  std::string rpc_layer_;
  int rank_ = 0;
  std::vector<std::string> hosts_;
  std::vector<int> tasks_per_node_;
  int gpus_per_task_ = 0;
  std::string gpu_allocation_;
};

DISTRIBUTE_END_NAMESPACE

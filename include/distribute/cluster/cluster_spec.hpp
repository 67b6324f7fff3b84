// ClusterSpec: job name → task addresses, TF's tf.train.ClusterSpec, with JSON in and out.
#pragma once

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/json.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <distribute/cluster/address.hpp>
#include <distribute/cluster/detail/json.hpp>
#include <distribute/core/error.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

namespace cluster::detail {

/// Task indices are kept below this so that job_tasks() (a list with a slot per index up to
/// the largest) cannot be made to allocate gigabytes by one stray sparse key.
inline constexpr std::int64_t kMaxTaskIndex = 999'999;

/// job → (task index → address): the one representation of dense and sparse jobs alike.
using ClusterJobs = std::map<std::string, std::map<int, std::string>>;

/// "cluster.worker" under TF_CONFIG, "worker" for a bare ClusterSpec.
inline std::string cluster_field(std::string_view root, std::string_view job) {
  return root.empty() ? std::string(job) : fmt::format("{}.{}", root, job);
}

/// Checks job names, task indices and addresses, and that no two tasks share an address.
/// Messages start with `who` ("TF_CONFIG", "ClusterSpec") and name the field under `root`.
inline void validate_cluster_jobs(const ClusterJobs& jobs, std::string_view who, std::string_view root) {
  std::map<std::string, std::string> owner;  // address → the field that first used it
  for (const auto& [job, tasks] : jobs) {
    // TF device names only allow these in a job name ("/job:<name>/...").
    bool name_ok = !job.empty() && std::isalpha(static_cast<unsigned char>(job.front())) &&
                   std::all_of(job.begin(), job.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
    if (!name_ok) {
      throw ClusterConfigError(fmt::format("{}: job name '{}'{} is not a valid name (a letter, then letters, digits or '_')",
                                           who, job, root.empty() ? "" : fmt::format(" in {}", root)));
    }
    for (const auto& [index, address] : tasks) {
      std::string field = fmt::format("{}[{}]", cluster_field(root, job), index);
      if (index < 0 || index > kMaxTaskIndex) {
        throw ClusterConfigError(fmt::format("{}: {} has task index {}, out of range [0, {}]", who, field, index, kMaxTaskIndex));
      }
      std::string why;
      if (!cluster::detail::split_host_port(address, why)) {
        throw ClusterConfigError(fmt::format("{}: {} address '{}' {}", who, field, address, why));
      }
      auto [it, fresh] = owner.emplace(address, field);
      if (!fresh) {
        throw ClusterConfigError(fmt::format("{}: {} address '{}' is already used by {}; every task needs its own address",
                                             who, field, address, it->second));
      }
    }
  }
}

/// Reads the JSON shape of a cluster: an object of job → list of addresses (dense) or object of
/// "index" → address (sparse). Only the shape is checked here; validate_cluster_jobs does the rest.
inline ClusterJobs cluster_jobs_from_json(const boost::json::value& v, std::string_view who, std::string_view root) {
  std::string what = root.empty() ? std::string("the cluster JSON") : std::string(root);
  const auto* obj = v.if_object();
  if (obj == nullptr) {
    throw ClusterConfigError(fmt::format("{}: {} must be an object of job name → task addresses, got {}", who, what,
                                         cluster_json_describe(v)));
  }
  ClusterJobs jobs;
  for (const auto& [key, tasks] : *obj) {
    std::string job(key);
    std::string field = cluster_field(root, job);
    auto& out = jobs[job];
    auto address_of = [&](const boost::json::value& a, std::string_view index) -> std::string {
      if (!a.is_string()) {
        throw ClusterConfigError(fmt::format("{}: {}[{}] must be a \"host:port\" string, got {}", who, field, index,
                                             cluster_json_describe(a)));
      }
      return std::string(a.get_string());
    };
    if (const auto* list = tasks.if_array()) {
      if (static_cast<std::int64_t>(list->size()) > kMaxTaskIndex + 1) {
        throw ClusterConfigError(fmt::format("{}: {} lists {} tasks, more than {}", who, field, list->size(), kMaxTaskIndex + 1));
      }
      for (std::size_t i = 0; i < list->size(); ++i) out[static_cast<int>(i)] = address_of((*list)[i], std::to_string(i));
    } else if (const auto* sparse = tasks.if_object()) {
      for (const auto& [index_key, address] : *sparse) {
        std::string_view k = index_key;
        std::int64_t index = -1;
        auto [end, ec] = std::from_chars(k.data(), k.data() + k.size(), index);
        bool digits = !k.empty() && std::all_of(k.begin(), k.end(), [](char c) { return c >= '0' && c <= '9'; });
        if (!digits || ec != std::errc{} || end != k.data() + k.size() || index > kMaxTaskIndex) {
          throw ClusterConfigError(fmt::format("{}: {} has key '{}', which is not a task index (an integer in [0, {}])", who,
                                               field, k, kMaxTaskIndex));
        }
        if (out.count(static_cast<int>(index)) != 0) {
          throw ClusterConfigError(fmt::format("{}: {} gives task index {} twice", who, field, index));
        }
        out[static_cast<int>(index)] = address_of(address, k);
      }
    } else {
      throw ClusterConfigError(fmt::format(
          "{}: {} must be a list of \"host:port\" addresses or an object of task index → address, got {}", who, field,
          cluster_json_describe(tasks)));
    }
  }
  return jobs;
}

}  // namespace cluster::detail

/// The addresses of a cluster's tasks, grouped by job ("chief", "worker", "ps", "evaluator"...).
/// A job is dense (tasks 0..n-1, TF's list form) or sparse (some indices only, TF's
/// {"0": "a:1", "3": "b:2"} form, used when a task only needs to know some of its peers).
/// Every address is validated as host:port, and no two tasks may share one. Jobs are kept in
/// name order, as TF sorts them.
class ClusterSpec {
 public:
  using DenseJobs = std::map<std::string, std::vector<std::string>>;
  using SparseJobs = std::map<std::string, std::map<int, std::string>>;

  /// An empty cluster: a single process, no peers.
  ClusterSpec() = default;

  /// From dense jobs: `ds::ClusterSpec({{"worker", {"a:2222", "b:2222"}}, {"ps", {"c:2222"}}})`.
  /// Throws ClusterConfigError naming the bad job name or address. Implicit: a spec is nothing
  /// but its jobs. The initializer-list form keeps `({{"ps", {"a:1"}}})` (one job, one task)
  /// from being ambiguous with the copy constructor.
  ClusterSpec(std::initializer_list<DenseJobs::value_type> jobs) : ClusterSpec(DenseJobs(jobs)) {}
  ClusterSpec(const DenseJobs& jobs) {
    for (const auto& [job, addresses] : jobs) {
      auto& tasks = jobs_[job];
      for (std::size_t i = 0; i < addresses.size(); ++i) tasks[static_cast<int>(i)] = addresses[i];
    }
    cluster::detail::validate_cluster_jobs(jobs_, "ClusterSpec", "");
  }

  /// From sparse jobs: `ClusterSpec::from_sparse({{"worker", {{0, "a:1"}, {3, "b:2"}}}})`.
  static ClusterSpec from_sparse(SparseJobs jobs) {
    cluster::detail::validate_cluster_jobs(jobs, "ClusterSpec", "");
    ClusterSpec spec;
    spec.jobs_ = std::move(jobs);
    return spec;
  }

  /// From TF's JSON: `{"worker": ["a:1", "b:2"], "ps": {"0": "c:3"}}`. Throws
  /// ClusterConfigError on a syntax error (with Boost.JSON's message and the offset) or a
  /// malformed job, naming the field ("ClusterSpec: worker[1] address 'b' has no port...").
  static ClusterSpec from_json(std::string_view json) { return from_json(cluster::detail::cluster_parse_json(json, "ClusterSpec")); }
  static ClusterSpec from_json(const boost::json::value& json) {
    return from_sparse(cluster::detail::cluster_jobs_from_json(json, "ClusterSpec", ""));
  }
  // boost::json::value converts from text too; these say which overload text means.
  static ClusterSpec from_json(const char* json) { return from_json(std::string_view(json)); }
  static ClusterSpec from_json(const std::string& json) { return from_json(std::string_view(json)); }
  static ClusterSpec from_json(const boost::json::object& json) { return from_json(boost::json::value(json)); }

  /// The JSON object TF writes: dense jobs as lists, sparse jobs as {"index": address}.
  boost::json::object to_json_value() const {
    boost::json::object out;
    for (const auto& [job, tasks] : jobs_) {
      if (is_dense(tasks)) {
        boost::json::array list;
        for (const auto& entry : tasks) list.emplace_back(entry.second);
        out[job] = std::move(list);
      } else {
        boost::json::object sparse;
        for (const auto& [index, address] : tasks) sparse[std::to_string(index)] = address;
        out[job] = std::move(sparse);
      }
    }
    return out;
  }
  std::string to_json() const { return boost::json::serialize(to_json_value()); }

  bool empty() const { return jobs_.empty(); }
  bool has_job(std::string_view job) const { return find(job) != jobs_.end(); }
  bool has_task(std::string_view job, int index) const {
    auto it = find(job);
    return it != jobs_.end() && it->second.count(index) != 0;
  }

  /// Job names in order.
  std::vector<std::string> jobs() const {
    std::vector<std::string> names;
    for (const auto& entry : jobs_) names.push_back(entry.first);
    return names;
  }

  /// Number of tasks defined in `job` (for a sparse job, not its largest index + 1).
  int num_tasks(std::string_view job) const { return static_cast<int>(tasks_of(job, "num_tasks").size()); }

  /// The task indices of `job`, ascending.
  std::vector<int> task_indices(std::string_view job) const {
    std::vector<int> out;
    for (const auto& entry : tasks_of(job, "task_indices")) out.push_back(entry.first);
    return out;
  }

  /// The address of task `index` of `job`; InvalidArgument if there is no such task.
  const std::string& task_address(std::string_view job, int index) const {
    const auto& tasks = tasks_of(job, "task_address");
    auto it = tasks.find(index);
    if (it == tasks.end()) {
      throw InvalidArgument(fmt::format("ClusterSpec::task_address: job '{}' has no task {} (task indices: {})", job, index,
                                        fmt::join(task_indices(job), ", ")));
    }
    return it->second;
  }

  /// TF's job_tasks: the addresses by index, a slot per index up to the largest; slots of a
  /// sparse job that no task fills are empty strings (TF's None).
  std::vector<std::string> job_tasks(std::string_view job) const {
    const auto& tasks = tasks_of(job, "job_tasks");
    std::vector<std::string> out(tasks.empty() ? 0 : static_cast<std::size_t>(tasks.rbegin()->first) + 1);
    for (const auto& [index, address] : tasks) out[static_cast<std::size_t>(index)] = address;
    return out;
  }

  /// Everything, as job → (index → address).
  const SparseJobs& as_dict() const { return jobs_; }

  friend bool operator==(const ClusterSpec&, const ClusterSpec&) = default;

 private:
  static bool is_dense(const std::map<int, std::string>& tasks) {
    return tasks.empty() || tasks.rbegin()->first + 1 == static_cast<int>(tasks.size());
  }
  SparseJobs::const_iterator find(std::string_view job) const {
    return std::find_if(jobs_.begin(), jobs_.end(), [&](const auto& entry) { return entry.first == job; });
  }
  const std::map<int, std::string>& tasks_of(std::string_view job, std::string_view what) const {
    auto it = find(job);
    if (it == jobs_.end()) {
      throw InvalidArgument(fmt::format("ClusterSpec::{}: no job '{}' in the cluster (jobs: {})", what, job,
                                        jobs_.empty() ? std::string("none") : fmt::format("{}", fmt::join(jobs(), ", "))));
    }
    return it->second;
  }

  SparseJobs jobs_;
};

DISTRIBUTE_END_NAMESPACE

// TFConfigClusterResolver: the cluster from the TF_CONFIG environment variable, fully validated.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <boost/json.hpp>
#include <fmt/format.h>

#include <distribute/cluster/cluster_resolver.hpp>
#include <distribute/cluster/cluster_spec.hpp>
#include <distribute/cluster/detail/env.hpp>
#include <distribute/cluster/detail/json.hpp>
#include <distribute/core/error.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

/// Explicit values that take precedence over TF_CONFIG's, as TF's constructor arguments do.
/// Set the fields you need (`ds::TFConfigOptions o; o.task_id = 1;`); designated initializers
/// that leave fields out trip GCC 12's -Wmissing-field-initializers.
struct TFConfigOptions {
  std::optional<std::string> task_type;
  std::optional<int> task_id;
  std::optional<std::string> rpc_layer;
  std::optional<std::string> environment;
  /// Reported by num_accelerators(); TF_CONFIG itself says nothing about devices.
  AcceleratorCounts num_accelerators;
};

namespace cluster::detail {

inline constexpr std::array<std::string_view, 4> kTFConfigTaskTypes = {"chief", "worker", "ps", "evaluator"};

inline bool is_tf_config_task_type(std::string_view type) {
  return std::find(kTFConfigTaskTypes.begin(), kTFConfigTaskTypes.end(), type) != kTFConfigTaskTypes.end();
}

inline bool tf_config_is_blank(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; });
}

/// A member that TF reads with dict.get(): absent and null both mean "not given".
inline const boost::json::value* tf_config_member(const boost::json::object& obj, std::string_view key) {
  const auto* v = obj.if_contains(key);
  return v == nullptr || v->is_null() ? nullptr : v;
}

inline std::string tf_config_string(const boost::json::object& obj, std::string_view key, std::string_view field) {
  const auto* v = tf_config_member(obj, key);
  if (v == nullptr) return {};
  if (!v->is_string()) {
    throw ClusterConfigError(fmt::format("TF_CONFIG: {} must be a string, got {}", field, cluster_json_describe(*v)));
  }
  return std::string(v->get_string());
}

}  // namespace cluster::detail

/// Reads the cluster from TF_CONFIG, TF's schema:
///
///     {"cluster": {"chief": ["host0:2222"], "worker": ["host1:2222", "host2:2222"],
///                  "ps": {"0": "host3:2222"}},
///      "task": {"type": "worker", "index": 1},
///      "rpc_layer": "grpc", "environment": "cloud"}
///
/// Jobs are lists (dense) or objects of "index" → address (sparse). Everything is checked at
/// construction and ClusterConfigError names the field that is wrong: JSON syntax (with
/// Boost.JSON's message), the types of `cluster`, `task`, `task.type`, `task.index`,
/// `rpc_layer`, `environment`; job names (chief, worker, ps, evaluator); at most one chief and
/// one evaluator; every address host:port and used once; the task's job present (an evaluator
/// may be absent, as in TF) and its index in range. Unknown top-level keys are ignored, as TF
/// does; `task.index` may also be a string of digits, which TF's int() accepts.
///
/// TF_CONFIG unset or blank (or `{}`) means local mode: an empty spec, task worker 0.
class TFConfigClusterResolver : public ClusterResolver {
 public:
  /// Reads the TF_CONFIG environment variable.
  TFConfigClusterResolver() : TFConfigClusterResolver(TFConfigOptions{}) {}
  explicit TFConfigClusterResolver(const TFConfigOptions& options) { init(cluster::detail::EnvReader{}.get("TF_CONFIG"), options); }
  /// Reads TF_CONFIG from `env` instead of the process environment.
  explicit TFConfigClusterResolver(const EnvVars& env, const TFConfigOptions& options = {}) {
    init(cluster::detail::EnvReader{&env}.get("TF_CONFIG"), options);
  }
  /// Parses `tf_config` as the value of TF_CONFIG (blank text: as if it were unset).
  explicit TFConfigClusterResolver(std::string_view tf_config, const TFConfigOptions& options = {}) {
    init(std::string(tf_config), options);
  }

  const ClusterSpec& cluster_spec() const override { return spec_; }
  std::string task_type() const override { return task_type_; }
  int task_id() const override { return task_id_; }
  std::string rpc_layer() const override { return rpc_layer_; }
  AcceleratorCounts num_accelerators() const override { return accelerators_; }
  std::string environment() const override { return environment_; }

  /// TF_CONFIG's "session_master", which TF's master() returns first when it is set.
  std::optional<std::string> session_master() const override { return session_master_; }

  /// False in local mode because TF_CONFIG was unset or blank.
  bool has_tf_config() const { return has_tf_config_; }

 private:
  void init(const std::optional<std::string>& text, const TFConfigOptions& options) {
    accelerators_ = options.num_accelerators;
    for (const auto& [device, count] : accelerators_) {
      if (count < 0) {
        throw ClusterConfigError(fmt::format("TFConfigClusterResolver: num_accelerators['{}'] is {}, negative", device, count));
      }
    }
    has_tf_config_ = text && !cluster::detail::tf_config_is_blank(*text);
    std::optional<std::string> type;
    std::optional<std::int64_t> index;
    if (has_tf_config_) parse(*text, type, index);

    // Explicit options win over TF_CONFIG; the labels say where a bad value came from.
    std::string type_label = "TF_CONFIG: task.type";
    std::string id_label = "TF_CONFIG: task.index";
    if (options.task_type) {
      type = options.task_type;
      type_label = "TFConfigClusterResolver: task_type";
    }
    if (options.task_id) {
      index = *options.task_id;
      id_label = "TFConfigClusterResolver: task_id";
    }
    if (options.rpc_layer) rpc_layer_ = *options.rpc_layer;
    if (options.environment) environment_ = *options.environment;

    if (spec_.empty()) {
      // Local mode: one process. As TF's resolver, a task named without a cluster is reported
      // as given (the helpers treat the process as worker 0 and the chief).
      task_type_ = type.value_or("worker");
      std::int64_t id = index.value_or(0);
      if (!cluster::detail::is_tf_config_task_type(task_type_)) {
        throw ClusterConfigError(fmt::format("{} '{}' is not a task type; expected chief, worker, ps or evaluator",
                                             type_label, task_type_));
      }
      if (id < 0) throw ClusterConfigError(fmt::format("{} {} is negative", id_label, id));
      if (id > cluster::detail::kMaxTaskIndex) {
        throw ClusterConfigError(fmt::format("{} {} is out of range (at most {})", id_label, id, cluster::detail::kMaxTaskIndex));
      }
      task_id_ = static_cast<int>(id);
      return;
    }
    if (!type && !has_task_) {
      throw ClusterConfigError("TF_CONFIG: task is missing; with a cluster, every process needs task.type and task.index");
    }
    if (!type) {
      throw ClusterConfigError("TF_CONFIG: task.type is missing; with a cluster, every process needs task.type and task.index");
    }
    if (!index) {
      throw ClusterConfigError("TF_CONFIG: task.index is missing; with a cluster, every process needs task.type and task.index");
    }
    if (!cluster::detail::is_tf_config_task_type(*type)) {
      throw ClusterConfigError(
          fmt::format("{} '{}' is not a task type; expected chief, worker, ps or evaluator", type_label, *type));
    }
    cluster::check_task_in_cluster(spec_, *type, *index, type_label, id_label, "cluster");
    task_type_ = *type;
    task_id_ = static_cast<int>(*index);
  }

  void parse(const std::string& text, std::optional<std::string>& type, std::optional<std::int64_t>& index) {
    auto doc = cluster::detail::cluster_parse_json(text, "TF_CONFIG");
    const auto* top = doc.if_object();
    if (top == nullptr) {
      throw ClusterConfigError(fmt::format("TF_CONFIG: the top level must be an object with cluster and task, got {}",
                                           cluster::detail::cluster_json_describe(doc)));
    }
    // cluster, task and task.index may be absent but not null: TF raises on a null one
    // (ClusterSpec(None), 'type' in None, int(None)). rpc_layer and environment may be null.
    if (const auto* cluster = top->if_contains("cluster")) {
      auto jobs = cluster::detail::cluster_jobs_from_json(*cluster, "TF_CONFIG", "cluster");
      for (const auto& entry : jobs) {
        if (!cluster::detail::is_tf_config_task_type(entry.first)) {
          throw ClusterConfigError(fmt::format("TF_CONFIG: cluster has job '{}'; jobs must be chief, worker, ps or evaluator",
                                               entry.first));
        }
      }
      cluster::detail::validate_cluster_jobs(jobs, "TF_CONFIG", "cluster");
      for (std::string_view single : {"chief", "evaluator"}) {
        auto it = jobs.find(std::string(single));
        if (it != jobs.end() && it->second.size() > 1) {
          throw ClusterConfigError(fmt::format("TF_CONFIG: cluster.{} has {} tasks; there can be at most one {}", single,
                                               it->second.size(), single));
        }
      }
      spec_ = ClusterSpec::from_sparse(std::move(jobs));
    }
    if (const auto* task_value = top->if_contains("task")) {
      has_task_ = true;
      const auto* task = task_value->if_object();
      if (task == nullptr) {
        throw ClusterConfigError(fmt::format("TF_CONFIG: task must be an object with type and index, got {}",
                                             cluster::detail::cluster_json_describe(*task_value)));
      }
      if (const auto* t = task->if_contains("type")) {
        if (!t->is_string()) {
          throw ClusterConfigError(
              fmt::format("TF_CONFIG: task.type must be a string, got {}", cluster::detail::cluster_json_describe(*t)));
        }
        type = std::string(t->get_string());
      }
      if (const auto* i = task->if_contains("index")) index = parse_index(*i);
    }
    rpc_layer_ = cluster::detail::tf_config_string(*top, "rpc_layer", "rpc_layer");
    environment_ = cluster::detail::tf_config_string(*top, "environment", "environment");
    if (cluster::detail::tf_config_member(*top, "session_master")) {
      session_master_ = cluster::detail::tf_config_string(*top, "session_master", "session_master");
    }
  }

  static std::int64_t parse_index(const boost::json::value& v) {
    if (auto i = cluster::detail::cluster_json_integer(v)) return *i;
    if (v.is_string()) {
      std::string_view s = v.get_string();
      if (auto i = cluster::detail::parse_env_integer(s)) return *i;
    }
    throw ClusterConfigError(fmt::format("TF_CONFIG: task.index must be an integer, got {}", cluster::detail::cluster_json_describe(v)));
  }

  ClusterSpec spec_;
  std::string task_type_ = "worker";
  int task_id_ = 0;
  std::string rpc_layer_;
  std::string environment_;
  AcceleratorCounts accelerators_;
  bool has_tf_config_ = false;
  bool has_task_ = false;  // TF_CONFIG has a "task" member
  std::optional<std::string> session_master_;
};

DISTRIBUTE_END_NAMESPACE

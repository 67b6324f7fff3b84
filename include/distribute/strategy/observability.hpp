// What a multi-worker strategy's task turns on to be seen: metrics served over HTTP and a
// timeline file (CommunicationOptions::metrics_port / timeline, or DISTRIBUTE_METRICS_PORT /
// DISTRIBUTE_TIMELINE). Off, nothing is built and the collectives only test a null pointer.
#pragma once

#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include <distribute/collective/communication_options.hpp>
#include <distribute/core/error.hpp>
#include <distribute/observe/collective_metrics.hpp>
#include <distribute/observe/metrics.hpp>
#include <distribute/net/metrics_server.hpp>
#include <distribute/observe/timeline.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace strategy {

/// The metrics port base from the options or DISTRIBUTE_METRICS_PORT (unset: metrics off).
/// `option`: how the option is named in messages (a ClusterCoordinator has its own).
inline std::optional<int> metrics_port_setting(const CommunicationOptions& options,
                                               std::string_view option = "CommunicationOptions::metrics_port") {
  if (options.metrics_port) {
    if (*options.metrics_port < 0 || *options.metrics_port > 65535) {
      throw InvalidArgument(fmt::format("{} must be in [0, 65535], got {}", option, *options.metrics_port));
    }
    return options.metrics_port;
  }
  const char* env = std::getenv("DISTRIBUTE_METRICS_PORT");
  if (env == nullptr || *env == '\0') return std::nullopt;
  const std::string v(env);
  int port = -1;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), port);
  if (ec != std::errc() || end != v.data() + v.size() || port < 0 || port > 65535) {
    throw InvalidArgument(fmt::format("DISTRIBUTE_METRICS_PORT='{}' is not a port number in [0, 65535] (the first task's "
                                      "metrics port; 0 for any free port)",
                                      v));
  }
  return port;
}

/// The timeline path from the options or DISTRIBUTE_TIMELINE ("" or unset: none).
inline std::string timeline_setting(const CommunicationOptions& options) {
  if (options.timeline) return *options.timeline;
  const char* env = std::getenv("DISTRIBUTE_TIMELINE");
  return env ? std::string(env) : std::string();
}

/// One task's metrics: the registry, the collectives' counters in it, and the HTTP server.
struct TaskMetrics {
  std::shared_ptr<observe::MetricsRegistry> registry;
  std::shared_ptr<observe::CollectiveMetrics> collectives;
  std::unique_ptr<net::MetricsServer> server;

  /// Serves on `host` at `port_base` + `rank` (0: any free port).
  static std::unique_ptr<TaskMetrics> start(const std::string& task_type, int task_index, const std::string& host,
                                            int port_base, int rank, net::MetricsAccess access) {
    const int port = port_base == 0 ? 0 : port_base + rank;
    if (port > 65535) {
      throw InvalidArgument(fmt::format("metrics port {} + rank {} is beyond 65535 (DISTRIBUTE_METRICS_PORT / "
                                        "CommunicationOptions::metrics_port)",
                                        port_base, rank));
    }
    auto m = std::make_unique<TaskMetrics>();
    m->registry = std::make_shared<observe::MetricsRegistry>(task_type, task_index);
    m->collectives = std::make_shared<observe::CollectiveMetrics>(m->registry);
    m->server = std::make_unique<net::MetricsServer>(m->registry, host, static_cast<std::uint16_t>(port), std::move(access));
    return m;
  }
};

/// Starts the process's timeline for this task when asked to.
inline void start_timeline(const CommunicationOptions& options, const std::string& task_type, int task_index) {
  const std::string path = timeline_setting(options);
  if (path.empty()) return;
  observe::Timeline::instance().start(observe::timeline_file(path, task_type, task_index), task_type, task_index);
}

}  // namespace strategy
DISTRIBUTE_END_NAMESPACE

// What a ClusterCoordinator (the parameter-server chief) records when asked to be seen: metrics
// served over HTTP on the chief's own host and a timeline of its closures, with the registry,
// server and timeline the other tasks use (observe/). Turned on like a MultiWorkerMirrored task's:
// CoordinatorOptions::metrics_port / timeline, else DISTRIBUTE_METRICS_PORT / DISTRIBUTE_TIMELINE.
// Off, nothing is built: the coordinator tests a null pointer and the timeline's flag per closure.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include <distribute/core/error.hpp>
#include <distribute/net/address.hpp>
#include <distribute/observe/metrics.hpp>
#include <distribute/net/metrics_server.hpp>
#include <distribute/observe/timeline.hpp>
#include <distribute/strategy/observability.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace ps::detail {

/// How the coordinator noticed it lost a worker: a closure's (or dataset's) call to it broke, or a
/// heartbeat got no answer (timed out or refused). A dead process is noticed by whichever comes first.
enum class WorkerLoss : std::uint8_t { ConnectionLost, NoHeartbeat };
inline constexpr std::array<const char*, 2> kWorkerLossReasons = {"connection_lost", "no_heartbeat"};

/// The coordinator's series in its task's registry. Shared with the RemoteValues it hands out
/// (they count fetches), so it may outlive the coordinator; the gauges that read the coordinator
/// are dropped with its HTTP server, which the coordinator owns.
struct CoordinatorMetrics {
  std::shared_ptr<observe::MetricsRegistry> registry;
  observe::Counter* scheduled = nullptr;
  observe::Counter* completed = nullptr;
  observe::Counter* failed = nullptr;
  observe::Counter* cancelled = nullptr;
  observe::Counter* retried = nullptr;
  observe::Counter* fetches = nullptr;
  observe::Counter* recoveries = nullptr;
  std::array<observe::Counter*, kWorkerLossReasons.size()> worker_failures{};
  observe::Histogram* latency = nullptr;

  explicit CoordinatorMetrics(std::shared_ptr<observe::MetricsRegistry> r) : registry(std::move(r)) {
    observe::MetricsRegistry& m = *registry;
    scheduled = &m.counter("distribute_coordinator_closures_scheduled_total", "Closures scheduled on the coordinator.");
    completed = &m.counter("distribute_coordinator_closures_completed_total", "Closures that returned a result.");
    failed = &m.counter("distribute_coordinator_closures_failed_total",
                        "Closures that raised an error on their worker (or lost a ps task).");
    cancelled = &m.counter("distribute_coordinator_closures_cancelled_total",
                           "Closures cancelled before they ran (an earlier error, shutdown, a lost ps task).");
    retried = &m.counter("distribute_coordinator_closures_retried_total",
                         "Closure attempts lost with their worker and scheduled again.");
    fetches = &m.counter("distribute_coordinator_remote_value_fetches_total",
                         "RemoteValue::get/fetch calls (results read by the coordinator).");
    recoveries = &m.counter("distribute_coordinator_worker_recoveries_total",
                            "Lost workers reconnected (their datasets rebuilt).");
    for (std::size_t k = 0; k < kWorkerLossReasons.size(); ++k) {
      worker_failures[k] = &m.counter("distribute_coordinator_worker_failures_total", "Workers lost, by reason.",
                                      {{"reason", kWorkerLossReasons[k]}});
    }
    latency = &m.histogram("distribute_coordinator_closure_latency_seconds",
                           "Time from schedule() to a closure's result or error, retries included.");
  }
};

/// JSON members describing a closure attempt's outcome for the timeline ("" error: none).
inline std::string closure_trace_args(std::uint64_t id, const std::string& function, int worker, std::uint32_t attempt,
                                      const char* outcome, const std::string& error = {}) {
  std::string out = fmt::format("\"closure\":{},\"function\":\"{}\",\"worker\":{},\"attempt\":{},\"outcome\":\"{}\"", id,
                                observe::json_escape(function), worker, attempt, outcome);
  if (!error.empty()) out += fmt::format(",\"error\":\"{}\"", observe::json_escape(error));
  return out;
}

/// The coordinator's observability, when some is on: metrics (with their HTTP server) and/or the
/// timeline. `settings` are the coordinator's options in CommunicationOptions' form.
struct CoordinatorObservability {
  std::shared_ptr<CoordinatorMetrics> metrics;  // null: metrics off
  std::unique_ptr<net::MetricsServer> server;
  bool timeline = false;

  /// Starts what `settings` (or the environment) ask for, for the chief `task_index` whose cluster
  /// address is `address` (the metrics bind to its host, port = the base: the chief is rank 0).
  /// `queued` and `workers_up` are read when scraped. InvalidArgument for bad settings,
  /// Unavailable for a port in use.
  static std::unique_ptr<CoordinatorObservability> start(const CommunicationOptions& settings, int task_index,
                                                          const std::string& address, std::function<double()> queued,
                                                          std::function<double()> workers_up) {
    const std::optional<int> port = strategy::metrics_port_setting(settings, "CoordinatorOptions::metrics_port");
    const std::string timeline_path = strategy::timeline_setting(settings);
    if (!port && timeline_path.empty()) return nullptr;
    auto o = std::make_unique<CoordinatorObservability>();
    if (port) {
      auto registry = std::make_shared<observe::MetricsRegistry>("chief", task_index);
      o->metrics = std::make_shared<CoordinatorMetrics>(registry);
      registry->callback("distribute_coordinator_queued_closures", "Closures waiting for a worker.", "gauge", {},
                         std::move(queued));
      registry->callback("distribute_coordinator_workers_up", "Workers in use (not lost).", "gauge", {},
                         std::move(workers_up));
      const auto host = net::parse_host_port(address).host;
      o->server = std::make_unique<net::MetricsServer>(registry, host, static_cast<std::uint16_t>(*port),
                                                       net::MetricsAccess{settings.cluster_token, settings.insecure});
    }
    if (!timeline_path.empty()) {
      observe::Timeline::instance().start(observe::timeline_file(timeline_path, "chief", task_index), "chief", task_index);
      o->timeline = true;
    }
    return o;
  }

  /// A closure attempt ended (`worker` -1 and `start_ns` 0: cancelled in the queue). "worker_lost"
  /// is retried; any other outcome ("ok", "error", "cancelled") is the closure's last.
  void closure_ended(std::uint64_t id, const std::string& function, std::uint32_t attempt, std::int64_t scheduled_ns,
                     int worker, std::int64_t start_ns, const char* outcome, const std::string& error) {
    const std::int64_t end_ns = observe::Timeline::now_ns();
    const std::string_view o(outcome);
    const bool last = o != "worker_lost";
    if (metrics) {
      if (o == "ok") metrics->completed->add();
      else if (o == "error") metrics->failed->add();
      else if (o == "cancelled") metrics->cancelled->add();
      else metrics->retried->add();
      if (last) metrics->latency->observe(static_cast<double>(end_ns - scheduled_ns) / 1e9);
    }
    if (!observe::timeline_enabled()) return;
    auto& t = observe::Timeline::instance();
    const std::string args = closure_trace_args(id, function, worker, attempt, outcome, error);
    if (start_ns != 0) t.complete(function, "closure_attempt", start_ns, end_ns, args);  // on its worker's dispatcher thread
    // The closure, schedule() to its end: it overlaps others (they queue), hence an async span.
    if (last) t.async_span(function, "closure", id, scheduled_ns, end_ns, args);
  }

  void worker_lost(int worker, WorkerLoss kind, const std::string& error) {
    const auto k = static_cast<std::size_t>(kind);
    if (metrics) metrics->worker_failures[k]->add();
    if (!observe::timeline_enabled()) return;
    observe::Timeline::instance().instant("worker lost", "coordinator", observe::Timeline::now_ns(),
                                          fmt::format("\"worker\":{},\"reason\":\"{}\",\"error\":\"{}\"", worker,
                                                      kWorkerLossReasons[k], observe::json_escape(error)));
    observe::Timeline::instance().flush();  // a job that then fails may not exit normally
  }

  void worker_back(int worker) {
    if (metrics) metrics->recoveries->add();
    if (!observe::timeline_enabled()) return;
    observe::Timeline::instance().instant("worker back", "coordinator", observe::Timeline::now_ns(),
                                          fmt::format("\"worker\":{}", worker));
  }

  /// Stops serving (before the gauges' coordinator goes) and writes the timeline.
  void stop() {
    server.reset();
    if (timeline) observe::Timeline::instance().flush();
  }
};

}  // namespace ps::detail
DISTRIBUTE_END_NAMESPACE

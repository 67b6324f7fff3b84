// One task of a parameter-server test cluster: `ps_helper JOB INDEX CLUSTER_JSON` runs a ds::Server
// for ps or worker task INDEX until the coordinator stops it. The functions below are registered
// in this process and in the test (the coordinator), as every process of a cluster does.
//
// `ps_helper chief N CLUSTER_JSON` is the chief of tests/check_metrics_prometheus.py and
// check_timeline.py (whose coordinator must be a process of its own: they read its /metrics and
// timeline): it schedules N closures (slow_add_one, 50 ms each), says "kill" once a quarter is done
// (the driver then SIGKILLs and restarts worker 1), joins, waits for worker 1 to be back, says
// "done COUNTER RETRIED WORKERS_UP" and waits for a line on stdin before shutting the cluster down.
// Metrics and timeline as the environment says (DISTRIBUTE_METRICS_PORT, DISTRIBUTE_TIMELINE).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>

#include "ps_functions.hpp"

namespace {

template <class F>
bool wait_until(F condition, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

int chief(int n, const std::string& cluster_json) {
  auto spec = ds::ClusterSpec::from_json(cluster_json);
  ds::ParameterServerStrategy strategy(std::make_shared<ds::SimpleClusterResolver>(spec, "chief", 0));
  ds::CoordinatorOptions options;
  // The default heartbeat timeout (3 s): a loaded machine does not lose a worker that is alive,
  // which would count a second failure; the killed one is noticed at once (its sockets close).
  options.log = [](std::string_view line) { std::fprintf(stderr, "chief: %.*s\n", int(line.size()), line.data()); };
  ds::ClusterCoordinator coordinator(strategy, options);
  const auto port = coordinator.metrics_port();
  std::printf("ready %d\n", port ? int(*port) : -1);
  std::fflush(stdout);
  auto scope = strategy.scope();
  ds::Variable<float> counter(0.0f, {.name = "counter"});
  std::vector<ds::RemoteValue<void>> results;
  for (int i = 0; i < n; ++i) results.push_back(coordinator.schedule(&ps_test::slow_add_one, counter, 50));
  auto completed = [&] {
    auto v = coordinator.closures_completed_per_worker();
    return std::accumulate(v.begin(), v.end(), std::uint64_t{0});
  };
  if (!wait_until([&] { return completed() >= std::uint64_t(n / 4); }, std::chrono::seconds(60))) {
    throw std::runtime_error("a quarter of the closures did not complete within 60 s");
  }
  std::printf("kill\n");
  std::fflush(stdout);
  coordinator.join();
  for (auto& r : results) r.get();  // fetches, counted
  if (!wait_until([&] { return coordinator.num_workers_up() == coordinator.num_workers(); }, std::chrono::seconds(30))) {
    throw std::runtime_error("worker 1 did not come back within 30 s");
  }
  std::printf("done %g %llu %d\n", double(counter.read_value()), (unsigned long long)coordinator.closures_retried(),
              coordinator.num_workers_up());
  std::fflush(stdout);
  std::string line;
  std::getline(std::cin, line);
  coordinator.shutdown_cluster();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // `ps_helper tf-config`: the task TF_CONFIG names (as distribute-launch starts it), with the
  // token the environment gives; prints "serving JOB at ADDRESS" (tests/test_hostile_input.cpp).
  if (argc == 2 && std::string(argv[1]) == "tf-config") {
    try {
      ds::TFConfigClusterResolver r;
      ds::Server server(r.cluster_spec(), r.task_type(), r.task_id());
      std::printf("serving %s at %s\n", r.task_type().c_str(), r.cluster_spec().task_address(r.task_type(), r.task_id()).c_str());
      std::fflush(stdout);
      server.join();
      return 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ps_helper tf-config: %s\n", e.what());
      return 1;
    }
  }
  if (argc != 4) {
    std::fprintf(stderr, "usage: ps_helper ps|worker INDEX CLUSTER_JSON, or ps_helper chief N CLUSTER_JSON\n");
    return 2;
  }
  const std::string job = argv[1];
  try {
    if (job == "chief") return chief(std::atoi(argv[2]), argv[3]);
    ds::Server server(ds::ClusterSpec::from_json(argv[3]), argv[1], std::atoi(argv[2]));
    std::printf("serving %s at %s\n", argv[1], server.target().c_str());
    std::fflush(stdout);
    server.join();
    std::printf("stopped\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ps_helper %s %s: %s\n", argv[1], argv[2], e.what());
    if (job == "chief") std::printf("error: %s\n", e.what());  // the driver reads the chief's stdout
    return 1;
  }
}

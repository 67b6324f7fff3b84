// A parameter-server test cluster of real processes on 127.0.0.1 (the ps and worker tasks are
// ps_helper processes, the test is the chief), and what the cluster tests ask of it: a
// coordinator's log lines, quiet options, counters summed over tasks' /metrics.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <distribute/cluster/cluster_resolver.hpp>
#include <distribute/cluster/cluster_spec.hpp>
#include <distribute/ps/cluster_coordinator.hpp>

#include "http_get.hpp"
#include "processes.hpp"

namespace test_support {

namespace ds = distribute;
using namespace std::chrono_literals;

inline const char* helper_path() {
  const char* p = std::getenv("DISTRIBUTE_PS_HELPER");
  REQUIRE_MESSAGE(p != nullptr, "DISTRIBUTE_PS_HELPER is not set (run through meson test)");
  return p;
}

/// num_ps ps tasks and num_workers workers (ps_helper processes); this process is the chief.
struct Cluster {
  int num_ps, num_workers;
  std::vector<int> ports;
  ds::ClusterSpec spec;
  std::vector<Child> ps, workers;
  std::map<std::string, std::string> env;

  Cluster(int p, int w, std::map<std::string, std::string> environment = {})
      : num_ps(p), num_workers(w), ports(free_ports(p + w + 1)), env(std::move(environment)) {
    auto addr = [&](int i) { return fmt::format("127.0.0.1:{}", ports[static_cast<std::size_t>(i)]); };
    ds::ClusterSpec::DenseJobs jobs;
    jobs["chief"] = {addr(p + w)};
    for (int i = 0; i < p; ++i) jobs["ps"].push_back(addr(i));
    for (int i = 0; i < w; ++i) jobs["worker"].push_back(addr(p + i));
    spec = ds::ClusterSpec(jobs);
    for (int i = 0; i < p; ++i) ps.push_back(start("ps", i));
    for (int i = 0; i < w; ++i) workers.push_back(start("worker", i));
  }
  Cluster(const Cluster&) = delete;
  ~Cluster() {
    for (auto* group : {&ps, &workers}) {
      for (auto& c : *group) kill_task(c);
    }
  }

  Child start(const std::string& job, int index) {
    return spawn({helper_path(), job, std::to_string(index), spec.to_json()}, env);
  }
  static void kill_task(Child& c) {
    if (c.pid <= 0) return;
    ::kill(c.pid, SIGKILL);
    ::waitpid(c.pid, nullptr, 0);
    ::close(c.out_fd);
    c.pid = -1;
  }
  std::shared_ptr<ds::ClusterResolver> resolver() const {
    return std::make_shared<ds::SimpleClusterResolver>(spec, "chief", 0);
  }
};

/// What a coordinator reported (lost and returning workers).
struct LogLines {
  std::mutex mutex;
  std::vector<std::string> lines;
  bool has(const std::string& text) {
    std::lock_guard lock(mutex);
    return std::any_of(lines.begin(), lines.end(), [&](const auto& l) { return l.find(text) != std::string::npos; });
  }
};

inline ds::CoordinatorOptions quiet_options(LogLines* log = nullptr) {
  ds::CoordinatorOptions o;
  // Above the default 3 s: under ASan on 2 cores beside another multi-process suite, one ping can stall past
  // a second, and a ps task missing one heartbeat is lost for good. A SIGSTOPped worker is found after it.
  o.heartbeat_timeout = 5000ms;
  o.log = [log](std::string_view line) {
    MESSAGE(std::string(line));
    if (log) {
      std::lock_guard lock(log->mutex);
      log->lines.emplace_back(line);
    }
  };
  return o;
}

/// The value of a Prometheus counter line `name{...} value` summed over the given ports.
inline double metric_sum(const std::vector<int>& ports, const std::string& name) {
  double total = 0;
  for (int port : ports) {
    const std::string text = http_get(port, "/metrics");
    std::size_t at = 0;
    while ((at = text.find("\n" + name + "{", at)) != std::string::npos) {
      const auto end = text.find('\n', at + 1);
      const auto line = text.substr(at + 1, end - at - 1);
      total += std::stod(line.substr(line.rfind(' ') + 1));
      at = end;
    }
  }
  return total;
}

template <class F>
bool wait_until(F&& ready, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!ready()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

}  // namespace test_support

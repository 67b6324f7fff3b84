// reduce_scatter, all_to_all, broadcast and all_reduce_async of MultiWorkerMirroredStrategy with
// real worker processes on 127.0.0.1 (tests/scatter_worker_helper is one worker).
#include <distribute/distribute.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <unistd.h>

#include "support/processes.hpp"

using namespace std::chrono_literals;

namespace {

std::vector<test_support::Child> start_workers(int n, const std::string& scenario, int local,
                                                std::map<std::string, std::string> extra = {}) {
  const char* helper = std::getenv("DISTRIBUTE_SCATTER_WORKER_HELPER");
  REQUIRE_MESSAGE(helper != nullptr, "DISTRIBUTE_SCATTER_WORKER_HELPER is not set (run through meson test)");
  auto ports = test_support::free_ports(n);
  std::vector<test_support::Child> children;
  for (int i = 0; i < n; ++i) {
    auto env = extra;
    env["TF_CONFIG"] = test_support::tf_config(ports, i);
    children.push_back(test_support::spawn({helper, scenario, std::to_string(local)}, env));
  }
  return children;
}

}  // namespace

TEST_CASE("reduce_scatter, all_to_all and broadcast: 2-4 workers x 1-2 local replicas, over TCP and shared memory") {
  for (const char* shm : {"0", "4096"}) {  // 0: TCP only; 4096: buffers of 4 KiB and more through shared memory
    for (int workers = 2; workers <= 4; ++workers) {
      for (int local = 1; local <= 2; ++local) {
        CAPTURE(shm);
        CAPTURE(workers);
        CAPTURE(local);
        auto children = start_workers(workers, "scatter", local, {{"TEST_SHARED_MEMORY_MIN_BYTES", shm}});
        CHECK(test_support::wait_all(children, 120s));
        for (auto& c : children) {
          INFO(c.output);
          CHECK(c.status == 0);
          CHECK(c.output.find("OK") != std::string::npos);
        }
      }
    }
  }
}

TEST_CASE("reduce_scatter and all_to_all mismatched across workers: InvalidArgument on every worker, no hang") {
  const std::map<std::string, std::string> expect = {
      {"mismatch_reduce_scatter", "shapes #"},
      {"mismatch_all_to_all_count", "passed 5 values but there are 4 replicas in sync"},
      {"mismatch_all_to_all_dtype", "is float64 but value 0 of replica 0 is float32"},
  };
  for (const auto& [scenario, text] : expect) {
    INFO(scenario);
    auto children = start_workers(2, scenario, 2, {{"TEST_TIMEOUT_SECONDS", "20"}});
    const auto started = std::chrono::steady_clock::now();
    CHECK(test_support::wait_all(children, 60s));
    CHECK(std::chrono::steady_clock::now() - started < 20s);  // seen, not timed out
    for (auto& c : children) {
      INFO(c.output);
      CHECK(c.status == 4);
      CHECK(c.output.find(text) != std::string::npos);
    }
  }
}

TEST_CASE("all_reduce_async across 2 and 3 workers x 1 and 2 local replicas: 6 in flight per step, exact sums") {
  for (int workers = 2; workers <= 3; ++workers) {
    for (int local = 1; local <= 2; ++local) {
      CAPTURE(workers);
      CAPTURE(local);
      auto children = start_workers(workers, "async", local);
      CHECK(test_support::wait_all(children, 120s));
      for (auto& c : children) {
        INFO(c.output);
        CHECK(c.status == 0);
        CHECK(c.output.find("OK") != std::string::npos);
      }
    }
  }
}

TEST_CASE("a worker SIGKILLed with 4 all_reduce_async in flight: every survivor's wait() throws PeerFailure (10 times)") {
  for (int trial = 0; trial < 10; ++trial) {
    CAPTURE(trial);
    const int victim = trial % 3;
    auto children = start_workers(3, "async_kill", 1, {{"TEST_TIMEOUT_SECONDS", "30"}});
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    for (bool all_started = false; !all_started && std::chrono::steady_clock::now() < deadline;) {
      all_started = true;
      for (auto& c : children) {
        char buf[4096];
        ssize_t got;
        while ((got = read(c.out_fd, buf, sizeof buf)) > 0) c.output.append(buf, static_cast<std::size_t>(got));
        all_started = all_started && c.output.find("first step done") != std::string::npos;
      }
      std::this_thread::sleep_for(5ms);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(7 * trial));
    kill(children[static_cast<std::size_t>(victim)].pid, SIGKILL);
    const auto killed_at = std::chrono::steady_clock::now();
    CHECK(test_support::wait_all(children, 30s));  // nobody hangs
    CHECK(std::chrono::steady_clock::now() - killed_at < 12s);
    for (int i = 0; i < 3; ++i) {
      if (i == victim) continue;
      const auto& c = children[static_cast<std::size_t>(i)];
      INFO("worker ", i, " output:\n", c.output);
      CHECK(c.status == 3);
      CHECK(c.output.find("wait() threw PeerFailure") != std::string::npos);
      CHECK(c.output.find(fmt::format("worker:{}", victim)) != std::string::npos);
    }
  }
}

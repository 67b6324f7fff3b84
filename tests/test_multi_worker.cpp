// MultiWorkerMirroredStrategy with real worker processes on 127.0.0.1 (tests/multi_worker_helper).
#include <distribute/distribute.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../examples/common/logistic_model.hpp"
#include "support/processes.hpp"

namespace ds = distribute;
using namespace std::chrono_literals;

namespace {

std::string helper_path() {
  const char* p = std::getenv("DISTRIBUTE_MULTI_WORKER_HELPER");
  REQUIRE_MESSAGE(p != nullptr, "DISTRIBUTE_MULTI_WORKER_HELPER is not set (run through meson test)");
  return p;
}

std::vector<test_support::Child> start_workers(int n, const std::string& scenario, int local,
                                                std::map<std::string, std::string> extra = {}) {
  auto ports = test_support::free_ports(n);
  std::vector<test_support::Child> children;
  for (int i = 0; i < n; ++i) {
    auto env = extra;
    env["TF_CONFIG"] = test_support::tf_config(ports, i);
    children.push_back(test_support::spawn({helper_path(), scenario, std::to_string(local)}, env));
  }
  return children;
}

void require_all_ok(std::vector<test_support::Child>& children) {
  const bool finished = test_support::wait_all(children, 120s);
  CHECK(finished);
  for (std::size_t i = 0; i < children.size(); ++i) {
    INFO("worker ", i, " output:\n", children[i].output);
    CHECK(children[i].status == 0);
    CHECK(children[i].output.find("OK") != std::string::npos);
  }
}

}  // namespace

TEST_CASE("2, 3 and 4 workers x 1 and 2 local replicas: collectives, reduce, gather, variables") {
  for (int workers : {2, 3, 4}) {
    for (int local : {1, 2}) {
      CAPTURE(workers);
      CAPTURE(local);
      auto children = start_workers(workers, "collectives", local);
      require_all_ok(children);
    }
  }
}

TEST_CASE("packing across workers: several values in small packs give the same exact results") {
  auto children = start_workers(3, "collectives", 2, {{"TEST_BYTES_PER_PACK", "64"}});
  require_all_ok(children);
}

TEST_CASE("no TF_CONFIG: a single-worker cluster behaves like MirroredStrategy") {
  std::vector<test_support::Child> one;
  one.push_back(test_support::spawn({helper_path(), "collectives", "3"}, {{"TF_CONFIG", ""}}));
  require_all_ok(one);
}

TEST_CASE("a worker SIGKILLed mid all-reduce: every survivor throws PeerFailure naming it (20 times)") {
  std::mt19937 rng(12345);
  for (int trial = 0; trial < 20; ++trial) {
    CAPTURE(trial);
    const int victim = static_cast<int>(rng() % 3);
    auto children = start_workers(3, "kill", 1);
    // Wait until every worker is inside the all-reduce loop.
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    for (;;) {
      bool all_started = true;
      for (auto& c : children) {
        char buf[4096];
        ssize_t n;
        while ((n = read(c.out_fd, buf, sizeof buf)) > 0) c.output.append(buf, static_cast<std::size_t>(n));
        all_started = all_started && c.output.find("first all-reduce done") != std::string::npos;
      }
      if (all_started || std::chrono::steady_clock::now() > deadline) break;
      std::this_thread::sleep_for(5ms);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 50));
    kill(children[static_cast<std::size_t>(victim)].pid, SIGKILL);
    const auto killed_at = std::chrono::steady_clock::now();
    const bool finished = test_support::wait_all(children, 20s);
    const auto took = std::chrono::steady_clock::now() - killed_at;
    CHECK(finished);  // nobody hangs
    CHECK(took < 12s);  // within the heartbeat bound (10 s), in practice at once
    for (int i = 0; i < 3; ++i) {
      if (i == victim) continue;
      const auto& c = children[static_cast<std::size_t>(i)];
      INFO("worker ", i, " output:\n", c.output);
      CHECK(c.status == 3);
      CHECK(c.output.find("PeerFailure") != std::string::npos);
      CHECK(c.output.find(fmt::format("worker:{}", victim)) != std::string::npos);
    }
  }
}

TEST_CASE("mismatched collectives across workers: InvalidArgument on every worker") {
  auto children = start_workers(3, "mismatch", 1);
  CHECK(test_support::wait_all(children, 60s));
  for (auto& c : children) {
    INFO(c.output);
    CHECK(c.status == 4);
    CHECK(c.output.find("InvalidArgument") != std::string::npos);
  }
}

TEST_CASE("the demo on 3 workers ends with the same weights as on one device") {
  auto children = start_workers(3, "demo", 1);
  CHECK(test_support::wait_all(children, 120s));
  const auto data = demo::make_data(1000, 8, 7);
  demo::TrainConfig config{.epochs = 3, .global_batch = 64, .learning_rate = 0.5f};
  ds::OneDeviceStrategy<> one;
  const auto reference = demo::train(one, data, config);
  for (auto& c : children) {
    INFO(c.output);
    REQUIRE(c.status == 0);
    auto at = c.output.find("weights ");
    REQUIRE(at != std::string::npos);
    std::istringstream in(c.output.substr(at + 8));
    std::vector<float> w;
    float x;
    while (w.size() < reference.size() && in >> x) w.push_back(x);
    REQUIRE(w.size() == reference.size());
    float max_diff = 0;
    for (std::size_t k = 0; k < w.size(); ++k) max_diff = std::max(max_diff, std::abs(w[k] - reference[k]));
    CHECK(max_diff <= 1e-5f);
  }
}

TEST_CASE("configuration errors") {
  ds::TFConfigClusterResolver ps_task(R"({"cluster": {"worker": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"]},
                                          "task": {"type": "ps", "index": 0}})");
  auto resolver = std::make_shared<ds::TFConfigClusterResolver>(ps_task);
  CHECK_THROWS_WITH_AS(ds::MultiWorkerMirroredStrategy<>({}, resolver), doctest::Contains("this task is 'ps'"),
                       ds::ClusterConfigError);
  CHECK_THROWS_WITH_AS(ds::MultiWorkerMirroredStrategy<>({.implementation = ds::CommunicationImplementation::Nccl}),
                       doctest::Contains("NCCL needs the cuda backend"), ds::InvalidArgument);
}

TEST_CASE("the demo under distribute-launch -n 3 ends with the same weights as on one device") {
  const char* launcher = std::getenv("DISTRIBUTE_LAUNCH");
  REQUIRE_MESSAGE(launcher != nullptr, "DISTRIBUTE_LAUNCH is not set (run through meson test)");
  std::vector<test_support::Child> run;
  run.push_back(test_support::spawn({launcher, "-n", "3", "--timeout", "120", "--", helper_path(), "demo", "1"}, {}));
  CHECK(test_support::wait_all(run, 150s));
  INFO(run[0].output);
  REQUIRE(run[0].status == 0);
  const auto data = demo::make_data(1000, 8, 7);
  demo::TrainConfig config{.epochs = 3, .global_batch = 64, .learning_rate = 0.5f};
  ds::OneDeviceStrategy<> one;
  const auto reference = demo::train(one, data, config);
  for (int worker = 0; worker < 3; ++worker) {
    const std::string prefix = fmt::format("[worker:{}] weights ", worker);
    auto at = run[0].output.find(prefix);
    REQUIRE(at != std::string::npos);
    std::istringstream in(run[0].output.substr(at + prefix.size()));
    std::vector<float> w;
    float x;
    while (w.size() < reference.size() && in >> x) w.push_back(x);
    REQUIRE(w.size() == reference.size());
    float max_diff = 0;
    for (std::size_t k = 0; k < w.size(); ++k) max_diff = std::max(max_diff, std::abs(w[k] - reference[k]));
    CHECK(max_diff <= 1e-5f);
  }
}

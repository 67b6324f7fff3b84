// PreemptionCheckpointHandler: in-process cases (OneDevice/Mirrored, PreemptionAction::Throw) and
// real worker processes (tests/preemption_helper) that are SIGTERMed, exit, and are restarted.
#define DISTRIBUTE_WITH_CHECKPOINT
#include <distribute/distribute.hpp>
#include <distribute/checkpoint/preemption.hpp>

#include <doctest/doctest.h>

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "support/processes.hpp"

namespace ds = distribute;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

/// A fresh directory under the system temp dir, removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    static std::atomic<int> counter{0};
    path = fs::temp_directory_path() / fmt::format("ds_preemption_{}_{}", getpid(), counter++);
    fs::remove_all(path);
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
};

std::vector<std::string> directory_entries(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// A one-step "training" that adds the step number to a variable.
struct Model {
  ds::Variable<std::int64_t> sum{0, {.name = "sum"}};
  ds::Checkpoint ckpt;
  Model() { ckpt.track("sum", sum); }
};

int sigterm_count_seen = 0;
void counting_handler(int) { ++sigterm_count_seen; }

}  // namespace

TEST_CASE("checkpoint_manager_options: worker 0 is the chief, others write workertemp_<index>") {
  ds::OneDeviceStrategy<> one;
  auto o = ds::checkpoint_manager_options(one, "model");
  CHECK(o.is_chief);
  CHECK(o.task_id == 0);
  CHECK(o.checkpoint_name == "model");
  ds::MirroredStrategy<> mirrored(2);
  CHECK(ds::checkpoint_manager_options(mirrored).is_chief);
}

TEST_CASE("OneDevice, Throw: a SIGTERM during step K saves at K+1 and throws; a new handler resumes there") {
  TempDir dir;
  ds::OneDeviceStrategy<> strategy;
  {
    Model m;
    ds::PreemptionCheckpointHandler handler(strategy, m.ckpt, dir.path, {.action = ds::PreemptionAction::Throw});
    CHECK(handler.total_run_calls() == 0);
    CHECK_FALSE(handler.restored_from());
    std::int64_t step = handler.total_run_calls();
    try {
      for (; step < 10; ++step) {
        const int r = handler.run([&](std::int64_t s) {
          m.sum.assign_add(s);
          if (s == 4) raise(SIGTERM);
          return 7;
        }, step);
        CHECK(r == 7);
      }
      FAIL("no Preempted");
    } catch (const ds::Preempted& e) {
      CHECK(e.step() == 5);
      CHECK(e.exit_code() == ds::kPreemptionExitCode);
      CHECK(e.checkpoint_path() == dir.path / "ckpt-1.safetensors");
      CHECK(std::string(e.what()).find("at step 5") != std::string::npos);
    }
    CHECK(step == 5);  // the check comes before step 5 runs
    CHECK(handler.preemption_received());
    CHECK(m.sum.read_value() == 0 + 1 + 2 + 3 + 4);
  }
  CHECK(directory_entries(dir.path) == std::vector<std::string>{"checkpoint", "ckpt-1.safetensors"});
  Model m2;
  ds::PreemptionCheckpointHandler handler(strategy, m2.ckpt, dir.path, {.action = ds::PreemptionAction::Throw});
  CHECK(handler.total_run_calls() == 5);
  CHECK(handler.restored_from() == dir.path / "ckpt-1.safetensors");
  CHECK(m2.sum.read_value() == 10);
  CHECK_FALSE(handler.preemption_received());
  for (std::int64_t step = handler.total_run_calls(); step < 10; ++step) handler.run([&] { m2.sum.assign_add(step); });
  CHECK(m2.sum.read_value() == 45);
  CHECK(handler.total_run_calls() == 10);
}

TEST_CASE("a SIGTERM before the first step saves step 0; two SIGTERMs save once") {
  TempDir dir;
  ds::MirroredStrategy<> strategy(2);
  auto scope = strategy.scope();
  {
    Model m;
    ds::PreemptionCheckpointHandler handler(strategy, m.ckpt, dir.path, {.action = ds::PreemptionAction::Throw});
    raise(SIGTERM);
    bool ran = false;
    CHECK_THROWS_AS(handler.run([&] { ran = true; }), ds::Preempted);
    CHECK_FALSE(ran);
    CHECK(handler.total_run_calls() == 0);
  }
  {
    Model m;
    ds::PreemptionCheckpointHandler handler(strategy, m.ckpt, dir.path, {.action = ds::PreemptionAction::Throw});
    CHECK(handler.total_run_calls() == 0);
    handler.run([&] { m.sum.assign_add(1); });
    handler.run([&] {
      m.sum.assign_add(1);
      raise(SIGTERM);
      raise(SIGTERM);
    });
    try {
      handler.run([&] { m.sum.assign_add(1); });
      FAIL("no Preempted");
    } catch (const ds::Preempted& e) {
      CHECK(e.step() == 2);
    }
    // Still signalled: the next check saves again rather than carrying on silently.
    CHECK_THROWS_AS(handler.run([] {}), ds::Preempted);
  }
  Model m;
  ds::PreemptionCheckpointHandler handler(strategy, m.ckpt, dir.path, {.action = ds::PreemptionAction::Throw});
  CHECK(handler.total_run_calls() == 2);
  CHECK(m.sum.read_value() == 2);
}

TEST_CASE("save_checkpoint_if_preempted counts the step first; check_interval delays the save") {
  TempDir dir;
  ds::OneDeviceStrategy<> strategy;
  {
    Model m;
    ds::PreemptionCheckpointHandler handler(strategy, m.ckpt, dir.path / "a", {.action = ds::PreemptionAction::Throw});
    m.sum.assign_add(1);
    handler.save_checkpoint_if_preempted();
    m.sum.assign_add(1);
    raise(SIGTERM);
    try {
      handler.save_checkpoint_if_preempted();
      FAIL("no Preempted");
    } catch (const ds::Preempted& e) {
      CHECK(e.step() == 2);  // both steps are in the checkpoint
    }
  }
  {
    Model m;
    ds::PreemptionCheckpointHandler handler(strategy, m.ckpt, dir.path / "b",
                                            {.action = ds::PreemptionAction::Throw, .check_interval = 3});
    std::int64_t done = 0;
    try {
      for (int i = 0; i < 10; ++i) {
        handler.run([&] {
          if (i == 0) raise(SIGTERM);
        });
        ++done;
      }
    } catch (const ds::Preempted& e) {
      CHECK(e.step() == 3);
    }
    CHECK(done == 3);
  }
}

TEST_CASE("the destructor puts the previous SIGTERM handler back") {
  TempDir dir;
  ds::OneDeviceStrategy<> strategy;
  struct sigaction mine {}, old {};
  mine.sa_handler = &counting_handler;
  sigemptyset(&mine.sa_mask);
  REQUIRE(sigaction(SIGTERM, &mine, &old) == 0);
  {
    Model m;
    ds::PreemptionCheckpointHandler handler(strategy, m.ckpt, dir.path, {.action = ds::PreemptionAction::Throw});
    raise(SIGTERM);
    CHECK(sigterm_count_seen == 0);
    CHECK(handler.preemption_received());
  }
  raise(SIGTERM);
  CHECK(sigterm_count_seen == 1);
  REQUIRE(sigaction(SIGTERM, &old, nullptr) == 0);
}

TEST_CASE("misuse is InvalidArgument") {
  TempDir dir;
  ds::OneDeviceStrategy<> strategy;
  Model m;
  CHECK_THROWS_WITH_AS(ds::PreemptionCheckpointHandler(strategy, m.ckpt, dir.path, {.check_interval = 0}),
                       doctest::Contains("check_interval"), ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(ds::PreemptionCheckpointHandler(strategy, m.ckpt, dir.path, {.exit_code = 300}),
                       doctest::Contains("exit_code 300"), ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(ds::PreemptionCheckpointHandler(strategy, m.ckpt, dir.path, {.signals = {SIGKILL}}),
                       doctest::Contains("cannot be caught"), ds::InvalidArgument);
  ds::CheckpointManager not_chief(m.ckpt, dir.path, 1, {.is_chief = false, .task_id = 0});
  CHECK_THROWS_WITH_AS(ds::PreemptionCheckpointHandler(strategy, not_chief), doctest::Contains("checkpoint_manager_options"),
                       ds::InvalidArgument);
  {
    ds::PreemptionCheckpointHandler first(strategy, m.ckpt, dir.path);
    Model other;
    CHECK_THROWS_WITH_AS(ds::PreemptionCheckpointHandler(strategy, other.ckpt, dir.path / "x"),
                         doctest::Contains("one at a time"), ds::InvalidArgument);
  }
  // The first handler left its counter in m.ckpt.
  CHECK_THROWS_WITH_AS(ds::PreemptionCheckpointHandler(strategy, m.ckpt, dir.path),
                       doctest::Contains("already tracks"), ds::InvalidArgument);
  // A failed construction leaves no handler installed.
  Model fresh;
  ds::PreemptionCheckpointHandler ok(strategy, fresh.ckpt, dir.path / "y");
  CHECK(ok.total_run_calls() == 0);
}

// ---- real processes -------------------------------------------------------------------------

namespace {

constexpr int kSteps = 120;

std::string helper_path() {
  const char* p = std::getenv("DISTRIBUTE_PREEMPTION_HELPER");
  REQUIRE_MESSAGE(p != nullptr, "DISTRIBUTE_PREEMPTION_HELPER is not set (run through meson test)");
  return p;
}

std::vector<test_support::Child> start_workers(int n, const fs::path& dir, std::vector<std::string> extra = {},
                                                std::map<std::string, std::string> env = {}) {
  auto ports = test_support::free_ports(n);
  std::vector<test_support::Child> children;
  for (int i = 0; i < n; ++i) {
    auto e = env;
    e["TF_CONFIG"] = test_support::tf_config(ports, i);
    std::vector<std::string> argv{helper_path(), "multi", dir.string(), std::to_string(kSteps)};
    argv.insert(argv.end(), extra.begin(), extra.end());
    children.push_back(test_support::spawn(argv, e));
  }
  return children;
}

std::string line_after(const std::string& output, const std::string& prefix) {
  auto at = output.find(prefix);
  if (at == std::string::npos) return "";
  at += prefix.size();
  return output.substr(at, output.find('\n', at) - at);
}

std::string final_weights(const std::string& output) { return line_after(output, "final w "); }

// The step a worker saved at, from the handler's exit message; -1 if none.
long saved_step(const std::string& output) {
  const std::string s = line_after(output, "' at step ");
  return s.empty() ? -1 : std::atol(s.c_str());
}

long resumed_at(const std::string& output) {
  const std::string s = line_after(output, "resume at step ");
  return s.empty() ? -1 : std::atol(s.c_str());
}

// Every worker finishes with exit 0 and the same weights; returns them.
std::string require_completed(std::vector<test_support::Child>& children, long resume_step) {
  CHECK(test_support::wait_all(children, 60s));
  std::string weights;
  for (std::size_t i = 0; i < children.size(); ++i) {
    INFO("worker ", i, " output:\n", children[i].output);
    REQUIRE(children[i].status == 0);
    CHECK(resumed_at(children[i].output) == resume_step);
    const std::string w = final_weights(children[i].output);
    REQUIRE(!w.empty());
    if (i == 0) weights = w;
    CHECK(w == weights);
  }
  return weights;
}

// Every worker exits with the preemption code, all saved at the same step; returns it. Only the
// chief's checkpoint is left in the directory.
long require_preempted(std::vector<test_support::Child>& children, const fs::path& dir) {
  CHECK(test_support::wait_all(children, 60s));
  long step = -2;
  for (std::size_t i = 0; i < children.size(); ++i) {
    INFO("worker ", i, " output:\n", children[i].output);
    REQUIRE(children[i].status == ds::kPreemptionExitCode);
    const long s = saved_step(children[i].output);
    CHECK(s >= 0);
    if (i == 0) step = s;
    CHECK(s == step);
    CHECK(children[i].output.find("OK") == std::string::npos);
  }
  for (const auto& name : directory_entries(dir)) {
    INFO(name);
    CHECK(name.rfind("workertemp_", 0) != 0);
    CHECK((name == "checkpoint" || (name.rfind("ckpt-", 0) == 0 && name.ends_with(".safetensors"))));
  }
  return step;
}

std::string uninterrupted_weights() {
  static std::string weights;
  if (weights.empty()) {
    TempDir dir;
    auto children = start_workers(3, dir.path);
    weights = require_completed(children, 0);
  }
  return weights;
}

}  // namespace

TEST_CASE("3 workers: SIGTERM to worker 1 during step 17: all save at step 18 and exit; the restart equals an "
          "uninterrupted run") {
  const std::string w = uninterrupted_weights();
  TempDir dir;
  auto run1 = start_workers(3, dir.path, {"17", "1"});
  CHECK(require_preempted(run1, dir.path) == 18);
  CHECK(directory_entries(dir.path) == std::vector<std::string>{"checkpoint", "ckpt-1.safetensors"});
  auto run2 = start_workers(3, dir.path);
  CHECK(require_completed(run2, 18) == w);
}

TEST_CASE("3 workers: the test SIGTERMs worker 1 after it prints step 10; the restart equals an uninterrupted run") {
  const std::string w = uninterrupted_weights();
  TempDir dir;
  auto run1 = start_workers(3, dir.path, {}, {{"PREEMPTION_STEP_SLEEP_MS", "10"}});
  auto& victim = run1[1];
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (victim.output.find("step 10\n") == std::string::npos && std::chrono::steady_clock::now() < deadline) {
    char buf[4096];
    ssize_t n;
    while ((n = read(victim.out_fd, buf, sizeof buf)) > 0) victim.output.append(buf, static_cast<std::size_t>(n));
    std::this_thread::sleep_for(2ms);
  }
  REQUIRE_MESSAGE(victim.output.find("step 10\n") != std::string::npos, victim.output);
  kill(victim.pid, SIGTERM);
  const long step = require_preempted(run1, dir.path);
  CHECK(step >= 11);
  CHECK(step < kSteps);
  auto run2 = start_workers(3, dir.path);
  CHECK(require_completed(run2, step) == w);
}

TEST_CASE("3 workers: SIGTERM before the first step saves step 0; two SIGTERMs; preempted twice across restarts") {
  const std::string w = uninterrupted_weights();
  TempDir dir;
  auto run1 = start_workers(3, dir.path, {"-1", "2"});  // worker 2, right after the handler is made
  CHECK(require_preempted(run1, dir.path) == 0);
  auto run2 = start_workers(3, dir.path, {"40", "0", "2"});  // the chief, two SIGTERMs in step 40
  CHECK(require_preempted(run2, dir.path) == 41);
  for (auto& c : run2) CHECK(resumed_at(c.output) == 0);
  auto run3 = start_workers(3, dir.path, {"90", "2"});  // preempted again after resuming at 41
  CHECK(require_preempted(run3, dir.path) == 91);
  for (auto& c : run3) CHECK(resumed_at(c.output) == 41);
  auto run4 = start_workers(3, dir.path);
  CHECK(require_completed(run4, 91) == w);
}

TEST_CASE("3 workers, a CheckpointManager made in the strategy's scope without options: worker 0 writes, the others "
          "write workertemp_<i>/ which is removed; the restart equals an uninterrupted run") {
  const std::string w = uninterrupted_weights();
  TempDir dir;
  const std::map<std::string, std::string> env{{"PREEMPTION_MANAGER_FROM_SCOPE", "1"}};
  auto run1 = start_workers(3, dir.path, {"17", "2"}, env);
  CHECK(require_preempted(run1, dir.path) == 18);  // also: no workertemp_ directory is left
  for (std::size_t i = 0; i < run1.size(); ++i) {
    INFO("worker ", i, " output:\n", run1[i].output);
    CHECK(line_after(run1[i].output, "manager is_chief ") == fmt::format("{} task_id {}", i == 0 ? 1 : 0, i));
  }
  CHECK(directory_entries(dir.path) == std::vector<std::string>{"checkpoint", "ckpt-1.safetensors"});
  auto run2 = start_workers(3, dir.path, {}, env);
  CHECK(require_completed(run2, 18) == w);
}

TEST_CASE("2 workers x 2 local replicas, checking every 4 steps: interrupted and resumed equals uninterrupted") {
  TempDir ref, dir;
  const std::map<std::string, std::string> env{{"PREEMPTION_LOCAL_REPLICAS", "2"}, {"PREEMPTION_CHECK_INTERVAL", "4"}};
  auto full = start_workers(2, ref.path, {}, env);
  const std::string w = require_completed(full, 0);
  CHECK(w != uninterrupted_weights());  // 4 replicas see other batches than 3
  auto run1 = start_workers(2, dir.path, {"61", "1"}, env);  // signalled in step 61: saved at the next multiple of 4
  CHECK(require_preempted(run1, dir.path) == 64);
  auto run2 = start_workers(2, dir.path, {}, env);
  CHECK(require_completed(run2, 64) == w);
}

TEST_CASE("one process, MirroredStrategy(2): SIGTERM saves and exits 42; the restart equals an uninterrupted run") {
  TempDir ref, dir;
  auto mirrored = [&](const fs::path& d, std::vector<std::string> extra) {
    std::vector<std::string> argv{helper_path(), "mirrored", d.string(), std::to_string(kSteps)};
    argv.insert(argv.end(), extra.begin(), extra.end());
    std::vector<test_support::Child> one;
    one.push_back(test_support::spawn(argv, {{"TF_CONFIG", ""}}));
    return one;
  };
  auto full = mirrored(ref.path, {});
  const std::string w = require_completed(full, 0);
  auto run1 = mirrored(dir.path, {"30"});
  CHECK(require_preempted(run1, dir.path) == 31);
  auto run2 = mirrored(dir.path, {});
  CHECK(require_completed(run2, 31) == w);
}

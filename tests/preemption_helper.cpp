// One worker of the preemption tests: trains a tiny linear model for STEPS steps under a
// PreemptionCheckpointHandler and prints the final weights as exact hex floats.
//   preemption_helper MODE CKPT_DIR STEPS [SIGTERM_AT [SIGTERM_WORKER [COUNT]]]
// MODE: multi (MultiWorkerMirroredStrategy<host> from TF_CONFIG, the (checkpoint, directory)
// form), mirrored (MirroredStrategy<host>(2) in one process, the CheckpointManager form).
// SIGTERM_AT K >= 0: worker SIGTERM_WORKER sends itself COUNT (default 1) SIGTERMs during step K;
// K = -1: right after the handler is made, before the first step; absent: no signal (the test
// may send one). Environment: PREEMPTION_STEP_SLEEP_MS slows each step down;
// PREEMPTION_LOCAL_REPLICAS (multi: replicas per worker, default 1); PREEMPTION_CHECK_INTERVAL;
// PREEMPTION_MANAGER_FROM_SCOPE=1 (multi: the CheckpointManager form, with a manager made in the
// strategy's scope without options, which takes chief/non-chief from the strategy; it prints
// "manager is_chief C task_id T").
// Prints "resume at step S" once the handler is ready, "step K" after each step, and
// "final w <hex>..." and "OK" at the end. Exit codes: 0 done, 42 preempted (by the library),
// 5 error.
#define DISTRIBUTE_WITH_CHECKPOINT
#define DISTRIBUTE_WITH_MULTI_WORKER
#include <distribute/distribute.hpp>
#include <distribute/checkpoint/preemption.hpp>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "support/hashed_values.hpp"

namespace ds = distribute;

namespace {

constexpr int kDim = 4;          // weights and a bias: kDim + 1 parameters
constexpr int kPerReplica = 8;   // examples per replica and step
constexpr float kLearningRate = 0.05f;

// A value in [-1, 1) fixed by (step, replica, example, feature): the data order is a function
// of the step number, so a resumed run sees exactly the batches the uninterrupted one did.
float feature(std::int64_t step, int replica, int example, int k) {
  const std::uint64_t key = (static_cast<std::uint64_t>(step) << 24) ^ (static_cast<std::uint64_t>(replica) << 16) ^
                            (static_cast<std::uint64_t>(example) << 4) ^ static_cast<std::uint64_t>(k);
  return static_cast<float>(test_support::splitmix64(key) >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

// Mean-squared-error gradient of one replica's batch (the target is a fixed linear function).
std::vector<float> gradient(const std::vector<float>& w, std::int64_t step, int replica) {
  const float truth[kDim + 1] = {0.5f, -1.25f, 2.0f, 0.75f, -0.3f};
  std::vector<float> g(kDim + 1, 0.0f);
  for (int e = 0; e < kPerReplica; ++e) {
    float x[kDim + 1];
    for (int k = 0; k < kDim; ++k) x[k] = feature(step, replica, e, k);
    x[kDim] = 1.0f;
    float pred = 0, target = 0;
    for (int k = 0; k <= kDim; ++k) pred += w[static_cast<std::size_t>(k)] * x[k], target += truth[k] * x[k];
    for (int k = 0; k <= kDim; ++k) g[static_cast<std::size_t>(k)] += 2.0f * (pred - target) * x[k] / kPerReplica;
  }
  return g;
}

template <class Strategy>
void train_step(Strategy& s, ds::Variable<std::vector<float>>& w, std::int64_t step) {
  s.run([&](ds::ReplicaContext& ctx) {
    auto g = gradient(w.read_value(), step, ctx.replica_id_in_sync_group());
    g = ctx.all_reduce(ds::ReduceOp::Mean, std::move(g));
    for (auto& v : g) v *= kLearningRate;
    w.assign_sub(g);  // aggregation NONE: the local copy, identical everywhere after the all-reduce
  });
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

struct Args {
  std::string mode, dir;
  std::int64_t steps = 0;
  std::optional<std::int64_t> sigterm_at;
  int sigterm_worker = 0;
  int count = 1;
};

template <class Strategy, class Handler>
int train(Strategy& s, ds::Variable<std::vector<float>>& w, Handler& handler, const Args& a) {
  const int worker = s.worker_index();
  auto signal_self = [&] {
    for (int i = 0; i < a.count; ++i) kill(getpid(), SIGTERM);
  };
  fmt::print("resume at step {}\n", handler.total_run_calls());
  std::fflush(stdout);
  if (a.sigterm_at && *a.sigterm_at < 0 && worker == a.sigterm_worker) signal_self();
  const int sleep_ms = env_int("PREEMPTION_STEP_SLEEP_MS", 0);
  const std::int64_t first = handler.total_run_calls();
  const auto start = std::chrono::steady_clock::now();
  for (std::int64_t step = first; step < a.steps; ++step) {
    handler.run([&] {
      train_step(s, w, step);
      if (a.sigterm_at && step == *a.sigterm_at && worker == a.sigterm_worker) signal_self();
    });
    fmt::print("step {}\n", step);
    std::fflush(stdout);
    if (sleep_ms) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
  }
  std::string hex;
  for (float v : w.read_value()) hex += fmt::format(" {:a}", v);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  fmt::print("final w{}\n{} steps in {:.3f} s\nOK\n", hex, a.steps - first, seconds);
  return 0;
}

std::vector<float> initial_weights() { return {0.1f, -0.2f, 0.3f, 0.0f, 0.05f}; }

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    fmt::print("usage: preemption_helper MODE CKPT_DIR STEPS [SIGTERM_AT [SIGTERM_WORKER [COUNT]]]\n");
    return 5;
  }
  Args a;
  a.mode = argv[1];
  a.dir = argv[2];
  a.steps = std::atoll(argv[3]);
  if (argc > 4) a.sigterm_at = std::atoll(argv[4]);
  if (argc > 5) a.sigterm_worker = std::atoi(argv[5]);
  if (argc > 6) a.count = std::atoi(argv[6]);
  try {
    if (a.mode == "multi") {
      ds::CommunicationOptions options;
      options.timeout_seconds = 30;
      ds::MultiWorkerMirroredStrategy<ds::host> s(options, nullptr, env_int("PREEMPTION_LOCAL_REPLICAS", 1));
      auto scope = s.scope();
      ds::Variable<std::vector<float>> w(initial_weights(), {.name = "w"});
      ds::Checkpoint ckpt;
      ckpt.track("w", w);
      const ds::PreemptionOptions preemption{.check_interval = env_int("PREEMPTION_CHECK_INTERVAL", 1)};
      if (env_int("PREEMPTION_MANAGER_FROM_SCOPE", 0)) {
        ds::CheckpointManager manager(ckpt, a.dir, 1);  // no options: from the strategy in scope
        fmt::print("manager is_chief {} task_id {}\n", manager.options().is_chief ? 1 : 0, manager.options().task_id);
        ds::PreemptionCheckpointHandler handler(s, manager, preemption);
        return train(s, w, handler, a);
      }
      ds::PreemptionCheckpointHandler handler(s, ckpt, a.dir, preemption);
      return train(s, w, handler, a);
    }
    if (a.mode == "mirrored") {
      ds::MirroredStrategy<ds::host> s(2);
      auto scope = s.scope();
      ds::Variable<std::vector<float>> w(initial_weights(), {.name = "w"});
      ds::Checkpoint ckpt;
      ckpt.track("w", w);
      ds::CheckpointManager manager(ckpt, a.dir, 2, ds::checkpoint_manager_options(s));
      ds::PreemptionCheckpointHandler handler(s, manager);
      return train(s, w, handler, a);
    }
    fmt::print("unknown mode {}\n", a.mode);
    return 5;
  } catch (const std::exception& e) {
    fmt::print("error: {}\n", e.what());
    return 5;
  }
}

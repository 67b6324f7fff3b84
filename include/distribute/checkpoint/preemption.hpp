// PreemptionCheckpointHandler: save at an agreed step and exit when a worker gets SIGTERM
// (tf.distribute.experimental.PreemptionCheckpointHandler).
//
//   ds::MultiWorkerMirroredStrategy<> strategy;
//   auto scope = strategy.scope();
//   ds::Variable<std::vector<float>> w(...);
//   ds::Checkpoint ckpt;
//   ckpt.track("w", w);
//   ds::PreemptionCheckpointHandler handler(strategy, ckpt, "/shared/ckpts");  // restores, if it can
//   for (std::int64_t step = handler.total_run_calls(); step < num_steps; ++step) {
//     handler.run([&] { train_step(step); });
//   }
//
// A SIGTERM to any worker only sets a flag. Before each step, run() all-reduces that flag (MAX)
// over every worker, so all of them see the same answer at the same step; when someone was
// signalled, every worker saves (the chief the real checkpoint, the others a temporary one that is
// removed, TF's rule), waits for the others to finish saving and exits with kPreemptionExitCode
// (or throws ds::Preempted). The number of completed steps, total_run_calls(), is saved in the
// checkpoint, so the restarted job restores it and continues with the next step.
//
// Cost: one all-reduce of three int64 per step (options.check_interval steps) on a multi-worker
// strategy, nothing on a single-worker one; one extra small all-reduce when saving.
#pragma once

#include <signal.h>

#include <atomic>
#include <cerrno>
#include <concepts>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <distribute/checkpoint/checkpoint.hpp>
#include <distribute/checkpoint/checkpoint_manager.hpp>
#include <distribute/core/context.hpp>
#include <distribute/core/cross_worker.hpp>
#include <distribute/core/error.hpp>
#include <distribute/core/reduce_op.hpp>
#include <distribute/core/variable.hpp>
#include <distribute/version.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

/// The exit code of a process that saved after a preemption signal (TF's default, 42): a job
/// scheduler restarts tasks that exit with it.
inline constexpr int kPreemptionExitCode = 42;

/// Thrown (with PreemptionAction::Throw) once every worker has saved after a preemption signal.
class Preempted : public Error {
 public:
  Preempted(const std::string& message, std::int64_t step, int exit_code, std::filesystem::path checkpoint)
      : Error(message), step_(step), exit_code_(exit_code), checkpoint_(std::move(checkpoint)) {}
  /// total_run_calls() at the save: the restarted job continues with this step.
  std::int64_t step() const noexcept { return step_; }
  /// What the process should exit with (PreemptionOptions::exit_code).
  int exit_code() const noexcept { return exit_code_; }
  /// The checkpoint written (on a non-chief: the temporary file, already removed).
  const std::filesystem::path& checkpoint_path() const noexcept { return checkpoint_; }

 private:
  std::int64_t step_;
  int exit_code_;
  std::filesystem::path checkpoint_;
};

enum class PreemptionAction {
  /// Flush stdio and std::_Exit(exit_code). Destructors and atexit handlers do not run (other
  /// threads, e.g. the communicator's, are still live); the checkpoint is already durable.
  Exit,
  /// Throw ds::Preempted, so that the program unwinds and returns e.exit_code() from main.
  Throw,
};

struct PreemptionOptions {
  PreemptionAction action = PreemptionAction::Exit;
  int exit_code = kPreemptionExitCode;
  /// The signals that mean "about to be preempted".
  std::vector<int> signals{SIGTERM};
  /// Agree (and possibly save) every this many steps: fewer collectives, a longer delay between
  /// the signal and the save.
  std::int64_t check_interval = 1;
  /// Only for the (checkpoint, directory) form, which makes its own CheckpointManager.
  std::optional<std::size_t> max_to_keep = 1;
  std::string checkpoint_name = "ckpt";
};

/// A strategy that knows which worker process this is (every synchronous strategy does).
template <class S>
concept WorkerAwareStrategy = requires(const S& s) {
  { s.worker_index() } -> std::convertible_to<int>;
  { s.num_workers() } -> std::convertible_to<int>;
};

/// CheckpointManagerOptions for this worker of `strategy`: worker 0 is the chief (writes the real
/// checkpoint), every other worker writes `workertemp_<worker_index>/`, which is removed again.
template <WorkerAwareStrategy S>
CheckpointManagerOptions checkpoint_manager_options(const S& strategy, std::string checkpoint_name = "ckpt") {
  CheckpointManagerOptions options;
  options.checkpoint_name = std::move(checkpoint_name);
  options.is_chief = strategy.worker_index() == 0;
  options.task_id = strategy.worker_index();
  return options;
}

namespace checkpoint::detail {

// Written by the signal handler, read by the training thread. A lock-free atomic is
// async-signal-safe; nothing else is done in the handler.
static_assert(std::atomic<int>::is_always_lock_free);
inline std::atomic<int> preemption_signals_received{0};
inline std::atomic<bool> preemption_handler_installed{false};

inline void on_preemption_signal(int) noexcept { preemption_signals_received.fetch_add(1, std::memory_order_relaxed); }

/// Installs on_preemption_signal for `signals` (one installation per process at a time); the
/// destructor puts the previous dispositions back.
class PreemptionSignals {
 public:
  explicit PreemptionSignals(const std::vector<int>& signals) {
    if (signals.empty()) throw InvalidArgument("PreemptionCheckpointHandler: options.signals is empty");
    for (int sig : signals) {
      if (sig <= 0 || sig == SIGKILL || sig == SIGSTOP || sig >= NSIG) {
        throw InvalidArgument(fmt::format("PreemptionCheckpointHandler: signal {} cannot be caught", sig));
      }
    }
    if (preemption_handler_installed.exchange(true)) {
      throw InvalidArgument(
          "PreemptionCheckpointHandler: another handler is alive in this process; one at a time (destroy the "
          "first)");
    }
    preemption_signals_received.store(0);
    for (int sig : signals) {
      struct sigaction action {};
      action.sa_handler = &on_preemption_signal;
      sigemptyset(&action.sa_mask);
      action.sa_flags = SA_RESTART;  // blocking calls carry on; we look at the flag between steps
      struct sigaction previous {};
      if (sigaction(sig, &action, &previous) != 0) {
        const int err = errno;
        restore();
        throw InvalidArgument(fmt::format("PreemptionCheckpointHandler: cannot handle signal {}: {}", sig,
                                          std::strerror(err)));
      }
      installed_.push_back({sig, previous});
    }
  }
  ~PreemptionSignals() { restore(); }
  PreemptionSignals(const PreemptionSignals&) = delete;
  PreemptionSignals& operator=(const PreemptionSignals&) = delete;

  /// True once a preemption signal arrived since installation.
  static bool received() noexcept { return preemption_signals_received.load(std::memory_order_relaxed) > 0; }

 private:
  void restore() noexcept {
    for (auto it = installed_.rbegin(); it != installed_.rend(); ++it) sigaction(it->first, &it->second, nullptr);
    installed_.clear();
    preemption_handler_installed.store(false);
  }

  std::vector<std::pair<int, struct sigaction>> installed_;
};

/// Creates a plain (unplaced) variable even inside a strategy's scope: the step counter is
/// host bookkeeping, not a model variable, and must not take a collective to create.
template <class T>
Variable<T> make_plain_variable(T value, std::string name) {
  auto& scopes = core::thread_context().scopes;
  std::vector<AnyStrategy*> saved;
  saved.swap(scopes);
  try {
    Variable<T> v(std::move(value), {.name = std::move(name), .trainable = false});
    saved.swap(scopes);
    return v;
  } catch (...) {
    saved.swap(scopes);
    throw;
  }
}

}  // namespace checkpoint::detail

template <WorkerAwareStrategy Strategy>
class PreemptionCheckpointHandler {
 public:
  /// The tensor under which total_run_calls() is saved in the checkpoint.
  static constexpr const char* kTotalRunCallsName = "distribute.total_run_calls";

  /// Uses `manager` (whose options must say is_chief / task_id for this worker: build them with
  /// ds::checkpoint_manager_options(strategy)). Tracks the step counter in its checkpoint and
  /// restores the latest checkpoint if there is one. Create the model's variables and track them
  /// first. The strategy and manager must outlive the handler.
  PreemptionCheckpointHandler(Strategy& strategy, CheckpointManager& manager, PreemptionOptions options = {})
      : options_(check(std::move(options))), signals_(options_.signals), strategy_(&strategy), manager_(&manager) {
    const CheckpointManagerOptions& mo = manager.options();
    const int worker = strategy.worker_index();
    if (mo.is_chief != (worker == 0) || (!mo.is_chief && mo.task_id != worker)) {
      throw InvalidArgument(fmt::format(
          "PreemptionCheckpointHandler: the CheckpointManager says is_chief={}, task_id={} but this is worker {} of "
          "{}; build its options with ds::checkpoint_manager_options(strategy)",
          mo.is_chief, mo.task_id, worker, strategy.num_workers()));
    }
    start();
  }

  /// Makes its own CheckpointManager over `directory` (options.max_to_keep, options.checkpoint_name,
  /// chief/non-chief from the strategy). `checkpoint` must outlive the handler.
  PreemptionCheckpointHandler(Strategy& strategy, Checkpoint& checkpoint, std::filesystem::path directory,
                              PreemptionOptions options = {})
      : options_(check(std::move(options))),
        signals_(options_.signals),
        strategy_(&strategy),
        owned_manager_(std::make_unique<CheckpointManager>(
            checkpoint, std::move(directory), options_.max_to_keep,
            checkpoint_manager_options(strategy, options_.checkpoint_name))),
        manager_(owned_manager_.get()) {
    start();
  }

  PreemptionCheckpointHandler(const PreemptionCheckpointHandler&) = delete;
  PreemptionCheckpointHandler& operator=(const PreemptionCheckpointHandler&) = delete;

  /// One training step: first, on every worker together, saves and exits if any worker was
  /// signalled; then calls fn(args...) and counts it. Call it in cross-replica context (fn usually
  /// calls strategy.run), the same number of times on every worker.
  template <class F, class... A>
  std::invoke_result_t<F, A...> run(F&& fn, A&&... args) {
    checkpoint::detail::check_cross_replica("PreemptionCheckpointHandler::run");
    if (total_run_calls_ % options_.check_interval == 0) save_and_exit_if_preempted();
    if constexpr (std::is_void_v<std::invoke_result_t<F, A...>>) {
      std::invoke(std::forward<F>(fn), std::forward<A>(args)...);
      count_step();
    } else {
      auto&& result = std::invoke(std::forward<F>(fn), std::forward<A>(args)...);
      count_step();
      return std::forward<decltype(result)>(result);
    }
  }

  /// For loops that do not wrap their step in run(): call it once after each step. Counts the
  /// step, then saves and exits like run() if any worker was signalled.
  void save_checkpoint_if_preempted() {
    checkpoint::detail::check_cross_replica("PreemptionCheckpointHandler::save_checkpoint_if_preempted");
    count_step();
    if (total_run_calls_ % options_.check_interval == 0) save_and_exit_if_preempted();
  }

  /// Steps completed, including those before a restart (restored from the checkpoint).
  std::int64_t total_run_calls() const noexcept { return total_run_calls_; }
  /// True once this process got a preemption signal (the others may not know yet).
  bool preemption_received() const noexcept { return checkpoint::detail::PreemptionSignals::received(); }
  /// The checkpoint restored at construction, if any.
  const std::optional<std::filesystem::path>& restored_from() const noexcept { return restored_from_; }
  CheckpointManager& checkpoint_manager() const noexcept { return *manager_; }
  const PreemptionOptions& options() const noexcept { return options_; }

 private:
  static PreemptionOptions check(PreemptionOptions options) {
    if (options.check_interval < 1) {
      throw InvalidArgument(fmt::format("PreemptionCheckpointHandler: check_interval must be at least 1, got {}",
                                        options.check_interval));
    }
    if (options.exit_code < 0 || options.exit_code > 255) {
      throw InvalidArgument(fmt::format("PreemptionCheckpointHandler: exit_code {} is not in [0, 255]", options.exit_code));
    }
    return options;
  }

  void start() {
    checkpoint::detail::check_cross_replica("PreemptionCheckpointHandler");
    Checkpoint& ckpt = manager_->checkpoint();
    if (ckpt.is_tracking(kTotalRunCallsName)) {
      throw InvalidArgument(fmt::format("PreemptionCheckpointHandler: the checkpoint already tracks '{}' (from "
                                        "another handler?); give each handler a Checkpoint of its own",
                                        kTotalRunCallsName));
    }
    ckpt.track(kTotalRunCallsName, counter_);
    restored_from_ = manager_->restore_or_initialize();
    total_run_calls_ = counter_.read_value();
  }

  void count_step() {
    ++total_run_calls_;
    counter_.assign(total_run_calls_);  // current for the user's own saves too
  }

  // One MAX all-reduce of {signalled, step, -step} over every replica: all workers get the same
  // answer, and a worker at another step (restored from another checkpoint) is caught.
  std::vector<std::int64_t> all_reduce_max(std::int64_t flag) {
    const std::vector<std::int64_t> mine{flag, total_run_calls_, -total_run_calls_};
    if (strategy_->num_workers() <= 1) return mine;
    auto values = strategy_->distribute_values_from_function([&](const auto&) { return mine; });
    std::vector<std::int64_t> all = strategy_->reduce(ReduceOp::Max, values);
    if (all[1] != -all[2]) {
      throw InvalidArgument(fmt::format(
          "PreemptionCheckpointHandler: the workers are at different steps (total_run_calls from {} to {}); every "
          "worker must restore the same checkpoint and call run() once per step",
          -all[2], all[1]));
    }
    return all;
  }

  void save_and_exit_if_preempted() {
    if (all_reduce_max(checkpoint::detail::PreemptionSignals::received() ? 1 : 0)[0] == 0) return;
    // Everyone is here, at the same step. Save together (saving may take collectives), then wait
    // until every worker has saved, so that nobody leaves while another still writes.
    const std::filesystem::path path = manager_->save();
    all_reduce_max(0);
    const std::string message = fmt::format(
        "distribute: preemption: worker {} of {} saved '{}' at step {} (total_run_calls); {} with code {}",
        strategy_->worker_index(), strategy_->num_workers(), path.string(), total_run_calls_,
        options_.action == PreemptionAction::Exit ? "exiting" : "stopping", options_.exit_code);
    if (options_.action == PreemptionAction::Throw) throw Preempted(message, total_run_calls_, options_.exit_code, path);
    // Leave the cluster with a goodbye: a worker that just vanished would make a peer still
    // finishing the last all-reduce fail it ("lost task"), since nothing here unwinds to the
    // strategy's destructor.
    if constexpr (requires { strategy_->variable_placement().link; }) {
      if (core::CrossWorkerLink* link = strategy_->variable_placement().link) link->close();
    }
    std::fprintf(stderr, "%s\n", message.c_str());
    std::fflush(nullptr);
    std::_Exit(options_.exit_code);
  }

  PreemptionOptions options_;
  checkpoint::detail::PreemptionSignals signals_;  // installed first, removed last
  Strategy* strategy_;
  std::unique_ptr<CheckpointManager> owned_manager_;
  CheckpointManager* manager_;
  Variable<std::int64_t> counter_ = checkpoint::detail::make_plain_variable<std::int64_t>(0, kTotalRunCallsName);
  std::int64_t total_run_calls_ = 0;
  std::optional<std::filesystem::path> restored_from_;
};

DISTRIBUTE_END_NAMESPACE

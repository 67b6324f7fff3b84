// Asynchronous parameter-server training of the digits MLP (the model of examples/digits.cpp),
// with a worker that dies in the middle of a step and comes back.
//
//   distribute-launch --ps 2 --workers 3 --restart-workers 1 --
//       parameter_server [--epochs E] [--batch B] [--hidden H] [--learning-rate LR] [--seed S]
//                        [--data PATH] [--out DIR] [--checkpoint-dir DIR]
//                        [--kill-worker I --kill-at-step K]
//
// The same program runs in every task and TF_CONFIG (set by the launcher) says which part it plays:
//   ps       a ds::Server holding the model's variables (round-robin over the ps tasks);
//   worker   a ds::Server running the training steps the coordinator schedules, each on a batch
//            of its own per-worker dataset (a seeded shuffle of the training set, repeated);
//   chief    the coordinator: ParameterServerStrategy + ClusterCoordinator. Per epoch it schedules
//            one step per global batch, joins, reads the variables back from the ps tasks to
//            measure test accuracy, prints a progress line, and (with --checkpoint-dir) saves a
//            checkpoint read from the ps tasks. At the end it writes metrics-parameter_server.csv
//            and loss-parameter_server.svg to --out and stops the cluster.
//
// Steps are asynchronous (TF's parameter-server training): a worker reads the current weights,
// computes its batch's gradient and subtracts learning_rate x gradient on the ps tasks, while the
// other workers do the same. A step's updates are committed once, when it finishes: a step lost
// with its worker is run again elsewhere and counted once.
//
// --kill-worker I --kill-at-step K: worker I SIGKILLs itself in its K-th step, after computing
// its updates and before they are committed (only on its first start: DISTRIBUTE_LAUNCH_RESTART
// is 0). With --restart-workers the launcher starts it again; the coordinator reschedules the lost
// step, takes the worker back and rebuilds its dataset.
//
// Exit status (chief): 0 when the final test accuracy reaches 0.95, 1 when it does not, 2 for a
// usage error, 3 for any other error. ps and worker tasks exit 0 when the coordinator stops them.
#define DISTRIBUTE_WITH_PS
#define DISTRIBUTE_WITH_CHECKPOINT
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/cli.hpp"
#include "common/digits_mlp.hpp"
#include "common/ps_tasks.hpp"
#include "common/training_report.hpp"

#ifndef DISTRIBUTE_EXAMPLES_DATA_DIR
#define DISTRIBUTE_EXAMPLES_DATA_DIR "examples/data"
#endif

namespace ds = distribute;

namespace {

using cli::kExitBelowTarget;
using cli::kTargetAccuracy;
using cli::parse_number;
using cli::UsageError;


constexpr const char* kUsage =
    "usage: distribute-launch --ps 2 --workers 3 --restart-workers 1 -- parameter_server [options]\n"
    "  --epochs E          passes over the training set (default 15)\n"
    "  --batch B           examples per step (default 32)\n"
    "  --hidden H          hidden units (default 64)\n"
    "  --learning-rate LR  SGD step size (default 0.2)\n"
    "  --seed S            weight initialisation and the workers' shuffles (default 1)\n"
    "  --data PATH         the digits CSV (default: " DISTRIBUTE_EXAMPLES_DATA_DIR "/digits.csv)\n"
    "  --out DIR           where metrics-parameter_server.csv and loss-parameter_server.svg go (default: digits-out)\n"
    "  --checkpoint-dir D  save a checkpoint after every epoch (read from the ps tasks) and resume from the\n"
    "                      latest one at start\n"
    "  --kill-worker I     worker I SIGKILLs itself in its K-th step (--kill-at-step K), on its first start only\n"
    "  --wait-for-workers S  before each epoch, wait up to S seconds for lost workers to come back (default 0:\n"
    "                      go on with the workers that are up; the whole run can be shorter than a restart)\n";

struct Options {
  int epochs = 15;
  std::int64_t batch = 32;
  int hidden = 64;
  float learning_rate = 0.2f;
  std::uint64_t seed = 1;
  std::string data = DISTRIBUTE_EXAMPLES_DATA_DIR "/digits.csv";
  std::string out = "digits-out";
  std::string checkpoint_dir;
  int kill_worker = -1;
  std::int64_t kill_at_step = 0;
  double wait_for_workers = 0;  // seconds
};

Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw UsageError(fmt::format("{} needs a value", flag));
      return argv[++i];
    };
    if (flag == "--epochs") o.epochs = parse_number<int>(flag, value());
    else if (flag == "--batch") o.batch = parse_number<std::int64_t>(flag, value());
    else if (flag == "--hidden") o.hidden = parse_number<int>(flag, value());
    else if (flag == "--learning-rate") o.learning_rate = parse_number<float>(flag, value());
    else if (flag == "--seed") o.seed = parse_number<std::uint64_t>(flag, value());
    else if (flag == "--data") o.data = value();
    else if (flag == "--out") o.out = value();
    else if (flag == "--checkpoint-dir") o.checkpoint_dir = value();
    else if (flag == "--kill-worker") o.kill_worker = parse_number<int>(flag, value());
    else if (flag == "--kill-at-step") o.kill_at_step = parse_number<std::int64_t>(flag, value());
    else if (flag == "--wait-for-workers") o.wait_for_workers = parse_number<double>(flag, value());
    else if (flag == "--help" || flag == "-h") throw UsageError("");
    else throw UsageError(fmt::format("unknown argument '{}'", flag));
  }
  if (o.epochs <= 0) throw UsageError(fmt::format("--epochs: {} must be positive", o.epochs));
  if (o.batch <= 0) throw UsageError(fmt::format("--batch: {} must be positive", o.batch));
  if (o.hidden <= 0) throw UsageError(fmt::format("--hidden: {} must be positive", o.hidden));
  if (!(o.learning_rate > 0)) throw UsageError(fmt::format("--learning-rate: {} must be positive", o.learning_rate));
  if (!(o.wait_for_workers >= 0)) throw UsageError(fmt::format("--wait-for-workers: {} is negative", o.wait_for_workers));
  if ((o.kill_worker >= 0) != (o.kill_at_step > 0)) {
    throw UsageError("--kill-worker and --kill-at-step go together (a worker index and a step count >= 1)");
  }
  return o;
}

// ---------------------------------------------------------------------------------------------
// What runs on the workers. Every task parses the same command line (the launcher passes it to
// all), so a worker knows the data file, the batch size and the seed without being sent them.

Options g_options;  // set in main() before any Server starts

/// This worker's copy of the training set, loaded on first use.
const digits::Examples& training_set() {
  static std::once_flag once;
  static digits::Examples train;
  std::call_once(once, [] { train = digits::split_train_test(digits::load_csv(g_options.data), 0.2, digits::kSplitSeed).train; });
  return train;
}

/// Each worker's input pipeline (TF: dataset_fn for create_per_worker_dataset): the training
/// example ids, shuffled with a seed of its own, repeated, in batches.
ds::data::Dataset<ds::Tensor<std::int64_t>> training_batches(const ds::InputContext& ctx) {
  const std::int64_t n = training_set().size();
  return ds::data::range(0, n)
      .shuffle(n, g_options.seed * 7919u + static_cast<std::uint64_t>(ctx.input_pipeline_id))
      .repeat()
      .batch(g_options.batch);
}
DISTRIBUTE_REMOTE_FUNCTION(training_batches);

using TensorVariable = ds::Variable<ds::Tensor<float>>;

/// One asynchronous SGD step on the next batch of this worker's dataset. Returns the batch's
/// loss sum, correct predictions and size, for the coordinator's epoch metrics.
std::vector<double> train_step(ds::PerWorkerIterator<ds::Tensor<std::int64_t>> batches, TensorVariable w1,
                               TensorVariable b1, TensorVariable w2, TensorVariable b2, float learning_rate) {
  const digits::Examples& train = training_set();
  const ds::Tensor<std::int64_t> ids = batches.get_next();
  const digits::Parameters p{w1.read_value(), b1.read_value(), w2.read_value(), b2.read_value()};
  digits::Gradients g(p.hidden());
  digits::BatchStats stats;
  digits::Activations a;
  for (const std::int64_t i : ids.values()) {
    digits::accumulate_example(p, train.image(i), train.labels[static_cast<std::size_t>(i)], a, g, stats);
  }
  const double scale = learning_rate / stats.count;
  auto step = [&](const std::vector<double>& gradient, const ds::Tensor<float>& like) {
    ds::Tensor<float> delta = ds::Tensor<float>::zeros(like.shape());
    for (std::size_t k = 0; k < gradient.size(); ++k) delta[k] = static_cast<float>(scale * gradient[k]);
    return delta;
  };
  // Buffered by the worker and committed to the ps tasks when the step returns.
  w1.assign_sub(step(g.w1, p.w1));
  b1.assign_sub(step(g.b1, p.b1));
  w2.assign_sub(step(g.w2, p.w2));
  b2.assign_sub(step(g.b2, p.b2));
  ps_tasks::maybe_die_in_step(g_options.kill_worker, g_options.kill_at_step);
  return {stats.loss_sum, stats.correct, stats.count};
}
DISTRIBUTE_REMOTE_FUNCTION(train_step);

// ---------------------------------------------------------------------------------------------
// The coordinator

int coordinate(const Options& options, ds::ParameterServerStrategy& strategy) {
  const auto data = digits::split_train_test(digits::load_csv(options.data), 0.2, digits::kSplitSeed);
  ds::CoordinatorOptions coordinator_options;
  coordinator_options.log = [](std::string_view line) { fmt::print("coordinator: {}\n", line); };
  ds::ClusterCoordinator coordinator(strategy, coordinator_options);

  // The variables live on the ps tasks, round-robin over them (with 2 ps: w1, w2 and the epoch
  // counter on ps 0, b1 and b2 on ps 1).
  const digits::Parameters init = digits::initial_parameters(options.hidden, options.seed);
  struct Model {
    TensorVariable w1, b1, w2, b2;
    ds::Variable<std::int64_t> epochs_done;
  };
  Model model = [&] {
    auto scope = strategy.scope();
    return Model{TensorVariable(init.w1, {.name = "dense_1/kernel"}), TensorVariable(init.b1, {.name = "dense_1/bias"}),
                 TensorVariable(init.w2, {.name = "dense_2/kernel"}), TensorVariable(init.b2, {.name = "dense_2/bias"}),
                 ds::Variable<std::int64_t>(0, {.name = "epochs_done", .trainable = false})};
  }();
  ds::Variable<std::int64_t>& epochs_done = model.epochs_done;

  // Checkpoints are written here, from values read from the ps tasks; restoring assigns them there.
  std::optional<ds::Checkpoint> checkpoint;
  std::optional<ds::CheckpointManager> manager;
  int first_epoch = 1;
  if (!options.checkpoint_dir.empty()) {
    checkpoint.emplace();
    checkpoint->track("dense_1/kernel", model.w1).track("dense_1/bias", model.b1);
    checkpoint->track("dense_2/kernel", model.w2).track("dense_2/bias", model.b2);
    checkpoint->track("epochs_done", epochs_done);
    manager.emplace(*checkpoint, options.checkpoint_dir, 3);
    if (const auto restored = manager->restore_or_initialize()) {
      first_epoch = static_cast<int>(epochs_done.read_value()) + 1;
      fmt::print("resumed from {} after epoch {}\n", restored->string(), first_epoch - 1);
    }
  }

  const std::int64_t steps_per_epoch = (data.train.size() + options.batch - 1) / options.batch;
  fmt::print("parameter_server: {} ps, {} workers; {} training / {} test examples, batch {}, {} steps per epoch, "
             "MLP 64-{}-10, asynchronous SGD lr {}\n",
             strategy.num_ps(), strategy.num_workers(), data.train.size(), data.test.size(), options.batch,
             steps_per_epoch, options.hidden, options.learning_rate);
  fmt::print("variables: {} on {}, {} on {}, {} on {}, {} on {}\n", model.w1.name(), model.w1.device(), model.b1.name(),
             model.b1.device(), model.w2.name(), model.w2.device(), model.b2.name(), model.b2.device());

  const auto per_worker_batches = coordinator.create_per_worker_dataset(&training_batches);
  const auto batches = ds::iter(per_worker_batches);
  std::vector<digits::EpochMetrics> history;
  std::vector<std::uint64_t> completed_before = coordinator.closures_completed_per_worker();
  const auto start = std::chrono::steady_clock::now();
  for (int epoch = first_epoch; epoch <= options.epochs; ++epoch) {
    if (options.wait_for_workers > 0 && coordinator.num_workers_up() < coordinator.num_workers()) {
      ps_tasks::wait_for_workers(coordinator, options.wait_for_workers);
    }
    const auto epoch_start = std::chrono::steady_clock::now();
    std::vector<ds::RemoteValue<std::vector<double>>> steps;
    steps.reserve(static_cast<std::size_t>(steps_per_epoch));
    for (std::int64_t s = 0; s < steps_per_epoch; ++s) {
      steps.push_back(coordinator.schedule(&train_step, batches, model.w1, model.b1, model.w2, model.b2,
                                           options.learning_rate));
    }
    coordinator.join();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_start).count();
    double loss_sum = 0, correct = 0, count = 0;
    for (const auto& s : steps) {
      const std::vector<double> r = s.get();
      loss_sum += r[0];
      correct += r[1];
      count += r[2];
    }
    // The model as the ps tasks hold it now.
    const digits::Parameters p{model.w1.read_value(), model.b1.read_value(), model.w2.read_value(),
                               model.b2.read_value()};
    digits::EpochMetrics m;
    m.epoch = epoch;
    m.loss = loss_sum / count;
    m.train_accuracy = correct / count;
    m.test_accuracy = static_cast<double>(digits::count_correct(p, data.test, 0, data.test.size())) /
                      static_cast<double>(data.test.size());
    m.examples_per_second = count / seconds;
    history.push_back(m);
    fmt::print("{}\n", report::epoch_line(m, options.epochs));
    const std::vector<std::uint64_t> completed = coordinator.closures_completed_per_worker();
    std::vector<std::uint64_t> this_epoch;
    for (std::size_t w = 0; w < completed.size(); ++w) this_epoch.push_back(completed[w] - completed_before[w]);
    completed_before = completed;
    fmt::print("          steps per worker {}  workers up {}/{}  steps retried so far {}\n", fmt::join(this_epoch, " "),
               coordinator.num_workers_up(), coordinator.num_workers(), coordinator.closures_retried());
    if (manager) {
      epochs_done.assign(epoch);
      fmt::print("saved {}\n", manager->save().string());
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  coordinator.shutdown_cluster();  // the ps and worker tasks' Server::join() return

  if (history.empty()) {
    fmt::print("nothing to train: the checkpoint in {} is already at epoch {}\n", options.checkpoint_dir,
               first_epoch - 1);
    return 0;
  }
  report::write_metrics_and_plot(options.out, "parameter_server", history,
                                 fmt::format("digits MLP, ParameterServerStrategy ({} ps, {} workers, asynchronous): "
                                             "training loss",
                                             strategy.num_ps(), strategy.num_workers()));
  const digits::EpochMetrics& last = history.back();
  fmt::print("{}\n", report::final_line(last, "parameter_server", options.epochs, seconds));
  if (last.test_accuracy < kTargetAccuracy) {
    fmt::print(stderr, "parameter_server: final test accuracy {:.4f} is below the target {}\n", last.test_accuracy,
               kTargetAccuracy);
    return kExitBelowTarget;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return cli::run_main("parameter_server", kUsage, [&] {
    g_options = parse_args(argc, argv);
    return ps_tasks::run_task([](std::shared_ptr<ds::TFConfigClusterResolver> resolver) {
      ds::ParameterServerStrategy strategy(std::move(resolver));
      return coordinate(g_options, strategy);
    });
  });
}

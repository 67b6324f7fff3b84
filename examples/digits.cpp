// Demo: an MLP classifier on the UCI optical handwritten digits (8x8 images), trained data-parallel.
//
//   digits [--strategy one_device|mirrored|multi_worker] [--replicas N] [--epochs E] [--batch B]
//          [--hidden H] [--learning-rate LR] [--seed S] [--data PATH] [--out DIR] [--logdir DIR]
//          [--progress auto|bar|lines|off] [--progress-interval S]
//   distribute-launch -n 3 -- digits --strategy multi_worker
//
// Prints one line per epoch and a final line, writes DIR/metrics-<strategy>.csv and
// DIR/loss-<strategy>.svg (in multi_worker mode only the chief writes them); with --logdir, the
// loss, accuracy and examples/s per step and per epoch as TensorBoard scalars (chief only). Shows
// the progress inside an epoch on stderr: a bar on a terminal, plain lines otherwise. Exit status: 0 when the
// final test accuracy reaches 0.95, 1 when it does not, 2 for a usage error, 3 for any other error
// (a missing or malformed data file, a cluster error).

// MultiWorkerMirroredStrategy needs Boost.Asio, Boost.JSON and OpenSSL. meson says whether they were
// found; without meson, whether their headers are there. With them, the program asks the umbrella
// header for the multi-worker part.
#ifndef DIGITS_WITH_MULTI_WORKER
#if __has_include(<boost/asio.hpp>) && __has_include(<openssl/hmac.h>) && __has_include(<boost/json.hpp>)
#define DIGITS_WITH_MULTI_WORKER 1
#else
#define DIGITS_WITH_MULTI_WORKER 0
#endif
#endif
#if DIGITS_WITH_MULTI_WORKER
#define DISTRIBUTE_WITH_MULTI_WORKER
#endif

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "common/cli.hpp"
#include "common/digits_mlp.hpp"
#include "common/training_monitor.hpp"
#include "common/training_report.hpp"

// meson passes the source tree's examples/data; a plain compiler build run from the repository
// root finds it relative to the working directory.
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
    "usage: digits [--strategy one_device|mirrored|multi_worker] [--replicas N] [--epochs E] [--batch B]\n"
    "              [--hidden H] [--learning-rate LR] [--seed S] [--data PATH] [--out DIR]\n"
    "              [--logdir DIR] [--progress auto|bar|lines|off] [--progress-interval S]\n"
    "       digits --strategies   (lists the strategies this build has)\n"
    "  --strategy    mirrored (default; --replicas host replicas, default 4), one_device, or multi_worker\n"
    "                (one process of a cluster, e.g. under `distribute-launch -n 3 --`; --replicas per worker,\n"
    "                default 1)\n"
    "  --data        the digits CSV (default: " DISTRIBUTE_EXAMPLES_DATA_DIR "/digits.csv)\n"
    "  --out         where metrics-<strategy>.csv and loss-<strategy>.svg go (default: digits-out)\n"
    REPORT_MONITOR_USAGE;

struct Options {
  std::string strategy = "mirrored";
  int replicas = 0;  // 0: the strategy's default
  digits::TrainConfig config;
  std::string data = DISTRIBUTE_EXAMPLES_DATA_DIR "/digits.csv";
  std::string out = "digits-out";
  bool list_strategies = false;
  report::MonitorOptions monitor;
};

Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw UsageError(fmt::format("{} needs a value", flag));
      return argv[++i];
    };
    if (flag == "--strategy") o.strategy = value();
    else if (flag == "--replicas") o.replicas = parse_number<int>(flag, value());
    else if (flag == "--epochs") o.config.epochs = parse_number<int>(flag, value());
    else if (flag == "--batch") o.config.global_batch = parse_number<std::int64_t>(flag, value());
    else if (flag == "--hidden") o.config.hidden = parse_number<int>(flag, value());
    else if (flag == "--learning-rate") o.config.learning_rate = parse_number<float>(flag, value());
    else if (flag == "--seed") o.config.seed = parse_number<std::uint64_t>(flag, value());
    else if (flag == "--data") o.data = value();
    else if (flag == "--out") o.out = value();
    else if (flag == "--strategies") o.list_strategies = true;
    else if (o.monitor.parse(flag, value)) continue;
    else if (flag == "--help" || flag == "-h") throw UsageError("");
    else throw UsageError(fmt::format("unknown argument '{}'", flag));
  }
  if (o.strategy != "one_device" && o.strategy != "mirrored" && o.strategy != "multi_worker") {
    throw UsageError(fmt::format("--strategy: '{}' is not one_device, mirrored or multi_worker", o.strategy));
  }
  if (o.strategy == "one_device" && o.replicas > 1) throw UsageError("--replicas: one_device has one replica");
  if (o.replicas < 0) throw UsageError(fmt::format("--replicas: {} is negative", o.replicas));
  return o;
}

/// Trains with `strategy`, prints progress (on the chief), writes the files (on the chief) and
/// returns the exit status. `description` names the strategy and its replicas for the header line.
template <class Strategy>
int train_and_report(Strategy& strategy, const Options& options, const digits::TrainTestSplit& data, bool is_chief,
                     const std::string& description, std::shared_ptr<const ds::ClusterResolver> resolver = nullptr) {
  const auto& config = options.config;
  if (is_chief) {
    fmt::print("digits: {}; {} training / {} test examples, global batch {}, MLP 64-{}-10, lr {}, momentum {}\n",
               description, data.train.size(), data.test.size(), config.global_batch, config.hidden,
               config.learning_rate, config.momentum);
  }
  report::TrainingMonitor monitor(options.monitor, is_chief, std::move(resolver));
  const auto start = std::chrono::steady_clock::now();
  const auto result = digits::train(
      strategy, data, config,
      [&](const digits::EpochMetrics& m) {
        monitor.epoch(m);
        if (is_chief) fmt::print("{}\n", report::epoch_line(m, config.epochs));
      },
      [&](const digits::StepMetrics& s) { monitor.step(s); },
      [&](int epoch, std::int64_t steps) { monitor.begin_epoch(epoch, config.epochs, steps); });
  monitor.close();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const digits::EpochMetrics& last = result.history.back();

  if (is_chief) {
    report::write_metrics_and_plot(options.out, options.strategy, result.history,
                                   fmt::format("digits MLP, {}: training loss", description));
  }
  // Every worker prints the final line (they hold identical models); tools and tests parse it.
  fmt::print("{}\n", report::final_line(last, options.strategy, config.epochs, seconds));
  if (last.test_accuracy < kTargetAccuracy) {
    fmt::print(stderr, "digits: final test accuracy {:.4f} is below the target {}\n", last.test_accuracy,
               kTargetAccuracy);
    return kExitBelowTarget;
  }
  return 0;
}

int run(const Options& options) {
  const auto data = digits::split_train_test(digits::load_csv(options.data), 0.2, digits::kSplitSeed);
  if (options.strategy == "one_device") {
    ds::OneDeviceStrategy<ds::host> strategy("/cpu:0");
    return train_and_report(strategy, options, data, true, "OneDeviceStrategy<host> on /cpu:0");
  }
  if (options.strategy == "mirrored") {
    const int replicas = options.replicas ? options.replicas : 4;
    ds::MirroredStrategy<ds::host> strategy(replicas);
    return train_and_report(strategy, options, data, true,
                            fmt::format("MirroredStrategy<host> with {} replicas", strategy.num_replicas_in_sync()));
  }
#if DIGITS_WITH_MULTI_WORKER
  // The cluster comes from TF_CONFIG (distribute-launch sets it); without it, a one-worker cluster.
  ds::CommunicationOptions communication;
  communication.timeout_seconds = 120;  // a lost peer ends the run with an error instead of a hang
  ds::MultiWorkerMirroredStrategy<ds::host> strategy(communication, nullptr, options.replicas ? options.replicas : 1);
  const std::string description =
      fmt::format("MultiWorkerMirroredStrategy<host>, {} workers x {} = {} replicas in sync", strategy.num_workers(),
                  strategy.num_replicas_in_sync() / strategy.num_workers(), strategy.num_replicas_in_sync());
  // The writer asks the strategy's own resolver who the chief is (a pointer that does not own it).
  return train_and_report(strategy, options, data, strategy.is_chief(), description,
                          std::shared_ptr<const ds::ClusterResolver>(std::shared_ptr<const void>(), strategy.cluster_resolver()));
#else
  throw UsageError("--strategy multi_worker: this build has no MultiWorkerMirroredStrategy (it needs Boost.Asio, "
                   "Boost.JSON and OpenSSL)");
#endif
}

}  // namespace

int main(int argc, char** argv) {
  return cli::run_main("digits", kUsage, [&] {
    const Options options = parse_args(argc, argv);
    if (options.list_strategies) {
      fmt::print("one_device\nmirrored\n{}", DIGITS_WITH_MULTI_WORKER ? "multi_worker\n" : "");
      return 0;
    }
    return run(options);
  });
}

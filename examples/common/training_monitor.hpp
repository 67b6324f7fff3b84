// What the digits examples show and record while they train, beside the per-epoch lines and the
// CSV/SVG: the progress inside each epoch (progress.hpp, on the chief) and, with --logdir, the
// loss, accuracy and examples/s as TensorBoard scalars (ds::SummaryWriter, which writes on the
// chief only):
//   batch_loss, batch_accuracy, batch_examples_per_second   every step, at the global step
//   epoch_loss, epoch_accuracy, epoch_test_accuracy,        every epoch, at the epoch number
//   epoch_examples_per_second
// (Keras' TensorBoard callback's names), so `tensorboard --logdir DIR` plots them.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include <distribute/summary/summary_writer.hpp>

#include "cli.hpp"
#include "digits_mlp.hpp"
#include "progress.hpp"

namespace report {

namespace ds = distribute;

/// The command-line options of the monitor: --logdir, --progress, --progress-interval.
struct MonitorOptions {
  std::string logdir;  // empty: no TensorBoard scalars
  progress::Mode progress = progress::Mode::Auto;
  double progress_interval = 10.0;

  /// Takes `flag` (and its value from `value()`) when it is one of ours.
  template <class Value>
  bool parse(std::string_view flag, Value&& value) {
    if (flag == "--logdir") {
      logdir = value();
    } else if (flag == "--progress") {
      const std::string mode = value();
      if (!progress::parse_mode(mode, progress)) {
        throw cli::UsageError(fmt::format("--progress: '{}' is not auto, bar, lines or off", mode));
      }
    } else if (flag == "--progress-interval") {
      progress_interval = cli::parse_number<double>(flag, value());
      if (!(progress_interval >= 0)) {
        throw cli::UsageError(fmt::format("--progress-interval: {} is negative", progress_interval));
      }
    } else {
      return false;
    }
    return true;
  }

};

// The options' lines of an example's usage text (a macro: the usage texts are string literals).
#define REPORT_MONITOR_USAGE                                                                                     \
  "  --logdir      write loss, accuracy and examples/s there for TensorBoard (tensorboard --logdir DIR)\n"    \
  "  --progress    progress inside an epoch, on stderr: auto (default: a bar on a terminal, plain lines\n"     \
  "                otherwise), bar, lines or off\n"                                                            \
  "  --progress-interval  seconds between plain progress lines (default 10; 0: after every step)\n"

class TrainingMonitor {
 public:
  /// `is_chief`: whether this task shows progress. `resolver`: the strategy's cluster resolver
  /// (nullptr: a single process), from which the SummaryWriter decides whether it writes.
  TrainingMonitor(const MonitorOptions& options, bool is_chief, std::shared_ptr<const ds::ClusterResolver> resolver)
      : display_(is_chief ? options.progress : progress::Mode::Off, options.progress_interval) {
    if (!options.logdir.empty()) {
      if (!resolver) resolver = std::make_shared<ds::SimpleClusterResolver>(ds::ClusterSpec{}, "worker", 0);
      writer_.emplace(options.logdir, ds::SummaryWriterOptions{.cluster_resolver = std::move(resolver)});
    }
  }

  void begin_epoch(int epoch, int epochs, std::int64_t steps) { display_.begin_epoch(epoch, epochs, steps); }

  void step(const digits::StepMetrics& s) {
    display_.step(s.step, s.loss);
    if (writer_) {
      writer_->scalar("batch_loss", s.loss, s.global_step);
      writer_->scalar("batch_accuracy", s.accuracy, s.global_step);
      writer_->scalar("batch_examples_per_second", s.seconds > 0 ? s.examples / s.seconds : 0.0, s.global_step);
    }
  }

  /// Call before printing the epoch's line.
  void epoch(const digits::EpochMetrics& m) {
    display_.end_epoch();
    if (writer_) {
      writer_->scalar("epoch_loss", m.loss, m.epoch);
      writer_->scalar("epoch_accuracy", m.train_accuracy, m.epoch);
      writer_->scalar("epoch_test_accuracy", m.test_accuracy, m.epoch);
      writer_->scalar("epoch_examples_per_second", m.examples_per_second, m.epoch);
      writer_->flush();  // an epoch's figures show in TensorBoard when the epoch ends
    }
  }

  /// Closes the event file; says where it is (on the task that wrote it).
  void close() {
    if (!writer_) return;
    writer_->close();
    if (writer_->writes()) fmt::print("wrote TensorBoard scalars to {}\n", writer_->path());
  }

 private:
  progress::Display display_;
  std::optional<ds::SummaryWriter> writer_;
};

}  // namespace report

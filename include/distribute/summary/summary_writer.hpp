// SummaryWriter: scalars for TensorBoard (TF's tf.summary.create_file_writer + tf.summary.scalar).
//
//   ds::SummaryWriter writer("logs/run1");          // logs/run1/events.out.tfevents.<time>.<host>.<pid>.<n>.v2
//   writer.scalar("loss", 0.25, /*step=*/100);
//   writer.flush();                                  // also every max_queue events, flush_interval, close()
//   $ tensorboard --logdir logs
//
// In a multi-worker job only the chief writes (TF's advice for summaries: the workers hold the same
// model); on the other tasks the writer checks its arguments and writes nothing. The chief is
// decided the way MultiWorkerMirroredStrategy decides it: by the cluster resolver (TF_CONFIG by
// default; without it, one process, the chief). `.all_tasks = true` makes every task write, each
// into its own run, logdir/<task type>_<task index>, so TensorBoard shows them side by side.
#pragma once

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <distribute/cluster/cluster_resolver.hpp>
#include <distribute/cluster/tf_config.hpp>
#include <distribute/core/error.hpp>
#include <distribute/data/record_file.hpp>
#include <distribute/summary/event.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace summary {

/// tf.summary.create_file_writer's arguments, and who writes in a multi-worker job.
struct SummaryWriterOptions {
  /// Events held in memory before they are written (TF's max_queue: written when more are queued).
  int max_queue = 10;
  /// The longest time between writes to the file (TF's flush_millis, 2 minutes), checked when an
  /// event is added (no thread of its own).
  std::chrono::milliseconds flush_interval{120'000};
  /// The end of the event file's name (TF's filename_suffix).
  std::string filename_suffix = ".v2";
  /// Every task writes (each into logdir/<task type>_<task index>), not only the chief.
  bool all_tasks = false;
  /// Which task this is; nullptr: TFConfigClusterResolver (the TF_CONFIG environment variable).
  std::shared_ptr<const ClusterResolver> cluster_resolver = nullptr;
};

namespace detail {

/// Whether `s` is well-formed UTF-8: a protobuf `string` must be, and TensorBoard's reader rejects
/// the whole file otherwise.
inline bool is_utf8(std::string_view s) noexcept {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t extra = 0;
    std::uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      extra = 1, cp = c & 0x1Fu;
    } else if ((c & 0xF0) == 0xE0) {
      extra = 2, cp = c & 0x0Fu;
    } else if ((c & 0xF8) == 0xF0) {
      extra = 3, cp = c & 0x07u;
    } else {
      return false;
    }
    if (i + extra >= s.size()) return false;  // the sequence is cut short
    for (std::size_t k = 1; k <= extra; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3Fu);
    }
    // Overlong forms, surrogates and code points past U+10FFFF are not UTF-8.
    static constexpr std::uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[extra] || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) return false;
    i += extra + 1;
  }
  return true;
}

inline std::string hostname() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || !*name) return "localhost";
  return name;
}

inline double wall_time_now() {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(
      std::chrono::system_clock::now().time_since_epoch());
  return static_cast<double>(us.count()) / 1e6;  // TF's resolution
}

}  // namespace detail

/// Writes scalar summaries to a TensorBoard event file. Thread-safe. Not copyable or movable
/// (hold it in a unique_ptr or optional to pass it around).
class SummaryWriter {
 public:
  /// Opens a new event file in `logdir` (created with its parents when missing), named like
  /// TF 2's: events.out.tfevents.<seconds, 10 digits>.<hostname>.<pid>.<n in this process><suffix>,
  /// and writes the file-version event to it. InvalidArgument when `logdir` cannot be created or
  /// the file cannot be written there, or for a bad option; ClusterConfigError from the resolver.
  explicit SummaryWriter(std::string logdir, SummaryWriterOptions options = {}) : options_(std::move(options)) {
    if (logdir.empty()) throw InvalidArgument("SummaryWriter: the log directory is empty");
    if (options_.max_queue < 0) {
      throw InvalidArgument(fmt::format("SummaryWriter: max_queue {} is negative", options_.max_queue));
    }
    if (options_.flush_interval.count() < 0) {
      throw InvalidArgument(fmt::format("SummaryWriter: flush_interval {} ms is negative", options_.flush_interval.count()));
    }
    if (options_.filename_suffix.find('/') != std::string::npos) {
      throw InvalidArgument(fmt::format("SummaryWriter: filename_suffix '{}' has a '/'", options_.filename_suffix));
    }
    auto resolver = options_.cluster_resolver;
    if (!resolver) resolver = std::make_shared<TFConfigClusterResolver>();
    const bool multi_task = !resolver->cluster_spec().empty();
    writes_ = options_.all_tasks || resolver->is_chief();
    std::filesystem::path dir(logdir);
    if (options_.all_tasks && multi_task) dir /= fmt::format("{}_{}", resolver->task_type(), resolver->task_id());
    logdir_ = dir.string();
    if (!writes_) return;

    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (!std::filesystem::is_directory(dir)) {
      const bool in_the_way = std::filesystem::exists(dir);
      throw InvalidArgument(fmt::format("SummaryWriter: cannot create the log directory '{}': {}", logdir_,
                                        in_the_way ? "a file of that name is in the way" : ec.message()));
    }
    static std::atomic<int> writers_in_process{0};
    const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(
                             std::chrono::system_clock::now().time_since_epoch()).count();
    path_ = (dir / fmt::format("events.out.tfevents.{:010d}.{}.{}.{}{}", seconds, detail::hostname(), ::getpid(),
                               writers_in_process++, options_.filename_suffix)).string();
    try {
      file_.emplace(path_);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(fmt::format("SummaryWriter: cannot write an event file in '{}': {}", logdir_, e.what()));
    }
    Event version;
    version.wall_time = detail::wall_time_now();
    version.file_version = kFileVersion;
    file_->write(encode_event(version));
    file_->flush();
    last_flush_ = std::chrono::steady_clock::now();
  }

  SummaryWriter(const SummaryWriter&) = delete;
  SummaryWriter& operator=(const SummaryWriter&) = delete;

  /// Flushes and closes; errors are dropped here (call close() to see them).
  ~SummaryWriter() {
    try {
      close();
    } catch (...) {
    }
  }

  /// Adds `value` (stored as float32, as TensorBoard's simple_value is) under `tag` at `step`, with
  /// the current wall time. NaN and infinities are written as they are (TensorBoard shows them).
  /// InvalidArgument for an empty tag or one that is not UTF-8, and after close(); Error when the
  /// file cannot be written.
  void scalar(std::string_view tag, double value, std::int64_t step) {
    if (tag.empty()) throw InvalidArgument(fmt::format("SummaryWriter::scalar: the tag is empty (step {})", step));
    if (!detail::is_utf8(tag)) {
      throw InvalidArgument(fmt::format("SummaryWriter::scalar: the tag is not valid UTF-8 ({} bytes, step {})", tag.size(), step));
    }
    std::lock_guard lock(mutex_);
    if (closed_) throw InvalidArgument(fmt::format("SummaryWriter::scalar('{}'): the writer is closed", tag));
    if (!writes_) return;
    Event event;
    event.wall_time = detail::wall_time_now();
    event.step = step;
    event.values.push_back({std::string(tag), static_cast<float>(value)});
    queue_.push_back(encode_event(event));
    if (static_cast<int>(queue_.size()) > options_.max_queue ||
        std::chrono::steady_clock::now() - last_flush_ >= options_.flush_interval) {
      flush_locked();
    }
  }

  /// Writes the queued events to the file and hands them to the operating system.
  void flush() {
    std::lock_guard lock(mutex_);
    if (!closed_) flush_locked();
  }

  /// Flushes and closes the file; later scalar() calls are errors, flush() and close() do nothing.
  void close() {
    std::lock_guard lock(mutex_);
    if (closed_) return;
    closed_ = true;
    if (!file_) return;
    flush_locked();
    file_->close();
  }

  /// Whether this task writes (the chief, or every task with all_tasks).
  bool writes() const noexcept { return writes_; }
  /// The directory of this writer's events (logdir, or logdir/<task>_<i> with all_tasks in a cluster).
  const std::string& logdir() const noexcept { return logdir_; }
  /// The event file's path; empty on a task that does not write.
  const std::string& path() const noexcept { return path_; }

 private:
  void flush_locked() {
    if (!file_) return;
    for (const auto& record : queue_) file_->write(record);
    queue_.clear();
    file_->flush();
    last_flush_ = std::chrono::steady_clock::now();
  }

  SummaryWriterOptions options_;
  bool writes_ = false;
  std::string logdir_, path_;
  std::mutex mutex_;
  std::optional<data::RecordWriter> file_;
  std::vector<std::string> queue_;
  std::chrono::steady_clock::time_point last_flush_{};
  bool closed_ = false;
};

/// TF's tf.summary.create_file_writer(logdir, max_queue, flush_millis, filename_suffix).
inline SummaryWriter create_file_writer(std::string logdir, SummaryWriterOptions options = {}) {
  return SummaryWriter(std::move(logdir), std::move(options));
}

}  // namespace summary

using summary::SummaryWriter;
using summary::SummaryWriterOptions;

DISTRIBUTE_END_NAMESPACE

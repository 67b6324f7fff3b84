// CheckpointManager: numbered checkpoints in one directory, keeping the newest few.
//
//   ds::CheckpointManager manager(ckpt, "/tmp/run", 3);
//   manager.restore_or_initialize();               // resume if the directory has a checkpoint
//   for (...) { train(); manager.save(); }         // ckpt-1.safetensors, ckpt-2, ... newest 3 kept
//
// Made inside the scope of a multi-worker strategy without explicit options, a manager takes the
// chief/non-chief options from that strategy (as ds::checkpoint_manager_options(strategy) does):
// worker 0 writes the real checkpoint, every other worker a temporary one that is removed.
//
// The directory holds `<name>-<N>.safetensors` files and a small TF-style index file named
// `checkpoint` (model_checkpoint_path / all_model_checkpoint_paths, written atomically). The
// files themselves are the truth: latest_checkpoint() is the highest N present, so a crash between
// writing a checkpoint and updating the index loses nothing. Numbers only grow within a directory
// (save() continues after the highest N present), which is what makes "highest" mean "newest".
#pragma once

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <distribute/checkpoint/checkpoint.hpp>
#include <distribute/checkpoint/detail/posix_file.hpp>
#include <distribute/core/context.hpp>
#include <distribute/core/cross_worker.hpp>
#include <distribute/core/error.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

struct CheckpointManagerOptions {
  /// Files are `<checkpoint_name>-<N>.safetensors`.
  std::string checkpoint_name = "ckpt";
  /// Multi-worker hook (TF's convention). Every worker calls save(), because saving can take
  /// collectives in which all workers must join (aggregating sync-on-read variables). Only the
  /// chief's file is kept: another worker writes into `<directory>/workertemp_<task_id>/`, which
  /// save() removes again, and it neither deletes old checkpoints nor writes the index. Nothing
  /// here talks to other workers. A CheckpointManager constructed without options takes these
  /// from the multi-worker strategy in scope (checkpoint::detail::checkpoint_manager_options_from_scope);
  /// ds::checkpoint_manager_options(strategy) gives the same for a strategy object.
  bool is_chief = true;
  int task_id = 0;
};

namespace checkpoint::detail {

struct NumberedCheckpoint {
  std::int64_t number;
  std::filesystem::path path;
};

inline constexpr std::string_view kCheckpointSuffix = ".safetensors";
inline constexpr std::string_view kIndexFileName = "checkpoint";

/// N when `filename` is `<name>-<N>.safetensors` (N decimal, no sign).
inline std::optional<std::int64_t> checkpoint_number(std::string_view filename, std::string_view name) {
  if (filename.size() <= name.size() + 1 + kCheckpointSuffix.size()) return std::nullopt;
  if (filename.substr(0, name.size()) != name || filename[name.size()] != '-') return std::nullopt;
  if (filename.substr(filename.size() - kCheckpointSuffix.size()) != kCheckpointSuffix) return std::nullopt;
  const std::string_view digits =
      filename.substr(name.size() + 1, filename.size() - name.size() - 1 - kCheckpointSuffix.size());
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  std::int64_t n = 0;
  auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
  if (ec != std::errc{} || ptr != digits.data() + digits.size()) return std::nullopt;
  return n;
}

/// The checkpoints in `directory`, oldest (lowest N) first; none when it does not exist.
inline std::vector<NumberedCheckpoint> list_checkpoints(const std::filesystem::path& directory, std::string_view name) {
  std::vector<NumberedCheckpoint> out;
  std::error_code ec;
  std::filesystem::directory_iterator it(directory, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    std::error_code type_ec;
    if (!it->is_regular_file(type_ec)) continue;
    if (auto n = checkpoint_number(it->path().filename().string(), name)) out.push_back({*n, it->path()});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.number < b.number; });
  return out;
}

/// The options for a manager made without explicit ones: the defaults (this process is the chief)
/// unless the strategy current on this thread spans several worker processes, in which case
/// worker 0 is the chief and worker i > 0 writes `workertemp_<i>/` (TF's rule, and what
/// ds::checkpoint_manager_options(strategy) says for a synchronous strategy).
inline CheckpointManagerOptions checkpoint_manager_options_from_scope() {
  CheckpointManagerOptions options;
  AnyStrategy* strategy = core::current_strategy_or_null();
  // Replicas in other processes: a synchronous multi-worker strategy (whose placement names its
  // link to the other workers). Asked only then: a parameter-server strategy hands out the next
  // ps task from variable_placement(), and its coordinator is the one process that saves anyway.
  if (strategy && strategy->num_replicas_in_sync() > strategy->num_local_replicas()) {
    const core::VariablePlacement placement = strategy->variable_placement();
    if (placement.link && placement.link->num_workers() > 1) {
      options.task_id = placement.link->worker_index();
      options.is_chief = options.task_id == 0;
    }
  }
  return options;
}

}  // namespace checkpoint::detail

/// The newest checkpoint in `directory` (tf.train.latest_checkpoint): the highest-numbered
/// `<checkpoint_name>-<N>.safetensors`, or nothing.
inline std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& directory,
                                                              std::string_view checkpoint_name = "ckpt") {
  auto all = checkpoint::detail::list_checkpoints(directory, checkpoint_name);
  if (all.empty()) return std::nullopt;
  return all.back().path;
}

class CheckpointManager {
 public:
  /// `max_to_keep`: how many checkpoints to keep (older ones are deleted after each save);
  /// std::nullopt keeps all. Checkpoints already in the directory count. Without `options`, they
  /// come from the strategy in scope: inside the scope of a multi-worker strategy, worker 0 is the
  /// chief and the other workers write a temporary checkpoint that is removed; elsewhere the
  /// defaults (the chief).
  CheckpointManager(Checkpoint& checkpoint, std::filesystem::path directory, std::optional<std::size_t> max_to_keep)
      : CheckpointManager(checkpoint, std::move(directory), max_to_keep,
                          checkpoint::detail::checkpoint_manager_options_from_scope()) {}

  /// With explicit options (e.g. ds::checkpoint_manager_options(strategy, "model")), used as given.
  CheckpointManager(Checkpoint& checkpoint, std::filesystem::path directory, std::optional<std::size_t> max_to_keep,
                    CheckpointManagerOptions options)
      : checkpoint_(&checkpoint),
        directory_(std::move(directory)),
        max_to_keep_(max_to_keep),
        options_(std::move(options)) {
    if (max_to_keep_ && *max_to_keep_ == 0) {
      throw InvalidArgument(fmt::format("CheckpointManager('{}'): max_to_keep must be at least 1, or std::nullopt to "
                                        "keep every checkpoint",
                                        directory_.string()));
    }
    const std::string& name = options_.checkpoint_name;
    if (name.empty() || name.find('/') != std::string::npos || name == checkpoint::detail::kIndexFileName) {
      throw InvalidArgument(fmt::format("CheckpointManager('{}'): '{}' cannot be a checkpoint name",
                                        directory_.string(), name));
    }
  }

  /// Saves the tracked variables as `<directory>/<name>-<N>.safetensors` and returns that path.
  /// N is `checkpoint_number` if given (e.g. the global step; it may not be lower than the newest
  /// present), else one more than both the save counter and the newest present. On the chief, then
  /// records it in the index and deletes the oldest checkpoints beyond max_to_keep.
  std::filesystem::path save(std::optional<std::int64_t> checkpoint_number = std::nullopt) {
    checkpoint::detail::check_cross_replica("CheckpointManager::save");
    const auto existing = checkpoints_with_numbers();
    const std::int64_t newest = existing.empty() ? -1 : existing.back().number;
    std::int64_t counter = checkpoint_->save_counter() + 1;
    std::int64_t number = counter;
    if (checkpoint_number) {
      if (*checkpoint_number < 0) {
        throw InvalidArgument(fmt::format("CheckpointManager::save: checkpoint number {} is negative",
                                          *checkpoint_number));
      }
      if (*checkpoint_number < newest) {
        throw InvalidArgument(fmt::format("CheckpointManager::save: checkpoint number {} is older than {}-{} already "
                                          "in '{}'; numbers must not go back, so that latest_checkpoint() finds the "
                                          "newest",
                                          *checkpoint_number, options_.checkpoint_name, newest, directory_.string()));
      }
      number = *checkpoint_number;
    } else if (newest >= number) {
      // A fresh Checkpoint (not restored) in a directory of older runs: continue after them
      // instead of overwriting ckpt-1 and leaving an older ckpt-5 to look newest.
      number = counter = newest + 1;
    }
    const std::string filename = fmt::format("{}-{}{}", options_.checkpoint_name, number, checkpoint::detail::kCheckpointSuffix);

    if (!options_.is_chief) {
      const std::filesystem::path temp_dir = directory_ / fmt::format("workertemp_{}", options_.task_id);
      const std::filesystem::path path = temp_dir / filename;
      checkpoint_->write_file(path, counter);
      checkpoint_->save_counter_ = counter;
      std::error_code ignored;
      std::filesystem::remove_all(temp_dir, ignored);
      return path;
    }

    const std::filesystem::path path = directory_ / filename;
    checkpoint_->write_file(path, counter);
    checkpoint_->save_counter_ = counter;

    // Index first, deletions last: a crash in between leaves extra files, never an index that
    // names deleted ones.
    auto kept = checkpoints_with_numbers();
    std::vector<checkpoint::detail::NumberedCheckpoint> doomed;
    if (max_to_keep_ && kept.size() > *max_to_keep_) {
      const auto cut = kept.size() - *max_to_keep_;
      doomed.assign(kept.begin(), kept.begin() + static_cast<std::ptrdiff_t>(cut));
      kept.erase(kept.begin(), kept.begin() + static_cast<std::ptrdiff_t>(cut));
    }
    write_index(path, kept);
    for (const auto& old : doomed) {
      std::error_code ignored;  // an undeletable old checkpoint is not worth failing a save for
      std::filesystem::remove(old.path, ignored);
    }
    const std::string prefix = options_.checkpoint_name + "-";
    checkpoint::detail::remove_stale_temp_files(directory_, [&](const std::string& target) {
      return target.rfind(prefix, 0) == 0 || target == checkpoint::detail::kIndexFileName;
    });
    return path;
  }

  /// The newest checkpoint in the directory, if any.
  std::optional<std::filesystem::path> latest_checkpoint() const {
    return distribute::latest_checkpoint(directory_, options_.checkpoint_name);
  }

  /// The checkpoints in the directory, oldest first.
  std::vector<std::filesystem::path> checkpoints() const {
    std::vector<std::filesystem::path> out;
    for (auto& c : checkpoints_with_numbers()) out.push_back(std::move(c.path));
    return out;
  }

  /// Restores the latest checkpoint and returns its path; with none, calls `initialize` (if
  /// given) and returns nothing. A latest checkpoint that fails to restore is an error, not a
  /// reason to start over.
  std::optional<std::filesystem::path> restore_or_initialize(const std::function<void()>& initialize = {}) {
    if (auto latest = latest_checkpoint()) {
      checkpoint_->restore(*latest);
      return latest;
    }
    if (initialize) initialize();
    return std::nullopt;
  }

  Checkpoint& checkpoint() const noexcept { return *checkpoint_; }
  const std::filesystem::path& directory() const noexcept { return directory_; }
  std::optional<std::size_t> max_to_keep() const noexcept { return max_to_keep_; }
  const CheckpointManagerOptions& options() const noexcept { return options_; }
  /// The index file (TF's `checkpoint` state file).
  std::filesystem::path index_path() const { return directory_ / checkpoint::detail::kIndexFileName; }

 private:
  std::vector<checkpoint::detail::NumberedCheckpoint> checkpoints_with_numbers() const {
    return checkpoint::detail::list_checkpoints(directory_, options_.checkpoint_name);
  }

  // TF's CheckpointState text format, with paths relative to the directory.
  void write_index(const std::filesystem::path& latest, const std::vector<checkpoint::detail::NumberedCheckpoint>& kept) const {
    std::string text = fmt::format("model_checkpoint_path: \"{}\"\n", latest.filename().string());
    for (const auto& c : kept) text += fmt::format("all_model_checkpoint_paths: \"{}\"\n", c.path.filename().string());
    distribute::checkpoint::detail::AtomicFile file(index_path(), checkpoint_->options().durable);
    file.write(std::as_bytes(std::span(text.data(), text.size())));
    file.commit();
  }

  Checkpoint* checkpoint_;
  std::filesystem::path directory_;
  std::optional<std::size_t> max_to_keep_;
  CheckpointManagerOptions options_;
};

DISTRIBUTE_END_NAMESPACE

// Checkpoint: named variables saved to, and restored from, one safetensors file.
//
//   ds::Checkpoint ckpt;
//   ckpt.track("dense/kernel", w).track("step", step);
//   auto path = ckpt.save("/tmp/run/ckpt");     // /tmp/run/ckpt-1.safetensors
//   ckpt.restore(path);
//
// What is saved for each kind of variable (TF's rules):
//   plain / mirrored (ON_WRITE)   one tensor, the primary copy; restored into every copy
//   sync-on-read (ON_READ)        the cross-replica aggregate (SUM/MEAN/ONLY_FIRST_REPLICA);
//                                 restored with a cross-replica assign (SUM: split over the copies)
//   sharded (track_sharded)       one tensor, the shards concatenated along axis 0; restorable into
//                                 any number of shards whose rows add up to the saved rows
// Variables of any TensorLike type are tracked through their run-time views: the dtype comes from
// the value, and the file holds the elements in row-major logical order whatever the value's
// layout (a column-major matrix, a transposed view), restored into that layout through its strides.
// Saving and restoring happen in cross-replica context (outside strategy.run()). A Checkpoint is
// not thread-safe: one thread saves or restores at a time.
#pragma once

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <distribute/checkpoint/safetensors.hpp>
#include <distribute/core/context.hpp>
#include <distribute/core/host_operands.hpp>
#include <distribute/core/dtype.hpp>
#include <distribute/core/error.hpp>
#include <distribute/core/shape.hpp>
#include <distribute/core/tensor_traits.hpp>
#include <distribute/core/tensor_view.hpp>
#include <distribute/core/values.hpp>
#include <distribute/core/variable.hpp>
#include <distribute/ps/sharded_variable.hpp>
#include <distribute/version.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

struct CheckpointOptions {
  /// fsync each file and its directory before save() returns, so that the checkpoint survives a
  /// power loss, not only a crash of the process. Off only for scratch checkpoints.
  bool durable = true;
  /// Called while a file is written: (bytes written so far, total bytes).
  std::function<void(std::uint64_t, std::uint64_t)> on_progress;
};

namespace checkpoint::detail {

inline constexpr std::string_view kSaveCounterKey = "distribute.save_counter";
inline constexpr std::string_view kLibraryVersionKey = "distribute.library_version";

/// A copy of a tracked value taken at save time, viewed as bytes; `owner` keeps the copy alive.
struct CheckpointSnapshot {
  std::shared_ptr<const void> owner;
  safetensors::TensorView view;
};

/// What Checkpoint knows about a tracked object: its dtype and logical shape, how to copy it out
/// and how to write a (validated) tensor back in.
class Trackable {
 public:
  virtual ~Trackable() = default;
  virtual DType dtype() const = 0;
  virtual Shape shape() const = 0;
  /// For messages: "variable 'w'", "sharded variable (2 shards: (4, 2), (3, 2))".
  virtual std::string describe() const = 0;
  virtual CheckpointSnapshot snapshot(const std::string& name) const = 0;
  /// `tensor` has already been checked to have dtype() and shape().
  virtual void restore(const safetensors::StoredTensor& tensor) = 0;
};

// Checkpoints read and write values through host memory: a compile-time type says where its
// values live in its type, a run-time one (torch::Tensor, DLPack) in each value's view.
template <class T>
void check_host_memory(const Variable<T>& var, std::string_view name) {
  static_assert(memory_space_v<T> == MemorySpace::host,
                "ds::Checkpoint: variables whose values live in device memory cannot be checkpointed yet");
  if constexpr (DynamicTensorLike<T>) {
    if (var.values().empty()) return;  // on a ps task: host memory there
    const TensorView v = view_of(var.values().front());
    if (v.memory != MemorySpace::host) {
      throw InvalidArgument(fmt::format("Checkpoint::track: '{}' (variable '{}') holds {} values in device memory, "
                                        "which cannot be checkpointed yet; track a host copy",
                                        name, var.name(), distribute::describe(v)));
    }
  }
}

// Reads a variable's checkpoint value: the primary copy, or the aggregate of a sync-on-read one.
template <class T>
T checkpoint_value(const Variable<T>& var, const std::string& name) {
  try {
    return var.read_value();
  } catch (const InvalidArgument& e) {
    throw CheckpointError(fmt::format("cannot save tensor '{}': {}", name, e.what()));
  }
}

// A value's elements in the file's row-major order: borrowed when its memory already holds them
// so, else copied into that order (a column-major matrix, a transposed or broadcast view).
template <class T>
CheckpointSnapshot snapshot_of(T value) {
  const TensorView v = view_of(value);
  if (v.contiguous()) {
    auto owner = std::make_shared<const T>(std::move(value));
    return CheckpointSnapshot{owner, safetensors::view_of(*owner)};
  }
  auto bytes = std::make_shared<std::vector<std::byte>>(v.bytes());
  copy_to_contiguous(v, bytes->data());
  return CheckpointSnapshot{bytes, safetensors::TensorView{v.dtype, v.shape, *bytes}};
}

// A SUM sync-on-read integer split as value/N per copy would lose the remainder (7 over 3 copies
// reads back 6); this gives it to copy 0 so that the sum reads back exactly. False (nothing
// written) for the other dtypes, which the cross-replica assign splits.
template <class T>
bool restore_integer_sum(Variable<T>& var, DType dtype, const std::byte* data) {
  return visit_value_dtype<T>(dtype, [&](auto tag) {
    using E = decltype(tag);
    if constexpr (!std::is_integral_v<E> || std::is_same_v<E, bool>) {
      return false;
    } else {
      const auto copies = static_cast<E>(var.values().size());
      var.apply_to_copies([&](T& copy, int index) {
        core::HostOperands ops("Checkpoint::restore");
        ops.add(view_of(copy));
        E* dst = static_cast<E*>(ops[0].data);
        for (std::size_t i = 0; i < ops[0].count(); ++i) {
          E src;
          std::memcpy(&src, data + i * sizeof(E), sizeof(E));
          const E share = static_cast<E>(src / copies);
          dst[i] = index == 0 ? static_cast<E>(src - share * static_cast<E>(copies - 1)) : share;
        }
        ops.write_back();
      });
      return true;
    }
  });
}

// Writes `shape`'s worth of row-major `dtype` elements from `data` into every copy of `var`, each
// copy in its own layout and memory (copies of handle types do not end up sharing one value).
template <class T>
void restore_variable(Variable<T>& var, DType dtype, const Shape& shape, const std::byte* data) {
  if (var.is_sync_on_read() && var.aggregation() == VariableAggregation::Sum && var.values().size() > 1 &&
      restore_integer_sum(var, dtype, data)) {
    return;
  }
  T value = make_value<T>(dtype, shape);
  copy_from_contiguous(data, view_of(value));
  var.assign(value);
}

template <class T>
class TrackedVariable final : public Trackable {
 public:
  explicit TrackedVariable(Variable<T> var) : var_(std::move(var)) {}
  DType dtype() const override { return var_.dtype(); }
  Shape shape() const override { return var_.shape(); }
  std::string describe() const override { return fmt::format("variable '{}'", var_.name()); }
  CheckpointSnapshot snapshot(const std::string& name) const override {
    return snapshot_of(checkpoint_value(var_, name));
  }
  void restore(const safetensors::StoredTensor& tensor) override {
    restore_variable(var_, tensor.dtype, tensor.shape, tensor.bytes.data());
  }

 private:
  Variable<T> var_;
};

template <class T>
class TrackedShards final : public Trackable {
 public:
  TrackedShards(std::vector<Variable<T>> shards, const std::string& name) : shards_(std::move(shards)) {
    if (shards_.empty()) throw InvalidArgument(fmt::format("Checkpoint: sharded variable '{}' has no shards", name));
    const Shape first = shards_.front().shape();
    const DType first_dtype = shards_.front().dtype();
    for (std::size_t i = 0; i < shards_.size(); ++i) {
      const Shape s = shards_[i].shape();
      if (s.empty() || s.size() != first.size() || !std::equal(s.begin() + 1, s.end(), first.begin() + 1)) {
        throw InvalidArgument(fmt::format("Checkpoint: shard {} ('{}') of '{}' has shape {}, which does not stack "
                                          "along axis 0 with shard 0's {}",
                                          i, shards_[i].name(), name, shape_string(s), shape_string(first)));
      }
      if (const DType d = shards_[i].dtype(); d != first_dtype) {
        throw InvalidArgument(fmt::format("Checkpoint: shard {} ('{}') of '{}' is {}, but shard 0 is {}; the shards "
                                          "of one tensor share a dtype",
                                          i, shards_[i].name(), name, to_string(d), to_string(first_dtype)));
      }
    }
  }
  DType dtype() const override { return shards_.front().dtype(); }
  Shape shape() const override {
    Shape s = shards_.front().shape();
    s[0] = 0;
    for (const auto& shard : shards_) s[0] += shard.shape()[0];
    return s;
  }
  std::string describe() const override {
    std::string shapes;
    for (std::size_t i = 0; i < shards_.size(); ++i) shapes += (i ? ", " : "") + shape_string(shards_[i].shape());
    return fmt::format("sharded variable ({} shard{}: {})", shards_.size(), shards_.size() == 1 ? "" : "s", shapes);
  }
  CheckpointSnapshot snapshot(const std::string& name) const override {
    const DType d = dtype();
    const Shape all = shape();
    auto bytes = std::make_shared<std::vector<std::byte>>(static_cast<std::size_t>(num_elements(all)) * size_of(d));
    std::byte* out = bytes->data();
    for (const auto& shard : shards_) {
      const T value = checkpoint_value(shard, name);
      const TensorView v = view_of(value);
      copy_to_contiguous(v, out);
      out += v.bytes();
    }
    return CheckpointSnapshot{bytes, safetensors::TensorView{d, all, *bytes}};
  }
  void restore(const safetensors::StoredTensor& tensor) override {
    const std::byte* data = tensor.bytes.data();
    // Split by rows: each shard takes as many rows as its own shape has, so the saved layout
    // (how many shards, which sizes) does not matter.
    for (auto& shard : shards_) {
      const Shape s = shard.shape();
      restore_variable(shard, tensor.dtype, s, data);
      data += static_cast<std::size_t>(num_elements(s)) * size_of(tensor.dtype);
    }
  }

 private:
  std::vector<Variable<T>> shards_;
};

/// Checkpoints are saved and restored in cross-replica context: inside a step function each
/// replica would read its own copy, and N replicas would all write the same file.
inline void check_cross_replica(const char* what) {
  if (ReplicaContext* ctx = core::thread_context().replica; ctx && ctx->strategy().num_local_replicas() > 1) {
    throw InvalidArgument(fmt::format("{} was called inside a step function of {} (replica {}); call it in "
                                      "cross-replica context, outside strategy.run()",
                                      what, ctx->strategy().name(), ctx->replica_id_in_sync_group()));
  }
}

}  // namespace checkpoint::detail

class Checkpoint {
 public:
  explicit Checkpoint(CheckpointOptions options = {}) : options_(std::move(options)) {}
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;
  Checkpoint(Checkpoint&&) = default;
  Checkpoint& operator=(Checkpoint&&) = default;

  /// Tracks a variable (plain, mirrored or sync-on-read) under `name`, the tensor's name in the file.
  template <class T>
  Checkpoint& track(std::string name, const Variable<T>& variable) {
    checkpoint::detail::check_host_memory(variable, name);
    return add(std::move(name), std::make_unique<checkpoint::detail::TrackedVariable<T>>(variable));
  }

  /// Tracks a sharded variable as one tensor: its shards concatenated along axis 0, so that it
  /// can be restored into a different number of shards.
  template <class T>
  Checkpoint& track(std::string name, const ShardedVariable<T>& variable) {
    return track_sharded(std::move(name), variable.variables());
  }

  /// Tracks shard variables (in row order) as one tensor, concatenated along axis 0. They must
  /// agree on every dimension but the first.
  template <class T>
  Checkpoint& track_sharded(std::string name, std::vector<Variable<T>> shards) {
    for (const auto& shard : shards) checkpoint::detail::check_host_memory(shard, name);
    auto tracked = std::make_unique<checkpoint::detail::TrackedShards<T>>(std::move(shards), name);
    return add(std::move(name), std::move(tracked));
  }

  bool is_tracking(std::string_view name) const { return items_.find(name) != items_.end(); }
  std::vector<std::string> tracked_names() const {
    std::vector<std::string> names;
    for (const auto& [name, item] : items_) names.push_back(name);
    return names;
  }

  /// How many times save() has succeeded (restored from the file by restore()).
  std::int64_t save_counter() const noexcept { return save_counter_; }
  const CheckpointOptions& options() const noexcept { return options_; }

  /// Increments the save counter and writes `<prefix>-<counter>.safetensors` (TF: ckpt-1, ckpt-2,
  /// ...), creating missing directories. Returns the path written.
  std::filesystem::path save(const std::filesystem::path& prefix) {
    checkpoint::detail::check_cross_replica("Checkpoint::save");
    const std::int64_t n = save_counter_ + 1;
    std::filesystem::path path(prefix.string() + fmt::format("-{}.safetensors", n));
    write_file(path, n);
    save_counter_ = n;
    return path;
  }

  /// Writes exactly `path`, leaving the save counter as it is (TF's Checkpoint.write).
  std::filesystem::path write(const std::filesystem::path& path) {
    checkpoint::detail::check_cross_replica("Checkpoint::write");
    write_file(path, save_counter_);
    return path;
  }

  /// Restores every tracked variable from `path`. Each must be in the file with the same dtype and
  /// shape (a sharded one: the concatenated shape); tensors the file has beyond those are ignored.
  /// Nothing is assigned unless everything matches.
  void restore(const std::filesystem::path& path) {
    checkpoint::detail::check_cross_replica("Checkpoint::restore");
    restore(safetensors::read(path));
  }

  /// Restores from a file already read (or parsed from memory).
  void restore(const safetensors::File& file) {
    checkpoint::detail::check_cross_replica("Checkpoint::restore");
    std::vector<std::string> problems;
    std::vector<std::pair<checkpoint::detail::Trackable*, const safetensors::StoredTensor*>> plan;
    for (const auto& [name, item] : items_) {
      const safetensors::StoredTensor* t = file.find(name);
      if (!t) {
        problems.push_back(fmt::format("tensor '{}' (for {}) is not in the file", name, item->describe()));
        continue;
      }
      const Shape want = item->shape();
      if (t->dtype != item->dtype() || t->shape != want) {
        problems.push_back(fmt::format("tensor '{}' is {} with shape {} in the file, but the tracked {} is {} with "
                                       "shape {}",
                                       name, safetensors::describe(t->dtype), shape_string(t->shape), item->describe(),
                                       safetensors::describe(item->dtype()), shape_string(want)));
        continue;
      }
      plan.emplace_back(item.get(), t);
    }
    std::int64_t counter = save_counter_;
    if (auto it = file.metadata.find(checkpoint::detail::kSaveCounterKey); it != file.metadata.end()) {
      const std::string& s = it->second;
      auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), counter);
      if (ec != std::errc{} || ptr != s.data() + s.size() || counter < 0) {
        problems.push_back(fmt::format("{} is \"{}\", not a non-negative integer", checkpoint::detail::kSaveCounterKey, s));
      }
    }
    if (!problems.empty()) {
      throw CheckpointError(fmt::format("cannot restore from '{}': {}", file.origin, fmt::join(problems, "; ")));
    }
    for (auto& [item, tensor] : plan) item->restore(*tensor);
    save_counter_ = counter;
  }

 private:
  friend class CheckpointManager;

  Checkpoint& add(std::string name, std::unique_ptr<checkpoint::detail::Trackable> item) {
    if (name.empty() || name == "__metadata__") {
      throw InvalidArgument(fmt::format("Checkpoint::track: '{}' cannot name a tensor", name));
    }
    if (items_.count(name)) {
      throw InvalidArgument(fmt::format("Checkpoint::track: '{}' is already tracked; each name holds one tensor", name));
    }
    items_.emplace(std::move(name), std::move(item));
    return *this;
  }

  void write_file(const std::filesystem::path& path, std::int64_t counter) {
    // Every value is copied out first so that the file is one consistent snapshot.
    std::vector<checkpoint::detail::CheckpointSnapshot> snapshots;
    safetensors::TensorMap tensors;
    for (const auto& [name, item] : items_) {
      snapshots.push_back(item->snapshot(name));
      tensors.emplace(name, snapshots.back().view);
    }
    safetensors::Metadata metadata{{std::string(checkpoint::detail::kSaveCounterKey), fmt::format("{}", counter)},
                                   {std::string(checkpoint::detail::kLibraryVersionKey), DISTRIBUTE_VERSION_STRING}};
    if (path.has_parent_path()) {
      std::error_code ec;
      std::filesystem::create_directories(path.parent_path(), ec);
      if (ec) {
        throw CheckpointError(fmt::format("cannot create the directory '{}' for checkpoint '{}': {}",
                                          path.parent_path().string(), path.string(), ec.message()));
      }
    }
    safetensors::write(path, tensors, metadata, safetensors::WriteOptions{options_.durable, options_.on_progress});
  }

  std::map<std::string, std::unique_ptr<checkpoint::detail::Trackable>, std::less<>> items_;
  std::int64_t save_counter_ = 0;
  CheckpointOptions options_;
};

DISTRIBUTE_END_NAMESPACE

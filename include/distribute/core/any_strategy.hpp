// AnyStrategy: the interface every strategy type implements (what get_strategy() returns), and how
// a strategy places the variables created in its scope.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <distribute/core/cross_worker.hpp>
#include <distribute/core/remote_store.hpp>
#include <distribute/version.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

namespace core {
/// How a strategy places the variables created in its scope.
/// Remote: one copy, held by a ps task (ParameterServerStrategy connected to its cluster).
enum class PlacementKind { Plain, Replicated, CentralStorage, Remote };

struct VariablePlacement {
  PlacementKind kind = PlacementKind::Plain;
  std::vector<std::string> devices;  // one per local copy
  int num_replicas_in_sync = 1;
  std::uint64_t strategy_id = 0;
  std::vector<std::string> replica_devices = {};  // CentralStorage: where the replicas compute
  CrossWorkerLink* link = nullptr;                 // multi-worker: the other workers' copies
  RemoteHandle remote = {};                        // Remote: where the value lives
};

inline std::uint64_t next_strategy_id() noexcept {
  static std::atomic<std::uint64_t> counter{0};
  return ++counter;
}
}  // namespace core

/// The strategy interface every strategy type implements; what get_strategy() returns.
class AnyStrategy {
 public:
  AnyStrategy() = default;
  AnyStrategy(const AnyStrategy&) = delete;
  AnyStrategy& operator=(const AnyStrategy&) = delete;
  virtual ~AnyStrategy() = default;

  /// "MirroredStrategy", "OneDeviceStrategy", ... as in TF.
  virtual std::string_view name() const noexcept = 0;
  virtual int num_replicas_in_sync() const noexcept = 0;
  virtual int num_local_replicas() const noexcept = 0;
  /// The local replicas' devices as TF strings ("/job:localhost/replica:0/task:0/device:CPU:0").
  virtual std::vector<std::string> worker_devices() const = 0;
  /// Unique per strategy object (never reused), to tell strategies apart at run time.
  std::uint64_t id() const noexcept { return id_; }

  /// How variables created in this strategy's scope are placed.
  virtual core::VariablePlacement variable_placement() const = 0;

  /// The concrete strategy, or nullptr if this is another type.
  template <class S>
  S* as() noexcept { return dynamic_cast<S*>(this); }
  template <class S>
  bool is() const noexcept { return dynamic_cast<const S*>(this) != nullptr; }

 private:
  std::uint64_t id_ = core::next_strategy_id();
};

DISTRIBUTE_END_NAMESPACE

// Where parameter-server variables live: ps tasks handed out round-robin, as TF's
// ParameterServerStrategy does. Every variable, and every shard of a sharded variable, takes the
// next task: with 3 ps tasks the 1st..4th go to tasks 0, 1, 2, 0.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/device.hpp>
#include <distribute/core/error.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

/// "/job:ps/replica:0/task:<task>/device:CPU:0": the device of a variable on ps task `task`.
inline std::string ps_device_string(int task) {
  if (task < 0) throw InvalidArgument(fmt::format("ps_device_string: task {} is negative", task));
  return DeviceSpec{"ps", 0, task, "CPU", 0}.to_string();
}

/// Hands out ps tasks in round-robin order. Thread-safe: concurrent callers get distinct turns.
class RoundRobinPlacement {
 public:
  explicit RoundRobinPlacement(int num_ps) : num_ps_(num_ps) {
    if (num_ps < 1) {
      throw InvalidArgument(fmt::format("RoundRobinPlacement: needs at least one ps task, got {}", num_ps));
    }
  }
  RoundRobinPlacement(const RoundRobinPlacement&) = delete;
  RoundRobinPlacement& operator=(const RoundRobinPlacement&) = delete;

  /// The task of the next variable placed.
  int next_task() noexcept { return static_cast<int>(placed_.fetch_add(1, std::memory_order_relaxed) % num_ps_); }
  /// The device string of the next variable placed.
  std::string next_device() { return ps_device_string(next_task()); }

  int num_ps() const noexcept { return num_ps_; }
  /// How many variables (shards count one each) have been placed so far.
  std::int64_t variables_placed() const noexcept { return placed_.load(std::memory_order_relaxed); }

 private:
  int num_ps_;
  std::atomic<std::int64_t> placed_{0};
};

/// The devices of `num_variables` variables placed round-robin over `num_ps` ps tasks.
inline std::vector<std::string> round_robin_ps_devices(std::int64_t num_variables, int num_ps) {
  if (num_variables < 0) {
    throw InvalidArgument(fmt::format("round_robin_ps_devices: num_variables {} is negative", num_variables));
  }
  RoundRobinPlacement placement(num_ps);
  std::vector<std::string> devices;
  devices.reserve(static_cast<std::size_t>(num_variables));
  for (std::int64_t i = 0; i < num_variables; ++i) devices.push_back(placement.next_device());
  return devices;
}

DISTRIBUTE_END_NAMESPACE

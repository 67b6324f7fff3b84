// OneDeviceStrategy: one replica on one device; the same program shape as the distributed ones.
#pragma once

#include <string>
#include <string_view>

#include <distribute/backends/host/replica_threads.hpp>
#include <distribute/collective/shared_memory.hpp>
#include <distribute/strategy/detail/host_devices.hpp>
#include <distribute/strategy/detail/sync_strategy.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

template <class Backend = host>
class OneDeviceStrategy : public SyncStrategy<OneDeviceStrategy<Backend>, Backend, SharedMemoryAllReduce> {
  using Base = SyncStrategy<OneDeviceStrategy<Backend>, Backend, SharedMemoryAllReduce>;

 public:
  /// The device, e.g. "/cpu:0"; variables are placed there and the step runs on the calling thread.
  explicit OneDeviceStrategy(const std::string& device = "/cpu:0")
      : Base(detail::host_devices(std::vector<std::string>{device}, "OneDeviceStrategy")) {}

  std::string_view name() const noexcept override { return "OneDeviceStrategy"; }
};

DISTRIBUTE_END_NAMESPACE

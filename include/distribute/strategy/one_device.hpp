// OneDeviceStrategy: one replica on one device; the same program shape as the distributed ones.
#pragma once

#include <string>
#include <string_view>

#include <distribute/backends/host/host.hpp>
#include <distribute/collective/shared_memory.hpp>
#include <distribute/strategy/detail/sync_strategy.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

template <class Backend = host>
class OneDeviceStrategy : public SyncStrategy<OneDeviceStrategy<Backend>, Backend, SharedMemoryAllReduce> {
  using Base = SyncStrategy<OneDeviceStrategy<Backend>, Backend, SharedMemoryAllReduce>;

 public:
  /// The backend's first device.
  OneDeviceStrategy() : Base(Backend::devices(1, "OneDeviceStrategy")) {}
  /// The device, e.g. "/cpu:0" or "/gpu:1"; variables are placed there.
  explicit OneDeviceStrategy(const std::string& device)
      : Base(Backend::devices(std::vector<std::string>{device}, "OneDeviceStrategy")) {}

  std::string_view name() const noexcept override { return "OneDeviceStrategy"; }
};

DISTRIBUTE_END_NAMESPACE

// CentralStorageStrategy: compute is replicated on the local devices, variables live once on
// the host. Replicas read the one copy; their updates are aggregated and applied once.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <distribute/backends/host/host.hpp>
#include <distribute/collective/shared_memory.hpp>
#include <distribute/core/device.hpp>
#include <distribute/strategy/detail/sync_strategy.hpp>
#include <distribute/strategy/mirrored.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

template <class Backend = host, class Ops = default_cross_device_ops_t<Backend>>
class CentralStorageStrategy : public SyncStrategy<CentralStorageStrategy<Backend, Ops>, Backend, Ops> {
  using Base = SyncStrategy<CentralStorageStrategy<Backend, Ops>, Backend, Ops>;

 public:
  CentralStorageStrategy() : Base(Backend::default_devices("CentralStorageStrategy")) {}
  explicit CentralStorageStrategy(int num_replicas) : Base(Backend::devices(num_replicas, "CentralStorageStrategy")) {}
  explicit CentralStorageStrategy(const std::vector<std::string>& compute_devices)
      : Base(Backend::devices(compute_devices, "CentralStorageStrategy")) {}

  std::string_view name() const noexcept override { return "CentralStorageStrategy"; }

  /// Variables: one copy on the host CPU (with one compute device, on that device, as TF does).
  core::VariablePlacement variable_placement() const override {
    auto replicas = this->worker_devices();
    std::vector<std::string> storage = replicas.size() == 1 ? replicas : std::vector<std::string>{local_device_string("CPU", 0)};
    return {core::PlacementKind::CentralStorage, storage, this->num_replicas_in_sync(), this->id(), replicas};
  }
};

DISTRIBUTE_END_NAMESPACE

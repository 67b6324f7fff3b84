// MirroredStrategy: synchronous data parallelism over the local devices of one process.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <distribute/backends/host/replica_threads.hpp>
#include <distribute/collective/shared_memory.hpp>
#include <distribute/strategy/detail/host_devices.hpp>
#include <distribute/strategy/detail/sync_strategy.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

/// The cross-device ops a backend uses when the strategy names none.
template <class Backend>
struct default_cross_device_ops {
  using type = SharedMemoryAllReduce;
};
template <class Backend>
using default_cross_device_ops_t = typename default_cross_device_ops<Backend>::type;

/// One replica per local device; variables mirrored on each; all-reduce with `Ops`.
template <class Backend = host, class Ops = default_cross_device_ops_t<Backend>>
class MirroredStrategy : public SyncStrategy<MirroredStrategy<Backend, Ops>, Backend, Ops> {
  using Base = SyncStrategy<MirroredStrategy<Backend, Ops>, Backend, Ops>;

 public:
  /// Every visible device of the backend (host: one CPU device).
  MirroredStrategy() : MirroredStrategy(1) {}
  /// `num_replicas` logical host devices "/cpu:0".."/cpu:N-1".
  explicit MirroredStrategy(int num_replicas) : Base(detail::host_devices(num_replicas, "MirroredStrategy")) {}
  /// An explicit device list, e.g. {"/cpu:0", "/cpu:1"}; unknown or duplicate devices throw.
  explicit MirroredStrategy(const std::vector<std::string>& devices)
      : Base(detail::host_devices(devices, "MirroredStrategy")) {}

  std::string_view name() const noexcept override { return "MirroredStrategy"; }
};

DISTRIBUTE_END_NAMESPACE

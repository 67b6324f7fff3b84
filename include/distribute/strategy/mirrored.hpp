// MirroredStrategy: synchronous data parallelism over the local devices of one process.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <distribute/backends/host/host.hpp>
#include <distribute/collective/default_cross_device_ops.hpp>
#include <distribute/collective/shared_memory.hpp>
#include <distribute/strategy/detail/sync_strategy.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

/// One replica per local device; variables mirrored on each; all-reduce with `Ops`.
template <class Backend = host, class Ops = default_cross_device_ops_t<Backend>>
class MirroredStrategy : public SyncStrategy<MirroredStrategy<Backend, Ops>, Backend, Ops> {
  using Base = SyncStrategy<MirroredStrategy<Backend, Ops>, Backend, Ops>;

 public:
  /// Every visible device of the backend (host: one CPU device; cuda: every visible GPU).
  MirroredStrategy() : Base(Backend::default_devices("MirroredStrategy")) {}
  /// The first `num_replicas` devices of the backend (host: logical CPUs "/cpu:0".."/cpu:N-1").
  explicit MirroredStrategy(int num_replicas, CommunicationOptions options = {})
      : Base(Backend::devices(num_replicas, "MirroredStrategy"), options) {}
  /// An explicit device list, e.g. {"/cpu:0", "/cpu:1"}; unknown or duplicate devices throw.
  explicit MirroredStrategy(const std::vector<std::string>& devices, CommunicationOptions options = {})
      : Base(Backend::devices(devices, "MirroredStrategy"), options) {}

  std::string_view name() const noexcept override { return "MirroredStrategy"; }
};

DISTRIBUTE_END_NAMESPACE

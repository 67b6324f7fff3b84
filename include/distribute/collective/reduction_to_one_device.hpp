// ReductionToOneDevice: every replica's buffer is reduced on one device, then copied back to
// all (TF's tf.distribute.ReductionToOneDevice). Simple and serial: the reference the other
// algorithms are checked against, and the choice when one device is much faster than the rest.
#pragma once

#include <memory>
#include <numeric>
#include <string_view>
#include <vector>

#include <distribute/collective/communication_options.hpp>
#include <distribute/collective/validate.hpp>
#include <distribute/collective/shared_memory.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace collective::detail {
#if DISTRIBUTE_DETAIL_DEFINE  // reached through make_collectives below (version.hpp: separate compilation)

class ReductionToOneDeviceCollectives : public SharedMemoryCollectives {
 public:
  ReductionToOneDeviceCollectives(std::int64_t mean_divisor, int num_local) : SharedMemoryCollectives(mean_divisor) {
    all_.resize(static_cast<std::size_t>(num_local));
    std::iota(all_.begin(), all_.end(), 0);
  }

  void all_reduce(core::ReplicaGroup& group, int replica, std::span<core::BufferRef> buffers, ReduceOp op) override {
    const core::CollectiveCall call{core::CollectiveKind::AllReduce, op, buffers};
    constexpr int root = 0;
    collective::exchange(
        group, replica, call,
        [&] {  // the root reduces everyone's buffers into its own
          if (replica != root) return;
          for (std::size_t i = 0; i < buffers.size(); ++i) reduce_into(group, root, all_, i, Reduction::lower(op, mean_divisor_), ReadFrom::inputs);
        },
        [&] {  // then everyone copies the result back
          if (replica != root) copy_buffers(group, root, replica);
        });
  }

 private:
  std::vector<int> all_;
};

#endif  // DISTRIBUTE_DETAIL_DEFINE
}  // namespace collective::detail

/// Cross-device ops policy: reduce on the first device, then broadcast.
struct ReductionToOneDevice {
  static constexpr std::string_view name = "ReductionToOneDevice";
  static std::unique_ptr<core::ReplicaCollectives> make_collectives(const collective::detail::CollectivesConfig& config);
};

#if DISTRIBUTE_DETAIL_DEFINE
DISTRIBUTE_DECL std::unique_ptr<core::ReplicaCollectives> ReductionToOneDevice::make_collectives(
    const collective::detail::CollectivesConfig& config) {
  return std::make_unique<collective::detail::ReductionToOneDeviceCollectives>(config.num_replicas_in_sync,
                                                                    static_cast<int>(config.devices.size()));
}
#endif

DISTRIBUTE_END_NAMESPACE

// HierarchicalCopyAllReduce: a two-level tree (TF's tf.distribute.HierarchicalCopyAllReduce).
// The devices form groups; each group's leader reduces its group, the first leader reduces the
// leaders, and the result is copied back down the same tree. On a DGX-like machine the groups
// are the devices that share a fast link; here, the first and second half of the devices.
#pragma once

#include <algorithm>
#include <memory>
#include <string_view>
#include <vector>

#include <distribute/collective/communication_options.hpp>
#include <distribute/collective/validate.hpp>
#include <distribute/collective/shared_memory.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace collective::detail {

/// The collectives of HierarchicalCopyAllReduceWith<num_groups>.
DISTRIBUTE_DECL std::unique_ptr<core::ReplicaCollectives> make_hierarchical_copy_collectives(std::int64_t mean_divisor,
                                                                                     int num_local, int num_groups);

#if DISTRIBUTE_DETAIL_DEFINE  // reached through the factory above (version.hpp: separate compilation)
class HierarchicalCopyCollectives : public SharedMemoryCollectives {
 public:
  HierarchicalCopyCollectives(std::int64_t mean_divisor, int num_local, int num_groups)
      : SharedMemoryCollectives(mean_divisor) {
    num_groups = std::clamp(num_groups, 1, std::max(1, num_local));
    const int per_group = (num_local + num_groups - 1) / num_groups;
    for (int r = 0; r < num_local; ++r) {
      const int g = r / per_group;
      if (static_cast<int>(groups_.size()) <= g) {
        groups_.emplace_back();
        leaders_.push_back(r);
      }
      groups_[static_cast<std::size_t>(g)].push_back(r);
      leader_of_.push_back(leaders_[static_cast<std::size_t>(g)]);
    }
  }

  void all_reduce(core::ReplicaGroup& group, int replica, std::span<core::BufferRef> buffers, ReduceOp op) override {
    const core::CollectiveCall call{core::CollectiveKind::AllReduce, op, buffers};
    const Reduction red = Reduction::lower(op, mean_divisor_);
    const int leader = leader_of_[static_cast<std::size_t>(replica)];
    const bool is_leader = leader == replica;
    const int root = leaders_.front();
    collective::exchange(
        group, replica, call,
        [&] {  // 1. each leader reduces its group (leaders work in parallel)
          if (!is_leader) return;
          const auto& members = groups_[static_cast<std::size_t>(
              std::find(leaders_.begin(), leaders_.end(), replica) - leaders_.begin())];
          for (std::size_t i = 0; i < buffers.size(); ++i) reduce_into(group, replica, members, i, red.undivided(), ReadFrom::inputs);
        },
        [&] {  // 2. the first leader reduces the leaders
          if (replica != root) return;
          for (std::size_t i = 0; i < buffers.size(); ++i) reduce_into(group, root, leaders_, i, red, ReadFrom::partial_results);
        },
        [&] {  // 3. the other leaders fetch the result
          if (is_leader && replica != root) copy_buffers(group, root, replica);
        },
        [&] {  // 4. members fetch it from their leader
          if (!is_leader) copy_buffers(group, leader, replica);
        });
  }

 private:
  std::vector<std::vector<int>> groups_;
  std::vector<int> leaders_;
  std::vector<int> leader_of_;
};

DISTRIBUTE_DECL std::unique_ptr<core::ReplicaCollectives> make_hierarchical_copy_collectives(std::int64_t mean_divisor,
                                                                                     int num_local, int num_groups) {
  return std::make_unique<HierarchicalCopyCollectives>(mean_divisor, num_local, num_groups);
}
#endif  // DISTRIBUTE_DETAIL_DEFINE

}  // namespace collective::detail

/// Cross-device ops policy: reduce within groups, across group leaders, then copy back down.
/// `NumGroups` groups of consecutive devices (TF's topology for 8 GPUs is two groups of four).
template <int NumGroups = 2>
struct HierarchicalCopyAllReduceWith {
  static constexpr std::string_view name = "HierarchicalCopyAllReduce";
  static std::unique_ptr<core::ReplicaCollectives> make_collectives(const collective::detail::CollectivesConfig& config) {
    return collective::detail::make_hierarchical_copy_collectives(config.num_replicas_in_sync,
                                                      static_cast<int>(config.devices.size()), NumGroups);
  }
};
using HierarchicalCopyAllReduce = HierarchicalCopyAllReduceWith<2>;

DISTRIBUTE_END_NAMESPACE

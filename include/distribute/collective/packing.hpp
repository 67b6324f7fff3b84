// Packing many small tensors into few contiguous buffers, so a transport or NCCL issues one
// collective per pack instead of one per tensor. TF's rule (cross_device_utils.group_by_size):
// values are taken in reverse order (the last gradients of backprop are ready first); a new pack
// starts once the previous one exceeds bytes_per_pack; 0 means a single pack. Values of
// different element types never share a pack.
#pragma once

#include <cstddef>
#include <cstring>
#include <span>
#include <vector>

#include <distribute/core/replica_group.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace collective::detail {

struct Pack {
  DType dtype = DType::F32;
  std::vector<std::size_t> members;  // indices into the values, in pack order
  std::size_t count = 0;             // elements in the pack
  std::size_t bytes() const noexcept { return count * size_of(dtype); }
};

DISTRIBUTE_DECL std::vector<Pack> make_packs(std::span<const core::BufferRef> values, std::size_t bytes_per_pack);
/// Copies the pack's members, in order, into `flat` (pack.bytes() bytes).
DISTRIBUTE_DECL void pack_into(const Pack& pack, std::span<const core::BufferRef> values, std::byte* flat);
/// Copies `flat` back out into the pack's members.
DISTRIBUTE_DECL void unpack_from(const Pack& pack, std::span<const core::BufferRef> values, const std::byte* flat);

#if DISTRIBUTE_DETAIL_DEFINE  // compiled apart with DISTRIBUTE_SEPARATE_COMPILATION (version.hpp)
DISTRIBUTE_DECL std::vector<Pack> make_packs(std::span<const core::BufferRef> values, std::size_t bytes_per_pack) {
  std::vector<Pack> packs;
  std::vector<std::size_t> open;  // per dtype: index of its current pack in `packs`, or npos
  constexpr std::size_t none = static_cast<std::size_t>(-1);
  open.assign(kNumDTypes, none);
  for (std::size_t k = values.size(); k-- > 0;) {
    const core::BufferRef& v = values[k];
    std::size_t& current = open[static_cast<std::size_t>(v.dtype)];
    if (current == none || (bytes_per_pack > 0 && packs[current].bytes() > bytes_per_pack)) {
      current = packs.size();
      packs.push_back(Pack{v.dtype, {}, 0});
    }
    packs[current].members.push_back(k);
    packs[current].count += v.count();
  }
  return packs;
}

DISTRIBUTE_DECL void pack_into(const Pack& pack, std::span<const core::BufferRef> values, std::byte* flat) {
  for (std::size_t k : pack.members) {
    const auto n = values[k].bytes();
    if (n) std::memcpy(flat, values[k].data, n);
    flat += n;
  }
}

DISTRIBUTE_DECL void unpack_from(const Pack& pack, std::span<const core::BufferRef> values, const std::byte* flat) {
  for (std::size_t k : pack.members) {
    const auto n = values[k].bytes();
    if (n) std::memcpy(values[k].data, flat, n);
    flat += n;
  }
}

#endif  // DISTRIBUTE_DETAIL_DEFINE
}  // namespace collective::detail
DISTRIBUTE_END_NAMESPACE

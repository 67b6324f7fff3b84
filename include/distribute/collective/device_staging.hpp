// Device buffers through host-only collectives. The shared-memory family of algorithms (and the
// multi-worker one over TCP) reads and writes buffers on the host; a buffer in device memory
// (BufferRef::memory == device, see core/memory_space.hpp) reaches them as a host copy, and the
// result is copied back. A policy whose collectives take device buffers themselves (NCCL) says
// so with `static constexpr bool device_buffers = true` and is not wrapped.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include <distribute/collective/communication_options.hpp>
#include <distribute/core/replica_group.hpp>
#include <distribute/core/memory_space.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace collective {

inline bool any_in_device_memory(std::span<const core::BufferRef> buffers) noexcept {
  for (const auto& b : buffers) {
    if (b.memory == MemorySpace::device) return true;
  }
  return false;
}

/// `inner` wrapped so that device buffers travel through host copies.
DISTRIBUTE_DECL std::unique_ptr<core::ReplicaCollectives> with_device_staging(std::unique_ptr<core::ReplicaCollectives> inner);

#if DISTRIBUTE_DETAIL_DEFINE  // reached through with_device_staging (version.hpp: separate compilation)
/// Host copies of a call's buffers: device buffers are copied in on construction and out by
/// copy_back(); host buffers are used in place.
class HostStaging {
 public:
  explicit HostStaging(std::span<const core::BufferRef> buffers, bool copy_in = true)
      : originals_(buffers.begin(), buffers.end()), staged_(originals_), storage_(originals_.size()) {
    for (std::size_t i = 0; i < originals_.size(); ++i) {
      const core::BufferRef& b = originals_[i];
      if (b.memory != MemorySpace::device) continue;
      storage_[i].resize(b.bytes());
      staged_[i].data = storage_[i].data();
      staged_[i].memory = MemorySpace::host;
      staged_[i].device = nullptr;
      if (copy_in) b.device->copy(storage_[i].data(), b.data, b.bytes());
    }
  }
  std::span<core::BufferRef> buffers() noexcept { return staged_; }
  void copy_back() const {
    for (std::size_t i = 0; i < originals_.size(); ++i) {
      const core::BufferRef& b = originals_[i];
      if (b.memory == MemorySpace::device) b.device->copy(b.data, storage_[i].data(), b.bytes());
    }
  }

 private:
  std::vector<core::BufferRef> originals_;
  std::vector<core::BufferRef> staged_;
  std::vector<std::vector<std::byte>> storage_;
};

/// Wraps host-only collectives so that device buffers travel through host copies.
class DeviceStagingCollectives final : public core::ReplicaCollectives {
 public:
  explicit DeviceStagingCollectives(std::unique_ptr<core::ReplicaCollectives> inner) : inner_(std::move(inner)) {}

  /// Out-of-place buffers are host buffers (an input in device memory is copied into its result
  /// first), which the staging leaves as they are.
  bool reads_sources() const noexcept override { return inner_->reads_sources(); }

  void all_reduce(core::ReplicaGroup& group, int replica, std::span<core::BufferRef> buffers, ReduceOp op) override {
    if (!any_in_device_memory(buffers)) return inner_->all_reduce(group, replica, buffers, op);
    HostStaging staging(buffers);
    inner_->all_reduce(group, replica, staging.buffers(), op);
    staging.copy_back();
  }

  void all_gather(core::ReplicaGroup& group, int replica, const core::BufferRef& input, int axis,
                  const std::function<void*(const Shape&)>& allocate) override {
    if (input.memory != MemorySpace::device) return inner_->all_gather(group, replica, input, axis, allocate);
    HostStaging staging(std::span<const core::BufferRef>(&input, 1));
    std::vector<std::byte> gathered;
    Shape shape;
    inner_->all_gather(group, replica, staging.buffers()[0], axis, [&](const Shape& s) -> void* {
      shape = s;
      gathered.resize(static_cast<std::size_t>(num_elements(s)) * size_of(input.dtype));
      return gathered.data();
    });
    // The result type's memory is the caller's business; the device copy reaches host or device.
    input.device->copy(allocate(shape), gathered.data(), gathered.size());
  }

  void broadcast(core::ReplicaGroup& group, int replica, core::BufferRef buffer, int root) override {
    if (buffer.memory != MemorySpace::device) return inner_->broadcast(group, replica, buffer, root);
    HostStaging staging(std::span<const core::BufferRef>(&buffer, 1));
    inner_->broadcast(group, replica, staging.buffers()[0], root);
    staging.copy_back();
  }

  void reduce_scatter(core::ReplicaGroup& group, int replica, core::BufferRef input, ReduceOp op,
                      const std::function<void*(const Shape&)>& allocate) override {
    if (input.memory != MemorySpace::device) return inner_->reduce_scatter(group, replica, input, op, allocate);
    HostStaging staging(std::span<const core::BufferRef>(&input, 1));
    std::vector<std::byte> part;
    Shape shape;
    inner_->reduce_scatter(group, replica, staging.buffers()[0], op, [&](const Shape& s) -> void* {
      shape = s;
      part.resize(static_cast<std::size_t>(num_elements(s)) * size_of(input.dtype));
      return part.data();
    });
    input.device->copy(allocate(shape), part.data(), part.size());
  }

  void all_to_all(core::ReplicaGroup& group, int replica, std::span<core::BufferRef> pieces, bool split,
                  const std::function<std::vector<void*>(const std::vector<Shape>&)>& allocate) override {
    if (!any_in_device_memory(pieces)) return inner_->all_to_all(group, replica, pieces, split, allocate);
    HostStaging staging(pieces);
    std::vector<std::vector<std::byte>> received;
    std::vector<Shape> shapes;
    inner_->all_to_all(group, replica, staging.buffers(), split, [&](const std::vector<Shape>& s) {
      shapes = s;
      std::vector<void*> out;
      for (const Shape& shape : s) {
        received.emplace_back(static_cast<std::size_t>(num_elements(shape)) * size_of(pieces[0].dtype));
        out.push_back(received.back().data());
      }
      return out;
    });
    const std::vector<void*> out = allocate(shapes);
    for (std::size_t k = 0; k < out.size(); ++k) {
      if (!received[k].empty()) pieces[0].device->copy(out[k], received[k].data(), received[k].size());
    }
  }

 private:
  std::unique_ptr<core::ReplicaCollectives> inner_;
};

DISTRIBUTE_DECL std::unique_ptr<core::ReplicaCollectives> with_device_staging(std::unique_ptr<core::ReplicaCollectives> inner) {
  return std::make_unique<DeviceStagingCollectives>(std::move(inner));
}
#endif  // DISTRIBUTE_DETAIL_DEFINE

/// The collectives of policy `Ops`, wrapped for device buffers unless Ops handles them itself.
template <class Ops>
std::unique_ptr<core::ReplicaCollectives> make_collectives(const collective::detail::CollectivesConfig& config) {
  if constexpr (requires { requires Ops::device_buffers; }) {
    return Ops::make_collectives(config);
  } else {
    return with_device_staging(Ops::make_collectives(config));
  }
}

}  // namespace collective
DISTRIBUTE_END_NAMESPACE

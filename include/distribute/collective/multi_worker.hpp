// The collectives of a multi-worker strategy: reduce among the local replicas in shared memory,
// one cross-worker collective per pack (made by local replica 0 over the CrossWorkerLink), then
// a local copy back out. Every value crosses the process boundary once. With
// CommunicationImplementation::Nccl the policy's NCCL collectives span the workers instead, and
// this TCP path takes only what NCCL cannot (make_multi_worker_collectives below).
#pragma once

#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <span>
#include <vector>

#include <distribute/collective/communication_options.hpp>
#include <distribute/collective/device_staging.hpp>
#include <distribute/collective/detail/scatter.hpp>
#include <distribute/collective/validate.hpp>
#include <distribute/collective/packing.hpp>
#include <distribute/collective/shared_memory.hpp>
#include <distribute/core/concat.hpp>
#include <distribute/core/cross_worker.hpp>
#include <distribute/core/error.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace collective {

/// In-place all-reduce of host buffers across the workers, one link collective per pack
/// (collective/packing.hpp's rule); `scratch` holds packs of several values. `op` is not Mean.
DISTRIBUTE_DECL void all_reduce_in_packs(core::CrossWorkerLink& link, std::span<core::BufferRef> buffers, ReduceOp op,
                                         std::size_t bytes_per_pack, std::vector<std::byte>& scratch);

/// The TCP path of a multi-worker strategy's collectives (MultiWorkerCollectives below), device
/// buffers through host copies.
DISTRIBUTE_DECL std::unique_ptr<core::ReplicaCollectives> make_cross_worker_collectives(const collective::detail::CollectivesConfig& config,
                                                                                core::CrossWorkerLink& link);

#if DISTRIBUTE_DETAIL_DEFINE  // reached through the two functions above (version.hpp: separate compilation)
DISTRIBUTE_DECL void all_reduce_in_packs(core::CrossWorkerLink& link, std::span<core::BufferRef> buffers, ReduceOp op,
                                         std::size_t bytes_per_pack, std::vector<std::byte>& scratch) {
  for (const collective::detail::Pack& pack : collective::detail::make_packs(buffers, bytes_per_pack)) {
    core::ShapesDigest shapes;
    for (std::size_t k : pack.members) shapes.add(buffers[k].shape);
    if (pack.members.size() == 1) {  // a lone value travels from its own memory, no copy
      core::BufferRef& b = buffers[pack.members.front()];
      link.all_reduce(b.data, b.count(), b.dtype, op, shapes.value());
    } else {
      scratch.resize(pack.bytes());
      detail::pack_into(pack, buffers, scratch.data());
      link.all_reduce(scratch.data(), pack.count, pack.dtype, op, shapes.value());
      detail::unpack_from(pack, buffers, scratch.data());
    }
  }
}

class MultiWorkerCollectives : public detail::SharedMemoryCollectives {
 public:
  MultiWorkerCollectives(core::CrossWorkerLink& link, int num_local, int num_replicas_in_sync, const CommunicationOptions& options)
      : detail::SharedMemoryCollectives(num_replicas_in_sync), link_(&link), bytes_per_pack_(options.bytes_per_pack) {
    local_.resize(static_cast<std::size_t>(num_local));
    std::iota(local_.begin(), local_.end(), 0);
  }

  void all_reduce(core::ReplicaGroup& group, int replica, std::span<core::BufferRef> buffers, ReduceOp op) override {
    const core::CollectiveCall call{core::CollectiveKind::AllReduce, op, buffers};
    const Reduction red = Reduction::lower(op, mean_divisor_);
    collective::exchange(
        group, replica, call,
        [&] {  // local replicas into replica 0
          if (replica != 0) return;
          for (std::size_t i = 0; i < buffers.size(); ++i) collective::detail::reduce_into(group, 0, local_, i, red.undivided(), collective::detail::ReadFrom::inputs);
        },
        [&] {  // replica 0: across the workers, one collective per pack
          if (replica == 0) cross_worker_all_reduce(buffers, red);
        },
        [&] {  // everyone takes the result
          if (replica != 0) collective::detail::copy_buffers(group, 0, replica);
        });
  }

  void all_gather(core::ReplicaGroup& group, int replica, const core::BufferRef& input, int axis,
                  const std::function<void*(const Shape&)>& allocate) override {
    core::BufferRef in = input;
    const core::CollectiveCall call{core::CollectiveKind::AllGather, ReduceOp::Sum, std::span<core::BufferRef>(&in, 1), axis};
    collective::exchange(
        group, replica, call,
        [&] {
          if (replica != 0) return;
          std::vector<const core::BufferRef*> parts;
          for (int r = 0; r < group.size(); ++r) parts.push_back(&group.slot(r).buffers[0]);
          std::vector<std::byte> local;
          Shape local_shape;
          core::concat_along_axis(parts, static_cast<std::size_t>(axis), [&](const Shape& s) -> void* {
            local_shape = s;
            local.resize(static_cast<std::size_t>(num_elements(s)) * size_of(in.dtype));
            return local.data();
          });
          gathered_ = core::gather_across_workers(*link_, {local.data(), in.dtype, local_shape},
                                            static_cast<std::size_t>(axis), "all_gather");
        },
        [&] {
          void* out = allocate(gathered_.shape);
          if (!gathered_.data.empty()) std::memcpy(out, gathered_.data.data(), gathered_.data.size());
        });
  }

  /// `root` is a replica_id_in_sync_group: its worker sends, every replica receives.
  void broadcast(core::ReplicaGroup& group, int replica, core::BufferRef buffer, int root) override {
    const core::CollectiveCall call{core::CollectiveKind::Broadcast, ReduceOp::Sum, std::span<core::BufferRef>(&buffer, 1), 0, root};
    const int root_worker = root / group.size();
    const int root_local = root % group.size();
    collective::exchange(
        group, replica, call,
        [&] {
          if (replica != 0) return;
          if (link_->worker_index() == root_worker && root_local != 0 && buffer.bytes() > 0) {
            std::memcpy(buffer.data, group.slot(root_local).buffers[0].data, buffer.bytes());
          }
          link_->broadcast(buffer.data, buffer.bytes(), root_worker);
        },
        [&] {
          if (replica != 0 && buffer.bytes() > 0) std::memcpy(buffer.data, group.slot(0).buffers[0].data, buffer.bytes());
        });
  }

  /// Local replicas reduce into replica 0's input; one cross-worker reduce-scatter leaves each
  /// worker the rows of its replicas' parts; each replica copies its part out.
  void reduce_scatter(core::ReplicaGroup& group, int replica, core::BufferRef input, ReduceOp op,
                      const std::function<void*(const Shape&)>& allocate) override {
    const core::CollectiveCall call{core::CollectiveKind::ReduceScatter, op, std::span<core::BufferRef>(&input, 1)};
    const Reduction red = Reduction::lower(op, mean_divisor_);
    const int local = group.size(), n = static_cast<int>(mean_divisor_), w = link_->worker_index();
    collective::exchange(
        group, replica, call,
        [&] {
          if (replica != 0) return;
          collective::detail::reduce_into(group, 0, local_, 0, red.undivided(), collective::detail::ReadFrom::inputs);
          const std::size_t row = core::row_elements(input.shape);
          std::vector<std::size_t> counts;
          for (int v = 0; v < link_->num_workers(); ++v) {
            std::int64_t rows = 0;
            for (int i = 0; i < local; ++i) rows += core::split_rows(input.shape[0], n, v * local + i).rows;
            counts.push_back(static_cast<std::size_t>(rows) * row);
          }
          link_->reduce_scatter(input.data, counts, input.dtype, red.op(), core::shapes_digest(input.shape));
          if (!red.divides()) return;
          const core::BufferRef first = core::part_of(input, n, w * local);
          visit_dtype(input.dtype, [&](auto t) {
            core::divide(static_cast<decltype(t)*>(first.data), counts[static_cast<std::size_t>(w)], red.divisor());
          });
        },
        [&] {
          if (group.collective_failed_replica() >= 0) return;
          const core::BufferRef part = core::part_of(group.slot(0).buffers[0], n, w * local + replica);
          void* out = allocate(part.shape);
          if (part.bytes() > 0) std::memcpy(out, part.data, part.bytes());
        });
  }

  /// Replica 0 gathers every replica's pieces' shapes over the link (the agreement check), sends
  /// each worker the pieces for its replicas in one all_to_all, and every replica copies its
  /// pieces out: from the local replicas' buffers, or from what arrived.
  void all_to_all(core::ReplicaGroup& group, int replica, std::span<core::BufferRef> pieces, bool split,
                  const std::function<std::vector<void*>(const std::vector<Shape>&)>& allocate) override {
    const int n = static_cast<int>(mean_divisor_);
    // root 0: checked in the first phase, on the table of every worker's replicas.
    const core::CollectiveCall call{core::CollectiveKind::AllToAll, ReduceOp::Sum, pieces, split ? 1 : 0, 0};
    const int local = group.size(), w = link_->worker_index(), workers = link_->num_workers();
    auto piece_bytes = [&](int from, int to) {
      const auto& s = sides_[static_cast<std::size_t>(from)];
      return static_cast<std::size_t>(num_elements(s.shapes[static_cast<std::size_t>(to)])) * size_of(s.dtypes[0]);
    };
    collective::exchange(
        group, replica, call,
        [&] {
          if (replica != 0) return;
          sides_ = collective::detail::gather_sides(*link_, group);
          collective::detail::check_all_to_all(sides_, n);
          // To worker v: for each of its replicas, the pieces of each of ours, in that order.
          std::vector<std::size_t> send_bytes(static_cast<std::size_t>(workers), 0), recv_bytes(send_bytes);
          std::vector<std::byte> send;
          received_at_.assign(static_cast<std::size_t>(n) * static_cast<std::size_t>(local), 0);
          std::size_t in = 0;
          for (int v = 0; v < workers; ++v) {
            if (v == w) continue;
            for (int to = v * local; to < (v + 1) * local; ++to) {
              for (int i = 0; i < local; ++i) {
                const core::BufferRef& b = group.slot(i).buffers[static_cast<std::size_t>(to)];
                const auto* p = static_cast<const std::byte*>(b.data);
                send.insert(send.end(), p, p + b.bytes());
                send_bytes[static_cast<std::size_t>(v)] += b.bytes();
              }
            }
            for (int i = 0; i < local; ++i) {  // from worker v, in the order it sends
              for (int from = v * local; from < (v + 1) * local; ++from) {
                received_at_[static_cast<std::size_t>(from) * static_cast<std::size_t>(local) + static_cast<std::size_t>(i)] = in;
                in += piece_bytes(from, w * local + i);
                recv_bytes[static_cast<std::size_t>(v)] += piece_bytes(from, w * local + i);
              }
            }
          }
          received_.resize(in);
          link_->all_to_all(send.data(), send_bytes, received_.data(), recv_bytes);
        },
        [&] {
          if (group.collective_failed_replica() >= 0) return;  // replica 0 failed: no table to read
          const int me = w * local + replica;
          std::vector<Shape> shapes;
          for (int from = 0; from < n; ++from) shapes.push_back(sides_[static_cast<std::size_t>(from)].shapes[static_cast<std::size_t>(me)]);
          const std::vector<void*> out = allocate(shapes);
          for (int from = 0; from < n; ++from) {
            const std::size_t bytes = piece_bytes(from, me);
            if (bytes == 0) continue;
            const void* src = from / local == w
                                  ? group.slot(from % local).buffers[static_cast<std::size_t>(me)].data
                                  : received_.data() + received_at_[static_cast<std::size_t>(from) * static_cast<std::size_t>(local) +
                                                                    static_cast<std::size_t>(replica)];
            std::memcpy(out[static_cast<std::size_t>(from)], src, bytes);
          }
        });
  }

 private:
  void cross_worker_all_reduce(std::span<core::BufferRef> buffers, Reduction red) {
    collective::all_reduce_in_packs(*link_, buffers, red.op(), bytes_per_pack_, scratch_);
    if (!red.divides()) return;
    for (core::BufferRef& b : buffers) {
      visit_dtype(b.dtype, [&](auto t) { core::divide(static_cast<decltype(t)*>(b.data), b.count(), red.divisor()); });
    }
  }

  core::CrossWorkerLink* link_;
  std::size_t bytes_per_pack_;
  std::vector<int> local_;
  std::vector<std::byte> scratch_;  // packs of several values (used by replica 0 only)
  core::GatheredBytes gathered_;          // replica 0's all_gather result, read by all
  std::vector<collective::detail::AllToAllSide> sides_;        // replica 0's all_to_all table, read by all
  std::vector<std::byte> received_;        // the pieces from other workers
  std::vector<std::size_t> received_at_;   // [from * local + local replica]: where its piece starts
};

DISTRIBUTE_DECL std::unique_ptr<core::ReplicaCollectives> make_cross_worker_collectives(const collective::detail::CollectivesConfig& config,
                                                                                core::CrossWorkerLink& link) {
  return with_device_staging(std::make_unique<MultiWorkerCollectives>(
      link, static_cast<int>(config.devices.size()), config.num_replicas_in_sync, config.options));
}
#endif  // DISTRIBUTE_DETAIL_DEFINE

/// Whether cross-device ops policy `Ops` can also run across workers (NcclAllReduce with NCCL
/// compiled in): it then provides make_multi_worker_collectives(config, link, fallback).
template <class Ops>
inline constexpr bool spans_workers_v = requires { &Ops::make_multi_worker_collectives; };

/// The collectives of a multi-worker strategy: the policy's own across the workers when
/// `implementation` is Nccl (falling back to the TCP path for what it cannot take), else the
/// TCP path, device buffers through host copies. `implementation` is resolved (never Auto).
template <class Ops>
std::unique_ptr<core::ReplicaCollectives> make_multi_worker_collectives(const collective::detail::CollectivesConfig& config,
                                                                  core::CrossWorkerLink& link,
                                                                  CommunicationImplementation implementation) {
  auto ring = make_cross_worker_collectives(config, link);
  if (implementation != CommunicationImplementation::Nccl) return ring;
  if constexpr (spans_workers_v<Ops>) {
    return Ops::make_multi_worker_collectives(config, link, std::move(ring));
  } else {
    throw InvalidArgument("MultiWorkerMirroredStrategy: CommunicationImplementation NCCL needs cross-device ops that "
                          "span workers (ds::NcclAllReduce, compiled by nvcc with NCCL)");
  }
}

}  // namespace collective
DISTRIBUTE_END_NAMESPACE

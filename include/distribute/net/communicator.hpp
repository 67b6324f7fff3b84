// Communicator: collectives and point-to-point messages among the processes of a cluster, over TCP.
//
//   ds::net::Communicator comm({"127.0.0.1:5000", "127.0.0.1:5001"}, rank, {}, {"worker:0", "worker:1"});
//   comm.all_reduce(std::span<float>(grads), ds::ReduceOp::Mean);
//
// Calls are synchronous and every rank must make the same collective calls in the same order
// (with matching counts, dtypes, ops and roots); a mismatch throws InvalidArgument on every rank.
// A lost or stalled peer throws PeerFailure or CollectiveTimeout on every survivor, and from then
// on the communicator is poisoned: every call throws that error again.
#pragma once

#include <cstddef>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/elementwise.hpp>
#include <distribute/core/dtype.hpp>
#include <distribute/core/error.hpp>
#include <distribute/core/reduce_op.hpp>
#include <distribute/net/detail/all_reduce.hpp>
#include <distribute/net/detail/collectives.hpp>
#include <distribute/net/detail/scatter_collectives.hpp>
#include <distribute/net/detail/shared_memory_agreement.hpp>
#include <distribute/net/detail/topology.hpp>
#include <distribute/net/detail/transport.hpp>
#include <distribute/net/options.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net {

class Communicator {
 public:
  /// Joins the cluster: listens on addresses[rank], connects to the lower ranks (retrying with
  /// back-off until options.connect_timeout) and accepts the higher ones, authenticating each with
  /// the cluster token when one is set. `task_names[i]` (e.g. "worker:2") names rank i in errors;
  /// default "rank i". Throws InvalidArgument (bad arguments), Unavailable (cannot listen),
  /// PeerFailure (a peer never appeared) or ClusterConfigError (token or cluster spec disagree).
  Communicator(std::vector<std::string> addresses, int rank, CommunicatorOptions options = {},
               std::vector<std::string> task_names = {})
      : transport_(std::make_unique<detail::Transport>(std::move(addresses), rank, std::move(options),
                                                       std::move(task_names))),
        topology_(detail::learn_topology(*transport_)),
        shared_agreement_(topology_.one_host_memory() != nullptr
                              ? std::make_unique<detail::SharedMemoryAgreement>(topology_.host_segment, transport_->rank())
                              : nullptr),
        agreement_(shared_agreement_ ? *shared_agreement_ : transport_->tcp_agreement()) {}

  /// Clean shutdown: says goodbye to every peer, waits (at most 2 s) for the goodbyes to be
  /// written and answered, closes the sockets and joins the network thread. Never throws.
  ~Communicator() = default;

  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const noexcept { return transport_->rank(); }
  int size() const noexcept { return transport_->size(); }
  const std::string& task_name(int rank) const { return transport_->task_name(rank); }
  const std::string& address(int rank) const { return transport_->address(rank); }
  const CommunicatorOptions& options() const noexcept { return transport_->options(); }

  /// Whether all-reduces of at least options().shared_memory_min_bytes (rank 0's value) go
  /// through shared memory: every rank runs on this host, enabled it, and mapped one segment.
  bool uses_shared_memory() const noexcept { return topology_.one_host_memory() != nullptr; }

  /// Whether all-reduce data between this rank and `peer` goes through shared memory: every pair
  /// when uses_shared_memory(); with ranks on several hosts, the pairs on one host (hostname and a
  /// shared-memory probe agree), whose all-reduces are hierarchical. A diagnostic.
  bool shares_memory_with(int peer) const noexcept {
    if (peer == rank() || peer < 0 || peer >= size()) return false;
    return topology_.host_memory != nullptr &&
           topology_.host_of[static_cast<std::size_t>(peer)] == topology_.host_of[static_cast<std::size_t>(rank())];
  }

  /// The message of the error that poisoned this communicator, if one did.
  std::optional<std::string> failure() const {
    auto f = transport_->failure();
    return f ? std::optional<std::string>(f->message) : std::nullopt;
  }

  /// In place: every rank ends with the element-wise reduction of all ranks' buffers (bitwise
  /// identical on every rank). MEAN is the SUM divided by size() (integers truncate), lowered here
  /// for everything below. `shapes`, when not 0, is a digest of the shapes the buffer holds: ranks
  /// must agree on it as on count and dtype.
  void all_reduce(void* data, std::size_t count, DType dtype, ReduceOp op, std::uint32_t shapes = 0) {
    if (data == nullptr && count > 0) {
      throw InvalidArgument(fmt::format("all_reduce: data is null but count is {}", count));
    }
    ::distribute::core::check_op_for_dtype(op, dtype, "all_reduce");
    const std::size_t es = size_of(dtype);
    if (count > std::numeric_limits<std::size_t>::max() / es) {
      throw InvalidArgument(fmt::format("all_reduce: count {} of {} overflows the address space", count, to_string(dtype)));
    }
    detail::Call call(*transport_, agreement_, detail::Descriptor{detail::CollectiveKind::AllReduce, dtype, op, shapes, count});
    auto* bytes = static_cast<std::byte*>(data);
    if (size() == 1 || count == 0) return call.finish();
    detail::all_reduce(*transport_, call, topology_, bytes, count, dtype, Reduction::lower(op, size()), scratch_);
  }

  template <Element T>
  void all_reduce(std::span<T> data, ReduceOp op) {
    all_reduce(data.data(), data.size(), dtype_of<T>(), op);
  }

  /// Every rank contributes `bytes` (they may differ); `out` receives all contributions in rank
  /// order and `sizes[i]` the byte count of rank i. `data` must not point into `out`.
  void all_gather(const void* data, std::size_t bytes, std::vector<std::byte>& out, std::vector<std::size_t>& sizes) {
    if (data == nullptr && bytes > 0) throw InvalidArgument(fmt::format("all_gather: data is null but bytes is {}", bytes));
    const auto* src = static_cast<const std::byte*>(data);
    if (bytes > 0 && !out.empty() && src < out.data() + out.size() && out.data() < src + bytes) {
      throw InvalidArgument("all_gather: the input buffer lies inside the output vector");
    }
    detail::Call call(*transport_, agreement_, detail::Descriptor{detail::CollectiveKind::AllGather, DType::U8, ReduceOp::Sum, 0, bytes});
    detail::direct_all_gather(*transport_, call, src, bytes, out, sizes);
  }

  /// Copies `bytes` bytes from rank `root`'s buffer into every other rank's.
  void broadcast(void* data, std::size_t bytes, int root) {
    if (root < 0 || root >= size()) {
      throw InvalidArgument(fmt::format("broadcast: root {} is out of range for a cluster of {}", root, size()));
    }
    if (data == nullptr && bytes > 0) throw InvalidArgument(fmt::format("broadcast: data is null but bytes is {}", bytes));
    detail::Call call(*transport_, agreement_, detail::Descriptor{detail::CollectiveKind::Broadcast, DType::U8, ReduceOp::Sum,
                                                               static_cast<std::uint32_t>(root), bytes});
    detail::chain_broadcast(*transport_, call, static_cast<std::byte*>(data), bytes, root);
  }

  /// In place: `data` holds sum(counts) elements (counts.size() == size()); on return the
  /// counts[rank()] elements after those of the lower ranks hold their reduction over every rank
  /// (the others are scratch). MEAN divides by size(), as for all_reduce. `shapes` as for all_reduce.
  void reduce_scatter(void* data, std::span<const std::size_t> counts, DType dtype, ReduceOp op, std::uint32_t shapes = 0) {
    if (counts.size() != static_cast<std::size_t>(size())) {
      throw InvalidArgument(fmt::format("reduce_scatter: {} counts for a cluster of {}", counts.size(), size()));
    }
    const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
    if (data == nullptr && total > 0) throw InvalidArgument(fmt::format("reduce_scatter: data is null but count is {}", total));
    ::distribute::core::check_op_for_dtype(op, dtype, "reduce_scatter");
    detail::Call call(*transport_, agreement_, detail::Descriptor{detail::CollectiveKind::ReduceScatter, dtype, op, shapes, total});
    if (size() == 1 || total == 0) return call.finish();
    detail::reduce_scatter(*transport_, call, topology_.one_host_memory(), static_cast<std::byte*>(data), counts, dtype,
                           Reduction::lower(op, size()), scratch_);
  }

  /// send_bytes[k] bytes of `send` (block k, after the blocks before it) go to rank k, and
  /// recv_bytes[k] bytes from rank k land in block k of `recv`. Every rank must expect what the
  /// others send it (a receive of another size fails the communicator); the buffers must not overlap.
  void all_to_all(const void* send, std::span<const std::size_t> send_bytes, void* recv,
                  std::span<const std::size_t> recv_bytes) {
    if (send_bytes.size() != static_cast<std::size_t>(size()) || recv_bytes.size() != static_cast<std::size_t>(size())) {
      throw InvalidArgument(fmt::format("all_to_all: {} send and {} receive sizes for a cluster of {}", send_bytes.size(),
                                        recv_bytes.size(), size()));
    }
    const std::size_t out = std::accumulate(send_bytes.begin(), send_bytes.end(), std::size_t{0});
    const std::size_t in = std::accumulate(recv_bytes.begin(), recv_bytes.end(), std::size_t{0});
    if ((send == nullptr && out > 0) || (recv == nullptr && in > 0)) throw InvalidArgument("all_to_all: a buffer is null");
    detail::Call call(*transport_, agreement_, detail::Descriptor{detail::CollectiveKind::AllToAll, DType::U8, ReduceOp::Sum, 0, out});
    detail::direct_all_to_all(*transport_, call, static_cast<const std::byte*>(send), send_bytes,
                              static_cast<std::byte*>(recv), recv_bytes);
  }

  /// Returns once every rank has entered the barrier.
  void barrier() {
    detail::Call call(*transport_, agreement_, detail::Descriptor{detail::CollectiveKind::Barrier, DType::U8, ReduceOp::Sum, 0, 0});
    call.finish();
  }

  /// Sends one message to `peer`; returns once it is handed to the kernel (`data` may then be
  /// reused). Messages between two ranks arrive in order; at most options().max_frame_bytes.
  void send(int peer, std::span<const std::byte> data) {
    detail::Call call(*transport_, fmt::format("send to {}", peer_label(peer)), peer, observe::CallKind::Send);
    call.send_p2p(peer, data);
    call.finish();
  }

  /// Receives the next message from `peer`, which must be exactly `data.size()` bytes (otherwise
  /// InvalidArgument; the message is consumed and the communicator stays usable).
  void recv(int peer, std::span<std::byte> data) {
    detail::Call call(*transport_, fmt::format("recv from {}", peer_label(peer)), peer, observe::CallKind::Recv);
    call.recv_p2p(peer, data);
    call.finish();
  }

 private:
  std::string peer_label(int peer) const {
    return peer >= 0 && peer < size() ? task_name(peer) : fmt::format("rank {}", peer);
  }

  std::unique_ptr<detail::Transport> transport_;
  detail::Topology topology_;
  // Every rank on this host sharing one segment: the agreement on its board; otherwise the
  // transport's, over TCP. Chosen once, here.
  std::unique_ptr<detail::SharedMemoryAgreement> shared_agreement_;
  detail::Agreement& agreement_;
  std::vector<std::byte> scratch_;  // kept between calls: where reduce-scatter receives land
};

}  // namespace net
DISTRIBUTE_END_NAMESPACE

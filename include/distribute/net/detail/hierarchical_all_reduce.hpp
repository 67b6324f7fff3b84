// All-reduce across hosts (topology.hpp found several, some with ranks sharing a segment): the
// ranks of each host reduce through their segment, the host leaders (each group's lowest rank)
// exchange their hosts' sums over TCP and reduce them in host order, and each leader copies the
// result to its host's ranks through the segment. Every host's data crosses the network once
// towards every other host; all ranks end bitwise identical (one order of reduction everywhere).
//
// The exchange between leaders is direct (each sends its whole buffer to every other): with two
// hosts that is the least any algorithm sends; with many hosts a ring of leaders would send less
// (issue 21: the reduce-scatter inside the host, the slices across hosts and the algorithm table
// come next).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <span>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/dtype.hpp>
#include <distribute/core/reduce_op.hpp>
#include <distribute/net/detail/reduce_bytes.hpp>
#include <distribute/net/detail/shared_memory_all_reduce.hpp>
#include <distribute/net/detail/transport.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net::detail {

inline void hierarchical_all_reduce(Transport& tr, Transport::Op& op, std::byte* data, std::size_t count, DType dtype,
                                    ReduceOp rop, std::vector<std::byte>& scratch) {
  const int n = tr.size(), r = tr.rank();
  const std::vector<int>& group_of = tr.group_of();
  std::vector<int> leaders;
  for (int k = 0; k < n; ++k) {
    if (group_of[static_cast<std::size_t>(k)] == k) leaders.push_back(k);
  }
  const bool leader = group_of[static_cast<std::size_t>(r)] == r;
  SharedMemoryAllReduce* const shm = tr.host_memory();  // null: this rank is a host of its own
  const std::size_t es = size_of(dtype), bytes = count * es;
  const ReduceOp partial = rop == ReduceOp::Mean ? ReduceOp::Sum : rop;  // divided once, at the end
  auto check = [&] { op.check_progress(-1); };
  auto mismatch = [&] {
    (void)op.descriptors();  // throws: the descriptors name the mismatch the same way on every rank
    op.fail(FailureKind::Peer, fmt::format("{}: the shared-memory stamps disagree but the descriptors agree",
                                          tr.task_name(tr.rank())));
  };
  if (shm != nullptr) {
    const auto quiet = tr.exempt_from_busy_poll();
    shm->run(data, count, dtype, partial, check, mismatch);
  }
  if (leader && leaders.size() > 1) {
    const std::size_t others = leaders.size() - 1;
    if (scratch.size() < others * bytes) scratch.resize(others * bytes);
    auto slot = [&](std::size_t i) {  // i: index in leaders, not ours
      const std::size_t mine = static_cast<std::size_t>(std::find(leaders.begin(), leaders.end(), r) - leaders.begin());
      return scratch.data() + (i < mine ? i : i - 1) * bytes;
    };
    const std::size_t chunk = tr.chunk_bytes();
    const std::size_t pieces = (bytes + chunk - 1) / chunk;
    std::vector<TransferPtr> transfers;
    for (std::size_t i = 0; i < leaders.size(); ++i) {
      if (leaders[i] == r) continue;
      for (std::size_t c = 0; c < pieces; ++c) {
        const std::size_t len = std::min(chunk, bytes - c * chunk);
        transfers.push_back(op.recv(leaders[i], c, std::span<std::byte>(slot(i) + c * chunk, len)));
      }
    }
    for (std::size_t i = 0; i < leaders.size(); ++i) {
      if (leaders[i] == r) continue;
      for (std::size_t c = 0; c < pieces; ++c) {
        const std::size_t len = std::min(chunk, bytes - c * chunk);
        transfers.push_back(op.send(leaders[i], c, std::span<const std::byte>(data + c * chunk, len)));
      }
    }
    for (const TransferPtr& t : transfers) op.wait(t);  // our buffer is no longer being sent either
    // Host order on every leader: leaders[0] + leaders[1] + ...
    if (leaders[0] == r) {
      for (std::size_t i = 1; i < leaders.size(); ++i) reduce_bytes(dtype, data, slot(i), count, partial);
    } else {
      std::byte* acc = slot(0);
      for (std::size_t i = 1; i < leaders.size(); ++i) reduce_bytes(dtype, acc, leaders[i] == r ? data : slot(i), count, partial);
      std::memcpy(data, acc, bytes);
    }
  }
  if (leader && rop == ReduceOp::Mean) divide_bytes(dtype, data, count, n);
  if (shm != nullptr) {
    const auto quiet = tr.exempt_from_busy_poll();
    shm->broadcast_from_first(data, bytes, check);
  }
  op.finish();
}

}  // namespace net::detail
DISTRIBUTE_END_NAMESPACE

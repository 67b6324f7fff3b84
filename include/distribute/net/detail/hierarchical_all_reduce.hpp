// All-reduce across hosts (topology.hpp found several, some with ranks sharing a segment), in three
// steps, with the buffer cut in `slices` parts (even_part):
//   1. reduce-scatter inside each host through its segment: part s ends reduced over the host on
//      the host's s-th rank (its leader for part s);
//   2. each part's leaders (one per host) all-reduce it across hosts over TCP, by the algorithm
//      that all_reduce.hpp's table picks for them;
//   3. all-gather inside each host through its segment.
// With as many parts as the smallest host has ranks, every rank of that host leads a part, so no
// one rank carries every byte that crosses the network, and each host's data crosses the network
// once in each direction. A host of one rank does steps 1 and 3 in no time (it leads the one
// part there is). The direct exchange across hosts is pipelined with both shared-memory steps: a
// leader sends each piece as soon as it has reduced it, and reduces what arrived as the all-gather
// needs it. Every part is reduced in one order on one rank per host (host order across), so all
// ranks end bitwise identical.
#pragma once

#include <algorithm>
#include <cstddef>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/dtype.hpp>
#include <distribute/core/reduce_op.hpp>
#include <distribute/net/detail/collectives.hpp>
#include <distribute/net/detail/reduce_bytes.hpp>
#include <distribute/net/detail/shared_memory_all_reduce.hpp>
#include <distribute/net/detail/topology.hpp>
#include <distribute/net/detail/transport.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net::detail {

/// The TCP algorithms a part's leaders may run across hosts (all_reduce.hpp's table picks one).
enum class AcrossHosts { Direct, HalvingDoubling, Ring };

/// The pieces the direct exchange across hosts moves, and the shared-memory rounds that feed it
/// and drain it: small enough that the network starts early and little is left to copy once the
/// last piece is in, large enough that each round's synchronization is cheap beside its copies.
inline constexpr std::size_t kAcrossHostsPieceBytes = std::size_t{128} << 10;

/// `slices`: 1 .. topo.fewest_per_host(), alike on every rank; `across`: how each part's leaders
/// all-reduce it (alike on every rank). The division `red` asks for is made once, across hosts.
inline void hierarchical_all_reduce(Transport& tr, Call& op, const Topology& topo, int slices, AcrossHosts across,
                                    std::byte* data, std::size_t count, DType dtype, Reduction red,
                                    std::vector<std::byte>& scratch) {
  const int r = tr.rank();
  const int host = topo.host_of[static_cast<std::size_t>(r)];
  const std::vector<int>& here = topo.hosts[static_cast<std::size_t>(host)];
  const int local = static_cast<int>(std::find(here.begin(), here.end(), r) - here.begin());
  SharedMemoryAllReduce* const shm = topo.host_memory.get();  // null: this rank is a host of its own
  const std::size_t es = size_of(dtype);
  const Reduction partial = red.undivided();  // within a host; the leaders divide
  const bool leads = local < slices;
  const auto mine_part = even_part(count, slices, leads ? local : 0);  // not a structured binding: lambdas use it
  const std::size_t first = mine_part.first, len = mine_part.second;

  // This part's leaders, host by host: this rank is the host-th.
  std::vector<int> leaders;
  if (leads) {
    for (const auto& h : topo.hosts) leaders.push_back(h[static_cast<std::size_t>(local)]);
  }
  const RankGroup group{leaders, host};
  std::byte* const part = data + first * es;
  std::optional<DirectExchange> direct;
  const bool pipelined = across == AcrossHosts::Direct;
  const std::size_t round_bytes = pipelined ? kAcrossHostsPieceBytes : 0;
  if (leads && len > 0 && pipelined) direct.emplace(tr, op, group, part, len, dtype, red, scratch, kAcrossHostsPieceBytes);

  auto check = [&] { op.check_progress(-1); };
  auto mismatch = [&] {
    (void)op.descriptors();  // throws: the descriptors name the mismatch the same way on every rank
    op.fail(FailureKind::Peer, fmt::format("{}: the shared-memory stamps disagree but the descriptors agree",
                                          tr.task_name(tr.rank())));
  };
  auto reduced = [&](std::size_t from, std::size_t elements) {
    if (direct) direct->send_up_to(from + elements - first);
  };
  auto needed = [&](std::size_t from, std::size_t elements) {
    if (direct) direct->finish_up_to(from + elements - first);
  };

  // Through the segment (the metrics count it as sent and received, as shared_memory's path does):
  // every rank's buffer in and, for a leader, its part of every other rank's out; then a leader's
  // result in and every other part out.
  const std::size_t bytes = count * es, mine = leads ? len * es : 0;
  const std::size_t ranks_here = here.size();
  if (shm != nullptr) {
    op.count_bytes(bytes + mine, (ranks_here - 1) * mine + bytes - mine);
    const auto quiet = tr.exempt_from_busy_poll();
    shm->reduce_scatter(data, count, dtype, partial, slices, round_bytes, check, mismatch, reduced);
  } else {
    reduced(first, len);
  }
  if (leads && len > 0 && across != AcrossHosts::Direct) {
    if (across == AcrossHosts::HalvingDoubling) {
      halving_doubling_all_reduce(tr, op, group, part, len, dtype, red, scratch);
    } else {
      ring_all_reduce(tr, op, group, part, len, dtype, red, scratch);
    }
  }
  if (shm != nullptr) {
    const auto quiet = tr.exempt_from_busy_poll();
    shm->all_gather(data, count, dtype, slices, round_bytes, check, mismatch, needed);
  } else {
    needed(first, len);
  }
}

}  // namespace net::detail
DISTRIBUTE_END_NAMESPACE

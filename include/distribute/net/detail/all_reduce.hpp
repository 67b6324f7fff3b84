// The one table that picks an all-reduce algorithm, by where the ranks run and the buffer's size,
// and the call that runs the pick. The rows are tried in order; the first that fits runs.
//
//   where the ranks run              | bytes                       | needs                | algorithm
//   ---------------------------------+-----------------------------+----------------------+-------------------------------
//   one host, one shared segment     | >= shared_memory_min_bytes  |                      | shared_memory
//   several hosts, some sharing      | <= direct_max_bytes         |                      | hierarchical, 1 part (one leader per host)
//   several hosts, some sharing      | any                         |                      | hierarchical, a part per rank of the smallest host
//   anywhere (TCP)                   | <= direct_max_bytes         |                      | direct
//   anywhere (TCP)                   | any                         | 2 ranks, 2 hosts     | direct
//   anywhere (TCP)                   | <= halving_doubling_max     | a power of two >= 4  | halving_doubling (nearest partners first)
//   anywhere (TCP)                   | any                         |                      | ring
//
// A hierarchical all-reduce's leaders of one part (one rank per host) all-reduce it across hosts by
// the TCP rows, with the part's size and one rank on each host. The TCP rows place ranks host by
// host (Topology::tcp_order). Why each row: docs/multi-worker.md and docs/performance.md.
#pragma once

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <span>
#include <vector>

#include <distribute/core/dtype.hpp>
#include <distribute/core/reduce_op.hpp>
#include <distribute/net/detail/collectives.hpp>
#include <distribute/net/detail/hierarchical_all_reduce.hpp>
#include <distribute/net/detail/topology.hpp>
#include <distribute/net/detail/transport.hpp>
#include <distribute/net/options.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net::detail {

enum class AllReduceAlgorithm { SharedMemory, Hierarchical, Direct, HalvingDoubling, Ring };

/// What the table sees of an all-reduce.
struct AllReduceCase {
  enum class Where { OneHostShared, HostsSharing, Tcp };
  Where where = Where::Tcp;
  std::size_t bytes = 0;
  int ranks = 0;  // taking part
  int hosts = 0;  // the hostnames they run on
};

/// The thresholds the rows name (options.hpp; shared_min is the segment creator's).
struct AllReduceLimits {
  std::size_t shared_min = 0;
  std::size_t direct_max = 0;
  std::size_t halving_doubling_max = 0;
};

struct AllReduceRow {
  enum class Where { OneHostShared, HostsSharing, Anywhere };
  enum class Needs { Nothing, TwoRanksTwoHosts, PowerOfTwoAtLeast4 };
  Where where;
  std::size_t AllReduceLimits::*min_bytes;  // null: no lower bound
  std::size_t AllReduceLimits::*max_bytes;  // null: no upper bound
  Needs needs;
  AllReduceAlgorithm algorithm;
  bool one_part;  // hierarchical: one leader per host instead of a part per rank of the smallest host
};

inline constexpr AllReduceRow kAllReduceTable[] = {
    {AllReduceRow::Where::OneHostShared, &AllReduceLimits::shared_min, nullptr, AllReduceRow::Needs::Nothing,
     AllReduceAlgorithm::SharedMemory, false},
    {AllReduceRow::Where::HostsSharing, nullptr, &AllReduceLimits::direct_max, AllReduceRow::Needs::Nothing,
     AllReduceAlgorithm::Hierarchical, true},
    {AllReduceRow::Where::HostsSharing, nullptr, nullptr, AllReduceRow::Needs::Nothing, AllReduceAlgorithm::Hierarchical,
     false},
    {AllReduceRow::Where::Anywhere, nullptr, &AllReduceLimits::direct_max, AllReduceRow::Needs::Nothing,
     AllReduceAlgorithm::Direct, false},
    {AllReduceRow::Where::Anywhere, nullptr, nullptr, AllReduceRow::Needs::TwoRanksTwoHosts, AllReduceAlgorithm::Direct,
     false},
    {AllReduceRow::Where::Anywhere, nullptr, &AllReduceLimits::halving_doubling_max,
     AllReduceRow::Needs::PowerOfTwoAtLeast4, AllReduceAlgorithm::HalvingDoubling, false},
    {AllReduceRow::Where::Anywhere, nullptr, nullptr, AllReduceRow::Needs::Nothing, AllReduceAlgorithm::Ring, false},
};

/// The first row of kAllReduceTable that fits (the last one always does).
inline const AllReduceRow& choose_all_reduce(const AllReduceCase& c, const AllReduceLimits& limits) {
  for (const AllReduceRow& row : kAllReduceTable) {
    const bool where = row.where == AllReduceRow::Where::Anywhere ||
                       (row.where == AllReduceRow::Where::OneHostShared && c.where == AllReduceCase::Where::OneHostShared) ||
                       (row.where == AllReduceRow::Where::HostsSharing && c.where == AllReduceCase::Where::HostsSharing);
    const bool needs = row.needs == AllReduceRow::Needs::Nothing ||
                       (row.needs == AllReduceRow::Needs::TwoRanksTwoHosts && c.ranks == 2 && c.hosts == 2) ||
                       (row.needs == AllReduceRow::Needs::PowerOfTwoAtLeast4 && halving_doubling_applies(c.ranks));
    if (where && needs && (row.min_bytes == nullptr || c.bytes >= limits.*row.min_bytes) &&
        (row.max_bytes == nullptr || c.bytes <= limits.*row.max_bytes)) {
      return row;
    }
  }
  return kAllReduceTable[std::size(kAllReduceTable) - 1];
}

inline const char* algorithm_name(AllReduceAlgorithm a) noexcept {
  switch (a) {
    case AllReduceAlgorithm::SharedMemory: return "shared_memory";
    case AllReduceAlgorithm::Hierarchical: return "hierarchical";
    case AllReduceAlgorithm::Direct: return "direct";
    case AllReduceAlgorithm::HalvingDoubling: return "halving_doubling";
    case AllReduceAlgorithm::Ring: return "ring";
  }
  return "?";
}

/// Runs the table's pick for this all-reduce and finishes the call. `count` > 0, more than one rank.
inline void all_reduce(Transport& tr, Call& op, const Topology& topo, std::byte* data, std::size_t count,
                       DType dtype, Reduction red, std::vector<std::byte>& scratch) {
  const CommunicatorOptions& o = tr.options();
  const std::size_t es = size_of(dtype), bytes = count * es;
  SharedMemoryAllReduce* const shm = topo.one_host_memory();
  AllReduceLimits limits;
  limits.shared_min = shm != nullptr ? shm->min_bytes() : 0;
  limits.direct_max = std::min(o.direct_max_bytes, o.max_frame_bytes);
  limits.halving_doubling_max = o.halving_doubling_max_bytes;
  AllReduceCase c;
  c.where = shm != nullptr          ? AllReduceCase::Where::OneHostShared
            : topo.hierarchical()  ? AllReduceCase::Where::HostsSharing
                                   : AllReduceCase::Where::Tcp;
  c.bytes = bytes;
  c.ranks = tr.size();
  c.hosts = topo.hostname_of.empty() ? 1 : static_cast<int>(std::count_if(topo.hostname_of.begin(), topo.hostname_of.end(),
                                                                  [k = 0](int h) mutable { return h == k++; }));
  const AllReduceRow& row = choose_all_reduce(c, limits);
  op.set_algorithm(algorithm_name(row.algorithm));
  const auto me = static_cast<int>(std::find(topo.tcp_order.begin(), topo.tcp_order.end(), tr.rank()) - topo.tcp_order.begin());
  const RankGroup everyone{topo.tcp_order, me};
  switch (row.algorithm) {
    case AllReduceAlgorithm::SharedMemory:
      op.count_bytes(bytes, bytes);  // this rank's values into the segment, the result out of it
      shared_memory_all_reduce(tr, op, *shm, data, count, dtype, red);
      break;
    case AllReduceAlgorithm::Hierarchical: {
      const int slices = row.one_part ? 1 : topo.fewest_per_host();
      const int hosts = static_cast<int>(topo.hosts.size());
      // Each part's leaders: one rank on each host, the part's size (the first part is the longest).
      const AllReduceCase leaders{AllReduceCase::Where::Tcp, even_part(count, slices, 0).second * es, hosts, hosts};
      const AllReduceAlgorithm a = choose_all_reduce(leaders, limits).algorithm;
      const AcrossHosts across = a == AllReduceAlgorithm::HalvingDoubling ? AcrossHosts::HalvingDoubling
                                 : a == AllReduceAlgorithm::Ring          ? AcrossHosts::Ring
                                                                          : AcrossHosts::Direct;
      hierarchical_all_reduce(tr, op, topo, slices, across, data, count, dtype, red, scratch);
      break;
    }
    case AllReduceAlgorithm::Direct:
      direct_all_reduce(tr, op, everyone, data, count, dtype, red, scratch);
      break;
    case AllReduceAlgorithm::HalvingDoubling:
      halving_doubling_all_reduce(tr, op, everyone, data, count, dtype, red, scratch);
      break;
    case AllReduceAlgorithm::Ring:
      ring_all_reduce(tr, op, everyone, data, count, dtype, red, scratch);
      break;
  }
  op.finish();
}

}  // namespace net::detail
DISTRIBUTE_END_NAMESPACE

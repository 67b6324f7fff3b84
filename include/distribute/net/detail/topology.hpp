// Where the ranks run, learnt once at construction, and the shared memory of each host.
//
// A rank's host is its hostname plus a shared-memory probe, not its address: every rank sends its
// hostname to rank 0, which sends back the table; the ranks of one hostname then try to map one
// segment that their lowest rank creates (the probe: a rank in another container or pid namespace
// with the same hostname cannot open it, or reads another nonce). Ranks whose probe failed count as
// hosts of their own, and a second table round through rank 0 tells every rank the final groups.
//
// A segment starts with the agreement's board (shared_memory_agreement.hpp), then the all-reduce's
// part (shared_memory_all_reduce.hpp). One group holding every rank: the board carries every
// collective's descriptor and the segment every all-reduce (Topology::one_host_memory). Several
// groups: each group's segment carries its part of the hierarchical all-reduce
// (Topology::host_memory, hierarchical_all_reduce.hpp) and the descriptors go over TCP.
// all_reduce.hpp's table reads the Topology to pick an algorithm.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif

#include <distribute/core/error.hpp>
#include <distribute/net/detail/auth.hpp>
#include <distribute/net/detail/shared_memory_agreement.hpp>
#include <distribute/net/detail/shared_memory_all_reduce.hpp>
#include <distribute/net/detail/shared_segment.hpp>
#include <distribute/net/detail/transport.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net::detail {

/// The largest slot a segment's creator offers or a rank accepts.
inline constexpr std::size_t kMaxSharedSlotBytes = std::size_t{1} << 30;

/// Every rank's `mine` (fixed-size records), in rank order: gathered by rank 0 over point-to-point
/// messages and sent back as one table (2(n-1) messages).
template <std::size_t N>
std::vector<std::array<std::byte, N>> exchange_through_root(Transport& tr, const std::array<std::byte, N>& mine) {
  const int n = tr.size(), r = tr.rank();
  std::vector<std::array<std::byte, N>> table(static_cast<std::size_t>(n));
  table[static_cast<std::size_t>(r)] = mine;
  auto bytes = [&](auto& v) { return std::as_writable_bytes(std::span(v)); };
  if (r == 0) {
    Call in(tr, "topology", 1);
    for (int k = 1; k < n; ++k) in.recv_p2p(k, table[static_cast<std::size_t>(k)]);
    in.finish();
    Call out(tr, "topology", 1);
    for (int k = 1; k < n; ++k) out.send_p2p(k, bytes(table));
    out.finish();
  } else {
    Call call(tr, "topology", 0);
    call.send_p2p(0, mine);
    call.recv_p2p(0, bytes(table));
    call.finish();
  }
  return table;
}

/// A host's segment as mapped by one of its ranks, and the all-reduce through it.
struct HostSegment {
  std::shared_ptr<SharedSegment> segment;
  std::unique_ptr<SharedMemoryAllReduce> all_reduce;
};

/// The bytes of a host's segment for `ranks` ranks and slots of `slot_bytes`: the board, then the
/// all-reduce's part, whose result slot ends the segment.
inline std::size_t host_segment_bytes(int ranks, std::size_t slot_bytes) {
  return SharedMemoryAgreement::board_bytes(ranks) + SharedMemoryAllReduce::part_bytes(ranks, slot_bytes);
}

/// Maps one segment among `members` (sorted ranks, this one among them; at least 2): the first
/// creates it and offers its path, a nonce written in it and its options; each other maps it and
/// answers whether that worked and the nonce matched; the first closes its handle and tells every
/// member whether all succeeded. Returns the segment, or null (TCP) where any failed. The members
/// of different groups run this at once: their messages never cross.
inline HostSegment setup_group_segment(Transport& tr, const std::vector<int>& members) {
  const int g = static_cast<int>(members.size());
  const int me = static_cast<int>(std::find(members.begin(), members.end(), tr.rank()) - members.begin());
  const int first = members[0];
  constexpr std::size_t kNameBytes = 64;
  // Offer: path (NUL-padded; empty: none), nonce, min_bytes, slot_bytes.
  std::array<std::byte, kNameBytes + kNonceBytes + 16> offer{};
  auto u64_at = [&](std::size_t at) -> std::byte* { return offer.data() + kNameBytes + kNonceBytes + at; };
  const CommunicatorOptions& o = tr.options();
  std::unique_ptr<SharedSegment> segment;
  std::size_t min_bytes = 0, slot_bytes = 0;
  if (me == 0) {
    min_bytes = o.shared_memory_min_bytes;
    // Whole cache lines (every slot stays aligned for every dtype), at most 1 GiB.
    slot_bytes = (std::clamp<std::size_t>(o.shared_memory_slot_bytes, 64, kMaxSharedSlotBytes) + 63) / 64 * 64;
    if (min_bytes > 0) {
      try {
        segment = SharedSegment::create(host_segment_bytes(g, slot_bytes));
        SharedMemoryAgreement::initialize(*segment, g);
        SharedMemoryAllReduce::initialize(*segment, SharedMemoryAgreement::board_bytes(g), g);
        const Nonce nonce = random_nonce();
        // The nonce sits where the result slot starts; the first all-reduce overwrites it.
        std::memcpy(segment->data() + segment->size() - slot_bytes, nonce.data(), nonce.size());
        std::memcpy(offer.data(), segment->name().data(), std::min(segment->name().size(), kNameBytes - 1));
        std::memcpy(offer.data() + kNameBytes, nonce.data(), nonce.size());
        std::memcpy(u64_at(0), &min_bytes, 8);
        std::memcpy(u64_at(8), &slot_bytes, 8);
      } catch (const Error&) {
        segment.reset();  // no offer: TCP only
      }
    }
  }
  std::uint64_t ok = 0;
  if (me == 0) {
    std::vector<std::uint64_t> answers(static_cast<std::size_t>(g), 0);
    {
      Call call(tr, "shared-memory set-up", members[1]);
      for (int k = 1; k < g; ++k) call.send_p2p(members[static_cast<std::size_t>(k)], offer);
      for (int k = 1; k < g; ++k) {
        call.recv_p2p(members[static_cast<std::size_t>(k)],
                      std::as_writable_bytes(std::span<std::uint64_t>(&answers[static_cast<std::size_t>(k)], 1)));
      }
      call.finish();
    }
    if (segment) segment->close_handle();
    ok = segment && std::all_of(answers.begin() + 1, answers.end(), [](std::uint64_t a) { return a == 1; }) ? 1 : 0;
    Call call(tr, "shared-memory set-up", members[1]);
    for (int k = 1; k < g; ++k) call.send_p2p(members[static_cast<std::size_t>(k)], std::as_bytes(std::span<const std::uint64_t>(&ok, 1)));
    call.finish();
  } else {
    Call call(tr, "shared-memory set-up", first);
    call.recv_p2p(first, offer);
    call.finish();
    std::uint64_t mapped = 0;
    const std::string name(reinterpret_cast<const char*>(offer.data()),
                           ::strnlen(reinterpret_cast<const char*>(offer.data()), kNameBytes));
    std::memcpy(&min_bytes, u64_at(0), 8);
    std::memcpy(&slot_bytes, u64_at(8), 8);
    if (!name.empty() && o.shared_memory_min_bytes > 0 && slot_bytes >= 64 && slot_bytes % 64 == 0 &&
        slot_bytes <= kMaxSharedSlotBytes) {
      try {
        segment = SharedSegment::open(name, host_segment_bytes(g, slot_bytes));
        mapped = std::memcmp(segment->data() + segment->size() - slot_bytes, offer.data() + kNameBytes, kNonceBytes) == 0 ? 1 : 0;
      } catch (const Error&) {
        segment.reset();
      }
    }
    Call answer(tr, "shared-memory set-up", first);
    answer.send_p2p(first, std::as_bytes(std::span<const std::uint64_t>(&mapped, 1)));
    answer.recv_p2p(first, std::as_writable_bytes(std::span<std::uint64_t>(&ok, 1)));
    answer.finish();
    if (mapped == 0) ok = 0;
  }
  if (ok != 1) return {};
  HostSegment host{std::shared_ptr<SharedSegment>(std::move(segment)), nullptr};
  host.all_reduce = std::make_unique<SharedMemoryAllReduce>(host.segment, SharedMemoryAgreement::board_bytes(g), g, me,
                                                            slot_bytes, min_bytes);
  return host;
}

/// This rank's hostname (at most 63 bytes; "" where it cannot be read).
inline std::string host_name() {
  char buf[256] = {};
#if defined(__unix__) || defined(__APPLE__)
  if (::gethostname(buf, sizeof buf - 1) != 0) return {};
#endif
  return std::string(buf).substr(0, 63);
}

/// Where the ranks run, as the collectives see it.
struct Topology {
  /// The hosts, each its ranks in ascending order, ordered by their lowest rank. Ranks of one
  /// hostname whose segment could not be shared (the probe failed, shared memory is off) are
  /// hosts of their own here. One host holding every rank: the transport's segment carries it.
  std::vector<std::vector<int>> hosts;
  /// Rank -> index in `hosts`.
  std::vector<int> host_of;
  /// Every rank, hostname by hostname (in the order of each hostname's lowest rank; ranks ascending
  /// inside): the order the TCP algorithms place ranks in, so that ring neighbours and
  /// halving-doubling's first partners share a host wherever they can.
  std::vector<int> tcp_order;
  /// Rank -> its hostname's index (by lowest rank); an unreadable hostname is a host of its own.
  std::vector<int> hostname_of;
  /// This rank's host's segment, its agreement's board included (null: it is alone on its host,
  /// or its host's ranks could not share one), and the all-reduce through it.
  std::shared_ptr<SharedSegment> host_segment;
  std::unique_ptr<SharedMemoryAllReduce> host_memory;

  /// Every rank on one host, sharing one segment: its all-reduce (null otherwise).
  SharedMemoryAllReduce* one_host_memory() const noexcept { return hosts.size() == 1 ? host_memory.get() : nullptr; }

  /// Several hosts, and some hold ranks that share a segment: all-reduces go hierarchically.
  bool hierarchical() const noexcept {
    return hosts.size() > 1 && std::any_of(hosts.begin(), hosts.end(), [](const auto& h) { return h.size() > 1; });
  }
  /// The fewest ranks any host holds: the slices a hierarchical all-reduce cuts a large buffer in.
  int fewest_per_host() const noexcept {
    std::size_t fewest = host_of.size();
    for (const auto& h : hosts) fewest = std::min(fewest, h.size());
    return static_cast<int>(fewest);
  }
};

/// Learns the hosts and maps each host's segment (see the header comment). Every rank runs this
/// once, right after the cluster has formed and before any other call.
inline Topology learn_topology(Transport& tr) {
  const int n = tr.size(), r = tr.rank();
  Topology topo;
  topo.hosts = {{}};
  for (int k = 0; k < n; ++k) topo.hosts[0].push_back(k);
  topo.host_of.assign(static_cast<std::size_t>(n), 0);
  topo.tcp_order = topo.hosts[0];
  topo.hostname_of.assign(static_cast<std::size_t>(n), 0);
  if (n == 1) return topo;
  std::array<std::byte, 64> mine{};
  const std::string host = host_name();
  std::memcpy(mine.data(), host.data(), host.size());
  const auto names = exchange_through_root(tr, mine);
  // An unreadable hostname shares with no one.
  auto same_name = [&](int a, int b) {
    const auto ua = static_cast<std::size_t>(a), ub = static_cast<std::size_t>(b);
    return a == b || (names[ua][0] != std::byte{0} && names[ua] == names[ub]);
  };
  for (int k = 0; k < n; ++k) {
    int first = k;
    for (int j = 0; j < k; ++j) {
      if (same_name(j, k)) {
        first = j;
        break;
      }
    }
    topo.hostname_of[static_cast<std::size_t>(k)] = first;
  }
  topo.tcp_order.clear();
  for (int k = 0; k < n; ++k) {
    if (topo.hostname_of[static_cast<std::size_t>(k)] != k) continue;
    for (int j = k; j < n; ++j) {
      if (topo.hostname_of[static_cast<std::size_t>(j)] == k) topo.tcp_order.push_back(j);
    }
  }
  std::vector<int> members;
  for (int k = 0; k < n; ++k) {
    if (same_name(k, r)) members.push_back(k);
  }
  HostSegment shm;
  if (members.size() >= 2) shm = setup_group_segment(tr, members);
  // Final groups: a rank's group is named by its lowest member, or by itself where the probe failed.
  std::array<std::byte, 8> group{};
  const std::uint64_t leader = static_cast<std::uint64_t>(shm.segment ? members[0] : r);
  std::memcpy(group.data(), &leader, 8);
  const auto groups = exchange_through_root(tr, group);
  topo.hosts.clear();
  for (int k = 0; k < n; ++k) {
    std::uint64_t g = 0;
    std::memcpy(&g, groups[static_cast<std::size_t>(k)].data(), 8);
    if (static_cast<int>(g) == k) {
      topo.host_of[static_cast<std::size_t>(k)] = static_cast<int>(topo.hosts.size());
      topo.hosts.push_back({k});
    } else {
      // A group's leader is its lowest rank: its host is already listed.
      const int h = topo.host_of[static_cast<std::size_t>(g)];
      topo.host_of[static_cast<std::size_t>(k)] = h;
      topo.hosts[static_cast<std::size_t>(h)].push_back(k);
    }
  }
  topo.host_segment = std::move(shm.segment);
  topo.host_memory = std::move(shm.all_reduce);
  return topo;
}

}  // namespace net::detail
DISTRIBUTE_END_NAMESPACE

// How the ranks of a mesh learn which collective each calls (its descriptor) when no shared
// memory carries the descriptors: every rank sends its own to rank 0 alone, and rank 0, once it
// holds every rank's, sends the whole table to every rank: 2(n-1) frames per collective instead of
// n(n-1), and every rank still compares every rank's call (the same pair is named everywhere). The
// table's entries count as each peer's descriptor. Guarded by the mesh's mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <distribute/net/detail/peer.hpp>
#include <distribute/net/detail/protocol.hpp>
#include <distribute/observe/timeline.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net::detail {

class DescriptorExchange {
 public:
  using Peers = std::vector<std::unique_ptr<Peer>>;

  /// A descriptor frame from `from` (collective `seq`) arrived: stores what it carries (rank 0: the
  /// peer's own; the others: rank 0's table). Throws FrameError for one that cannot be right.
  void receive_locked(Peers& peers, int rank, Peer& from, std::uint64_t seq, std::span<const std::byte> payload) {
    const std::size_t n = peers.size();
    auto store = [&](Peer& p, const Descriptor& d) {
      if (!p.descriptors.emplace(seq, d).second) {
        throw FrameError(fmt::format("second descriptor of {} for collective #{}", p.name(), seq));
      }
    };
    if (rank == 0) {
      if (payload.size() != kDescriptorBytes) {
        throw FrameError(fmt::format("descriptor frame of {} bytes (expected {})", payload.size(), kDescriptorBytes));
      }
      store(from, decode_descriptor(payload));
      relay_locked(peers, rank);
    } else {
      if (from.rank != 0 || payload.size() != n * kDescriptorBytes) {
        throw FrameError(fmt::format("descriptor frame of {} bytes from rank {} (only rank 0 sends them, {} bytes)",
                                     payload.size(), from.rank, n * kDescriptorBytes));
      }
      for (std::size_t r = 0; r < n; ++r) {
        if (static_cast<int>(r) == rank) continue;
        store(*peers[r], decode_descriptor(payload.subspan(r * kDescriptorBytes, kDescriptorBytes)));
      }
    }
    if (observe::timeline_enabled()) from.descriptor_at[seq] = Clock::now();
  }

  /// Rank 0's own call: its table goes out once every peer's descriptor is in (now, if they came first).
  void announce_root_locked(Peers& peers, int rank, std::uint64_t seq, const Descriptor& mine) {
    root_pending_.emplace(seq, mine);
    relay_locked(peers, rank);
  }

  // Whether a peer's descriptor must wake the waiting threads. A thread in Op::wait_until (the
  // ring) need not wake for one that agrees with its own call: it checks every descriptor once its
  // data is in, and a descriptor that disagrees still wakes it at once. Sparing that wake-up saves
  // two context switches per call where the caller and the io thread share a core.
  // Disagreement is judged once every descriptor is in, so the thread is woken for every
  // arrival (the last one included) while any descriptor of its call disagrees, whichever
  // came first.
  bool wakes_locked(const Peers& peers, std::uint64_t seq, int progress_waiters) const {
    if (progress_waiters > 0 || quiet_desc == nullptr || quiet_seq != seq) return true;
    for (const auto& p : peers) {
      const auto it = p->descriptors.find(seq);
      if (it != p->descriptors.end() && !compatible(*quiet_desc, it->second)) return true;
    }
    return false;
  }

  /// The call of the thread in Op::wait_until, if one is there (wakes_locked).
  const Descriptor* quiet_desc = nullptr;
  std::uint64_t quiet_seq = 0;

 private:
  // Rank 0: once its own call and every peer's descriptor of it are in, sends the table out.
  void relay_locked(Peers& peers, int rank) {
    if (!root_pending_) return;
    const std::uint64_t seq = root_pending_->first;
    for (const auto& p : peers) {
      if (p->rank != rank && p->descriptors.count(seq) == 0) return;
    }
    std::vector<std::byte> table;
    table.reserve(peers.size() * kDescriptorBytes);
    for (const auto& p : peers) {
      const auto bytes = encode(p->rank == rank ? root_pending_->second : p->descriptors.at(seq));
      table.insert(table.end(), bytes.begin(), bytes.end());
    }
    root_pending_.reset();
    for (auto& p : peers) {
      if (p->rank != rank && p->state() == Connection::State::Open) p->conn.enqueue_control_locked(FrameType::Descriptor, seq, table);
    }
  }

  // Rank 0: its call whose table is not sent yet.
  std::optional<std::pair<std::uint64_t, Descriptor>> root_pending_;
};

}  // namespace net::detail
DISTRIBUTE_END_NAMESPACE

// The agreement over TCP, for ranks on several hosts: every rank sends its descriptor of a
// collective to rank 0 alone, and rank 0, once it holds every rank's, sends the whole table to
// every rank: 2(n-1) frames per collective instead of n(n-1), and every rank still compares every
// rank's call (the same pair is named everywhere). The table's entries count as each peer's
// descriptor. Descriptor frames can come at any time after the mesh formed (a peer may call its
// first collective while this rank still learns the topology), so the transport owns this one and
// hands it every Descriptor frame.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <distribute/net/detail/agreement.hpp>
#include <distribute/net/detail/peer.hpp>
#include <distribute/net/detail/protocol.hpp>
#include <distribute/observe/timeline.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net::detail {

class TcpAgreement final : public Agreement {
 public:
  using Peers = std::vector<std::unique_ptr<Peer>>;

  /// `peers`: the mesh's, one for each of `size` ranks once it has formed (this one's included),
  /// guarded by the mesh's mutex.
  TcpAgreement(Peers& peers, int rank, int size)
      : peers_(peers), rank_(rank), received_(static_cast<std::size_t>(size)), arrived_at_(static_cast<std::size_t>(size)) {}

  void announce(std::unique_lock<NotifyingMutex>& lk, std::uint64_t seq, const Descriptor& mine) override {
    if (rank_ == 0) {
      root_pending_.emplace(seq, mine);  // sent when every peer's is in
      relay();
      return;
    }
    OutFrame f;
    f.owned = encode(mine);
    f.set_header(FrameHeader{FrameType::Descriptor, f.owned.size(), seq, 0});
    f.size = f.owned.size();
    peers_[0]->conn.send_now_or_enqueue(lk, std::move(f));
  }

  bool joined(int r, std::uint64_t seq) const override { return received(r).count(seq) != 0; }

  Arrival collect(int r, std::uint64_t seq) override {
    auto& from = received(r);
    auto it = from.find(seq);
    Arrival a{it->second};
    from.erase(it);
    auto& times = arrived_at_[static_cast<std::size_t>(r)];
    if (auto at = times.find(seq); at != times.end()) {
      a.at_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(at->second.time_since_epoch()).count();
      times.erase(times.begin(), std::next(at));
    }
    return a;
  }

  // Descriptor frames wake the mutex (receive()): nothing to poll.
  std::uint32_t mark() const noexcept override { return 0; }

  void wait(std::unique_lock<NotifyingMutex>& lk, std::uint32_t, std::optional<std::chrono::steady_clock::time_point> deadline, bool,
            int) override {
    if (deadline) {
      lk.mutex()->wait_until(lk, *deadline);
    } else {
      lk.mutex()->wait(lk);
    }
  }

  bool quiet_begin(const Descriptor& mine, std::uint64_t seq) override {
    if (quiet_desc_ != nullptr) return false;
    quiet_desc_ = &mine;
    quiet_seq_ = seq;
    return true;
  }
  void quiet_end() override { quiet_desc_ = nullptr; }

  /// A descriptor frame from `from` (collective `seq`) arrived: stores what it carries (rank 0: the
  /// peer's own; the others: rank 0's table). Returns whether it must wake the waiting threads
  /// (`progress_waiters`: those that want waking on any progress). Throws FrameError for a frame
  /// that cannot be right.
  bool receive(const Peer& from, std::uint64_t seq, std::span<const std::byte> payload, int progress_waiters) {
    const std::size_t n = peers_.size();
    auto store = [&](int r, const Descriptor& d) {
      if (!received(r).emplace(seq, d).second) {
        throw FrameError(fmt::format("second descriptor of {} for collective #{}", peers_[static_cast<std::size_t>(r)]->name(), seq));
      }
    };
    if (rank_ == 0) {
      if (payload.size() != kDescriptorBytes) {
        throw FrameError(fmt::format("descriptor frame of {} bytes (expected {})", payload.size(), kDescriptorBytes));
      }
      store(from.rank, decode_descriptor(payload));
      relay();
    } else {
      if (from.rank != 0 || payload.size() != n * kDescriptorBytes) {
        throw FrameError(fmt::format("descriptor frame of {} bytes from rank {} (only rank 0 sends them, {} bytes)",
                                     payload.size(), from.rank, n * kDescriptorBytes));
      }
      for (std::size_t r = 0; r < n; ++r) {
        if (static_cast<int>(r) == rank_) continue;
        store(static_cast<int>(r), decode_descriptor(payload.subspan(r * kDescriptorBytes, kDescriptorBytes)));
      }
    }
    if (observe::timeline_enabled()) arrived_at_[static_cast<std::size_t>(from.rank)][seq] = Clock::now();
    return wakes(seq, progress_waiters);
  }

 private:
  std::map<std::uint64_t, Descriptor>& received(int r) { return received_[static_cast<std::size_t>(r)]; }
  const std::map<std::uint64_t, Descriptor>& received(int r) const { return received_[static_cast<std::size_t>(r)]; }

  // Whether a peer's descriptor must wake the waiting threads. A thread in Call::wait_until (the
  // ring) need not wake for one that agrees with its own call: it checks every descriptor once its
  // data is in, and a descriptor that disagrees still wakes it at once. Sparing that wake-up saves
  // two context switches per call where the caller and the io thread share a core.
  // Disagreement is judged once every descriptor is in, so the thread is woken for every
  // arrival (the last one included) while any descriptor of its call disagrees, whichever
  // came first.
  bool wakes(std::uint64_t seq, int progress_waiters) const {
    if (progress_waiters > 0 || quiet_desc_ == nullptr || quiet_seq_ != seq) return true;
    for (const auto& by_seq : received_) {
      const auto it = by_seq.find(seq);
      if (it != by_seq.end() && !compatible(*quiet_desc_, it->second)) return true;
    }
    return false;
  }

  // Rank 0: once its own call and every peer's descriptor of it are in, sends the table out.
  void relay() {
    if (!root_pending_) return;
    const std::uint64_t seq = root_pending_->first;
    for (const auto& p : peers_) {
      if (p->rank != rank_ && !joined(p->rank, seq)) return;
    }
    std::vector<std::byte> table;
    table.reserve(peers_.size() * kDescriptorBytes);
    for (const auto& p : peers_) {
      const auto bytes = encode(p->rank == rank_ ? root_pending_->second : received(p->rank).at(seq));
      table.insert(table.end(), bytes.begin(), bytes.end());
    }
    root_pending_.reset();
    for (auto& p : peers_) {
      if (p->rank != rank_ && p->state() == Connection::State::Open) p->conn.enqueue_control_locked(FrameType::Descriptor, seq, table);
    }
  }

  Peers& peers_;
  int rank_;
  // Every rank's descriptors received and not yet collected, by rank then collective.
  std::vector<std::map<std::uint64_t, Descriptor>> received_;
  // When each of those arrived: kept only while the timeline records (waiting vs moving data).
  std::vector<std::map<std::uint64_t, Clock::time_point>> arrived_at_;
  // Rank 0: its call whose table is not sent yet.
  std::optional<std::pair<std::uint64_t, Descriptor>> root_pending_;
  // The call of the thread in Call::wait_until, if one is there (wakes()).
  const Descriptor* quiet_desc_ = nullptr;
  std::uint64_t quiet_seq_ = 0;
};

}  // namespace net::detail
DISTRIBUTE_END_NAMESPACE

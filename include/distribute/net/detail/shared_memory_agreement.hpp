// The agreement through shared memory, for communicators whose ranks all run on one host: every
// rank writes its descriptor of each collective on its line of a board at the start of the host's
// segment (topology.hpp maps it) and reads everyone's there, whatever path the call's data takes:
// no descriptor frames at all. Failures still come through the sockets, which is why a wait here
// is bounded (1 ms) and the call looks at the transport between two waits.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <optional>
#include <thread>

#if defined(__linux__)
#include <climits>
#include <ctime>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <distribute/net/detail/agreement.hpp>
#include <distribute/net/detail/shared_segment.hpp>
#include <distribute/observe/timeline.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net::detail {

/// A rank's descriptor of collective `seq`. Two per rank (by seq % 2) suffice: a rank announces
/// seq + 2 only after every rank finished seq + 1, which each did only after reading every
/// announcement of seq.
struct SharedAnnouncement {
  std::atomic<std::uint64_t> seq1{0};  // seq + 1 once the fields below are written (0: none yet)
  std::uint64_t count = 0;
  std::uint32_t root = 0;
  std::uint8_t kind = 0, dtype = 0, op = 0;
};

/// The board's head: bumped by every announcement, and a futex word that a rank waiting for
/// announcements sleeps on (`waiters` of them: an announcement wakes them only when there are).
struct SharedBoardHead {
  alignas(64) std::atomic<std::uint32_t> epoch{0};
  std::atomic<std::uint32_t> waiters{0};
};

/// One rank's line of the board.
struct SharedAnnouncementLine {
  alignas(64) SharedAnnouncement by_parity[2];
};

static_assert(sizeof(std::atomic<std::uint32_t>) == 4, "a futex word is 32 bits");
static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "shared-memory counters must be lock-free");

// A futex on a word in memory that several processes map (not FUTEX_PRIVATE): the waiter sleeps
// in the kernel until another process's wake or the timeout. Elsewhere: a short sleep.
inline void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t seen, std::chrono::microseconds timeout) noexcept {
#if defined(__linux__)
  const auto us = timeout.count();
  ::timespec ts{static_cast<std::time_t>(us / 1000000), static_cast<long>(us % 1000000) * 1000};
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT, seen, &ts, nullptr, 0);
#else
  (void)word;
  (void)seen;
  std::this_thread::sleep_for(std::min(timeout, std::chrono::microseconds(50)));
#endif
}
inline void futex_wake(std::atomic<std::uint32_t>& word) noexcept {
#if defined(__linux__)
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
#else
  (void)word;
#endif
}

class SharedMemoryAgreement final : public Agreement {
 public:
  /// The board's size for `ranks` ranks (whole cache lines): the first bytes of the segment.
  static constexpr std::size_t board_bytes(int ranks) noexcept {
    return sizeof(SharedBoardHead) + static_cast<std::size_t>(ranks) * sizeof(SharedAnnouncementLine);
  }

  /// Constructs the board of a new segment: by its creator, before any other rank is told its name.
  static void initialize(SharedSegment& segment, int ranks) {
    new (segment.data()) SharedBoardHead;
    for (int r = 0; r < ranks; ++r) new (segment.data() + line_offset(r)) SharedAnnouncementLine;
  }

  /// `segment`: mapped by every rank of the communicator, its board initialized; this one is `rank`.
  SharedMemoryAgreement(std::shared_ptr<SharedSegment> segment, int rank) : segment_(std::move(segment)), rank_(rank) {}

  void announce(std::unique_lock<NotifyingMutex>&, std::uint64_t seq, const Descriptor& d) override {
    SharedAnnouncement& a = line(rank_).by_parity[seq % 2];
    a.count = d.count;
    a.root = d.root;
    a.kind = static_cast<std::uint8_t>(d.kind);
    a.dtype = static_cast<std::uint8_t>(d.dtype);
    a.op = static_cast<std::uint8_t>(d.op);
    a.seq1.store(seq + 1, std::memory_order_release);
    SharedBoardHead& h = head();
    h.epoch.fetch_add(1, std::memory_order_seq_cst);
    if (h.waiters.load(std::memory_order_seq_cst) > 0) futex_wake(h.epoch);
  }

  bool joined(int r, std::uint64_t seq) const override {
    return line(r).by_parity[seq % 2].seq1.load(std::memory_order_acquire) == seq + 1;
  }

  // The timeline's "waiting for peers" ends when this rank saw the last announcement.
  Arrival collect(int r, std::uint64_t seq) override {
    const SharedAnnouncement& a = line(r).by_parity[seq % 2];
    Descriptor d;
    d.kind = static_cast<CollectiveKind>(a.kind);
    d.dtype = static_cast<DType>(a.dtype);
    d.op = static_cast<ReduceOp>(a.op);
    d.root = a.root;
    d.count = a.count;
    return Arrival{d, observe::Timeline::now_ns()};
  }

  std::uint32_t mark() const noexcept override { return head().epoch.load(std::memory_order_seq_cst); }

  // Announcements do not wake the transport's mutex. Waiting for them alone: sleeps on the board
  // until a rank announces a call after `mark` was read, or 1 ms passes (a failure comes through
  // the sockets, and is seen within that). Waiting for transfers too: on the mutex, which they
  // wake, for 20 us doubling to 1 ms.
  void wait(std::unique_lock<NotifyingMutex>& lk, std::uint32_t mark, std::optional<std::chrono::steady_clock::time_point> deadline,
            bool descriptors_only, int round) override {
    auto pause = descriptors_only ? std::chrono::microseconds(1000)
                                  : std::chrono::microseconds(std::min(1000, 20 << std::min(6, round)));
    if (deadline) {
      pause = std::clamp(std::chrono::duration_cast<std::chrono::microseconds>(*deadline - std::chrono::steady_clock::now()),
                         std::chrono::microseconds(1), pause);
    }
    if (!descriptors_only) {
      lk.mutex()->wait_until(lk, std::chrono::steady_clock::now() + pause);
      return;
    }
    lk.unlock();
    SharedBoardHead& h = head();
    h.waiters.fetch_add(1, std::memory_order_seq_cst);
    if (h.epoch.load(std::memory_order_seq_cst) == mark) futex_wait(h.epoch, mark, pause);
    h.waiters.fetch_sub(1, std::memory_order_seq_cst);
    lk.lock();
  }

 private:
  static constexpr std::size_t line_offset(int r) noexcept {
    return sizeof(SharedBoardHead) + static_cast<std::size_t>(r) * sizeof(SharedAnnouncementLine);
  }
  SharedBoardHead& head() const noexcept { return *std::launder(reinterpret_cast<SharedBoardHead*>(segment_->data())); }
  SharedAnnouncementLine& line(int r) const noexcept {
    return *std::launder(reinterpret_cast<SharedAnnouncementLine*>(segment_->data() + line_offset(r)));
  }

  std::shared_ptr<SharedSegment> segment_;
  int rank_;
};

}  // namespace net::detail
DISTRIBUTE_END_NAMESPACE

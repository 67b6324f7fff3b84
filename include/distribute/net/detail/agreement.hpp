// Agreement: how the ranks of a communicator learn which collective each one called, so that a
// mismatch (another kind, count, dtype, op or root) is named on every rank instead of corrupting
// data or hanging. Every collective call announces its descriptor; the call collects every rank's
// descriptor of it and compares them (call.hpp). Two implementations, chosen once when the
// communicator is built and its topology is known:
//   tcp_agreement.hpp            descriptor frames through rank 0 (ranks on several hosts)
//   shared_memory_agreement.hpp  a board in the host's shared segment (every rank on one host)
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>

#include <distribute/net/detail/notifying_mutex.hpp>
#include <distribute/net/detail/protocol.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net::detail {

/// The agreement on each collective's descriptor. Every member runs with the transport's mutex
/// held (`lk`), from the thread making the call.
class Agreement {
 public:
  /// A rank's descriptor, and when it arrived on the timeline's clock (ns; -1: not recorded).
  struct Arrival {
    Descriptor descriptor;
    std::int64_t at_ns = -1;
  };

  virtual ~Agreement() = default;

  /// Publishes this rank's descriptor of collective `seq`.
  virtual void announce(std::unique_lock<NotifyingMutex>& lk, std::uint64_t seq, const Descriptor& mine) = 0;

  /// Whether rank `r` (another rank) has announced collective `seq`.
  virtual bool joined(int r, std::uint64_t seq) const = 0;

  /// Rank `r`'s descriptor of `seq`, once joined(r, seq); each is collected once.
  virtual Arrival collect(int r, std::uint64_t seq) = 0;

  /// Taken before looking whether the descriptors are in, and handed to wait().
  virtual std::uint32_t mark() const noexcept = 0;

  /// Waits, the mutex released meanwhile, until an announcement may have come after `mark`, a
  /// transfer or failure woke the mutex, or `deadline` passes. `descriptors_only`: nothing but the
  /// announcements is awaited (no transfer of the call is pending); `round` counts the waits of
  /// this look, for a back-off.
  virtual void wait(std::unique_lock<NotifyingMutex>& lk, std::uint32_t mark, std::optional<std::chrono::steady_clock::time_point> deadline,
                    bool descriptors_only, int round) = 0;

  /// A thread waiting for its data of `seq` need not be woken by announcements that agree with
  /// `mine` (it checks them once its data is in): true when this agreement took note (it then
  /// wakes only for a disagreeing one), until quiet_end().
  virtual bool quiet_begin(const Descriptor& mine, std::uint64_t seq) {
    (void)mine;
    (void)seq;
    return false;
  }
  virtual void quiet_end() {}

 protected:
  Agreement() = default;
  Agreement(const Agreement&) = default;
  Agreement& operator=(const Agreement&) = default;
};

}  // namespace net::detail
DISTRIBUTE_END_NAMESPACE

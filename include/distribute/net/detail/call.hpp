// One call on the transport: a collective (numbered, its descriptor announced through the
// communicator's agreement and checked against every rank's) or a point-to-point send or receive.
// It owns the transfers it starts, waits for them under the call's deadline, turns failures into
// the communicator's error, and, when it ends by an exception, makes sure the io thread no longer
// touches the caller's memory before the caller's frame unwinds. It uses the transport through the
// members under "for calls" (mesh.hpp) and the agreement through its interface (agreement.hpp).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/error.hpp>
#include <distribute/net/detail/agreement.hpp>
#include <distribute/net/detail/mesh.hpp>
#include <distribute/net/detail/observed_kinds.hpp>
#include <distribute/observe/call_observation.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net::detail {

/// One call on the transport (a collective, or a point-to-point send/recv): it owns the transfers
/// it starts. If it ends by an exception, its destructor makes sure the io thread no longer
/// touches the caller's memory before the caller's frame unwinds.
class Call {
 public:
  /// A collective: takes the next collective number and announces `desc` through `agreement`.
  Call(Transport& t, Agreement& agreement, const Descriptor& desc)
      : t_(t), agreement_(&agreement), mine_(desc), observation_(observed_kind(desc.kind)) {
    auto lk = t_.lock();
    label_ = fmt::format("{} #{}", to_string(desc.kind), t_.next_collective_locked());
    if (t_.failure_locked()) fail_at_start(lk);
    seq_ = t_.claim_collective_locked();
    start();
    if (t_.size() > 1) agreement_->announce(lk, seq_, desc);
  }

  /// Point-to-point with `peer`; `kind` (Send or Recv) counts it in the metrics and timeline,
  /// unset leaves it out (the transport's own set-up messages).
  Call(Transport& t, std::string label, int peer, std::optional<observe::CallKind> kind = std::nullopt)
      : t_(t), label_(std::move(label)), observation_(kind.value_or(observe::CallKind::Send), kind.has_value()) {
    if (peer < 0 || peer >= t_.size() || peer == t_.rank()) {
      throw InvalidArgument(fmt::format("{}: peer {} is not another rank of this cluster of {} (this is rank {})", label_,
                                        peer, t_.size(), t_.rank()));
    }
    auto lk = t_.lock();
    if (t_.failure_locked()) fail_at_start(lk);
    start();
  }

  ~Call() {
    if (!finished_) {
      abandon();
      if (observation_.active()) report(true);
    }
  }

  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;

  std::uint64_t seq() const noexcept { return seq_; }

  /// Names the algorithm or path this call takes, for the timeline ("ring", "shared_memory"...).
  void set_algorithm(const char* name) noexcept { observation_.set_algorithm(name); }

  /// Counts bytes moved outside the transport's frames (through shared memory), for the metrics.
  void count_bytes(std::size_t sent, std::size_t received) {
    if (!observation_.active()) return;
    const auto lk = t_.lock();
    observation_.count(sent, received);
  }

  /// Unless finish() completed: stops this call's transfers and waits until neither the io thread
  /// nor a continuation touches the caller's memory (what the destructor does). An algorithm
  /// whose continuations use its own locals calls it before those go out of scope
  /// (ContinuationScope).
  void abandon_unless_finished() noexcept {
    if (!finished_) abandon();
  }

  /// Sends `data` (kept alive and unchanged by the caller until finish()) as a Data frame.
  TransferPtr send(int peer, std::uint64_t tag, std::span<const std::byte> data) {
    return send_frame(peer, MsgKey{FrameType::Data, seq_, tag}, data);
  }

  /// Like send(), but only the io thread writes the frame: directly when called there (from a
  /// continuation), else queued for it. For memory that a later receive of the same call
  /// overwrites: the io thread's own write then happens before its read into that memory, which
  /// the peer's causality alone guarantees but a race detector cannot see.
  TransferPtr send_by_io_thread(int peer, std::uint64_t tag, std::span<const std::byte> data) {
    return send_frame(peer, MsgKey{FrameType::Data, seq_, tag}, data, t_.on_io_thread());
  }

  /// Posts a receive of exactly `dst.size()` bytes. `on_arrival`, when given, runs once the bytes
  /// are in `dst`, on whichever thread completed the receive (the io thread, or this one when the
  /// frame was already here), before the receive counts as done. It may send and post receives
  /// on this call; it must not wait, and it may run concurrently with this thread and with other
  /// continuations. It returns true when what wait_until() waits for may now hold. Once the call
  /// is being abandoned, its sends and receives fail without starting.
  TransferPtr recv(int peer, std::uint64_t tag, std::span<std::byte> dst, std::function<bool()> on_arrival = {}) {
    return recv_frame(peer, MsgKey{FrameType::Data, seq_, tag}, dst, false, std::move(on_arrival));
  }

  TransferPtr send_p2p(int peer, std::span<const std::byte> data) {
    std::uint64_t n = 0;
    {
      const auto lk = t_.lock();
      n = t_.claim_message_to_locked(peer);
    }
    return send_frame(peer, MsgKey{FrameType::PointToPoint, n, 0}, data);
  }

  TransferPtr recv_p2p(int peer, std::span<std::byte> dst) {
    return recv_frame(peer, MsgKey{FrameType::PointToPoint, 0, 0}, dst, true);
  }

  /// Waits until `t` is done; throws the communicator's failure, a timeout, or a mismatch.
  void wait(const TransferPtr& t) {
    auto lk = t_.lock();
    block(lk, [&] { return settled_locked(*t); }, t->peer, t->is_send ? "a send to" : "data from");
  }

  /// Waits until `done()` holds, for state that continuations update: checked under the
  /// transport's mutex when a continuation returns true (not on every completed transfer), and on
  /// failures and descriptors. Throws like wait(), and for a failed transfer of this call.
  /// `waiting_on` names the peer in a timeout's message.
  template <class Done>
  void wait_until(Done&& done, int waiting_on) {
    auto lk = t_.lock();
    quiet_ = true;
    const bool noted = collective_ && agreement_->quiet_begin(mine_, seq_);
    struct Loud {  // destroyed before lk: runs with the mutex held
      Call& call;
      bool noted;
      ~Loud() {
        call.quiet_ = false;
        if (noted) call.agreement_->quiet_end();
      }
    } loud{*this, noted};
    block(
        lk,
        [&] {
          // By index: a continuation may append transfers whenever the mutex is released.
          for (std::size_t i = 0; i < transfers_.size(); ++i) {
            if (transfers_[i]->state == Transfer::State::Failed) (void)settled_locked(*transfers_[i]);
          }
          return done();
        },
        waiting_on, "data from");
  }

  /// For an algorithm that waits outside the transport (shared memory): throws what a wait would
  /// throw now (the communicator's failure, a mismatch once every descriptor is in, a passed
  /// deadline) without waiting. `waiting_on`: as for wait_until, or -1 (every rank).
  void check_progress(int waiting_on) {
    const auto lk = t_.lock();
    if (t_.failure_locked()) raise_failure_locked();
    if (collective_) poll_descriptors_locked();
    if (deadline_ && Clock::now() >= *deadline_) time_out_locked(waiting_on, "data from");
  }

  /// Poisons the communicator with `message` (sent to every peer) and throws it.
  [[noreturn]] void fail(FailureKind kind, std::string message) {
    const auto lk = t_.lock();
    t_.fail_locked(Failure{kind, std::move(message)}, true);
    raise_failure_locked();
  }

  /// Every rank's descriptor of this collective, by rank (they agree; a mismatch throws).
  const std::vector<Descriptor>& descriptors() {
    auto lk = t_.lock();
    agreement_only_ = true;
    block(lk, [&] { return descs_ok_; }, -1, "");
    agreement_only_ = false;
    return all_;
  }

  /// Waits for every transfer started so far (continuations included) and goes on: for an
  /// algorithm run as one step of a larger one, which finish() ends.
  void settle() {
    auto lk = t_.lock();
    settle_locked(lk);
  }

  /// Waits for every transfer and, for a collective, every peer's agreeing descriptor. After it
  /// the transport holds no reference to the caller's memory.
  void finish() {
    auto lk = t_.lock();
    settle_locked(lk);
    if (collective_) {
      agreement_only_ = true;
      block(lk, [&] { return descs_ok_; }, -1, "");
    }
    transfers_.clear();
    finished_ = true;
    lk.unlock();
    if (observation_.active()) report(false);
  }

 private:
  void settle_locked(std::unique_lock<NotifyingMutex>& lk) {
    // By index: a continuation may append transfers whenever the mutex is released.
    for (std::size_t i = 0; i < transfers_.size(); ++i) {
      const TransferPtr t = transfers_[i];
      block(lk, [&] { return settled_locked(*t); }, t->peer, t->is_send ? "a send to" : "data from");
    }
    transfers_.clear();
  }

  void start() {
    if (t_.options().operation_timeout) deadline_ = Clock::now() + *t_.options().operation_timeout;
    observation_.begin(t_.metrics());
  }

  // A call on a broken communicator: observed like one that failed, then its error.
  [[noreturn]] void fail_at_start(std::unique_lock<NotifyingMutex>& lk) {
    start();
    if (observation_.active()) {
      lk.unlock();
      report(true);
      lk.lock();
    }
    raise_failure_locked();
  }

  // The call's end, into the metrics and the timeline (once).
  void report(bool failed) noexcept {
    std::string error;
    try {
      if (failed && observe::timeline_enabled()) {
        const auto lk = t_.lock();
        error = t_.failure_locked() ? t_.failure_locked()->message : std::string("ended by an error");
      }
    } catch (...) {
      // Observing must never turn a call's outcome into another error.
    }
    const std::size_t bytes = !collective_ ? std::max(observation_.sent(), observation_.received())
                              : mine_.kind == CollectiveKind::AllReduce ? mine_.count * size_of(mine_.dtype)
                                                                        : mine_.count;
    observation_.report(t_.metrics(), collective_ ? static_cast<std::int64_t>(seq_) : -1, bytes, failed, error);
  }

  TransferPtr send_frame(int peer, const MsgKey& key, std::span<const std::byte> data, bool direct = true) {
    check_frame_size(data.size());
    auto t = std::make_shared<Transfer>();
    t->is_send = true;
    t->peer = peer;
    t->key = key;
    t->size = data.size();
    OutFrame f;
    f.set_header(FrameHeader{key.type, data.size(), key.seq, key.tag});
    f.payload = data.data();
    f.size = data.size();
    f.transfer = t;
    auto lk = t_.lock();
    transfers_.push_back(t);
    if (abandoning_) {
      t->state = Transfer::State::Failed;
      return t;
    }
    observation_.count(data.size(), 0);
    t_.post_send_locked(lk, peer, std::move(f), direct);
    return t;
  }

  TransferPtr recv_frame(int peer, MsgKey key, std::span<std::byte> dst, bool p2p, std::function<bool()> on_arrival = {}) {
    check_frame_size(dst.size());
    auto t = std::make_shared<Transfer>();
    t->peer = peer;
    t->key = key;
    t->dst = dst.data();
    t->size = dst.size();
    t->on_arrival = std::move(on_arrival);
    auto lk = t_.lock();
    transfers_.push_back(t);
    if (abandoning_) {
      t->state = Transfer::State::Failed;
      return t;
    }
    observation_.count(0, dst.size());
    t_.post_receive_locked(lk, t, p2p);
    return t;
  }

  void check_frame_size(std::size_t bytes) const {
    if (bytes > t_.options().max_frame_bytes) {
      throw InvalidArgument(fmt::format("{}: a message of {} bytes exceeds max_frame_bytes ({})", label_, bytes,
                                        t_.options().max_frame_bytes));
    }
  }

  [[noreturn]] void raise_failure_locked() const {
    const Failure& f = *t_.failure_locked();
    raise(f.kind, fmt::format("{}: {}", label_, f.message));
  }

  bool settled_locked(const Transfer& t) {
    switch (t.state) {
      case Transfer::State::Done: return true;
      case Transfer::State::Failed:
        if (t.error.kind == FailureKind::Mismatch) {
          // A point-to-point size mismatch consumed the message: the streams are still in step.
          if (!collective_) raise(FailureKind::Mismatch, fmt::format("{}: {}", label_, t.error.message));
          // In a collective the descriptors (sent ahead of the data) say precisely what differs.
          if (!mismatch_) mismatch_ = t.error;
          return false;
        }
        t_.fail_locked(t.error, true);
        raise_failure_locked();
      default: return false;
    }
  }

  template <class Done>
  void block(std::unique_lock<NotifyingMutex>& lk, Done&& done, int waiting_on, std::string_view what) {
    int polls = 0;
    for (;;) {
      // Taken before the announcements are looked at (the agreement's wait then returns at once
      // if one came since).
      const std::uint32_t mark = collective_ ? agreement_->mark() : 0;
      if (done()) return;
      if (t_.failure_locked()) raise_failure_locked();
      if (collective_) {
        poll_descriptors_locked();
        if (descs_ok_ && mismatch_) {
          t_.fail_locked(*mismatch_, true);
          raise_failure_locked();
        }
        if (done()) return;  // the poll may have been what it waited for
      }
      const auto waiter = t_.progress_waiter(!quiet_);
      if (deadline_ && Clock::now() >= *deadline_) time_out_locked(waiting_on, what);
      if (collective_ && !descs_ok_) {
        agreement_->wait(lk, mark, deadline_, agreement_only_, polls++);
      } else if (deadline_) {
        lk.mutex()->wait_until(lk, *deadline_);
      } else {
        lk.mutex()->wait(lk);
      }
    }
  }

  [[noreturn]] void time_out_locked(int waiting_on, std::string_view what) {
    const std::string waiting = waiting_on >= 0 ? fmt::format("{} {}", what, t_.task_name(waiting_on)) : missing_locked();
    t_.fail_locked(Failure{FailureKind::Timeout,
                           fmt::format("did not complete within {} ms ({} was waiting for {}{})",
                                       t_.options().operation_timeout->count(), t_.me(), waiting, t_.silent_peers_locked())},
                   true);
    raise_failure_locked();
  }

  // Who has not announced this collective yet (for timeout messages).
  std::string missing_locked() const {
    if (descs_ok_) return "the other ranks";
    std::string names;
    for (int r = 0; r < t_.size(); ++r) {
      if (r == t_.rank() || agreement_->joined(r, seq_)) continue;
      names += (names.empty() ? "" : ", ") + t_.task_name(r);
    }
    return names.empty() ? std::string("the other ranks") : fmt::format("{} to join", names);
  }

  void poll_descriptors_locked() {
    if (descs_ok_) return;
    for (int r = 0; r < t_.size(); ++r) {
      if (r == t_.rank() || agreement_->joined(r, seq_)) continue;
      if (!t_.peer_open_locked(r)) {
        t_.fail_locked(Failure{FailureKind::Peer, fmt::format("{} ({}) closed its communicator before joining collective #{}",
                                                              t_.task_name(r), t_.address(r), seq_)},
                       true);
        raise_failure_locked();
      }
      return;
    }
    all_.assign(static_cast<std::size_t>(t_.size()), Descriptor{});
    for (int r = 0; r < t_.size(); ++r) {
      if (r == t_.rank()) {
        all_[static_cast<std::size_t>(r)] = mine_;
        continue;
      }
      const Agreement::Arrival a = agreement_->collect(r, seq_);
      all_[static_cast<std::size_t>(r)] = a.descriptor;
      // The timeline's "waiting for peers" ends when the last descriptor came.
      if (a.at_ns >= 0) observation_.joined_at(a.at_ns);
    }
    descs_ok_ = true;
    // Every rank compares every rank against rank 0 in rank order, so all report the same pair.
    for (std::size_t r = 1; r < all_.size(); ++r) {
      if (!compatible(all_[0], all_[r])) {
        t_.fail_locked(Failure{FailureKind::Mismatch,
                               fmt::format("mismatched collectives at collective #{}: {} called {} but {} called {}", seq_,
                                           t_.task_name(0), describe(all_[0]), t_.task_name(static_cast<int>(r)),
                                           describe(all_[r]))},
                       true);
        raise_failure_locked();
      }
    }
  }

  void abandon() noexcept {
    try {
      auto lk = t_.lock();
      abandoning_ = true;  // continuations still running start nothing new
      for (const auto& t : transfers_) {
        if (t->state != Transfer::State::Queued) continue;
        t_.cancel_locked(t);
        t->state = Transfer::State::Failed;
      }
      auto busy = [&] {
        return std::any_of(transfers_.begin(), transfers_.end(),
                           [](const TransferPtr& t) { return t->state == Transfer::State::Active; });
      };
      const auto waiter = t_.progress_waiter(true);
      if (!lk.mutex()->wait_for(lk, kAbandonGrace, [&] { return !busy(); })) {
        // A peer that neither reads nor writes (stopped) holds our memory in a socket call: cut it.
        std::set<int> stuck;
        for (const auto& t : transfers_) {
          if (t->state == Transfer::State::Active) stuck.insert(t->peer);
        }
        for (int r : stuck) t_.cut(r, "connection cut: it stopped exchanging data");
        lk.mutex()->wait(lk, [&] { return !busy(); });
      }
      transfers_.clear();
      finished_ = true;
    } catch (...) {
      // Only allocation can throw here; nothing better to do than carry on unwinding.
    }
  }

  Transport& t_;
  Agreement* agreement_ = nullptr;  // a collective's; null for point-to-point
  // Counts this call among those in flight for its whole life (after ~Call's abandon, too): the
  // event loop polls while there are any.
  ScopedCount<std::atomic<int>> in_flight_ = t_.call_in_flight();
  bool collective_ = agreement_ != nullptr;
  Descriptor mine_{};
  std::string label_;
  std::uint64_t seq_ = 0;
  std::optional<Clock::time_point> deadline_;
  std::vector<TransferPtr> transfers_;
  std::vector<Descriptor> all_;
  bool descs_ok_ = false;
  std::optional<Failure> mismatch_;
  bool finished_ = false;
  bool abandoning_ = false;
  bool quiet_ = false;  // in wait_until: only continuations that ask for it wake this thread
  bool agreement_only_ = false;  // in block() for the descriptors alone (the agreement's wait)
  observe::CallObservation observation_;
};

/// Declared after the locals that a call's continuations capture: if the scope is left by an
/// exception, the call is abandoned while those locals still exist. An algorithm that returns
/// normally has settled or finished the call first.
class ContinuationScope {
 public:
  explicit ContinuationScope(Call& op) noexcept : op_(op), unwinding_(std::uncaught_exceptions()) {}
  ~ContinuationScope() {
    if (std::uncaught_exceptions() > unwinding_) op_.abandon_unless_finished();
  }
  ContinuationScope(const ContinuationScope&) = delete;
  ContinuationScope& operator=(const ContinuationScope&) = delete;

 private:
  Call& op_;
  int unwinding_;
};

}  // namespace net::detail
DISTRIBUTE_END_NAMESPACE

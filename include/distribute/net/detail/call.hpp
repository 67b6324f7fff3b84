// One call on the transport: a collective (numbered, announced to every peer by its descriptor,
// and checked against theirs) or a point-to-point send or receive. It owns the transfers it starts,
// waits for them under the call's deadline, turns failures into the communicator's error, and,
// when it ends by an exception, makes sure the io thread no longer touches the caller's memory
// before the caller's frame unwinds.
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
#include <distribute/net/detail/mesh.hpp>
#include <distribute/net/detail/observed_kinds.hpp>
#include <distribute/observe/call_observation.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net::detail {

/// One call on the transport (a collective, or a point-to-point send/recv): it owns the transfers
/// it starts. If it ends by an exception, its destructor makes sure the io thread no longer
/// touches the caller's memory before the caller's frame unwinds.
class Transport::Op {
 public:
  /// A collective: takes the next collective number and announces `desc` to every peer.
  Op(Transport& t, const Descriptor& desc)
      : t_(t), collective_(true), mine_(desc), observation_(observed_kind(desc.kind)) {
    std::unique_lock lk(t_.mu_);
    label_ = fmt::format("{} #{}", to_string(desc.kind), t_.next_seq_);
    if (t_.failure_) fail_at_start(lk);
    seq_ = t_.next_seq_++;
    start();
    if (t_.size_ == 1) return;
    if (SharedMemoryAllReduce* shm = t_.shared_memory_.get()) {
      shm->announce(seq_, desc);  // every rank reads every announcement: no frames
    } else if (t_.rank_ == 0) {
      t_.descriptors_.announce_root_locked(t_.peers_, t_.rank_, seq_, desc);  // sent when every peer's is in
    } else {
      OutFrame f;
      f.owned = encode(desc);
      f.set_header(FrameHeader{FrameType::Descriptor, f.owned.size(), seq_, 0});
      f.size = f.owned.size();
      t_.peer(0).conn.send_now_or_enqueue(lk, std::move(f));
    }
  }

  /// Point-to-point with `peer`; `kind` (Send or Recv) counts it in the metrics and timeline,
  /// unset leaves it out (the transport's own set-up messages).
  Op(Transport& t, std::string label, int peer, std::optional<observe::CallKind> kind = std::nullopt)
      : t_(t), collective_(false), label_(std::move(label)),
        observation_(kind.value_or(observe::CallKind::Send), kind.has_value()) {
    if (peer < 0 || peer >= t_.size_ || peer == t_.rank_) {
      throw InvalidArgument(fmt::format("{}: peer {} is not another rank of this cluster of {} (this is rank {})", label_,
                                        peer, t_.size_, t_.rank_));
    }
    std::unique_lock lk(t_.mu_);
    if (t_.failure_) fail_at_start(lk);
    start();
  }

  ~Op() {
    if (!finished_) {
      abandon();
      if (observation_.active()) report(true);
    }
  }

  Op(const Op&) = delete;
  Op& operator=(const Op&) = delete;

  std::uint64_t seq() const noexcept { return seq_; }

  /// Names the algorithm or path this call takes, for the timeline ("ring", "shared_memory"...).
  void set_algorithm(const char* name) noexcept { observation_.set_algorithm(name); }

  /// Counts bytes moved outside the transport's frames (through shared memory), for the metrics.
  void count_bytes(std::size_t sent, std::size_t received) {
    if (!observation_.active()) return;
    std::lock_guard lk(t_.mu_);
    observation_.count(sent, received);
  }

  /// Unless finish() completed: stops this Op's transfers and waits until neither the io thread
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
  /// continuation), else queued for it. For memory that a later receive of the same Op
  /// overwrites: the io thread's own write then happens before its read into that memory, which
  /// the peer's causality alone guarantees but a race detector cannot see.
  TransferPtr send_by_io_thread(int peer, std::uint64_t tag, std::span<const std::byte> data) {
    return send_frame(peer, MsgKey{FrameType::Data, seq_, tag}, data, t_.loop_.on_loop_thread());
  }

  /// Posts a receive of exactly `dst.size()` bytes. `on_arrival`, when given, runs once the bytes
  /// are in `dst`, on whichever thread completed the receive (the io thread, or this one when the
  /// frame was already here), before the receive counts as done. It may send and post receives
  /// on this Op; it must not wait, and it may run concurrently with this thread and with other
  /// continuations. It returns true when what wait_until() waits for may now hold. Once the Op is
  /// being abandoned, its sends and receives fail without starting.
  TransferPtr recv(int peer, std::uint64_t tag, std::span<std::byte> dst, std::function<bool()> on_arrival = {}) {
    return recv_frame(peer, MsgKey{FrameType::Data, seq_, tag}, dst, false, std::move(on_arrival));
  }

  TransferPtr send_p2p(int peer, std::span<const std::byte> data) {
    std::uint64_t n = 0;
    {
      std::lock_guard lk(t_.mu_);
      n = t_.peer(peer).p2p_sent++;
    }
    return send_frame(peer, MsgKey{FrameType::PointToPoint, n, 0}, data);
  }

  TransferPtr recv_p2p(int peer, std::span<std::byte> dst) {
    return recv_frame(peer, MsgKey{FrameType::PointToPoint, 0, 0}, dst, true);
  }

  /// Waits until `t` is done; throws the communicator's failure, a timeout, or a mismatch.
  void wait(const TransferPtr& t) {
    std::unique_lock lk(t_.mu_);
    block(lk, [&] { return settled_locked(*t); }, t->peer, t->is_send ? "a send to" : "data from");
  }

  /// Waits until `done()` holds, for state that continuations update: checked under the
  /// transport's mutex when a continuation returns true (not on every completed transfer), and on
  /// failures and descriptors. Throws like wait(), and for a failed transfer of this Op.
  /// `waiting_on` names the peer in a timeout's message.
  template <class Done>
  void wait_until(Done&& done, int waiting_on) {
    std::unique_lock lk(t_.mu_);
    quiet_ = true;
    const bool announce = collective_ && t_.descriptors_.quiet_desc == nullptr;
    if (announce) {
      t_.descriptors_.quiet_desc = &mine_;
      t_.descriptors_.quiet_seq = seq_;
    }
    struct Loud {  // destroyed before lk: runs with the mutex held
      Op& op;
      bool announced;
      ~Loud() {
        op.quiet_ = false;
        if (announced) op.t_.descriptors_.quiet_desc = nullptr;
      }
    } loud{*this, announce};
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
    std::unique_lock lk(t_.mu_);
    if (t_.failure_) raise_failure_locked();
    if (collective_) poll_descriptors_locked();
    if (deadline_ && Clock::now() >= *deadline_) time_out_locked(waiting_on, "data from");
  }

  /// Poisons the communicator with `message` (sent to every peer) and throws it.
  [[noreturn]] void fail(FailureKind kind, std::string message) {
    std::unique_lock lk(t_.mu_);
    t_.fail_locked(Failure{kind, std::move(message)}, true);
    raise_failure_locked();
  }

  /// Every rank's descriptor of this collective, by rank (they agree; a mismatch throws).
  const std::vector<Descriptor>& descriptors() {
    std::unique_lock lk(t_.mu_);
    agreement_only_ = true;
    block(lk, [&] { return descs_ok_; }, -1, "");
    agreement_only_ = false;
    return all_;
  }

  /// Waits for every transfer started so far (continuations included) and goes on: for an
  /// algorithm run as one step of a larger one, which finish() ends.
  void settle() {
    std::unique_lock lk(t_.mu_);
    settle_locked(lk);
  }

  /// Waits for every transfer and, for a collective, every peer's agreeing descriptor. After it
  /// the transport holds no reference to the caller's memory.
  void finish() {
    std::unique_lock lk(t_.mu_);
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
    if (t_.options_.operation_timeout) deadline_ = Clock::now() + *t_.options_.operation_timeout;
    observation_.begin(t_.metrics_);
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
        std::lock_guard lk(t_.mu_);
        error = t_.failure_ ? t_.failure_->message : std::string("ended by an error");
      }
    } catch (...) {
      // Observing must never turn a call's outcome into another error.
    }
    const std::size_t bytes = !collective_ ? std::max(observation_.sent(), observation_.received())
                              : mine_.kind == CollectiveKind::AllReduce ? mine_.count * size_of(mine_.dtype)
                                                                        : mine_.count;
    observation_.report(t_.metrics_, collective_ ? static_cast<std::int64_t>(seq_) : -1, bytes, failed, error);
  }

  TransferPtr send_frame(int peer, const MsgKey& key, std::span<const std::byte> data, bool direct = true) {
    if (data.size() > t_.options_.max_frame_bytes) {
      throw InvalidArgument(fmt::format("{}: a message of {} bytes exceeds max_frame_bytes ({})", label_, data.size(),
                                        t_.options_.max_frame_bytes));
    }
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
    std::unique_lock lk(t_.mu_);
    transfers_.push_back(t);
    if (abandoning_) {
      t->state = Transfer::State::Failed;
      return t;
    }
    observation_.count(data.size(), 0);
    t_.peer(peer).conn.send_now_or_enqueue(lk, std::move(f), direct);
    return t;
  }

  TransferPtr recv_frame(int peer, MsgKey key, std::span<std::byte> dst, bool p2p, std::function<bool()> on_arrival = {}) {
    if (dst.size() > t_.options_.max_frame_bytes) {
      throw InvalidArgument(fmt::format("{}: a message of {} bytes exceeds max_frame_bytes ({})", label_, dst.size(),
                                        t_.options_.max_frame_bytes));
    }
    auto t = std::make_shared<Transfer>();
    t->peer = peer;
    t->dst = dst.data();
    t->size = dst.size();
    t->on_arrival = std::move(on_arrival);
    Blob early;
    {
      std::lock_guard lk(t_.mu_);
      Peer& p = t_.peer(peer);
      if (p2p) key.seq = p.p2p_received++;
      t->key = key;
      transfers_.push_back(t);
      if (abandoning_) {
        t->state = Transfer::State::Failed;
        return t;
      }
      observation_.count(0, dst.size());
      if (p.take_early_locked(key, early)) {
        t->state = Transfer::State::Active;  // abandon() must wait for the copy and the continuation
      } else if (p.state() != Connection::State::Open) {
        t->state = Transfer::State::Failed;
        t->error = t_.closed_failure_locked(p.conn);
        return t;
      } else {
        p.posted[key].push_back(t);
        return t;
      }
    }
    // It arrived before this receive was posted: copy it out of its buffer (outside the lock).
    if (early.size == dst.size()) {
      if (early.size > 0) std::memcpy(dst.data(), early.data.get(), early.size);
      std::unique_lock lk(t_.mu_);
      t_.blobs_.give(std::move(early));
      t_.complete_receive_locked(lk, t);
    } else {
      std::lock_guard lk(t_.mu_);
      t->state = Transfer::State::Failed;
      t->error = Failure{FailureKind::Mismatch, t_.peer(peer).size_mismatch(early.size, dst.size(), t->key, t_.me())};
      t_.mu_.notify_all_locked();  // posted by a continuation, the caller waits in wait_until
    }
    return t;
  }

  // Counts this thread, while it waits, among those to wake whenever a transfer completes.
  using ProgressWaiter = ScopedCount<int>;

  [[noreturn]] void raise_failure_locked() const { raise(t_.failure_->kind, fmt::format("{}: {}", label_, t_.failure_->message)); }

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
      // Read before the announcements are looked at (poll_pause sleeps only if none came since).
      const std::uint32_t epoch = collective_ && t_.shared_memory_ ? t_.shared_memory_->announce_epoch() : 0;
      if (done()) return;
      if (t_.failure_) raise_failure_locked();
      if (collective_) {
        poll_descriptors_locked();
        if (descs_ok_ && mismatch_) {
          t_.fail_locked(*mismatch_, true);
          raise_failure_locked();
        }
        if (done()) return;  // the poll may have been what it waited for
      }
      const ProgressWaiter waiter(t_.progress_waiters_, quiet_ ? 0 : 1);
      if (collective_ && !descs_ok_ && t_.shared_memory_) {
        // The peers' descriptors come through shared memory, which does not wake the mutex.
        if (deadline_ && Clock::now() >= *deadline_) time_out_locked(waiting_on, what);
        poll_pause(lk, epoch, polls++);
        continue;
      }
      if (!deadline_) {
        t_.mu_.wait(lk);
        continue;
      }
      if (Clock::now() >= *deadline_) time_out_locked(waiting_on, what);
      t_.mu_.wait_until(lk, *deadline_);
    }
  }

  // Between two looks at shared memory. Waiting for the descriptors alone (finish, descriptors):
  // sleeps until a rank announces a call after `epoch` was read, or 1 ms passes (a failure, which
  // comes through the sockets, is seen within that). Waiting for transfers too: on the mutex, which
  // they wake, for 20 us doubling to 1 ms.
  void poll_pause(std::unique_lock<NotifyingMutex>& lk, std::uint32_t epoch, int round) {
    auto wait = agreement_only_ ? std::chrono::microseconds(1000)
                                : std::chrono::microseconds(std::min(1000, 20 << std::min(6, round)));
    if (deadline_) {
      wait = std::clamp(std::chrono::duration_cast<std::chrono::microseconds>(*deadline_ - Clock::now()),
                        std::chrono::microseconds(1), wait);
    }
    if (!agreement_only_) {
      t_.mu_.wait_until(lk, Clock::now() + wait);
      return;
    }
    const SharedMemoryAllReduce* shm = t_.shared_memory_.get();
    lk.unlock();
    shm->wait_announcement(epoch, wait);
    lk.lock();
  }

  [[noreturn]] void time_out_locked(int waiting_on, std::string_view what) {
    const std::string waiting = waiting_on >= 0 ? fmt::format("{} {}", what, t_.peer(waiting_on).name()) : missing_locked();
    t_.fail_locked(Failure{FailureKind::Timeout,
                           fmt::format("did not complete within {} ms ({} was waiting for {}{})",
                                       t_.options_.operation_timeout->count(), t_.me(), waiting, silent_peers_locked())},
                   true);
    raise_failure_locked();
  }

  // Peers quiet for longer than two heartbeat intervals: the likely culprits of a stall, which
  // need not be the peer this rank waits on (in a ring, everyone waits behind a stopped rank).
  std::string silent_peers_locked() const {
    std::string out;
    const auto now = Clock::now();
    for (const auto& p : t_.peers_) {
      if (p->rank == t_.rank_ || p->state() != Connection::State::Open) continue;
      const auto quiet = p->conn.silence(now);
      if (quiet > 2 * t_.options_.heartbeat_interval) {
        out += fmt::format("; {} has sent nothing for {:.1f} s", p->name(), std::chrono::duration<double>(quiet).count());
      }
    }
    return out;
  }

  // Who has not announced this collective yet (for timeout messages).
  std::string missing_locked() const {
    if (descs_ok_) return "the other ranks";
    std::string names;
    for (const auto& p : t_.peers_) {
      if (p->rank == t_.rank_ || joined_locked(*p)) continue;
      names += (names.empty() ? "" : ", ") + p->name();
    }
    return names.empty() ? std::string("the other ranks") : fmt::format("{} to join", names);
  }

  // Whether rank `r`'s descriptor of this call is in (in shared memory, or from TCP).
  bool joined_locked(const Peer& p) const {
    if (const SharedMemoryAllReduce* shm = t_.shared_memory_.get()) return shm->announced(p.rank, seq_).has_value();
    return p.descriptors.count(seq_) != 0;
  }

  void poll_descriptors_locked() {
    if (descs_ok_) return;
    const SharedMemoryAllReduce* shm = t_.shared_memory_.get();
    for (auto& p : t_.peers_) {
      if (p->rank == t_.rank_ || joined_locked(*p)) continue;
      if (p->state() != Connection::State::Open) {
        t_.fail_locked(Failure{FailureKind::Peer, fmt::format("{} ({}) closed its communicator before joining collective #{}",
                                                              p->name(), p->address(), seq_)},
                       true);
        raise_failure_locked();
      }
      return;
    }
    all_.assign(static_cast<std::size_t>(t_.size_), Descriptor{});
    for (auto& p : t_.peers_) {
      if (p->rank == t_.rank_) {
        all_[static_cast<std::size_t>(p->rank)] = mine_;
      } else if (shm != nullptr) {
        all_[static_cast<std::size_t>(p->rank)] = *shm->announced(p->rank, seq_);
        // The timeline's "waiting for peers" ends when this rank saw the last announcement.
        observation_.joined_at(observe::Timeline::now_ns());
      } else {
        auto it = p->descriptors.find(seq_);
        all_[static_cast<std::size_t>(p->rank)] = it->second;
        p->descriptors.erase(it);
        if (!p->descriptor_at.empty()) note_joined_locked(*p);
      }
    }
    descs_ok_ = true;
    // Every rank compares every rank against rank 0 in rank order, so all report the same pair.
    for (std::size_t r = 1; r < all_.size(); ++r) {
      if (!compatible(all_[0], all_[r])) {
        t_.fail_locked(Failure{FailureKind::Mismatch,
                               fmt::format("mismatched collectives at collective #{}: {} called {} but {} called {}", seq_,
                                           t_.peer(0).name(), describe(all_[0]), t_.peer(static_cast<int>(r)).name(),
                                           describe(all_[r]))},
                       true);
        raise_failure_locked();
      }
    }
  }

  // The timeline's "waiting for peers" ends when the last peer's descriptor arrived.
  void note_joined_locked(Peer& p) {
    auto at = p.descriptor_at.find(seq_);
    if (at == p.descriptor_at.end()) return;
    observation_.joined_at(std::chrono::duration_cast<std::chrono::nanoseconds>(at->second.time_since_epoch()).count());
    p.descriptor_at.erase(p.descriptor_at.begin(), std::next(at));
  }

  void abandon() noexcept {
    try {
      std::unique_lock lk(t_.mu_);
      abandoning_ = true;  // continuations still running start nothing new
      for (const auto& t : transfers_) {
        if (t->state != Transfer::State::Queued) continue;
        Peer& p = t_.peer(t->peer);
        if (t->is_send) {
          p.conn.unqueue_locked(t);
        } else {
          p.unpost_locked(t);
        }
        t->state = Transfer::State::Failed;
      }
      auto busy = [&] {
        return std::any_of(transfers_.begin(), transfers_.end(),
                           [](const TransferPtr& t) { return t->state == Transfer::State::Active; });
      };
      const ProgressWaiter waiter(t_.progress_waiters_, 1);
      if (!t_.mu_.wait_for(lk, kAbandonGrace, [&] { return !busy(); })) {
        // A peer that neither reads nor writes (stopped) holds our memory in a socket call: cut it.
        std::set<int> stuck;
        for (const auto& t : transfers_) {
          if (t->state == Transfer::State::Active) stuck.insert(t->peer);
        }
        for (int r : stuck) {
          t_.loop_.post([tr = &t_, r] {
            std::lock_guard g(tr->mu_);
            tr->peer_down_locked(tr->peer(r), "connection cut: it stopped exchanging data");
          });
        }
        t_.mu_.wait(lk, [&] { return !busy(); });
      }
      transfers_.clear();
      finished_ = true;
    } catch (...) {
      // Only allocation can throw here; nothing better to do than carry on unwinding.
    }
  }

  Transport& t_;
  // Counts this Op among the calls in flight for its whole life (after ~Op's abandon, too): the
  // event loop polls while there are any.
  ScopedCount<std::atomic<int>> in_flight_ = t_.loop_.call_in_flight();
  bool collective_;
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
  bool agreement_only_ = false;  // in block() for the descriptors alone (poll_pause)
  observe::CallObservation observation_;
};

/// Declared after the locals that an Op's continuations capture: if the scope is left by an
/// exception, the Op is abandoned while those locals still exist. An algorithm that returns
/// normally has settled or finished the Op first.
class ContinuationScope {
 public:
  explicit ContinuationScope(Transport::Op& op) noexcept : op_(op), unwinding_(std::uncaught_exceptions()) {}
  ~ContinuationScope() {
    if (std::uncaught_exceptions() > unwinding_) op_.abandon_unless_finished();
  }
  ContinuationScope(const ContinuationScope&) = delete;
  ContinuationScope& operator=(const ContinuationScope&) = delete;

 private:
  Transport::Op& op_;
  int unwinding_;
};

}  // namespace net::detail
DISTRIBUTE_END_NAMESPACE

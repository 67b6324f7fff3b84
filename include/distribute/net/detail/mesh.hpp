// The mesh of a communicator: one authenticated connection to every other rank (so every rank hears
// at once when any rank dies), formed at construction (each rank connects to the ranks below it and
// accepts the ones above), the matching of incoming frames to the receives calls post, heartbeats,
// and failure: the first failure (a peer lost, a timeout, mismatched collectives) poisons the
// transport, is sent to every peer in an Abort frame, and every later call throws it. The calls
// themselves are Call (call.hpp), on the members under "for calls"; incoming data frames are
// matched to their receives by ReceiveMatching (receive_matching.hpp), and the descriptor frames of
// the agreement over TCP go to the TcpAgreement it owns (tcp_agreement.hpp).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/error.hpp>
#include <distribute/net/address.hpp>
#include <distribute/net/detail/auth.hpp>
#include <distribute/net/detail/congestion_control.hpp>
#include <distribute/net/detail/connection.hpp>
#include <distribute/net/detail/connector.hpp>
#include <distribute/net/detail/event_loop.hpp>
#include <distribute/net/detail/handshake.hpp>
#include <distribute/net/detail/listener.hpp>
#include <distribute/net/detail/mesh_terms.hpp>
#include <distribute/net/detail/notifying_mutex.hpp>
#include <distribute/net/detail/observed_kinds.hpp>
#include <distribute/net/detail/peer.hpp>
#include <distribute/net/detail/protocol.hpp>
#include <distribute/net/detail/receive_matching.hpp>
#include <distribute/net/detail/tcp_agreement.hpp>
#include <distribute/net/detail/transfer.hpp>
#include <distribute/net/frame.hpp>
#include <distribute/net/options.hpp>
#include <distribute/net/refusal_log.hpp>
#include <distribute/observe/collective_metrics.hpp>
#include <distribute/observe/timeline.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net::detail {

// After an error, how long in-flight I/O on the caller's memory may finish before its socket is cut.
inline constexpr std::chrono::milliseconds kAbandonGrace{500};
// The longest wait between two connection attempts to a peer that is not listening yet.
inline constexpr std::chrono::milliseconds kMaxConnectBackoff{50};
// How long a clean shutdown waits for goodbyes to be written and answered.
inline constexpr std::chrono::milliseconds kShutdownGrace{2000};

class Transport final : private ConnectionOwner {
 public:
  Transport(std::vector<std::string> addresses, int rank, CommunicatorOptions options,
            std::vector<std::string> task_names)
      : loop_(options.busy_poll), options_(std::move(options)), rank_(rank), size_(static_cast<int>(addresses.size())) {
    if (addresses.empty()) throw InvalidArgument("Communicator: the address list is empty");
    if (rank < 0 || rank >= size_) {
      throw InvalidArgument(fmt::format("Communicator: rank {} is out of range for {} addresses", rank, size_));
    }
    if (!task_names.empty() && task_names.size() != addresses.size()) {
      throw InvalidArgument(fmt::format("Communicator: {} task names given for {} addresses", task_names.size(),
                                        addresses.size()));
    }
    if (options_.chunk_bytes == 0) throw InvalidArgument("Communicator: chunk_bytes must be positive, got 0");
    if (options_.max_frame_bytes < 4096) {
      throw InvalidArgument(fmt::format("Communicator: max_frame_bytes must be at least 4096, got {}", options_.max_frame_bytes));
    }
    if (options_.heartbeat_interval.count() <= 0) {
      throw InvalidArgument(fmt::format("Communicator: heartbeat_interval must be positive, got {} ms",
                                        options_.heartbeat_interval.count()));
    }
    chunk_bytes_ = std::min(options_.chunk_bytes, options_.max_frame_bytes);
    token_ = effective_cluster_token(options_.cluster_token);
    handshaker_.emplace(token_, options_.handshake_timeout);
    std::vector<MeshTerms::Rank> ranks;
    for (int i = 0; i < size_; ++i) {
      auto p = std::make_unique<Peer>(static_cast<ConnectionOwner&>(*this), mu_, loop_.io(), i,
                                      task_names.empty() ? fmt::format("rank {}", i) : task_names[static_cast<std::size_t>(i)],
                                      addresses[static_cast<std::size_t>(i)], options_.max_frame_bytes);
      p->endpoint = parse_host_port(p->address());
      for (int j = 0; j < i; ++j) {
        if (peers_[static_cast<std::size_t>(j)]->address() == p->address()) {
          throw InvalidArgument(fmt::format("Communicator: ranks {} and {} have the same address '{}'", j, i, p->address()));
        }
      }
      if (i < rank_) p->dialer.emplace(loop_.io(), *handshaker_, p->endpoint, options_.loopback_congestion_control, kMaxConnectBackoff);
      ranks.push_back(MeshTerms::Rank{p->name(), p->address()});
      peers_.push_back(std::move(p));
    }
    terms_.emplace(rank_, std::move(ranks), token_.has_value());
    if (size_ == 1) return;

    listener_.emplace(loop_.io(), Listener::Options{me(), "Communicator", options_.loopback_congestion_control,
                                                    options_.max_pending_connections,
                                                    [this](const std::string& l) { log_limited(l); },
                                                    [this](const std::string& l) { log(l); }});
    listener_->listen(peer(rank_).address(), token_.has_value(), insecure_chosen(options_.insecure));
    loop_.start([this](const std::exception& e) {
      // A handler must not take the process down; the transport is unusable afterwards.
      std::lock_guard lk(mu_);
      fail_locked(Failure{FailureKind::Peer, fmt::format("internal error in the network thread of {}: {}", me(), e.what())}, true);
    });
    loop_.post([this] {
      listener_->start([this](const HandshakePtr& h) { return on_accepted(h); });
      for (int j = 0; j < rank_; ++j) start_dialing(j);
      // Heartbeats start now, not once the cluster has formed: peers that connected early must
      // keep hearing from us while a late one is still awaited.
      heartbeat_tick();
    });

    std::unique_lock lk(mu_);
    const auto deadline = Clock::now() + options_.connect_timeout;
    const bool formed = mu_.wait_until(lk, deadline, [&] { return open_count_ == size_ - 1 || setup_failure_ || failure_; });
    if (!formed || setup_failure_ || failure_ || open_count_ != size_ - 1) {
      Failure f = setup_failure_ ? *setup_failure_ : failure_ ? *failure_ : Failure{FailureKind::Peer, missing_peers_locked()};
      lk.unlock();
      shutdown();
      raise(f.kind, f.message);
    }
  }

  ~Transport() { shutdown(); }

  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  const std::string& task_name(int r) const { return peer_at(r).name(); }
  const std::string& address(int r) const { return peer_at(r).address(); }
  const CommunicatorOptions& options() const noexcept { return options_; }
  std::size_t chunk_bytes() const noexcept { return chunk_bytes_; }

  std::optional<Failure> failure() const {
    std::lock_guard lk(mu_);
    return failure_;
  }

  /// For the life of the result, one call in flight does not make the io thread busy-poll: its
  /// data does not come through the sockets (shared memory), and the polling thread would take
  /// turns on the core with the one copying.
  ScopedCount<std::atomic<int>> exempt_from_busy_poll() noexcept { return loop_.exempt_from_busy_poll(); }

  /// The agreement over descriptor frames, which this transport receives.
  Agreement& tcp_agreement() noexcept { return tcp_agreement_; }

  /// The TCP congestion control of the connection to rank `r` ("" where it cannot be read).
  std::string congestion_control(int r) {
    std::lock_guard lk(mu_);
    (void)peer_at(r);  // throws for a rank out of range
    Peer& p = peer(r);
    if (r == rank_ || !p.conn.has_socket()) return {};
    return congestion_control_of(p.conn.socket().native_handle());
  }

  // ---- for calls (call.hpp) ------------------------------------------------------------------
  // What a call does on the mesh. `lk` (from lock()) holds the transport's mutex, which guards
  // every member named `_locked`; a call waits on it (lk.mutex()), and the mesh wakes it when a
  // transfer completes (for the waiters counted by progress_waiter), a descriptor or a failure
  // comes.

  std::unique_lock<NotifyingMutex> lock() const { return std::unique_lock(mu_); }

  /// This rank's name, for messages.
  const std::string& me() const { return peers_[static_cast<std::size_t>(rank_)]->name(); }

  /// The failure that poisoned the transport, if one did.
  const std::optional<Failure>& failure_locked() const noexcept { return failure_; }

  /// Records the first failure; `broadcast`: tell every peer (found here, or relayed).
  void fail_locked(Failure f, bool broadcast) {
    if (failure_) return;
    failure_ = f;
    if (metrics_) metrics_->failure(observed_reason(f.kind));
    if (observe::timeline_enabled()) {
      try {
        observe::Timeline::instance().instant("communicator failed", "failure", observe::Timeline::now_ns(),
                                              fmt::format("\"message\":\"{}\"", observe::json_escape(f.message)));
      } catch (...) {
      }
    }
    if (broadcast) {
      const auto payload = encode(f);
      for (auto& p : peers_) {
        if (p->rank != rank_ && p->state() == Connection::State::Open) p->conn.enqueue_control_locked(FrameType::Abort, 0, payload);
      }
    }
    mu_.notify_all_locked();
  }

  /// The number the next collective takes, and taking it.
  std::uint64_t next_collective_locked() const noexcept { return next_seq_; }
  std::uint64_t claim_collective_locked() noexcept { return next_seq_++; }

  /// The number of the next point-to-point message to rank `r`, taken.
  std::uint64_t claim_message_to_locked(int r) { return peer(r).p2p_sent++; }

  /// Hands the frame of a send to rank `r`'s connection (`direct`: this thread may write it).
  void post_send_locked(std::unique_lock<NotifyingMutex>& lk, int r, OutFrame f, bool direct) {
    peer(r).conn.send_now_or_enqueue(lk, std::move(f), direct);
  }

  /// Posts the receive `t` (its peer, key, destination and size set; `p2p`: its key's sequence
  /// becomes the number of the next message from that peer). A frame that came before it is
  /// copied in now, the mutex released meanwhile, and the receive completes (continuation
  /// included); a frame of another size fails it with a mismatch.
  void post_receive_locked(std::unique_lock<NotifyingMutex>& lk, const TransferPtr& t, bool p2p) {
    Peer& p = peer(t->peer);
    if (!matching_.post_locked(lk, p, t, p2p, me())) {
      t->state = Transfer::State::Failed;
      t->error = closed_failure_locked(p.conn);
    }
  }

  /// Takes a transfer that has not started (Queued) off its connection: its call is abandoned.
  void cancel_locked(const TransferPtr& t) {
    Peer& p = peer(t->peer);
    if (t->is_send) {
      p.conn.unqueue_locked(t);
    } else {
      p.unpost_locked(t);
    }
  }

  /// Cuts the connection to rank `r` from the io thread: a stopped peer holds a call's memory in
  /// a socket call.
  void cut(int r, std::string reason) {
    loop_.post([this, r, reason = std::move(reason)] {
      std::lock_guard g(mu_);
      peer_down_locked(peer(r), reason);
    });
  }

  bool peer_open_locked(int r) const { return peers_[static_cast<std::size_t>(r)]->state() == Connection::State::Open; }

  /// Peers quiet for longer than two heartbeat intervals, as "; NAME has sent nothing for S s"
  /// each: the likely culprits of a stall, which need not be the peer a call waits on (in a ring,
  /// everyone waits behind a stopped rank).
  std::string silent_peers_locked() const {
    std::string out;
    const auto now = Clock::now();
    for (const auto& p : peers_) {
      if (p->rank == rank_ || p->state() != Connection::State::Open) continue;
      const auto quiet = p->conn.silence(now);
      if (quiet > 2 * options_.heartbeat_interval) {
        out += fmt::format("; {} has sent nothing for {:.1f} s", p->name(), std::chrono::duration<double>(quiet).count());
      }
    }
    return out;
  }

  /// While the result lives, the thread counts among those woken whenever a transfer completes
  /// (`counts` false: it does not).
  ScopedCount<int> progress_waiter(bool counts) noexcept { return ScopedCount<int>(progress_waiters_, counts ? 1 : 0); }

  /// A call in flight for the life of the result (the io thread polls while there are any).
  ScopedCount<std::atomic<int>> call_in_flight() noexcept { return loop_.call_in_flight(); }
  bool on_io_thread() const noexcept { return loop_.on_loop_thread(); }

  observe::CollectiveMetrics* metrics() const noexcept { return metrics_; }

 private:
  const Peer& peer_at(int r) const {
    if (r < 0 || r >= size_) throw InvalidArgument(fmt::format("rank {} is out of range for a cluster of {}", r, size_));
    return *peers_[static_cast<std::size_t>(r)];
  }
  Peer& peer(int r) { return *peers_[static_cast<std::size_t>(r)]; }
  Peer& peer(const Connection& c) { return *peers_[static_cast<std::size_t>(c.id())]; }
  const Peer& peer(const Connection& c) const { return *peers_[static_cast<std::size_t>(c.id())]; }

  void log(const std::string& line) const {
    if (options_.log) {
      options_.log(line);
    } else {
      fmt::print(stderr, "distribute.net: {}\n", line);
    }
  }

  // Lines a stranger can cause: a few a second at most.
  void log_limited(const std::string& line) {
    if (std::string admitted = refusal_limiter_.admit(line); !admitted.empty()) log(admitted);
  }

  // ---- forming the mesh -----------------------------------------------------------------------

  std::string missing_peers_locked() const {
    std::string out;
    for (const auto& p : peers_) {
      if (p->rank == rank_ || p->state() == Connection::State::Open) continue;
      if (!out.empty()) out += "; ";
      if (p->rank < rank_) {
        out += fmt::format("could not connect to {} at {} (last error: {})", p->name(), p->address(), p->last_error);
      } else {
        out += fmt::format("{} ({}) never connected", p->name(), p->address());
      }
    }
    return fmt::format("{}: the cluster of {} did not form within {} ms: {}", me(), size_, options_.connect_timeout.count(),
                       out);
  }

  void setup_fail(FailureKind kind, std::string message) {
    std::lock_guard lk(mu_);
    if (!setup_failure_) setup_failure_ = Failure{kind, std::move(message)};
    mu_.notify_all_locked();
  }

  // Connector side: ranks connect to every lower rank, retrying while it is not up yet.
  void start_dialing(int j) {
    Dialer::Hooks hooks;
    hooks.wanted = [this, j] {
      std::lock_guard lk(mu_);
      return !closing_ && peer(j).state() == Connection::State::Connecting;
    };
    hooks.retry = [this, j](const std::string& reason) {
      std::lock_guard lk(mu_);
      Peer& q = peer(j);
      if (closing_ || q.state() != Connection::State::Connecting) return false;
      q.last_error = reason;
      if (metrics_) metrics_->retry();
      return true;
    };
    hooks.connected = [this, j](const HandshakePtr& h) { register_peer(j, std::move(h->socket), h->written); };
    hooks.refused = [this](const std::string& message) { setup_fail(FailureKind::Config, message); };
    hooks.congestion_refused = [this, j](const std::string& why) {
      if (congestion_refusal_logged_) return;
      congestion_refusal_logged_ = true;  // once, not once per connection attempt
      log(fmt::format("{}: connecting to {} with the system's congestion control: '{}' is refused by the kernel: {}", me(),
                      peer(j).name(), options_.loopback_congestion_control, why));
    };
    peer(j).dialer->start(terms_->connector(j), std::move(hooks));
  }

  // Acceptor side: anyone may connect; only a peer that proves the token and a valid rank joins.
  bool on_accepted(const HandshakePtr& h) {
    {
      std::lock_guard lk(mu_);
      if (closing_) return false;
    }
    if (!acceptor_terms_) {
      acceptor_terms_ = terms_->acceptor(
          [this](int from) -> std::string {
            std::lock_guard lk(mu_);
            Peer& p = peer(from);
            if (closing_ || p.state() != Connection::State::Connecting || p.claimed) return fmt::format("{} is already connected", p.name());
            p.claimed = true;
            return {};
          },
          [this](int from) {
            std::lock_guard lk(mu_);
            peer(from).claimed = false;
          },
          [this](const std::string& l) { log_limited(l); });
    }
    handshaker_->accept(h, acceptor_terms_, [this](const HandshakePtr& done) {
      register_peer(static_cast<int>(done->hello.from_rank), std::move(done->socket), done->written);
    });
    return true;
  }

  void register_peer(int j, tcp::socket socket, std::uint64_t handshake_bytes) {
    boost::system::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    std::unique_lock lk(mu_);
    Peer& p = peer(j);
    if (closing_ || p.state() != Connection::State::Connecting) {
      socket.close(ignored);
      return;
    }
    p.conn.open_locked(std::move(socket), handshake_bytes);
    p.claimed = false;
    ++open_count_;
    mu_.notify_all_locked();
    lk.unlock();
    p.conn.start_reading();
  }

  // ---- what the connections report (ConnectionOwner) ------------------------------------------

  FrameIntake intake(const Connection&, FrameType type) const noexcept override {
    switch (type) {
      case FrameType::Heartbeat: return FrameIntake::Heartbeat;
      case FrameType::Goodbye: return FrameIntake::Goodbye;
      case FrameType::Abort:
      case FrameType::Descriptor: return FrameIntake::Control;
      case FrameType::Data:
      case FrameType::PointToPoint: return FrameIntake::Bulk;
      default: return FrameIntake::Refuse;
    }
  }

  void on_goodbye(Connection& c) override {
    std::lock_guard lk(mu_);
    on_goodbye_locked(peer(c));
  }

  void on_control(Connection& c, const FrameHeader& h, std::span<const std::byte> payload) override {
    Peer& p = peer(c);
    if (h.type == FrameType::Abort) {
      Failure f = decode_abort(payload);
      std::lock_guard lk(mu_);
      if (!closing_) {
        if (f.message.find(" (reported by ") == std::string::npos) f.message += fmt::format(" (reported by {})", p.name());
        // Relayed before anything else we send: a peer that hears our goodbye later must have
        // heard why first, or it would blame our departure instead of the real loss.
        fail_locked(std::move(f), true);
      }
    } else {
      std::lock_guard lk(mu_);
      on_descriptor_locked(p, h.seq, payload);
    }
  }

  std::byte* begin_bulk(Connection& c, const FrameHeader& h) override { return matching_.begin_frame(peer(c), h, me()); }

  void end_bulk(Connection& c) override { matching_.end_frame(peer(c), c.current(), me()); }

  void on_read_failed(Connection& c, const std::string& reason, bool malformed) override {
    Peer& p = peer(c);
    std::lock_guard lk(mu_);
    if (p.rx_transfer) {
      p.rx_transfer->state = Transfer::State::Failed;
      p.rx_transfer->error = loss_locked(c, reason);
      p.rx_transfer.reset();
    }
    if (!malformed) p.rx_blob = Blob{};
    peer_down_locked(p, malformed ? fmt::format("it sent a malformed frame: {}", reason) : reason);
  }

  Failure loss_locked(const Connection& c, const std::string& reason) const override {
    if (c.state == Connection::State::Failed && failure_) return *failure_;
    if (c.state == Connection::State::Closed) return closed_failure_locked(c);
    return Failure{FailureKind::Peer, fmt::format("lost task {} ({}): {}", c.name(), c.address(), reason)};
  }

  Failure closed_failure_locked(const Connection& c) const override {
    if (c.state == Connection::State::Failed && failure_) return *failure_;
    return Failure{FailureKind::Peer, fmt::format("{} ({}) has closed its communicator", c.name(), c.address())};
  }

  void on_write_failed_locked(Connection& c, const std::string& reason) override { peer_down_locked(peer(c), reason); }

  bool wake_on_progress_locked() const noexcept override { return progress_waiters_ > 0; }

  // ---- descriptors ----------------------------------------------------------------------------

  void on_descriptor_locked(Peer& p, std::uint64_t seq, std::span<const std::byte> payload) {
    if (tcp_agreement_.receive(p, seq, payload, progress_waiters_)) mu_.notify_all_locked();
  }

  // ---- failure --------------------------------------------------------------------------------

  void on_goodbye_locked(Peer& p) {
    if (p.state() != Connection::State::Open) return;
    p.state() = Connection::State::Closed;
    p.fail_pending_locked(closed_failure_locked(p.conn));
    // It sends nothing more; end our side too once what is being written is out.
    p.conn.half_close_when_written_locked();
    mu_.notify_all_locked();
  }

  void peer_down_locked(Peer& p, const std::string& reason) {
    if (p.state() == Connection::State::Closed || p.state() == Connection::State::Failed) {
      p.conn.close_locked();
      mu_.notify_all_locked();
      return;
    }
    const bool expected = closing_;  // during our own shutdown every error is expected
    const Failure loss = loss_locked(p.conn, reason);
    p.state() = expected ? Connection::State::Closed : Connection::State::Failed;
    p.conn.close_locked();
    p.fail_pending_locked(loss);
    if (!expected) fail_locked(loss, true);
    mu_.notify_all_locked();
  }

  // ---- heartbeats -----------------------------------------------------------------------------

  void heartbeat_tick() {
    if (!heartbeat_timer_) heartbeat_timer_.emplace(loop_.io());
    heartbeat_timer_->expires_after(options_.heartbeat_interval);
    heartbeat_timer_->async_wait([this](const boost::system::error_code& ec) {
      if (ec) return;
      on_heartbeat();
      heartbeat_tick();
    });
  }

  void on_heartbeat() {
    std::lock_guard lk(mu_);
    if (closing_) return;
    const auto now = Clock::now();
    for (auto& pp : peers_) {
      Peer& p = *pp;
      if (p.rank == rank_ || p.state() != Connection::State::Open) continue;
      if (const auto silent = p.conn.heartbeat_locked(now, options_.heartbeat_interval, options_.heartbeat_timeout)) {
        peer_down_locked(p, fmt::format("no heartbeat for {:.1f} s", std::chrono::duration<double>(*silent).count()));
      }
    }
  }

  // ---- shutdown -------------------------------------------------------------------------------

  void shutdown() noexcept {
    if (!loop_.started()) return;
    try {
      {
        std::unique_lock lk(mu_);
        closing_ = true;
        for (auto& p : peers_) {
          if (p->rank != rank_ && p->state() == Connection::State::Open) {
            p->conn.enqueue_control_locked(FrameType::Goodbye, 0, {}, true);
          }
        }
        // A poisoned transport has told its peers already; a stopped peer would only delay us.
        mu_.wait_for(lk, failure_ ? kShutdownGrace / 4 : kShutdownGrace, [&] {
          return std::all_of(peers_.begin(), peers_.end(), [](const auto& p) { return p->conn.done_locked(); });
        });
      }
      std::promise<void> closed;
      loop_.post([this, &closed] {
        if (listener_) listener_->close();
        if (heartbeat_timer_) heartbeat_timer_->cancel();
        std::lock_guard lk(mu_);
        for (auto& p : peers_) {
          if (p->dialer) p->dialer->cancel();
          p->conn.close_locked();
        }
        closed.set_value();
      });
      closed.get_future().wait_for(kShutdownGrace);
    } catch (...) {
      // Shutting down must not throw; stopping the event loop below releases everything anyway.
    }
    loop_.stop();
  }

  // Members. loop_ comes first so that its io_context outlives every socket and timer that uses it.
  EventLoop loop_;
  CommunicatorOptions options_;
  observe::CollectiveMetrics* metrics_ = options_.metrics.get();  // null: no metrics
  int rank_;
  int size_;
  std::size_t chunk_bytes_ = 0;
  std::optional<std::string> token_;
  std::optional<Handshaker> handshaker_;
  std::optional<MeshTerms> terms_;
  std::shared_ptr<const AcceptorTerms> acceptor_terms_;  // io thread only
  std::vector<std::unique_ptr<Peer>> peers_;
  std::optional<Listener> listener_;
  RateLimiter refusal_limiter_;
  std::optional<asio::steady_timer> heartbeat_timer_;

  // The transport's lock and its condition: waiters are woken after it is released.
  mutable NotifyingMutex mu_;
  int open_count_ = 0;
  bool closing_ = false;
  std::optional<Failure> failure_;
  std::optional<Failure> setup_failure_;
  std::uint64_t next_seq_ = 0;
  bool congestion_refusal_logged_ = false;  // io thread only
  // Threads blocked in Call::block that want waking whenever a transfer completes; one in
  // Call::wait_until is woken only by a continuation's request, a failure, or a descriptor.
  int progress_waiters_ = 0;
  ReceiveMatching matching_{mu_, progress_waiters_};
  // Collectives' descriptors over TCP (the agreement where no shared memory carries them).
  TcpAgreement tcp_agreement_{peers_, rank_, size_};
};

}  // namespace net::detail
DISTRIBUTE_END_NAMESPACE

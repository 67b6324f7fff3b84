// The mesh of a communicator: one authenticated connection to every other rank (so every rank hears
// at once when any rank dies), formed at construction (each rank connects to the ranks below it and
// accepts the ones above), the matching of incoming frames to the receives calls post, the
// agreement on each collective (descriptors), heartbeats, and failure: the first failure (a peer
// lost, a timeout, mismatched collectives) poisons the transport, is sent to every peer in an Abort
// frame, and every later call throws it. The calls themselves are Transport::Op (call.hpp).
//
// Receives are matched by (type, sequence, tag): a frame whose receive is already posted is read
// straight into the caller's buffer; an early one is buffered until its receive is posted. A
// receive may carry a continuation that the io thread runs as soon as the frame is in (reduce, send
// on, post the next receive), so a pipelined collective does not wake the calling thread for every
// chunk.
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
#include <distribute/net/detail/address.hpp>
#include <distribute/net/detail/auth.hpp>
#include <distribute/net/detail/congestion_control.hpp>
#include <distribute/net/detail/connection.hpp>
#include <distribute/net/detail/connector.hpp>
#include <distribute/net/detail/event_loop.hpp>
#include <distribute/net/detail/handshake.hpp>
#include <distribute/net/detail/listener.hpp>
#include <distribute/net/detail/notifying_mutex.hpp>
#include <distribute/net/detail/protocol.hpp>
#include <distribute/net/detail/shared_memory_all_reduce.hpp>
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

/// One other rank: its connection and what its frames are matched against.
struct Peer {
  Peer(ConnectionOwner& owner, NotifyingMutex& mu, asio::io_context& io, int r, std::string name, std::string address,
       std::size_t max_frame_bytes)
      : conn(owner, mu, io, r, std::move(name), std::move(address), max_frame_bytes), rank(r) {}
  Connection conn;
  int rank;
  HostPort endpoint;
  const std::string& name() const noexcept { return conn.name(); }
  const std::string& address() const noexcept { return conn.address(); }
  Connection::State& state() noexcept { return conn.state; }
  Connection::State state() const noexcept { return conn.state; }
  bool claimed = false;  // an accepted handshake is completing for this rank
  // Connecting to ranks below ours.
  std::optional<Dialer> dialer;
  std::string last_error = "no attempt yet";
  // The frame being read (io thread only): the receive it goes to, or the buffer it waits in.
  TransferPtr rx_transfer;
  Blob rx_blob;
  bool rx_keep = false;
  // Matching (guarded by the mutex).
  std::map<MsgKey, std::deque<TransferPtr>> posted;
  std::map<MsgKey, std::deque<Blob>> unexpected;
  std::map<std::uint64_t, Descriptor> descriptors;
  // When each of those arrived: kept only while the timeline records (waiting vs moving data).
  std::map<std::uint64_t, Clock::time_point> descriptor_at;
  std::uint64_t p2p_sent = 0;
  std::uint64_t p2p_received = 0;
};

class Transport final : private ConnectionOwner {
 public:
  class Op;

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
      peers_.push_back(std::move(p));
    }
    if (size_ == 1) return;

    listener_.emplace(loop_.io(), Listener::Options{me(), "Communicator", options_.loopback_congestion_control,
                                                    options_.max_pending_connections,
                                                    [this](const std::string& l) { log_limited(l); },
                                                    [this](const std::string& l) { log(l); }});
    listener_->listen(peer(rank_).address(), token_.has_value());
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

  /// For the life of the result, one Op in flight does not make the io thread busy-poll: its
  /// data does not come through the sockets (shared memory), and the polling thread would take
  /// turns on the core with the one copying.
  ScopedCount<std::atomic<int>> exempt_from_busy_poll() noexcept { return loop_.exempt_from_busy_poll(); }

  /// The shared-memory all-reduce, when every rank mapped one segment at construction.
  SharedMemoryAllReduce* shared_memory() const noexcept { return shared_memory_.get(); }
  void set_shared_memory(std::unique_ptr<SharedMemoryAllReduce> s) noexcept { shared_memory_ = std::move(s); }

  /// With ranks on several hosts (topology.hpp): `group_of[k]` names rank k's host group by its
  /// lowest rank; `members` are this rank's group (sorted) and `host_memory` their segment (null for
  /// a group of one). Set once after construction.
  void set_topology(std::vector<int> group_of, std::vector<int> members, std::unique_ptr<SharedMemoryAllReduce> host_memory) {
    group_of_ = std::move(group_of);
    host_members_ = std::move(members);
    host_memory_ = std::move(host_memory);
  }
  SharedMemoryAllReduce* host_memory() const noexcept { return host_memory_.get(); }
  const std::vector<int>& group_of() const noexcept { return group_of_; }
  const std::vector<int>& host_members() const noexcept { return host_members_; }
  /// Whether all-reduce data between this rank and `r` goes through shared memory.
  bool shares_memory_with(int r) const noexcept {
    if (r == rank_ || r < 0 || r >= size_) return false;
    if (shared_memory_) return true;
    return host_memory_ && std::find(host_members_.begin(), host_members_.end(), r) != host_members_.end();
  }

  /// The TCP congestion control of the connection to rank `r` ("" where it cannot be read).
  std::string congestion_control(int r) {
    std::lock_guard lk(mu_);
    (void)peer_at(r);  // throws for a rank out of range
    Peer& p = peer(r);
    if (r == rank_ || !p.conn.has_socket()) return {};
    return congestion_control_of(p.conn.socket().native_handle());
  }

 private:
  const Peer& peer_at(int r) const {
    if (r < 0 || r >= size_) throw InvalidArgument(fmt::format("rank {} is out of range for a cluster of {}", r, size_));
    return *peers_[static_cast<std::size_t>(r)];
  }
  Peer& peer(int r) { return *peers_[static_cast<std::size_t>(r)]; }
  Peer& peer(const Connection& c) { return *peers_[static_cast<std::size_t>(c.id())]; }
  const Peer& peer(const Connection& c) const { return *peers_[static_cast<std::size_t>(c.id())]; }
  const std::string& me() const { return peers_[static_cast<std::size_t>(rank_)]->name(); }

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

  // What a connector reports when a peer refused it (an acceptor tells the peer no more than "refused").
  std::string refused_by(const Peer& p, const std::string& text) const {
    if (text == kRefusedText) {
      return fmt::format("{} at {} refused {} (its log says why; cluster specs or cluster tokens that differ are the usual "
                         "cause)",
                         p.name(), p.address(), me());
    }
    return fmt::format("{} at {} refused {}: {}", p.name(), p.address(), me(), text);
  }

  // Connector side: ranks connect to every lower rank, retrying while it is not up yet.
  void start_dialing(int j) {
    auto terms = std::make_shared<ConnectorTerms>();
    const Peer& p = peer(j);
    terms->hello = Hello{static_cast<std::uint32_t>(size_), static_cast<std::uint32_t>(rank_), static_cast<std::uint32_t>(j)};
    terms->peer_name = p.name();
    terms->peer_address = p.address();
    terms->me = me();
    terms->check = [this, j](const Challenge& c) -> std::string {
      const Peer& q = peer(j);
      if (c.size != static_cast<std::uint32_t>(size_) || c.rank != static_cast<std::uint32_t>(j) ||
          c.peer_rank != static_cast<std::uint32_t>(rank_) || c.service) {
        return fmt::format("{} answered as rank {} of a {}-rank cluster, but {} (rank {} of {}) lists it as {} (rank {}): the "
                           "processes were given different cluster specs",
                           q.address(), c.rank, c.size, me(), rank_, size_, q.name(), j);
      }
      if (c.has_token != token_.has_value()) {
        return token_ ? fmt::format("{} at {} uses no cluster token but {} does", q.name(), q.address(), me())
                      : fmt::format("{} at {} requires a cluster token (DISTRIBUTE_CLUSTER_TOKEN) but {} has none", q.name(),
                                    q.address(), me());
      }
      return {};
    };
    terms->refused = [this, j](const std::string& text) { return refused_by(peer(j), text); };
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
    peer(j).dialer->start(std::move(terms), std::move(hooks));
  }

  // Acceptor side: anyone may connect; only a peer that proves the token and a valid rank joins.
  bool on_accepted(const HandshakePtr& h) {
    {
      std::lock_guard lk(mu_);
      if (closing_) return false;
    }
    if (!acceptor_terms_) {
      auto terms = std::make_shared<AcceptorTerms>();
      terms->me = me();
      terms->admit = [this](Handshake& hs, const Hello& hello) -> std::string {
        if (hello.service) return "it is a client of a service, not a rank of this cluster";
        if (hello.size != static_cast<std::uint32_t>(size_) || hello.to_rank != static_cast<std::uint32_t>(rank_)) {
          return fmt::format("it believes in a {}-rank cluster and called rank {}, but this is rank {} of {}", hello.size,
                             hello.to_rank, rank_, size_);
        }
        if (hello.from_rank <= static_cast<std::uint32_t>(rank_) || hello.from_rank >= static_cast<std::uint32_t>(size_)) {
          return fmt::format("it claims rank {}, but only ranks {}..{} connect to rank {}", hello.from_rank, rank_ + 1, size_ - 1,
                             rank_);
        }
        hs.claimed = fmt::format(" (claiming to be {})", peer(static_cast<int>(hello.from_rank)).name());
        if (hello.has_token != token_.has_value()) {
          return token_ ? std::string("it presented no cluster token, and this cluster requires one")
                        : std::string("it presented a cluster token, and this rank has none");
        }
        return {};
      };
      terms->claim = [this](const Hello& hello) -> std::string {
        std::lock_guard lk(mu_);
        Peer& p = peer(static_cast<int>(hello.from_rank));
        if (closing_ || p.state() != Connection::State::Connecting || p.claimed) return fmt::format("{} is already connected", p.name());
        p.claimed = true;
        return {};
      };
      terms->unclaim = [this](const Hello& hello) {
        std::lock_guard lk(mu_);
        peer(static_cast<int>(hello.from_rank)).claimed = false;
      };
      terms->log = [this](const std::string& l) { log_limited(l); };
      acceptor_terms_ = std::move(terms);
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

  std::byte* begin_bulk(Connection& c, const FrameHeader& h) override {
    Peer& p = peer(c);
    const MsgKey key{h.type, h.seq, h.tag};
    const auto length = static_cast<std::size_t>(h.length);
    bool keep = true;
    {
      std::lock_guard lk(mu_);
      p.rx_transfer.reset();
      auto it = p.posted.find(key);
      if (it != p.posted.end()) {
        TransferPtr t = std::move(it->second.front());
        it->second.pop_front();
        if (it->second.empty()) p.posted.erase(it);
        if (t->size == length) {
          t->state = Transfer::State::Active;
          p.rx_transfer = std::move(t);
          return p.rx_transfer->dst;
        }
        t->state = Transfer::State::Failed;
        t->error = Failure{FailureKind::Mismatch, size_mismatch(p, length, t->size, key)};
        keep = false;  // read and drop it: the stream stays in step
        mu_.notify_all_locked();
      }
    }
    try {
      {
        std::lock_guard lk(mu_);
        p.rx_blob = blobs_.take(length);
      }
      if (!p.rx_blob.data) p.rx_blob = Blob{std::make_unique_for_overwrite<std::byte[]>(length), length, length};
    } catch (const std::bad_alloc&) {
      throw FrameError(fmt::format("cannot buffer a frame of {} bytes: out of memory", length));
    }
    p.rx_keep = keep;
    return p.rx_blob.data.get();
  }

  void end_bulk(Connection& c) override {
    Peer& p = peer(c);
    const FrameHeader& h = c.current();
    std::unique_lock lk(mu_);
    if (p.rx_transfer) {
      const TransferPtr t = std::move(p.rx_transfer);  // leaves rx_transfer empty
      complete_receive_locked(lk, t);
    } else if (p.rx_keep) {
      // Its receive may have been posted while the frame was arriving: hand it over now.
      const MsgKey key{h.type, h.seq, h.tag};
      auto it = p.posted.find(key);
      if (it == p.posted.end()) {
        p.unexpected[key].push_back(std::move(p.rx_blob));
      } else {
        TransferPtr t = std::move(it->second.front());
        it->second.pop_front();
        if (it->second.empty()) p.posted.erase(it);
        if (t->size == p.rx_blob.size) {
          t->state = Transfer::State::Active;
          lk.unlock();
          if (t->size > 0) std::memcpy(t->dst, p.rx_blob.data.get(), t->size);
          lk.lock();
          complete_receive_locked(lk, t);
        } else {
          t->state = Transfer::State::Failed;
          t->error = Failure{FailureKind::Mismatch, size_mismatch(p, p.rx_blob.size, t->size, key)};
          mu_.notify_all_locked();
        }
      }
    }
    blobs_.give(std::move(p.rx_blob));
    p.rx_blob = Blob{};
  }

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

  // Descriptors over TCP (no shared memory): every rank sends its own to rank 0 alone, and rank 0,
  // once it holds every rank's, sends the whole table to every rank: 2(n-1) frames per collective
  // instead of n(n-1), and every rank still compares every rank's call (the same pair is named
  // everywhere). The table's entries count as each peer's descriptor.
  void on_descriptor_locked(Peer& p, std::uint64_t seq, std::span<const std::byte> payload) {
    const std::size_t n = static_cast<std::size_t>(size_);
    auto store = [&](Peer& from, const Descriptor& d) {
      if (!from.descriptors.emplace(seq, d).second) {
        throw FrameError(fmt::format("second descriptor of {} for collective #{}", from.name(), seq));
      }
    };
    if (rank_ == 0) {
      if (payload.size() != kDescriptorBytes) {
        throw FrameError(fmt::format("descriptor frame of {} bytes (expected {})", payload.size(), kDescriptorBytes));
      }
      store(p, decode_descriptor(payload));
      relay_descriptors_locked();
    } else {
      if (p.rank != 0 || payload.size() != n * kDescriptorBytes) {
        throw FrameError(fmt::format("descriptor frame of {} bytes from rank {} (only rank 0 sends them, {} bytes)",
                                     payload.size(), p.rank, n * kDescriptorBytes));
      }
      for (std::size_t r = 0; r < n; ++r) {
        if (static_cast<int>(r) == rank_) continue;
        store(*peers_[r], decode_descriptor(payload.subspan(r * kDescriptorBytes, kDescriptorBytes)));
      }
    }
    if (observe::timeline_enabled()) p.descriptor_at[seq] = Clock::now();
    if (descriptor_wakes_locked(seq)) mu_.notify_all_locked();
  }

  // Rank 0: once its own call and every peer's descriptor of it are in, sends the table out.
  void relay_descriptors_locked() {
    if (!root_pending_) return;
    const std::uint64_t seq = root_pending_->first;
    for (const auto& p : peers_) {
      if (p->rank != rank_ && p->descriptors.count(seq) == 0) return;
    }
    std::vector<std::byte> table;
    table.reserve(static_cast<std::size_t>(size_) * kDescriptorBytes);
    for (const auto& p : peers_) {
      const auto bytes = encode(p->rank == rank_ ? root_pending_->second : p->descriptors.at(seq));
      table.insert(table.end(), bytes.begin(), bytes.end());
    }
    root_pending_.reset();
    for (auto& p : peers_) {
      if (p->rank != rank_ && p->state() == Connection::State::Open) p->conn.enqueue_control_locked(FrameType::Descriptor, seq, table);
    }
  }

  // Whether a peer's descriptor must wake the waiting threads. A thread in Op::wait_until (the
  // ring) need not wake for one that agrees with its own call: it checks every descriptor once its
  // data is in, and a descriptor that disagrees still wakes it at once. Sparing that wake-up saves
  // two context switches per call where the caller and the io thread share a core.
  // Disagreement is judged once every descriptor is in, so the thread is woken for every
  // arrival (the last one included) while any descriptor of its call disagrees, whichever
  // came first.
  bool descriptor_wakes_locked(std::uint64_t seq) const {
    if (progress_waiters_ > 0 || quiet_desc_ == nullptr || quiet_seq_ != seq) return true;
    for (const auto& p : peers_) {
      const auto it = p->descriptors.find(seq);
      if (it != p->descriptors.end() && !compatible(*quiet_desc_, it->second)) return true;
    }
    return false;
  }

  // ---- receives -------------------------------------------------------------------------------

  // A receive's bytes are in place (state Active, `lk` held): runs its continuation, if any, with
  // the mutex released, then marks it Done. A continuation that throws fails the receive, and
  // with it the collective.
  void complete_receive_locked(std::unique_lock<NotifyingMutex>& lk, const TransferPtr& t) {
    bool wake = progress_waiters_ > 0;
    if (t->on_arrival) {
      const std::function<bool()> next = std::move(t->on_arrival);
      t->on_arrival = nullptr;
      std::optional<std::string> error;
      lk.unlock();
      try {
        wake = next() || wake;
      } catch (const std::exception& e) {
        error = e.what();
      } catch (...) {
        error = "unknown exception";
      }
      lk.lock();
      if (error) {
        t->state = Transfer::State::Failed;
        t->error = Failure{FailureKind::Peer, fmt::format("{} failed while passing on received data: {}", me(), *error)};
        mu_.notify_all_locked();
        return;
      }
    }
    t->state = Transfer::State::Done;
    if (wake || progress_waiters_ > 0) mu_.notify_all_locked();
  }

  std::string size_mismatch(const Peer& p, std::size_t got, std::size_t want, const MsgKey& key) const {
    std::string msg = fmt::format("{} sent {} bytes where {} expected {}", p.name(), got, me(), want);
    if (key.type == FrameType::Data) msg += fmt::format(" (collective #{}, piece {})", key.seq, key.tag);
    return msg;
  }

  // ---- failure --------------------------------------------------------------------------------

  /// Records the first failure; `broadcast`: tell every peer (found here, or relayed).
  void fail_locked(Failure f, bool broadcast) {
    if (failure_) return;
    failure_ = f;
    if (metrics_) metrics_->failure(static_cast<int>(f.kind));
    if (observe::timeline_enabled()) {
      try {
        observe::Timeline::instance().instant("communicator failed", "failure", observe::Timeline::now_ns(),
                                              fmt::format("\"message\":\"{}\"", observe::detail::json_escape(f.message)));
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

  // Fails what waits on `p` and cannot complete any more (posted receives, queued sends).
  void fail_pending_locked(Peer& p, const Failure& f) {
    for (auto& [key, list] : p.posted) {
      for (auto& t : list) {
        t->state = Transfer::State::Failed;
        t->error = f;
      }
    }
    p.posted.clear();
    p.conn.fail_queued_locked(f);
  }

  void on_goodbye_locked(Peer& p) {
    if (p.state() != Connection::State::Open) return;
    p.state() = Connection::State::Closed;
    fail_pending_locked(p, closed_failure_locked(p.conn));
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
    fail_pending_locked(p, loss);
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
      const auto silent = p.conn.silence(now);
      if (options_.heartbeat_timeout.count() > 0 && silent > options_.heartbeat_timeout) {
        if (p.conn.bytes_waiting()) continue;  // alive: this thread is behind
        peer_down_locked(p, fmt::format("no heartbeat for {:.1f} s", std::chrono::duration<double>(silent).count()));
        continue;
      }
      if (p.conn.idle_locked() && now - p.conn.last_tx >= options_.heartbeat_interval / 2) {
        p.conn.enqueue_control_locked(FrameType::Heartbeat, 0, {});
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
  BlobPool blobs_;
  bool congestion_refusal_logged_ = false;  // io thread only
  // Threads blocked in Op::block that want waking whenever a transfer completes; one in
  // Op::wait_until is woken only by a continuation's request, a failure, or a descriptor.
  int progress_waiters_ = 0;
  // Set once after construction when every rank mapped one segment (setup_shared_memory);
  // used by the calling thread only.
  std::unique_ptr<SharedMemoryAllReduce> shared_memory_;
  // Several hosts (set_topology): groups by rank, this rank's group and its segment.
  std::vector<int> group_of_;
  std::vector<int> host_members_;
  std::unique_ptr<SharedMemoryAllReduce> host_memory_;
  // Rank 0 over TCP: its call whose descriptor table is not sent yet (relay_descriptors_locked).
  std::optional<std::pair<std::uint64_t, Descriptor>> root_pending_;
  // The call of the thread in Op::wait_until, if one is there (descriptor_wakes_locked).
  const Descriptor* quiet_desc_ = nullptr;
  std::uint64_t quiet_seq_ = 0;
};

}  // namespace net::detail
DISTRIBUTE_END_NAMESPACE

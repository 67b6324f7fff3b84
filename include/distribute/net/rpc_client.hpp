// Shared by net/ and ps/ (internal use): the client side of the transport's request/response
// protocol. A call is a Request frame (seq = call number, tag = operation) answered by a Reply frame
// (the same seq, tag 0 ok or 1 error), on a connection made by the transport's connector and
// handshake (as a service client: no rank, the same token proofs), read and written by its
// connection layer (bounded, framed, heartbeats both ways) on a network thread that every client of
// the process shares. The server is rpc_server.hpp.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/error.hpp>
#include <distribute/net/address.hpp>
#include <distribute/net/detail/auth.hpp>
#include <distribute/net/detail/client_loop.hpp>
#include <distribute/net/detail/connection.hpp>
#include <distribute/net/detail/connector.hpp>
#include <distribute/net/detail/handshake.hpp>
#include <distribute/net/options.hpp>
#include <distribute/net/refusal_log.hpp>
#include <distribute/net/rpc_errors.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net {

/// A client of one server: one connection, calls one at a time (thread-safe), reconnecting on the
/// next call after a failure. Every failure to reach the server is ConnectionLost naming it.
class RpcClient final : private detail::ConnectionOwner, private detail::Ticking {
 public:
  RpcClient(std::string address, std::string peer_name, RpcOptions options)
      : address_(std::move(address)), peer_(std::move(peer_name)), options_(std::move(options)),
        token_(detail::effective_cluster_token(options_.cluster_token)), target_(net::parse_host_port(address_)),
        shared_(detail::ClientLoop::instance()) {
    shared_->add(this);
  }

  ~RpcClient() {
    shared_->remove(this);
    std::unique_lock lk(mu_);
    retire_locked();
    // Nothing of the loop may touch this client once it is gone: wait until every connection it
    // had is closed on the loop and its last read and write have returned (a connection ends its
    // read without a notification, so this polls).
    const auto done = [&] {
      reap_locked();
      return retired_.empty() && posts_ == 0;
    };
    while (!mu_.wait_for(lk, std::chrono::milliseconds(2), done)) {
    }
  }

  RpcClient(const RpcClient&) = delete;
  RpcClient& operator=(const RpcClient&) = delete;

  const std::string& peer_name() const noexcept { return peer_; }
  const std::string& address() const noexcept { return address_; }

  /// Connects, retrying with back-off for up to `timeout` while the server is not up yet.
  void connect(std::chrono::milliseconds timeout) {
    std::lock_guard call(call_mutex_);
    connect_now(timeout);
  }

  /// One call: sends the request and waits for the reply (at most `timeout`, when given). `op` is
  /// an enumerator of the service's operations. Returns the reply's payload; an error reply
  /// throws RemoteError.
  template <class Op>
    requires std::is_enum_v<Op>
  std::vector<std::byte> call(Op op, std::span<const std::byte> payload,
                              std::optional<std::chrono::milliseconds> timeout = std::nullopt) {
    std::vector<std::byte> out;
    call_into(static_cast<std::uint64_t>(op), payload, timeout, [&](std::span<const std::byte> reply) {
      out.assign(reply.begin(), reply.end());
    });
    return out;
  }

  /// Like call(), but hands the reply to `take` (before the next call can reuse its buffer).
  template <class Take>
  void call_into(std::uint64_t op, std::span<const std::byte> payload, std::optional<std::chrono::milliseconds> timeout,
                 Take&& take) {
    PendingCall c = start_call(op, payload, timeout);
    finish_call(c, std::forward<Take>(take));
  }

  /// A call sent and not yet answered (start_call). The client makes no other call until it is
  /// finished; one left unfinished is finished when it goes, its reply or error dropped.
  class PendingCall {
   public:
    PendingCall(PendingCall&& other) noexcept
        : client_(std::exchange(other.client_, nullptr)), lock_(std::move(other.lock_)), sent_(std::move(other.sent_)),
          conn_(other.conn_), deadline_(other.deadline_), timeout_(other.timeout_) {}
    PendingCall& operator=(PendingCall&&) = delete;
    ~PendingCall() {
      if (!client_) return;
      try {
        client_->finish_call(*this, [](std::span<const std::byte>) {});
      } catch (...) {
      }
    }

   private:
    friend class RpcClient;
    explicit PendingCall(std::unique_lock<std::mutex> lock) : lock_(std::move(lock)) {}
    RpcClient* client_ = nullptr;  // set once the request is sent: who finishes it
    std::unique_lock<std::mutex> lock_;  // the client's call lock
    std::shared_ptr<detail::Transfer> sent_;
    detail::Connection* conn_ = nullptr;
    std::optional<detail::Clock::time_point> deadline_;
    std::optional<std::chrono::milliseconds> timeout_;
  };

  /// Sends a request and returns at once: calls to several servers go out together and are
  /// finished one after the other (finish_call). `payload` must stay valid until then.
  PendingCall start_call(std::uint64_t op, std::span<const std::byte> payload,
                         std::optional<std::chrono::milliseconds> timeout) {
    PendingCall c{std::unique_lock(call_mutex_)};
    if (!connected()) connect_now(timeout ? std::min(*timeout, options_.connect_timeout) : options_.connect_timeout);
    std::unique_lock lk(mu_);
    const std::uint64_t seq = ++seq_;
    replied_ = false;
    in_call_ = true;
    c.sent_ = std::make_shared<detail::Transfer>();
    c.sent_->is_send = true;
    c.sent_->size = payload.size();
    detail::OutFrame f;
    f.set_header(FrameHeader{FrameType::Request, payload.size(), seq, op});
    f.payload = payload.data();
    f.size = payload.size();
    f.transfer = c.sent_;
    c.conn_ = conn_.get();
    c.conn_->send_now_or_enqueue(lk, std::move(f));
    c.client_ = this;
    c.timeout_ = timeout;
    if (timeout) c.deadline_ = detail::Clock::now() + *timeout;
    return c;
  }

  /// Waits for the reply of `c` (at most its timeout) and hands it to `take`; an error reply
  /// throws RemoteError, a lost connection ConnectionLost, the timeout TimedOut.
  template <class Take>
  void finish_call(PendingCall& c, Take&& take) {
    c.client_ = nullptr;  // finished here, whatever happens
    const std::unique_lock<std::mutex> call_lock = std::move(c.lock_);
    detail::Connection* conn = c.conn_;
    std::unique_lock lk(mu_);
    auto over = [&] { return replied_ || lost_.has_value(); };
    if (c.deadline_) {
      mu_.wait_until(lk, *c.deadline_, over);
    } else {
      mu_.wait(lk, over);
    }
    if (!replied_) {
      std::optional<std::string> lost = lost_;
      if (!lost) {
        lost_ = fmt::format("call to {} ({}): timed out after {} ms", peer_, address_, c.timeout_->count());
        close_later_locked(*conn);
      }
      // The caller's payload may still be going out: wait until the connection is done with it.
      if (c.sent_->state == detail::Transfer::State::Queued) conn->unqueue_locked(c.sent_);
      awaiting_send_ = true;
      mu_.wait(lk, [&] { return c.sent_->state != detail::Transfer::State::Active; });
      awaiting_send_ = false;
      in_call_ = false;
      if (!lost) throw TimedOut(*lost_);
      throw ConnectionLost(*lost);
    }
    // The reply can be handled before the completion of the request's last write: wait for that.
    awaiting_send_ = true;
    mu_.wait(lk, [&] {
      return c.sent_->state != detail::Transfer::State::Active && c.sent_->state != detail::Transfer::State::Queued;
    });
    awaiting_send_ = false;
    in_call_ = false;
    const std::span<const std::byte> reply(reply_.data(), reply_len_);
    if (reply_status_ != 0) {
      const std::string_view text(reinterpret_cast<const char*>(reply.data()), reply.size());
      const auto bar = text.find('|');
      throw RemoteError(error_kind_from_name(text.substr(0, bar)),
                        bar == std::string_view::npos ? std::string(text) : std::string(text.substr(bar + 1)));
    }
    take(reply);
    if (reply_.size() > kKeptReplyBytes) std::vector<std::byte>().swap(reply_);
  }

  /// Thread-safe: fails a call in flight, or a connection being made (the next call reconnects).
  void abort() noexcept {
    {
      std::lock_guard dial(dial_mutex_);
      if (dialing_) dialing_->stop();
    }
    try {
      std::lock_guard lk(mu_);
      if (conn_ && !lost_) {
        lost_ = fmt::format("call to {} ({}): aborted", peer_, address_);
        close_later_locked(*conn_);
        mu_.notify_all_locked();
      }
    } catch (...) {
    }
  }

  /// Whether a connection is up (as far as this client knows).
  bool connected() {
    std::lock_guard lk(mu_);
    return conn_ && !lost_;
  }

  void disconnect() {
    std::lock_guard call(call_mutex_);
    std::lock_guard lk(mu_);
    retire_locked();
  }

 private:
  // ---- connecting -----------------------------------------------------------------------------

  // The connector and handshake run on an event loop of this call's own (this thread runs it, for
  // at most `timeout`); the authenticated socket then moves to the shared loop.
  void connect_now(std::chrono::milliseconds timeout) {
    {
      std::lock_guard lk(mu_);
      retire_locked();
    }
    const auto deadline = detail::Clock::now() + timeout;
    boost::asio::io_context io;
    detail::Handshaker handshaker(token_, options_.handshake_timeout);
    detail::Dialer dialer(io, handshaker, target_, options_.loopback_congestion_control, kMaxRetryWait);
    auto terms = std::make_shared<detail::ConnectorTerms>();
    terms->hello.service = true;
    terms->peer_name = peer_;
    terms->peer_address = address_;
    terms->me = "this client";
    terms->check = [this](const detail::Challenge& c) -> std::string {
      if (!c.service || c.size != 0 || c.rank != 0 || c.peer_rank != 0) {
        return fmt::format("{} ({}) answered as a rank of a communicator, not as a server", peer_, address_);
      }
      if (c.has_token != token_.has_value()) return fmt::format("{} did not prove the cluster token", peer_);
      return {};
    };
    terms->refused = [this](const std::string& text) {
      if (text == kRefusedText) {  // a server says no more to anyone
        return fmt::format("{} ({}) refused the connection (its log says why; the usual cause is a cluster token that "
                           "differs or is missing: DISTRIBUTE_CLUSTER_TOKEN)",
                           peer_, address_);
      }
      return fmt::format("{} ({}) refused the connection: {}", peer_, address_, text);
    };
    std::optional<detail::HandshakePtr> welcomed;
    std::optional<std::string> refused;
    std::string last_error = "no attempt yet";
    detail::Dialer::Hooks hooks;
    hooks.wanted = [&] { return detail::Clock::now() < deadline; };
    hooks.retry = [&](const std::string& reason) {
      last_error = reason;
      return detail::Clock::now() < deadline;
    };
    hooks.connected = [&](const detail::HandshakePtr& h) { welcomed = h; };
    hooks.refused = [&](const std::string& message) { refused = message; };
    {
      std::lock_guard dial(dial_mutex_);
      dialing_ = &io;
    }
    dialer.start(std::move(terms), std::move(hooks));
    io.run_for(deadline - detail::Clock::now() + std::chrono::milliseconds(1));
    {
      std::lock_guard dial(dial_mutex_);
      dialing_ = nullptr;
    }
    if (refused) throw ConnectionLost(*refused);
    if (!welcomed) {
      throw ConnectionLost(fmt::format("cannot reach {} at {} within {} ms: {}", peer_, address_, timeout.count(), last_error));
    }
    adopt((*welcomed)->socket, (*welcomed)->written);
  }

  void adopt(detail::tcp::socket& dialed, std::uint64_t handshake_bytes) {
    boost::system::error_code ec;
    const auto protocol = dialed.local_endpoint(ec).protocol();
    if (ec) throw ConnectionLost(fmt::format("connect to {} ({}): {}", peer_, address_, ec.message()));
    detail::tcp::socket socket(shared_->loop().io());
    socket.assign(protocol, dialed.release(), ec);
    if (ec) throw ConnectionLost(fmt::format("connect to {} ({}): {}", peer_, address_, ec.message()));
    socket.set_option(detail::tcp::no_delay(true), ec);
    std::lock_guard lk(mu_);
    conn_ = std::make_unique<detail::Connection>(static_cast<ConnectionOwner&>(*this), mu_, shared_->loop().io(), 0, peer_,
                                                 address_, options_.max_frame_bytes);
    conn_->open_locked(std::move(socket), handshake_bytes);
    lost_.reset();
    seq_ = 0;
    ++posts_;
    shared_->loop().post([this, c = conn_.get()] {
      c->start_reading();
      std::lock_guard g(mu_);
      --posts_;
      mu_.notify_all_locked();
    });
  }

  // ---- closing --------------------------------------------------------------------------------

  // Sockets are closed on the loop's thread, as everywhere in the transport.
  void close_later_locked(detail::Connection& c) {
    ++posts_;
    shared_->loop().post([this, &c] {
      std::lock_guard g(mu_);
      c.state = detail::Connection::State::Closed;
      c.close_locked();
      c.fail_queued_locked(detail::Failure{detail::FailureKind::Peer, lost_.value_or("closed")});
      --posts_;
      mu_.notify_all_locked();
    });
  }

  // The current connection is done with: closed on the loop, kept until nothing refers to it.
  void retire_locked() {
    if (!conn_) return;
    if (!lost_) lost_ = fmt::format("call to {} ({}): disconnected", peer_, address_);
    close_later_locked(*conn_);
    retired_.push_back(std::move(conn_));
  }

  void reap_locked() {
    if (posts_ > 0) return;  // a posted close may still refer to a retired connection
    std::erase_if(retired_, [](const std::unique_ptr<detail::Connection>& c) { return c->quiescent_locked(); });
  }

  // ---- what the connection reports (loop thread) ------------------------------------------------

  detail::FrameIntake intake(const detail::Connection&, FrameType type) const noexcept override {
    switch (type) {
      case FrameType::Heartbeat: return detail::FrameIntake::Heartbeat;
      case FrameType::Goodbye: return detail::FrameIntake::Goodbye;
      case FrameType::Reply: return detail::FrameIntake::Bulk;
      default: return detail::FrameIntake::Refuse;
    }
  }

  void on_goodbye(detail::Connection& c) override {
    std::lock_guard lk(mu_);
    c.half_close_when_written_locked();
    lose_locked(c, fmt::format("{} ({}) closed the connection: it stopped serving", peer_, address_));
  }

  void on_control(detail::Connection&, const FrameHeader& h, std::span<const std::byte>) override {
    throw FrameError(fmt::format("unexpected {} frame", to_string(h.type)));
  }

  std::byte* begin_bulk(detail::Connection& c, const FrameHeader& h) override {
    std::lock_guard lk(mu_);
    if (&c != conn_.get() || !in_call_ || replied_ || h.seq != seq_) {
      out_of_turn_ = fmt::format("{} ({}) answered out of turn ({} frame #{}, expected reply #{})", peer_, address_,
                                 to_string(h.type), h.seq, seq_);
      throw FrameError(out_of_turn_);
    }
    reply_status_ = h.tag;
    return nullptr;  // reply_ grows as the bytes arrive (grow_bulk)
  }

  std::byte* grow_bulk(detail::Connection&, std::size_t bytes) override {
    // Only this thread touches reply_ until the reply is complete. It keeps its largest size, so a
    // reply costs no allocation and no zero-filling after the first of its size.
    if (reply_.size() < bytes) {
      try {
        reply_.resize(bytes);
      } catch (const std::bad_alloc&) {
        throw FrameError(fmt::format("cannot buffer a reply of {} bytes: out of memory", bytes));
      }
    }
    return reply_.data();
  }

  void end_bulk(detail::Connection& c) override {
    std::lock_guard lk(mu_);
    reply_len_ = static_cast<std::size_t>(c.current().length);
    replied_ = true;
    mu_.notify_all_locked();
  }

  void on_read_failed(detail::Connection& c, const std::string& reason, bool malformed) override {
    std::lock_guard lk(mu_);
    std::string why = !out_of_turn_.empty() ? std::exchange(out_of_turn_, std::string())
                      : malformed         ? fmt::format("{} ({}) sent a malformed reply: {}", peer_, address_, reason)
                                          : fmt::format("call to {} ({}): {}", peer_, address_, reason);
    lose_locked(c, std::move(why));
    c.close_locked();
    mu_.notify_all_locked();  // a call may wait for its reply
  }

  detail::Failure loss_locked(const detail::Connection&, const std::string& reason) const override {
    return detail::Failure{detail::FailureKind::Peer, fmt::format("call to {} ({}): {}", peer_, address_, reason)};
  }
  detail::Failure closed_failure_locked(const detail::Connection&) const override {
    return detail::Failure{detail::FailureKind::Peer, lost_.value_or(fmt::format("call to {} ({}): closed", peer_, address_))};
  }
  void on_write_failed_locked(detail::Connection& c, const std::string& reason) override {
    lose_locked(c, fmt::format("call to {} ({}): {}", peer_, address_, reason));
    c.close_locked();
  }
  bool wake_on_progress_locked() const noexcept override { return awaiting_send_; }

  // The connection `c` cannot carry calls any more; a call waiting on it fails with `why`.
  void lose_locked(detail::Connection& c, std::string why) {
    if (c.state == detail::Connection::State::Open) c.state = detail::Connection::State::Failed;
    c.fail_queued_locked(detail::Failure{detail::FailureKind::Peer, why});
    if (&c == conn_.get() && !lost_) lost_ = std::move(why);
    mu_.notify_all_locked();
  }

  // ---- heartbeats (the shared loop's tick) ------------------------------------------------------

  void tick(detail::Clock::time_point now) override {
    std::lock_guard lk(mu_);
    reap_locked();
    if (!conn_ || lost_ || !conn_->is_open_locked()) return;
    detail::Connection& c = *conn_;
    if (const auto silent = c.heartbeat_locked(now, options_.heartbeat_interval, options_.heartbeat_timeout)) {
      lose_locked(c, fmt::format("call to {} ({}): no heartbeat for {:.1f} s", peer_, address_,
                                 std::chrono::duration<double>(*silent).count()));
      c.close_locked();
    }
  }

  // A reply buffer larger than this is not kept for the next call.
  static constexpr std::size_t kKeptReplyBytes = std::size_t{64} << 20;
  // Between two connection attempts, at most this long.
  static constexpr std::chrono::milliseconds kMaxRetryWait{500};

  std::string address_;
  std::string peer_;
  RpcOptions options_;
  std::optional<std::string> token_;
  net::HostPort target_;
  std::shared_ptr<detail::ClientLoop> shared_;
  std::mutex call_mutex_;  // one call (or connect) at a time
  std::mutex dial_mutex_;
  boost::asio::io_context* dialing_ = nullptr;  // the connect in progress, for abort()
  // Guarded by mu_.
  mutable detail::NotifyingMutex mu_;
  std::unique_ptr<detail::Connection> conn_;
  std::vector<std::unique_ptr<detail::Connection>> retired_;  // closed, until their last I/O returned
  int posts_ = 0;                                             // handlers posted to the loop, not run yet
  std::optional<std::string> lost_;                           // why conn_ carries no more calls
  std::uint64_t seq_ = 0;
  bool in_call_ = false;
  bool awaiting_send_ = false;  // the caller waits for its request's last write
  bool replied_ = false;
  std::uint64_t reply_status_ = 0;
  std::size_t reply_len_ = 0;
  std::string out_of_turn_;  // loop thread
  // The reply's bytes: written by the loop thread while a call waits, read by the caller after.
  std::vector<std::byte> reply_;
};

}  // namespace net
DISTRIBUTE_END_NAMESPACE

// The parameter-server service's wire layer, client side and what both sides share: request/reply
// calls over TCP (Boost.Asio), framed with net/frame.hpp's versioned header (Request/Reply frames),
// authenticated with the cluster token by HMAC-SHA256 challenge-response both ways before any call,
// every wait bounded by a deadline. The server is in rpc_server.hpp.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <sys/socket.h>

#include <boost/asio.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>

#include <distribute/core/error.hpp>
#include <distribute/net/detail/address.hpp>
#include <distribute/net/detail/auth.hpp>
#include <distribute/net/refusal_log.hpp>
#include <distribute/net/detail/transfer_all.hpp>
#include <distribute/net/frame.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace detail {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using RpcClock = std::chrono::steady_clock;

/// The peer could not be reached, or the connection broke or timed out: the peer may be dead.
class ConnectionLost : public PeerFailure {
 public:
  using PeerFailure::PeerFailure;
};

/// The peer answered a call with an error; `kind` names its exception type ("InvalidArgument"...).
class RemoteError : public Error {
 public:
  RemoteError(std::string kind, const std::string& message) : Error(message), kind_(std::move(kind)) {}
  const std::string& kind() const noexcept { return kind_; }

 private:
  std::string kind_;
};

enum class RpcOp : std::uint64_t {
  Ping = 1,
  CreateVar = 2,
  ReadVar = 3,
  ReadRows = 4,
  UpdateVar = 5,
  Commit = 6,
  RunClosure = 7,
  MakeDataset = 8,
  Stop = 9,
};

/// A read or write did not complete within its deadline.
class TimedOut : public ConnectionLost {
 public:
  using ConnectionLost::ConnectionLost;
};

struct RpcOptions {
  /// How long a first connection retries (with back-off) while the server starts.
  std::chrono::milliseconds connect_timeout{60000};
  /// The whole handshake; also how long a silent stranger may hold a socket.
  std::chrono::milliseconds handshake_timeout{5000};
  /// Server: once a request has begun, each piece of it (its header's rest, each MiB of payload)
  /// must arrive within this, so a half-sent frame does not hold a connection forever.
  std::chrono::milliseconds read_timeout{30000};
  /// Server: how long an authenticated connection may stay silent between requests (none: as long
  /// as it likes; a coordinator's connections are idle between closures).
  std::optional<std::chrono::milliseconds> idle_timeout = std::nullopt;
  /// Server: connections still in their handshake (or an HTTP request) at once; beyond it a new
  /// connection is closed as soon as it is accepted. Also capped by the descriptor limit
  /// (RLIMIT_NOFILE), so that strangers cannot use up the descriptors a worker needs.
  std::size_t max_pending_connections = 64;
  /// Shared secret (see net::CommunicatorOptions::cluster_token): unset means the
  /// DISTRIBUTE_CLUSTER_TOKEN environment variable, "" means none.
  std::optional<std::string> cluster_token = std::nullopt;
  std::size_t max_frame_bytes = std::size_t{1} << 31;
  /// Refused connections are reported here; default: one line on stderr.
  std::function<void(std::string_view)> log = {};
};

/// The exception type's name, for an error reply.
inline std::string error_kind(const std::exception& e) {
  if (dynamic_cast<const ClusterConfigError*>(&e)) return "ClusterConfigError";
  if (dynamic_cast<const InvalidArgument*>(&e)) return "InvalidArgument";
  if (dynamic_cast<const OutOfRange*>(&e)) return "OutOfRange";
  if (dynamic_cast<const PeerFailure*>(&e)) return "PeerFailure";
  if (dynamic_cast<const CollectiveTimeout*>(&e)) return "CollectiveTimeout";
  if (dynamic_cast<const CheckpointError*>(&e)) return "CheckpointError";
  if (dynamic_cast<const Unavailable*>(&e)) return "Unavailable";
  if (dynamic_cast<const Cancelled*>(&e)) return "Cancelled";
  return "Error";
}

/// Rethrows an error reply as the library's exception of that kind.
[[noreturn]] inline void throw_as_kind(const std::string& kind, const std::string& message) {
  if (kind == "ClusterConfigError") throw ClusterConfigError(message);
  if (kind == "InvalidArgument") throw InvalidArgument(message);
  if (kind == "OutOfRange") throw OutOfRange(message);
  if (kind == "PeerFailure") throw PeerFailure(message);
  if (kind == "CollectiveTimeout") throw CollectiveTimeout(message);
  if (kind == "CheckpointError") throw CheckpointError(message);
  if (kind == "Unavailable") throw Unavailable(message);
  if (kind == "Cancelled") throw Cancelled(message);
  throw Error(message);
}

/// A random 64-bit id (sessions, server incarnations), from OpenSSL like the handshake nonces.
inline std::uint64_t random_id() {
  const net::detail::Nonce n = net::detail::random_nonce();
  std::uint64_t id = 0;
  std::memcpy(&id, n.data(), sizeof id);
  return id;
}

inline std::vector<std::byte> to_bytes(std::string_view s) {
  std::vector<std::byte> out(s.size());
  if (!s.empty()) std::memcpy(out.data(), s.data(), s.size());
  return out;
}
inline std::string_view as_chars(std::span<const std::byte> b) {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

/// One socket with an io_context of its own, so that every operation can run under a deadline:
/// start it, run the context for at most the time left, and close the socket if it is not done.
class FramedStream {
 public:
  FramedStream() : socket_(io_) {}
  FramedStream(const FramedStream&) = delete;
  FramedStream& operator=(const FramedStream&) = delete;

  tcp::socket& socket() noexcept { return socket_; }

  /// Runs what `start(ec)` starts until it completes or `timeout` passes (none: no limit).
  template <class Start>
  void run(Start&& start, std::optional<RpcClock::duration> timeout, std::string_view what) {
    boost::system::error_code ec = asio::error::would_block;
    start(ec);
    io_.restart();
    if (timeout) {
      io_.run_for(*timeout);
    } else {
      io_.run();
    }
    if (ec == asio::error::would_block) {
      close();
      io_.restart();
      io_.run();
      throw TimedOut(fmt::format("{}: timed out after {} ms", what,
                                 std::chrono::duration_cast<std::chrono::milliseconds>(*timeout).count()));
    }
    if (ec) throw ConnectionLost(fmt::format("{}: {}", what, describe(ec)));
  }

  void connect(const tcp::resolver::results_type& endpoints, RpcClock::duration timeout, std::string_view what) {
    run([&](boost::system::error_code& ec) {
          asio::async_connect(socket_, endpoints, [&ec](const boost::system::error_code& e, const tcp::endpoint&) { ec = e; });
        },
        timeout, what);
    socket_.set_option(tcp::no_delay(true));
    fd_.store(socket_.native_handle());
  }

  void adopt_accepted() {
    socket_.set_option(tcp::no_delay(true));
    fd_.store(socket_.native_handle());
  }

  void write_frame(net::FrameType type, std::uint64_t seq, std::uint64_t tag, std::span<const std::byte> payload,
                   std::optional<RpcClock::duration> timeout, std::string_view what) {
    net::FrameHeader h{type, payload.size(), seq, tag};
    const net::HeaderBytes head = net::encode_header(h);
    std::array<asio::const_buffer, 2> bufs{asio::buffer(head), asio::buffer(payload.data(), payload.size())};
    run([&](boost::system::error_code& ec) {
          asio::async_write(socket_, bufs, net::detail::TransferAllUncapped{}, [&ec](const boost::system::error_code& e, std::size_t) { ec = e; });
        },
        timeout, what);
  }

  void read_exact(std::span<std::byte> dst, std::optional<RpcClock::duration> timeout, std::string_view what) {
    if (dst.empty()) return;
    run([&](boost::system::error_code& ec) {
          asio::async_read(socket_, asio::buffer(dst.data(), dst.size()), net::detail::TransferAllUncapped{},
                           [&ec](const boost::system::error_code& e, std::size_t) { ec = e; });
        },
        timeout, what);
  }

  /// Reads some bytes, at least one, into `dst`; returns how many.
  std::size_t read_some(std::span<std::byte> dst, std::optional<RpcClock::duration> timeout, std::string_view what) {
    std::size_t got = 0;
    run([&](boost::system::error_code& ec) {
          asio::async_read(socket_, asio::buffer(dst.data(), dst.size()), asio::transfer_at_least(1),
                           [&ec, &got](const boost::system::error_code& e, std::size_t n) {
                             got = n;
                             ec = e;
                           });
        },
        timeout, what);
    return got;
  }

  /// Payloads are read this much at a time, the buffer growing as bytes arrive: a header that
  /// claims much and sends little costs the reader what was sent, not what was claimed.
  static constexpr std::size_t kReadChunk = std::size_t{1} << 20;

  /// Reads one frame whose first `have` header bytes were already read into `head`: the first byte
  /// within `first` (none: no limit), every later piece within `rest` (none: as `first`).
  net::Frame read_frame(std::size_t max_bytes, std::optional<RpcClock::duration> first, std::string_view what,
                        net::HeaderBytes head = {}, std::size_t have = 0,
                        std::optional<RpcClock::duration> rest = std::nullopt) {
    if (!rest) rest = first;
    if (have == 0) have = read_some(head, first, what);
    read_exact(std::span(head).subspan(have), rest, what);
    net::Frame f;
    f.header = net::decode_header(head, max_bytes);  // FrameError on malformed input
    const auto length = static_cast<std::size_t>(f.header.length);
    for (std::size_t got = 0; got < length;) {
      const std::size_t step = std::min(kReadChunk, length - got);
      f.payload.resize(got + step);
      read_exact(std::span(f.payload).subspan(got, step), rest, what);
      got += step;
    }
    return f;
  }

  /// Thread-safe: makes an operation in flight on another thread fail at once.
  void abort() noexcept {
    std::lock_guard lock(fd_mutex_);
    const int fd = fd_.load();
    if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
  }

  void close() noexcept {
    std::lock_guard lock(fd_mutex_);
    fd_.store(-1);
    boost::system::error_code ignored;
    socket_.close(ignored);
  }

  static std::string describe(const boost::system::error_code& ec) {
    if (ec == asio::error::eof) return "connection closed by the peer";
    return ec.message();
  }

 private:
  asio::io_context io_;
  tcp::socket socket_;
  std::atomic<int> fd_{-1};
  std::mutex fd_mutex_;
};

// The handshake, the same whatever the token (so that a mismatch is reported, not misread):
//   client -> Hello     nonce_c
//   server -> Challenge nonce_s, HMAC(token, "ps-server" nonce_c nonce_s)   (MAC empty: no token)
//   client -> Response  HMAC(token, "ps-client" nonce_s nonce_c)            (MAC empty: no token)
//   server -> Welcome | Reject(reason)
inline net::detail::Mac handshake_mac(std::string_view token, std::string_view role, std::span<const std::byte> a,
                                      std::span<const std::byte> b) {
  std::vector<std::byte> msg = to_bytes(role);
  msg.insert(msg.end(), a.begin(), a.end());
  msg.insert(msg.end(), b.begin(), b.end());
  return net::detail::hmac_sha256(token, msg);
}

/// A client of one server: one connection, calls one at a time (thread-safe), reconnecting on the
/// next call after a failure. Every failure to reach the server is ConnectionLost naming it.
class RpcClient {
 public:
  RpcClient(std::string address, std::string peer_name, RpcOptions options)
      : address_(std::move(address)), peer_(std::move(peer_name)), options_(std::move(options)),
        token_(net::detail::effective_cluster_token(options_.cluster_token)) {}

  const std::string& peer_name() const noexcept { return peer_; }
  const std::string& address() const noexcept { return address_; }

  /// Connects, retrying with back-off for up to `timeout` while the server is not up yet.
  void connect(std::chrono::milliseconds timeout) {
    std::lock_guard lock(mutex_);
    connect_locked(timeout);
  }

  /// One call: sends the request and waits for the reply (at most `timeout`, when given).
  /// Returns the reply's payload; an error reply throws RemoteError.
  std::vector<std::byte> call(RpcOp op, std::span<const std::byte> payload,
                              std::optional<std::chrono::milliseconds> timeout = std::nullopt) {
    std::lock_guard lock(mutex_);
    if (!stream_) connect_locked(timeout ? std::min(*timeout, options_.connect_timeout) : options_.connect_timeout);
    const std::uint64_t seq = ++seq_;
    net::Frame reply;
    try {
      const auto what = fmt::format("call to {} ({})", peer_, address_);
      stream_->write_frame(net::FrameType::Request, seq, static_cast<std::uint64_t>(op), payload, timeout, what);
      reply = stream_->read_frame(options_.max_frame_bytes, timeout, what);
    } catch (const net::FrameError& e) {
      drop_locked();
      throw ConnectionLost(fmt::format("{} ({}) sent a malformed reply: {}", peer_, address_, e.what()));
    } catch (...) {
      drop_locked();
      throw;
    }
    if (reply.header.type != net::FrameType::Reply || reply.header.seq != seq) {
      drop_locked();
      throw ConnectionLost(fmt::format("{} ({}) answered out of turn ({} frame #{}, expected reply #{})", peer_,
                                       address_, net::to_string(reply.header.type), reply.header.seq, seq));
    }
    if (reply.header.tag != 0) {
      const std::string_view text = as_chars(reply.payload);
      const auto bar = text.find('|');
      throw RemoteError(std::string(text.substr(0, bar)),
                        bar == std::string_view::npos ? std::string(text) : std::string(text.substr(bar + 1)));
    }
    return std::move(reply.payload);
  }

  /// Thread-safe: fails a call in flight (the next call reconnects).
  void abort() noexcept {
    std::lock_guard lock(abort_mutex_);
    if (live_) live_->abort();
  }

  bool connected() {
    std::lock_guard lock(mutex_);
    return stream_ != nullptr;
  }

  void disconnect() {
    std::lock_guard lock(mutex_);
    drop_locked();
  }

 private:
  void drop_locked() {
    std::lock_guard lock(abort_mutex_);
    if (stream_) stream_->close();
    stream_.reset();
    live_.reset();
  }

  void connect_locked(std::chrono::milliseconds timeout) {
    const auto deadline = RpcClock::now() + timeout;
    auto backoff = std::chrono::milliseconds(20);
    std::string last_error;
    const auto hp = net::detail::parse_host_port(address_);
    for (;;) {
      auto stream = std::make_shared<FramedStream>();
      {
        std::lock_guard lock(abort_mutex_);
        live_ = stream;
      }
      try {
        asio::io_context resolver_io;
        tcp::resolver resolver(resolver_io);
        const auto endpoints = resolver.resolve(hp.host, hp.port);
        const auto left = std::max<RpcClock::duration>(deadline - RpcClock::now(), std::chrono::milliseconds(50));
        stream->connect(endpoints, std::min<RpcClock::duration>(left, options_.handshake_timeout),
                        fmt::format("connect to {} ({})", peer_, address_));
        handshake(*stream);
        stream_ = std::move(stream);
        seq_ = 0;
        return;
      } catch (const RemoteError& e) {  // refused by the server: retrying will not help
        stream->close();
        if (std::string_view(e.what()) == net::kRefusedText) {  // a server says no more to anyone
          throw ConnectionLost(fmt::format("{} ({}) refused the connection (its log says why; the usual cause is a "
                                           "cluster token that differs or is missing: DISTRIBUTE_CLUSTER_TOKEN)",
                                           peer_, address_));
        }
        throw ConnectionLost(fmt::format("{} ({}) refused the connection: {}", peer_, address_, e.what()));
      } catch (const std::exception& e) {
        stream->close();
        last_error = e.what();
      }
      {
        std::lock_guard lock(abort_mutex_);
        live_.reset();
      }
      if (RpcClock::now() + backoff >= deadline) break;
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
    }
    throw ConnectionLost(fmt::format("cannot reach {} at {} within {} ms: {}", peer_, address_, timeout.count(),
                                     last_error));
  }

  void handshake(FramedStream& s) {
    const auto limit = options_.handshake_timeout;
    const auto what = fmt::format("handshake with {} ({})", peer_, address_);
    const net::detail::Nonce mine = net::detail::random_nonce();
    s.write_frame(net::FrameType::Hello, 0, 0, mine, limit, what);
    net::Frame challenge = s.read_frame(net::kMaxPreAuthPayload, limit, what);
    if (challenge.header.type == net::FrameType::Reject) throw RemoteError("Error", std::string(as_chars(challenge.payload)));
    if (challenge.header.type != net::FrameType::Challenge || challenge.payload.size() < net::detail::kNonceBytes) {
      throw ConnectionLost(fmt::format("{}: expected a challenge, got a {} frame", what, net::to_string(challenge.header.type)));
    }
    const std::span<const std::byte> theirs(challenge.payload.data(), net::detail::kNonceBytes);
    const auto their_mac = std::span<const std::byte>(challenge.payload).subspan(net::detail::kNonceBytes);
    std::vector<std::byte> response;
    if (token_) {
      const auto want = handshake_mac(*token_, "ps-server", mine, theirs);
      if (their_mac.size() != want.size() ||
          !net::detail::macs_equal(want, *reinterpret_cast<const net::detail::Mac*>(their_mac.data()))) {
        throw RemoteError("Error", fmt::format("{} did not prove the cluster token", peer_));
      }
      const auto mac = handshake_mac(*token_, "ps-client", theirs, mine);
      response.assign(mac.begin(), mac.end());
    }
    s.write_frame(net::FrameType::Response, 0, 0, response, limit, what);
    net::Frame verdict = s.read_frame(net::kMaxPreAuthPayload, limit, what);
    if (verdict.header.type == net::FrameType::Reject) throw RemoteError("Error", std::string(as_chars(verdict.payload)));
    if (verdict.header.type != net::FrameType::Welcome) {
      throw ConnectionLost(fmt::format("{}: expected welcome, got a {} frame", what, net::to_string(verdict.header.type)));
    }
  }

  std::string address_;
  std::string peer_;
  RpcOptions options_;
  std::optional<std::string> token_;
  std::mutex mutex_;                      // one call at a time
  std::shared_ptr<FramedStream> stream_;  // connected and welcomed
  std::mutex abort_mutex_;
  std::shared_ptr<FramedStream> live_;  // what abort() interrupts (connecting or connected)
  std::uint64_t seq_ = 0;
};

}  // namespace detail
DISTRIBUTE_END_NAMESPACE

// The parameter-server service's wire layer: request/reply calls over TCP (Boost.Asio), framed with
// net/frame.hpp's versioned header (Request/Reply frames), authenticated with the cluster token by
// HMAC-SHA256 challenge-response both ways before any call, and every client-side wait bounded by a
// deadline. The same port answers plain HTTP GETs (/healthz, /metrics) through Boost.Beast, sniffed
// from the first bytes, so a server needs one address only.
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

struct RpcOptions {
  /// How long a first connection retries (with back-off) while the server starts.
  std::chrono::milliseconds connect_timeout{60000};
  /// The whole handshake; also how long a silent stranger may hold a socket.
  std::chrono::milliseconds handshake_timeout{5000};
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
      throw ConnectionLost(fmt::format("{}: timed out after {} ms", what,
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

  /// Reads one frame whose first `have` header bytes were already read into `head`.
  net::Frame read_frame(std::size_t max_bytes, std::optional<RpcClock::duration> timeout, std::string_view what,
                        net::HeaderBytes head = {}, std::size_t have = 0) {
    read_exact(std::span(head).subspan(have), timeout, what);
    net::Frame f;
    f.header = net::decode_header(head, max_bytes);  // FrameError on malformed input
    f.payload.resize(static_cast<std::size_t>(f.header.length));
    read_exact(f.payload, timeout, what);
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
    net::Frame challenge = s.read_frame(net::kMaxControlPayload, limit, what);
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
    net::Frame verdict = s.read_frame(net::kMaxControlPayload, limit, what);
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

/// The server side: accepts connections on `address`, one thread per connection (peers are the
/// coordinator and the workers: few), answers each request with `handler(op, payload)`; an
/// exception from the handler becomes an error reply. HTTP GETs get `http(target)`.
class RpcServer {
 public:
  using Handler = std::function<std::vector<std::byte>(RpcOp, std::span<const std::byte>)>;
  /// Returns {status, content type, body} for an HTTP GET of `target`.
  struct HttpReply {
    unsigned status = 404;
    std::string content_type = "text/plain; charset=utf-8";
    std::string body = "not found\n";
  };
  using HttpHandler = std::function<HttpReply(std::string_view target)>;

  RpcServer(std::string address, std::string name, RpcOptions options, Handler handler, HttpHandler http)
      : name_(std::move(name)), options_(std::move(options)), token_(net::detail::effective_cluster_token(options_.cluster_token)),
        handler_(std::move(handler)), http_(std::move(http)), acceptor_(io_) {
    const auto hp = net::detail::parse_host_port(address);
    tcp::resolver resolver(io_);
    boost::system::error_code ec;
    auto endpoints = resolver.resolve(hp.host, hp.port, ec);
    if (ec || endpoints.empty()) {
      throw Unavailable(fmt::format("{}: cannot resolve the address '{}': {}", name_, address, ec.message()));
    }
    const tcp::endpoint ep = endpoints.begin()->endpoint();
    acceptor_.open(ep.protocol());
    acceptor_.set_option(asio::socket_base::reuse_address(true));
    acceptor_.bind(ep, ec);
    if (ec) {
      throw Unavailable(fmt::format("{}: cannot listen on {}: {}", name_, address, ec.message()));
    }
    acceptor_.listen();
    port_ = acceptor_.local_endpoint().port();
    accept_thread_ = std::thread([this] { accept_loop(); });
  }

  RpcServer(const RpcServer&) = delete;
  RpcServer& operator=(const RpcServer&) = delete;
  ~RpcServer() { stop(); }

  std::uint16_t port() const noexcept { return port_; }

  /// Stops accepting, fails every open connection and waits for their threads. Idempotent.
  void stop() {
    if (stopped_.exchange(true)) return;
    ::shutdown(acceptor_.native_handle(), SHUT_RDWR);  // wakes the blocked accept
    if (accept_thread_.joinable()) accept_thread_.join();
    boost::system::error_code ignored;
    acceptor_.close(ignored);
    std::list<Connection> conns;
    {
      std::lock_guard lock(mutex_);
      conns.splice(conns.end(), connections_);
    }
    for (auto& c : conns) c.stream->abort();
    for (auto& c : conns) {
      if (c.thread.joinable()) c.thread.join();
    }
  }

 private:
  struct Connection {
    std::shared_ptr<FramedStream> stream;
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> finished = std::make_shared<std::atomic<bool>>(false);
  };

  void log(const std::string& line) const {
    if (options_.log) {
      options_.log(line);
    } else {
      std::fputs((line + "\n").c_str(), stderr);
    }
  }

  void accept_loop() {
    while (!stopped_) {
      auto stream = std::make_shared<FramedStream>();
      boost::system::error_code ec;
      acceptor_.accept(stream->socket(), ec);
      if (ec || stopped_) return;
      stream->adopt_accepted();
      std::lock_guard lock(mutex_);
      for (auto it = connections_.begin(); it != connections_.end();) {  // reap finished ones
        if (it->finished->load()) {
          it->thread.join();
          it = connections_.erase(it);
        } else {
          ++it;
        }
      }
      Connection c;
      c.stream = stream;
      auto finished = c.finished;
      c.thread = std::thread([this, stream, finished] {
        serve(*stream);
        stream->close();
        finished->store(true);
      });
      connections_.push_back(std::move(c));
    }
  }

  std::string peer_of(FramedStream& s) {
    boost::system::error_code ec;
    auto ep = s.socket().remote_endpoint(ec);
    return ec ? std::string("?") : fmt::format("{}:{}", ep.address().to_string(), ep.port());
  }

  void serve(FramedStream& s) {
    const std::string who = peer_of(s);
    net::HeaderBytes head{};
    try {
      s.read_exact(std::span(head).first(4), options_.handshake_timeout, "first bytes");
    } catch (const std::exception&) {
      return;
    }
    if (std::memcmp(head.data(), "GET ", 4) == 0) return serve_http(s, head);
    try {
      net::Frame hello = s.read_frame(net::kMaxControlPayload, options_.handshake_timeout, "hello", head, 4);
      if (!accept_peer(s, hello, who)) return;
      for (;;) {
        net::Frame req = s.read_frame(options_.max_frame_bytes, std::nullopt, "request");
        if (req.header.type != net::FrameType::Request) {
          log(fmt::format("{}: closing the connection from {}: unexpected {} frame", name_, who,
                          net::to_string(req.header.type)));
          return;
        }
        std::vector<std::byte> out;
        std::uint64_t status = 0;
        const auto op = static_cast<RpcOp>(req.header.tag);
        try {
          out = handler_(op, req.payload);
        } catch (const std::exception& e) {
          status = 1;
          out = to_bytes(error_kind(e) + "|" + e.what());
        }
        s.write_frame(net::FrameType::Reply, req.header.seq, status, out, std::nullopt, "reply");
        if (op == RpcOp::Stop && status == 0) return;
      }
    } catch (const net::FrameError& e) {
      log(fmt::format("{}: closing the connection from {}: malformed frame: {}", name_, who, e.what()));
    } catch (const std::exception&) {
      // The peer went away (EOF, reset) or we are stopping: nothing to report.
    }
  }

  bool accept_peer(FramedStream& s, const net::Frame& hello, const std::string& who) {
    const auto limit = options_.handshake_timeout;
    auto reject = [&](const std::string& reason) {
      log(fmt::format("{}: refused a connection from {}: {}", name_, who, reason));
      try {
        s.write_frame(net::FrameType::Reject, 0, 0, to_bytes(reason), limit, "reject");
      } catch (const std::exception&) {
      }
      return false;
    };
    if (hello.header.type != net::FrameType::Hello || hello.payload.size() != net::detail::kNonceBytes) {
      return reject(fmt::format("expected a hello frame, got {}", net::to_string(hello.header.type)));
    }
    const net::detail::Nonce mine = net::detail::random_nonce();
    std::vector<std::byte> challenge(mine.begin(), mine.end());
    if (token_) {
      const auto mac = handshake_mac(*token_, "ps-server", hello.payload, mine);
      challenge.insert(challenge.end(), mac.begin(), mac.end());
    }
    s.write_frame(net::FrameType::Challenge, 0, 0, challenge, limit, "challenge");
    net::Frame response = s.read_frame(net::kMaxControlPayload, limit, "response");
    if (response.header.type != net::FrameType::Response) {
      return reject(fmt::format("expected a response frame, got {}", net::to_string(response.header.type)));
    }
    if (token_) {
      const auto want = handshake_mac(*token_, "ps-client", mine, hello.payload);
      if (response.payload.size() != want.size()) return reject("the peer did not present the cluster token");
      if (!net::detail::macs_equal(want, *reinterpret_cast<const net::detail::Mac*>(response.payload.data()))) {
        return reject("the peer's proof of the cluster token is wrong");
      }
    }
    s.write_frame(net::FrameType::Welcome, 0, 0, {}, limit, "welcome");
    return true;
  }

  void serve_http(FramedStream& s, const net::HeaderBytes& head) {
    namespace http = boost::beast::http;
    try {
      boost::beast::flat_buffer buffer;
      auto space = buffer.prepare(4);
      std::memcpy(space.data(), head.data(), 4);
      buffer.commit(4);
      http::request<http::string_body> req;
      s.run([&](boost::system::error_code& ec) {
             http::async_read(s.socket(), buffer, req, [&ec](const boost::system::error_code& e, std::size_t) { ec = e; });
           },
           options_.handshake_timeout, "http request");
      HttpReply r = http_ ? http_(std::string_view(req.target().data(), req.target().size())) : HttpReply{};
      http::response<http::string_body> res{static_cast<http::status>(r.status), req.version()};
      res.set(http::field::content_type, r.content_type);
      res.set(http::field::server, "distribute");
      res.keep_alive(false);
      res.body() = std::move(r.body);
      res.prepare_payload();
      s.run([&](boost::system::error_code& ec) {
             http::async_write(s.socket(), res, [&ec](const boost::system::error_code& e, std::size_t) { ec = e; });
           },
           options_.handshake_timeout, "http reply");
    } catch (const std::exception&) {
    }
  }

  std::string name_;
  RpcOptions options_;
  std::optional<std::string> token_;
  Handler handler_;
  HttpHandler http_;
  asio::io_context io_;
  tcp::acceptor acceptor_;
  std::uint16_t port_ = 0;
  std::atomic<bool> stopped_{false};
  std::thread accept_thread_;
  std::mutex mutex_;
  std::list<Connection> connections_;
};

}  // namespace detail
DISTRIBUTE_END_NAMESPACE

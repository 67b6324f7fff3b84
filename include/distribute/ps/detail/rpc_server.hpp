// The parameter-server service's server side: accepts connections, authenticates each peer (the
// handshake in rpc.hpp), then answers its requests one at a time on a thread of its own. The same
// port answers plain HTTP GETs (/healthz, /metrics) through Boost.Beast, sniffed from the first
// bytes, so a server needs one address only.
//
// What a stranger can cost it is bounded: connections not yet authenticated are few
// (RpcOptions::max_pending_connections, capped by the descriptor limit) and each holds a few KiB
// (net::kMaxPreAuthPayload) for at most the handshake timeout; an accepted request's payload grows
// as its bytes arrive, each piece within the read timeout; accept errors (out of descriptors,
// buffers or memory) and a thread that cannot start cost that one connection, never the task. A
// refused peer reads only "refused"; why goes to the local log, a few lines a second at most.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>

#include <sys/resource.h>
#include <sys/socket.h>

#include <boost/asio.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>

#include <distribute/core/error.hpp>
#include <distribute/net/detail/address.hpp>
#include <distribute/net/detail/auth.hpp>
#include <distribute/net/refusal_log.hpp>
#include <distribute/net/frame.hpp>
#include <distribute/ps/detail/rpc.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace detail {

/// How many connections may wait in their handshake at once: the option, and no more than an
/// eighth of the descriptors this process may still open (each costs a socket and its deadline's
/// event loop, about four descriptors), so strangers cannot starve the task of descriptors.
inline std::size_t pending_connection_bound(std::size_t option) {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return option;
  const auto soft = static_cast<std::size_t>(lim.rlim_cur);
  const std::size_t by_fds = soft > 64 ? (soft - 64) / 8 : 1;
  return std::max<std::size_t>(1, std::min(option, by_fds));
}

/// Accepts connections on `address` and answers each request with `handler(op, payload)`; an
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
        handler_(std::move(handler)), http_(std::move(http)), acceptor_(io_),
        max_pending_(pending_connection_bound(options_.max_pending_connections)) {
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
    if (!token_ && !ep.address().is_loopback()) log(net::no_token_warning(name_, address));
    accept_thread_ = std::thread([this] { accept_loop(); });
  }

  RpcServer(const RpcServer&) = delete;
  RpcServer& operator=(const RpcServer&) = delete;
  ~RpcServer() { stop(); }

  std::uint16_t port() const noexcept { return port_; }
  /// The bound in effect on connections waiting in their handshake.
  std::size_t max_pending_connections() const noexcept { return max_pending_; }

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
  /// Lines a stranger can cause: a few a second at most.
  void log_limited(const std::string& line) {
    if (std::string admitted = limiter_.admit(line); !admitted.empty()) log(admitted);
  }

  /// Pending connections are counted from accept to the end of their handshake (or of their HTTP
  /// request), whichever way it ends.
  class PendingSlot {
   public:
    explicit PendingSlot(std::atomic<std::size_t>& n) : n_(&n) {}
    PendingSlot(const PendingSlot&) = delete;
    PendingSlot& operator=(const PendingSlot&) = delete;
    ~PendingSlot() { release(); }
    void release() noexcept {
      if (n_) n_->fetch_sub(1);
      n_ = nullptr;
    }

   private:
    std::atomic<std::size_t>* n_;
  };

  void reap_locked() {
    for (auto it = connections_.begin(); it != connections_.end();) {
      if (it->finished->load()) {
        it->thread.join();
        it = connections_.erase(it);
      } else {
        ++it;
      }
    }
  }

  void accept_loop() {
    auto backoff = std::chrono::milliseconds(10);
    while (!stopped_) {
      // Accepted on the acceptor's own loop (one descriptor) and only handed a loop of its own
      // (more descriptors) once it is known to be admitted.
      tcp::socket raw(io_);
      boost::system::error_code ec;
      acceptor_.accept(raw, ec);
      if (stopped_) return;
      if (ec) {  // EMFILE, ENFILE, ENOBUFS, ENOMEM...: the next accept may succeed, keep going
        log_limited(fmt::format("{}: accept failed: {}; retrying in {} ms", name_, ec.message(), backoff.count()));
        std::this_thread::sleep_for(backoff);
        backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
        continue;
      }
      backoff = std::chrono::milliseconds(10);
      if (pending_.load() >= max_pending_) {
        boost::system::error_code ignored;
        const auto remote = raw.remote_endpoint(ignored);
        log_limited(fmt::format("{}: refused a connection from {}:{}: {} connections are already in their handshake",
                                name_, remote.address().to_string(), remote.port(), max_pending_));
        raw.close(ignored);
        continue;
      }
      start_connection(std::move(raw));
    }
  }

  void start_connection(tcp::socket raw) {
    boost::system::error_code ignored;
    std::shared_ptr<FramedStream> stream;
    try {
      stream = std::make_shared<FramedStream>();  // may fail for want of descriptors or memory
      const auto protocol = raw.local_endpoint().protocol();
      stream->socket().assign(protocol, raw.release());
      stream->adopt_accepted();
    } catch (const std::exception& e) {
      log_limited(fmt::format("{}: dropped an accepted connection: {}", name_, e.what()));
      if (stream) stream->close();
      raw.close(ignored);
      return;
    }
    pending_.fetch_add(1);
    auto slot = std::make_shared<PendingSlot>(pending_);
    std::lock_guard lock(mutex_);
    reap_locked();
    Connection c;
    c.stream = stream;
    auto finished = c.finished;
    try {
      c.thread = std::thread([this, stream, finished, slot] {
        serve(*stream, *slot);
        slot->release();
        stream->close();
        finished->store(true);
      });
    } catch (const std::system_error& e) {  // out of threads (a pid limit): this connection only
      log_limited(fmt::format("{}: closed a connection: cannot start a thread for it: {}", name_, e.what()));
      stream->close();
      return;
    }
    connections_.push_back(std::move(c));
  }

  std::string peer_of(FramedStream& s) {
    boost::system::error_code ec;
    auto ep = s.socket().remote_endpoint(ec);
    return ec ? std::string("?") : fmt::format("{}:{}", ep.address().to_string(), ep.port());
  }

  void serve(FramedStream& s, PendingSlot& slot) {
    const std::string who = peer_of(s);
    const auto deadline = RpcClock::now() + options_.handshake_timeout;  // the whole handshake
    auto left = [&] { return std::max<RpcClock::duration>(deadline - RpcClock::now(), std::chrono::milliseconds(1)); };
    net::HeaderBytes head{};
    try {
      s.read_exact(std::span(head).first(4), left(), "first bytes");
    } catch (const std::exception&) {
      return;
    }
    if (std::memcmp(head.data(), "GET ", 4) == 0) return serve_http(s, head, left());
    try {
      net::Frame hello = s.read_frame(net::kMaxPreAuthPayload, left(), "hello", head, 4);
      if (!accept_peer(s, hello, who, left)) return;
      slot.release();
      for (;;) {
        net::Frame req = s.read_frame(options_.max_frame_bytes, options_.idle_timeout, "request", {}, 0,
                                      RpcClock::duration(options_.read_timeout));
        if (req.header.type != net::FrameType::Request) {
          log_limited(fmt::format("{}: closing the connection from {}: unexpected {} frame", name_, who,
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
        req.payload = {};  // not held while the reply is written
        s.write_frame(net::FrameType::Reply, req.header.seq, status, out, std::nullopt, "reply");
        if (op == RpcOp::Stop && status == 0) return;
      }
    } catch (const net::FrameError& e) {
      log_limited(fmt::format("{}: closing the connection from {}: malformed frame: {}", name_, who, e.what()));
    } catch (const TimedOut& e) {
      log_limited(fmt::format("{}: closing the connection from {}: {}", name_, who, e.what()));
    } catch (const std::exception&) {
      // The peer went away (EOF, reset) or we are stopping: nothing to report.
    }
  }

  template <class Left>
  bool accept_peer(FramedStream& s, const net::Frame& hello, const std::string& who, Left left) {
    auto reject = [&](const std::string& reason) {
      log_limited(fmt::format("{}: refused a connection from {}: {}", name_, who, reason));
      try {
        const std::string_view text = net::kRefusedText;
        s.write_frame(net::FrameType::Reject, 0, 0, to_bytes(text), left(), "reject");
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
    s.write_frame(net::FrameType::Challenge, 0, 0, challenge, left(), "challenge");
    net::Frame response = s.read_frame(net::kMaxPreAuthPayload, left(), "response");
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
    s.write_frame(net::FrameType::Welcome, 0, 0, {}, left(), "welcome");
    return true;
  }

  void serve_http(FramedStream& s, const net::HeaderBytes& head, RpcClock::duration limit) {
    namespace http = boost::beast::http;
    try {
      boost::beast::flat_buffer buffer(8 * 1024);  // a GET of a status page: headers only
      auto space = buffer.prepare(4);
      std::memcpy(space.data(), head.data(), 4);
      buffer.commit(4);
      http::request_parser<http::string_body> parser;
      parser.body_limit(0);
      parser.header_limit(8 * 1024);
      s.run([&](boost::system::error_code& ec) {
             http::async_read(s.socket(), buffer, parser, [&ec](const boost::system::error_code& e, std::size_t) { ec = e; });
           },
           limit, "http request");
      const auto& req = parser.get();
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
  std::size_t max_pending_;
  std::atomic<std::size_t> pending_{0};
  net::RateLimiter limiter_;
  std::uint16_t port_ = 0;
  std::atomic<bool> stopped_{false};
  std::thread accept_thread_;
  std::mutex mutex_;
  std::list<Connection> connections_;
};

}  // namespace detail
DISTRIBUTE_END_NAMESPACE

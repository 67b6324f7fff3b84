// MetricsServer: answers GET /metrics (a MetricsRegistry's text) and GET /healthz over HTTP/1.1
// (Boost.Beast, as the parameter-server Server's port does), for tasks that have no HTTP port of
// their own (MultiWorkerMirroredStrategy workers, the coordinator). It binds the task's own host,
// never every interface, and serves from one background thread. What a client can cost is bounded
// as on every listening socket of the library (detail/accept_loop.hpp): at most `max_pending`
// connections at once (64, and no more than a quarter of the descriptors the process may still
// open), 5 s each to send a request of at most 8 KiB of header (Beast's limit), and an accept
// error backs off instead of spinning. Refusals are written to stderr, a few a second at most.
// Like every server of the library it will not listen beyond loopback without a cluster token
// unless told `insecure`; with a token, GET /metrics wants it as a bearer credential (/healthz
// does not).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include <boost/asio.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>

#include <distribute/core/error.hpp>
#include <distribute/net/detail/loopback.hpp>
#include <distribute/net/detail/accept_loop.hpp>
#include <distribute/net/detail/auth.hpp>
#include <distribute/net/refusal_log.hpp>
#include <distribute/observe/metrics.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net {

/// Who may read a metrics port.
struct MetricsAccess {
  /// Scrapes of /metrics must send it as `Authorization: Bearer TOKEN`. Unset:
  /// DISTRIBUTE_CLUSTER_TOKEN, if non-empty; "": none.
  std::optional<std::string> cluster_token = std::nullopt;
  /// Listen beyond loopback without a token (anyone may read the metrics): refused
  /// (ClusterConfigError) unless set, or DISTRIBUTE_INSECURE=1.
  bool insecure = false;
};

class MetricsServer {
 public:
  /// Listens on `host`:`port` (0: a free port, see port()); throws Unavailable when it cannot.
  MetricsServer(std::shared_ptr<const observe::MetricsRegistry> registry, const std::string& host, std::uint16_t port,
                MetricsAccess access = {}, std::size_t max_pending = 64)
      : registry_(std::move(registry)), token_(detail::effective_cluster_token(access.cluster_token)), acceptor_(io_),
        accepting_(io_, acceptor_, fmt::format("the metrics port on {}", host), "waiting for an answer", max_pending,
                   [this](const std::string& line) {
                     if (std::string admitted = refusals_.admit(line); !admitted.empty()) {
                       fmt::print(stderr, "distribute.metrics: {}\n", admitted);
                     }
                   }) {
    namespace asio = boost::asio;
    boost::system::error_code ec;
    asio::ip::tcp::resolver resolver(io_);
    auto endpoints = resolver.resolve(host, std::to_string(port), ec);
    if (ec || endpoints.empty()) {
      throw Unavailable(fmt::format("metrics: cannot resolve the host '{}': {}", host, ec.message()));
    }
    const auto ep = endpoints.begin()->endpoint();
    const std::string address = fmt::format("{}:{}", host, port);
    if (!token_ && !detail::is_loopback(ep.address())) {
      if (!detail::insecure_chosen(access.insecure)) throw ClusterConfigError(no_token_refusal("the metrics port", address));
      fmt::print(stderr, "distribute.metrics: {}\n", no_token_warning("the metrics port", address));
    }
    acceptor_.open(ep.protocol(), ec);
    if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(ep, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) throw Unavailable(fmt::format("metrics: cannot listen on {}:{}: {}", host, port, ec.message()));
    port_ = acceptor_.local_endpoint().port();
    accepting_.start([this](asio::ip::tcp::socket socket, detail::AcceptLoop::Slot slot) {
      serve(std::make_shared<Session>(std::move(socket), std::move(slot)));
      return true;
    });
    thread_ = std::thread([this] { io_.run(); });
  }
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;
  ~MetricsServer() {
    io_.stop();
    if (thread_.joinable()) thread_.join();
  }

  std::uint16_t port() const noexcept { return port_; }
  /// The bound in effect on connections at once.
  std::size_t max_pending() const noexcept { return accepting_.max_pending(); }

 private:
  struct Session {
    Session(boost::asio::ip::tcp::socket s, detail::AcceptLoop::Slot held)
        : stream(std::move(s)), deadline(stream.get_executor()), slot(std::move(held)) {}
    boost::asio::ip::tcp::socket stream;
    boost::asio::steady_timer deadline;  // a client that says nothing is dropped after 5 s
    detail::AcceptLoop::Slot slot;       // its place among the connections at once, for its life
    boost::beast::flat_buffer buffer;
    boost::beast::http::request<boost::beast::http::string_body> req;
    boost::beast::http::response<boost::beast::http::string_body> res;
  };

  void serve(std::shared_ptr<Session> s) {
    namespace http = boost::beast::http;
    s->deadline.expires_after(std::chrono::seconds(5));
    s->deadline.async_wait([s](const boost::system::error_code& ec) {
      if (!ec) {
        boost::system::error_code ignored;
        s->stream.close(ignored);
      }
    });
    http::async_read(s->stream, s->buffer, s->req, [this, s](const boost::system::error_code& ec, std::size_t) {
      if (ec) {
        s->deadline.cancel();
        return;
      }
      const auto target = s->req.target();
      s->res.version(s->req.version());
      s->res.set(http::field::server, "distribute");
      s->res.keep_alive(false);
      if (s->req.method() != http::verb::get) {
        s->res.result(http::status::method_not_allowed);
        s->res.set(http::field::content_type, "text/plain; charset=utf-8");
        s->res.body() = "only GET\n";
      } else if (!detail::scrape_allowed(std::string_view(target.data(), target.size()),
                                         std::string_view(s->req[http::field::authorization].data(),
                                                          s->req[http::field::authorization].size()),
                                         token_)) {
        s->res.result(http::status::unauthorized);
        s->res.set(http::field::www_authenticate, "Bearer realm=\"distribute\"");
        s->res.set(http::field::content_type, "text/plain; charset=utf-8");
        s->res.body() = std::string(detail::kScrapeRefused);
      } else if (target == "/metrics") {
        s->res.result(http::status::ok);
        s->res.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
        s->res.body() = registry_->expose();
      } else if (target == "/healthz") {
        s->res.result(http::status::ok);
        s->res.set(http::field::content_type, "text/plain; charset=utf-8");
        s->res.body() = "ok\n";
      } else {
        s->res.result(http::status::not_found);
        s->res.set(http::field::content_type, "text/plain; charset=utf-8");
        s->res.body() = "not found\n";
      }
      s->res.prepare_payload();
      http::async_write(s->stream, s->res, [s](const boost::system::error_code&, std::size_t) {
        s->deadline.cancel();
        boost::system::error_code ignored;
        s->stream.shutdown(boost::asio::ip::tcp::socket::shutdown_send, ignored);
      });
    });
  }

  std::shared_ptr<const observe::MetricsRegistry> registry_;
  std::optional<std::string> token_;
  boost::asio::io_context io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  RateLimiter refusals_;
  detail::AcceptLoop accepting_;
  std::uint16_t port_ = 0;
  std::thread thread_;
};

}  // namespace net
DISTRIBUTE_END_NAMESPACE

// MetricsServer: answers GET /metrics (a MetricsRegistry's text) and GET /healthz over HTTP/1.1
// (Boost.Beast, as the parameter-server Server's port does), for tasks that have no HTTP port of
// their own (MultiWorkerMirroredStrategy workers). It binds the task's own host, never every
// interface, and serves from one background thread; a client has 5 s to send its request.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include <boost/asio.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>

#include <distribute/core/error.hpp>
#include <distribute/observe/metrics.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace observe {

class MetricsServer {
 public:
  /// Listens on `host`:`port` (0: a free port, see port()); throws Unavailable when it cannot.
  MetricsServer(std::shared_ptr<const MetricsRegistry> registry, const std::string& host, std::uint16_t port)
      : registry_(std::move(registry)), acceptor_(io_) {
    namespace asio = boost::asio;
    boost::system::error_code ec;
    asio::ip::tcp::resolver resolver(io_);
    auto endpoints = resolver.resolve(host, std::to_string(port), ec);
    if (ec || endpoints.empty()) {
      throw Unavailable(fmt::format("metrics: cannot resolve the host '{}': {}", host, ec.message()));
    }
    const auto ep = endpoints.begin()->endpoint();
    acceptor_.open(ep.protocol(), ec);
    if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(ep, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) throw Unavailable(fmt::format("metrics: cannot listen on {}:{}: {}", host, port, ec.message()));
    port_ = acceptor_.local_endpoint().port();
    accept();
    thread_ = std::thread([this] { io_.run(); });
  }
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;
  ~MetricsServer() {
    io_.stop();
    if (thread_.joinable()) thread_.join();
  }

  std::uint16_t port() const noexcept { return port_; }

 private:
  struct Session {
    explicit Session(boost::asio::ip::tcp::socket s) : stream(std::move(s)), deadline(stream.get_executor()) {}
    boost::asio::ip::tcp::socket stream;
    boost::asio::steady_timer deadline;  // a client that says nothing is dropped after 5 s
    boost::beast::flat_buffer buffer;
    boost::beast::http::request<boost::beast::http::string_body> req;
    boost::beast::http::response<boost::beast::http::string_body> res;
  };

  void accept() {
    acceptor_.async_accept([this](const boost::system::error_code& ec, boost::asio::ip::tcp::socket socket) {
      if (ec == boost::asio::error::operation_aborted) return;
      if (!ec) serve(std::make_shared<Session>(std::move(socket)));
      accept();
    });
  }

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

  std::shared_ptr<const MetricsRegistry> registry_;
  boost::asio::io_context io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  std::uint16_t port_ = 0;
  std::thread thread_;
};

}  // namespace observe
DISTRIBUTE_END_NAMESPACE

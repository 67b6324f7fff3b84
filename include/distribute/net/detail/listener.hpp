// The listening side: binds an address and accepts connections for their handshake. What a
// stranger can cost is bounded: at most a few connections are in their handshake at once (more
// are closed as soon as they are accepted), and an accept error (out of descriptors, buffers or
// memory) backs off 10 ms doubling to 500 ms and goes on accepting.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include <sys/resource.h>

#include <boost/asio.hpp>
#include <fmt/format.h>

#include <distribute/core/error.hpp>
#include <distribute/net/address.hpp>
#include <distribute/net/detail/congestion_control.hpp>
#include <distribute/net/detail/handshake.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net::detail {

/// How many connections may wait in their handshake at once: the option, and no more than a
/// quarter of the descriptors this process may still open, so that strangers cannot starve it of
/// the descriptors its peers need.
inline std::size_t pending_connection_bound(std::size_t option) {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return option;
  const auto soft = static_cast<std::size_t>(lim.rlim_cur);
  const std::size_t by_fds = soft > 64 ? (soft - 64) / 4 : 1;
  return std::max<std::size_t>(1, std::min(option, by_fds));
}

class Listener {
 public:
  struct Options {
    std::string me;                           // who listens, for messages
    std::string settings;                     // whose options these are, for their errors ("Communicator")
    std::string loopback_congestion_control;  // set before connections exist ("" keeps the system's)
    std::size_t max_pending_connections = 64;
    std::function<void(const std::string&)> log;          // lines a stranger can cause (rate-limited)
    std::function<void(const std::string&)> log_always;   // the start-up warning
  };

  Listener(asio::io_context& io, Options options)
      : io_(io), options_(std::move(options)), max_pending_(pending_connection_bound(options_.max_pending_connections)) {}

  /// Binds `address` and listens (blocking; before the event loop runs). Throws Unavailable when it
  /// cannot, InvalidArgument when the kernel refuses the congestion control. Warns once when the
  /// address reaches beyond this host and `has_token` is false.
  void listen(const std::string& address, bool has_token) {
    const HostPort ep = parse_host_port(address);
    boost::system::error_code ec;
    tcp::resolver resolver(io_);
    const auto results = resolver.resolve(ep.host, ep.port, ec);
    if (ec) throw Unavailable(fmt::format("{} cannot resolve its own address '{}': {}", options_.me, address, ec.message()));
    for (const auto& entry : results) {
      acceptor_.emplace(io_);
      acceptor_->open(entry.endpoint().protocol(), ec);
      if (!ec && is_loopback(entry.endpoint().address())) {
        // Accepted sockets inherit it, before their connection is established.
        const std::string refused = set_congestion_control(acceptor_->native_handle(), options_.loopback_congestion_control);
        if (!refused.empty()) {
          throw InvalidArgument(fmt::format(
              "{}: loopback_congestion_control '{}' is refused by the kernel: {} (the algorithms any user may pick are in "
              "/proc/sys/net/ipv4/tcp_allowed_congestion_control; \"\" keeps the system's default)",
              options_.settings, options_.loopback_congestion_control, refused));
        }
      }
      if (!ec) acceptor_->set_option(tcp::acceptor::reuse_address(true), ec);
      if (!ec) acceptor_->bind(entry.endpoint(), ec);
      if (!ec) acceptor_->listen(asio::socket_base::max_listen_connections, ec);
      if (!ec) {
        port_ = acceptor_->local_endpoint(ec).port();
        if (!has_token && !is_loopback(entry.endpoint().address())) options_.log_always(no_token_warning(options_.me, address));
        return;
      }
      acceptor_.reset();
    }
    throw Unavailable(fmt::format("{} cannot listen on {}: {}", options_.me, address,
                                  ec ? ec.message() : std::string("the host resolves to no address")));
  }

  std::uint16_t port() const noexcept { return port_; }
  /// The bound in effect on connections waiting in their handshake.
  std::size_t max_pending_connections() const noexcept { return max_pending_; }

  /// Accepts until closed (on the event loop). Each admitted connection goes to `accepted` with a
  /// handshake whose `pending` holds its place among those in their handshake until reset;
  /// `accepted` returns false to stop accepting (its owner is closing).
  void start(std::function<bool(const HandshakePtr&)> accepted) {
    accepted_ = std::move(accepted);
    accept_next();
  }

  /// Stops accepting (on the event loop).
  void close() {
    closed_ = true;
    boost::system::error_code ignored;
    if (acceptor_) acceptor_->close(ignored);
  }

 private:
  void accept_next() {
    acceptor_->async_accept([this](const boost::system::error_code& ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted || closed_) return;
      if (ec) {
        options_.log(fmt::format("{}: accept failed: {}; retrying in {} ms", options_.me, ec.message(), backoff_.count()));
        auto timer = std::make_shared<asio::steady_timer>(io_, backoff_);
        backoff_ = std::min(backoff_ * 2, std::chrono::milliseconds(500));
        timer->async_wait([this, timer](const boost::system::error_code& e) {
          if (!e && !closed_) accept_next();
        });
        return;
      }
      backoff_ = std::chrono::milliseconds(10);
      if (pending_->load() >= max_pending_) {
        boost::system::error_code ignored;
        const auto remote = socket.remote_endpoint(ignored);
        options_.log(fmt::format("{}: refused connection from {}:{}: {} connections are already in their handshake", options_.me,
                                 remote.address().to_string(), remote.port(), max_pending_));
        socket.close(ignored);
        return accept_next();
      }
      auto h = std::make_shared<Handshake>(std::move(socket));
      pending_->fetch_add(1);
      h->pending = std::shared_ptr<void>(nullptr, [n = pending_](void*) { n->fetch_sub(1); });
      if (accepted_(h)) accept_next();
    });
  }

  asio::io_context& io_;
  Options options_;
  std::size_t max_pending_;
  std::optional<tcp::acceptor> acceptor_;
  std::uint16_t port_ = 0;
  std::chrono::milliseconds backoff_{10};  // event loop only
  bool closed_ = false;                    // event loop only
  std::shared_ptr<std::atomic<std::size_t>> pending_ = std::make_shared<std::atomic<std::size_t>>(0);
  std::function<bool(const HandshakePtr&)> accepted_;
};

}  // namespace net::detail
DISTRIBUTE_END_NAMESPACE

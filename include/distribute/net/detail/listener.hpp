// The listening side of the handshaking services (a communicator's mesh, a ds::Server): binds an
// address and accepts connections for their handshake, under the accept policy of every
// listening socket (accept_loop.hpp): at most a few connections in their handshake at once, and
// an accept error backs off.
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
#include <distribute/net/detail/accept_loop.hpp>
#include <distribute/net/detail/congestion_control.hpp>
#include <distribute/net/detail/loopback.hpp>
#include <distribute/net/detail/handshake.hpp>
#include <distribute/net/refusal_log.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net::detail {

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

  Listener(asio::io_context& io, Options options) : io_(io), options_(std::move(options)) {}

  /// Binds `address` and listens (blocking; before the event loop runs). Throws Unavailable when it
  /// cannot, InvalidArgument when the kernel refuses the congestion control, ClusterConfigError
  /// when the address reaches beyond this host and there is no token, unless `insecure` (then it
  /// warns once).
  void listen(const std::string& address, bool has_token, bool insecure) {
    const HostPort ep = parse_host_port(address);
    boost::system::error_code ec;
    tcp::resolver resolver(io_);
    const auto results = resolver.resolve(ep.host, ep.port, ec);
    if (ec) throw Unavailable(fmt::format("{} cannot resolve its own address '{}': {}", options_.me, address, ec.message()));
    for (const auto& entry : results) {
      if (!has_token && !is_loopback(entry.endpoint().address())) {
        if (!insecure) throw ClusterConfigError(no_token_refusal(options_.me, address));
        options_.log_always(no_token_warning(options_.me, address));
      }
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
        accepting_.emplace(io_, *acceptor_, options_.me, "in their handshake", options_.max_pending_connections, options_.log);
        return;
      }
      acceptor_.reset();
    }
    throw Unavailable(fmt::format("{} cannot listen on {}: {}", options_.me, address,
                                  ec ? ec.message() : std::string("the host resolves to no address")));
  }

  std::uint16_t port() const noexcept { return port_; }
  /// The bound in effect on connections waiting in their handshake (after listen()).
  std::size_t max_pending_connections() const noexcept {
    return accepting_ ? accepting_->max_pending() : pending_connection_bound(options_.max_pending_connections);
  }

  /// Accepts until closed (on the event loop). Each admitted connection goes to `accepted` with a
  /// handshake whose `pending` holds its place among those in their handshake until reset;
  /// `accepted` returns false to stop accepting (its owner is closing).
  void start(std::function<bool(const HandshakePtr&)> accepted) {
    accepting_->start([accepted = std::move(accepted)](tcp::socket socket, AcceptLoop::Slot slot) {
      auto h = std::make_shared<Handshake>(std::move(socket));
      h->pending = std::move(slot);
      return accepted(h);
    });
  }

  /// Stops accepting (on the event loop).
  void close() {
    if (accepting_) accepting_->close();
    boost::system::error_code ignored;
    if (acceptor_) acceptor_->close(ignored);
  }

 private:
  asio::io_context& io_;
  Options options_;
  std::optional<tcp::acceptor> acceptor_;
  std::optional<AcceptLoop> accepting_;  // once listening
  std::uint16_t port_ = 0;
};

}  // namespace net::detail
DISTRIBUTE_END_NAMESPACE

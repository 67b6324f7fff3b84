// The connecting side: reaches one address, over and over while its owner wants it and the peer is
// not up yet (peers start in any order): resolve, connect to each endpoint in turn, then the
// connector's handshake. Retries back off from a millisecond, doubling to a cap.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <boost/asio.hpp>

#include <distribute/net/address.hpp>
#include <distribute/net/detail/congestion_control.hpp>
#include <distribute/net/detail/loopback.hpp>
#include <distribute/net/detail/handshake.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net::detail {

class Dialer {
 public:
  struct Hooks {
    /// Checked before each attempt: false stops dialing (the owner closes, or has its peer).
    std::function<bool()> wanted;
    /// An attempt failed for `reason`; returns whether to try again (the owner records why).
    std::function<bool(const std::string& reason)> retry;
    /// The peer was reached and welcomed us: h->socket is authenticated.
    std::function<void(const HandshakePtr& h)> connected;
    /// The peer refused us, or disagrees in a way retrying cannot cure.
    std::function<void(const std::string& message)> refused;
    /// The kernel refused the loopback congestion control on a connecting socket (it connects anyway).
    std::function<void(const std::string& why)> congestion_refused;
  };

  Dialer(asio::io_context& io, Handshaker& handshaker, HostPort target, std::string loopback_congestion_control,
         std::chrono::milliseconds max_backoff)
      : io_(io), handshaker_(handshaker), target_(std::move(target)), congestion_(std::move(loopback_congestion_control)),
        max_backoff_(max_backoff), timer_(io) {}

  /// Starts dialing (on the event loop, or before it runs).
  void start(std::shared_ptr<const ConnectorTerms> terms, Hooks hooks) {
    terms_ = std::move(terms);
    hooks_ = std::move(hooks);
    backoff_ = std::chrono::milliseconds(1);
    attempt();
  }

  /// Stops a pending retry (on the event loop).
  void cancel() { timer_.cancel(); }

 private:
  void attempt() {
    if (!hooks_.wanted()) return;
    auto resolver = std::make_shared<tcp::resolver>(io_);
    resolver->async_resolve(target_.host, target_.port,
                            [this, resolver](const boost::system::error_code& ec, tcp::resolver::results_type results) {
                              if (ec) return retry_later(ec.message());
                              std::vector<tcp::endpoint> endpoints;
                              for (const auto& entry : results) endpoints.push_back(entry.endpoint());
                              connect_to(std::move(endpoints), 0, "the host resolves to no address");
                            });
  }

  // Tries the endpoints from `i` on in turn. The socket is opened here rather than by
  // async_connect so that a loopback connection gets its congestion control before it exists.
  void connect_to(std::vector<tcp::endpoint> endpoints, std::size_t i, std::string last_error) {
    if (i == endpoints.size()) return retry_later(std::move(last_error));
    auto h = std::make_shared<Handshake>(io_);
    const tcp::endpoint to = endpoints[i];  // a copy: the vector moves into the handler below
    boost::system::error_code ec;
    h->socket.open(to.protocol(), ec);
    if (ec) return connect_to(std::move(endpoints), i + 1, describe_error(ec));
    if (is_loopback(to.address())) {
      const std::string refused = set_congestion_control(h->socket.native_handle(), congestion_);
      if (!refused.empty() && hooks_.congestion_refused) hooks_.congestion_refused(refused);
    }
    h->socket.async_connect(to, [this, h, endpoints = std::move(endpoints), i](const boost::system::error_code& ec2) mutable {
      if (ec2) return connect_to(std::move(endpoints), i + 1, describe_error(ec2));
      handshaker_.connect(h, terms_, [this, h](HandshakeEnd end, const std::string& message) {
        switch (end) {
          case HandshakeEnd::Ok: return hooks_.connected(h);
          case HandshakeEnd::Fatal: return hooks_.refused(message);
          case HandshakeEnd::Retry: return retry_later(message);
        }
      });
    });
  }

  // 1, 2, 4 ... ms, then every max_backoff: peers start within milliseconds of each other, and a
  // refused connect costs a round trip, so a late peer is met soon after it listens.
  void retry_later(std::string reason) {
    if (!hooks_.retry(reason)) return;
    const auto delay = backoff_;
    backoff_ = std::min(backoff_ * 2, max_backoff_);
    timer_.expires_after(delay);
    timer_.async_wait([this](const boost::system::error_code& ec) {
      if (!ec) attempt();
    });
  }

  asio::io_context& io_;
  Handshaker& handshaker_;
  HostPort target_;
  std::string congestion_;
  std::chrono::milliseconds max_backoff_;
  asio::steady_timer timer_;
  std::chrono::milliseconds backoff_{1};
  std::shared_ptr<const ConnectorTerms> terms_;
  Hooks hooks_;
};

}  // namespace net::detail
DISTRIBUTE_END_NAMESPACE

// The one policy of every listening socket of the library (a communicator's mesh, a ds::Server,
// a metrics port) for the connections it accepted and has not yet trusted or answered: at most a
// bounded number at once (the owner's option, and no more than a quarter of the descriptors the
// process may still open, so that strangers cannot starve it of the descriptors its own work
// needs; more are closed as soon as they are accepted), each held until its owner lets go of its
// slot (its handshake or request done, or its deadline passed); and an accept error (out of
// descriptors, buffers or memory) backs off 10 ms doubling to 500 ms instead of spinning.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include <sys/resource.h>

#include <boost/asio.hpp>
#include <fmt/format.h>

#include <distribute/version.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net::detail {

/// How many accepted connections may wait at once: `option`, and no more than a quarter of the
/// descriptors this process may still open.
inline std::size_t pending_connection_bound(std::size_t option) {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return option;
  const auto soft = static_cast<std::size_t>(lim.rlim_cur);
  const std::size_t by_fds = soft > 64 ? (soft - 64) / 4 : 1;
  return std::max<std::size_t>(1, std::min(option, by_fds));
}

class AcceptLoop {
 public:
  /// Holds an accepted connection's place among those waiting until it is reset or destroyed.
  using Slot = std::shared_ptr<void>;
  /// Gets each admitted connection and its slot; returns false to stop accepting (closing).
  using Accepted = std::function<bool(boost::asio::ip::tcp::socket, Slot)>;

  /// `me` names the listener in log lines, `waiting` what its connections wait for ("in their
  /// handshake"); `log` writes the lines a stranger can cause (the owner rate-limits them).
  AcceptLoop(boost::asio::io_context& io, boost::asio::ip::tcp::acceptor& acceptor, std::string me, std::string waiting,
             std::size_t max_pending, std::function<void(const std::string&)> log)
      : io_(io), acceptor_(acceptor), me_(std::move(me)), waiting_(std::move(waiting)),
        max_pending_(pending_connection_bound(max_pending)), log_(std::move(log)) {}

  /// The bound in effect.
  std::size_t max_pending() const noexcept { return max_pending_; }

  /// Accepts until close() (on the event loop).
  void start(Accepted accepted) {
    accepted_ = std::move(accepted);
    accept_next();
  }

  /// Stops accepting (on the event loop; the acceptor is its owner's to close).
  void close() noexcept { closed_ = true; }

 private:
  void accept_next() {
    acceptor_.async_accept([this](const boost::system::error_code& ec, boost::asio::ip::tcp::socket socket) {
      if (ec == boost::asio::error::operation_aborted || closed_) return;
      if (ec) {
        log_(fmt::format("{}: accept failed: {}; retrying in {} ms", me_, ec.message(), backoff_.count()));
        auto timer = std::make_shared<boost::asio::steady_timer>(io_, backoff_);
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
        log_(fmt::format("{}: refused connection from {}:{}: {} connections are already {}", me_,
                         remote.address().to_string(), remote.port(), max_pending_, waiting_));
        socket.close(ignored);
        return accept_next();
      }
      pending_->fetch_add(1);
      Slot slot(nullptr, [n = pending_](void*) { n->fetch_sub(1); });
      if (accepted_(std::move(socket), std::move(slot))) accept_next();
    });
  }

  boost::asio::io_context& io_;
  boost::asio::ip::tcp::acceptor& acceptor_;
  std::string me_;
  std::string waiting_;
  std::size_t max_pending_;
  std::function<void(const std::string&)> log_;
  Accepted accepted_;
  std::chrono::milliseconds backoff_{10};  // event loop only
  bool closed_ = false;                    // event loop only
  std::shared_ptr<std::atomic<std::size_t>> pending_ = std::make_shared<std::atomic<std::size_t>>(0);
};

}  // namespace net::detail
DISTRIBUTE_END_NAMESPACE

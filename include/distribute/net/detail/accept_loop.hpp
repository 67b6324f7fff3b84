// The one policy of every listening socket of the library (a communicator's mesh, a ds::Server,
// a metrics port, distribute-launch's node meeting) for the connections it accepted and has not
// yet trusted or answered: at most a bounded number at once (the owner's option, and no more than
// a quarter of the descriptors the process may still open, so that strangers cannot starve it of
// the descriptors its own work needs), and from one remote address at most a quarter of those
// (loopback excepted: a job on one host comes from one address, and a local process has other
// ways to hurt); more are closed as soon as they are accepted. Each is held until its owner lets
// go of its slot (its handshake or request done, or its deadline passed); and an accept error
// (out of descriptors, buffers or memory) backs off 10 ms doubling to 500 ms instead of spinning.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include <sys/resource.h>

#include <boost/asio.hpp>
#include <fmt/format.h>

#include <distribute/net/detail/loopback.hpp>
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
  /// The bound in effect on connections from one address other than loopback.
  std::size_t max_pending_per_address() const noexcept { return std::max<std::size_t>(1, max_pending_ / 4); }

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
      boost::system::error_code ignored;
      const auto remote = socket.remote_endpoint(ignored);
      const auto address = remote.address();
      // The address's slot count, kept only for addresses other machines have.
      const std::string key = is_loopback(address) ? std::string() : address.to_string();  // "": not counted
      std::string refusal;
      {
        std::lock_guard lock(pending_->mutex);
        if (pending_->all >= max_pending_) {
          refusal = fmt::format("{} connections are already {}", max_pending_, waiting_);
        } else if (!key.empty() && pending_->by_address[key] >= max_pending_per_address()) {
          refusal = fmt::format("{} connections from that address are already {}", max_pending_per_address(), waiting_);
        } else {
          ++pending_->all;
          if (!key.empty()) ++pending_->by_address[key];
        }
      }
      if (!refusal.empty()) {
        log_(fmt::format("{}: refused connection from {}:{}: {}", me_, address.to_string(), remote.port(), refusal));
        socket.close(ignored);
        return accept_next();
      }
      Slot slot(nullptr, [p = pending_, key](void*) { p->release(key); });
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
  // Connections holding a slot, in all and by remote address (slots are let go on any thread).
  struct Pending {
    std::mutex mutex;
    std::size_t all = 0;
    std::map<std::string, std::size_t> by_address;
    void release(const std::string& key) {
      std::lock_guard lock(mutex);
      --all;
      if (key.empty()) return;
      if (auto it = by_address.find(key); it != by_address.end() && --it->second == 0) by_address.erase(it);
    }
  };
  std::shared_ptr<Pending> pending_ = std::make_shared<Pending>();
};

}  // namespace net::detail
DISTRIBUTE_END_NAMESPACE

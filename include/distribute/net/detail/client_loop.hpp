// The network thread shared by every RPC client of a process: one event loop reads the replies and
// heartbeats of all their connections (no thread per connection), and a tick visits each client
// for its heartbeats and liveness checks. It starts with the first client and stops with the last.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <set>

#include <boost/asio/steady_timer.hpp>

#include <distribute/net/detail/event_loop.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net::detail {

/// What the shared loop's tick visits (on its thread).
class Ticking {
 public:
  virtual void tick(std::chrono::steady_clock::time_point now) = 0;

 protected:
  ~Ticking() = default;
};

class ClientLoop {
 public:
  /// How often each client is visited: a quarter of the shortest heartbeat interval worth having.
  static constexpr std::chrono::milliseconds kTick{250};

  /// The process's loop, started on first use.
  static std::shared_ptr<ClientLoop> instance() {
    static std::mutex mutex;
    static std::weak_ptr<ClientLoop> current;
    std::lock_guard lock(mutex);
    if (auto loop = current.lock()) return loop;
    auto loop = std::shared_ptr<ClientLoop>(new ClientLoop());
    current = loop;
    return loop;
  }

  ~ClientLoop() { loop_.stop(); }
  ClientLoop(const ClientLoop&) = delete;
  ClientLoop& operator=(const ClientLoop&) = delete;

  EventLoop& loop() noexcept { return loop_; }

  /// Visits `t` on every tick until remove(t) returns.
  void add(Ticking* t) {
    std::lock_guard lock(mutex_);
    clients_.insert(t);
  }
  /// After this returns, no tick visits `t` (a tick in progress has finished).
  void remove(Ticking* t) {
    std::lock_guard lock(mutex_);
    clients_.erase(t);
  }

 private:
  ClientLoop() : timer_(loop_.io()) {
    loop_.start([](const std::exception&) {});  // a client's handlers report their own errors
    loop_.post([this] { tick(); });
  }

  void tick() {
    timer_.expires_after(kTick);
    timer_.async_wait([this](const boost::system::error_code& ec) {
      if (ec) return;
      {
        std::lock_guard lock(mutex_);
        const auto now = std::chrono::steady_clock::now();
        for (Ticking* t : clients_) t->tick(now);
      }
      tick();
    });
  }

  EventLoop loop_;  // first: its io_context outlives the timer
  boost::asio::steady_timer timer_;
  std::mutex mutex_;  // guards clients_; held through a tick
  std::set<Ticking*> clients_;
};

}  // namespace net::detail
DISTRIBUTE_END_NAMESPACE

// The network thread: one Asio io_context run on a thread of its own, doing all socket I/O of its
// owner (a communicator's mesh of peers, an RPC server or client). While calls are in flight it
// polls instead of sleeping (busy_poll), so that the next frame is handled without a wake-up.
#pragma once

#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <optional>
#include <thread>
#include <utility>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>

#include <distribute/net/detail/transfer.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net::detail {

class EventLoop {
 public:
  using Clock = std::chrono::steady_clock;

  /// `busy_poll`: how long the thread keeps polling after the last event while calls are in
  /// flight (zero or less: it always sleeps).
  explicit EventLoop(std::chrono::microseconds busy_poll = std::chrono::microseconds(0)) : spin_(busy_poll) {}
  ~EventLoop() { stop(); }
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  boost::asio::io_context& io() noexcept { return io_; }

  /// Starts the thread. A handler that throws does not end it: `on_error` hears of it (on the
  /// loop's thread) and the loop goes on.
  void start(std::function<void(const std::exception&)> on_error) {
    on_error_ = std::move(on_error);
    work_.emplace(io_.get_executor());
    thread_ = std::thread([this] { run(); });
  }
  bool started() const noexcept { return thread_.joinable(); }

  /// Stops the loop (handlers not run yet are dropped) and joins the thread. Idempotent.
  void stop() noexcept {
    if (!thread_.joinable()) return;
    work_.reset();
    io_.stop();
    thread_.join();
  }

  template <class F>
  void post(F&& f) {
    boost::asio::post(io_, std::forward<F>(f));
  }

  /// Whether the calling thread is the loop's.
  bool on_loop_thread() const noexcept { return std::this_thread::get_id() == thread_.get_id(); }

  /// For its life, the loop counts one more call in flight (and polls while any is).
  ScopedCount<std::atomic<int>> call_in_flight() noexcept { return ScopedCount<std::atomic<int>>(in_flight_, 1); }

  /// For the life of the result, one call in flight does not make the loop busy-poll: its data
  /// does not come through the sockets (shared memory), and the polling thread would take turns on
  /// the core with the one copying.
  ScopedCount<std::atomic<int>> exempt_from_busy_poll() noexcept { return ScopedCount<std::atomic<int>>(exempt_, 1); }

 private:
  void run() {
    for (;;) {
      try {
        run_loop();
        return;
      } catch (const std::exception& e) {
        if (on_error_) on_error_(e);
      }
    }
  }

  // Runs handlers until the io_context stops. While a call is in flight the thread polls instead
  // of sleeping, until busy_poll has passed without an event: the next chunk usually comes within
  // that, and handling it at once saves a wake-up per chunk. It yields between polls so that on a
  // host with fewer cores than busy threads the others still run.
  void run_loop() {
    if (spin_.count() <= 0) {
      io_.run();
      return;
    }
    auto polling_wanted = [this] {
      return in_flight_.load(std::memory_order_relaxed) > exempt_.load(std::memory_order_relaxed);
    };
    for (;;) {
      if (polling_wanted()) {
        auto until = Clock::now() + spin_;
        for (;;) {
          const std::size_t ran = io_.poll();
          if (io_.stopped()) return;
          const auto now = Clock::now();
          if (ran > 0) {
            until = now + spin_;
          } else if (now >= until || !polling_wanted()) {
            break;
          } else {
            std::this_thread::yield();
          }
        }
      }
      if (io_.run_one() == 0) return;
    }
  }

  boost::asio::io_context io_;  // first: outlives every socket and timer of the owner
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work_;
  std::chrono::microseconds spin_;
  std::atomic<int> in_flight_{0};
  std::atomic<int> exempt_{0};
  std::function<void(const std::exception&)> on_error_;
  std::thread thread_;
};

}  // namespace net::detail
DISTRIBUTE_END_NAMESPACE

// A few threads for a server's requests that may take long (a worker's closures), so that the
// network thread stays free for the quick ones, heartbeats and new connections. The threads start
// as they are first needed, never more than the bound, whatever the number of connections.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <distribute/version.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net::detail {

class HandlerPool {
 public:
  explicit HandlerPool(std::size_t max_threads) : max_threads_(max_threads == 0 ? 1 : max_threads) {}
  ~HandlerPool() { stop(); }
  HandlerPool(const HandlerPool&) = delete;
  HandlerPool& operator=(const HandlerPool&) = delete;

  /// Queues `job`; starts a thread for it if every thread is busy and the bound allows. False when
  /// no thread runs and none could be started (out of threads, a pid limit): the job is dropped.
  bool post(std::function<void()> job) {
    std::lock_guard lock(mutex_);
    if (stopping_) return false;
    if (idle_ == 0 && threads_.size() < max_threads_) {
      try {
        threads_.emplace_back([this] { run(); });
        ++idle_;
      } catch (const std::system_error&) {
        if (threads_.empty()) return false;  // the running ones will get to it
      }
    }
    jobs_.push_back(std::move(job));
    cond_.notify_one();
    return true;
  }

  /// Runs what is queued, then joins the threads. Idempotent.
  void stop() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    cond_.notify_all();
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
  }

 private:
  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      cond_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping, nothing left
      std::function<void()> job = std::move(jobs_.front());
      jobs_.pop_front();
      --idle_;
      lock.unlock();
      job();  // jobs catch their own exceptions
      lock.lock();
      ++idle_;
    }
  }

  std::size_t max_threads_;
  std::mutex mutex_;
  std::condition_variable cond_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  std::size_t idle_ = 0;
  bool stopping_ = false;
};

}  // namespace net::detail
DISTRIBUTE_END_NAMESPACE

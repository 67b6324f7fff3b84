// A mutex with a condition of its own: a thread waits on it while holding it, as with a
// condition_variable, but is woken only once the notifier has released it.
//
// Why: a condition_variable is notified with its mutex held. On a host with no idle core the woken
// thread is often run at once on the notifier's core, finds the mutex held, and sleeps again until
// the notifier releases it: two extra context switches per wake-up. A trace of a two-process 1 MiB
// all-reduce on two cores showed them as half of the transport's context switches.
//
// The cost: a notifier still uses the object after it released the mutex, while the thread it
// woke may already have seen the state it waited for and destroyed the object's owner. So the
// destructor waits for notifiers in flight (they count themselves while still holding the mutex,
// and anyone who destroys the owner took the mutex after them).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <utility>

#include <distribute/version.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net::detail {

class NotifyingMutex {
 public:
  NotifyingMutex() = default;
  NotifyingMutex(const NotifyingMutex&) = delete;
  NotifyingMutex& operator=(const NotifyingMutex&) = delete;
  ~NotifyingMutex() {
    while (notifying_.load(std::memory_order_acquire) != 0) std::this_thread::yield();
  }

  void lock() { mutex_.lock(); }
  bool try_lock() { return mutex_.try_lock(); }
  void unlock() {
    const bool wake = std::exchange(wake_, false);
    if (wake) notifying_.fetch_add(1, std::memory_order_relaxed);  // under mutex_: see the destructor
    mutex_.unlock();
    if (wake) {
      {
        const std::lock_guard g(gate_);
        ++epoch_;
      }
      cond_.notify_all();
      notifying_.fetch_sub(1, std::memory_order_release);  // the last touch of this object
    }
  }

  /// Held: every waiter is woken once the mutex is released.
  void notify_all_locked() noexcept { wake_ = true; }

  /// `lk` holds this mutex: releases it until a notification (or spuriously), then re-takes it.
  template <class Lock>
  void wait(Lock& lk) {
    sleep(lk, [this](std::unique_lock<std::mutex>& g, const auto& woken) {
      cond_.wait(g, woken);
      return true;
    });
  }
  template <class Lock, class Pred>
  void wait(Lock& lk, Pred pred) {
    while (!pred()) wait(lk);
  }
  template <class Lock, class Clock, class Duration>
  std::cv_status wait_until(Lock& lk, const std::chrono::time_point<Clock, Duration>& deadline) {
    const bool notified = sleep(lk, [&](std::unique_lock<std::mutex>& g, const auto& woken) {
      return cond_.wait_until(g, deadline, woken);
    });
    return notified ? std::cv_status::no_timeout : std::cv_status::timeout;
  }
  template <class Lock, class Clock, class Duration, class Pred>
  bool wait_until(Lock& lk, const std::chrono::time_point<Clock, Duration>& deadline, Pred pred) {
    while (!pred()) {
      if (wait_until(lk, deadline) == std::cv_status::timeout) return pred();
    }
    return true;
  }
  template <class Lock, class Rep, class Period, class Pred>
  bool wait_for(Lock& lk, const std::chrono::duration<Rep, Period>& timeout, Pred pred) {
    return wait_until(lk, std::chrono::steady_clock::now() + timeout, std::move(pred));
  }

 private:
  // Lock order: mutex_, then gate_. unlock() takes gate_ only after releasing mutex_.
  // `block(g, woken)` waits on cond_ (holding gate_ through g) and says whether it was woken.
  template <class Lock, class Block>
  bool sleep(Lock& lk, Block block) {
    std::unique_lock g(gate_);
    if (std::exchange(wake_, false)) {
      ++epoch_;  // this thread had notified: that wake-up goes out now
      cond_.notify_all();
    }
    const std::uint64_t seen = epoch_;
    lk.unlock();  // wake_ is clear, so this does not take gate_
    const bool woken = block(g, [&] { return epoch_ != seen; });
    g.unlock();
    lk.lock();
    return woken;
  }

  std::mutex mutex_;
  bool wake_ = false;  // guarded by mutex_
  std::mutex gate_;    // guards epoch_
  std::condition_variable cond_;
  std::uint64_t epoch_ = 0;
  std::atomic<int> notifying_{0};  // unlock()s between releasing mutex_ and their last notify
};

}  // namespace net::detail
DISTRIBUTE_END_NAMESPACE

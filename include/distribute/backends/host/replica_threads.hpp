// The replica executor of every backend: one long-lived thread per local replica. `run_all`
// hands every thread the same job and returns when all have finished it; no thread is created
// per step. A backend prepares each thread once (e.g. binds its GPU) through `on_start`.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <distribute/core/replica_group.hpp>

#if defined(__linux__)
#include <pthread.h>
#endif

DISTRIBUTE_BEGIN_NAMESPACE
namespace backends {

/// A non-owning reference to a callable `void(int replica)`: no allocation per step.
class ReplicaJob {
 public:
  template <class F>
  explicit ReplicaJob(F& f) noexcept
      : object_(&f), call_([](void* o, int replica) { (*static_cast<F*>(o))(replica); }) {}
  void operator()(int replica) const { call_(object_, replica); }

 private:
  void* object_;
  void (*call_)(void*, int);
};

class HostReplicaThreads {
 public:
  /// `caller_runs_first`: replica 0 runs on the thread that calls run_all (one hand-off fewer
  /// per step); the others, and all of them otherwise, on threads of their own.
  HostReplicaThreads(int count, std::function<void(int)> on_start, bool caller_runs_first = false);
  HostReplicaThreads(const HostReplicaThreads&) = delete;
  HostReplicaThreads& operator=(const HostReplicaThreads&) = delete;
  ~HostReplicaThreads();

  int size() const noexcept { return count_; }

  /// Runs job(i) for every replica i (on its thread) and waits for all. `job` must not throw.
  void run_all(const ReplicaJob& job) noexcept {
    job_ = &job;
    remaining_.store(count_ - first_, std::memory_order_relaxed);
    epoch_.fetch_add(1, std::memory_order_acq_rel);
    epoch_.notify_all();
    if (first_ == 1) job(0);
    core::SpinThenWait backoff(spin_limit_);
    for (;;) {
      const int left = remaining_.load(std::memory_order_acquire);
      if (left == 0) break;
      backoff.pause(remaining_, left);
    }
  }

 private:
  void loop(int replica);

  const int count_;
  const int first_;
  const unsigned spin_limit_;
  std::vector<std::thread> threads_;
  const ReplicaJob* job_ = nullptr;
  alignas(64) std::atomic<std::uint32_t> epoch_{0};
  alignas(64) std::atomic<int> remaining_{0};
  std::atomic<bool> stopping_{false};
};

#if DISTRIBUTE_DETAIL_DEFINE  // compiled apart with DISTRIBUTE_SEPARATE_COMPILATION (version.hpp)
DISTRIBUTE_DECL HostReplicaThreads::HostReplicaThreads(int count, std::function<void(int)> on_start,
                                                       bool caller_runs_first)
    : count_(count), first_(caller_runs_first ? 1 : 0), spin_limit_(core::ReplicaGroup::spin_budget(count)) {
  threads_.reserve(static_cast<std::size_t>(count));
  for (int i = first_; i < count; ++i) {
    threads_.emplace_back([this, i, on_start] {
      if (on_start) on_start(i);
      loop(i);
    });
#if defined(__linux__)
    pthread_setname_np(threads_.back().native_handle(), ("ds-replica-" + std::to_string(i)).substr(0, 15).c_str());
#endif
  }
}

DISTRIBUTE_DECL HostReplicaThreads::~HostReplicaThreads() {
  stopping_.store(true, std::memory_order_release);
  epoch_.fetch_add(1, std::memory_order_acq_rel);
  epoch_.notify_all();
  for (auto& t : threads_) t.join();
}

DISTRIBUTE_DECL void HostReplicaThreads::loop(int replica) {
  std::uint32_t seen = 0;
  for (;;) {
    core::SpinThenWait backoff(spin_limit_);
    std::uint32_t e;
    while ((e = epoch_.load(std::memory_order_acquire)) == seen) backoff.pause(epoch_, seen);
    seen = e;
    if (stopping_.load(std::memory_order_acquire)) return;
    (*job_)(replica);
    if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) remaining_.notify_all();
  }
}
#endif

}  // namespace backends

DISTRIBUTE_END_NAMESPACE

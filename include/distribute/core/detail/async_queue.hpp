// The collectives a replica starts asynchronously (ReplicaContext::all_reduce_async) run on one
// thread of that replica's, in the order they were started. Every local replica has such a thread,
// so each asynchronous collective meets its peers in the ReplicaGroup exactly as the synchronous
// ones do, only off the step's thread. A synchronous collective of the replica first waits for
// its asynchronous ones (drain), so the group and the cross-worker link see one collective at a
// time, in program order.
//
// Errors: a collective that fails completes with its error, and so does every one started after
// it (the group or the link is broken or out of step; they never run). wait() rethrows the error;
// an error no wait() has seen is rethrown by the next drain (the replica's next collective, or
// the end of its step), so none is lost.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <distribute/version.hpp>

#if defined(__linux__)
#include <pthread.h>
#endif

DISTRIBUTE_BEGIN_NAMESPACE
namespace core::detail {

/// One asynchronous collective's completion.
class AsyncCompletion {
 public:
  void complete(std::exception_ptr error) {
    {
      std::lock_guard lk(mu_);
      error_ = std::move(error);
      done_ = true;
    }
    cv_.notify_all();
  }
  /// Waits for the completion; returns its error (null when it succeeded) and marks it seen.
  std::exception_ptr wait() {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return done_; });
    observed_ = true;
    return error_;
  }
  bool done() const {
    std::lock_guard lk(mu_);
    return done_;
  }
  /// The error, if the collective failed and no wait() has returned it.
  std::exception_ptr unobserved_error() const {
    std::lock_guard lk(mu_);
    return observed_ ? nullptr : error_;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  bool observed_ = false;
  std::exception_ptr error_;
};

class AsyncQueue {
 public:
  /// `on_start` prepares the thread once (the backend binds it to the replica's device).
  explicit AsyncQueue(std::function<void()> on_start = {}) : on_start_(std::move(on_start)) {}
  AsyncQueue(const AsyncQueue&) = delete;
  AsyncQueue& operator=(const AsyncQueue&) = delete;
  ~AsyncQueue();

  /// Queues `job` behind the collectives started before it; the thread starts on first use.
  std::shared_ptr<AsyncCompletion> submit(std::function<void()> job);

  /// Waits until every collective started so far has completed, then forgets them; rethrows the
  /// first error that no wait() has seen. A later collective starts with a clean slate.
  void drain();

 private:
  struct Job {
    std::function<void()> run;
    std::shared_ptr<AsyncCompletion> completion;
  };

  void loop();

  std::function<void()> on_start_;
  std::mutex mu_;
  std::condition_variable cv_, idle_;
  std::deque<Job> jobs_;
  std::vector<std::shared_ptr<AsyncCompletion>> started_;  // since the last drain
  std::size_t pending_ = 0;
  std::exception_ptr failed_;  // the first error since the last drain: later jobs complete with it
  bool stopping_ = false;
  std::thread thread_;
};

#if DISTRIBUTE_DETAIL_DEFINE  // compiled apart with DISTRIBUTE_SEPARATE_COMPILATION (version.hpp)
DISTRIBUTE_DECL AsyncQueue::~AsyncQueue() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

DISTRIBUTE_DECL std::shared_ptr<AsyncCompletion> AsyncQueue::submit(std::function<void()> job) {
  auto completion = std::make_shared<AsyncCompletion>();
  {
    std::lock_guard lk(mu_);
    if (!thread_.joinable()) {
      thread_ = std::thread([this] { loop(); });
#if defined(__linux__)
      pthread_setname_np(thread_.native_handle(), "ds-async");
#endif
    }
    jobs_.push_back(Job{std::move(job), completion});
    started_.push_back(completion);
    ++pending_;
  }
  cv_.notify_all();
  return completion;
}

DISTRIBUTE_DECL void AsyncQueue::drain() {
  std::vector<std::shared_ptr<AsyncCompletion>> started;
  {
    std::unique_lock lk(mu_);
    if (started_.empty()) return;
    idle_.wait(lk, [&] { return pending_ == 0; });
    started.swap(started_);
    failed_ = nullptr;
  }
  for (const auto& c : started) {
    if (auto e = c->unobserved_error()) std::rethrow_exception(e);
  }
}

DISTRIBUTE_DECL void AsyncQueue::loop() {
  if (on_start_) on_start_();
  std::unique_lock lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stopping_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stopping, nothing left
    Job job = std::move(jobs_.front());
    jobs_.pop_front();
    std::exception_ptr error = failed_;
    lk.unlock();
    if (!error) {
      try {
        job.run();
      } catch (...) {
        error = std::current_exception();
      }
    }
    job.run = nullptr;  // the job's values are released before its completion is seen
    lk.lock();
    if (error && !failed_) failed_ = error;
    lk.unlock();
    job.completion->complete(error);
    lk.lock();
    if (--pending_ == 0) idle_.notify_all();
  }
}
#endif

}  // namespace core::detail
DISTRIBUTE_END_NAMESPACE

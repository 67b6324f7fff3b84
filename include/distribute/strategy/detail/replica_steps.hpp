// A synchronous strategy's steps: a body run once per local replica, each on its replica thread
// in its replica context, one step at a time per strategy; the replicas' errors ranked into the
// one that run() throws.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#include <distribute/backends/host/replica_threads.hpp>
#include <distribute/core/context.hpp>
#include <distribute/core/error.hpp>
#include <distribute/core/replica_group.hpp>
#include <distribute/observe/timeline.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

namespace strategy::detail {

/// The error a step throws when replicas failed: the earliest (by `order`, 1 = first) that is not
/// a replica released with Cancelled because another failed; only Cancelled ones: the earliest.
DISTRIBUTE_DECL std::exception_ptr first_real_error(const std::vector<std::exception_ptr>& errors,
                                                    const std::vector<unsigned>& order);

class ReplicaSteps {
 public:
  /// `threads`: the replica threads, or null where the one replica runs on the caller's thread.
  ReplicaSteps(core::ReplicaGroup& group, std::unique_ptr<backends::HostReplicaThreads> threads)
      : group_(&group), threads_(std::move(threads)) {}

  /// Runs body(i) for each local replica i in contexts[i]; rethrows first_real_error of the step.
  /// A replica that fails aborts the group (releasing the others from its collectives).
  template <class Context, class Body>
  void execute(const std::vector<std::unique_ptr<Context>>& contexts, Body&& body) {
    auto& tc = core::thread_context();
    if (tc.replica) {
      throw InvalidArgument(fmt::format("run() called from inside a step function of {}: steps do not nest; call "
                                        "run() in cross-replica context",
                                        tc.replica->strategy().name()));
    }
    std::lock_guard serial(run_mutex_);
    const observe::TimelineSpan span("run", "step", static_cast<std::int64_t>(run_steps_++));  // off: a load, a branch
    const std::size_t n = contexts.size();
    errors_.assign(n, nullptr);
    error_order_.assign(n, 0);
    std::atomic<unsigned> error_counter{0};
    group_->begin_step();
    auto job = [&](int replica) {
      const auto i = static_cast<std::size_t>(replica);
      core::ReplicaContextSwitch in_replica(contexts[i].get());
      try {
        body(i);
        contexts[i]->drain_async();  // the step's asynchronous collectives end with it
      } catch (...) {
        errors_[i] = std::current_exception();
        error_order_[i] = ++error_counter;
        group_->abort();
        try {
          contexts[i]->drain_async();  // released by the abort; their errors are this one's echo
        } catch (...) {
        }
      }
      group_->finish(replica);
    };
    if (threads_) {
      backends::ReplicaJob ref(job);
      threads_->run_all(ref);
    } else {
      job(0);
    }
    if (error_counter.load() != 0) std::rethrow_exception(first_real_error(errors_, error_order_));
  }

 private:
  core::ReplicaGroup* group_;
  std::unique_ptr<backends::HostReplicaThreads> threads_;
  std::mutex run_mutex_;
  std::uint64_t run_steps_ = 0;  // steps so far, for the timeline
  std::vector<std::exception_ptr> errors_;
  std::vector<unsigned> error_order_;
};

#if DISTRIBUTE_DETAIL_DEFINE  // compiled apart with DISTRIBUTE_SEPARATE_COMPILATION (version.hpp)
DISTRIBUTE_DECL std::exception_ptr first_real_error(const std::vector<std::exception_ptr>& errors,
                                                    const std::vector<unsigned>& order) {
  std::exception_ptr first, first_any;
  unsigned best = ~0u, best_any = ~0u;
  for (std::size_t i = 0; i < errors.size(); ++i) {
    if (!errors[i]) continue;
    if (order[i] < best_any) best_any = order[i], first_any = errors[i];
    bool cancelled = false;
    try {
      std::rethrow_exception(errors[i]);
    } catch (const Cancelled&) {
      cancelled = true;
    } catch (...) {
    }
    if (!cancelled && order[i] < best) best = order[i], first = errors[i];
  }
  return first ? first : first_any;
}
#endif

}  // namespace strategy::detail

DISTRIBUTE_END_NAMESPACE

// ds::RemoteValue: the result of a function scheduled on a parameter-server cluster's worker (TF's
// tf.distribute.experimental.coordinator.RemoteValue), and the state the coordinator fulfils.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <distribute/ps/detail/coordinator_observability.hpp>
#include <distribute/ps/remote_function.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace ps::detail {

/// A scheduled closure's outcome: its serialised result or its error, once.
struct ClosureState {
  std::mutex mutex;
  std::condition_variable cv;
  bool finished = false;
  std::vector<std::byte> result;  // serialised
  std::exception_ptr error;
  std::shared_ptr<CoordinatorMetrics> metrics;  // null unless the coordinator serves metrics
  std::int64_t scheduled_ns = 0;                // set when the coordinator observes

  void finish(std::vector<std::byte> r) {
    std::lock_guard lock(mutex);
    result = std::move(r);
    finished = true;
    cv.notify_all();
  }
  void fail(std::exception_ptr e) {
    std::lock_guard lock(mutex);
    error = std::move(e);
    finished = true;
    cv.notify_all();
  }
  void wait() {
    std::unique_lock lock(mutex);
    cv.wait(lock, [&] { return finished; });
  }
};

}  // namespace ps::detail

/// The result of a scheduled function (TF's RemoteValue): get() waits for it.
template <class R>
class RemoteValue {
 public:
  explicit RemoteValue(std::shared_ptr<ps::detail::ClosureState> state) : state_(std::move(state)) {}

  /// Waits for the closure; returns its result or rethrows its error (Cancelled when an earlier
  /// closure's error cancelled it).
  R get() const {
    if (state_->metrics) state_->metrics->fetches->add();
    state_->wait();
    if (state_->error) std::rethrow_exception(state_->error);
    if constexpr (!std::is_void_v<R>) return std::get<0>(ps::detail::load_values<R>(
        std::string_view(reinterpret_cast<const char*>(state_->result.data()), state_->result.size()), "closure result"));
  }
  /// The same as get() (TF's fetch).
  R fetch() const { return get(); }
  /// True once the closure finished, with a result or an error.
  bool ready() const {
    std::lock_guard lock(state_->mutex);
    return state_->finished;
  }

 private:
  std::shared_ptr<ps::detail::ClosureState> state_;
};

DISTRIBUTE_END_NAMESPACE

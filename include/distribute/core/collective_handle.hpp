// CollectiveHandle<R>: what ReplicaContext::all_reduce_async returns. The collective runs on the
// replica's own collective thread (core/detail/async_queue.hpp) while the step goes on; wait()
// gives its results.
#pragma once

#include <exception>
#include <memory>
#include <optional>
#include <utility>

#include <distribute/core/detail/async_queue.hpp>
#include <distribute/core/error.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

template <class R>
class [[nodiscard]] CollectiveHandle {
 public:
  CollectiveHandle(std::shared_ptr<core::detail::AsyncCompletion> completion, std::shared_ptr<std::optional<R>> result)
      : completion_(std::move(completion)), result_(std::move(result)) {}

  /// Waits for the collective and returns its results (what all_reduce would have returned);
  /// throws its error (PeerFailure, CollectiveTimeout, InvalidArgument, ...) instead. Once only.
  R wait() {
    if (!completion_) throw InvalidArgument("CollectiveHandle::wait: this handle was waited on already (or moved from)");
    auto completion = std::move(completion_);
    if (std::exception_ptr e = completion->wait()) std::rethrow_exception(e);
    return std::move(**result_);
  }

  /// True once the collective has completed (wait() then returns at once).
  bool done() const { return completion_ && completion_->done(); }

 private:
  std::shared_ptr<core::detail::AsyncCompletion> completion_;
  std::shared_ptr<std::optional<R>> result_;
};

DISTRIBUTE_END_NAMESPACE

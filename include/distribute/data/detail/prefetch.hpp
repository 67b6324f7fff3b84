// Dataset::prefetch: a background thread that runs the stages before it and keeps up to
// `capacity` elements ready, so that producing the next batch overlaps the consumer's step.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include <distribute/data/detail/iterator.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace data::detail {

template <class T>
class PrefetchIterator final : public ElementIterator<T> {
 public:
  PrefetchIterator(IteratorPtr<T> upstream, std::size_t capacity)
      : upstream_(std::move(upstream)), capacity_(capacity) {
    // Started last, once every member it touches exists.
    producer_ = std::thread([this] { produce(); });
  }

  /// Stops the producer and waits for it. It is woken at once if it waits for room in the
  /// buffer; if it is inside an upstream stage (a slow map), that one element is finished first,
  /// so destruction takes at most one element's production time.
  ~PrefetchIterator() override {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    not_full_.notify_all();
    producer_.join();
  }

  PrefetchIterator(const PrefetchIterator&) = delete;
  PrefetchIterator& operator=(const PrefetchIterator&) = delete;

  /// The buffered elements in order; then the producer's exception (once), if it failed;
  /// then the end.
  std::optional<T> next() override {
    std::unique_lock lock(mutex_);
    not_empty_.wait(lock, [&] { return !buffer_.empty() || done_; });
    if (!buffer_.empty()) {
      std::optional<T> out(std::move(buffer_.front()));
      buffer_.pop_front();
      lock.unlock();
      not_full_.notify_one();
      return out;
    }
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
    return std::nullopt;
  }

 private:
  void produce() {
    std::exception_ptr error;
    try {
      for (;;) {
        {
          std::unique_lock lock(mutex_);
          not_full_.wait(lock, [&] { return stop_ || buffer_.size() < capacity_; });
          if (stop_) break;
        }
        std::optional<T> value = upstream_->next();  // outside the lock: this is the slow part
        if (!value) break;
        {
          std::lock_guard lock(mutex_);
          buffer_.push_back(std::move(*value));
        }
        not_empty_.notify_one();
      }
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard lock(mutex_);
      // Moved, not copied: the consumer then holds the only reference and the exception dies on its
      // thread (a copy left here would be released last on this one, after the consumer read it).
      error_ = std::move(error);
      done_ = true;
    }
    not_empty_.notify_all();
  }

  IteratorPtr<T> upstream_;  // used by the producer thread only, destroyed after it has joined
  const std::size_t capacity_;
  std::mutex mutex_;
  std::condition_variable not_empty_, not_full_;
  std::deque<T> buffer_;
  std::exception_ptr error_;
  bool done_ = false;
  bool stop_ = false;
  std::thread producer_;
};

}  // namespace data::detail
DISTRIBUTE_END_NAMESPACE

// The type-erased pipeline under Dataset<T>: every stage is an ElementIterator<T> that pulls from
// the stage before it, made by a factory each time the dataset is iterated (so a Dataset is a
// cheap, re-iterable value, as a tf.data.Dataset is).
#pragma once

#include <cstddef>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <utility>

#include <distribute/core/error.hpp>
#include <distribute/version.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace data::detail {

/// What the code iterating a dataset tells its sources. distribute_dataset sets the file shard
/// so that a file source reads only this worker's files (AutoShardPolicy::File); everything else
/// passes the context through unchanged.
struct PipelineContext {
  std::size_t file_shards = 1;
  std::size_t file_shard_index = 0;
};

/// One stage of a pipeline, pulled from the consumer's side.
template <class T>
class ElementIterator {
 public:
  virtual ~ElementIterator() = default;
  /// The next element, or nullopt once the stage is exhausted (and on every call after that).
  virtual std::optional<T> next() = 0;
};

template <class T>
using IteratorPtr = std::unique_ptr<ElementIterator<T>>;

template <class T>
using IteratorFactory = std::function<IteratorPtr<T>(const PipelineContext&)>;

/// A stage written as a lambda: next() calls `fn()`. Keeps the stages in dataset.hpp short.
template <class T, class F>
class LambdaIterator final : public ElementIterator<T> {
 public:
  explicit LambdaIterator(F fn) : fn_(std::move(fn)) {}
  std::optional<T> next() override { return fn_(); }

 private:
  F fn_;
};

template <class T, class F>
IteratorPtr<T> make_iterator(F fn) {
  return std::make_unique<LambdaIterator<T, F>>(std::move(fn));
}

/// The input iterator over one pass that Dataset and DistributedDataset hand out. It pulls
/// `source.next()` (an optional<T>, nullopt at the end) lazily: when the iterator is first looked
/// at (compared with end() or dereferenced) after it was made or advanced, not before. A `next()`
/// that throws is called again on the next look. `Source::past_the_end` is the message of a
/// dereference at the end.
template <class T, class Source>
class PullIterator {
 public:
  using value_type = T;
  using difference_type = std::ptrdiff_t;
  using iterator_concept = std::input_iterator_tag;

  PullIterator() = default;
  explicit PullIterator(Source source) : state_(std::make_unique<State>(std::move(source))) {}

  T& operator*() const {
    fill();
    if (!state_->current) throw InvalidArgument(Source::past_the_end);
    return *state_->current;
  }
  T* operator->() const { return &**this; }
  PullIterator& operator++() {
    fill();
    state_->current.reset();
    state_->fetched = false;
    return *this;
  }
  void operator++(int) { ++*this; }
  friend bool operator==(const PullIterator& it, std::default_sentinel_t) {
    if (!it.state_) return true;
    it.fill();
    return !it.state_->current;
  }

  /// The next element, or nullopt at the end (TF's get_next_as_optional).
  std::optional<T> get_next_as_optional() {
    if (!state_) return std::nullopt;
    fill();
    std::optional<T> out = std::move(state_->current);
    state_->current.reset();
    state_->fetched = false;
    return out;
  }

 private:
  struct State {
    explicit State(Source s) : source(std::move(s)) {}
    Source source;
    std::optional<T> current;
    bool fetched = false;
  };
  void fill() const {
    if (!state_->fetched) {
      state_->current = state_->source.next();
      state_->fetched = true;
    }
  }
  std::unique_ptr<State> state_;  // behind a pointer: the iterator is a cheap move-only handle
};

}  // namespace data::detail
DISTRIBUTE_END_NAMESPACE

// The type-erased pipeline under Dataset<T>: every stage is an ElementIterator<T> that pulls from
// the stage before it, made by a factory each time the dataset is iterated (so a Dataset is a
// cheap, re-iterable value, as a tf.data.Dataset is).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <utility>

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

}  // namespace data::detail
DISTRIBUTE_END_NAMESPACE

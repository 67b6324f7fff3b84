// DistributedDataset: what strategy.distribute_dataset and strategy.distribute_datasets_from_function
// return. Iterating it yields one PerReplica batch per step (a batch for each local replica),
// which strategy.run hands to the replicas.
//
// distribute_dataset(dataset) — the dataset yields *global* batches:
//
//  * Rebatching (TF's rule). A global batch of n rows is cut into num_replicas_in_sync pieces of
//    b = ceil(n / num_replicas_in_sync) rows: replica i gets rows [i*b, min((i+1)*b, n)), empty
//    when i*b >= n. range(8).batch(4) on 3 replicas: [0,1] [2,3] [] then [4,5] [6,7] [];
//    range(6).batch(4) on 2 replicas: [0,1] [2,3] then [4] [5]. No row goes to two replicas and
//    none is lost, so reduce(Mean, per_replica, 0) over a step is the mean of the global batch.
//  * Autosharding across workers, by the dataset's AutoShardPolicy (a no-op with one worker):
//    - Data: every worker runs the whole pipeline, cuts every global batch into the pieces above
//      and keeps the pieces of its own replicas (global replica ids w*L .. w*L+L-1). This is how
//      TF shards DATA (after rebatching, on the per-replica pieces), and it means a step on W
//      workers sees exactly the global batch a single worker would: training is the same as on
//      one worker with as many replicas. The price: each worker reads and maps everything. The
//      pipeline must be deterministic (seed the shuffle).
//    - File: worker w reads only the files i with i % W == w, batches them itself, and its replicas
//      take the pieces of its own global batches L at a time (W steps per global batch, as each
//      piece is 1/W of what the worker's global batch would give one replica). InvalidArgument
//      when the dataset has no file source or fewer files than workers.
//    - Auto: File when the source is files and there are at least as many files as workers,
//      else Data (as TF falls back).
//    - Off: every worker reads everything, as File does with all the files: every element is
//      seen once per worker.
//  * Prefetch: num_local_replicas pieces (one step) are prepared on a background thread.
//
// distribute_datasets_from_function(fn) — fn(InputContext) builds this worker's pipeline, already
// sharded and batched per replica; each local replica takes the next batch each step. On one
// worker, a pipeline batched with drop_remainder=true (every batch full, TF's static batch
// dimension) ends before a step that would leave a replica without a batch, as TF's does; else
// the rule below applies (TF, too, pads the last step whenever there are several workers).
//
// The end of the data (both): a step goes ahead as long as *any* replica of any worker has a
// batch. Each step the workers all-reduce how many of their replicas got one (TF's agreement);
// a replica without data that step gets an empty batch (no rows; inner shape of the last real
// batch, else a default-constructed batch), so every worker runs the same steps and the same
// collectives, and none waits for a peer that has run out. When the sum is 0 the iteration ends
// everywhere. If a worker's pipeline throws, that worker rethrows its error and every other
// worker throws PeerFailure at the same step.
//
// A DistributedDataset refers to its strategy's link to the other workers: iterate it only while
// the strategy lives, and on every worker the same way.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <iterator>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/cross_worker.hpp>
#include <distribute/core/dtype.hpp>
#include <distribute/core/error.hpp>
#include <distribute/core/reduce_op.hpp>
#include <distribute/core/values.hpp>
#include <distribute/data/dataset.hpp>
#include <distribute/data/detail/batching.hpp>
#include <distribute/data/detail/iterator.hpp>
#include <distribute/data/input_context.hpp>
#include <distribute/data/options.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace data {

/// Where this process's input goes: what a strategy tells distribute_dataset below.
struct InputPlacement {
  int num_workers = 1;
  int worker_index = 0;
  int num_local_replicas = 1;
  int num_replicas_in_sync = 1;
};

namespace detail {

/// Cuts each global batch into `num_pieces` per-replica pieces (the rule at the top of this
/// file) and passes on pieces [keep_begin, keep_end) of each, in order.
template <Sliceable B>
class RebatchIterator final : public ElementIterator<B> {
 public:
  RebatchIterator(IteratorPtr<B> upstream, std::int64_t num_pieces, std::int64_t keep_begin, std::int64_t keep_end)
      : upstream_(std::move(upstream)), num_pieces_(num_pieces), keep_begin_(keep_begin), keep_end_(keep_end) {}

  std::optional<B> next() override {
    while (pending_.empty()) {
      std::optional<B> global = upstream_->next();
      if (!global) return std::nullopt;
      const std::int64_t n =
          slice_traits<B>::rows(*global, "distribute_dataset (its elements must be global batches: dataset.batch(n))");
      const std::int64_t b = (n + num_pieces_ - 1) / num_pieces_;
      for (std::int64_t i = keep_begin_; i < keep_end_; ++i) {
        pending_.push_back(slice_traits<B>::slice(*global, std::min(i * b, n), std::min((i + 1) * b, n)));
      }
    }
    std::optional<B> out(std::move(pending_.front()));
    pending_.pop_front();
    return out;
  }

 private:
  IteratorPtr<B> upstream_;
  std::int64_t num_pieces_, keep_begin_, keep_end_;
  std::deque<B> pending_;
};

template <class T>
struct is_dataset : std::false_type {};
template <class T>
struct is_dataset<Dataset<T>> : std::true_type {};

struct DistributedAccess;

}  // namespace detail

/// A dataset distributed over a strategy's replicas; see the top of this file.
template <class Batch, class S>
class DistributedDataset {
  static_assert(detail::Sliceable<Batch>, "DistributedDataset: the elements must be batches");

 public:
  using value_type = PerReplica<Batch, S>;

  /// An input iterator over one pass: each step's PerReplica batch. A step (and, with several
  /// workers, its agreement collective) happens when the iterator is first looked at after ++;
  /// get_next_as_optional() is TF's.
  struct StepSource {
    using value_type = PerReplica<Batch, S>;
    static constexpr const char* past_the_end = "DistributedDataset iterator: dereferenced past the end";

    detail::IteratorPtr<Batch> source;
    InputPlacement placement;
    distribute::core::CrossWorkerLink* link = nullptr;
    std::optional<Batch> empty;  // what a replica without data gets: no rows, the last real inner shape
    bool finished = false;       // set on the end and on an error: a step that threw is not retried
    bool drop_partial_step = false;  // end instead of a step where a local replica has no batch

    // A worker that fails sends this instead of its count, so the sum turns negative everywhere.
    static constexpr std::int64_t failed_worker = -(std::int64_t{1} << 40);

    std::optional<value_type> next() {
      if (finished) return std::nullopt;
      const auto local = static_cast<std::size_t>(placement.num_local_replicas);
      std::vector<Batch> batches;
      batches.reserve(local);
      std::exception_ptr error;
      try {
        while (batches.size() < local) {
          std::optional<Batch> b = source->next();
          if (!b) break;
          batches.push_back(std::move(*b));
        }
      } catch (...) {
        error = std::current_exception();
      }
      std::int64_t replicas_with_data = error ? failed_worker : static_cast<std::int64_t>(batches.size());
      if (link && placement.num_workers > 1) {
        // Every worker takes part in this agreement every step, also the one whose input failed
        // or ran out, so the others never wait for it in a later collective.
        link->all_reduce(&replicas_with_data, 1, DType::I64, ReduceOp::Sum);
      }
      if (error) {
        finished = true;
        std::rethrow_exception(error);
      }
      if (replicas_with_data < 0) {
        finished = true;
        throw PeerFailure(fmt::format("distribute_dataset: the input pipeline of another worker failed at this step "
                                      "(worker {} of {} is stopping too; the error is reported on that worker)",
                                      placement.worker_index, placement.num_workers));
      }
      if (replicas_with_data == 0 || (drop_partial_step && batches.size() < local)) {
        finished = true;
        return std::nullopt;
      }
      if (!batches.empty()) empty = detail::empty_like(batches.back());
      while (batches.size() < local) batches.push_back(empty ? *empty : Batch{});
      return value_type(std::move(batches));
    }
  };
  using iterator = detail::PullIterator<typename StepSource::value_type, StepSource>;

  /// A fresh pass: the pipeline restarts (and its prefetch thread starts).
  iterator begin() const {
    return iterator(StepSource{detail::DatasetAccess::make_iterator(per_replica_, context_), placement_, link_,
                               std::nullopt, false, drop_partial_step_});
  }
  std::default_sentinel_t end() const noexcept { return {}; }

  int num_replicas_in_sync() const noexcept { return placement_.num_replicas_in_sync; }
  /// How this worker's share was chosen (Auto resolved to File or Data; Off with one worker).
  AutoShardPolicy auto_shard_policy() const noexcept { return policy_; }

 private:
  bool drop_partial_step_ = false;
  friend struct detail::DistributedAccess;

  DistributedDataset(Dataset<Batch> per_replica, detail::PipelineContext context, InputPlacement placement,
                     distribute::core::CrossWorkerLink* link, AutoShardPolicy policy)
      : per_replica_(std::move(per_replica)),
        context_(context),
        placement_(placement),
        link_(link),
        policy_(policy) {}

  Dataset<Batch> per_replica_;  // this worker's per-replica batches, in replica order, step after step
  detail::PipelineContext context_;
  InputPlacement placement_;
  distribute::core::CrossWorkerLink* link_;
  AutoShardPolicy policy_;
};

namespace detail {

struct DistributedAccess {
  template <class S, class T>
  static DistributedDataset<T, S> make(Dataset<T> per_replica, PipelineContext context, InputPlacement placement,
                                       distribute::core::CrossWorkerLink* link, AutoShardPolicy policy) {
    return DistributedDataset<T, S>(std::move(per_replica), context, placement, link, policy);
  }
  template <class S, class T>
  static void set_drop_partial_step(DistributedDataset<T, S>& d, bool on) {
    d.drop_partial_step_ = on;
  }
};

}  // namespace detail

/// For the strategies (strategy.distribute_dataset): rebatch, autoshard, prefetch (see the top of this file).
template <class S, class T>
DistributedDataset<T, S> distribute_dataset(const Dataset<T>& dataset, const InputPlacement& placement,
                                            distribute::core::CrossWorkerLink* link) {
  static_assert(detail::Sliceable<T>,
                "distribute_dataset: the dataset's elements are not batches (a Tensor, a std::vector, or a pair or "
                "tuple of them); call .batch(global_batch_size) first: distribute_dataset splits each global "
                "batch among the replicas");
  const detail::Metadata metadata = detail::DatasetAccess::metadata(dataset);
  const int workers = placement.num_workers, worker = placement.worker_index;
  const int local = placement.num_local_replicas, in_sync = placement.num_replicas_in_sync;
  AutoShardPolicy policy = metadata.options.auto_shard_policy;
  if (policy == AutoShardPolicy::Auto) {
    const bool enough_files = metadata.num_files && *metadata.num_files >= static_cast<std::size_t>(workers);
    policy = enough_files ? AutoShardPolicy::File : AutoShardPolicy::Data;
  }
  detail::PipelineContext context;
  std::int64_t keep_begin = 0, keep_end = in_sync;
  if (workers <= 1) {
    policy = AutoShardPolicy::Off;  // nothing to shard; the local replicas split every global batch
  } else if (policy == AutoShardPolicy::File) {
    if (!metadata.num_files) {
      throw InvalidArgument(
          "distribute_dataset: AutoShardPolicy::File needs a dataset read from files (from_text_files, "
          "from_record_files); this one has no file source. Use AutoShardPolicy::Data");
    }
    if (*metadata.num_files < static_cast<std::size_t>(workers)) {
      throw InvalidArgument(fmt::format(
          "distribute_dataset: AutoShardPolicy::File: the dataset reads {} file(s) but there are {} workers; every "
          "worker needs at least one file. Use more files or AutoShardPolicy::Data",
          *metadata.num_files, workers));
    }
    context.file_shards = static_cast<std::size_t>(workers);
    context.file_shard_index = static_cast<std::size_t>(worker);
  } else if (policy == AutoShardPolicy::Data) {
    keep_begin = static_cast<std::int64_t>(worker) * local;
    keep_end = keep_begin + local;
  }
  auto upstream = dataset;
  Dataset<T> pieces = detail::DatasetAccess::make<T>(
      [upstream, in_sync, keep_begin, keep_end](const detail::PipelineContext& ctx) -> detail::IteratorPtr<T> {
        return std::make_unique<detail::RebatchIterator<T>>(detail::DatasetAccess::make_iterator(upstream, ctx), in_sync, keep_begin,
                                                    keep_end);
      },
      metadata);
  return detail::DistributedAccess::make<S>(pieces.prefetch(local), context, placement, link, policy);
}

/// For the strategies (strategy.distribute_datasets_from_function): fn(InputContext) once, for this worker's pipeline.
template <class S, class F>
auto distribute_datasets_from_function(F&& fn, const InputPlacement& placement,
                                       distribute::core::CrossWorkerLink* link) {
  static_assert(std::is_invocable_v<F&, const InputContext&>,
                "distribute_datasets_from_function(fn): fn must take a ds::InputContext");
  using D = std::remove_cvref_t<std::invoke_result_t<F&, const InputContext&>>;
  static_assert(detail::is_dataset<D>::value, "distribute_datasets_from_function(fn): fn must return a ds::data::Dataset");
  static_assert(detail::Sliceable<typename D::element_type>,
                "distribute_datasets_from_function(fn): the dataset must yield per-replica batches (a Tensor, a "
                "std::vector, or a pair or tuple of them): call .batch(ctx.get_per_replica_batch_size(global)). A "
                "replica left without data at the end gets an empty batch, which only a batch type can express");
  const InputContext context{placement.num_workers, placement.worker_index, placement.num_replicas_in_sync};
  D dataset = fn(context);
  auto out = detail::DistributedAccess::make<S>(dataset.prefetch(placement.num_local_replicas), detail::PipelineContext{}, placement,
                                        link, AutoShardPolicy::Off);
  // TF (input_lib._enable_get_next_as_optional): partial steps only where batches may be short
  // or there are several workers.
  detail::DistributedAccess::set_drop_partial_step(out, placement.num_workers == 1 && detail::DatasetAccess::metadata(dataset).static_batch);
  return out;
}

}  // namespace data
DISTRIBUTE_END_NAMESPACE

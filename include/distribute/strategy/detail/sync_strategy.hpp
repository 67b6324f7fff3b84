// SyncStrategy: the one composable core behind OneDeviceStrategy and MirroredStrategy (and,
// later, the strategies that add workers). It owns the local replicas (an executor of the
// backend, a ReplicaGroup and the cross-device ops) and implements run/reduce/gather/...
// Derived is the public strategy type: values it makes are PerReplica<T, Derived>.
#pragma once

#include <atomic>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <distribute/backends/host/replica_threads.hpp>
#include <distribute/collective/communication_options.hpp>
#include <distribute/collective/device_staging.hpp>
#include <distribute/collective/validate.hpp>
#include <distribute/collective/multi_worker.hpp>
#include <distribute/collective/shared_memory.hpp>
#include <distribute/core/context.hpp>
#include <distribute/core/concat.hpp>
#include <distribute/core/host_operands.hpp>
#include <distribute/core/device.hpp>
#include <distribute/core/values.hpp>
#include <distribute/core/variable.hpp>
#include <distribute/data/distributed_dataset.hpp>
#include <distribute/observe/timeline.hpp>
#include <distribute/strategy/detail/reduce_values.hpp>
#include <distribute/strategy/detail/replica_context_for.hpp>
#include <distribute/strategy/detail/strategy_values.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

/// What distribute_values_from_function passes to its function.
struct ValueContext {
  int replica_id_in_sync_group = 0;
  int num_replicas_in_sync = 1;
};

template <class S>
class StrategyExtended;

template <class Derived, class Backend, class Ops>
class SyncStrategy : public AnyStrategy {
 public:
  using backend_type = Backend;
  using cross_device_ops = Ops;
  template <class T>
  using per_replica = PerReplica<T, Derived>;
  using replica_context_type = ReplicaContextFor<Derived>;

  const CommunicationOptions& communication_options() const noexcept { return options_; }

  SyncStrategy(const SyncStrategy&) = delete;
  SyncStrategy& operator=(const SyncStrategy&) = delete;

  int num_replicas_in_sync() const noexcept override { return static_cast<int>(devices_.size()) * num_workers_; }
  int num_local_replicas() const noexcept override { return static_cast<int>(devices_.size()); }
  std::vector<std::string> worker_devices() const override { return devices_; }

  core::VariablePlacement variable_placement() const override {
    return {core::PlacementKind::Replicated, devices_, num_replicas_in_sync(), id(), {}, link_};
  }

  /// Makes this strategy current on the calling thread until the guard is destroyed.
  [[nodiscard]] ScopeGuard scope() { return ScopeGuard(*this); }

  /// Calls fn once per local replica, concurrently, each in its replica context.
  template <class F, class... A>
  auto run(F&& fn, A&&... args) {
    const std::size_t n = devices_.size();
    std::size_t position = 0;
    (strategy::detail::check_arity<Derived>(args, n, position++), ...);
    constexpr bool plain = std::is_invocable_v<F&, decltype(strategy::detail::unwrap_for_replica<Derived>(args, 0))...>;
    constexpr bool with_ctx =
        std::is_invocable_v<F&, replica_context_type&, decltype(strategy::detail::unwrap_for_replica<Derived>(args, 0))...>;
    static_assert(plain || with_ctx,
                  "run(fn, args...): fn is not callable with the (unwrapped) arguments, with or without a "
                  "ReplicaContext& first");
    auto call = [&](std::size_t i) -> decltype(auto) {
      if constexpr (plain) return fn(strategy::detail::unwrap_for_replica<Derived>(args, i)...);
      else return fn(*contexts_[i], strategy::detail::unwrap_for_replica<Derived>(args, i)...);
    };
    using R = decltype(call(0));
    using Stored = std::conditional_t<std::is_void_v<R>, bool, std::decay_t<R>>;
    std::vector<std::optional<Stored>> results(n);
    execute([&](std::size_t i) {
      if constexpr (std::is_void_v<R>) {
        call(i);
        results[i].emplace(true);
      } else {
        results[i].emplace(call(i));
      }
    });
    if constexpr (std::is_void_v<R>) {
      return;
    } else if constexpr (strategy::detail::is_tuple<Stored>::value) {
      return split_tuple(results, std::make_index_sequence<std::tuple_size_v<Stored>>{});
    } else {
      std::vector<Stored> out;
      out.reserve(n);
      for (auto& r : results) out.push_back(std::move(*r));
      return PerReplica<Stored, Derived>(std::move(out));
    }
  }

  /// Reduces across replicas (no axis): returns a value of the component type. Per-replica
  /// IndexedSlices reduce as TF's, SUM or MEAN: every replica's rows in replica order (MEAN divides
  /// the values by num_replicas_in_sync()).
  template <class V>
  auto reduce(ReduceOpArg op, const V& value) {
    using C = typename strategy::detail::component_of<V>::type;
    static_assert(TensorLike<C> || core::is_indexed_slices_v<C>,
                  "ds::Strategy::reduce: the value's type has no ds::tensor_traits specialisation (it is not "
                  "TensorLike; see docs/tensors.md)");
    if constexpr (core::is_indexed_slices_v<C>) {  // TF's: every replica's rows (core/sparse_all_reduce.hpp)
      static_assert(strategy::detail::made_by_a_strategy<V>,
                    "ds::Strategy::reduce: IndexedSlices are reduced as a distributed value (PerReplica)");
      return core::reduce_slices(op.op, pointers(value.values()), link_, num_replicas_in_sync());
    } else if constexpr (TensorLike<C>) {
      return reduce_value(op, value);
    }
  }

  /// Reduces inside each component along `axis` and across replicas (a Tensor). With an axis,
  /// MEAN divides by the total number of elements along it, exact for uneven last batches.
  template <class V>
  auto reduce(ReduceOpArg op, const V& value, std::optional<std::int64_t> axis) {
    static_assert(!core::is_indexed_slices_v<typename strategy::detail::component_of<V>::type>,
                  "ds::Strategy::reduce with an axis: TF makes each replica's IndexedSlices dense first; return "
                  "slices.to_dense() from the step, or reduce the slices without an axis");
    static_assert(TensorLike<typename strategy::detail::component_of<V>::type>,
                  "ds::Strategy::reduce: the value's type has no ds::tensor_traits specialisation (it is not "
                  "TensorLike; see docs/tensors.md)");
    if constexpr (TensorLike<typename strategy::detail::component_of<V>::type>) return reduce_value(op, value, axis);
  }

  /// Reduces inside each component over several axes (TF's tuple axis: reduce(op, v, {0, 1});
  /// negative axes count from the end; each at most once) and across replicas (a Tensor). MEAN
  /// divides by the total number of elements over them; no axes: across replicas only.
  template <class V>
  auto reduce(ReduceOpArg op, const V& value, std::initializer_list<std::int64_t> axes) {
    return reduce(op, value, std::span<const std::int64_t>(axes.begin(), axes.size()));
  }
  /// The same with a run-time list of axes (a std::vector<std::int64_t>, ...).
  template <class V>
  auto reduce(ReduceOpArg op, const V& value, std::span<const std::int64_t> axes) {
    static_assert(TensorLike<typename strategy::detail::component_of<V>::type>,
                  "ds::Strategy::reduce: the value's type has no ds::tensor_traits specialisation (it is not "
                  "TensorLike; see docs/tensors.md)");
    if constexpr (TensorLike<typename strategy::detail::component_of<V>::type>) return reduce_value_over(op, value, axes);
  }

  /// Concatenates the components along `axis` (in [-rank, rank); negative counts from the end).
  template <class V>
  auto gather(const V& value, std::int64_t axis) {
    static_assert(!core::is_indexed_slices_v<typename strategy::detail::component_of<V>::type>,
                  "ds::Strategy::gather: IndexedSlices are not gathered (TF makes them dense, or refuses with one "
                  "replica); gather slices.to_dense(), or reduce the slices to get every replica's rows");
    static_assert(TensorLike<typename strategy::detail::component_of<V>::type>,
                  "ds::Strategy::gather: the value's type has no ds::tensor_traits specialisation (it is not "
                  "TensorLike; see docs/tensors.md)");
    if constexpr (TensorLike<typename strategy::detail::component_of<V>::type>) return gather_value(value, axis);
  }

  /// The local components in replica order, not copied: a reference to the value's own
  /// components (valid while `value` lives; `const auto& x = s.local_results(v)[0]` refers into
  /// v). A temporary distributed value's components are moved out; a single (non-distributed)
  /// value is returned as a vector of one copy.
  template <class V>
  decltype(auto) local_results(const V& value) {
    if constexpr (strategy::detail::replica_components<V>) {
      static_assert(strategy::detail::not_of_another_strategy<V, Derived>,
                    "local_results: this distributed value was made by a strategy of another type");
      return value.values();
    } else {
      return std::vector<V>{value};
    }
  }
  template <class V>
    requires(!std::is_reference_v<V> && strategy::detail::made_by_a_strategy<V>)
  std::vector<typename V::value_type> local_results(V&& value) {
    static_assert(std::is_same_v<typename V::strategy_type, Derived>,
                  "local_results: this distributed value was made by a strategy of another type");
    return std::move(value).values();
  }

  /// fn(ValueContext) once per local replica → PerReplica.
  template <class F>
  auto distribute_values_from_function(F&& fn) {
    using R = std::decay_t<std::invoke_result_t<F&, const ValueContext&>>;
    std::vector<R> values;
    values.reserve(devices_.size());
    for (std::size_t i = 0; i < devices_.size(); ++i) {
      values.push_back(fn(ValueContext{contexts_[i]->replica_id_in_sync_group(), num_replicas_in_sync()}));
    }
    return PerReplica<R, Derived>(std::move(values));
  }

  /// Splits each global batch of `dataset` into per-replica batches (TF's rule), shards the input
  /// across workers by the dataset's AutoShardPolicy and prefetches; iterating the result yields
  /// PerReplica batches for run(). See data/distributed_dataset.hpp.
  template <class T>
  data::DistributedDataset<T, Derived> distribute_dataset(const data::Dataset<T>& dataset) {
    return data::distribute_dataset<Derived>(
        dataset, {num_workers_, worker_index_, num_local_replicas(), num_replicas_in_sync()}, link_);
  }

  /// fn(ds::InputContext) once for this worker's input pipeline; fn returns a Dataset already
  /// sharded and batched per replica, and each local replica takes one batch of it per step.
  template <class F>
  auto distribute_datasets_from_function(F&& fn) {
    return data::distribute_datasets_from_function<Derived>(
        std::forward<F>(fn), {num_workers_, worker_index_, num_local_replicas(), num_replicas_in_sync()}, link_);
  }

  StrategyExtended<Derived> extended() noexcept { return StrategyExtended<Derived>(self()); }

  /// Index of this worker process among the strategy's workers (0 = chief) and their number.
  int worker_index() const noexcept { return worker_index_; }
  int num_workers() const noexcept { return num_workers_; }

 protected:
  /// `devices`: canonical TF device strings, one per local replica. `link`: the other workers
  /// of a multi-worker strategy (outlives the strategy's base), or null. `cross_worker`: how the
  /// workers communicate (resolved already: Ring or Nccl). `metrics`: the task's collective
  /// metrics, where it serves them (outlives the strategy's base), or null.
  explicit SyncStrategy(std::vector<std::string> devices, CommunicationOptions options = {},
                        core::CrossWorkerLink* link = nullptr,
                        CommunicationImplementation cross_worker = CommunicationImplementation::Ring,
                        observe::CollectiveMetrics* metrics = nullptr)
      : devices_(std::move(devices)),
        options_(options),
        link_(link),
        num_workers_(link ? link->num_workers() : 1),
        worker_index_(link ? link->worker_index() : 0),
        group_(static_cast<int>(devices_.size())),
        collectives_(link ? collective::make_multi_worker_collectives<Ops>(
                                {num_replicas_in_sync(), devices_, options_, metrics}, *link, cross_worker)
                          : collective::make_collectives<Ops>({num_replicas_in_sync(), devices_, options_})) {
    const int local = static_cast<int>(devices_.size());
    for (int i = 0; i < local; ++i) {
      // The AnyStrategy base, not self(): Derived is not constructed yet, and a downcast to it
      // here is undefined (clang's UBSan reports it).
      contexts_.push_back(std::make_unique<replica_context_type>(static_cast<AnyStrategy&>(*this), group_, *collectives_, i,
                                                                 worker_index_ * local + i,
                                                                 devices_[static_cast<std::size_t>(i)]));
      contexts_.back()->set_async_thread_setup(
          [this, i] { Backend::enter_replica_thread(i, devices_[static_cast<std::size_t>(i)]); });
    }
    if (devices_.size() > 1 || !Backend::single_replica_on_caller_thread) {
      threads_ = std::make_unique<backends::HostReplicaThreads>(
          static_cast<int>(devices_.size()),
          [this](int i) { Backend::enter_replica_thread(i, devices_[static_cast<std::size_t>(i)]); },
          Backend::single_replica_on_caller_thread);
    }
  }

 protected:
  replica_context_type& replica_context(std::size_t i) noexcept { return *contexts_[i]; }

 private:
  // The bodies of reduce and gather, for values whose components are TensorLike.
  template <class V>
  auto reduce_value(ReduceOpArg op, const V& value) {
    if constexpr (strategy::detail::replica_components<V>) {
      static_assert(strategy::detail::not_of_another_strategy<V, Derived>,
                    "reduce: this distributed value was made by a strategy of another type");
      return core::reduce_components(op.op, pointers(value.values()), link_);
    } else {
      static_assert(TensorLike<V>, "reduce: the value is neither a distributed value of this strategy nor TensorLike");
      return reduce_plain(op.op, value);
    }
  }

  template <class V>
  auto reduce_value(ReduceOpArg op, const V& value, std::optional<std::int64_t> axis) {
    constexpr bool distributed = strategy::detail::replica_components<V>;
    auto components = [&]() -> decltype(auto) {
      if constexpr (distributed) {
        static_assert(strategy::detail::not_of_another_strategy<V, Derived>,
                      "reduce: this distributed value was made by a strategy of another type");
        return pointers(value.values());
      } else {
        static_assert(TensorLike<V>, "reduce: the value is neither a distributed value of this strategy nor TensorLike");
        return std::vector<const V*>{&value};
      }
    }();
    using U = std::remove_cvref_t<decltype(*components.front())>;
    using R = strategy::detail::reduced_t<U>;
    if (!axis) {
      U r = [&] {
        if constexpr (distributed) return core::reduce_components(op.op, components, link_);
        else return reduce_plain(op.op, value);
      }();
      if constexpr (memory_space_v<U> == MemorySpace::device) {
        return core::device_ops<U>::to_host(r);
      } else if constexpr (std::is_same_v<R, U>) {
        return r;
      } else {
        const TensorView v = view_of(r);
        core::RowMajorResult<R> out;
        copy_to_contiguous(v, out.allocate(v.dtype, v.shape));
        return out.take();
      }
    }
    if constexpr (!distributed) {
      if (op.op == ReduceOp::Sum || op.op == ReduceOp::Product) check_plain_reducible(op.op);
    }
    return strategy::detail::reduce_components_along(op.op, components, *axis, distributed ? link_ : nullptr);
  }

  template <class V>
  auto reduce_value_over(ReduceOpArg op, const V& value, std::span<const std::int64_t> axes) {
    if constexpr (strategy::detail::replica_components<V>) {
      static_assert(strategy::detail::not_of_another_strategy<V, Derived>,
                    "reduce: this distributed value was made by a strategy of another type");
      return strategy::detail::reduce_components_over(op.op, pointers(value.values()), axes, link_);
    } else {
      if (op.op == ReduceOp::Sum || op.op == ReduceOp::Product) check_plain_reducible(op.op);
      return strategy::detail::reduce_components_over(op.op, std::vector<const V*>{&value}, axes, nullptr);
    }
  }

  template <class V>
  auto gather_value(const V& value, std::int64_t axis) {
    if constexpr (strategy::detail::made_by_a_strategy<V>) {
      static_assert(strategy::detail::not_of_another_strategy<V, Derived>,
                    "gather: this distributed value was made by a strategy of another type");
      return gather_parts(pointers(value.values()), axis);
    } else {
      static_assert(TensorLike<V>, "gather: the value is neither a distributed value of this strategy nor TensorLike");
      std::vector<const V*> parts(devices_.size(), &value);
      return gather_parts(parts, axis);
    }
  }

  Derived& self() noexcept { return static_cast<Derived&>(*this); }

  template <class T>
  static std::vector<const T*> pointers(const std::vector<T>& values) {
    std::vector<const T*> out;
    out.reserve(values.size());
    for (const auto& v : values) out.push_back(&v);
    return out;
  }

  void check_plain_reducible(ReduceOp op) const {
    if (num_replicas_in_sync() > 1) {
      throw InvalidArgument(fmt::format("reduce: a plain (non-distributed) value cannot be reduced with {} across {} "
                                        "replicas; pass the PerReplica value that run() returned",
                                        op, num_replicas_in_sync()));
    }
  }

  template <class U>
  U reduce_plain(ReduceOp op, const U& value) const {
    if (op == ReduceOp::Sum || op == ReduceOp::Product) check_plain_reducible(op);
    return clone_value(value);
  }

  template <class U>
  auto gather_parts(const std::vector<const U*>& parts, std::int64_t axis) {
    // A negative axis counts from the end (TF's gather does so with one replica; with several,
    // TF 2.21's collectives fail on it: docs/semantics.md). One below -rank is reported as given.
    if (const auto rank = static_cast<std::int64_t>(shape_of(*parts.front()).size()); axis < 0 && axis >= -rank) axis += rank;
    using G = gathered_t<U>;
    if constexpr (memory_space_v<U> == MemorySpace::device) {  // Thrust device memory (backends/cuda)
      std::vector<core::BufferRef> refs;
      std::vector<const core::BufferRef*> ptrs;
      refs.reserve(parts.size());
      for (const U* p : parts) {
        refs.push_back({const_cast<element_t<U>*>(tensor_traits<U>::data(*p)), dtype_of<element_t<U>>(), shape_of(*p)});
      }
      for (auto& r : refs) ptrs.push_back(&r);
      core::check_concat(ptrs, axis, "gather");
      if (!link_) return core::device_ops<U>::template concat<G>(ptrs, static_cast<std::size_t>(axis));
      auto host = core::device_ops<U>::host_copies(parts);  // across workers through host copies
      return core::device_ops<U>::template from_host<G>(gather_parts(host.pointers(), axis));
    } else {
      core::HostOperands in("gather");
      for (const U* p : parts) in.add(view_of(*p), true);
      std::vector<const core::BufferRef*> ptrs;
      for (auto& r : in.buffers()) ptrs.push_back(&r);
      core::check_concat(ptrs, axis, "gather");
      const DType dtype = in[0].dtype;
      core::RowMajorResult<G> out;
      if (!link_) {
        core::concat_along_axis(ptrs, static_cast<std::size_t>(axis),
                                  [&](const Shape& s) -> void* { return out.allocate(dtype, s); });
        return out.take();
      }
      std::vector<std::byte> local;
      Shape local_shape;
      core::concat_along_axis(ptrs, static_cast<std::size_t>(axis), [&](const Shape& s) -> void* {
        local_shape = s;
        local.resize(static_cast<std::size_t>(num_elements(s)) * size_of(dtype));
        return local.data();
      });
      auto all = core::gather_across_workers(*link_, {local.data(), dtype, local_shape},
                                               static_cast<std::size_t>(axis), "gather");
      void* dst = out.allocate(dtype, all.shape);
      if (!all.data.empty()) std::memcpy(dst, all.data.data(), all.data.size());
      return out.take();
    }
  }

  // batch_reduce_to across workers: each value reduced over the local replicas, then one
  // cross-worker all-reduce per pack of the local results, then MEAN's division.
  template <class... V>
  auto reduce_in_packs(ReduceOp op, const V&... values) {
    // MEAN lowered once per value: over its local copies on every worker.
    const Reduction reductions[] = {Reduction::lower(op, static_cast<std::int64_t>(values.values().size()) * num_workers_)...};
    const ReduceOp combine_op = reductions[0].op();
    auto out = std::make_tuple(core::reduce_components(combine_op, pointers(values.values()))...);
    core::HostOperands refs("batch_reduce_to");
    std::apply([&](auto&... r) { (refs.add(view_of(r)), ...); }, out);
    for (const auto& b : refs.buffers()) core::check_op_for_dtype(op, b.dtype, "batch_reduce_to");
    std::vector<std::byte> scratch;
    collective::all_reduce_in_packs(*link_, refs.buffers(), combine_op, options_.bytes_per_pack, scratch);
    for (std::size_t k = 0; k < refs.buffers().size(); ++k) {
      if (!reductions[k].divides()) continue;
      core::BufferRef& b = refs[k];
      visit_dtype(b.dtype, [&](auto t) { core::divide(static_cast<decltype(t)*>(b.data), b.count(), reductions[k].divisor()); });
    }
    refs.write_back();
    return out;
  }

  template <class Stored, std::size_t... I>
  auto split_tuple(std::vector<std::optional<Stored>>& results, std::index_sequence<I...>) {
    auto column = [&]<std::size_t K>(std::integral_constant<std::size_t, K>) {
      using T = std::tuple_element_t<K, Stored>;
      std::vector<T> values;
      values.reserve(results.size());
      for (auto& r : results) values.push_back(std::move(std::get<K>(*r)));
      return PerReplica<T, Derived>(std::move(values));
    };
    return std::make_tuple(column(std::integral_constant<std::size_t, I>{})...);
  }

  // Runs body(i) for each local replica in its replica context; rethrows the first real error.
  template <class Body>
  void execute(Body&& body) {
    auto& tc = core::thread_context();
    if (tc.replica) {
      throw InvalidArgument(fmt::format("run() called from inside a step function of {}: steps do not nest; call "
                                        "run() in cross-replica context",
                                        tc.replica->strategy().name()));
    }
    std::lock_guard serial(run_mutex_);  // one step at a time per strategy
    const observe::TimelineSpan span("run", "step", static_cast<std::int64_t>(run_steps_++));  // off: a load, a branch
    const std::size_t n = devices_.size();
    errors_.assign(n, nullptr);
    error_order_.assign(n, 0);
    std::atomic<unsigned> error_counter{0};
    group_.begin_step();
    auto job = [&](int replica) {
      const auto i = static_cast<std::size_t>(replica);
      core::ReplicaContextSwitch in_replica(contexts_[i].get());
      try {
        body(i);
        contexts_[i]->drain_async();  // the step's asynchronous collectives end with it
      } catch (...) {
        errors_[i] = std::current_exception();
        error_order_[i] = ++error_counter;
        group_.abort();
        try {
          contexts_[i]->drain_async();  // released by the abort; their errors are this one's echo
        } catch (...) {
        }
      }
      group_.finish(replica);
    };
    if (threads_) {
      backends::ReplicaJob ref(job);
      threads_->run_all(ref);
    } else {
      job(0);
    }
    if (error_counter.load() == 0) return;
    // The earliest error that is not a replica released because of another's failure.
    std::exception_ptr first, first_any;
    unsigned best = ~0u, best_any = ~0u;
    for (std::size_t i = 0; i < n; ++i) {
      if (!errors_[i]) continue;
      if (error_order_[i] < best_any) best_any = error_order_[i], first_any = errors_[i];
      bool cancelled = false;
      try {
        std::rethrow_exception(errors_[i]);
      } catch (const Cancelled&) {
        cancelled = true;
      } catch (...) {
      }
      if (!cancelled && error_order_[i] < best) best = error_order_[i], first = errors_[i];
    }
    std::rethrow_exception(first ? first : first_any);
  }

  std::vector<std::string> devices_;
  CommunicationOptions options_;
  core::CrossWorkerLink* link_;
  int num_workers_;
  int worker_index_;
  core::ReplicaGroup group_;
  std::unique_ptr<core::ReplicaCollectives> collectives_;
  std::vector<std::unique_ptr<replica_context_type>> contexts_;
  std::unique_ptr<backends::HostReplicaThreads> threads_;
  std::mutex run_mutex_;
  std::uint64_t run_steps_ = 0;  // run() calls so far, for the timeline
  std::vector<std::exception_ptr> errors_;
  std::vector<unsigned> error_order_;

  template <class S>
  friend class StrategyExtended;
};

DISTRIBUTE_END_NAMESPACE

#include <distribute/strategy/detail/strategy_extended.hpp>  // after SyncStrategy: it reads its privates

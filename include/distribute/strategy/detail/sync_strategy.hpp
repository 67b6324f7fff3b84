// SyncStrategy: the one composable core behind OneDeviceStrategy, MirroredStrategy and
// MultiWorkerMirroredStrategy. It owns the local replicas (their contexts, a ReplicaGroup, the
// cross-device ops) and states the strategy's API: run (whose steps replica_steps.hpp runs),
// reduce and gather (whose bodies are cross_replica.hpp's), the datasets, local_results.
// Derived is the public strategy type: values it makes are PerReplica<T, Derived>.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <distribute/backends/host/replica_threads.hpp>
#include <distribute/collective/communication_options.hpp>
#include <distribute/collective/device_staging.hpp>
#include <distribute/collective/multi_worker.hpp>
#include <distribute/core/context.hpp>
#include <distribute/core/device.hpp>
#include <distribute/core/sparse_all_reduce.hpp>
#include <distribute/core/values.hpp>
#include <distribute/core/variable.hpp>
#include <distribute/data/distributed_dataset.hpp>
#include <distribute/observe/collective_metrics.hpp>
#include <distribute/strategy/detail/cross_replica.hpp>
#include <distribute/strategy/detail/replica_context_for.hpp>
#include <distribute/strategy/detail/replica_steps.hpp>
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
    steps_.execute(contexts_, [&](std::size_t i) {
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
      return core::reduce_slices(op.op, strategy::detail::pointers(value.values()), link_, num_replicas_in_sync());
    } else if constexpr (TensorLike<C>) {
      return strategy::detail::reduce_value<Derived>(site(), op, value);
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
    if constexpr (TensorLike<typename strategy::detail::component_of<V>::type>) {
      return strategy::detail::reduce_value<Derived>(site(), op, value, axis);
    }
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
    if constexpr (TensorLike<typename strategy::detail::component_of<V>::type>) {
      return strategy::detail::reduce_value_over<Derived>(site(), op, value, axes);
    }
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
    if constexpr (TensorLike<typename strategy::detail::component_of<V>::type>) {
      return strategy::detail::gather_value<Derived>(site(), value, axis);
    }
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
                          : collective::make_collectives<Ops>({num_replicas_in_sync(), devices_, options_})),
        contexts_(replica_contexts()),
        steps_(group_, replica_threads()) {}

 protected:
  replica_context_type& replica_context(std::size_t i) noexcept { return *contexts_[i]; }

 private:
  Derived& self() noexcept { return static_cast<Derived&>(*this); }

  strategy::detail::CrossReplicaSite site() const noexcept {
    return {link_, devices_.size(), num_workers_, options_.bytes_per_pack};
  }

  /// The local replicas' contexts, made before their threads.
  std::vector<std::unique_ptr<replica_context_type>> replica_contexts() {
    std::vector<std::unique_ptr<replica_context_type>> contexts;
    const int local = static_cast<int>(devices_.size());
    for (int i = 0; i < local; ++i) {
      // The AnyStrategy base, not self(): Derived is not constructed yet, and a downcast to it
      // here is undefined (clang's UBSan reports it).
      contexts.push_back(std::make_unique<replica_context_type>(static_cast<AnyStrategy&>(*this), group_, *collectives_, i,
                                                                worker_index_ * local + i,
                                                                devices_[static_cast<std::size_t>(i)]));
      contexts.back()->set_async_thread_setup(
          [this, i] { Backend::enter_replica_thread(i, devices_[static_cast<std::size_t>(i)]); });
    }
    return contexts;
  }

  /// One thread per local replica, or none where the backend runs a single replica on the caller's.
  std::unique_ptr<backends::HostReplicaThreads> replica_threads() {
    if (devices_.size() <= 1 && Backend::single_replica_on_caller_thread) return nullptr;
    return std::make_unique<backends::HostReplicaThreads>(
        static_cast<int>(devices_.size()),
        [this](int i) { Backend::enter_replica_thread(i, devices_[static_cast<std::size_t>(i)]); },
        Backend::single_replica_on_caller_thread);
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

  std::vector<std::string> devices_;
  CommunicationOptions options_;
  core::CrossWorkerLink* link_;
  int num_workers_;
  int worker_index_;
  core::ReplicaGroup group_;
  std::unique_ptr<core::ReplicaCollectives> collectives_;
  std::vector<std::unique_ptr<replica_context_type>> contexts_;
  strategy::detail::ReplicaSteps steps_;  // after contexts_: its replica threads stop before they go

  template <class S>
  friend class StrategyExtended;
};

DISTRIBUTE_END_NAMESPACE

#include <distribute/strategy/detail/strategy_extended.hpp>  // after SyncStrategy: it reads its privates

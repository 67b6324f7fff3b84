// Contexts: which strategy is current on this thread (scope), and the replica context a step
// function runs in. A thread is in cross-replica context inside a scope and outside `run`, and in
// replica context inside a step function that `run` started.
#pragma once

#include <array>
#include <exception>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/any_strategy.hpp>
#include <distribute/core/collective_handle.hpp>
#include <distribute/core/detail/async_queue.hpp>
#include <distribute/core/detail/replica_operands.hpp>
#include <distribute/core/cross_worker.hpp>
#include <distribute/core/replica_group.hpp>
#include <distribute/core/elementwise.hpp>
#include <distribute/core/host_operands.hpp>
#include <distribute/core/remote_store.hpp>
#include <distribute/core/sparse_all_reduce.hpp>
#include <distribute/core/split_rows.hpp>
#include <distribute/core/error.hpp>
#include <distribute/core/reduce_op.hpp>
#include <distribute/core/tensor_traits.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

class ReplicaContext;

namespace core {
/// Per-thread context: the stack of entered scopes and, on a replica thread, its replica context.
struct ThreadContext {
  std::vector<AnyStrategy*> scopes;
  ReplicaContext* replica = nullptr;
};
inline ThreadContext& thread_context() noexcept {
  static thread_local ThreadContext ctx;
  return ctx;
}

/// The strategy whose scope is innermost on this thread (or whose replica this thread runs).
AnyStrategy* current_strategy_or_null() noexcept;

/// Sets this thread's replica context for the lifetime of the guard (run, merge_call).
class ReplicaContextSwitch {
 public:
  explicit ReplicaContextSwitch(ReplicaContext* ctx) noexcept : previous_(thread_context().replica) {
    thread_context().replica = ctx;
  }
  ~ReplicaContextSwitch() { thread_context().replica = previous_; }
  ReplicaContextSwitch(const ReplicaContextSwitch&) = delete;
  ReplicaContextSwitch& operator=(const ReplicaContextSwitch&) = delete;

 private:
  ReplicaContext* previous_;
};
}  // namespace core

/// RAII guard returned by `strategy.scope()`: makes the strategy current on this thread and
/// routes variable creation to it. Re-entering the same strategy is fine; entering a different
/// one inside it throws InvalidArgument.
class [[nodiscard]] ScopeGuard {
 public:
  explicit ScopeGuard(AnyStrategy& strategy);
  ~ScopeGuard() {
    auto& scopes = core::thread_context().scopes;
    if (!scopes.empty()) scopes.pop_back();
  }
  ScopeGuard(const ScopeGuard&) = delete;
  ScopeGuard& operator=(const ScopeGuard&) = delete;
  ScopeGuard(ScopeGuard&&) = delete;
  ScopeGuard& operator=(ScopeGuard&&) = delete;
};

/// A reduce op given as ds::ReduceOp or as one of TF's strings ("sum", "MEAN").
struct ReduceOpArg {
  ReduceOp op;
  ReduceOpArg(ReduceOp o) noexcept : op(o) {}  // NOLINT: implicit on purpose
  ReduceOpArg(std::string_view s) : op(parse_reduce_op(s)) {}  // NOLINT
  ReduceOpArg(const char* s) : op(parse_reduce_op(s)) {}  // NOLINT
  ReduceOpArg(const std::string& s) : op(parse_reduce_op(s)) {}  // NOLINT: string -> string_view would be a 2nd conversion
};

/// Given to a step function (as its first argument, or through get_replica_context()):
/// which replica it is, and the collectives among the replicas of the step.
class ReplicaContext {
 public:
  ReplicaContext(AnyStrategy& strategy, core::ReplicaGroup& group, core::ReplicaCollectives& collectives,
                 int local_replica_id, int replica_id_in_sync_group, std::string device)
      : strategy_(&strategy),
        group_(&group),
        collectives_(&collectives),
        local_id_(local_replica_id),
        global_id_(replica_id_in_sync_group),
        device_(std::move(device)) {}
  ReplicaContext(const ReplicaContext&) = delete;
  ReplicaContext& operator=(const ReplicaContext&) = delete;
  virtual ~ReplicaContext() = default;

  int replica_id_in_sync_group() const noexcept { return global_id_; }
  int num_replicas_in_sync() const noexcept { return strategy_->num_replicas_in_sync(); }
  /// This replica's index among the replicas of this process.
  int local_replica_id() const noexcept { return local_id_; }
  AnyStrategy& strategy() const noexcept { return *strategy_; }
  /// This replica's device as a TF string.
  const std::string& device() const noexcept { return device_; }

  /// Reduces each value across all replicas and returns the results (one value, or a tuple for
  /// several). All values of one call travel in one collective. Lvalues are left as they are (the
  /// result is a new value); rvalues are reduced in their own memory. An IndexedSlices is reduced as
  /// TF does, SUM or MEAN only: the result holds every replica's rows in replica order (MEAN
  /// divides the values by num_replicas_in_sync()); dense values passed with one ride in the same
  /// all-gather and are added on each replica (core/sparse_all_reduce.hpp).
  template <class... U>
    requires(sizeof...(U) > 0)
  auto all_reduce(ReduceOpArg op, U&&... values) {
    drain_async();
    return all_reduce_now(op, std::forward<U>(values)...);
  }

  /// The all-reduce of `input` written into `output`'s memory: each replica's input is read where
  /// it is and the result written into its output in one pass, with no allocation once `output`
  /// has the input's dtype and shape (an output kept across steps is reused every step; one of
  /// another dtype or shape is first replaced by a new value, which a view type cannot be).
  /// `output` may be `input` itself (in place) but may not otherwise overlap it, nor another
  /// replica's input or output: InvalidArgument. The elements are bitwise what all_reduce returns.
  template <class In, class Out>
  void all_reduce_into(ReduceOpArg op, const In& input, Out& output) {
    constexpr bool tensors = TensorLike<In> && TensorLike<Out>;
    static_assert(tensors, "ds::ReplicaContext::all_reduce_into: a value's type has no ds::tensor_traits "
                           "specialisation (it is not TensorLike; see docs/tensors.md)");
    if constexpr (tensors) {
      static_assert(memory_space_v<In> == MemorySpace::host && memory_space_v<Out> == MemorySpace::host,
                    "ds::ReplicaContext::all_reduce_into takes host values; reduce device values with all_reduce");
      drain_async();
      core::HostOperands operands("all_reduce_into");
      const TensorView in = view_of(input);
      operands.check_host(in);
      TensorView out = view_of(output);
      if constexpr (!is_view_v<Out>) {
        if (static_cast<const void*>(&input) != static_cast<const void*>(&output) &&
            (out.dtype != in.dtype || out.shape != in.shape)) {
          output = make_value<Out>(in.dtype, in.shape);
          out = view_of(output);
        }
      }
      if (out.dtype != in.dtype || out.shape != in.shape) {
        throw InvalidArgument(fmt::format("all_reduce_into: the output is a view of {}; it cannot hold the result, {}",
                                          describe(out), describe(in)));
      }
      const bool in_place = core::detail::same_elements(in, out);
      if (!in_place && core::detail::overlap(in, out)) {
        throw InvalidArgument(fmt::format("all_reduce_into: the output ({}) overlaps the input ({}) without being "
                                          "it; pass the input itself to reduce in place, or an output of its own",
                                          describe(out), describe(in)));
      }
      if (in_place) core::detail::add_operand(operands, output);
      else operands.add_out_of_place(in, std::move(out), collectives_->reads_sources());
      operands[0].caller_output = true;
      all_reduce_operands(op.op, operands, "all_reduce_into");
    }
  }

  /// Starts the all-reduce of `values` and returns at once; the handle's wait() gives what
  /// all_reduce would have returned. The collective runs on this replica's collective thread
  /// while the step goes on; several may be in flight, and they complete in the order they were
  /// started (every replica must start the same ones in the same order). Lvalues are copied now.
  /// A failure (a lost peer, a timeout, a mismatch) is thrown by wait(), and by the replica's
  /// next collective or the end of its step if no wait() saw it; a synchronous collective first
  /// waits for the asynchronous ones started before it.
  template <class... U>
    requires(sizeof...(U) > 0)
  auto all_reduce_async(ReduceOpArg op, U&&... values) {
    constexpr bool tensors = (TensorLike<std::remove_cvref_t<U>> && ...);
    static_assert(tensors, "ds::ReplicaContext::all_reduce_async: a value's type has no ds::tensor_traits "
                           "specialisation (it is not TensorLike; see docs/tensors.md)");
    if constexpr (tensors) {
      using R = decltype(std::declval<ReplicaContext&>().all_reduce_now(op, std::declval<std::remove_cvref_t<U>>()...));
      auto in = std::make_shared<std::tuple<std::remove_cvref_t<U>...>>(core::detail::owned(std::forward<U>(values))...);
      auto result = std::make_shared<std::optional<R>>();
      if (!async_) async_ = std::make_unique<core::detail::AsyncQueue>(async_thread_setup_);
      auto completion = async_->submit([this, op, in, result] {
        result->emplace(std::apply([&](auto&... v) { return all_reduce_now(op, std::move(v)...); }, *in));
      });
      return CollectiveHandle<R>(std::move(completion), std::move(result));
    }
  }

  /// Waits for this replica's asynchronous collectives; rethrows an error no wait() has seen.
  void drain_async() {
    if (async_) async_->drain();
  }

  /// How the strategy prepares this replica's collective thread (binds it to the device).
  void set_async_thread_setup(std::function<void()> setup) { async_thread_setup_ = std::move(setup); }

 private:
  // What every dense all-reduce ends with, once its values are operands: the op checked against
  // each dtype, the collective among the replicas, the results written back into the values.
  void all_reduce_operands(ReduceOp op, core::HostOperands& operands, const char* what) {
    for (const auto& b : operands.buffers()) core::check_op_for_dtype(op, b.dtype, what);
    collectives_->all_reduce(*group_, local_id_, operands.buffers(), op);
    operands.write_back();
  }

  template <class... U>
  auto all_reduce_now(ReduceOpArg op, U&&... values) {
    if constexpr ((core::is_indexed_slices_v<std::remove_cvref_t<U>> || ...)) {  // one all-gather of everything
      return core::all_reduce_with_slices(*collectives_, *group_, local_id_, num_replicas_in_sync(), op.op,
                                                  std::as_const(values)...);
    } else {
      return all_reduce_dense(op, std::forward<U>(values)...);
    }
  }

  template <class... U>
  auto all_reduce_dense(ReduceOpArg op, U&&... values) {
    // Checked here rather than in the constraint: one error at the caller's line (the compiler names
    // U in the note "in instantiation of ... all_reduce<...>"), and run(fn) still sees fn callable.
    constexpr bool tensors = (TensorLike<std::remove_cvref_t<U>> && ...);
    static_assert(tensors, "ds::ReplicaContext::all_reduce: a value's type has no ds::tensor_traits specialisation "
                           "(it is not TensorLike; see docs/tensors.md)");
    if constexpr (tensors) {
      // An lvalue is read where it is and its result written into a new value (out of place, one
      // pass); an rvalue is reduced in its own memory.
      std::tuple<U&&...> args(std::forward<U>(values)...);
      constexpr auto each = std::index_sequence_for<U...>{};
      std::array<Shape, sizeof...(U)> shapes;  // each lvalue's, measured once
      auto out = [&]<std::size_t... I>(std::index_sequence<I...>) {
        return std::tuple<std::remove_cvref_t<U>...>(
            core::detail::result_value<U>(std::get<I>(std::move(args)), shapes[I])...);
      }(each);
      core::HostOperands operands("all_reduce");
      const bool read_sources = collectives_->reads_sources();
      [&]<std::size_t... I>(std::index_sequence<I...>) {
        (core::detail::add_result_operand<U>(operands, std::get<I>(args), std::get<I>(out), std::move(shapes[I]),
                                             read_sources),
         ...);
      }(each);
      all_reduce_operands(op.op, operands, "all_reduce");
      if constexpr (sizeof...(U) == 1) {
        return std::get<0>(std::move(out));
      } else {
        return out;
      }
    }
  }

 public:
  /// Reduces a run-time list of values (e.g. every gradient of a model) in one collective;
  /// returns them in the same order (an lvalue list is left as it is).
  template <class V>
    requires requires { typename std::remove_cvref_t<V>::value_type; } &&
             TensorLike<typename std::remove_cvref_t<V>::value_type> &&
             std::same_as<std::remove_cvref_t<V>, std::vector<typename std::remove_cvref_t<V>::value_type>>
  auto batch_all_reduce(ReduceOpArg op, V&& values_in) {
    drain_async();
    using U = typename std::remove_cvref_t<V>::value_type;
    std::vector<U> values;
    core::HostOperands operands("batch_all_reduce");
    if constexpr (core::detail::out_of_place_v<const U&> && std::is_lvalue_reference_v<V>) {  // as all_reduce's lvalues
      values.reserve(values_in.size());
      std::vector<Shape> shapes(values_in.size());
      for (std::size_t i = 0; i < values_in.size(); ++i) {
        values.push_back(core::detail::result_value<const U&>(values_in[i], shapes[i]));
      }
      const bool read_sources = collectives_->reads_sources();
      for (std::size_t i = 0; i < values.size(); ++i) {
        core::detail::add_result_operand<const U&>(operands, values_in[i], values[i], std::move(shapes[i]), read_sources);
      }
    } else {
      if constexpr (std::is_lvalue_reference_v<V>) {
        values.reserve(values_in.size());
        for (const auto& v : values_in) values.push_back(clone_value(v));
      } else {
        values = std::move(values_in);
      }
      for (auto& v : values) core::detail::add_operand(operands, v);
    }
    all_reduce_operands(op.op, operands, "batch_all_reduce");
    return values;
  }

  /// Concatenates every replica's value along `axis` (sizes along it may differ) on every replica.
  template <class U>
  auto all_gather(const U& value, int axis) {
    static_assert(TensorLike<U>, "ds::ReplicaContext::all_gather: the value's type has no ds::tensor_traits "
                                 "specialisation (it is not TensorLike; see docs/tensors.md)");
    drain_async();
    if constexpr (TensorLike<U>) return all_gather_tensor(value, axis);
  }

  /// Every replica receives the value of replica `root` (a replica_id_in_sync_group).
  template <class V>
    requires TensorLike<std::remove_cvref_t<V>>
  std::remove_cvref_t<V> broadcast(V&& value_in, int root = 0) {
    if (root < 0 || root >= num_replicas_in_sync()) {
      throw InvalidArgument(
          fmt::format("broadcast: root {} is not a replica id (0..{})", root, num_replicas_in_sync() - 1));
    }
    drain_async();
    std::remove_cvref_t<V> value = core::detail::owned(std::forward<V>(value_in));
    core::HostOperands operands("broadcast");
    core::detail::add_operand(operands, value);
    collectives_->broadcast(*group_, local_id_, operands[0], root);
    operands.write_back();
    return value;
  }

  /// Reduces `value` (rank >= 1; the same dtype and shape on every replica) across all replicas
  /// and returns this replica's part of the result along axis 0. The rows are cut into
  /// num_replicas_in_sync() parts as np.array_split does: the first dim0 % n parts have one row
  /// more; replica i receives part i (so a [10] value over 4 replicas gives 3, 3, 2, 2 elements).
  template <class V>
  auto reduce_scatter(ReduceOpArg op, V&& value_in) {
    using U = std::remove_cvref_t<V>;
    static_assert(TensorLike<U>, "ds::ReplicaContext::reduce_scatter: the value's type has no ds::tensor_traits "
                                 "specialisation (it is not TensorLike; see docs/tensors.md)");
    if constexpr (TensorLike<U>) {
      drain_async();
      U value = core::detail::owned(std::forward<V>(value_in));  // the collectives may reduce into it
      core::HostOperands operands("reduce_scatter");
      core::detail::add_operand(operands, value);
      core::check_has_axis0(operands[0].shape, "reduce_scatter");
      core::check_op_for_dtype(op.op, operands[0].dtype, "reduce_scatter");
      const DType dtype = operands[0].dtype;
      core::RowMajorResult<gathered_t<U>> result;
      collectives_->reduce_scatter(*group_, local_id_, operands[0], op.op,
                                   [&](const Shape& shape) -> void* { return result.allocate(dtype, shape); });
      return result.take();
    }
  }

  /// One value cut along axis 0 into num_replicas_in_sync() parts (np.array_split's rule, as
  /// reduce_scatter): part j goes to replica j, and this replica receives the part addressed to
  /// it by every replica, concatenated along axis 0 in replica order. Replicas may cut values of
  /// different lengths; the other axes and the dtype must agree.
  template <class U>
    requires TensorLike<U>
  gathered_t<U> all_to_all(const U& value) {
    drain_async();
    core::HostOperands operands("all_to_all");
    core::detail::add_operand(operands, const_cast<U&>(value), true);
    const core::BufferRef& in = operands[0];
    core::check_has_axis0(in.shape, "all_to_all");
    const int n = num_replicas_in_sync();
    std::vector<core::BufferRef> pieces;
    for (int j = 0; j < n; ++j) pieces.push_back(core::part_of(in, n, j));
    core::RowMajorResult<gathered_t<U>> result;
    collectives_->all_to_all(*group_, local_id_, pieces, true, [&](const std::vector<Shape>& shapes) {
      Shape total = shapes.front();
      for (std::size_t k = 1; k < shapes.size(); ++k) total[0] += shapes[k][0];
      auto* out = static_cast<std::byte*>(result.allocate(in.dtype, total));
      std::vector<void*> at;
      for (const Shape& s : shapes) {
        at.push_back(out);
        out += static_cast<std::size_t>(num_elements(s)) * size_of(in.dtype);
      }
      return at;
    });
    return result.take();
  }

  /// num_replicas_in_sync() values: values[j] goes to replica j, and this replica receives the
  /// value addressed to it by every replica, in replica order. Shapes may differ from value to
  /// value; dtypes may not. (A std::vector of scalars is one rank-1 value: the overload above.)
  template <class U>
    requires TensorLike<U> && (!TensorLike<std::vector<U>>)
  std::vector<gathered_t<U>> all_to_all(const std::vector<U>& values) {
    drain_async();
    core::HostOperands operands("all_to_all");
    for (const U& v : values) core::detail::add_operand(operands, const_cast<U&>(v), true);
    std::vector<core::RowMajorResult<gathered_t<U>>> results;
    collectives_->all_to_all(*group_, local_id_, operands.buffers(), false, [&](const std::vector<Shape>& shapes) {
      results.resize(shapes.size());
      std::vector<void*> at;
      const DType dtype = operands[0].dtype;
      for (std::size_t k = 0; k < shapes.size(); ++k) at.push_back(results[k].allocate(dtype, shapes[k]));
      return at;
    });
    std::vector<gathered_t<U>> out;
    out.reserve(results.size());
    for (auto& r : results) out.push_back(r.take());
    return out;
  }

  /// Runs fn on replica 0 once every replica has arrived; all replicas leave together after it.
  /// (How a single shared copy is updated without racing the other replicas' reads.)
  template <class F>
  void run_once(F&& fn) {
    drain_async();
    group_->arrive_and_wait(local_id_, core::CollectiveKind::MergeCall);
    std::exception_ptr error;
    if (local_id_ == 0) {
      try {
        fn();
      } catch (...) {
        error = std::current_exception();
        group_->abort();
      }
    }
    group_->arrive_and_wait(local_id_, core::CollectiveKind::MergeCall);
    if (error) std::rethrow_exception(error);
  }

  core::ReplicaGroup& group() noexcept { return *group_; }

 private:
  template <class U>
  gathered_t<U> all_gather_tensor(const U& value, int axis) {
    using G = gathered_t<U>;
    core::RowMajorResult<G> result;
    core::HostOperands operands("all_gather");
    core::detail::add_operand(operands, const_cast<U&>(value), true);
    const core::BufferRef& in = operands[0];
    auto rank = static_cast<int>(in.shape.size());
    if (axis < -rank || axis >= rank) {
      throw InvalidArgument(fmt::format("all_gather: axis {} is out of range for a value of shape {}; it must be in [{}, {})",
                                        axis, shape_string(in.shape), -rank, rank));
    }
    if (axis < 0) axis += rank;  // from the end, as TF's all_gather takes it
    collectives_->all_gather(*group_, local_id_, in, axis, [&](const Shape& shape) -> void* {
      return result.allocate(in.dtype, shape);
    });
    return result.take();
  }

  AnyStrategy* strategy_;
  core::ReplicaGroup* group_;
  core::ReplicaCollectives* collectives_;
  int local_id_;
  int global_id_;
  std::string device_;
  std::function<void()> async_thread_setup_;
  std::unique_ptr<core::detail::AsyncQueue> async_;  // started by the first all_reduce_async
};


namespace core {
inline AnyStrategy* current_strategy_or_null() noexcept {
  auto& tc = thread_context();
  if (tc.replica) return &tc.replica->strategy();
  return tc.scopes.empty() ? nullptr : tc.scopes.back();
}
}  // namespace core

#if DISTRIBUTE_DETAIL_DEFINE  // compiled apart with DISTRIBUTE_SEPARATE_COMPILATION (version.hpp)
DISTRIBUTE_DECL ScopeGuard::ScopeGuard(AnyStrategy& strategy) {
  auto& tc = core::thread_context();
  AnyStrategy* current = core::current_strategy_or_null();
  if (current && current->id() != strategy.id()) {
    throw InvalidArgument(fmt::format(
        "cannot enter the scope of {} (strategy #{}) inside the scope of {} (strategy #{}): a thread can be in one "
        "strategy's scope at a time; leave the outer scope first",
        strategy.name(), strategy.id(), current->name(), current->id()));
  }
  tc.scopes.push_back(&strategy);
}
#endif

DISTRIBUTE_END_NAMESPACE

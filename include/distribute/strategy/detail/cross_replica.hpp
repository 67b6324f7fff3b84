// The bodies of a synchronous strategy's reduce, gather and batch_reduce_to across workers
// (SyncStrategy, sync_strategy.hpp, keeps their signatures and contracts): a value's components
// (a distributed value's, or a plain value's one) reduced or concatenated over the local replicas
// and, through the workers' link, across workers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <tuple>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include <distribute/collective/multi_worker.hpp>
#include <distribute/core/concat.hpp>
#include <distribute/core/cross_worker.hpp>
#include <distribute/core/elementwise.hpp>
#include <distribute/core/error.hpp>
#include <distribute/core/host_operands.hpp>
#include <distribute/core/memory_space.hpp>
#include <distribute/core/reduce_components.hpp>
#include <distribute/core/reduce_op.hpp>
#include <distribute/core/tensor_traits.hpp>
#include <distribute/strategy/detail/reduce_values.hpp>
#include <distribute/strategy/detail/strategy_values.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

namespace strategy::detail {

/// Where a strategy's cross-replica operations run: the link to the other workers (null for one
/// worker) and how many replicas there are.
struct CrossReplicaSite {
  core::CrossWorkerLink* link = nullptr;
  std::size_t num_local_replicas = 1;
  int num_workers = 1;
  std::size_t bytes_per_pack = 0;  // CommunicationOptions::bytes_per_pack: batch_reduce_to's packs

  int num_replicas_in_sync() const noexcept { return static_cast<int>(num_local_replicas) * num_workers; }
};

template <class T>
std::vector<const T*> pointers(const std::vector<T>& values) {
  std::vector<const T*> out;
  out.reserve(values.size());
  for (const auto& v : values) out.push_back(&v);
  return out;
}

/// A plain value stands for every replica's: SUM and PRODUCT of it across several replicas would
/// be a guess at what the caller meant.
inline void check_plain_reducible(const CrossReplicaSite& site, ReduceOp op) {
  if (site.num_replicas_in_sync() > 1) {
    throw InvalidArgument(fmt::format("reduce: a plain (non-distributed) value cannot be reduced with {} across {} "
                                      "replicas; pass the PerReplica value that run() returned",
                                      op, site.num_replicas_in_sync()));
  }
}

template <class U>
U reduce_plain(const CrossReplicaSite& site, ReduceOp op, const U& value) {
  if (op == ReduceOp::Sum || op == ReduceOp::Product) check_plain_reducible(site, op);
  return clone_value(value);
}

/// reduce(op, value) for TensorLike components: a value of the component type.
template <class S, class V>
auto reduce_value(const CrossReplicaSite& site, ReduceOpArg op, const V& value) {
  if constexpr (replica_components<V>) {
    static_assert(not_of_another_strategy<V, S>, "reduce: this distributed value was made by a strategy of another type");
    return core::reduce_components(op.op, pointers(value.values()), site.link);
  } else {
    static_assert(TensorLike<V>, "reduce: the value is neither a distributed value of this strategy nor TensorLike");
    return reduce_plain(site, op.op, value);
  }
}

/// reduce(op, value, axis): without an axis, across replicas into a host Tensor; with one, inside
/// each component along it too.
template <class S, class V>
auto reduce_value(const CrossReplicaSite& site, ReduceOpArg op, const V& value, std::optional<std::int64_t> axis) {
  constexpr bool distributed = replica_components<V>;
  auto components = [&]() -> decltype(auto) {
    if constexpr (distributed) {
      static_assert(not_of_another_strategy<V, S>, "reduce: this distributed value was made by a strategy of another type");
      return pointers(value.values());
    } else {
      static_assert(TensorLike<V>, "reduce: the value is neither a distributed value of this strategy nor TensorLike");
      return std::vector<const V*>{&value};
    }
  }();
  using U = std::remove_cvref_t<decltype(*components.front())>;
  using R = reduced_t<U>;
  if (!axis) {
    U r = [&] {
      if constexpr (distributed) return core::reduce_components(op.op, components, site.link);
      else return reduce_plain(site, op.op, value);
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
    if (op.op == ReduceOp::Sum || op.op == ReduceOp::Product) check_plain_reducible(site, op.op);
  }
  return reduce_components_along(op.op, components, *axis, distributed ? site.link : nullptr);
}

/// reduce(op, value, axes): inside each component over the axes, and across replicas.
template <class S, class V>
auto reduce_value_over(const CrossReplicaSite& site, ReduceOpArg op, const V& value, std::span<const std::int64_t> axes) {
  if constexpr (replica_components<V>) {
    static_assert(not_of_another_strategy<V, S>, "reduce: this distributed value was made by a strategy of another type");
    return reduce_components_over(op.op, pointers(value.values()), axes, site.link);
  } else {
    if (op.op == ReduceOp::Sum || op.op == ReduceOp::Product) check_plain_reducible(site, op.op);
    return reduce_components_over(op.op, std::vector<const V*>{&value}, axes, nullptr);
  }
}

/// The local parts concatenated along `axis`, then, across workers, every worker's in worker order.
template <class U>
auto gather_parts(const CrossReplicaSite& site, const std::vector<const U*>& parts, std::int64_t axis) {
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
    if (!site.link) return core::device_ops<U>::template concat<G>(ptrs, static_cast<std::size_t>(axis));
    auto host = core::device_ops<U>::host_copies(parts);  // across workers through host copies
    return core::device_ops<U>::template from_host<G>(gather_parts(site, host.pointers(), axis));
  } else {
    core::HostOperands in("gather");
    for (const U* p : parts) in.add(view_of(*p), true);
    std::vector<const core::BufferRef*> ptrs;
    for (auto& r : in.buffers()) ptrs.push_back(&r);
    core::check_concat(ptrs, axis, "gather");
    const DType dtype = in[0].dtype;
    core::RowMajorResult<G> out;
    if (!site.link) {
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
    auto all = core::gather_across_workers(*site.link, {local.data(), dtype, local_shape},
                                           static_cast<std::size_t>(axis), "gather");
    void* dst = out.allocate(dtype, all.shape);
    if (!all.data.empty()) std::memcpy(dst, all.data.data(), all.data.size());
    return out.take();
  }
}

/// gather(value, axis) for TensorLike components; a plain value stands for every local replica's.
template <class S, class V>
auto gather_value(const CrossReplicaSite& site, const V& value, std::int64_t axis) {
  if constexpr (made_by_a_strategy<V>) {
    static_assert(not_of_another_strategy<V, S>, "gather: this distributed value was made by a strategy of another type");
    return gather_parts(site, pointers(value.values()), axis);
  } else {
    static_assert(TensorLike<V>, "gather: the value is neither a distributed value of this strategy nor TensorLike");
    std::vector<const V*> parts(site.num_local_replicas, &value);
    return gather_parts(site, parts, axis);
  }
}

/// batch_reduce_to across workers: each value reduced over the local replicas, then one
/// cross-worker all-reduce per pack of the local results, then MEAN's division.
template <class... V>
auto reduce_in_packs(const CrossReplicaSite& site, ReduceOp op, const V&... values) {
  // MEAN lowered once per value: over its local copies on every worker.
  const Reduction reductions[] = {
      Reduction::lower(op, static_cast<std::int64_t>(values.values().size()) * site.num_workers)...};
  const ReduceOp combine_op = reductions[0].op();
  auto out = std::make_tuple(core::reduce_components(combine_op, pointers(values.values()))...);
  core::HostOperands refs("batch_reduce_to");
  std::apply([&](auto&... r) { (refs.add(view_of(r)), ...); }, out);
  for (const auto& b : refs.buffers()) core::check_op_for_dtype(op, b.dtype, "batch_reduce_to");
  std::vector<std::byte> scratch;
  collective::all_reduce_in_packs(*site.link, refs.buffers(), combine_op, site.bytes_per_pack, scratch);
  for (std::size_t k = 0; k < refs.buffers().size(); ++k) {
    if (!reductions[k].divides()) continue;
    core::BufferRef& b = refs[k];
    visit_dtype(b.dtype,
                [&](auto t) { core::divide(static_cast<decltype(t)*>(b.data), b.count(), reductions[k].divisor()); });
  }
  refs.write_back();
  return out;
}

}  // namespace strategy::detail

DISTRIBUTE_END_NAMESPACE

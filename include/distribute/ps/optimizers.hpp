// Optimizers for variables on ps tasks (TF's Keras SGD and Adagrad), applied by the ps task that
// holds the rows: a worker sends the gradient (the rows of an IndexedSlices, or a dense value) and
// the hyperparameters, and the ps task updates the variable and its slot variable together, under
// its lock. The slot variables (SGD's momentum, Adagrad's accumulator) are created by build() on the
// coordinator beside each shard: same ps task, same shape, stored under the shard's key plus
// "/<slot>", so a step finds them without a handle and a checkpoint saves them with slot().
//
//   ds::optimizers::Adagrad opt{.learning_rate = 0.1};
//   opt.build(table);                                   // coordinator, in the strategy's scope
//   ... in a scheduled function (the optimizer travels as an argument, by value):
//   opt.apply_gradients(table, ds::IndexedSlices<ds::Tensor<float>>::from_lookup(ids, grad, table.shape()));
//
// A sparse gradient is deduplicated first (rows of one index summed, TF's deduplication), so each
// row is stepped once per gradient and the step equals the dense rule on to_dense() for every row
// it names; the rows it does not name keep their values and their slots' (TF's sparse kernels: a
// dense momentum step would also decay those rows' momentum). Inside a scheduled function the
// step joins the closure's commit: applied once even when the closure is retried.
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/error.hpp>
#include <distribute/core/host_operands.hpp>
#include <distribute/core/indexed_slices.hpp>
#include <distribute/core/initializer.hpp>
#include <distribute/core/remote_store.hpp>
#include <distribute/core/variable.hpp>
#include <distribute/ps/detail/optimizer_rules.hpp>
#include <distribute/ps/sharded_variable.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace ps::detail {

/// What an optimizer tells the ps task: which rule, its hyperparameters, its slot and the slot's
/// first value.
struct StepRule {
  core::RemoteUpdate kind;
  std::array<double, 3> params;
  double slot_initial_value;
};

template <class T>
const core::RemoteHandle& on_ps(const Variable<T>& v, const StepRule& rule, std::string_view what) {
  const core::RemoteHandle* h = v.remote_handle();
  if (!h) {
    throw InvalidArgument(fmt::format("{}.{}: variable '{}' is not on a ps task; these optimizers step variables where "
                                      "a ps task holds them (create it in ParameterServerStrategy::scope(), connected "
                                      "to its cluster)",
                                      optimizer_name(rule.kind), what, v.name()));
  }
  if (!steps_apply_to(v.dtype())) {
    throw InvalidArgument(fmt::format("{}.{}: {} applies to float32 and float64 variables; '{}' is {}",
                                      optimizer_name(rule.kind), what, optimizer_name(rule.kind), v.name(),
                                      to_string(v.dtype())));
  }
  check_step_params(rule.kind, rule.params, fmt::format("variable '{}'", v.name()));
  return *h;
}

template <class T>
void build_slot(const Variable<T>& v, const StepRule& rule) {
  const core::RemoteHandle& h = on_ps(v, rule, "build");
  const std::string_view slot = slot_name(rule.kind);
  if (slot.empty()) return;
  h.store->create_initialized(h.task, slot_key(h.key, slot), v.dtype(), v.shape(), Initializer::constant(rule.slot_initial_value));
}

template <class T>
Variable<T> slot_of(const Variable<T>& v, const StepRule& rule, std::string_view slot) {
  const core::RemoteHandle& h = on_ps(v, rule, "slot");
  if (slot_name(rule.kind).empty() || slot != slot_name(rule.kind)) {
    throw InvalidArgument(fmt::format("{} keeps {}; '{}' is not one of its slots", optimizer_name(rule.kind),
                                      slot_name(rule.kind).empty() ? std::string("no slot") : fmt::format("the slot '{}'", slot_name(rule.kind)),
                                      slot));
  }
  return Variable<T>::attach_remote(fmt::format("{}/{}", v.name(), slot), v.dtype(), v.shape(),
                                    core::RemoteHandle{h.store, h.task, slot_key(h.key, slot)});
}

template <class T, class U>
void step_rows(const ShardedVariable<T>& table, const IndexedSlices<U>& gradient, const StepRule& rule) {
  const std::string what = fmt::format("{}.apply_gradients", optimizer_name(rule.kind));
  const auto parts = table.route(gradient.deduplicated(), what);
  std::vector<core::RowsWrite> writes;
  for (const auto& p : parts) {
    const core::RemoteHandle& h = on_ps(table.variables()[p.shard], rule, "apply_gradients");
    core::RowsUpdate u;
    u.kind = rule.kind;
    u.dtype = table.dtype();
    u.rows = p.rows;
    u.values = p.values;
    u.params = rule.params;
    writes.push_back({h.task, h.key, u});
  }
  if (!writes.empty()) table.variables()[parts.front().shard].remote_handle()->store->update_rows_batch(writes);
}

template <class T, class U>
void step_rows(const Variable<T>& v, const IndexedSlices<U>& gradient, const StepRule& rule) {
  step_rows(ShardedVariable<T>(std::vector<Variable<T>>{v}, v.name()), gradient, rule);
}

template <class T>
void step_dense(const Variable<T>& v, const T& gradient, const StepRule& rule) {
  const core::RemoteHandle& h = on_ps(v, rule, "apply_gradients");
  core::HostOperands g("apply_gradients");
  g.add(view_of(gradient), true);
  if (g[0].dtype != v.dtype() || g[0].shape != v.shape()) {
    throw InvalidArgument(fmt::format("{}.apply_gradients: a {} gradient of shape {} for variable '{}' ({} of shape {})",
                                      optimizer_name(rule.kind), to_string(g[0].dtype), shape_string(g[0].shape),
                                      v.name(), to_string(v.dtype()), shape_string(v.shape())));
  }
  core::RowsUpdate u;
  u.kind = rule.kind;
  u.dtype = v.dtype();
  u.all_rows = true;
  u.values = {static_cast<const std::byte*>(g[0].data), g[0].bytes()};
  u.params = rule.params;
  h.store->update_rows(h.task, h.key, u);
}

// What the optimizers' members call, for a sharded variable or a variable.
template <class T>
void build_slots(const ShardedVariable<T>& table, const StepRule& rule) {
  for (const auto& shard : table.variables()) build_slot(shard, rule);
}
template <class T>
void build_slots(const Variable<T>& v, const StepRule& rule) {
  build_slot(v, rule);
}
template <class V, class U>
void step(const V& v, const IndexedSlices<U>& gradient, const StepRule& rule) {
  step_rows(v, gradient, rule);
}
template <class T>
void step(const Variable<T>& v, const T& gradient, const StepRule& rule) {
  step_dense(v, gradient, rule);
}
template <class T>
ShardedVariable<T> slots_of(const ShardedVariable<T>& table, const StepRule& rule, std::string_view slot) {
  std::vector<Variable<T>> shards;
  for (const auto& shard : table.variables()) shards.push_back(slot_of(shard, rule, slot));
  return ShardedVariable<T>(std::move(shards), fmt::format("{}/{}", table.name(), slot));
}
template <class T>
Variable<T> slots_of(const Variable<T>& v, const StepRule& rule, std::string_view slot) {
  return slot_of(v, rule, slot);
}

}  // namespace ps::detail

namespace optimizers {

// Each optimizer is a plain aggregate of its hyperparameters (so `Adagrad{.learning_rate = 0.1}`
// works and it travels to a scheduled function by value) with the same members, each a line that
// hands its StepRule to ps/detail:
//   build(table | variable)                 creates the slot variables beside each shard (coordinator)
//   apply_gradients(table | variable, g)    one step with an IndexedSlices g (or a dense g for a Variable)
//   slot(table | variable, name)            the slot variables, as a ShardedVariable / Variable handle

/// Keras's SGD: var -= learning_rate * g; with momentum, m = momentum * m - learning_rate * g and
/// var += m (nesterov: var += momentum * m - learning_rate * g), m in the slot "momentum" (from 0).
struct SGD {
  double learning_rate = 0.01;
  double momentum = 0.0;
  bool nesterov = false;

  ps::detail::StepRule rule() const {
    if (momentum == 0.0 && !nesterov) return {core::RemoteUpdate::ApplySgd, {learning_rate, 0, 0}, 0.0};
    return {core::RemoteUpdate::ApplyMomentum, {learning_rate, momentum, nesterov ? 1.0 : 0.0}, 0.0};
  }
  template <class V>
  void build(const V& v) const { ps::detail::build_slots(v, rule()); }
  template <class V, class G>
  void apply_gradients(const V& v, const G& gradient) const { ps::detail::step(v, gradient, rule()); }
  template <class V>
  V slot(const V& v, std::string_view name) const { return ps::detail::slots_of(v, rule(), name); }
  template <class A>
  void serialize(A& a) { a(learning_rate, momentum, nesterov); }
};

/// Adagrad (TF's ApplyAdagradV2): acc += g * g; var -= learning_rate * g / (sqrt(acc) + epsilon),
/// acc in the slot "accumulator" (from initial_accumulator_value). Keras's defaults.
struct Adagrad {
  double learning_rate = 0.001;
  double initial_accumulator_value = 0.1;
  double epsilon = 1e-7;

  ps::detail::StepRule rule() const {
    if (!std::isfinite(initial_accumulator_value) || initial_accumulator_value < 0) {
      throw InvalidArgument(fmt::format("Adagrad: initial_accumulator_value must be a finite number >= 0, got {}",
                                        initial_accumulator_value));
    }
    return {core::RemoteUpdate::ApplyAdagrad, {learning_rate, epsilon, 0}, initial_accumulator_value};
  }
  template <class V>
  void build(const V& v) const { ps::detail::build_slots(v, rule()); }
  template <class V, class G>
  void apply_gradients(const V& v, const G& gradient) const { ps::detail::step(v, gradient, rule()); }
  template <class V>
  V slot(const V& v, std::string_view name) const { return ps::detail::slots_of(v, rule(), name); }
  template <class A>
  void serialize(A& a) { a(learning_rate, initial_accumulator_value, epsilon); }
};

}  // namespace optimizers
DISTRIBUTE_END_NAMESPACE

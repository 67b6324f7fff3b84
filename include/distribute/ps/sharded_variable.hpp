// ShardedVariable<T>: one logical variable stored as several Variable<T> shards split along
// axis 0 (TF's ShardedVariable, what ParameterServerStrategy makes of a partitioned variable).
//
// Why a class of its own rather than core/values.hpp's Sharded<Variable<T>, S>: Sharded<T, S> is
// an immutable value tied to the strategy type S that produced it, and its shape()/to_tensor()
// need T to be a tensor. A sharded variable is state: a handle (copies share the shards, as with
// Variable), updated in place, whose shards are placed one by one by whatever scope is current
// (round-robin on ps tasks inside ParameterServerStrategy), and which looks rows up shard by shard.
// Sharded<T, S> stays what it is for values.
//
// Shards follow the "div" rule when this class splits a value (ps/partitioner.hpp), but any
// shards that stack along axis 0 can be wrapped. Call the updating members in cross-replica
// context (the coordinator); each shard update goes through Variable's own rules.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <future>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/context.hpp>
#include <distribute/core/error.hpp>
#include <distribute/core/shape.hpp>
#include <distribute/core/tensor.hpp>
#include <distribute/core/tensor_traits.hpp>
#include <distribute/core/variable.hpp>
#include <distribute/ps/partitioner.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

namespace ps::detail {
/// Implemented by strategies that partition the variables created in their scope
/// (ParameterServerStrategy with a partitioner). ShardedVariable finds it on the current strategy
/// by a cross-cast, so core/ needs no partitioning hook.
class PartitionsVariables {
 public:
  virtual ~PartitionsVariables() = default;
  /// How many axis-0 shards a variable of this shape and dtype gets (1: not partitioned).
  virtual std::int64_t num_shards_for(const Shape& shape, DType dtype) const = 0;
};

/// The partitioning strategy whose scope is current on this thread, if any.
inline const PartitionsVariables* current_partitioning() noexcept {
  AnyStrategy* s = core::current_strategy_or_null();
  return s ? dynamic_cast<const PartitionsVariables*>(s) : nullptr;
}
}  // namespace ps::detail

template <class T>
class ShardedVariable {
  static_assert(TensorLike<T>, "ds::ShardedVariable<T>: T needs a ds::tensor_traits specialisation (see TensorLike)");
  static_assert(memory_space_v<T> == MemorySpace::host, "ds::ShardedVariable<T>: T must live in host memory");

 public:
  using value_type = T;
  using element_type = element_t<T>;

  /// Wraps existing shards, in row order (TF's ShardedVariable(variables)). They must agree on
  /// every dimension but the first; InvalidArgument otherwise, or when there are none.
  explicit ShardedVariable(std::vector<Variable<T>> shards, std::string name = "ShardedVariable")
      : state_(std::make_shared<State>()) {
    state_->name = std::move(name);
    state_->shards = std::move(shards);
    index_shards();
  }

  /// Splits `initial_value` into `num_shards` shards by the div rule (at most one per row). Each
  /// shard is a Variable<T> named "<name>/part_<i>", created, and so placed, by the scope current
  /// on this thread.
  ShardedVariable(const T& initial_value, std::int64_t num_shards, VariableOptions options = {})
      : state_(std::make_shared<State>()) {
    create_shards(initial_value, num_shards, std::move(options));
  }

  /// Inside the scope of a partitioning strategy, splits `initial_value` as its partitioner says;
  /// elsewhere, or when the partitioner says 1, one shard.
  explicit ShardedVariable(const T& initial_value, VariableOptions options = {}) : state_(std::make_shared<State>()) {
    const auto* partitioning = ps::detail::current_partitioning();
    const std::int64_t shards =
        partitioning ? partitioning->num_shards_for(shape_of(initial_value), dtype_of<element_type>()) : 1;
    create_shards(initial_value, shards, std::move(options));
  }

  const std::string& name() const noexcept { return state_->name; }
  /// The shards, in row order.
  const std::vector<Variable<T>>& variables() const noexcept { return state_->shards; }
  std::size_t num_shards() const noexcept { return state_->shards.size(); }
  /// The full shape: the shards' rows added up.
  const Shape& shape() const noexcept { return state_->shape; }
  DType dtype() const noexcept { return dtype_of<element_type>(); }
  /// Where each shard starts along axis 0, plus the row count at the end.
  const std::vector<std::int64_t>& row_offsets() const noexcept { return state_->offsets; }
  /// Each shard's device ("/job:ps/replica:0/task:1/device:CPU:0" under ParameterServerStrategy).
  std::vector<std::string> devices() const {
    std::vector<std::string> out;
    for (const auto& v : state_->shards) out.push_back(v.device());
    return out;
  }

  /// The shards concatenated along axis 0 (TF's convert_to_tensor: reads every shard).
  Tensor<element_type> to_tensor() const {
    std::vector<element_type> out(static_cast<std::size_t>(num_elements(shape())));
    for (std::size_t i = 0; i < num_shards(); ++i) {
      const T piece = state_->shards[i].read_value();
      copy_elements(tensor_traits<T>::data(piece), element_count(piece), out.data() + row_begin(i));
    }
    return Tensor<element_type>(shape(), std::move(out));
  }

  /// The whole value as a T (for T = std::vector<float>, a vector of every row).
  T read_value() const {
    T out = tensor_traits<T>::make(shape());
    const Tensor<element_type> all = to_tensor();
    copy_elements(all.data(), all.size(), tensor_traits<T>::data(out));
    return out;
  }

  /// Assigns (adds, subtracts) a value of the full shape, each shard its rows.
  template <TensorLike U>
  void assign(const U& value) { update_all(value, "assign", [](Variable<T>& v, const T& p) { v.assign(p); }); }
  template <TensorLike U>
  void assign_add(const U& delta) { update_all(delta, "assign_add", [](Variable<T>& v, const T& p) { v.assign_add(p); }); }
  template <TensorLike U>
  void assign_sub(const U& delta) { update_all(delta, "assign_sub", [](Variable<T>& v, const T& p) { v.assign_sub(p); }); }

  /// Overwrites rows [row_offset, row_offset + rows) with `rows` (its first dimension says how many
  /// rows; the others must match the variable's). A shard only partly covered is read, patched and
  /// written back, so concurrent writers of the same shard may lose updates.
  template <TensorLike U>
  void assign_rows(std::int64_t row_offset, const U& rows) {
    static_assert(std::is_same_v<element_t<U>, element_type>, "assign_rows: the rows must have the variable's element type");
    require_rows("assign_rows");
    const Shape s = shape_of(rows);
    if (s.size() != shape().size() || !std::equal(s.begin() + 1, s.end(), shape().begin() + 1)) {
      throw InvalidArgument(fmt::format("assign_rows: rows of shape {} do not fit sharded variable '{}' of shape {}; "
                                        "all dimensions but the first must match",
                                        shape_string(s), name(), shape_string(shape())));
    }
    const std::int64_t count = s[0];
    if (row_offset < 0 || row_offset + count > shape()[0]) {
      throw InvalidArgument(fmt::format("assign_rows: rows [{}, {}) are out of range for sharded variable '{}' with "
                                        "{} rows",
                                        row_offset, row_offset + count, name(), shape()[0]));
    }
    const element_type* src = tensor_traits<U>::data(rows);
    for (std::size_t i = 0; i < num_shards(); ++i) {
      const std::int64_t first = std::max(row_offset, offset(i));
      const std::int64_t last = std::min(row_offset + count, offset(i + 1));
      if (first >= last) continue;
      Variable<T>& shard = state_->shards[i];
      T piece = first == offset(i) && last == offset(i + 1) ? tensor_traits<T>::make(shard.shape()) : shard.read_value();
      copy_elements(src + (first - row_offset) * row_size(), static_cast<std::size_t>((last - first) * row_size()),
                    tensor_traits<T>::data(piece) + (first - offset(i)) * row_size());
      shard.assign(piece);
    }
  }

  /// The rows `ids` name, in the ids' order: shape ids.shape + shape[1:] (TF's
  /// tf.nn.embedding_lookup on a sharded variable). Each shard is read once, in parallel, and
  /// only the rows asked for are copied. An id outside [0, rows) is InvalidArgument naming it.
  template <TensorLike I>
    requires std::is_integral_v<element_t<I>>
  Tensor<element_type> embedding_lookup(const I& ids) const {
    require_rows("embedding_lookup");
    const Shape ids_shape = shape_of(ids);
    const auto* id = tensor_traits<I>::data(ids);
    const std::size_t n = element_count(ids);
    // Which positions each shard serves, with the row inside that shard.
    std::vector<std::vector<std::pair<std::size_t, std::int64_t>>> wanted(num_shards());
    const auto& offsets = state_->offsets;
    for (std::size_t p = 0; p < n; ++p) {
      const auto row = static_cast<std::int64_t>(id[p]);
      if (row < 0 || row >= shape()[0]) {
        throw InvalidArgument(fmt::format("embedding_lookup: id {} (at position {}) is out of range for sharded "
                                          "variable '{}' with {} rows",
                                          row, p, name(), shape()[0]));
      }
      const auto shard = static_cast<std::size_t>(std::upper_bound(offsets.begin(), offsets.end(), row) - offsets.begin() - 1);
      wanted[shard].emplace_back(p, row - offsets[shard]);
    }
    Shape out_shape = ids_shape;
    out_shape.insert(out_shape.end(), shape().begin() + 1, shape().end());
    std::vector<element_type> out(static_cast<std::size_t>(num_elements(out_shape)));
    const auto width = static_cast<std::size_t>(row_size());
    // Each task writes only its own positions of `out`, so the tasks share nothing.
    auto gather_from = [&](std::size_t shard) {
      Variable<T> v = state_->shards[shard];
      auto copy_rows = [&](const T& copy) {
        const element_type* rows = tensor_traits<T>::data(copy);
        for (const auto& [pos, local] : wanted[shard]) {
          copy_elements(rows + static_cast<std::size_t>(local) * width, width, out.data() + pos * width);
        }
      };
      if (const auto* remote = v.remote_handle()) {  // on a ps task: fetch only the rows asked for
        if constexpr (memory_space_v<T> == MemorySpace::host) {
          std::vector<std::int64_t> rows;
          rows.reserve(wanted[shard].size());
          for (const auto& [pos, local] : wanted[shard]) rows.push_back(local);
          std::vector<element_type> got(rows.size() * width);
          remote->store->read_rows(remote->task, remote->key, dtype_of<element_type>(), rows, width * sizeof(element_type),
                                   {reinterpret_cast<std::byte*>(got.data()), got.size() * sizeof(element_type)});
          for (std::size_t k = 0; k < rows.size(); ++k) {
            copy_elements(got.data() + k * width, width, out.data() + wanted[shard][k].first * width);
          }
        }
        return;
      }
      if (v.is_sync_on_read()) {
        copy_rows(v.read_value());  // its cross-replica value is an aggregate of the copies
        return;
      }
      bool done = false;  // in cross-replica context this visits every copy; one is enough
      v.apply_to_copies([&](T& copy, int) {
        if (!done) copy_rows(copy);
        done = true;
      });
    };
    std::vector<std::size_t> busy;
    for (std::size_t s = 0; s < num_shards(); ++s) {
      if (!wanted[s].empty()) busy.push_back(s);
    }
    if (busy.size() <= 1) {
      for (auto s : busy) gather_from(s);
      return Tensor<element_type>(std::move(out_shape), std::move(out));
    }
    std::vector<std::future<void>> pending;
    for (std::size_t k = 1; k < busy.size(); ++k) pending.push_back(std::async(std::launch::async, gather_from, busy[k]));
    std::exception_ptr error;
    try {
      gather_from(busy.front());
    } catch (...) {
      error = std::current_exception();
    }
    for (auto& f : pending) {  // wait for every task before `out` goes away, keep the first error
      try {
        f.get();
      } catch (...) {
        if (!error) error = std::current_exception();
      }
    }
    if (error) std::rethrow_exception(error);
    return Tensor<element_type>(std::move(out_shape), std::move(out));
  }

  /// Handles to the same shards compare equal.
  friend bool operator==(const ShardedVariable& a, const ShardedVariable& b) noexcept { return a.state_ == b.state_; }

 private:
  struct State {
    std::string name;
    std::vector<Variable<T>> shards;
    Shape shape;
    std::vector<std::int64_t> offsets;
    std::int64_t row_size = 1;  // elements per row
  };

  std::int64_t offset(std::size_t i) const { return state_->offsets[i]; }
  std::int64_t row_size() const { return state_->row_size; }
  std::size_t row_begin(std::size_t shard) const { return static_cast<std::size_t>(offset(shard) * row_size()); }

  void require_rows(const char* what) const {
    if (shape().empty()) {
      throw InvalidArgument(fmt::format("{}: sharded variable '{}' is a scalar and has no rows", what, name()));
    }
  }

  static void copy_elements(const element_type* src, std::size_t count, element_type* dst) {
    if (count != 0) std::memcpy(dst, src, count * sizeof(element_type));
  }

  void create_shards(const T& initial_value, std::int64_t num_shards, VariableOptions options) {
    state_->name = options.name;
    const Shape full = shape_of(initial_value);
    if (num_shards < 1) {
      throw InvalidArgument(fmt::format("ShardedVariable '{}': num_shards must be positive, got {}", options.name, num_shards));
    }
    if (full.empty()) {
      if (num_shards > 1) {
        throw InvalidArgument(fmt::format("ShardedVariable '{}': a scalar cannot be split into {} shards", options.name,
                                          num_shards));
      }
      state_->shards.emplace_back(initial_value, std::move(options));
      index_shards();
      return;
    }
    // As TF does: never more shards than rows (a 0-row value stays in one shard).
    const std::int64_t shards = std::max<std::int64_t>(1, std::min(num_shards, full[0]));
    if (shards == 1) {
      state_->shards.emplace_back(initial_value, std::move(options));
      index_shards();
      return;
    }
    const auto offsets = shard_row_offsets(full[0], shards);
    const std::int64_t width = num_elements(full) / full[0];
    const element_type* src = tensor_traits<T>::data(initial_value);
    for (std::int64_t i = 0; i < shards; ++i) {
      const auto idx = static_cast<std::size_t>(i);
      Shape piece_shape = full;
      piece_shape[0] = offsets[idx + 1] - offsets[idx];
      T piece = tensor_traits<T>::make(piece_shape);
      copy_elements(src + offsets[idx] * width, static_cast<std::size_t>(piece_shape[0] * width), tensor_traits<T>::data(piece));
      VariableOptions shard_options = options;
      shard_options.name = fmt::format("{}/part_{}", options.name, i);
      state_->shards.emplace_back(std::move(piece), std::move(shard_options));
    }
    index_shards();
  }

  // Checks the shards stack along axis 0 and records the full shape and row offsets.
  void index_shards() {
    auto& s = *state_;
    if (s.shards.empty()) throw InvalidArgument(fmt::format("ShardedVariable '{}': needs at least one shard", s.name));
    const Shape first = s.shards.front().shape();
    if (first.empty() && s.shards.size() > 1) {
      throw InvalidArgument(fmt::format("ShardedVariable '{}': scalar shards cannot be stacked along axis 0", s.name));
    }
    s.shape = first;
    s.offsets = {0};
    for (std::size_t i = 0; i < s.shards.size(); ++i) {
      const Shape si = s.shards[i].shape();
      if (si.size() != first.size() || (!si.empty() && !std::equal(si.begin() + 1, si.end(), first.begin() + 1))) {
        throw InvalidArgument(fmt::format("ShardedVariable '{}': shard {} has shape {} which does not stack with shard "
                                          "0's {}; all dimensions but the first must match",
                                          s.name, i, shape_string(si), shape_string(first)));
      }
      if (!si.empty()) s.offsets.push_back(s.offsets.back() + si[0]);
    }
    if (first.empty()) {
      s.offsets.push_back(1);  // a scalar reads as one "row"
      s.row_size = 1;
      return;
    }
    s.shape[0] = s.offsets.back();
    s.row_size = num_elements(Shape(first.begin() + 1, first.end()));
  }

  template <class U, class F>
  void update_all(const U& value, const char* what, F&& apply) {
    static_assert(std::is_same_v<element_t<U>, element_type>, "the value must have the variable's element type");
    if (shape_of(value) != shape()) {
      throw InvalidArgument(fmt::format("{}: value of shape {} does not match sharded variable '{}' of shape {}", what,
                                        shape_string(shape_of(value)), name(), shape_string(shape())));
    }
    const element_type* src = tensor_traits<U>::data(value);
    for (std::size_t i = 0; i < num_shards(); ++i) {
      Variable<T>& shard = state_->shards[i];
      T piece = tensor_traits<T>::make(shard.shape());
      copy_elements(src + row_begin(i), element_count(piece), tensor_traits<T>::data(piece));
      apply(shard, piece);
    }
  }

  std::shared_ptr<State> state_;
};

DISTRIBUTE_END_NAMESPACE

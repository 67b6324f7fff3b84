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
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/context.hpp>
#include <distribute/core/error.hpp>
#include <distribute/core/indexed_slices.hpp>
#include <distribute/core/initializer.hpp>
#include <distribute/core/remote_store.hpp>
#include <distribute/core/row_updates.hpp>
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

  /// A variable of `shape` filled by `init`, split into `num_shards` shards by the div rule (at
  /// most one per row). Shards on ps tasks are filled there: nothing but the shape is sent, and no
  /// process holds the whole table. Each shard holds the values `init` gives its rows whatever the
  /// shard count (random initializers are a function of the seed and the element's position).
  ShardedVariable(Shape shape, const Initializer& init, std::int64_t num_shards, VariableOptions options = {})
    requires StaticTensorLike<T>
      : state_(std::make_shared<State>()) {
    create_initialized_shards(std::move(shape), init, num_shards, std::move(options));
  }

  /// The same, split as the partitioning strategy whose scope is current says (else one shard).
  ShardedVariable(Shape shape, const Initializer& init, VariableOptions options = {})
    requires StaticTensorLike<T>
      : state_(std::make_shared<State>()) {
    const auto* partitioning = ps::detail::current_partitioning();
    const std::int64_t shards = partitioning ? partitioning->num_shards_for(shape, dtype_of<element_type>()) : 1;
    create_initialized_shards(std::move(shape), init, shards, std::move(options));
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
  /// rows; the others must match the variable's): scatter_update of those rows, so only they
  /// travel and writers of other rows of the same shard lose nothing.
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
    std::vector<std::int64_t> indices(static_cast<std::size_t>(count));
    for (std::int64_t i = 0; i < count; ++i) indices[static_cast<std::size_t>(i)] = row_offset + i;
    const element_type* src = tensor_traits<U>::data(rows);
    std::vector<element_type> values(src, src + element_count(rows));
    scatter(core::RowOp::Update, IndexedSlices<Tensor<element_type>>(std::move(indices), Tensor<element_type>(s, std::move(values)), shape()));
  }

  /// The rows `ids` name, in the ids' order: shape ids.shape + shape[1:] (TF's
  /// tf.nn.embedding_lookup on a sharded variable). Each shard is asked once for the distinct rows
  /// it holds, the shards on ps tasks at the same time, so a row repeated in `ids` travels once. An
  /// id outside [0, rows) is InvalidArgument naming it and its position.
  template <TensorLike I>
    requires std::is_integral_v<element_t<I>>
  Tensor<element_type> embedding_lookup(const I& ids) const {
    require_rows("embedding_lookup");
    const auto* id = tensor_traits<I>::data(ids);
    const std::size_t n = element_count(ids);
    struct Wanted {
      std::vector<std::int64_t> rows;        // distinct rows of the shard, as first asked for
      std::vector<std::size_t> slot;         // for each position served: its row's index in `rows`
      std::vector<std::size_t> positions;
      std::unordered_map<std::int64_t, std::size_t> index;
      std::vector<element_type> got;
    };
    std::vector<Wanted> wanted(num_shards());
    for (std::size_t p = 0; p < n; ++p) {
      const auto row = static_cast<std::int64_t>(id[p]);
      if (row < 0 || row >= shape()[0]) {
        throw InvalidArgument(fmt::format("embedding_lookup: id {} (at position {}) is out of range for sharded "
                                          "variable '{}' with {} rows",
                                          row, p, name(), shape()[0]));
      }
      const std::size_t shard = shard_of(row);
      Wanted& w = wanted[shard];
      auto [it, fresh] = w.index.try_emplace(row - offset(shard), w.rows.size());
      if (fresh) w.rows.push_back(row - offset(shard));
      w.slot.push_back(it->second);
      w.positions.push_back(p);
    }
    const auto width = static_cast<std::size_t>(row_size());
    for (auto& w : wanted) w.got.resize(w.rows.size() * width);
    std::vector<core::RowsRead> remote;
    std::vector<std::shared_ptr<core::RemoteVariableStore>> stores;
    for (std::size_t s = 0; s < num_shards(); ++s) {
      if (wanted[s].rows.empty()) continue;
      const Variable<T>& v = state_->shards[s];
      if (const auto* h = v.remote_handle()) {
        remote.push_back({h->task, h->key, dtype(), wanted[s].rows, width * sizeof(element_type),
                          std::as_writable_bytes(std::span(wanted[s].got))});
        stores.push_back(h->store);
      } else {
        const auto rows = v.sparse_read(wanted[s].rows);  // in this process
        const TensorView got = view_of(rows);
        if (got.bytes()) std::memcpy(wanted[s].got.data(), got.data, got.bytes());
      }
    }
    read_remote(remote, stores);
    Shape out_shape = shape_of(ids);
    out_shape.insert(out_shape.end(), shape().begin() + 1, shape().end());
    std::vector<element_type> out(static_cast<std::size_t>(num_elements(out_shape)));
    for (const Wanted& w : wanted) {
      for (std::size_t k = 0; k < w.positions.size(); ++k) {
        copy_elements(w.got.data() + w.slot[k] * width, width, out.data() + w.positions[k] * width);
      }
    }
    return Tensor<element_type>(std::move(out_shape), std::move(out));
  }

  /// TF's ShardedVariable.sparse_read: embedding_lookup of `indices`.
  template <TensorLike I>
    requires std::is_integral_v<element_t<I>>
  Tensor<element_type> sparse_read(const I& indices) const {
    return embedding_lookup(indices);
  }

  /// TF's scatter_add on a sharded variable: each row of `slices` (indices into the whole
  /// variable) goes to the shard that holds it, the shards on ps tasks at the same time, and each
  /// shard applies its rows in their order (Variable::scatter_add). Only the rows travel.
  template <class U>
  void scatter_add(const IndexedSlices<U>& slices) { scatter(core::RowOp::Add, slices); }
  template <class U>
  void scatter_sub(const IndexedSlices<U>& slices) { scatter(core::RowOp::Sub, slices); }
  template <class U>
  void scatter_update(const IndexedSlices<U>& slices) { scatter(core::RowOp::Update, slices); }
  template <class U>
  void scatter_min(const IndexedSlices<U>& slices) { scatter(core::RowOp::Min, slices); }
  template <class U>
  void scatter_max(const IndexedSlices<U>& slices) { scatter(core::RowOp::Max, slices); }

  /// The rows of one shard, cut from an IndexedSlices of the whole variable (route()).
  struct ShardRows {
    std::size_t shard = 0;
    std::vector<std::int64_t> rows;  // within the shard, in the order of the slices
    std::vector<std::byte> values;   // one row each
  };

  /// `slices` (indices into the whole variable) cut by shard: for each shard that holds some of
  /// its rows, those rows (in their order) and their values. What scatter and the optimizers send
  /// to each shard. InvalidArgument when `slices` do not fit this variable (dtype, dense shape).
  template <class U>
  std::vector<ShardRows> route(const IndexedSlices<U>& slices, std::string_view what) const {
    require_rows(std::string(what).c_str());
    check_slices_fit(slices, shape(), dtype(), what, fmt::format("sharded variable '{}'", name()));
    std::vector<std::size_t> part_of(num_shards(), SIZE_MAX);
    std::vector<ShardRows> parts;
    const std::size_t rb = slices.row_bytes();
    for (std::size_t i = 0; i < slices.size(); ++i) {
      const std::int64_t row = slices.indices()[i];
      const std::size_t shard = shard_of(row);
      if (part_of[shard] == SIZE_MAX) {
        part_of[shard] = parts.size();
        parts.push_back(ShardRows{shard, {}, {}});
      }
      ShardRows& p = parts[part_of[shard]];
      p.rows.push_back(row - offset(shard));
      p.values.insert(p.values.end(), slices.value_bytes() + i * rb, slices.value_bytes() + (i + 1) * rb);
    }
    return parts;
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
  std::size_t shard_of(std::int64_t row) const {
    const auto& o = state_->offsets;
    return static_cast<std::size_t>(std::upper_bound(o.begin(), o.end(), row) - o.begin() - 1);
  }

  // Reads on ps tasks, each store's together (its shards' tasks at once).
  static void read_remote(std::vector<core::RowsRead>& reads, const std::vector<std::shared_ptr<core::RemoteVariableStore>>& stores) {
    for (std::size_t i = 0; i < reads.size();) {
      std::size_t j = i;
      while (j < reads.size() && stores[j] == stores[i]) ++j;
      stores[i]->read_rows_batch(std::span(reads).subspan(i, j - i));
      i = j;
    }
  }

  template <class U>
  void scatter(core::RowOp op, const IndexedSlices<U>& slices) {
    const std::string_view what = core::scatter_name(op);
    core::check_row_op(op, dtype(), fmt::format("sharded variable '{}'", name()));
    const auto parts = route(slices, what);
    std::vector<core::RowsWrite> remote;
    std::vector<std::shared_ptr<core::RemoteVariableStore>> stores;
    for (const ShardRows& p : parts) {
      Variable<T>& v = state_->shards[p.shard];
      if (const auto* h = v.remote_handle()) {
        core::RowsUpdate u;
        u.kind = core::scatter_update_of(op);
        u.dtype = dtype();
        u.rows = p.rows;
        u.values = p.values;
        remote.push_back({h->task, h->key, u});
        stores.push_back(h->store);
        continue;
      }
      Shape rows_shape = v.shape();
      rows_shape[0] = static_cast<std::int64_t>(p.rows.size());
      std::vector<element_type> values(p.values.size() / sizeof(element_type));
      if (!values.empty()) std::memcpy(values.data(), p.values.data(), p.values.size());
      const IndexedSlices<Tensor<element_type>> local(p.rows, Tensor<element_type>(std::move(rows_shape), std::move(values)),
                                                      v.shape());
      switch (op) {
        case core::RowOp::Update: v.scatter_update(local); break;
        case core::RowOp::Add: v.scatter_add(local); break;
        case core::RowOp::Sub: v.scatter_sub(local); break;
        case core::RowOp::Min: v.scatter_min(local); break;
        case core::RowOp::Max: v.scatter_max(local); break;
      }
    }
    for (std::size_t i = 0; i < remote.size();) {
      std::size_t j = i;
      while (j < remote.size() && stores[j] == stores[i]) ++j;
      stores[i]->update_rows_batch(std::span(remote).subspan(i, j - i));
      i = j;
    }
  }

  void create_initialized_shards(Shape full, const Initializer& init, std::int64_t num_shards, VariableOptions options) {
    state_->name = options.name;
    if (num_shards < 1) {
      throw InvalidArgument(fmt::format("ShardedVariable '{}': num_shards must be positive, got {}", options.name, num_shards));
    }
    if (full.empty() && num_shards > 1) {
      throw InvalidArgument(fmt::format("ShardedVariable '{}': a scalar cannot be split into {} shards", options.name,
                                        num_shards));
    }
    const std::int64_t shards = full.empty() ? 1 : std::max<std::int64_t>(1, std::min(num_shards, full[0]));
    if (shards == 1) {
      state_->shards.emplace_back(std::move(full), init, std::move(options));
      index_shards();
      return;
    }
    const auto offsets = shard_row_offsets(full[0], shards);
    const std::int64_t width = full[0] ? num_elements(full) / full[0] : 0;
    for (std::int64_t i = 0; i < shards; ++i) {
      const auto idx = static_cast<std::size_t>(i);
      Shape piece = full;
      piece[0] = offsets[idx + 1] - offsets[idx];
      VariableOptions shard_options = options;
      shard_options.name = fmt::format("{}/part_{}", options.name, i);
      state_->shards.emplace_back(std::move(piece), init.from(static_cast<std::uint64_t>(offsets[idx] * width)),
                                  std::move(shard_options));
    }
    index_shards();
  }
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

// Shared by core/ and strategy/ (internal use): how an all-reduce that holds IndexedSlices travels
// (ReplicaContext::all_reduce, and strategy.reduce of per-replica IndexedSlices): as TF does it,
// by gathering, not adding. Each replica packs its values into one block of bytes (every
// IndexedSlices' indices and rows, every dense value's elements, after a description of each), one
// all-gather of those blocks reaches every replica, and each replica unpacks them in replica order:
// an IndexedSlices becomes all the replicas' rows one after the other (duplicates kept; MEAN divides
// the values by the number of replicas), a dense value passed in the same call the sum of the
// replicas' values (MEAN: divided likewise). So one collective carries the whole call, on every
// strategy and transport that gathers (host threads, TCP and shared memory, MPI; device staging).
//
// Every replica reads every block, so a replica whose values do not match replica 0's (another
// kind, dtype or dense shape) makes the same InvalidArgument on every replica, naming both.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/cross_worker.hpp>
#include <distribute/core/dtype.hpp>
#include <distribute/core/elementwise.hpp>
#include <distribute/core/error.hpp>
#include <distribute/core/host_operands.hpp>
#include <distribute/core/indexed_slices.hpp>
#include <distribute/core/reduce_op.hpp>
#include <distribute/core/replica_group.hpp>
#include <distribute/core/row_updates.hpp>
#include <distribute/core/shape.hpp>
#include <distribute/core/tensor_traits.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace core {

template <class T>
inline constexpr bool is_indexed_slices_v = false;
template <class T>
inline constexpr bool is_indexed_slices_v<IndexedSlices<T>> = true;

namespace detail {

/// What one value of the call is, as every replica must agree.
struct PackedValue {
  bool slices = false;
  DType dtype = DType::F32;
  Shape shape;             // the dense shape of an IndexedSlices, the shape of a dense value
  std::uint64_t rows = 0;  // an IndexedSlices' rows (differ between replicas)
  const std::byte* indices = nullptr;
  const std::byte* values = nullptr;
  std::size_t value_bytes = 0;

  std::string describe() const {
    return fmt::format("{} {} {}", slices ? "IndexedSlices of dense shape" : "a dense value of shape", shape_string(shape),
                       to_string(dtype));
  }
  bool agrees_with(const PackedValue& o) const { return slices == o.slices && dtype == o.dtype && shape == o.shape; }
};

/// One replica's block: [u64 size][u32 count] then per value [u8 slices][u8 dtype][u16 rank]
/// [rank x i64 shape][u64 rows], then per value its indices (i64) and elements.
class SparsePack {
 public:
  template <class T>
  void add(const IndexedSlices<T>& s) {
    PackedValue v{true, s.dtype(), s.dense_shape(), s.size(), reinterpret_cast<const std::byte*>(s.indices().data()),
                  s.value_bytes(), s.size() * s.row_bytes()};
    values_.push_back(std::move(v));
  }
  template <class T>
  void add(const T& dense) {
    const TensorView view = view_of(dense);
    if (!view.contiguous()) {
      staged_.emplace_back(view.bytes());
      copy_to_contiguous(view, staged_.back().data());
    }
    values_.push_back(PackedValue{false, view.dtype, view.shape, 0, nullptr,
                                  view.contiguous() ? static_cast<const std::byte*>(view.data) : staged_.back().data(),
                                  view.bytes()});
  }

  std::vector<std::byte> bytes() const {
    std::vector<std::byte> out(8);
    put<std::uint32_t>(out, static_cast<std::uint32_t>(values_.size()));
    for (const PackedValue& v : values_) {
      put<std::uint8_t>(out, v.slices ? 1 : 0);
      put<std::uint8_t>(out, static_cast<std::uint8_t>(v.dtype));
      put<std::uint16_t>(out, static_cast<std::uint16_t>(v.shape.size()));
      for (auto d : v.shape) put<std::int64_t>(out, d);
      put<std::uint64_t>(out, v.rows);
    }
    for (const PackedValue& v : values_) {
      if (v.slices) append(out, v.indices, v.rows * sizeof(std::int64_t));
      append(out, v.values, v.value_bytes);
    }
    const std::uint64_t size = out.size();
    std::memcpy(out.data(), &size, sizeof size);
    return out;
  }

 private:
  template <class I>
  static void put(std::vector<std::byte>& out, I v) {
    append(out, reinterpret_cast<const std::byte*>(&v), sizeof v);
  }
  static void append(std::vector<std::byte>& out, const std::byte* p, std::size_t n) {
    if (n) out.insert(out.end(), p, p + n);
  }

  std::vector<PackedValue> values_;
  std::vector<std::vector<std::byte>> staged_;  // strided dense values, copied row-major
};

/// Reads the replicas' blocks one after the other out of the gathered bytes, checking every size
/// against what is there.
class SparseUnpack {
 public:
  /// `what`: the call, for messages ("all_reduce", "reduce").
  SparseUnpack(std::span<const std::byte> gathered, int replicas, const char* what) : what_(what) {
    std::size_t at = 0;
    for (int r = 0; r < replicas; ++r) {
      std::uint64_t size = 0;
      read_at(gathered, at, &size, sizeof size, r);
      if (size < 12 || size > gathered.size() - at) malformed(r, "its size");
      blocks_.push_back(parse(gathered.subspan(at, static_cast<std::size_t>(size)), r));
      at += static_cast<std::size_t>(size);
    }
    if (at != gathered.size()) malformed(replicas - 1, "the end of the gathered bytes");
    const auto& first = blocks_.front();
    for (int r = 1; r < replicas; ++r) {
      const auto& block = blocks_[static_cast<std::size_t>(r)];
      if (block.size() != first.size()) {
        throw InvalidArgument(fmt::format("{}: replica 0 passed {} values and replica {} passed {}; every replica "
                                          "passes the same values",
                                          what_, first.size(), r, block.size()));
      }
      for (std::size_t i = 0; i < first.size(); ++i) {
        if (!block[i].agrees_with(first[i])) {
          throw InvalidArgument(fmt::format("{}: value {} is {} on replica 0 but {} on replica {}; every replica passes "
                                            "the same kinds, dtypes and shapes",
                                            what_, i, first[i].describe(), block[i].describe(), r));
        }
      }
    }
  }

  /// Value `i` of every replica, in replica order.
  std::vector<const PackedValue*> value(std::size_t i) const {
    std::vector<const PackedValue*> out;
    for (const auto& b : blocks_) out.push_back(&b[i]);
    return out;
  }

 private:
  [[noreturn]] static void malformed(int replica, const char* what) {
    throw InvalidArgument(fmt::format("the block of IndexedSlices replica {} sent is malformed ({})", replica, what));
  }
  static void read_at(std::span<const std::byte> b, std::size_t at, void* out, std::size_t n, int replica) {
    if (at > b.size() || n > b.size() - at) malformed(replica, "it ends early");
    std::memcpy(out, b.data() + at, n);
  }

  static std::vector<PackedValue> parse(std::span<const std::byte> b, int r) {
    std::size_t at = 8;
    std::uint32_t count = 0;
    read_at(b, at, &count, 4, r);
    at += 4;
    if (count > b.size() / 12) malformed(r, "its count of values");
    std::vector<PackedValue> values(count);
    for (auto& v : values) {
      std::uint8_t kind = 0, dtype = 0;
      std::uint16_t rank = 0;
      read_at(b, at, &kind, 1, r);
      read_at(b, at + 1, &dtype, 1, r);
      read_at(b, at + 2, &rank, 2, r);
      at += 4;
      if (kind > 1 || !is_dtype_code(dtype) || (kind == 1 && rank == 0)) malformed(r, "a value's kind, dtype or rank");
      v.slices = kind == 1;
      v.dtype = static_cast<DType>(dtype);
      v.shape.resize(rank);
      for (auto& d : v.shape) {
        read_at(b, at, &d, 8, r);
        at += 8;
        if (d < 0) malformed(r, "a negative dimension");
      }
      read_at(b, at, &v.rows, 8, r);
      at += 8;
    }
    for (auto& v : values) {
      std::uint64_t rows = v.slices ? v.rows : 1, row_bytes = 0, bytes = 0;
      Shape row_shape = v.shape;
      if (v.slices && !row_shape.empty()) row_shape.erase(row_shape.begin());
      if (!checked_mul(static_cast<std::uint64_t>(num_elements_checked(row_shape, r)), size_of(v.dtype), row_bytes) ||
          !checked_mul(rows, row_bytes, bytes)) {
        malformed(r, "a value's size");
      }
      if (v.slices) {
        if (v.rows > (b.size() - at) / 8) malformed(r, "more rows claimed than bytes sent");
        v.indices = b.data() + at;
        at += static_cast<std::size_t>(v.rows) * 8;
      }
      if (bytes > b.size() - at) malformed(r, "more rows claimed than bytes sent");
      v.values = b.data() + at;
      v.value_bytes = static_cast<std::size_t>(bytes);
      at += v.value_bytes;
    }
    if (at != b.size()) malformed(r, "bytes left over");
    return values;
  }

  static std::int64_t num_elements_checked(const Shape& s, int r) {
    std::uint64_t n = 1;
    for (auto d : s) {
      if (!checked_mul(n, static_cast<std::uint64_t>(d), n) || n > (std::uint64_t{1} << 62)) malformed(r, "a shape");
    }
    return static_cast<std::int64_t>(n);
  }

  const char* what_;
  std::vector<std::vector<PackedValue>> blocks_;
};

/// The result of an IndexedSlices of T: every replica's rows, in replica order; MEAN divides the
/// values by `replicas`.
template <class T>
IndexedSlices<T> gathered_slices(const std::vector<const PackedValue*>& parts, ReduceOp op, int replicas) {
  const PackedValue& first = *parts.front();
  std::vector<std::int64_t> indices;
  std::size_t total_bytes = 0;
  for (const auto* p : parts) {
    const std::size_t at = indices.size();
    indices.resize(at + p->rows);
    if (p->rows) std::memcpy(indices.data() + at, p->indices, p->rows * sizeof(std::int64_t));
    total_bytes += p->value_bytes;
  }
  Shape values_shape = first.shape;
  values_shape[0] = static_cast<std::int64_t>(indices.size());
  T values = make_value<T>(first.dtype, values_shape);
  auto* out = static_cast<std::byte*>(view_of(values).data);
  for (const auto* p : parts) {
    if (p->value_bytes) std::memcpy(out, p->values, p->value_bytes);
    out += p->value_bytes;
  }
  if (const Reduction red = Reduction::lower(op, replicas); red.divides()) {
    visit_dtype(first.dtype, [&](auto zero) {
      using E = decltype(zero);
      divide(static_cast<E*>(view_of(values).data), total_bytes / sizeof(E), red.divisor());
    });
  }
  for (const auto i : indices) {  // from peers: checked as any IndexedSlices is
    if (i < 0 || i >= first.shape[0]) {
      throw InvalidArgument(fmt::format("a replica sent IndexedSlices with index {} for dense shape {}", i, shape_string(first.shape)));
    }
  }
  return IndexedSlices<T>(std::move(indices), std::move(values), first.shape);
}

/// The result of a dense value passed with IndexedSlices: the replicas' values added in replica
/// order (MEAN: then divided by `replicas`), the same on every replica.
template <class T>
T summed_dense(const std::vector<const PackedValue*>& parts, ReduceOp op, int replicas) {
  const PackedValue& first = *parts.front();
  T out = make_value<T>(first.dtype, first.shape);
  core::HostOperands staged("all_reduce");
  staged.add(view_of(out));
  auto* dst = static_cast<std::byte*>(staged[0].data);
  const std::size_t count = staged[0].count();
  if (first.value_bytes) std::memcpy(dst, first.values, first.value_bytes);
  for (std::size_t r = 1; r < parts.size(); ++r) combine_bytes(first.dtype, RowOp::Add, dst, parts[r]->values, count);
  if (const Reduction red = Reduction::lower(op, replicas); red.divides()) {
    visit_dtype(first.dtype, [&](auto zero) {
      using E = decltype(zero);
      divide(reinterpret_cast<E*>(dst), count, red.divisor());
    });
  }
  staged.write_back();
  return out;
}

}  // namespace detail

/// strategy.reduce(SUM or MEAN, per-replica IndexedSlices) without an axis, as TF does it: every
/// replica's rows in replica order (MEAN divides the values by the replicas in sync), the local
/// replicas' `locals` and, through `link`, the other workers' (one all-gather of their blocks).
template <class T>
IndexedSlices<T> reduce_slices(ReduceOp op, const std::vector<const IndexedSlices<T>*>& locals, CrossWorkerLink* link,
                               int replicas) {
  if (op != ReduceOp::Sum && op != ReduceOp::Mean) {
    throw InvalidArgument(fmt::format("reduce: IndexedSlices are reduced with SUM or MEAN (their rows gathered, as in "
                                      "TF); {} is not defined for them",
                                      to_string(op)));
  }
  std::vector<std::byte> mine;
  for (const auto* s : locals) {
    detail::SparsePack pack;
    pack.add(*s);
    const auto block = pack.bytes();
    mine.insert(mine.end(), block.begin(), block.end());
  }
  std::vector<std::byte> all;
  if (link && link->num_workers() > 1) {
    std::vector<std::size_t> sizes;
    link->all_gather(mine.data(), mine.size(), all, sizes);
  } else {
    all = std::move(mine);
  }
  const detail::SparseUnpack unpack(all, replicas, "reduce");
  return detail::gathered_slices<T>(unpack.value(0), op, replicas);
}

/// ReplicaContext::all_reduce of `values`, some of them IndexedSlices, on replica `local_id` of
/// `group`: packed, gathered once, unpacked (see the top of this file).
template <class... U>
auto all_reduce_with_slices(ReplicaCollectives& collectives, ReplicaGroup& group, int local_id, int replicas, ReduceOp op,
                            const U&... values) {
  static_assert(((is_indexed_slices_v<U> || TensorLike<U>) && ...),
                "ds::ReplicaContext::all_reduce: a value's type is neither a ds::IndexedSlices nor TensorLike (it has no "
                "ds::tensor_traits specialisation; see docs/tensors.md)");
  if (op != ReduceOp::Sum && op != ReduceOp::Mean) {
    throw InvalidArgument(fmt::format("all_reduce: IndexedSlices are reduced with SUM or MEAN (an all-gather of their "
                                      "rows, as in TF); {} is not defined for them",
                                      to_string(op)));
  }
  detail::SparsePack pack;
  auto add = [&](const auto& v) {
    using V = std::remove_cvref_t<decltype(v)>;
    if constexpr (!is_indexed_slices_v<V>) {
      static_assert(memory_space_v<V> == MemorySpace::host,
                    "ds::ReplicaContext::all_reduce: dense values passed with IndexedSlices are host values");
      check_op_for_dtype(op, value_dtype(v), "all_reduce");
    }
    pack.add(v);
  };
  (add(values), ...);
  std::vector<std::byte> mine = pack.bytes();
  const BufferRef in{mine.data(), DType::U8, {static_cast<std::int64_t>(mine.size())}};
  std::vector<std::byte> all;
  collectives.all_gather(group, local_id, in, 0, [&](const Shape& shape) -> void* {
    all.resize(static_cast<std::size_t>(shape[0]));
    return all.data();
  });
  const detail::SparseUnpack unpack(all, replicas, "all_reduce");
  std::size_t next = 0;
  auto reduce_one = [&]<class V>(std::type_identity<V>) {
    const auto parts = unpack.value(next++);
    if constexpr (is_indexed_slices_v<V>) {
      return detail::gathered_slices<typename V::values_type>(parts, op, replicas);
    } else {
      return detail::summed_dense<V>(parts, op, replicas);
    }
  };
  std::tuple<U...> out{reduce_one(std::type_identity<U>{})...};  // braced: in order
  if constexpr (sizeof...(U) == 1) {
    return std::get<0>(std::move(out));
  } else {
    return out;
  }
}

}  // namespace core
DISTRIBUTE_END_NAMESPACE

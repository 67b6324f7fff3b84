// Shared by core/ and ps/ (internal use): updates of a variable's rows, on raw bytes of a run-time
// dtype. A plain or mirrored variable applies them to its copies, a ps task to the rows it holds,
// a worker to what it read back inside a closure (a closure reads its own writes), and the dense
// assign_add/assign_sub of a ps variable is the same kernel over every row: one implementation.
//
// The elements may lie anywhere (an update's values are read where they lie in a request, with no
// alignment): aligned ones are combined where they lie, the others a block at a time through
// aligned locals. Signed integers wrap as TF's kernels do (two's
// complement), never overflow (which C++ leaves undefined); 16-bit floats compute in float32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <type_traits>

#include <fmt/format.h>

#include <distribute/core/dtype.hpp>
#include <distribute/core/error.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace core {

/// How a row of values combines with the row it updates (TF's scatter_update, scatter_add,
/// scatter_sub, scatter_min, scatter_max).
enum class RowOp : std::uint8_t { Update = 0, Add = 1, Sub = 2, Min = 3, Max = 4 };

/// TF's name of the variable member that applies `op` to rows.
constexpr std::string_view scatter_name(RowOp op) noexcept {
  switch (op) {
    case RowOp::Update: return "scatter_update";
    case RowOp::Add: return "scatter_add";
    case RowOp::Sub: return "scatter_sub";
    case RowOp::Min: return "scatter_min";
    case RowOp::Max: return "scatter_max";
  }
  return "scatter";
}

/// Whether `op` is defined for `dtype`: updates for every dtype, arithmetic for numbers (not bool).
constexpr bool row_op_supports(RowOp op, DType dtype) noexcept { return op == RowOp::Update || dtype != DType::Bool; }

/// InvalidArgument naming `what` when `op` cannot apply to `dtype`.
inline void check_row_op(RowOp op, DType dtype, std::string_view what) {
  if (!row_op_supports(op, dtype)) {
    throw InvalidArgument(fmt::format("{} needs numbers, and {} is {}", scatter_name(op), what, to_string(dtype)));
  }
}

namespace detail {

// a op b for one element; Min and Max as Eigen's cwiseMin/cwiseMax, which TF's kernels use (a NaN
// update leaves the row as it is, a NaN in the row stays). Op is a template argument, so that each
// loop below is one operation the compiler can vectorise.
template <RowOp Op, class E>
E combine_element(E a, E b) noexcept {
  if constexpr (Op == RowOp::Min) {
    return b < a ? b : a;
  } else if constexpr (Op == RowOp::Max) {
    return a < b ? b : a;
  } else if constexpr (Op == RowOp::Update) {
    return b;
  } else if constexpr (std::is_same_v<E, bool>) {  // as bool(a + b) and bool(a - b): a dense assign_add of bools
    return Op == RowOp::Add ? (a || b) : (a != b);
  } else if constexpr (std::is_integral_v<E> && std::is_signed_v<E>) {  // two's complement, as TF's kernels
    using U = std::make_unsigned_t<E>;
    const U r = Op == RowOp::Add ? static_cast<U>(static_cast<U>(a) + static_cast<U>(b))
                                 : static_cast<U>(static_cast<U>(a) - static_cast<U>(b));
    return static_cast<E>(r);
  } else {
    return Op == RowOp::Add ? static_cast<E>(a + b) : static_cast<E>(a - b);
  }
}

template <class E, RowOp Op>
void combine_block(E* a, const E* b, std::size_t n) noexcept {
  for (std::size_t j = 0; j < n; ++j) a[j] = combine_element<Op>(a[j], b[j]);
}

// 16-bit floats: widened to float32, combined, rounded once.
template <class E>
constexpr bool computes_in_float = std::is_same_v<E, float16> || std::is_same_v<E, bfloat16>;

template <class E>
bool aligned_for(const void* p) noexcept {
  return reinterpret_cast<std::uintptr_t>(p) % alignof(E) == 0;
}

template <class E, RowOp Op>
void combine_elements(std::byte* dst, const std::byte* src, std::size_t count) noexcept {
  constexpr std::size_t kBlock = 256 / sizeof(E) ? 256 / sizeof(E) : 1;
  if constexpr (!computes_in_float<E>) {
    if (aligned_for<E>(dst)) {  // a table's rows are aligned: combined where they lie
      E* d = reinterpret_cast<E*>(dst);
      if (aligned_for<E>(src)) {
        const E* v = reinterpret_cast<const E*>(src);
        for (std::size_t j = 0; j < count; ++j) d[j] = combine_element<Op>(d[j], v[j]);
        return;
      }
      E b[kBlock];  // values read where they lie in a request: copied a block at a time
      for (std::size_t at = 0; at < count; at += kBlock) {
        const std::size_t n = count - at < kBlock ? count - at : kBlock;
        std::memcpy(b, src + at * sizeof(E), n * sizeof(E));
        for (std::size_t j = 0; j < n; ++j) d[at + j] = combine_element<Op>(d[at + j], b[j]);
      }
      return;
    }
  }
  for (std::size_t at = 0; at < count; at += kBlock) {
    const std::size_t n = count - at < kBlock ? count - at : kBlock;
    E a[kBlock], b[kBlock];
    std::memcpy(a, dst + at * sizeof(E), n * sizeof(E));
    std::memcpy(b, src + at * sizeof(E), n * sizeof(E));
    if constexpr (computes_in_float<E>) {
      for (std::size_t j = 0; j < n; ++j) a[j] = E(combine_element<Op>(float(a[j]), float(b[j])));
    } else if (n == kBlock) {
      combine_block<E, Op>(a, b, kBlock);  // a loop of known length
    } else {
      combine_block<E, Op>(a, b, n);
    }
    std::memcpy(dst + at * sizeof(E), a, n * sizeof(E));
  }
}

}  // namespace detail

/// dst[i] = dst[i] (op) src[i] for `count` elements of `dtype`, at any alignment; dst and src do
/// not overlap. Row updates check `op` against `dtype` first (check_row_op).
inline void combine_bytes(DType dtype, RowOp op, std::byte* dst, const std::byte* src, std::size_t count) noexcept {
  if (count == 0) return;
  if (op == RowOp::Update) {
    std::memcpy(dst, src, count * size_of(dtype));
    return;
  }
  visit_dtype(dtype, [&](auto zero) {
    using E = decltype(zero);
    switch (op) {
      case RowOp::Add: detail::combine_elements<E, RowOp::Add>(dst, src, count); break;
      case RowOp::Sub: detail::combine_elements<E, RowOp::Sub>(dst, src, count); break;
      case RowOp::Min: detail::combine_elements<E, RowOp::Min>(dst, src, count); break;
      case RowOp::Max: detail::combine_elements<E, RowOp::Max>(dst, src, count); break;
      case RowOp::Update: break;
    }
  });
}

/// The row index at position `i` of `rows`, int64 values that may lie at any alignment.
inline std::int64_t row_at(std::span<const std::byte> rows, std::size_t i) noexcept {
  std::int64_t r;
  std::memcpy(&r, rows.data() + i * sizeof r, sizeof r);
  return r;
}

/// The first position of `rows` (int64s at any alignment) outside [0, num_rows), or -1.
inline std::int64_t first_row_out_of_range(std::span<const std::byte> rows, std::int64_t num_rows) noexcept {
  const std::size_t n = rows.size() / sizeof(std::int64_t);
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t r = row_at(rows, i);
    if (r < 0 || r >= num_rows) return static_cast<std::int64_t>(i);
  }
  return -1;
}

/// TF's scatter kernels: table row rows[i] (op)= values row i, for each i in order (so duplicate
/// rows all apply: added up, or the last update wins). `rows` are int64s at any alignment, each
/// already checked to be in range; `values` holds rows.size()/8 rows of `row_bytes`.
inline void scatter_rows(DType dtype, RowOp op, std::span<std::byte> table, std::size_t row_bytes,
                         std::span<const std::byte> rows, std::span<const std::byte> values) noexcept {
  const std::size_t n = rows.size() / sizeof(std::int64_t);
  if (op == RowOp::Update) {
    for (std::size_t i = 0; i < n; ++i) {
      std::memcpy(table.data() + static_cast<std::size_t>(row_at(rows, i)) * row_bytes, values.data() + i * row_bytes, row_bytes);
    }
    return;
  }
  // The dtype and op are chosen once, not per row. A table's rows are scattered over memory larger
  // than the caches: the rows a few positions ahead are fetched while this one is combined.
  constexpr std::size_t kAhead = 8;
  auto each_row = [&](auto combine) {
    for (std::size_t i = 0; i < n; ++i) {
      if (i + kAhead < n) {
        const std::byte* next = table.data() + static_cast<std::size_t>(row_at(rows, i + kAhead)) * row_bytes;
        for (std::size_t line = 0; line < row_bytes; line += 64) __builtin_prefetch(next + line, 1);
      }
      combine(table.data() + static_cast<std::size_t>(row_at(rows, i)) * row_bytes, values.data() + i * row_bytes);
    }
  };
  visit_dtype(dtype, [&](auto zero) {
    using E = decltype(zero);
    const std::size_t width = row_bytes / sizeof(E);
    switch (op) {
      case RowOp::Add: each_row([&](std::byte* d, const std::byte* s) { detail::combine_elements<E, RowOp::Add>(d, s, width); }); break;
      case RowOp::Sub: each_row([&](std::byte* d, const std::byte* s) { detail::combine_elements<E, RowOp::Sub>(d, s, width); }); break;
      case RowOp::Min: each_row([&](std::byte* d, const std::byte* s) { detail::combine_elements<E, RowOp::Min>(d, s, width); }); break;
      case RowOp::Max: each_row([&](std::byte* d, const std::byte* s) { detail::combine_elements<E, RowOp::Max>(d, s, width); }); break;
      case RowOp::Update: break;
    }
  });
}

}  // namespace core
DISTRIBUTE_END_NAMESPACE

// Element-wise reduction of raw buffers of a run-time dtype, for the collectives' byte buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include <distribute/core/elementwise.hpp>
#include <distribute/core/dtype.hpp>
#include <distribute/core/reduce_op.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net::detail {

/// acc = acc (op) src, for a lowered reduction's op (never Mean; see Reduction).
inline void reduce_bytes(DType dtype, std::byte* acc, const std::byte* src, std::size_t n, ReduceOp op) {
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    ::distribute::core::combine(reinterpret_cast<T*>(acc), reinterpret_cast<const T*>(src), n, op);
  });
}

/// out = srcs[0] (op) srcs[1] (op) ..., divided when `r` divides. 16-bit floats accumulate in
/// float32 and round once (core/elementwise.hpp's reduce_many).
inline void reduce_many_bytes(DType dtype, std::byte* out, std::span<const void* const> srcs, std::size_t n,
                              Reduction r) {
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    ::distribute::core::reduce_many<T>(reinterpret_cast<T*>(out), srcs, n, r);
  });
}

inline void divide_bytes(DType dtype, std::byte* acc, std::size_t n, std::int64_t divisor) {
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    ::distribute::core::divide(reinterpret_cast<T*>(acc), n, divisor);
  });
}

}  // namespace net::detail
DISTRIBUTE_END_NAMESPACE

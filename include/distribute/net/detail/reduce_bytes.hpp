// Element-wise reduction of raw buffers of a run-time dtype, for the collectives' byte buffers.
#pragma once

#include <cstddef>
#include <cstdint>

#include <distribute/core/detail/elementwise.hpp>
#include <distribute/core/dtype.hpp>
#include <distribute/core/reduce_op.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net::detail {

inline void reduce_bytes(DType dtype, std::byte* acc, const std::byte* src, std::size_t n, ReduceOp op) {
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    ::distribute::detail::combine(reinterpret_cast<T*>(acc), reinterpret_cast<const T*>(src), n, op);
  });
}

inline void divide_bytes(DType dtype, std::byte* acc, std::size_t n, std::int64_t divisor) {
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    ::distribute::detail::divide(reinterpret_cast<T*>(acc), n, divisor);
  });
}

}  // namespace net::detail
DISTRIBUTE_END_NAMESPACE

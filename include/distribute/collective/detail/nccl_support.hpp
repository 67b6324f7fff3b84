// The NCCL vocabulary the NCCL collectives share (collective/nccl.hpp and
// collective/detail/nccl_scatter.hpp): NcclError, nccl_check, the dtype and reduction mappings,
// and the MEAN division NCCL cannot do itself. Included by those headers only, inside their
// DISTRIBUTE_HAS_NCCL block (a CUDA compiler with <nccl.h>).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nccl.h>
#include <thrust/execution_policy.h>
#include <thrust/transform.h>

#include <distribute/backends/cuda/device_ops.hpp>
#include <distribute/core/replica_group.hpp>
#include <distribute/core/error.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

/// An NCCL call failed. Carries the ncclResult_t and NCCL's own description of the failure.
class NcclError : public Error {
 public:
  NcclError(int code, const std::string& message) : Error(message), code_(code) {}
  int code() const noexcept { return code_; }

 private:
  int code_;
};

namespace collective::detail {

/// Whether an asynchronous result is an error (in progress is not).
inline bool nccl_failed(ncclResult_t r) noexcept {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
  if (r == ncclInProgress) return false;
#endif
  return r != ncclSuccess;
}

/// Throws NcclError naming `call` unless `r` is ncclSuccess (or, for group calls, in progress).
inline void nccl_check(ncclResult_t r, std::string_view call, ncclComm_t comm = nullptr) {
  if (r == ncclSuccess) return;
  std::string message = fmt::format("{} failed: {} ({})", call, ncclGetErrorString(r), static_cast<int>(r));
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
  if (const char* last = ncclGetLastError(comm); last && *last) message += fmt::format("; NCCL says: {}", last);
#else
  (void)comm;
#endif
  throw NcclError(static_cast<int>(r), message);
}

/// NCCL's element type for a dtype; none for 16-bit integers, which NCCL does not reduce.
inline std::optional<ncclDataType_t> nccl_type(DType d) noexcept {
  switch (d) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::I8: return ncclInt8;
    case DType::U8: return ncclUint8;
    case DType::Bool: return ncclUint8;  // 0/1 bytes: OR is Max, AND is Min
    case DType::I32: return ncclInt32;
    case DType::U32: return ncclUint32;
    case DType::I64: return ncclInt64;
    case DType::U64: return ncclUint64;
    case DType::F16: return ncclFloat16;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
    case DType::BF16: return ncclBfloat16;
#else
    case DType::BF16: return std::nullopt;
#endif
    case DType::I16:
    case DType::U16: return std::nullopt;
  }
  return std::nullopt;
}

/// The NCCL reduction for a lowered reduction on `dtype`. A SUM divided by the number of ranks
/// is ncclAvg where that matches our MEAN (floats, NCCL >= 2.10); any other division is a SUM
/// divided afterwards, so that integer MEAN truncates exactly as the host kernels do.
struct NcclReduction {
  ncclRedOp_t op = ncclSum;
  bool divide_after = false;
};
inline NcclReduction nccl_reduction(Reduction red, DType dtype, int ranks) noexcept {
  if (dtype == DType::Bool) {
    const bool any = red.op() == ReduceOp::Sum || red.op() == ReduceOp::Max;
    return {any ? ncclMax : ncclMin, false};
  }
  switch (red.op()) {
    case ReduceOp::Min: return {ncclMin, false};
    case ReduceOp::Max: return {ncclMax, false};
    case ReduceOp::Product: return {ncclProd, false};
    case ReduceOp::Sum:
    case ReduceOp::Mean:  // lowered to Sum before it reaches here
      break;
  }
  if (!red.divides()) return {ncclSum, false};
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
  if (is_floating(dtype) && red.divisor() == ranks) return {ncclAvg, false};
#endif
  return {ncclSum, true};
}

/// Divides a reduced device buffer by `divisor` on `stream`: MEAN where NCCL summed (integers
/// truncate as the host kernels do). Half types never get here (ncclAvg takes them).
inline void divide_on_device(const core::BufferRef& b, std::int64_t divisor, cudaStream_t stream, const char* what) {
  visit_dtype(b.dtype, [&](auto t) {
    using T = decltype(t);
    if constexpr (core::is_half_v<T>) {
      throw InvalidArgument(fmt::format("NcclAllReduce: MEAN of {} values needs ncclAvg (NCCL >= 2.10 and a "
                                        "divisor equal to the number of ranks); reduce with SUM and divide",
                                        to_string(b.dtype)));
    } else if constexpr (!std::is_same_v<T, bool>) {
      auto* p = static_cast<T*>(b.data);
      backends::device_kernels::run(what, [&] {
        thrust::transform(thrust::cuda::par_nosync.on(stream), p, p + b.count(), p,
                          backends::device_kernels::divide_by_fn<T>{static_cast<T>(divisor)});
      });
    }
  });
}

}  // namespace collective::detail
DISTRIBUTE_END_NAMESPACE

// CudaError: a CUDA runtime call failed. Every CUDA call of the library goes through
// backends::cuda_check, so a failure is an exception carrying the call, the error's name and
// CUDA's own message, never a crash or an ignored status.
#pragma once

#include <distribute/version.hpp>  // first: under nvcc it configures fmt before fmt is included

#include <string>
#include <string_view>

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <distribute/core/error.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

/// A CUDA runtime call failed (out of memory, a kernel fault, a lost device...). "No GPU visible"
/// is ds::Unavailable instead: that is a property of the machine, not a failure of a call.
class CudaError : public Error {
 public:
  CudaError(int code, const std::string& message) : Error(message), code_(code) {}
  /// The cudaError_t value.
  int code() const noexcept { return code_; }

 private:
  int code_;
};

namespace backends {

/// "cudaErrorNoDevice (100): no CUDA-capable device is detected".
inline std::string cuda_error_text(cudaError_t e) {
  return fmt::format("{} ({}): {}", cudaGetErrorName(e), static_cast<int>(e), cudaGetErrorString(e));
}

/// Throws CudaError naming `call` and `context` unless `e` is cudaSuccess. Clears CUDA's sticky
/// last-error slot so a later, unrelated check does not report this failure again.
inline void cuda_check(cudaError_t e, std::string_view call, std::string_view context = {}) {
  if (e == cudaSuccess) return;
  (void)cudaGetLastError();
  throw CudaError(static_cast<int>(e), context.empty()
                                           ? fmt::format("{} failed: {}", call, cuda_error_text(e))
                                           : fmt::format("{}: {} failed: {}", context, call, cuda_error_text(e)));
}

}  // namespace backends

DISTRIBUTE_END_NAMESPACE

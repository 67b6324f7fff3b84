// The CUDA runtime pieces of the cuda backend: the visible devices, a scoped current device, the
// device a pointer lives on, and the state of a replica thread (its GPU and its stream).
// Needs only the CUDA runtime API (cuda_runtime.h, libcudart), not nvcc.
#pragma once

#include <distribute/version.hpp>  // first: under nvcc it configures fmt before fmt is included

#include <cstddef>
#include <string>
#include <utility>

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <distribute/backends/cuda/error.hpp>
#include <distribute/core/error.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace backends {

/// The number of GPUs this process sees (CUDA_VISIBLE_DEVICES applies). None, or no usable
/// driver, is Unavailable with what cudaGetDeviceCount said.
inline int visible_cuda_devices(const char* who) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    throw Unavailable(fmt::format("{}: no CUDA device visible: cudaGetDeviceCount failed with {}", who,
                                  cuda_error_text(e)));
  }
  if (count < 1) {
    throw Unavailable(fmt::format("{}: no CUDA device visible: cudaGetDeviceCount reported 0 devices", who));
  }
  return count;
}

/// Makes `device` current on this thread for the guard's lifetime (no-op for device < 0).
class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(int device) {
    if (device < 0) return;
    cuda_check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) cuda_check(cudaSetDevice(device), fmt::format("cudaSetDevice({})", device));
  }
  ~CudaDeviceGuard() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);  // restoring cannot sensibly fail or throw here
  }
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

/// The GPU whose memory `p` points into, or -1 for host memory (pageable or pinned) and null.
inline int cuda_device_of(const void* p) {
  if (!p) return -1;
  cudaPointerAttributes attributes{};
  cuda_check(cudaPointerGetAttributes(&attributes, p), "cudaPointerGetAttributes");
  if (attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged) return attributes.device;
  return -1;
}

/// A replica thread's binding: its GPU and its stream. Set once by ds::cuda::enter_replica_thread;
/// the stream is destroyed when the thread ends.
struct CudaReplicaThread {
  int device = -1;
  cudaStream_t stream = nullptr;
  std::string error;  // why binding the thread failed; reported by the first use of the stream
  int error_code = 0;  // its cudaError_t

  CudaReplicaThread() = default;
  CudaReplicaThread(const CudaReplicaThread&) = delete;
  CudaReplicaThread& operator=(const CudaReplicaThread&) = delete;
  ~CudaReplicaThread() {
    // At process exit the runtime may already be unloading; nothing useful can be done on failure.
    if (stream) (void)cudaStreamDestroy(stream);
  }
};

inline CudaReplicaThread& cuda_replica_thread() noexcept {
  static thread_local CudaReplicaThread state;
  return state;
}

/// The stream of this replica thread; the default stream (0) on any other thread. Throws the
/// error that binding this replica thread to its GPU met, if any.
inline cudaStream_t cuda_replica_stream() {
  const auto& state = cuda_replica_thread();
  if (!state.error.empty()) throw CudaError(state.error_code, state.error);
  return state.stream;
}

/// Device memory owned by one allocation (cudaMalloc on the current device).
class CudaBuffer {
 public:
  CudaBuffer() = default;
  explicit CudaBuffer(std::size_t bytes) {
    if (bytes) cuda_check(cudaMalloc(&data_, bytes), fmt::format("cudaMalloc({} bytes)", bytes));
  }
  CudaBuffer(CudaBuffer&& o) noexcept : data_(std::exchange(o.data_, nullptr)) {}
  CudaBuffer& operator=(CudaBuffer&& o) noexcept {
    std::swap(data_, o.data_);
    return *this;
  }
  ~CudaBuffer() {
    if (data_) (void)cudaFree(data_);
  }
  void* data() const noexcept { return data_; }

 private:
  void* data_ = nullptr;
};

}  // namespace backends
DISTRIBUTE_END_NAMESPACE

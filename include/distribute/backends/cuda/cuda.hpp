// The cuda backend: replicas are the visible GPUs ("/gpu:0".."/gpu:N-1", or an explicit list),
// each driven by its own long-lived host thread that is bound to its GPU and owns a stream.
//
//   ds::MirroredStrategy<ds::cuda> strategy;            // every visible GPU, NCCL all-reduce
//   ds::MirroredStrategy<ds::cuda> two({"/gpu:0", "GPU:1"});
//   ds::OneDeviceStrategy<ds::cuda> one("/gpu:1");
//
// The tag needs only the CUDA runtime (cuda_runtime.h, libcudart), so host-valued strategies on
// GPU-bound threads also build with a host compiler. Device values (ds::DeviceTensor,
// thrust::device_vector) and NCCL need nvcc: <distribute/backends/cuda/device_tensor.hpp> and
// <distribute/collective/nccl.hpp>. With nvcc and NCCL, MirroredStrategy<ds::cuda> defaults to
// NcclAllReduce, otherwise to SharedMemoryAllReduce (device buffers through host copies; the choice
// is collective/default_cross_device_ops.hpp's); use
// the same compiler for every file that names MirroredStrategy<ds::cuda> without its Ops.
#pragma once

#include <distribute/version.hpp>  // first: under nvcc it configures fmt before fmt is included

#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <distribute/backends/cuda/runtime.hpp>
#include <distribute/backends/cuda/error.hpp>
#include <distribute/core/device.hpp>
#include <distribute/core/error.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace backends::detail {

/// Creates each GPU's context now, so that a GPU that cannot be used (exclusive-process mode
/// held by another process, a fault) fails the strategy's constructor, not a replica thread.
inline void open_cuda_devices(const std::vector<int>& gpus, const char* strategy) {
  int current = 0;
  cuda_check(cudaGetDevice(&current), "cudaGetDevice", strategy);
  CudaDeviceGuard restore(current);
  for (int gpu : gpus) {
    cudaError_t e = cudaSetDevice(gpu);
    if (e == cudaSuccess) e = cudaFree(nullptr);  // the customary way to initialise the context
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      throw Unavailable(fmt::format("{}: GPU {} cannot be used: {}", strategy, gpu, cuda_error_text(e)));
    }
  }
}

inline std::vector<std::string> cuda_device_names(const std::vector<int>& gpus, const char* strategy) {
  open_cuda_devices(gpus, strategy);
  std::vector<std::string> out;
  for (int gpu : gpus) out.push_back(local_device_string("GPU", gpu));
  return out;
}

inline std::vector<std::string> cuda_devices(int count, const char* strategy) {
  if (count < 1) {
    throw InvalidArgument(fmt::format("{}: the number of replicas must be at least 1, got {}", strategy, count));
  }
  const int visible = visible_cuda_devices(strategy);
  if (count > visible) {
    throw InvalidArgument(fmt::format("{}: {} GPUs were asked for but {} {} visible", strategy, count, visible,
                                      visible == 1 ? "is" : "are"));
  }
  std::vector<int> gpus;
  for (int i = 0; i < count; ++i) gpus.push_back(i);
  return cuda_device_names(gpus, strategy);
}

/// Parses a user's device list for the cuda backend: GPUs of this process, no duplicates, each
/// one visible. Spelling errors are reported before the machine is asked about its GPUs.
inline std::vector<std::string> cuda_devices(const std::vector<std::string>& names, const char* strategy) {
  if (names.empty()) throw InvalidArgument(fmt::format("{}: the device list is empty", strategy));
  std::vector<int> gpus;
  std::set<int> seen;
  for (const auto& name : names) {
    const DeviceSpec d = DeviceSpec::parse(name);
    if (d.device_type != std::string("GPU")) {
      throw InvalidArgument(fmt::format("{}: device '{}' is not a GPU; the cuda backend runs on GPUs (\"/gpu:0\", "
                                        "\"GPU:1\", ...)",
                                        strategy, name));
    }
    if (!d.device_index) throw InvalidArgument(fmt::format("{}: device '{}' names no device index", strategy, name));
    if (*d.device_index < 0) {  // TF's DeviceSpec parses "/gpu:-1"; no device has that index
      throw InvalidArgument(fmt::format("{}: device '{}' has a negative device index", strategy, name));
    }
    if ((d.job && *d.job != "localhost") || (d.task && *d.task != 0) || (d.replica && *d.replica != 0)) {
      throw InvalidArgument(fmt::format("{}: device '{}' is not a device of this process (job localhost, task 0)",
                                        strategy, name));
    }
    if (!seen.insert(*d.device_index).second) {
      throw InvalidArgument(fmt::format("{}: device '{}' is listed twice", strategy, name));
    }
    gpus.push_back(*d.device_index);
  }
  const int visible = visible_cuda_devices(strategy);
  for (std::size_t i = 0; i < gpus.size(); ++i) {
    if (gpus[i] >= visible) {
      throw InvalidArgument(fmt::format("{}: device '{}' does not exist: {} GPU{} visible (GPU:0..GPU:{})", strategy,
                                        names[i], visible, visible == 1 ? " is" : "s are", visible - 1));
    }
  }
  return cuda_device_names(gpus, strategy);
}

}  // namespace backends::detail

/// Backend tag: replicas are the GPUs of this process, one host thread per GPU.
struct cuda {
  static constexpr std::string_view name = "cuda";
  static constexpr std::string_view device_type = "GPU";
  /// Even one replica gets its own thread: the caller's thread keeps its current device.
  static constexpr bool single_replica_on_caller_thread = false;

  /// The GPUs this process sees (CUDA_VISIBLE_DEVICES applies); Unavailable when there are none.
  static int device_count() { return backends::visible_cuda_devices("ds::cuda"); }

  /// Every visible GPU; Unavailable (with what cudaGetDeviceCount said) when there is none.
  static std::vector<std::string> default_devices(const char* strategy) {
    return backends::detail::cuda_devices(backends::visible_cuda_devices(strategy), strategy);
  }
  /// The first `count` GPUs.
  static std::vector<std::string> devices(int count, const char* strategy) { return backends::detail::cuda_devices(count, strategy); }
  /// The listed GPUs ("/gpu:0", "GPU:1", "/job:localhost/replica:0/task:0/device:GPU:2").
  static std::vector<std::string> devices(const std::vector<std::string>& names, const char* strategy) {
    return backends::detail::cuda_devices(names, strategy);
  }

  /// Called once on each replica thread before its first step: makes the replica's GPU current
  /// and creates its stream. Must not throw (it runs at the top of the thread); a failure is kept
  /// and thrown by the first current_stream() of that replica, e.g. in its first collective.
  static void enter_replica_thread(int local_replica, const std::string& device) noexcept {
    auto& state = backends::cuda_replica_thread();
    try {
      const int gpu = *DeviceSpec::parse(device).device_index;
      cudaError_t e = cudaSetDevice(gpu);
      // A blocking stream: it waits for work on the legacy default stream (where Thrust's
      // algorithms run by default) and that stream waits for it, so the step's kernels and the
      // collectives on this stream stay in program order.
      if (e == cudaSuccess) e = cudaStreamCreate(&state.stream);
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        state.error_code = static_cast<int>(e);
        state.error = fmt::format("replica {} could not be bound to {}: {}", local_replica, device,
                                  backends::cuda_error_text(e));
        return;
      }
      state.device = gpu;
    } catch (const std::exception& e) {
      state.error_code = static_cast<int>(cudaErrorUnknown);
      state.error = fmt::format("replica {} could not be bound to {}: {}", local_replica, device, e.what());
    } catch (...) {
      state.error_code = static_cast<int>(cudaErrorUnknown);
      state.error = fmt::format("replica {} could not be bound to {}", local_replica, device);
    }
  }

  /// This replica's stream (inside a step of a cuda strategy); the default stream (0) elsewhere.
  /// Work a step puts on it is ordered with the replica's collectives.
  static cudaStream_t current_stream() { return backends::cuda_replica_stream(); }
  /// This replica's GPU index (inside a step of a cuda strategy), else -1.
  static int current_device() noexcept { return backends::cuda_replica_thread().device; }
};

DISTRIBUTE_END_NAMESPACE

// core::device_ops<U>: what host-generic code (strategy reduce/gather, Variable updates, the
// shared-memory collective) does with a value whose elements live in device memory. One Thrust
// implementation for every device system: CUDA under nvcc, OpenMP/CPP in CPU builds.
//
// The kernels are element-wise Thrust transforms whose functors spell exactly the expressions of
// the host kernels in core/elementwise.hpp (Min is std::min's `b < a ? b : a`, not
// thrust::minimum's `a < b ? a : b`), so a device reduction is bit-identical to the host one,
// NaN and signed zero included.
#pragma once

#include <distribute/version.hpp>  // first: under nvcc it configures fmt before fmt is included

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <thrust/device_vector.h>
#include <thrust/execution_policy.h>
#include <thrust/system_error.h>
#include <thrust/transform.h>

#include <distribute/backends/cuda/detail/thrust_system.hpp>
#include <distribute/core/half_convert.hpp>
#include <distribute/core/replica_group.hpp>
#include <distribute/core/device.hpp>
#include <distribute/core/dtype.hpp>
#include <distribute/core/error.hpp>
#include <distribute/core/memory_space.hpp>
#include <distribute/core/reduce_op.hpp>
#include <distribute/core/shape.hpp>
#include <distribute/core/tensor.hpp>
#include <distribute/core/tensor_traits.hpp>

#if DISTRIBUTE_THRUST_CUDA
#include <distribute/backends/cuda/runtime.hpp>
#endif

DISTRIBUTE_BEGIN_NAMESPACE
namespace backends {
namespace device_kernels {

// ---- functors: the host kernels' expressions, callable on the device ----------------------
template <class T>
struct sum_fn {
  DISTRIBUTE_HOST_DEVICE T operator()(const T& a, const T& b) const { return static_cast<T>(a + b); }
};
template <class T>
struct difference_fn {
  DISTRIBUTE_HOST_DEVICE T operator()(const T& a, const T& b) const { return static_cast<T>(a - b); }
};
template <class T>
struct product_fn {
  DISTRIBUTE_HOST_DEVICE T operator()(const T& a, const T& b) const { return static_cast<T>(a * b); }
};
template <class T>
struct min_fn {  // as the host kernels: a NaN on either side wins
  DISTRIBUTE_HOST_DEVICE T operator()(const T& a, const T& b) const { return (a < b || a != a) ? a : b; }
};
template <class T>
struct max_fn {
  DISTRIBUTE_HOST_DEVICE T operator()(const T& a, const T& b) const { return (a > b || a != a) ? a : b; }
};
struct or_fn {
  DISTRIBUTE_HOST_DEVICE bool operator()(bool a, bool b) const { return a || b; }
};
struct and_fn {
  DISTRIBUTE_HOST_DEVICE bool operator()(bool a, bool b) const { return a && b; }
};
template <class T>
struct divide_by_fn {
  T divisor;
  DISTRIBUTE_HOST_DEVICE T operator()(const T& a) const { return static_cast<T>(a / divisor); }
};

/// Runs a Thrust algorithm and turns a device-system failure into a library error naming `what`.
template <class F>
void run(const char* what, F&& f) {
  try {
    f();
  } catch (const thrust::system_error& e) {
#if DISTRIBUTE_THRUST_CUDA
    throw CudaError(e.code().value(), fmt::format("{}: {}", what, e.what()));
#else
    throw Error(fmt::format("{}: {}", what, e.what()));
#endif
  }
}

template <class T, class F>
void binary(T* acc, const T* src, std::size_t n, F f) {
  run("device kernel", [&] { thrust::transform(thrust::device, acc, acc + n, src, acc, f); });
}

/// acc[i] = acc[i] (op) src[i] on the device, as core::combine does on the host, for a lowered
/// reduction's op (never Mean; see Reduction). Both pointers must be on the current device.
template <class T>
void combine(T* acc, const T* src, std::size_t n, ReduceOp op) {
  if (n == 0) return;
  if constexpr (std::is_same_v<T, bool>) {
    if (op == ReduceOp::Sum || op == ReduceOp::Max) binary(acc, src, n, or_fn{});
    else binary(acc, src, n, and_fn{});
  } else {
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Mean:  // lowered to Sum before it reaches here; summed all the same
        binary(acc, src, n, sum_fn<T>{});
        break;
      case ReduceOp::Min: binary(acc, src, n, min_fn<T>{}); break;
      case ReduceOp::Max: binary(acc, src, n, max_fn<T>{}); break;
      case ReduceOp::Product: binary(acc, src, n, product_fn<T>{}); break;
    }
  }
}

/// acc[i] /= divisor on the device (integers truncate, as core::divide); bool is left alone.
template <class T>
void divide(T* acc, std::size_t n, std::int64_t divisor) {
  if constexpr (!std::is_same_v<T, bool>) {
    if (n == 0) return;
    const divide_by_fn<T> f{static_cast<T>(divisor)};
    run("device kernel", [&] { thrust::transform(thrust::device, acc, acc + n, acc, f); });
  }
}

/// divide() for a buffer known only by its dtype (the NCCL collective's integer MEAN).
inline void divide(void* acc, DType dtype, std::size_t n, std::int64_t divisor) {
  visit_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    if constexpr (core::is_half_v<T>) {
      throw InvalidArgument(fmt::format("a MEAN of {} values on the device is divided by NCCL (ncclAvg) only",
                                        to_string(dtype)));
    } else {
      divide(static_cast<T*>(acc), n, divisor);
    }
  });
}

}  // namespace device_kernels

/// Copies bytes between any two of host memory and device memory.
inline void device_copy_bytes(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
#if DISTRIBUTE_THRUST_CUDA
  // With unified addressing CUDA tells host, this GPU and other GPUs apart by the pointers.
  cuda_check(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), "cudaMemcpy");
#else
  std::memcpy(dst, src, bytes);  // the OpenMP and CPP device systems keep "device" memory on the host
#endif
}

/// What a BufferRef in device memory carries for the collectives.
inline constexpr core::DeviceMemoryAccess thrust_device_access{&device_copy_bytes};

#if DISTRIBUTE_THRUST_CUDA
/// Makes the GPU that `p` points into current for the guard's lifetime (kernels run on the
/// current GPU); host memory leaves the current device alone.
class OnDeviceOf {
 public:
  explicit OnDeviceOf(const void* p) : device_(cuda_device_of(p)), guard_(device_) {}
  int device() const noexcept { return device_; }

 private:
  int device_;
  CudaDeviceGuard guard_;
};

/// Under CUDA a kernel may not read another GPU's memory (peer access is not enabled). This
/// makes the destination's GPU current and, if the source lives on another GPU, copies it next
/// to the destination first.
template <class T>
class SameDeviceOperand {
 public:
  SameDeviceOperand(const T* dst, const T* src, std::size_t n) : on_(dst), src_(src) {
    if (n == 0 || on_.device() < 0 || cuda_device_of(src) == on_.device()) return;
    staged_ = CudaBuffer(n * sizeof(T));
    device_copy_bytes(staged_.data(), src, n * sizeof(T));
    src_ = static_cast<const T*>(staged_.data());
  }
  const T* get() const noexcept { return src_; }

 private:
  OnDeviceOf on_;
  CudaBuffer staged_;
  const T* src_;
};
#else
class OnDeviceOf {  // one memory, no devices to switch
 public:
  explicit OnDeviceOf(const void*) noexcept {}
};

template <class T>
class SameDeviceOperand {
 public:
  SameDeviceOperand(const T*, const T* src, std::size_t) noexcept : src_(src) {}
  const T* get() const noexcept { return src_; }

 private:
  const T* src_;
};
#endif

/// The GPU index named by a TF device string ("/job:localhost/.../device:GPU:1" → 1), or -1.
inline int gpu_index_of(const std::string& device) {
  if (device.empty()) return -1;
  const DeviceSpec d = DeviceSpec::parse(device);
  return d.device_type == std::string("GPU") && d.device_index ? *d.device_index : -1;
}

/// Host copies of device values, for code that only works on the host (reduce along an axis).
template <class E>
struct HostCopies {
  std::vector<Tensor<E>> tensors;
  std::vector<const Tensor<E>*> pointers() const {
    std::vector<const Tensor<E>*> out;
    out.reserve(tensors.size());
    for (const auto& t : tensors) out.push_back(&t);
    return out;
  }
};

/// core::device_ops for every device value type (below): the operations core/ and collective/ name
/// without knowing the backend.
template <class U>
struct ThrustDeviceOps {
  using E = element_t<U>;
  using traits = tensor_traits<U>;

  /// For the BufferRef of a device value (ReplicaContext::buffer_ref).
  static constexpr const core::DeviceMemoryAccess* access() noexcept { return &thrust_device_access; }

  /// acc (op)= src, element-wise; src may live on another GPU than acc.
  static void combine(U& acc, const U& src, ReduceOp op) {
    const std::size_t n = element_count(acc);
    SameDeviceOperand<E> s(traits::data(acc), traits::data(src), n);
    device_kernels::combine(traits::data(acc), s.get(), n, op);
  }
  static void divide(U& acc, std::int64_t divisor) {
    const OnDeviceOf on(traits::data(acc));
    device_kernels::divide(traits::data(acc), element_count(acc), divisor);
  }
  /// Variable updates: dst = src, dst += src, dst -= src (src may live on another GPU).
  static void assign(U& dst, const U& src) {
    device_copy_bytes(traits::data(dst), traits::data(src), element_count(dst) * sizeof(E));
  }
  static void add(U& dst, const U& src) { binary(dst, src, device_kernels::sum_fn<E>{}); }
  static void sub(U& dst, const U& src) { binary(dst, src, device_kernels::difference_fn<E>{}); }

  /// strategy.reduce of device components: `out` (a copy of parts[0]) combined with the other
  /// parts, then with the other workers' through `link` (host memory travels, so a host copy),
  /// then divided for Mean by the number of components in all.
  template <class Link>
  static U reduce(U out, const std::vector<const U*>& parts, ReduceOp op, Link* link) {
    const Reduction red = Reduction::lower(op, static_cast<std::int64_t>(parts.size()) * (link ? link->num_workers() : 1));
    for (std::size_t r = 1; r < parts.size(); ++r) combine(out, *parts[r], red.op());
    if (link) {
      const std::size_t n = element_count(out);
      on_host(out, [&](void* p) { link->all_reduce(p, n, dtype_of<E>(), red.op()); });
    }
    if (red.divides()) divide(out, red.divisor());
    return out;
  }

  /// The same over a variable's copies (a cross-replica read of a sync-on-read variable).
  template <class Link>
  static U reduce(U out, const std::vector<U>& copies, ReduceOp op, Link* link) {
    std::vector<const U*> parts;
    parts.reserve(copies.size());
    for (const auto& c : copies) parts.push_back(&c);
    return reduce(std::move(out), parts, op, link);
  }

  /// A variable's copies: `copies` of `initial`, copy c on devices[c] (its replica's GPU under
  /// CUDA, not the GPU current on the creating thread). With a link every worker starts from
  /// the chief's value, as for host variables.
  template <class Link>
  static std::vector<U> place_copies(U& initial, std::size_t copies, const std::vector<std::string>& devices,
                                     Link* link) {
    if (link) {
      const std::size_t bytes = element_count(initial) * sizeof(E);
      on_host(initial, [&](void* p) { link->broadcast(p, bytes, 0); });
    }
    std::vector<U> out;
    out.reserve(copies);
    for (std::size_t c = 0; c < copies; ++c) out.push_back(copy_to(initial, c < devices.size() ? devices[c] : std::string()));
    return out;
  }

  /// A host Tensor with v's shape and elements.
  static Tensor<E> to_host(const U& v) {
    Tensor<E> out = Tensor<E>::zeros(shape_of(v));
    device_copy_bytes(out.data(), traits::data(v), out.size() * sizeof(E));
    return out;
  }
  /// A G (allocated on the current device) holding the host tensor's shape and elements.
  template <class G>
  static G from_host(const Tensor<E>& host) {
    G out = tensor_traits<G>::make(host.shape());
    device_copy_bytes(tensor_traits<G>::data(out), host.data(), host.size() * sizeof(E));
    return out;
  }
  static HostCopies<E> host_copies(const std::vector<const U*>& parts) {
    HostCopies<E> out;
    out.tensors.reserve(parts.size());
    for (const U* p : parts) out.tensors.push_back(to_host(*p));
    return out;
  }

  /// Runs f(void* host_elements) on a host copy of v's elements and copies them back (for the
  /// cross-worker links, which send host memory).
  template <class F>
  static void on_host(U& v, F&& f) {
    const std::size_t bytes = element_count(v) * sizeof(E);
    std::vector<std::byte> host(bytes);
    device_copy_bytes(host.data(), traits::data(v), bytes);
    f(static_cast<void*>(host.data()));
    device_copy_bytes(traits::data(v), host.data(), bytes);
  }

  /// A copy of v placed on `device` (a TF device string; a GPU under CUDA, else where v is).
  static U copy_to(const U& v, const std::string& device) {
#if DISTRIBUTE_THRUST_CUDA
    CudaDeviceGuard on(gpu_index_of(device));
    U out = traits::make(shape_of(v));
    device_copy_bytes(traits::data(out), traits::data(v), element_count(v) * sizeof(E));
    return out;
#else
    (void)device;
    return v;
#endif
  }

  /// The concatenation of `parts` along `axis` as a new G (allocated on the current device).
  template <class G>
  static G concat(const std::vector<const core::BufferRef*>& parts, std::size_t axis) {
    Shape out_shape = parts.front()->shape;
    out_shape[axis] = 0;
    for (const auto* p : parts) out_shape[axis] += p->shape[axis];
    G out = tensor_traits<G>::make(out_shape);
    concat_into(parts, axis, out_shape, tensor_traits<G>::data(out));
    return out;
  }

 private:
  template <class F>
  static void binary(U& dst, const U& src, F f) {
    const std::size_t n = element_count(dst);
    SameDeviceOperand<E> s(traits::data(dst), traits::data(src), n);
    device_kernels::binary(traits::data(dst), s.get(), n, f);
  }

  static void concat_into(const std::vector<const core::BufferRef*>& parts, std::size_t axis, const Shape& out_shape,
                          void* out) {
    const std::size_t elem = size_of(parts.front()->dtype);
    std::size_t outer = 1, inner = 1;
    for (std::size_t d = 0; d < axis; ++d) outer *= static_cast<std::size_t>(out_shape[d]);
    for (std::size_t d = axis + 1; d < out_shape.size(); ++d) inner *= static_cast<std::size_t>(out_shape[d]);
    const std::size_t row = static_cast<std::size_t>(out_shape[axis]) * inner * elem;  // one outer row of out
    std::size_t column = 0;
    for (const auto* p : parts) {
      const std::size_t run = static_cast<std::size_t>(p->shape[axis]) * inner * elem;
      if (run != 0 && outer != 0) {
#if DISTRIBUTE_THRUST_CUDA
        // One strided copy per part: `outer` runs of `run` bytes, `row` bytes apart in out.
        cuda_check(cudaMemcpy2D(static_cast<std::byte*>(out) + column, row, p->data, run, run, outer,
                                cudaMemcpyDefault),
                   "cudaMemcpy2D");
#else
        for (std::size_t o = 0; o < outer; ++o) {
          device_copy_bytes(static_cast<std::byte*>(out) + o * row + column,
                            static_cast<const std::byte*>(p->data) + o * run, run);
        }
#endif
      }
      column += run;
    }
  }
};

}  // namespace backends

template <class U>
struct core::device_ops : backends::ThrustDeviceOps<U> {};

DISTRIBUTE_END_NAMESPACE

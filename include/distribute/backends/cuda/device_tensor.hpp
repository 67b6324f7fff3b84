// Values in device memory: ds::DeviceTensor<T> (a shape over a thrust::device_vector<T>) and
// tensor_traits for thrust::device_vector<T>. Their memory space is MemorySpace::device, the
// Thrust device system's memory: GPU memory under nvcc, host memory in an OpenMP/CPP CPU build
// (-DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP or _CPP), where the same code runs without a GPU.
//
// Under CUDA a device value lives on the GPU that was current when it was made: a replica's
// values on its replica's GPU, the values returned by strategy.reduce/gather on the caller's.
#pragma once

#include <distribute/version.hpp>  // first: under nvcc it configures fmt before fmt is included

#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <thrust/copy.h>
#include <thrust/device_vector.h>
#include <thrust/equal.h>

#include <distribute/backends/cuda/device_ops.hpp>
#include <distribute/backends/cuda/detail/thrust_system.hpp>
#include <distribute/core/dtype.hpp>
#include <distribute/core/error.hpp>
#include <distribute/core/memory_space.hpp>
#include <distribute/core/shape.hpp>
#include <distribute/core/tensor.hpp>
#include <distribute/core/tensor_traits.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

/// A dense row-major array in device memory with a shape; the device counterpart of ds::Tensor.
/// Element access goes through the host (to_host(), or storage() with Thrust algorithms).
template <class T>
class DeviceTensor {
  static_assert(Element<T>, "ds::DeviceTensor<T>: T must be an arithmetic element type (float, int32_t, ...)");

 public:
  using value_type = T;

  /// An empty rank-1 tensor of shape (0,).
  DeviceTensor() : shape_{0} {}
  /// Zeros of `shape`.
  explicit DeviceTensor(Shape shape) : shape_(checked(std::move(shape))), data_(count(shape_)) {}
  /// `shape` holding the host `values` (row-major); the sizes must agree.
  DeviceTensor(Shape shape, const std::vector<T>& values) : shape_(checked(std::move(shape))) {
    if (count(shape_) != values.size()) {
      throw InvalidArgument(fmt::format("DeviceTensor: shape {} holds {} elements but {} values were given",
                                        shape_string(shape_), count(shape_), values.size()));
    }
    data_ = thrust::device_vector<T>(values.begin(), values.end());
  }
  static DeviceTensor zeros(Shape shape) { return DeviceTensor(std::move(shape)); }
  /// A device copy of a host tensor. (A named function: a constructor from Tensor<T> would make
  /// DeviceTensor<T>({2, 3}) ambiguous, since Tensor<T> takes a list of values.)
  static DeviceTensor from_host(const Tensor<T>& host) {
    DeviceTensor out;
    out.shape_ = host.shape();
    out.data_ = thrust::device_vector<T>(host.data(), host.data() + host.size());
    return out;
  }

  const Shape& shape() const noexcept { return shape_; }
  std::size_t rank() const noexcept { return shape_.size(); }
  std::size_t size() const noexcept { return data_.size(); }
  bool empty() const noexcept { return data_.empty(); }

  /// Raw device pointers (for kernels, cuBLAS, NCCL...).
  T* data() noexcept { return thrust::raw_pointer_cast(data_.data()); }
  const T* data() const noexcept { return thrust::raw_pointer_cast(data_.data()); }
  thrust::device_vector<T>& storage() noexcept { return data_; }
  const thrust::device_vector<T>& storage() const noexcept { return data_; }

  /// The elements copied to the host.
  Tensor<T> to_host() const {
    std::vector<T> values(data_.size());
    thrust::copy(data_.begin(), data_.end(), values.begin());
    return Tensor<T>(shape_, std::move(values));
  }

  friend bool operator==(const DeviceTensor& a, const DeviceTensor& b) {
    return a.shape_ == b.shape_ && thrust::equal(a.data_.begin(), a.data_.end(), b.data_.begin());
  }

 private:
  static Shape checked(Shape shape) {
    for (auto d : shape) {
      if (d < 0) throw InvalidArgument(fmt::format("DeviceTensor: negative dimension in shape {}", shape_string(shape)));
    }
    return shape;
  }
  static std::size_t count(const Shape& shape) { return static_cast<std::size_t>(num_elements(shape)); }

  Shape shape_;
  thrust::device_vector<T> data_;
};

/// thrust::device_vector<T> is a rank-1 tensor in device memory; gathering gives a device_vector.
template <class T>
  requires Element<T>
struct tensor_traits<thrust::device_vector<T>> {
  using value_type = T;
  using gathered_type = thrust::device_vector<T>;
  static constexpr MemorySpace memory = MemorySpace::device;
  static Shape shape(const thrust::device_vector<T>& v) { return {static_cast<std::int64_t>(v.size())}; }
  static const T* data(const thrust::device_vector<T>& v) { return thrust::raw_pointer_cast(v.data()); }
  static T* data(thrust::device_vector<T>& v) { return thrust::raw_pointer_cast(v.data()); }
  static thrust::device_vector<T> make(const Shape& s) {
    if (s.size() != 1) {
      throw InvalidArgument(fmt::format(
          "cannot hold shape {} in a thrust::device_vector (rank 1); use ds::DeviceTensor", shape_string(s)));
    }
    return thrust::device_vector<T>(static_cast<std::size_t>(s[0]));
  }
};

template <class T>
struct tensor_traits<DeviceTensor<T>> {
  using value_type = T;
  using gathered_type = DeviceTensor<T>;
  static constexpr MemorySpace memory = MemorySpace::device;
  static Shape shape(const DeviceTensor<T>& t) { return t.shape(); }
  static const T* data(const DeviceTensor<T>& t) { return t.data(); }
  static T* data(DeviceTensor<T>& t) { return t.data(); }
  static DeviceTensor<T> make(const Shape& s) { return DeviceTensor<T>(s); }
};

DISTRIBUTE_END_NAMESPACE

/// fmt::format("{}", t) → "DeviceTensor<float32>(shape=(2,), [1, 2])" (copies to the host to print).
template <class T>
struct fmt::formatter<distribute::DeviceTensor<T>> {
  constexpr auto parse(format_parse_context& ctx) { return ctx.begin(); }
  template <class Ctx>
  auto format(const distribute::DeviceTensor<T>& t, Ctx& ctx) const {
    auto out = fmt::format_to(ctx.out(), "DeviceTensor<{}>(shape={}, ", distribute::to_string(distribute::dtype_of<T>()),
                              distribute::shape_string(t.shape()));
    if constexpr (std::is_same_v<T, bool>) {
      out = fmt::format_to(out, "...");
    } else {
      const auto host = t.to_host();
      if (host.size() == 0 && host.rank() > 0) out = fmt::format_to(out, "[]");
      else out = distribute::core::detail::format_tensor_data(out, host.data(), host.shape(), 0);
    }
    return fmt::format_to(out, ")");
  }
};

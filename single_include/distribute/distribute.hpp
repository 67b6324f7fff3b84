// distribute 0.1.0: tf.distribute for C++, single-header edition.
// SPDX-License-Identifier: Apache-2.0
//
// GENERATED FILE, DO NOT EDIT. It is produced from include/distribute/ by
//   python3 tools/amalgamate.py
// Edit the headers under include/ and regenerate.
#pragma once

// ---- begin <distribute/distribute.hpp> ----
// distribute: tf.distribute for C++. The umbrella header: includes every enabled part.

// ---- begin <distribute/version.hpp> ----
// Version macros and the versioned inline ABI namespace.

#define DISTRIBUTE_VERSION_MAJOR 0
#define DISTRIBUTE_VERSION_MINOR 1
#define DISTRIBUTE_VERSION_PATCH 0
#define DISTRIBUTE_VERSION_STRING "0.1.0"

// Every public name lives in distribute::v0 so that two incompatible builds of the
// library linked into one program fail to link instead of silently mixing layouts.
#define DISTRIBUTE_BEGIN_NAMESPACE \
  namespace distribute {           \
  inline namespace v0 {
#define DISTRIBUTE_END_NAMESPACE \
  }                              \
  }
// ---- end <distribute/version.hpp> ----

// ---- begin <distribute/core/device.hpp> ----
// DeviceSpec: TF device strings ("/gpu:0", "GPU:1", "/job:worker/replica:0/task:1/device:CPU:0").

#include <algorithm>
#include <cctype>
#include <charconv>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>

// ---- begin <distribute/core/error.hpp> ----
// The library's error hierarchy: every error derives from ds::Error.

#include <stdexcept>
#include <string>


DISTRIBUTE_BEGIN_NAMESPACE

/// Base of every error the library throws.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A caller passed a value the library cannot work with (bad shape, axis, name, nesting).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

/// The cluster configuration (TF_CONFIG, Slurm, launcher environment) is malformed.
class ClusterConfigError : public Error {
 public:
  using Error::Error;
};

/// A peer (another replica, worker or parameter server) failed or went away.
class PeerFailure : public Error {
 public:
  using Error::Error;
};

/// A collective did not complete within its timeout.
class CollectiveTimeout : public Error {
 public:
  using Error::Error;
};

/// A checkpoint file is missing, truncated, corrupted or does not match what it restores.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

/// A resource the caller asked for does not exist on this machine (e.g. no GPU visible).
class Unavailable : public Error {
 public:
  using Error::Error;
};

/// A replica was released from a collective because another replica of the same step failed.
/// `run` never rethrows this one when the original error is known; it rethrows the original.
class Cancelled : public Error {
 public:
  using Error::Error;
};

DISTRIBUTE_END_NAMESPACE
// ---- end <distribute/core/error.hpp> ----

DISTRIBUTE_BEGIN_NAMESPACE

/// A (possibly partial) device name. Absent parts are left unset; to_string() writes the
/// canonical TF form with only the parts that are set.
struct DeviceSpec {
  std::optional<std::string> job;
  std::optional<int> replica;
  std::optional<int> task;
  std::optional<std::string> device_type;  // upper case: "CPU", "GPU"
  std::optional<int> device_index;

  /// Parses "/job:w/replica:0/task:1/device:CPU:0", "/cpu:0", "GPU:1", "/device:GPU:*"... and
  /// throws InvalidArgument naming the string and the part that is wrong.
  static DeviceSpec parse(std::string_view text);

  static DeviceSpec local(std::string_view type, int index) {
    return DeviceSpec{{}, {}, {}, std::string(type), index};
  }

  /// "/job:worker/replica:0/task:1/device:CPU:0" with only the parts that are set.
  std::string to_string() const {
    std::string out;
    if (job) out += fmt::format("/job:{}", *job);
    if (replica) out += fmt::format("/replica:{}", *replica);
    if (task) out += fmt::format("/task:{}", *task);
    if (device_type) out += fmt::format("/device:{}:{}", *device_type, device_index ? std::to_string(*device_index) : "*");
    return out;
  }

  /// The device with job/replica/task filled in from `base` where this one leaves them unset.
  DeviceSpec fill_from(const DeviceSpec& base) const {
    DeviceSpec d = *this;
    if (!d.job) d.job = base.job;
    if (!d.replica) d.replica = base.replica;
    if (!d.task) d.task = base.task;
    if (!d.device_type) d.device_type = base.device_type;
    if (!d.device_index) d.device_index = base.device_index;
    return d;
  }

  friend bool operator==(const DeviceSpec&, const DeviceSpec&) = default;
};

namespace detail {
inline std::string upper(std::string_view s) {
  std::string u(s);
  std::transform(u.begin(), u.end(), u.begin(), [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  return u;
}
inline std::optional<int> parse_index(std::string_view s) {
  int v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || p != s.data() + s.size() || v < 0 || s.empty()) return std::nullopt;
  return v;
}
}  // namespace detail

inline DeviceSpec DeviceSpec::parse(std::string_view text) {
  auto fail = [&](std::string_view why) -> DeviceSpec {
    throw InvalidArgument(fmt::format("invalid device string '{}': {}", text, why));
  };
  if (text.empty()) return fail("it is empty");
  DeviceSpec spec;
  std::string_view rest = text;
  if (rest.front() == '/') rest.remove_prefix(1);
  while (!rest.empty()) {
    auto slash = rest.find('/');
    std::string_view part = rest.substr(0, slash);
    rest = slash == std::string_view::npos ? std::string_view{} : rest.substr(slash + 1);
    if (part.empty()) return fail("empty component");
    auto colon = part.find(':');
    if (colon == std::string_view::npos) return fail(fmt::format("component '{}' has no ':'", part));
    std::string key = detail::upper(part.substr(0, colon));
    std::string_view value = part.substr(colon + 1);
    auto index_or_fail = [&](std::string_view v, std::string_view what) -> int {
      auto i = detail::parse_index(v);
      if (!i) fail(fmt::format("{} '{}' is not a non-negative integer", what, v));
      return *i;
    };
    if (key == "JOB") {
      if (value.empty()) return fail("empty job name");
      spec.job = std::string(value);
    } else if (key == "REPLICA") {
      spec.replica = index_or_fail(value, "replica");
    } else if (key == "TASK") {
      spec.task = index_or_fail(value, "task");
    } else {
      // "device:CPU:0", or the short forms "CPU:0" / "gpu:1".
      std::string_view type_and_index = part;
      if (key == "DEVICE") type_and_index = value;
      auto c = type_and_index.find(':');
      std::string type = detail::upper(type_and_index.substr(0, c));
      if (type.empty() || !std::all_of(type.begin(), type.end(), [](char ch) { return std::isalpha(static_cast<unsigned char>(ch)) || ch == '_'; })) {
        return fail(fmt::format("device type '{}' is not a name", type_and_index.substr(0, c)));
      }
      if (spec.device_type) return fail("more than one device component");
      spec.device_type = type;
      if (c != std::string_view::npos) {
        auto idx = type_and_index.substr(c + 1);
        if (idx != "*") spec.device_index = index_or_fail(idx, "device index");
      }
    }
  }
  return spec;
}

/// "/job:localhost/replica:0/task:0/device:CPU:i": the canonical name of local device i.
inline std::string local_device_string(std::string_view type, int index) {
  return DeviceSpec{"localhost", 0, 0, std::string(type), index}.to_string();
}

DISTRIBUTE_END_NAMESPACE

template <>
struct fmt::formatter<distribute::DeviceSpec> : fmt::formatter<std::string> {
  template <class Ctx>
  auto format(const distribute::DeviceSpec& d, Ctx& ctx) const {
    return fmt::formatter<std::string>::format(d.to_string(), ctx);
  }
};
// ---- end <distribute/core/device.hpp> ----
// ---- begin <distribute/core/dtype.hpp> ----
// Element types that cross a replica or process boundary, named as in TF/safetensors.

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>


DISTRIBUTE_BEGIN_NAMESPACE

enum class DType : std::uint8_t { F32, F64, I8, I16, I32, I64, U8, U16, U32, U64, Bool };

constexpr std::string_view to_string(DType d) noexcept {
  switch (d) {
    case DType::F32: return "float32";
    case DType::F64: return "float64";
    case DType::I8: return "int8";
    case DType::I16: return "int16";
    case DType::I32: return "int32";
    case DType::I64: return "int64";
    case DType::U8: return "uint8";
    case DType::U16: return "uint16";
    case DType::U32: return "uint32";
    case DType::U64: return "uint64";
    case DType::Bool: return "bool";
  }
  return "?";
}

constexpr std::size_t size_of(DType d) noexcept {
  switch (d) {
    case DType::I8: case DType::U8: case DType::Bool: return 1;
    case DType::I16: case DType::U16: return 2;
    case DType::F32: case DType::I32: case DType::U32: return 4;
    case DType::F64: case DType::I64: case DType::U64: return 8;
  }
  return 0;
}

/// Arithmetic element types the collectives know how to combine.
template <class T>
concept Element = std::is_arithmetic_v<T> && !std::is_const_v<T> && !std::is_volatile_v<T> &&
                  (sizeof(T) <= 8) && !std::is_same_v<T, char> && !std::is_same_v<T, wchar_t> &&
                  !std::is_same_v<T, long double>;

template <Element T>
constexpr DType dtype_of() noexcept {
  if constexpr (std::is_same_v<T, bool>) return DType::Bool;
  else if constexpr (std::is_floating_point_v<T>) return sizeof(T) == 4 ? DType::F32 : DType::F64;
  else if constexpr (std::is_signed_v<T>) {
    if constexpr (sizeof(T) == 1) return DType::I8;
    else if constexpr (sizeof(T) == 2) return DType::I16;
    else if constexpr (sizeof(T) == 4) return DType::I32;
    else return DType::I64;
  } else {
    if constexpr (sizeof(T) == 1) return DType::U8;
    else if constexpr (sizeof(T) == 2) return DType::U16;
    else if constexpr (sizeof(T) == 4) return DType::U32;
    else return DType::U64;
  }
}

/// Calls f(T{}) with the C++ type of a runtime DType.
template <class F>
decltype(auto) visit_dtype(DType d, F&& f) {
  switch (d) {
    case DType::F32: return f(float{});
    case DType::F64: return f(double{});
    case DType::I8: return f(std::int8_t{});
    case DType::I16: return f(std::int16_t{});
    case DType::I32: return f(std::int32_t{});
    case DType::I64: return f(std::int64_t{});
    case DType::U8: return f(std::uint8_t{});
    case DType::U16: return f(std::uint16_t{});
    case DType::U32: return f(std::uint32_t{});
    case DType::U64: return f(std::uint64_t{});
    case DType::Bool: return f(bool{});
  }
  return f(float{});
}

DISTRIBUTE_END_NAMESPACE
// ---- end <distribute/core/dtype.hpp> ----
// ---- begin <distribute/core/reduce_op.hpp> ----
// ReduceOp and its TF string forms.

#include <algorithm>
#include <cctype>
#include <string>
#include <string_view>

#include <fmt/format.h>


DISTRIBUTE_BEGIN_NAMESPACE

/// How values are combined across replicas.
enum class ReduceOp { Sum, Mean, Min, Max, Product };

/// The canonical (TF) spelling: "SUM", "MEAN", "MIN", "MAX", "PRODUCT".
constexpr std::string_view to_string(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::Sum: return "SUM";
    case ReduceOp::Mean: return "MEAN";
    case ReduceOp::Min: return "MIN";
    case ReduceOp::Max: return "MAX";
    case ReduceOp::Product: return "PRODUCT";
  }
  return "?";
}

/// Parses TF's strings case-insensitively ("sum", "MEAN", "Max", ...).
inline ReduceOp parse_reduce_op(std::string_view text) {
  std::string upper(text);
  std::transform(upper.begin(), upper.end(), upper.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Min, ReduceOp::Max, ReduceOp::Product}) {
    if (upper == to_string(op)) return op;
  }
  throw InvalidArgument(fmt::format(
      "unknown reduce op '{}': expected one of SUM, MEAN, MIN, MAX, PRODUCT (any case)", text));
}

DISTRIBUTE_END_NAMESPACE

template <>
struct fmt::formatter<distribute::ReduceOp> : fmt::formatter<std::string_view> {
  template <class Ctx>
  auto format(distribute::ReduceOp op, Ctx& ctx) const {
    return fmt::formatter<std::string_view>::format(distribute::to_string(op), ctx);
  }
};
// ---- end <distribute/core/reduce_op.hpp> ----
// ---- begin <distribute/core/shape.hpp> ----
// Shapes: a row-major list of dimension sizes, printed the way TF prints them: (4, 2, 3).

#include <cstdint>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include <fmt/format.h>


DISTRIBUTE_BEGIN_NAMESPACE

using Shape = std::vector<std::int64_t>;

/// Number of elements a shape holds (1 for a scalar).
inline std::int64_t num_elements(const Shape& shape) {
  return std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>{});
}

/// "(4, 2, 3)", "(3,)" and "()" as in Python.
inline std::string shape_string(const Shape& shape) {
  if (shape.size() == 1) return fmt::format("({},)", shape[0]);
  return fmt::format("({})", fmt::join(shape, ", "));
}

/// Normalises an axis that may be negative (Python style) against a rank; throws naming both.
inline std::size_t normalize_axis(std::int64_t axis, std::size_t rank, const char* what) {
  const auto r = static_cast<std::int64_t>(rank);
  if (axis < -r || axis >= r) {
    throw InvalidArgument(fmt::format("{}: axis {} is out of range for a value of rank {} (valid: [{}, {}))",
                                      what, axis, rank, -r, r));
  }
  return static_cast<std::size_t>(axis < 0 ? axis + r : axis);
}

DISTRIBUTE_END_NAMESPACE
// ---- end <distribute/core/shape.hpp> ----
// ---- begin <distribute/core/tensor.hpp> ----
// Tensor<T>: a dense row-major array with a shape.

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>


DISTRIBUTE_BEGIN_NAMESPACE

template <class T>
class Tensor {
  static_assert(Element<T>, "ds::Tensor<T>: T must be an arithmetic element type (float, int32_t, ...)");
  static_assert(!std::is_same_v<T, bool>, "ds::Tensor<bool> is not supported; use ds::Tensor<std::uint8_t>");

 public:
  using value_type = T;

  /// An empty rank-1 tensor of shape (0,).
  Tensor() : shape_{0} {}

  /// A tensor of `shape` holding `data` in row-major order; the sizes must agree.
  Tensor(Shape shape, std::vector<T> data) : shape_(std::move(shape)), data_(std::move(data)) {
    for (auto d : shape_) {
      if (d < 0) throw InvalidArgument(fmt::format("Tensor: negative dimension in shape {}", shape_string(shape_)));
    }
    if (num_elements(shape_) != static_cast<std::int64_t>(data_.size())) {
      throw InvalidArgument(fmt::format("Tensor: shape {} holds {} elements but {} values were given",
                                        shape_string(shape_), num_elements(shape_), data_.size()));
    }
  }

  /// A rank-1 tensor holding `values`.
  Tensor(std::initializer_list<T> values) : shape_{static_cast<std::int64_t>(values.size())}, data_(values) {}

  static Tensor zeros(Shape shape) { return full(std::move(shape), T{}); }
  static Tensor full(Shape shape, T value) {
    auto n = num_elements(shape);
    if (n < 0) throw InvalidArgument(fmt::format("Tensor: negative dimension in shape {}", shape_string(shape)));
    return Tensor(std::move(shape), std::vector<T>(static_cast<std::size_t>(n), value));
  }
  static Tensor scalar(T value) { return Tensor(Shape{}, std::vector<T>{value}); }

  const Shape& shape() const noexcept { return shape_; }
  std::size_t rank() const noexcept { return shape_.size(); }
  std::int64_t dim(std::size_t axis) const { return shape_.at(axis); }
  std::size_t size() const noexcept { return data_.size(); }
  bool empty() const noexcept { return data_.empty(); }

  T* data() noexcept { return data_.data(); }
  const T* data() const noexcept { return data_.data(); }
  const std::vector<T>& values() const& noexcept { return data_; }
  std::vector<T> values() && noexcept { return std::move(data_); }

  T* begin() noexcept { return data_.data(); }
  T* end() noexcept { return data_.data() + data_.size(); }
  const T* begin() const noexcept { return data_.data(); }
  const T* end() const noexcept { return data_.data() + data_.size(); }

  /// Flat (row-major) element access.
  T& operator[](std::size_t i) noexcept { return data_[i]; }
  const T& operator[](std::size_t i) const noexcept { return data_[i]; }

  /// Multi-index access, bounds-checked: t.at(1, 2).
  template <class... I>
    requires(std::is_integral_v<I> && ...)
  T& at(I... index) { return data_[offset({static_cast<std::int64_t>(index)...})]; }
  template <class... I>
    requires(std::is_integral_v<I> && ...)
  const T& at(I... index) const { return data_[offset({static_cast<std::int64_t>(index)...})]; }

  /// The same elements under another shape with as many elements.
  Tensor reshape(Shape shape) const& { return Tensor(std::move(shape), data_); }
  Tensor reshape(Shape shape) && { return Tensor(std::move(shape), std::move(data_)); }

  friend bool operator==(const Tensor&, const Tensor&) = default;

 private:
  std::size_t offset(std::initializer_list<std::int64_t> index) const {
    if (index.size() != shape_.size()) {
      throw InvalidArgument(fmt::format("Tensor::at: {} indices given for a tensor of rank {}", index.size(), rank()));
    }
    std::int64_t flat = 0;
    std::size_t axis = 0;
    for (auto i : index) {
      if (i < 0 || i >= shape_[axis]) {
        throw InvalidArgument(fmt::format("Tensor::at: index {} is out of range for axis {} of shape {}", i, axis,
                                          shape_string(shape_)));
      }
      flat = flat * shape_[axis] + i;
      ++axis;
    }
    return static_cast<std::size_t>(flat);
  }

  Shape shape_;
  std::vector<T> data_;
};

namespace detail {
// Prints nested brackets, eliding the middle of long dimensions as numpy does.
template <class T, class Out>
Out format_tensor_data(Out out, const T* data, const Shape& shape, std::size_t axis) {
  if (axis == shape.size()) return fmt::format_to(out, "{}", data[0]);
  const std::int64_t n = shape[axis];
  std::int64_t stride = 1;
  for (std::size_t a = axis + 1; a < shape.size(); ++a) stride *= shape[a];
  constexpr std::int64_t edge = 3;
  out = fmt::format_to(out, "[");
  for (std::int64_t i = 0; i < n; ++i) {
    if (n > 2 * edge + 1 && i == edge) {
      out = fmt::format_to(out, "..., ");
      i = n - edge - 1;
      continue;
    }
    out = format_tensor_data(out, data + i * stride, shape, axis + 1);
    if (i + 1 < n) out = fmt::format_to(out, ", ");
  }
  return fmt::format_to(out, "]");
}
}  // namespace detail

DISTRIBUTE_END_NAMESPACE

// Printed by the formatter below (with shape and dtype), not as a generic range.
template <class T, class Char>
struct fmt::is_range<distribute::Tensor<T>, Char> : std::false_type {};

/// fmt::format("{}", t) → "Tensor<float32>(shape=(2, 2), [[1, 2], [3, 4]])".
template <class T>
struct fmt::formatter<distribute::Tensor<T>> {
  constexpr auto parse(format_parse_context& ctx) { return ctx.begin(); }
  template <class Ctx>
  auto format(const distribute::Tensor<T>& t, Ctx& ctx) const {
    auto out = fmt::format_to(ctx.out(), "Tensor<{}>(shape={}, ", distribute::to_string(distribute::dtype_of<T>()),
                              distribute::shape_string(t.shape()));
    if (t.size() == 0 && t.rank() > 0) {
      out = fmt::format_to(out, "[]");
    } else {
      out = distribute::detail::format_tensor_data(out, t.data(), t.shape(), 0);
    }
    return fmt::format_to(out, ")");
  }
};
// ---- end <distribute/core/tensor.hpp> ----
// ---- begin <distribute/core/tensor_traits.hpp> ----
// tensor_traits<U>: the customisation point that tells the library how to see a value as a tensor.
//
// A type the library reduces, gathers or sends must describe itself through a specialisation:
//
//   template <> struct distribute::tensor_traits<MyVec> {
//     using value_type = float;                                  // an arithmetic element type
//     static ds::Shape shape(const MyVec&);                      // row-major dims
//     static const float* data(const MyVec&);                    // contiguous elements
//     static float* data(MyVec&);
//     static MyVec make(const ds::Shape&);                       // a zeroed value of that shape
//   };
//
// Optional members: `using gathered_type = ...` (what gather/all_gather return; default Tensor<T>)
// and `static constexpr ds::MemorySpace memory = ...` (default host; `device` for values in the
// Thrust device system's memory, see core/memory_space.hpp and backends/cuda/device_tensor.hpp).

#include <array>
#include <concepts>
#include <cstddef>
#include <type_traits>
#include <vector>

// ---- begin <distribute/core/memory_space.hpp> ----
// MemorySpace: where a value's elements live, and the hooks that let host-generic code reach
// values in device memory without knowing the device system.
//
// "Device" means Thrust's device system, a compile-time choice: CUDA under nvcc, OpenMP or the
// sequential CPP system in CPU builds (-DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP/_CPP). The
// same device-shaped code therefore runs in CPU tests, as Thrust's own OpenMP/CPP systems intend.

#include <cstddef>


DISTRIBUTE_BEGIN_NAMESPACE

/// Where a value's elements live: host memory, or the memory of the Thrust device system.
enum class MemorySpace { host, device };

namespace detail {

/// How a type-erased collective reaches a buffer in device memory. Carried by a BufferRef whose
/// memory is `device`; supplied by detail::device_ops (backends/cuda/detail/device_ops.hpp).
struct DeviceMemoryAccess {
  /// Copies `bytes` bytes; either side may be host or device memory (CUDA: cudaMemcpyDefault).
  void (*copy)(void* dst, const void* src, std::size_t bytes);
};

/// The element-wise operations on values in device memory (combine, divide, copies to other
/// devices and to the host). Core code names it only inside
/// `if constexpr (memory_space_v<U> == MemorySpace::device)`, so a host-only program never needs
/// its definition. It is defined, for every U, by <distribute/backends/cuda/detail/device_ops.hpp>,
/// which the headers of device value types (backends/cuda/device_tensor.hpp) include: a value type
/// whose tensor_traits say `memory = MemorySpace::device` must come with that header.
template <class U>
struct device_ops;

}  // namespace detail

DISTRIBUTE_END_NAMESPACE
// ---- end <distribute/core/memory_space.hpp> ----

DISTRIBUTE_BEGIN_NAMESPACE

/// Primary template: deliberately empty, so that a type without a specialisation fails the
/// TensorLike concept with a readable message instead of a backtrace.
template <class U>
struct tensor_traits {};

/// A value the library can reduce, gather and send: it has a complete tensor_traits specialisation.
template <class U>
concept TensorLike = requires(const U& cu, U& u, const Shape& s) {
  typename tensor_traits<U>::value_type;
  requires Element<typename tensor_traits<U>::value_type>;
  { tensor_traits<U>::shape(cu) } -> std::convertible_to<Shape>;
  { tensor_traits<U>::data(cu) } -> std::same_as<const typename tensor_traits<U>::value_type*>;
  { tensor_traits<U>::data(u) } -> std::same_as<typename tensor_traits<U>::value_type*>;
  { tensor_traits<U>::make(s) } -> std::same_as<U>;
};

template <TensorLike U>
using element_t = typename tensor_traits<U>::value_type;

namespace detail {
template <class U>
struct gathered_type_of {
  using type = Tensor<element_t<U>>;
};
template <class U>
  requires requires { typename tensor_traits<U>::gathered_type; }
struct gathered_type_of<U> {
  using type = typename tensor_traits<U>::gathered_type;
};
template <class U>
constexpr MemorySpace memory_of() {
  if constexpr (requires { tensor_traits<U>::memory; }) return tensor_traits<U>::memory;
  else return MemorySpace::host;
}
}  // namespace detail

/// What gather/all_gather return for components of type U (a concatenation along an axis).
template <TensorLike U>
using gathered_t = typename detail::gathered_type_of<U>::type;

template <TensorLike U>
inline constexpr MemorySpace memory_space_v = detail::memory_of<U>();

template <TensorLike U>
Shape shape_of(const U& u) { return tensor_traits<U>::shape(u); }

template <TensorLike U>
std::size_t element_count(const U& u) {
  return static_cast<std::size_t>(num_elements(tensor_traits<U>::shape(u)));
}

// ---- built-in specialisations -------------------------------------------------------------

/// Arithmetic scalars are rank-0 tensors.
template <class T>
  requires Element<T>
struct tensor_traits<T> {
  using value_type = T;
  static Shape shape(const T&) { return {}; }
  static const T* data(const T& v) { return &v; }
  static T* data(T& v) { return &v; }
  static T make(const Shape& s) {
    if (!s.empty()) throw InvalidArgument(fmt::format("cannot hold shape {} in a scalar", shape_string(s)));
    return T{};
  }
};

/// std::vector<T> is a rank-1 tensor; gathering vectors gives a vector.
template <class T>
  requires(Element<T> && !std::is_same_v<T, bool>)
struct tensor_traits<std::vector<T>> {
  using value_type = T;
  using gathered_type = std::vector<T>;
  static Shape shape(const std::vector<T>& v) { return {static_cast<std::int64_t>(v.size())}; }
  static const T* data(const std::vector<T>& v) { return v.data(); }
  static T* data(std::vector<T>& v) { return v.data(); }
  static std::vector<T> make(const Shape& s) {
    if (s.size() != 1) {
      throw InvalidArgument(fmt::format("cannot hold shape {} in a std::vector (rank 1); use ds::Tensor", shape_string(s)));
    }
    return std::vector<T>(static_cast<std::size_t>(s[0]));
  }
};

/// std::array<T, N> is a rank-1 tensor of N elements.
template <class T, std::size_t N>
  requires Element<T>
struct tensor_traits<std::array<T, N>> {
  using value_type = T;
  static Shape shape(const std::array<T, N>&) { return {static_cast<std::int64_t>(N)}; }
  static const T* data(const std::array<T, N>& v) { return v.data(); }
  static T* data(std::array<T, N>& v) { return v.data(); }
  static std::array<T, N> make(const Shape& s) {
    if (s != Shape{static_cast<std::int64_t>(N)}) {
      throw InvalidArgument(fmt::format("cannot hold shape {} in a std::array of {}", shape_string(s), N));
    }
    return std::array<T, N>{};
  }
};

template <class T>
struct tensor_traits<Tensor<T>> {
  using value_type = T;
  using gathered_type = Tensor<T>;
  static Shape shape(const Tensor<T>& t) { return t.shape(); }
  static const T* data(const Tensor<T>& t) { return t.data(); }
  static T* data(Tensor<T>& t) { return t.data(); }
  static Tensor<T> make(const Shape& s) { return Tensor<T>::zeros(s); }
};

DISTRIBUTE_END_NAMESPACE
// ---- end <distribute/core/tensor_traits.hpp> ----
// ---- begin <distribute/core/values.hpp> ----
// Distributed values: PerReplica, Mirrored and Sharded, each tied to the strategy type S that
// made it, so that a value of one strategy handed to another is a compile error.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>


DISTRIBUTE_BEGIN_NAMESPACE

/// One component per local replica, in replica order.
template <class T, class S>
class PerReplica {
 public:
  using value_type = T;
  using strategy_type = S;

  PerReplica() = default;
  explicit PerReplica(std::vector<T> values) : values_(std::move(values)) {}

  std::size_t size() const noexcept { return values_.size(); }
  T& operator[](std::size_t i) { return values_.at(i); }
  const T& operator[](std::size_t i) const { return values_.at(i); }
  const std::vector<T>& values() const& noexcept { return values_; }
  std::vector<T>& values() & noexcept { return values_; }
  std::vector<T> values() && noexcept { return std::move(values_); }
  auto begin() const noexcept { return values_.begin(); }
  auto end() const noexcept { return values_.end(); }

  friend bool operator==(const PerReplica&, const PerReplica&) = default;

 private:
  std::vector<T> values_;
};

/// One logical value kept identical on every replica.
template <class T, class S>
class Mirrored {
 public:
  using value_type = T;
  using strategy_type = S;

  Mirrored() = default;
  explicit Mirrored(std::vector<T> values) : values_(std::move(values)) {
    if (values_.empty()) throw InvalidArgument("Mirrored: needs at least one copy");
  }

  const T& primary() const { return values_.front(); }
  std::size_t size() const noexcept { return values_.size(); }
  const T& operator[](std::size_t i) const { return values_.at(i); }
  const std::vector<T>& values() const noexcept { return values_; }

  friend bool operator==(const Mirrored&, const Mirrored&) = default;

 private:
  std::vector<T> values_;
};

/// One logical value split into shards along axis 0.
template <class T, class S>
class Sharded {
 public:
  using value_type = T;
  using strategy_type = S;

  Sharded() = default;
  /// Shards must agree on every dimension but the first.
  explicit Sharded(std::vector<T> shards) : shards_(std::move(shards)) {
    if constexpr (TensorLike<T>) {
      for (std::size_t i = 0; i < shards_.size(); ++i) {
        const Shape s = shape_of(shards_[i]);
        const Shape s0 = shape_of(shards_[0]);
        if (s.empty() || s.size() != s0.size() || !std::equal(s.begin() + 1, s.end(), s0.begin() + 1)) {
          throw InvalidArgument(fmt::format("Sharded: shard {} has shape {} which does not stack with shard 0's {}", i,
                                            shape_string(s), shape_string(s0)));
        }
      }
    }
  }

  const std::vector<T>& shards() const noexcept { return shards_; }
  std::size_t num_shards() const noexcept { return shards_.size(); }

  /// The logical (concatenated) shape.
  Shape shape() const
    requires TensorLike<T>
  {
    if (shards_.empty()) return {0};
    Shape s = shape_of(shards_.front());
    s[0] = 0;
    for (const auto& shard : shards_) s[0] += shape_of(shard)[0];
    return s;
  }

  /// The shards concatenated along axis 0 (a Tensor of their element type).
  auto to_tensor() const
    requires TensorLike<T>
  {
    Shape s = shape();
    std::vector<element_t<T>> out;
    out.reserve(static_cast<std::size_t>(num_elements(s)));
    for (const auto& shard : shards_) {
      const auto* p = tensor_traits<T>::data(shard);
      out.insert(out.end(), p, p + element_count(shard));
    }
    return Tensor<element_t<T>>(std::move(s), std::move(out));
  }

 private:
  std::vector<T> shards_;
};

namespace detail {
template <class V>
struct is_per_replica : std::false_type {};
template <class T, class S>
struct is_per_replica<PerReplica<T, S>> : std::true_type {};
template <class V>
struct is_mirrored : std::false_type {};
template <class T, class S>
struct is_mirrored<Mirrored<T, S>> : std::true_type {};
}  // namespace detail

/// True for PerReplica and Mirrored values (those `run` unwraps per replica).
template <class V>
concept DistributedValue = detail::is_per_replica<std::remove_cvref_t<V>>::value ||
                           detail::is_mirrored<std::remove_cvref_t<V>>::value;

DISTRIBUTE_END_NAMESPACE

// Printed by the formatters below, not as generic ranges.
template <class T, class S, class Char>
struct fmt::is_range<distribute::PerReplica<T, S>, Char> : std::false_type {};

/// fmt::format("{}", per_replica) → "PerReplica{0: ..., 1: ...}" as TF prints it.
template <class T, class S>
struct fmt::formatter<distribute::PerReplica<T, S>> {
  constexpr auto parse(format_parse_context& ctx) { return ctx.begin(); }
  template <class Ctx>
  auto format(const distribute::PerReplica<T, S>& v, Ctx& ctx) const {
    auto out = fmt::format_to(ctx.out(), "PerReplica{{");
    for (std::size_t i = 0; i < v.size(); ++i) out = fmt::format_to(out, "{}{}: {}", i ? ", " : "", i, v[i]);
    return fmt::format_to(out, "}}");
  }
};

template <class T, class S>
struct fmt::formatter<distribute::Mirrored<T, S>> {
  constexpr auto parse(format_parse_context& ctx) { return ctx.begin(); }
  template <class Ctx>
  auto format(const distribute::Mirrored<T, S>& v, Ctx& ctx) const {
    auto out = fmt::format_to(ctx.out(), "Mirrored{{");
    for (std::size_t i = 0; i < v.size(); ++i) out = fmt::format_to(out, "{}{}: {}", i ? ", " : "", i, v[i]);
    return fmt::format_to(out, "}}");
  }
};
// ---- end <distribute/core/values.hpp> ----
// ---- begin <distribute/core/context.hpp> ----
// Contexts: which strategy is current on this thread (scope), and the replica context a step
// function runs in. A thread is in cross-replica context inside a scope and outside `run`, and in
// replica context inside a step function that `run` started.

#include <array>
#include <exception>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

// ---- begin <distribute/core/detail/cross_worker.hpp> ----
// CrossWorkerLink: what a multi-worker strategy needs from the transport between its worker
// processes. The strategy layer talks to this interface only; net/ provides the TCP
// implementation (and a NCCL one can sit beside it), chosen from the cluster configuration.

#include <cstddef>
#include <vector>


DISTRIBUTE_BEGIN_NAMESPACE
namespace detail {

class CrossWorkerLink {
 public:
  virtual ~CrossWorkerLink() = default;
  virtual int num_workers() const noexcept = 0;
  virtual int worker_index() const noexcept = 0;
  /// In-place all-reduce over the workers. `op` is never Mean: callers sum and divide, since
  /// only they know the replica count to divide by.
  virtual void all_reduce(void* data, std::size_t count, DType dtype, ReduceOp op) = 0;
  /// Every worker's bytes, concatenated in worker order; `sizes[w]` = bytes from worker w.
  virtual void all_gather(const void* data, std::size_t bytes, std::vector<std::byte>& out,
                          std::vector<std::size_t>& sizes) = 0;
  /// Worker `root`'s bytes into everyone's `data`.
  virtual void broadcast(void* data, std::size_t bytes, int root) = 0;
  virtual void barrier() = 0;
};

}  // namespace detail
DISTRIBUTE_END_NAMESPACE
// ---- end <distribute/core/detail/cross_worker.hpp> ----
// ---- begin <distribute/core/detail/replica_group.hpp> ----
// ReplicaGroup: the rendezvous of the local replicas of one strategy inside one step.
//
// A collective is "publish my call, barrier, work on everybody's buffers, barrier". The barrier
// can be aborted (a replica failed) and detects a replica that returned from its step function
// while others wait, so a step can never hang on a missing participant.

#include <algorithm>
#include <atomic>
#include <functional>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <typeinfo>
#include <vector>

#include <fmt/format.h>


#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

DISTRIBUTE_BEGIN_NAMESPACE
namespace detail {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

/// A contiguous buffer of one replica as the collectives see it.
struct BufferRef {
  void* data = nullptr;
  DType dtype = DType::F32;
  Shape shape = {};
  /// Device buffers (the Thrust device system's memory) are not readable on the host: the
  /// collectives either hand them to a device library (NCCL) or copy them through `device`.
  MemorySpace memory = MemorySpace::host;
  const DeviceMemoryAccess* device = nullptr;  // set when memory == device
  std::size_t count() const { return static_cast<std::size_t>(num_elements(shape)); }
  std::size_t bytes() const { return count() * size_of(dtype); }
};

enum class CollectiveKind : std::uint8_t { AllReduce, AllGather, Broadcast, MergeCall };

constexpr std::string_view to_string(CollectiveKind k) noexcept {
  switch (k) {
    case CollectiveKind::AllReduce: return "all_reduce";
    case CollectiveKind::AllGather: return "all_gather";
    case CollectiveKind::Broadcast: return "broadcast";
    case CollectiveKind::MergeCall: return "merge_call";
  }
  return "?";
}

/// What one replica brings to a collective; the others read it between the two barriers.
struct CollectiveCall {
  CollectiveKind kind = CollectiveKind::AllReduce;
  ReduceOp op = ReduceOp::Sum;
  std::span<BufferRef> buffers = {};
  int axis = 0;
  int root = 0;
  const std::type_info* merge_type = nullptr;
  void* merge_args = nullptr;
  void* merge_outcome = nullptr;  // replica 0's result of merge_call
};

class ReplicaGroup {
 public:
  explicit ReplicaGroup(int size)
      : size_(size),
        slots_(static_cast<std::size_t>(size), nullptr),
        spin_limit_(spin_budget(size)) {}

  /// Pause iterations a waiter spins before yielding, then sleeping: a few microseconds when
  /// every replica (and the launching thread) has a core of its own, next to none otherwise,
  /// where spinning steals the core from the replica being waited for.
  static unsigned spin_budget(int threads) noexcept {
    return static_cast<unsigned>(threads) + 1 <= std::max(1u, std::thread::hardware_concurrency()) ? 2000 : 16;
  }
  static constexpr unsigned kYields = 16;

  int size() const noexcept { return size_; }

  /// Called by the launching thread while no replica runs.
  void begin_step() noexcept {
    arrived_.store(0, std::memory_order_relaxed);
    aborted_.store(false, std::memory_order_relaxed);
    first_finished_.store(-1, std::memory_order_relaxed);
    collective_failed_.store(-1, std::memory_order_relaxed);
    std::fill(slots_.begin(), slots_.end(), nullptr);
    std::atomic_thread_fence(std::memory_order_release);
  }

  /// Waits until every replica has arrived. Throws Cancelled when the step was aborted, and
  /// InvalidArgument when a replica left its step function instead of arriving.
  void arrive_and_wait(int replica, CollectiveKind what) {
    if (size_ == 1) return;
    check_alive(replica, what);
    const auto gen = generation_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == size_) {
      arrived_.store(0, std::memory_order_relaxed);
      generation_.store(gen + 1, std::memory_order_release);
      signal();
      return;
    }
    unsigned spins = 0;
    for (;;) {
      const auto s = events_.load(std::memory_order_acquire);
      if (generation_.load(std::memory_order_acquire) != gen) return;
      if (failure_pending()) {
        // The last replica may have completed this barrier and then failed or finished its
        // step between our two loads: a completed barrier wins over a later failure.
        if (generation_.load(std::memory_order_acquire) != gen) return;
        check_alive(replica, what);
      }
      if (spins < spin_limit_) {
        ++spins;
        cpu_relax();
      } else if (spins < spin_limit_ + kYields) {
        ++spins;
        std::this_thread::yield();
      } else {
        events_.wait(s, std::memory_order_acquire);
      }
    }
  }

  /// Marks the step failed and wakes every waiting replica.
  void abort() noexcept {
    aborted_.store(true, std::memory_order_release);
    signal();
  }
  bool aborted() const noexcept { return aborted_.load(std::memory_order_acquire); }

  /// A replica returned from its step function (normally or not).
  void finish(int replica) noexcept {
    int expected = -1;
    first_finished_.compare_exchange_strong(expected, replica, std::memory_order_acq_rel);
    signal();
  }

  /// A replica failed inside a collective's work; the others must not use its result.
  void mark_collective_failed(int replica) noexcept {
    int expected = -1;
    collective_failed_.compare_exchange_strong(expected, replica, std::memory_order_acq_rel);
  }
  int collective_failed_replica() const noexcept { return collective_failed_.load(std::memory_order_acquire); }

  void publish(int replica, const CollectiveCall* call) noexcept { slots_[static_cast<std::size_t>(replica)] = call; }
  const CollectiveCall& slot(int replica) const noexcept { return *slots_[static_cast<std::size_t>(replica)]; }

 private:
  void signal() noexcept {
    events_.fetch_add(1, std::memory_order_acq_rel);
    events_.notify_all();
  }

  bool failure_pending() const noexcept {
    return aborted_.load(std::memory_order_acquire) || first_finished_.load(std::memory_order_acquire) >= 0;
  }

  void check_alive(int replica, CollectiveKind what) const {
    if (aborted_.load(std::memory_order_acquire)) {
      throw Cancelled(fmt::format("replica {} left {}: another replica of this step failed", replica, to_string(what)));
    }
    if (int f = first_finished_.load(std::memory_order_acquire); f >= 0) {
      throw InvalidArgument(fmt::format(
          "replica {} returned from its step function while replica {} waits in {}: every replica must issue the "
          "same collectives in the same order",
          f, replica, to_string(what)));
    }
  }

  const int size_;
  std::vector<const CollectiveCall*> slots_;
  const unsigned spin_limit_;
  alignas(64) std::atomic<int> arrived_{0};
  alignas(64) std::atomic<std::uint32_t> generation_{0};
  alignas(64) std::atomic<std::uint32_t> events_{0};
  std::atomic<bool> aborted_{false};
  std::atomic<int> first_finished_{-1};
  std::atomic<int> collective_failed_{-1};
};

/// The collectives a strategy offers its replicas inside a step. One implementation per
/// cross-device algorithm (collective/), composed by strategies; MultiWorker wraps a local one.
class ReplicaCollectives {
 public:
  virtual ~ReplicaCollectives() = default;
  /// In-place all-reduce of `buffers` (same dtypes/shapes on every replica). Mean divides by
  /// `num_replicas_in_sync`.
  virtual void all_reduce(ReplicaGroup& group, int replica, std::span<BufferRef> buffers, ReduceOp op) = 0;
  /// Concatenation along `axis`; `allocate(shape)` returns where this replica's result goes.
  virtual void all_gather(ReplicaGroup& group, int replica, const BufferRef& input, int axis,
                          const std::function<void*(const Shape&)>& allocate) = 0;
  /// Copies root's buffer into every replica's buffer.
  virtual void broadcast(ReplicaGroup& group, int replica, BufferRef buffer, int root) = 0;
};

}  // namespace detail
DISTRIBUTE_END_NAMESPACE
// ---- end <distribute/core/detail/replica_group.hpp> ----
// ---- begin <distribute/core/detail/elementwise.hpp> ----
// Element-wise combination kernels shared by every reduction path. The op switch sits outside
// the loops so each loop is a plain vectorisable pass.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <fmt/format.h>


DISTRIBUTE_BEGIN_NAMESPACE
namespace detail {

/// acc[i] = acc[i] (op) src[i]; Mean accumulates as Sum (the division comes once, at the end).
template <class T>
void combine(T* __restrict acc, const T* __restrict src, std::size_t n, ReduceOp op) noexcept {
  if constexpr (std::is_same_v<T, bool>) {
    const bool any = op == ReduceOp::Sum || op == ReduceOp::Max || op == ReduceOp::Mean;
    if (any) {
      for (std::size_t i = 0; i < n; ++i) acc[i] = acc[i] || src[i];
    } else {
      for (std::size_t i = 0; i < n; ++i) acc[i] = acc[i] && src[i];
    }
  } else {
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Mean:
        for (std::size_t i = 0; i < n; ++i) acc[i] = static_cast<T>(acc[i] + src[i]);
        break;
      case ReduceOp::Min:
        for (std::size_t i = 0; i < n; ++i) acc[i] = std::min(acc[i], src[i]);
        break;
      case ReduceOp::Max:
        for (std::size_t i = 0; i < n; ++i) acc[i] = std::max(acc[i], src[i]);
        break;
      case ReduceOp::Product:
        for (std::size_t i = 0; i < n; ++i) acc[i] = static_cast<T>(acc[i] * src[i]);
        break;
    }
  }
}

/// acc[i] /= divisor (integer division truncates, as C++ and TF's integer mean do).
template <class T>
void divide(T* acc, std::size_t n, std::int64_t divisor) noexcept {
  if constexpr (!std::is_same_v<T, bool>) {
    const T d = static_cast<T>(divisor);
    for (std::size_t i = 0; i < n; ++i) acc[i] = static_cast<T>(acc[i] / d);
  }
}

/// Mean of booleans has no meaning; every other op is defined for every element type.
inline void check_op_for_dtype(ReduceOp op, DType dtype, const char* where) {
  if (op == ReduceOp::Mean && dtype == DType::Bool) {
    throw InvalidArgument(fmt::format("{}: MEAN is not defined for bool values", where));
  }
}

}  // namespace detail
DISTRIBUTE_END_NAMESPACE
// ---- end <distribute/core/detail/elementwise.hpp> ----

DISTRIBUTE_BEGIN_NAMESPACE

class ReplicaContext;

namespace detail {
/// How a strategy places the variables created in its scope.
enum class PlacementKind { Plain, Replicated, CentralStorage };

struct VariablePlacement {
  PlacementKind kind = PlacementKind::Plain;
  std::vector<std::string> devices;  // one per local copy
  int num_replicas_in_sync = 1;
  std::uint64_t strategy_id = 0;
  std::vector<std::string> replica_devices = {};  // CentralStorage: where the replicas compute
  CrossWorkerLink* link = nullptr;                 // multi-worker: the other workers' copies
};

inline std::uint64_t next_strategy_id() noexcept {
  static std::atomic<std::uint64_t> counter{0};
  return ++counter;
}
}  // namespace detail

/// The strategy interface every strategy type implements; what get_strategy() returns.
class AnyStrategy {
 public:
  AnyStrategy() = default;
  AnyStrategy(const AnyStrategy&) = delete;
  AnyStrategy& operator=(const AnyStrategy&) = delete;
  virtual ~AnyStrategy() = default;

  /// "MirroredStrategy", "OneDeviceStrategy", ... as in TF.
  virtual std::string_view name() const noexcept = 0;
  virtual int num_replicas_in_sync() const noexcept = 0;
  virtual int num_local_replicas() const noexcept = 0;
  /// The local replicas' devices as TF strings ("/job:localhost/replica:0/task:0/device:CPU:0").
  virtual std::vector<std::string> worker_devices() const = 0;
  /// Unique per strategy object (never reused), to tell strategies apart at run time.
  std::uint64_t id() const noexcept { return id_; }

  /// How variables created in this strategy's scope are placed.
  virtual detail::VariablePlacement variable_placement() const = 0;

  /// The concrete strategy, or nullptr if this is another type.
  template <class S>
  S* as() noexcept { return dynamic_cast<S*>(this); }
  template <class S>
  bool is() const noexcept { return dynamic_cast<const S*>(this) != nullptr; }

 private:
  std::uint64_t id_ = detail::next_strategy_id();
};

namespace detail {
/// Per-thread context: the stack of entered scopes and, on a replica thread, its replica context.
struct ThreadContext {
  std::vector<AnyStrategy*> scopes;
  ReplicaContext* replica = nullptr;
};
inline ThreadContext& thread_context() noexcept {
  static thread_local ThreadContext ctx;
  return ctx;
}

/// The strategy whose scope is innermost on this thread (or whose replica this thread runs).
AnyStrategy* current_strategy_or_null() noexcept;

/// Sets this thread's replica context for the lifetime of the guard (run, merge_call).
class ReplicaContextSwitch {
 public:
  explicit ReplicaContextSwitch(ReplicaContext* ctx) noexcept : previous_(thread_context().replica) {
    thread_context().replica = ctx;
  }
  ~ReplicaContextSwitch() { thread_context().replica = previous_; }
  ReplicaContextSwitch(const ReplicaContextSwitch&) = delete;
  ReplicaContextSwitch& operator=(const ReplicaContextSwitch&) = delete;

 private:
  ReplicaContext* previous_;
};
}  // namespace detail

/// RAII guard returned by `strategy.scope()`: makes the strategy current on this thread and
/// routes variable creation to it. Re-entering the same strategy is fine; entering a different
/// one inside it throws InvalidArgument.
class [[nodiscard]] ScopeGuard {
 public:
  explicit ScopeGuard(AnyStrategy& strategy);
  ~ScopeGuard() {
    auto& scopes = detail::thread_context().scopes;
    if (!scopes.empty()) scopes.pop_back();
  }
  ScopeGuard(const ScopeGuard&) = delete;
  ScopeGuard& operator=(const ScopeGuard&) = delete;
  ScopeGuard(ScopeGuard&&) = delete;
  ScopeGuard& operator=(ScopeGuard&&) = delete;
};

/// A reduce op given as ds::ReduceOp or as one of TF's strings ("sum", "MEAN").
struct ReduceOpArg {
  ReduceOp op;
  ReduceOpArg(ReduceOp o) noexcept : op(o) {}  // NOLINT: implicit on purpose
  ReduceOpArg(std::string_view s) : op(parse_reduce_op(s)) {}  // NOLINT
  ReduceOpArg(const char* s) : op(parse_reduce_op(s)) {}  // NOLINT
};

/// Given to a step function (as its first argument, or through get_replica_context()):
/// which replica it is, and the collectives among the replicas of the step.
class ReplicaContext {
 public:
  ReplicaContext(AnyStrategy& strategy, detail::ReplicaGroup& group, detail::ReplicaCollectives& collectives,
                 int local_replica_id, int replica_id_in_sync_group, std::string device)
      : strategy_(&strategy),
        group_(&group),
        collectives_(&collectives),
        local_id_(local_replica_id),
        global_id_(replica_id_in_sync_group),
        device_(std::move(device)) {}
  ReplicaContext(const ReplicaContext&) = delete;
  ReplicaContext& operator=(const ReplicaContext&) = delete;
  virtual ~ReplicaContext() = default;

  int replica_id_in_sync_group() const noexcept { return global_id_; }
  int num_replicas_in_sync() const noexcept { return strategy_->num_replicas_in_sync(); }
  /// This replica's index among the replicas of this process.
  int local_replica_id() const noexcept { return local_id_; }
  AnyStrategy& strategy() const noexcept { return *strategy_; }
  /// This replica's device as a TF string.
  const std::string& device() const noexcept { return device_; }

  /// Reduces each value across all replicas and returns the results (one value, or a tuple for
  /// several). All values of one call travel in one collective. Pass rvalues to reduce without a copy.
  template <class... U>
    requires(sizeof...(U) > 0 && (TensorLike<std::remove_cvref_t<U>> && ...))
  auto all_reduce(ReduceOpArg op, U&&... values) {
    std::tuple<std::remove_cvref_t<U>...> out(std::forward<U>(values)...);
    std::array<detail::BufferRef, sizeof...(U)> buffers;
    std::apply([&](auto&... v) {
      std::size_t i = 0;
      ((buffers[i++] = buffer_ref(v)), ...);
    }, out);
    for (const auto& b : buffers) detail::check_op_for_dtype(op.op, b.dtype, "all_reduce");
    collectives_->all_reduce(*group_, local_id_, buffers, op.op);
    if constexpr (sizeof...(U) == 1) {
      return std::get<0>(std::move(out));
    } else {
      return out;
    }
  }

  /// Reduces a run-time list of values (e.g. every gradient of a model) in one collective;
  /// returns them in the same order.
  template <class U>
    requires TensorLike<U>
  std::vector<U> batch_all_reduce(ReduceOpArg op, std::vector<U> values) {
    std::vector<detail::BufferRef> buffers;
    buffers.reserve(values.size());
    for (auto& v : values) buffers.push_back(buffer_ref(v));
    detail::check_op_for_dtype(op.op, dtype_of<element_t<U>>(), "batch_all_reduce");
    collectives_->all_reduce(*group_, local_id_, buffers, op.op);
    return values;
  }

  /// Concatenates every replica's value along `axis` (sizes along it may differ) on every replica.
  template <class U>
    requires TensorLike<U>
  gathered_t<U> all_gather(const U& value, int axis) {
    using G = gathered_t<U>;
    std::optional<G> result;
    auto in = buffer_ref(const_cast<U&>(value));
    auto rank = static_cast<int>(in.shape.size());
    if (axis < 0 || axis >= rank) {
      throw InvalidArgument(fmt::format("all_gather: axis {} is out of range for a value of shape {}; it must be in [0, {})",
                                        axis, shape_string(in.shape), rank));
    }
    collectives_->all_gather(*group_, local_id_, in, axis, [&](const Shape& shape) -> void* {
      result.emplace(tensor_traits<G>::make(shape));
      return tensor_traits<G>::data(*result);
    });
    return std::move(*result);
  }

  /// Every replica receives the value of replica `root` (a replica_id_in_sync_group).
  template <class U>
    requires TensorLike<U>
  U broadcast(U value, int root = 0) {
    if (root < 0 || root >= num_replicas_in_sync()) {
      throw InvalidArgument(
          fmt::format("broadcast: root {} is not a replica id (0..{})", root, num_replicas_in_sync() - 1));
    }
    collectives_->broadcast(*group_, local_id_, buffer_ref(value), root);
    return value;
  }

  /// Runs fn on replica 0 once every replica has arrived; all replicas leave together after it.
  /// (How a single shared copy is updated without racing the other replicas' reads.)
  template <class F>
  void run_once(F&& fn) {
    group_->arrive_and_wait(local_id_, detail::CollectiveKind::MergeCall);
    std::exception_ptr error;
    if (local_id_ == 0) {
      try {
        fn();
      } catch (...) {
        error = std::current_exception();
        group_->abort();
      }
    }
    group_->arrive_and_wait(local_id_, detail::CollectiveKind::MergeCall);
    if (error) std::rethrow_exception(error);
  }

  detail::ReplicaGroup& group() noexcept { return *group_; }

 protected:
  template <class U>
  static detail::BufferRef buffer_ref(U& v) {
    detail::BufferRef ref{tensor_traits<U>::data(v), dtype_of<element_t<U>>(), tensor_traits<U>::shape(v)};
    if constexpr (memory_space_v<U> == MemorySpace::device) {  // see core/memory_space.hpp
      ref.memory = MemorySpace::device;
      ref.device = detail::device_ops<U>::access();
    }
    return ref;
  }

 private:
  AnyStrategy* strategy_;
  detail::ReplicaGroup* group_;
  detail::ReplicaCollectives* collectives_;
  int local_id_;
  int global_id_;
  std::string device_;
};


namespace detail {
inline AnyStrategy* current_strategy_or_null() noexcept {
  auto& tc = thread_context();
  if (tc.replica) return &tc.replica->strategy();
  return tc.scopes.empty() ? nullptr : tc.scopes.back();
}
}  // namespace detail

inline ScopeGuard::ScopeGuard(AnyStrategy& strategy) {
  auto& tc = detail::thread_context();
  AnyStrategy* current = detail::current_strategy_or_null();
  if (current && current->id() != strategy.id()) {
    throw InvalidArgument(fmt::format(
        "cannot enter the scope of {} (strategy #{}) inside the scope of {} (strategy #{}): a thread can be in one "
        "strategy's scope at a time; leave the outer scope first",
        strategy.name(), strategy.id(), current->name(), current->id()));
  }
  tc.scopes.push_back(&strategy);
}

DISTRIBUTE_END_NAMESPACE
// ---- end <distribute/core/context.hpp> ----
// ---- begin <distribute/core/variable.hpp> ----
// Variable<T>: state that a strategy places when it is created in the strategy's scope.
//
// A Variable is a handle: copies share the same state, as Python references to a tf.Variable do.
// Placement happens once, at construction, from the scope current on this thread:
//   outside any scope         plain: one copy, safe to use from any thread
//   Mirrored/OneDevice scope  one copy per local replica (ON_WRITE: kept identical by updates;
//                             ON_READ: each replica updates its own copy, cross-replica reads aggregate)

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>


DISTRIBUTE_BEGIN_NAMESPACE

enum class VariableSynchronization { Auto, OnWrite, OnRead, None };
enum class VariableAggregation { None, Sum, Mean, OnlyFirstReplica };

constexpr std::string_view to_string(VariableSynchronization s) noexcept {
  switch (s) {
    case VariableSynchronization::Auto: return "AUTO";
    case VariableSynchronization::OnWrite: return "ON_WRITE";
    case VariableSynchronization::OnRead: return "ON_READ";
    case VariableSynchronization::None: return "NONE";
  }
  return "?";
}
constexpr std::string_view to_string(VariableAggregation a) noexcept {
  switch (a) {
    case VariableAggregation::None: return "NONE";
    case VariableAggregation::Sum: return "SUM";
    case VariableAggregation::Mean: return "MEAN";
    case VariableAggregation::OnlyFirstReplica: return "ONLY_FIRST_REPLICA";
  }
  return "?";
}

struct VariableOptions {
  std::string name = "Variable";
  /// Unset means TF's default: true, except for ON_READ variables (false).
  std::optional<bool> trainable = std::nullopt;
  VariableSynchronization synchronization = VariableSynchronization::Auto;
  VariableAggregation aggregation = VariableAggregation::None;
};

template <class T>
class Variable {
  static_assert(TensorLike<T>, "ds::Variable<T>: T needs a ds::tensor_traits specialisation (see TensorLike)");

 public:
  using value_type = T;

  /// Creates the variable; inside a strategy's scope the strategy places it.
  explicit Variable(T initial_value, VariableOptions options = {}) : state_(std::make_shared<State>()) {
    auto& s = *state_;
    s.name = std::move(options.name);
    s.aggregation = options.aggregation;
    s.synchronization = options.synchronization == VariableSynchronization::Auto ? VariableSynchronization::OnWrite
                                                                                : options.synchronization;
    s.trainable = options.trainable.value_or(s.synchronization != VariableSynchronization::OnRead);
    if (s.aggregation == VariableAggregation::Mean && !std::is_floating_point_v<element_t<T>>) {
      throw InvalidArgument(fmt::format("variable '{}': MEAN aggregation needs a floating-point variable, not {}", s.name,
                                        to_string(dtype_of<element_t<T>>())));
    }
    if (s.synchronization == VariableSynchronization::OnRead && options.trainable.value_or(false)) {
      throw InvalidArgument(fmt::format(
          "variable '{}': synchronization ON_READ is only for non-trainable variables, but trainable=true was given",
          s.name));
    }
    AnyStrategy* strategy = detail::current_strategy_or_null();
    if (strategy) {
      if (detail::thread_context().replica && strategy->num_local_replicas() > 1) {
        throw InvalidArgument(fmt::format(
            "variable '{}' created inside a step function of {}: create variables in cross-replica context "
            "(inside scope(), outside run())",
            s.name, strategy->name()));
      }
      s.placement = strategy->variable_placement();
      s.strategy_name = std::string(strategy->name());
      if (s.placement.kind == detail::PlacementKind::CentralStorage &&
          s.synchronization == VariableSynchronization::OnRead) {
        // Sync-on-read state (metrics, batch-norm statistics) stays per replica, as in TF.
        s.placement.kind = detail::PlacementKind::Replicated;
        s.placement.devices = s.placement.replica_devices;
      }
    }
    if (s.placement.kind == detail::PlacementKind::Plain) {
      s.placement.devices = {"/job:localhost/replica:0/task:0/device:CPU:0"};
    } else if (s.synchronization == VariableSynchronization::None) {
      throw InvalidArgument(fmt::format(
          "variable '{}': synchronization NONE is not supported inside the scope of {}; use AUTO, ON_WRITE or ON_READ",
          s.name, s.strategy_name));
    }
    const std::size_t copies =
        s.placement.kind == detail::PlacementKind::Replicated ? s.placement.devices.size() : std::size_t{1};
    if constexpr (memory_space_v<T> == MemorySpace::device) {  // each copy on its replica's device (backends/cuda)
      s.copies = detail::device_ops<T>::place_copies(initial_value, copies, s.placement.devices, s.placement.link);
      return;
    }
    if (s.placement.link) {
      // Every worker starts from the chief's value (workers create variables in the same order).
      auto* p = tensor_traits<T>::data(initial_value);
      s.placement.link->broadcast(p, element_count(initial_value) * sizeof(element_t<T>), 0);
    }
    s.copies.assign(copies, initial_value);
  }

  const std::string& name() const noexcept { return state_->name; }
  bool trainable() const noexcept { return state_->trainable; }
  VariableSynchronization synchronization() const noexcept { return state_->synchronization; }
  VariableAggregation aggregation() const noexcept { return state_->aggregation; }
  Shape shape() const { return shape_of(state_->copies.front()); }
  /// True when the variable was placed by a strategy (mirrored, sync-on-read, central...).
  bool is_distributed() const noexcept { return state_->placement.kind != detail::PlacementKind::Plain; }
  bool is_sync_on_read() const noexcept { return state_->synchronization == VariableSynchronization::OnRead; }
  /// Id of the strategy that placed it (0 for plain variables).
  std::uint64_t strategy_id() const noexcept { return state_->placement.strategy_id; }

  /// This replica's device in replica context, else the primary copy's.
  const std::string& device() const {
    int i = local_index();
    return state_->placement.devices[static_cast<std::size_t>(i < 0 ? 0 : i)];
  }
  const std::vector<std::string>& devices() const noexcept { return state_->placement.devices; }

  /// The per-replica copies (one for a plain variable). Read them in cross-replica context.
  const std::vector<T>& values() const noexcept { return state_->copies; }

  /// In replica context the local copy; in cross-replica context the primary copy (ON_WRITE) or
  /// the aggregate of all copies (ON_READ).
  T read_value() const {
    auto& s = *state_;
    int i = local_index();
    if (i == kPlain) {
      std::lock_guard lock(s.mutex);
      return s.copies.front();
    }
    if (i >= 0) return s.copies[static_cast<std::size_t>(i)];
    if (s.synchronization != VariableSynchronization::OnRead) return s.copies.front();
    return aggregate_copies();
  }

  void assign(const T& value) { update(Update::Assign, value); }
  void assign_add(const T& delta) { update(Update::Add, delta); }
  void assign_sub(const T& delta) { update(Update::Sub, delta); }

  /// Applies fn(copy) to the copy (or copies) the caller may change: the local copy in replica
  /// context, every copy in cross-replica context. Used by strategy.extended().update().
  template <class F>
  void apply_to_copies(F&& fn) {
    auto& s = *state_;
    int i = local_index();
    if (i == kPlain) {
      std::lock_guard lock(s.mutex);
      fn(s.copies.front(), 0);
    } else if (i >= 0) {
      fn(s.copies[static_cast<std::size_t>(i)], i);
    } else {
      for (std::size_t c = 0; c < s.copies.size(); ++c) fn(s.copies[c], static_cast<int>(c));
    }
  }

  friend bool operator==(const Variable& a, const Variable& b) noexcept { return a.state_ == b.state_; }

 private:
  enum class Update { Assign, Add, Sub };
  static constexpr int kCrossReplica = -1;
  static constexpr int kPlain = -2;

  struct State {
    std::string name;
    std::string strategy_name;
    bool trainable = true;
    VariableSynchronization synchronization = VariableSynchronization::OnWrite;
    VariableAggregation aggregation = VariableAggregation::None;
    detail::VariablePlacement placement;
    std::vector<T> copies;
    mutable std::mutex mutex;  // guards plain variables, which any thread may touch
  };

  // kPlain for plain variables, kCrossReplica outside a step, else the local replica index.
  int local_index() const {
    const auto& s = *state_;
    if (s.placement.kind == detail::PlacementKind::Plain) return kPlain;
    ReplicaContext* ctx = detail::thread_context().replica;
    if (!ctx) return kCrossReplica;
    if (ctx->strategy().id() != s.placement.strategy_id) {
      throw InvalidArgument(fmt::format("variable '{}' belongs to {} (strategy #{}) but is used in a replica of {} "
                                        "(strategy #{})",
                                        s.name, s.strategy_name, s.placement.strategy_id, ctx->strategy().name(),
                                        ctx->strategy().id()));
    }
    if (s.placement.kind != detail::PlacementKind::Replicated) return 0;
    return ctx->local_replica_id();
  }

  void check_shape(const T& value, const char* what) const {
    if (shape_of(value) != shape()) {
      throw InvalidArgument(fmt::format("{}: value of shape {} does not match variable '{}' of shape {}", what,
                                        shape_string(shape_of(value)), name(), shape_string(shape())));
    }
  }

  static void apply(Update kind, T& target, const T& value) {
    if constexpr (memory_space_v<T> == MemorySpace::device) {  // Thrust device memory (backends/cuda)
      if (kind == Update::Assign) detail::device_ops<T>::assign(target, value);
      else if (kind == Update::Add) detail::device_ops<T>::add(target, value);
      else detail::device_ops<T>::sub(target, value);
      return;
    }
    using E = element_t<T>;
    E* dst = tensor_traits<T>::data(target);
    const E* src = tensor_traits<T>::data(value);
    const std::size_t n = element_count(target);
    switch (kind) {
      case Update::Assign:
        for (std::size_t i = 0; i < n; ++i) dst[i] = src[i];
        break;
      case Update::Add:
        for (std::size_t i = 0; i < n; ++i) dst[i] = static_cast<E>(dst[i] + src[i]);
        break;
      case Update::Sub:
        for (std::size_t i = 0; i < n; ++i) dst[i] = static_cast<E>(dst[i] - src[i]);
        break;
    }
  }

  void update(Update kind, const T& value) {
    static constexpr const char* names[] = {"assign", "assign_add", "assign_sub"};
    const char* what = names[static_cast<int>(kind)];
    check_shape(value, what);
    auto& s = *state_;
    const int i = local_index();
    if (i == kPlain) {
      std::lock_guard lock(s.mutex);
      apply(kind, s.copies.front(), value);
      return;
    }
    if (i == kCrossReplica) {
      update_cross_replica(kind, value, what);
      return;
    }
    ReplicaContext& ctx = *detail::thread_context().replica;
    if (s.placement.kind == detail::PlacementKind::CentralStorage) {
      // One copy for all replicas: aggregate the replicas' values, apply once on replica 0
      // while the others wait. With NONE (or ONLY_FIRST_REPLICA) the replicas' values are
      // identical by contract (e.g. all-reduced gradients), so replica 0's is applied.
      switch (s.aggregation) {
        case VariableAggregation::Sum: {
          T sum = ctx.all_reduce(ReduceOp::Sum, value);
          ctx.run_once([&] { apply(kind, s.copies.front(), sum); });
          return;
        }
        case VariableAggregation::Mean: {
          T mean = ctx.all_reduce(ReduceOp::Mean, value);
          ctx.run_once([&] { apply(kind, s.copies.front(), mean); });
          return;
        }
        case VariableAggregation::None:
        case VariableAggregation::OnlyFirstReplica:
          ctx.run_once([&] { apply(kind, s.copies.front(), value); });
          return;
      }
    }
    auto& local = s.copies[static_cast<std::size_t>(i)];
    if (s.synchronization == VariableSynchronization::OnRead || s.aggregation == VariableAggregation::None) {
      apply(kind, local, value);  // local copy only; the caller keeps mirrored copies identical
      return;
    }
    switch (s.aggregation) {
      case VariableAggregation::Sum: apply(kind, local, ctx.all_reduce(ReduceOp::Sum, value)); break;
      case VariableAggregation::Mean: apply(kind, local, ctx.all_reduce(ReduceOp::Mean, value)); break;
      case VariableAggregation::OnlyFirstReplica: apply(kind, local, ctx.broadcast(value, 0)); break;
      case VariableAggregation::None: break;
    }
  }

  void update_cross_replica(Update kind, const T& value, const char* what) {
    auto& s = *state_;
    if (s.synchronization == VariableSynchronization::OnRead && s.aggregation == VariableAggregation::Sum) {
      if (kind != Update::Assign) {
        throw InvalidArgument(fmt::format("variable '{}': {} of a sync-on-read variable with SUM aggregation is not "
                                          "supported in cross-replica context; use assign",
                                          s.name, what));
      }
      // Each copy holds value / N so that the cross-replica sum reads back `value`.
      T share = value;
      if constexpr (memory_space_v<T> == MemorySpace::device) {  // Thrust device memory (backends/cuda)
        detail::device_ops<T>::divide(share, s.placement.num_replicas_in_sync);
        for (auto& c : s.copies) apply(kind, c, share);
        return;
      }
      using E = element_t<T>;
      E* p = tensor_traits<T>::data(share);
      const auto n = static_cast<E>(s.placement.num_replicas_in_sync);
      for (std::size_t k = 0; k < element_count(share); ++k) p[k] = static_cast<E>(p[k] / n);
      for (auto& c : s.copies) apply(kind, c, share);
      return;
    }
    for (auto& c : s.copies) apply(kind, c, value);
  }

  T aggregate_copies() const {
    const auto& s = *state_;
    switch (s.aggregation) {
      case VariableAggregation::OnlyFirstReplica: return s.copies.front();
      case VariableAggregation::None:
        throw InvalidArgument(fmt::format("variable '{}': a cross-replica read of a sync-on-read variable needs an "
                                          "aggregation (SUM, MEAN or ONLY_FIRST_REPLICA), not NONE",
                                          s.name));
      case VariableAggregation::Sum:
      case VariableAggregation::Mean: {
        if constexpr (memory_space_v<T> == MemorySpace::device) {  // Thrust device memory (backends/cuda)
          const auto op = s.aggregation == VariableAggregation::Mean ? ReduceOp::Mean : ReduceOp::Sum;
          return detail::device_ops<T>::reduce(s.copies.front(), s.copies, op, s.placement.link);
        }
        T out = s.copies.front();
        for (std::size_t c = 1; c < s.copies.size(); ++c) {
          detail::combine(tensor_traits<T>::data(out), tensor_traits<T>::data(s.copies[c]), element_count(out),
                          ReduceOp::Sum);
        }
        if (s.placement.link) {
          s.placement.link->all_reduce(tensor_traits<T>::data(out), element_count(out), dtype_of<element_t<T>>(),
                                       ReduceOp::Sum);
        }
        if (s.aggregation == VariableAggregation::Mean) {
          const auto replicas = s.placement.link ? std::int64_t{s.placement.num_replicas_in_sync}
                                                 : static_cast<std::int64_t>(s.copies.size());
          detail::divide(tensor_traits<T>::data(out), element_count(out), replicas);
        }
        return out;
      }
    }
    return s.copies.front();
  }

  std::shared_ptr<State> state_;
};

DISTRIBUTE_END_NAMESPACE
// ---- end <distribute/core/variable.hpp> ----


// ---- begin <distribute/backends/host/host.hpp> ----
// The host backend: replicas are threads on logical CPU devices "/cpu:0".."/cpu:N-1".

#include <set>
#include <string_view>
#include <string>
#include <vector>

#include <fmt/format.h>


DISTRIBUTE_BEGIN_NAMESPACE
namespace detail {

inline std::vector<std::string> host_devices(int count, const char* strategy) {
  if (count < 1) {
    throw InvalidArgument(fmt::format("{}: the number of replicas must be at least 1, got {}", strategy, count));
  }
  std::vector<std::string> out;
  for (int i = 0; i < count; ++i) out.push_back(local_device_string("CPU", i));
  return out;
}

/// Parses a user's device list for the host backend: CPU devices of this process, no duplicates.
inline std::vector<std::string> host_devices(const std::vector<std::string>& names, const char* strategy) {
  if (names.empty()) throw InvalidArgument(fmt::format("{}: the device list is empty", strategy));
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const auto& name : names) {
    DeviceSpec d = DeviceSpec::parse(name);
    if (d.device_type != "CPU") {
      throw InvalidArgument(fmt::format("{}: device '{}' is not a host device; the host backend runs on CPU devices "
                                        "(\"/cpu:0\", \"/cpu:1\", ...)",
                                        strategy, name));
    }
    if (!d.device_index) {
      throw InvalidArgument(fmt::format("{}: device '{}' names no device index", strategy, name));
    }
    if ((d.job && *d.job != "localhost") || (d.task && *d.task != 0) || (d.replica && *d.replica != 0)) {
      throw InvalidArgument(fmt::format("{}: device '{}' is not a device of this process (job localhost, task 0)",
                                        strategy, name));
    }
    auto canonical = local_device_string("CPU", *d.device_index);
    if (!seen.insert(canonical).second) {
      throw InvalidArgument(fmt::format("{}: device '{}' is listed twice", strategy, name));
    }
    out.push_back(canonical);
  }
  return out;
}

}  // namespace detail

/// Backend tag: replicas are threads of this process on logical CPU devices. A backend tag
/// names its devices and prepares a replica thread; strategies are written once over it.
struct host {
  static constexpr std::string_view name = "host";
  static constexpr std::string_view device_type = "CPU";
  /// Replica 0 runs on the thread that calls run(): nothing to bind, one hand-off fewer per step.
  static constexpr bool single_replica_on_caller_thread = true;

  /// What a strategy uses when given no devices: one CPU device.
  static std::vector<std::string> default_devices(const char* strategy) { return detail::host_devices(1, strategy); }
  static std::vector<std::string> devices(int count, const char* strategy) { return detail::host_devices(count, strategy); }
  static std::vector<std::string> devices(const std::vector<std::string>& names, const char* strategy) {
    return detail::host_devices(names, strategy);
  }
  /// Called once on each replica thread before its first step.
  static void enter_replica_thread(int /*local_replica*/, const std::string& /*device*/) noexcept {}
};

DISTRIBUTE_END_NAMESPACE
// ---- end <distribute/backends/host/host.hpp> ----
// ---- begin <distribute/backends/host/replica_threads.hpp> ----
// The replica executor of every backend: one long-lived thread per local replica. `run_all`
// hands every thread the same job and returns when all have finished it; no thread is created
// per step. A backend prepares each thread once (e.g. binds its GPU) through `on_start`.

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>


#if defined(__linux__)
#include <pthread.h>
#endif

DISTRIBUTE_BEGIN_NAMESPACE
namespace detail {

/// A non-owning reference to a callable `void(int replica)`: no allocation per step.
class ReplicaJob {
 public:
  template <class F>
  explicit ReplicaJob(F& f) noexcept
      : object_(&f), call_([](void* o, int replica) { (*static_cast<F*>(o))(replica); }) {}
  void operator()(int replica) const { call_(object_, replica); }

 private:
  void* object_;
  void (*call_)(void*, int);
};

class HostReplicaThreads {
 public:
  /// `caller_runs_first`: replica 0 runs on the thread that calls run_all (one hand-off fewer
  /// per step); the others, and all of them otherwise, on threads of their own.
  HostReplicaThreads(int count, std::function<void(int)> on_start, bool caller_runs_first = false)
      : count_(count), first_(caller_runs_first ? 1 : 0), spin_limit_(ReplicaGroup::spin_budget(count)) {
    threads_.reserve(static_cast<std::size_t>(count));
    for (int i = first_; i < count; ++i) {
      threads_.emplace_back([this, i, on_start] {
        if (on_start) on_start(i);
        loop(i);
      });
#if defined(__linux__)
      pthread_setname_np(threads_.back().native_handle(), ("ds-replica-" + std::to_string(i)).substr(0, 15).c_str());
#endif
    }
  }
  HostReplicaThreads(const HostReplicaThreads&) = delete;
  HostReplicaThreads& operator=(const HostReplicaThreads&) = delete;

  ~HostReplicaThreads() {
    stopping_.store(true, std::memory_order_release);
    epoch_.fetch_add(1, std::memory_order_acq_rel);
    epoch_.notify_all();
    for (auto& t : threads_) t.join();
  }

  int size() const noexcept { return count_; }

  /// Runs job(i) for every replica i (on its thread) and waits for all. `job` must not throw.
  void run_all(const ReplicaJob& job) noexcept {
    job_ = &job;
    remaining_.store(count_ - first_, std::memory_order_relaxed);
    epoch_.fetch_add(1, std::memory_order_acq_rel);
    epoch_.notify_all();
    if (first_ == 1) job(0);
    unsigned spins = 0;
    for (;;) {
      int left = remaining_.load(std::memory_order_acquire);
      if (left == 0) break;
      if (spins < spin_limit_) {
        ++spins;
        cpu_relax();
      } else if (spins < spin_limit_ + ReplicaGroup::kYields) {
        ++spins;
        std::this_thread::yield();
      } else {
        remaining_.wait(left, std::memory_order_acquire);
      }
    }
  }

 private:
  void loop(int replica) {
    std::uint32_t seen = 0;
    for (;;) {
      unsigned spins = 0;
      std::uint32_t e;
      while ((e = epoch_.load(std::memory_order_acquire)) == seen) {
        if (spins < spin_limit_) {
          ++spins;
          cpu_relax();
        } else if (spins < spin_limit_ + ReplicaGroup::kYields) {
          ++spins;
          std::this_thread::yield();
        } else {
          epoch_.wait(seen, std::memory_order_acquire);
        }
      }
      seen = e;
      if (stopping_.load(std::memory_order_acquire)) return;
      (*job_)(replica);
      if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) remaining_.notify_all();
    }
  }

  const int count_;
  const int first_;
  const unsigned spin_limit_;
  std::vector<std::thread> threads_;
  const ReplicaJob* job_ = nullptr;
  alignas(64) std::atomic<std::uint32_t> epoch_{0};
  alignas(64) std::atomic<int> remaining_{0};
  std::atomic<bool> stopping_{false};
};

}  // namespace detail

DISTRIBUTE_END_NAMESPACE
// ---- end <distribute/backends/host/replica_threads.hpp> ----
// ---- begin <distribute/collective/communication_options.hpp> ----
// CommunicationOptions: how a strategy's collectives travel (TF's tf.distribute.experimental.CommunicationOptions).

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>


DISTRIBUTE_BEGIN_NAMESPACE

enum class CommunicationImplementation { Auto, Ring, Nccl };

constexpr std::string_view to_string(CommunicationImplementation i) noexcept {
  switch (i) {
    case CommunicationImplementation::Auto: return "AUTO";
    case CommunicationImplementation::Ring: return "RING";
    case CommunicationImplementation::Nccl: return "NCCL";
  }
  return "?";
}

struct CommunicationOptions {
  /// Values of one all-reduce are packed into buffers of about this many bytes (TF's rule:
  /// taken in reverse order; a new pack starts once the previous exceeds it). 0: one pack.
  std::size_t bytes_per_pack = 0;
  /// A collective that has not finished after this long throws CollectiveTimeout.
  std::optional<double> timeout_seconds = std::nullopt;
  CommunicationImplementation implementation = CommunicationImplementation::Auto;
};

namespace detail {
/// What a cross-device ops policy needs to build the collectives of one strategy.
struct CollectivesConfig {
  int num_replicas_in_sync = 1;
  std::vector<std::string> devices;  // the local replicas' devices
  CommunicationOptions options;
};
}  // namespace detail

DISTRIBUTE_END_NAMESPACE
// ---- end <distribute/collective/communication_options.hpp> ----
// ---- begin <distribute/collective/shared_memory.hpp> ----
// The host default cross-device op: replicas are threads of one process, so they reduce straight
// out of each other's buffers. Replica r reduces slice r of every buffer across all replicas and
// writes the result into slice r of every replica's buffer: a reduce-scatter and an all-gather
// fused into one pass, in place, with no scratch buffer and two barriers per call.

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <string_view>
#include <span>
#include <vector>

#include <fmt/format.h>

// ---- begin <distribute/collective/detail/validate.hpp> ----
// The shape of every in-process collective: publish my call, barrier, check all calls agree,
// work on everybody's buffers, barrier. Every replica checks the published calls against
// replica 0's, so a mismatch (another op, shape, dtype or collective) fails identically on all
// of them, and no replica leaves (freeing the buffers it published) while others still read them.

#include <exception>

#include <fmt/format.h>

// ---- begin <distribute/core/detail/concat.hpp> ----
// Concatenation of row-major buffers along an axis (gather, all_gather, Sharded::to_tensor).

#include <algorithm>
#include <cstring>
#include <functional>
#include <vector>

#include <fmt/format.h>


DISTRIBUTE_BEGIN_NAMESPACE
namespace detail {

/// Checks that `parts` can be concatenated along `axis`: same dtype and rank, axis in
/// [0, rank), equal dimensions except along axis. Names the offending parts' shapes.
inline void check_concat(const std::vector<const BufferRef*>& parts, std::int64_t axis, const char* what) {
  const BufferRef& first = *parts.front();
  const auto rank = static_cast<std::int64_t>(first.shape.size());
  if (axis < 0 || axis >= rank) {
    throw InvalidArgument(fmt::format("{}: axis {} is out of range for values of shape {} (rank {}); it must be in [0, {})",
                                      what, axis, shape_string(first.shape), rank, rank));
  }
  for (std::size_t r = 1; r < parts.size(); ++r) {
    const BufferRef& p = *parts[r];
    bool ok = p.dtype == first.dtype && p.shape.size() == first.shape.size();
    for (std::size_t d = 0; ok && d < p.shape.size(); ++d) {
      if (static_cast<std::int64_t>(d) != axis && p.shape[d] != first.shape[d]) ok = false;
    }
    if (!ok) {
      throw InvalidArgument(fmt::format(
          "{}: replica 0 has a {} value of shape {} but replica {} has a {} value of shape {}; they can only differ "
          "along axis {}",
          what, to_string(first.dtype), shape_string(first.shape), r, to_string(p.dtype), shape_string(p.shape), axis));
    }
  }
}

/// Writes the concatenation of `parts` along `axis` into allocate(result_shape).
inline void concat_along_axis(const std::vector<const BufferRef*>& parts, std::size_t axis,
                              const std::function<void*(const Shape&)>& allocate) {
  Shape out_shape = parts.front()->shape;
  out_shape[axis] = 0;
  for (auto* p : parts) out_shape[axis] += p->shape[axis];
  auto* out = static_cast<std::byte*>(allocate(out_shape));
  const std::size_t elem = size_of(parts.front()->dtype);
  std::int64_t outer = 1, inner = 1;
  for (std::size_t d = 0; d < axis; ++d) outer *= out_shape[d];
  for (std::size_t d = axis + 1; d < out_shape.size(); ++d) inner *= out_shape[d];
  for (std::int64_t o = 0; o < outer; ++o) {
    for (auto* p : parts) {
      const auto run = static_cast<std::size_t>(p->shape[axis] * inner) * elem;
      if (run == 0) continue;
      std::memcpy(out, static_cast<const std::byte*>(p->data) + static_cast<std::size_t>(o) * run, run);
      out += run;
    }
  }
}

/// The concatenation along `axis` of every worker's `local` buffer (already this worker's
/// concatenation), in worker order. Shapes travel with the bytes so each worker can check
/// that the others' agree except along `axis`; on a mismatch every worker throws the same error.
struct GatheredBytes {
  std::vector<std::byte> data;
  Shape shape;
};
inline GatheredBytes gather_across_workers(CrossWorkerLink& link, const BufferRef& local, std::size_t axis,
                                           const char* what) {
  std::vector<std::byte> mine((1 + local.shape.size()) * sizeof(std::int64_t) + local.bytes());
  const auto rank = static_cast<std::int64_t>(local.shape.size());
  std::memcpy(mine.data(), &rank, sizeof rank);
  std::memcpy(mine.data() + sizeof rank, local.shape.data(), local.shape.size() * sizeof(std::int64_t));
  if (local.bytes()) {
    std::memcpy(mine.data() + (1 + local.shape.size()) * sizeof(std::int64_t), local.data, local.bytes());
  }
  std::vector<std::byte> all;
  std::vector<std::size_t> sizes;
  link.all_gather(mine.data(), mine.size(), all, sizes);
  std::vector<BufferRef> parts(sizes.size());
  std::size_t offset = 0;
  for (std::size_t w = 0; w < sizes.size(); ++w) {
    std::int64_t r = 0;
    std::memcpy(&r, all.data() + offset, sizeof r);
    Shape shape(static_cast<std::size_t>(std::max<std::int64_t>(r, 0)));
    std::memcpy(shape.data(), all.data() + offset + sizeof r, shape.size() * sizeof(std::int64_t));
    const std::size_t header = (1 + shape.size()) * sizeof(std::int64_t);
    parts[w] = BufferRef{all.data() + offset + header, local.dtype, std::move(shape)};
    offset += sizes[w];
  }
  std::vector<const BufferRef*> ptrs;
  for (auto& p : parts) ptrs.push_back(&p);
  check_concat(ptrs, static_cast<std::int64_t>(axis), what);
  GatheredBytes out;
  concat_along_axis(ptrs, axis, [&](const Shape& shape) -> void* {
    out.shape = shape;
    out.data.resize(static_cast<std::size_t>(num_elements(shape)) * size_of(local.dtype));
    return out.data.data();
  });
  return out;
}

}  // namespace detail
DISTRIBUTE_END_NAMESPACE
// ---- end <distribute/core/detail/concat.hpp> ----

DISTRIBUTE_BEGIN_NAMESPACE
namespace detail {

inline void validate_same_call(const ReplicaGroup& group) {
  const CollectiveCall& c0 = group.slot(0);
  const CollectiveKind kind = c0.kind;
  for (int r = 1; r < group.size(); ++r) {
    const CollectiveCall& c = group.slot(r);
    if (c.kind != kind) {
      throw InvalidArgument(fmt::format("replica 0 called {} but replica {} called {}: every replica must issue the "
                                        "same collectives in the same order",
                                        to_string(c0.kind), r, to_string(c.kind)));
    }
  }
  for (int r = 1; r < group.size(); ++r) {
    const CollectiveCall& c = group.slot(r);
    switch (kind) {
      case CollectiveKind::AllReduce:
        if (c.op != c0.op) {
          throw InvalidArgument(
              fmt::format("all_reduce: replica 0 reduces with {} but replica {} with {}", c0.op, r, c.op));
        }
        if (c.buffers.size() != c0.buffers.size()) {
          throw InvalidArgument(fmt::format("all_reduce: replica 0 passed {} values but replica {} passed {}",
                                            c0.buffers.size(), r, c.buffers.size()));
        }
        for (std::size_t i = 0; i < c.buffers.size(); ++i) {
          const auto& a = c0.buffers[i];
          const auto& b = c.buffers[i];
          if (a.dtype != b.dtype || a.shape != b.shape) {
            throw InvalidArgument(fmt::format(
                "all_reduce: value {} is {} of shape {} on replica 0 but {} of shape {} on replica {}", i,
                to_string(a.dtype), shape_string(a.shape), to_string(b.dtype), shape_string(b.shape), r));
          }
        }
        break;
      case CollectiveKind::AllGather: {
        if (c.axis != c0.axis) {
          throw InvalidArgument(
              fmt::format("all_gather: replica 0 gathers along axis {} but replica {} along axis {}", c0.axis, r, c.axis));
        }
        break;
      }
      case CollectiveKind::Broadcast: {
        const auto& a = c0.buffers[0];
        const auto& b = c.buffers[0];
        if (c.root != c0.root || a.dtype != b.dtype || a.shape != b.shape) {
          throw InvalidArgument(fmt::format(
              "broadcast: replica 0 passes {} of shape {} from root {} but replica {} passes {} of shape {} from root {}",
              to_string(a.dtype), shape_string(a.shape), c0.root, r, to_string(b.dtype), shape_string(b.shape), c.root));
        }
        break;
      }
      case CollectiveKind::MergeCall:
        if (c.merge_type != c0.merge_type && *c.merge_type != *c0.merge_type) {
          throw InvalidArgument(fmt::format("merge_call: replica {} passed other argument types than replica 0", r));
        }
        break;
    }
  }
  if (kind == CollectiveKind::AllGather) {
    std::vector<const BufferRef*> parts;
    for (int r = 0; r < group.size(); ++r) parts.push_back(&group.slot(r).buffers[0]);
    check_concat(parts, c0.axis, "all_gather");
  }
}

/// Publishes `call`, waits for every replica, checks the calls agree, then runs each phase on
/// every replica with a barrier after each (a phase may read what earlier phases wrote on any
/// replica). The final barrier keeps every published buffer alive until all readers are done.
/// A replica whose phase throws skips its later phases and rethrows after the last barrier;
/// the others then throw Cancelled instead of returning a half-computed result.
template <class... Phases>
void exchange(ReplicaGroup& group, int replica, const CollectiveCall& call, Phases&&... phases) {
  group.publish(replica, &call);
  group.arrive_and_wait(replica, call.kind);
  std::exception_ptr error;
  try {
    validate_same_call(group);
  } catch (...) {
    error = std::current_exception();  // every replica sees the same mismatch
  }
  auto run_phase = [&](auto& phase) {
    if (!error) {
      try {
        phase();
      } catch (...) {
        error = std::current_exception();
        group.mark_collective_failed(replica);
      }
    }
    group.arrive_and_wait(replica, call.kind);
  };
  (run_phase(phases), ...);
  if (error) std::rethrow_exception(error);
  if (int failed = group.collective_failed_replica(); failed >= 0) {
    throw Cancelled(fmt::format("replica {} left {}: replica {} failed in it", replica, to_string(call.kind), failed));
  }
}

}  // namespace detail
DISTRIBUTE_END_NAMESPACE
// ---- end <distribute/collective/detail/validate.hpp> ----

DISTRIBUTE_BEGIN_NAMESPACE

/// Cross-device ops policy: parallel reduce in shared memory (the host backend's default).
namespace detail {

// Elements per block: small enough that a block of every source stays in L2 while reduced.
inline constexpr std::size_t kReduceBlockBytes = 32 * 1024;

template <class T>
void reduce_slice_across(const ReplicaGroup& group, std::size_t buffer_index, std::size_t begin, std::size_t end,
                         ReduceOp op, std::int64_t divisor) {
  const int n = group.size();
  constexpr std::size_t block = std::max<std::size_t>(1, kReduceBlockBytes / sizeof(T));
  for (std::size_t b = begin; b < end; b += block) {
    const std::size_t len = std::min(block, end - b);
    T* acc = static_cast<T*>(group.slot(0).buffers[buffer_index].data) + b;
    for (int r = 1; r < n; ++r) {
      combine(acc, static_cast<const T*>(group.slot(r).buffers[buffer_index].data) + b, len, op);
    }
    if (op == ReduceOp::Mean && divisor > 1) divide(acc, len, divisor);
    for (int r = 1; r < n; ++r) {
      std::memcpy(static_cast<T*>(group.slot(r).buffers[buffer_index].data) + b, acc, len * sizeof(T));
    }
  }
}

/// Reduces buffer `buffer_index` of every replica in `sources` into replica `target`'s buffer
/// (element range [begin, end)); Mean divides when `divisor` > 1.
inline void reduce_into(const ReplicaGroup& group, int target, const std::vector<int>& sources, std::size_t buffer_index,
                        ReduceOp op, std::int64_t divisor) {
  const BufferRef& dst = group.slot(target).buffers[buffer_index];
  visit_dtype(dst.dtype, [&](auto t) {
    using T = decltype(t);
    T* acc = static_cast<T*>(dst.data);
    const std::size_t n = dst.count();
    for (int s : sources) {
      if (s != target) combine(acc, static_cast<const T*>(group.slot(s).buffers[buffer_index].data), n, op);
    }
    if (op == ReduceOp::Mean && divisor > 1) divide(acc, n, divisor);
  });
}

/// Copies replica `from`'s buffers into replica `to`'s.
inline void copy_buffers(const ReplicaGroup& group, int from, int to) {
  const auto& src = group.slot(from).buffers;
  const auto& dst = group.slot(to).buffers;
  for (std::size_t i = 0; i < dst.size(); ++i) {
    if (dst[i].bytes() > 0) std::memcpy(dst[i].data, src[i].data, dst[i].bytes());
  }
}

/// The shared-memory algorithms, usable by any strategy whose replicas share an address space.
class SharedMemoryCollectives : public ReplicaCollectives {
 public:
  /// `mean_divisor`: what MEAN divides by (num_replicas_in_sync; 0 leaves the sum, for callers
  /// that divide after a further cross-worker step).
  explicit SharedMemoryCollectives(std::int64_t mean_divisor) : mean_divisor_(mean_divisor) {}

  void all_reduce(ReplicaGroup& group, int replica, std::span<BufferRef> buffers, ReduceOp op) override {
    const CollectiveCall call{CollectiveKind::AllReduce, op, buffers};
    exchange(group, replica, call, [&] {
      const auto n = static_cast<std::size_t>(group.size());
      const auto r = static_cast<std::size_t>(replica);
      for (std::size_t i = 0; i < buffers.size(); ++i) {
        const std::size_t count = buffers[i].count();
        if (group.size() == 1) {
          if (op == ReduceOp::Mean && mean_divisor_ > 1) {
            visit_dtype(buffers[i].dtype, [&](auto t) {
              divide(static_cast<decltype(t)*>(buffers[i].data), count, mean_divisor_);
            });
          }
          continue;
        }
        const std::size_t begin = count * r / n, end = count * (r + 1) / n;
        if (begin == end) continue;
        visit_dtype(buffers[i].dtype,
                    [&](auto t) { reduce_slice_across<decltype(t)>(group, i, begin, end, op, mean_divisor_); });
      }
    });
  }

  void all_gather(ReplicaGroup& group, int replica, const BufferRef& input, int axis,
                  const std::function<void*(const Shape&)>& allocate) override {
    BufferRef in = input;
    const CollectiveCall call{CollectiveKind::AllGather, ReduceOp::Sum, std::span<BufferRef>(&in, 1), axis};
    exchange(group, replica, call, [&] {
      std::vector<const BufferRef*> parts;
      for (int r = 0; r < group.size(); ++r) parts.push_back(&group.slot(r).buffers[0]);
      concat_along_axis(parts, static_cast<std::size_t>(axis), allocate);
    });
  }

  void broadcast(ReplicaGroup& group, int replica, BufferRef buffer, int root) override {
    const CollectiveCall call{CollectiveKind::Broadcast, ReduceOp::Sum, std::span<BufferRef>(&buffer, 1), 0, root};
    exchange(group, replica, call, [&] {
      if (replica != root && buffer.bytes() > 0) {
        std::memcpy(buffer.data, group.slot(root).buffers[0].data, buffer.bytes());
      }
    });
  }

 protected:
  std::int64_t mean_divisor_;
};

}  // namespace detail

/// Cross-device ops policy: parallel reduce in shared memory (the host backend's default).
struct SharedMemoryAllReduce {
  static constexpr std::string_view name = "SharedMemoryAllReduce";
  static std::unique_ptr<detail::ReplicaCollectives> make_collectives(const detail::CollectivesConfig& config) {
    return std::make_unique<detail::SharedMemoryCollectives>(config.num_replicas_in_sync);
  }
};

DISTRIBUTE_END_NAMESPACE
// ---- end <distribute/collective/shared_memory.hpp> ----
// ---- begin <distribute/collective/reduction_to_one_device.hpp> ----
// ReductionToOneDevice: every replica's buffer is reduced on one device, then copied back to
// all (TF's tf.distribute.ReductionToOneDevice). Simple and serial: the reference the other
// algorithms are checked against, and the choice when one device is much faster than the rest.

#include <memory>
#include <numeric>
#include <string_view>
#include <vector>


DISTRIBUTE_BEGIN_NAMESPACE
namespace detail {

class ReductionToOneDeviceCollectives : public SharedMemoryCollectives {
 public:
  ReductionToOneDeviceCollectives(std::int64_t mean_divisor, int num_local) : SharedMemoryCollectives(mean_divisor) {
    all_.resize(static_cast<std::size_t>(num_local));
    std::iota(all_.begin(), all_.end(), 0);
  }

  void all_reduce(ReplicaGroup& group, int replica, std::span<BufferRef> buffers, ReduceOp op) override {
    const CollectiveCall call{CollectiveKind::AllReduce, op, buffers};
    constexpr int root = 0;
    exchange(
        group, replica, call,
        [&] {  // the root reduces everyone's buffers into its own
          if (replica != root) return;
          for (std::size_t i = 0; i < buffers.size(); ++i) reduce_into(group, root, all_, i, op, mean_divisor_);
        },
        [&] {  // then everyone copies the result back
          if (replica != root) copy_buffers(group, root, replica);
        });
  }

 private:
  std::vector<int> all_;
};

}  // namespace detail

/// Cross-device ops policy: reduce on the first device, then broadcast.
struct ReductionToOneDevice {
  static constexpr std::string_view name = "ReductionToOneDevice";
  static std::unique_ptr<detail::ReplicaCollectives> make_collectives(const detail::CollectivesConfig& config) {
    return std::make_unique<detail::ReductionToOneDeviceCollectives>(config.num_replicas_in_sync,
                                                                      static_cast<int>(config.devices.size()));
  }
};

DISTRIBUTE_END_NAMESPACE
// ---- end <distribute/collective/reduction_to_one_device.hpp> ----
// ---- begin <distribute/collective/hierarchical_copy.hpp> ----
// HierarchicalCopyAllReduce: a two-level tree (TF's tf.distribute.HierarchicalCopyAllReduce).
// The devices form groups; each group's leader reduces its group, the first leader reduces the
// leaders, and the result is copied back down the same tree. On a DGX-like machine the groups
// are the devices that share a fast link; here, the first and second half of the devices.

#include <algorithm>
#include <memory>
#include <string_view>
#include <vector>


DISTRIBUTE_BEGIN_NAMESPACE
namespace detail {

class HierarchicalCopyCollectives : public SharedMemoryCollectives {
 public:
  HierarchicalCopyCollectives(std::int64_t mean_divisor, int num_local, int num_groups)
      : SharedMemoryCollectives(mean_divisor) {
    num_groups = std::clamp(num_groups, 1, std::max(1, num_local));
    const int per_group = (num_local + num_groups - 1) / num_groups;
    for (int r = 0; r < num_local; ++r) {
      const int g = r / per_group;
      if (static_cast<int>(groups_.size()) <= g) {
        groups_.emplace_back();
        leaders_.push_back(r);
      }
      groups_[static_cast<std::size_t>(g)].push_back(r);
      leader_of_.push_back(leaders_[static_cast<std::size_t>(g)]);
    }
  }

  void all_reduce(ReplicaGroup& group, int replica, std::span<BufferRef> buffers, ReduceOp op) override {
    const CollectiveCall call{CollectiveKind::AllReduce, op, buffers};
    const int leader = leader_of_[static_cast<std::size_t>(replica)];
    const bool is_leader = leader == replica;
    const int root = leaders_.front();
    exchange(
        group, replica, call,
        [&] {  // 1. each leader reduces its group (leaders work in parallel)
          if (!is_leader) return;
          const auto& members = groups_[static_cast<std::size_t>(
              std::find(leaders_.begin(), leaders_.end(), replica) - leaders_.begin())];
          for (std::size_t i = 0; i < buffers.size(); ++i) reduce_into(group, replica, members, i, op, 0);
        },
        [&] {  // 2. the first leader reduces the leaders
          if (replica != root) return;
          for (std::size_t i = 0; i < buffers.size(); ++i) reduce_into(group, root, leaders_, i, op, mean_divisor_);
        },
        [&] {  // 3. the other leaders fetch the result
          if (is_leader && replica != root) copy_buffers(group, root, replica);
        },
        [&] {  // 4. members fetch it from their leader
          if (!is_leader) copy_buffers(group, leader, replica);
        });
  }

 private:
  std::vector<std::vector<int>> groups_;
  std::vector<int> leaders_;
  std::vector<int> leader_of_;
};

}  // namespace detail

/// Cross-device ops policy: reduce within groups, across group leaders, then copy back down.
/// `NumGroups` groups of consecutive devices (TF's topology for 8 GPUs is two groups of four).
template <int NumGroups = 2>
struct HierarchicalCopyAllReduceWith {
  static constexpr std::string_view name = "HierarchicalCopyAllReduce";
  static std::unique_ptr<detail::ReplicaCollectives> make_collectives(const detail::CollectivesConfig& config) {
    return std::make_unique<detail::HierarchicalCopyCollectives>(
        config.num_replicas_in_sync, static_cast<int>(config.devices.size()), NumGroups);
  }
};
using HierarchicalCopyAllReduce = HierarchicalCopyAllReduceWith<2>;

DISTRIBUTE_END_NAMESPACE
// ---- end <distribute/collective/hierarchical_copy.hpp> ----
// ---- begin <distribute/collective/packing.hpp> ----
// Packing many small tensors into few contiguous buffers, so a transport or NCCL issues one
// collective per pack instead of one per tensor. TF's rule (cross_device_utils.group_by_size):
// values are taken in reverse order (the last gradients of backprop are ready first); a new pack
// starts once the previous one exceeds bytes_per_pack; 0 means a single pack. Values of
// different element types never share a pack.

#include <cstddef>
#include <cstring>
#include <span>
#include <vector>


DISTRIBUTE_BEGIN_NAMESPACE
namespace detail {

struct Pack {
  DType dtype = DType::F32;
  std::vector<std::size_t> members;  // indices into the values, in pack order
  std::size_t count = 0;             // elements in the pack
  std::size_t bytes() const noexcept { return count * size_of(dtype); }
};

inline std::vector<Pack> make_packs(std::span<const BufferRef> values, std::size_t bytes_per_pack) {
  std::vector<Pack> packs;
  std::vector<std::size_t> open;  // per dtype: index of its current pack in `packs`, or npos
  constexpr std::size_t none = static_cast<std::size_t>(-1);
  open.assign(static_cast<std::size_t>(DType::Bool) + 1, none);
  for (std::size_t k = values.size(); k-- > 0;) {
    const BufferRef& v = values[k];
    std::size_t& current = open[static_cast<std::size_t>(v.dtype)];
    if (current == none || (bytes_per_pack > 0 && packs[current].bytes() > bytes_per_pack)) {
      current = packs.size();
      packs.push_back(Pack{v.dtype, {}, 0});
    }
    packs[current].members.push_back(k);
    packs[current].count += v.count();
  }
  return packs;
}

/// Copies the pack's members, in order, into `flat` (pack.bytes() bytes).
inline void pack_into(const Pack& pack, std::span<const BufferRef> values, std::byte* flat) {
  for (std::size_t k : pack.members) {
    const auto n = values[k].bytes();
    if (n) std::memcpy(flat, values[k].data, n);
    flat += n;
  }
}

/// Copies `flat` back out into the pack's members.
inline void unpack_from(const Pack& pack, std::span<const BufferRef> values, const std::byte* flat) {
  for (std::size_t k : pack.members) {
    const auto n = values[k].bytes();
    if (n) std::memcpy(values[k].data, flat, n);
    flat += n;
  }
}

}  // namespace detail
DISTRIBUTE_END_NAMESPACE
// ---- end <distribute/collective/packing.hpp> ----

// ---- begin <distribute/strategy/default_strategy.hpp> ----
// The default strategy (what get_strategy() returns outside any scope) and the free context
// functions: get_strategy, has_strategy, get_replica_context, in_cross_replica_context.

#include <string_view>

// ---- begin <distribute/strategy/detail/sync_strategy.hpp> ----
// SyncStrategy: the one composable core behind OneDeviceStrategy and MirroredStrategy (and,
// later, the strategies that add workers). It owns the local replicas (an executor of the
// backend, a ReplicaGroup and the cross-device ops) and implements run/reduce/gather/...
// Derived is the public strategy type: values it makes are PerReplica<T, Derived>.

#include <atomic>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include <fmt/format.h>

// ---- begin <distribute/collective/detail/device_staging.hpp> ----
// Device buffers through host-only collectives. The shared-memory family of algorithms (and the
// multi-worker one over TCP) reads and writes buffers on the host; a buffer in device memory
// (BufferRef::memory == device, see core/memory_space.hpp) reaches them as a host copy, and the
// result is copied back. A policy whose collectives take device buffers themselves (NCCL) says
// so with `static constexpr bool device_buffers = true` and is not wrapped.

#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <utility>
#include <vector>


DISTRIBUTE_BEGIN_NAMESPACE
namespace detail {

inline bool any_in_device_memory(std::span<const BufferRef> buffers) noexcept {
  for (const auto& b : buffers) {
    if (b.memory == MemorySpace::device) return true;
  }
  return false;
}

/// Host copies of a call's buffers: device buffers are copied in on construction and out by
/// copy_back(); host buffers are used in place.
class HostStaging {
 public:
  explicit HostStaging(std::span<const BufferRef> buffers, bool copy_in = true)
      : originals_(buffers.begin(), buffers.end()), staged_(originals_), storage_(originals_.size()) {
    for (std::size_t i = 0; i < originals_.size(); ++i) {
      const BufferRef& b = originals_[i];
      if (b.memory != MemorySpace::device) continue;
      storage_[i].resize(b.bytes());
      staged_[i].data = storage_[i].data();
      staged_[i].memory = MemorySpace::host;
      staged_[i].device = nullptr;
      if (copy_in) b.device->copy(storage_[i].data(), b.data, b.bytes());
    }
  }
  std::span<BufferRef> buffers() noexcept { return staged_; }
  void copy_back() const {
    for (std::size_t i = 0; i < originals_.size(); ++i) {
      const BufferRef& b = originals_[i];
      if (b.memory == MemorySpace::device) b.device->copy(b.data, storage_[i].data(), b.bytes());
    }
  }

 private:
  std::vector<BufferRef> originals_;
  std::vector<BufferRef> staged_;
  std::vector<std::vector<std::byte>> storage_;
};

/// Wraps host-only collectives so that device buffers travel through host copies.
class DeviceStagingCollectives final : public ReplicaCollectives {
 public:
  explicit DeviceStagingCollectives(std::unique_ptr<ReplicaCollectives> inner) : inner_(std::move(inner)) {}

  void all_reduce(ReplicaGroup& group, int replica, std::span<BufferRef> buffers, ReduceOp op) override {
    if (!any_in_device_memory(buffers)) return inner_->all_reduce(group, replica, buffers, op);
    HostStaging staging(buffers);
    inner_->all_reduce(group, replica, staging.buffers(), op);
    staging.copy_back();
  }

  void all_gather(ReplicaGroup& group, int replica, const BufferRef& input, int axis,
                  const std::function<void*(const Shape&)>& allocate) override {
    if (input.memory != MemorySpace::device) return inner_->all_gather(group, replica, input, axis, allocate);
    HostStaging staging(std::span<const BufferRef>(&input, 1));
    std::vector<std::byte> gathered;
    Shape shape;
    inner_->all_gather(group, replica, staging.buffers()[0], axis, [&](const Shape& s) -> void* {
      shape = s;
      gathered.resize(static_cast<std::size_t>(num_elements(s)) * size_of(input.dtype));
      return gathered.data();
    });
    // The result type's memory is the caller's business; the device copy reaches host or device.
    input.device->copy(allocate(shape), gathered.data(), gathered.size());
  }

  void broadcast(ReplicaGroup& group, int replica, BufferRef buffer, int root) override {
    if (buffer.memory != MemorySpace::device) return inner_->broadcast(group, replica, buffer, root);
    HostStaging staging(std::span<const BufferRef>(&buffer, 1));
    inner_->broadcast(group, replica, staging.buffers()[0], root);
    staging.copy_back();
  }

 private:
  std::unique_ptr<ReplicaCollectives> inner_;
};

inline std::unique_ptr<ReplicaCollectives> with_device_staging(std::unique_ptr<ReplicaCollectives> inner) {
  return std::make_unique<DeviceStagingCollectives>(std::move(inner));
}

/// The collectives of policy `Ops`, wrapped for device buffers unless Ops handles them itself.
template <class Ops>
std::unique_ptr<ReplicaCollectives> make_collectives(const CollectivesConfig& config) {
  if constexpr (requires { requires Ops::device_buffers; }) {
    return Ops::make_collectives(config);
  } else {
    return with_device_staging(Ops::make_collectives(config));
  }
}

}  // namespace detail
DISTRIBUTE_END_NAMESPACE
// ---- end <distribute/collective/detail/device_staging.hpp> ----
// ---- begin <distribute/collective/multi_worker.hpp> ----
// The collectives of a multi-worker strategy: reduce among the local replicas in shared memory,
// one cross-worker collective per pack (made by local replica 0 over the CrossWorkerLink), then
// a local copy back out. Every value crosses the process boundary once.

#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <span>
#include <vector>


DISTRIBUTE_BEGIN_NAMESPACE
namespace detail {

class MultiWorkerCollectives : public SharedMemoryCollectives {
 public:
  MultiWorkerCollectives(CrossWorkerLink& link, int num_local, int num_replicas_in_sync, const CommunicationOptions& options)
      : SharedMemoryCollectives(num_replicas_in_sync), link_(&link), bytes_per_pack_(options.bytes_per_pack) {
    local_.resize(static_cast<std::size_t>(num_local));
    std::iota(local_.begin(), local_.end(), 0);
  }

  void all_reduce(ReplicaGroup& group, int replica, std::span<BufferRef> buffers, ReduceOp op) override {
    const CollectiveCall call{CollectiveKind::AllReduce, op, buffers};
    const ReduceOp combine_op = op == ReduceOp::Mean ? ReduceOp::Sum : op;
    exchange(
        group, replica, call,
        [&] {  // local replicas into replica 0
          if (replica != 0) return;
          for (std::size_t i = 0; i < buffers.size(); ++i) reduce_into(group, 0, local_, i, combine_op, 0);
        },
        [&] {  // replica 0: across the workers, one collective per pack
          if (replica == 0) cross_worker_all_reduce(buffers, combine_op, op == ReduceOp::Mean);
        },
        [&] {  // everyone takes the result
          if (replica != 0) copy_buffers(group, 0, replica);
        });
  }

  void all_gather(ReplicaGroup& group, int replica, const BufferRef& input, int axis,
                  const std::function<void*(const Shape&)>& allocate) override {
    BufferRef in = input;
    const CollectiveCall call{CollectiveKind::AllGather, ReduceOp::Sum, std::span<BufferRef>(&in, 1), axis};
    exchange(
        group, replica, call,
        [&] {
          if (replica != 0) return;
          std::vector<const BufferRef*> parts;
          for (int r = 0; r < group.size(); ++r) parts.push_back(&group.slot(r).buffers[0]);
          std::vector<std::byte> local;
          Shape local_shape;
          concat_along_axis(parts, static_cast<std::size_t>(axis), [&](const Shape& s) -> void* {
            local_shape = s;
            local.resize(static_cast<std::size_t>(num_elements(s)) * size_of(in.dtype));
            return local.data();
          });
          gathered_ = gather_across_workers(*link_, {local.data(), in.dtype, local_shape},
                                            static_cast<std::size_t>(axis), "all_gather");
        },
        [&] {
          void* out = allocate(gathered_.shape);
          if (!gathered_.data.empty()) std::memcpy(out, gathered_.data.data(), gathered_.data.size());
        });
  }

  /// `root` is a replica_id_in_sync_group: its worker sends, every replica receives.
  void broadcast(ReplicaGroup& group, int replica, BufferRef buffer, int root) override {
    const CollectiveCall call{CollectiveKind::Broadcast, ReduceOp::Sum, std::span<BufferRef>(&buffer, 1), 0, root};
    const int root_worker = root / group.size();
    const int root_local = root % group.size();
    exchange(
        group, replica, call,
        [&] {
          if (replica != 0) return;
          if (link_->worker_index() == root_worker && root_local != 0 && buffer.bytes() > 0) {
            std::memcpy(buffer.data, group.slot(root_local).buffers[0].data, buffer.bytes());
          }
          link_->broadcast(buffer.data, buffer.bytes(), root_worker);
        },
        [&] {
          if (replica != 0 && buffer.bytes() > 0) std::memcpy(buffer.data, group.slot(0).buffers[0].data, buffer.bytes());
        });
  }

 private:
  void cross_worker_all_reduce(std::span<BufferRef> buffers, ReduceOp combine_op, bool mean) {
    for (const Pack& pack : make_packs(buffers, bytes_per_pack_)) {
      if (pack.members.size() == 1) {  // a lone value travels from its own memory, no copy
        BufferRef& b = buffers[pack.members.front()];
        link_->all_reduce(b.data, b.count(), b.dtype, combine_op);
      } else {
        scratch_.resize(pack.bytes());
        pack_into(pack, buffers, scratch_.data());
        link_->all_reduce(scratch_.data(), pack.count, pack.dtype, combine_op);
        unpack_from(pack, buffers, scratch_.data());
      }
    }
    if (!mean) return;
    for (BufferRef& b : buffers) {
      visit_dtype(b.dtype, [&](auto t) { divide(static_cast<decltype(t)*>(b.data), b.count(), mean_divisor_); });
    }
  }

  CrossWorkerLink* link_;
  std::size_t bytes_per_pack_;
  std::vector<int> local_;
  std::vector<std::byte> scratch_;  // packs of several values (used by replica 0 only)
  GatheredBytes gathered_;          // replica 0's all_gather result, read by all
};

}  // namespace detail
DISTRIBUTE_END_NAMESPACE
// ---- end <distribute/collective/multi_worker.hpp> ----
// ---- begin <distribute/strategy/detail/reduce_values.hpp> ----
// Cross-replica reduction of per-replica components on the calling thread (strategy.reduce).

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include <fmt/format.h>


DISTRIBUTE_BEGIN_NAMESPACE
namespace detail {

/// Element-wise reduction of equally shaped components (and, with a link, of every other
/// worker's); Mean divides by the total number of components.
template <TensorLike U>
U reduce_components(ReduceOp op, const std::vector<const U*>& parts, CrossWorkerLink* link = nullptr) {
  using E = element_t<U>;
  check_op_for_dtype(op, dtype_of<E>(), "reduce");
  if (parts.empty()) throw InvalidArgument("reduce: there are no values to reduce");
  const Shape shape = shape_of(*parts.front());
  for (std::size_t r = 1; r < parts.size(); ++r) {
    if (shape_of(*parts[r]) != shape) {
      throw InvalidArgument(fmt::format(
          "reduce: replica 0's value has shape {} but replica {}'s has shape {}; values of different batch sizes "
          "need an axis (reduce(op, value, 0))",
          shape_string(shape), r, shape_string(shape_of(*parts[r]))));
    }
  }
  const ReduceOp combine_op = op == ReduceOp::Mean ? ReduceOp::Sum : op;
  U out = *parts.front();
  if constexpr (memory_space_v<U> == MemorySpace::device) {  // Thrust device memory (backends/cuda)
    return device_ops<U>::reduce(std::move(out), parts, op, link);
  }
  const std::size_t n = element_count(out);
  for (std::size_t r = 1; r < parts.size(); ++r) {
    combine(tensor_traits<U>::data(out), tensor_traits<U>::data(*parts[r]), n, combine_op);
  }
  auto components = static_cast<std::int64_t>(parts.size());
  if (link) {
    link->all_reduce(tensor_traits<U>::data(out), n, dtype_of<E>(), combine_op);
    components *= link->num_workers();
  }
  if (op == ReduceOp::Mean) divide(tensor_traits<U>::data(out), n, components);
  return out;
}

/// Reduces each component along `axis` and then across components (and workers). Components
/// may differ in size along `axis` (an uneven last batch); Mean divides by the total count along it.
template <TensorLike U>
Tensor<element_t<U>> reduce_components_along(ReduceOp op, const std::vector<const U*>& parts, std::int64_t axis_arg,
                                             CrossWorkerLink* link = nullptr) {
  if constexpr (memory_space_v<U> == MemorySpace::device) {  // on host copies (backends/cuda)
    const auto host = device_ops<U>::host_copies(parts);
    return reduce_components_along(op, host.pointers(), axis_arg, link);
  }
  using E = element_t<U>;
  check_op_for_dtype(op, dtype_of<E>(), "reduce");
  if (parts.empty()) throw InvalidArgument("reduce: there are no values to reduce");
  const Shape first = shape_of(*parts.front());
  const std::size_t axis = normalize_axis(axis_arg, first.size(), "reduce");
  Shape out_shape = first;
  out_shape.erase(out_shape.begin() + static_cast<std::ptrdiff_t>(axis));
  for (std::size_t r = 1; r < parts.size(); ++r) {
    Shape s = shape_of(*parts[r]);
    bool ok = s.size() == first.size();
    for (std::size_t d = 0; ok && d < s.size(); ++d) ok = d == axis || s[d] == first[d];
    if (!ok) {
      throw InvalidArgument(fmt::format(
          "reduce: replica 0's value has shape {} but replica {}'s has shape {}; they may only differ along axis {}",
          shape_string(first), r, shape_string(s), axis));
    }
  }
  std::int64_t outer = 1, inner = 1;
  for (std::size_t d = 0; d < axis; ++d) outer *= first[d];
  for (std::size_t d = axis + 1; d < first.size(); ++d) inner *= first[d];
  const auto inner_n = static_cast<std::size_t>(inner);

  // Start from the op's identity so that a replica (or worker) with no rows changes nothing.
  const ReduceOp combine_op = op == ReduceOp::Mean ? ReduceOp::Sum : op;
  E identity{};
  if (combine_op == ReduceOp::Min) identity = std::numeric_limits<E>::max();
  if (combine_op == ReduceOp::Max) identity = std::numeric_limits<E>::lowest();
  if (combine_op == ReduceOp::Product) identity = E{1};
  Tensor<E> out = Tensor<E>::full(out_shape, identity);
  std::int64_t total = 0;
  for (const U* part : parts) {
    const std::int64_t len = shape_of(*part)[axis];
    const E* src = tensor_traits<U>::data(*part);
    for (std::int64_t o = 0; o < outer; ++o) {
      E* dst = out.data() + o * inner;
      for (std::int64_t k = 0; k < len; ++k) combine(dst, src + (o * len + k) * inner, inner_n, combine_op);
    }
    total += len;
  }
  if (link) {
    link->all_reduce(out.data(), out.size(), dtype_of<E>(), combine_op);
    link->all_reduce(&total, 1, DType::I64, ReduceOp::Sum);
  }
  if (total == 0 && (op == ReduceOp::Min || op == ReduceOp::Max || op == ReduceOp::Mean)) {
    throw InvalidArgument(fmt::format("reduce: {} along axis {} over zero elements is undefined", op, axis));
  }
  if (op == ReduceOp::Mean) divide(out.data(), out.size(), total);
  return out;
}

}  // namespace detail
DISTRIBUTE_END_NAMESPACE
// ---- end <distribute/strategy/detail/reduce_values.hpp> ----

DISTRIBUTE_BEGIN_NAMESPACE

/// What distribute_values_from_function passes to its function.
struct ValueContext {
  int replica_id_in_sync_group = 0;
  int num_replicas_in_sync = 1;
};

template <class S>
class StrategyExtended;

/// The replica context `run` hands to a step function of strategy S. Adds merge_call, whose
/// merged values are PerReplica<T, S> that S's reduce/update accept.
template <class S>
class ReplicaContextFor : public ReplicaContext {
 public:
  ReplicaContextFor(S& strategy, detail::ReplicaGroup& group, detail::ReplicaCollectives& collectives, int local_id,
                    int global_id, std::string device)
      : ReplicaContext(strategy, group, collectives, local_id, global_id, std::move(device)), typed_(&strategy) {}

  S& strategy() const noexcept { return *typed_; }

  /// Runs fn once, in cross-replica context, with each argument merged across the replicas
  /// into a PerReplica; fn may take the strategy first. Every replica receives fn's result.
  template <class F, class... A>
  auto merge_call(F&& fn, A&&... args) {
    using Args = std::tuple<std::decay_t<A>...>;
    constexpr bool takes_strategy = std::is_invocable_v<F&, S&, PerReplica<std::decay_t<A>, S>...>;
    using R = std::conditional_t<takes_strategy, std::invoke_result<F&, S&, PerReplica<std::decay_t<A>, S>...>,
                                 std::invoke_result<F&, PerReplica<std::decay_t<A>, S>...>>::type;
    using Stored = std::conditional_t<std::is_void_v<R>, bool, std::decay_t<R>>;
    struct Outcome {
      std::optional<Stored> value;
      std::exception_ptr error;
    };
    Args mine(std::forward<A>(args)...);
    Outcome outcome;
    auto& g = group();
    detail::CollectiveCall call{detail::CollectiveKind::MergeCall};
    call.merge_type = &typeid(Args);
    call.merge_args = &mine;
    call.merge_outcome = &outcome;
    // Replica 0 runs fn while the others wait in the exchange; its outcome is read after it.
    detail::exchange(g, local_replica_id(), call, [&] {
      if (local_replica_id() != 0) return;
      try {
        detail::ReplicaContextSwitch cross_replica(nullptr);
        ScopeGuard in_scope(*typed_);
        auto merged = merge_args<Args>(std::index_sequence_for<A...>{});
        auto invoke = [&](auto&&... m) -> decltype(auto) {
          if constexpr (takes_strategy) return fn(*typed_, std::move(m)...);
          else return fn(std::move(m)...);
        };
        if constexpr (std::is_void_v<R>) {
          std::apply(invoke, std::move(merged));
          outcome.value.emplace(true);
        } else {
          outcome.value.emplace(std::apply(invoke, std::move(merged)));
        }
      } catch (...) {
        outcome.error = std::current_exception();
      }
    });
    const Outcome& root = *static_cast<const Outcome*>(g.slot(0).merge_outcome);
    std::exception_ptr error = root.error;
    std::optional<Stored> result;
    if (!error) result = root.value;
    g.arrive_and_wait(local_replica_id(), call.kind);  // replica 0's outcome stays alive until read
    if (error) std::rethrow_exception(error);
    if constexpr (!std::is_void_v<R>) return std::move(*result);
  }

 private:
  template <class Args, std::size_t... I>
  auto merge_args(std::index_sequence<I...>) {
    auto& g = group();
    auto component = [&]<std::size_t K>(std::integral_constant<std::size_t, K>) {
      using T = std::tuple_element_t<K, Args>;
      std::vector<T> values;
      values.reserve(static_cast<std::size_t>(g.size()));
      for (int r = 0; r < g.size(); ++r) values.push_back(std::get<K>(*static_cast<Args*>(g.slot(r).merge_args)));
      return PerReplica<T, S>(std::move(values));
    };
    return std::make_tuple(component(std::integral_constant<std::size_t, I>{})...);
  }

  S* typed_;
};

namespace detail {

template <class R>
struct run_result {
  template <class S>
  using type = PerReplica<R, S>;
};

// Components of a PerReplica argument for replica i, a Mirrored's local copy, anything else as is.
template <class S, class A>
decltype(auto) unwrap_for_replica(A& arg, std::size_t i) {
  using D = std::remove_cvref_t<A>;
  if constexpr (is_per_replica<D>::value || is_mirrored<D>::value) {
    static_assert(std::is_same_v<typename D::strategy_type, S>,
                  "a distributed value made by one strategy type was passed to a strategy of another type; "
                  "values are tied to the strategy type that produced them");
    return arg[i];
  } else {
    return static_cast<const D&>(arg);
  }
}

template <class S, class A>
void check_arity(const A& arg, std::size_t replicas, std::size_t position) {
  using D = std::remove_cvref_t<A>;
  if constexpr (is_per_replica<D>::value || is_mirrored<D>::value) {
    if (arg.size() != replicas) {
      throw InvalidArgument(fmt::format("run: argument {} has {} components but the strategy has {} local replicas",
                                        position, arg.size(), replicas));
    }
  }
}

template <class T>
struct is_tuple : std::false_type {};
template <class... T>
struct is_tuple<std::tuple<T...>> : std::true_type {};

}  // namespace detail

template <class Derived, class Backend, class Ops>
class SyncStrategy : public AnyStrategy {
 public:
  using backend_type = Backend;
  using cross_device_ops = Ops;
  template <class T>
  using per_replica = PerReplica<T, Derived>;
  using replica_context_type = ReplicaContextFor<Derived>;

  const CommunicationOptions& communication_options() const noexcept { return options_; }

  SyncStrategy(const SyncStrategy&) = delete;
  SyncStrategy& operator=(const SyncStrategy&) = delete;

  int num_replicas_in_sync() const noexcept override { return static_cast<int>(devices_.size()) * num_workers_; }
  int num_local_replicas() const noexcept override { return static_cast<int>(devices_.size()); }
  std::vector<std::string> worker_devices() const override { return devices_; }

  detail::VariablePlacement variable_placement() const override {
    return {detail::PlacementKind::Replicated, devices_, num_replicas_in_sync(), id(), {}, link_};
  }

  /// Makes this strategy current on the calling thread until the guard is destroyed.
  [[nodiscard]] ScopeGuard scope() { return ScopeGuard(*this); }

  /// Calls fn once per local replica, concurrently, each in its replica context.
  template <class F, class... A>
  auto run(F&& fn, A&&... args) {
    const std::size_t n = devices_.size();
    std::size_t position = 0;
    (detail::check_arity<Derived>(args, n, position++), ...);
    constexpr bool plain = std::is_invocable_v<F&, decltype(detail::unwrap_for_replica<Derived>(args, 0))...>;
    constexpr bool with_ctx =
        std::is_invocable_v<F&, replica_context_type&, decltype(detail::unwrap_for_replica<Derived>(args, 0))...>;
    static_assert(plain || with_ctx,
                  "run(fn, args...): fn is not callable with the (unwrapped) arguments, with or without a "
                  "ReplicaContext& first");
    auto call = [&](std::size_t i) -> decltype(auto) {
      if constexpr (plain) return fn(detail::unwrap_for_replica<Derived>(args, i)...);
      else return fn(*contexts_[i], detail::unwrap_for_replica<Derived>(args, i)...);
    };
    using R = decltype(call(0));
    using Stored = std::conditional_t<std::is_void_v<R>, bool, std::decay_t<R>>;
    std::vector<std::optional<Stored>> results(n);
    execute([&](std::size_t i) {
      if constexpr (std::is_void_v<R>) {
        call(i);
        results[i].emplace(true);
      } else {
        results[i].emplace(call(i));
      }
    });
    if constexpr (std::is_void_v<R>) {
      return;
    } else if constexpr (detail::is_tuple<Stored>::value) {
      return split_tuple(results, std::make_index_sequence<std::tuple_size_v<Stored>>{});
    } else {
      std::vector<Stored> out;
      out.reserve(n);
      for (auto& r : results) out.push_back(std::move(*r));
      return PerReplica<Stored, Derived>(std::move(out));
    }
  }

  /// Reduces across replicas (no axis): returns a value of the component type.
  template <class V>
  auto reduce(ReduceOpArg op, const V& value) {
    if constexpr (requires { typename V::strategy_type; }) {
      static_assert(std::is_same_v<typename V::strategy_type, Derived>,
                    "reduce: this distributed value was made by a strategy of another type");
      return detail::reduce_components(op.op, pointers(value.values()), link_);
    } else if constexpr (requires { value.values(); value.read_value(); }) {
      return detail::reduce_components(op.op, pointers(value.values()), link_);  // a variable's copies
    } else {
      static_assert(TensorLike<V>, "reduce: the value is neither a distributed value of this strategy nor TensorLike");
      return reduce_plain(op.op, value);
    }
  }

  /// Reduces inside each component along `axis` and across replicas (a Tensor). With an axis,
  /// MEAN divides by the total number of elements along it, exact for uneven last batches.
  template <class V>
  auto reduce(ReduceOpArg op, const V& value, std::optional<std::int64_t> axis) {
    auto components = [&]() -> decltype(auto) {
      if constexpr (requires { typename V::strategy_type; }) {
        static_assert(std::is_same_v<typename V::strategy_type, Derived>,
                      "reduce: this distributed value was made by a strategy of another type");
        return pointers(value.values());
      } else if constexpr (requires { value.values(); value.read_value(); }) {
        return pointers(value.values());
      } else {
        static_assert(TensorLike<V>, "reduce: the value is neither a distributed value of this strategy nor TensorLike");
        return std::vector<const V*>{&value};
      }
    }();
    using U = std::remove_cvref_t<decltype(*components.front())>;
    using E = element_t<U>;
    constexpr bool distributed = requires { typename V::strategy_type; } || requires { value.read_value(); };
    if (!axis) {
      U r = [&] {
        if constexpr (distributed) return detail::reduce_components(op.op, components, link_);
        else return reduce_plain(op.op, value);
      }();
      if constexpr (memory_space_v<U> == MemorySpace::device) return detail::device_ops<U>::to_host(r);
      const E* p = tensor_traits<U>::data(r);
      return Tensor<E>(shape_of(r), std::vector<E>(p, p + element_count(r)));
    }
    if constexpr (!distributed) {
      if (op.op == ReduceOp::Sum || op.op == ReduceOp::Product) check_plain_reducible(op.op);
    }
    return detail::reduce_components_along(op.op, components, *axis, distributed ? link_ : nullptr);
  }

  /// Concatenates the components along `axis` (in [0, rank)).
  template <class V>
  auto gather(const V& value, std::int64_t axis) {
    if constexpr (requires { typename V::strategy_type; }) {
      static_assert(std::is_same_v<typename V::strategy_type, Derived>,
                    "gather: this distributed value was made by a strategy of another type");
      return gather_parts(pointers(value.values()), axis);
    } else {
      static_assert(TensorLike<V>, "gather: the value is neither a distributed value of this strategy nor TensorLike");
      std::vector<const V*> parts(devices_.size(), &value);
      return gather_parts(parts, axis);
    }
  }

  /// The local components in replica order (a single value is returned as one component).
  template <class V>
  auto local_results(const V& value) {
    if constexpr (requires { typename V::strategy_type; }) {
      static_assert(std::is_same_v<typename V::strategy_type, Derived>,
                    "local_results: this distributed value was made by a strategy of another type");
      return value.values();
    } else if constexpr (requires { value.values(); value.read_value(); }) {
      return value.values();
    } else {
      return std::vector<V>{value};
    }
  }

  /// fn(ValueContext) once per local replica → PerReplica.
  template <class F>
  auto distribute_values_from_function(F&& fn) {
    using R = std::decay_t<std::invoke_result_t<F&, const ValueContext&>>;
    std::vector<R> values;
    values.reserve(devices_.size());
    for (std::size_t i = 0; i < devices_.size(); ++i) {
      values.push_back(fn(ValueContext{contexts_[i]->replica_id_in_sync_group(), num_replicas_in_sync()}));
    }
    return PerReplica<R, Derived>(std::move(values));
  }

  StrategyExtended<Derived> extended() noexcept { return StrategyExtended<Derived>(self()); }

  /// Index of this worker process among the strategy's workers (0 = chief) and their number.
  int worker_index() const noexcept { return worker_index_; }
  int num_workers() const noexcept { return num_workers_; }

 protected:
  /// `devices`: canonical TF device strings, one per local replica. `link`: the other workers
  /// of a multi-worker strategy (outlives the strategy's base), or null.
  explicit SyncStrategy(std::vector<std::string> devices, CommunicationOptions options = {},
                        detail::CrossWorkerLink* link = nullptr)
      : devices_(std::move(devices)),
        options_(options),
        link_(link),
        num_workers_(link ? link->num_workers() : 1),
        worker_index_(link ? link->worker_index() : 0),
        group_(static_cast<int>(devices_.size())),
        collectives_(link ? detail::with_device_staging(std::make_unique<detail::MultiWorkerCollectives>(
                                *link, static_cast<int>(devices_.size()), num_replicas_in_sync(), options_))
                          : detail::make_collectives<Ops>({num_replicas_in_sync(), devices_, options_})) {
    const int local = static_cast<int>(devices_.size());
    for (int i = 0; i < local; ++i) {
      contexts_.push_back(std::make_unique<replica_context_type>(self(), group_, *collectives_, i,
                                                                 worker_index_ * local + i,
                                                                 devices_[static_cast<std::size_t>(i)]));
    }
    if (devices_.size() > 1 || !Backend::single_replica_on_caller_thread) {
      threads_ = std::make_unique<detail::HostReplicaThreads>(
          static_cast<int>(devices_.size()),
          [this](int i) { Backend::enter_replica_thread(i, devices_[static_cast<std::size_t>(i)]); },
          Backend::single_replica_on_caller_thread);
    }
  }

 protected:
  replica_context_type& replica_context(std::size_t i) noexcept { return *contexts_[i]; }

 private:
  Derived& self() noexcept { return static_cast<Derived&>(*this); }

  template <class T>
  static std::vector<const T*> pointers(const std::vector<T>& values) {
    std::vector<const T*> out;
    out.reserve(values.size());
    for (const auto& v : values) out.push_back(&v);
    return out;
  }

  void check_plain_reducible(ReduceOp op) const {
    if (num_replicas_in_sync() > 1) {
      throw InvalidArgument(fmt::format("reduce: a plain (non-distributed) value cannot be reduced with {} across {} "
                                        "replicas; pass the PerReplica value that run() returned",
                                        op, num_replicas_in_sync()));
    }
  }

  template <class U>
  U reduce_plain(ReduceOp op, const U& value) const {
    if (op == ReduceOp::Sum || op == ReduceOp::Product) check_plain_reducible(op);
    return value;
  }

  template <class U>
  auto gather_parts(const std::vector<const U*>& parts, std::int64_t axis) {
    using G = gathered_t<U>;
    std::vector<detail::BufferRef> refs;
    std::vector<const detail::BufferRef*> ptrs;
    refs.reserve(parts.size());
    for (const U* p : parts) {
      refs.push_back({const_cast<element_t<U>*>(tensor_traits<U>::data(*p)), dtype_of<element_t<U>>(), shape_of(*p)});
    }
    for (auto& r : refs) ptrs.push_back(&r);
    detail::check_concat(ptrs, axis, "gather");
    if constexpr (memory_space_v<U> == MemorySpace::device) {  // Thrust device memory (backends/cuda)
      if (!link_) return detail::device_ops<U>::template concat<G>(ptrs, static_cast<std::size_t>(axis));
      auto host = detail::device_ops<U>::host_copies(parts);  // across workers through host copies
      return detail::device_ops<U>::template from_host<G>(gather_parts(host.pointers(), axis));
    }
    std::optional<G> out;
    auto allocate = [&](const Shape& s) -> void* {
      out.emplace(tensor_traits<G>::make(s));
      return tensor_traits<G>::data(*out);
    };
    if (!link_) {
      detail::concat_along_axis(ptrs, static_cast<std::size_t>(axis), allocate);
      return std::move(*out);
    }
    std::vector<std::byte> local;
    Shape local_shape;
    detail::concat_along_axis(ptrs, static_cast<std::size_t>(axis), [&](const Shape& s) -> void* {
      local_shape = s;
      local.resize(static_cast<std::size_t>(num_elements(s)) * sizeof(element_t<U>));
      return local.data();
    });
    auto all = detail::gather_across_workers(*link_, {local.data(), dtype_of<element_t<U>>(), local_shape},
                                             static_cast<std::size_t>(axis), "gather");
    std::memcpy(allocate(all.shape), all.data.data(), all.data.size());
    return std::move(*out);
  }

  template <class Stored, std::size_t... I>
  auto split_tuple(std::vector<std::optional<Stored>>& results, std::index_sequence<I...>) {
    auto column = [&]<std::size_t K>(std::integral_constant<std::size_t, K>) {
      using T = std::tuple_element_t<K, Stored>;
      std::vector<T> values;
      values.reserve(results.size());
      for (auto& r : results) values.push_back(std::move(std::get<K>(*r)));
      return PerReplica<T, Derived>(std::move(values));
    };
    return std::make_tuple(column(std::integral_constant<std::size_t, I>{})...);
  }

  // Runs body(i) for each local replica in its replica context; rethrows the first real error.
  template <class Body>
  void execute(Body&& body) {
    auto& tc = detail::thread_context();
    if (tc.replica) {
      throw InvalidArgument(fmt::format("run() called from inside a step function of {}: steps do not nest; call "
                                        "run() in cross-replica context",
                                        tc.replica->strategy().name()));
    }
    std::lock_guard serial(run_mutex_);  // one step at a time per strategy
    const std::size_t n = devices_.size();
    errors_.assign(n, nullptr);
    error_order_.assign(n, 0);
    std::atomic<unsigned> error_counter{0};
    group_.begin_step();
    auto job = [&](int replica) {
      const auto i = static_cast<std::size_t>(replica);
      detail::ReplicaContextSwitch in_replica(contexts_[i].get());
      try {
        body(i);
      } catch (...) {
        errors_[i] = std::current_exception();
        error_order_[i] = ++error_counter;
        group_.abort();
      }
      group_.finish(replica);
    };
    if (threads_) {
      detail::ReplicaJob ref(job);
      threads_->run_all(ref);
    } else {
      job(0);
    }
    if (error_counter.load() == 0) return;
    // The earliest error that is not a replica released because of another's failure.
    std::exception_ptr first, first_any;
    unsigned best = ~0u, best_any = ~0u;
    for (std::size_t i = 0; i < n; ++i) {
      if (!errors_[i]) continue;
      if (error_order_[i] < best_any) best_any = error_order_[i], first_any = errors_[i];
      bool cancelled = false;
      try {
        std::rethrow_exception(errors_[i]);
      } catch (const Cancelled&) {
        cancelled = true;
      } catch (...) {
      }
      if (!cancelled && error_order_[i] < best) best = error_order_[i], first = errors_[i];
    }
    std::rethrow_exception(first ? first : first_any);
  }

  std::vector<std::string> devices_;
  CommunicationOptions options_;
  detail::CrossWorkerLink* link_;
  int num_workers_;
  int worker_index_;
  detail::ReplicaGroup group_;
  std::unique_ptr<detail::ReplicaCollectives> collectives_;
  std::vector<std::unique_ptr<replica_context_type>> contexts_;
  std::unique_ptr<detail::HostReplicaThreads> threads_;
  std::mutex run_mutex_;
  std::vector<std::exception_ptr> errors_;
  std::vector<unsigned> error_order_;

  template <class S>
  friend class StrategyExtended;
};

/// strategy.extended(): the lower-level members of a strategy, as TF's StrategyExtended.
template <class S>
class StrategyExtended {
 public:
  explicit StrategyExtended(S& strategy) noexcept : strategy_(&strategy) {}

  std::vector<std::string> worker_devices() const { return strategy_->worker_devices(); }

  /// True if `var` was created in this strategy's scope.
  template <class T>
  bool variable_created_in_scope(const Variable<T>& var) const noexcept {
    return var.is_distributed() && var.strategy_id() == strategy_->id();
  }

  /// Applies fn(copy, args...) to each copy of `var` in cross-replica context (with PerReplica /
  /// Mirrored arguments unwrapped per copy), or to the local copy in replica context.
  template <class T, class F, class... A>
  void update(Variable<T>& var, F&& fn, A&&... args) {
    if (var.is_distributed() && var.strategy_id() != strategy_->id()) {
      throw InvalidArgument(fmt::format("extended().update: variable '{}' was not created in this {}'s scope",
                                        var.name(), strategy_->name()));
    }
    var.apply_to_copies([&](T& copy, [[maybe_unused]] int i) {
      fn(copy, detail::unwrap_for_replica<S>(args, static_cast<std::size_t>(i))...);
    });
  }

  /// Variables created while the returned guard lives are placed with `var`. Every replica holds
  /// every variable in these strategies, so this only checks `var` belongs here.
  template <class T>
  [[nodiscard]] ScopeGuard colocate_vars_with(const Variable<T>& var) {
    if (var.is_distributed() && var.strategy_id() != strategy_->id()) {
      throw InvalidArgument(fmt::format("colocate_vars_with: variable '{}' was not created in this {}'s scope",
                                        var.name(), strategy_->name()));
    }
    return ScopeGuard(*strategy_);
  }

  /// Reduces several distributed values in one call; returns a tuple of the results.
  template <class... V>
  auto batch_reduce_to(ReduceOpArg op, const V&... values) {
    return std::make_tuple(strategy_->reduce(op, values)...);
  }

 private:
  S* strategy_;
};

DISTRIBUTE_END_NAMESPACE
// ---- end <distribute/strategy/detail/sync_strategy.hpp> ----

DISTRIBUTE_BEGIN_NAMESPACE

/// One replica on the calling thread; variables created under it are plain.
class DefaultStrategy : public SyncStrategy<DefaultStrategy, host, SharedMemoryAllReduce> {
  using Base = SyncStrategy<DefaultStrategy, host, SharedMemoryAllReduce>;

 public:
  DefaultStrategy() : Base(host::devices(1, "DefaultStrategy")) {}
  std::string_view name() const noexcept override { return "DefaultStrategy"; }
  detail::VariablePlacement variable_placement() const override {
    return {detail::PlacementKind::Plain, {}, 1, 0};
  }
  /// TF's default replica context: replica 0 of 1, in effect outside any scope.
  ReplicaContext& default_replica_context() noexcept { return replica_context(0); }
};

/// The process-wide default strategy.
inline DefaultStrategy& default_strategy() {
  static DefaultStrategy strategy;
  return strategy;
}

/// The strategy current on this thread: the innermost scope's, the one running this replica, or
/// the default strategy.
inline AnyStrategy& get_strategy() {
  if (AnyStrategy* s = detail::current_strategy_or_null()) return *s;
  return default_strategy();
}

/// True inside a (non-default) strategy's scope or step function.
inline bool has_strategy() {
  AnyStrategy* s = detail::current_strategy_or_null();
  return s != nullptr && s != static_cast<AnyStrategy*>(&default_strategy());
}

/// The replica context in a step function; null in cross-replica context (inside a scope,
/// outside run); the default replica context outside any scope.
inline ReplicaContext* get_replica_context() {
  auto& tc = detail::thread_context();
  if (tc.replica) return tc.replica;
  if (!tc.scopes.empty()) return nullptr;
  return &default_strategy().default_replica_context();
}

/// True inside a scope but outside any step function (or inside merge_call's function).
inline bool in_cross_replica_context() {
  auto& tc = detail::thread_context();
  return tc.replica == nullptr && !tc.scopes.empty();
}

DISTRIBUTE_END_NAMESPACE
// ---- end <distribute/strategy/default_strategy.hpp> ----
// ---- begin <distribute/strategy/mirrored.hpp> ----
// MirroredStrategy: synchronous data parallelism over the local devices of one process.

#include <string>
#include <string_view>
#include <vector>


DISTRIBUTE_BEGIN_NAMESPACE

/// The cross-device ops a backend uses when the strategy names none: the backend tag's own
/// choice (`Backend::default_cross_device_ops`, e.g. NcclAllReduce for ds::cuda), else shared memory.
template <class Backend>
struct default_cross_device_ops {
  using type = SharedMemoryAllReduce;
};
template <class Backend>
  requires requires { typename Backend::default_cross_device_ops; }
struct default_cross_device_ops<Backend> {
  using type = typename Backend::default_cross_device_ops;
};
template <class Backend>
using default_cross_device_ops_t = typename default_cross_device_ops<Backend>::type;

/// One replica per local device; variables mirrored on each; all-reduce with `Ops`.
template <class Backend = host, class Ops = default_cross_device_ops_t<Backend>>
class MirroredStrategy : public SyncStrategy<MirroredStrategy<Backend, Ops>, Backend, Ops> {
  using Base = SyncStrategy<MirroredStrategy<Backend, Ops>, Backend, Ops>;

 public:
  /// Every visible device of the backend (host: one CPU device; cuda: every visible GPU).
  MirroredStrategy() : Base(Backend::default_devices("MirroredStrategy")) {}
  /// The first `num_replicas` devices of the backend (host: logical CPUs "/cpu:0".."/cpu:N-1").
  explicit MirroredStrategy(int num_replicas, CommunicationOptions options = {})
      : Base(Backend::devices(num_replicas, "MirroredStrategy"), options) {}
  /// An explicit device list, e.g. {"/cpu:0", "/cpu:1"}; unknown or duplicate devices throw.
  explicit MirroredStrategy(const std::vector<std::string>& devices, CommunicationOptions options = {})
      : Base(Backend::devices(devices, "MirroredStrategy"), options) {}

  std::string_view name() const noexcept override { return "MirroredStrategy"; }
};

DISTRIBUTE_END_NAMESPACE
// ---- end <distribute/strategy/mirrored.hpp> ----
// ---- begin <distribute/strategy/one_device.hpp> ----
// OneDeviceStrategy: one replica on one device; the same program shape as the distributed ones.

#include <string>
#include <string_view>


DISTRIBUTE_BEGIN_NAMESPACE

template <class Backend = host>
class OneDeviceStrategy : public SyncStrategy<OneDeviceStrategy<Backend>, Backend, SharedMemoryAllReduce> {
  using Base = SyncStrategy<OneDeviceStrategy<Backend>, Backend, SharedMemoryAllReduce>;

 public:
  /// The backend's first device.
  OneDeviceStrategy() : Base(Backend::devices(1, "OneDeviceStrategy")) {}
  /// The device, e.g. "/cpu:0" or "/gpu:1"; variables are placed there.
  explicit OneDeviceStrategy(const std::string& device)
      : Base(Backend::devices(std::vector<std::string>{device}, "OneDeviceStrategy")) {}

  std::string_view name() const noexcept override { return "OneDeviceStrategy"; }
};

DISTRIBUTE_END_NAMESPACE
// ---- end <distribute/strategy/one_device.hpp> ----
// ---- begin <distribute/strategy/central_storage.hpp> ----
// CentralStorageStrategy: compute is replicated on the local devices, variables live once on
// the host. Replicas read the one copy; their updates are aggregated and applied once.

#include <string>
#include <string_view>
#include <vector>


DISTRIBUTE_BEGIN_NAMESPACE

template <class Backend = host, class Ops = default_cross_device_ops_t<Backend>>
class CentralStorageStrategy : public SyncStrategy<CentralStorageStrategy<Backend, Ops>, Backend, Ops> {
  using Base = SyncStrategy<CentralStorageStrategy<Backend, Ops>, Backend, Ops>;

 public:
  CentralStorageStrategy() : Base(Backend::default_devices("CentralStorageStrategy")) {}
  explicit CentralStorageStrategy(int num_replicas) : Base(Backend::devices(num_replicas, "CentralStorageStrategy")) {}
  explicit CentralStorageStrategy(const std::vector<std::string>& compute_devices)
      : Base(Backend::devices(compute_devices, "CentralStorageStrategy")) {}

  std::string_view name() const noexcept override { return "CentralStorageStrategy"; }

  /// Variables: one copy on the host CPU (with one compute device, on that device, as TF does).
  detail::VariablePlacement variable_placement() const override {
    auto replicas = this->worker_devices();
    std::vector<std::string> storage = replicas.size() == 1 ? replicas : std::vector<std::string>{local_device_string("CPU", 0)};
    return {detail::PlacementKind::CentralStorage, storage, this->num_replicas_in_sync(), this->id(), replicas};
  }
};

DISTRIBUTE_END_NAMESPACE
// ---- end <distribute/strategy/central_storage.hpp> ----

// checkpoint/ (needs Boost.JSON)
#if __has_include(<boost/json.hpp>)
// ---- begin <distribute/checkpoint/safetensors.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CHECKPOINT_SAFETENSORS_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CHECKPOINT_SAFETENSORS_HPP
// safetensors files: read, write, validate.
//
// Layout (https://github.com/huggingface/safetensors):
//   8 bytes   N, little-endian u64
//   N bytes   JSON header: {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//                           "__metadata__": {"key": "value", ...}}
//             padded with spaces so that the payload starts 8-byte aligned
//   payload   the tensors' bytes, row-major, little-endian; offsets are relative to the payload
//
// What distribute adds, inside __metadata__ (so any safetensors reader still reads the file):
//   "distribute.format": "1"
//   "distribute.crc32.<tensor>": CRC-32 (IEEE, as zlib.crc32) of that tensor's bytes, 8 hex digits
//   "distribute.header_crc32": CRC-32 of a canonical form of the header (see detail::header_digest),
//                              so that a corrupted shape, offset, name or metadata value is caught too
// A file carrying any of these must carry all of them. Files without them (written by Python's
// safetensors, say) are read with the structural checks only.
//
// Every problem is a ds::CheckpointError naming the file and, where there is one, the tensor.

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <boost/crc.hpp>
#include <boost/json.hpp>
#include <fmt/format.h>

// ---- begin <distribute/checkpoint/detail/posix_file.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CHECKPOINT_DETAIL_POSIX_FILE_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CHECKPOINT_DETAIL_POSIX_FILE_HPP
// POSIX file primitives for checkpoints: reads and writes that retry short counts and EINTR, and
// AtomicFile, the replace-on-commit protocol that keeps a crash from ever exposing a partial file:
//   write a temp file in the target's directory → fsync it → rename it over the target → fsync
//   the directory (so the rename itself survives a power loss).
// rename(2) within one directory is atomic, so a reader sees the old file or the new one, never a mix.

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include <fmt/format.h>


DISTRIBUTE_BEGIN_NAMESPACE

namespace detail {

inline std::string errno_message(int err) { return std::system_category().message(err); }

/// An owned file descriptor; closes on destruction (errors there are ignored: use close()).
class FileDescriptor {
 public:
  FileDescriptor() = default;
  explicit FileDescriptor(int fd) noexcept : fd_(fd) {}
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  FileDescriptor& operator=(FileDescriptor&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() { reset(); }

  int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }

  /// Closes and reports the error: on NFS a failed write may only surface here.
  void close(const std::filesystem::path& path) {
    if (fd_ < 0) return;
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0 && errno != EINTR) {
      throw CheckpointError(fmt::format("closing '{}' failed: {}", path.string(), errno_message(errno)));
    }
  }

 private:
  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int fd_ = -1;
};

inline FileDescriptor open_for_reading(const std::filesystem::path& path) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    throw CheckpointError(fmt::format("cannot open checkpoint file '{}': {}", path.string(), errno_message(errno)));
  }
  return FileDescriptor(fd);
}

inline std::uint64_t file_size(const FileDescriptor& fd, const std::filesystem::path& path) {
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    throw CheckpointError(fmt::format("cannot stat '{}': {}", path.string(), errno_message(errno)));
  }
  if (!S_ISREG(st.st_mode)) throw CheckpointError(fmt::format("'{}' is not a regular file", path.string()));
  return static_cast<std::uint64_t>(st.st_size);
}

/// Reads exactly `out.size()` bytes at `offset`; a short file is a CheckpointError naming `what`.
inline void read_exact(const FileDescriptor& fd, std::span<std::byte> out, std::uint64_t offset,
                       const std::filesystem::path& path, std::string_view what) {
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::pread(fd.get(), out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw CheckpointError(fmt::format("reading {} from '{}' failed: {}", what, path.string(), errno_message(errno)));
    }
    if (n == 0) {
      throw CheckpointError(fmt::format("'{}' ended after {} of the {} bytes of {}: the file is truncated",
                                        path.string(), done, out.size(), what));
    }
    done += static_cast<std::size_t>(n);
  }
}

inline void write_all(const FileDescriptor& fd, std::span<const std::byte> bytes, const std::filesystem::path& path) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd.get(), bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw CheckpointError(fmt::format("writing '{}' failed after {} bytes: {}", path.string(), done,
                                        errno_message(errno)));
    }
    done += static_cast<std::size_t>(n);
  }
}

inline void fsync_or_throw(const FileDescriptor& fd, const std::filesystem::path& path) {
  while (::fsync(fd.get()) != 0) {
    if (errno == EINTR) continue;
    throw CheckpointError(fmt::format("fsync of '{}' failed: {}", path.string(), errno_message(errno)));
  }
}

/// Makes a rename or unlink in `dir` durable. Some filesystems cannot fsync a directory (EINVAL);
/// there is nothing more to do on those.
inline void fsync_directory(const std::filesystem::path& dir) {
  const std::filesystem::path d = dir.empty() ? std::filesystem::path(".") : dir;
  FileDescriptor fd(::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd) throw CheckpointError(fmt::format("cannot open directory '{}': {}", d.string(), errno_message(errno)));
  while (::fsync(fd.get()) != 0) {
    if (errno == EINTR) continue;
    if (errno == EINVAL || errno == EROFS) return;
    throw CheckpointError(fmt::format("fsync of directory '{}' failed: {}", d.string(), errno_message(errno)));
  }
}

inline const std::string& host_name() {
  static const std::string name = [] {
    char buf[256] = {};
    if (::gethostname(buf, sizeof buf - 1) != 0) return std::string("localhost");
    std::string s(buf);
    for (char& c : s) {
      if (c == '/' || c == ' ') c = '_';
    }
    return s.empty() ? std::string("localhost") : s;
  }();
  return name;
}

// Temp files are named ".<target>.tmp.<host>.<pid>.<seq>": hidden, next to the target (rename
// must not cross filesystems), and attributable, so that leftovers of a killed writer can be
// recognised and removed without touching a live writer's file.
inline std::string temp_prefix(const std::filesystem::path& target) {
  return "." + target.filename().string() + ".tmp.";
}


/// The file name a temp file was made for, when `name` is a temp file of a writer on this host
/// whose process no longer exists (killed mid-save); nothing otherwise.
inline std::optional<std::string> stale_temp_target(const std::string& name) {
  // .<target>.tmp.<host>.<pid>.<seq>; the host and the target may contain dots, so match from the right.
  const std::string marker = ".tmp." + host_name() + ".";
  const auto seq_dot = name.rfind('.');
  if (name.size() < 2 || name.front() != '.' || seq_dot == std::string::npos || seq_dot == 0) return std::nullopt;
  const auto pid_dot = name.rfind('.', seq_dot - 1);
  if (pid_dot == std::string::npos || pid_dot + 1 < marker.size()) return std::nullopt;
  const auto marker_at = pid_dot + 1 - marker.size();
  if (marker_at < 1 || name.compare(marker_at, marker.size(), marker) != 0) return std::nullopt;
  long long pid = 0;
  const char* first = name.data() + pid_dot + 1;
  const char* last = name.data() + seq_dot;
  auto [ptr, err] = std::from_chars(first, last, pid);
  if (err != std::errc{} || ptr != last || pid <= 0) return std::nullopt;
  if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) return std::nullopt;  // alive (or not ours to judge)
  return name.substr(1, marker_at - 1);
}

/// Removes, from `dir`, the temp files of dead writers on this host whose target satisfies
/// `is_target`. Best effort: a file that cannot be removed is left alone.
template <class Pred>
void remove_stale_temp_files(const std::filesystem::path& dir, Pred&& is_target) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::directory_iterator it(dir.empty() ? fs::path(".") : dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    if (auto target = stale_temp_target(it->path().filename().string()); target && is_target(*target)) {
      std::error_code ignored;
      fs::remove(it->path(), ignored);
    }
  }
}

/// A file that appears at `target` only on commit(), complete and durable; destroyed without a
/// commit (an exception, an early return) it removes its temp file and leaves `target` as it was.
class AtomicFile {
 public:
  explicit AtomicFile(std::filesystem::path target, bool durable = true)
      : target_(std::move(target)), durable_(durable) {
    const std::string filename = target_.filename().string();
    remove_stale_temp_files(target_.parent_path(), [&](const std::string& t) { return t == filename; });
    static std::atomic<std::uint64_t> sequence{0};
    for (int attempt = 0; attempt < 100; ++attempt) {
      temp_ = target_.parent_path() / fmt::format("{}{}.{}.{}", temp_prefix(target_), host_name(),
                                                  static_cast<long long>(::getpid()), sequence.fetch_add(1));
      int fd;
      do {
        fd = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      } while (fd < 0 && errno == EINTR);
      if (fd >= 0) {
        fd_ = FileDescriptor(fd);
        return;
      }
      if (errno != EEXIST) {
        throw CheckpointError(fmt::format("cannot create a temporary file next to '{}' ({}): {}", target_.string(),
                                          temp_.string(), errno_message(errno)));
      }
    }
    throw CheckpointError(fmt::format("cannot create a unique temporary file next to '{}'", target_.string()));
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile() {
    if (!committed_) {
      fd_ = FileDescriptor();
      ::unlink(temp_.c_str());
    }
  }

  void write(std::span<const std::byte> bytes) { write_all(fd_, bytes, temp_); }

  /// fsync → close → rename over the target → fsync the directory.
  void commit() {
    if (durable_) fsync_or_throw(fd_, temp_);
    fd_.close(temp_);
    if (::rename(temp_.c_str(), target_.c_str()) != 0) {
      throw CheckpointError(fmt::format("cannot rename '{}' to '{}': {}", temp_.string(), target_.string(),
                                        errno_message(errno)));
    }
    committed_ = true;
    if (durable_) fsync_directory(target_.parent_path());
  }

  const std::filesystem::path& temp_path() const noexcept { return temp_; }

 private:
  std::filesystem::path target_;
  std::filesystem::path temp_;
  FileDescriptor fd_;
  bool durable_;
  bool committed_ = false;
};

}  // namespace detail

DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CHECKPOINT_DETAIL_POSIX_FILE_HPP
// ---- end <distribute/checkpoint/detail/posix_file.hpp> ----

static_assert(std::endian::native == std::endian::little,
              "distribute/checkpoint: safetensors payloads are little-endian; big-endian hosts are not supported");

DISTRIBUTE_BEGIN_NAMESPACE

namespace safetensors {

/// The element types of a safetensors file, spelled as in the file. F16 and BF16 have no C++
/// arithmetic type here: they are carried as raw 2-byte values (float16 / bfloat16 below).
enum class Dtype : std::uint8_t { F16, BF16, F32, F64, I8, I16, I32, I64, U8, U16, U32, U64, Bool };

inline constexpr std::array<Dtype, 13> all_dtypes = {Dtype::F16, Dtype::BF16, Dtype::F32, Dtype::F64, Dtype::I8,
                                                     Dtype::I16, Dtype::I32,  Dtype::I64, Dtype::U8,  Dtype::U16,
                                                     Dtype::U32, Dtype::U64,  Dtype::Bool};

/// "F32", "BOOL", ... as written in the header.
constexpr std::string_view to_string(Dtype d) noexcept {
  switch (d) {
    case Dtype::F16: return "F16";
    case Dtype::BF16: return "BF16";
    case Dtype::F32: return "F32";
    case Dtype::F64: return "F64";
    case Dtype::I8: return "I8";
    case Dtype::I16: return "I16";
    case Dtype::I32: return "I32";
    case Dtype::I64: return "I64";
    case Dtype::U8: return "U8";
    case Dtype::U16: return "U16";
    case Dtype::U32: return "U32";
    case Dtype::U64: return "U64";
    case Dtype::Bool: return "BOOL";
  }
  return "?";
}

constexpr std::size_t size_of(Dtype d) noexcept {
  switch (d) {
    case Dtype::I8: case Dtype::U8: case Dtype::Bool: return 1;
    case Dtype::F16: case Dtype::BF16: case Dtype::I16: case Dtype::U16: return 2;
    case Dtype::F32: case Dtype::I32: case Dtype::U32: return 4;
    case Dtype::F64: case Dtype::I64: case Dtype::U64: return 8;
  }
  return 0;
}

constexpr std::optional<Dtype> parse_dtype(std::string_view s) noexcept {
  for (Dtype d : all_dtypes) {
    if (to_string(d) == s) return d;
  }
  return std::nullopt;
}

/// The file dtype of a library element type.
constexpr Dtype from_dtype(DType d) noexcept {
  switch (d) {
    case DType::F32: return Dtype::F32;
    case DType::F64: return Dtype::F64;
    case DType::I8: return Dtype::I8;
    case DType::I16: return Dtype::I16;
    case DType::I32: return Dtype::I32;
    case DType::I64: return Dtype::I64;
    case DType::U8: return Dtype::U8;
    case DType::U16: return Dtype::U16;
    case DType::U32: return Dtype::U32;
    case DType::U64: return Dtype::U64;
    case DType::Bool: return Dtype::Bool;
  }
  return Dtype::F32;
}

/// The library element type of a file dtype; none for F16/BF16.
constexpr std::optional<DType> to_dtype(Dtype d) noexcept {
  switch (d) {
    case Dtype::F16: case Dtype::BF16: return std::nullopt;
    case Dtype::F32: return DType::F32;
    case Dtype::F64: return DType::F64;
    case Dtype::I8: return DType::I8;
    case Dtype::I16: return DType::I16;
    case Dtype::I32: return DType::I32;
    case Dtype::I64: return DType::I64;
    case Dtype::U8: return DType::U8;
    case Dtype::U16: return DType::U16;
    case Dtype::U32: return DType::U32;
    case Dtype::U64: return DType::U64;
    case Dtype::Bool: return DType::Bool;
  }
  return std::nullopt;
}

/// "F32 (float32)"; "F16" for the types with no library counterpart.
inline std::string describe(Dtype d) {
  auto lib = to_dtype(d);
  return lib ? fmt::format("{} ({})", to_string(d), distribute::to_string(*lib)) : std::string(to_string(d));
}

/// IEEE half precision, stored as its bit pattern. No arithmetic, no implicit conversion:
/// distribute moves these values, it does not compute with them.
struct float16 {
  std::uint16_t bits = 0;
  friend constexpr bool operator==(float16, float16) = default;
};
/// bfloat16 (the upper half of an IEEE float32), stored as its bit pattern.
struct bfloat16 {
  std::uint16_t bits = 0;
  friend constexpr bool operator==(bfloat16, bfloat16) = default;
};

/// An element type a safetensors tensor can be read as or written from.
template <class T>
concept StorableElement = Element<T> || std::same_as<T, float16> || std::same_as<T, bfloat16>;

template <StorableElement T>
constexpr Dtype dtype_for() noexcept {
  if constexpr (std::same_as<T, float16>) return Dtype::F16;
  else if constexpr (std::same_as<T, bfloat16>) return Dtype::BF16;
  else return from_dtype(dtype_of<T>());
}

/// Borrowed bytes of one tensor to write: the caller keeps them alive during the write.
struct TensorView {
  Dtype dtype = Dtype::F32;
  Shape shape;
  std::span<const std::byte> bytes;

  /// A view of `data` (row-major) as a tensor of `shape`; the element count must match.
  template <StorableElement T>
  static TensorView of(Shape shape, std::span<const T> data) {
    for (auto d : shape) {
      if (d < 0) throw InvalidArgument(fmt::format("safetensors: negative dimension in shape {}", shape_string(shape)));
    }
    if (num_elements(shape) != static_cast<std::int64_t>(data.size())) {
      throw InvalidArgument(fmt::format("safetensors: shape {} holds {} elements but {} were given",
                                        shape_string(shape), num_elements(shape), data.size()));
    }
    return TensorView{dtype_for<T>(), std::move(shape), std::as_bytes(data)};
  }
};

/// A view of any host TensorLike value (a scalar, std::vector, ds::Tensor, a user type...).
template <TensorLike U>
TensorView view_of(const U& value) {
  static_assert(memory_space_v<U> == MemorySpace::host,
                "safetensors::view_of: the value lives in device memory; copy it to the host first");
  using E = element_t<U>;
  return TensorView{dtype_for<E>(), shape_of(value),
                    std::as_bytes(std::span<const E>(tensor_traits<U>::data(value), element_count(value)))};
}

/// One tensor read from a file (owns its bytes).
struct StoredTensor {
  std::string name;
  Dtype dtype = Dtype::F32;
  Shape shape;
  std::vector<std::byte> bytes;

  std::int64_t num_elements() const { return distribute::num_elements(shape); }
  TensorView view() const { return TensorView{dtype, shape, bytes}; }

  /// The elements as T, which must be exactly the stored dtype: F16 is not read as float, nor
  /// I32 as I64 (a silent conversion would hide a mismatch between a file and its reader).
  template <StorableElement T>
  std::vector<T> values() const {
    check_dtype(dtype_for<T>());
    const std::size_t n = bytes.size() / sizeof(T);
    if constexpr (std::is_same_v<T, bool>) {
      std::vector<bool> out(n);
      for (std::size_t i = 0; i < n; ++i) out[i] = bytes[i] != std::byte{0};
      return out;
    } else {
      std::vector<T> out(n);
      if (n) std::memcpy(out.data(), bytes.data(), bytes.size());
      return out;
    }
  }

  /// The tensor as a ds::Tensor<T> (T exactly the stored dtype).
  template <Element T>
    requires(!std::is_same_v<T, bool>)
  Tensor<T> to_tensor() const {
    return Tensor<T>(shape, values<T>());
  }

  void check_dtype(Dtype wanted) const {
    if (wanted != dtype) {
      throw CheckpointError(fmt::format("tensor '{}' has dtype {} and cannot be read as {}; distribute does not "
                                        "convert between element types",
                                        name, describe(dtype), describe(wanted)));
    }
  }
};

using Metadata = std::map<std::string, std::string, std::less<>>;

/// The contents of a safetensors file.
struct File {
  /// The path it was read from, or the name given to parse().
  std::string origin;
  /// In payload order.
  std::vector<StoredTensor> tensors;
  Metadata metadata;

  const StoredTensor* find(std::string_view name) const {
    for (const auto& t : tensors) {
      if (t.name == name) return &t;
    }
    return nullptr;
  }
  const StoredTensor& at(std::string_view name) const {
    if (const StoredTensor* t = find(name)) return *t;
    std::string names;
    for (std::size_t i = 0; i < tensors.size() && i < 20; ++i) names += fmt::format("{}'{}'", i ? ", " : "", tensors[i].name);
    if (tensors.size() > 20) names += fmt::format(", ... ({} in all)", tensors.size());
    throw CheckpointError(fmt::format("'{}' has no tensor '{}' (it has: {})", origin, name,
                                      tensors.empty() ? std::string("none") : names));
  }
};

/// Tensors to write, by name.
using TensorMap = std::map<std::string, TensorView, std::less<>>;

struct WriteOptions {
  /// fsync the file and its directory before returning (off only for scratch files).
  bool durable = true;
  /// Called after each chunk written: (bytes written so far, total bytes).
  std::function<void(std::uint64_t, std::uint64_t)> on_progress;
};

struct ReadOptions {
  /// Verify distribute's CRC-32s when the file has them.
  bool verify_checksums = true;
};

namespace detail {

inline constexpr std::string_view kFormatKey = "distribute.format";
inline constexpr std::string_view kFormatVersion = "1";
inline constexpr std::string_view kHeaderCrcKey = "distribute.header_crc32";
inline constexpr std::string_view kTensorCrcPrefix = "distribute.crc32.";
inline constexpr std::string_view kMetadataKey = "__metadata__";
// The Rust reference implementation refuses larger headers too; it bounds what a corrupted
// length prefix can make us allocate.
inline constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;
inline constexpr std::size_t kWriteChunk = std::size_t{4} << 20;

inline std::uint32_t crc32(std::span<const std::byte> bytes) {
  boost::crc_32_type crc;
  crc.process_bytes(bytes.data(), bytes.size());
  return crc.checksum();
}
inline std::string crc_hex(std::uint32_t crc) { return fmt::format("{:08x}", crc); }

inline bool is_reserved_key(std::string_view key) {
  return key == kFormatKey || key == kHeaderCrcKey || key.substr(0, kTensorCrcPrefix.size()) == kTensorCrcPrefix;
}

struct Entry {
  std::string name;
  Dtype dtype = Dtype::F32;
  Shape shape;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
};

// The header's meaning in a canonical form: tensors by name, then metadata by key (without the
// header checksum itself). The JSON text is not hashed, so formatting and key order are free.
//   "T" name NUL dtype NUL dims,joined,by,commas NUL begin NUL end "\n"
//   "M" key NUL value "\n"
inline std::uint32_t header_digest(std::vector<const Entry*> entries, const Metadata& metadata) {
  std::sort(entries.begin(), entries.end(), [](const Entry* a, const Entry* b) { return a->name < b->name; });
  std::string text;
  for (const Entry* e : entries) {
    text += 'T';
    text += e->name;
    text += '\0';
    text += to_string(e->dtype);
    text += '\0';
    text += fmt::format("{}", fmt::join(e->shape, ","));
    text += '\0';
    text += fmt::format("{}", e->begin);
    text += '\0';
    text += fmt::format("{}\n", e->end);
  }
  for (const auto& [key, value] : metadata) {
    if (key == kHeaderCrcKey) continue;
    text += 'M';
    text += key;
    text += '\0';
    text += value;
    text += '\n';
  }
  return crc32(std::as_bytes(std::span(text.data(), text.size())));
}

inline std::uint64_t checked_size(const std::string& origin, const Entry& e) {
  std::uint64_t n = size_of(e.dtype);
  for (auto d : e.shape) {
    if (__builtin_mul_overflow(n, static_cast<std::uint64_t>(d), &n)) {
      throw CheckpointError(fmt::format("'{}': tensor '{}' has shape {}, whose byte size overflows 64 bits", origin,
                                        e.name, shape_string(e.shape)));
    }
  }
  return n;
}

inline std::uint64_t json_unsigned(const boost::json::value& v, const std::string& origin, const std::string& name,
                                   const char* field) {
  if (v.is_uint64()) return v.get_uint64();
  if (v.is_int64() && v.get_int64() >= 0) return static_cast<std::uint64_t>(v.get_int64());
  throw CheckpointError(fmt::format("'{}': tensor '{}': {} must hold non-negative integers, not {}", origin, name, field,
                                    boost::json::serialize(v)));
}

// A parsed and validated header: entries in payload order, the metadata, and whether the file
// carries distribute's checksums.
struct Header {
  std::vector<Entry> entries;  // in payload order
  Metadata metadata;
  bool has_checksums = false;
};

inline Header parse_header(std::string_view json, std::uint64_t payload_size, const std::string& origin) {
  if (json.empty() || json.front() != '{') {
    throw CheckpointError(fmt::format("'{}': the header does not start with '{{': not a safetensors file, or a "
                                      "corrupted one",
                                      origin));
  }
  boost::system::error_code ec;
  boost::json::value root = boost::json::parse(json, ec);
  if (ec) {
    throw CheckpointError(fmt::format("'{}': the JSON header ({} bytes) is invalid: {}", origin, json.size(),
                                      ec.message()));
  }
  if (!root.is_object()) throw CheckpointError(fmt::format("'{}': the JSON header is not an object", origin));

  Header h;
  for (const auto& kv : root.get_object()) {
    const std::string name(kv.key());
    const boost::json::value& v = kv.value();
    if (name == kMetadataKey) {
      if (!v.is_object()) {
        throw CheckpointError(fmt::format("'{}': __metadata__ must be an object of strings, not {}", origin,
                                          boost::json::serialize(v)));
      }
      for (const auto& m : v.get_object()) {
        if (!m.value().is_string()) {
          throw CheckpointError(fmt::format("'{}': __metadata__ value of '{}' must be a string, not {}", origin,
                                            std::string_view(m.key()), boost::json::serialize(m.value())));
        }
        h.metadata.emplace(std::string(m.key()), std::string(m.value().get_string()));
      }
      continue;
    }
    if (!v.is_object()) {
      throw CheckpointError(fmt::format("'{}': tensor '{}' must be described by an object, not {}", origin, name,
                                        boost::json::serialize(v)));
    }
    const auto& obj = v.get_object();
    Entry e;
    e.name = name;
    const boost::json::value* dtype = obj.if_contains("dtype");
    const boost::json::value* shape = obj.if_contains("shape");
    const boost::json::value* offsets = obj.if_contains("data_offsets");
    if (!dtype || !shape || !offsets) {
      throw CheckpointError(fmt::format("'{}': tensor '{}' lacks {}", origin, name,
                                        !dtype ? "\"dtype\"" : !shape ? "\"shape\"" : "\"data_offsets\""));
    }
    for (const auto& field : obj) {
      if (field.key() != "dtype" && field.key() != "shape" && field.key() != "data_offsets") {
        throw CheckpointError(fmt::format("'{}': tensor '{}' has an unknown field \"{}\"", origin, name,
                                          std::string_view(field.key())));
      }
    }
    if (!dtype->is_string()) {
      throw CheckpointError(fmt::format("'{}': tensor '{}': dtype must be a string, not {}", origin, name,
                                        boost::json::serialize(*dtype)));
    }
    auto d = parse_dtype(dtype->get_string());
    if (!d) {
      throw CheckpointError(fmt::format("'{}': tensor '{}' has dtype \"{}\", which distribute does not know (known: "
                                        "F16, BF16, F32, F64, I8, I16, I32, I64, U8, U16, U32, U64, BOOL)",
                                        origin, name, std::string_view(dtype->get_string())));
    }
    e.dtype = *d;
    if (!shape->is_array()) {
      throw CheckpointError(fmt::format("'{}': tensor '{}': shape must be an array, not {}", origin, name,
                                        boost::json::serialize(*shape)));
    }
    for (const auto& dim : shape->get_array()) {
      const std::uint64_t u = json_unsigned(dim, origin, name, "shape");
      if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
        throw CheckpointError(fmt::format("'{}': tensor '{}': dimension {} is too large", origin, name, u));
      }
      e.shape.push_back(static_cast<std::int64_t>(u));
    }
    if (!offsets->is_array() || offsets->get_array().size() != 2) {
      throw CheckpointError(fmt::format("'{}': tensor '{}': data_offsets must be [begin, end], not {}", origin, name,
                                        boost::json::serialize(*offsets)));
    }
    e.begin = json_unsigned(offsets->get_array()[0], origin, name, "data_offsets");
    e.end = json_unsigned(offsets->get_array()[1], origin, name, "data_offsets");
    if (e.begin > e.end) {
      throw CheckpointError(fmt::format("'{}': tensor '{}' has data_offsets [{}, {}]: begin is after end", origin,
                                        name, e.begin, e.end));
    }
    const std::uint64_t expected = checked_size(origin, e);
    if (e.end - e.begin != expected) {
      throw CheckpointError(fmt::format("'{}': tensor '{}' of dtype {} and shape {} needs {} bytes, but its "
                                        "data_offsets [{}, {}] span {}",
                                        origin, name, to_string(e.dtype), shape_string(e.shape), expected, e.begin,
                                        e.end, e.end - e.begin));
    }
    if (e.end > payload_size) {
      throw CheckpointError(fmt::format("'{}': tensor '{}' has data_offsets [{}, {}] but the payload holds only {} "
                                        "bytes: the file is truncated or the offsets are corrupted",
                                        origin, name, e.begin, e.end, payload_size));
    }
    h.entries.push_back(std::move(e));
  }

  // The tensors must tile the payload exactly: no overlap (two tensors aliasing bytes), no gap
  // (bytes nobody owns), nothing after the last one.
  std::sort(h.entries.begin(), h.entries.end(),
            [](const Entry& a, const Entry& b) { return std::tie(a.begin, a.end) < std::tie(b.begin, b.end); });
  std::uint64_t cursor = 0;
  const Entry* previous = nullptr;
  for (const Entry& e : h.entries) {
    if (e.begin != cursor) {
      if (previous) {
        throw CheckpointError(fmt::format("'{}': tensor '{}' (data_offsets [{}, {}]) {} tensor '{}' (data_offsets "
                                          "[{}, {}]); tensors must be contiguous and must not overlap",
                                          origin, e.name, e.begin, e.end,
                                          e.begin < cursor ? "overlaps" : "leaves a gap after", previous->name,
                                          previous->begin, previous->end));
      }
      throw CheckpointError(fmt::format("'{}': the first tensor '{}' starts at payload byte {}, not 0", origin, e.name,
                                        e.begin));
    }
    cursor = e.end;
    previous = &e;
  }
  if (cursor != payload_size) {
    throw CheckpointError(fmt::format("'{}': the tensors cover {} bytes but the payload has {}: the file has "
                                      "trailing bytes or its header length is corrupted",
                                      origin, cursor, payload_size));
  }

  // distribute's checksums: all or nothing, so that corrupting one key cannot switch them off.
  bool any = false;
  for (const auto& [key, value] : h.metadata) any = any || is_reserved_key(key);
  h.has_checksums = any;
  if (any) {
    auto need = [&](std::string_view key) -> const std::string& {
      auto it = h.metadata.find(key);
      if (it == h.metadata.end()) {
        throw CheckpointError(fmt::format("'{}': __metadata__ has distribute checksums but lacks \"{}\": the header "
                                          "is corrupted",
                                          origin, key));
      }
      return it->second;
    };
    if (need(kFormatKey) != kFormatVersion) {
      throw CheckpointError(fmt::format("'{}': distribute.format is \"{}\"; this version reads format {}", origin,
                                        need(kFormatKey), kFormatVersion));
    }
    std::vector<const Entry*> all;
    for (const Entry& e : h.entries) {
      all.push_back(&e);
      need(fmt::format("{}{}", kTensorCrcPrefix, e.name));
    }
    for (const auto& [key, value] : h.metadata) {
      if (key.rfind(kTensorCrcPrefix, 0) == 0) {
        const std::string tensor = key.substr(kTensorCrcPrefix.size());
        if (std::none_of(h.entries.begin(), h.entries.end(), [&](const Entry& e) { return e.name == tensor; })) {
          throw CheckpointError(fmt::format("'{}': __metadata__ has a checksum for tensor '{}', which the header "
                                            "does not list: the header is corrupted",
                                            origin, tensor));
        }
      }
    }
    const std::string stored = need(kHeaderCrcKey);
    const std::string computed = crc_hex(header_digest(std::move(all), h.metadata));
    if (stored != computed) {
      throw CheckpointError(fmt::format("'{}': header checksum mismatch (stored {}, computed {}): the header is "
                                        "corrupted",
                                        origin, stored, computed));
    }
  }
  return h;
}

// After the bytes are in: BOOL must be 0/1 (anything else is not a bool in C++), and the CRC.
inline void check_tensor_bytes(const Header& h, const StoredTensor& t, const std::string& origin,
                               const ReadOptions& options) {
  if (t.dtype == Dtype::Bool) {
    for (std::size_t i = 0; i < t.bytes.size(); ++i) {
      if (static_cast<unsigned>(t.bytes[i]) > 1) {
        throw CheckpointError(fmt::format("'{}': BOOL tensor '{}' holds byte {} at element {}; only 0 and 1 are "
                                          "booleans",
                                          origin, t.name, static_cast<unsigned>(t.bytes[i]), i));
      }
    }
  }
  if (!h.has_checksums || !options.verify_checksums) return;
  const std::string& stored = h.metadata.find(fmt::format("{}{}", kTensorCrcPrefix, t.name))->second;
  const std::string computed = crc_hex(crc32(t.bytes));
  if (stored != computed) {
    throw CheckpointError(fmt::format("'{}': tensor '{}' is corrupted: the CRC-32 of its {} bytes is {}, the file "
                                      "recorded {}",
                                      origin, t.name, t.bytes.size(), computed, stored));
  }
}

inline std::uint64_t read_le64(const std::byte* p) {
  std::uint64_t v = 0;
  std::memcpy(&v, p, 8);
  return v;  // little-endian host (static_assert above)
}

inline void check_prefix(std::uint64_t file_size, const std::string& origin) {
  if (file_size < 8) {
    throw CheckpointError(fmt::format("'{}' is {} bytes long, too short for the 8-byte header length of a "
                                      "safetensors file: truncated, or not a safetensors file",
                                      origin, file_size));
  }
}
inline void check_header_length(std::uint64_t n, std::uint64_t file_size, const std::string& origin) {
  if (n > file_size - 8) {
    throw CheckpointError(fmt::format("'{}': the header length {} runs past the end of the file ({} bytes follow "
                                      "the length): truncated or corrupted",
                                      origin, n, file_size - 8));
  }
  if (n > kMaxHeaderBytes) {
    throw CheckpointError(fmt::format("'{}': the header length {} exceeds the limit of {} bytes: corrupted", origin, n,
                                      kMaxHeaderBytes));
  }
}

// The header JSON (padded) and the payload order, shared by serialize() and write().
struct Layout {
  std::string header;  // includes the 8-byte length prefix and the padding
  std::vector<std::pair<const std::string*, const TensorView*>> order;
  std::uint64_t payload_size = 0;
};

inline Layout plan(const TensorMap& tensors, const Metadata& user_metadata) {
  Layout layout;
  for (const auto& [key, value] : user_metadata) {
    if (is_reserved_key(key)) {
      throw InvalidArgument(fmt::format("safetensors: metadata key '{}' is reserved; distribute computes it", key));
    }
  }
  for (const auto& [name, view] : tensors) {
    if (name.empty() || name == kMetadataKey) {
      throw InvalidArgument(fmt::format("safetensors: '{}' cannot be a tensor name", name));
    }
    for (auto d : view.shape) {
      if (d < 0) {
        throw InvalidArgument(fmt::format("safetensors: tensor '{}' has a negative dimension in shape {}", name,
                                          shape_string(view.shape)));
      }
    }
    const std::uint64_t want = static_cast<std::uint64_t>(num_elements(view.shape)) * size_of(view.dtype);
    if (view.bytes.size() != want) {
      throw InvalidArgument(fmt::format("safetensors: tensor '{}' of dtype {} and shape {} needs {} bytes, but {} "
                                        "were given",
                                        name, to_string(view.dtype), shape_string(view.shape), want,
                                        view.bytes.size()));
    }
    layout.order.emplace_back(&name, &view);
  }
  // Widest elements first: with an 8-aligned payload every tensor then starts at a multiple of
  // its element size, so a reader may map the file and use the data in place (as Python's does).
  std::stable_sort(layout.order.begin(), layout.order.end(),
                   [](const auto& a, const auto& b) { return size_of(a.second->dtype) > size_of(b.second->dtype); });

  std::vector<Entry> entries;
  entries.reserve(layout.order.size());
  Metadata metadata = user_metadata;
  std::uint64_t offset = 0;
  for (const auto& [name, view] : layout.order) {
    entries.push_back(Entry{*name, view->dtype, view->shape, offset, offset + view->bytes.size()});
    offset += view->bytes.size();
    metadata.emplace(fmt::format("{}{}", kTensorCrcPrefix, *name), crc_hex(crc32(view->bytes)));
  }
  layout.payload_size = offset;
  metadata.emplace(std::string(kFormatKey), std::string(kFormatVersion));
  std::vector<const Entry*> pointers;
  for (const auto& e : entries) pointers.push_back(&e);
  metadata.emplace(std::string(kHeaderCrcKey), crc_hex(header_digest(std::move(pointers), metadata)));

  boost::json::object root;
  boost::json::object meta;
  for (const auto& [key, value] : metadata) meta[key] = value;
  root[kMetadataKey] = std::move(meta);
  for (const Entry& e : entries) {
    boost::json::array shape;
    for (auto d : e.shape) shape.push_back(d);
    root[e.name] = boost::json::object{
        {"dtype", to_string(e.dtype)}, {"shape", std::move(shape)}, {"data_offsets", boost::json::array{e.begin, e.end}}};
  }
  std::string json = boost::json::serialize(root);
  json.append((8 - json.size() % 8) % 8, ' ');
  const std::uint64_t n = json.size();
  layout.header.resize(8);
  std::memcpy(layout.header.data(), &n, 8);
  layout.header += json;
  return layout;
}

}  // namespace detail

/// The bytes of a safetensors file holding `tensors` and `metadata` (with distribute's checksums).
inline std::vector<std::byte> serialize(const TensorMap& tensors, const Metadata& metadata = {}) {
  const detail::Layout layout = detail::plan(tensors, metadata);
  std::vector<std::byte> out;
  out.reserve(layout.header.size() + layout.payload_size);
  const auto* h = reinterpret_cast<const std::byte*>(layout.header.data());
  out.insert(out.end(), h, h + layout.header.size());
  for (const auto& [name, view] : layout.order) out.insert(out.end(), view->bytes.begin(), view->bytes.end());
  return out;
}

/// Writes `path` atomically: it holds either its previous contents or the complete new file,
/// whatever happens during the write (see detail::AtomicFile).
inline void write(const std::filesystem::path& path, const TensorMap& tensors, const Metadata& metadata = {},
                  const WriteOptions& options = {}) {
  const detail::Layout layout = detail::plan(tensors, metadata);
  const std::uint64_t total = layout.header.size() + layout.payload_size;
  std::uint64_t written = 0;
  distribute::detail::AtomicFile file(path, options.durable);
  auto put = [&](std::span<const std::byte> bytes) {
    file.write(bytes);
    written += bytes.size();
    if (options.on_progress) options.on_progress(written, total);
  };
  put(std::as_bytes(std::span(layout.header.data(), layout.header.size())));
  for (const auto& [name, view] : layout.order) {
    for (std::size_t at = 0; at < view->bytes.size(); at += detail::kWriteChunk) {
      put(view->bytes.subspan(at, std::min(detail::kWriteChunk, view->bytes.size() - at)));
    }
  }
  file.commit();
}

/// Parses and validates a whole file held in memory; `origin` names it in errors.
inline File parse(std::span<const std::byte> bytes, std::string origin = "<memory>", const ReadOptions& options = {}) {
  detail::check_prefix(bytes.size(), origin);
  const std::uint64_t n = detail::read_le64(bytes.data());
  detail::check_header_length(n, bytes.size(), origin);
  const std::string_view json(reinterpret_cast<const char*>(bytes.data()) + 8, static_cast<std::size_t>(n));
  const std::uint64_t payload_start = 8 + n;
  detail::Header h = detail::parse_header(json, bytes.size() - payload_start, origin);
  File file;
  file.origin = std::move(origin);
  for (auto& e : h.entries) {
    StoredTensor t{e.name, e.dtype, e.shape, {}};
    auto src = bytes.subspan(static_cast<std::size_t>(payload_start + e.begin), static_cast<std::size_t>(e.end - e.begin));
    t.bytes.assign(src.begin(), src.end());
    detail::check_tensor_bytes(h, t, file.origin, options);
    file.tensors.push_back(std::move(t));
  }
  file.metadata = std::move(h.metadata);
  return file;
}

/// Reads and validates a safetensors file; every problem is a CheckpointError naming the file.
inline File read(const std::filesystem::path& path, const ReadOptions& options = {}) {
  const std::string origin = path.string();
  auto fd = distribute::detail::open_for_reading(path);
  const std::uint64_t size = distribute::detail::file_size(fd, path);
  detail::check_prefix(size, origin);
  std::array<std::byte, 8> prefix{};
  distribute::detail::read_exact(fd, prefix, 0, path, "the header length");
  const std::uint64_t n = detail::read_le64(prefix.data());
  detail::check_header_length(n, size, origin);
  std::string json(static_cast<std::size_t>(n), '\0');
  distribute::detail::read_exact(fd, std::as_writable_bytes(std::span(json.data(), json.size())), 8, path,
                                 "the JSON header");
  const std::uint64_t payload_start = 8 + n;
  detail::Header h = detail::parse_header(json, size - payload_start, origin);
  File file;
  file.origin = origin;
  for (auto& e : h.entries) {
    StoredTensor t{e.name, e.dtype, e.shape, std::vector<std::byte>(static_cast<std::size_t>(e.end - e.begin))};
    distribute::detail::read_exact(fd, t.bytes, payload_start + e.begin, path, fmt::format("tensor '{}'", e.name));
    detail::check_tensor_bytes(h, t, origin, options);
    file.tensors.push_back(std::move(t));
  }
  file.metadata = std::move(h.metadata);
  return file;
}

}  // namespace safetensors

DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CHECKPOINT_SAFETENSORS_HPP
// ---- end <distribute/checkpoint/safetensors.hpp> ----
// ---- begin <distribute/checkpoint/checkpoint.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CHECKPOINT_CHECKPOINT_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CHECKPOINT_CHECKPOINT_HPP
// Checkpoint: named variables saved to, and restored from, one safetensors file.
//
//   ds::Checkpoint ckpt;
//   ckpt.track("dense/kernel", w).track("step", step);
//   auto path = ckpt.save("/tmp/run/ckpt");     // /tmp/run/ckpt-1.safetensors
//   ckpt.restore(path);
//
// What is saved for each kind of variable (TF's rules):
//   plain / mirrored (ON_WRITE)   one tensor, the primary copy; restored into every copy
//   sync-on-read (ON_READ)        the cross-replica aggregate (SUM/MEAN/ONLY_FIRST_REPLICA);
//                                 restored with a cross-replica assign (SUM: split over the copies)
//   sharded (track_sharded)       one tensor, the shards concatenated along axis 0; restorable into
//                                 any number of shards whose rows add up to the saved rows
// Saving and restoring happen in cross-replica context (outside strategy.run()). A Checkpoint is
// not thread-safe: one thread saves or restores at a time.

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

// ---- begin <distribute/checkpoint/safetensors.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CHECKPOINT_SAFETENSORS_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CHECKPOINT_SAFETENSORS_HPP
// safetensors files: read, write, validate.
//
// Layout (https://github.com/huggingface/safetensors):
//   8 bytes   N, little-endian u64
//   N bytes   JSON header: {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//                           "__metadata__": {"key": "value", ...}}
//             padded with spaces so that the payload starts 8-byte aligned
//   payload   the tensors' bytes, row-major, little-endian; offsets are relative to the payload
//
// What distribute adds, inside __metadata__ (so any safetensors reader still reads the file):
//   "distribute.format": "1"
//   "distribute.crc32.<tensor>": CRC-32 (IEEE, as zlib.crc32) of that tensor's bytes, 8 hex digits
//   "distribute.header_crc32": CRC-32 of a canonical form of the header (see detail::header_digest),
//                              so that a corrupted shape, offset, name or metadata value is caught too
// A file carrying any of these must carry all of them. Files without them (written by Python's
// safetensors, say) are read with the structural checks only.
//
// Every problem is a ds::CheckpointError naming the file and, where there is one, the tensor.

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <boost/crc.hpp>
#include <boost/json.hpp>
#include <fmt/format.h>

// ---- begin <distribute/checkpoint/detail/posix_file.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CHECKPOINT_DETAIL_POSIX_FILE_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CHECKPOINT_DETAIL_POSIX_FILE_HPP
// POSIX file primitives for checkpoints: reads and writes that retry short counts and EINTR, and
// AtomicFile, the replace-on-commit protocol that keeps a crash from ever exposing a partial file:
//   write a temp file in the target's directory → fsync it → rename it over the target → fsync
//   the directory (so the rename itself survives a power loss).
// rename(2) within one directory is atomic, so a reader sees the old file or the new one, never a mix.

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include <fmt/format.h>


DISTRIBUTE_BEGIN_NAMESPACE

namespace detail {

inline std::string errno_message(int err) { return std::system_category().message(err); }

/// An owned file descriptor; closes on destruction (errors there are ignored: use close()).
class FileDescriptor {
 public:
  FileDescriptor() = default;
  explicit FileDescriptor(int fd) noexcept : fd_(fd) {}
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  FileDescriptor& operator=(FileDescriptor&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() { reset(); }

  int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }

  /// Closes and reports the error: on NFS a failed write may only surface here.
  void close(const std::filesystem::path& path) {
    if (fd_ < 0) return;
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0 && errno != EINTR) {
      throw CheckpointError(fmt::format("closing '{}' failed: {}", path.string(), errno_message(errno)));
    }
  }

 private:
  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int fd_ = -1;
};

inline FileDescriptor open_for_reading(const std::filesystem::path& path) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    throw CheckpointError(fmt::format("cannot open checkpoint file '{}': {}", path.string(), errno_message(errno)));
  }
  return FileDescriptor(fd);
}

inline std::uint64_t file_size(const FileDescriptor& fd, const std::filesystem::path& path) {
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    throw CheckpointError(fmt::format("cannot stat '{}': {}", path.string(), errno_message(errno)));
  }
  if (!S_ISREG(st.st_mode)) throw CheckpointError(fmt::format("'{}' is not a regular file", path.string()));
  return static_cast<std::uint64_t>(st.st_size);
}

/// Reads exactly `out.size()` bytes at `offset`; a short file is a CheckpointError naming `what`.
inline void read_exact(const FileDescriptor& fd, std::span<std::byte> out, std::uint64_t offset,
                       const std::filesystem::path& path, std::string_view what) {
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::pread(fd.get(), out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw CheckpointError(fmt::format("reading {} from '{}' failed: {}", what, path.string(), errno_message(errno)));
    }
    if (n == 0) {
      throw CheckpointError(fmt::format("'{}' ended after {} of the {} bytes of {}: the file is truncated",
                                        path.string(), done, out.size(), what));
    }
    done += static_cast<std::size_t>(n);
  }
}

inline void write_all(const FileDescriptor& fd, std::span<const std::byte> bytes, const std::filesystem::path& path) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd.get(), bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw CheckpointError(fmt::format("writing '{}' failed after {} bytes: {}", path.string(), done,
                                        errno_message(errno)));
    }
    done += static_cast<std::size_t>(n);
  }
}

inline void fsync_or_throw(const FileDescriptor& fd, const std::filesystem::path& path) {
  while (::fsync(fd.get()) != 0) {
    if (errno == EINTR) continue;
    throw CheckpointError(fmt::format("fsync of '{}' failed: {}", path.string(), errno_message(errno)));
  }
}

/// Makes a rename or unlink in `dir` durable. Some filesystems cannot fsync a directory (EINVAL);
/// there is nothing more to do on those.
inline void fsync_directory(const std::filesystem::path& dir) {
  const std::filesystem::path d = dir.empty() ? std::filesystem::path(".") : dir;
  FileDescriptor fd(::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd) throw CheckpointError(fmt::format("cannot open directory '{}': {}", d.string(), errno_message(errno)));
  while (::fsync(fd.get()) != 0) {
    if (errno == EINTR) continue;
    if (errno == EINVAL || errno == EROFS) return;
    throw CheckpointError(fmt::format("fsync of directory '{}' failed: {}", d.string(), errno_message(errno)));
  }
}

inline const std::string& host_name() {
  static const std::string name = [] {
    char buf[256] = {};
    if (::gethostname(buf, sizeof buf - 1) != 0) return std::string("localhost");
    std::string s(buf);
    for (char& c : s) {
      if (c == '/' || c == ' ') c = '_';
    }
    return s.empty() ? std::string("localhost") : s;
  }();
  return name;
}

// Temp files are named ".<target>.tmp.<host>.<pid>.<seq>": hidden, next to the target (rename
// must not cross filesystems), and attributable, so that leftovers of a killed writer can be
// recognised and removed without touching a live writer's file.
inline std::string temp_prefix(const std::filesystem::path& target) {
  return "." + target.filename().string() + ".tmp.";
}


/// The file name a temp file was made for, when `name` is a temp file of a writer on this host
/// whose process no longer exists (killed mid-save); nothing otherwise.
inline std::optional<std::string> stale_temp_target(const std::string& name) {
  // .<target>.tmp.<host>.<pid>.<seq>; the host and the target may contain dots, so match from the right.
  const std::string marker = ".tmp." + host_name() + ".";
  const auto seq_dot = name.rfind('.');
  if (name.size() < 2 || name.front() != '.' || seq_dot == std::string::npos || seq_dot == 0) return std::nullopt;
  const auto pid_dot = name.rfind('.', seq_dot - 1);
  if (pid_dot == std::string::npos || pid_dot + 1 < marker.size()) return std::nullopt;
  const auto marker_at = pid_dot + 1 - marker.size();
  if (marker_at < 1 || name.compare(marker_at, marker.size(), marker) != 0) return std::nullopt;
  long long pid = 0;
  const char* first = name.data() + pid_dot + 1;
  const char* last = name.data() + seq_dot;
  auto [ptr, err] = std::from_chars(first, last, pid);
  if (err != std::errc{} || ptr != last || pid <= 0) return std::nullopt;
  if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) return std::nullopt;  // alive (or not ours to judge)
  return name.substr(1, marker_at - 1);
}

/// Removes, from `dir`, the temp files of dead writers on this host whose target satisfies
/// `is_target`. Best effort: a file that cannot be removed is left alone.
template <class Pred>
void remove_stale_temp_files(const std::filesystem::path& dir, Pred&& is_target) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::directory_iterator it(dir.empty() ? fs::path(".") : dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    if (auto target = stale_temp_target(it->path().filename().string()); target && is_target(*target)) {
      std::error_code ignored;
      fs::remove(it->path(), ignored);
    }
  }
}

/// A file that appears at `target` only on commit(), complete and durable; destroyed without a
/// commit (an exception, an early return) it removes its temp file and leaves `target` as it was.
class AtomicFile {
 public:
  explicit AtomicFile(std::filesystem::path target, bool durable = true)
      : target_(std::move(target)), durable_(durable) {
    const std::string filename = target_.filename().string();
    remove_stale_temp_files(target_.parent_path(), [&](const std::string& t) { return t == filename; });
    static std::atomic<std::uint64_t> sequence{0};
    for (int attempt = 0; attempt < 100; ++attempt) {
      temp_ = target_.parent_path() / fmt::format("{}{}.{}.{}", temp_prefix(target_), host_name(),
                                                  static_cast<long long>(::getpid()), sequence.fetch_add(1));
      int fd;
      do {
        fd = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      } while (fd < 0 && errno == EINTR);
      if (fd >= 0) {
        fd_ = FileDescriptor(fd);
        return;
      }
      if (errno != EEXIST) {
        throw CheckpointError(fmt::format("cannot create a temporary file next to '{}' ({}): {}", target_.string(),
                                          temp_.string(), errno_message(errno)));
      }
    }
    throw CheckpointError(fmt::format("cannot create a unique temporary file next to '{}'", target_.string()));
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile() {
    if (!committed_) {
      fd_ = FileDescriptor();
      ::unlink(temp_.c_str());
    }
  }

  void write(std::span<const std::byte> bytes) { write_all(fd_, bytes, temp_); }

  /// fsync → close → rename over the target → fsync the directory.
  void commit() {
    if (durable_) fsync_or_throw(fd_, temp_);
    fd_.close(temp_);
    if (::rename(temp_.c_str(), target_.c_str()) != 0) {
      throw CheckpointError(fmt::format("cannot rename '{}' to '{}': {}", temp_.string(), target_.string(),
                                        errno_message(errno)));
    }
    committed_ = true;
    if (durable_) fsync_directory(target_.parent_path());
  }

  const std::filesystem::path& temp_path() const noexcept { return temp_; }

 private:
  std::filesystem::path target_;
  std::filesystem::path temp_;
  FileDescriptor fd_;
  bool durable_;
  bool committed_ = false;
};

}  // namespace detail

DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CHECKPOINT_DETAIL_POSIX_FILE_HPP
// ---- end <distribute/checkpoint/detail/posix_file.hpp> ----

static_assert(std::endian::native == std::endian::little,
              "distribute/checkpoint: safetensors payloads are little-endian; big-endian hosts are not supported");

DISTRIBUTE_BEGIN_NAMESPACE

namespace safetensors {

/// The element types of a safetensors file, spelled as in the file. F16 and BF16 have no C++
/// arithmetic type here: they are carried as raw 2-byte values (float16 / bfloat16 below).
enum class Dtype : std::uint8_t { F16, BF16, F32, F64, I8, I16, I32, I64, U8, U16, U32, U64, Bool };

inline constexpr std::array<Dtype, 13> all_dtypes = {Dtype::F16, Dtype::BF16, Dtype::F32, Dtype::F64, Dtype::I8,
                                                     Dtype::I16, Dtype::I32,  Dtype::I64, Dtype::U8,  Dtype::U16,
                                                     Dtype::U32, Dtype::U64,  Dtype::Bool};

/// "F32", "BOOL", ... as written in the header.
constexpr std::string_view to_string(Dtype d) noexcept {
  switch (d) {
    case Dtype::F16: return "F16";
    case Dtype::BF16: return "BF16";
    case Dtype::F32: return "F32";
    case Dtype::F64: return "F64";
    case Dtype::I8: return "I8";
    case Dtype::I16: return "I16";
    case Dtype::I32: return "I32";
    case Dtype::I64: return "I64";
    case Dtype::U8: return "U8";
    case Dtype::U16: return "U16";
    case Dtype::U32: return "U32";
    case Dtype::U64: return "U64";
    case Dtype::Bool: return "BOOL";
  }
  return "?";
}

constexpr std::size_t size_of(Dtype d) noexcept {
  switch (d) {
    case Dtype::I8: case Dtype::U8: case Dtype::Bool: return 1;
    case Dtype::F16: case Dtype::BF16: case Dtype::I16: case Dtype::U16: return 2;
    case Dtype::F32: case Dtype::I32: case Dtype::U32: return 4;
    case Dtype::F64: case Dtype::I64: case Dtype::U64: return 8;
  }
  return 0;
}

constexpr std::optional<Dtype> parse_dtype(std::string_view s) noexcept {
  for (Dtype d : all_dtypes) {
    if (to_string(d) == s) return d;
  }
  return std::nullopt;
}

/// The file dtype of a library element type.
constexpr Dtype from_dtype(DType d) noexcept {
  switch (d) {
    case DType::F32: return Dtype::F32;
    case DType::F64: return Dtype::F64;
    case DType::I8: return Dtype::I8;
    case DType::I16: return Dtype::I16;
    case DType::I32: return Dtype::I32;
    case DType::I64: return Dtype::I64;
    case DType::U8: return Dtype::U8;
    case DType::U16: return Dtype::U16;
    case DType::U32: return Dtype::U32;
    case DType::U64: return Dtype::U64;
    case DType::Bool: return Dtype::Bool;
  }
  return Dtype::F32;
}

/// The library element type of a file dtype; none for F16/BF16.
constexpr std::optional<DType> to_dtype(Dtype d) noexcept {
  switch (d) {
    case Dtype::F16: case Dtype::BF16: return std::nullopt;
    case Dtype::F32: return DType::F32;
    case Dtype::F64: return DType::F64;
    case Dtype::I8: return DType::I8;
    case Dtype::I16: return DType::I16;
    case Dtype::I32: return DType::I32;
    case Dtype::I64: return DType::I64;
    case Dtype::U8: return DType::U8;
    case Dtype::U16: return DType::U16;
    case Dtype::U32: return DType::U32;
    case Dtype::U64: return DType::U64;
    case Dtype::Bool: return DType::Bool;
  }
  return std::nullopt;
}

/// "F32 (float32)"; "F16" for the types with no library counterpart.
inline std::string describe(Dtype d) {
  auto lib = to_dtype(d);
  return lib ? fmt::format("{} ({})", to_string(d), distribute::to_string(*lib)) : std::string(to_string(d));
}

/// IEEE half precision, stored as its bit pattern. No arithmetic, no implicit conversion:
/// distribute moves these values, it does not compute with them.
struct float16 {
  std::uint16_t bits = 0;
  friend constexpr bool operator==(float16, float16) = default;
};
/// bfloat16 (the upper half of an IEEE float32), stored as its bit pattern.
struct bfloat16 {
  std::uint16_t bits = 0;
  friend constexpr bool operator==(bfloat16, bfloat16) = default;
};

/// An element type a safetensors tensor can be read as or written from.
template <class T>
concept StorableElement = Element<T> || std::same_as<T, float16> || std::same_as<T, bfloat16>;

template <StorableElement T>
constexpr Dtype dtype_for() noexcept {
  if constexpr (std::same_as<T, float16>) return Dtype::F16;
  else if constexpr (std::same_as<T, bfloat16>) return Dtype::BF16;
  else return from_dtype(dtype_of<T>());
}

/// Borrowed bytes of one tensor to write: the caller keeps them alive during the write.
struct TensorView {
  Dtype dtype = Dtype::F32;
  Shape shape;
  std::span<const std::byte> bytes;

  /// A view of `data` (row-major) as a tensor of `shape`; the element count must match.
  template <StorableElement T>
  static TensorView of(Shape shape, std::span<const T> data) {
    for (auto d : shape) {
      if (d < 0) throw InvalidArgument(fmt::format("safetensors: negative dimension in shape {}", shape_string(shape)));
    }
    if (num_elements(shape) != static_cast<std::int64_t>(data.size())) {
      throw InvalidArgument(fmt::format("safetensors: shape {} holds {} elements but {} were given",
                                        shape_string(shape), num_elements(shape), data.size()));
    }
    return TensorView{dtype_for<T>(), std::move(shape), std::as_bytes(data)};
  }
};

/// A view of any host TensorLike value (a scalar, std::vector, ds::Tensor, a user type...).
template <TensorLike U>
TensorView view_of(const U& value) {
  static_assert(memory_space_v<U> == MemorySpace::host,
                "safetensors::view_of: the value lives in device memory; copy it to the host first");
  using E = element_t<U>;
  return TensorView{dtype_for<E>(), shape_of(value),
                    std::as_bytes(std::span<const E>(tensor_traits<U>::data(value), element_count(value)))};
}

/// One tensor read from a file (owns its bytes).
struct StoredTensor {
  std::string name;
  Dtype dtype = Dtype::F32;
  Shape shape;
  std::vector<std::byte> bytes;

  std::int64_t num_elements() const { return distribute::num_elements(shape); }
  TensorView view() const { return TensorView{dtype, shape, bytes}; }

  /// The elements as T, which must be exactly the stored dtype: F16 is not read as float, nor
  /// I32 as I64 (a silent conversion would hide a mismatch between a file and its reader).
  template <StorableElement T>
  std::vector<T> values() const {
    check_dtype(dtype_for<T>());
    const std::size_t n = bytes.size() / sizeof(T);
    if constexpr (std::is_same_v<T, bool>) {
      std::vector<bool> out(n);
      for (std::size_t i = 0; i < n; ++i) out[i] = bytes[i] != std::byte{0};
      return out;
    } else {
      std::vector<T> out(n);
      if (n) std::memcpy(out.data(), bytes.data(), bytes.size());
      return out;
    }
  }

  /// The tensor as a ds::Tensor<T> (T exactly the stored dtype).
  template <Element T>
    requires(!std::is_same_v<T, bool>)
  Tensor<T> to_tensor() const {
    return Tensor<T>(shape, values<T>());
  }

  void check_dtype(Dtype wanted) const {
    if (wanted != dtype) {
      throw CheckpointError(fmt::format("tensor '{}' has dtype {} and cannot be read as {}; distribute does not "
                                        "convert between element types",
                                        name, describe(dtype), describe(wanted)));
    }
  }
};

using Metadata = std::map<std::string, std::string, std::less<>>;

/// The contents of a safetensors file.
struct File {
  /// The path it was read from, or the name given to parse().
  std::string origin;
  /// In payload order.
  std::vector<StoredTensor> tensors;
  Metadata metadata;

  const StoredTensor* find(std::string_view name) const {
    for (const auto& t : tensors) {
      if (t.name == name) return &t;
    }
    return nullptr;
  }
  const StoredTensor& at(std::string_view name) const {
    if (const StoredTensor* t = find(name)) return *t;
    std::string names;
    for (std::size_t i = 0; i < tensors.size() && i < 20; ++i) names += fmt::format("{}'{}'", i ? ", " : "", tensors[i].name);
    if (tensors.size() > 20) names += fmt::format(", ... ({} in all)", tensors.size());
    throw CheckpointError(fmt::format("'{}' has no tensor '{}' (it has: {})", origin, name,
                                      tensors.empty() ? std::string("none") : names));
  }
};

/// Tensors to write, by name.
using TensorMap = std::map<std::string, TensorView, std::less<>>;

struct WriteOptions {
  /// fsync the file and its directory before returning (off only for scratch files).
  bool durable = true;
  /// Called after each chunk written: (bytes written so far, total bytes).
  std::function<void(std::uint64_t, std::uint64_t)> on_progress;
};

struct ReadOptions {
  /// Verify distribute's CRC-32s when the file has them.
  bool verify_checksums = true;
};

namespace detail {

inline constexpr std::string_view kFormatKey = "distribute.format";
inline constexpr std::string_view kFormatVersion = "1";
inline constexpr std::string_view kHeaderCrcKey = "distribute.header_crc32";
inline constexpr std::string_view kTensorCrcPrefix = "distribute.crc32.";
inline constexpr std::string_view kMetadataKey = "__metadata__";
// The Rust reference implementation refuses larger headers too; it bounds what a corrupted
// length prefix can make us allocate.
inline constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;
inline constexpr std::size_t kWriteChunk = std::size_t{4} << 20;

inline std::uint32_t crc32(std::span<const std::byte> bytes) {
  boost::crc_32_type crc;
  crc.process_bytes(bytes.data(), bytes.size());
  return crc.checksum();
}
inline std::string crc_hex(std::uint32_t crc) { return fmt::format("{:08x}", crc); }

inline bool is_reserved_key(std::string_view key) {
  return key == kFormatKey || key == kHeaderCrcKey || key.substr(0, kTensorCrcPrefix.size()) == kTensorCrcPrefix;
}

struct Entry {
  std::string name;
  Dtype dtype = Dtype::F32;
  Shape shape;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
};

// The header's meaning in a canonical form: tensors by name, then metadata by key (without the
// header checksum itself). The JSON text is not hashed, so formatting and key order are free.
//   "T" name NUL dtype NUL dims,joined,by,commas NUL begin NUL end "\n"
//   "M" key NUL value "\n"
inline std::uint32_t header_digest(std::vector<const Entry*> entries, const Metadata& metadata) {
  std::sort(entries.begin(), entries.end(), [](const Entry* a, const Entry* b) { return a->name < b->name; });
  std::string text;
  for (const Entry* e : entries) {
    text += 'T';
    text += e->name;
    text += '\0';
    text += to_string(e->dtype);
    text += '\0';
    text += fmt::format("{}", fmt::join(e->shape, ","));
    text += '\0';
    text += fmt::format("{}", e->begin);
    text += '\0';
    text += fmt::format("{}\n", e->end);
  }
  for (const auto& [key, value] : metadata) {
    if (key == kHeaderCrcKey) continue;
    text += 'M';
    text += key;
    text += '\0';
    text += value;
    text += '\n';
  }
  return crc32(std::as_bytes(std::span(text.data(), text.size())));
}

inline std::uint64_t checked_size(const std::string& origin, const Entry& e) {
  std::uint64_t n = size_of(e.dtype);
  for (auto d : e.shape) {
    if (__builtin_mul_overflow(n, static_cast<std::uint64_t>(d), &n)) {
      throw CheckpointError(fmt::format("'{}': tensor '{}' has shape {}, whose byte size overflows 64 bits", origin,
                                        e.name, shape_string(e.shape)));
    }
  }
  return n;
}

inline std::uint64_t json_unsigned(const boost::json::value& v, const std::string& origin, const std::string& name,
                                   const char* field) {
  if (v.is_uint64()) return v.get_uint64();
  if (v.is_int64() && v.get_int64() >= 0) return static_cast<std::uint64_t>(v.get_int64());
  throw CheckpointError(fmt::format("'{}': tensor '{}': {} must hold non-negative integers, not {}", origin, name, field,
                                    boost::json::serialize(v)));
}

// A parsed and validated header: entries in payload order, the metadata, and whether the file
// carries distribute's checksums.
struct Header {
  std::vector<Entry> entries;  // in payload order
  Metadata metadata;
  bool has_checksums = false;
};

inline Header parse_header(std::string_view json, std::uint64_t payload_size, const std::string& origin) {
  if (json.empty() || json.front() != '{') {
    throw CheckpointError(fmt::format("'{}': the header does not start with '{{': not a safetensors file, or a "
                                      "corrupted one",
                                      origin));
  }
  boost::system::error_code ec;
  boost::json::value root = boost::json::parse(json, ec);
  if (ec) {
    throw CheckpointError(fmt::format("'{}': the JSON header ({} bytes) is invalid: {}", origin, json.size(),
                                      ec.message()));
  }
  if (!root.is_object()) throw CheckpointError(fmt::format("'{}': the JSON header is not an object", origin));

  Header h;
  for (const auto& kv : root.get_object()) {
    const std::string name(kv.key());
    const boost::json::value& v = kv.value();
    if (name == kMetadataKey) {
      if (!v.is_object()) {
        throw CheckpointError(fmt::format("'{}': __metadata__ must be an object of strings, not {}", origin,
                                          boost::json::serialize(v)));
      }
      for (const auto& m : v.get_object()) {
        if (!m.value().is_string()) {
          throw CheckpointError(fmt::format("'{}': __metadata__ value of '{}' must be a string, not {}", origin,
                                            std::string_view(m.key()), boost::json::serialize(m.value())));
        }
        h.metadata.emplace(std::string(m.key()), std::string(m.value().get_string()));
      }
      continue;
    }
    if (!v.is_object()) {
      throw CheckpointError(fmt::format("'{}': tensor '{}' must be described by an object, not {}", origin, name,
                                        boost::json::serialize(v)));
    }
    const auto& obj = v.get_object();
    Entry e;
    e.name = name;
    const boost::json::value* dtype = obj.if_contains("dtype");
    const boost::json::value* shape = obj.if_contains("shape");
    const boost::json::value* offsets = obj.if_contains("data_offsets");
    if (!dtype || !shape || !offsets) {
      throw CheckpointError(fmt::format("'{}': tensor '{}' lacks {}", origin, name,
                                        !dtype ? "\"dtype\"" : !shape ? "\"shape\"" : "\"data_offsets\""));
    }
    for (const auto& field : obj) {
      if (field.key() != "dtype" && field.key() != "shape" && field.key() != "data_offsets") {
        throw CheckpointError(fmt::format("'{}': tensor '{}' has an unknown field \"{}\"", origin, name,
                                          std::string_view(field.key())));
      }
    }
    if (!dtype->is_string()) {
      throw CheckpointError(fmt::format("'{}': tensor '{}': dtype must be a string, not {}", origin, name,
                                        boost::json::serialize(*dtype)));
    }
    auto d = parse_dtype(dtype->get_string());
    if (!d) {
      throw CheckpointError(fmt::format("'{}': tensor '{}' has dtype \"{}\", which distribute does not know (known: "
                                        "F16, BF16, F32, F64, I8, I16, I32, I64, U8, U16, U32, U64, BOOL)",
                                        origin, name, std::string_view(dtype->get_string())));
    }
    e.dtype = *d;
    if (!shape->is_array()) {
      throw CheckpointError(fmt::format("'{}': tensor '{}': shape must be an array, not {}", origin, name,
                                        boost::json::serialize(*shape)));
    }
    for (const auto& dim : shape->get_array()) {
      const std::uint64_t u = json_unsigned(dim, origin, name, "shape");
      if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
        throw CheckpointError(fmt::format("'{}': tensor '{}': dimension {} is too large", origin, name, u));
      }
      e.shape.push_back(static_cast<std::int64_t>(u));
    }
    if (!offsets->is_array() || offsets->get_array().size() != 2) {
      throw CheckpointError(fmt::format("'{}': tensor '{}': data_offsets must be [begin, end], not {}", origin, name,
                                        boost::json::serialize(*offsets)));
    }
    e.begin = json_unsigned(offsets->get_array()[0], origin, name, "data_offsets");
    e.end = json_unsigned(offsets->get_array()[1], origin, name, "data_offsets");
    if (e.begin > e.end) {
      throw CheckpointError(fmt::format("'{}': tensor '{}' has data_offsets [{}, {}]: begin is after end", origin,
                                        name, e.begin, e.end));
    }
    const std::uint64_t expected = checked_size(origin, e);
    if (e.end - e.begin != expected) {
      throw CheckpointError(fmt::format("'{}': tensor '{}' of dtype {} and shape {} needs {} bytes, but its "
                                        "data_offsets [{}, {}] span {}",
                                        origin, name, to_string(e.dtype), shape_string(e.shape), expected, e.begin,
                                        e.end, e.end - e.begin));
    }
    if (e.end > payload_size) {
      throw CheckpointError(fmt::format("'{}': tensor '{}' has data_offsets [{}, {}] but the payload holds only {} "
                                        "bytes: the file is truncated or the offsets are corrupted",
                                        origin, name, e.begin, e.end, payload_size));
    }
    h.entries.push_back(std::move(e));
  }

  // The tensors must tile the payload exactly: no overlap (two tensors aliasing bytes), no gap
  // (bytes nobody owns), nothing after the last one.
  std::sort(h.entries.begin(), h.entries.end(),
            [](const Entry& a, const Entry& b) { return std::tie(a.begin, a.end) < std::tie(b.begin, b.end); });
  std::uint64_t cursor = 0;
  const Entry* previous = nullptr;
  for (const Entry& e : h.entries) {
    if (e.begin != cursor) {
      if (previous) {
        throw CheckpointError(fmt::format("'{}': tensor '{}' (data_offsets [{}, {}]) {} tensor '{}' (data_offsets "
                                          "[{}, {}]); tensors must be contiguous and must not overlap",
                                          origin, e.name, e.begin, e.end,
                                          e.begin < cursor ? "overlaps" : "leaves a gap after", previous->name,
                                          previous->begin, previous->end));
      }
      throw CheckpointError(fmt::format("'{}': the first tensor '{}' starts at payload byte {}, not 0", origin, e.name,
                                        e.begin));
    }
    cursor = e.end;
    previous = &e;
  }
  if (cursor != payload_size) {
    throw CheckpointError(fmt::format("'{}': the tensors cover {} bytes but the payload has {}: the file has "
                                      "trailing bytes or its header length is corrupted",
                                      origin, cursor, payload_size));
  }

  // distribute's checksums: all or nothing, so that corrupting one key cannot switch them off.
  bool any = false;
  for (const auto& [key, value] : h.metadata) any = any || is_reserved_key(key);
  h.has_checksums = any;
  if (any) {
    auto need = [&](std::string_view key) -> const std::string& {
      auto it = h.metadata.find(key);
      if (it == h.metadata.end()) {
        throw CheckpointError(fmt::format("'{}': __metadata__ has distribute checksums but lacks \"{}\": the header "
                                          "is corrupted",
                                          origin, key));
      }
      return it->second;
    };
    if (need(kFormatKey) != kFormatVersion) {
      throw CheckpointError(fmt::format("'{}': distribute.format is \"{}\"; this version reads format {}", origin,
                                        need(kFormatKey), kFormatVersion));
    }
    std::vector<const Entry*> all;
    for (const Entry& e : h.entries) {
      all.push_back(&e);
      need(fmt::format("{}{}", kTensorCrcPrefix, e.name));
    }
    for (const auto& [key, value] : h.metadata) {
      if (key.rfind(kTensorCrcPrefix, 0) == 0) {
        const std::string tensor = key.substr(kTensorCrcPrefix.size());
        if (std::none_of(h.entries.begin(), h.entries.end(), [&](const Entry& e) { return e.name == tensor; })) {
          throw CheckpointError(fmt::format("'{}': __metadata__ has a checksum for tensor '{}', which the header "
                                            "does not list: the header is corrupted",
                                            origin, tensor));
        }
      }
    }
    const std::string stored = need(kHeaderCrcKey);
    const std::string computed = crc_hex(header_digest(std::move(all), h.metadata));
    if (stored != computed) {
      throw CheckpointError(fmt::format("'{}': header checksum mismatch (stored {}, computed {}): the header is "
                                        "corrupted",
                                        origin, stored, computed));
    }
  }
  return h;
}

// After the bytes are in: BOOL must be 0/1 (anything else is not a bool in C++), and the CRC.
inline void check_tensor_bytes(const Header& h, const StoredTensor& t, const std::string& origin,
                               const ReadOptions& options) {
  if (t.dtype == Dtype::Bool) {
    for (std::size_t i = 0; i < t.bytes.size(); ++i) {
      if (static_cast<unsigned>(t.bytes[i]) > 1) {
        throw CheckpointError(fmt::format("'{}': BOOL tensor '{}' holds byte {} at element {}; only 0 and 1 are "
                                          "booleans",
                                          origin, t.name, static_cast<unsigned>(t.bytes[i]), i));
      }
    }
  }
  if (!h.has_checksums || !options.verify_checksums) return;
  const std::string& stored = h.metadata.find(fmt::format("{}{}", kTensorCrcPrefix, t.name))->second;
  const std::string computed = crc_hex(crc32(t.bytes));
  if (stored != computed) {
    throw CheckpointError(fmt::format("'{}': tensor '{}' is corrupted: the CRC-32 of its {} bytes is {}, the file "
                                      "recorded {}",
                                      origin, t.name, t.bytes.size(), computed, stored));
  }
}

inline std::uint64_t read_le64(const std::byte* p) {
  std::uint64_t v = 0;
  std::memcpy(&v, p, 8);
  return v;  // little-endian host (static_assert above)
}

inline void check_prefix(std::uint64_t file_size, const std::string& origin) {
  if (file_size < 8) {
    throw CheckpointError(fmt::format("'{}' is {} bytes long, too short for the 8-byte header length of a "
                                      "safetensors file: truncated, or not a safetensors file",
                                      origin, file_size));
  }
}
inline void check_header_length(std::uint64_t n, std::uint64_t file_size, const std::string& origin) {
  if (n > file_size - 8) {
    throw CheckpointError(fmt::format("'{}': the header length {} runs past the end of the file ({} bytes follow "
                                      "the length): truncated or corrupted",
                                      origin, n, file_size - 8));
  }
  if (n > kMaxHeaderBytes) {
    throw CheckpointError(fmt::format("'{}': the header length {} exceeds the limit of {} bytes: corrupted", origin, n,
                                      kMaxHeaderBytes));
  }
}

// The header JSON (padded) and the payload order, shared by serialize() and write().
struct Layout {
  std::string header;  // includes the 8-byte length prefix and the padding
  std::vector<std::pair<const std::string*, const TensorView*>> order;
  std::uint64_t payload_size = 0;
};

inline Layout plan(const TensorMap& tensors, const Metadata& user_metadata) {
  Layout layout;
  for (const auto& [key, value] : user_metadata) {
    if (is_reserved_key(key)) {
      throw InvalidArgument(fmt::format("safetensors: metadata key '{}' is reserved; distribute computes it", key));
    }
  }
  for (const auto& [name, view] : tensors) {
    if (name.empty() || name == kMetadataKey) {
      throw InvalidArgument(fmt::format("safetensors: '{}' cannot be a tensor name", name));
    }
    for (auto d : view.shape) {
      if (d < 0) {
        throw InvalidArgument(fmt::format("safetensors: tensor '{}' has a negative dimension in shape {}", name,
                                          shape_string(view.shape)));
      }
    }
    const std::uint64_t want = static_cast<std::uint64_t>(num_elements(view.shape)) * size_of(view.dtype);
    if (view.bytes.size() != want) {
      throw InvalidArgument(fmt::format("safetensors: tensor '{}' of dtype {} and shape {} needs {} bytes, but {} "
                                        "were given",
                                        name, to_string(view.dtype), shape_string(view.shape), want,
                                        view.bytes.size()));
    }
    layout.order.emplace_back(&name, &view);
  }
  // Widest elements first: with an 8-aligned payload every tensor then starts at a multiple of
  // its element size, so a reader may map the file and use the data in place (as Python's does).
  std::stable_sort(layout.order.begin(), layout.order.end(),
                   [](const auto& a, const auto& b) { return size_of(a.second->dtype) > size_of(b.second->dtype); });

  std::vector<Entry> entries;
  entries.reserve(layout.order.size());
  Metadata metadata = user_metadata;
  std::uint64_t offset = 0;
  for (const auto& [name, view] : layout.order) {
    entries.push_back(Entry{*name, view->dtype, view->shape, offset, offset + view->bytes.size()});
    offset += view->bytes.size();
    metadata.emplace(fmt::format("{}{}", kTensorCrcPrefix, *name), crc_hex(crc32(view->bytes)));
  }
  layout.payload_size = offset;
  metadata.emplace(std::string(kFormatKey), std::string(kFormatVersion));
  std::vector<const Entry*> pointers;
  for (const auto& e : entries) pointers.push_back(&e);
  metadata.emplace(std::string(kHeaderCrcKey), crc_hex(header_digest(std::move(pointers), metadata)));

  boost::json::object root;
  boost::json::object meta;
  for (const auto& [key, value] : metadata) meta[key] = value;
  root[kMetadataKey] = std::move(meta);
  for (const Entry& e : entries) {
    boost::json::array shape;
    for (auto d : e.shape) shape.push_back(d);
    root[e.name] = boost::json::object{
        {"dtype", to_string(e.dtype)}, {"shape", std::move(shape)}, {"data_offsets", boost::json::array{e.begin, e.end}}};
  }
  std::string json = boost::json::serialize(root);
  json.append((8 - json.size() % 8) % 8, ' ');
  const std::uint64_t n = json.size();
  layout.header.resize(8);
  std::memcpy(layout.header.data(), &n, 8);
  layout.header += json;
  return layout;
}

}  // namespace detail

/// The bytes of a safetensors file holding `tensors` and `metadata` (with distribute's checksums).
inline std::vector<std::byte> serialize(const TensorMap& tensors, const Metadata& metadata = {}) {
  const detail::Layout layout = detail::plan(tensors, metadata);
  std::vector<std::byte> out;
  out.reserve(layout.header.size() + layout.payload_size);
  const auto* h = reinterpret_cast<const std::byte*>(layout.header.data());
  out.insert(out.end(), h, h + layout.header.size());
  for (const auto& [name, view] : layout.order) out.insert(out.end(), view->bytes.begin(), view->bytes.end());
  return out;
}

/// Writes `path` atomically: it holds either its previous contents or the complete new file,
/// whatever happens during the write (see detail::AtomicFile).
inline void write(const std::filesystem::path& path, const TensorMap& tensors, const Metadata& metadata = {},
                  const WriteOptions& options = {}) {
  const detail::Layout layout = detail::plan(tensors, metadata);
  const std::uint64_t total = layout.header.size() + layout.payload_size;
  std::uint64_t written = 0;
  distribute::detail::AtomicFile file(path, options.durable);
  auto put = [&](std::span<const std::byte> bytes) {
    file.write(bytes);
    written += bytes.size();
    if (options.on_progress) options.on_progress(written, total);
  };
  put(std::as_bytes(std::span(layout.header.data(), layout.header.size())));
  for (const auto& [name, view] : layout.order) {
    for (std::size_t at = 0; at < view->bytes.size(); at += detail::kWriteChunk) {
      put(view->bytes.subspan(at, std::min(detail::kWriteChunk, view->bytes.size() - at)));
    }
  }
  file.commit();
}

/// Parses and validates a whole file held in memory; `origin` names it in errors.
inline File parse(std::span<const std::byte> bytes, std::string origin = "<memory>", const ReadOptions& options = {}) {
  detail::check_prefix(bytes.size(), origin);
  const std::uint64_t n = detail::read_le64(bytes.data());
  detail::check_header_length(n, bytes.size(), origin);
  const std::string_view json(reinterpret_cast<const char*>(bytes.data()) + 8, static_cast<std::size_t>(n));
  const std::uint64_t payload_start = 8 + n;
  detail::Header h = detail::parse_header(json, bytes.size() - payload_start, origin);
  File file;
  file.origin = std::move(origin);
  for (auto& e : h.entries) {
    StoredTensor t{e.name, e.dtype, e.shape, {}};
    auto src = bytes.subspan(static_cast<std::size_t>(payload_start + e.begin), static_cast<std::size_t>(e.end - e.begin));
    t.bytes.assign(src.begin(), src.end());
    detail::check_tensor_bytes(h, t, file.origin, options);
    file.tensors.push_back(std::move(t));
  }
  file.metadata = std::move(h.metadata);
  return file;
}

/// Reads and validates a safetensors file; every problem is a CheckpointError naming the file.
inline File read(const std::filesystem::path& path, const ReadOptions& options = {}) {
  const std::string origin = path.string();
  auto fd = distribute::detail::open_for_reading(path);
  const std::uint64_t size = distribute::detail::file_size(fd, path);
  detail::check_prefix(size, origin);
  std::array<std::byte, 8> prefix{};
  distribute::detail::read_exact(fd, prefix, 0, path, "the header length");
  const std::uint64_t n = detail::read_le64(prefix.data());
  detail::check_header_length(n, size, origin);
  std::string json(static_cast<std::size_t>(n), '\0');
  distribute::detail::read_exact(fd, std::as_writable_bytes(std::span(json.data(), json.size())), 8, path,
                                 "the JSON header");
  const std::uint64_t payload_start = 8 + n;
  detail::Header h = detail::parse_header(json, size - payload_start, origin);
  File file;
  file.origin = origin;
  for (auto& e : h.entries) {
    StoredTensor t{e.name, e.dtype, e.shape, std::vector<std::byte>(static_cast<std::size_t>(e.end - e.begin))};
    distribute::detail::read_exact(fd, t.bytes, payload_start + e.begin, path, fmt::format("tensor '{}'", e.name));
    detail::check_tensor_bytes(h, t, origin, options);
    file.tensors.push_back(std::move(t));
  }
  file.metadata = std::move(h.metadata);
  return file;
}

}  // namespace safetensors

DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CHECKPOINT_SAFETENSORS_HPP
// ---- end <distribute/checkpoint/safetensors.hpp> ----

DISTRIBUTE_BEGIN_NAMESPACE

struct CheckpointOptions {
  /// fsync each file and its directory before save() returns, so that the checkpoint survives a
  /// power loss, not only a crash of the process. Off only for scratch checkpoints.
  bool durable = true;
  /// Called while a file is written: (bytes written so far, total bytes).
  std::function<void(std::uint64_t, std::uint64_t)> on_progress;
};

namespace detail {

inline constexpr std::string_view kSaveCounterKey = "distribute.save_counter";
inline constexpr std::string_view kLibraryVersionKey = "distribute.library_version";

/// A copy of a tracked value taken at save time, viewed as bytes; `owner` keeps the copy alive.
struct CheckpointSnapshot {
  std::shared_ptr<const void> owner;
  safetensors::TensorView view;
};

/// What Checkpoint knows about a tracked object: its dtype and logical shape, how to copy it out
/// and how to write a (validated) tensor back in.
class Trackable {
 public:
  virtual ~Trackable() = default;
  virtual safetensors::Dtype dtype() const = 0;
  virtual Shape shape() const = 0;
  /// For messages: "variable 'w'", "sharded variable (2 shards: (4, 2), (3, 2))".
  virtual std::string describe() const = 0;
  virtual CheckpointSnapshot snapshot(const std::string& name) const = 0;
  /// `tensor` has already been checked to have dtype() and shape().
  virtual void restore(const safetensors::StoredTensor& tensor) = 0;
};

template <class T>
void check_host_memory() {
  static_assert(memory_space_v<T> == MemorySpace::host,
                "ds::Checkpoint: variables whose values live in device memory cannot be checkpointed yet");
}

// Reads a variable's checkpoint value: the primary copy, or the aggregate of a sync-on-read one.
template <class T>
T checkpoint_value(const Variable<T>& var, const std::string& name) {
  try {
    return var.read_value();
  } catch (const InvalidArgument& e) {
    throw CheckpointError(fmt::format("cannot save tensor '{}': {}", name, e.what()));
  }
}

// Writes `shape`'s worth of elements from `data` into every copy of `var`.
template <class T>
void restore_variable(Variable<T>& var, const Shape& shape, const std::byte* data) {
  using E = element_t<T>;
  T value = tensor_traits<T>::make(shape);
  const std::size_t n = static_cast<std::size_t>(num_elements(shape));
  if (n) std::memcpy(tensor_traits<T>::data(value), data, n * sizeof(E));
  if constexpr (std::is_integral_v<E> && !std::is_same_v<E, bool>) {
    // A SUM sync-on-read integer split as value/N per copy would lose the remainder (7 over 3
    // copies reads back 6); give it to copy 0 so that the sum reads back exactly.
    const std::size_t copies = var.values().size();
    if (var.is_sync_on_read() && var.aggregation() == VariableAggregation::Sum && copies > 1) {
      const E* src = tensor_traits<T>::data(value);
      var.apply_to_copies([&](T& copy, int index) {
        E* dst = tensor_traits<T>::data(copy);
        for (std::size_t i = 0; i < n; ++i) {
          const E share = static_cast<E>(src[i] / static_cast<E>(copies));
          dst[i] = index == 0 ? static_cast<E>(src[i] - share * static_cast<E>(copies - 1)) : share;
        }
      });
      return;
    }
  }
  var.assign(value);
}

template <class T>
class TrackedVariable final : public Trackable {
 public:
  explicit TrackedVariable(Variable<T> var) : var_(std::move(var)) {}
  safetensors::Dtype dtype() const override { return safetensors::dtype_for<element_t<T>>(); }
  Shape shape() const override { return var_.shape(); }
  std::string describe() const override { return fmt::format("variable '{}'", var_.name()); }
  CheckpointSnapshot snapshot(const std::string& name) const override {
    auto copy = std::make_shared<const T>(checkpoint_value(var_, name));
    return CheckpointSnapshot{copy, safetensors::view_of(*copy)};
  }
  void restore(const safetensors::StoredTensor& tensor) override {
    restore_variable(var_, tensor.shape, tensor.bytes.data());
  }

 private:
  Variable<T> var_;
};

template <class T>
class TrackedShards final : public Trackable {
  using E = element_t<T>;

 public:
  TrackedShards(std::vector<Variable<T>> shards, const std::string& name) : shards_(std::move(shards)) {
    if (shards_.empty()) throw InvalidArgument(fmt::format("Checkpoint: sharded variable '{}' has no shards", name));
    const Shape first = shards_.front().shape();
    for (std::size_t i = 0; i < shards_.size(); ++i) {
      const Shape s = shards_[i].shape();
      if (s.empty() || s.size() != first.size() || !std::equal(s.begin() + 1, s.end(), first.begin() + 1)) {
        throw InvalidArgument(fmt::format("Checkpoint: shard {} ('{}') of '{}' has shape {}, which does not stack "
                                          "along axis 0 with shard 0's {}",
                                          i, shards_[i].name(), name, shape_string(s), shape_string(first)));
      }
    }
  }
  safetensors::Dtype dtype() const override { return safetensors::dtype_for<E>(); }
  Shape shape() const override {
    Shape s = shards_.front().shape();
    s[0] = 0;
    for (const auto& shard : shards_) s[0] += shard.shape()[0];
    return s;
  }
  std::string describe() const override {
    std::string shapes;
    for (std::size_t i = 0; i < shards_.size(); ++i) shapes += (i ? ", " : "") + shape_string(shards_[i].shape());
    return fmt::format("sharded variable ({} shard{}: {})", shards_.size(), shards_.size() == 1 ? "" : "s", shapes);
  }
  CheckpointSnapshot snapshot(const std::string& name) const override {
    auto bytes = std::make_shared<std::vector<std::byte>>();
    bytes->reserve(static_cast<std::size_t>(num_elements(shape())) * sizeof(E));
    for (const auto& shard : shards_) {
      const T value = checkpoint_value(shard, name);
      const auto* p = reinterpret_cast<const std::byte*>(tensor_traits<T>::data(value));
      bytes->insert(bytes->end(), p, p + element_count(value) * sizeof(E));
    }
    return CheckpointSnapshot{bytes, safetensors::TensorView{dtype(), shape(), *bytes}};
  }
  void restore(const safetensors::StoredTensor& tensor) override {
    const std::byte* data = tensor.bytes.data();
    // Split by rows: each shard takes as many rows as its own shape has, so the saved layout
    // (how many shards, which sizes) does not matter.
    for (auto& shard : shards_) {
      const Shape s = shard.shape();
      restore_variable(shard, s, data);
      data += static_cast<std::size_t>(num_elements(s)) * sizeof(E);
    }
  }

 private:
  std::vector<Variable<T>> shards_;
};

/// Checkpoints are saved and restored in cross-replica context: inside a step function each
/// replica would read its own copy, and N replicas would all write the same file.
inline void check_cross_replica(const char* what) {
  if (ReplicaContext* ctx = thread_context().replica; ctx && ctx->strategy().num_local_replicas() > 1) {
    throw InvalidArgument(fmt::format("{} was called inside a step function of {} (replica {}); call it in "
                                      "cross-replica context, outside strategy.run()",
                                      what, ctx->strategy().name(), ctx->replica_id_in_sync_group()));
  }
}

}  // namespace detail

class Checkpoint {
 public:
  explicit Checkpoint(CheckpointOptions options = {}) : options_(std::move(options)) {}
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;
  Checkpoint(Checkpoint&&) = default;
  Checkpoint& operator=(Checkpoint&&) = default;

  /// Tracks a variable (plain, mirrored or sync-on-read) under `name`, the tensor's name in the file.
  template <class T>
  Checkpoint& track(std::string name, const Variable<T>& variable) {
    detail::check_host_memory<T>();
    return add(std::move(name), std::make_unique<detail::TrackedVariable<T>>(variable));
  }

  /// Tracks a sharded variable as one tensor: its shards concatenated along axis 0.
  /// (Usable once Sharded<Variable<T>, S> can be instantiated: core/values.hpp's to_tensor()
  /// names element_t<T> in its return type, which a Variable does not have. Until then use
  /// track_sharded with the shard variables.)
  template <class T, class S>
  Checkpoint& track(std::string name, const Sharded<Variable<T>, S>& variable) {
    return track_sharded(std::move(name), variable.shards());
  }

  /// Tracks shard variables (in row order) as one tensor, concatenated along axis 0. They must
  /// agree on every dimension but the first.
  template <class T>
  Checkpoint& track_sharded(std::string name, std::vector<Variable<T>> shards) {
    detail::check_host_memory<T>();
    auto tracked = std::make_unique<detail::TrackedShards<T>>(std::move(shards), name);
    return add(std::move(name), std::move(tracked));
  }

  bool is_tracking(std::string_view name) const { return items_.find(name) != items_.end(); }
  std::vector<std::string> tracked_names() const {
    std::vector<std::string> names;
    for (const auto& [name, item] : items_) names.push_back(name);
    return names;
  }

  /// How many times save() has succeeded (restored from the file by restore()).
  std::int64_t save_counter() const noexcept { return save_counter_; }
  const CheckpointOptions& options() const noexcept { return options_; }

  /// Increments the save counter and writes `<prefix>-<counter>.safetensors` (TF: ckpt-1, ckpt-2,
  /// ...), creating missing directories. Returns the path written.
  std::filesystem::path save(const std::filesystem::path& prefix) {
    detail::check_cross_replica("Checkpoint::save");
    const std::int64_t n = save_counter_ + 1;
    std::filesystem::path path(prefix.string() + fmt::format("-{}.safetensors", n));
    write_file(path, n);
    save_counter_ = n;
    return path;
  }

  /// Writes exactly `path`, leaving the save counter as it is (TF's Checkpoint.write).
  std::filesystem::path write(const std::filesystem::path& path) {
    detail::check_cross_replica("Checkpoint::write");
    write_file(path, save_counter_);
    return path;
  }

  /// Restores every tracked variable from `path`. Each must be in the file with the same dtype and
  /// shape (a sharded one: the concatenated shape); tensors the file has beyond those are ignored.
  /// Nothing is assigned unless everything matches.
  void restore(const std::filesystem::path& path) {
    detail::check_cross_replica("Checkpoint::restore");
    restore(safetensors::read(path));
  }

  /// Restores from a file already read (or parsed from memory).
  void restore(const safetensors::File& file) {
    detail::check_cross_replica("Checkpoint::restore");
    std::vector<std::string> problems;
    std::vector<std::pair<detail::Trackable*, const safetensors::StoredTensor*>> plan;
    for (const auto& [name, item] : items_) {
      const safetensors::StoredTensor* t = file.find(name);
      if (!t) {
        problems.push_back(fmt::format("tensor '{}' (for {}) is not in the file", name, item->describe()));
        continue;
      }
      const Shape want = item->shape();
      if (t->dtype != item->dtype() || t->shape != want) {
        problems.push_back(fmt::format("tensor '{}' is {} with shape {} in the file, but the tracked {} is {} with "
                                       "shape {}",
                                       name, safetensors::describe(t->dtype), shape_string(t->shape), item->describe(),
                                       safetensors::describe(item->dtype()), shape_string(want)));
        continue;
      }
      plan.emplace_back(item.get(), t);
    }
    std::int64_t counter = save_counter_;
    if (auto it = file.metadata.find(detail::kSaveCounterKey); it != file.metadata.end()) {
      const std::string& s = it->second;
      auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), counter);
      if (ec != std::errc{} || ptr != s.data() + s.size() || counter < 0) {
        problems.push_back(fmt::format("{} is \"{}\", not a non-negative integer", detail::kSaveCounterKey, s));
      }
    }
    if (!problems.empty()) {
      throw CheckpointError(fmt::format("cannot restore from '{}': {}", file.origin, fmt::join(problems, "; ")));
    }
    for (auto& [item, tensor] : plan) item->restore(*tensor);
    save_counter_ = counter;
  }

 private:
  friend class CheckpointManager;

  Checkpoint& add(std::string name, std::unique_ptr<detail::Trackable> item) {
    if (name.empty() || name == "__metadata__") {
      throw InvalidArgument(fmt::format("Checkpoint::track: '{}' cannot name a tensor", name));
    }
    if (items_.count(name)) {
      throw InvalidArgument(fmt::format("Checkpoint::track: '{}' is already tracked; each name holds one tensor", name));
    }
    items_.emplace(std::move(name), std::move(item));
    return *this;
  }

  void write_file(const std::filesystem::path& path, std::int64_t counter) {
    // Every value is copied out first so that the file is one consistent snapshot.
    std::vector<detail::CheckpointSnapshot> snapshots;
    safetensors::TensorMap tensors;
    for (const auto& [name, item] : items_) {
      snapshots.push_back(item->snapshot(name));
      tensors.emplace(name, snapshots.back().view);
    }
    safetensors::Metadata metadata{{std::string(detail::kSaveCounterKey), fmt::format("{}", counter)},
                                   {std::string(detail::kLibraryVersionKey), DISTRIBUTE_VERSION_STRING}};
    if (path.has_parent_path()) {
      std::error_code ec;
      std::filesystem::create_directories(path.parent_path(), ec);
      if (ec) {
        throw CheckpointError(fmt::format("cannot create the directory '{}' for checkpoint '{}': {}",
                                          path.parent_path().string(), path.string(), ec.message()));
      }
    }
    safetensors::write(path, tensors, metadata, safetensors::WriteOptions{options_.durable, options_.on_progress});
  }

  std::map<std::string, std::unique_ptr<detail::Trackable>, std::less<>> items_;
  std::int64_t save_counter_ = 0;
  CheckpointOptions options_;
};

DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CHECKPOINT_CHECKPOINT_HPP
// ---- end <distribute/checkpoint/checkpoint.hpp> ----
// ---- begin <distribute/checkpoint/checkpoint_manager.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CHECKPOINT_CHECKPOINT_MANAGER_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CHECKPOINT_CHECKPOINT_MANAGER_HPP
// CheckpointManager: numbered checkpoints in one directory, keeping the newest few.
//
//   ds::CheckpointManager manager(ckpt, "/tmp/run", 3);
//   manager.restore_or_initialize();               // resume if the directory has a checkpoint
//   for (...) { train(); manager.save(); }         // ckpt-1.safetensors, ckpt-2, ... newest 3 kept
//
// The directory holds `<name>-<N>.safetensors` files and a small TF-style index file named
// `checkpoint` (model_checkpoint_path / all_model_checkpoint_paths, written atomically). The
// files themselves are the truth: latest_checkpoint() is the highest N present, so a crash between
// writing a checkpoint and updating the index loses nothing. Numbers only grow within a directory
// (save() continues after the highest N present), which is what makes "highest" mean "newest".

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>

// ---- begin <distribute/checkpoint/checkpoint.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CHECKPOINT_CHECKPOINT_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CHECKPOINT_CHECKPOINT_HPP
// Checkpoint: named variables saved to, and restored from, one safetensors file.
//
//   ds::Checkpoint ckpt;
//   ckpt.track("dense/kernel", w).track("step", step);
//   auto path = ckpt.save("/tmp/run/ckpt");     // /tmp/run/ckpt-1.safetensors
//   ckpt.restore(path);
//
// What is saved for each kind of variable (TF's rules):
//   plain / mirrored (ON_WRITE)   one tensor, the primary copy; restored into every copy
//   sync-on-read (ON_READ)        the cross-replica aggregate (SUM/MEAN/ONLY_FIRST_REPLICA);
//                                 restored with a cross-replica assign (SUM: split over the copies)
//   sharded (track_sharded)       one tensor, the shards concatenated along axis 0; restorable into
//                                 any number of shards whose rows add up to the saved rows
// Saving and restoring happen in cross-replica context (outside strategy.run()). A Checkpoint is
// not thread-safe: one thread saves or restores at a time.

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

// ---- begin <distribute/checkpoint/safetensors.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CHECKPOINT_SAFETENSORS_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CHECKPOINT_SAFETENSORS_HPP
// safetensors files: read, write, validate.
//
// Layout (https://github.com/huggingface/safetensors):
//   8 bytes   N, little-endian u64
//   N bytes   JSON header: {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//                           "__metadata__": {"key": "value", ...}}
//             padded with spaces so that the payload starts 8-byte aligned
//   payload   the tensors' bytes, row-major, little-endian; offsets are relative to the payload
//
// What distribute adds, inside __metadata__ (so any safetensors reader still reads the file):
//   "distribute.format": "1"
//   "distribute.crc32.<tensor>": CRC-32 (IEEE, as zlib.crc32) of that tensor's bytes, 8 hex digits
//   "distribute.header_crc32": CRC-32 of a canonical form of the header (see detail::header_digest),
//                              so that a corrupted shape, offset, name or metadata value is caught too
// A file carrying any of these must carry all of them. Files without them (written by Python's
// safetensors, say) are read with the structural checks only.
//
// Every problem is a ds::CheckpointError naming the file and, where there is one, the tensor.

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <boost/crc.hpp>
#include <boost/json.hpp>
#include <fmt/format.h>

// ---- begin <distribute/checkpoint/detail/posix_file.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CHECKPOINT_DETAIL_POSIX_FILE_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CHECKPOINT_DETAIL_POSIX_FILE_HPP
// POSIX file primitives for checkpoints: reads and writes that retry short counts and EINTR, and
// AtomicFile, the replace-on-commit protocol that keeps a crash from ever exposing a partial file:
//   write a temp file in the target's directory → fsync it → rename it over the target → fsync
//   the directory (so the rename itself survives a power loss).
// rename(2) within one directory is atomic, so a reader sees the old file or the new one, never a mix.

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include <fmt/format.h>


DISTRIBUTE_BEGIN_NAMESPACE

namespace detail {

inline std::string errno_message(int err) { return std::system_category().message(err); }

/// An owned file descriptor; closes on destruction (errors there are ignored: use close()).
class FileDescriptor {
 public:
  FileDescriptor() = default;
  explicit FileDescriptor(int fd) noexcept : fd_(fd) {}
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  FileDescriptor& operator=(FileDescriptor&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() { reset(); }

  int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }

  /// Closes and reports the error: on NFS a failed write may only surface here.
  void close(const std::filesystem::path& path) {
    if (fd_ < 0) return;
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0 && errno != EINTR) {
      throw CheckpointError(fmt::format("closing '{}' failed: {}", path.string(), errno_message(errno)));
    }
  }

 private:
  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int fd_ = -1;
};

inline FileDescriptor open_for_reading(const std::filesystem::path& path) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    throw CheckpointError(fmt::format("cannot open checkpoint file '{}': {}", path.string(), errno_message(errno)));
  }
  return FileDescriptor(fd);
}

inline std::uint64_t file_size(const FileDescriptor& fd, const std::filesystem::path& path) {
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    throw CheckpointError(fmt::format("cannot stat '{}': {}", path.string(), errno_message(errno)));
  }
  if (!S_ISREG(st.st_mode)) throw CheckpointError(fmt::format("'{}' is not a regular file", path.string()));
  return static_cast<std::uint64_t>(st.st_size);
}

/// Reads exactly `out.size()` bytes at `offset`; a short file is a CheckpointError naming `what`.
inline void read_exact(const FileDescriptor& fd, std::span<std::byte> out, std::uint64_t offset,
                       const std::filesystem::path& path, std::string_view what) {
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::pread(fd.get(), out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw CheckpointError(fmt::format("reading {} from '{}' failed: {}", what, path.string(), errno_message(errno)));
    }
    if (n == 0) {
      throw CheckpointError(fmt::format("'{}' ended after {} of the {} bytes of {}: the file is truncated",
                                        path.string(), done, out.size(), what));
    }
    done += static_cast<std::size_t>(n);
  }
}

inline void write_all(const FileDescriptor& fd, std::span<const std::byte> bytes, const std::filesystem::path& path) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd.get(), bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw CheckpointError(fmt::format("writing '{}' failed after {} bytes: {}", path.string(), done,
                                        errno_message(errno)));
    }
    done += static_cast<std::size_t>(n);
  }
}

inline void fsync_or_throw(const FileDescriptor& fd, const std::filesystem::path& path) {
  while (::fsync(fd.get()) != 0) {
    if (errno == EINTR) continue;
    throw CheckpointError(fmt::format("fsync of '{}' failed: {}", path.string(), errno_message(errno)));
  }
}

/// Makes a rename or unlink in `dir` durable. Some filesystems cannot fsync a directory (EINVAL);
/// there is nothing more to do on those.
inline void fsync_directory(const std::filesystem::path& dir) {
  const std::filesystem::path d = dir.empty() ? std::filesystem::path(".") : dir;
  FileDescriptor fd(::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd) throw CheckpointError(fmt::format("cannot open directory '{}': {}", d.string(), errno_message(errno)));
  while (::fsync(fd.get()) != 0) {
    if (errno == EINTR) continue;
    if (errno == EINVAL || errno == EROFS) return;
    throw CheckpointError(fmt::format("fsync of directory '{}' failed: {}", d.string(), errno_message(errno)));
  }
}

inline const std::string& host_name() {
  static const std::string name = [] {
    char buf[256] = {};
    if (::gethostname(buf, sizeof buf - 1) != 0) return std::string("localhost");
    std::string s(buf);
    for (char& c : s) {
      if (c == '/' || c == ' ') c = '_';
    }
    return s.empty() ? std::string("localhost") : s;
  }();
  return name;
}

// Temp files are named ".<target>.tmp.<host>.<pid>.<seq>": hidden, next to the target (rename
// must not cross filesystems), and attributable, so that leftovers of a killed writer can be
// recognised and removed without touching a live writer's file.
inline std::string temp_prefix(const std::filesystem::path& target) {
  return "." + target.filename().string() + ".tmp.";
}


/// The file name a temp file was made for, when `name` is a temp file of a writer on this host
/// whose process no longer exists (killed mid-save); nothing otherwise.
inline std::optional<std::string> stale_temp_target(const std::string& name) {
  // .<target>.tmp.<host>.<pid>.<seq>; the host and the target may contain dots, so match from the right.
  const std::string marker = ".tmp." + host_name() + ".";
  const auto seq_dot = name.rfind('.');
  if (name.size() < 2 || name.front() != '.' || seq_dot == std::string::npos || seq_dot == 0) return std::nullopt;
  const auto pid_dot = name.rfind('.', seq_dot - 1);
  if (pid_dot == std::string::npos || pid_dot + 1 < marker.size()) return std::nullopt;
  const auto marker_at = pid_dot + 1 - marker.size();
  if (marker_at < 1 || name.compare(marker_at, marker.size(), marker) != 0) return std::nullopt;
  long long pid = 0;
  const char* first = name.data() + pid_dot + 1;
  const char* last = name.data() + seq_dot;
  auto [ptr, err] = std::from_chars(first, last, pid);
  if (err != std::errc{} || ptr != last || pid <= 0) return std::nullopt;
  if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) return std::nullopt;  // alive (or not ours to judge)
  return name.substr(1, marker_at - 1);
}

/// Removes, from `dir`, the temp files of dead writers on this host whose target satisfies
/// `is_target`. Best effort: a file that cannot be removed is left alone.
template <class Pred>
void remove_stale_temp_files(const std::filesystem::path& dir, Pred&& is_target) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::directory_iterator it(dir.empty() ? fs::path(".") : dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    if (auto target = stale_temp_target(it->path().filename().string()); target && is_target(*target)) {
      std::error_code ignored;
      fs::remove(it->path(), ignored);
    }
  }
}

/// A file that appears at `target` only on commit(), complete and durable; destroyed without a
/// commit (an exception, an early return) it removes its temp file and leaves `target` as it was.
class AtomicFile {
 public:
  explicit AtomicFile(std::filesystem::path target, bool durable = true)
      : target_(std::move(target)), durable_(durable) {
    const std::string filename = target_.filename().string();
    remove_stale_temp_files(target_.parent_path(), [&](const std::string& t) { return t == filename; });
    static std::atomic<std::uint64_t> sequence{0};
    for (int attempt = 0; attempt < 100; ++attempt) {
      temp_ = target_.parent_path() / fmt::format("{}{}.{}.{}", temp_prefix(target_), host_name(),
                                                  static_cast<long long>(::getpid()), sequence.fetch_add(1));
      int fd;
      do {
        fd = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      } while (fd < 0 && errno == EINTR);
      if (fd >= 0) {
        fd_ = FileDescriptor(fd);
        return;
      }
      if (errno != EEXIST) {
        throw CheckpointError(fmt::format("cannot create a temporary file next to '{}' ({}): {}", target_.string(),
                                          temp_.string(), errno_message(errno)));
      }
    }
    throw CheckpointError(fmt::format("cannot create a unique temporary file next to '{}'", target_.string()));
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile() {
    if (!committed_) {
      fd_ = FileDescriptor();
      ::unlink(temp_.c_str());
    }
  }

  void write(std::span<const std::byte> bytes) { write_all(fd_, bytes, temp_); }

  /// fsync → close → rename over the target → fsync the directory.
  void commit() {
    if (durable_) fsync_or_throw(fd_, temp_);
    fd_.close(temp_);
    if (::rename(temp_.c_str(), target_.c_str()) != 0) {
      throw CheckpointError(fmt::format("cannot rename '{}' to '{}': {}", temp_.string(), target_.string(),
                                        errno_message(errno)));
    }
    committed_ = true;
    if (durable_) fsync_directory(target_.parent_path());
  }

  const std::filesystem::path& temp_path() const noexcept { return temp_; }

 private:
  std::filesystem::path target_;
  std::filesystem::path temp_;
  FileDescriptor fd_;
  bool durable_;
  bool committed_ = false;
};

}  // namespace detail

DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CHECKPOINT_DETAIL_POSIX_FILE_HPP
// ---- end <distribute/checkpoint/detail/posix_file.hpp> ----

static_assert(std::endian::native == std::endian::little,
              "distribute/checkpoint: safetensors payloads are little-endian; big-endian hosts are not supported");

DISTRIBUTE_BEGIN_NAMESPACE

namespace safetensors {

/// The element types of a safetensors file, spelled as in the file. F16 and BF16 have no C++
/// arithmetic type here: they are carried as raw 2-byte values (float16 / bfloat16 below).
enum class Dtype : std::uint8_t { F16, BF16, F32, F64, I8, I16, I32, I64, U8, U16, U32, U64, Bool };

inline constexpr std::array<Dtype, 13> all_dtypes = {Dtype::F16, Dtype::BF16, Dtype::F32, Dtype::F64, Dtype::I8,
                                                     Dtype::I16, Dtype::I32,  Dtype::I64, Dtype::U8,  Dtype::U16,
                                                     Dtype::U32, Dtype::U64,  Dtype::Bool};

/// "F32", "BOOL", ... as written in the header.
constexpr std::string_view to_string(Dtype d) noexcept {
  switch (d) {
    case Dtype::F16: return "F16";
    case Dtype::BF16: return "BF16";
    case Dtype::F32: return "F32";
    case Dtype::F64: return "F64";
    case Dtype::I8: return "I8";
    case Dtype::I16: return "I16";
    case Dtype::I32: return "I32";
    case Dtype::I64: return "I64";
    case Dtype::U8: return "U8";
    case Dtype::U16: return "U16";
    case Dtype::U32: return "U32";
    case Dtype::U64: return "U64";
    case Dtype::Bool: return "BOOL";
  }
  return "?";
}

constexpr std::size_t size_of(Dtype d) noexcept {
  switch (d) {
    case Dtype::I8: case Dtype::U8: case Dtype::Bool: return 1;
    case Dtype::F16: case Dtype::BF16: case Dtype::I16: case Dtype::U16: return 2;
    case Dtype::F32: case Dtype::I32: case Dtype::U32: return 4;
    case Dtype::F64: case Dtype::I64: case Dtype::U64: return 8;
  }
  return 0;
}

constexpr std::optional<Dtype> parse_dtype(std::string_view s) noexcept {
  for (Dtype d : all_dtypes) {
    if (to_string(d) == s) return d;
  }
  return std::nullopt;
}

/// The file dtype of a library element type.
constexpr Dtype from_dtype(DType d) noexcept {
  switch (d) {
    case DType::F32: return Dtype::F32;
    case DType::F64: return Dtype::F64;
    case DType::I8: return Dtype::I8;
    case DType::I16: return Dtype::I16;
    case DType::I32: return Dtype::I32;
    case DType::I64: return Dtype::I64;
    case DType::U8: return Dtype::U8;
    case DType::U16: return Dtype::U16;
    case DType::U32: return Dtype::U32;
    case DType::U64: return Dtype::U64;
    case DType::Bool: return Dtype::Bool;
  }
  return Dtype::F32;
}

/// The library element type of a file dtype; none for F16/BF16.
constexpr std::optional<DType> to_dtype(Dtype d) noexcept {
  switch (d) {
    case Dtype::F16: case Dtype::BF16: return std::nullopt;
    case Dtype::F32: return DType::F32;
    case Dtype::F64: return DType::F64;
    case Dtype::I8: return DType::I8;
    case Dtype::I16: return DType::I16;
    case Dtype::I32: return DType::I32;
    case Dtype::I64: return DType::I64;
    case Dtype::U8: return DType::U8;
    case Dtype::U16: return DType::U16;
    case Dtype::U32: return DType::U32;
    case Dtype::U64: return DType::U64;
    case Dtype::Bool: return DType::Bool;
  }
  return std::nullopt;
}

/// "F32 (float32)"; "F16" for the types with no library counterpart.
inline std::string describe(Dtype d) {
  auto lib = to_dtype(d);
  return lib ? fmt::format("{} ({})", to_string(d), distribute::to_string(*lib)) : std::string(to_string(d));
}

/// IEEE half precision, stored as its bit pattern. No arithmetic, no implicit conversion:
/// distribute moves these values, it does not compute with them.
struct float16 {
  std::uint16_t bits = 0;
  friend constexpr bool operator==(float16, float16) = default;
};
/// bfloat16 (the upper half of an IEEE float32), stored as its bit pattern.
struct bfloat16 {
  std::uint16_t bits = 0;
  friend constexpr bool operator==(bfloat16, bfloat16) = default;
};

/// An element type a safetensors tensor can be read as or written from.
template <class T>
concept StorableElement = Element<T> || std::same_as<T, float16> || std::same_as<T, bfloat16>;

template <StorableElement T>
constexpr Dtype dtype_for() noexcept {
  if constexpr (std::same_as<T, float16>) return Dtype::F16;
  else if constexpr (std::same_as<T, bfloat16>) return Dtype::BF16;
  else return from_dtype(dtype_of<T>());
}

/// Borrowed bytes of one tensor to write: the caller keeps them alive during the write.
struct TensorView {
  Dtype dtype = Dtype::F32;
  Shape shape;
  std::span<const std::byte> bytes;

  /// A view of `data` (row-major) as a tensor of `shape`; the element count must match.
  template <StorableElement T>
  static TensorView of(Shape shape, std::span<const T> data) {
    for (auto d : shape) {
      if (d < 0) throw InvalidArgument(fmt::format("safetensors: negative dimension in shape {}", shape_string(shape)));
    }
    if (num_elements(shape) != static_cast<std::int64_t>(data.size())) {
      throw InvalidArgument(fmt::format("safetensors: shape {} holds {} elements but {} were given",
                                        shape_string(shape), num_elements(shape), data.size()));
    }
    return TensorView{dtype_for<T>(), std::move(shape), std::as_bytes(data)};
  }
};

/// A view of any host TensorLike value (a scalar, std::vector, ds::Tensor, a user type...).
template <TensorLike U>
TensorView view_of(const U& value) {
  static_assert(memory_space_v<U> == MemorySpace::host,
                "safetensors::view_of: the value lives in device memory; copy it to the host first");
  using E = element_t<U>;
  return TensorView{dtype_for<E>(), shape_of(value),
                    std::as_bytes(std::span<const E>(tensor_traits<U>::data(value), element_count(value)))};
}

/// One tensor read from a file (owns its bytes).
struct StoredTensor {
  std::string name;
  Dtype dtype = Dtype::F32;
  Shape shape;
  std::vector<std::byte> bytes;

  std::int64_t num_elements() const { return distribute::num_elements(shape); }
  TensorView view() const { return TensorView{dtype, shape, bytes}; }

  /// The elements as T, which must be exactly the stored dtype: F16 is not read as float, nor
  /// I32 as I64 (a silent conversion would hide a mismatch between a file and its reader).
  template <StorableElement T>
  std::vector<T> values() const {
    check_dtype(dtype_for<T>());
    const std::size_t n = bytes.size() / sizeof(T);
    if constexpr (std::is_same_v<T, bool>) {
      std::vector<bool> out(n);
      for (std::size_t i = 0; i < n; ++i) out[i] = bytes[i] != std::byte{0};
      return out;
    } else {
      std::vector<T> out(n);
      if (n) std::memcpy(out.data(), bytes.data(), bytes.size());
      return out;
    }
  }

  /// The tensor as a ds::Tensor<T> (T exactly the stored dtype).
  template <Element T>
    requires(!std::is_same_v<T, bool>)
  Tensor<T> to_tensor() const {
    return Tensor<T>(shape, values<T>());
  }

  void check_dtype(Dtype wanted) const {
    if (wanted != dtype) {
      throw CheckpointError(fmt::format("tensor '{}' has dtype {} and cannot be read as {}; distribute does not "
                                        "convert between element types",
                                        name, describe(dtype), describe(wanted)));
    }
  }
};

using Metadata = std::map<std::string, std::string, std::less<>>;

/// The contents of a safetensors file.
struct File {
  /// The path it was read from, or the name given to parse().
  std::string origin;
  /// In payload order.
  std::vector<StoredTensor> tensors;
  Metadata metadata;

  const StoredTensor* find(std::string_view name) const {
    for (const auto& t : tensors) {
      if (t.name == name) return &t;
    }
    return nullptr;
  }
  const StoredTensor& at(std::string_view name) const {
    if (const StoredTensor* t = find(name)) return *t;
    std::string names;
    for (std::size_t i = 0; i < tensors.size() && i < 20; ++i) names += fmt::format("{}'{}'", i ? ", " : "", tensors[i].name);
    if (tensors.size() > 20) names += fmt::format(", ... ({} in all)", tensors.size());
    throw CheckpointError(fmt::format("'{}' has no tensor '{}' (it has: {})", origin, name,
                                      tensors.empty() ? std::string("none") : names));
  }
};

/// Tensors to write, by name.
using TensorMap = std::map<std::string, TensorView, std::less<>>;

struct WriteOptions {
  /// fsync the file and its directory before returning (off only for scratch files).
  bool durable = true;
  /// Called after each chunk written: (bytes written so far, total bytes).
  std::function<void(std::uint64_t, std::uint64_t)> on_progress;
};

struct ReadOptions {
  /// Verify distribute's CRC-32s when the file has them.
  bool verify_checksums = true;
};

namespace detail {

inline constexpr std::string_view kFormatKey = "distribute.format";
inline constexpr std::string_view kFormatVersion = "1";
inline constexpr std::string_view kHeaderCrcKey = "distribute.header_crc32";
inline constexpr std::string_view kTensorCrcPrefix = "distribute.crc32.";
inline constexpr std::string_view kMetadataKey = "__metadata__";
// The Rust reference implementation refuses larger headers too; it bounds what a corrupted
// length prefix can make us allocate.
inline constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;
inline constexpr std::size_t kWriteChunk = std::size_t{4} << 20;

inline std::uint32_t crc32(std::span<const std::byte> bytes) {
  boost::crc_32_type crc;
  crc.process_bytes(bytes.data(), bytes.size());
  return crc.checksum();
}
inline std::string crc_hex(std::uint32_t crc) { return fmt::format("{:08x}", crc); }

inline bool is_reserved_key(std::string_view key) {
  return key == kFormatKey || key == kHeaderCrcKey || key.substr(0, kTensorCrcPrefix.size()) == kTensorCrcPrefix;
}

struct Entry {
  std::string name;
  Dtype dtype = Dtype::F32;
  Shape shape;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
};

// The header's meaning in a canonical form: tensors by name, then metadata by key (without the
// header checksum itself). The JSON text is not hashed, so formatting and key order are free.
//   "T" name NUL dtype NUL dims,joined,by,commas NUL begin NUL end "\n"
//   "M" key NUL value "\n"
inline std::uint32_t header_digest(std::vector<const Entry*> entries, const Metadata& metadata) {
  std::sort(entries.begin(), entries.end(), [](const Entry* a, const Entry* b) { return a->name < b->name; });
  std::string text;
  for (const Entry* e : entries) {
    text += 'T';
    text += e->name;
    text += '\0';
    text += to_string(e->dtype);
    text += '\0';
    text += fmt::format("{}", fmt::join(e->shape, ","));
    text += '\0';
    text += fmt::format("{}", e->begin);
    text += '\0';
    text += fmt::format("{}\n", e->end);
  }
  for (const auto& [key, value] : metadata) {
    if (key == kHeaderCrcKey) continue;
    text += 'M';
    text += key;
    text += '\0';
    text += value;
    text += '\n';
  }
  return crc32(std::as_bytes(std::span(text.data(), text.size())));
}

inline std::uint64_t checked_size(const std::string& origin, const Entry& e) {
  std::uint64_t n = size_of(e.dtype);
  for (auto d : e.shape) {
    if (__builtin_mul_overflow(n, static_cast<std::uint64_t>(d), &n)) {
      throw CheckpointError(fmt::format("'{}': tensor '{}' has shape {}, whose byte size overflows 64 bits", origin,
                                        e.name, shape_string(e.shape)));
    }
  }
  return n;
}

inline std::uint64_t json_unsigned(const boost::json::value& v, const std::string& origin, const std::string& name,
                                   const char* field) {
  if (v.is_uint64()) return v.get_uint64();
  if (v.is_int64() && v.get_int64() >= 0) return static_cast<std::uint64_t>(v.get_int64());
  throw CheckpointError(fmt::format("'{}': tensor '{}': {} must hold non-negative integers, not {}", origin, name, field,
                                    boost::json::serialize(v)));
}

// A parsed and validated header: entries in payload order, the metadata, and whether the file
// carries distribute's checksums.
struct Header {
  std::vector<Entry> entries;  // in payload order
  Metadata metadata;
  bool has_checksums = false;
};

inline Header parse_header(std::string_view json, std::uint64_t payload_size, const std::string& origin) {
  if (json.empty() || json.front() != '{') {
    throw CheckpointError(fmt::format("'{}': the header does not start with '{{': not a safetensors file, or a "
                                      "corrupted one",
                                      origin));
  }
  boost::system::error_code ec;
  boost::json::value root = boost::json::parse(json, ec);
  if (ec) {
    throw CheckpointError(fmt::format("'{}': the JSON header ({} bytes) is invalid: {}", origin, json.size(),
                                      ec.message()));
  }
  if (!root.is_object()) throw CheckpointError(fmt::format("'{}': the JSON header is not an object", origin));

  Header h;
  for (const auto& kv : root.get_object()) {
    const std::string name(kv.key());
    const boost::json::value& v = kv.value();
    if (name == kMetadataKey) {
      if (!v.is_object()) {
        throw CheckpointError(fmt::format("'{}': __metadata__ must be an object of strings, not {}", origin,
                                          boost::json::serialize(v)));
      }
      for (const auto& m : v.get_object()) {
        if (!m.value().is_string()) {
          throw CheckpointError(fmt::format("'{}': __metadata__ value of '{}' must be a string, not {}", origin,
                                            std::string_view(m.key()), boost::json::serialize(m.value())));
        }
        h.metadata.emplace(std::string(m.key()), std::string(m.value().get_string()));
      }
      continue;
    }
    if (!v.is_object()) {
      throw CheckpointError(fmt::format("'{}': tensor '{}' must be described by an object, not {}", origin, name,
                                        boost::json::serialize(v)));
    }
    const auto& obj = v.get_object();
    Entry e;
    e.name = name;
    const boost::json::value* dtype = obj.if_contains("dtype");
    const boost::json::value* shape = obj.if_contains("shape");
    const boost::json::value* offsets = obj.if_contains("data_offsets");
    if (!dtype || !shape || !offsets) {
      throw CheckpointError(fmt::format("'{}': tensor '{}' lacks {}", origin, name,
                                        !dtype ? "\"dtype\"" : !shape ? "\"shape\"" : "\"data_offsets\""));
    }
    for (const auto& field : obj) {
      if (field.key() != "dtype" && field.key() != "shape" && field.key() != "data_offsets") {
        throw CheckpointError(fmt::format("'{}': tensor '{}' has an unknown field \"{}\"", origin, name,
                                          std::string_view(field.key())));
      }
    }
    if (!dtype->is_string()) {
      throw CheckpointError(fmt::format("'{}': tensor '{}': dtype must be a string, not {}", origin, name,
                                        boost::json::serialize(*dtype)));
    }
    auto d = parse_dtype(dtype->get_string());
    if (!d) {
      throw CheckpointError(fmt::format("'{}': tensor '{}' has dtype \"{}\", which distribute does not know (known: "
                                        "F16, BF16, F32, F64, I8, I16, I32, I64, U8, U16, U32, U64, BOOL)",
                                        origin, name, std::string_view(dtype->get_string())));
    }
    e.dtype = *d;
    if (!shape->is_array()) {
      throw CheckpointError(fmt::format("'{}': tensor '{}': shape must be an array, not {}", origin, name,
                                        boost::json::serialize(*shape)));
    }
    for (const auto& dim : shape->get_array()) {
      const std::uint64_t u = json_unsigned(dim, origin, name, "shape");
      if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
        throw CheckpointError(fmt::format("'{}': tensor '{}': dimension {} is too large", origin, name, u));
      }
      e.shape.push_back(static_cast<std::int64_t>(u));
    }
    if (!offsets->is_array() || offsets->get_array().size() != 2) {
      throw CheckpointError(fmt::format("'{}': tensor '{}': data_offsets must be [begin, end], not {}", origin, name,
                                        boost::json::serialize(*offsets)));
    }
    e.begin = json_unsigned(offsets->get_array()[0], origin, name, "data_offsets");
    e.end = json_unsigned(offsets->get_array()[1], origin, name, "data_offsets");
    if (e.begin > e.end) {
      throw CheckpointError(fmt::format("'{}': tensor '{}' has data_offsets [{}, {}]: begin is after end", origin,
                                        name, e.begin, e.end));
    }
    const std::uint64_t expected = checked_size(origin, e);
    if (e.end - e.begin != expected) {
      throw CheckpointError(fmt::format("'{}': tensor '{}' of dtype {} and shape {} needs {} bytes, but its "
                                        "data_offsets [{}, {}] span {}",
                                        origin, name, to_string(e.dtype), shape_string(e.shape), expected, e.begin,
                                        e.end, e.end - e.begin));
    }
    if (e.end > payload_size) {
      throw CheckpointError(fmt::format("'{}': tensor '{}' has data_offsets [{}, {}] but the payload holds only {} "
                                        "bytes: the file is truncated or the offsets are corrupted",
                                        origin, name, e.begin, e.end, payload_size));
    }
    h.entries.push_back(std::move(e));
  }

  // The tensors must tile the payload exactly: no overlap (two tensors aliasing bytes), no gap
  // (bytes nobody owns), nothing after the last one.
  std::sort(h.entries.begin(), h.entries.end(),
            [](const Entry& a, const Entry& b) { return std::tie(a.begin, a.end) < std::tie(b.begin, b.end); });
  std::uint64_t cursor = 0;
  const Entry* previous = nullptr;
  for (const Entry& e : h.entries) {
    if (e.begin != cursor) {
      if (previous) {
        throw CheckpointError(fmt::format("'{}': tensor '{}' (data_offsets [{}, {}]) {} tensor '{}' (data_offsets "
                                          "[{}, {}]); tensors must be contiguous and must not overlap",
                                          origin, e.name, e.begin, e.end,
                                          e.begin < cursor ? "overlaps" : "leaves a gap after", previous->name,
                                          previous->begin, previous->end));
      }
      throw CheckpointError(fmt::format("'{}': the first tensor '{}' starts at payload byte {}, not 0", origin, e.name,
                                        e.begin));
    }
    cursor = e.end;
    previous = &e;
  }
  if (cursor != payload_size) {
    throw CheckpointError(fmt::format("'{}': the tensors cover {} bytes but the payload has {}: the file has "
                                      "trailing bytes or its header length is corrupted",
                                      origin, cursor, payload_size));
  }

  // distribute's checksums: all or nothing, so that corrupting one key cannot switch them off.
  bool any = false;
  for (const auto& [key, value] : h.metadata) any = any || is_reserved_key(key);
  h.has_checksums = any;
  if (any) {
    auto need = [&](std::string_view key) -> const std::string& {
      auto it = h.metadata.find(key);
      if (it == h.metadata.end()) {
        throw CheckpointError(fmt::format("'{}': __metadata__ has distribute checksums but lacks \"{}\": the header "
                                          "is corrupted",
                                          origin, key));
      }
      return it->second;
    };
    if (need(kFormatKey) != kFormatVersion) {
      throw CheckpointError(fmt::format("'{}': distribute.format is \"{}\"; this version reads format {}", origin,
                                        need(kFormatKey), kFormatVersion));
    }
    std::vector<const Entry*> all;
    for (const Entry& e : h.entries) {
      all.push_back(&e);
      need(fmt::format("{}{}", kTensorCrcPrefix, e.name));
    }
    for (const auto& [key, value] : h.metadata) {
      if (key.rfind(kTensorCrcPrefix, 0) == 0) {
        const std::string tensor = key.substr(kTensorCrcPrefix.size());
        if (std::none_of(h.entries.begin(), h.entries.end(), [&](const Entry& e) { return e.name == tensor; })) {
          throw CheckpointError(fmt::format("'{}': __metadata__ has a checksum for tensor '{}', which the header "
                                            "does not list: the header is corrupted",
                                            origin, tensor));
        }
      }
    }
    const std::string stored = need(kHeaderCrcKey);
    const std::string computed = crc_hex(header_digest(std::move(all), h.metadata));
    if (stored != computed) {
      throw CheckpointError(fmt::format("'{}': header checksum mismatch (stored {}, computed {}): the header is "
                                        "corrupted",
                                        origin, stored, computed));
    }
  }
  return h;
}

// After the bytes are in: BOOL must be 0/1 (anything else is not a bool in C++), and the CRC.
inline void check_tensor_bytes(const Header& h, const StoredTensor& t, const std::string& origin,
                               const ReadOptions& options) {
  if (t.dtype == Dtype::Bool) {
    for (std::size_t i = 0; i < t.bytes.size(); ++i) {
      if (static_cast<unsigned>(t.bytes[i]) > 1) {
        throw CheckpointError(fmt::format("'{}': BOOL tensor '{}' holds byte {} at element {}; only 0 and 1 are "
                                          "booleans",
                                          origin, t.name, static_cast<unsigned>(t.bytes[i]), i));
      }
    }
  }
  if (!h.has_checksums || !options.verify_checksums) return;
  const std::string& stored = h.metadata.find(fmt::format("{}{}", kTensorCrcPrefix, t.name))->second;
  const std::string computed = crc_hex(crc32(t.bytes));
  if (stored != computed) {
    throw CheckpointError(fmt::format("'{}': tensor '{}' is corrupted: the CRC-32 of its {} bytes is {}, the file "
                                      "recorded {}",
                                      origin, t.name, t.bytes.size(), computed, stored));
  }
}

inline std::uint64_t read_le64(const std::byte* p) {
  std::uint64_t v = 0;
  std::memcpy(&v, p, 8);
  return v;  // little-endian host (static_assert above)
}

inline void check_prefix(std::uint64_t file_size, const std::string& origin) {
  if (file_size < 8) {
    throw CheckpointError(fmt::format("'{}' is {} bytes long, too short for the 8-byte header length of a "
                                      "safetensors file: truncated, or not a safetensors file",
                                      origin, file_size));
  }
}
inline void check_header_length(std::uint64_t n, std::uint64_t file_size, const std::string& origin) {
  if (n > file_size - 8) {
    throw CheckpointError(fmt::format("'{}': the header length {} runs past the end of the file ({} bytes follow "
                                      "the length): truncated or corrupted",
                                      origin, n, file_size - 8));
  }
  if (n > kMaxHeaderBytes) {
    throw CheckpointError(fmt::format("'{}': the header length {} exceeds the limit of {} bytes: corrupted", origin, n,
                                      kMaxHeaderBytes));
  }
}

// The header JSON (padded) and the payload order, shared by serialize() and write().
struct Layout {
  std::string header;  // includes the 8-byte length prefix and the padding
  std::vector<std::pair<const std::string*, const TensorView*>> order;
  std::uint64_t payload_size = 0;
};

inline Layout plan(const TensorMap& tensors, const Metadata& user_metadata) {
  Layout layout;
  for (const auto& [key, value] : user_metadata) {
    if (is_reserved_key(key)) {
      throw InvalidArgument(fmt::format("safetensors: metadata key '{}' is reserved; distribute computes it", key));
    }
  }
  for (const auto& [name, view] : tensors) {
    if (name.empty() || name == kMetadataKey) {
      throw InvalidArgument(fmt::format("safetensors: '{}' cannot be a tensor name", name));
    }
    for (auto d : view.shape) {
      if (d < 0) {
        throw InvalidArgument(fmt::format("safetensors: tensor '{}' has a negative dimension in shape {}", name,
                                          shape_string(view.shape)));
      }
    }
    const std::uint64_t want = static_cast<std::uint64_t>(num_elements(view.shape)) * size_of(view.dtype);
    if (view.bytes.size() != want) {
      throw InvalidArgument(fmt::format("safetensors: tensor '{}' of dtype {} and shape {} needs {} bytes, but {} "
                                        "were given",
                                        name, to_string(view.dtype), shape_string(view.shape), want,
                                        view.bytes.size()));
    }
    layout.order.emplace_back(&name, &view);
  }
  // Widest elements first: with an 8-aligned payload every tensor then starts at a multiple of
  // its element size, so a reader may map the file and use the data in place (as Python's does).
  std::stable_sort(layout.order.begin(), layout.order.end(),
                   [](const auto& a, const auto& b) { return size_of(a.second->dtype) > size_of(b.second->dtype); });

  std::vector<Entry> entries;
  entries.reserve(layout.order.size());
  Metadata metadata = user_metadata;
  std::uint64_t offset = 0;
  for (const auto& [name, view] : layout.order) {
    entries.push_back(Entry{*name, view->dtype, view->shape, offset, offset + view->bytes.size()});
    offset += view->bytes.size();
    metadata.emplace(fmt::format("{}{}", kTensorCrcPrefix, *name), crc_hex(crc32(view->bytes)));
  }
  layout.payload_size = offset;
  metadata.emplace(std::string(kFormatKey), std::string(kFormatVersion));
  std::vector<const Entry*> pointers;
  for (const auto& e : entries) pointers.push_back(&e);
  metadata.emplace(std::string(kHeaderCrcKey), crc_hex(header_digest(std::move(pointers), metadata)));

  boost::json::object root;
  boost::json::object meta;
  for (const auto& [key, value] : metadata) meta[key] = value;
  root[kMetadataKey] = std::move(meta);
  for (const Entry& e : entries) {
    boost::json::array shape;
    for (auto d : e.shape) shape.push_back(d);
    root[e.name] = boost::json::object{
        {"dtype", to_string(e.dtype)}, {"shape", std::move(shape)}, {"data_offsets", boost::json::array{e.begin, e.end}}};
  }
  std::string json = boost::json::serialize(root);
  json.append((8 - json.size() % 8) % 8, ' ');
  const std::uint64_t n = json.size();
  layout.header.resize(8);
  std::memcpy(layout.header.data(), &n, 8);
  layout.header += json;
  return layout;
}

}  // namespace detail

/// The bytes of a safetensors file holding `tensors` and `metadata` (with distribute's checksums).
inline std::vector<std::byte> serialize(const TensorMap& tensors, const Metadata& metadata = {}) {
  const detail::Layout layout = detail::plan(tensors, metadata);
  std::vector<std::byte> out;
  out.reserve(layout.header.size() + layout.payload_size);
  const auto* h = reinterpret_cast<const std::byte*>(layout.header.data());
  out.insert(out.end(), h, h + layout.header.size());
  for (const auto& [name, view] : layout.order) out.insert(out.end(), view->bytes.begin(), view->bytes.end());
  return out;
}

/// Writes `path` atomically: it holds either its previous contents or the complete new file,
/// whatever happens during the write (see detail::AtomicFile).
inline void write(const std::filesystem::path& path, const TensorMap& tensors, const Metadata& metadata = {},
                  const WriteOptions& options = {}) {
  const detail::Layout layout = detail::plan(tensors, metadata);
  const std::uint64_t total = layout.header.size() + layout.payload_size;
  std::uint64_t written = 0;
  distribute::detail::AtomicFile file(path, options.durable);
  auto put = [&](std::span<const std::byte> bytes) {
    file.write(bytes);
    written += bytes.size();
    if (options.on_progress) options.on_progress(written, total);
  };
  put(std::as_bytes(std::span(layout.header.data(), layout.header.size())));
  for (const auto& [name, view] : layout.order) {
    for (std::size_t at = 0; at < view->bytes.size(); at += detail::kWriteChunk) {
      put(view->bytes.subspan(at, std::min(detail::kWriteChunk, view->bytes.size() - at)));
    }
  }
  file.commit();
}

/// Parses and validates a whole file held in memory; `origin` names it in errors.
inline File parse(std::span<const std::byte> bytes, std::string origin = "<memory>", const ReadOptions& options = {}) {
  detail::check_prefix(bytes.size(), origin);
  const std::uint64_t n = detail::read_le64(bytes.data());
  detail::check_header_length(n, bytes.size(), origin);
  const std::string_view json(reinterpret_cast<const char*>(bytes.data()) + 8, static_cast<std::size_t>(n));
  const std::uint64_t payload_start = 8 + n;
  detail::Header h = detail::parse_header(json, bytes.size() - payload_start, origin);
  File file;
  file.origin = std::move(origin);
  for (auto& e : h.entries) {
    StoredTensor t{e.name, e.dtype, e.shape, {}};
    auto src = bytes.subspan(static_cast<std::size_t>(payload_start + e.begin), static_cast<std::size_t>(e.end - e.begin));
    t.bytes.assign(src.begin(), src.end());
    detail::check_tensor_bytes(h, t, file.origin, options);
    file.tensors.push_back(std::move(t));
  }
  file.metadata = std::move(h.metadata);
  return file;
}

/// Reads and validates a safetensors file; every problem is a CheckpointError naming the file.
inline File read(const std::filesystem::path& path, const ReadOptions& options = {}) {
  const std::string origin = path.string();
  auto fd = distribute::detail::open_for_reading(path);
  const std::uint64_t size = distribute::detail::file_size(fd, path);
  detail::check_prefix(size, origin);
  std::array<std::byte, 8> prefix{};
  distribute::detail::read_exact(fd, prefix, 0, path, "the header length");
  const std::uint64_t n = detail::read_le64(prefix.data());
  detail::check_header_length(n, size, origin);
  std::string json(static_cast<std::size_t>(n), '\0');
  distribute::detail::read_exact(fd, std::as_writable_bytes(std::span(json.data(), json.size())), 8, path,
                                 "the JSON header");
  const std::uint64_t payload_start = 8 + n;
  detail::Header h = detail::parse_header(json, size - payload_start, origin);
  File file;
  file.origin = origin;
  for (auto& e : h.entries) {
    StoredTensor t{e.name, e.dtype, e.shape, std::vector<std::byte>(static_cast<std::size_t>(e.end - e.begin))};
    distribute::detail::read_exact(fd, t.bytes, payload_start + e.begin, path, fmt::format("tensor '{}'", e.name));
    detail::check_tensor_bytes(h, t, origin, options);
    file.tensors.push_back(std::move(t));
  }
  file.metadata = std::move(h.metadata);
  return file;
}

}  // namespace safetensors

DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CHECKPOINT_SAFETENSORS_HPP
// ---- end <distribute/checkpoint/safetensors.hpp> ----

DISTRIBUTE_BEGIN_NAMESPACE

struct CheckpointOptions {
  /// fsync each file and its directory before save() returns, so that the checkpoint survives a
  /// power loss, not only a crash of the process. Off only for scratch checkpoints.
  bool durable = true;
  /// Called while a file is written: (bytes written so far, total bytes).
  std::function<void(std::uint64_t, std::uint64_t)> on_progress;
};

namespace detail {

inline constexpr std::string_view kSaveCounterKey = "distribute.save_counter";
inline constexpr std::string_view kLibraryVersionKey = "distribute.library_version";

/// A copy of a tracked value taken at save time, viewed as bytes; `owner` keeps the copy alive.
struct CheckpointSnapshot {
  std::shared_ptr<const void> owner;
  safetensors::TensorView view;
};

/// What Checkpoint knows about a tracked object: its dtype and logical shape, how to copy it out
/// and how to write a (validated) tensor back in.
class Trackable {
 public:
  virtual ~Trackable() = default;
  virtual safetensors::Dtype dtype() const = 0;
  virtual Shape shape() const = 0;
  /// For messages: "variable 'w'", "sharded variable (2 shards: (4, 2), (3, 2))".
  virtual std::string describe() const = 0;
  virtual CheckpointSnapshot snapshot(const std::string& name) const = 0;
  /// `tensor` has already been checked to have dtype() and shape().
  virtual void restore(const safetensors::StoredTensor& tensor) = 0;
};

template <class T>
void check_host_memory() {
  static_assert(memory_space_v<T> == MemorySpace::host,
                "ds::Checkpoint: variables whose values live in device memory cannot be checkpointed yet");
}

// Reads a variable's checkpoint value: the primary copy, or the aggregate of a sync-on-read one.
template <class T>
T checkpoint_value(const Variable<T>& var, const std::string& name) {
  try {
    return var.read_value();
  } catch (const InvalidArgument& e) {
    throw CheckpointError(fmt::format("cannot save tensor '{}': {}", name, e.what()));
  }
}

// Writes `shape`'s worth of elements from `data` into every copy of `var`.
template <class T>
void restore_variable(Variable<T>& var, const Shape& shape, const std::byte* data) {
  using E = element_t<T>;
  T value = tensor_traits<T>::make(shape);
  const std::size_t n = static_cast<std::size_t>(num_elements(shape));
  if (n) std::memcpy(tensor_traits<T>::data(value), data, n * sizeof(E));
  if constexpr (std::is_integral_v<E> && !std::is_same_v<E, bool>) {
    // A SUM sync-on-read integer split as value/N per copy would lose the remainder (7 over 3
    // copies reads back 6); give it to copy 0 so that the sum reads back exactly.
    const std::size_t copies = var.values().size();
    if (var.is_sync_on_read() && var.aggregation() == VariableAggregation::Sum && copies > 1) {
      const E* src = tensor_traits<T>::data(value);
      var.apply_to_copies([&](T& copy, int index) {
        E* dst = tensor_traits<T>::data(copy);
        for (std::size_t i = 0; i < n; ++i) {
          const E share = static_cast<E>(src[i] / static_cast<E>(copies));
          dst[i] = index == 0 ? static_cast<E>(src[i] - share * static_cast<E>(copies - 1)) : share;
        }
      });
      return;
    }
  }
  var.assign(value);
}

template <class T>
class TrackedVariable final : public Trackable {
 public:
  explicit TrackedVariable(Variable<T> var) : var_(std::move(var)) {}
  safetensors::Dtype dtype() const override { return safetensors::dtype_for<element_t<T>>(); }
  Shape shape() const override { return var_.shape(); }
  std::string describe() const override { return fmt::format("variable '{}'", var_.name()); }
  CheckpointSnapshot snapshot(const std::string& name) const override {
    auto copy = std::make_shared<const T>(checkpoint_value(var_, name));
    return CheckpointSnapshot{copy, safetensors::view_of(*copy)};
  }
  void restore(const safetensors::StoredTensor& tensor) override {
    restore_variable(var_, tensor.shape, tensor.bytes.data());
  }

 private:
  Variable<T> var_;
};

template <class T>
class TrackedShards final : public Trackable {
  using E = element_t<T>;

 public:
  TrackedShards(std::vector<Variable<T>> shards, const std::string& name) : shards_(std::move(shards)) {
    if (shards_.empty()) throw InvalidArgument(fmt::format("Checkpoint: sharded variable '{}' has no shards", name));
    const Shape first = shards_.front().shape();
    for (std::size_t i = 0; i < shards_.size(); ++i) {
      const Shape s = shards_[i].shape();
      if (s.empty() || s.size() != first.size() || !std::equal(s.begin() + 1, s.end(), first.begin() + 1)) {
        throw InvalidArgument(fmt::format("Checkpoint: shard {} ('{}') of '{}' has shape {}, which does not stack "
                                          "along axis 0 with shard 0's {}",
                                          i, shards_[i].name(), name, shape_string(s), shape_string(first)));
      }
    }
  }
  safetensors::Dtype dtype() const override { return safetensors::dtype_for<E>(); }
  Shape shape() const override {
    Shape s = shards_.front().shape();
    s[0] = 0;
    for (const auto& shard : shards_) s[0] += shard.shape()[0];
    return s;
  }
  std::string describe() const override {
    std::string shapes;
    for (std::size_t i = 0; i < shards_.size(); ++i) shapes += (i ? ", " : "") + shape_string(shards_[i].shape());
    return fmt::format("sharded variable ({} shard{}: {})", shards_.size(), shards_.size() == 1 ? "" : "s", shapes);
  }
  CheckpointSnapshot snapshot(const std::string& name) const override {
    auto bytes = std::make_shared<std::vector<std::byte>>();
    bytes->reserve(static_cast<std::size_t>(num_elements(shape())) * sizeof(E));
    for (const auto& shard : shards_) {
      const T value = checkpoint_value(shard, name);
      const auto* p = reinterpret_cast<const std::byte*>(tensor_traits<T>::data(value));
      bytes->insert(bytes->end(), p, p + element_count(value) * sizeof(E));
    }
    return CheckpointSnapshot{bytes, safetensors::TensorView{dtype(), shape(), *bytes}};
  }
  void restore(const safetensors::StoredTensor& tensor) override {
    const std::byte* data = tensor.bytes.data();
    // Split by rows: each shard takes as many rows as its own shape has, so the saved layout
    // (how many shards, which sizes) does not matter.
    for (auto& shard : shards_) {
      const Shape s = shard.shape();
      restore_variable(shard, s, data);
      data += static_cast<std::size_t>(num_elements(s)) * sizeof(E);
    }
  }

 private:
  std::vector<Variable<T>> shards_;
};

/// Checkpoints are saved and restored in cross-replica context: inside a step function each
/// replica would read its own copy, and N replicas would all write the same file.
inline void check_cross_replica(const char* what) {
  if (ReplicaContext* ctx = thread_context().replica; ctx && ctx->strategy().num_local_replicas() > 1) {
    throw InvalidArgument(fmt::format("{} was called inside a step function of {} (replica {}); call it in "
                                      "cross-replica context, outside strategy.run()",
                                      what, ctx->strategy().name(), ctx->replica_id_in_sync_group()));
  }
}

}  // namespace detail

class Checkpoint {
 public:
  explicit Checkpoint(CheckpointOptions options = {}) : options_(std::move(options)) {}
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;
  Checkpoint(Checkpoint&&) = default;
  Checkpoint& operator=(Checkpoint&&) = default;

  /// Tracks a variable (plain, mirrored or sync-on-read) under `name`, the tensor's name in the file.
  template <class T>
  Checkpoint& track(std::string name, const Variable<T>& variable) {
    detail::check_host_memory<T>();
    return add(std::move(name), std::make_unique<detail::TrackedVariable<T>>(variable));
  }

  /// Tracks a sharded variable as one tensor: its shards concatenated along axis 0.
  /// (Usable once Sharded<Variable<T>, S> can be instantiated: core/values.hpp's to_tensor()
  /// names element_t<T> in its return type, which a Variable does not have. Until then use
  /// track_sharded with the shard variables.)
  template <class T, class S>
  Checkpoint& track(std::string name, const Sharded<Variable<T>, S>& variable) {
    return track_sharded(std::move(name), variable.shards());
  }

  /// Tracks shard variables (in row order) as one tensor, concatenated along axis 0. They must
  /// agree on every dimension but the first.
  template <class T>
  Checkpoint& track_sharded(std::string name, std::vector<Variable<T>> shards) {
    detail::check_host_memory<T>();
    auto tracked = std::make_unique<detail::TrackedShards<T>>(std::move(shards), name);
    return add(std::move(name), std::move(tracked));
  }

  bool is_tracking(std::string_view name) const { return items_.find(name) != items_.end(); }
  std::vector<std::string> tracked_names() const {
    std::vector<std::string> names;
    for (const auto& [name, item] : items_) names.push_back(name);
    return names;
  }

  /// How many times save() has succeeded (restored from the file by restore()).
  std::int64_t save_counter() const noexcept { return save_counter_; }
  const CheckpointOptions& options() const noexcept { return options_; }

  /// Increments the save counter and writes `<prefix>-<counter>.safetensors` (TF: ckpt-1, ckpt-2,
  /// ...), creating missing directories. Returns the path written.
  std::filesystem::path save(const std::filesystem::path& prefix) {
    detail::check_cross_replica("Checkpoint::save");
    const std::int64_t n = save_counter_ + 1;
    std::filesystem::path path(prefix.string() + fmt::format("-{}.safetensors", n));
    write_file(path, n);
    save_counter_ = n;
    return path;
  }

  /// Writes exactly `path`, leaving the save counter as it is (TF's Checkpoint.write).
  std::filesystem::path write(const std::filesystem::path& path) {
    detail::check_cross_replica("Checkpoint::write");
    write_file(path, save_counter_);
    return path;
  }

  /// Restores every tracked variable from `path`. Each must be in the file with the same dtype and
  /// shape (a sharded one: the concatenated shape); tensors the file has beyond those are ignored.
  /// Nothing is assigned unless everything matches.
  void restore(const std::filesystem::path& path) {
    detail::check_cross_replica("Checkpoint::restore");
    restore(safetensors::read(path));
  }

  /// Restores from a file already read (or parsed from memory).
  void restore(const safetensors::File& file) {
    detail::check_cross_replica("Checkpoint::restore");
    std::vector<std::string> problems;
    std::vector<std::pair<detail::Trackable*, const safetensors::StoredTensor*>> plan;
    for (const auto& [name, item] : items_) {
      const safetensors::StoredTensor* t = file.find(name);
      if (!t) {
        problems.push_back(fmt::format("tensor '{}' (for {}) is not in the file", name, item->describe()));
        continue;
      }
      const Shape want = item->shape();
      if (t->dtype != item->dtype() || t->shape != want) {
        problems.push_back(fmt::format("tensor '{}' is {} with shape {} in the file, but the tracked {} is {} with "
                                       "shape {}",
                                       name, safetensors::describe(t->dtype), shape_string(t->shape), item->describe(),
                                       safetensors::describe(item->dtype()), shape_string(want)));
        continue;
      }
      plan.emplace_back(item.get(), t);
    }
    std::int64_t counter = save_counter_;
    if (auto it = file.metadata.find(detail::kSaveCounterKey); it != file.metadata.end()) {
      const std::string& s = it->second;
      auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), counter);
      if (ec != std::errc{} || ptr != s.data() + s.size() || counter < 0) {
        problems.push_back(fmt::format("{} is \"{}\", not a non-negative integer", detail::kSaveCounterKey, s));
      }
    }
    if (!problems.empty()) {
      throw CheckpointError(fmt::format("cannot restore from '{}': {}", file.origin, fmt::join(problems, "; ")));
    }
    for (auto& [item, tensor] : plan) item->restore(*tensor);
    save_counter_ = counter;
  }

 private:
  friend class CheckpointManager;

  Checkpoint& add(std::string name, std::unique_ptr<detail::Trackable> item) {
    if (name.empty() || name == "__metadata__") {
      throw InvalidArgument(fmt::format("Checkpoint::track: '{}' cannot name a tensor", name));
    }
    if (items_.count(name)) {
      throw InvalidArgument(fmt::format("Checkpoint::track: '{}' is already tracked; each name holds one tensor", name));
    }
    items_.emplace(std::move(name), std::move(item));
    return *this;
  }

  void write_file(const std::filesystem::path& path, std::int64_t counter) {
    // Every value is copied out first so that the file is one consistent snapshot.
    std::vector<detail::CheckpointSnapshot> snapshots;
    safetensors::TensorMap tensors;
    for (const auto& [name, item] : items_) {
      snapshots.push_back(item->snapshot(name));
      tensors.emplace(name, snapshots.back().view);
    }
    safetensors::Metadata metadata{{std::string(detail::kSaveCounterKey), fmt::format("{}", counter)},
                                   {std::string(detail::kLibraryVersionKey), DISTRIBUTE_VERSION_STRING}};
    if (path.has_parent_path()) {
      std::error_code ec;
      std::filesystem::create_directories(path.parent_path(), ec);
      if (ec) {
        throw CheckpointError(fmt::format("cannot create the directory '{}' for checkpoint '{}': {}",
                                          path.parent_path().string(), path.string(), ec.message()));
      }
    }
    safetensors::write(path, tensors, metadata, safetensors::WriteOptions{options_.durable, options_.on_progress});
  }

  std::map<std::string, std::unique_ptr<detail::Trackable>, std::less<>> items_;
  std::int64_t save_counter_ = 0;
  CheckpointOptions options_;
};

DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CHECKPOINT_CHECKPOINT_HPP
// ---- end <distribute/checkpoint/checkpoint.hpp> ----
// ---- begin <distribute/checkpoint/detail/posix_file.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CHECKPOINT_DETAIL_POSIX_FILE_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CHECKPOINT_DETAIL_POSIX_FILE_HPP
// POSIX file primitives for checkpoints: reads and writes that retry short counts and EINTR, and
// AtomicFile, the replace-on-commit protocol that keeps a crash from ever exposing a partial file:
//   write a temp file in the target's directory → fsync it → rename it over the target → fsync
//   the directory (so the rename itself survives a power loss).
// rename(2) within one directory is atomic, so a reader sees the old file or the new one, never a mix.

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include <fmt/format.h>


DISTRIBUTE_BEGIN_NAMESPACE

namespace detail {

inline std::string errno_message(int err) { return std::system_category().message(err); }

/// An owned file descriptor; closes on destruction (errors there are ignored: use close()).
class FileDescriptor {
 public:
  FileDescriptor() = default;
  explicit FileDescriptor(int fd) noexcept : fd_(fd) {}
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  FileDescriptor& operator=(FileDescriptor&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() { reset(); }

  int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }

  /// Closes and reports the error: on NFS a failed write may only surface here.
  void close(const std::filesystem::path& path) {
    if (fd_ < 0) return;
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0 && errno != EINTR) {
      throw CheckpointError(fmt::format("closing '{}' failed: {}", path.string(), errno_message(errno)));
    }
  }

 private:
  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int fd_ = -1;
};

inline FileDescriptor open_for_reading(const std::filesystem::path& path) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    throw CheckpointError(fmt::format("cannot open checkpoint file '{}': {}", path.string(), errno_message(errno)));
  }
  return FileDescriptor(fd);
}

inline std::uint64_t file_size(const FileDescriptor& fd, const std::filesystem::path& path) {
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    throw CheckpointError(fmt::format("cannot stat '{}': {}", path.string(), errno_message(errno)));
  }
  if (!S_ISREG(st.st_mode)) throw CheckpointError(fmt::format("'{}' is not a regular file", path.string()));
  return static_cast<std::uint64_t>(st.st_size);
}

/// Reads exactly `out.size()` bytes at `offset`; a short file is a CheckpointError naming `what`.
inline void read_exact(const FileDescriptor& fd, std::span<std::byte> out, std::uint64_t offset,
                       const std::filesystem::path& path, std::string_view what) {
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::pread(fd.get(), out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw CheckpointError(fmt::format("reading {} from '{}' failed: {}", what, path.string(), errno_message(errno)));
    }
    if (n == 0) {
      throw CheckpointError(fmt::format("'{}' ended after {} of the {} bytes of {}: the file is truncated",
                                        path.string(), done, out.size(), what));
    }
    done += static_cast<std::size_t>(n);
  }
}

inline void write_all(const FileDescriptor& fd, std::span<const std::byte> bytes, const std::filesystem::path& path) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd.get(), bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw CheckpointError(fmt::format("writing '{}' failed after {} bytes: {}", path.string(), done,
                                        errno_message(errno)));
    }
    done += static_cast<std::size_t>(n);
  }
}

inline void fsync_or_throw(const FileDescriptor& fd, const std::filesystem::path& path) {
  while (::fsync(fd.get()) != 0) {
    if (errno == EINTR) continue;
    throw CheckpointError(fmt::format("fsync of '{}' failed: {}", path.string(), errno_message(errno)));
  }
}

/// Makes a rename or unlink in `dir` durable. Some filesystems cannot fsync a directory (EINVAL);
/// there is nothing more to do on those.
inline void fsync_directory(const std::filesystem::path& dir) {
  const std::filesystem::path d = dir.empty() ? std::filesystem::path(".") : dir;
  FileDescriptor fd(::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd) throw CheckpointError(fmt::format("cannot open directory '{}': {}", d.string(), errno_message(errno)));
  while (::fsync(fd.get()) != 0) {
    if (errno == EINTR) continue;
    if (errno == EINVAL || errno == EROFS) return;
    throw CheckpointError(fmt::format("fsync of directory '{}' failed: {}", d.string(), errno_message(errno)));
  }
}

inline const std::string& host_name() {
  static const std::string name = [] {
    char buf[256] = {};
    if (::gethostname(buf, sizeof buf - 1) != 0) return std::string("localhost");
    std::string s(buf);
    for (char& c : s) {
      if (c == '/' || c == ' ') c = '_';
    }
    return s.empty() ? std::string("localhost") : s;
  }();
  return name;
}

// Temp files are named ".<target>.tmp.<host>.<pid>.<seq>": hidden, next to the target (rename
// must not cross filesystems), and attributable, so that leftovers of a killed writer can be
// recognised and removed without touching a live writer's file.
inline std::string temp_prefix(const std::filesystem::path& target) {
  return "." + target.filename().string() + ".tmp.";
}


/// The file name a temp file was made for, when `name` is a temp file of a writer on this host
/// whose process no longer exists (killed mid-save); nothing otherwise.
inline std::optional<std::string> stale_temp_target(const std::string& name) {
  // .<target>.tmp.<host>.<pid>.<seq>; the host and the target may contain dots, so match from the right.
  const std::string marker = ".tmp." + host_name() + ".";
  const auto seq_dot = name.rfind('.');
  if (name.size() < 2 || name.front() != '.' || seq_dot == std::string::npos || seq_dot == 0) return std::nullopt;
  const auto pid_dot = name.rfind('.', seq_dot - 1);
  if (pid_dot == std::string::npos || pid_dot + 1 < marker.size()) return std::nullopt;
  const auto marker_at = pid_dot + 1 - marker.size();
  if (marker_at < 1 || name.compare(marker_at, marker.size(), marker) != 0) return std::nullopt;
  long long pid = 0;
  const char* first = name.data() + pid_dot + 1;
  const char* last = name.data() + seq_dot;
  auto [ptr, err] = std::from_chars(first, last, pid);
  if (err != std::errc{} || ptr != last || pid <= 0) return std::nullopt;
  if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) return std::nullopt;  // alive (or not ours to judge)
  return name.substr(1, marker_at - 1);
}

/// Removes, from `dir`, the temp files of dead writers on this host whose target satisfies
/// `is_target`. Best effort: a file that cannot be removed is left alone.
template <class Pred>
void remove_stale_temp_files(const std::filesystem::path& dir, Pred&& is_target) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::directory_iterator it(dir.empty() ? fs::path(".") : dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    if (auto target = stale_temp_target(it->path().filename().string()); target && is_target(*target)) {
      std::error_code ignored;
      fs::remove(it->path(), ignored);
    }
  }
}

/// A file that appears at `target` only on commit(), complete and durable; destroyed without a
/// commit (an exception, an early return) it removes its temp file and leaves `target` as it was.
class AtomicFile {
 public:
  explicit AtomicFile(std::filesystem::path target, bool durable = true)
      : target_(std::move(target)), durable_(durable) {
    const std::string filename = target_.filename().string();
    remove_stale_temp_files(target_.parent_path(), [&](const std::string& t) { return t == filename; });
    static std::atomic<std::uint64_t> sequence{0};
    for (int attempt = 0; attempt < 100; ++attempt) {
      temp_ = target_.parent_path() / fmt::format("{}{}.{}.{}", temp_prefix(target_), host_name(),
                                                  static_cast<long long>(::getpid()), sequence.fetch_add(1));
      int fd;
      do {
        fd = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      } while (fd < 0 && errno == EINTR);
      if (fd >= 0) {
        fd_ = FileDescriptor(fd);
        return;
      }
      if (errno != EEXIST) {
        throw CheckpointError(fmt::format("cannot create a temporary file next to '{}' ({}): {}", target_.string(),
                                          temp_.string(), errno_message(errno)));
      }
    }
    throw CheckpointError(fmt::format("cannot create a unique temporary file next to '{}'", target_.string()));
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile() {
    if (!committed_) {
      fd_ = FileDescriptor();
      ::unlink(temp_.c_str());
    }
  }

  void write(std::span<const std::byte> bytes) { write_all(fd_, bytes, temp_); }

  /// fsync → close → rename over the target → fsync the directory.
  void commit() {
    if (durable_) fsync_or_throw(fd_, temp_);
    fd_.close(temp_);
    if (::rename(temp_.c_str(), target_.c_str()) != 0) {
      throw CheckpointError(fmt::format("cannot rename '{}' to '{}': {}", temp_.string(), target_.string(),
                                        errno_message(errno)));
    }
    committed_ = true;
    if (durable_) fsync_directory(target_.parent_path());
  }

  const std::filesystem::path& temp_path() const noexcept { return temp_; }

 private:
  std::filesystem::path target_;
  std::filesystem::path temp_;
  FileDescriptor fd_;
  bool durable_;
  bool committed_ = false;
};

}  // namespace detail

DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CHECKPOINT_DETAIL_POSIX_FILE_HPP
// ---- end <distribute/checkpoint/detail/posix_file.hpp> ----

DISTRIBUTE_BEGIN_NAMESPACE

struct CheckpointManagerOptions {
  /// Files are `<checkpoint_name>-<N>.safetensors`.
  std::string checkpoint_name = "ckpt";
  /// Multi-worker hook (TF's convention). Every worker calls save(), because saving can take
  /// collectives in which all workers must join (aggregating sync-on-read variables). Only the
  /// chief's file is kept: another worker writes into `<directory>/workertemp_<task_id>/`, which
  /// save() removes again, and it neither deletes old checkpoints nor writes the index. Nothing
  /// here talks to other workers; the cluster layer sets these from its resolver.
  bool is_chief = true;
  int task_id = 0;
};

namespace detail {

struct NumberedCheckpoint {
  std::int64_t number;
  std::filesystem::path path;
};

inline constexpr std::string_view kCheckpointSuffix = ".safetensors";
inline constexpr std::string_view kIndexFileName = "checkpoint";

/// N when `filename` is `<name>-<N>.safetensors` (N decimal, no sign).
inline std::optional<std::int64_t> checkpoint_number(std::string_view filename, std::string_view name) {
  if (filename.size() <= name.size() + 1 + kCheckpointSuffix.size()) return std::nullopt;
  if (filename.substr(0, name.size()) != name || filename[name.size()] != '-') return std::nullopt;
  if (filename.substr(filename.size() - kCheckpointSuffix.size()) != kCheckpointSuffix) return std::nullopt;
  const std::string_view digits =
      filename.substr(name.size() + 1, filename.size() - name.size() - 1 - kCheckpointSuffix.size());
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  std::int64_t n = 0;
  auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
  if (ec != std::errc{} || ptr != digits.data() + digits.size()) return std::nullopt;
  return n;
}

/// The checkpoints in `directory`, oldest (lowest N) first; none when it does not exist.
inline std::vector<NumberedCheckpoint> list_checkpoints(const std::filesystem::path& directory, std::string_view name) {
  std::vector<NumberedCheckpoint> out;
  std::error_code ec;
  std::filesystem::directory_iterator it(directory, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    std::error_code type_ec;
    if (!it->is_regular_file(type_ec)) continue;
    if (auto n = checkpoint_number(it->path().filename().string(), name)) out.push_back({*n, it->path()});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.number < b.number; });
  return out;
}

}  // namespace detail

/// The newest checkpoint in `directory` (tf.train.latest_checkpoint): the highest-numbered
/// `<checkpoint_name>-<N>.safetensors`, or nothing.
inline std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& directory,
                                                              std::string_view checkpoint_name = "ckpt") {
  auto all = detail::list_checkpoints(directory, checkpoint_name);
  if (all.empty()) return std::nullopt;
  return all.back().path;
}

class CheckpointManager {
 public:
  /// `max_to_keep`: how many checkpoints to keep (older ones are deleted after each save);
  /// std::nullopt keeps all. Checkpoints already in the directory count.
  CheckpointManager(Checkpoint& checkpoint, std::filesystem::path directory, std::optional<std::size_t> max_to_keep,
                    CheckpointManagerOptions options = {})
      : checkpoint_(&checkpoint),
        directory_(std::move(directory)),
        max_to_keep_(max_to_keep),
        options_(std::move(options)) {
    if (max_to_keep_ && *max_to_keep_ == 0) {
      throw InvalidArgument(fmt::format("CheckpointManager('{}'): max_to_keep must be at least 1, or std::nullopt to "
                                        "keep every checkpoint",
                                        directory_.string()));
    }
    const std::string& name = options_.checkpoint_name;
    if (name.empty() || name.find('/') != std::string::npos || name == detail::kIndexFileName) {
      throw InvalidArgument(fmt::format("CheckpointManager('{}'): '{}' cannot be a checkpoint name",
                                        directory_.string(), name));
    }
  }

  /// Saves the tracked variables as `<directory>/<name>-<N>.safetensors` and returns that path.
  /// N is `checkpoint_number` if given (e.g. the global step; it may not be lower than the newest
  /// present), else one more than both the save counter and the newest present. On the chief, then
  /// records it in the index and deletes the oldest checkpoints beyond max_to_keep.
  std::filesystem::path save(std::optional<std::int64_t> checkpoint_number = std::nullopt) {
    detail::check_cross_replica("CheckpointManager::save");
    const auto existing = checkpoints_with_numbers();
    const std::int64_t newest = existing.empty() ? -1 : existing.back().number;
    std::int64_t counter = checkpoint_->save_counter() + 1;
    std::int64_t number = counter;
    if (checkpoint_number) {
      if (*checkpoint_number < 0) {
        throw InvalidArgument(fmt::format("CheckpointManager::save: checkpoint number {} is negative",
                                          *checkpoint_number));
      }
      if (*checkpoint_number < newest) {
        throw InvalidArgument(fmt::format("CheckpointManager::save: checkpoint number {} is older than {}-{} already "
                                          "in '{}'; numbers must not go back, so that latest_checkpoint() finds the "
                                          "newest",
                                          *checkpoint_number, options_.checkpoint_name, newest, directory_.string()));
      }
      number = *checkpoint_number;
    } else if (newest >= number) {
      // A fresh Checkpoint (not restored) in a directory of older runs: continue after them
      // instead of overwriting ckpt-1 and leaving an older ckpt-5 to look newest.
      number = counter = newest + 1;
    }
    const std::string filename = fmt::format("{}-{}{}", options_.checkpoint_name, number, detail::kCheckpointSuffix);

    if (!options_.is_chief) {
      const std::filesystem::path temp_dir = directory_ / fmt::format("workertemp_{}", options_.task_id);
      const std::filesystem::path path = temp_dir / filename;
      checkpoint_->write_file(path, counter);
      checkpoint_->save_counter_ = counter;
      std::error_code ignored;
      std::filesystem::remove_all(temp_dir, ignored);
      return path;
    }

    const std::filesystem::path path = directory_ / filename;
    checkpoint_->write_file(path, counter);
    checkpoint_->save_counter_ = counter;

    // Index first, deletions last: a crash in between leaves extra files, never an index that
    // names deleted ones.
    auto kept = checkpoints_with_numbers();
    std::vector<detail::NumberedCheckpoint> doomed;
    if (max_to_keep_ && kept.size() > *max_to_keep_) {
      const auto cut = kept.size() - *max_to_keep_;
      doomed.assign(kept.begin(), kept.begin() + static_cast<std::ptrdiff_t>(cut));
      kept.erase(kept.begin(), kept.begin() + static_cast<std::ptrdiff_t>(cut));
    }
    write_index(path, kept);
    for (const auto& old : doomed) {
      std::error_code ignored;  // an undeletable old checkpoint is not worth failing a save for
      std::filesystem::remove(old.path, ignored);
    }
    const std::string prefix = options_.checkpoint_name + "-";
    detail::remove_stale_temp_files(directory_, [&](const std::string& target) {
      return target.rfind(prefix, 0) == 0 || target == detail::kIndexFileName;
    });
    return path;
  }

  /// The newest checkpoint in the directory, if any.
  std::optional<std::filesystem::path> latest_checkpoint() const {
    return distribute::latest_checkpoint(directory_, options_.checkpoint_name);
  }

  /// The checkpoints in the directory, oldest first.
  std::vector<std::filesystem::path> checkpoints() const {
    std::vector<std::filesystem::path> out;
    for (auto& c : checkpoints_with_numbers()) out.push_back(std::move(c.path));
    return out;
  }

  /// Restores the latest checkpoint and returns its path; with none, calls `initialize` (if
  /// given) and returns nothing. A latest checkpoint that fails to restore is an error, not a
  /// reason to start over.
  std::optional<std::filesystem::path> restore_or_initialize(const std::function<void()>& initialize = {}) {
    if (auto latest = latest_checkpoint()) {
      checkpoint_->restore(*latest);
      return latest;
    }
    if (initialize) initialize();
    return std::nullopt;
  }

  Checkpoint& checkpoint() const noexcept { return *checkpoint_; }
  const std::filesystem::path& directory() const noexcept { return directory_; }
  std::optional<std::size_t> max_to_keep() const noexcept { return max_to_keep_; }
  const CheckpointManagerOptions& options() const noexcept { return options_; }
  /// The index file (TF's `checkpoint` state file).
  std::filesystem::path index_path() const { return directory_ / detail::kIndexFileName; }

 private:
  std::vector<detail::NumberedCheckpoint> checkpoints_with_numbers() const {
    return detail::list_checkpoints(directory_, options_.checkpoint_name);
  }

  // TF's CheckpointState text format, with paths relative to the directory.
  void write_index(const std::filesystem::path& latest, const std::vector<detail::NumberedCheckpoint>& kept) const {
    std::string text = fmt::format("model_checkpoint_path: \"{}\"\n", latest.filename().string());
    for (const auto& c : kept) text += fmt::format("all_model_checkpoint_paths: \"{}\"\n", c.path.filename().string());
    distribute::detail::AtomicFile file(index_path(), checkpoint_->options().durable);
    file.write(std::as_bytes(std::span(text.data(), text.size())));
    file.commit();
  }

  Checkpoint* checkpoint_;
  std::filesystem::path directory_;
  std::optional<std::size_t> max_to_keep_;
  CheckpointManagerOptions options_;
};

DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CHECKPOINT_CHECKPOINT_MANAGER_HPP
// ---- end <distribute/checkpoint/checkpoint_manager.hpp> ----
#endif

// cluster/ (needs Boost.JSON)
#if __has_include(<boost/json.hpp>)
// ---- begin <distribute/cluster/address.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_ADDRESS_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_ADDRESS_HPP
// Task addresses: "host:port", IPv6 hosts in brackets ("[::1]:2222").

#include <algorithm>
#include <cctype>
#include <charconv>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>


DISTRIBUTE_BEGIN_NAMESPACE

/// A task address split into its parts. `host` carries no brackets, so it can go straight to a
/// resolver; to_string() puts them back for IPv6 hosts.
struct HostPort {
  std::string host;
  int port = 0;

  std::string to_string() const {
    return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port) : fmt::format("{}:{}", host, port);
  }
  friend bool operator==(const HostPort&, const HostPort&) = default;
};

namespace detail {

inline bool is_hostname_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_';
}

/// Splits `address`, or says what is wrong with it as the end of a sentence that starts with
/// "address 'X' " (so every caller can put its own field name in front).
inline std::optional<HostPort> split_host_port(std::string_view address, std::string& why) {
  auto fail = [&](std::string reason) -> std::optional<HostPort> {
    why = std::move(reason);
    return std::nullopt;
  };
  if (address.empty()) return fail("is empty");
  if (auto scheme = address.find("://"); scheme != std::string_view::npos) {
    return fail(fmt::format("has a scheme ('{}'); write host:port and set the rpc layer separately",
                            address.substr(0, scheme + 3)));
  }
  std::string_view host;
  std::string_view port;
  if (address.front() == '[') {
    auto close = address.find(']');
    if (close == std::string_view::npos) return fail("has an unclosed '['");
    host = address.substr(1, close - 1);
    auto rest = address.substr(close + 1);
    if (rest.empty() || rest.front() != ':') return fail("has no ':port' after ']'; expected [host]:port");
    port = rest.substr(1);
    if (host.empty()) return fail("has an empty host in brackets; expected [host]:port");
    // An IPv6 literal: hex digits, ':' and '.' (IPv4-mapped tail), then an optional "%zone".
    auto zone = host.find('%');
    auto ip = host.substr(0, zone);
    bool ok = ip.find(':') != std::string_view::npos &&
              std::all_of(ip.begin(), ip.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) || c == ':' || c == '.'; });
    if (zone != std::string_view::npos) {
      auto z = host.substr(zone + 1);
      ok = ok && !z.empty() && std::all_of(z.begin(), z.end(), is_hostname_char);
    }
    if (!ok) return fail(fmt::format("has '{}' in brackets, which is not an IPv6 address", host));
  } else {
    auto colon = address.rfind(':');
    if (colon == std::string_view::npos) return fail("has no port; expected host:port");
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) {
      return fail("has an IPv6 host without brackets; write [host]:port, e.g. [::1]:2222");
    }
    if (host.empty()) return fail("has an empty host; expected host:port");
    if (auto bad = std::find_if_not(host.begin(), host.end(), is_hostname_char); bad != host.end()) {
      return fail(fmt::format("has host '{}' with the invalid character '{}'", host, *bad));
    }
  }
  if (port.empty()) return fail("has an empty port; expected host:port");
  int p = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  bool digits = std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits || (ec != std::errc{} && ec != std::errc::result_out_of_range) || end != port.data() + port.size()) {
    return fail(fmt::format("has port '{}', which is not a number", port));
  }
  if (ec == std::errc::result_out_of_range || p < 1 || p > 65535) {
    return fail(fmt::format("has port {}, out of range [1, 65535]", port));
  }
  return HostPort{std::string(host), p};
}

}  // namespace detail

/// Splits "host:port" or "[v6]:port"; throws ClusterConfigError naming the address and what is
/// wrong with it (no port, port out of [1, 65535], an unbracketed IPv6 host, a URL scheme...).
inline HostPort split_host_port(std::string_view address) {
  std::string why;
  auto hp = detail::split_host_port(address, why);
  if (!hp) throw ClusterConfigError(fmt::format("address '{}' {}", address, why));
  return *hp;
}

/// True when split_host_port(address) would succeed.
inline bool is_valid_address(std::string_view address) {
  std::string why;
  return detail::split_host_port(address, why).has_value();
}

DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_ADDRESS_HPP
// ---- end <distribute/cluster/address.hpp> ----
// ---- begin <distribute/cluster/cluster_spec.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_CLUSTER_SPEC_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_CLUSTER_SPEC_HPP
// ClusterSpec: job name → task addresses, TF's tf.train.ClusterSpec, with JSON in and out.

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/json.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

// ---- begin <distribute/cluster/address.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_ADDRESS_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_ADDRESS_HPP
// Task addresses: "host:port", IPv6 hosts in brackets ("[::1]:2222").

#include <algorithm>
#include <cctype>
#include <charconv>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>


DISTRIBUTE_BEGIN_NAMESPACE

/// A task address split into its parts. `host` carries no brackets, so it can go straight to a
/// resolver; to_string() puts them back for IPv6 hosts.
struct HostPort {
  std::string host;
  int port = 0;

  std::string to_string() const {
    return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port) : fmt::format("{}:{}", host, port);
  }
  friend bool operator==(const HostPort&, const HostPort&) = default;
};

namespace detail {

inline bool is_hostname_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_';
}

/// Splits `address`, or says what is wrong with it as the end of a sentence that starts with
/// "address 'X' " (so every caller can put its own field name in front).
inline std::optional<HostPort> split_host_port(std::string_view address, std::string& why) {
  auto fail = [&](std::string reason) -> std::optional<HostPort> {
    why = std::move(reason);
    return std::nullopt;
  };
  if (address.empty()) return fail("is empty");
  if (auto scheme = address.find("://"); scheme != std::string_view::npos) {
    return fail(fmt::format("has a scheme ('{}'); write host:port and set the rpc layer separately",
                            address.substr(0, scheme + 3)));
  }
  std::string_view host;
  std::string_view port;
  if (address.front() == '[') {
    auto close = address.find(']');
    if (close == std::string_view::npos) return fail("has an unclosed '['");
    host = address.substr(1, close - 1);
    auto rest = address.substr(close + 1);
    if (rest.empty() || rest.front() != ':') return fail("has no ':port' after ']'; expected [host]:port");
    port = rest.substr(1);
    if (host.empty()) return fail("has an empty host in brackets; expected [host]:port");
    // An IPv6 literal: hex digits, ':' and '.' (IPv4-mapped tail), then an optional "%zone".
    auto zone = host.find('%');
    auto ip = host.substr(0, zone);
    bool ok = ip.find(':') != std::string_view::npos &&
              std::all_of(ip.begin(), ip.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) || c == ':' || c == '.'; });
    if (zone != std::string_view::npos) {
      auto z = host.substr(zone + 1);
      ok = ok && !z.empty() && std::all_of(z.begin(), z.end(), is_hostname_char);
    }
    if (!ok) return fail(fmt::format("has '{}' in brackets, which is not an IPv6 address", host));
  } else {
    auto colon = address.rfind(':');
    if (colon == std::string_view::npos) return fail("has no port; expected host:port");
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) {
      return fail("has an IPv6 host without brackets; write [host]:port, e.g. [::1]:2222");
    }
    if (host.empty()) return fail("has an empty host; expected host:port");
    if (auto bad = std::find_if_not(host.begin(), host.end(), is_hostname_char); bad != host.end()) {
      return fail(fmt::format("has host '{}' with the invalid character '{}'", host, *bad));
    }
  }
  if (port.empty()) return fail("has an empty port; expected host:port");
  int p = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  bool digits = std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits || (ec != std::errc{} && ec != std::errc::result_out_of_range) || end != port.data() + port.size()) {
    return fail(fmt::format("has port '{}', which is not a number", port));
  }
  if (ec == std::errc::result_out_of_range || p < 1 || p > 65535) {
    return fail(fmt::format("has port {}, out of range [1, 65535]", port));
  }
  return HostPort{std::string(host), p};
}

}  // namespace detail

/// Splits "host:port" or "[v6]:port"; throws ClusterConfigError naming the address and what is
/// wrong with it (no port, port out of [1, 65535], an unbracketed IPv6 host, a URL scheme...).
inline HostPort split_host_port(std::string_view address) {
  std::string why;
  auto hp = detail::split_host_port(address, why);
  if (!hp) throw ClusterConfigError(fmt::format("address '{}' {}", address, why));
  return *hp;
}

/// True when split_host_port(address) would succeed.
inline bool is_valid_address(std::string_view address) {
  std::string why;
  return detail::split_host_port(address, why).has_value();
}

DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_ADDRESS_HPP
// ---- end <distribute/cluster/address.hpp> ----
// ---- begin <distribute/cluster/detail/json.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_JSON_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_JSON_HPP
// Boost.JSON helpers shared by ClusterSpec and TFConfigClusterResolver: parsing text with the
// error position, describing a value in a message, reading integers strictly.

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include <boost/json.hpp>
#include <fmt/format.h>


DISTRIBUTE_BEGIN_NAMESPACE
namespace detail {

/// Parses `text` as one JSON document. Errors name `who` (the variable or type being read), the
/// character offset and Boost.JSON's own message.
inline boost::json::value cluster_parse_json(std::string_view text, std::string_view who) {
  boost::json::parser parser;
  boost::system::error_code ec;
  std::size_t consumed = parser.write(text.data(), text.size(), ec);
  if (ec) {
    throw ClusterConfigError(fmt::format("{}: invalid JSON at offset {}: {}", who, consumed, ec.message()));
  }
  return parser.release();
}

/// "array", "object", "null", or the value itself for scalars ("number 1.5", "string \"x\"",
/// "bool true"), for "..., got X" in messages.
inline std::string cluster_json_describe(const boost::json::value& v) {
  switch (v.kind()) {
    case boost::json::kind::null: return "null";
    case boost::json::kind::bool_: return fmt::format("bool {}", v.get_bool());
    case boost::json::kind::int64: return fmt::format("number {}", v.get_int64());
    case boost::json::kind::uint64: return fmt::format("number {}", v.get_uint64());
    // fmt, not serialize(): serialize writes 1.5 as "1.5E0".
    case boost::json::kind::double_: return fmt::format("number {}", v.get_double());
    case boost::json::kind::string: return fmt::format("string {}", boost::json::serialize(v));
    case boost::json::kind::array: return "array";
    case boost::json::kind::object: return "object";
  }
  return "unknown";
}

/// The value as an integer if it is a JSON integer that fits in int64 (1.0 and "1" are not).
inline std::optional<std::int64_t> cluster_json_integer(const boost::json::value& v) {
  if (v.is_int64()) return v.get_int64();
  if (v.is_uint64() && v.get_uint64() <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    return static_cast<std::int64_t>(v.get_uint64());
  }
  return std::nullopt;
}

}  // namespace detail
DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_JSON_HPP
// ---- end <distribute/cluster/detail/json.hpp> ----

DISTRIBUTE_BEGIN_NAMESPACE

namespace detail {

/// Task indices are kept below this so that job_tasks() (a list with a slot per index up to
/// the largest) cannot be made to allocate gigabytes by one stray sparse key.
inline constexpr std::int64_t kMaxTaskIndex = 999'999;

/// job → (task index → address): the one representation of dense and sparse jobs alike.
using ClusterJobs = std::map<std::string, std::map<int, std::string>>;

/// "cluster.worker" under TF_CONFIG, "worker" for a bare ClusterSpec.
inline std::string cluster_field(std::string_view root, std::string_view job) {
  return root.empty() ? std::string(job) : fmt::format("{}.{}", root, job);
}

/// Checks job names, task indices and addresses, and that no two tasks share an address.
/// Messages start with `who` ("TF_CONFIG", "ClusterSpec") and name the field under `root`.
inline void validate_cluster_jobs(const ClusterJobs& jobs, std::string_view who, std::string_view root) {
  std::map<std::string, std::string> owner;  // address → the field that first used it
  for (const auto& [job, tasks] : jobs) {
    // TF device names only allow these in a job name ("/job:<name>/...").
    bool name_ok = !job.empty() && std::isalpha(static_cast<unsigned char>(job.front())) &&
                   std::all_of(job.begin(), job.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
    if (!name_ok) {
      throw ClusterConfigError(fmt::format("{}: job name '{}'{} is not a valid name (a letter, then letters, digits or '_')",
                                           who, job, root.empty() ? "" : fmt::format(" in {}", root)));
    }
    for (const auto& [index, address] : tasks) {
      std::string field = fmt::format("{}[{}]", cluster_field(root, job), index);
      if (index < 0 || index > kMaxTaskIndex) {
        throw ClusterConfigError(fmt::format("{}: {} has task index {}, out of range [0, {}]", who, field, index, kMaxTaskIndex));
      }
      std::string why;
      if (!detail::split_host_port(address, why)) {
        throw ClusterConfigError(fmt::format("{}: {} address '{}' {}", who, field, address, why));
      }
      auto [it, fresh] = owner.emplace(address, field);
      if (!fresh) {
        throw ClusterConfigError(fmt::format("{}: {} address '{}' is already used by {}; every task needs its own address",
                                             who, field, address, it->second));
      }
    }
  }
}

/// Reads the JSON shape of a cluster: an object of job → list of addresses (dense) or object of
/// "index" → address (sparse). Only the shape is checked here; validate_cluster_jobs does the rest.
inline ClusterJobs cluster_jobs_from_json(const boost::json::value& v, std::string_view who, std::string_view root) {
  std::string what = root.empty() ? std::string("the cluster JSON") : std::string(root);
  const auto* obj = v.if_object();
  if (obj == nullptr) {
    throw ClusterConfigError(fmt::format("{}: {} must be an object of job name → task addresses, got {}", who, what,
                                         cluster_json_describe(v)));
  }
  ClusterJobs jobs;
  for (const auto& [key, tasks] : *obj) {
    std::string job(key);
    std::string field = cluster_field(root, job);
    auto& out = jobs[job];
    auto address_of = [&](const boost::json::value& a, std::string_view index) -> std::string {
      if (!a.is_string()) {
        throw ClusterConfigError(fmt::format("{}: {}[{}] must be a \"host:port\" string, got {}", who, field, index,
                                             cluster_json_describe(a)));
      }
      return std::string(a.get_string());
    };
    if (const auto* list = tasks.if_array()) {
      if (static_cast<std::int64_t>(list->size()) > kMaxTaskIndex + 1) {
        throw ClusterConfigError(fmt::format("{}: {} lists {} tasks, more than {}", who, field, list->size(), kMaxTaskIndex + 1));
      }
      for (std::size_t i = 0; i < list->size(); ++i) out[static_cast<int>(i)] = address_of((*list)[i], std::to_string(i));
    } else if (const auto* sparse = tasks.if_object()) {
      for (const auto& [index_key, address] : *sparse) {
        std::string_view k = index_key;
        std::int64_t index = -1;
        auto [end, ec] = std::from_chars(k.data(), k.data() + k.size(), index);
        bool digits = !k.empty() && std::all_of(k.begin(), k.end(), [](char c) { return c >= '0' && c <= '9'; });
        if (!digits || ec != std::errc{} || end != k.data() + k.size() || index > kMaxTaskIndex) {
          throw ClusterConfigError(fmt::format("{}: {} has key '{}', which is not a task index (an integer in [0, {}])", who,
                                               field, k, kMaxTaskIndex));
        }
        if (out.count(static_cast<int>(index)) != 0) {
          throw ClusterConfigError(fmt::format("{}: {} gives task index {} twice", who, field, index));
        }
        out[static_cast<int>(index)] = address_of(address, k);
      }
    } else {
      throw ClusterConfigError(fmt::format(
          "{}: {} must be a list of \"host:port\" addresses or an object of task index → address, got {}", who, field,
          cluster_json_describe(tasks)));
    }
  }
  return jobs;
}

}  // namespace detail

/// The addresses of a cluster's tasks, grouped by job ("chief", "worker", "ps", "evaluator"...).
/// A job is dense (tasks 0..n-1, TF's list form) or sparse (some indices only, TF's
/// {"0": "a:1", "3": "b:2"} form, used when a task only needs to know some of its peers).
/// Every address is validated as host:port, and no two tasks may share one. Jobs are kept in
/// name order, as TF sorts them.
class ClusterSpec {
 public:
  using DenseJobs = std::map<std::string, std::vector<std::string>>;
  using SparseJobs = std::map<std::string, std::map<int, std::string>>;

  /// An empty cluster: a single process, no peers.
  ClusterSpec() = default;

  /// From dense jobs: `ds::ClusterSpec({{"worker", {"a:2222", "b:2222"}}, {"ps", {"c:2222"}}})`.
  /// Throws ClusterConfigError naming the bad job name or address. Implicit: a spec is nothing
  /// but its jobs. The initializer-list form keeps `({{"ps", {"a:1"}}})` (one job, one task)
  /// from being ambiguous with the copy constructor.
  ClusterSpec(std::initializer_list<DenseJobs::value_type> jobs) : ClusterSpec(DenseJobs(jobs)) {}
  ClusterSpec(const DenseJobs& jobs) {
    for (const auto& [job, addresses] : jobs) {
      auto& tasks = jobs_[job];
      for (std::size_t i = 0; i < addresses.size(); ++i) tasks[static_cast<int>(i)] = addresses[i];
    }
    detail::validate_cluster_jobs(jobs_, "ClusterSpec", "");
  }

  /// From sparse jobs: `ClusterSpec::from_sparse({{"worker", {{0, "a:1"}, {3, "b:2"}}}})`.
  static ClusterSpec from_sparse(SparseJobs jobs) {
    detail::validate_cluster_jobs(jobs, "ClusterSpec", "");
    ClusterSpec spec;
    spec.jobs_ = std::move(jobs);
    return spec;
  }

  /// From TF's JSON: `{"worker": ["a:1", "b:2"], "ps": {"0": "c:3"}}`. Throws
  /// ClusterConfigError on a syntax error (with Boost.JSON's message and the offset) or a
  /// malformed job, naming the field ("ClusterSpec: worker[1] address 'b' has no port...").
  static ClusterSpec from_json(std::string_view json) { return from_json(detail::cluster_parse_json(json, "ClusterSpec")); }
  static ClusterSpec from_json(const boost::json::value& json) {
    return from_sparse(detail::cluster_jobs_from_json(json, "ClusterSpec", ""));
  }
  // boost::json::value converts from text too; these say which overload text means.
  static ClusterSpec from_json(const char* json) { return from_json(std::string_view(json)); }
  static ClusterSpec from_json(const std::string& json) { return from_json(std::string_view(json)); }
  static ClusterSpec from_json(const boost::json::object& json) { return from_json(boost::json::value(json)); }

  /// The JSON object TF writes: dense jobs as lists, sparse jobs as {"index": address}.
  boost::json::object to_json_value() const {
    boost::json::object out;
    for (const auto& [job, tasks] : jobs_) {
      if (is_dense(tasks)) {
        boost::json::array list;
        for (const auto& entry : tasks) list.emplace_back(entry.second);
        out[job] = std::move(list);
      } else {
        boost::json::object sparse;
        for (const auto& [index, address] : tasks) sparse[std::to_string(index)] = address;
        out[job] = std::move(sparse);
      }
    }
    return out;
  }
  std::string to_json() const { return boost::json::serialize(to_json_value()); }

  bool empty() const { return jobs_.empty(); }
  bool has_job(std::string_view job) const { return find(job) != jobs_.end(); }
  bool has_task(std::string_view job, int index) const {
    auto it = find(job);
    return it != jobs_.end() && it->second.count(index) != 0;
  }

  /// Job names in order.
  std::vector<std::string> jobs() const {
    std::vector<std::string> names;
    for (const auto& entry : jobs_) names.push_back(entry.first);
    return names;
  }

  /// Number of tasks defined in `job` (for a sparse job, not its largest index + 1).
  int num_tasks(std::string_view job) const { return static_cast<int>(tasks_of(job, "num_tasks").size()); }

  /// The task indices of `job`, ascending.
  std::vector<int> task_indices(std::string_view job) const {
    std::vector<int> out;
    for (const auto& entry : tasks_of(job, "task_indices")) out.push_back(entry.first);
    return out;
  }

  /// The address of task `index` of `job`; InvalidArgument if there is no such task.
  const std::string& task_address(std::string_view job, int index) const {
    const auto& tasks = tasks_of(job, "task_address");
    auto it = tasks.find(index);
    if (it == tasks.end()) {
      throw InvalidArgument(fmt::format("ClusterSpec::task_address: job '{}' has no task {} (task indices: {})", job, index,
                                        fmt::join(task_indices(job), ", ")));
    }
    return it->second;
  }

  /// TF's job_tasks: the addresses by index, a slot per index up to the largest; slots of a
  /// sparse job that no task fills are empty strings (TF's None).
  std::vector<std::string> job_tasks(std::string_view job) const {
    const auto& tasks = tasks_of(job, "job_tasks");
    std::vector<std::string> out(tasks.empty() ? 0 : static_cast<std::size_t>(tasks.rbegin()->first) + 1);
    for (const auto& [index, address] : tasks) out[static_cast<std::size_t>(index)] = address;
    return out;
  }

  /// Everything, as job → (index → address).
  const SparseJobs& as_dict() const { return jobs_; }

  friend bool operator==(const ClusterSpec&, const ClusterSpec&) = default;

 private:
  static bool is_dense(const std::map<int, std::string>& tasks) {
    return tasks.empty() || tasks.rbegin()->first + 1 == static_cast<int>(tasks.size());
  }
  SparseJobs::const_iterator find(std::string_view job) const {
    return std::find_if(jobs_.begin(), jobs_.end(), [&](const auto& entry) { return entry.first == job; });
  }
  const std::map<int, std::string>& tasks_of(std::string_view job, std::string_view what) const {
    auto it = find(job);
    if (it == jobs_.end()) {
      throw InvalidArgument(fmt::format("ClusterSpec::{}: no job '{}' in the cluster (jobs: {})", what, job,
                                        jobs_.empty() ? std::string("none") : fmt::format("{}", fmt::join(jobs(), ", "))));
    }
    return it->second;
  }

  SparseJobs jobs_;
};

DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_CLUSTER_SPEC_HPP
// ---- end <distribute/cluster/cluster_spec.hpp> ----
// ---- begin <distribute/cluster/cluster_resolver.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_CLUSTER_RESOLVER_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_CLUSTER_RESOLVER_HPP
// ClusterResolver: where this process sits in the cluster; SimpleClusterResolver for explicit specs.

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

// ---- begin <distribute/cluster/cluster_spec.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_CLUSTER_SPEC_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_CLUSTER_SPEC_HPP
// ClusterSpec: job name → task addresses, TF's tf.train.ClusterSpec, with JSON in and out.

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/json.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

// ---- begin <distribute/cluster/address.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_ADDRESS_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_ADDRESS_HPP
// Task addresses: "host:port", IPv6 hosts in brackets ("[::1]:2222").

#include <algorithm>
#include <cctype>
#include <charconv>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>


DISTRIBUTE_BEGIN_NAMESPACE

/// A task address split into its parts. `host` carries no brackets, so it can go straight to a
/// resolver; to_string() puts them back for IPv6 hosts.
struct HostPort {
  std::string host;
  int port = 0;

  std::string to_string() const {
    return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port) : fmt::format("{}:{}", host, port);
  }
  friend bool operator==(const HostPort&, const HostPort&) = default;
};

namespace detail {

inline bool is_hostname_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_';
}

/// Splits `address`, or says what is wrong with it as the end of a sentence that starts with
/// "address 'X' " (so every caller can put its own field name in front).
inline std::optional<HostPort> split_host_port(std::string_view address, std::string& why) {
  auto fail = [&](std::string reason) -> std::optional<HostPort> {
    why = std::move(reason);
    return std::nullopt;
  };
  if (address.empty()) return fail("is empty");
  if (auto scheme = address.find("://"); scheme != std::string_view::npos) {
    return fail(fmt::format("has a scheme ('{}'); write host:port and set the rpc layer separately",
                            address.substr(0, scheme + 3)));
  }
  std::string_view host;
  std::string_view port;
  if (address.front() == '[') {
    auto close = address.find(']');
    if (close == std::string_view::npos) return fail("has an unclosed '['");
    host = address.substr(1, close - 1);
    auto rest = address.substr(close + 1);
    if (rest.empty() || rest.front() != ':') return fail("has no ':port' after ']'; expected [host]:port");
    port = rest.substr(1);
    if (host.empty()) return fail("has an empty host in brackets; expected [host]:port");
    // An IPv6 literal: hex digits, ':' and '.' (IPv4-mapped tail), then an optional "%zone".
    auto zone = host.find('%');
    auto ip = host.substr(0, zone);
    bool ok = ip.find(':') != std::string_view::npos &&
              std::all_of(ip.begin(), ip.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) || c == ':' || c == '.'; });
    if (zone != std::string_view::npos) {
      auto z = host.substr(zone + 1);
      ok = ok && !z.empty() && std::all_of(z.begin(), z.end(), is_hostname_char);
    }
    if (!ok) return fail(fmt::format("has '{}' in brackets, which is not an IPv6 address", host));
  } else {
    auto colon = address.rfind(':');
    if (colon == std::string_view::npos) return fail("has no port; expected host:port");
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) {
      return fail("has an IPv6 host without brackets; write [host]:port, e.g. [::1]:2222");
    }
    if (host.empty()) return fail("has an empty host; expected host:port");
    if (auto bad = std::find_if_not(host.begin(), host.end(), is_hostname_char); bad != host.end()) {
      return fail(fmt::format("has host '{}' with the invalid character '{}'", host, *bad));
    }
  }
  if (port.empty()) return fail("has an empty port; expected host:port");
  int p = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  bool digits = std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits || (ec != std::errc{} && ec != std::errc::result_out_of_range) || end != port.data() + port.size()) {
    return fail(fmt::format("has port '{}', which is not a number", port));
  }
  if (ec == std::errc::result_out_of_range || p < 1 || p > 65535) {
    return fail(fmt::format("has port {}, out of range [1, 65535]", port));
  }
  return HostPort{std::string(host), p};
}

}  // namespace detail

/// Splits "host:port" or "[v6]:port"; throws ClusterConfigError naming the address and what is
/// wrong with it (no port, port out of [1, 65535], an unbracketed IPv6 host, a URL scheme...).
inline HostPort split_host_port(std::string_view address) {
  std::string why;
  auto hp = detail::split_host_port(address, why);
  if (!hp) throw ClusterConfigError(fmt::format("address '{}' {}", address, why));
  return *hp;
}

/// True when split_host_port(address) would succeed.
inline bool is_valid_address(std::string_view address) {
  std::string why;
  return detail::split_host_port(address, why).has_value();
}

DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_ADDRESS_HPP
// ---- end <distribute/cluster/address.hpp> ----
// ---- begin <distribute/cluster/detail/json.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_JSON_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_JSON_HPP
// Boost.JSON helpers shared by ClusterSpec and TFConfigClusterResolver: parsing text with the
// error position, describing a value in a message, reading integers strictly.

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include <boost/json.hpp>
#include <fmt/format.h>


DISTRIBUTE_BEGIN_NAMESPACE
namespace detail {

/// Parses `text` as one JSON document. Errors name `who` (the variable or type being read), the
/// character offset and Boost.JSON's own message.
inline boost::json::value cluster_parse_json(std::string_view text, std::string_view who) {
  boost::json::parser parser;
  boost::system::error_code ec;
  std::size_t consumed = parser.write(text.data(), text.size(), ec);
  if (ec) {
    throw ClusterConfigError(fmt::format("{}: invalid JSON at offset {}: {}", who, consumed, ec.message()));
  }
  return parser.release();
}

/// "array", "object", "null", or the value itself for scalars ("number 1.5", "string \"x\"",
/// "bool true"), for "..., got X" in messages.
inline std::string cluster_json_describe(const boost::json::value& v) {
  switch (v.kind()) {
    case boost::json::kind::null: return "null";
    case boost::json::kind::bool_: return fmt::format("bool {}", v.get_bool());
    case boost::json::kind::int64: return fmt::format("number {}", v.get_int64());
    case boost::json::kind::uint64: return fmt::format("number {}", v.get_uint64());
    // fmt, not serialize(): serialize writes 1.5 as "1.5E0".
    case boost::json::kind::double_: return fmt::format("number {}", v.get_double());
    case boost::json::kind::string: return fmt::format("string {}", boost::json::serialize(v));
    case boost::json::kind::array: return "array";
    case boost::json::kind::object: return "object";
  }
  return "unknown";
}

/// The value as an integer if it is a JSON integer that fits in int64 (1.0 and "1" are not).
inline std::optional<std::int64_t> cluster_json_integer(const boost::json::value& v) {
  if (v.is_int64()) return v.get_int64();
  if (v.is_uint64() && v.get_uint64() <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    return static_cast<std::int64_t>(v.get_uint64());
  }
  return std::nullopt;
}

}  // namespace detail
DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_JSON_HPP
// ---- end <distribute/cluster/detail/json.hpp> ----

DISTRIBUTE_BEGIN_NAMESPACE

namespace detail {

/// Task indices are kept below this so that job_tasks() (a list with a slot per index up to
/// the largest) cannot be made to allocate gigabytes by one stray sparse key.
inline constexpr std::int64_t kMaxTaskIndex = 999'999;

/// job → (task index → address): the one representation of dense and sparse jobs alike.
using ClusterJobs = std::map<std::string, std::map<int, std::string>>;

/// "cluster.worker" under TF_CONFIG, "worker" for a bare ClusterSpec.
inline std::string cluster_field(std::string_view root, std::string_view job) {
  return root.empty() ? std::string(job) : fmt::format("{}.{}", root, job);
}

/// Checks job names, task indices and addresses, and that no two tasks share an address.
/// Messages start with `who` ("TF_CONFIG", "ClusterSpec") and name the field under `root`.
inline void validate_cluster_jobs(const ClusterJobs& jobs, std::string_view who, std::string_view root) {
  std::map<std::string, std::string> owner;  // address → the field that first used it
  for (const auto& [job, tasks] : jobs) {
    // TF device names only allow these in a job name ("/job:<name>/...").
    bool name_ok = !job.empty() && std::isalpha(static_cast<unsigned char>(job.front())) &&
                   std::all_of(job.begin(), job.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
    if (!name_ok) {
      throw ClusterConfigError(fmt::format("{}: job name '{}'{} is not a valid name (a letter, then letters, digits or '_')",
                                           who, job, root.empty() ? "" : fmt::format(" in {}", root)));
    }
    for (const auto& [index, address] : tasks) {
      std::string field = fmt::format("{}[{}]", cluster_field(root, job), index);
      if (index < 0 || index > kMaxTaskIndex) {
        throw ClusterConfigError(fmt::format("{}: {} has task index {}, out of range [0, {}]", who, field, index, kMaxTaskIndex));
      }
      std::string why;
      if (!detail::split_host_port(address, why)) {
        throw ClusterConfigError(fmt::format("{}: {} address '{}' {}", who, field, address, why));
      }
      auto [it, fresh] = owner.emplace(address, field);
      if (!fresh) {
        throw ClusterConfigError(fmt::format("{}: {} address '{}' is already used by {}; every task needs its own address",
                                             who, field, address, it->second));
      }
    }
  }
}

/// Reads the JSON shape of a cluster: an object of job → list of addresses (dense) or object of
/// "index" → address (sparse). Only the shape is checked here; validate_cluster_jobs does the rest.
inline ClusterJobs cluster_jobs_from_json(const boost::json::value& v, std::string_view who, std::string_view root) {
  std::string what = root.empty() ? std::string("the cluster JSON") : std::string(root);
  const auto* obj = v.if_object();
  if (obj == nullptr) {
    throw ClusterConfigError(fmt::format("{}: {} must be an object of job name → task addresses, got {}", who, what,
                                         cluster_json_describe(v)));
  }
  ClusterJobs jobs;
  for (const auto& [key, tasks] : *obj) {
    std::string job(key);
    std::string field = cluster_field(root, job);
    auto& out = jobs[job];
    auto address_of = [&](const boost::json::value& a, std::string_view index) -> std::string {
      if (!a.is_string()) {
        throw ClusterConfigError(fmt::format("{}: {}[{}] must be a \"host:port\" string, got {}", who, field, index,
                                             cluster_json_describe(a)));
      }
      return std::string(a.get_string());
    };
    if (const auto* list = tasks.if_array()) {
      if (static_cast<std::int64_t>(list->size()) > kMaxTaskIndex + 1) {
        throw ClusterConfigError(fmt::format("{}: {} lists {} tasks, more than {}", who, field, list->size(), kMaxTaskIndex + 1));
      }
      for (std::size_t i = 0; i < list->size(); ++i) out[static_cast<int>(i)] = address_of((*list)[i], std::to_string(i));
    } else if (const auto* sparse = tasks.if_object()) {
      for (const auto& [index_key, address] : *sparse) {
        std::string_view k = index_key;
        std::int64_t index = -1;
        auto [end, ec] = std::from_chars(k.data(), k.data() + k.size(), index);
        bool digits = !k.empty() && std::all_of(k.begin(), k.end(), [](char c) { return c >= '0' && c <= '9'; });
        if (!digits || ec != std::errc{} || end != k.data() + k.size() || index > kMaxTaskIndex) {
          throw ClusterConfigError(fmt::format("{}: {} has key '{}', which is not a task index (an integer in [0, {}])", who,
                                               field, k, kMaxTaskIndex));
        }
        if (out.count(static_cast<int>(index)) != 0) {
          throw ClusterConfigError(fmt::format("{}: {} gives task index {} twice", who, field, index));
        }
        out[static_cast<int>(index)] = address_of(address, k);
      }
    } else {
      throw ClusterConfigError(fmt::format(
          "{}: {} must be a list of \"host:port\" addresses or an object of task index → address, got {}", who, field,
          cluster_json_describe(tasks)));
    }
  }
  return jobs;
}

}  // namespace detail

/// The addresses of a cluster's tasks, grouped by job ("chief", "worker", "ps", "evaluator"...).
/// A job is dense (tasks 0..n-1, TF's list form) or sparse (some indices only, TF's
/// {"0": "a:1", "3": "b:2"} form, used when a task only needs to know some of its peers).
/// Every address is validated as host:port, and no two tasks may share one. Jobs are kept in
/// name order, as TF sorts them.
class ClusterSpec {
 public:
  using DenseJobs = std::map<std::string, std::vector<std::string>>;
  using SparseJobs = std::map<std::string, std::map<int, std::string>>;

  /// An empty cluster: a single process, no peers.
  ClusterSpec() = default;

  /// From dense jobs: `ds::ClusterSpec({{"worker", {"a:2222", "b:2222"}}, {"ps", {"c:2222"}}})`.
  /// Throws ClusterConfigError naming the bad job name or address. Implicit: a spec is nothing
  /// but its jobs. The initializer-list form keeps `({{"ps", {"a:1"}}})` (one job, one task)
  /// from being ambiguous with the copy constructor.
  ClusterSpec(std::initializer_list<DenseJobs::value_type> jobs) : ClusterSpec(DenseJobs(jobs)) {}
  ClusterSpec(const DenseJobs& jobs) {
    for (const auto& [job, addresses] : jobs) {
      auto& tasks = jobs_[job];
      for (std::size_t i = 0; i < addresses.size(); ++i) tasks[static_cast<int>(i)] = addresses[i];
    }
    detail::validate_cluster_jobs(jobs_, "ClusterSpec", "");
  }

  /// From sparse jobs: `ClusterSpec::from_sparse({{"worker", {{0, "a:1"}, {3, "b:2"}}}})`.
  static ClusterSpec from_sparse(SparseJobs jobs) {
    detail::validate_cluster_jobs(jobs, "ClusterSpec", "");
    ClusterSpec spec;
    spec.jobs_ = std::move(jobs);
    return spec;
  }

  /// From TF's JSON: `{"worker": ["a:1", "b:2"], "ps": {"0": "c:3"}}`. Throws
  /// ClusterConfigError on a syntax error (with Boost.JSON's message and the offset) or a
  /// malformed job, naming the field ("ClusterSpec: worker[1] address 'b' has no port...").
  static ClusterSpec from_json(std::string_view json) { return from_json(detail::cluster_parse_json(json, "ClusterSpec")); }
  static ClusterSpec from_json(const boost::json::value& json) {
    return from_sparse(detail::cluster_jobs_from_json(json, "ClusterSpec", ""));
  }
  // boost::json::value converts from text too; these say which overload text means.
  static ClusterSpec from_json(const char* json) { return from_json(std::string_view(json)); }
  static ClusterSpec from_json(const std::string& json) { return from_json(std::string_view(json)); }
  static ClusterSpec from_json(const boost::json::object& json) { return from_json(boost::json::value(json)); }

  /// The JSON object TF writes: dense jobs as lists, sparse jobs as {"index": address}.
  boost::json::object to_json_value() const {
    boost::json::object out;
    for (const auto& [job, tasks] : jobs_) {
      if (is_dense(tasks)) {
        boost::json::array list;
        for (const auto& entry : tasks) list.emplace_back(entry.second);
        out[job] = std::move(list);
      } else {
        boost::json::object sparse;
        for (const auto& [index, address] : tasks) sparse[std::to_string(index)] = address;
        out[job] = std::move(sparse);
      }
    }
    return out;
  }
  std::string to_json() const { return boost::json::serialize(to_json_value()); }

  bool empty() const { return jobs_.empty(); }
  bool has_job(std::string_view job) const { return find(job) != jobs_.end(); }
  bool has_task(std::string_view job, int index) const {
    auto it = find(job);
    return it != jobs_.end() && it->second.count(index) != 0;
  }

  /// Job names in order.
  std::vector<std::string> jobs() const {
    std::vector<std::string> names;
    for (const auto& entry : jobs_) names.push_back(entry.first);
    return names;
  }

  /// Number of tasks defined in `job` (for a sparse job, not its largest index + 1).
  int num_tasks(std::string_view job) const { return static_cast<int>(tasks_of(job, "num_tasks").size()); }

  /// The task indices of `job`, ascending.
  std::vector<int> task_indices(std::string_view job) const {
    std::vector<int> out;
    for (const auto& entry : tasks_of(job, "task_indices")) out.push_back(entry.first);
    return out;
  }

  /// The address of task `index` of `job`; InvalidArgument if there is no such task.
  const std::string& task_address(std::string_view job, int index) const {
    const auto& tasks = tasks_of(job, "task_address");
    auto it = tasks.find(index);
    if (it == tasks.end()) {
      throw InvalidArgument(fmt::format("ClusterSpec::task_address: job '{}' has no task {} (task indices: {})", job, index,
                                        fmt::join(task_indices(job), ", ")));
    }
    return it->second;
  }

  /// TF's job_tasks: the addresses by index, a slot per index up to the largest; slots of a
  /// sparse job that no task fills are empty strings (TF's None).
  std::vector<std::string> job_tasks(std::string_view job) const {
    const auto& tasks = tasks_of(job, "job_tasks");
    std::vector<std::string> out(tasks.empty() ? 0 : static_cast<std::size_t>(tasks.rbegin()->first) + 1);
    for (const auto& [index, address] : tasks) out[static_cast<std::size_t>(index)] = address;
    return out;
  }

  /// Everything, as job → (index → address).
  const SparseJobs& as_dict() const { return jobs_; }

  friend bool operator==(const ClusterSpec&, const ClusterSpec&) = default;

 private:
  static bool is_dense(const std::map<int, std::string>& tasks) {
    return tasks.empty() || tasks.rbegin()->first + 1 == static_cast<int>(tasks.size());
  }
  SparseJobs::const_iterator find(std::string_view job) const {
    return std::find_if(jobs_.begin(), jobs_.end(), [&](const auto& entry) { return entry.first == job; });
  }
  const std::map<int, std::string>& tasks_of(std::string_view job, std::string_view what) const {
    auto it = find(job);
    if (it == jobs_.end()) {
      throw InvalidArgument(fmt::format("ClusterSpec::{}: no job '{}' in the cluster (jobs: {})", what, job,
                                        jobs_.empty() ? std::string("none") : fmt::format("{}", fmt::join(jobs(), ", "))));
    }
    return it->second;
  }

  SparseJobs jobs_;
};

DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_CLUSTER_SPEC_HPP
// ---- end <distribute/cluster/cluster_spec.hpp> ----
// ---- begin <distribute/cluster/detail/env.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_ENV_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_ENV_HPP
// Reading environment variables, from the process or from an injected map (tests).

#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>


DISTRIBUTE_BEGIN_NAMESPACE
namespace detail {

/// Variable name → value. Transparent comparison so lookups by string_view do not allocate.
using EnvMap = std::map<std::string, std::string, std::less<>>;

/// Looks variables up in `map` when one is given, else in the process environment. Resolvers
/// take a map in a constructor overload so tests never have to mutate the real environment
/// (setenv is not thread-safe and would leak between test cases).
class EnvReader {
 public:
  EnvReader() = default;
  explicit EnvReader(const EnvMap* map) : map_(map) {}

  std::optional<std::string> get(std::string_view name) const {
    if (map_ != nullptr) {
      auto it = map_->find(name);
      if (it == map_->end()) return std::nullopt;
      return it->second;
    }
    // std::getenv needs a NUL-terminated name.
    const char* v = std::getenv(std::string(name).c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  }

  bool has(std::string_view name) const { return get(name).has_value(); }

 private:
  const EnvMap* map_ = nullptr;
};

/// Parses a whole decimal integer (optional leading '-'; no spaces, signs or suffixes).
inline std::optional<std::int64_t> parse_env_integer(std::string_view s) {
  std::int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc{} || p != s.data() + s.size()) return std::nullopt;
  return v;
}

/// The integer value of variable `name`, which must be set and lie in [lo, hi]. `who` prefixes
/// the message ("SlurmClusterResolver") so the user knows which resolver read it.
inline int require_env_int(const EnvReader& env, std::string_view who, std::string_view name, std::int64_t lo,
                           std::int64_t hi, std::string_view hint = {}) {
  auto raw = env.get(name);
  if (!raw) throw ClusterConfigError(fmt::format("{}: environment variable {} is not set{}", who, name, hint));
  auto v = parse_env_integer(*raw);
  if (!v) throw ClusterConfigError(fmt::format("{}: {}='{}' is not an integer", who, name, *raw));
  if (*v < lo || *v > hi) {
    throw ClusterConfigError(fmt::format("{}: {}={} is out of range; it must be in [{}, {}]", who, name, *v, lo, hi));
  }
  return static_cast<int>(*v);
}

}  // namespace detail
DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_ENV_HPP
// ---- end <distribute/cluster/detail/env.hpp> ----

DISTRIBUTE_BEGIN_NAMESPACE

/// Environment variables handed to a resolver instead of the process environment (tests, or a
/// program that computes them). Lookups by string_view do not allocate.
using EnvVars = detail::EnvMap;

/// Device type → count, as TF's num_accelerators() ({"GPU": 2}); empty for host-only tasks.
using AcceleratorCounts = std::map<std::string, int>;

namespace detail {

inline std::string cluster_tasks_phrase(std::int64_t n) { return fmt::format("{} task{}", n, n == 1 ? "" : "s"); }

/// Checks that task (type, id) exists in `spec`. An evaluator may be missing from the cluster
/// (TF runs it beside the training cluster), and then it is the only evaluator, index 0.
/// `type_label`/`id_label` name the fields ("TF_CONFIG: task.type"), `cluster_name` the spec.
inline void check_task_in_cluster(const ClusterSpec& spec, std::string_view type, std::int64_t id,
                                  std::string_view type_label, std::string_view id_label, std::string_view cluster_name) {
  if (type.empty()) throw ClusterConfigError(fmt::format("{} is empty", type_label));
  if (id < 0) throw ClusterConfigError(fmt::format("{} {} is negative", id_label, id));
  if (!spec.has_job(type)) {
    if (type == "evaluator") {
      if (id != 0) {
        throw ClusterConfigError(fmt::format(
            "{} {} is out of range for job 'evaluator', which is not in {} and so has one task (index 0)", id_label, id,
            cluster_name));
      }
      return;
    }
    throw ClusterConfigError(fmt::format("{} '{}' has no job in {} (jobs: {})", type_label, type, cluster_name,
                                         spec.empty() ? std::string("none") : fmt::format("{}", fmt::join(spec.jobs(), ", "))));
  }
  auto indices = spec.task_indices(type);
  bool dense = indices.empty() || indices.back() + 1 == static_cast<int>(indices.size());
  if (dense && id >= static_cast<std::int64_t>(indices.size())) {
    throw ClusterConfigError(fmt::format("{} {} is out of range for job '{}' with {}", id_label, id, type,
                                         cluster_tasks_phrase(static_cast<std::int64_t>(indices.size()))));
  }
  if (!dense && !spec.has_task(type, static_cast<int>(std::min<std::int64_t>(id, kMaxTaskIndex + 1)))) {
    throw ClusterConfigError(fmt::format("{} {} is not a task of job '{}' (task indices: {})", id_label, id, type,
                                         fmt::join(indices, ", ")));
  }
}

inline int cluster_job_size(const ClusterSpec& spec, std::string_view job) {
  return spec.has_job(job) ? spec.num_tasks(job) : 0;
}

}  // namespace detail

/// Where this process sits in a cluster: the cluster's spec, this task's type and index, the
/// RPC layer and local accelerators. Resolvers read it from somewhere (TF_CONFIG, Slurm, a
/// launcher's environment) once, at construction, and validate it there, so the getters are
/// cheap and cannot fail. Users may derive their own.
///
/// The helpers below follow TF's multi_worker_util. A cluster with an empty spec is local mode:
/// one process, which is worker 0 and the chief.
class ClusterResolver {
 public:
  virtual ~ClusterResolver() = default;

  virtual const ClusterSpec& cluster_spec() const = 0;
  /// "chief", "worker", "ps" or "evaluator" (custom resolvers may use other job names).
  virtual std::string task_type() const = 0;
  virtual int task_id() const = 0;
  /// "grpc" and the like; empty when the configuration names none.
  virtual std::string rpc_layer() const = 0;
  virtual AcceleratorCounts num_accelerators() const = 0;
  /// TF's free-form environment string ("cloud", "google"); empty unless configured.
  virtual std::string environment() const { return {}; }

  /// The chief task; without a chief job, worker 0. The evaluator also counts as chief of its
  /// own work, as in TF (it writes its own summaries).
  bool is_chief() const {
    const auto type = task_type();
    if (type == "chief" || type == "evaluator") return true;
    return type == "worker" && task_id() == 0 && detail::cluster_job_size(cluster_spec(), "chief") == 0;
  }

  /// The number of tasks that run replicas in sync: chief + workers (1 in local mode). For the
  /// evaluator, the evaluators (it trains with nobody). ClusterConfigError for other tasks.
  int worker_count() const {
    const auto& spec = cluster_spec();
    const auto type = task_type();
    if (spec.empty()) return 1;
    if (type == "evaluator") return std::max(1, detail::cluster_job_size(spec, "evaluator"));
    if (type != "chief" && type != "worker") {
      throw ClusterConfigError(
          fmt::format("ClusterResolver::worker_count: task type '{}' runs no replicas; only chief and worker tasks do", type));
    }
    return detail::cluster_job_size(spec, "chief") + detail::cluster_job_size(spec, "worker");
  }

  /// This task's position among the tasks that run replicas: the chief is 0 and worker i is
  /// i + 1 when there is a chief, else i (TF's id_in_cluster). ClusterConfigError for the
  /// evaluator and for ps tasks, which have no replicas.
  int id_in_cluster() const {
    const auto& spec = cluster_spec();
    const auto type = task_type();
    if (type == "chief") return 0;
    if (type == "worker") return task_id() + detail::cluster_job_size(spec, "chief");
    if (type == "evaluator") {
      throw ClusterConfigError(
          "ClusterResolver::id_in_cluster: task type 'evaluator' has no id in the cluster; it runs beside training");
    }
    throw ClusterConfigError(fmt::format(
        "ClusterResolver::id_in_cluster: task type '{}' has no id in the cluster; only chief and worker tasks do", type));
  }

  /// The global id of local replica `local_id` when every task runs `local_replicas`:
  /// id_in_cluster() * local_replicas + local_id.
  int global_replica_id(int local_replicas, int local_id) const {
    if (local_replicas < 1 || local_id < 0 || local_id >= local_replicas) {
      throw InvalidArgument(fmt::format(
          "ClusterResolver::global_replica_id: local replica {} is out of range for {} local replicas", local_id,
          local_replicas));
    }
    return id_in_cluster() * local_replicas + local_id;
  }

  /// The address everyone rendezvous with: the chief's, else worker 0's. Empty in local mode
  /// (an empty spec), where there is nobody to connect to.
  std::string master_address() const {
    const auto& spec = cluster_spec();
    if (spec.empty()) return {};
    if (detail::cluster_job_size(spec, "chief") > 0) return spec.task_address("chief", spec.task_indices("chief").front());
    if (spec.has_task("worker", 0)) return spec.task_address("worker", 0);
    throw ClusterConfigError(fmt::format("ClusterResolver::master_address: the cluster (jobs: {}) has neither a chief nor worker 0",
                                         fmt::join(spec.jobs(), ", ")));
  }

 protected:
  ClusterResolver() = default;
  ClusterResolver(const ClusterResolver&) = default;
  ClusterResolver(ClusterResolver&&) = default;
  ClusterResolver& operator=(const ClusterResolver&) = default;
  ClusterResolver& operator=(ClusterResolver&&) = default;
};

/// A resolver for a spec the program already has (TF's SimpleClusterResolver). The task must
/// exist in the spec unless the spec is empty (local mode); ClusterConfigError otherwise.
class SimpleClusterResolver : public ClusterResolver {
 public:
  SimpleClusterResolver(ClusterSpec cluster_spec, std::string task_type, int task_id, std::string rpc_layer = "grpc",
                        AcceleratorCounts num_accelerators = {}, std::string environment = {})
      : spec_(std::move(cluster_spec)),
        task_type_(std::move(task_type)),
        task_id_(task_id),
        rpc_layer_(std::move(rpc_layer)),
        accelerators_(std::move(num_accelerators)),
        environment_(std::move(environment)) {
    if (task_type_.empty()) throw ClusterConfigError("SimpleClusterResolver: task_type is empty");
    if (task_id_ < 0) throw ClusterConfigError(fmt::format("SimpleClusterResolver: task_id {} is negative", task_id_));
    if (!spec_.empty()) {
      detail::check_task_in_cluster(spec_, task_type_, task_id_, "SimpleClusterResolver: task_type",
                                    "SimpleClusterResolver: task_id", "the cluster spec");
    }
    for (const auto& [device, count] : accelerators_) {
      if (count < 0) {
        throw ClusterConfigError(fmt::format("SimpleClusterResolver: num_accelerators['{}'] is {}, negative", device, count));
      }
    }
  }

  const ClusterSpec& cluster_spec() const override { return spec_; }
  std::string task_type() const override { return task_type_; }
  int task_id() const override { return task_id_; }
  std::string rpc_layer() const override { return rpc_layer_; }
  AcceleratorCounts num_accelerators() const override { return accelerators_; }
  std::string environment() const override { return environment_; }

 private:
  ClusterSpec spec_;
  std::string task_type_;
  int task_id_;
  std::string rpc_layer_;
  AcceleratorCounts accelerators_;
  std::string environment_;
};

DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_CLUSTER_RESOLVER_HPP
// ---- end <distribute/cluster/cluster_resolver.hpp> ----
// ---- begin <distribute/cluster/tf_config.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_TF_CONFIG_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_TF_CONFIG_HPP
// TFConfigClusterResolver: the cluster from the TF_CONFIG environment variable, fully validated.

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <boost/json.hpp>
#include <fmt/format.h>

// ---- begin <distribute/cluster/cluster_resolver.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_CLUSTER_RESOLVER_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_CLUSTER_RESOLVER_HPP
// ClusterResolver: where this process sits in the cluster; SimpleClusterResolver for explicit specs.

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

// ---- begin <distribute/cluster/cluster_spec.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_CLUSTER_SPEC_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_CLUSTER_SPEC_HPP
// ClusterSpec: job name → task addresses, TF's tf.train.ClusterSpec, with JSON in and out.

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/json.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

// ---- begin <distribute/cluster/address.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_ADDRESS_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_ADDRESS_HPP
// Task addresses: "host:port", IPv6 hosts in brackets ("[::1]:2222").

#include <algorithm>
#include <cctype>
#include <charconv>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>


DISTRIBUTE_BEGIN_NAMESPACE

/// A task address split into its parts. `host` carries no brackets, so it can go straight to a
/// resolver; to_string() puts them back for IPv6 hosts.
struct HostPort {
  std::string host;
  int port = 0;

  std::string to_string() const {
    return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port) : fmt::format("{}:{}", host, port);
  }
  friend bool operator==(const HostPort&, const HostPort&) = default;
};

namespace detail {

inline bool is_hostname_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_';
}

/// Splits `address`, or says what is wrong with it as the end of a sentence that starts with
/// "address 'X' " (so every caller can put its own field name in front).
inline std::optional<HostPort> split_host_port(std::string_view address, std::string& why) {
  auto fail = [&](std::string reason) -> std::optional<HostPort> {
    why = std::move(reason);
    return std::nullopt;
  };
  if (address.empty()) return fail("is empty");
  if (auto scheme = address.find("://"); scheme != std::string_view::npos) {
    return fail(fmt::format("has a scheme ('{}'); write host:port and set the rpc layer separately",
                            address.substr(0, scheme + 3)));
  }
  std::string_view host;
  std::string_view port;
  if (address.front() == '[') {
    auto close = address.find(']');
    if (close == std::string_view::npos) return fail("has an unclosed '['");
    host = address.substr(1, close - 1);
    auto rest = address.substr(close + 1);
    if (rest.empty() || rest.front() != ':') return fail("has no ':port' after ']'; expected [host]:port");
    port = rest.substr(1);
    if (host.empty()) return fail("has an empty host in brackets; expected [host]:port");
    // An IPv6 literal: hex digits, ':' and '.' (IPv4-mapped tail), then an optional "%zone".
    auto zone = host.find('%');
    auto ip = host.substr(0, zone);
    bool ok = ip.find(':') != std::string_view::npos &&
              std::all_of(ip.begin(), ip.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) || c == ':' || c == '.'; });
    if (zone != std::string_view::npos) {
      auto z = host.substr(zone + 1);
      ok = ok && !z.empty() && std::all_of(z.begin(), z.end(), is_hostname_char);
    }
    if (!ok) return fail(fmt::format("has '{}' in brackets, which is not an IPv6 address", host));
  } else {
    auto colon = address.rfind(':');
    if (colon == std::string_view::npos) return fail("has no port; expected host:port");
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) {
      return fail("has an IPv6 host without brackets; write [host]:port, e.g. [::1]:2222");
    }
    if (host.empty()) return fail("has an empty host; expected host:port");
    if (auto bad = std::find_if_not(host.begin(), host.end(), is_hostname_char); bad != host.end()) {
      return fail(fmt::format("has host '{}' with the invalid character '{}'", host, *bad));
    }
  }
  if (port.empty()) return fail("has an empty port; expected host:port");
  int p = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  bool digits = std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits || (ec != std::errc{} && ec != std::errc::result_out_of_range) || end != port.data() + port.size()) {
    return fail(fmt::format("has port '{}', which is not a number", port));
  }
  if (ec == std::errc::result_out_of_range || p < 1 || p > 65535) {
    return fail(fmt::format("has port {}, out of range [1, 65535]", port));
  }
  return HostPort{std::string(host), p};
}

}  // namespace detail

/// Splits "host:port" or "[v6]:port"; throws ClusterConfigError naming the address and what is
/// wrong with it (no port, port out of [1, 65535], an unbracketed IPv6 host, a URL scheme...).
inline HostPort split_host_port(std::string_view address) {
  std::string why;
  auto hp = detail::split_host_port(address, why);
  if (!hp) throw ClusterConfigError(fmt::format("address '{}' {}", address, why));
  return *hp;
}

/// True when split_host_port(address) would succeed.
inline bool is_valid_address(std::string_view address) {
  std::string why;
  return detail::split_host_port(address, why).has_value();
}

DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_ADDRESS_HPP
// ---- end <distribute/cluster/address.hpp> ----
// ---- begin <distribute/cluster/detail/json.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_JSON_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_JSON_HPP
// Boost.JSON helpers shared by ClusterSpec and TFConfigClusterResolver: parsing text with the
// error position, describing a value in a message, reading integers strictly.

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include <boost/json.hpp>
#include <fmt/format.h>


DISTRIBUTE_BEGIN_NAMESPACE
namespace detail {

/// Parses `text` as one JSON document. Errors name `who` (the variable or type being read), the
/// character offset and Boost.JSON's own message.
inline boost::json::value cluster_parse_json(std::string_view text, std::string_view who) {
  boost::json::parser parser;
  boost::system::error_code ec;
  std::size_t consumed = parser.write(text.data(), text.size(), ec);
  if (ec) {
    throw ClusterConfigError(fmt::format("{}: invalid JSON at offset {}: {}", who, consumed, ec.message()));
  }
  return parser.release();
}

/// "array", "object", "null", or the value itself for scalars ("number 1.5", "string \"x\"",
/// "bool true"), for "..., got X" in messages.
inline std::string cluster_json_describe(const boost::json::value& v) {
  switch (v.kind()) {
    case boost::json::kind::null: return "null";
    case boost::json::kind::bool_: return fmt::format("bool {}", v.get_bool());
    case boost::json::kind::int64: return fmt::format("number {}", v.get_int64());
    case boost::json::kind::uint64: return fmt::format("number {}", v.get_uint64());
    // fmt, not serialize(): serialize writes 1.5 as "1.5E0".
    case boost::json::kind::double_: return fmt::format("number {}", v.get_double());
    case boost::json::kind::string: return fmt::format("string {}", boost::json::serialize(v));
    case boost::json::kind::array: return "array";
    case boost::json::kind::object: return "object";
  }
  return "unknown";
}

/// The value as an integer if it is a JSON integer that fits in int64 (1.0 and "1" are not).
inline std::optional<std::int64_t> cluster_json_integer(const boost::json::value& v) {
  if (v.is_int64()) return v.get_int64();
  if (v.is_uint64() && v.get_uint64() <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    return static_cast<std::int64_t>(v.get_uint64());
  }
  return std::nullopt;
}

}  // namespace detail
DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_JSON_HPP
// ---- end <distribute/cluster/detail/json.hpp> ----

DISTRIBUTE_BEGIN_NAMESPACE

namespace detail {

/// Task indices are kept below this so that job_tasks() (a list with a slot per index up to
/// the largest) cannot be made to allocate gigabytes by one stray sparse key.
inline constexpr std::int64_t kMaxTaskIndex = 999'999;

/// job → (task index → address): the one representation of dense and sparse jobs alike.
using ClusterJobs = std::map<std::string, std::map<int, std::string>>;

/// "cluster.worker" under TF_CONFIG, "worker" for a bare ClusterSpec.
inline std::string cluster_field(std::string_view root, std::string_view job) {
  return root.empty() ? std::string(job) : fmt::format("{}.{}", root, job);
}

/// Checks job names, task indices and addresses, and that no two tasks share an address.
/// Messages start with `who` ("TF_CONFIG", "ClusterSpec") and name the field under `root`.
inline void validate_cluster_jobs(const ClusterJobs& jobs, std::string_view who, std::string_view root) {
  std::map<std::string, std::string> owner;  // address → the field that first used it
  for (const auto& [job, tasks] : jobs) {
    // TF device names only allow these in a job name ("/job:<name>/...").
    bool name_ok = !job.empty() && std::isalpha(static_cast<unsigned char>(job.front())) &&
                   std::all_of(job.begin(), job.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
    if (!name_ok) {
      throw ClusterConfigError(fmt::format("{}: job name '{}'{} is not a valid name (a letter, then letters, digits or '_')",
                                           who, job, root.empty() ? "" : fmt::format(" in {}", root)));
    }
    for (const auto& [index, address] : tasks) {
      std::string field = fmt::format("{}[{}]", cluster_field(root, job), index);
      if (index < 0 || index > kMaxTaskIndex) {
        throw ClusterConfigError(fmt::format("{}: {} has task index {}, out of range [0, {}]", who, field, index, kMaxTaskIndex));
      }
      std::string why;
      if (!detail::split_host_port(address, why)) {
        throw ClusterConfigError(fmt::format("{}: {} address '{}' {}", who, field, address, why));
      }
      auto [it, fresh] = owner.emplace(address, field);
      if (!fresh) {
        throw ClusterConfigError(fmt::format("{}: {} address '{}' is already used by {}; every task needs its own address",
                                             who, field, address, it->second));
      }
    }
  }
}

/// Reads the JSON shape of a cluster: an object of job → list of addresses (dense) or object of
/// "index" → address (sparse). Only the shape is checked here; validate_cluster_jobs does the rest.
inline ClusterJobs cluster_jobs_from_json(const boost::json::value& v, std::string_view who, std::string_view root) {
  std::string what = root.empty() ? std::string("the cluster JSON") : std::string(root);
  const auto* obj = v.if_object();
  if (obj == nullptr) {
    throw ClusterConfigError(fmt::format("{}: {} must be an object of job name → task addresses, got {}", who, what,
                                         cluster_json_describe(v)));
  }
  ClusterJobs jobs;
  for (const auto& [key, tasks] : *obj) {
    std::string job(key);
    std::string field = cluster_field(root, job);
    auto& out = jobs[job];
    auto address_of = [&](const boost::json::value& a, std::string_view index) -> std::string {
      if (!a.is_string()) {
        throw ClusterConfigError(fmt::format("{}: {}[{}] must be a \"host:port\" string, got {}", who, field, index,
                                             cluster_json_describe(a)));
      }
      return std::string(a.get_string());
    };
    if (const auto* list = tasks.if_array()) {
      if (static_cast<std::int64_t>(list->size()) > kMaxTaskIndex + 1) {
        throw ClusterConfigError(fmt::format("{}: {} lists {} tasks, more than {}", who, field, list->size(), kMaxTaskIndex + 1));
      }
      for (std::size_t i = 0; i < list->size(); ++i) out[static_cast<int>(i)] = address_of((*list)[i], std::to_string(i));
    } else if (const auto* sparse = tasks.if_object()) {
      for (const auto& [index_key, address] : *sparse) {
        std::string_view k = index_key;
        std::int64_t index = -1;
        auto [end, ec] = std::from_chars(k.data(), k.data() + k.size(), index);
        bool digits = !k.empty() && std::all_of(k.begin(), k.end(), [](char c) { return c >= '0' && c <= '9'; });
        if (!digits || ec != std::errc{} || end != k.data() + k.size() || index > kMaxTaskIndex) {
          throw ClusterConfigError(fmt::format("{}: {} has key '{}', which is not a task index (an integer in [0, {}])", who,
                                               field, k, kMaxTaskIndex));
        }
        if (out.count(static_cast<int>(index)) != 0) {
          throw ClusterConfigError(fmt::format("{}: {} gives task index {} twice", who, field, index));
        }
        out[static_cast<int>(index)] = address_of(address, k);
      }
    } else {
      throw ClusterConfigError(fmt::format(
          "{}: {} must be a list of \"host:port\" addresses or an object of task index → address, got {}", who, field,
          cluster_json_describe(tasks)));
    }
  }
  return jobs;
}

}  // namespace detail

/// The addresses of a cluster's tasks, grouped by job ("chief", "worker", "ps", "evaluator"...).
/// A job is dense (tasks 0..n-1, TF's list form) or sparse (some indices only, TF's
/// {"0": "a:1", "3": "b:2"} form, used when a task only needs to know some of its peers).
/// Every address is validated as host:port, and no two tasks may share one. Jobs are kept in
/// name order, as TF sorts them.
class ClusterSpec {
 public:
  using DenseJobs = std::map<std::string, std::vector<std::string>>;
  using SparseJobs = std::map<std::string, std::map<int, std::string>>;

  /// An empty cluster: a single process, no peers.
  ClusterSpec() = default;

  /// From dense jobs: `ds::ClusterSpec({{"worker", {"a:2222", "b:2222"}}, {"ps", {"c:2222"}}})`.
  /// Throws ClusterConfigError naming the bad job name or address. Implicit: a spec is nothing
  /// but its jobs. The initializer-list form keeps `({{"ps", {"a:1"}}})` (one job, one task)
  /// from being ambiguous with the copy constructor.
  ClusterSpec(std::initializer_list<DenseJobs::value_type> jobs) : ClusterSpec(DenseJobs(jobs)) {}
  ClusterSpec(const DenseJobs& jobs) {
    for (const auto& [job, addresses] : jobs) {
      auto& tasks = jobs_[job];
      for (std::size_t i = 0; i < addresses.size(); ++i) tasks[static_cast<int>(i)] = addresses[i];
    }
    detail::validate_cluster_jobs(jobs_, "ClusterSpec", "");
  }

  /// From sparse jobs: `ClusterSpec::from_sparse({{"worker", {{0, "a:1"}, {3, "b:2"}}}})`.
  static ClusterSpec from_sparse(SparseJobs jobs) {
    detail::validate_cluster_jobs(jobs, "ClusterSpec", "");
    ClusterSpec spec;
    spec.jobs_ = std::move(jobs);
    return spec;
  }

  /// From TF's JSON: `{"worker": ["a:1", "b:2"], "ps": {"0": "c:3"}}`. Throws
  /// ClusterConfigError on a syntax error (with Boost.JSON's message and the offset) or a
  /// malformed job, naming the field ("ClusterSpec: worker[1] address 'b' has no port...").
  static ClusterSpec from_json(std::string_view json) { return from_json(detail::cluster_parse_json(json, "ClusterSpec")); }
  static ClusterSpec from_json(const boost::json::value& json) {
    return from_sparse(detail::cluster_jobs_from_json(json, "ClusterSpec", ""));
  }
  // boost::json::value converts from text too; these say which overload text means.
  static ClusterSpec from_json(const char* json) { return from_json(std::string_view(json)); }
  static ClusterSpec from_json(const std::string& json) { return from_json(std::string_view(json)); }
  static ClusterSpec from_json(const boost::json::object& json) { return from_json(boost::json::value(json)); }

  /// The JSON object TF writes: dense jobs as lists, sparse jobs as {"index": address}.
  boost::json::object to_json_value() const {
    boost::json::object out;
    for (const auto& [job, tasks] : jobs_) {
      if (is_dense(tasks)) {
        boost::json::array list;
        for (const auto& entry : tasks) list.emplace_back(entry.second);
        out[job] = std::move(list);
      } else {
        boost::json::object sparse;
        for (const auto& [index, address] : tasks) sparse[std::to_string(index)] = address;
        out[job] = std::move(sparse);
      }
    }
    return out;
  }
  std::string to_json() const { return boost::json::serialize(to_json_value()); }

  bool empty() const { return jobs_.empty(); }
  bool has_job(std::string_view job) const { return find(job) != jobs_.end(); }
  bool has_task(std::string_view job, int index) const {
    auto it = find(job);
    return it != jobs_.end() && it->second.count(index) != 0;
  }

  /// Job names in order.
  std::vector<std::string> jobs() const {
    std::vector<std::string> names;
    for (const auto& entry : jobs_) names.push_back(entry.first);
    return names;
  }

  /// Number of tasks defined in `job` (for a sparse job, not its largest index + 1).
  int num_tasks(std::string_view job) const { return static_cast<int>(tasks_of(job, "num_tasks").size()); }

  /// The task indices of `job`, ascending.
  std::vector<int> task_indices(std::string_view job) const {
    std::vector<int> out;
    for (const auto& entry : tasks_of(job, "task_indices")) out.push_back(entry.first);
    return out;
  }

  /// The address of task `index` of `job`; InvalidArgument if there is no such task.
  const std::string& task_address(std::string_view job, int index) const {
    const auto& tasks = tasks_of(job, "task_address");
    auto it = tasks.find(index);
    if (it == tasks.end()) {
      throw InvalidArgument(fmt::format("ClusterSpec::task_address: job '{}' has no task {} (task indices: {})", job, index,
                                        fmt::join(task_indices(job), ", ")));
    }
    return it->second;
  }

  /// TF's job_tasks: the addresses by index, a slot per index up to the largest; slots of a
  /// sparse job that no task fills are empty strings (TF's None).
  std::vector<std::string> job_tasks(std::string_view job) const {
    const auto& tasks = tasks_of(job, "job_tasks");
    std::vector<std::string> out(tasks.empty() ? 0 : static_cast<std::size_t>(tasks.rbegin()->first) + 1);
    for (const auto& [index, address] : tasks) out[static_cast<std::size_t>(index)] = address;
    return out;
  }

  /// Everything, as job → (index → address).
  const SparseJobs& as_dict() const { return jobs_; }

  friend bool operator==(const ClusterSpec&, const ClusterSpec&) = default;

 private:
  static bool is_dense(const std::map<int, std::string>& tasks) {
    return tasks.empty() || tasks.rbegin()->first + 1 == static_cast<int>(tasks.size());
  }
  SparseJobs::const_iterator find(std::string_view job) const {
    return std::find_if(jobs_.begin(), jobs_.end(), [&](const auto& entry) { return entry.first == job; });
  }
  const std::map<int, std::string>& tasks_of(std::string_view job, std::string_view what) const {
    auto it = find(job);
    if (it == jobs_.end()) {
      throw InvalidArgument(fmt::format("ClusterSpec::{}: no job '{}' in the cluster (jobs: {})", what, job,
                                        jobs_.empty() ? std::string("none") : fmt::format("{}", fmt::join(jobs(), ", "))));
    }
    return it->second;
  }

  SparseJobs jobs_;
};

DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_CLUSTER_SPEC_HPP
// ---- end <distribute/cluster/cluster_spec.hpp> ----
// ---- begin <distribute/cluster/detail/env.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_ENV_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_ENV_HPP
// Reading environment variables, from the process or from an injected map (tests).

#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>


DISTRIBUTE_BEGIN_NAMESPACE
namespace detail {

/// Variable name → value. Transparent comparison so lookups by string_view do not allocate.
using EnvMap = std::map<std::string, std::string, std::less<>>;

/// Looks variables up in `map` when one is given, else in the process environment. Resolvers
/// take a map in a constructor overload so tests never have to mutate the real environment
/// (setenv is not thread-safe and would leak between test cases).
class EnvReader {
 public:
  EnvReader() = default;
  explicit EnvReader(const EnvMap* map) : map_(map) {}

  std::optional<std::string> get(std::string_view name) const {
    if (map_ != nullptr) {
      auto it = map_->find(name);
      if (it == map_->end()) return std::nullopt;
      return it->second;
    }
    // std::getenv needs a NUL-terminated name.
    const char* v = std::getenv(std::string(name).c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  }

  bool has(std::string_view name) const { return get(name).has_value(); }

 private:
  const EnvMap* map_ = nullptr;
};

/// Parses a whole decimal integer (optional leading '-'; no spaces, signs or suffixes).
inline std::optional<std::int64_t> parse_env_integer(std::string_view s) {
  std::int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc{} || p != s.data() + s.size()) return std::nullopt;
  return v;
}

/// The integer value of variable `name`, which must be set and lie in [lo, hi]. `who` prefixes
/// the message ("SlurmClusterResolver") so the user knows which resolver read it.
inline int require_env_int(const EnvReader& env, std::string_view who, std::string_view name, std::int64_t lo,
                           std::int64_t hi, std::string_view hint = {}) {
  auto raw = env.get(name);
  if (!raw) throw ClusterConfigError(fmt::format("{}: environment variable {} is not set{}", who, name, hint));
  auto v = parse_env_integer(*raw);
  if (!v) throw ClusterConfigError(fmt::format("{}: {}='{}' is not an integer", who, name, *raw));
  if (*v < lo || *v > hi) {
    throw ClusterConfigError(fmt::format("{}: {}={} is out of range; it must be in [{}, {}]", who, name, *v, lo, hi));
  }
  return static_cast<int>(*v);
}

}  // namespace detail
DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_ENV_HPP
// ---- end <distribute/cluster/detail/env.hpp> ----

DISTRIBUTE_BEGIN_NAMESPACE

/// Environment variables handed to a resolver instead of the process environment (tests, or a
/// program that computes them). Lookups by string_view do not allocate.
using EnvVars = detail::EnvMap;

/// Device type → count, as TF's num_accelerators() ({"GPU": 2}); empty for host-only tasks.
using AcceleratorCounts = std::map<std::string, int>;

namespace detail {

inline std::string cluster_tasks_phrase(std::int64_t n) { return fmt::format("{} task{}", n, n == 1 ? "" : "s"); }

/// Checks that task (type, id) exists in `spec`. An evaluator may be missing from the cluster
/// (TF runs it beside the training cluster), and then it is the only evaluator, index 0.
/// `type_label`/`id_label` name the fields ("TF_CONFIG: task.type"), `cluster_name` the spec.
inline void check_task_in_cluster(const ClusterSpec& spec, std::string_view type, std::int64_t id,
                                  std::string_view type_label, std::string_view id_label, std::string_view cluster_name) {
  if (type.empty()) throw ClusterConfigError(fmt::format("{} is empty", type_label));
  if (id < 0) throw ClusterConfigError(fmt::format("{} {} is negative", id_label, id));
  if (!spec.has_job(type)) {
    if (type == "evaluator") {
      if (id != 0) {
        throw ClusterConfigError(fmt::format(
            "{} {} is out of range for job 'evaluator', which is not in {} and so has one task (index 0)", id_label, id,
            cluster_name));
      }
      return;
    }
    throw ClusterConfigError(fmt::format("{} '{}' has no job in {} (jobs: {})", type_label, type, cluster_name,
                                         spec.empty() ? std::string("none") : fmt::format("{}", fmt::join(spec.jobs(), ", "))));
  }
  auto indices = spec.task_indices(type);
  bool dense = indices.empty() || indices.back() + 1 == static_cast<int>(indices.size());
  if (dense && id >= static_cast<std::int64_t>(indices.size())) {
    throw ClusterConfigError(fmt::format("{} {} is out of range for job '{}' with {}", id_label, id, type,
                                         cluster_tasks_phrase(static_cast<std::int64_t>(indices.size()))));
  }
  if (!dense && !spec.has_task(type, static_cast<int>(std::min<std::int64_t>(id, kMaxTaskIndex + 1)))) {
    throw ClusterConfigError(fmt::format("{} {} is not a task of job '{}' (task indices: {})", id_label, id, type,
                                         fmt::join(indices, ", ")));
  }
}

inline int cluster_job_size(const ClusterSpec& spec, std::string_view job) {
  return spec.has_job(job) ? spec.num_tasks(job) : 0;
}

}  // namespace detail

/// Where this process sits in a cluster: the cluster's spec, this task's type and index, the
/// RPC layer and local accelerators. Resolvers read it from somewhere (TF_CONFIG, Slurm, a
/// launcher's environment) once, at construction, and validate it there, so the getters are
/// cheap and cannot fail. Users may derive their own.
///
/// The helpers below follow TF's multi_worker_util. A cluster with an empty spec is local mode:
/// one process, which is worker 0 and the chief.
class ClusterResolver {
 public:
  virtual ~ClusterResolver() = default;

  virtual const ClusterSpec& cluster_spec() const = 0;
  /// "chief", "worker", "ps" or "evaluator" (custom resolvers may use other job names).
  virtual std::string task_type() const = 0;
  virtual int task_id() const = 0;
  /// "grpc" and the like; empty when the configuration names none.
  virtual std::string rpc_layer() const = 0;
  virtual AcceleratorCounts num_accelerators() const = 0;
  /// TF's free-form environment string ("cloud", "google"); empty unless configured.
  virtual std::string environment() const { return {}; }

  /// The chief task; without a chief job, worker 0. The evaluator also counts as chief of its
  /// own work, as in TF (it writes its own summaries).
  bool is_chief() const {
    const auto type = task_type();
    if (type == "chief" || type == "evaluator") return true;
    return type == "worker" && task_id() == 0 && detail::cluster_job_size(cluster_spec(), "chief") == 0;
  }

  /// The number of tasks that run replicas in sync: chief + workers (1 in local mode). For the
  /// evaluator, the evaluators (it trains with nobody). ClusterConfigError for other tasks.
  int worker_count() const {
    const auto& spec = cluster_spec();
    const auto type = task_type();
    if (spec.empty()) return 1;
    if (type == "evaluator") return std::max(1, detail::cluster_job_size(spec, "evaluator"));
    if (type != "chief" && type != "worker") {
      throw ClusterConfigError(
          fmt::format("ClusterResolver::worker_count: task type '{}' runs no replicas; only chief and worker tasks do", type));
    }
    return detail::cluster_job_size(spec, "chief") + detail::cluster_job_size(spec, "worker");
  }

  /// This task's position among the tasks that run replicas: the chief is 0 and worker i is
  /// i + 1 when there is a chief, else i (TF's id_in_cluster). ClusterConfigError for the
  /// evaluator and for ps tasks, which have no replicas.
  int id_in_cluster() const {
    const auto& spec = cluster_spec();
    const auto type = task_type();
    if (type == "chief") return 0;
    if (type == "worker") return task_id() + detail::cluster_job_size(spec, "chief");
    if (type == "evaluator") {
      throw ClusterConfigError(
          "ClusterResolver::id_in_cluster: task type 'evaluator' has no id in the cluster; it runs beside training");
    }
    throw ClusterConfigError(fmt::format(
        "ClusterResolver::id_in_cluster: task type '{}' has no id in the cluster; only chief and worker tasks do", type));
  }

  /// The global id of local replica `local_id` when every task runs `local_replicas`:
  /// id_in_cluster() * local_replicas + local_id.
  int global_replica_id(int local_replicas, int local_id) const {
    if (local_replicas < 1 || local_id < 0 || local_id >= local_replicas) {
      throw InvalidArgument(fmt::format(
          "ClusterResolver::global_replica_id: local replica {} is out of range for {} local replicas", local_id,
          local_replicas));
    }
    return id_in_cluster() * local_replicas + local_id;
  }

  /// The address everyone rendezvous with: the chief's, else worker 0's. Empty in local mode
  /// (an empty spec), where there is nobody to connect to.
  std::string master_address() const {
    const auto& spec = cluster_spec();
    if (spec.empty()) return {};
    if (detail::cluster_job_size(spec, "chief") > 0) return spec.task_address("chief", spec.task_indices("chief").front());
    if (spec.has_task("worker", 0)) return spec.task_address("worker", 0);
    throw ClusterConfigError(fmt::format("ClusterResolver::master_address: the cluster (jobs: {}) has neither a chief nor worker 0",
                                         fmt::join(spec.jobs(), ", ")));
  }

 protected:
  ClusterResolver() = default;
  ClusterResolver(const ClusterResolver&) = default;
  ClusterResolver(ClusterResolver&&) = default;
  ClusterResolver& operator=(const ClusterResolver&) = default;
  ClusterResolver& operator=(ClusterResolver&&) = default;
};

/// A resolver for a spec the program already has (TF's SimpleClusterResolver). The task must
/// exist in the spec unless the spec is empty (local mode); ClusterConfigError otherwise.
class SimpleClusterResolver : public ClusterResolver {
 public:
  SimpleClusterResolver(ClusterSpec cluster_spec, std::string task_type, int task_id, std::string rpc_layer = "grpc",
                        AcceleratorCounts num_accelerators = {}, std::string environment = {})
      : spec_(std::move(cluster_spec)),
        task_type_(std::move(task_type)),
        task_id_(task_id),
        rpc_layer_(std::move(rpc_layer)),
        accelerators_(std::move(num_accelerators)),
        environment_(std::move(environment)) {
    if (task_type_.empty()) throw ClusterConfigError("SimpleClusterResolver: task_type is empty");
    if (task_id_ < 0) throw ClusterConfigError(fmt::format("SimpleClusterResolver: task_id {} is negative", task_id_));
    if (!spec_.empty()) {
      detail::check_task_in_cluster(spec_, task_type_, task_id_, "SimpleClusterResolver: task_type",
                                    "SimpleClusterResolver: task_id", "the cluster spec");
    }
    for (const auto& [device, count] : accelerators_) {
      if (count < 0) {
        throw ClusterConfigError(fmt::format("SimpleClusterResolver: num_accelerators['{}'] is {}, negative", device, count));
      }
    }
  }

  const ClusterSpec& cluster_spec() const override { return spec_; }
  std::string task_type() const override { return task_type_; }
  int task_id() const override { return task_id_; }
  std::string rpc_layer() const override { return rpc_layer_; }
  AcceleratorCounts num_accelerators() const override { return accelerators_; }
  std::string environment() const override { return environment_; }

 private:
  ClusterSpec spec_;
  std::string task_type_;
  int task_id_;
  std::string rpc_layer_;
  AcceleratorCounts accelerators_;
  std::string environment_;
};

DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_CLUSTER_RESOLVER_HPP
// ---- end <distribute/cluster/cluster_resolver.hpp> ----
// ---- begin <distribute/cluster/cluster_spec.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_CLUSTER_SPEC_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_CLUSTER_SPEC_HPP
// ClusterSpec: job name → task addresses, TF's tf.train.ClusterSpec, with JSON in and out.

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/json.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

// ---- begin <distribute/cluster/address.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_ADDRESS_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_ADDRESS_HPP
// Task addresses: "host:port", IPv6 hosts in brackets ("[::1]:2222").

#include <algorithm>
#include <cctype>
#include <charconv>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>


DISTRIBUTE_BEGIN_NAMESPACE

/// A task address split into its parts. `host` carries no brackets, so it can go straight to a
/// resolver; to_string() puts them back for IPv6 hosts.
struct HostPort {
  std::string host;
  int port = 0;

  std::string to_string() const {
    return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port) : fmt::format("{}:{}", host, port);
  }
  friend bool operator==(const HostPort&, const HostPort&) = default;
};

namespace detail {

inline bool is_hostname_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_';
}

/// Splits `address`, or says what is wrong with it as the end of a sentence that starts with
/// "address 'X' " (so every caller can put its own field name in front).
inline std::optional<HostPort> split_host_port(std::string_view address, std::string& why) {
  auto fail = [&](std::string reason) -> std::optional<HostPort> {
    why = std::move(reason);
    return std::nullopt;
  };
  if (address.empty()) return fail("is empty");
  if (auto scheme = address.find("://"); scheme != std::string_view::npos) {
    return fail(fmt::format("has a scheme ('{}'); write host:port and set the rpc layer separately",
                            address.substr(0, scheme + 3)));
  }
  std::string_view host;
  std::string_view port;
  if (address.front() == '[') {
    auto close = address.find(']');
    if (close == std::string_view::npos) return fail("has an unclosed '['");
    host = address.substr(1, close - 1);
    auto rest = address.substr(close + 1);
    if (rest.empty() || rest.front() != ':') return fail("has no ':port' after ']'; expected [host]:port");
    port = rest.substr(1);
    if (host.empty()) return fail("has an empty host in brackets; expected [host]:port");
    // An IPv6 literal: hex digits, ':' and '.' (IPv4-mapped tail), then an optional "%zone".
    auto zone = host.find('%');
    auto ip = host.substr(0, zone);
    bool ok = ip.find(':') != std::string_view::npos &&
              std::all_of(ip.begin(), ip.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) || c == ':' || c == '.'; });
    if (zone != std::string_view::npos) {
      auto z = host.substr(zone + 1);
      ok = ok && !z.empty() && std::all_of(z.begin(), z.end(), is_hostname_char);
    }
    if (!ok) return fail(fmt::format("has '{}' in brackets, which is not an IPv6 address", host));
  } else {
    auto colon = address.rfind(':');
    if (colon == std::string_view::npos) return fail("has no port; expected host:port");
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) {
      return fail("has an IPv6 host without brackets; write [host]:port, e.g. [::1]:2222");
    }
    if (host.empty()) return fail("has an empty host; expected host:port");
    if (auto bad = std::find_if_not(host.begin(), host.end(), is_hostname_char); bad != host.end()) {
      return fail(fmt::format("has host '{}' with the invalid character '{}'", host, *bad));
    }
  }
  if (port.empty()) return fail("has an empty port; expected host:port");
  int p = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  bool digits = std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits || (ec != std::errc{} && ec != std::errc::result_out_of_range) || end != port.data() + port.size()) {
    return fail(fmt::format("has port '{}', which is not a number", port));
  }
  if (ec == std::errc::result_out_of_range || p < 1 || p > 65535) {
    return fail(fmt::format("has port {}, out of range [1, 65535]", port));
  }
  return HostPort{std::string(host), p};
}

}  // namespace detail

/// Splits "host:port" or "[v6]:port"; throws ClusterConfigError naming the address and what is
/// wrong with it (no port, port out of [1, 65535], an unbracketed IPv6 host, a URL scheme...).
inline HostPort split_host_port(std::string_view address) {
  std::string why;
  auto hp = detail::split_host_port(address, why);
  if (!hp) throw ClusterConfigError(fmt::format("address '{}' {}", address, why));
  return *hp;
}

/// True when split_host_port(address) would succeed.
inline bool is_valid_address(std::string_view address) {
  std::string why;
  return detail::split_host_port(address, why).has_value();
}

DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_ADDRESS_HPP
// ---- end <distribute/cluster/address.hpp> ----
// ---- begin <distribute/cluster/detail/json.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_JSON_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_JSON_HPP
// Boost.JSON helpers shared by ClusterSpec and TFConfigClusterResolver: parsing text with the
// error position, describing a value in a message, reading integers strictly.

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include <boost/json.hpp>
#include <fmt/format.h>


DISTRIBUTE_BEGIN_NAMESPACE
namespace detail {

/// Parses `text` as one JSON document. Errors name `who` (the variable or type being read), the
/// character offset and Boost.JSON's own message.
inline boost::json::value cluster_parse_json(std::string_view text, std::string_view who) {
  boost::json::parser parser;
  boost::system::error_code ec;
  std::size_t consumed = parser.write(text.data(), text.size(), ec);
  if (ec) {
    throw ClusterConfigError(fmt::format("{}: invalid JSON at offset {}: {}", who, consumed, ec.message()));
  }
  return parser.release();
}

/// "array", "object", "null", or the value itself for scalars ("number 1.5", "string \"x\"",
/// "bool true"), for "..., got X" in messages.
inline std::string cluster_json_describe(const boost::json::value& v) {
  switch (v.kind()) {
    case boost::json::kind::null: return "null";
    case boost::json::kind::bool_: return fmt::format("bool {}", v.get_bool());
    case boost::json::kind::int64: return fmt::format("number {}", v.get_int64());
    case boost::json::kind::uint64: return fmt::format("number {}", v.get_uint64());
    // fmt, not serialize(): serialize writes 1.5 as "1.5E0".
    case boost::json::kind::double_: return fmt::format("number {}", v.get_double());
    case boost::json::kind::string: return fmt::format("string {}", boost::json::serialize(v));
    case boost::json::kind::array: return "array";
    case boost::json::kind::object: return "object";
  }
  return "unknown";
}

/// The value as an integer if it is a JSON integer that fits in int64 (1.0 and "1" are not).
inline std::optional<std::int64_t> cluster_json_integer(const boost::json::value& v) {
  if (v.is_int64()) return v.get_int64();
  if (v.is_uint64() && v.get_uint64() <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    return static_cast<std::int64_t>(v.get_uint64());
  }
  return std::nullopt;
}

}  // namespace detail
DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_JSON_HPP
// ---- end <distribute/cluster/detail/json.hpp> ----

DISTRIBUTE_BEGIN_NAMESPACE

namespace detail {

/// Task indices are kept below this so that job_tasks() (a list with a slot per index up to
/// the largest) cannot be made to allocate gigabytes by one stray sparse key.
inline constexpr std::int64_t kMaxTaskIndex = 999'999;

/// job → (task index → address): the one representation of dense and sparse jobs alike.
using ClusterJobs = std::map<std::string, std::map<int, std::string>>;

/// "cluster.worker" under TF_CONFIG, "worker" for a bare ClusterSpec.
inline std::string cluster_field(std::string_view root, std::string_view job) {
  return root.empty() ? std::string(job) : fmt::format("{}.{}", root, job);
}

/// Checks job names, task indices and addresses, and that no two tasks share an address.
/// Messages start with `who` ("TF_CONFIG", "ClusterSpec") and name the field under `root`.
inline void validate_cluster_jobs(const ClusterJobs& jobs, std::string_view who, std::string_view root) {
  std::map<std::string, std::string> owner;  // address → the field that first used it
  for (const auto& [job, tasks] : jobs) {
    // TF device names only allow these in a job name ("/job:<name>/...").
    bool name_ok = !job.empty() && std::isalpha(static_cast<unsigned char>(job.front())) &&
                   std::all_of(job.begin(), job.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
    if (!name_ok) {
      throw ClusterConfigError(fmt::format("{}: job name '{}'{} is not a valid name (a letter, then letters, digits or '_')",
                                           who, job, root.empty() ? "" : fmt::format(" in {}", root)));
    }
    for (const auto& [index, address] : tasks) {
      std::string field = fmt::format("{}[{}]", cluster_field(root, job), index);
      if (index < 0 || index > kMaxTaskIndex) {
        throw ClusterConfigError(fmt::format("{}: {} has task index {}, out of range [0, {}]", who, field, index, kMaxTaskIndex));
      }
      std::string why;
      if (!detail::split_host_port(address, why)) {
        throw ClusterConfigError(fmt::format("{}: {} address '{}' {}", who, field, address, why));
      }
      auto [it, fresh] = owner.emplace(address, field);
      if (!fresh) {
        throw ClusterConfigError(fmt::format("{}: {} address '{}' is already used by {}; every task needs its own address",
                                             who, field, address, it->second));
      }
    }
  }
}

/// Reads the JSON shape of a cluster: an object of job → list of addresses (dense) or object of
/// "index" → address (sparse). Only the shape is checked here; validate_cluster_jobs does the rest.
inline ClusterJobs cluster_jobs_from_json(const boost::json::value& v, std::string_view who, std::string_view root) {
  std::string what = root.empty() ? std::string("the cluster JSON") : std::string(root);
  const auto* obj = v.if_object();
  if (obj == nullptr) {
    throw ClusterConfigError(fmt::format("{}: {} must be an object of job name → task addresses, got {}", who, what,
                                         cluster_json_describe(v)));
  }
  ClusterJobs jobs;
  for (const auto& [key, tasks] : *obj) {
    std::string job(key);
    std::string field = cluster_field(root, job);
    auto& out = jobs[job];
    auto address_of = [&](const boost::json::value& a, std::string_view index) -> std::string {
      if (!a.is_string()) {
        throw ClusterConfigError(fmt::format("{}: {}[{}] must be a \"host:port\" string, got {}", who, field, index,
                                             cluster_json_describe(a)));
      }
      return std::string(a.get_string());
    };
    if (const auto* list = tasks.if_array()) {
      if (static_cast<std::int64_t>(list->size()) > kMaxTaskIndex + 1) {
        throw ClusterConfigError(fmt::format("{}: {} lists {} tasks, more than {}", who, field, list->size(), kMaxTaskIndex + 1));
      }
      for (std::size_t i = 0; i < list->size(); ++i) out[static_cast<int>(i)] = address_of((*list)[i], std::to_string(i));
    } else if (const auto* sparse = tasks.if_object()) {
      for (const auto& [index_key, address] : *sparse) {
        std::string_view k = index_key;
        std::int64_t index = -1;
        auto [end, ec] = std::from_chars(k.data(), k.data() + k.size(), index);
        bool digits = !k.empty() && std::all_of(k.begin(), k.end(), [](char c) { return c >= '0' && c <= '9'; });
        if (!digits || ec != std::errc{} || end != k.data() + k.size() || index > kMaxTaskIndex) {
          throw ClusterConfigError(fmt::format("{}: {} has key '{}', which is not a task index (an integer in [0, {}])", who,
                                               field, k, kMaxTaskIndex));
        }
        if (out.count(static_cast<int>(index)) != 0) {
          throw ClusterConfigError(fmt::format("{}: {} gives task index {} twice", who, field, index));
        }
        out[static_cast<int>(index)] = address_of(address, k);
      }
    } else {
      throw ClusterConfigError(fmt::format(
          "{}: {} must be a list of \"host:port\" addresses or an object of task index → address, got {}", who, field,
          cluster_json_describe(tasks)));
    }
  }
  return jobs;
}

}  // namespace detail

/// The addresses of a cluster's tasks, grouped by job ("chief", "worker", "ps", "evaluator"...).
/// A job is dense (tasks 0..n-1, TF's list form) or sparse (some indices only, TF's
/// {"0": "a:1", "3": "b:2"} form, used when a task only needs to know some of its peers).
/// Every address is validated as host:port, and no two tasks may share one. Jobs are kept in
/// name order, as TF sorts them.
class ClusterSpec {
 public:
  using DenseJobs = std::map<std::string, std::vector<std::string>>;
  using SparseJobs = std::map<std::string, std::map<int, std::string>>;

  /// An empty cluster: a single process, no peers.
  ClusterSpec() = default;

  /// From dense jobs: `ds::ClusterSpec({{"worker", {"a:2222", "b:2222"}}, {"ps", {"c:2222"}}})`.
  /// Throws ClusterConfigError naming the bad job name or address. Implicit: a spec is nothing
  /// but its jobs. The initializer-list form keeps `({{"ps", {"a:1"}}})` (one job, one task)
  /// from being ambiguous with the copy constructor.
  ClusterSpec(std::initializer_list<DenseJobs::value_type> jobs) : ClusterSpec(DenseJobs(jobs)) {}
  ClusterSpec(const DenseJobs& jobs) {
    for (const auto& [job, addresses] : jobs) {
      auto& tasks = jobs_[job];
      for (std::size_t i = 0; i < addresses.size(); ++i) tasks[static_cast<int>(i)] = addresses[i];
    }
    detail::validate_cluster_jobs(jobs_, "ClusterSpec", "");
  }

  /// From sparse jobs: `ClusterSpec::from_sparse({{"worker", {{0, "a:1"}, {3, "b:2"}}}})`.
  static ClusterSpec from_sparse(SparseJobs jobs) {
    detail::validate_cluster_jobs(jobs, "ClusterSpec", "");
    ClusterSpec spec;
    spec.jobs_ = std::move(jobs);
    return spec;
  }

  /// From TF's JSON: `{"worker": ["a:1", "b:2"], "ps": {"0": "c:3"}}`. Throws
  /// ClusterConfigError on a syntax error (with Boost.JSON's message and the offset) or a
  /// malformed job, naming the field ("ClusterSpec: worker[1] address 'b' has no port...").
  static ClusterSpec from_json(std::string_view json) { return from_json(detail::cluster_parse_json(json, "ClusterSpec")); }
  static ClusterSpec from_json(const boost::json::value& json) {
    return from_sparse(detail::cluster_jobs_from_json(json, "ClusterSpec", ""));
  }
  // boost::json::value converts from text too; these say which overload text means.
  static ClusterSpec from_json(const char* json) { return from_json(std::string_view(json)); }
  static ClusterSpec from_json(const std::string& json) { return from_json(std::string_view(json)); }
  static ClusterSpec from_json(const boost::json::object& json) { return from_json(boost::json::value(json)); }

  /// The JSON object TF writes: dense jobs as lists, sparse jobs as {"index": address}.
  boost::json::object to_json_value() const {
    boost::json::object out;
    for (const auto& [job, tasks] : jobs_) {
      if (is_dense(tasks)) {
        boost::json::array list;
        for (const auto& entry : tasks) list.emplace_back(entry.second);
        out[job] = std::move(list);
      } else {
        boost::json::object sparse;
        for (const auto& [index, address] : tasks) sparse[std::to_string(index)] = address;
        out[job] = std::move(sparse);
      }
    }
    return out;
  }
  std::string to_json() const { return boost::json::serialize(to_json_value()); }

  bool empty() const { return jobs_.empty(); }
  bool has_job(std::string_view job) const { return find(job) != jobs_.end(); }
  bool has_task(std::string_view job, int index) const {
    auto it = find(job);
    return it != jobs_.end() && it->second.count(index) != 0;
  }

  /// Job names in order.
  std::vector<std::string> jobs() const {
    std::vector<std::string> names;
    for (const auto& entry : jobs_) names.push_back(entry.first);
    return names;
  }

  /// Number of tasks defined in `job` (for a sparse job, not its largest index + 1).
  int num_tasks(std::string_view job) const { return static_cast<int>(tasks_of(job, "num_tasks").size()); }

  /// The task indices of `job`, ascending.
  std::vector<int> task_indices(std::string_view job) const {
    std::vector<int> out;
    for (const auto& entry : tasks_of(job, "task_indices")) out.push_back(entry.first);
    return out;
  }

  /// The address of task `index` of `job`; InvalidArgument if there is no such task.
  const std::string& task_address(std::string_view job, int index) const {
    const auto& tasks = tasks_of(job, "task_address");
    auto it = tasks.find(index);
    if (it == tasks.end()) {
      throw InvalidArgument(fmt::format("ClusterSpec::task_address: job '{}' has no task {} (task indices: {})", job, index,
                                        fmt::join(task_indices(job), ", ")));
    }
    return it->second;
  }

  /// TF's job_tasks: the addresses by index, a slot per index up to the largest; slots of a
  /// sparse job that no task fills are empty strings (TF's None).
  std::vector<std::string> job_tasks(std::string_view job) const {
    const auto& tasks = tasks_of(job, "job_tasks");
    std::vector<std::string> out(tasks.empty() ? 0 : static_cast<std::size_t>(tasks.rbegin()->first) + 1);
    for (const auto& [index, address] : tasks) out[static_cast<std::size_t>(index)] = address;
    return out;
  }

  /// Everything, as job → (index → address).
  const SparseJobs& as_dict() const { return jobs_; }

  friend bool operator==(const ClusterSpec&, const ClusterSpec&) = default;

 private:
  static bool is_dense(const std::map<int, std::string>& tasks) {
    return tasks.empty() || tasks.rbegin()->first + 1 == static_cast<int>(tasks.size());
  }
  SparseJobs::const_iterator find(std::string_view job) const {
    return std::find_if(jobs_.begin(), jobs_.end(), [&](const auto& entry) { return entry.first == job; });
  }
  const std::map<int, std::string>& tasks_of(std::string_view job, std::string_view what) const {
    auto it = find(job);
    if (it == jobs_.end()) {
      throw InvalidArgument(fmt::format("ClusterSpec::{}: no job '{}' in the cluster (jobs: {})", what, job,
                                        jobs_.empty() ? std::string("none") : fmt::format("{}", fmt::join(jobs(), ", "))));
    }
    return it->second;
  }

  SparseJobs jobs_;
};

DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_CLUSTER_SPEC_HPP
// ---- end <distribute/cluster/cluster_spec.hpp> ----
// ---- begin <distribute/cluster/detail/env.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_ENV_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_ENV_HPP
// Reading environment variables, from the process or from an injected map (tests).

#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>


DISTRIBUTE_BEGIN_NAMESPACE
namespace detail {

/// Variable name → value. Transparent comparison so lookups by string_view do not allocate.
using EnvMap = std::map<std::string, std::string, std::less<>>;

/// Looks variables up in `map` when one is given, else in the process environment. Resolvers
/// take a map in a constructor overload so tests never have to mutate the real environment
/// (setenv is not thread-safe and would leak between test cases).
class EnvReader {
 public:
  EnvReader() = default;
  explicit EnvReader(const EnvMap* map) : map_(map) {}

  std::optional<std::string> get(std::string_view name) const {
    if (map_ != nullptr) {
      auto it = map_->find(name);
      if (it == map_->end()) return std::nullopt;
      return it->second;
    }
    // std::getenv needs a NUL-terminated name.
    const char* v = std::getenv(std::string(name).c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  }

  bool has(std::string_view name) const { return get(name).has_value(); }

 private:
  const EnvMap* map_ = nullptr;
};

/// Parses a whole decimal integer (optional leading '-'; no spaces, signs or suffixes).
inline std::optional<std::int64_t> parse_env_integer(std::string_view s) {
  std::int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc{} || p != s.data() + s.size()) return std::nullopt;
  return v;
}

/// The integer value of variable `name`, which must be set and lie in [lo, hi]. `who` prefixes
/// the message ("SlurmClusterResolver") so the user knows which resolver read it.
inline int require_env_int(const EnvReader& env, std::string_view who, std::string_view name, std::int64_t lo,
                           std::int64_t hi, std::string_view hint = {}) {
  auto raw = env.get(name);
  if (!raw) throw ClusterConfigError(fmt::format("{}: environment variable {} is not set{}", who, name, hint));
  auto v = parse_env_integer(*raw);
  if (!v) throw ClusterConfigError(fmt::format("{}: {}='{}' is not an integer", who, name, *raw));
  if (*v < lo || *v > hi) {
    throw ClusterConfigError(fmt::format("{}: {}={} is out of range; it must be in [{}, {}]", who, name, *v, lo, hi));
  }
  return static_cast<int>(*v);
}

}  // namespace detail
DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_ENV_HPP
// ---- end <distribute/cluster/detail/env.hpp> ----
// ---- begin <distribute/cluster/detail/json.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_JSON_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_JSON_HPP
// Boost.JSON helpers shared by ClusterSpec and TFConfigClusterResolver: parsing text with the
// error position, describing a value in a message, reading integers strictly.

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include <boost/json.hpp>
#include <fmt/format.h>


DISTRIBUTE_BEGIN_NAMESPACE
namespace detail {

/// Parses `text` as one JSON document. Errors name `who` (the variable or type being read), the
/// character offset and Boost.JSON's own message.
inline boost::json::value cluster_parse_json(std::string_view text, std::string_view who) {
  boost::json::parser parser;
  boost::system::error_code ec;
  std::size_t consumed = parser.write(text.data(), text.size(), ec);
  if (ec) {
    throw ClusterConfigError(fmt::format("{}: invalid JSON at offset {}: {}", who, consumed, ec.message()));
  }
  return parser.release();
}

/// "array", "object", "null", or the value itself for scalars ("number 1.5", "string \"x\"",
/// "bool true"), for "..., got X" in messages.
inline std::string cluster_json_describe(const boost::json::value& v) {
  switch (v.kind()) {
    case boost::json::kind::null: return "null";
    case boost::json::kind::bool_: return fmt::format("bool {}", v.get_bool());
    case boost::json::kind::int64: return fmt::format("number {}", v.get_int64());
    case boost::json::kind::uint64: return fmt::format("number {}", v.get_uint64());
    // fmt, not serialize(): serialize writes 1.5 as "1.5E0".
    case boost::json::kind::double_: return fmt::format("number {}", v.get_double());
    case boost::json::kind::string: return fmt::format("string {}", boost::json::serialize(v));
    case boost::json::kind::array: return "array";
    case boost::json::kind::object: return "object";
  }
  return "unknown";
}

/// The value as an integer if it is a JSON integer that fits in int64 (1.0 and "1" are not).
inline std::optional<std::int64_t> cluster_json_integer(const boost::json::value& v) {
  if (v.is_int64()) return v.get_int64();
  if (v.is_uint64() && v.get_uint64() <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    return static_cast<std::int64_t>(v.get_uint64());
  }
  return std::nullopt;
}

}  // namespace detail
DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_JSON_HPP
// ---- end <distribute/cluster/detail/json.hpp> ----

DISTRIBUTE_BEGIN_NAMESPACE

/// Explicit values that take precedence over TF_CONFIG's, as TF's constructor arguments do.
/// Set the fields you need (`ds::TFConfigOptions o; o.task_id = 1;`); designated initializers
/// that leave fields out trip GCC 12's -Wmissing-field-initializers.
struct TFConfigOptions {
  std::optional<std::string> task_type;
  std::optional<int> task_id;
  std::optional<std::string> rpc_layer;
  std::optional<std::string> environment;
  /// Reported by num_accelerators(); TF_CONFIG itself says nothing about devices.
  AcceleratorCounts num_accelerators;
};

namespace detail {

inline constexpr std::array<std::string_view, 4> kTFConfigTaskTypes = {"chief", "worker", "ps", "evaluator"};

inline bool is_tf_config_task_type(std::string_view type) {
  return std::find(kTFConfigTaskTypes.begin(), kTFConfigTaskTypes.end(), type) != kTFConfigTaskTypes.end();
}

inline bool tf_config_is_blank(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; });
}

/// A member that TF reads with dict.get(): absent and null both mean "not given".
inline const boost::json::value* tf_config_member(const boost::json::object& obj, std::string_view key) {
  const auto* v = obj.if_contains(key);
  return v == nullptr || v->is_null() ? nullptr : v;
}

inline std::string tf_config_string(const boost::json::object& obj, std::string_view key, std::string_view field) {
  const auto* v = tf_config_member(obj, key);
  if (v == nullptr) return {};
  if (!v->is_string()) {
    throw ClusterConfigError(fmt::format("TF_CONFIG: {} must be a string, got {}", field, cluster_json_describe(*v)));
  }
  return std::string(v->get_string());
}

}  // namespace detail

/// Reads the cluster from TF_CONFIG, TF's schema:
///
///     {"cluster": {"chief": ["host0:2222"], "worker": ["host1:2222", "host2:2222"],
///                  "ps": {"0": "host3:2222"}},
///      "task": {"type": "worker", "index": 1},
///      "rpc_layer": "grpc", "environment": "cloud"}
///
/// Jobs are lists (dense) or objects of "index" → address (sparse). Everything is checked at
/// construction and ClusterConfigError names the field that is wrong: JSON syntax (with
/// Boost.JSON's message), the types of `cluster`, `task`, `task.type`, `task.index`,
/// `rpc_layer`, `environment`; job names (chief, worker, ps, evaluator); at most one chief and
/// one evaluator; every address host:port and used once; the task's job present (an evaluator
/// may be absent, as in TF) and its index in range. Unknown top-level keys are ignored, as TF
/// does; `task.index` may also be a string of digits, which TF's int() accepts.
///
/// TF_CONFIG unset or blank (or `{}`) means local mode: an empty spec, task worker 0.
class TFConfigClusterResolver : public ClusterResolver {
 public:
  /// Reads the TF_CONFIG environment variable.
  TFConfigClusterResolver() : TFConfigClusterResolver(TFConfigOptions{}) {}
  explicit TFConfigClusterResolver(const TFConfigOptions& options) { init(detail::EnvReader{}.get("TF_CONFIG"), options); }
  /// Reads TF_CONFIG from `env` instead of the process environment.
  explicit TFConfigClusterResolver(const EnvVars& env, const TFConfigOptions& options = {}) {
    init(detail::EnvReader{&env}.get("TF_CONFIG"), options);
  }
  /// Parses `tf_config` as the value of TF_CONFIG (blank text: as if it were unset).
  explicit TFConfigClusterResolver(std::string_view tf_config, const TFConfigOptions& options = {}) {
    init(std::string(tf_config), options);
  }

  const ClusterSpec& cluster_spec() const override { return spec_; }
  std::string task_type() const override { return task_type_; }
  int task_id() const override { return task_id_; }
  std::string rpc_layer() const override { return rpc_layer_; }
  AcceleratorCounts num_accelerators() const override { return accelerators_; }
  std::string environment() const override { return environment_; }

  /// False in local mode because TF_CONFIG was unset or blank.
  bool has_tf_config() const { return has_tf_config_; }

 private:
  void init(const std::optional<std::string>& text, const TFConfigOptions& options) {
    accelerators_ = options.num_accelerators;
    for (const auto& [device, count] : accelerators_) {
      if (count < 0) {
        throw ClusterConfigError(fmt::format("TFConfigClusterResolver: num_accelerators['{}'] is {}, negative", device, count));
      }
    }
    has_tf_config_ = text && !detail::tf_config_is_blank(*text);
    std::optional<std::string> type;
    std::optional<std::int64_t> index;
    if (has_tf_config_) parse(*text, type, index);

    // Explicit options win over TF_CONFIG; the labels say where a bad value came from.
    std::string type_label = "TF_CONFIG: task.type";
    std::string id_label = "TF_CONFIG: task.index";
    if (options.task_type) {
      type = options.task_type;
      type_label = "TFConfigClusterResolver: task_type";
    }
    if (options.task_id) {
      index = *options.task_id;
      id_label = "TFConfigClusterResolver: task_id";
    }
    if (options.rpc_layer) rpc_layer_ = *options.rpc_layer;
    if (options.environment) environment_ = *options.environment;

    if (spec_.empty()) {
      // Local mode: one process. A task, if one is named, must be that process.
      task_type_ = type.value_or("worker");
      std::int64_t id = index.value_or(0);
      if (!detail::is_tf_config_task_type(task_type_)) {
        throw ClusterConfigError(fmt::format("{} '{}' is not a task type; expected chief, worker, ps or evaluator",
                                             type_label, task_type_));
      }
      if (task_type_ == "ps") {
        throw ClusterConfigError(fmt::format("{} 'ps' has no job in cluster: cluster is empty (local mode: one worker)", type_label));
      }
      if (id != 0) {
        throw ClusterConfigError(fmt::format("{} {} is out of range: cluster is empty, so the only task is {} 0", id_label, id,
                                             task_type_));
      }
      task_id_ = 0;
      return;
    }
    if (!type && !has_task_) {
      throw ClusterConfigError("TF_CONFIG: task is missing; with a cluster, every process needs task.type and task.index");
    }
    if (!type) {
      throw ClusterConfigError("TF_CONFIG: task.type is missing; with a cluster, every process needs task.type and task.index");
    }
    if (!index) {
      throw ClusterConfigError("TF_CONFIG: task.index is missing; with a cluster, every process needs task.type and task.index");
    }
    if (!detail::is_tf_config_task_type(*type)) {
      throw ClusterConfigError(
          fmt::format("{} '{}' is not a task type; expected chief, worker, ps or evaluator", type_label, *type));
    }
    detail::check_task_in_cluster(spec_, *type, *index, type_label, id_label, "cluster");
    task_type_ = *type;
    task_id_ = static_cast<int>(*index);
  }

  void parse(const std::string& text, std::optional<std::string>& type, std::optional<std::int64_t>& index) {
    auto doc = detail::cluster_parse_json(text, "TF_CONFIG");
    const auto* top = doc.if_object();
    if (top == nullptr) {
      throw ClusterConfigError(fmt::format("TF_CONFIG: the top level must be an object with cluster and task, got {}",
                                           detail::cluster_json_describe(doc)));
    }
    if (const auto* cluster = detail::tf_config_member(*top, "cluster")) {
      auto jobs = detail::cluster_jobs_from_json(*cluster, "TF_CONFIG", "cluster");
      for (const auto& entry : jobs) {
        if (!detail::is_tf_config_task_type(entry.first)) {
          throw ClusterConfigError(fmt::format("TF_CONFIG: cluster has job '{}'; jobs must be chief, worker, ps or evaluator",
                                               entry.first));
        }
      }
      detail::validate_cluster_jobs(jobs, "TF_CONFIG", "cluster");
      for (std::string_view single : {"chief", "evaluator"}) {
        auto it = jobs.find(std::string(single));
        if (it != jobs.end() && it->second.size() > 1) {
          throw ClusterConfigError(fmt::format("TF_CONFIG: cluster.{} has {} tasks; there can be at most one {}", single,
                                               it->second.size(), single));
        }
      }
      spec_ = ClusterSpec::from_sparse(std::move(jobs));
    }
    if (const auto* task_value = detail::tf_config_member(*top, "task")) {
      has_task_ = true;
      const auto* task = task_value->if_object();
      if (task == nullptr) {
        throw ClusterConfigError(fmt::format("TF_CONFIG: task must be an object with type and index, got {}",
                                             detail::cluster_json_describe(*task_value)));
      }
      if (const auto* t = detail::tf_config_member(*task, "type")) {
        if (!t->is_string()) {
          throw ClusterConfigError(
              fmt::format("TF_CONFIG: task.type must be a string, got {}", detail::cluster_json_describe(*t)));
        }
        type = std::string(t->get_string());
      }
      if (const auto* i = detail::tf_config_member(*task, "index")) index = parse_index(*i);
    }
    rpc_layer_ = detail::tf_config_string(*top, "rpc_layer", "rpc_layer");
    environment_ = detail::tf_config_string(*top, "environment", "environment");
  }

  static std::int64_t parse_index(const boost::json::value& v) {
    if (auto i = detail::cluster_json_integer(v)) return *i;
    if (v.is_string()) {
      std::string_view s = v.get_string();
      if (auto i = detail::parse_env_integer(s)) return *i;
    }
    throw ClusterConfigError(fmt::format("TF_CONFIG: task.index must be an integer, got {}", detail::cluster_json_describe(v)));
  }

  ClusterSpec spec_;
  std::string task_type_ = "worker";
  int task_id_ = 0;
  std::string rpc_layer_;
  std::string environment_;
  AcceleratorCounts accelerators_;
  bool has_tf_config_ = false;
  bool has_task_ = false;  // TF_CONFIG has a "task" member
};

DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_TF_CONFIG_HPP
// ---- end <distribute/cluster/tf_config.hpp> ----
// ---- begin <distribute/cluster/slurm.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_SLURM_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_SLURM_HPP
// SlurmClusterResolver: the cluster of a Slurm job step (srun), as TF's SlurmClusterResolver.

#include <algorithm>
#include <climits>
#include <cstdint>
#include <map>
#include <numeric>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

// ---- begin <distribute/cluster/address.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_ADDRESS_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_ADDRESS_HPP
// Task addresses: "host:port", IPv6 hosts in brackets ("[::1]:2222").

#include <algorithm>
#include <cctype>
#include <charconv>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>


DISTRIBUTE_BEGIN_NAMESPACE

/// A task address split into its parts. `host` carries no brackets, so it can go straight to a
/// resolver; to_string() puts them back for IPv6 hosts.
struct HostPort {
  std::string host;
  int port = 0;

  std::string to_string() const {
    return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port) : fmt::format("{}:{}", host, port);
  }
  friend bool operator==(const HostPort&, const HostPort&) = default;
};

namespace detail {

inline bool is_hostname_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_';
}

/// Splits `address`, or says what is wrong with it as the end of a sentence that starts with
/// "address 'X' " (so every caller can put its own field name in front).
inline std::optional<HostPort> split_host_port(std::string_view address, std::string& why) {
  auto fail = [&](std::string reason) -> std::optional<HostPort> {
    why = std::move(reason);
    return std::nullopt;
  };
  if (address.empty()) return fail("is empty");
  if (auto scheme = address.find("://"); scheme != std::string_view::npos) {
    return fail(fmt::format("has a scheme ('{}'); write host:port and set the rpc layer separately",
                            address.substr(0, scheme + 3)));
  }
  std::string_view host;
  std::string_view port;
  if (address.front() == '[') {
    auto close = address.find(']');
    if (close == std::string_view::npos) return fail("has an unclosed '['");
    host = address.substr(1, close - 1);
    auto rest = address.substr(close + 1);
    if (rest.empty() || rest.front() != ':') return fail("has no ':port' after ']'; expected [host]:port");
    port = rest.substr(1);
    if (host.empty()) return fail("has an empty host in brackets; expected [host]:port");
    // An IPv6 literal: hex digits, ':' and '.' (IPv4-mapped tail), then an optional "%zone".
    auto zone = host.find('%');
    auto ip = host.substr(0, zone);
    bool ok = ip.find(':') != std::string_view::npos &&
              std::all_of(ip.begin(), ip.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) || c == ':' || c == '.'; });
    if (zone != std::string_view::npos) {
      auto z = host.substr(zone + 1);
      ok = ok && !z.empty() && std::all_of(z.begin(), z.end(), is_hostname_char);
    }
    if (!ok) return fail(fmt::format("has '{}' in brackets, which is not an IPv6 address", host));
  } else {
    auto colon = address.rfind(':');
    if (colon == std::string_view::npos) return fail("has no port; expected host:port");
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) {
      return fail("has an IPv6 host without brackets; write [host]:port, e.g. [::1]:2222");
    }
    if (host.empty()) return fail("has an empty host; expected host:port");
    if (auto bad = std::find_if_not(host.begin(), host.end(), is_hostname_char); bad != host.end()) {
      return fail(fmt::format("has host '{}' with the invalid character '{}'", host, *bad));
    }
  }
  if (port.empty()) return fail("has an empty port; expected host:port");
  int p = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  bool digits = std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits || (ec != std::errc{} && ec != std::errc::result_out_of_range) || end != port.data() + port.size()) {
    return fail(fmt::format("has port '{}', which is not a number", port));
  }
  if (ec == std::errc::result_out_of_range || p < 1 || p > 65535) {
    return fail(fmt::format("has port {}, out of range [1, 65535]", port));
  }
  return HostPort{std::string(host), p};
}

}  // namespace detail

/// Splits "host:port" or "[v6]:port"; throws ClusterConfigError naming the address and what is
/// wrong with it (no port, port out of [1, 65535], an unbracketed IPv6 host, a URL scheme...).
inline HostPort split_host_port(std::string_view address) {
  std::string why;
  auto hp = detail::split_host_port(address, why);
  if (!hp) throw ClusterConfigError(fmt::format("address '{}' {}", address, why));
  return *hp;
}

/// True when split_host_port(address) would succeed.
inline bool is_valid_address(std::string_view address) {
  std::string why;
  return detail::split_host_port(address, why).has_value();
}

DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_ADDRESS_HPP
// ---- end <distribute/cluster/address.hpp> ----
// ---- begin <distribute/cluster/cluster_resolver.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_CLUSTER_RESOLVER_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_CLUSTER_RESOLVER_HPP
// ClusterResolver: where this process sits in the cluster; SimpleClusterResolver for explicit specs.

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

// ---- begin <distribute/cluster/cluster_spec.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_CLUSTER_SPEC_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_CLUSTER_SPEC_HPP
// ClusterSpec: job name → task addresses, TF's tf.train.ClusterSpec, with JSON in and out.

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/json.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

// ---- begin <distribute/cluster/address.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_ADDRESS_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_ADDRESS_HPP
// Task addresses: "host:port", IPv6 hosts in brackets ("[::1]:2222").

#include <algorithm>
#include <cctype>
#include <charconv>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>


DISTRIBUTE_BEGIN_NAMESPACE

/// A task address split into its parts. `host` carries no brackets, so it can go straight to a
/// resolver; to_string() puts them back for IPv6 hosts.
struct HostPort {
  std::string host;
  int port = 0;

  std::string to_string() const {
    return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port) : fmt::format("{}:{}", host, port);
  }
  friend bool operator==(const HostPort&, const HostPort&) = default;
};

namespace detail {

inline bool is_hostname_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_';
}

/// Splits `address`, or says what is wrong with it as the end of a sentence that starts with
/// "address 'X' " (so every caller can put its own field name in front).
inline std::optional<HostPort> split_host_port(std::string_view address, std::string& why) {
  auto fail = [&](std::string reason) -> std::optional<HostPort> {
    why = std::move(reason);
    return std::nullopt;
  };
  if (address.empty()) return fail("is empty");
  if (auto scheme = address.find("://"); scheme != std::string_view::npos) {
    return fail(fmt::format("has a scheme ('{}'); write host:port and set the rpc layer separately",
                            address.substr(0, scheme + 3)));
  }
  std::string_view host;
  std::string_view port;
  if (address.front() == '[') {
    auto close = address.find(']');
    if (close == std::string_view::npos) return fail("has an unclosed '['");
    host = address.substr(1, close - 1);
    auto rest = address.substr(close + 1);
    if (rest.empty() || rest.front() != ':') return fail("has no ':port' after ']'; expected [host]:port");
    port = rest.substr(1);
    if (host.empty()) return fail("has an empty host in brackets; expected [host]:port");
    // An IPv6 literal: hex digits, ':' and '.' (IPv4-mapped tail), then an optional "%zone".
    auto zone = host.find('%');
    auto ip = host.substr(0, zone);
    bool ok = ip.find(':') != std::string_view::npos &&
              std::all_of(ip.begin(), ip.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) || c == ':' || c == '.'; });
    if (zone != std::string_view::npos) {
      auto z = host.substr(zone + 1);
      ok = ok && !z.empty() && std::all_of(z.begin(), z.end(), is_hostname_char);
    }
    if (!ok) return fail(fmt::format("has '{}' in brackets, which is not an IPv6 address", host));
  } else {
    auto colon = address.rfind(':');
    if (colon == std::string_view::npos) return fail("has no port; expected host:port");
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) {
      return fail("has an IPv6 host without brackets; write [host]:port, e.g. [::1]:2222");
    }
    if (host.empty()) return fail("has an empty host; expected host:port");
    if (auto bad = std::find_if_not(host.begin(), host.end(), is_hostname_char); bad != host.end()) {
      return fail(fmt::format("has host '{}' with the invalid character '{}'", host, *bad));
    }
  }
  if (port.empty()) return fail("has an empty port; expected host:port");
  int p = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  bool digits = std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits || (ec != std::errc{} && ec != std::errc::result_out_of_range) || end != port.data() + port.size()) {
    return fail(fmt::format("has port '{}', which is not a number", port));
  }
  if (ec == std::errc::result_out_of_range || p < 1 || p > 65535) {
    return fail(fmt::format("has port {}, out of range [1, 65535]", port));
  }
  return HostPort{std::string(host), p};
}

}  // namespace detail

/// Splits "host:port" or "[v6]:port"; throws ClusterConfigError naming the address and what is
/// wrong with it (no port, port out of [1, 65535], an unbracketed IPv6 host, a URL scheme...).
inline HostPort split_host_port(std::string_view address) {
  std::string why;
  auto hp = detail::split_host_port(address, why);
  if (!hp) throw ClusterConfigError(fmt::format("address '{}' {}", address, why));
  return *hp;
}

/// True when split_host_port(address) would succeed.
inline bool is_valid_address(std::string_view address) {
  std::string why;
  return detail::split_host_port(address, why).has_value();
}

DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_ADDRESS_HPP
// ---- end <distribute/cluster/address.hpp> ----
// ---- begin <distribute/cluster/detail/json.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_JSON_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_JSON_HPP
// Boost.JSON helpers shared by ClusterSpec and TFConfigClusterResolver: parsing text with the
// error position, describing a value in a message, reading integers strictly.

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include <boost/json.hpp>
#include <fmt/format.h>


DISTRIBUTE_BEGIN_NAMESPACE
namespace detail {

/// Parses `text` as one JSON document. Errors name `who` (the variable or type being read), the
/// character offset and Boost.JSON's own message.
inline boost::json::value cluster_parse_json(std::string_view text, std::string_view who) {
  boost::json::parser parser;
  boost::system::error_code ec;
  std::size_t consumed = parser.write(text.data(), text.size(), ec);
  if (ec) {
    throw ClusterConfigError(fmt::format("{}: invalid JSON at offset {}: {}", who, consumed, ec.message()));
  }
  return parser.release();
}

/// "array", "object", "null", or the value itself for scalars ("number 1.5", "string \"x\"",
/// "bool true"), for "..., got X" in messages.
inline std::string cluster_json_describe(const boost::json::value& v) {
  switch (v.kind()) {
    case boost::json::kind::null: return "null";
    case boost::json::kind::bool_: return fmt::format("bool {}", v.get_bool());
    case boost::json::kind::int64: return fmt::format("number {}", v.get_int64());
    case boost::json::kind::uint64: return fmt::format("number {}", v.get_uint64());
    // fmt, not serialize(): serialize writes 1.5 as "1.5E0".
    case boost::json::kind::double_: return fmt::format("number {}", v.get_double());
    case boost::json::kind::string: return fmt::format("string {}", boost::json::serialize(v));
    case boost::json::kind::array: return "array";
    case boost::json::kind::object: return "object";
  }
  return "unknown";
}

/// The value as an integer if it is a JSON integer that fits in int64 (1.0 and "1" are not).
inline std::optional<std::int64_t> cluster_json_integer(const boost::json::value& v) {
  if (v.is_int64()) return v.get_int64();
  if (v.is_uint64() && v.get_uint64() <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    return static_cast<std::int64_t>(v.get_uint64());
  }
  return std::nullopt;
}

}  // namespace detail
DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_JSON_HPP
// ---- end <distribute/cluster/detail/json.hpp> ----

DISTRIBUTE_BEGIN_NAMESPACE

namespace detail {

/// Task indices are kept below this so that job_tasks() (a list with a slot per index up to
/// the largest) cannot be made to allocate gigabytes by one stray sparse key.
inline constexpr std::int64_t kMaxTaskIndex = 999'999;

/// job → (task index → address): the one representation of dense and sparse jobs alike.
using ClusterJobs = std::map<std::string, std::map<int, std::string>>;

/// "cluster.worker" under TF_CONFIG, "worker" for a bare ClusterSpec.
inline std::string cluster_field(std::string_view root, std::string_view job) {
  return root.empty() ? std::string(job) : fmt::format("{}.{}", root, job);
}

/// Checks job names, task indices and addresses, and that no two tasks share an address.
/// Messages start with `who` ("TF_CONFIG", "ClusterSpec") and name the field under `root`.
inline void validate_cluster_jobs(const ClusterJobs& jobs, std::string_view who, std::string_view root) {
  std::map<std::string, std::string> owner;  // address → the field that first used it
  for (const auto& [job, tasks] : jobs) {
    // TF device names only allow these in a job name ("/job:<name>/...").
    bool name_ok = !job.empty() && std::isalpha(static_cast<unsigned char>(job.front())) &&
                   std::all_of(job.begin(), job.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
    if (!name_ok) {
      throw ClusterConfigError(fmt::format("{}: job name '{}'{} is not a valid name (a letter, then letters, digits or '_')",
                                           who, job, root.empty() ? "" : fmt::format(" in {}", root)));
    }
    for (const auto& [index, address] : tasks) {
      std::string field = fmt::format("{}[{}]", cluster_field(root, job), index);
      if (index < 0 || index > kMaxTaskIndex) {
        throw ClusterConfigError(fmt::format("{}: {} has task index {}, out of range [0, {}]", who, field, index, kMaxTaskIndex));
      }
      std::string why;
      if (!detail::split_host_port(address, why)) {
        throw ClusterConfigError(fmt::format("{}: {} address '{}' {}", who, field, address, why));
      }
      auto [it, fresh] = owner.emplace(address, field);
      if (!fresh) {
        throw ClusterConfigError(fmt::format("{}: {} address '{}' is already used by {}; every task needs its own address",
                                             who, field, address, it->second));
      }
    }
  }
}

/// Reads the JSON shape of a cluster: an object of job → list of addresses (dense) or object of
/// "index" → address (sparse). Only the shape is checked here; validate_cluster_jobs does the rest.
inline ClusterJobs cluster_jobs_from_json(const boost::json::value& v, std::string_view who, std::string_view root) {
  std::string what = root.empty() ? std::string("the cluster JSON") : std::string(root);
  const auto* obj = v.if_object();
  if (obj == nullptr) {
    throw ClusterConfigError(fmt::format("{}: {} must be an object of job name → task addresses, got {}", who, what,
                                         cluster_json_describe(v)));
  }
  ClusterJobs jobs;
  for (const auto& [key, tasks] : *obj) {
    std::string job(key);
    std::string field = cluster_field(root, job);
    auto& out = jobs[job];
    auto address_of = [&](const boost::json::value& a, std::string_view index) -> std::string {
      if (!a.is_string()) {
        throw ClusterConfigError(fmt::format("{}: {}[{}] must be a \"host:port\" string, got {}", who, field, index,
                                             cluster_json_describe(a)));
      }
      return std::string(a.get_string());
    };
    if (const auto* list = tasks.if_array()) {
      if (static_cast<std::int64_t>(list->size()) > kMaxTaskIndex + 1) {
        throw ClusterConfigError(fmt::format("{}: {} lists {} tasks, more than {}", who, field, list->size(), kMaxTaskIndex + 1));
      }
      for (std::size_t i = 0; i < list->size(); ++i) out[static_cast<int>(i)] = address_of((*list)[i], std::to_string(i));
    } else if (const auto* sparse = tasks.if_object()) {
      for (const auto& [index_key, address] : *sparse) {
        std::string_view k = index_key;
        std::int64_t index = -1;
        auto [end, ec] = std::from_chars(k.data(), k.data() + k.size(), index);
        bool digits = !k.empty() && std::all_of(k.begin(), k.end(), [](char c) { return c >= '0' && c <= '9'; });
        if (!digits || ec != std::errc{} || end != k.data() + k.size() || index > kMaxTaskIndex) {
          throw ClusterConfigError(fmt::format("{}: {} has key '{}', which is not a task index (an integer in [0, {}])", who,
                                               field, k, kMaxTaskIndex));
        }
        if (out.count(static_cast<int>(index)) != 0) {
          throw ClusterConfigError(fmt::format("{}: {} gives task index {} twice", who, field, index));
        }
        out[static_cast<int>(index)] = address_of(address, k);
      }
    } else {
      throw ClusterConfigError(fmt::format(
          "{}: {} must be a list of \"host:port\" addresses or an object of task index → address, got {}", who, field,
          cluster_json_describe(tasks)));
    }
  }
  return jobs;
}

}  // namespace detail

/// The addresses of a cluster's tasks, grouped by job ("chief", "worker", "ps", "evaluator"...).
/// A job is dense (tasks 0..n-1, TF's list form) or sparse (some indices only, TF's
/// {"0": "a:1", "3": "b:2"} form, used when a task only needs to know some of its peers).
/// Every address is validated as host:port, and no two tasks may share one. Jobs are kept in
/// name order, as TF sorts them.
class ClusterSpec {
 public:
  using DenseJobs = std::map<std::string, std::vector<std::string>>;
  using SparseJobs = std::map<std::string, std::map<int, std::string>>;

  /// An empty cluster: a single process, no peers.
  ClusterSpec() = default;

  /// From dense jobs: `ds::ClusterSpec({{"worker", {"a:2222", "b:2222"}}, {"ps", {"c:2222"}}})`.
  /// Throws ClusterConfigError naming the bad job name or address. Implicit: a spec is nothing
  /// but its jobs. The initializer-list form keeps `({{"ps", {"a:1"}}})` (one job, one task)
  /// from being ambiguous with the copy constructor.
  ClusterSpec(std::initializer_list<DenseJobs::value_type> jobs) : ClusterSpec(DenseJobs(jobs)) {}
  ClusterSpec(const DenseJobs& jobs) {
    for (const auto& [job, addresses] : jobs) {
      auto& tasks = jobs_[job];
      for (std::size_t i = 0; i < addresses.size(); ++i) tasks[static_cast<int>(i)] = addresses[i];
    }
    detail::validate_cluster_jobs(jobs_, "ClusterSpec", "");
  }

  /// From sparse jobs: `ClusterSpec::from_sparse({{"worker", {{0, "a:1"}, {3, "b:2"}}}})`.
  static ClusterSpec from_sparse(SparseJobs jobs) {
    detail::validate_cluster_jobs(jobs, "ClusterSpec", "");
    ClusterSpec spec;
    spec.jobs_ = std::move(jobs);
    return spec;
  }

  /// From TF's JSON: `{"worker": ["a:1", "b:2"], "ps": {"0": "c:3"}}`. Throws
  /// ClusterConfigError on a syntax error (with Boost.JSON's message and the offset) or a
  /// malformed job, naming the field ("ClusterSpec: worker[1] address 'b' has no port...").
  static ClusterSpec from_json(std::string_view json) { return from_json(detail::cluster_parse_json(json, "ClusterSpec")); }
  static ClusterSpec from_json(const boost::json::value& json) {
    return from_sparse(detail::cluster_jobs_from_json(json, "ClusterSpec", ""));
  }
  // boost::json::value converts from text too; these say which overload text means.
  static ClusterSpec from_json(const char* json) { return from_json(std::string_view(json)); }
  static ClusterSpec from_json(const std::string& json) { return from_json(std::string_view(json)); }
  static ClusterSpec from_json(const boost::json::object& json) { return from_json(boost::json::value(json)); }

  /// The JSON object TF writes: dense jobs as lists, sparse jobs as {"index": address}.
  boost::json::object to_json_value() const {
    boost::json::object out;
    for (const auto& [job, tasks] : jobs_) {
      if (is_dense(tasks)) {
        boost::json::array list;
        for (const auto& entry : tasks) list.emplace_back(entry.second);
        out[job] = std::move(list);
      } else {
        boost::json::object sparse;
        for (const auto& [index, address] : tasks) sparse[std::to_string(index)] = address;
        out[job] = std::move(sparse);
      }
    }
    return out;
  }
  std::string to_json() const { return boost::json::serialize(to_json_value()); }

  bool empty() const { return jobs_.empty(); }
  bool has_job(std::string_view job) const { return find(job) != jobs_.end(); }
  bool has_task(std::string_view job, int index) const {
    auto it = find(job);
    return it != jobs_.end() && it->second.count(index) != 0;
  }

  /// Job names in order.
  std::vector<std::string> jobs() const {
    std::vector<std::string> names;
    for (const auto& entry : jobs_) names.push_back(entry.first);
    return names;
  }

  /// Number of tasks defined in `job` (for a sparse job, not its largest index + 1).
  int num_tasks(std::string_view job) const { return static_cast<int>(tasks_of(job, "num_tasks").size()); }

  /// The task indices of `job`, ascending.
  std::vector<int> task_indices(std::string_view job) const {
    std::vector<int> out;
    for (const auto& entry : tasks_of(job, "task_indices")) out.push_back(entry.first);
    return out;
  }

  /// The address of task `index` of `job`; InvalidArgument if there is no such task.
  const std::string& task_address(std::string_view job, int index) const {
    const auto& tasks = tasks_of(job, "task_address");
    auto it = tasks.find(index);
    if (it == tasks.end()) {
      throw InvalidArgument(fmt::format("ClusterSpec::task_address: job '{}' has no task {} (task indices: {})", job, index,
                                        fmt::join(task_indices(job), ", ")));
    }
    return it->second;
  }

  /// TF's job_tasks: the addresses by index, a slot per index up to the largest; slots of a
  /// sparse job that no task fills are empty strings (TF's None).
  std::vector<std::string> job_tasks(std::string_view job) const {
    const auto& tasks = tasks_of(job, "job_tasks");
    std::vector<std::string> out(tasks.empty() ? 0 : static_cast<std::size_t>(tasks.rbegin()->first) + 1);
    for (const auto& [index, address] : tasks) out[static_cast<std::size_t>(index)] = address;
    return out;
  }

  /// Everything, as job → (index → address).
  const SparseJobs& as_dict() const { return jobs_; }

  friend bool operator==(const ClusterSpec&, const ClusterSpec&) = default;

 private:
  static bool is_dense(const std::map<int, std::string>& tasks) {
    return tasks.empty() || tasks.rbegin()->first + 1 == static_cast<int>(tasks.size());
  }
  SparseJobs::const_iterator find(std::string_view job) const {
    return std::find_if(jobs_.begin(), jobs_.end(), [&](const auto& entry) { return entry.first == job; });
  }
  const std::map<int, std::string>& tasks_of(std::string_view job, std::string_view what) const {
    auto it = find(job);
    if (it == jobs_.end()) {
      throw InvalidArgument(fmt::format("ClusterSpec::{}: no job '{}' in the cluster (jobs: {})", what, job,
                                        jobs_.empty() ? std::string("none") : fmt::format("{}", fmt::join(jobs(), ", "))));
    }
    return it->second;
  }

  SparseJobs jobs_;
};

DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_CLUSTER_SPEC_HPP
// ---- end <distribute/cluster/cluster_spec.hpp> ----
// ---- begin <distribute/cluster/detail/env.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_ENV_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_ENV_HPP
// Reading environment variables, from the process or from an injected map (tests).

#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>


DISTRIBUTE_BEGIN_NAMESPACE
namespace detail {

/// Variable name → value. Transparent comparison so lookups by string_view do not allocate.
using EnvMap = std::map<std::string, std::string, std::less<>>;

/// Looks variables up in `map` when one is given, else in the process environment. Resolvers
/// take a map in a constructor overload so tests never have to mutate the real environment
/// (setenv is not thread-safe and would leak between test cases).
class EnvReader {
 public:
  EnvReader() = default;
  explicit EnvReader(const EnvMap* map) : map_(map) {}

  std::optional<std::string> get(std::string_view name) const {
    if (map_ != nullptr) {
      auto it = map_->find(name);
      if (it == map_->end()) return std::nullopt;
      return it->second;
    }
    // std::getenv needs a NUL-terminated name.
    const char* v = std::getenv(std::string(name).c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  }

  bool has(std::string_view name) const { return get(name).has_value(); }

 private:
  const EnvMap* map_ = nullptr;
};

/// Parses a whole decimal integer (optional leading '-'; no spaces, signs or suffixes).
inline std::optional<std::int64_t> parse_env_integer(std::string_view s) {
  std::int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc{} || p != s.data() + s.size()) return std::nullopt;
  return v;
}

/// The integer value of variable `name`, which must be set and lie in [lo, hi]. `who` prefixes
/// the message ("SlurmClusterResolver") so the user knows which resolver read it.
inline int require_env_int(const EnvReader& env, std::string_view who, std::string_view name, std::int64_t lo,
                           std::int64_t hi, std::string_view hint = {}) {
  auto raw = env.get(name);
  if (!raw) throw ClusterConfigError(fmt::format("{}: environment variable {} is not set{}", who, name, hint));
  auto v = parse_env_integer(*raw);
  if (!v) throw ClusterConfigError(fmt::format("{}: {}='{}' is not an integer", who, name, *raw));
  if (*v < lo || *v > hi) {
    throw ClusterConfigError(fmt::format("{}: {}={} is out of range; it must be in [{}, {}]", who, name, *v, lo, hi));
  }
  return static_cast<int>(*v);
}

}  // namespace detail
DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_ENV_HPP
// ---- end <distribute/cluster/detail/env.hpp> ----

DISTRIBUTE_BEGIN_NAMESPACE

/// Environment variables handed to a resolver instead of the process environment (tests, or a
/// program that computes them). Lookups by string_view do not allocate.
using EnvVars = detail::EnvMap;

/// Device type → count, as TF's num_accelerators() ({"GPU": 2}); empty for host-only tasks.
using AcceleratorCounts = std::map<std::string, int>;

namespace detail {

inline std::string cluster_tasks_phrase(std::int64_t n) { return fmt::format("{} task{}", n, n == 1 ? "" : "s"); }

/// Checks that task (type, id) exists in `spec`. An evaluator may be missing from the cluster
/// (TF runs it beside the training cluster), and then it is the only evaluator, index 0.
/// `type_label`/`id_label` name the fields ("TF_CONFIG: task.type"), `cluster_name` the spec.
inline void check_task_in_cluster(const ClusterSpec& spec, std::string_view type, std::int64_t id,
                                  std::string_view type_label, std::string_view id_label, std::string_view cluster_name) {
  if (type.empty()) throw ClusterConfigError(fmt::format("{} is empty", type_label));
  if (id < 0) throw ClusterConfigError(fmt::format("{} {} is negative", id_label, id));
  if (!spec.has_job(type)) {
    if (type == "evaluator") {
      if (id != 0) {
        throw ClusterConfigError(fmt::format(
            "{} {} is out of range for job 'evaluator', which is not in {} and so has one task (index 0)", id_label, id,
            cluster_name));
      }
      return;
    }
    throw ClusterConfigError(fmt::format("{} '{}' has no job in {} (jobs: {})", type_label, type, cluster_name,
                                         spec.empty() ? std::string("none") : fmt::format("{}", fmt::join(spec.jobs(), ", "))));
  }
  auto indices = spec.task_indices(type);
  bool dense = indices.empty() || indices.back() + 1 == static_cast<int>(indices.size());
  if (dense && id >= static_cast<std::int64_t>(indices.size())) {
    throw ClusterConfigError(fmt::format("{} {} is out of range for job '{}' with {}", id_label, id, type,
                                         cluster_tasks_phrase(static_cast<std::int64_t>(indices.size()))));
  }
  if (!dense && !spec.has_task(type, static_cast<int>(std::min<std::int64_t>(id, kMaxTaskIndex + 1)))) {
    throw ClusterConfigError(fmt::format("{} {} is not a task of job '{}' (task indices: {})", id_label, id, type,
                                         fmt::join(indices, ", ")));
  }
}

inline int cluster_job_size(const ClusterSpec& spec, std::string_view job) {
  return spec.has_job(job) ? spec.num_tasks(job) : 0;
}

}  // namespace detail

/// Where this process sits in a cluster: the cluster's spec, this task's type and index, the
/// RPC layer and local accelerators. Resolvers read it from somewhere (TF_CONFIG, Slurm, a
/// launcher's environment) once, at construction, and validate it there, so the getters are
/// cheap and cannot fail. Users may derive their own.
///
/// The helpers below follow TF's multi_worker_util. A cluster with an empty spec is local mode:
/// one process, which is worker 0 and the chief.
class ClusterResolver {
 public:
  virtual ~ClusterResolver() = default;

  virtual const ClusterSpec& cluster_spec() const = 0;
  /// "chief", "worker", "ps" or "evaluator" (custom resolvers may use other job names).
  virtual std::string task_type() const = 0;
  virtual int task_id() const = 0;
  /// "grpc" and the like; empty when the configuration names none.
  virtual std::string rpc_layer() const = 0;
  virtual AcceleratorCounts num_accelerators() const = 0;
  /// TF's free-form environment string ("cloud", "google"); empty unless configured.
  virtual std::string environment() const { return {}; }

  /// The chief task; without a chief job, worker 0. The evaluator also counts as chief of its
  /// own work, as in TF (it writes its own summaries).
  bool is_chief() const {
    const auto type = task_type();
    if (type == "chief" || type == "evaluator") return true;
    return type == "worker" && task_id() == 0 && detail::cluster_job_size(cluster_spec(), "chief") == 0;
  }

  /// The number of tasks that run replicas in sync: chief + workers (1 in local mode). For the
  /// evaluator, the evaluators (it trains with nobody). ClusterConfigError for other tasks.
  int worker_count() const {
    const auto& spec = cluster_spec();
    const auto type = task_type();
    if (spec.empty()) return 1;
    if (type == "evaluator") return std::max(1, detail::cluster_job_size(spec, "evaluator"));
    if (type != "chief" && type != "worker") {
      throw ClusterConfigError(
          fmt::format("ClusterResolver::worker_count: task type '{}' runs no replicas; only chief and worker tasks do", type));
    }
    return detail::cluster_job_size(spec, "chief") + detail::cluster_job_size(spec, "worker");
  }

  /// This task's position among the tasks that run replicas: the chief is 0 and worker i is
  /// i + 1 when there is a chief, else i (TF's id_in_cluster). ClusterConfigError for the
  /// evaluator and for ps tasks, which have no replicas.
  int id_in_cluster() const {
    const auto& spec = cluster_spec();
    const auto type = task_type();
    if (type == "chief") return 0;
    if (type == "worker") return task_id() + detail::cluster_job_size(spec, "chief");
    if (type == "evaluator") {
      throw ClusterConfigError(
          "ClusterResolver::id_in_cluster: task type 'evaluator' has no id in the cluster; it runs beside training");
    }
    throw ClusterConfigError(fmt::format(
        "ClusterResolver::id_in_cluster: task type '{}' has no id in the cluster; only chief and worker tasks do", type));
  }

  /// The global id of local replica `local_id` when every task runs `local_replicas`:
  /// id_in_cluster() * local_replicas + local_id.
  int global_replica_id(int local_replicas, int local_id) const {
    if (local_replicas < 1 || local_id < 0 || local_id >= local_replicas) {
      throw InvalidArgument(fmt::format(
          "ClusterResolver::global_replica_id: local replica {} is out of range for {} local replicas", local_id,
          local_replicas));
    }
    return id_in_cluster() * local_replicas + local_id;
  }

  /// The address everyone rendezvous with: the chief's, else worker 0's. Empty in local mode
  /// (an empty spec), where there is nobody to connect to.
  std::string master_address() const {
    const auto& spec = cluster_spec();
    if (spec.empty()) return {};
    if (detail::cluster_job_size(spec, "chief") > 0) return spec.task_address("chief", spec.task_indices("chief").front());
    if (spec.has_task("worker", 0)) return spec.task_address("worker", 0);
    throw ClusterConfigError(fmt::format("ClusterResolver::master_address: the cluster (jobs: {}) has neither a chief nor worker 0",
                                         fmt::join(spec.jobs(), ", ")));
  }

 protected:
  ClusterResolver() = default;
  ClusterResolver(const ClusterResolver&) = default;
  ClusterResolver(ClusterResolver&&) = default;
  ClusterResolver& operator=(const ClusterResolver&) = default;
  ClusterResolver& operator=(ClusterResolver&&) = default;
};

/// A resolver for a spec the program already has (TF's SimpleClusterResolver). The task must
/// exist in the spec unless the spec is empty (local mode); ClusterConfigError otherwise.
class SimpleClusterResolver : public ClusterResolver {
 public:
  SimpleClusterResolver(ClusterSpec cluster_spec, std::string task_type, int task_id, std::string rpc_layer = "grpc",
                        AcceleratorCounts num_accelerators = {}, std::string environment = {})
      : spec_(std::move(cluster_spec)),
        task_type_(std::move(task_type)),
        task_id_(task_id),
        rpc_layer_(std::move(rpc_layer)),
        accelerators_(std::move(num_accelerators)),
        environment_(std::move(environment)) {
    if (task_type_.empty()) throw ClusterConfigError("SimpleClusterResolver: task_type is empty");
    if (task_id_ < 0) throw ClusterConfigError(fmt::format("SimpleClusterResolver: task_id {} is negative", task_id_));
    if (!spec_.empty()) {
      detail::check_task_in_cluster(spec_, task_type_, task_id_, "SimpleClusterResolver: task_type",
                                    "SimpleClusterResolver: task_id", "the cluster spec");
    }
    for (const auto& [device, count] : accelerators_) {
      if (count < 0) {
        throw ClusterConfigError(fmt::format("SimpleClusterResolver: num_accelerators['{}'] is {}, negative", device, count));
      }
    }
  }

  const ClusterSpec& cluster_spec() const override { return spec_; }
  std::string task_type() const override { return task_type_; }
  int task_id() const override { return task_id_; }
  std::string rpc_layer() const override { return rpc_layer_; }
  AcceleratorCounts num_accelerators() const override { return accelerators_; }
  std::string environment() const override { return environment_; }

 private:
  ClusterSpec spec_;
  std::string task_type_;
  int task_id_;
  std::string rpc_layer_;
  AcceleratorCounts accelerators_;
  std::string environment_;
};

DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_CLUSTER_RESOLVER_HPP
// ---- end <distribute/cluster/cluster_resolver.hpp> ----
// ---- begin <distribute/cluster/cluster_spec.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_CLUSTER_SPEC_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_CLUSTER_SPEC_HPP
// ClusterSpec: job name → task addresses, TF's tf.train.ClusterSpec, with JSON in and out.

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/json.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

// ---- begin <distribute/cluster/address.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_ADDRESS_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_ADDRESS_HPP
// Task addresses: "host:port", IPv6 hosts in brackets ("[::1]:2222").

#include <algorithm>
#include <cctype>
#include <charconv>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>


DISTRIBUTE_BEGIN_NAMESPACE

/// A task address split into its parts. `host` carries no brackets, so it can go straight to a
/// resolver; to_string() puts them back for IPv6 hosts.
struct HostPort {
  std::string host;
  int port = 0;

  std::string to_string() const {
    return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port) : fmt::format("{}:{}", host, port);
  }
  friend bool operator==(const HostPort&, const HostPort&) = default;
};

namespace detail {

inline bool is_hostname_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_';
}

/// Splits `address`, or says what is wrong with it as the end of a sentence that starts with
/// "address 'X' " (so every caller can put its own field name in front).
inline std::optional<HostPort> split_host_port(std::string_view address, std::string& why) {
  auto fail = [&](std::string reason) -> std::optional<HostPort> {
    why = std::move(reason);
    return std::nullopt;
  };
  if (address.empty()) return fail("is empty");
  if (auto scheme = address.find("://"); scheme != std::string_view::npos) {
    return fail(fmt::format("has a scheme ('{}'); write host:port and set the rpc layer separately",
                            address.substr(0, scheme + 3)));
  }
  std::string_view host;
  std::string_view port;
  if (address.front() == '[') {
    auto close = address.find(']');
    if (close == std::string_view::npos) return fail("has an unclosed '['");
    host = address.substr(1, close - 1);
    auto rest = address.substr(close + 1);
    if (rest.empty() || rest.front() != ':') return fail("has no ':port' after ']'; expected [host]:port");
    port = rest.substr(1);
    if (host.empty()) return fail("has an empty host in brackets; expected [host]:port");
    // An IPv6 literal: hex digits, ':' and '.' (IPv4-mapped tail), then an optional "%zone".
    auto zone = host.find('%');
    auto ip = host.substr(0, zone);
    bool ok = ip.find(':') != std::string_view::npos &&
              std::all_of(ip.begin(), ip.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) || c == ':' || c == '.'; });
    if (zone != std::string_view::npos) {
      auto z = host.substr(zone + 1);
      ok = ok && !z.empty() && std::all_of(z.begin(), z.end(), is_hostname_char);
    }
    if (!ok) return fail(fmt::format("has '{}' in brackets, which is not an IPv6 address", host));
  } else {
    auto colon = address.rfind(':');
    if (colon == std::string_view::npos) return fail("has no port; expected host:port");
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) {
      return fail("has an IPv6 host without brackets; write [host]:port, e.g. [::1]:2222");
    }
    if (host.empty()) return fail("has an empty host; expected host:port");
    if (auto bad = std::find_if_not(host.begin(), host.end(), is_hostname_char); bad != host.end()) {
      return fail(fmt::format("has host '{}' with the invalid character '{}'", host, *bad));
    }
  }
  if (port.empty()) return fail("has an empty port; expected host:port");
  int p = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  bool digits = std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits || (ec != std::errc{} && ec != std::errc::result_out_of_range) || end != port.data() + port.size()) {
    return fail(fmt::format("has port '{}', which is not a number", port));
  }
  if (ec == std::errc::result_out_of_range || p < 1 || p > 65535) {
    return fail(fmt::format("has port {}, out of range [1, 65535]", port));
  }
  return HostPort{std::string(host), p};
}

}  // namespace detail

/// Splits "host:port" or "[v6]:port"; throws ClusterConfigError naming the address and what is
/// wrong with it (no port, port out of [1, 65535], an unbracketed IPv6 host, a URL scheme...).
inline HostPort split_host_port(std::string_view address) {
  std::string why;
  auto hp = detail::split_host_port(address, why);
  if (!hp) throw ClusterConfigError(fmt::format("address '{}' {}", address, why));
  return *hp;
}

/// True when split_host_port(address) would succeed.
inline bool is_valid_address(std::string_view address) {
  std::string why;
  return detail::split_host_port(address, why).has_value();
}

DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_ADDRESS_HPP
// ---- end <distribute/cluster/address.hpp> ----
// ---- begin <distribute/cluster/detail/json.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_JSON_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_JSON_HPP
// Boost.JSON helpers shared by ClusterSpec and TFConfigClusterResolver: parsing text with the
// error position, describing a value in a message, reading integers strictly.

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include <boost/json.hpp>
#include <fmt/format.h>


DISTRIBUTE_BEGIN_NAMESPACE
namespace detail {

/// Parses `text` as one JSON document. Errors name `who` (the variable or type being read), the
/// character offset and Boost.JSON's own message.
inline boost::json::value cluster_parse_json(std::string_view text, std::string_view who) {
  boost::json::parser parser;
  boost::system::error_code ec;
  std::size_t consumed = parser.write(text.data(), text.size(), ec);
  if (ec) {
    throw ClusterConfigError(fmt::format("{}: invalid JSON at offset {}: {}", who, consumed, ec.message()));
  }
  return parser.release();
}

/// "array", "object", "null", or the value itself for scalars ("number 1.5", "string \"x\"",
/// "bool true"), for "..., got X" in messages.
inline std::string cluster_json_describe(const boost::json::value& v) {
  switch (v.kind()) {
    case boost::json::kind::null: return "null";
    case boost::json::kind::bool_: return fmt::format("bool {}", v.get_bool());
    case boost::json::kind::int64: return fmt::format("number {}", v.get_int64());
    case boost::json::kind::uint64: return fmt::format("number {}", v.get_uint64());
    // fmt, not serialize(): serialize writes 1.5 as "1.5E0".
    case boost::json::kind::double_: return fmt::format("number {}", v.get_double());
    case boost::json::kind::string: return fmt::format("string {}", boost::json::serialize(v));
    case boost::json::kind::array: return "array";
    case boost::json::kind::object: return "object";
  }
  return "unknown";
}

/// The value as an integer if it is a JSON integer that fits in int64 (1.0 and "1" are not).
inline std::optional<std::int64_t> cluster_json_integer(const boost::json::value& v) {
  if (v.is_int64()) return v.get_int64();
  if (v.is_uint64() && v.get_uint64() <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    return static_cast<std::int64_t>(v.get_uint64());
  }
  return std::nullopt;
}

}  // namespace detail
DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_JSON_HPP
// ---- end <distribute/cluster/detail/json.hpp> ----

DISTRIBUTE_BEGIN_NAMESPACE

namespace detail {

/// Task indices are kept below this so that job_tasks() (a list with a slot per index up to
/// the largest) cannot be made to allocate gigabytes by one stray sparse key.
inline constexpr std::int64_t kMaxTaskIndex = 999'999;

/// job → (task index → address): the one representation of dense and sparse jobs alike.
using ClusterJobs = std::map<std::string, std::map<int, std::string>>;

/// "cluster.worker" under TF_CONFIG, "worker" for a bare ClusterSpec.
inline std::string cluster_field(std::string_view root, std::string_view job) {
  return root.empty() ? std::string(job) : fmt::format("{}.{}", root, job);
}

/// Checks job names, task indices and addresses, and that no two tasks share an address.
/// Messages start with `who` ("TF_CONFIG", "ClusterSpec") and name the field under `root`.
inline void validate_cluster_jobs(const ClusterJobs& jobs, std::string_view who, std::string_view root) {
  std::map<std::string, std::string> owner;  // address → the field that first used it
  for (const auto& [job, tasks] : jobs) {
    // TF device names only allow these in a job name ("/job:<name>/...").
    bool name_ok = !job.empty() && std::isalpha(static_cast<unsigned char>(job.front())) &&
                   std::all_of(job.begin(), job.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
    if (!name_ok) {
      throw ClusterConfigError(fmt::format("{}: job name '{}'{} is not a valid name (a letter, then letters, digits or '_')",
                                           who, job, root.empty() ? "" : fmt::format(" in {}", root)));
    }
    for (const auto& [index, address] : tasks) {
      std::string field = fmt::format("{}[{}]", cluster_field(root, job), index);
      if (index < 0 || index > kMaxTaskIndex) {
        throw ClusterConfigError(fmt::format("{}: {} has task index {}, out of range [0, {}]", who, field, index, kMaxTaskIndex));
      }
      std::string why;
      if (!detail::split_host_port(address, why)) {
        throw ClusterConfigError(fmt::format("{}: {} address '{}' {}", who, field, address, why));
      }
      auto [it, fresh] = owner.emplace(address, field);
      if (!fresh) {
        throw ClusterConfigError(fmt::format("{}: {} address '{}' is already used by {}; every task needs its own address",
                                             who, field, address, it->second));
      }
    }
  }
}

/// Reads the JSON shape of a cluster: an object of job → list of addresses (dense) or object of
/// "index" → address (sparse). Only the shape is checked here; validate_cluster_jobs does the rest.
inline ClusterJobs cluster_jobs_from_json(const boost::json::value& v, std::string_view who, std::string_view root) {
  std::string what = root.empty() ? std::string("the cluster JSON") : std::string(root);
  const auto* obj = v.if_object();
  if (obj == nullptr) {
    throw ClusterConfigError(fmt::format("{}: {} must be an object of job name → task addresses, got {}", who, what,
                                         cluster_json_describe(v)));
  }
  ClusterJobs jobs;
  for (const auto& [key, tasks] : *obj) {
    std::string job(key);
    std::string field = cluster_field(root, job);
    auto& out = jobs[job];
    auto address_of = [&](const boost::json::value& a, std::string_view index) -> std::string {
      if (!a.is_string()) {
        throw ClusterConfigError(fmt::format("{}: {}[{}] must be a \"host:port\" string, got {}", who, field, index,
                                             cluster_json_describe(a)));
      }
      return std::string(a.get_string());
    };
    if (const auto* list = tasks.if_array()) {
      if (static_cast<std::int64_t>(list->size()) > kMaxTaskIndex + 1) {
        throw ClusterConfigError(fmt::format("{}: {} lists {} tasks, more than {}", who, field, list->size(), kMaxTaskIndex + 1));
      }
      for (std::size_t i = 0; i < list->size(); ++i) out[static_cast<int>(i)] = address_of((*list)[i], std::to_string(i));
    } else if (const auto* sparse = tasks.if_object()) {
      for (const auto& [index_key, address] : *sparse) {
        std::string_view k = index_key;
        std::int64_t index = -1;
        auto [end, ec] = std::from_chars(k.data(), k.data() + k.size(), index);
        bool digits = !k.empty() && std::all_of(k.begin(), k.end(), [](char c) { return c >= '0' && c <= '9'; });
        if (!digits || ec != std::errc{} || end != k.data() + k.size() || index > kMaxTaskIndex) {
          throw ClusterConfigError(fmt::format("{}: {} has key '{}', which is not a task index (an integer in [0, {}])", who,
                                               field, k, kMaxTaskIndex));
        }
        if (out.count(static_cast<int>(index)) != 0) {
          throw ClusterConfigError(fmt::format("{}: {} gives task index {} twice", who, field, index));
        }
        out[static_cast<int>(index)] = address_of(address, k);
      }
    } else {
      throw ClusterConfigError(fmt::format(
          "{}: {} must be a list of \"host:port\" addresses or an object of task index → address, got {}", who, field,
          cluster_json_describe(tasks)));
    }
  }
  return jobs;
}

}  // namespace detail

/// The addresses of a cluster's tasks, grouped by job ("chief", "worker", "ps", "evaluator"...).
/// A job is dense (tasks 0..n-1, TF's list form) or sparse (some indices only, TF's
/// {"0": "a:1", "3": "b:2"} form, used when a task only needs to know some of its peers).
/// Every address is validated as host:port, and no two tasks may share one. Jobs are kept in
/// name order, as TF sorts them.
class ClusterSpec {
 public:
  using DenseJobs = std::map<std::string, std::vector<std::string>>;
  using SparseJobs = std::map<std::string, std::map<int, std::string>>;

  /// An empty cluster: a single process, no peers.
  ClusterSpec() = default;

  /// From dense jobs: `ds::ClusterSpec({{"worker", {"a:2222", "b:2222"}}, {"ps", {"c:2222"}}})`.
  /// Throws ClusterConfigError naming the bad job name or address. Implicit: a spec is nothing
  /// but its jobs. The initializer-list form keeps `({{"ps", {"a:1"}}})` (one job, one task)
  /// from being ambiguous with the copy constructor.
  ClusterSpec(std::initializer_list<DenseJobs::value_type> jobs) : ClusterSpec(DenseJobs(jobs)) {}
  ClusterSpec(const DenseJobs& jobs) {
    for (const auto& [job, addresses] : jobs) {
      auto& tasks = jobs_[job];
      for (std::size_t i = 0; i < addresses.size(); ++i) tasks[static_cast<int>(i)] = addresses[i];
    }
    detail::validate_cluster_jobs(jobs_, "ClusterSpec", "");
  }

  /// From sparse jobs: `ClusterSpec::from_sparse({{"worker", {{0, "a:1"}, {3, "b:2"}}}})`.
  static ClusterSpec from_sparse(SparseJobs jobs) {
    detail::validate_cluster_jobs(jobs, "ClusterSpec", "");
    ClusterSpec spec;
    spec.jobs_ = std::move(jobs);
    return spec;
  }

  /// From TF's JSON: `{"worker": ["a:1", "b:2"], "ps": {"0": "c:3"}}`. Throws
  /// ClusterConfigError on a syntax error (with Boost.JSON's message and the offset) or a
  /// malformed job, naming the field ("ClusterSpec: worker[1] address 'b' has no port...").
  static ClusterSpec from_json(std::string_view json) { return from_json(detail::cluster_parse_json(json, "ClusterSpec")); }
  static ClusterSpec from_json(const boost::json::value& json) {
    return from_sparse(detail::cluster_jobs_from_json(json, "ClusterSpec", ""));
  }
  // boost::json::value converts from text too; these say which overload text means.
  static ClusterSpec from_json(const char* json) { return from_json(std::string_view(json)); }
  static ClusterSpec from_json(const std::string& json) { return from_json(std::string_view(json)); }
  static ClusterSpec from_json(const boost::json::object& json) { return from_json(boost::json::value(json)); }

  /// The JSON object TF writes: dense jobs as lists, sparse jobs as {"index": address}.
  boost::json::object to_json_value() const {
    boost::json::object out;
    for (const auto& [job, tasks] : jobs_) {
      if (is_dense(tasks)) {
        boost::json::array list;
        for (const auto& entry : tasks) list.emplace_back(entry.second);
        out[job] = std::move(list);
      } else {
        boost::json::object sparse;
        for (const auto& [index, address] : tasks) sparse[std::to_string(index)] = address;
        out[job] = std::move(sparse);
      }
    }
    return out;
  }
  std::string to_json() const { return boost::json::serialize(to_json_value()); }

  bool empty() const { return jobs_.empty(); }
  bool has_job(std::string_view job) const { return find(job) != jobs_.end(); }
  bool has_task(std::string_view job, int index) const {
    auto it = find(job);
    return it != jobs_.end() && it->second.count(index) != 0;
  }

  /// Job names in order.
  std::vector<std::string> jobs() const {
    std::vector<std::string> names;
    for (const auto& entry : jobs_) names.push_back(entry.first);
    return names;
  }

  /// Number of tasks defined in `job` (for a sparse job, not its largest index + 1).
  int num_tasks(std::string_view job) const { return static_cast<int>(tasks_of(job, "num_tasks").size()); }

  /// The task indices of `job`, ascending.
  std::vector<int> task_indices(std::string_view job) const {
    std::vector<int> out;
    for (const auto& entry : tasks_of(job, "task_indices")) out.push_back(entry.first);
    return out;
  }

  /// The address of task `index` of `job`; InvalidArgument if there is no such task.
  const std::string& task_address(std::string_view job, int index) const {
    const auto& tasks = tasks_of(job, "task_address");
    auto it = tasks.find(index);
    if (it == tasks.end()) {
      throw InvalidArgument(fmt::format("ClusterSpec::task_address: job '{}' has no task {} (task indices: {})", job, index,
                                        fmt::join(task_indices(job), ", ")));
    }
    return it->second;
  }

  /// TF's job_tasks: the addresses by index, a slot per index up to the largest; slots of a
  /// sparse job that no task fills are empty strings (TF's None).
  std::vector<std::string> job_tasks(std::string_view job) const {
    const auto& tasks = tasks_of(job, "job_tasks");
    std::vector<std::string> out(tasks.empty() ? 0 : static_cast<std::size_t>(tasks.rbegin()->first) + 1);
    for (const auto& [index, address] : tasks) out[static_cast<std::size_t>(index)] = address;
    return out;
  }

  /// Everything, as job → (index → address).
  const SparseJobs& as_dict() const { return jobs_; }

  friend bool operator==(const ClusterSpec&, const ClusterSpec&) = default;

 private:
  static bool is_dense(const std::map<int, std::string>& tasks) {
    return tasks.empty() || tasks.rbegin()->first + 1 == static_cast<int>(tasks.size());
  }
  SparseJobs::const_iterator find(std::string_view job) const {
    return std::find_if(jobs_.begin(), jobs_.end(), [&](const auto& entry) { return entry.first == job; });
  }
  const std::map<int, std::string>& tasks_of(std::string_view job, std::string_view what) const {
    auto it = find(job);
    if (it == jobs_.end()) {
      throw InvalidArgument(fmt::format("ClusterSpec::{}: no job '{}' in the cluster (jobs: {})", what, job,
                                        jobs_.empty() ? std::string("none") : fmt::format("{}", fmt::join(jobs(), ", "))));
    }
    return it->second;
  }

  SparseJobs jobs_;
};

DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_CLUSTER_SPEC_HPP
// ---- end <distribute/cluster/cluster_spec.hpp> ----
// ---- begin <distribute/cluster/detail/env.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_ENV_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_ENV_HPP
// Reading environment variables, from the process or from an injected map (tests).

#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>


DISTRIBUTE_BEGIN_NAMESPACE
namespace detail {

/// Variable name → value. Transparent comparison so lookups by string_view do not allocate.
using EnvMap = std::map<std::string, std::string, std::less<>>;

/// Looks variables up in `map` when one is given, else in the process environment. Resolvers
/// take a map in a constructor overload so tests never have to mutate the real environment
/// (setenv is not thread-safe and would leak between test cases).
class EnvReader {
 public:
  EnvReader() = default;
  explicit EnvReader(const EnvMap* map) : map_(map) {}

  std::optional<std::string> get(std::string_view name) const {
    if (map_ != nullptr) {
      auto it = map_->find(name);
      if (it == map_->end()) return std::nullopt;
      return it->second;
    }
    // std::getenv needs a NUL-terminated name.
    const char* v = std::getenv(std::string(name).c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  }

  bool has(std::string_view name) const { return get(name).has_value(); }

 private:
  const EnvMap* map_ = nullptr;
};

/// Parses a whole decimal integer (optional leading '-'; no spaces, signs or suffixes).
inline std::optional<std::int64_t> parse_env_integer(std::string_view s) {
  std::int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc{} || p != s.data() + s.size()) return std::nullopt;
  return v;
}

/// The integer value of variable `name`, which must be set and lie in [lo, hi]. `who` prefixes
/// the message ("SlurmClusterResolver") so the user knows which resolver read it.
inline int require_env_int(const EnvReader& env, std::string_view who, std::string_view name, std::int64_t lo,
                           std::int64_t hi, std::string_view hint = {}) {
  auto raw = env.get(name);
  if (!raw) throw ClusterConfigError(fmt::format("{}: environment variable {} is not set{}", who, name, hint));
  auto v = parse_env_integer(*raw);
  if (!v) throw ClusterConfigError(fmt::format("{}: {}='{}' is not an integer", who, name, *raw));
  if (*v < lo || *v > hi) {
    throw ClusterConfigError(fmt::format("{}: {}={} is out of range; it must be in [{}, {}]", who, name, *v, lo, hi));
  }
  return static_cast<int>(*v);
}

}  // namespace detail
DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_ENV_HPP
// ---- end <distribute/cluster/detail/env.hpp> ----

DISTRIBUTE_BEGIN_NAMESPACE

/// What SlurmClusterResolver builds from the step. Defaults match TF's.
struct SlurmOptions {
  /// Job name → number of tasks, filled in name order by SLURM_PROCID (TF sorts the jobs):
  /// {{"ps", 1}, {"worker", 3}} makes rank 0 the ps and ranks 1..3 workers 0..2. The counts
  /// must add up to the step's tasks. Empty: every task is a worker.
  std::map<std::string, int> jobs;
  /// Task k on a node listens on port_base + k.
  int port_base = 8888;
  /// GPUs on each node. Unset: counted from SLURM_STEP_GPUS, else SLURM_JOB_GPUS, else 0.
  std::optional<int> gpus_per_node;
  /// GPUs for each task. Unset: gpus_per_node / (most tasks on one node).
  std::optional<int> gpus_per_task;
  std::string rpc_layer = "grpc";
};

namespace detail {

/// Slurm's numbers are at most this: large enough for any real cluster, small enough that a
/// typo such as "node[1-99999999]" is an error and not an out-of-memory.
inline constexpr std::int64_t kSlurmMaxCount = 1'000'000;

/// "0-3" → {0, 3, 1} (low, high, digits of low): one item of a hostlist range.
struct SlurmRangeItem {
  std::int64_t low = 0;
  std::int64_t high = 0;
  std::size_t width = 0;
};

inline std::optional<std::int64_t> slurm_number(std::string_view s) {
  if (s.empty() || s.size() > 9 || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  return parse_env_integer(s);
}

/// Expands Slurm's compressed host list: "node[01-03,07]", "a,b[1-2]", "rack[1-2]-n[1-2]".
/// Zero padding follows the low end of each range ("[08-10]" → 08, 09, 10); several ranges in
/// one name expand left to right, the leftmost varying slowest. `label` starts every message.
inline std::vector<std::string> slurm_expand_hostlist(std::string_view text, std::string_view label) {
  auto fail = [&](const std::string& why) -> std::vector<std::string> {
    throw ClusterConfigError(fmt::format("{} '{}' is not a valid hostlist: {}", label, text, why));
  };
  if (text.empty()) return fail("it is empty");
  std::vector<std::string> hosts;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    // One comma-separated element (commas inside brackets separate range items, not hosts).
    std::size_t end = pos;
    bool in_brackets = false;
    for (; end < text.size(); ++end) {
      char c = text[end];
      if (c == '[') {
        if (in_brackets) return fail(fmt::format("'[' at offset {} is nested in another '['", end));
        in_brackets = true;
      } else if (c == ']') {
        if (!in_brackets) return fail(fmt::format("']' at offset {} has no matching '['", end));
        in_brackets = false;
      } else if (c == ',' && !in_brackets) {
        break;
      }
    }
    if (in_brackets) return fail("a '[' is never closed");
    std::string_view element = text.substr(pos, end - pos);
    if (element.empty()) return fail(fmt::format("empty host name at offset {}", pos));

    std::vector<std::string> names{""};
    std::size_t i = 0;
    while (i < element.size()) {
      if (element[i] != '[') {
        std::size_t j = element.find('[', i);
        std::string_view literal = element.substr(i, j == std::string_view::npos ? std::string_view::npos : j - i);
        if (auto bad = std::find_if_not(literal.begin(), literal.end(), is_hostname_char); bad != literal.end()) {
          return fail(fmt::format("host name '{}' has the invalid character '{}'", element, *bad));
        }
        for (auto& n : names) n += literal;
        i += literal.size();
        continue;
      }
      std::size_t close = element.find(']', i);
      std::string_view range = element.substr(i + 1, close - i - 1);
      if (range.empty()) return fail(fmt::format("'{}' has an empty range '[]'", element));
      std::vector<SlurmRangeItem> items;
      std::int64_t count = 0;
      std::size_t start = 0;
      while (start <= range.size()) {
        std::size_t comma = std::min(range.find(',', start), range.size());
        std::string_view item = range.substr(start, comma - start);
        std::size_t dash = item.find('-');
        std::string_view lo = item.substr(0, dash);
        std::string_view hi = dash == std::string_view::npos ? lo : item.substr(dash + 1);
        auto l = slurm_number(lo);
        auto h = slurm_number(hi);
        if (!l || !h) return fail(fmt::format("range item '{}' in '{}' is not N or N-M with decimal numbers", item, element));
        if (*h < *l) return fail(fmt::format("range item '{}' in '{}' goes down", item, element));
        items.push_back({*l, *h, lo.size()});
        count += *h - *l + 1;
        if (count > kSlurmMaxCount) return fail(fmt::format("'{}' names more than {} hosts", element, kSlurmMaxCount));
        start = comma + 1;
      }
      if (static_cast<std::int64_t>(names.size()) * count > kSlurmMaxCount) {
        return fail(fmt::format("'{}' names more than {} hosts", element, kSlurmMaxCount));
      }
      std::vector<std::string> next;
      next.reserve(names.size() * static_cast<std::size_t>(count));
      for (const auto& n : names) {
        for (const auto& it : items) {
          for (std::int64_t v = it.low; v <= it.high; ++v) next.push_back(fmt::format("{}{:0{}}", n, v, it.width));
        }
      }
      names = std::move(next);
      i = close + 1;
    }
    hosts.insert(hosts.end(), names.begin(), names.end());
    if (static_cast<std::int64_t>(hosts.size()) > kSlurmMaxCount) return fail(fmt::format("it names more than {} hosts", kSlurmMaxCount));
    if (end == text.size()) break;
    pos = end + 1;
    if (pos == text.size()) return fail("it ends with ','");
  }
  return hosts;
}

/// Expands Slurm's tasks-per-node list: "2(x3),1" → 2, 2, 2, 1.
inline std::vector<int> slurm_expand_tasks_per_node(std::string_view text, std::string_view label) {
  auto fail = [&](const std::string& why) -> std::vector<int> {
    throw ClusterConfigError(fmt::format("{} '{}' is not a valid tasks-per-node list: {}", label, text, why));
  };
  if (text.empty()) return fail("it is empty");
  std::vector<int> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t comma = std::min(text.find(',', start), text.size());
    std::string_view part = text.substr(start, comma - start);
    std::string_view count_text = part;
    std::int64_t repeat = 1;
    if (auto paren = part.find('('); paren != std::string_view::npos) {
      count_text = part.substr(0, paren);
      std::string_view rep = part.substr(paren);
      auto r = rep.size() > 3 && rep.substr(0, 2) == "(x" && rep.back() == ')' ? slurm_number(rep.substr(2, rep.size() - 3))
                                                                                 : std::nullopt;
      if (!r || *r < 1) return fail(fmt::format("'{}' is not N or N(xR) with R >= 1", part));
      repeat = *r;
    }
    auto n = slurm_number(count_text);
    if (!n) return fail(fmt::format("'{}' is not N or N(xR) with decimal numbers", part));
    if (static_cast<std::int64_t>(out.size()) + repeat > kSlurmMaxCount || *n > kSlurmMaxCount) {
      return fail(fmt::format("it names more than {} nodes or tasks", kSlurmMaxCount));
    }
    out.insert(out.end(), static_cast<std::size_t>(repeat), static_cast<int>(*n));
    start = comma + 1;
  }
  return out;
}

/// The number of GPU ids in a list such as "0,1,3" or "0-3" (SLURM_STEP_GPUS, SLURM_JOB_GPUS).
inline int slurm_count_gpus(std::string_view text, std::string_view label) {
  if (text.empty()) return 0;
  std::int64_t count = 0;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t comma = std::min(text.find(',', start), text.size());
    std::string_view item = text.substr(start, comma - start);
    std::size_t dash = item.find('-');
    auto lo = slurm_number(item.substr(0, dash));
    auto hi = dash == std::string_view::npos ? lo : slurm_number(item.substr(dash + 1));
    if (!lo || !hi || *hi < *lo) {
      throw ClusterConfigError(fmt::format("{}='{}' is not a list of GPU ids: item '{}'", label, text, item));
    }
    count += *hi - *lo + 1;
    if (count > kSlurmMaxCount) throw ClusterConfigError(fmt::format("{}='{}' names too many GPUs", label, text));
    start = comma + 1;
  }
  return static_cast<int>(count);
}

}  // namespace detail

/// Builds the cluster of a Slurm job step from the variables srun sets in every task:
/// SLURM_PROCID (this task's rank), SLURM_STEP_NUM_TASKS, SLURM_STEP_NODELIST (e.g.
/// "node[01-03,07]") and SLURM_STEP_TASKS_PER_NODE (e.g. "2(x3),1"). As in TF, ranks are laid
/// out node by node in node-list order (Slurm's default block distribution): the k-th task on
/// host h gets address h:(port_base + k), and the ranks fill the jobs in name order.
///
/// Missing or malformed variables, counts that disagree, or ports past 65535 throw
/// ClusterConfigError naming the variable. Unlike TF, this does not set CUDA_VISIBLE_DEVICES
/// (changing the environment of a running process is unsafe); gpu_allocation() says which GPU
/// ids this task should use.
class SlurmClusterResolver : public ClusterResolver {
 public:
  /// Every task a worker, ports from 8888, the process environment.
  SlurmClusterResolver() : SlurmClusterResolver(SlurmOptions{}) {}
  /// TF's positional form: `SlurmClusterResolver({{"ps", 1}, {"worker", 3}}, 9000)`.
  explicit SlurmClusterResolver(std::map<std::string, int> jobs, int port_base = 8888) {
    SlurmOptions options;
    options.jobs = std::move(jobs);
    options.port_base = port_base;
    init(std::move(options), detail::EnvReader{});
  }
  explicit SlurmClusterResolver(SlurmOptions options) { init(std::move(options), detail::EnvReader{}); }
  /// Reads the variables from `env` instead of the process environment.
  SlurmClusterResolver(SlurmOptions options, const EnvVars& env) { init(std::move(options), detail::EnvReader{&env}); }

  /// "node[01-03,07]" → node01, node02, node03, node07; "a,b[1-2]" → a, b1, b2. Zero padding
  /// follows the low end of a range. ClusterConfigError on malformed lists.
  static std::vector<std::string> expand_hostlist(std::string_view hostlist) {
    return detail::slurm_expand_hostlist(hostlist, "hostlist");
  }
  /// "2(x3),1" → 2, 2, 2, 1. ClusterConfigError on malformed lists.
  static std::vector<int> expand_tasks_per_node(std::string_view tasks_per_node) {
    return detail::slurm_expand_tasks_per_node(tasks_per_node, "tasks-per-node list");
  }

  const ClusterSpec& cluster_spec() const override { return spec_; }
  std::string task_type() const override { return task_type_; }
  int task_id() const override { return task_id_; }
  std::string rpc_layer() const override { return rpc_layer_; }
  /// {"GPU": gpus per task}, or {} without GPUs.
  AcceleratorCounts num_accelerators() const override {
    return gpus_per_task_ > 0 ? AcceleratorCounts{{"GPU", gpus_per_task_}} : AcceleratorCounts{};
  }

  /// SLURM_PROCID.
  int rank() const { return rank_; }
  /// The step's nodes, expanded, in order, and how many tasks each runs.
  const std::vector<std::string>& hosts() const { return hosts_; }
  const std::vector<int>& tasks_per_node() const { return tasks_per_node_; }
  /// This task's GPU ids on its node ("2,3"), what TF would put in CUDA_VISIBLE_DEVICES; empty
  /// without GPUs.
  const std::string& gpu_allocation() const { return gpu_allocation_; }

 private:
  void init(SlurmOptions options, const detail::EnvReader& env) {
    constexpr std::string_view who = "SlurmClusterResolver";
    constexpr std::string_view hint = " (is this process a task of a Slurm step, started by srun?)";
    rpc_layer_ = std::move(options.rpc_layer);
    rank_ = detail::require_env_int(env, who, "SLURM_PROCID", 0, INT_MAX, hint);
    const int num_tasks = detail::require_env_int(env, who, "SLURM_STEP_NUM_TASKS", 1, detail::kSlurmMaxCount, hint);
    auto require = [&](std::string_view name) {
      auto v = env.get(name);
      if (!v) throw ClusterConfigError(fmt::format("{}: environment variable {} is not set{}", who, name, hint));
      return *v;
    };
    const std::string nodelist = require("SLURM_STEP_NODELIST");
    const std::string tasks_text = require("SLURM_STEP_TASKS_PER_NODE");
    hosts_ = detail::slurm_expand_hostlist(nodelist, "SlurmClusterResolver: SLURM_STEP_NODELIST");
    tasks_per_node_ = detail::slurm_expand_tasks_per_node(tasks_text, "SlurmClusterResolver: SLURM_STEP_TASKS_PER_NODE");

    if (hosts_.size() != tasks_per_node_.size()) {
      throw ClusterConfigError(fmt::format(
          "{}: SLURM_STEP_TASKS_PER_NODE='{}' describes {} nodes but SLURM_STEP_NODELIST='{}' has {}", who, tasks_text,
          tasks_per_node_.size(), nodelist, hosts_.size()));
    }
    const std::int64_t listed = std::accumulate(tasks_per_node_.begin(), tasks_per_node_.end(), std::int64_t{0});
    if (listed != num_tasks) {
      throw ClusterConfigError(fmt::format("{}: SLURM_STEP_TASKS_PER_NODE='{}' adds up to {} tasks but SLURM_STEP_NUM_TASKS={}",
                                           who, tasks_text, listed, num_tasks));
    }
    if (rank_ >= num_tasks) {
      throw ClusterConfigError(fmt::format("{}: SLURM_PROCID={} is out of range for SLURM_STEP_NUM_TASKS={}", who, rank_, num_tasks));
    }

    auto jobs = options.jobs.empty() ? std::map<std::string, int>{{"worker", num_tasks}} : std::move(options.jobs);
    std::int64_t asked = 0;
    for (const auto& [job, count] : jobs) {
      if (count < 0) throw ClusterConfigError(fmt::format("{}: jobs['{}'] is {}, negative", who, job, count));
      asked += count;
    }
    if (asked != num_tasks) {
      std::vector<std::string> parts;
      for (const auto& [job, count] : jobs) parts.push_back(fmt::format("{}: {}", job, count));
      throw ClusterConfigError(fmt::format("{}: jobs ask for {} tasks ({}) but the Slurm step has SLURM_STEP_NUM_TASKS={}", who,
                                           asked, fmt::join(parts, ", "), num_tasks));
    }

    const int max_per_node = *std::max_element(tasks_per_node_.begin(), tasks_per_node_.end());
    if (options.port_base < 1 || options.port_base > 65535 ||
        static_cast<std::int64_t>(options.port_base) + std::max(max_per_node, 1) - 1 > 65535) {
      throw ClusterConfigError(fmt::format("{}: port_base {} with up to {} tasks on a node gives ports outside [1, 65535]", who,
                                           options.port_base, max_per_node));
    }

    // GPUs: each task on a node gets its own consecutive block of gpus_per_task ids.
    int gpus_per_node = 0;
    if (options.gpus_per_node) {
      gpus_per_node = *options.gpus_per_node;
    } else if (auto step = env.get("SLURM_STEP_GPUS")) {
      gpus_per_node = detail::slurm_count_gpus(*step, "SlurmClusterResolver: SLURM_STEP_GPUS");
    } else if (auto job = env.get("SLURM_JOB_GPUS")) {
      gpus_per_node = detail::slurm_count_gpus(*job, "SlurmClusterResolver: SLURM_JOB_GPUS");
    }
    if (gpus_per_node < 0) throw ClusterConfigError(fmt::format("{}: gpus_per_node {} is negative", who, gpus_per_node));
    gpus_per_task_ = options.gpus_per_task.value_or(max_per_node > 0 ? gpus_per_node / max_per_node : 0);
    if (gpus_per_task_ < 0) throw ClusterConfigError(fmt::format("{}: gpus_per_task {} is negative", who, gpus_per_task_));
    if (static_cast<std::int64_t>(gpus_per_task_) * max_per_node > gpus_per_node) {
      throw ClusterConfigError(fmt::format("{}: {} GPUs per task for up to {} tasks on a node need {} GPUs but nodes have {}", who,
                                           gpus_per_task_, max_per_node,
                                           static_cast<std::int64_t>(gpus_per_task_) * max_per_node, gpus_per_node));
    }

    // Addresses in rank order: node by node, port_base + k for the k-th task on a node.
    std::vector<std::string> addresses;
    int local_offset = 0;
    for (std::size_t h = 0; h < hosts_.size(); ++h) {
      for (int k = 0; k < tasks_per_node_[h]; ++k) {
        if (static_cast<int>(addresses.size()) == rank_) local_offset = k;
        addresses.push_back(HostPort{hosts_[h], options.port_base + k}.to_string());
      }
    }
    std::vector<std::string> ids;
    for (int g = 0; g < gpus_per_task_; ++g) ids.push_back(std::to_string(local_offset * gpus_per_task_ + g));
    gpu_allocation_ = fmt::format("{}", fmt::join(ids, ","));

    detail::ClusterJobs cluster;
    int first = 0;
    for (const auto& [job, count] : jobs) {
      auto& tasks = cluster[job];
      for (int i = 0; i < count; ++i) tasks[i] = addresses[static_cast<std::size_t>(first + i)];
      if (rank_ >= first && rank_ < first + count) {
        task_type_ = job;
        task_id_ = rank_ - first;
      }
      first += count;
    }
    // Bad job names in `jobs`, or a node listed twice, are reported as ours, not ClusterSpec's.
    detail::validate_cluster_jobs(cluster, who, "");
    spec_ = ClusterSpec::from_sparse(std::move(cluster));
  }

  ClusterSpec spec_;
  std::string task_type_;
  int task_id_ = 0;
  std::string rpc_layer_;
  int rank_ = 0;
  std::vector<std::string> hosts_;
  std::vector<int> tasks_per_node_;
  int gpus_per_task_ = 0;
  std::string gpu_allocation_;
};

DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_SLURM_HPP
// ---- end <distribute/cluster/slurm.hpp> ----
// ---- begin <distribute/cluster/launcher.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_LAUNCHER_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_LAUNCHER_HPP
// LauncherClusterResolver: the cluster from the variables mpirun / torchrun-style launchers set.

#include <array>
#include <climits>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

// ---- begin <distribute/cluster/address.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_ADDRESS_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_ADDRESS_HPP
// Task addresses: "host:port", IPv6 hosts in brackets ("[::1]:2222").

#include <algorithm>
#include <cctype>
#include <charconv>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>


DISTRIBUTE_BEGIN_NAMESPACE

/// A task address split into its parts. `host` carries no brackets, so it can go straight to a
/// resolver; to_string() puts them back for IPv6 hosts.
struct HostPort {
  std::string host;
  int port = 0;

  std::string to_string() const {
    return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port) : fmt::format("{}:{}", host, port);
  }
  friend bool operator==(const HostPort&, const HostPort&) = default;
};

namespace detail {

inline bool is_hostname_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_';
}

/// Splits `address`, or says what is wrong with it as the end of a sentence that starts with
/// "address 'X' " (so every caller can put its own field name in front).
inline std::optional<HostPort> split_host_port(std::string_view address, std::string& why) {
  auto fail = [&](std::string reason) -> std::optional<HostPort> {
    why = std::move(reason);
    return std::nullopt;
  };
  if (address.empty()) return fail("is empty");
  if (auto scheme = address.find("://"); scheme != std::string_view::npos) {
    return fail(fmt::format("has a scheme ('{}'); write host:port and set the rpc layer separately",
                            address.substr(0, scheme + 3)));
  }
  std::string_view host;
  std::string_view port;
  if (address.front() == '[') {
    auto close = address.find(']');
    if (close == std::string_view::npos) return fail("has an unclosed '['");
    host = address.substr(1, close - 1);
    auto rest = address.substr(close + 1);
    if (rest.empty() || rest.front() != ':') return fail("has no ':port' after ']'; expected [host]:port");
    port = rest.substr(1);
    if (host.empty()) return fail("has an empty host in brackets; expected [host]:port");
    // An IPv6 literal: hex digits, ':' and '.' (IPv4-mapped tail), then an optional "%zone".
    auto zone = host.find('%');
    auto ip = host.substr(0, zone);
    bool ok = ip.find(':') != std::string_view::npos &&
              std::all_of(ip.begin(), ip.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) || c == ':' || c == '.'; });
    if (zone != std::string_view::npos) {
      auto z = host.substr(zone + 1);
      ok = ok && !z.empty() && std::all_of(z.begin(), z.end(), is_hostname_char);
    }
    if (!ok) return fail(fmt::format("has '{}' in brackets, which is not an IPv6 address", host));
  } else {
    auto colon = address.rfind(':');
    if (colon == std::string_view::npos) return fail("has no port; expected host:port");
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) {
      return fail("has an IPv6 host without brackets; write [host]:port, e.g. [::1]:2222");
    }
    if (host.empty()) return fail("has an empty host; expected host:port");
    if (auto bad = std::find_if_not(host.begin(), host.end(), is_hostname_char); bad != host.end()) {
      return fail(fmt::format("has host '{}' with the invalid character '{}'", host, *bad));
    }
  }
  if (port.empty()) return fail("has an empty port; expected host:port");
  int p = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  bool digits = std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits || (ec != std::errc{} && ec != std::errc::result_out_of_range) || end != port.data() + port.size()) {
    return fail(fmt::format("has port '{}', which is not a number", port));
  }
  if (ec == std::errc::result_out_of_range || p < 1 || p > 65535) {
    return fail(fmt::format("has port {}, out of range [1, 65535]", port));
  }
  return HostPort{std::string(host), p};
}

}  // namespace detail

/// Splits "host:port" or "[v6]:port"; throws ClusterConfigError naming the address and what is
/// wrong with it (no port, port out of [1, 65535], an unbracketed IPv6 host, a URL scheme...).
inline HostPort split_host_port(std::string_view address) {
  std::string why;
  auto hp = detail::split_host_port(address, why);
  if (!hp) throw ClusterConfigError(fmt::format("address '{}' {}", address, why));
  return *hp;
}

/// True when split_host_port(address) would succeed.
inline bool is_valid_address(std::string_view address) {
  std::string why;
  return detail::split_host_port(address, why).has_value();
}

DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_ADDRESS_HPP
// ---- end <distribute/cluster/address.hpp> ----
// ---- begin <distribute/cluster/cluster_resolver.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_CLUSTER_RESOLVER_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_CLUSTER_RESOLVER_HPP
// ClusterResolver: where this process sits in the cluster; SimpleClusterResolver for explicit specs.

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

// ---- begin <distribute/cluster/cluster_spec.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_CLUSTER_SPEC_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_CLUSTER_SPEC_HPP
// ClusterSpec: job name → task addresses, TF's tf.train.ClusterSpec, with JSON in and out.

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/json.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

// ---- begin <distribute/cluster/address.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_ADDRESS_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_ADDRESS_HPP
// Task addresses: "host:port", IPv6 hosts in brackets ("[::1]:2222").

#include <algorithm>
#include <cctype>
#include <charconv>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>


DISTRIBUTE_BEGIN_NAMESPACE

/// A task address split into its parts. `host` carries no brackets, so it can go straight to a
/// resolver; to_string() puts them back for IPv6 hosts.
struct HostPort {
  std::string host;
  int port = 0;

  std::string to_string() const {
    return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port) : fmt::format("{}:{}", host, port);
  }
  friend bool operator==(const HostPort&, const HostPort&) = default;
};

namespace detail {

inline bool is_hostname_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_';
}

/// Splits `address`, or says what is wrong with it as the end of a sentence that starts with
/// "address 'X' " (so every caller can put its own field name in front).
inline std::optional<HostPort> split_host_port(std::string_view address, std::string& why) {
  auto fail = [&](std::string reason) -> std::optional<HostPort> {
    why = std::move(reason);
    return std::nullopt;
  };
  if (address.empty()) return fail("is empty");
  if (auto scheme = address.find("://"); scheme != std::string_view::npos) {
    return fail(fmt::format("has a scheme ('{}'); write host:port and set the rpc layer separately",
                            address.substr(0, scheme + 3)));
  }
  std::string_view host;
  std::string_view port;
  if (address.front() == '[') {
    auto close = address.find(']');
    if (close == std::string_view::npos) return fail("has an unclosed '['");
    host = address.substr(1, close - 1);
    auto rest = address.substr(close + 1);
    if (rest.empty() || rest.front() != ':') return fail("has no ':port' after ']'; expected [host]:port");
    port = rest.substr(1);
    if (host.empty()) return fail("has an empty host in brackets; expected [host]:port");
    // An IPv6 literal: hex digits, ':' and '.' (IPv4-mapped tail), then an optional "%zone".
    auto zone = host.find('%');
    auto ip = host.substr(0, zone);
    bool ok = ip.find(':') != std::string_view::npos &&
              std::all_of(ip.begin(), ip.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) || c == ':' || c == '.'; });
    if (zone != std::string_view::npos) {
      auto z = host.substr(zone + 1);
      ok = ok && !z.empty() && std::all_of(z.begin(), z.end(), is_hostname_char);
    }
    if (!ok) return fail(fmt::format("has '{}' in brackets, which is not an IPv6 address", host));
  } else {
    auto colon = address.rfind(':');
    if (colon == std::string_view::npos) return fail("has no port; expected host:port");
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) {
      return fail("has an IPv6 host without brackets; write [host]:port, e.g. [::1]:2222");
    }
    if (host.empty()) return fail("has an empty host; expected host:port");
    if (auto bad = std::find_if_not(host.begin(), host.end(), is_hostname_char); bad != host.end()) {
      return fail(fmt::format("has host '{}' with the invalid character '{}'", host, *bad));
    }
  }
  if (port.empty()) return fail("has an empty port; expected host:port");
  int p = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  bool digits = std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits || (ec != std::errc{} && ec != std::errc::result_out_of_range) || end != port.data() + port.size()) {
    return fail(fmt::format("has port '{}', which is not a number", port));
  }
  if (ec == std::errc::result_out_of_range || p < 1 || p > 65535) {
    return fail(fmt::format("has port {}, out of range [1, 65535]", port));
  }
  return HostPort{std::string(host), p};
}

}  // namespace detail

/// Splits "host:port" or "[v6]:port"; throws ClusterConfigError naming the address and what is
/// wrong with it (no port, port out of [1, 65535], an unbracketed IPv6 host, a URL scheme...).
inline HostPort split_host_port(std::string_view address) {
  std::string why;
  auto hp = detail::split_host_port(address, why);
  if (!hp) throw ClusterConfigError(fmt::format("address '{}' {}", address, why));
  return *hp;
}

/// True when split_host_port(address) would succeed.
inline bool is_valid_address(std::string_view address) {
  std::string why;
  return detail::split_host_port(address, why).has_value();
}

DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_ADDRESS_HPP
// ---- end <distribute/cluster/address.hpp> ----
// ---- begin <distribute/cluster/detail/json.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_JSON_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_JSON_HPP
// Boost.JSON helpers shared by ClusterSpec and TFConfigClusterResolver: parsing text with the
// error position, describing a value in a message, reading integers strictly.

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include <boost/json.hpp>
#include <fmt/format.h>


DISTRIBUTE_BEGIN_NAMESPACE
namespace detail {

/// Parses `text` as one JSON document. Errors name `who` (the variable or type being read), the
/// character offset and Boost.JSON's own message.
inline boost::json::value cluster_parse_json(std::string_view text, std::string_view who) {
  boost::json::parser parser;
  boost::system::error_code ec;
  std::size_t consumed = parser.write(text.data(), text.size(), ec);
  if (ec) {
    throw ClusterConfigError(fmt::format("{}: invalid JSON at offset {}: {}", who, consumed, ec.message()));
  }
  return parser.release();
}

/// "array", "object", "null", or the value itself for scalars ("number 1.5", "string \"x\"",
/// "bool true"), for "..., got X" in messages.
inline std::string cluster_json_describe(const boost::json::value& v) {
  switch (v.kind()) {
    case boost::json::kind::null: return "null";
    case boost::json::kind::bool_: return fmt::format("bool {}", v.get_bool());
    case boost::json::kind::int64: return fmt::format("number {}", v.get_int64());
    case boost::json::kind::uint64: return fmt::format("number {}", v.get_uint64());
    // fmt, not serialize(): serialize writes 1.5 as "1.5E0".
    case boost::json::kind::double_: return fmt::format("number {}", v.get_double());
    case boost::json::kind::string: return fmt::format("string {}", boost::json::serialize(v));
    case boost::json::kind::array: return "array";
    case boost::json::kind::object: return "object";
  }
  return "unknown";
}

/// The value as an integer if it is a JSON integer that fits in int64 (1.0 and "1" are not).
inline std::optional<std::int64_t> cluster_json_integer(const boost::json::value& v) {
  if (v.is_int64()) return v.get_int64();
  if (v.is_uint64() && v.get_uint64() <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    return static_cast<std::int64_t>(v.get_uint64());
  }
  return std::nullopt;
}

}  // namespace detail
DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_JSON_HPP
// ---- end <distribute/cluster/detail/json.hpp> ----

DISTRIBUTE_BEGIN_NAMESPACE

namespace detail {

/// Task indices are kept below this so that job_tasks() (a list with a slot per index up to
/// the largest) cannot be made to allocate gigabytes by one stray sparse key.
inline constexpr std::int64_t kMaxTaskIndex = 999'999;

/// job → (task index → address): the one representation of dense and sparse jobs alike.
using ClusterJobs = std::map<std::string, std::map<int, std::string>>;

/// "cluster.worker" under TF_CONFIG, "worker" for a bare ClusterSpec.
inline std::string cluster_field(std::string_view root, std::string_view job) {
  return root.empty() ? std::string(job) : fmt::format("{}.{}", root, job);
}

/// Checks job names, task indices and addresses, and that no two tasks share an address.
/// Messages start with `who` ("TF_CONFIG", "ClusterSpec") and name the field under `root`.
inline void validate_cluster_jobs(const ClusterJobs& jobs, std::string_view who, std::string_view root) {
  std::map<std::string, std::string> owner;  // address → the field that first used it
  for (const auto& [job, tasks] : jobs) {
    // TF device names only allow these in a job name ("/job:<name>/...").
    bool name_ok = !job.empty() && std::isalpha(static_cast<unsigned char>(job.front())) &&
                   std::all_of(job.begin(), job.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
    if (!name_ok) {
      throw ClusterConfigError(fmt::format("{}: job name '{}'{} is not a valid name (a letter, then letters, digits or '_')",
                                           who, job, root.empty() ? "" : fmt::format(" in {}", root)));
    }
    for (const auto& [index, address] : tasks) {
      std::string field = fmt::format("{}[{}]", cluster_field(root, job), index);
      if (index < 0 || index > kMaxTaskIndex) {
        throw ClusterConfigError(fmt::format("{}: {} has task index {}, out of range [0, {}]", who, field, index, kMaxTaskIndex));
      }
      std::string why;
      if (!detail::split_host_port(address, why)) {
        throw ClusterConfigError(fmt::format("{}: {} address '{}' {}", who, field, address, why));
      }
      auto [it, fresh] = owner.emplace(address, field);
      if (!fresh) {
        throw ClusterConfigError(fmt::format("{}: {} address '{}' is already used by {}; every task needs its own address",
                                             who, field, address, it->second));
      }
    }
  }
}

/// Reads the JSON shape of a cluster: an object of job → list of addresses (dense) or object of
/// "index" → address (sparse). Only the shape is checked here; validate_cluster_jobs does the rest.
inline ClusterJobs cluster_jobs_from_json(const boost::json::value& v, std::string_view who, std::string_view root) {
  std::string what = root.empty() ? std::string("the cluster JSON") : std::string(root);
  const auto* obj = v.if_object();
  if (obj == nullptr) {
    throw ClusterConfigError(fmt::format("{}: {} must be an object of job name → task addresses, got {}", who, what,
                                         cluster_json_describe(v)));
  }
  ClusterJobs jobs;
  for (const auto& [key, tasks] : *obj) {
    std::string job(key);
    std::string field = cluster_field(root, job);
    auto& out = jobs[job];
    auto address_of = [&](const boost::json::value& a, std::string_view index) -> std::string {
      if (!a.is_string()) {
        throw ClusterConfigError(fmt::format("{}: {}[{}] must be a \"host:port\" string, got {}", who, field, index,
                                             cluster_json_describe(a)));
      }
      return std::string(a.get_string());
    };
    if (const auto* list = tasks.if_array()) {
      if (static_cast<std::int64_t>(list->size()) > kMaxTaskIndex + 1) {
        throw ClusterConfigError(fmt::format("{}: {} lists {} tasks, more than {}", who, field, list->size(), kMaxTaskIndex + 1));
      }
      for (std::size_t i = 0; i < list->size(); ++i) out[static_cast<int>(i)] = address_of((*list)[i], std::to_string(i));
    } else if (const auto* sparse = tasks.if_object()) {
      for (const auto& [index_key, address] : *sparse) {
        std::string_view k = index_key;
        std::int64_t index = -1;
        auto [end, ec] = std::from_chars(k.data(), k.data() + k.size(), index);
        bool digits = !k.empty() && std::all_of(k.begin(), k.end(), [](char c) { return c >= '0' && c <= '9'; });
        if (!digits || ec != std::errc{} || end != k.data() + k.size() || index > kMaxTaskIndex) {
          throw ClusterConfigError(fmt::format("{}: {} has key '{}', which is not a task index (an integer in [0, {}])", who,
                                               field, k, kMaxTaskIndex));
        }
        if (out.count(static_cast<int>(index)) != 0) {
          throw ClusterConfigError(fmt::format("{}: {} gives task index {} twice", who, field, index));
        }
        out[static_cast<int>(index)] = address_of(address, k);
      }
    } else {
      throw ClusterConfigError(fmt::format(
          "{}: {} must be a list of \"host:port\" addresses or an object of task index → address, got {}", who, field,
          cluster_json_describe(tasks)));
    }
  }
  return jobs;
}

}  // namespace detail

/// The addresses of a cluster's tasks, grouped by job ("chief", "worker", "ps", "evaluator"...).
/// A job is dense (tasks 0..n-1, TF's list form) or sparse (some indices only, TF's
/// {"0": "a:1", "3": "b:2"} form, used when a task only needs to know some of its peers).
/// Every address is validated as host:port, and no two tasks may share one. Jobs are kept in
/// name order, as TF sorts them.
class ClusterSpec {
 public:
  using DenseJobs = std::map<std::string, std::vector<std::string>>;
  using SparseJobs = std::map<std::string, std::map<int, std::string>>;

  /// An empty cluster: a single process, no peers.
  ClusterSpec() = default;

  /// From dense jobs: `ds::ClusterSpec({{"worker", {"a:2222", "b:2222"}}, {"ps", {"c:2222"}}})`.
  /// Throws ClusterConfigError naming the bad job name or address. Implicit: a spec is nothing
  /// but its jobs. The initializer-list form keeps `({{"ps", {"a:1"}}})` (one job, one task)
  /// from being ambiguous with the copy constructor.
  ClusterSpec(std::initializer_list<DenseJobs::value_type> jobs) : ClusterSpec(DenseJobs(jobs)) {}
  ClusterSpec(const DenseJobs& jobs) {
    for (const auto& [job, addresses] : jobs) {
      auto& tasks = jobs_[job];
      for (std::size_t i = 0; i < addresses.size(); ++i) tasks[static_cast<int>(i)] = addresses[i];
    }
    detail::validate_cluster_jobs(jobs_, "ClusterSpec", "");
  }

  /// From sparse jobs: `ClusterSpec::from_sparse({{"worker", {{0, "a:1"}, {3, "b:2"}}}})`.
  static ClusterSpec from_sparse(SparseJobs jobs) {
    detail::validate_cluster_jobs(jobs, "ClusterSpec", "");
    ClusterSpec spec;
    spec.jobs_ = std::move(jobs);
    return spec;
  }

  /// From TF's JSON: `{"worker": ["a:1", "b:2"], "ps": {"0": "c:3"}}`. Throws
  /// ClusterConfigError on a syntax error (with Boost.JSON's message and the offset) or a
  /// malformed job, naming the field ("ClusterSpec: worker[1] address 'b' has no port...").
  static ClusterSpec from_json(std::string_view json) { return from_json(detail::cluster_parse_json(json, "ClusterSpec")); }
  static ClusterSpec from_json(const boost::json::value& json) {
    return from_sparse(detail::cluster_jobs_from_json(json, "ClusterSpec", ""));
  }
  // boost::json::value converts from text too; these say which overload text means.
  static ClusterSpec from_json(const char* json) { return from_json(std::string_view(json)); }
  static ClusterSpec from_json(const std::string& json) { return from_json(std::string_view(json)); }
  static ClusterSpec from_json(const boost::json::object& json) { return from_json(boost::json::value(json)); }

  /// The JSON object TF writes: dense jobs as lists, sparse jobs as {"index": address}.
  boost::json::object to_json_value() const {
    boost::json::object out;
    for (const auto& [job, tasks] : jobs_) {
      if (is_dense(tasks)) {
        boost::json::array list;
        for (const auto& entry : tasks) list.emplace_back(entry.second);
        out[job] = std::move(list);
      } else {
        boost::json::object sparse;
        for (const auto& [index, address] : tasks) sparse[std::to_string(index)] = address;
        out[job] = std::move(sparse);
      }
    }
    return out;
  }
  std::string to_json() const { return boost::json::serialize(to_json_value()); }

  bool empty() const { return jobs_.empty(); }
  bool has_job(std::string_view job) const { return find(job) != jobs_.end(); }
  bool has_task(std::string_view job, int index) const {
    auto it = find(job);
    return it != jobs_.end() && it->second.count(index) != 0;
  }

  /// Job names in order.
  std::vector<std::string> jobs() const {
    std::vector<std::string> names;
    for (const auto& entry : jobs_) names.push_back(entry.first);
    return names;
  }

  /// Number of tasks defined in `job` (for a sparse job, not its largest index + 1).
  int num_tasks(std::string_view job) const { return static_cast<int>(tasks_of(job, "num_tasks").size()); }

  /// The task indices of `job`, ascending.
  std::vector<int> task_indices(std::string_view job) const {
    std::vector<int> out;
    for (const auto& entry : tasks_of(job, "task_indices")) out.push_back(entry.first);
    return out;
  }

  /// The address of task `index` of `job`; InvalidArgument if there is no such task.
  const std::string& task_address(std::string_view job, int index) const {
    const auto& tasks = tasks_of(job, "task_address");
    auto it = tasks.find(index);
    if (it == tasks.end()) {
      throw InvalidArgument(fmt::format("ClusterSpec::task_address: job '{}' has no task {} (task indices: {})", job, index,
                                        fmt::join(task_indices(job), ", ")));
    }
    return it->second;
  }

  /// TF's job_tasks: the addresses by index, a slot per index up to the largest; slots of a
  /// sparse job that no task fills are empty strings (TF's None).
  std::vector<std::string> job_tasks(std::string_view job) const {
    const auto& tasks = tasks_of(job, "job_tasks");
    std::vector<std::string> out(tasks.empty() ? 0 : static_cast<std::size_t>(tasks.rbegin()->first) + 1);
    for (const auto& [index, address] : tasks) out[static_cast<std::size_t>(index)] = address;
    return out;
  }

  /// Everything, as job → (index → address).
  const SparseJobs& as_dict() const { return jobs_; }

  friend bool operator==(const ClusterSpec&, const ClusterSpec&) = default;

 private:
  static bool is_dense(const std::map<int, std::string>& tasks) {
    return tasks.empty() || tasks.rbegin()->first + 1 == static_cast<int>(tasks.size());
  }
  SparseJobs::const_iterator find(std::string_view job) const {
    return std::find_if(jobs_.begin(), jobs_.end(), [&](const auto& entry) { return entry.first == job; });
  }
  const std::map<int, std::string>& tasks_of(std::string_view job, std::string_view what) const {
    auto it = find(job);
    if (it == jobs_.end()) {
      throw InvalidArgument(fmt::format("ClusterSpec::{}: no job '{}' in the cluster (jobs: {})", what, job,
                                        jobs_.empty() ? std::string("none") : fmt::format("{}", fmt::join(jobs(), ", "))));
    }
    return it->second;
  }

  SparseJobs jobs_;
};

DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_CLUSTER_SPEC_HPP
// ---- end <distribute/cluster/cluster_spec.hpp> ----
// ---- begin <distribute/cluster/detail/env.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_ENV_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_ENV_HPP
// Reading environment variables, from the process or from an injected map (tests).

#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>


DISTRIBUTE_BEGIN_NAMESPACE
namespace detail {

/// Variable name → value. Transparent comparison so lookups by string_view do not allocate.
using EnvMap = std::map<std::string, std::string, std::less<>>;

/// Looks variables up in `map` when one is given, else in the process environment. Resolvers
/// take a map in a constructor overload so tests never have to mutate the real environment
/// (setenv is not thread-safe and would leak between test cases).
class EnvReader {
 public:
  EnvReader() = default;
  explicit EnvReader(const EnvMap* map) : map_(map) {}

  std::optional<std::string> get(std::string_view name) const {
    if (map_ != nullptr) {
      auto it = map_->find(name);
      if (it == map_->end()) return std::nullopt;
      return it->second;
    }
    // std::getenv needs a NUL-terminated name.
    const char* v = std::getenv(std::string(name).c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  }

  bool has(std::string_view name) const { return get(name).has_value(); }

 private:
  const EnvMap* map_ = nullptr;
};

/// Parses a whole decimal integer (optional leading '-'; no spaces, signs or suffixes).
inline std::optional<std::int64_t> parse_env_integer(std::string_view s) {
  std::int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc{} || p != s.data() + s.size()) return std::nullopt;
  return v;
}

/// The integer value of variable `name`, which must be set and lie in [lo, hi]. `who` prefixes
/// the message ("SlurmClusterResolver") so the user knows which resolver read it.
inline int require_env_int(const EnvReader& env, std::string_view who, std::string_view name, std::int64_t lo,
                           std::int64_t hi, std::string_view hint = {}) {
  auto raw = env.get(name);
  if (!raw) throw ClusterConfigError(fmt::format("{}: environment variable {} is not set{}", who, name, hint));
  auto v = parse_env_integer(*raw);
  if (!v) throw ClusterConfigError(fmt::format("{}: {}='{}' is not an integer", who, name, *raw));
  if (*v < lo || *v > hi) {
    throw ClusterConfigError(fmt::format("{}: {}={} is out of range; it must be in [{}, {}]", who, name, *v, lo, hi));
  }
  return static_cast<int>(*v);
}

}  // namespace detail
DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_ENV_HPP
// ---- end <distribute/cluster/detail/env.hpp> ----

DISTRIBUTE_BEGIN_NAMESPACE

/// Environment variables handed to a resolver instead of the process environment (tests, or a
/// program that computes them). Lookups by string_view do not allocate.
using EnvVars = detail::EnvMap;

/// Device type → count, as TF's num_accelerators() ({"GPU": 2}); empty for host-only tasks.
using AcceleratorCounts = std::map<std::string, int>;

namespace detail {

inline std::string cluster_tasks_phrase(std::int64_t n) { return fmt::format("{} task{}", n, n == 1 ? "" : "s"); }

/// Checks that task (type, id) exists in `spec`. An evaluator may be missing from the cluster
/// (TF runs it beside the training cluster), and then it is the only evaluator, index 0.
/// `type_label`/`id_label` name the fields ("TF_CONFIG: task.type"), `cluster_name` the spec.
inline void check_task_in_cluster(const ClusterSpec& spec, std::string_view type, std::int64_t id,
                                  std::string_view type_label, std::string_view id_label, std::string_view cluster_name) {
  if (type.empty()) throw ClusterConfigError(fmt::format("{} is empty", type_label));
  if (id < 0) throw ClusterConfigError(fmt::format("{} {} is negative", id_label, id));
  if (!spec.has_job(type)) {
    if (type == "evaluator") {
      if (id != 0) {
        throw ClusterConfigError(fmt::format(
            "{} {} is out of range for job 'evaluator', which is not in {} and so has one task (index 0)", id_label, id,
            cluster_name));
      }
      return;
    }
    throw ClusterConfigError(fmt::format("{} '{}' has no job in {} (jobs: {})", type_label, type, cluster_name,
                                         spec.empty() ? std::string("none") : fmt::format("{}", fmt::join(spec.jobs(), ", "))));
  }
  auto indices = spec.task_indices(type);
  bool dense = indices.empty() || indices.back() + 1 == static_cast<int>(indices.size());
  if (dense && id >= static_cast<std::int64_t>(indices.size())) {
    throw ClusterConfigError(fmt::format("{} {} is out of range for job '{}' with {}", id_label, id, type,
                                         cluster_tasks_phrase(static_cast<std::int64_t>(indices.size()))));
  }
  if (!dense && !spec.has_task(type, static_cast<int>(std::min<std::int64_t>(id, kMaxTaskIndex + 1)))) {
    throw ClusterConfigError(fmt::format("{} {} is not a task of job '{}' (task indices: {})", id_label, id, type,
                                         fmt::join(indices, ", ")));
  }
}

inline int cluster_job_size(const ClusterSpec& spec, std::string_view job) {
  return spec.has_job(job) ? spec.num_tasks(job) : 0;
}

}  // namespace detail

/// Where this process sits in a cluster: the cluster's spec, this task's type and index, the
/// RPC layer and local accelerators. Resolvers read it from somewhere (TF_CONFIG, Slurm, a
/// launcher's environment) once, at construction, and validate it there, so the getters are
/// cheap and cannot fail. Users may derive their own.
///
/// The helpers below follow TF's multi_worker_util. A cluster with an empty spec is local mode:
/// one process, which is worker 0 and the chief.
class ClusterResolver {
 public:
  virtual ~ClusterResolver() = default;

  virtual const ClusterSpec& cluster_spec() const = 0;
  /// "chief", "worker", "ps" or "evaluator" (custom resolvers may use other job names).
  virtual std::string task_type() const = 0;
  virtual int task_id() const = 0;
  /// "grpc" and the like; empty when the configuration names none.
  virtual std::string rpc_layer() const = 0;
  virtual AcceleratorCounts num_accelerators() const = 0;
  /// TF's free-form environment string ("cloud", "google"); empty unless configured.
  virtual std::string environment() const { return {}; }

  /// The chief task; without a chief job, worker 0. The evaluator also counts as chief of its
  /// own work, as in TF (it writes its own summaries).
  bool is_chief() const {
    const auto type = task_type();
    if (type == "chief" || type == "evaluator") return true;
    return type == "worker" && task_id() == 0 && detail::cluster_job_size(cluster_spec(), "chief") == 0;
  }

  /// The number of tasks that run replicas in sync: chief + workers (1 in local mode). For the
  /// evaluator, the evaluators (it trains with nobody). ClusterConfigError for other tasks.
  int worker_count() const {
    const auto& spec = cluster_spec();
    const auto type = task_type();
    if (spec.empty()) return 1;
    if (type == "evaluator") return std::max(1, detail::cluster_job_size(spec, "evaluator"));
    if (type != "chief" && type != "worker") {
      throw ClusterConfigError(
          fmt::format("ClusterResolver::worker_count: task type '{}' runs no replicas; only chief and worker tasks do", type));
    }
    return detail::cluster_job_size(spec, "chief") + detail::cluster_job_size(spec, "worker");
  }

  /// This task's position among the tasks that run replicas: the chief is 0 and worker i is
  /// i + 1 when there is a chief, else i (TF's id_in_cluster). ClusterConfigError for the
  /// evaluator and for ps tasks, which have no replicas.
  int id_in_cluster() const {
    const auto& spec = cluster_spec();
    const auto type = task_type();
    if (type == "chief") return 0;
    if (type == "worker") return task_id() + detail::cluster_job_size(spec, "chief");
    if (type == "evaluator") {
      throw ClusterConfigError(
          "ClusterResolver::id_in_cluster: task type 'evaluator' has no id in the cluster; it runs beside training");
    }
    throw ClusterConfigError(fmt::format(
        "ClusterResolver::id_in_cluster: task type '{}' has no id in the cluster; only chief and worker tasks do", type));
  }

  /// The global id of local replica `local_id` when every task runs `local_replicas`:
  /// id_in_cluster() * local_replicas + local_id.
  int global_replica_id(int local_replicas, int local_id) const {
    if (local_replicas < 1 || local_id < 0 || local_id >= local_replicas) {
      throw InvalidArgument(fmt::format(
          "ClusterResolver::global_replica_id: local replica {} is out of range for {} local replicas", local_id,
          local_replicas));
    }
    return id_in_cluster() * local_replicas + local_id;
  }

  /// The address everyone rendezvous with: the chief's, else worker 0's. Empty in local mode
  /// (an empty spec), where there is nobody to connect to.
  std::string master_address() const {
    const auto& spec = cluster_spec();
    if (spec.empty()) return {};
    if (detail::cluster_job_size(spec, "chief") > 0) return spec.task_address("chief", spec.task_indices("chief").front());
    if (spec.has_task("worker", 0)) return spec.task_address("worker", 0);
    throw ClusterConfigError(fmt::format("ClusterResolver::master_address: the cluster (jobs: {}) has neither a chief nor worker 0",
                                         fmt::join(spec.jobs(), ", ")));
  }

 protected:
  ClusterResolver() = default;
  ClusterResolver(const ClusterResolver&) = default;
  ClusterResolver(ClusterResolver&&) = default;
  ClusterResolver& operator=(const ClusterResolver&) = default;
  ClusterResolver& operator=(ClusterResolver&&) = default;
};

/// A resolver for a spec the program already has (TF's SimpleClusterResolver). The task must
/// exist in the spec unless the spec is empty (local mode); ClusterConfigError otherwise.
class SimpleClusterResolver : public ClusterResolver {
 public:
  SimpleClusterResolver(ClusterSpec cluster_spec, std::string task_type, int task_id, std::string rpc_layer = "grpc",
                        AcceleratorCounts num_accelerators = {}, std::string environment = {})
      : spec_(std::move(cluster_spec)),
        task_type_(std::move(task_type)),
        task_id_(task_id),
        rpc_layer_(std::move(rpc_layer)),
        accelerators_(std::move(num_accelerators)),
        environment_(std::move(environment)) {
    if (task_type_.empty()) throw ClusterConfigError("SimpleClusterResolver: task_type is empty");
    if (task_id_ < 0) throw ClusterConfigError(fmt::format("SimpleClusterResolver: task_id {} is negative", task_id_));
    if (!spec_.empty()) {
      detail::check_task_in_cluster(spec_, task_type_, task_id_, "SimpleClusterResolver: task_type",
                                    "SimpleClusterResolver: task_id", "the cluster spec");
    }
    for (const auto& [device, count] : accelerators_) {
      if (count < 0) {
        throw ClusterConfigError(fmt::format("SimpleClusterResolver: num_accelerators['{}'] is {}, negative", device, count));
      }
    }
  }

  const ClusterSpec& cluster_spec() const override { return spec_; }
  std::string task_type() const override { return task_type_; }
  int task_id() const override { return task_id_; }
  std::string rpc_layer() const override { return rpc_layer_; }
  AcceleratorCounts num_accelerators() const override { return accelerators_; }
  std::string environment() const override { return environment_; }

 private:
  ClusterSpec spec_;
  std::string task_type_;
  int task_id_;
  std::string rpc_layer_;
  AcceleratorCounts accelerators_;
  std::string environment_;
};

DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_CLUSTER_RESOLVER_HPP
// ---- end <distribute/cluster/cluster_resolver.hpp> ----
// ---- begin <distribute/cluster/cluster_spec.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_CLUSTER_SPEC_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_CLUSTER_SPEC_HPP
// ClusterSpec: job name → task addresses, TF's tf.train.ClusterSpec, with JSON in and out.

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/json.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

// ---- begin <distribute/cluster/address.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_ADDRESS_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_ADDRESS_HPP
// Task addresses: "host:port", IPv6 hosts in brackets ("[::1]:2222").

#include <algorithm>
#include <cctype>
#include <charconv>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>


DISTRIBUTE_BEGIN_NAMESPACE

/// A task address split into its parts. `host` carries no brackets, so it can go straight to a
/// resolver; to_string() puts them back for IPv6 hosts.
struct HostPort {
  std::string host;
  int port = 0;

  std::string to_string() const {
    return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port) : fmt::format("{}:{}", host, port);
  }
  friend bool operator==(const HostPort&, const HostPort&) = default;
};

namespace detail {

inline bool is_hostname_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_';
}

/// Splits `address`, or says what is wrong with it as the end of a sentence that starts with
/// "address 'X' " (so every caller can put its own field name in front).
inline std::optional<HostPort> split_host_port(std::string_view address, std::string& why) {
  auto fail = [&](std::string reason) -> std::optional<HostPort> {
    why = std::move(reason);
    return std::nullopt;
  };
  if (address.empty()) return fail("is empty");
  if (auto scheme = address.find("://"); scheme != std::string_view::npos) {
    return fail(fmt::format("has a scheme ('{}'); write host:port and set the rpc layer separately",
                            address.substr(0, scheme + 3)));
  }
  std::string_view host;
  std::string_view port;
  if (address.front() == '[') {
    auto close = address.find(']');
    if (close == std::string_view::npos) return fail("has an unclosed '['");
    host = address.substr(1, close - 1);
    auto rest = address.substr(close + 1);
    if (rest.empty() || rest.front() != ':') return fail("has no ':port' after ']'; expected [host]:port");
    port = rest.substr(1);
    if (host.empty()) return fail("has an empty host in brackets; expected [host]:port");
    // An IPv6 literal: hex digits, ':' and '.' (IPv4-mapped tail), then an optional "%zone".
    auto zone = host.find('%');
    auto ip = host.substr(0, zone);
    bool ok = ip.find(':') != std::string_view::npos &&
              std::all_of(ip.begin(), ip.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) || c == ':' || c == '.'; });
    if (zone != std::string_view::npos) {
      auto z = host.substr(zone + 1);
      ok = ok && !z.empty() && std::all_of(z.begin(), z.end(), is_hostname_char);
    }
    if (!ok) return fail(fmt::format("has '{}' in brackets, which is not an IPv6 address", host));
  } else {
    auto colon = address.rfind(':');
    if (colon == std::string_view::npos) return fail("has no port; expected host:port");
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) {
      return fail("has an IPv6 host without brackets; write [host]:port, e.g. [::1]:2222");
    }
    if (host.empty()) return fail("has an empty host; expected host:port");
    if (auto bad = std::find_if_not(host.begin(), host.end(), is_hostname_char); bad != host.end()) {
      return fail(fmt::format("has host '{}' with the invalid character '{}'", host, *bad));
    }
  }
  if (port.empty()) return fail("has an empty port; expected host:port");
  int p = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  bool digits = std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits || (ec != std::errc{} && ec != std::errc::result_out_of_range) || end != port.data() + port.size()) {
    return fail(fmt::format("has port '{}', which is not a number", port));
  }
  if (ec == std::errc::result_out_of_range || p < 1 || p > 65535) {
    return fail(fmt::format("has port {}, out of range [1, 65535]", port));
  }
  return HostPort{std::string(host), p};
}

}  // namespace detail

/// Splits "host:port" or "[v6]:port"; throws ClusterConfigError naming the address and what is
/// wrong with it (no port, port out of [1, 65535], an unbracketed IPv6 host, a URL scheme...).
inline HostPort split_host_port(std::string_view address) {
  std::string why;
  auto hp = detail::split_host_port(address, why);
  if (!hp) throw ClusterConfigError(fmt::format("address '{}' {}", address, why));
  return *hp;
}

/// True when split_host_port(address) would succeed.
inline bool is_valid_address(std::string_view address) {
  std::string why;
  return detail::split_host_port(address, why).has_value();
}

DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_ADDRESS_HPP
// ---- end <distribute/cluster/address.hpp> ----
// ---- begin <distribute/cluster/detail/json.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_JSON_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_JSON_HPP
// Boost.JSON helpers shared by ClusterSpec and TFConfigClusterResolver: parsing text with the
// error position, describing a value in a message, reading integers strictly.

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include <boost/json.hpp>
#include <fmt/format.h>


DISTRIBUTE_BEGIN_NAMESPACE
namespace detail {

/// Parses `text` as one JSON document. Errors name `who` (the variable or type being read), the
/// character offset and Boost.JSON's own message.
inline boost::json::value cluster_parse_json(std::string_view text, std::string_view who) {
  boost::json::parser parser;
  boost::system::error_code ec;
  std::size_t consumed = parser.write(text.data(), text.size(), ec);
  if (ec) {
    throw ClusterConfigError(fmt::format("{}: invalid JSON at offset {}: {}", who, consumed, ec.message()));
  }
  return parser.release();
}

/// "array", "object", "null", or the value itself for scalars ("number 1.5", "string \"x\"",
/// "bool true"), for "..., got X" in messages.
inline std::string cluster_json_describe(const boost::json::value& v) {
  switch (v.kind()) {
    case boost::json::kind::null: return "null";
    case boost::json::kind::bool_: return fmt::format("bool {}", v.get_bool());
    case boost::json::kind::int64: return fmt::format("number {}", v.get_int64());
    case boost::json::kind::uint64: return fmt::format("number {}", v.get_uint64());
    // fmt, not serialize(): serialize writes 1.5 as "1.5E0".
    case boost::json::kind::double_: return fmt::format("number {}", v.get_double());
    case boost::json::kind::string: return fmt::format("string {}", boost::json::serialize(v));
    case boost::json::kind::array: return "array";
    case boost::json::kind::object: return "object";
  }
  return "unknown";
}

/// The value as an integer if it is a JSON integer that fits in int64 (1.0 and "1" are not).
inline std::optional<std::int64_t> cluster_json_integer(const boost::json::value& v) {
  if (v.is_int64()) return v.get_int64();
  if (v.is_uint64() && v.get_uint64() <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    return static_cast<std::int64_t>(v.get_uint64());
  }
  return std::nullopt;
}

}  // namespace detail
DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_JSON_HPP
// ---- end <distribute/cluster/detail/json.hpp> ----

DISTRIBUTE_BEGIN_NAMESPACE

namespace detail {

/// Task indices are kept below this so that job_tasks() (a list with a slot per index up to
/// the largest) cannot be made to allocate gigabytes by one stray sparse key.
inline constexpr std::int64_t kMaxTaskIndex = 999'999;

/// job → (task index → address): the one representation of dense and sparse jobs alike.
using ClusterJobs = std::map<std::string, std::map<int, std::string>>;

/// "cluster.worker" under TF_CONFIG, "worker" for a bare ClusterSpec.
inline std::string cluster_field(std::string_view root, std::string_view job) {
  return root.empty() ? std::string(job) : fmt::format("{}.{}", root, job);
}

/// Checks job names, task indices and addresses, and that no two tasks share an address.
/// Messages start with `who` ("TF_CONFIG", "ClusterSpec") and name the field under `root`.
inline void validate_cluster_jobs(const ClusterJobs& jobs, std::string_view who, std::string_view root) {
  std::map<std::string, std::string> owner;  // address → the field that first used it
  for (const auto& [job, tasks] : jobs) {
    // TF device names only allow these in a job name ("/job:<name>/...").
    bool name_ok = !job.empty() && std::isalpha(static_cast<unsigned char>(job.front())) &&
                   std::all_of(job.begin(), job.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
    if (!name_ok) {
      throw ClusterConfigError(fmt::format("{}: job name '{}'{} is not a valid name (a letter, then letters, digits or '_')",
                                           who, job, root.empty() ? "" : fmt::format(" in {}", root)));
    }
    for (const auto& [index, address] : tasks) {
      std::string field = fmt::format("{}[{}]", cluster_field(root, job), index);
      if (index < 0 || index > kMaxTaskIndex) {
        throw ClusterConfigError(fmt::format("{}: {} has task index {}, out of range [0, {}]", who, field, index, kMaxTaskIndex));
      }
      std::string why;
      if (!detail::split_host_port(address, why)) {
        throw ClusterConfigError(fmt::format("{}: {} address '{}' {}", who, field, address, why));
      }
      auto [it, fresh] = owner.emplace(address, field);
      if (!fresh) {
        throw ClusterConfigError(fmt::format("{}: {} address '{}' is already used by {}; every task needs its own address",
                                             who, field, address, it->second));
      }
    }
  }
}

/// Reads the JSON shape of a cluster: an object of job → list of addresses (dense) or object of
/// "index" → address (sparse). Only the shape is checked here; validate_cluster_jobs does the rest.
inline ClusterJobs cluster_jobs_from_json(const boost::json::value& v, std::string_view who, std::string_view root) {
  std::string what = root.empty() ? std::string("the cluster JSON") : std::string(root);
  const auto* obj = v.if_object();
  if (obj == nullptr) {
    throw ClusterConfigError(fmt::format("{}: {} must be an object of job name → task addresses, got {}", who, what,
                                         cluster_json_describe(v)));
  }
  ClusterJobs jobs;
  for (const auto& [key, tasks] : *obj) {
    std::string job(key);
    std::string field = cluster_field(root, job);
    auto& out = jobs[job];
    auto address_of = [&](const boost::json::value& a, std::string_view index) -> std::string {
      if (!a.is_string()) {
        throw ClusterConfigError(fmt::format("{}: {}[{}] must be a \"host:port\" string, got {}", who, field, index,
                                             cluster_json_describe(a)));
      }
      return std::string(a.get_string());
    };
    if (const auto* list = tasks.if_array()) {
      if (static_cast<std::int64_t>(list->size()) > kMaxTaskIndex + 1) {
        throw ClusterConfigError(fmt::format("{}: {} lists {} tasks, more than {}", who, field, list->size(), kMaxTaskIndex + 1));
      }
      for (std::size_t i = 0; i < list->size(); ++i) out[static_cast<int>(i)] = address_of((*list)[i], std::to_string(i));
    } else if (const auto* sparse = tasks.if_object()) {
      for (const auto& [index_key, address] : *sparse) {
        std::string_view k = index_key;
        std::int64_t index = -1;
        auto [end, ec] = std::from_chars(k.data(), k.data() + k.size(), index);
        bool digits = !k.empty() && std::all_of(k.begin(), k.end(), [](char c) { return c >= '0' && c <= '9'; });
        if (!digits || ec != std::errc{} || end != k.data() + k.size() || index > kMaxTaskIndex) {
          throw ClusterConfigError(fmt::format("{}: {} has key '{}', which is not a task index (an integer in [0, {}])", who,
                                               field, k, kMaxTaskIndex));
        }
        if (out.count(static_cast<int>(index)) != 0) {
          throw ClusterConfigError(fmt::format("{}: {} gives task index {} twice", who, field, index));
        }
        out[static_cast<int>(index)] = address_of(address, k);
      }
    } else {
      throw ClusterConfigError(fmt::format(
          "{}: {} must be a list of \"host:port\" addresses or an object of task index → address, got {}", who, field,
          cluster_json_describe(tasks)));
    }
  }
  return jobs;
}

}  // namespace detail

/// The addresses of a cluster's tasks, grouped by job ("chief", "worker", "ps", "evaluator"...).
/// A job is dense (tasks 0..n-1, TF's list form) or sparse (some indices only, TF's
/// {"0": "a:1", "3": "b:2"} form, used when a task only needs to know some of its peers).
/// Every address is validated as host:port, and no two tasks may share one. Jobs are kept in
/// name order, as TF sorts them.
class ClusterSpec {
 public:
  using DenseJobs = std::map<std::string, std::vector<std::string>>;
  using SparseJobs = std::map<std::string, std::map<int, std::string>>;

  /// An empty cluster: a single process, no peers.
  ClusterSpec() = default;

  /// From dense jobs: `ds::ClusterSpec({{"worker", {"a:2222", "b:2222"}}, {"ps", {"c:2222"}}})`.
  /// Throws ClusterConfigError naming the bad job name or address. Implicit: a spec is nothing
  /// but its jobs. The initializer-list form keeps `({{"ps", {"a:1"}}})` (one job, one task)
  /// from being ambiguous with the copy constructor.
  ClusterSpec(std::initializer_list<DenseJobs::value_type> jobs) : ClusterSpec(DenseJobs(jobs)) {}
  ClusterSpec(const DenseJobs& jobs) {
    for (const auto& [job, addresses] : jobs) {
      auto& tasks = jobs_[job];
      for (std::size_t i = 0; i < addresses.size(); ++i) tasks[static_cast<int>(i)] = addresses[i];
    }
    detail::validate_cluster_jobs(jobs_, "ClusterSpec", "");
  }

  /// From sparse jobs: `ClusterSpec::from_sparse({{"worker", {{0, "a:1"}, {3, "b:2"}}}})`.
  static ClusterSpec from_sparse(SparseJobs jobs) {
    detail::validate_cluster_jobs(jobs, "ClusterSpec", "");
    ClusterSpec spec;
    spec.jobs_ = std::move(jobs);
    return spec;
  }

  /// From TF's JSON: `{"worker": ["a:1", "b:2"], "ps": {"0": "c:3"}}`. Throws
  /// ClusterConfigError on a syntax error (with Boost.JSON's message and the offset) or a
  /// malformed job, naming the field ("ClusterSpec: worker[1] address 'b' has no port...").
  static ClusterSpec from_json(std::string_view json) { return from_json(detail::cluster_parse_json(json, "ClusterSpec")); }
  static ClusterSpec from_json(const boost::json::value& json) {
    return from_sparse(detail::cluster_jobs_from_json(json, "ClusterSpec", ""));
  }
  // boost::json::value converts from text too; these say which overload text means.
  static ClusterSpec from_json(const char* json) { return from_json(std::string_view(json)); }
  static ClusterSpec from_json(const std::string& json) { return from_json(std::string_view(json)); }
  static ClusterSpec from_json(const boost::json::object& json) { return from_json(boost::json::value(json)); }

  /// The JSON object TF writes: dense jobs as lists, sparse jobs as {"index": address}.
  boost::json::object to_json_value() const {
    boost::json::object out;
    for (const auto& [job, tasks] : jobs_) {
      if (is_dense(tasks)) {
        boost::json::array list;
        for (const auto& entry : tasks) list.emplace_back(entry.second);
        out[job] = std::move(list);
      } else {
        boost::json::object sparse;
        for (const auto& [index, address] : tasks) sparse[std::to_string(index)] = address;
        out[job] = std::move(sparse);
      }
    }
    return out;
  }
  std::string to_json() const { return boost::json::serialize(to_json_value()); }

  bool empty() const { return jobs_.empty(); }
  bool has_job(std::string_view job) const { return find(job) != jobs_.end(); }
  bool has_task(std::string_view job, int index) const {
    auto it = find(job);
    return it != jobs_.end() && it->second.count(index) != 0;
  }

  /// Job names in order.
  std::vector<std::string> jobs() const {
    std::vector<std::string> names;
    for (const auto& entry : jobs_) names.push_back(entry.first);
    return names;
  }

  /// Number of tasks defined in `job` (for a sparse job, not its largest index + 1).
  int num_tasks(std::string_view job) const { return static_cast<int>(tasks_of(job, "num_tasks").size()); }

  /// The task indices of `job`, ascending.
  std::vector<int> task_indices(std::string_view job) const {
    std::vector<int> out;
    for (const auto& entry : tasks_of(job, "task_indices")) out.push_back(entry.first);
    return out;
  }

  /// The address of task `index` of `job`; InvalidArgument if there is no such task.
  const std::string& task_address(std::string_view job, int index) const {
    const auto& tasks = tasks_of(job, "task_address");
    auto it = tasks.find(index);
    if (it == tasks.end()) {
      throw InvalidArgument(fmt::format("ClusterSpec::task_address: job '{}' has no task {} (task indices: {})", job, index,
                                        fmt::join(task_indices(job), ", ")));
    }
    return it->second;
  }

  /// TF's job_tasks: the addresses by index, a slot per index up to the largest; slots of a
  /// sparse job that no task fills are empty strings (TF's None).
  std::vector<std::string> job_tasks(std::string_view job) const {
    const auto& tasks = tasks_of(job, "job_tasks");
    std::vector<std::string> out(tasks.empty() ? 0 : static_cast<std::size_t>(tasks.rbegin()->first) + 1);
    for (const auto& [index, address] : tasks) out[static_cast<std::size_t>(index)] = address;
    return out;
  }

  /// Everything, as job → (index → address).
  const SparseJobs& as_dict() const { return jobs_; }

  friend bool operator==(const ClusterSpec&, const ClusterSpec&) = default;

 private:
  static bool is_dense(const std::map<int, std::string>& tasks) {
    return tasks.empty() || tasks.rbegin()->first + 1 == static_cast<int>(tasks.size());
  }
  SparseJobs::const_iterator find(std::string_view job) const {
    return std::find_if(jobs_.begin(), jobs_.end(), [&](const auto& entry) { return entry.first == job; });
  }
  const std::map<int, std::string>& tasks_of(std::string_view job, std::string_view what) const {
    auto it = find(job);
    if (it == jobs_.end()) {
      throw InvalidArgument(fmt::format("ClusterSpec::{}: no job '{}' in the cluster (jobs: {})", what, job,
                                        jobs_.empty() ? std::string("none") : fmt::format("{}", fmt::join(jobs(), ", "))));
    }
    return it->second;
  }

  SparseJobs jobs_;
};

DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_CLUSTER_SPEC_HPP
// ---- end <distribute/cluster/cluster_spec.hpp> ----
// ---- begin <distribute/cluster/detail/env.hpp> ----
#ifndef DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_ENV_HPP
#define DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_ENV_HPP
// Reading environment variables, from the process or from an injected map (tests).

#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>


DISTRIBUTE_BEGIN_NAMESPACE
namespace detail {

/// Variable name → value. Transparent comparison so lookups by string_view do not allocate.
using EnvMap = std::map<std::string, std::string, std::less<>>;

/// Looks variables up in `map` when one is given, else in the process environment. Resolvers
/// take a map in a constructor overload so tests never have to mutate the real environment
/// (setenv is not thread-safe and would leak between test cases).
class EnvReader {
 public:
  EnvReader() = default;
  explicit EnvReader(const EnvMap* map) : map_(map) {}

  std::optional<std::string> get(std::string_view name) const {
    if (map_ != nullptr) {
      auto it = map_->find(name);
      if (it == map_->end()) return std::nullopt;
      return it->second;
    }
    // std::getenv needs a NUL-terminated name.
    const char* v = std::getenv(std::string(name).c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  }

  bool has(std::string_view name) const { return get(name).has_value(); }

 private:
  const EnvMap* map_ = nullptr;
};

/// Parses a whole decimal integer (optional leading '-'; no spaces, signs or suffixes).
inline std::optional<std::int64_t> parse_env_integer(std::string_view s) {
  std::int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc{} || p != s.data() + s.size()) return std::nullopt;
  return v;
}

/// The integer value of variable `name`, which must be set and lie in [lo, hi]. `who` prefixes
/// the message ("SlurmClusterResolver") so the user knows which resolver read it.
inline int require_env_int(const EnvReader& env, std::string_view who, std::string_view name, std::int64_t lo,
                           std::int64_t hi, std::string_view hint = {}) {
  auto raw = env.get(name);
  if (!raw) throw ClusterConfigError(fmt::format("{}: environment variable {} is not set{}", who, name, hint));
  auto v = parse_env_integer(*raw);
  if (!v) throw ClusterConfigError(fmt::format("{}: {}='{}' is not an integer", who, name, *raw));
  if (*v < lo || *v > hi) {
    throw ClusterConfigError(fmt::format("{}: {}={} is out of range; it must be in [{}, {}]", who, name, *v, lo, hi));
  }
  return static_cast<int>(*v);
}

}  // namespace detail
DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_DETAIL_ENV_HPP
// ---- end <distribute/cluster/detail/env.hpp> ----

DISTRIBUTE_BEGIN_NAMESPACE

/// Fallbacks and extras for LauncherClusterResolver. The environment wins where it sets a value.
struct LauncherOptions {
  /// Used when MASTER_ADDR is unset (mpirun sets no address; `mpirun -x MASTER_ADDR=...` does).
  std::optional<std::string> master_addr;
  /// Used when MASTER_PORT is unset.
  std::optional<int> master_port;
  /// Task i's port is MASTER_PORT + port_offset + i. torchrun's agent already listens on
  /// MASTER_PORT itself, so under torchrun use 1 or more.
  int port_offset = 0;
  std::string rpc_layer = "grpc";
  AcceleratorCounts num_accelerators;
};

namespace detail {

/// The variables of one launcher family: rank, world size, rank on this host.
struct LauncherVars {
  std::string_view rank;
  std::string_view size;
  std::string_view local_rank;
  std::string_view launcher;
};

// In this order: a process started by mpirun inside a torchrun job (or the reverse) reads the
// launcher closest to it, and MPI's variables are only ever set by MPI.
inline constexpr std::array<LauncherVars, 3> kLauncherVars = {{
    {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "Open MPI mpirun"},
    {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "PMI (MPICH / Intel MPI mpiexec)"},
    {"RANK", "WORLD_SIZE", "LOCAL_RANK", "torchrun"},
}};

inline const LauncherVars* find_launcher(const EnvReader& env) {
  for (const auto& vars : kLauncherVars) {
    if (env.has(vars.rank)) return &vars;
  }
  return nullptr;
}

}  // namespace detail

/// Resolves the cluster of processes started by a launcher that hands each one a rank and the
/// world size: Open MPI's mpirun (OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE), PMI launchers
/// such as MPICH's and Intel MPI's mpiexec (PMI_RANK / PMI_SIZE), or torchrun (RANK /
/// WORLD_SIZE), checked in that order. The rendezvous point comes from MASTER_ADDR and
/// MASTER_PORT (or LauncherOptions when unset).
///
/// These launchers say nothing about the other tasks' addresses, so by convention every task
/// is a worker and task i's address is MASTER_ADDR:(MASTER_PORT + port_offset + i): worker 0
/// (the chief) is reachable at the rendezvous address, and on one host every task has a port of
/// its own. Across hosts only the chief's entry is a real address of that task; transports
/// should rendezvous through master_address() and exchange real addresses there.
///
/// With one task and no MASTER_ADDR/MASTER_PORT the result is local mode (an empty spec, worker
/// 0). No launcher variables at all, a rank outside [0, size), a missing size, address or port
/// throw ClusterConfigError naming the variable.
class LauncherClusterResolver : public ClusterResolver {
 public:
  LauncherClusterResolver() : LauncherClusterResolver(LauncherOptions{}) {}
  explicit LauncherClusterResolver(LauncherOptions options) { init(std::move(options), detail::EnvReader{}); }
  /// Reads the variables from `env` instead of the process environment.
  LauncherClusterResolver(LauncherOptions options, const EnvVars& env) { init(std::move(options), detail::EnvReader{&env}); }

  /// True when the process environment (or `env`) has a launcher's rank variable.
  static bool detected() { return detail::find_launcher(detail::EnvReader{}) != nullptr; }
  static bool detected(const EnvVars& env) { return detail::find_launcher(detail::EnvReader{&env}) != nullptr; }

  const ClusterSpec& cluster_spec() const override { return spec_; }
  std::string task_type() const override { return "worker"; }
  int task_id() const override { return rank_; }
  std::string rpc_layer() const override { return rpc_layer_; }
  AcceleratorCounts num_accelerators() const override { return accelerators_; }

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  /// This process's rank on its host, when the launcher says (OMPI_COMM_WORLD_LOCAL_RANK,
  /// MPI_LOCALRANKID, LOCAL_RANK): handy to pick a GPU.
  std::optional<int> local_rank() const { return local_rank_; }
  /// The variable the rank came from: "OMPI_COMM_WORLD_RANK", "PMI_RANK" or "RANK".
  std::string_view rank_variable() const { return vars_->rank; }

 private:
  void init(LauncherOptions options, const detail::EnvReader& env) {
    constexpr std::string_view who = "LauncherClusterResolver";
    rpc_layer_ = std::move(options.rpc_layer);
    accelerators_ = std::move(options.num_accelerators);
    vars_ = detail::find_launcher(env);
    if (vars_ == nullptr) {
      throw ClusterConfigError(fmt::format(
          "{}: no launcher environment: none of OMPI_COMM_WORLD_RANK (mpirun), PMI_RANK (mpiexec) or RANK (torchrun) is "
          "set", who));
    }
    const std::string hint = fmt::format(" ({} sets it together with {}, which is set)", vars_->launcher, vars_->rank);
    world_size_ = detail::require_env_int(env, who, vars_->size, 1, 1'000'000, hint);
    rank_ = detail::require_env_int(env, who, vars_->rank, 0, INT_MAX);
    if (rank_ >= world_size_) {
      throw ClusterConfigError(fmt::format("{}: {}={} is out of range for {}={}", who, vars_->rank, rank_, vars_->size, world_size_));
    }
    if (env.has(vars_->local_rank)) local_rank_ = detail::require_env_int(env, who, vars_->local_rank, 0, INT_MAX);

    auto addr = env.get("MASTER_ADDR");
    if (!addr) addr = options.master_addr;
    std::optional<int> port;
    if (env.has("MASTER_PORT")) {
      port = detail::require_env_int(env, who, "MASTER_PORT", 1, 65535);
    } else if (options.master_port) {
      port = *options.master_port;
      if (*port < 1 || *port > 65535) {
        throw ClusterConfigError(fmt::format("{}: master_port {} is out of range [1, 65535]", who, *port));
      }
    }
    if (world_size_ == 1 && !addr && !port) return;  // one process and nobody to meet: local mode
    auto missing = [&](std::string_view name) {
      return ClusterConfigError(fmt::format(
          "{}: {} is not set; {} tasks ({}={}) need the chief's address in MASTER_ADDR and MASTER_PORT (mpirun: -x {}=...)",
          who, name, world_size_, vars_->size, world_size_, name));
    };
    if (!addr) throw missing("MASTER_ADDR");
    if (!port) throw missing("MASTER_PORT");
    if (options.port_offset < 0) throw ClusterConfigError(fmt::format("{}: port_offset {} is negative", who, options.port_offset));
    const std::int64_t last = static_cast<std::int64_t>(*port) + options.port_offset + world_size_ - 1;
    if (last > 65535) {
      throw ClusterConfigError(fmt::format("{}: MASTER_PORT={} + port_offset {} leaves no room for {} tasks: port {} is past 65535",
                                           who, *port, options.port_offset, world_size_, last));
    }
    std::string why;
    // MASTER_ADDR is a bare host; IPv6 hosts come without brackets, so HostPort adds them.
    const std::string master = HostPort{*addr, *port + options.port_offset}.to_string();
    if (addr->empty() || addr->front() == '[' || !detail::split_host_port(master, why)) {
      throw ClusterConfigError(fmt::format("{}: MASTER_ADDR='{}' is not a host name or IP address", who, *addr));
    }
    std::map<int, std::string> workers;
    for (int i = 0; i < world_size_; ++i) workers[i] = HostPort{*addr, *port + options.port_offset + i}.to_string();
    spec_ = ClusterSpec::from_sparse({{"worker", std::move(workers)}});
  }

  ClusterSpec spec_;
  int rank_ = 0;
  int world_size_ = 1;
  std::optional<int> local_rank_;
  const detail::LauncherVars* vars_ = nullptr;
  std::string rpc_layer_;
  AcceleratorCounts accelerators_;
};

DISTRIBUTE_END_NAMESPACE
#endif  // DISTRIBUTE_AMALGAMATED_DISTRIBUTE_CLUSTER_LAUNCHER_HPP
// ---- end <distribute/cluster/launcher.hpp> ----
#endif
// ---- end <distribute/distribute.hpp> ----

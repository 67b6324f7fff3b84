// DLPack tensors in and out: the exchange format of PyTorch, JAX, TensorFlow, CuPy and NumPy.
//
//   ds::dlpack::Tensor t = ds::dlpack::from_dlpack(managed);  // takes ownership (torch.to_dlpack)
//   ds::dlpack::Tensor v = ds::dlpack::borrow(dl_tensor);     // elements stay the caller's
//   auto sum = ctx.all_reduce(ds::ReduceOp::Sum, t);          // any collective, strategy, Variable
//   DLManagedTensor* out = ds::dlpack::to_dlpack(sum);        // for torch.from_dlpack & co
//
// Copies of a Tensor share their elements (as torch::Tensor's do); clone() is a deep copy. The
// collectives copy lvalues first and work in place on rvalues, so an rvalue borrowed or adopted
// tensor is reduced in the producer's own memory.
//
// Element types: float 16/32/64, bfloat 16, int and uint 8/16/32/64, bool (kDLBool where this
// DLPack has it); one lane. DLPack's uint8 cannot be told apart from the bool older PyTorch
// exported as uint8: it is read as uint8. Others are refused with InvalidArgument when the tensor
// is used. Tensors on kDLCPU, kDLCUDAHost or kDLROCMHost are host memory; any other device is
// reported as device memory, which the host collectives refuse with a message.
//
// Needs <dlpack/dlpack.h> (Debian: libdlpack-dev); not included by <distribute/distribute.hpp>.
#pragma once

#include <dlpack/dlpack.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <typeinfo>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/dtype.hpp>
#include <distribute/core/error.hpp>
#include <distribute/core/memory_space.hpp>
#include <distribute/core/shape.hpp>
#include <distribute/core/tensor_traits.hpp>
#include <distribute/core/tensor_view.hpp>

// kDLBool arrived in DLPack 0.8 (DLPACK_VERSION 80); 1.0 replaced DLPACK_VERSION by MAJOR/MINOR.
#if defined(DLPACK_MAJOR_VERSION) || (defined(DLPACK_VERSION) && DLPACK_VERSION >= 80)
#define DISTRIBUTE_DLPACK_HAS_BOOL 1
#else
#define DISTRIBUTE_DLPACK_HAS_BOOL 0
#endif

DISTRIBUTE_BEGIN_NAMESPACE
namespace adapters::detail {



inline const char* type_code_name(std::uint8_t code) noexcept {
  switch (code) {
    case kDLInt: return "int";
    case kDLUInt: return "uint";
    case kDLFloat: return "float";
    case kDLOpaqueHandle: return "opaque handle";
    case kDLBfloat: return "bfloat";
    case kDLComplex: return "complex";
#if DISTRIBUTE_DLPACK_HAS_BOOL
    case kDLBool: return "bool";
#endif
    default: return "unknown";
  }
}

/// The device type as the integer the producer wrote, read without loading it as the enum: a
/// value outside the enumerators' range would be undefined behaviour to load.
inline std::int32_t raw_device_type(const DLDevice& device) noexcept {
  static_assert(sizeof(device.device_type) == sizeof(std::int32_t), "DLDeviceType is a 32-bit enum");
  std::int32_t raw = 0;
  std::memcpy(&raw, &device.device_type, sizeof raw);
  return raw;
}

/// The name of a device type this DLPack knows, or "unknown device type".
inline const char* device_name(std::int32_t type) noexcept {
  switch (type) {
    case kDLCPU: return "kDLCPU";
    case kDLCUDA: return "kDLCUDA";
    case kDLCUDAHost: return "kDLCUDAHost";
    case kDLOpenCL: return "kDLOpenCL";
    case kDLVulkan: return "kDLVulkan";
    case kDLMetal: return "kDLMetal";
    case kDLVPI: return "kDLVPI";
    case kDLROCM: return "kDLROCM";
    case kDLROCMHost: return "kDLROCMHost";
    case kDLExtDev: return "kDLExtDev";
    case kDLCUDAManaged: return "kDLCUDAManaged";
    default: return "unknown device type";
  }
}

/// "kDLCUDA:1" (or "device type 42:0"), for messages.
inline std::string device_string(DLDevice device) {
  const std::int32_t raw = raw_device_type(device);
  const char* name = device_name(raw);
  if (std::strcmp(name, "unknown device type") == 0) return fmt::format("device type {}:{}", raw, device.device_id);
  return fmt::format("{}:{}", name, device.device_id);
}

/// "type code 5 (complex), 64 bits, 1 lane", for messages.
inline std::string dtype_string(DLDataType t) {
  return fmt::format("type code {} ({}), {} bits, {} lane{}", t.code, type_code_name(t.code), t.bits, t.lanes,
                     t.lanes == 1 ? "" : "s");
}

/// Pinned host memory (cudaMallocHost, hipMallocHost) is ordinary host memory to the CPU. Any
/// other type, one this DLPack does not name included, is a device's memory.
inline bool is_host_device(const DLDevice& device) noexcept {
  const std::int32_t type = raw_device_type(device);
  return type == kDLCPU || type == kDLCUDAHost || type == kDLROCMHost;
}

/// a * b for non-negative sizes, or an InvalidArgument naming `what` when it exceeds int64.
inline std::int64_t checked_mul(std::int64_t a, std::int64_t b, const char* what) {
  std::int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) {
    throw InvalidArgument(fmt::format("DLPack tensor: {} overflows a 64-bit size ({} * {})", what, a, b));
  }
  return out;
}

inline std::int64_t checked_add(std::int64_t a, std::int64_t b, const char* what) {
  std::int64_t out = 0;
  if (__builtin_add_overflow(a, b, &out)) {
    throw InvalidArgument(fmt::format("DLPack tensor: {} overflows a 64-bit size ({} + {})", what, a, b));
  }
  return out;
}

/// Elements aligned to 256 bytes, as DLPack asks of the tensors it describes.
struct AlignedFree {
  void operator()(std::byte* p) const noexcept { ::operator delete(p, std::align_val_t{256}); }
};
using AlignedBytes = std::unique_ptr<std::byte, AlignedFree>;

inline AlignedBytes allocate_zeroed(std::size_t bytes) {
  AlignedBytes out;
  try {
    out.reset(static_cast<std::byte*>(::operator new(bytes == 0 ? 1 : bytes, std::align_val_t{256})));
  } catch (const std::bad_alloc&) {
    // A broadcast view (stride 0) can stand for far more elements than its memory holds.
    throw InvalidArgument(fmt::format("DLPack tensor: {} bytes of elements cannot be allocated", bytes));
  }
  std::memset(out.get(), 0, bytes);
  return out;
}

/// What the copies of one Tensor share: the DLTensor they describe and whatever keeps its
/// elements alive (a producer's DLManagedTensor, or elements this library allocated).
struct State {
  DLTensor tensor{};
  std::vector<std::int64_t> shape, strides;  // tensor.shape / tensor.strides point here
  DLManagedTensor* owned = nullptr;          // released through its deleter with the last copy
  AlignedBytes storage;                      // elements allocated here (make, clone)
  std::optional<DType> dtype;                // set where this library chose it (Bool on DLPack < 0.8)

  State() = default;
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  ~State() {
    if (owned && owned->deleter) owned->deleter(owned);
  }
};

/// A DLManagedTensor handed out by to_dlpack: it keeps the shared State alive until its deleter runs.
struct Exported {
  DLManagedTensor managed{};
  std::vector<std::int64_t> shape, strides;
  std::shared_ptr<const State> state;
};

}  // namespace adapters::detail

namespace dlpack {

/// The ds::DType of a DLPack element type; InvalidArgument naming the code, bits and lanes for
/// types the library has none for.
inline DType to_dtype(DLDataType t) {
  auto refuse = [&](const char* why) {
    return InvalidArgument(fmt::format("DLPack dtype {} is not supported{}; supported: float 16/32/64, bfloat 16, "
                                       "int and uint 8/16/32/64, bool, with 1 lane",
                                       adapters::detail::dtype_string(t), why));
  };
  if (t.lanes != 1) throw refuse(" (vector types are not)");
  switch (t.code) {
    case kDLFloat:
      if (t.bits == 16) return DType::F16;
      if (t.bits == 32) return DType::F32;
      if (t.bits == 64) return DType::F64;
      break;
    case kDLBfloat:
      if (t.bits == 16) return DType::BF16;
      break;
    case kDLInt:
      if (t.bits == 8) return DType::I8;
      if (t.bits == 16) return DType::I16;
      if (t.bits == 32) return DType::I32;
      if (t.bits == 64) return DType::I64;
      break;
    case kDLUInt:
      if (t.bits == 8) return DType::U8;
      if (t.bits == 16) return DType::U16;
      if (t.bits == 32) return DType::U32;
      if (t.bits == 64) return DType::U64;
      break;
#if DISTRIBUTE_DLPACK_HAS_BOOL
    case kDLBool:
      if (t.bits == 8) return DType::Bool;
      break;
#endif
    default: break;
  }
  throw refuse("");
}

/// The DLPack element type of a DType. Bool is kDLBool where this DLPack has it, else uint8, the
/// way PyTorch exported bool before kDLBool existed.
inline DLDataType to_dl_dtype(DType d) noexcept {
  auto of = [](DLDataTypeCode code, std::size_t bytes) {
    return DLDataType{static_cast<std::uint8_t>(code), static_cast<std::uint8_t>(bytes * 8), 1};
  };
  switch (d) {
    case DType::F16: case DType::F32: case DType::F64: return of(kDLFloat, size_of(d));
    case DType::BF16: return of(kDLBfloat, 2);
    case DType::I8: case DType::I16: case DType::I32: case DType::I64: return of(kDLInt, size_of(d));
    case DType::U8: case DType::U16: case DType::U32: case DType::U64: return of(kDLUInt, size_of(d));
#if DISTRIBUTE_DLPACK_HAS_BOOL
    case DType::Bool: return of(kDLBool, 1);
#else
    case DType::Bool: return of(kDLUInt, 1);
#endif
  }
  return of(kDLFloat, 4);
}

class Tensor;
Tensor from_dlpack(DLManagedTensor* managed);
Tensor borrow(const DLTensor& tensor);
DLManagedTensor* to_dlpack(const Tensor& tensor);

/// A DLPack tensor as a value the library can reduce, gather, broadcast and hold in variables.
class Tensor {
 public:
  /// An empty float32 tensor of shape (0,).
  Tensor() : Tensor(zeros(DType::F32, {0})) {}

  /// A zeroed, row-major tensor in new CPU memory.
  static Tensor zeros(DType dtype, const Shape& shape) {
    auto state = std::make_shared<adapters::detail::State>();
    std::int64_t count = 1;
    for (std::int64_t d : shape) {
      if (d < 0) throw InvalidArgument(fmt::format("DLPack tensor: negative dimension in shape {}", shape_string(shape)));
      count = adapters::detail::checked_mul(count, d, "the element count");
    }
    const std::int64_t bytes = adapters::detail::checked_mul(count, static_cast<std::int64_t>(size_of(dtype)), "the byte size");
    state->storage = adapters::detail::allocate_zeroed(static_cast<std::size_t>(bytes));
    state->shape = shape;
    state->dtype = dtype;
    state->tensor.data = state->storage.get();
    state->tensor.device = DLDevice{kDLCPU, 0};
    state->tensor.dtype = to_dl_dtype(dtype);
    state->tensor.ndim = static_cast<int>(shape.size());
    state->tensor.shape = state->shape.empty() ? nullptr : state->shape.data();
    state->tensor.strides = nullptr;
    state->tensor.byte_offset = 0;
    return Tensor(std::move(state));
  }

  /// A row-major CPU tensor holding `values`; their count must match the shape's.
  template <Element T>
  static Tensor from_values(const Shape& shape, const std::vector<T>& values) {
    Tensor t = zeros(dtype_of<T>(), shape);
    if (static_cast<std::size_t>(num_elements(t.shape())) != values.size()) {
      throw InvalidArgument(fmt::format("DLPack tensor: shape {} holds {} elements but {} values were given",
                                        shape_string(shape), num_elements(shape), values.size()));
    }
    if (!values.empty()) std::memcpy(t.data(), values.data(), values.size() * sizeof(T));
    return t;
  }

  /// The DLTensor this value describes (its shape and strides arrays are this value's copies).
  const DLTensor& dl_tensor() const noexcept { return state_->tensor; }

  /// The element type; InvalidArgument for DLPack types the library does not support.
  DType dtype() const { return state_->dtype ? *state_->dtype : to_dtype(state_->tensor.dtype); }
  Shape shape() const { return state_->shape; }
  /// In elements; empty where the producer gave none (row-major contiguous).
  Strides strides() const { return state_->strides; }
  /// The first element (the DLTensor's data plus its byte_offset).
  void* data() const noexcept {
    if (state_->tensor.data == nullptr) return nullptr;  // an empty tensor's; no offset applies
    return static_cast<std::byte*>(state_->tensor.data) + state_->tensor.byte_offset;
  }
  DLDevice device() const noexcept { return state_->tensor.device; }
  /// Whether the CPU can read the elements (kDLCPU, or pinned host memory).
  bool is_host() const noexcept { return adapters::detail::is_host_device(state_->tensor.device); }

  /// How the library sees it: data, dtype, shape, strides, host or device memory.
  TensorView view() const {
    TensorView v{data(), dtype(), state_->shape, state_->strides};
    v.memory = is_host() ? MemorySpace::host : MemorySpace::device;
    return v;
  }

  /// An independent row-major copy in new CPU memory.
  Tensor clone() const {
    require_host("clone");
    const TensorView v = view();
    check_view(v, typeid(dlpack::Tensor));
    Tensor out = zeros(v.dtype, v.shape);
    copy_to_contiguous(v, out.data());
    return out;
  }

  /// The elements in row-major logical order; T must be the tensor's element type.
  template <Element T>
  std::vector<T> to_vector() const {
    require_host("to_vector");
    const TensorView v = view();
    if (v.dtype != dtype_of<T>()) {
      throw InvalidArgument(fmt::format("DLPack tensor: to_vector<{}> of a {} tensor", to_string(dtype_of<T>()),
                                        to_string(v.dtype)));
    }
    check_view(v, typeid(dlpack::Tensor));
    std::vector<T> out(v.count());
    copy_to_contiguous(v, out.data());
    return out;
  }

  /// Whether two values share one DLTensor (copies of each other).
  bool shares_with(const Tensor& other) const noexcept { return state_ == other.state_; }

 private:
  friend Tensor from_dlpack(DLManagedTensor* managed);
  friend Tensor borrow(const DLTensor& tensor);
  friend DLManagedTensor* to_dlpack(const Tensor& tensor);

  explicit Tensor(std::shared_ptr<adapters::detail::State> state) : state_(std::move(state)) {}

  // Copies the producer's description and checks it; the elements are not touched.
  static Tensor from_description(const DLTensor& in, std::shared_ptr<adapters::detail::State> state) {
    if (in.ndim < 0) throw InvalidArgument(fmt::format("DLPack tensor: negative ndim {}", in.ndim));
    if (in.ndim > 0 && in.shape == nullptr) {
      throw InvalidArgument(fmt::format("DLPack tensor: ndim is {} but shape is null", in.ndim));
    }
    if (in.byte_offset > static_cast<std::uint64_t>(std::numeric_limits<std::ptrdiff_t>::max())) {
      throw InvalidArgument(fmt::format("DLPack tensor: byte_offset {} is beyond any address", in.byte_offset));
    }
    const auto rank = static_cast<std::size_t>(in.ndim);
    state->shape.assign(in.shape, in.shape + rank);
    if (in.strides != nullptr) state->strides.assign(in.strides, in.strides + rank);
    std::int64_t count = 1, last = 0;  // `last`: the farthest element's offset, in elements
    for (std::size_t d = 0; d < rank; ++d) {
      if (state->shape[d] < 0) {
        throw InvalidArgument(fmt::format("DLPack tensor: negative dimension in shape {}", shape_string(state->shape)));
      }
      count = adapters::detail::checked_mul(count, state->shape[d], "the element count");
    }
    for (std::size_t d = 0; d < state->strides.size(); ++d) {
      if (state->strides[d] < 0) {
        throw InvalidArgument(fmt::format("DLPack tensor: negative stride in strides {} (shape {}); make a contiguous "
                                          "copy first",
                                          shape_string(state->strides), shape_string(state->shape)));
      }
      if (count > 0) {
        last = adapters::detail::checked_add(last, adapters::detail::checked_mul(state->shape[d] - 1, state->strides[d], "a stride's extent"),
                                   "the strides' extent");
      }
    }
    if (state->strides.empty() && count > 0) last = count - 1;
    // Every byte the elements span must be addressable with 64-bit offsets.
    const std::int64_t element_bytes = (std::int64_t{in.dtype.bits} * in.dtype.lanes + 7) / 8;
    adapters::detail::checked_mul(adapters::detail::checked_add(last, 1, "the extent"), element_bytes, "the byte extent");
    if (in.data == nullptr && count > 0) {
      throw InvalidArgument(fmt::format("DLPack tensor: data is null for a tensor of shape {}", shape_string(state->shape)));
    }
    // Elements are loaded as their type: the first must sit at a multiple of its size.
    if (count > 0 && element_bytes > 1 &&
        (reinterpret_cast<std::uintptr_t>(in.data) + in.byte_offset) % static_cast<std::uint64_t>(element_bytes) != 0) {
      throw InvalidArgument(fmt::format("DLPack tensor: byte_offset {} puts the first element at {}, not aligned to its "
                                        "{}-byte elements; copy it into aligned memory first",
                                        in.byte_offset, static_cast<const void*>(static_cast<const std::byte*>(in.data) + in.byte_offset),
                                        element_bytes));
    }
    state->tensor = in;
    state->tensor.shape = state->shape.empty() ? nullptr : state->shape.data();
    state->tensor.strides = state->strides.empty() ? nullptr : state->strides.data();
    return Tensor(std::move(state));
  }

  void require_host(const char* what) const {
    if (!is_host()) {
      throw InvalidArgument(fmt::format("DLPack tensor: {} needs host memory but the elements are on {}; copy them "
                                        "to the CPU first (e.g. tensor.cpu() in PyTorch)",
                                        what, adapters::detail::device_string(device())));
    }
  }

  std::shared_ptr<adapters::detail::State> state_;
};

/// Takes ownership of a producer's tensor (what torch.utils.dlpack.to_dlpack, jax.dlpack.to_dlpack,
/// ... hand out): its deleter runs when the last copy is gone, or at once if it is refused.
inline Tensor from_dlpack(DLManagedTensor* managed) {
  if (managed == nullptr) throw InvalidArgument("from_dlpack: the DLManagedTensor is null");
  auto state = std::make_shared<adapters::detail::State>();
  state->owned = managed;
  return Tensor::from_description(managed->dl_tensor, std::move(state));
}

/// Describes memory the caller keeps alive (and owns) for as long as the Tensor and its copies
/// are used; shape and strides are copied.
inline Tensor borrow(const DLTensor& tensor) { return Tensor::from_description(tensor, std::make_shared<adapters::detail::State>()); }

/// A DLManagedTensor sharing `tensor`'s elements, for a consumer (torch.utils.dlpack.from_dlpack,
/// ...) that calls its deleter when done; it keeps them alive until then. Strides are always
/// given (row-major when the tensor has none), as DLPack 1.0 asks of producers.
inline DLManagedTensor* to_dlpack(const Tensor& tensor) {
  auto exported = std::make_unique<adapters::detail::Exported>();
  const adapters::detail::State& state = *tensor.state_;
  exported->state = tensor.state_;
  exported->shape = state.shape;
  exported->strides = state.strides.empty() ? row_major_strides(state.shape) : state.strides;
  DLTensor& out = exported->managed.dl_tensor;
  out = state.tensor;
  if (state.dtype) out.dtype = to_dl_dtype(*state.dtype);
  out.shape = exported->shape.empty() ? nullptr : exported->shape.data();
  out.strides = exported->strides.empty() ? nullptr : exported->strides.data();
  exported->managed.manager_ctx = exported.get();
  exported->managed.deleter = [](DLManagedTensor* self) { delete static_cast<adapters::detail::Exported*>(self->manager_ctx); };
  return &exported.release()->managed;
}

}  // namespace dlpack

/// DLPack tensors through tensor_traits' run-time form: gathers give dlpack::Tensor in CPU memory.
template <>
struct tensor_traits<dlpack::Tensor> {
  static TensorView view(const dlpack::Tensor& t) { return t.view(); }
  static dlpack::Tensor make(DType dtype, const Shape& shape) { return dlpack::Tensor::zeros(dtype, shape); }
  static dlpack::Tensor clone(const dlpack::Tensor& t) { return t.clone(); }
};

DISTRIBUTE_END_NAMESPACE

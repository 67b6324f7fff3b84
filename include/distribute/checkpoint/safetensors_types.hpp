// The data model of a safetensors file (checkpoint/safetensors.hpp reads and writes it): the
// dtype names the format uses, views of tensors to write, the tensors and metadata read.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/dtype.hpp>
#include <distribute/core/error.hpp>
#include <distribute/core/shape.hpp>
#include <distribute/core/tensor.hpp>
#include <distribute/core/tensor_traits.hpp>
#include <distribute/core/tensor_view.hpp>

static_assert(std::endian::native == std::endian::little,
              "distribute/checkpoint: safetensors payloads are little-endian; big-endian hosts are not supported");

DISTRIBUTE_BEGIN_NAMESPACE

namespace safetensors {

/// A dtype as the file spells it: "F32", "BF16", "BOOL", ... (the element types are ds::DType;
/// this is only their name in a safetensors header).
constexpr std::string_view dtype_name(DType d) noexcept {
  switch (d) {
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::F32: return "F32";
    case DType::F64: return "F64";
    case DType::I8: return "I8";
    case DType::I16: return "I16";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::U8: return "U8";
    case DType::U16: return "U16";
    case DType::U32: return "U32";
    case DType::U64: return "U64";
    case DType::Bool: return "BOOL";
  }
  return {};  // a DType with no safetensors name: parse_dtype never returns it
}

/// The DType a header's "dtype" string names; none for a name distribute does not know
/// ("F8_E4M3", "I4", ...).
constexpr std::optional<DType> parse_dtype(std::string_view name) noexcept {
  if (name.empty()) return std::nullopt;
  for (std::uint8_t code = 0; code < kNumDTypes; ++code) {
    const auto d = static_cast<DType>(code);
    if (dtype_name(d) == name) return d;
  }
  return std::nullopt;
}

/// For messages: "F16 (float16)", the file's name and the library's.
inline std::string describe(DType d) { return fmt::format("{} ({})", dtype_name(d), distribute::to_string(d)); }

/// Borrowed bytes of one tensor to write: the caller keeps them alive during the write.
struct TensorView {
  DType dtype = DType::F32;
  Shape shape;
  std::span<const std::byte> bytes;

  /// A view of `data` (row-major) as a tensor of `shape`; the element count must match.
  template <Element T>
  static TensorView of(Shape shape, std::span<const T> data) {
    for (auto d : shape) {
      if (d < 0) throw InvalidArgument(fmt::format("safetensors: negative dimension in shape {}", shape_string(shape)));
    }
    if (num_elements(shape) != static_cast<std::int64_t>(data.size())) {
      throw InvalidArgument(fmt::format("safetensors: shape {} holds {} elements but {} were given",
                                        shape_string(shape), num_elements(shape), data.size()));
    }
    return TensorView{dtype_of<T>(), std::move(shape), std::as_bytes(data)};
  }
};

/// A view of any host TensorLike value (a scalar, std::vector, ds::Tensor, a user type, one whose
/// dtype is known at run time) whose elements are row-major contiguous, as the file stores them:
/// its bytes are borrowed, not copied.
template <TensorLike U>
TensorView view_of(const U& value) {
  static_assert(memory_space_v<U> == MemorySpace::host,
                "safetensors::view_of: the value lives in device memory; copy it to the host first");
  const distribute::TensorView v = distribute::view_of(value);
  if (v.memory != MemorySpace::host) {
    throw InvalidArgument(fmt::format("safetensors::view_of: the {} value lives in device memory; copy it to the "
                                      "host first",
                                      distribute::describe(v)));
  }
  if (!v.contiguous()) {
    throw InvalidArgument(fmt::format("safetensors::view_of: the {} value is not row-major contiguous, as a "
                                      "safetensors file stores tensors; pass a contiguous copy",
                                      distribute::describe(v)));
  }
  return TensorView{v.dtype, v.shape, std::span<const std::byte>(static_cast<const std::byte*>(v.data), v.bytes())};
}

/// One tensor read from a file (owns its bytes).
struct StoredTensor {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  std::vector<std::byte> bytes;

  std::int64_t num_elements() const { return distribute::num_elements(shape); }
  TensorView view() const { return TensorView{dtype, shape, bytes}; }

  /// The elements as T, which must be exactly the stored dtype: F16 is not read as float, nor
  /// I32 as I64 (a silent conversion would hide a mismatch between a file and its reader).
  template <Element T>
  std::vector<T> values() const {
    check_dtype(dtype_of<T>());
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

  void check_dtype(DType wanted) const {
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

}  // namespace safetensors

DISTRIBUTE_END_NAMESPACE

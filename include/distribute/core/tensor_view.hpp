// TensorView: the run-time description of one tensor's memory (element type, shape, strides,
// memory space) that the collectives, packing and variables work on. Every value type reaches
// the library through one: a compile-time tensor_traits builds it from its static element type,
// a run-time one (libtorch, DLPack) returns it directly.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <typeinfo>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/type_name.hpp>
#include <distribute/core/dtype.hpp>
#include <distribute/core/error.hpp>
#include <distribute/core/memory_space.hpp>
#include <distribute/core/shape.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

/// Elements (not bytes) between neighbours along each axis, as torch's strides() and numpy's
/// strides / itemsize. Non-negative.
using Strides = std::vector<std::int64_t>;

/// The strides of a row-major contiguous tensor of `shape`.
inline Strides row_major_strides(const Shape& shape) {
  Strides s(shape.size());
  std::int64_t step = 1;
  for (std::size_t d = shape.size(); d-- > 0;) {
    s[d] = step;
    step *= shape[d] > 0 ? shape[d] : 1;
  }
  return s;
}

/// A tensor's memory as the library sees it. Views do not own: the value they were taken from
/// must outlive them.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::F32;
  Shape shape = {};
  /// Empty means row-major contiguous (the common case, and what make() must return).
  Strides strides = {};
  MemorySpace memory = MemorySpace::host;

  std::size_t count() const { return static_cast<std::size_t>(num_elements(shape)); }
  /// The bytes of its elements (as a contiguous buffer would hold them).
  std::size_t bytes() const { return count() * size_of(dtype); }

  /// Whether its elements lie in row-major order with no gaps. Axes of size 1 may have any
  /// stride (torch reports several for them); an empty tensor is contiguous.
  bool contiguous() const {
    if (strides.empty()) return true;
    std::int64_t step = 1;
    for (std::size_t d = shape.size(); d-- > 0;) {
      if (shape[d] == 0) return true;
      if (shape[d] != 1 && strides[d] != step) return false;
      step *= shape[d];
    }
    return true;
  }
};

/// "float32 (2, 3)" or "float32 (2, 3) strides (1, 2)", for messages.
DISTRIBUTE_DECL std::string describe(const TensorView& v);
/// Checks what a tensor_traits returned: strides match the shape's rank and are non-negative, and
/// the first element is aligned to the element size (elements are loaded as their type).
/// `type` names the value type in the message (demangled only when there is one to give).
DISTRIBUTE_DECL void check_view(const TensorView& v, const std::type_info& type);

#if DISTRIBUTE_DETAIL_DEFINE  // compiled apart with DISTRIBUTE_SEPARATE_COMPILATION (version.hpp)
DISTRIBUTE_DECL std::string describe(const TensorView& v) {
  if (v.strides.empty()) return fmt::format("{} {}", to_string(v.dtype), shape_string(v.shape));
  return fmt::format("{} {} strides {}", to_string(v.dtype), shape_string(v.shape), shape_string(v.strides));
}

DISTRIBUTE_DECL void check_view(const TensorView& v, const std::type_info& type) {
  if (!v.strides.empty() && v.strides.size() != v.shape.size()) {
    throw InvalidArgument(fmt::format("tensor_traits<{}>::view gave {} strides for a tensor of rank {}",
                                      core::type_name(type), v.strides.size(), v.shape.size()));
  }
  for (std::size_t d = 0; d < v.shape.size(); ++d) {
    if (v.shape[d] < 0) {
      throw InvalidArgument(fmt::format("tensor_traits<{}>: negative dimension in shape {}", core::type_name(type),
                                        shape_string(v.shape)));
    }
    if (!v.strides.empty() && v.strides[d] < 0) {
      throw InvalidArgument(fmt::format("tensor_traits<{}>: negative stride in {}; flip the tensor into a "
                                        "contiguous copy first",
                                        core::type_name(type), describe(v)));
    }
  }
  const std::size_t align = size_of(v.dtype);
  if (reinterpret_cast<std::uintptr_t>(v.data) % align != 0 && v.count() > 0) {
    throw InvalidArgument(fmt::format("tensor_traits<{}>: the first element of a {} value is at address {}, not aligned "
                                      "to its {}-byte elements; copy it into aligned memory first",
                                      core::type_name(type), describe(v), v.data, align));
  }
}

#endif  // DISTRIBUTE_DETAIL_DEFINE
namespace core::detail {

/// The bytes [first, last) a view's elements lie in (its gaps included); empty for no elements.
inline std::pair<const std::byte*, const std::byte*> extent(const TensorView& v) {
  const auto* first = static_cast<const std::byte*>(v.data);
  if (v.count() == 0) return {first, first};
  if (v.strides.empty()) return {first, first + v.bytes()};
  std::int64_t last = 0;
  for (std::size_t d = 0; d < v.shape.size(); ++d) last += (v.shape[d] - 1) * v.strides[d];
  return {first, first + (static_cast<std::size_t>(last) + 1) * size_of(v.dtype)};
}

/// Whether two views share a byte of memory.
inline bool overlap(const TensorView& a, const TensorView& b) {
  const auto [a0, a1] = extent(a);
  const auto [b0, b1] = extent(b);
  return a0 < b1 && b0 < a1;
}

/// Whether two views of one dtype and shape are the same elements (the same memory and layout).
inline bool same_elements(const TensorView& a, const TensorView& b) {
  if (a.data != b.data || a.dtype != b.dtype || a.shape != b.shape) return false;
  return (a.contiguous() && b.contiguous()) || a.strides == b.strides;
}

/// An axis along which two of a view's elements may share memory, if there is one: sorted by
/// stride, every axis of more than one element must step past all that the smaller axes reach
/// (a sufficient test; an exotic interleaving that does not overlap is reported too).
inline std::optional<std::size_t> overlapping_axis(const TensorView& v) {
  if (v.strides.empty() || v.count() == 0) return std::nullopt;
  std::vector<std::size_t> axes;
  for (std::size_t d = 0; d < v.shape.size(); ++d) {
    if (v.shape[d] > 1) axes.push_back(d);
  }
  std::stable_sort(axes.begin(), axes.end(), [&](std::size_t a, std::size_t b) { return v.strides[a] < v.strides[b]; });
  std::int64_t reach = 1;  // elements the axes so far span: their largest offset, plus one
  for (std::size_t d : axes) {
    if (v.strides[d] < reach) return d;
    std::int64_t step = 0;
    if (__builtin_mul_overflow(v.strides[d], v.shape[d] - 1, &step) || __builtin_add_overflow(reach, step, &reach)) {
      return std::nullopt;  // the next axis, if any, steps past it only beyond 64-bit offsets
    }
  }
  return std::nullopt;
}

// Walks the elements of a strided view in row-major order, calling run(offset_in_elements, len)
// for each run of elements contiguous in memory (the innermost axis when its stride is 1).
template <class Run>
void for_each_run(const TensorView& v, Run&& run) {
  const std::size_t rank = v.shape.size();
  if (v.count() == 0) return;
  if (rank == 0 || v.contiguous()) return run(std::int64_t{0}, v.count(), std::int64_t{1});
  const std::int64_t inner = v.shape[rank - 1], inner_stride = v.strides[rank - 1];
  std::vector<std::int64_t> index(rank - 1, 0);
  for (;;) {
    std::int64_t offset = 0;
    for (std::size_t d = 0; d + 1 < rank; ++d) offset += index[d] * v.strides[d];
    run(offset, static_cast<std::size_t>(inner), inner_stride);
    std::size_t d = rank - 1;
    while (d-- > 0) {
      if (++index[d] < v.shape[d]) break;
      index[d] = 0;
    }
    if (d == static_cast<std::size_t>(-1)) return;
  }
}

}  // namespace core::detail

/// Copies a view's elements, in row-major order, into `out` (view.bytes() bytes).
DISTRIBUTE_DECL void copy_to_contiguous(const TensorView& v, void* out);
/// Copies row-major contiguous elements from `in` into the view's memory, wherever its strides put them.
DISTRIBUTE_DECL void copy_from_contiguous(const void* in, const TensorView& v);

#if DISTRIBUTE_DETAIL_DEFINE  // compiled apart with DISTRIBUTE_SEPARATE_COMPILATION (version.hpp)
DISTRIBUTE_DECL void copy_to_contiguous(const TensorView& v, void* out) {
  const std::size_t es = size_of(v.dtype);
  auto* dst = static_cast<std::byte*>(out);
  const auto* base = static_cast<const std::byte*>(v.data);
  core::detail::for_each_run(v, [&](std::int64_t offset, std::size_t len, std::int64_t stride) {
    const std::byte* src = base + offset * static_cast<std::int64_t>(es);
    if (stride == 1) {
      std::memcpy(dst, src, len * es);
      dst += len * es;
    } else {
      for (std::size_t i = 0; i < len; ++i, dst += es) std::memcpy(dst, src + i * stride * es, es);
    }
  });
}

DISTRIBUTE_DECL void copy_from_contiguous(const void* in, const TensorView& v) {
  const std::size_t es = size_of(v.dtype);
  const auto* src = static_cast<const std::byte*>(in);
  auto* base = static_cast<std::byte*>(v.data);
  core::detail::for_each_run(v, [&](std::int64_t offset, std::size_t len, std::int64_t stride) {
    std::byte* dst = base + offset * static_cast<std::int64_t>(es);
    if (stride == 1) {
      std::memcpy(dst, src, len * es);
      src += len * es;
    } else {
      for (std::size_t i = 0; i < len; ++i, src += es) std::memcpy(dst + i * stride * es, src, es);
    }
  });
}

#endif  // DISTRIBUTE_DETAIL_DEFINE
DISTRIBUTE_END_NAMESPACE

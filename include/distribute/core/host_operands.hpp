// The values of one collective call as contiguous host buffers: a value whose memory is row-major
// contiguous is used in place; any other (a transposed view, a column-major matrix) is copied into
// row-major order first and, for collectives that write, copied back after. So every collective
// sees the logical, row-major element order whatever the layout of the values it was given.
#pragma once

#include <cstddef>
#include <cstring>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/replica_group.hpp>
#include <distribute/core/error.hpp>
#include <distribute/core/tensor_traits.hpp>
#include <distribute/core/tensor_view.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace core {

class HostOperands {
 public:
  explicit HostOperands(const char* what) : what_(what) {}

  /// Adds a value's view; `i`-th added is buffers()[i]. write_back() leaves `read_only` ones alone.
  void add(TensorView v, bool read_only = false);

  /// Refuses a value in device memory (which only the device strategies' collectives take).
  void check_host(const TensorView& v) const {
    if (v.memory != MemorySpace::host) {
      throw InvalidArgument(fmt::format("{}: a {} value in device memory cannot go through the host collectives; "
                                        "use a strategy of the device's backend",
                                        what_, describe(v)));
    }
  }

  /// Adds `out` for a collective that reads `in` (the same dtype and shape) and writes `out`: when
  /// `read_source` and `in` is row-major contiguous host memory, the collective reads it where it is
  /// (BufferRef::source); else `in` is copied first into the memory the collective writes. Both
  /// in host memory, as add() requires.
  void add_out_of_place(const TensorView& in, TensorView out, bool read_source) {
    check_host(in);
    add(std::move(out));
    BufferRef& ref = buffers_.back();
    if (read_source && in.memory == MemorySpace::host && in.contiguous()) {
      ref.source = in.data;
    } else if (ref.bytes() > 0) {
      copy_to_contiguous(in, ref.data);
    }
  }

  /// The same for values whose elements are row-major contiguous in host memory (known from their
  /// type): `in` points at the input's elements, `out` is the result's buffer.
  void add_out_of_place(const void* in, BufferRef out, bool read_source) {
    if (read_source) out.source = in;
    else if (out.bytes() > 0) std::memcpy(out.data, in, out.bytes());
    buffers_.push_back(std::move(out));
  }

  /// Adds a buffer built elsewhere (device memory, see core/memory_space.hpp).
  void add(BufferRef ref) { buffers_.push_back(std::move(ref)); }

  std::vector<BufferRef>& buffers() noexcept { return buffers_; }
  BufferRef& operator[](std::size_t i) noexcept { return buffers_[i]; }

  /// Copies the results of staged values back into their own (strided) memory.
  void write_back() const {
    for (const Staged& s : staged_) {
      if (!s.read_only) copy_from_contiguous(s.bytes.data(), s.view);
    }
  }

 private:
  struct Staged {
    std::size_t index;
    TensorView view;
    std::vector<std::byte> bytes;
    bool read_only;
  };
  const char* what_;
  std::vector<BufferRef> buffers_;
  std::vector<Staged> staged_;
};

#if DISTRIBUTE_DETAIL_DEFINE  // compiled apart with DISTRIBUTE_SEPARATE_COMPILATION (version.hpp)
DISTRIBUTE_DECL void HostOperands::add(TensorView v, bool read_only) {
  check_host(v);
  if (!read_only) {
    if (const std::optional<std::size_t> d = detail::overlapping_axis(v)) {
      const std::string why = v.strides[*d] == 0 ? fmt::format("stride 0 along axis {}, as torch's expand() makes", *d)
                                                 : fmt::format("its strides make elements share memory along axis {}", *d);
      throw InvalidArgument(fmt::format("{}: a {} value whose elements overlap ({}) cannot be written; pass a "
                                        "contiguous copy",
                                        what_, describe(v), why));
    }
  }
  if (v.contiguous()) {
    buffers_.push_back(BufferRef{v.data, v.dtype, std::move(v.shape)});
    return;
  }
  BufferRef ref{nullptr, v.dtype, v.shape};
  const std::size_t bytes = v.bytes();
  std::vector<std::byte> staging;
  try {
    staging.resize(bytes);
  } catch (const std::bad_alloc&) {
    // A broadcast view (stride 0) can stand for far more elements than its memory holds.
    throw InvalidArgument(fmt::format("{}: a {} value needs a row-major copy of {} bytes, which cannot be allocated",
                                      what_, describe(v), bytes));
  }
  auto& s = staged_.emplace_back(Staged{buffers_.size(), std::move(v), std::move(staging), read_only});
  copy_to_contiguous(s.view, s.bytes.data());
  ref.data = s.bytes.data();
  buffers_.push_back(std::move(ref));
}
#endif

/// A new value of G that a result is written into in row-major order: straight into its memory
/// when that is row-major contiguous, else into scratch copied into it by take().
template <class G>
class RowMajorResult {
 public:
  void* allocate(DType dtype, const Shape& shape) {
    value_.emplace(make_value<G>(dtype, shape));
    view_ = view_of(*value_);
    if (view_.contiguous()) return view_.data;
    scratch_.resize(view_.bytes());
    return scratch_.data();
  }
  G take() {
    if (!view_.contiguous()) copy_from_contiguous(scratch_.data(), view_);
    return std::move(*value_);
  }

 private:
  std::optional<G> value_;
  TensorView view_;
  std::vector<std::byte> scratch_;
};

}  // namespace core
DISTRIBUTE_END_NAMESPACE

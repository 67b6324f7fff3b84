// The values of one collective call as contiguous host buffers: a value whose memory is row-major
// contiguous is used in place; any other (a transposed view, a column-major matrix) is copied into
// row-major order first and, for collectives that write, copied back after. So every collective
// sees the logical, row-major element order whatever the layout of the values it was given.
#pragma once

#include <cstddef>
#include <optional>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/detail/replica_group.hpp>
#include <distribute/core/error.hpp>
#include <distribute/core/tensor_traits.hpp>
#include <distribute/core/tensor_view.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace detail {

class HostOperands {
 public:
  explicit HostOperands(const char* what) : what_(what) {}

  /// Adds a value's view; `i`-th added is buffers()[i]. write_back() leaves `read_only` ones alone.
  void add(const TensorView& v, bool read_only = false);

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
DISTRIBUTE_DECL void HostOperands::add(const TensorView& v, bool read_only) {
    if (v.memory != MemorySpace::host) {
      throw InvalidArgument(fmt::format("{}: a {} value in device memory cannot go through the host collectives; "
                                        "use a strategy of the device's backend",
                                        what_, describe(v)));
    }
    if (!read_only && !v.strides.empty()) {
      for (std::size_t d = 0; d < v.shape.size(); ++d) {
        if (v.strides[d] == 0 && v.shape[d] > 1) {
          throw InvalidArgument(fmt::format("{}: a {} value whose elements overlap (stride 0 along axis {}, as "
                                            "torch's expand() makes) cannot be written; pass a contiguous copy",
                                            what_, describe(v), d));
        }
      }
    }
    BufferRef ref{v.data, v.dtype, v.shape};
    if (!v.contiguous()) {
      auto& s = staged_.emplace_back(Staged{buffers_.size(), v, std::vector<std::byte>(v.bytes()), read_only});
      copy_to_contiguous(v, s.bytes.data());
      ref.data = s.bytes.data();
    }
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

}  // namespace detail
DISTRIBUTE_END_NAMESPACE

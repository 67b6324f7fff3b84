// How reduce_scatter and all_to_all cut a value along axis 0 into one part per replica: as
// np.array_split does, the first dim0 % n parts one row longer than the others.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include <fmt/format.h>

#include <distribute/core/replica_group.hpp>
#include <distribute/core/error.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace core {

/// Rows [begin, begin + rows) of part `i` when `dim0` rows are cut into `n` parts as
/// np.array_split does: the first dim0 % n parts have one row more than the others.
struct RowRange {
  std::int64_t begin = 0;
  std::int64_t rows = 0;
};
inline RowRange split_rows(std::int64_t dim0, int n, int i) noexcept {
  const std::int64_t base = dim0 / n, extra = dim0 % n;
  const std::int64_t rows = base + (i < extra ? 1 : 0);
  return {i * base + std::min<std::int64_t>(i, extra), rows};
}

/// Elements per row of `shape` (rank >= 1) and the shape of `rows` of its rows.
inline std::size_t row_elements(const Shape& shape) noexcept {
  std::size_t e = 1;
  for (std::size_t d = 1; d < shape.size(); ++d) e *= static_cast<std::size_t>(shape[d]);
  return e;
}
inline Shape with_rows(Shape shape, std::int64_t rows) {
  shape[0] = rows;
  return shape;
}

/// Part `i` of `b` (rank >= 1) cut into `n` parts along axis 0: a view into b's memory.
inline BufferRef part_of(const BufferRef& b, int n, int i) {
  const RowRange rr = split_rows(b.shape[0], n, i);
  BufferRef part = b;
  part.shape = with_rows(b.shape, rr.rows);
  part.data = static_cast<std::byte*>(b.data) + static_cast<std::size_t>(rr.begin) * row_elements(b.shape) * size_of(b.dtype);
  return part;
}

/// reduce_scatter and all_to_all cut along axis 0: a scalar has none.
DISTRIBUTE_DECL void check_has_axis0(const Shape& shape, const char* what);

#if DISTRIBUTE_DETAIL_DEFINE  // compiled apart with DISTRIBUTE_SEPARATE_COMPILATION (version.hpp)
DISTRIBUTE_DECL void check_has_axis0(const Shape& shape, const char* what) {
  if (shape.empty()) {
    throw InvalidArgument(fmt::format("{}: a scalar cannot be split across replicas; pass a value of rank >= 1 (split "
                                      "along axis 0)",
                                      what));
  }
}
#endif

}  // namespace core
DISTRIBUTE_END_NAMESPACE

// Concatenation of row-major buffers along an axis (gather, all_gather, Sharded::to_tensor).
#pragma once

#include <algorithm>
#include <cstring>
#include <functional>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/cross_worker.hpp>
#include <distribute/core/replica_group.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace core {

/// Checks that `parts` can be concatenated along `axis`: same dtype and rank, axis in
/// [0, rank) (callers count a negative axis from the end first), equal dimensions except along
/// axis. Names the offending parts' shapes.
DISTRIBUTE_DECL void check_concat(const std::vector<const BufferRef*>& parts, std::int64_t axis, const char* what);

/// Writes the concatenation of `parts` along `axis` into allocate(result_shape).
DISTRIBUTE_DECL void concat_along_axis(const std::vector<const BufferRef*>& parts, std::size_t axis,
                                       const std::function<void*(const Shape&)>& allocate);

/// The concatenation along `axis` of every worker's `local` buffer (already this worker's
/// concatenation), in worker order. Shapes travel with the bytes so each worker can check
/// that the others' agree except along `axis`; on a mismatch every worker throws the same error.
struct GatheredBytes {
  std::vector<std::byte> data;
  Shape shape;
};
DISTRIBUTE_DECL GatheredBytes gather_across_workers(CrossWorkerLink& link, const BufferRef& local, std::size_t axis,
                                                    const char* what);

#if DISTRIBUTE_DETAIL_DEFINE  // compiled apart with DISTRIBUTE_SEPARATE_COMPILATION (version.hpp)
DISTRIBUTE_DECL void check_concat(const std::vector<const BufferRef*>& parts, std::int64_t axis, const char* what) {
  const BufferRef& first = *parts.front();
  const auto rank = static_cast<std::int64_t>(first.shape.size());
  if (axis < 0 || axis >= rank) {
    throw InvalidArgument(fmt::format("{}: axis {} is out of range for values of shape {} (rank {}); it must be in [{}, {})",
                                      what, axis, shape_string(first.shape), rank, -rank, rank));
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

DISTRIBUTE_DECL void concat_along_axis(const std::vector<const BufferRef*>& parts, std::size_t axis,
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

DISTRIBUTE_DECL GatheredBytes gather_across_workers(CrossWorkerLink& link, const BufferRef& local, std::size_t axis,
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

#endif  // DISTRIBUTE_DETAIL_DEFINE
}  // namespace core
DISTRIBUTE_END_NAMESPACE

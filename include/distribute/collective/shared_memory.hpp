// The host default cross-device op: replicas are threads of one process, so they reduce straight
// out of each other's buffers. Replica r reduces slice r of every buffer across all replicas and
// writes the result into slice r of every replica's buffer: a reduce-scatter and an all-gather
// fused into one pass, with no scratch buffer and two barriers per call. In place, or out of
// place (each input read where it is, BufferRef::source) at the same cost.
#pragma once

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <string_view>
#include <span>
#include <vector>

#include <fmt/format.h>

#include <distribute/collective/communication_options.hpp>
#include <distribute/collective/detail/scatter.hpp>
#include <distribute/collective/validate.hpp>
#include <distribute/core/elementwise.hpp>
#include <distribute/core/replica_group.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

/// Cross-device ops policy: parallel reduce in shared memory (the host backend's default).
namespace collective::detail {
// The algorithms are reached through the policies' make_collectives: with separate compilation
// (version.hpp) only the library's own translation unit compiles them.
#if DISTRIBUTE_DETAIL_DEFINE

// Elements per block: small enough that a block of every source stays in L2 while reduced.
inline constexpr std::size_t kReduceBlockBytes = 32 * 1024;

template <class T>
void reduce_slice_across(const core::ReplicaGroup& group, std::size_t buffer_index, std::size_t begin, std::size_t end,
                         Reduction red) {
  const int n = group.size();
  constexpr std::size_t block = std::max<std::size_t>(1, kReduceBlockBytes / sizeof(T));
  std::vector<const void*> sources(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) sources[static_cast<std::size_t>(r)] = group.slot(r).buffers[buffer_index].input();
  for (std::size_t b = begin; b < end; b += block) {
    const std::size_t len = std::min(block, end - b);
    T* acc = static_cast<T*>(group.slot(0).buffers[buffer_index].data) + b;
    core::reduce_many<T>(acc, sources, len, red, b);
    for (int r = 1; r < n; ++r) {
      std::memcpy(static_cast<T*>(group.slot(r).buffers[buffer_index].data) + b, acc, len * sizeof(T));
    }
  }
}

/// Which of a replica's buffers a reduction step reads: its input (BufferRef::source when out of
/// place), as a first step does, or `data`, where an earlier step left a partial result.
enum class ReadFrom : bool { inputs, partial_results };

/// Reduces buffer `buffer_index` of every replica in `sources` into replica `target`'s buffer,
/// divided when `red` divides.
inline void reduce_into(const core::ReplicaGroup& group, int target, const std::vector<int>& sources, std::size_t buffer_index,
                        Reduction red, ReadFrom from_what) {
  const core::BufferRef& dst = group.slot(target).buffers[buffer_index];
  auto read = [&](const core::BufferRef& b) { return from_what == ReadFrom::inputs ? b.input() : b.data; };
  visit_dtype(dst.dtype, [&](auto t) {
    using T = decltype(t);
    std::vector<const void*> from{read(dst)};
    for (int s : sources) {
      if (s != target) from.push_back(read(group.slot(s).buffers[buffer_index]));
    }
    core::reduce_many<T>(static_cast<T*>(dst.data), from, dst.count(), red);
  });
}

/// Copies replica `from`'s buffers into replica `to`'s.
inline void copy_buffers(const core::ReplicaGroup& group, int from, int to) {
  const auto& src = group.slot(from).buffers;
  const auto& dst = group.slot(to).buffers;
  for (std::size_t i = 0; i < dst.size(); ++i) {
    if (dst[i].bytes() > 0) std::memcpy(dst[i].data, src[i].data, dst[i].bytes());
  }
}

/// The shared-memory algorithms, usable by any strategy whose replicas share an address space.
class SharedMemoryCollectives : public core::ReplicaCollectives {
 public:
  /// `mean_divisor`: what MEAN divides by (num_replicas_in_sync; 0 leaves the sum, for callers
  /// that divide after a further cross-worker step). Each collective lowers MEAN with it once, on
  /// entry (Reduction::lower); what it calls sees a SUM and that divisor.
  explicit SharedMemoryCollectives(std::int64_t mean_divisor) : mean_divisor_(mean_divisor) {}

  /// Out of place costs what in place does: each block of every input is read once and the
  /// result written to every output (the subclasses' first steps read inputs, ReadFrom::inputs).
  bool reads_sources() const noexcept override { return true; }

  void all_reduce(core::ReplicaGroup& group, int replica, std::span<core::BufferRef> buffers, ReduceOp op) override {
    const core::CollectiveCall call{core::CollectiveKind::AllReduce, op, buffers};
    const Reduction red = Reduction::lower(op, mean_divisor_);
    collective::exchange(group, replica, call, [&] {
      const auto n = static_cast<std::size_t>(group.size());
      const auto r = static_cast<std::size_t>(replica);
      for (std::size_t i = 0; i < buffers.size(); ++i) {
        const std::size_t count = buffers[i].count();
        if (group.size() == 1) {
          if (buffers[i].source != nullptr && count > 0) std::memcpy(buffers[i].data, buffers[i].source, buffers[i].bytes());
          if (red.divides()) {
            visit_dtype(buffers[i].dtype, [&](auto t) {
              core::divide(static_cast<decltype(t)*>(buffers[i].data), count, red.divisor());
            });
          }
          continue;
        }
        const std::size_t begin = count * r / n, end = count * (r + 1) / n;
        if (begin == end) continue;
        visit_dtype(buffers[i].dtype,
                    [&](auto t) { reduce_slice_across<decltype(t)>(group, i, begin, end, red); });
      }
    });
  }

  void all_gather(core::ReplicaGroup& group, int replica, const core::BufferRef& input, int axis,
                  const std::function<void*(const Shape&)>& allocate) override {
    core::BufferRef in = input;
    const core::CollectiveCall call{core::CollectiveKind::AllGather, ReduceOp::Sum, std::span<core::BufferRef>(&in, 1), axis};
    collective::exchange(group, replica, call, [&] {
      std::vector<const core::BufferRef*> parts;
      for (int r = 0; r < group.size(); ++r) parts.push_back(&group.slot(r).buffers[0]);
      core::concat_along_axis(parts, static_cast<std::size_t>(axis), allocate);
    });
  }

  void broadcast(core::ReplicaGroup& group, int replica, core::BufferRef buffer, int root) override {
    const core::CollectiveCall call{core::CollectiveKind::Broadcast, ReduceOp::Sum, std::span<core::BufferRef>(&buffer, 1), 0, root};
    collective::exchange(group, replica, call, [&] {
      if (replica != root && buffer.bytes() > 0) {
        std::memcpy(buffer.data, group.slot(root).buffers[0].data, buffer.bytes());
      }
    });
  }

  /// Each replica reduces its own part straight out of every replica's input.
  void reduce_scatter(core::ReplicaGroup& group, int replica, core::BufferRef input, ReduceOp op,
                      const std::function<void*(const Shape&)>& allocate) override {
    const core::CollectiveCall call{core::CollectiveKind::ReduceScatter, op, std::span<core::BufferRef>(&input, 1)};
    collective::exchange(group, replica, call, [&] {
      const core::BufferRef part = core::part_of(input, group.size(), replica);
      void* out = allocate(part.shape);
      const std::size_t offset = (static_cast<std::byte*>(part.data) - static_cast<std::byte*>(input.data)) / size_of(input.dtype);
      std::vector<const void*> sources;
      for (int r = 0; r < group.size(); ++r) sources.push_back(group.slot(r).buffers[0].data);
      visit_dtype(input.dtype, [&](auto t) {
        using T = decltype(t);
        core::reduce_many<T>(static_cast<T*>(out), sources, part.count(), Reduction::lower(op, mean_divisor_), offset);
      });
    });
  }

  /// Each replica copies the pieces addressed to it out of every replica's list.
  void all_to_all(core::ReplicaGroup& group, int replica, std::span<core::BufferRef> pieces, bool split,
                  const std::function<std::vector<void*>(const std::vector<Shape>&)>& allocate) override {
    const core::CollectiveCall call{core::CollectiveKind::AllToAll, ReduceOp::Sum, pieces, split ? 1 : 0, group.size()};
    collective::exchange(group, replica, call, [&] {
      const auto me = static_cast<std::size_t>(replica);
      std::vector<Shape> shapes;
      for (int r = 0; r < group.size(); ++r) shapes.push_back(group.slot(r).buffers[me].shape);
      const std::vector<void*> out = allocate(shapes);
      for (int r = 0; r < group.size(); ++r) {
        const core::BufferRef& from = group.slot(r).buffers[me];
        if (from.bytes() > 0) std::memcpy(out[static_cast<std::size_t>(r)], from.data, from.bytes());
      }
    });
  }

 protected:
  std::int64_t mean_divisor_;
};

#endif  // DISTRIBUTE_DETAIL_DEFINE
}  // namespace collective::detail

/// Cross-device ops policy: parallel reduce in shared memory (the host backend's default).
struct SharedMemoryAllReduce {
  static constexpr std::string_view name = "SharedMemoryAllReduce";
  static std::unique_ptr<core::ReplicaCollectives> make_collectives(const collective::detail::CollectivesConfig& config);
};

#if DISTRIBUTE_DETAIL_DEFINE
DISTRIBUTE_DECL std::unique_ptr<core::ReplicaCollectives> SharedMemoryAllReduce::make_collectives(
    const collective::detail::CollectivesConfig& config) {
  return std::make_unique<collective::detail::SharedMemoryCollectives>(config.num_replicas_in_sync);
}
#endif

DISTRIBUTE_END_NAMESPACE

// What reduce_scatter and all_to_all share across the cross-device ops: how a value is cut along
// axis 0 (np.array_split's rule), and the agreement check of an all_to_all, made once over every
// replica's pieces whether they were published in this process or gathered from other workers.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/cross_worker.hpp>
#include <distribute/core/replica_group.hpp>
#include <distribute/core/split_rows.hpp>
#include <distribute/core/error.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace collective::detail {

/// One replica's side of an all_to_all, as every replica checks it.
struct AllToAllSide {
  bool split = false;
  bool device = false;  // every piece in device memory (the NCCL path takes only those)
  std::vector<DType> dtypes;
  std::vector<Shape> shapes;  // shapes[j]: the piece for replica j
};

/// Throws the same InvalidArgument on every replica (each checks the same table) unless the
/// sides form one all_to_all over `n` replicas.
DISTRIBUTE_DECL void check_all_to_all(const std::vector<AllToAllSide>& sides, int n);
/// The side a published call describes.
DISTRIBUTE_DECL AllToAllSide side_of(const core::CollectiveCall& c);
/// The local replicas' sides as bytes for the workers' all_gather, and back. Layout per side:
/// u8 split, u8 device, u32 pieces, then per piece u8 dtype, u32 rank, i64 dims.
DISTRIBUTE_DECL void encode_sides(const std::vector<AllToAllSide>& sides, std::vector<std::byte>& out);
DISTRIBUTE_DECL std::vector<AllToAllSide> decode_sides(std::span<const std::byte> in, std::size_t count);
/// Every replica's side across the workers, by replica_id_in_sync_group: replica 0 of each
/// worker gathers the local sides over `link` (worker w's local replica i is w * local + i).
DISTRIBUTE_DECL std::vector<AllToAllSide> gather_sides(core::CrossWorkerLink& link, const core::ReplicaGroup& group);

#if DISTRIBUTE_DETAIL_DEFINE  // compiled apart with DISTRIBUTE_SEPARATE_COMPILATION (version.hpp)
DISTRIBUTE_DECL void check_all_to_all(const std::vector<AllToAllSide>& sides, int n) {
  for (std::size_t g = 0; g < sides.size(); ++g) {
    if (sides[g].shapes.size() != static_cast<std::size_t>(n)) {
      throw InvalidArgument(fmt::format("all_to_all: replica {} passed {} values but there are {} replicas in sync; "
                                        "pass one value per replica (the i-th goes to replica i)",
                                        g, sides[g].shapes.size(), n));
    }
  }
  const AllToAllSide& s0 = sides.front();
  for (std::size_t g = 0; g < sides.size(); ++g) {
    const AllToAllSide& s = sides[g];
    if (s.device != s0.device) {
      throw InvalidArgument(fmt::format("all_to_all: replica 0 passes values in {} memory but replica {} in {} memory",
                                        s0.device ? "device" : "host", g, s.device ? "device" : "host"));
    }
    if (s.split != s0.split) {
      throw InvalidArgument(fmt::format("all_to_all: replica 0 passed {} but replica {} passed {}",
                                        s0.split ? "one value to split" : "a list of values", g,
                                        s.split ? "one value to split" : "a list of values"));
    }
    for (std::size_t j = 0; j < s.shapes.size(); ++j) {
      if (s.dtypes[j] != s0.dtypes[0]) {
        throw InvalidArgument(fmt::format("all_to_all: value {} of replica {} is {} but value 0 of replica 0 is {}", j, g,
                                          to_string(s.dtypes[j]), to_string(s0.dtypes[0])));
      }
      if (s.split && (s.shapes[j].size() != s0.shapes[0].size() ||
                      !std::equal(s.shapes[j].begin() + 1, s.shapes[j].end(), s0.shapes[0].begin() + 1))) {
        throw InvalidArgument(fmt::format("all_to_all: replica {} splits a value whose rows have shape {} but replica 0 "
                                          "one whose rows have shape {}: values split along axis 0 must agree in the other axes",
                                          g, shape_string(Shape(s.shapes[j].begin() + 1, s.shapes[j].end())),
                                          shape_string(Shape(s0.shapes[0].begin() + 1, s0.shapes[0].end()))));
      }
    }
  }
}

DISTRIBUTE_DECL AllToAllSide side_of(const core::CollectiveCall& c) {
  AllToAllSide s;
  s.split = c.axis == 1;
  s.device = !c.buffers.empty();
  for (const core::BufferRef& b : c.buffers) {
    s.device = s.device && b.memory == MemorySpace::device;
    s.dtypes.push_back(b.dtype);
    s.shapes.push_back(b.shape);
  }
  return s;
}

DISTRIBUTE_DECL void encode_sides(const std::vector<AllToAllSide>& sides, std::vector<std::byte>& out) {
  auto put = [&](const void* p, std::size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    out.insert(out.end(), b, b + n);
  };
  for (const AllToAllSide& s : sides) {
    const std::uint8_t split = s.split ? 1 : 0, device = s.device ? 1 : 0;
    const auto pieces = static_cast<std::uint32_t>(s.shapes.size());
    put(&split, 1);
    put(&device, 1);
    put(&pieces, 4);
    for (std::size_t j = 0; j < s.shapes.size(); ++j) {
      const auto dtype = static_cast<std::uint8_t>(s.dtypes[j]);
      const auto rank = static_cast<std::uint32_t>(s.shapes[j].size());
      put(&dtype, 1);
      put(&rank, 4);
      put(s.shapes[j].data(), s.shapes[j].size() * sizeof(std::int64_t));
    }
  }
}

DISTRIBUTE_DECL std::vector<AllToAllSide> decode_sides(std::span<const std::byte> in, std::size_t count) {
  std::size_t at = 0;
  auto get = [&](void* p, std::size_t n) {
    if (at + n > in.size()) throw PeerFailure("all_to_all: a worker's description of its values is truncated");
    std::memcpy(p, in.data() + at, n);
    at += n;
  };
  std::vector<AllToAllSide> sides(count);
  for (AllToAllSide& s : sides) {
    std::uint8_t split = 0, device = 0;
    std::uint32_t pieces = 0;
    get(&split, 1);
    get(&device, 1);
    get(&pieces, 4);
    s.split = split != 0;
    s.device = device != 0;
    for (std::uint32_t j = 0; j < pieces; ++j) {
      std::uint8_t dtype = 0;
      std::uint32_t rank = 0;
      get(&dtype, 1);
      get(&rank, 4);
      if (rank > 64) throw PeerFailure(fmt::format("all_to_all: a worker described a value of rank {}", rank));
      Shape shape(rank);
      get(shape.data(), rank * sizeof(std::int64_t));
      s.dtypes.push_back(static_cast<DType>(dtype));
      s.shapes.push_back(std::move(shape));
    }
  }
  return sides;
}

DISTRIBUTE_DECL std::vector<AllToAllSide> gather_sides(core::CrossWorkerLink& link, const core::ReplicaGroup& group) {
  std::vector<AllToAllSide> local;
  for (int r = 0; r < group.size(); ++r) local.push_back(side_of(group.slot(r)));
  std::vector<std::byte> mine, all;
  encode_sides(local, mine);
  std::vector<std::size_t> sizes;
  link.all_gather(mine.data(), mine.size(), all, sizes);
  std::vector<AllToAllSide> sides;
  std::size_t offset = 0;
  for (std::size_t w = 0; w < sizes.size(); ++w) {
    auto part = decode_sides(std::span<const std::byte>(all.data() + offset, sizes[w]), static_cast<std::size_t>(group.size()));
    for (auto& s : part) sides.push_back(std::move(s));
    offset += sizes[w];
  }
  return sides;
}

#endif  // DISTRIBUTE_DETAIL_DEFINE
}  // namespace collective::detail
DISTRIBUTE_END_NAMESPACE

// Reduce-scatter and all-to-all over the transport. Both are direct: every rank sends each other
// rank what that rank needs, in chunks of about chunk_bytes, all at once. Bytes on the wire are
// the least either collective can move ((n-1)/n of the buffer per rank for reduce-scatter, every
// byte once for all-to-all); the ring would only trade connections for steps at these cluster
// sizes. Each runs inside one Call, whose descriptor exchange checks that every rank is
// doing the same thing.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <numeric>
#include <span>
#include <vector>

#include <distribute/core/dtype.hpp>
#include <distribute/core/reduce_op.hpp>
#include <distribute/net/detail/collectives.hpp>
#include <distribute/net/detail/reduce_bytes.hpp>
#include <distribute/net/detail/transport.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net::detail {

/// Posts the receives of `bytes` at `dst` from `peer`, cut in chunks tagged 0, 1, ...
inline void recv_chunked(Transport& tr, Call& op, int peer, std::byte* dst, std::size_t bytes) {
  const std::size_t chunk = tr.chunk_bytes();
  for (std::size_t c = 0; c * chunk < bytes; ++c) {
    op.recv(peer, c, std::span<std::byte>(dst + c * chunk, std::min(chunk, bytes - c * chunk)));
  }
}
inline void send_chunked(Transport& tr, Call& op, int peer, const std::byte* src, std::size_t bytes) {
  const std::size_t chunk = tr.chunk_bytes();
  for (std::size_t c = 0; c * chunk < bytes; ++c) {
    op.send(peer, c, std::span<const std::byte>(src + c * chunk, std::min(chunk, bytes - c * chunk)));
  }
}

/// In place: segment k of `data` (counts[k] elements, after the segments before it) ends reduced
/// on rank k. Every rank sends segment k to rank k, and rank k reduces the n contributions in
/// rank order (a deterministic result). When every rank shares one host's segment (`shm`, else
/// null) and the buffer is large enough for it, the whole buffer is all-reduced through shared
/// memory instead, which also leaves each rank its segment. Each segment is divided once when
/// `red` asks for it.
inline void reduce_scatter(Transport& tr, Call& op, SharedMemoryAllReduce* shm, std::byte* data,
                           std::span<const std::size_t> counts, DType dtype, Reduction red, std::vector<std::byte>& scratch) {
  const int n = tr.size(), r = tr.rank();
  const std::size_t es = size_of(dtype);
  const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  if (shm != nullptr && total * es >= shm->min_bytes()) {
    op.set_algorithm("shared_memory");
    op.count_bytes(total * es, counts[static_cast<std::size_t>(r)] * es);
    shared_memory_all_reduce(tr, op, *shm, data, total, dtype, red);
    return op.finish();
  }
  op.set_algorithm("direct");
  std::vector<std::size_t> offset(static_cast<std::size_t>(n), 0);
  for (int k = 1; k < n; ++k) offset[k] = offset[k - 1] + counts[k - 1];
  const std::size_t mine = counts[static_cast<std::size_t>(r)];
  const std::size_t bytes = mine * es;
  if (scratch.size() < static_cast<std::size_t>(n - 1) * bytes) scratch.resize(static_cast<std::size_t>(n - 1) * bytes);
  auto slot = [&](int k) { return scratch.data() + static_cast<std::size_t>(k < r ? k : k - 1) * bytes; };
  for (int k = 0; k < n; ++k) {
    if (k != r) recv_chunked(tr, op, k, slot(k), bytes);
  }
  for (int k = 0; k < n; ++k) {
    if (k != r) send_chunked(tr, op, k, data + offset[static_cast<std::size_t>(k)] * es, counts[static_cast<std::size_t>(k)] * es);
  }
  op.finish();  // also: the segments sent are no longer read, and every contribution is in
  std::byte* own = data + offset[static_cast<std::size_t>(r)] * es;
  if (mine == 0) return;
  if (r == 0) {
    for (int k = 1; k < n; ++k) reduce_bytes(dtype, own, slot(k), mine, red.op());
  } else {
    std::byte* acc = slot(0);
    for (int k = 1; k < n; ++k) reduce_bytes(dtype, acc, k == r ? own : slot(k), mine, red.op());
    std::memcpy(own, acc, bytes);
  }
  if (red.divides()) divide_bytes(dtype, own, mine, red.divisor());
}

/// Block k of `send` (send_bytes[k]) goes to rank k; block k of `recv` (recv_bytes[k]) comes from
/// rank k. This rank's own block is copied.
inline void direct_all_to_all(Transport& tr, Call& op, const std::byte* send, std::span<const std::size_t> send_bytes,
                              std::byte* recv, std::span<const std::size_t> recv_bytes) {
  op.set_algorithm("direct");
  const int n = tr.size(), r = tr.rank();
  std::size_t in = 0, out = 0;
  for (int k = 0; k < n; ++k) {
    const auto u = static_cast<std::size_t>(k);
    if (k != r) recv_chunked(tr, op, k, recv + in, recv_bytes[u]);
    in += recv_bytes[u];
  }
  for (int k = 0; k < n; ++k) {
    const auto u = static_cast<std::size_t>(k);
    if (k != r) send_chunked(tr, op, k, send + out, send_bytes[u]);
    out += send_bytes[u];
  }
  const auto me = static_cast<std::size_t>(r);
  const std::size_t own_in = std::accumulate(recv_bytes.begin(), recv_bytes.begin() + r, std::size_t{0});
  const std::size_t own_out = std::accumulate(send_bytes.begin(), send_bytes.begin() + r, std::size_t{0});
  if (const std::size_t own = std::min(send_bytes[me], recv_bytes[me]); own > 0) {
    std::memcpy(recv + own_in, send + own_out, own);
  }
  op.finish();
}

}  // namespace net::detail
DISTRIBUTE_END_NAMESPACE

// The collective algorithms over the transport: a chunked, pipelined ring all-reduce, a one-hop
// all-reduce for small buffers, a pipelined chain broadcast, and an all-gather of uneven sizes.
// Each runs inside one Transport::Op, whose descriptor exchange checks that every rank is doing
// the same thing.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <utility>
#include <vector>

#include <distribute/core/detail/elementwise.hpp>
#include <distribute/core/dtype.hpp>
#include <distribute/core/reduce_op.hpp>
#include <distribute/net/detail/transport.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net::detail {

inline void reduce_bytes(DType dtype, std::byte* acc, const std::byte* src, std::size_t n, ReduceOp op) {
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    ::distribute::detail::combine(reinterpret_cast<T*>(acc), reinterpret_cast<const T*>(src), n, op);
  });
}

inline void divide_bytes(DType dtype, std::byte* acc, std::size_t n, std::int64_t divisor) {
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    ::distribute::detail::divide(reinterpret_cast<T*>(acc), n, divisor);
  });
}

/// How the ring cuts `count` elements: n segments (sizes differ by at most one element), each cut
/// into the same number of chunks so that chunk c of every step forms one pipeline.
struct RingGeometry {
  RingGeometry(std::size_t count, int ranks, std::size_t chunk_elems)
      : n(static_cast<std::size_t>(ranks)), base(count / n), rem(count % n), max_seg(base + (rem > 0 ? 1 : 0)) {
    nchunks = std::max<std::size_t>(1, (max_seg + chunk_elems - 1) / chunk_elems);
    max_chunk = (max_seg + nchunks - 1) / nchunks;
  }
  std::size_t seg_begin(int s) const {
    const auto u = static_cast<std::size_t>(s);
    return u * base + std::min(u, rem);
  }
  std::size_t seg_len(int s) const { return base + (static_cast<std::size_t>(s) < rem ? 1 : 0); }
  /// [first element, length) of chunk c of segment s.
  std::pair<std::size_t, std::size_t> chunk(int s, std::size_t c) const {
    const std::size_t len = seg_len(s), b = seg_begin(s);
    const std::size_t lo = c * len / nchunks, hi = (c + 1) * len / nchunks;
    return {b + lo, hi - lo};
  }

  std::size_t n, base, rem, max_seg;
  std::size_t nchunks = 1;
  std::size_t max_chunk = 0;
};

/// Ring all-reduce: n-1 reduce-scatter steps then n-1 all-gather steps, each step's segment cut in
/// chunks. Chunk c moves on as soon as it is reduced, so while this thread reduces chunk c the io
/// thread is sending chunk c-1 onwards and receiving chunk c+1. Every segment is reduced along one
/// chain and then copied, so all ranks end with bitwise identical results.
inline void ring_all_reduce(Transport& tr, Transport::Op& op, std::byte* data, std::size_t count, DType dtype,
                            ReduceOp rop, std::vector<std::byte>& scratch) {
  const int n = tr.size(), r = tr.rank();
  const std::size_t es = size_of(dtype);
  const RingGeometry g(count, n, std::max<std::size_t>(1, tr.chunk_bytes() / es));
  const int left = (r - 1 + n) % n, right = (r + 1) % n;
  const int steps = 2 * (n - 1);
  // Reduce-scatter receives land in scratch: two step slots (step t+2 is posted as step t drains),
  // each with a fixed region per chunk index so no posted region overlaps an unconsumed one.
  const std::size_t slot_bytes = g.nchunks * g.max_chunk * es;
  const std::size_t slots = std::min<std::size_t>(2, static_cast<std::size_t>(n - 1));
  if (scratch.size() < slots * slot_bytes) scratch.resize(slots * slot_bytes);

  auto mod = [n](int x) { return ((x % n) + n) % n; };
  auto send_seg = [&](int t) { return t < n - 1 ? mod(r - t) : mod(r + 1 - (t - (n - 1))); };
  auto recv_seg = [&](int t) { return t < n - 1 ? mod(r - t - 1) : mod(r - (t - (n - 1))); };
  auto tag = [&](int t, std::size_t c) { return static_cast<std::uint64_t>(t) * g.nchunks + c; };
  auto scratch_at = [&](int t, std::size_t c) {
    return scratch.data() + static_cast<std::size_t>(t % 2) * slot_bytes + c * g.max_chunk * es;
  };

  std::vector<TransferPtr> recvs(static_cast<std::size_t>(steps) * g.nchunks);
  auto post = [&](int t, std::size_t c) {
    const auto [b, len] = g.chunk(recv_seg(t), c);
    std::byte* dst = t < n - 1 ? scratch_at(t, c) : data + b * es;
    recvs[tag(t, c)] = op.recv(left, tag(t, c), std::span<std::byte>(dst, len * es));
  };
  auto send = [&](int t, std::size_t c) {
    const auto [b, len] = g.chunk(send_seg(t), c);
    op.send(right, tag(t, c), std::span<const std::byte>(data + b * es, len * es));
  };

  for (std::size_t c = 0; c < g.nchunks; ++c) send(0, c);
  for (int t = 0; t < std::min(2, steps); ++t) {
    for (std::size_t c = 0; c < g.nchunks; ++c) post(t, c);
  }
  for (int t = 0; t < steps; ++t) {
    for (std::size_t c = 0; c < g.nchunks; ++c) {
      TransferPtr& in = recvs[tag(t, c)];
      op.wait(in);
      in.reset();
      if (t < n - 1) {
        const auto [b, len] = g.chunk(recv_seg(t), c);
        reduce_bytes(dtype, data + b * es, scratch_at(t, c), len, rop);
        if (t == n - 2 && rop == ReduceOp::Mean) divide_bytes(dtype, data + b * es, len, n);
      }
      if (t + 1 < steps) send(t + 1, c);
      if (t + 2 < steps) post(t + 2, c);
    }
  }
  op.finish();
}

/// Small buffers: every rank sends its buffer to every other and reduces all n in rank order, so
/// the result is bitwise identical everywhere and costs one hop instead of 2(n-1).
inline void direct_all_reduce(Transport& tr, Transport::Op& op, std::byte* data, std::size_t count, DType dtype,
                              ReduceOp rop, std::vector<std::byte>& scratch) {
  const int n = tr.size(), r = tr.rank();
  const std::size_t bytes = count * size_of(dtype);
  if (scratch.size() < static_cast<std::size_t>(n - 1) * bytes) scratch.resize(static_cast<std::size_t>(n - 1) * bytes);
  auto slot = [&](int k) { return scratch.data() + static_cast<std::size_t>(k < r ? k : k - 1) * bytes; };
  for (int k = 0; k < n; ++k) {
    if (k != r) op.recv(k, 0, std::span<std::byte>(slot(k), bytes));
  }
  for (int k = 0; k < n; ++k) {
    if (k != r) op.send(k, 0, std::span<const std::byte>(data, bytes));
  }
  op.finish();  // also: our buffer is no longer being sent, so it may be overwritten
  if (r == 0) {
    for (int k = 1; k < n; ++k) reduce_bytes(dtype, data, slot(k), count, rop);
  } else {
    std::byte* acc = slot(0);
    for (int k = 1; k < n; ++k) reduce_bytes(dtype, acc, k == r ? data : slot(k), count, rop);
    std::memcpy(data, acc, bytes);
  }
  if (rop == ReduceOp::Mean) divide_bytes(dtype, data, count, n);
}

/// Broadcast: small payloads go from the root to everyone directly; large ones flow down the chain
/// root → root+1 → … in chunks, each rank forwarding a chunk as soon as it has it.
inline void chain_broadcast(Transport& tr, Transport::Op& op, std::byte* data, std::size_t bytes, int root) {
  const int n = tr.size(), r = tr.rank();
  if (bytes == 0 || n == 1) return op.finish();
  if (bytes <= std::min(tr.options().direct_max_bytes, tr.options().max_frame_bytes)) {
    if (r == root) {
      for (int k = 0; k < n; ++k) {
        if (k != r) op.send(k, 0, std::span<const std::byte>(data, bytes));
      }
    } else {
      op.recv(root, 0, std::span<std::byte>(data, bytes));
    }
    return op.finish();
  }
  const std::size_t chunk = tr.chunk_bytes();
  const std::size_t nch = (bytes + chunk - 1) / chunk;
  const int pos = (r - root + n) % n, prev = (r - 1 + n) % n, next = (r + 1) % n;
  auto piece = [&](std::size_t c) { return std::span<std::byte>(data + c * chunk, std::min(chunk, bytes - c * chunk)); };
  if (pos == 0) {
    for (std::size_t c = 0; c < nch; ++c) op.send(next, c, piece(c));
  } else {
    std::vector<TransferPtr> recvs(nch);
    for (std::size_t c = 0; c < nch; ++c) recvs[c] = op.recv(prev, c, piece(c));
    for (std::size_t c = 0; c < nch; ++c) {
      op.wait(recvs[c]);
      if (pos < n - 1) op.send(next, c, piece(c));
    }
  }
  op.finish();
}

/// All-gather of uneven sizes: each rank sends its block to every other; the sizes come with the
/// descriptors, so no extra round is needed to learn them.
inline void direct_all_gather(Transport& tr, Transport::Op& op, const std::byte* data, std::size_t bytes,
                              std::vector<std::byte>& out, std::vector<std::size_t>& sizes) {
  const int n = tr.size(), r = tr.rank();
  const std::size_t chunk = tr.chunk_bytes();
  auto pieces = [&](std::size_t total) { return (total + chunk - 1) / chunk; };
  for (int k = 0; k < n; ++k) {
    if (k == r) continue;
    for (std::size_t c = 0; c < pieces(bytes); ++c) {
      op.send(k, c, std::span<const std::byte>(data + c * chunk, std::min(chunk, bytes - c * chunk)));
    }
  }
  const auto& all = op.descriptors();
  sizes.assign(static_cast<std::size_t>(n), 0);
  std::size_t total = 0;
  for (int k = 0; k < n; ++k) {
    sizes[static_cast<std::size_t>(k)] = static_cast<std::size_t>(all[static_cast<std::size_t>(k)].count);
    total += sizes[static_cast<std::size_t>(k)];
  }
  out.resize(total);
  std::size_t offset = 0;
  for (int k = 0; k < n; ++k) {
    const std::size_t size = sizes[static_cast<std::size_t>(k)];
    if (k == r) {
      if (size > 0) std::memcpy(out.data() + offset, data, size);
    } else {
      for (std::size_t c = 0; c < pieces(size); ++c) {
        op.recv(k, c, std::span<std::byte>(out.data() + offset + c * chunk, std::min(chunk, size - c * chunk)));
      }
    }
    offset += size;
  }
  op.finish();
}

}  // namespace net::detail
DISTRIBUTE_END_NAMESPACE

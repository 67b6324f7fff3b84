// The collective algorithms over the transport: a chunked, pipelined ring all-reduce, a
// halving-doubling all-reduce for power-of-two rank counts, a one-hop all-reduce for small buffers, a pipelined chain broadcast, and an all-gather of uneven sizes.
// Each runs inside one Transport::Op, whose descriptor exchange checks that every rank is doing
// the same thing.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <span>
#include <utility>
#include <vector>

#include <distribute/core/detail/elementwise.hpp>
#include <distribute/core/dtype.hpp>
#include <distribute/core/reduce_op.hpp>
#include <distribute/net/detail/hierarchical_all_reduce.hpp>
#include <distribute/net/detail/reduce_bytes.hpp>
#include <distribute/net/detail/transport.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net::detail {

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
/// chunks. Chunk c moves on as soon as it is reduced: each receive carries a continuation that
/// reduces the chunk, sends it to the right and posts the receive two steps on, so the thread that
/// read the chunk (the io thread, as a rule) forwards it at once, and the calling thread sleeps
/// until the last chunk is in instead of being woken for every one. Every segment is reduced along
/// one chain and then copied, so all ranks end with bitwise identical results.
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
  std::byte* const scratch_base = scratch.data();

  auto mod = [n](int x) { return ((x % n) + n) % n; };
  auto send_seg = [&](int t) { return t < n - 1 ? mod(r - t) : mod(r + 1 - (t - (n - 1))); };
  auto recv_seg = [&](int t) { return t < n - 1 ? mod(r - t - 1) : mod(r - (t - (n - 1))); };
  auto tag = [&](int t, std::size_t c) { return static_cast<std::uint64_t>(t) * g.nchunks + c; };
  auto scratch_at = [&](int t, std::size_t c) {
    return scratch_base + static_cast<std::size_t>(t % 2) * slot_bytes + c * g.max_chunk * es;
  };
  // Every reduce-scatter send's memory later receives an all-gather chunk, so the io thread
  // does all the writing (the first step's frames are queued to it in one hand-off).
  auto send = [&](int t, std::size_t c) {
    const auto [b, len] = g.chunk(send_seg(t), c);
    op.send_by_io_thread(right, tag(t, c), std::span<const std::byte>(data + b * es, len * es));
  };

  // Continuations run on the io thread and on this one, possibly at once, but each touches only
  // its own chunk's memory; the count is what this thread waits on.
  const std::size_t total = static_cast<std::size_t>(steps) * g.nchunks;
  std::atomic<std::size_t> arrived{0};
  std::function<void(int, std::size_t)> post;
  auto on_arrival = [&](int t, std::size_t c) {
    if (t < n - 1) {
      const auto [b, len] = g.chunk(recv_seg(t), c);
      reduce_bytes(dtype, data + b * es, scratch_at(t, c), len, rop);
      if (t == n - 2 && rop == ReduceOp::Mean) divide_bytes(dtype, data + b * es, len, n);
    }
    if (t + 1 < steps) send(t + 1, c);
    if (t + 2 < steps) post(t + 2, c);
    return arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == total;  // the last one wakes the caller
  };
  post = [&](int t, std::size_t c) {
    const auto [b, len] = g.chunk(recv_seg(t), c);
    std::byte* dst = t < n - 1 ? scratch_at(t, c) : data + b * es;
    op.recv(left, tag(t, c), std::span<std::byte>(dst, len * es), [&on_arrival, t, c] { return on_arrival(t, c); });
  };
  const ContinuationScope scope(op);

  // Receives first: a frame that arrives before its receive is posted must be buffered and copied.
  for (int t = 0; t < std::min(2, steps); ++t) {
    for (std::size_t c = 0; c < g.nchunks; ++c) post(t, c);
  }
  for (std::size_t c = 0; c < g.nchunks; ++c) send(0, c);
  op.wait_until([&] { return arrived.load(std::memory_order_acquire) == total; }, left);
  op.finish();
}

/// True when a halving-doubling all-reduce can run on `n` ranks (a power of two, at least 4: on 2
/// ranks it is the ring's two steps without the ring's overlap of one step with the next).
inline bool halving_doubling_applies(int n) { return n >= 4 && (n & (n - 1)) == 0; }

/// Halving-doubling all-reduce (Rabenseifner) for a power-of-two number of ranks: log2(n)
/// reduce-scatter steps by recursive halving, then log2(n) all-gather steps by recursive
/// doubling, instead of the ring's 2(n-1) steps; the bytes each rank sends are the ring's
/// (2(n-1)/n of the buffer). In the step with distance d a rank exchanges with rank r^d: halving,
/// it sends the half of its current range that the partner keeps and reduces the partner's copy
/// of its own half; doubling, it sends its range and receives the partner's adjacent one. Each
/// step's exchange is cut into chunks of about chunk_bytes, reduced as they arrive. Segment s
/// (the ring's cut) ends reduced on rank s alone and is then copied, so all ranks end bitwise
/// identical.
inline void halving_doubling_all_reduce(Transport& tr, Transport::Op& op, std::byte* data, std::size_t count, DType dtype,
                                        ReduceOp rop, std::vector<std::byte>& scratch) {
  const int n = tr.size(), r = tr.rank();
  const std::size_t es = size_of(dtype);
  const std::size_t chunk_elems = std::max<std::size_t>(1, tr.chunk_bytes() / es);
  const RingGeometry g(count, n, 1);
  int steps = 0;
  while ((1 << steps) < n) ++steps;
  // [first element, element count) of segments [s, s + k).
  auto range = [&](int s, int k) {
    const std::size_t b = g.seg_begin(s);
    return std::pair<std::size_t, std::size_t>{b, (s + k < n ? g.seg_begin(s + k) : count) - b};
  };
  auto pieces = [&](std::size_t len) { return (len + chunk_elems - 1) / chunk_elems; };
  // Piece c of a range cut into `nch` pieces whose sizes differ by at most one element.
  auto piece = [](std::pair<std::size_t, std::size_t> rg, std::size_t c, std::size_t nch) {
    const std::size_t lo = c * rg.second / nch, hi = (c + 1) * rg.second / nch;
    return std::pair<std::size_t, std::size_t>{rg.first + lo, hi - lo};
  };
  auto tag = [](int step, std::size_t c) { return (static_cast<std::uint64_t>(step) << 32) | c; };

  // Where each step's exchange lies: the range this rank keeps (receives into) and the one it
  // sends, as the first segment of each (both d segments long).
  struct Step {
    int d, partner, keep, give;
  };
  std::vector<Step> halving;
  for (int lo = 0, d = n / 2; d >= 1; d /= 2) {
    const bool lower = (r & d) == 0;
    halving.push_back(Step{d, r ^ d, lower ? lo : lo + d, lower ? lo + d : lo});
    lo = lower ? lo : lo + d;
  }
  // Reduce-scatter receives land in scratch, each step in its own region, all posted up front.
  std::vector<std::size_t> at(static_cast<std::size_t>(steps) + 1, 0);
  for (int s = 0; s < steps; ++s) {
    at[static_cast<std::size_t>(s) + 1] = at[static_cast<std::size_t>(s)] + range(halving[s].keep, halving[s].d).second * es;
  }
  if (scratch.size() < at.back()) scratch.resize(at.back());
  std::vector<std::vector<TransferPtr>> in(static_cast<std::size_t>(steps));
  for (int s = 0; s < steps; ++s) {
    const auto rg = range(halving[s].keep, halving[s].d);
    const std::size_t nch = pieces(rg.second);
    for (std::size_t c = 0; c < nch; ++c) {
      const auto [b, len] = piece(rg, c, nch);
      in[s].push_back(op.recv(halving[s].partner, tag(s, c),
                              std::span<std::byte>(scratch.data() + at[s] + (b - rg.first) * es, len * es)));
    }
  }
  auto send_range = [&](int step, int partner, std::pair<std::size_t, std::size_t> rg, std::vector<TransferPtr>& out) {
    const std::size_t nch = pieces(rg.second);
    for (std::size_t c = 0; c < nch; ++c) {
      const auto [b, len] = piece(rg, c, nch);
      out.push_back(op.send(partner, tag(step, c), std::span<const std::byte>(data + b * es, len * es)));
    }
  };

  // Reduce-scatter by recursive halving.
  std::vector<std::vector<TransferPtr>> given(static_cast<std::size_t>(steps));
  for (int s = 0; s < steps; ++s) {
    const Step& st = halving[s];
    send_range(s, st.partner, range(st.give, st.d), given[s]);
    const auto rg = range(st.keep, st.d);
    const std::size_t nch = pieces(rg.second);
    for (std::size_t c = 0; c < nch; ++c) {
      op.wait(in[s][c]);
      in[s][c].reset();
      const auto [b, len] = piece(rg, c, nch);
      reduce_bytes(dtype, data + b * es, scratch.data() + at[s] + (b - rg.first) * es, len, rop);
      if (s == steps - 1 && rop == ReduceOp::Mean) divide_bytes(dtype, data + b * es, len, n);
    }
  }
  // All-gather by recursive doubling, the halving steps backwards: the partner's range is the one
  // sent to it while halving, so those sends must be out of our memory before it is overwritten.
  for (int s = steps - 1; s >= 0; --s) {
    for (const TransferPtr& t : given[s]) op.wait(t);
  }
  std::vector<std::vector<TransferPtr>> back(static_cast<std::size_t>(steps));
  for (int s = steps - 1; s >= 0; --s) {
    const auto rg = range(halving[s].give, halving[s].d);
    const std::size_t nch = pieces(rg.second);
    for (std::size_t c = 0; c < nch; ++c) {
      const auto [b, len] = piece(rg, c, nch);
      back[s].push_back(op.recv(halving[s].partner, tag(2 * steps - 1 - s, c), std::span<std::byte>(data + b * es, len * es)));
    }
  }
  std::vector<TransferPtr> sent;
  for (int s = steps - 1; s >= 0; --s) {
    const Step& st = halving[s];
    send_range(2 * steps - 1 - s, st.partner, range(st.keep, st.d), sent);
    for (const TransferPtr& t : back[s]) op.wait(t);
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

/// All-reduce through the transport's shared-memory segment (shared_memory_all_reduce.hpp).
inline void shared_memory_all_reduce(Transport& tr, Transport::Op& op, SharedMemoryAllReduce& shm, std::byte* data,
                                     std::size_t count, DType dtype, ReduceOp rop) {
  const auto quiet = tr.exempt_from_busy_poll();
  shm.run(
      data, count, dtype, rop, [&] { op.check_progress(-1); },
      [&] {
        (void)op.descriptors();  // throws: the announced descriptors name the mismatch the same way on every rank
        op.fail(FailureKind::Peer, fmt::format("{}: the shared-memory stamps disagree but the announced descriptors agree",
                                              tr.task_name(tr.rank())));
      });
  op.finish();
}

/// The one place that picks an all-reduce algorithm, by size and rank count (options.hpp says
/// when each runs). `count` > 0 and more than one rank.
inline void all_reduce(Transport& tr, Transport::Op& op, std::byte* data, std::size_t count, DType dtype, ReduceOp rop,
                       std::vector<std::byte>& scratch) {
  const CommunicatorOptions& o = tr.options();
  const std::size_t bytes = count * size_of(dtype);
  if (!tr.group_of().empty()) {
    // Several hosts, some with ranks that share memory (topology.hpp): the same choice on every rank.
    op.set_algorithm("hierarchical");
    hierarchical_all_reduce(tr, op, data, count, dtype, rop, scratch);
  } else if (SharedMemoryAllReduce* shm = tr.shared_memory(); shm != nullptr && bytes >= shm->min_bytes()) {
    op.set_algorithm("shared_memory");
    op.count_bytes(bytes, bytes);  // this rank's values into the segment, the result out of it
    shared_memory_all_reduce(tr, op, *shm, data, count, dtype, rop);
  } else if (bytes <= std::min(o.direct_max_bytes, o.max_frame_bytes)) {
    op.set_algorithm("direct");
    direct_all_reduce(tr, op, data, count, dtype, rop, scratch);
  } else if (bytes <= o.halving_doubling_max_bytes && halving_doubling_applies(tr.size())) {
    op.set_algorithm("halving_doubling");
    halving_doubling_all_reduce(tr, op, data, count, dtype, rop, scratch);
  } else {
    op.set_algorithm("ring");
    ring_all_reduce(tr, op, data, count, dtype, rop, scratch);
  }
}

/// Broadcast: small payloads go from the root to everyone directly; large ones flow down the chain
/// root → root+1 → … in chunks, each rank forwarding a chunk as soon as it has it.
inline void chain_broadcast(Transport& tr, Transport::Op& op, std::byte* data, std::size_t bytes, int root) {
  const int n = tr.size(), r = tr.rank();
  if (bytes == 0 || n == 1) return op.finish();
  if (bytes <= std::min(tr.options().direct_max_bytes, tr.options().max_frame_bytes)) {
    op.set_algorithm("direct");
    if (r == root) {
      for (int k = 0; k < n; ++k) {
        if (k != r) op.send(k, 0, std::span<const std::byte>(data, bytes));
      }
    } else {
      op.recv(root, 0, std::span<std::byte>(data, bytes));
    }
    return op.finish();
  }
  op.set_algorithm("chain");
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
  op.set_algorithm("direct");
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

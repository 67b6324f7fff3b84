// The TCP all-reduce algorithms, each among a group of ranks (every rank, or one rank per host in
// a hierarchical all-reduce): a chunked, pipelined ring, halving-doubling for power-of-two groups,
// and a direct exchange (every rank sends its buffer to every other, chunked); the shared-memory
// all-reduce of one host; and broadcast and all-gather. all_reduce.hpp's table picks among the
// all-reduces. Each runs inside one Call, whose descriptor exchange checks that every
// rank is doing the same thing; the all-reduces leave finish() to their caller.
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

#include <fmt/format.h>

#include <distribute/core/elementwise.hpp>
#include <distribute/core/dtype.hpp>
#include <distribute/core/reduce_op.hpp>
#include <distribute/net/detail/shared_memory_all_reduce.hpp>
#include <distribute/net/detail/reduce_bytes.hpp>
#include <distribute/net/detail/transport.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net::detail {

/// The ranks an algorithm runs among, in the order it places them (positions 0 .. size()-1), and
/// this rank's position. Every member must pass the same list.
struct RankGroup {
  std::span<const int> ranks;
  int me = 0;

  int size() const noexcept { return static_cast<int>(ranks.size()); }
  int at(int position) const noexcept { return ranks[static_cast<std::size_t>(position)]; }
};

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

/// Ring all-reduce among `g`: n-1 reduce-scatter steps then n-1 all-gather steps, each step's
/// segment cut in chunks. Chunk c moves on as soon as it is reduced: each receive carries a
/// continuation that reduces the chunk, sends it to the right and posts the receive two steps on,
/// so the thread that read the chunk (the io thread, as a rule) forwards it at once, and the
/// calling thread sleeps until the last chunk is in instead of being woken for every one. Every
/// segment is reduced along one chain and then copied, so all members end bitwise identical; the
/// division `r` asks for is made once, on the segment's last reduction. Returns with every transfer settled.
inline void ring_all_reduce(Transport& tr, Call& op, RankGroup grp, std::byte* data, std::size_t count, DType dtype,
                            Reduction red, std::vector<std::byte>& scratch) {
  const int n = grp.size(), r = grp.me;
  const std::size_t es = size_of(dtype);
  const RingGeometry g(count, n, std::max<std::size_t>(1, tr.chunk_bytes() / es));
  const int left = grp.at((r - 1 + n) % n), right = grp.at((r + 1) % n);
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
      reduce_bytes(dtype, data + b * es, scratch_at(t, c), len, red.op());
      if (t == n - 2 && red.divides()) divide_bytes(dtype, data + b * es, len, red.divisor());
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
  op.settle();  // every continuation has returned: the locals above may go
}

/// True when a halving-doubling all-reduce can run on `n` ranks (a power of two, at least 4: on 2
/// ranks it is the ring's two steps without the ring's overlap of one step with the next).
inline bool halving_doubling_applies(int n) { return n >= 4 && (n & (n - 1)) == 0; }

/// Halving-doubling all-reduce (Rabenseifner) among a power-of-two group: log2(n) reduce-scatter
/// steps by recursive halving, then log2(n) all-gather steps by recursive doubling, instead of the
/// ring's 2(n-1) steps; the bytes each rank sends are the ring's (2(n-1)/n of the buffer).
/// Nearest partners first: in halving step s a member exchanges with position me ^ 2^s, so with
/// the group in host order (Topology::tcp_order) the large early steps stay inside a host and only
/// the small late ones cross hosts (farthest first would send half the buffer across in each
/// direction twice). Halving, a member keeps the lower or upper half of its current range (by bit
/// s of its position), sends the other half to its partner and reduces the partner's copy of its
/// own; doubling retraces the steps backwards, each member sending its range and receiving the
/// partner's adjacent one. Each step's exchange is cut into chunks of about chunk_bytes, reduced
/// as they arrive. Every segment (the ring's cut) ends reduced on one member alone and is then
/// copied, so all end bitwise identical; the division `red` asks for is made there, once.
inline void halving_doubling_all_reduce(Transport& tr, Call& op, RankGroup grp, std::byte* data, std::size_t count,
                                        DType dtype, Reduction red, std::vector<std::byte>& scratch) {
  const int n = grp.size(), r = grp.me;
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

  // Each halving step: the partner (a rank), and the ranges this member keeps (receives into) and
  // sends, as first segment and segment count (both halves of the range it held before the step).
  struct Step {
    int partner, keep, give, len;
  };
  std::vector<Step> halving;
  for (int s = 0, lo = 0, len = n; s < steps; ++s) {
    const int half = len / 2;
    const bool lower = (r & (1 << s)) == 0;
    halving.push_back(Step{grp.at(r ^ (1 << s)), lower ? lo : lo + half, lower ? lo + half : lo, half});
    lo = halving.back().keep;
    len = half;
  }
  // Reduce-scatter receives land in scratch, each step in its own region, all posted up front.
  std::vector<std::size_t> at(static_cast<std::size_t>(steps) + 1, 0);
  for (int s = 0; s < steps; ++s) {
    at[static_cast<std::size_t>(s) + 1] = at[static_cast<std::size_t>(s)] + range(halving[s].keep, halving[s].len).second * es;
  }
  if (scratch.size() < at.back()) scratch.resize(at.back());
  std::vector<std::vector<TransferPtr>> in(static_cast<std::size_t>(steps));
  for (int s = 0; s < steps; ++s) {
    const auto rg = range(halving[s].keep, halving[s].len);
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
    send_range(s, st.partner, range(st.give, st.len), given[s]);
    const auto rg = range(st.keep, st.len);
    const std::size_t nch = pieces(rg.second);
    for (std::size_t c = 0; c < nch; ++c) {
      op.wait(in[s][c]);
      in[s][c].reset();
      const auto [b, len] = piece(rg, c, nch);
      reduce_bytes(dtype, data + b * es, scratch.data() + at[s] + (b - rg.first) * es, len, red.op());
      if (s == steps - 1 && red.divides()) divide_bytes(dtype, data + b * es, len, red.divisor());
    }
  }
  // All-gather by recursive doubling, the halving steps backwards: the partner's range is the one
  // sent to it while halving, so those sends must be out of our memory before it is overwritten.
  for (int s = steps - 1; s >= 0; --s) {
    for (const TransferPtr& t : given[s]) op.wait(t);
  }
  std::vector<std::vector<TransferPtr>> back(static_cast<std::size_t>(steps));
  for (int s = steps - 1; s >= 0; --s) {
    const auto rg = range(halving[s].give, halving[s].len);
    const std::size_t nch = pieces(rg.second);
    for (std::size_t c = 0; c < nch; ++c) {
      const auto [b, len] = piece(rg, c, nch);
      back[s].push_back(op.recv(halving[s].partner, tag(2 * steps - 1 - s, c), std::span<std::byte>(data + b * es, len * es)));
    }
  }
  std::vector<TransferPtr> sent;
  for (int s = steps - 1; s >= 0; --s) {
    const Step& st = halving[s];
    send_range(2 * steps - 1 - s, st.partner, range(st.keep, st.len), sent);
    for (const TransferPtr& t : back[s]) op.wait(t);
  }
}

/// Direct all-reduce among a group: every member sends its buffer to every other, in chunks of
/// about chunk_bytes, and reduces each chunk of all n buffers in position order, so the result is
/// bitwise identical everywhere after one hop. Small buffers take it at any group size (latency
/// beats bandwidth), and two members on two hosts at any size: then it sends what any algorithm
/// must, in one step instead of the ring's two.
///
/// In two halves, so that a hierarchical all-reduce can send chunks as its shared-memory
/// reduce-scatter produces them and reduce them as its all-gather needs them: send_up_to(k) sends
/// the chunks within the first k elements (they must be final in `data`), finish_up_to(k) waits
/// for and reduces every chunk that starts before element k (once sent).
class DirectExchange {
 public:
  /// `chunk_bytes`: the pieces (0: the transport's chunk_bytes).
  DirectExchange(Transport& tr, Call& op, RankGroup grp, std::byte* data, std::size_t count, DType dtype,
                 Reduction red, std::vector<std::byte>& scratch, std::size_t chunk_bytes = 0)
      : op_(op), grp_(grp), data_(data), count_(count), dtype_(dtype), red_(red),
        es_(size_of(dtype)), chunk_(std::max<std::size_t>(1, (chunk_bytes > 0 ? chunk_bytes : tr.chunk_bytes()) / es_)),
        chunks_((count + chunk_ - 1) / chunk_) {
    const auto others = static_cast<std::size_t>(grp.size() - 1);
    if (scratch.size() < others * count * es_) scratch.resize(others * count * es_);
    scratch_ = scratch.data();
    recvs_.resize(others * chunks_);
    sends_.resize(others * chunks_);
    for (int p = 0; p < grp.size(); ++p) {
      if (p == grp.me) continue;
      for (std::size_t c = 0; c < chunks_; ++c) {
        const auto [b, len] = chunk(c);
        recvs_[index(p, c)] = op.recv(grp.at(p), c, std::span<std::byte>(slot(p) + b * es_, len * es_));
      }
    }
  }

  void send_up_to(std::size_t elements) {
    for (; sent_ < chunks_ && std::min((sent_ + 1) * chunk_, count_) <= elements; ++sent_) {
      const auto [b, len] = chunk(sent_);
      for (int p = 0; p < grp_.size(); ++p) {
        if (p != grp_.me) sends_[index(p, sent_)] = op_.send(grp_.at(p), sent_, std::span<const std::byte>(data_ + b * es_, len * es_));
      }
    }
  }

  void finish_up_to(std::size_t elements) {
    for (; done_ < sent_ && done_ * chunk_ < elements; ++done_) {
      const auto [b, len] = chunk(done_);
      for (int p = 0; p < grp_.size(); ++p) {
        if (p == grp_.me) continue;
        op_.wait(recvs_[index(p, done_)]);
        op_.wait(sends_[index(p, done_)]);  // our chunk is out: it may be overwritten
      }
      std::byte* const mine = data_ + b * es_;
      if (grp_.me == 0) {
        for (int p = 1; p < grp_.size(); ++p) reduce_bytes(dtype_, mine, slot(p) + b * es_, len, red_.op());
      } else {
        std::byte* const acc = slot(0) + b * es_;
        for (int p = 1; p < grp_.size(); ++p) reduce_bytes(dtype_, acc, p == grp_.me ? mine : slot(p) + b * es_, len, red_.op());
        std::memcpy(mine, acc, len * es_);
      }
      if (red_.divides()) divide_bytes(dtype_, mine, len, red_.divisor());
    }
  }

 private:
  std::pair<std::size_t, std::size_t> chunk(std::size_t c) const {
    return {c * chunk_, std::min(chunk_, count_ - c * chunk_)};
  }
  std::size_t index(int p, std::size_t c) const {
    return static_cast<std::size_t>(p < grp_.me ? p : p - 1) * chunks_ + c;
  }
  std::byte* slot(int p) const { return scratch_ + static_cast<std::size_t>(p < grp_.me ? p : p - 1) * count_ * es_; }

  Call& op_;
  RankGroup grp_;
  std::byte* data_;
  std::size_t count_;
  DType dtype_;
  Reduction red_;
  std::size_t es_, chunk_, chunks_;
  std::byte* scratch_ = nullptr;
  std::vector<TransferPtr> recvs_, sends_;
  std::size_t sent_ = 0, done_ = 0;
};

inline void direct_all_reduce(Transport& tr, Call& op, RankGroup grp, std::byte* data, std::size_t count, DType dtype,
                              Reduction red, std::vector<std::byte>& scratch) {
  DirectExchange exchange(tr, op, grp, data, count, dtype, red, scratch);
  exchange.send_up_to(count);
  exchange.finish_up_to(count);
}

/// All-reduce through the transport's shared-memory segment (shared_memory_all_reduce.hpp).
inline void shared_memory_all_reduce(Transport& tr, Call& op, SharedMemoryAllReduce& shm, std::byte* data,
                                     std::size_t count, DType dtype, Reduction red) {
  const auto quiet = tr.exempt_from_busy_poll();
  shm.run(
      data, count, dtype, red, [&] { op.check_progress(-1); },
      [&] {
        (void)op.descriptors();  // throws: the announced descriptors name the mismatch the same way on every rank
        op.fail(FailureKind::Peer, fmt::format("{}: the shared-memory stamps disagree but the announced descriptors agree",
                                              tr.task_name(tr.rank())));
      });
}

/// Broadcast: small payloads go from the root to everyone directly; large ones flow down the chain
/// root → root+1 → … in chunks, each rank forwarding a chunk as soon as it has it.
inline void chain_broadcast(Transport& tr, Call& op, std::byte* data, std::size_t bytes, int root) {
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
inline void direct_all_gather(Transport& tr, Call& op, const std::byte* data, std::size_t bytes,
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

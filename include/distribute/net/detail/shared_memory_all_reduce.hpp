// All-reduce through a segment of shared memory, for communicators whose ranks all run on one
// host: two copies of the buffer per rank (in and out) and a reduction, instead of the TCP path's
// two kernel copies per byte sent plus the TCP stack on both ends. OpenMPI's shared-memory
// transport (vader) is the same idea.
//
// The segment holds a control line per rank, one slot per rank and a result slot. A buffer goes
// through in pieces of at most a slot. For each piece, every rank:
//   1. waits until every rank has copied the previous piece's result out (slots are reused),
//   2. copies its piece into its slot and publishes its stamp in `arrived`,
//   3. waits for every rank's `arrived`, reduces its own slice of the piece across all slots in
//      rank order into its buffer, copies that slice into the result slot and publishes `reduced`,
//   4. waits for every rank's `reduced`, copies the other slices of the result out and publishes
//      `left`.
// Every element is reduced by one rank in one order, so all ranks end bitwise identical. Stamps
// count pieces since the segment was made and advance alike on every rank.
//
// The segment also holds the board of the agreement (shared_memory_agreement.hpp), before this
// part. Failures come through TCP: while waiting here, a rank asks the call (`check`) every few
// hundred polls, which throws on a lost peer (EOF, heartbeat), a passed deadline, or an announced
// descriptor that disagrees. Each rank also leaves its call's count, dtype and op next to its
// stamp, and a rank that reads a different one stops before touching the data and lets the
// announced descriptors name the mismatch.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>
#include <memory>
#include <new>
#include <optional>
#include <thread>
#include <utility>

#include <distribute/core/cpu_relax.hpp>
#include <distribute/core/dtype.hpp>
#include <distribute/core/error.hpp>
#include <distribute/core/reduce_op.hpp>
#include <distribute/net/detail/protocol.hpp>
#include <distribute/net/detail/reduce_bytes.hpp>
#include <distribute/net/detail/shared_segment.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net::detail {

/// One rank's control line in the segment; each counter on its own cache line.
struct SharedRankControl {
  alignas(64) std::atomic<std::uint64_t> arrived{0};
  alignas(64) std::atomic<std::uint64_t> reduced{0};
  alignas(64) std::atomic<std::uint64_t> left{0};
  // The call the piece stamped `arrived` belongs to (written before `arrived`).
  alignas(64) std::uint64_t count = 0;
  std::uint32_t dtype = 0;
  std::uint32_t op = 0;
  // run_small's call (count, dtype << 8 | op) by stamp parity: a rank may write the next one
  // while a slower one still reads this one.
  std::uint64_t small_call[2][2] = {};
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "shared-memory counters must be lock-free");

/// Part k of `count` elements cut in `parts` (sizes differ by at most one element, the longer
/// first), as [first element, count): the ring's cut.
inline std::pair<std::size_t, std::size_t> even_part(std::size_t count, int parts, int k) noexcept {
  const auto p = static_cast<std::size_t>(parts), u = static_cast<std::size_t>(k);
  const std::size_t base = count / p, rem = count % p;
  return {u * base + std::min(u, rem), base + (u < rem ? 1 : 0)};
}

class SharedMemoryAllReduce {
 public:
  /// The bytes this part of a segment takes: a control line per rank, then a slot per rank and
  /// the result slot (last in the segment).
  static std::size_t part_bytes(int ranks, std::size_t slot_bytes) {
    return static_cast<std::size_t>(ranks) * sizeof(SharedRankControl) + (static_cast<std::size_t>(ranks) + 1) * slot_bytes;
  }

  /// Constructs the control lines of a new segment's part at `offset`: by its creator, before any
  /// other rank is told its name.
  static void initialize(SharedSegment& segment, std::size_t offset, int ranks) {
    for (int r = 0; r < ranks; ++r) {
      new (segment.data() + offset + static_cast<std::size_t>(r) * sizeof(SharedRankControl)) SharedRankControl;
    }
  }

  /// Its part of `segment` starts at `offset` (whole cache lines).
  SharedMemoryAllReduce(std::shared_ptr<SharedSegment> segment, std::size_t offset, int ranks, int rank,
                        std::size_t slot_bytes, std::size_t min_bytes)
      : segment_(std::move(segment)), base_(segment_->data() + offset), n_(ranks), rank_(rank), slot_bytes_(slot_bytes),
        min_bytes_(min_bytes) {}

  std::size_t min_bytes() const noexcept { return min_bytes_; }

  /// `check()` throws when the call cannot complete (see the header comment); `mismatch()` is
  /// called when a rank's shared descriptor differs from ours, and must throw.
  template <class Check, class Mismatch>
  void run(std::byte* data, std::size_t count, DType dtype, Reduction red, Check&& check, Mismatch&& mismatch) {
    const std::size_t es = size_of(dtype);
    if (count * es <= std::min(kSmallBytes, slot_bytes_ / 2)) return run_small(data, count, dtype, red, check, mismatch);
    const std::uint32_t op = stamp_code(red);
    const std::size_t piece_elems = std::max<std::size_t>(1, slot_bytes_ / es);
    const auto nu = static_cast<std::size_t>(n_);
    for (std::size_t first = 0; first < count; first += piece_elems) {
      const std::size_t len = std::min(piece_elems, count - first);
      const std::uint64_t stamp = ++stamp_;
      std::byte* const piece = data + first * es;

      wait_all(&SharedRankControl::left, stamp - 1, check);
      SharedRankControl& me = control(rank_);
      std::memcpy(slot(rank_), piece, len * es);
      me.count = count;
      me.dtype = static_cast<std::uint32_t>(dtype);
      me.op = op;
      me.arrived.store(stamp, std::memory_order_release);

      wait_all(&SharedRankControl::arrived, stamp, check);
      for (int r = 0; r < n_; ++r) {
        const SharedRankControl& c = control(r);
        if (c.count != count || c.dtype != static_cast<std::uint32_t>(dtype) || c.op != op) {
          mismatch();
        }
      }
      // This rank's slice of the piece, cut as the ring cuts a buffer (sizes differ by at most one).
      const auto ru = static_cast<std::size_t>(rank_);
      const std::size_t lo = ru * (len / nu) + std::min(ru, len % nu);
      const std::size_t hi = lo + len / nu + (ru < len % nu ? 1 : 0);
      // Reduced into the caller's buffer, where the slice ends anyway (rank 0's own data already
      // is slot 0's), then published in the result slot for the others.
      if (hi > lo) {
        std::byte* const out = piece + lo * es;
        sources_.resize(nu);
        for (std::size_t r = 0; r < nu; ++r) sources_[r] = slot(static_cast<int>(r)) + lo * es;
        reduce_many_bytes(dtype, out, sources_, hi - lo, red);  // 16-bit floats: rounded once
        std::memcpy(result() + lo * es, out, (hi - lo) * es);
      }
      me.reduced.store(stamp, std::memory_order_release);

      wait_all(&SharedRankControl::reduced, stamp, check);
      std::memcpy(piece, result(), lo * es);
      std::memcpy(piece + hi * es, result() + hi * es, (len - hi) * es);
      me.left.store(stamp, std::memory_order_release);
    }
  }

  /// All-reduces up to this many bytes in one step (run_small).
  static constexpr std::size_t kSmallBytes = std::size_t{32} << 10;

  /// A small buffer in one step: each rank copies it into its half-slot of this stamp's parity,
  /// waits for every rank's, and reduces all of them in rank order itself (the same result on
  /// every rank). One wait instead of run()'s three: the half it writes was last read at stamp - 2,
  /// which every rank finished before it arrived at stamp - 1, which this rank waited for. It still
  /// publishes `reduced` and `left`, which run()'s next piece waits on.
  template <class Check, class Mismatch>
  void run_small(std::byte* data, std::size_t count, DType dtype, Reduction red, Check& check, Mismatch& mismatch) {
    const std::size_t bytes = count * size_of(dtype);
    const std::uint64_t stamp = ++stamp_;
    const std::size_t half = stamp % 2 == 0 ? 0 : slot_bytes_ / 2 / 64 * 64;  // whole lines: aligned for every dtype
    SharedRankControl& me = control(rank_);
    std::memcpy(slot(rank_) + half, data, bytes);
    const std::uint64_t call = static_cast<std::uint64_t>(dtype) << 8 | stamp_code(red);
    me.small_call[stamp % 2][0] = count;
    me.small_call[stamp % 2][1] = call;
    me.arrived.store(stamp, std::memory_order_release);
    wait_all(&SharedRankControl::arrived, stamp, check);
    for (int r = 0; r < n_; ++r) {
      const SharedRankControl& c = control(r);
      if (c.small_call[stamp % 2][0] != count || c.small_call[stamp % 2][1] != call) mismatch();
    }
    sources_.resize(nu());
    for (std::size_t r = 0; r < nu(); ++r) sources_[r] = slot(static_cast<int>(r)) + half;
    reduce_many_bytes(dtype, data, sources_, count, red);
    me.reduced.store(stamp, std::memory_order_release);
    me.left.store(stamp, std::memory_order_release);
  }

  /// Copies `bytes` of rank 0's (in this segment) `data` into every other rank's, through the
  /// result slot in pieces; stamps advance as in run(). `check` as for run().
  template <class Check>
  void broadcast_from_first(std::byte* data, std::size_t bytes, Check&& check) {
    for (std::size_t first = 0; first < bytes; first += slot_bytes_) {
      const std::size_t len = std::min(slot_bytes_, bytes - first);
      const std::uint64_t stamp = ++stamp_;
      wait_all(&SharedRankControl::left, stamp - 1, check);
      SharedRankControl& me = control(rank_);
      if (rank_ == 0) std::memcpy(result(), data + first, len);
      me.count = bytes;
      me.arrived.store(stamp, std::memory_order_release);
      wait_all(&SharedRankControl::arrived, stamp, check);
      if (rank_ != 0) std::memcpy(data + first, result(), len);
      me.reduced.store(stamp, std::memory_order_release);
      me.left.store(stamp, std::memory_order_release);
    }
  }

  /// Reduce-scatter into `slices` (1 .. ranks) parts of the buffer cut as even_part() cuts it:
  /// part s ends reduced over this segment's ranks (in rank order) in the buffer of rank s, for
  /// hierarchical_all_reduce.hpp. In rounds, so that each part goes through every slot at once:
  /// each round every rank copies the next piece of every part into its slot (a slot/slices
  /// share each), and rank s reduces piece s of every slot into its buffer, then calls
  /// `on_reduced(first, count)` with the elements it just finished. A rank reads others' slots
  /// only between their `arrived` and its own `left`, and every writer waits for every `left`.
  /// `round_bytes` (0: no limit) caps each part's share of a round, so that a caller that sends
  /// what was reduced gets its first pieces early. The parts are not divided: `partial` combines
  /// a share of a larger reduction whose owner divides.
  template <class Check, class Mismatch, class OnReduced>
  void reduce_scatter(std::byte* data, std::size_t count, DType dtype, Reduction partial, int slices,
                      std::size_t round_bytes, Check&& check, Mismatch&& mismatch, OnReduced&& on_reduced) {
    const Reduction red = partial.undivided();
    const std::size_t es = size_of(dtype);
    const auto su = static_cast<std::size_t>(slices);
    const std::size_t share = std::min(slot_bytes_ / su, round_bytes > 0 ? round_bytes : slot_bytes_) / es;  // per part and round
    if (share == 0) {
      // A slot too small to split (a few bytes per part): an all-reduce leaves every part everywhere.
      run(data, count, dtype, red, check, mismatch);
      if (rank_ < slices) {
        const auto [first, len] = even_part(count, slices, rank_);
        on_reduced(first, len);
      }
      return;
    }
    const std::size_t longest = even_part(count, slices, 0).second;
    const std::uint32_t call = stamp_code(red) | 1u << 8 | static_cast<std::uint32_t>(slices) << 16;
    SharedRankControl& me = control(rank_);
    for (std::size_t done = 0; done < longest; done += share) {
      const std::uint64_t stamp = ++stamp_;
      wait_all(&SharedRankControl::left, stamp - 1, check, kYieldAcrossHosts);
      for (int s = 0; s < slices; ++s) {
        const auto [first, len] = round_piece(count, slices, s, done, share);
        std::memcpy(slot(rank_) + static_cast<std::size_t>(s) * share * es, data + first * es, len * es);
      }
      publish(me, count, dtype, call, stamp);
      wait_all(&SharedRankControl::arrived, stamp, check, kYieldAcrossHosts);
      agree(count, dtype, call, mismatch);
      if (rank_ < slices) {
        const auto [first, len] = round_piece(count, slices, rank_, done, share);
        sources_.resize(nu());
        for (std::size_t r = 0; r < nu(); ++r) sources_[r] = slot(static_cast<int>(r)) + static_cast<std::size_t>(rank_) * share * es;
        reduce_many_bytes(dtype, data + first * es, sources_, len, red);
        me.reduced.store(stamp, std::memory_order_release);
        me.left.store(stamp, std::memory_order_release);
        if (len > 0) on_reduced(first, len);
      } else {
        me.reduced.store(stamp, std::memory_order_release);
        me.left.store(stamp, std::memory_order_release);
      }
    }
  }

  /// All-gather of the parts reduce_scatter() left: rank s (< slices) holds part s, and every rank
  /// ends with all of them. In rounds of a slot per part: rank s first calls
  /// `before_publish(first, count)` (the elements must be final when it returns), copies them into
  /// its own slot, and every other rank copies them out. The last round waits until every rank
  /// has copied, so that no read of a slot outlives the call. `round_bytes` as for reduce_scatter().
  template <class Check, class Mismatch, class BeforePublish>
  void all_gather(std::byte* data, std::size_t count, DType dtype, int slices, std::size_t round_bytes, Check&& check,
                  Mismatch&& mismatch, BeforePublish&& before_publish) {
    const std::size_t es = size_of(dtype);
    const std::size_t share = std::max<std::size_t>(1, std::min(slot_bytes_, round_bytes > 0 ? round_bytes : slot_bytes_) / es);
    const std::size_t longest = even_part(count, slices, 0).second;
    const std::uint32_t call = 2u << 8 | static_cast<std::uint32_t>(slices) << 16;
    SharedRankControl& me = control(rank_);
    for (std::size_t done = 0; done < longest; done += share) {
      const std::uint64_t stamp = ++stamp_;
      const bool last = done + share >= longest;
      wait_all(&SharedRankControl::left, stamp - 1, check, kYieldAcrossHosts);
      if (rank_ < slices) {
        const auto [first, len] = round_piece(count, slices, rank_, done, share);
        if (len > 0) before_publish(first, len);
        std::memcpy(slot(rank_), data + first * es, len * es);
      }
      publish(me, count, dtype, call, stamp);
      wait_all(&SharedRankControl::arrived, stamp, check, kYieldAcrossHosts);
      agree(count, dtype, call, mismatch);
      for (int s = 0; s < slices; ++s) {
        if (s == rank_) continue;
        const auto [first, len] = round_piece(count, slices, s, done, share);
        std::memcpy(data + first * es, slot(s), len * es);
      }
      me.reduced.store(stamp, std::memory_order_release);
      if (last) wait_all(&SharedRankControl::reduced, stamp, check, kYieldAcrossHosts);
      me.left.store(stamp, std::memory_order_release);
    }
  }

 private:
  // [first element, count) of part s's piece in the round that starts `done` elements into it.
  static std::pair<std::size_t, std::size_t> round_piece(std::size_t count, int parts, int s, std::size_t done,
                                                         std::size_t share) {
    const auto [first, len] = even_part(count, parts, s);
    if (done >= len) return {first + len, 0};
    return {first + done, std::min(share, len - done)};
  }
  void publish(SharedRankControl& me, std::size_t count, DType dtype, std::uint32_t call, std::uint64_t stamp) noexcept {
    me.count = count;
    me.dtype = static_cast<std::uint32_t>(dtype);
    me.op = call;
    me.arrived.store(stamp, std::memory_order_release);
  }
  template <class Mismatch>
  void agree(std::size_t count, DType dtype, std::uint32_t call, Mismatch& mismatch) const {
    for (int r = 0; r < n_; ++r) {
      const SharedRankControl& c = control(r);
      if (c.count != count || c.dtype != static_cast<std::uint32_t>(dtype) || c.op != call) mismatch();
    }
  }

  // The reduction in a rank's stamp: its op, and whether it divides (a MEAN against a SUM must
  // not agree). Below 8 bits: the callers put more beside it.
  static constexpr std::uint32_t stamp_code(Reduction red) noexcept {
    return static_cast<std::uint32_t>(red.op()) | (red.divides() ? 0x80u : 0u);
  }

  SharedRankControl& control(int r) const noexcept {
    return *std::launder(reinterpret_cast<SharedRankControl*>(base_ + static_cast<std::size_t>(r) * sizeof(SharedRankControl)));
  }
  std::byte* slot(int r) const noexcept {
    return base_ + nu() * sizeof(SharedRankControl) + static_cast<std::size_t>(r) * slot_bytes_;
  }
  std::byte* result() const noexcept { return slot(n_); }
  std::size_t nu() const noexcept { return static_cast<std::size_t>(n_); }

  // How long a wait yields the core before it sleeps. On one host the others are a copy away. In
  // a hierarchical all-reduce (reduce_scatter, all_gather) they may be waiting for the network
  // themselves, and a rank that yields for long takes turns on the core with them: 2 ms there
  // took a 1 MiB all-reduce across two simulated hosts from 11-12 to 16-17 ms (docs/performance.md).
  static constexpr std::chrono::microseconds kYieldOneHost{2000};
  static constexpr std::chrono::microseconds kYieldAcrossHosts{50};

  // Until every rank's `counter` reaches `stamp`: spins briefly (the others are usually a copy
  // away), then yields the core (which may be shared with them) for `yield_for`, then sleeps in
  // short steps so that a rank still computing its step does not cost a whole core. `check` runs
  // every 256 rounds once spinning has not sufficed.
  template <class Check>
  void wait_all(std::atomic<std::uint64_t> SharedRankControl::*counter, std::uint64_t stamp, Check& check,
                std::chrono::microseconds yield_for = kYieldOneHost) const {
    auto ready = [&] {
      for (int r = 0; r < n_; ++r) {
        if ((control(r).*counter).load(std::memory_order_acquire) < stamp) return false;
      }
      return true;
    };
    constexpr int kSpins = 100;
    for (int i = 0; i < kSpins; ++i) {
      if (ready()) return;
      ::distribute::core::cpu_relax();
    }
    const auto start = std::chrono::steady_clock::now();
    for (std::uint32_t i = 0;; ++i) {
      if (ready()) return;
      if (i % 256 == 0) check();
      if (std::chrono::steady_clock::now() - start < yield_for) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }

  std::shared_ptr<SharedSegment> segment_;
  std::byte* base_;
  int n_;
  int rank_;
  std::size_t slot_bytes_;
  std::size_t min_bytes_;
  std::vector<const void*> sources_;  // this rank's slice in every slot
  std::uint64_t stamp_ = 0;
};

}  // namespace net::detail
DISTRIBUTE_END_NAMESPACE

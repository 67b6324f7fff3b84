// ReplicaGroup: the rendezvous of the local replicas of one strategy inside one step.
//
// A collective is "publish my call, barrier, work on everybody's buffers, barrier". The barrier
// can be aborted (a replica failed) and detects a replica that returned from its step function
// while others wait, so a step can never hang on a missing participant.
#pragma once

#include <algorithm>
#include <atomic>
#include <functional>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <typeinfo>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/spin_wait.hpp>
#include <distribute/core/dtype.hpp>
#include <distribute/core/error.hpp>
#include <distribute/core/memory_space.hpp>
#include <distribute/core/reduce_op.hpp>
#include <distribute/core/shape.hpp>


DISTRIBUTE_BEGIN_NAMESPACE
namespace core {

/// A contiguous buffer of one replica as the collectives see it.
struct BufferRef {
  void* data = nullptr;
  DType dtype = DType::F32;
  Shape shape = {};
  /// Device buffers (the Thrust device system's memory) are not readable on the host: the
  /// collectives either hand them to a device library (NCCL) or copy them through `device`.
  MemorySpace memory = MemorySpace::host;
  const DeviceMemoryAccess* device = nullptr;  // set when memory == device
  /// Out of place: the collective reads this replica's value here and writes the result to `data`
  /// (host memory, for collectives whose reads_sources() is true). Null: in place, at `data`.
  const void* source = nullptr;
  const void* input() const noexcept { return source != nullptr ? source : data; }
  /// `data` is memory the caller gave for the result (all_reduce_into): every replica checks it
  /// against the other replicas' inputs and outputs before any is written.
  bool caller_output = false;
  std::size_t count() const { return static_cast<std::size_t>(num_elements(shape)); }
  std::size_t bytes() const { return count() * size_of(dtype); }
};

enum class CollectiveKind : std::uint8_t { AllReduce, AllGather, Broadcast, MergeCall, ReduceScatter, AllToAll };

constexpr std::string_view to_string(CollectiveKind k) noexcept {
  switch (k) {
    case CollectiveKind::AllReduce: return "all_reduce";
    case CollectiveKind::AllGather: return "all_gather";
    case CollectiveKind::Broadcast: return "broadcast";
    case CollectiveKind::MergeCall: return "merge_call";
    case CollectiveKind::ReduceScatter: return "reduce_scatter";
    case CollectiveKind::AllToAll: return "all_to_all";
  }
  return "?";
}

/// What one replica brings to a collective; the others read it between the two barriers.
struct CollectiveCall {
  CollectiveKind kind = CollectiveKind::AllReduce;
  ReduceOp op = ReduceOp::Sum;
  std::span<BufferRef> buffers = {};
  int axis = 0;  // all_gather: the axis; all_to_all: 1 when the pieces are one value split along axis 0
  int root = 0;
  const std::type_info* merge_type = nullptr;
  void* merge_args = nullptr;
  void* merge_outcome = nullptr;  // replica 0's result of merge_call
};

class ReplicaGroup {
 public:
  explicit ReplicaGroup(int size)
      : size_(size),
        slots_(static_cast<std::size_t>(size), nullptr),
        spin_limit_(spin_budget(size)) {}

  /// Pause iterations a waiter spins before yielding, then sleeping: a few microseconds when
  /// every replica (and the launching thread) has a core of its own, next to none otherwise,
  /// where spinning steals the core from the replica being waited for.
  static unsigned spin_budget(int threads) noexcept {
    return static_cast<unsigned>(threads) + 1 <= std::max(1u, std::thread::hardware_concurrency()) ? 2000 : 16;
  }

  int size() const noexcept { return size_; }

  /// Called by the launching thread while no replica runs.
  void begin_step() noexcept {
    arrived_.store(0, std::memory_order_relaxed);
    aborted_.store(false, std::memory_order_relaxed);
    first_finished_.store(-1, std::memory_order_relaxed);
    collective_failed_.store(-1, std::memory_order_relaxed);
    std::fill(slots_.begin(), slots_.end(), nullptr);
    std::atomic_thread_fence(std::memory_order_release);
  }

  /// Waits until every replica has arrived. Throws Cancelled when the step was aborted, and
  /// InvalidArgument when a replica left its step function instead of arriving.
  void arrive_and_wait(int replica, CollectiveKind what) {
    if (size_ == 1) return;
    check_alive(replica, what);
    const auto gen = generation_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == size_) {
      arrived_.store(0, std::memory_order_relaxed);
      generation_.store(gen + 1, std::memory_order_release);
      signal();
      return;
    }
    core::SpinThenWait backoff(spin_limit_);
    for (;;) {
      const auto s = events_.load(std::memory_order_acquire);
      if (generation_.load(std::memory_order_acquire) != gen) return;
      if (failure_pending()) {
        // The last replica may have completed this barrier and then failed or finished its
        // step between our two loads: a completed barrier wins over a later failure.
        if (generation_.load(std::memory_order_acquire) != gen) return;
        check_alive(replica, what);
      }
      backoff.pause(events_, s);
    }
  }

  /// Marks the step failed and wakes every waiting replica.
  void abort() noexcept {
    aborted_.store(true, std::memory_order_release);
    signal();
  }
  bool aborted() const noexcept { return aborted_.load(std::memory_order_acquire); }

  /// A replica returned from its step function (normally or not).
  void finish(int replica) noexcept {
    int expected = -1;
    first_finished_.compare_exchange_strong(expected, replica, std::memory_order_acq_rel);
    signal();
  }

  /// A replica failed inside a collective's work; the others must not use its result.
  void mark_collective_failed(int replica) noexcept {
    int expected = -1;
    collective_failed_.compare_exchange_strong(expected, replica, std::memory_order_acq_rel);
  }
  int collective_failed_replica() const noexcept { return collective_failed_.load(std::memory_order_acquire); }

  void publish(int replica, const CollectiveCall* call) noexcept { slots_[static_cast<std::size_t>(replica)] = call; }
  const CollectiveCall& slot(int replica) const noexcept { return *slots_[static_cast<std::size_t>(replica)]; }

 private:
  void signal() noexcept {
    events_.fetch_add(1, std::memory_order_acq_rel);
    events_.notify_all();
  }

  bool failure_pending() const noexcept {
    return aborted_.load(std::memory_order_acquire) || first_finished_.load(std::memory_order_acquire) >= 0;
  }

  void check_alive(int replica, CollectiveKind what) const;  // below

  const int size_;
  std::vector<const CollectiveCall*> slots_;
  const unsigned spin_limit_;
  alignas(64) std::atomic<int> arrived_{0};
  alignas(64) std::atomic<std::uint32_t> generation_{0};
  alignas(64) std::atomic<std::uint32_t> events_{0};
  std::atomic<bool> aborted_{false};
  std::atomic<int> first_finished_{-1};
  std::atomic<int> collective_failed_{-1};
};

/// The collectives a strategy offers its replicas inside a step. One implementation per
/// cross-device algorithm (collective/), composed by strategies; MultiWorker wraps a local one.
class ReplicaCollectives {
 public:
  virtual ~ReplicaCollectives() = default;
  /// All-reduce of `buffers` (same dtypes/shapes on every replica): in place, or out of place for
  /// buffers with a `source` where reads_sources(). Mean divides by `num_replicas_in_sync`.
  virtual void all_reduce(ReplicaGroup& group, int replica, std::span<BufferRef> buffers, ReduceOp op) = 0;
  /// Whether all_reduce reads BufferRef::source (else a caller copies the input into `data` first).
  virtual bool reads_sources() const noexcept { return false; }
  /// Concatenation along `axis`; `allocate(shape)` returns where this replica's result goes.
  virtual void all_gather(ReplicaGroup& group, int replica, const BufferRef& input, int axis,
                          const std::function<void*(const Shape&)>& allocate) = 0;
  /// Copies root's buffer into every replica's buffer.
  virtual void broadcast(ReplicaGroup& group, int replica, BufferRef buffer, int root) = 0;
  /// Reduces `input` (rank >= 1, the same dtype and shape on every replica) across all replicas
  /// and writes this replica's part of axis 0 (collective/detail/scatter.hpp's split) to
  /// `allocate(part shape)`. `input` may be overwritten (the callers pass their own copy).
  virtual void reduce_scatter(ReplicaGroup& group, int replica, BufferRef input, ReduceOp op,
                              const std::function<void*(const Shape&)>& allocate) {
    (void)group, (void)replica, (void)input, (void)op, (void)allocate;
    throw Unavailable("reduce_scatter: these cross-device ops do not implement it");
  }
  /// `pieces[j]` goes to the replica with replica_id_in_sync_group j. `allocate(shapes)` is given
  /// the shapes of the pieces this replica receives, from replica 0, 1, ..., and returns where
  /// each goes. `split`: the pieces are one value cut along axis 0 (their other axes must agree).
  virtual void all_to_all(ReplicaGroup& group, int replica, std::span<BufferRef> pieces, bool split,
                          const std::function<std::vector<void*>(const std::vector<Shape>&)>& allocate) {
    (void)group, (void)replica, (void)pieces, (void)split, (void)allocate;
    throw Unavailable("all_to_all: these cross-device ops do not implement it");
  }
};

#if DISTRIBUTE_DETAIL_DEFINE  // compiled apart with DISTRIBUTE_SEPARATE_COMPILATION (version.hpp)
DISTRIBUTE_DECL void ReplicaGroup::check_alive(int replica, CollectiveKind what) const {
  if (aborted_.load(std::memory_order_acquire)) {
    throw Cancelled(fmt::format("replica {} left {}: another replica of this step failed", replica, to_string(what)));
  }
  if (int f = first_finished_.load(std::memory_order_acquire); f >= 0) {
    throw InvalidArgument(fmt::format(
        "replica {} returned from its step function while replica {} waits in {}: every replica must issue the "
        "same collectives in the same order",
        f, replica, to_string(what)));
  }
}
#endif

}  // namespace core
DISTRIBUTE_END_NAMESPACE

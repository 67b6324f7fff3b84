// NcclAllReduce: the cuda backend's cross-device ops (TF's tf.distribute.NcclAllReduce). One NCCL
// communicator per local GPU, made once per strategy with ncclCommInitAll; each replica thread
// issues its NCCL calls on its own communicator and its own stream (ds::cuda::current_stream()).
// Across workers (MultiWorkerMirroredStrategy<ds::cuda>, CommunicationImplementation::Nccl) the
// communicators span every GPU of every worker, bootstrapped over the workers' TCP link
// (ncclGetUniqueId on the chief, ncclCommInitRank everywhere). An all-reduce's values travel in
// packs (collective/packing.hpp): one ncclAllReduce per pack.
//
// Compiled in only where it can work: under a CUDA compiler (__CUDACC__), with <nccl.h> on the
// include path, and with Thrust's device system left at CUDA, so that device values are CUDA
// memory. g++ may well see <nccl.h> (it often sits in /usr/local/include) but compiles no device
// code, and under an OpenMP/CPP Thrust system "device" memory is host memory that NCCL cannot
// take. Elsewhere this header defines DISTRIBUTE_HAS_NCCL to 0 and nothing else; define
// DISTRIBUTE_NO_NCCL to leave NCCL out on purpose. Link with -lnccl (meson: nccl_dep).
//
// Buffers NCCL cannot take (host memory, int16/uint16 reductions) fall back, on every replica
// alike, to the shared-memory algorithm (across workers: the TCP path), device buffers through
// host copies.
#pragma once

#include <distribute/version.hpp>

#if defined(__CUDACC__) && __has_include(<nccl.h>) && !defined(DISTRIBUTE_NO_NCCL)
#include <thrust/detail/config.h>
#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
#define DISTRIBUTE_HAS_NCCL 1
#endif
#endif
#ifndef DISTRIBUTE_HAS_NCCL
#define DISTRIBUTE_HAS_NCCL 0
#endif

#if DISTRIBUTE_HAS_NCCL

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <cuda_runtime.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nccl.h>
#include <thrust/execution_policy.h>
#include <thrust/transform.h>

#include <distribute/backends/cuda/device_ops.hpp>
#include <distribute/backends/cuda/runtime.hpp>
#include <distribute/backends/cuda/error.hpp>
#include <distribute/collective/communication_options.hpp>
#include <distribute/collective/detail/bootstrap.hpp>
#include <distribute/collective/detail/nccl_gather.hpp>
#include <distribute/collective/detail/nccl_support.hpp>
#include <distribute/collective/detail/nccl_scatter.hpp>
#include <distribute/collective/device_staging.hpp>
#include <distribute/collective/validate.hpp>
#include <distribute/collective/packing.hpp>
#include <distribute/collective/shared_memory.hpp>
#include <distribute/core/cross_worker.hpp>
#include <distribute/core/replica_group.hpp>
#include <distribute/core/device.hpp>
#include <distribute/core/error.hpp>
#include <distribute/observe/call_observation.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

namespace collective::detail {

class NcclCollectives final : public core::ReplicaCollectives {
 public:
  /// One process: one NCCL rank per local GPU, made with ncclCommInitAll.
  explicit NcclCollectives(const CollectivesConfig& config)
      : NcclCollectives(config, with_device_staging(SharedMemoryAllReduce::make_collectives(config)),
                        nullptr) {
    int current = 0;
    backends::cuda_check(cudaGetDevice(&current), "cudaGetDevice", "NcclAllReduce");
    backends::CudaDeviceGuard restore(current);  // ncclCommInitAll visits every device
    nccl_check(ncclCommInitAll(comms_.data(), static_cast<int>(gpus_.size()), gpus_.data()),
               fmt::format("ncclCommInitAll over GPUs {}", fmt::join(gpus_, ", ")));
  }

  /// Several worker processes (MultiWorkerMirroredStrategy<ds::cuda> with NCCL): one NCCL rank per
  /// GPU of every worker, global rank = worker_index × local GPUs + local index (= the replica's
  /// replica_id_in_sync_group). The chief's ncclUniqueId reaches the others over `link`; each
  /// worker then joins with ncclCommInitRank, one call per local GPU inside one NCCL group.
  /// `fallback` (the TCP path over `link`) takes the calls NCCL cannot, and every all_gather.
  NcclCollectives(const CollectivesConfig& config, core::CrossWorkerLink& link, std::unique_ptr<core::ReplicaCollectives> fallback)
      : NcclCollectives(config, std::move(fallback), &link) {
    const int local = static_cast<int>(gpus_.size());
    check_same_on_every_worker(link, local, "MultiWorkerMirroredStrategy with NCCL: the number of local GPUs");
    ranks_ = local * link.num_workers();
    rank_offset_ = local * link.worker_index();
    const ncclUniqueId id = broadcast_from_chief<ncclUniqueId>(
        link,
        [] {
          ncclUniqueId made;
          nccl_check(ncclGetUniqueId(&made), "ncclGetUniqueId");
          return made;
        },
        "the NCCL unique id");
    int current = 0;
    backends::cuda_check(cudaGetDevice(&current), "cudaGetDevice", "NcclAllReduce");
    backends::CudaDeviceGuard restore(current);
    try {
      nccl_check(ncclGroupStart(), "ncclGroupStart");
      ncclResult_t issued = ncclSuccess;
      cudaError_t selected = cudaSuccess;
      int at = 0;
      for (; at < local; ++at) {
        const auto i = static_cast<std::size_t>(at);
        selected = cudaSetDevice(gpus_[i]);
        if (selected != cudaSuccess) break;
        issued = ncclCommInitRank(&comms_[i], ranks_, id, rank_offset_ + at);
        if (issued != ncclSuccess) break;
      }
      const ncclResult_t ended = ncclGroupEnd();
      backends::cuda_check(selected, "cudaSetDevice", "NcclAllReduce");
      nccl_check(issued, fmt::format("ncclCommInitRank (rank {} of {}, GPU {})", rank_offset_ + at, ranks_,
                                     at < local ? gpus_[static_cast<std::size_t>(at)] : -1));
      nccl_check(ended, fmt::format("ncclGroupEnd after ncclCommInitRank of ranks {}..{} of {}", rank_offset_,
                                    rank_offset_ + local - 1, ranks_));
    } catch (...) {
      for (ncclComm_t& c : comms_) {
        if (c) (void)ncclCommAbort(c);
        c = nullptr;
      }
      throw;
    }
  }
  NcclCollectives(const NcclCollectives&) = delete;
  NcclCollectives& operator=(const NcclCollectives&) = delete;

  ~NcclCollectives() override {
    // The replica threads have been joined (the strategy destroys them first).
    for (ncclComm_t c : comms_) {
      if (!c) continue;
      if (aborted_.load()) (void)ncclCommAbort(c);
      else (void)ncclCommDestroy(c);
    }
  }

  /// NCCL ranks in the communicators (every GPU of every worker) and this process's first one.
  int ranks() const noexcept { return ranks_; }
  int rank_offset() const noexcept { return rank_offset_; }

  void all_reduce(core::ReplicaGroup& group, int replica, std::span<core::BufferRef> buffers, ReduceOp op) override {
    const core::CollectiveCall call{core::CollectiveKind::AllReduce, op, buffers};
    observe::ObservedCall observed = observe_call(replica, observe::CallKind::AllReduce, buffers);
    bool nccl = false;
    cudaStream_t stream = nullptr;
    issue_in_exchange(group, replica, call, [&](bool& issuing) {
      nccl = takes(group, /*reduction=*/true);
      if (!nccl) return;
      stream = backends::cuda_replica_stream();
      issuing = true;
      enqueue_all_reduce(replica, buffers, op, stream);
    });
    if (!nccl) {
      observed.skip();
      return fallback_->all_reduce(group, replica, buffers, op);
    }
    wait(group, replica, stream, core::CollectiveKind::AllReduce);
    observed.finish();
  }

  void all_gather(core::ReplicaGroup& group, int replica, const core::BufferRef& input, int axis,
                  const std::function<void*(const Shape&)>& allocate) override {
    // Across workers the parts' shapes are known only after an exchange: the TCP path gathers.
    if (link_) return fallback_->all_gather(group, replica, input, axis, allocate);
    core::BufferRef in = input;
    const core::CollectiveCall call{core::CollectiveKind::AllGather, ReduceOp::Sum, std::span<core::BufferRef>(&in, 1), axis};
    observe::ObservedCall observed = observe_call(replica, observe::CallKind::AllGather, call.buffers);
    bool nccl = false;
    std::vector<Shape> shapes;  // every replica's input shape, read while the exchange holds them
    exchange(group, replica, call, [&] {
      nccl = takes(group, /*reduction=*/false);
      if (!nccl) return;
      for (int r = 0; r < group.size(); ++r) shapes.push_back(group.slot(r).buffers[0].shape);
    });
    if (!nccl) {
      observed.skip();
      return fallback_->all_gather(group, replica, input, axis, allocate);
    }
    gather_with_broadcasts(group, replica, in, static_cast<std::size_t>(axis), shapes, allocate);
    observed.finish();
  }

  /// `root` is a replica_id_in_sync_group, which is also its NCCL rank.
  void broadcast(core::ReplicaGroup& group, int replica, core::BufferRef buffer, int root) override {
    const core::CollectiveCall call{core::CollectiveKind::Broadcast, ReduceOp::Sum, std::span<core::BufferRef>(&buffer, 1), 0, root};
    observe::ObservedCall observed = observe_call(replica, observe::CallKind::Broadcast, call.buffers);
    bool nccl = false;
    cudaStream_t stream = nullptr;
    issue_in_exchange(group, replica, call, [&](bool& issuing) {
      nccl = root >= 0 && root < ranks_ && takes(group, /*reduction=*/false);
      if (!nccl || buffer.bytes() == 0) return;
      stream = backends::cuda_replica_stream();
      const ncclComm_t comm = comm_of(replica);
      issuing = true;
      nccl_check(ncclBroadcast(buffer.data, buffer.data, buffer.bytes(), ncclInt8, root, comm, stream), "ncclBroadcast",
                 comm);
    });
    if (!nccl) {
      observed.skip();
      return fallback_->broadcast(group, replica, buffer, root);
    }
    if (stream) wait(group, replica, stream, core::CollectiveKind::Broadcast);
    observed.finish();
  }

  /// ncclReduceScatter (equal parts) or one ncclReduce per part (np.array_split's uneven parts).
  void reduce_scatter(core::ReplicaGroup& group, int replica, core::BufferRef input, ReduceOp op,
                      const std::function<void*(const Shape&)>& allocate) override {
    const core::CollectiveCall call{core::CollectiveKind::ReduceScatter, op, std::span<core::BufferRef>(&input, 1)};
    observe::ObservedCall observed = observe_call(replica, observe::CallKind::ReduceScatter, call.buffers);
    bool nccl = false;
    cudaStream_t stream = nullptr;
    issue_in_exchange(group, replica, call, [&](bool& issuing) {
      nccl = takes(group, /*reduction=*/true);
      if (!nccl) return;
      const int me = rank_offset_ + replica;
      void* out = allocate(core::part_of(input, ranks_, me).shape);
      stream = backends::cuda_replica_stream();
      issuing = true;
      enqueue_reduce_scatter(comm_of(replica), stream, input, ranks_, me, out, Reduction::lower(op, mean_divisor_));
    });
    if (!nccl) {
      observed.skip();
      return fallback_->reduce_scatter(group, replica, input, op, allocate);
    }
    wait(group, replica, stream, core::CollectiveKind::ReduceScatter);
    observed.finish();
  }

  /// Grouped ncclSend/ncclRecv. Every replica's pieces' shapes are known from the published
  /// calls, across workers from one all_gather of them over the link (which is also the check
  /// that the calls agree); NCCL runs when every piece everywhere is in device memory.
  void all_to_all(core::ReplicaGroup& group, int replica, std::span<core::BufferRef> pieces, bool split,
                  const std::function<std::vector<void*>(const std::vector<Shape>&)>& allocate) override {
    const core::CollectiveCall call{core::CollectiveKind::AllToAll, ReduceOp::Sum, pieces, split ? 1 : 0, link_ ? 0 : ranks_};
    observe::ObservedCall observed = observe_call(replica, observe::CallKind::AllToAll, pieces);
    bool nccl = false, issuing = false;
    cudaStream_t stream = nullptr;
    try {
      exchange(
          group, replica, call,
          [&] {
            if (replica != 0) return;
            sides_.clear();
            if (link_) {
              sides_ = gather_sides(*link_, group);
              check_all_to_all(sides_, ranks_);
            } else {
              for (int r = 0; r < group.size(); ++r) sides_.push_back(side_of(group.slot(r)));
            }
          },
          [&] {
            if (group.collective_failed_replica() >= 0) return;
            if (aborted_.load(std::memory_order_acquire)) {
              throw Unavailable("NcclAllReduce: the NCCL communicators were aborted after a failed step; create a new strategy");
            }
            nccl = group.size() == static_cast<int>(comms_.size()) && sides_.front().device;
            if (!nccl) return;
            const auto me = static_cast<std::size_t>(rank_offset_ + replica);
            std::vector<Shape> shapes;
            std::vector<std::size_t> received;
            for (const AllToAllSide& side : sides_) {
              shapes.push_back(side.shapes[me]);
              received.push_back(static_cast<std::size_t>(num_elements(side.shapes[me])) * size_of(side.dtypes[0]));
            }
            const std::vector<void*> out = allocate(shapes);
            stream = backends::cuda_replica_stream();
            issuing = true;
            enqueue_all_to_all(comm_of(replica), stream, pieces, received, out);
          });
    } catch (...) {
      if (issuing) abort_communicator(replica);
      throw;
    }
    if (!nccl) {
      observed.skip();
      return fallback_->all_to_all(group, replica, pieces, split, allocate);
    }
    wait(group, replica, stream, core::CollectiveKind::AllToAll);
    observed.finish();
  }

 private:
  NcclCollectives(const CollectivesConfig& config, std::unique_ptr<core::ReplicaCollectives> fallback, core::CrossWorkerLink* link)
      : mean_divisor_(config.num_replicas_in_sync),
        bytes_per_pack_(config.options.bytes_per_pack),
        fallback_(std::move(fallback)),
        link_(link),
        metrics_(config.metrics) {
    if (config.options.timeout_seconds) {
      timeout_ = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(*config.options.timeout_seconds));
    }
    for (const auto& device : config.devices) {
      const DeviceSpec spec = DeviceSpec::parse(device);
      if (spec.device_type != std::string("GPU") || !spec.device_index) {
        throw InvalidArgument(fmt::format(
            "NcclAllReduce: device '{}' is not a GPU; NCCL runs between GPUs (use MirroredStrategy<ds::cuda>)", device));
      }
      gpus_.push_back(*spec.device_index);
    }
    comms_.assign(gpus_.size(), nullptr);
    ranks_ = static_cast<int>(gpus_.size());
    scratch_.resize(gpus_.size());
  }

  ncclComm_t comm_of(int replica) const { return comms_[static_cast<std::size_t>(replica)]; }

  // Replica 0's record of a call NCCL runs (once per worker, as the TCP transport counts), the
  // payload as its bytes sent and received; a call the fallback takes is observed there (skip()).
  observe::ObservedCall observe_call(int replica, observe::CallKind kind, std::span<const core::BufferRef> values) {
    std::size_t bytes = 0;
    for (const core::BufferRef& v : values) bytes += v.bytes();
    return observe::ObservedCall(metrics_, kind, replica == 0, replica == 0 ? observed_calls_++ : -1, bytes, "nccl");
  }

  // Runs issue(issuing) inside the exchange, after the calls are validated on every replica (and,
  // across workers, on every worker: replica 0 compares the calls over the link first);
  // `issue` sets `issuing` just before it enqueues NCCL work. If the exchange then fails on any
  // replica, that work can never complete (a peer never issued its part): abort the
  // communicator, which ends the NCCL kernel, rather than leave the GPU spinning in it.
  template <class Issue>
  void issue_in_exchange(core::ReplicaGroup& group, int replica, const core::CollectiveCall& call, Issue&& issue) {
    bool issuing = false;
    try {
      if (link_) {
        exchange(
            group, replica, call,
            [&] {
              if (replica == 0) check_same_call_on_every_worker(*link_, describe(group));
            },
            [&] { issue(issuing); });
      } else {
        exchange(group, replica, call, [&] { issue(issuing); });
      }
    } catch (...) {
      if (issuing) abort_communicator(replica);
      throw;
    }
  }

  // What every worker must agree on before NCCL runs a call: the kind, op, root and each value's
  // dtype, shape and memory (which also decide whether NCCL or the fallback takes it).
  static std::string describe(const core::ReplicaGroup& group) {
    const core::CollectiveCall& c = group.slot(0);
    std::string out = fmt::format("{}(", to_string(c.kind));
    if (c.kind == core::CollectiveKind::AllReduce || c.kind == core::CollectiveKind::ReduceScatter) out += fmt::format("{}", c.op);
    if (c.kind == core::CollectiveKind::Broadcast) out += fmt::format("root {}", c.root);
    for (const core::BufferRef& b : c.buffers) {
      out += fmt::format(", {}{} {}", b.memory == MemorySpace::device ? "device " : "", to_string(b.dtype),
                         shape_string(b.shape));
    }
    return out + ")";
  }

  // Whether NCCL runs this call. Decided from the published calls, so every replica decides alike
  // (and, across workers, every worker: the calls were compared first).
  bool takes(const core::ReplicaGroup& group, bool reduction) const {
    if (aborted_.load(std::memory_order_acquire)) {
      throw Unavailable("NcclAllReduce: the NCCL communicators were aborted after a failed step; create a new strategy");
    }
    if (group.size() != static_cast<int>(comms_.size())) return false;
    for (int r = 0; r < group.size(); ++r) {
      for (const core::BufferRef& b : group.slot(r).buffers) {
        if (b.memory != MemorySpace::device) return false;
        if (reduction && !nccl_type(b.dtype)) return false;
      }
    }
    return true;
  }

  // The values travel in packs (collective/packing.hpp, the rule every policy uses): one
  // ncclAllReduce per pack, all of them in one NCCL group. A pack of several values is copied
  // into this replica's scratch buffer and back out, on the replica's stream; a lone value is
  // reduced in place.
  void enqueue_all_reduce(int replica, std::span<core::BufferRef> buffers, ReduceOp op, cudaStream_t stream) {
    const ncclComm_t comm = comm_of(replica);
    const Reduction red = Reduction::lower(op, mean_divisor_);
#if defined(CUDA_API_PER_THREAD_DEFAULT_STREAM)
    // Our stream only waits for the legacy default stream by itself; the step's work may be on
    // this thread's default stream instead.
    order_after_default_stream(stream);
#endif
    const std::vector<Pack> packs = make_packs(buffers, bytes_per_pack_);
    std::vector<std::size_t> offsets(packs.size(), 0);
    std::size_t scratch_bytes = 0;
    for (std::size_t p = 0; p < packs.size(); ++p) {
      if (packs[p].members.size() < 2) continue;
      offsets[p] = scratch_bytes;
      scratch_bytes += (packs[p].bytes() + 255) / 256 * 256;  // NCCL likes aligned buffers
    }
    auto* scratch = static_cast<std::byte*>(scratch_for(replica, scratch_bytes));
    auto copy_members = [&](bool into_pack) {
      for (std::size_t p = 0; p < packs.size(); ++p) {
        if (packs[p].members.size() < 2) continue;
        std::byte* flat = scratch + offsets[p];
        for (std::size_t k : packs[p].members) {
          const core::BufferRef& b = buffers[k];
          if (b.bytes() == 0) continue;
          backends::cuda_check(cudaMemcpyAsync(into_pack ? flat : b.data, into_pack ? b.data : flat, b.bytes(),
                                     cudaMemcpyDeviceToDevice, stream),
                     "cudaMemcpyAsync", into_pack ? "all_reduce: packing" : "all_reduce: unpacking");
          flat += b.bytes();
        }
      }
    };
    copy_members(true);
    nccl_check(ncclGroupStart(), "ncclGroupStart", comm);
    ncclResult_t issued = ncclSuccess;
    for (std::size_t p = 0; p < packs.size() && issued == ncclSuccess; ++p) {
      const Pack& pack = packs[p];
      if (pack.count == 0) continue;
      void* data = pack.members.size() < 2 ? buffers[pack.members.front()].data : scratch + offsets[p];
      const NcclReduction how = nccl_reduction(red, pack.dtype, ranks_);
      issued = ncclAllReduce(data, data, pack.count, *nccl_type(pack.dtype), how.op, comm, stream);
    }
    const ncclResult_t ended = ncclGroupEnd();
    nccl_check(issued, "ncclAllReduce", comm);
    nccl_check(ended, "ncclGroupEnd", comm);
    copy_members(false);
    for (const core::BufferRef& b : buffers) {
      if (b.count() == 0 || !nccl_reduction(red, b.dtype, ranks_).divide_after) continue;
      divide_on_device(b, red.divisor(), stream, "MEAN division after ncclAllReduce");
    }
  }

  // This replica's scratch buffer on its GPU, at least `bytes` long; kept between calls.
  void* scratch_for(int replica, std::size_t bytes) {
    auto& s = scratch_[static_cast<std::size_t>(replica)];
    if (bytes > s.bytes) {
      s.buffer = backends::CudaBuffer();  // cudaFree first: the old buffer's work is done (we waited for it)
      s.buffer = backends::CudaBuffer(bytes);
      s.bytes = bytes;
    }
    return s.buffer.data();
  }

  // Every replica's input lands at its offset by one ncclBroadcast from that replica
  // (collective/detail/nccl_gather.hpp); along axis 0 straight into the result, along another
  // axis into a staging buffer that strided copies then interleave.
  void gather_with_broadcasts(core::ReplicaGroup& group, int replica, const core::BufferRef& in, std::size_t axis,
                              const std::vector<Shape>& shapes, const std::function<void*(const Shape&)>& allocate) {
    const std::size_t elem = size_of(in.dtype);
    Shape out_shape = shapes.front();
    out_shape[axis] = 0;
    for (const auto& s : shapes) out_shape[axis] += s[axis];
    std::size_t outer = 1, inner = 1;
    for (std::size_t d = 0; d < axis; ++d) outer *= static_cast<std::size_t>(out_shape[d]);
    for (std::size_t d = axis + 1; d < out_shape.size(); ++d) inner *= static_cast<std::size_t>(out_shape[d]);
    std::vector<std::size_t> bytes, offsets;
    std::size_t total = 0;
    for (const auto& s : shapes) {
      offsets.push_back(total);
      bytes.push_back(static_cast<std::size_t>(num_elements(s)) * elem);
      total += bytes.back();
    }
    auto* out = static_cast<std::byte*>(allocate(out_shape));
    if (total == 0) return;
    const cudaStream_t stream = backends::cuda_replica_stream();
    const ncclComm_t comm = comm_of(replica);
    const bool direct = (axis == 0 || outer == 1) && backends::cuda_device_of(out) == gpus_[static_cast<std::size_t>(replica)];
    backends::CudaBuffer staging(direct ? 0 : total);
    auto* dst = direct ? out : static_cast<std::byte*>(staging.data());
#if defined(CUDA_API_PER_THREAD_DEFAULT_STREAM)
    order_after_default_stream(stream);
#endif
    enqueue_broadcast_gather(comm, stream, in.data, replica, dst, offsets, bytes);
    if (!direct) {
      std::vector<std::size_t> runs;  // part i's runs along the gathered axis, in bytes
      for (const auto& s : shapes) runs.push_back(static_cast<std::size_t>(s[axis]) * inner * elem);
      enqueue_interleave(stream, dst, offsets, runs, outer, out);
    }
    wait(group, replica, stream, core::CollectiveKind::AllGather);
  }

#if defined(CUDA_API_PER_THREAD_DEFAULT_STREAM)
  static void order_after_default_stream(cudaStream_t stream) {
    cudaEvent_t ready = nullptr;
    backends::cuda_check(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    const cudaError_t recorded = cudaEventRecord(ready, cudaStreamPerThread);
    const cudaError_t waited = recorded == cudaSuccess ? cudaStreamWaitEvent(stream, ready, 0) : recorded;
    (void)cudaEventDestroy(ready);
    backends::cuda_check(waited, "cudaStreamWaitEvent");
  }
#endif

  // Waits for this replica's stream. Polls rather than blocks so that a step another replica
  // abandoned (its NCCL call never comes) ends in an error instead of a hang: the communicators
  // are then aborted, which releases the NCCL kernels of every replica. Across workers it also
  // watches the link (a lost worker: PeerFailure naming it) and timeout_seconds (CollectiveTimeout).
  void wait(core::ReplicaGroup& group, int replica, cudaStream_t stream, core::CollectiveKind what) {
    const ncclComm_t comm = comm_of(replica);
    const auto started = std::chrono::steady_clock::now();
    for (unsigned spins = 0;; ++spins) {
      const cudaError_t e = cudaStreamQuery(stream);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) {
        abort_communicator(replica);
        backends::cuda_check(e, "cudaStreamQuery", to_string(what));
      }
      ncclResult_t async = ncclSuccess;
      nccl_check(ncclCommGetAsyncError(comm, &async), "ncclCommGetAsyncError", comm);
      if (nccl_failed(async)) {
        abort_communicator(replica);
        nccl_check(async, fmt::format("{} (asynchronous error on replica {})", to_string(what), replica), comm);
      }
      if (group.aborted()) {
        abort_communicator(replica);
        throw Cancelled(fmt::format("replica {} left {}: another replica of this step failed", replica, to_string(what)));
      }
      if (link_ && spins % 256 == 255) {
        if (auto lost = link_->failure()) {
          abort_communicator(replica);
          throw PeerFailure(fmt::format("{} over NCCL: {}", to_string(what), *lost));
        }
        if (timeout_ && std::chrono::steady_clock::now() - started > *timeout_) {
          abort_communicator(replica);
          throw CollectiveTimeout(fmt::format("{} over NCCL did not finish within timeout_seconds ({} s) on replica {}",
                                              to_string(what),
                                              std::chrono::duration<double>(*timeout_).count(), rank_offset_ + replica));
        }
      }
      if (spins < 2000) core::cpu_relax();
      else std::this_thread::yield();
    }
  }

  // Each replica aborts its own communicator (another thread may be polling the others); that
  // ends its NCCL kernels. The strategy's later collectives then report Unavailable.
  void abort_communicator(int replica) noexcept {
    aborted_.store(true, std::memory_order_release);
    auto& c = comms_[static_cast<std::size_t>(replica)];
    if (c) (void)ncclCommAbort(c);
    c = nullptr;
  }

  struct Scratch {
    backends::CudaBuffer buffer;
    std::size_t bytes = 0;
  };

  std::int64_t mean_divisor_;
  std::size_t bytes_per_pack_;
  std::unique_ptr<core::ReplicaCollectives> fallback_;
  core::CrossWorkerLink* link_;  // across workers; null in one process
  observe::CollectiveMetrics* metrics_;  // the task's, when it serves metrics
  std::int64_t observed_calls_ = 0;      // replica 0's calls through NCCL (the timeline's seq)
  std::optional<std::chrono::steady_clock::duration> timeout_;
  std::vector<int> gpus_;
  std::vector<ncclComm_t> comms_;
  int ranks_ = 0;        // NCCL ranks in each communicator
  int rank_offset_ = 0;  // this process's first rank
  std::vector<Scratch> scratch_;  // per replica, on its GPU: packs of several values
  std::atomic<bool> aborted_{false};
  std::vector<AllToAllSide> sides_;  // replica 0's all_to_all table, read by all
};

}  // namespace collective::detail

/// Cross-device ops policy: NCCL all-reduce, all-gather and broadcast between the local GPUs
/// (the default of MirroredStrategy<ds::cuda> where NCCL is compiled in), and, for
/// MultiWorkerMirroredStrategy<ds::cuda>, between every GPU of every worker.
struct NcclAllReduce {
  static constexpr std::string_view name = "NcclAllReduce";
  /// The collectives take device buffers themselves (see collective/device_staging.hpp).
  static constexpr bool device_buffers = true;
  static std::unique_ptr<core::ReplicaCollectives> make_collectives(const collective::detail::CollectivesConfig& config) {
    return std::make_unique<collective::detail::NcclCollectives>(config);
  }
  /// Across workers (CommunicationImplementation::Nccl): NCCL bootstrapped over `link`;
  /// `fallback`, the TCP path, takes host buffers, 16-bit integer reductions and all_gather.
  static std::unique_ptr<core::ReplicaCollectives> make_multi_worker_collectives(
      const collective::detail::CollectivesConfig& config, core::CrossWorkerLink& link,
      std::unique_ptr<core::ReplicaCollectives> fallback) {
    return std::make_unique<collective::detail::NcclCollectives>(config, link, std::move(fallback));
  }
};

DISTRIBUTE_END_NAMESPACE

#endif  // DISTRIBUTE_HAS_NCCL

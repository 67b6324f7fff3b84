// MPI as the transport between the workers of a MultiWorkerMirroredStrategy<ds::host>
// (CommunicationImplementation::Mpi): for clusters whose fabric (InfiniBand, other RDMA, a vendor's
// interconnect) is driven through MPI, in programs started by mpirun, mpiexec or srun.
//
// Compiled in only when asked for: define DISTRIBUTE_WITH_MPI (the CMake target distribute::mpi
// and the meson dependency distribute_mpi_dep do) and compile with MPI's include path (mpicxx
// does), or include <mpi.h> before this header. Without it the header is empty and asking for
// CommunicationImplementation::Mpi is an InvalidArgument that says how to build with it; the
// strategy's code is the same either way (it finds the MPI link through mpi_link_factory()),
// so translation units built with and without MPI can share a program.
//
// Every call is checked like the TCP transport's: the workers first agree on what they call (one
// small MPI_Allreduce of each worker's descriptor as maximum and minimum; only when they differ
// are the descriptors gathered to say who called what), so a mismatch is an InvalidArgument on
// every worker, never a truncated message or a wrong sum. That check is one more small collective
// per call (a third of a 4 KiB all-reduce's time); CommunicationOptions::mpi_check_agreement =
// false leaves it out, and a mismatch is then what MPI makes of it, as in a program calling MPI. Without CommunicationOptions::
// timeout_seconds collectives are MPI's blocking calls; with it, MPI's non-blocking calls driven
// to completion with MPI_Test until the timeout: a worker that never joins becomes
// CollectiveTimeout. An error MPI returns (MPI_ERRORS_RETURN) becomes PeerFailure either way. MPI cannot cancel a collective, so either leaves the link unusable: every later
// call throws the same error, as on TCP. Whether a dead rank is seen at all is up to the MPI
// runtime: Open MPI's mpirun ends the whole job when a rank dies, unless told otherwise.
#pragma once

#if defined(DISTRIBUTE_WITH_MPI) || defined(MPI_VERSION)
// MPI's C API only: the deprecated C++ bindings would need their own library (libmpi_cxx).
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>
#endif

#include <array>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/cross_worker.hpp>
#include <distribute/core/dtype.hpp>
#include <distribute/core/error.hpp>
#include <distribute/core/reduce_op.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net {

/// What MultiWorkerMirroredStrategy needs to start an MPI link: the operation timeout (none:
/// wait as long as MPI does).
struct MpiLinkOptions {
  std::optional<std::chrono::milliseconds> operation_timeout;
  /// Whether every call first checks that the workers all call the same collective (see
  /// CommunicationOptions::mpi_check_agreement).
  bool check_agreement = true;
};

/// The MPI link of this program, or an empty function where MPI is not compiled in.
using MpiLinkFactory = std::unique_ptr<::distribute::core::CrossWorkerLink> (*)(const MpiLinkOptions&);

inline MpiLinkFactory& mpi_link_factory() noexcept {
  static MpiLinkFactory factory = nullptr;
  return factory;
}

}  // namespace net
DISTRIBUTE_END_NAMESPACE

#if defined(MPI_VERSION)

#include <distribute/net/detail/protocol.hpp>
#include <distribute/net/detail/reduce_bytes.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net::detail {

/// MPI's own element type for `d`, or MPI_DATATYPE_NULL where the library reduces it itself
/// (16-bit floats, bool: MPI has no type whose builtin operations mean what ours do).
inline MPI_Datatype mpi_builtin_type(DType d) noexcept {
  switch (d) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    case DType::I8: return MPI_INT8_T;
    case DType::I16: return MPI_INT16_T;
    case DType::I32: return MPI_INT32_T;
    case DType::I64: return MPI_INT64_T;
    case DType::U8: return MPI_UINT8_T;
    case DType::U16: return MPI_UINT16_T;
    case DType::U32: return MPI_UINT32_T;
    case DType::U64: return MPI_UINT64_T;
    case DType::Bool:
    case DType::F16:
    case DType::BF16: return MPI_DATATYPE_NULL;
  }
  return MPI_DATATYPE_NULL;
}

inline MPI_Op mpi_builtin_op(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::Sum: return MPI_SUM;
    case ReduceOp::Min: return MPI_MIN;
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Product: return MPI_PROD;
    case ReduceOp::Mean: break;  // never asked: a CrossWorkerLink's op is lowered (Reduction)
  }
  return MPI_OP_NULL;
}

/// MPI_Ops that reduce bool, float16 and bfloat16 with the library's own element-wise code (the
/// same results as the TCP transport's), one per (dtype, op); made once, after MPI_Init.
class MpiCustomOps {
 public:
  static MPI_Op get(DType d, ReduceOp op) {
    static MpiCustomOps ops;
    return ops.ops_[slot(d)][static_cast<std::size_t>(op)];
  }

 private:
  static std::size_t slot(DType d) noexcept { return d == DType::Bool ? 0 : d == DType::F16 ? 1 : 2; }
  static constexpr DType kTypes[3] = {DType::Bool, DType::F16, DType::BF16};

  template <std::size_t Slot, ReduceOp Op>
  static void reduce(void* in, void* inout, int* len, MPI_Datatype*) {
    reduce_bytes(kTypes[Slot], static_cast<std::byte*>(inout), static_cast<const std::byte*>(in),
                 static_cast<std::size_t>(*len), Op);
  }

  template <std::size_t Slot>
  void make(std::array<MPI_Op, 5>& row) {
    MPI_Op_create(&reduce<Slot, ReduceOp::Sum>, 1, &row[static_cast<std::size_t>(ReduceOp::Sum)]);
    MPI_Op_create(&reduce<Slot, ReduceOp::Min>, 1, &row[static_cast<std::size_t>(ReduceOp::Min)]);
    MPI_Op_create(&reduce<Slot, ReduceOp::Max>, 1, &row[static_cast<std::size_t>(ReduceOp::Max)]);
    MPI_Op_create(&reduce<Slot, ReduceOp::Product>, 1, &row[static_cast<std::size_t>(ReduceOp::Product)]);
    row[static_cast<std::size_t>(ReduceOp::Mean)] = MPI_OP_NULL;
  }

  MpiCustomOps() {
    make<0>(ops_[0]);
    make<1>(ops_[1]);
    make<2>(ops_[2]);
  }

  std::array<std::array<MPI_Op, 5>, 3> ops_{};
};

/// Set once a collective was left pending (a dead or stalled worker): MPI_Finalize would then wait
/// for it forever, so the process exits without it (mpirun reports that; the job is failing anyway).
inline std::atomic<bool>& mpi_collective_abandoned() noexcept {
  static std::atomic<bool> abandoned{false};
  return abandoned;
}

/// MPI_Init_thread on first use (unless the program initialised MPI itself) and MPI_Finalize at
/// exit when it was us (and no collective was abandoned). Throws Unavailable when MPI cannot be used from several threads in turn.
inline void ensure_mpi_initialized() {
  static std::once_flag once;
  std::call_once(once, [] {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (finalized) throw Unavailable("MultiWorkerMirroredStrategy (MPI): MPI was already finalized in this process");
    int provided = MPI_THREAD_SINGLE;
    if (!initialized) {
      if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
        throw Unavailable("MultiWorkerMirroredStrategy (MPI): MPI_Init_thread failed");
      std::atexit([] {
        int done = 0;
        MPI_Finalized(&done);
        if (!done && !mpi_collective_abandoned().load()) MPI_Finalize();
      });
    } else {
      MPI_Query_thread(&provided);
    }
    // Replica threads take turns calling the link (it serialises them), so SERIALIZED suffices.
    if (provided < MPI_THREAD_SERIALIZED) {
      throw Unavailable(fmt::format(
          "MultiWorkerMirroredStrategy (MPI): this MPI provides thread level {} ; MPI_THREAD_SERIALIZED ({}) or more is "
          "needed (initialise MPI with MPI_Init_thread, or let the strategy do it)",
          provided, MPI_THREAD_SERIALIZED));
    }
  });
}

/// CrossWorkerLink over a duplicate of MPI_COMM_WORLD.
class MpiLink final : public ::distribute::core::CrossWorkerLink {
 public:
  explicit MpiLink(const MpiLinkOptions& options)
      : timeout_(options.operation_timeout), check_agreement_(options.check_agreement) {
    ensure_mpi_initialized();
    if (MPI_Comm_dup(MPI_COMM_WORLD, &comm_) != MPI_SUCCESS)
      throw Unavailable("MultiWorkerMirroredStrategy (MPI): MPI_Comm_dup(MPI_COMM_WORLD) failed");
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiLink() override { close(); }

  int num_workers() const noexcept override { return size_; }
  int worker_index() const noexcept override { return rank_; }

  void all_reduce(void* data, std::size_t count, DType dtype, ReduceOp op, std::uint32_t shapes = 0) override {
    std::lock_guard lock(mutex_);
    agree({detail::CollectiveKind::AllReduce, dtype, op, shapes, count});
    reduce_chunks(data, count, dtype, op, "all_reduce");
  }

  void all_gather(const void* data, std::size_t bytes, std::vector<std::byte>& out,
                  std::vector<std::size_t>& sizes) override {
    std::lock_guard lock(mutex_);
    agree({detail::CollectiveKind::AllGather, DType::U8, ReduceOp::Sum, 0, 0});
    std::vector<std::uint64_t> all(static_cast<std::size_t>(size_));
    const std::uint64_t mine = bytes;
    run([&] { return MPI_Allgather(&mine, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, comm_); },
        [&](MPI_Request* r) { return MPI_Iallgather(&mine, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, comm_, r); },
        "all_gather (sizes)");
    std::vector<int> counts(all.size()), displs(all.size());
    std::uint64_t total = 0;
    sizes.assign(all.size(), 0);
    for (std::size_t w = 0; w < all.size(); ++w) {
      counts[w] = int_count(all[w], "all_gather");
      displs[w] = int_count(total, "all_gather");
      sizes[w] = static_cast<std::size_t>(all[w]);
      total += all[w];
    }
    out.resize(static_cast<std::size_t>(total));
    const int own = counts[static_cast<std::size_t>(rank_)];
    run([&] { return MPI_Allgatherv(data, own, MPI_BYTE, out.data(), counts.data(), displs.data(), MPI_BYTE, comm_); },
        [&](MPI_Request* r) {
          return MPI_Iallgatherv(data, own, MPI_BYTE, out.data(), counts.data(), displs.data(), MPI_BYTE, comm_, r);
        },
        "all_gather");
  }

  void broadcast(void* data, std::size_t bytes, int root) override {
    std::lock_guard lock(mutex_);
    agree({detail::CollectiveKind::Broadcast, DType::U8, ReduceOp::Sum, static_cast<std::uint32_t>(root), bytes});
    auto* p = static_cast<std::byte*>(data);
    for (std::size_t done = 0; done < bytes;) {
      const std::size_t n = std::min<std::size_t>(bytes - done, kMaxChunk);
      run([&] { return MPI_Bcast(p + done, static_cast<int>(n), MPI_BYTE, root, comm_); },
          [&](MPI_Request* r) { return MPI_Ibcast(p + done, static_cast<int>(n), MPI_BYTE, root, comm_, r); },
          "broadcast");
      done += n;
    }
  }

  void reduce_scatter(void* data, std::span<const std::size_t> counts, DType dtype, ReduceOp op,
                      std::uint32_t shapes = 0) override {
    std::lock_guard lock(mutex_);
    std::size_t total = 0, offset = 0;
    std::vector<int> recv(counts.size());
    for (std::size_t w = 0; w < counts.size(); ++w) {
      recv[w] = int_count(counts[w], "reduce_scatter");
      if (static_cast<int>(w) < rank_) offset += counts[w];
      total += counts[w];
    }
    agree({detail::CollectiveKind::ReduceScatter, dtype, op, shapes, total});
    const std::size_t width = size_of(dtype);
    std::vector<std::byte> mine(counts[static_cast<std::size_t>(rank_)] * width);
    auto [type, mpi_op] = type_and_op(dtype, op);
    run([&, type = type, mpi_op = mpi_op] { return MPI_Reduce_scatter(data, mine.data(), recv.data(), type, mpi_op, comm_); },
        [&, type = type, mpi_op = mpi_op](MPI_Request* r) {
          return MPI_Ireduce_scatter(data, mine.data(), recv.data(), type, mpi_op, comm_, r);
        },
        "reduce_scatter");
    std::memcpy(static_cast<std::byte*>(data) + offset * width, mine.data(), mine.size());
  }

  void all_to_all(const void* send, std::span<const std::size_t> send_bytes, void* recv,
                  std::span<const std::size_t> recv_bytes) override {
    std::lock_guard lock(mutex_);
    agree({detail::CollectiveKind::AllToAll, DType::U8, ReduceOp::Sum, 0, 0});
    std::vector<int> sc(send_bytes.size()), sd(send_bytes.size()), rc(recv_bytes.size()), rd(recv_bytes.size());
    std::size_t s = 0, q = 0;
    for (std::size_t w = 0; w < send_bytes.size(); ++w) {
      sc[w] = int_count(send_bytes[w], "all_to_all");
      sd[w] = int_count(s, "all_to_all");
      s += send_bytes[w];
      rc[w] = int_count(recv_bytes[w], "all_to_all");
      rd[w] = int_count(q, "all_to_all");
      q += recv_bytes[w];
    }
    run([&] { return MPI_Alltoallv(send, sc.data(), sd.data(), MPI_BYTE, recv, rc.data(), rd.data(), MPI_BYTE, comm_); },
        [&](MPI_Request* r) {
          return MPI_Ialltoallv(send, sc.data(), sd.data(), MPI_BYTE, recv, rc.data(), rd.data(), MPI_BYTE, comm_, r);
        },
        "all_to_all");
  }

  void barrier() override {
    std::lock_guard lock(mutex_);
    agree({detail::CollectiveKind::Barrier, DType::U8, ReduceOp::Sum, 0, 0});
    run([&] { return MPI_Barrier(comm_); }, [&](MPI_Request* r) { return MPI_Ibarrier(comm_, r); }, "barrier");
  }

  void close() noexcept override {
    std::lock_guard lock(mutex_);
    int finalized = 0;
    MPI_Finalized(&finalized);
    // A link broken mid-collective keeps its communicator: freeing it with a call pending is erroneous.
    if (comm_ != MPI_COMM_NULL && !failure_ && !finalized) MPI_Comm_free(&comm_);
    comm_ = MPI_COMM_NULL;
  }

  std::optional<std::string> failure() const override {
    std::lock_guard lock(failure_mutex_);
    return failure_ ? std::optional<std::string>(failure_->message) : std::nullopt;
  }

 private:
  // MPI counts are ints: an all-reduce or broadcast goes in pieces of at most this many elements.
  static constexpr std::size_t kMaxChunk = std::size_t{1} << 30;

  struct Broken {
    FailureKind kind = FailureKind::Peer;
    std::string message;
  };

  std::string name(int rank) const { return fmt::format("worker:{}", rank); }

  static int int_count(std::uint64_t n, const char* what) {
    if (n > static_cast<std::uint64_t>(INT_MAX))
      throw InvalidArgument(fmt::format("{} over MPI: {} bytes (or elements) for one worker are more than MPI's int "
                                        "counts can describe ({}); split the value",
                                        what, n, INT_MAX));
    return static_cast<int>(n);
  }

  static std::pair<MPI_Datatype, MPI_Op> type_and_op(DType dtype, ReduceOp op) {
    if (const MPI_Datatype t = mpi_builtin_type(dtype); t != MPI_DATATYPE_NULL) return {t, mpi_builtin_op(op)};
    return {dtype == DType::Bool ? MPI_UINT8_T : MPI_UINT16_T, MpiCustomOps::get(dtype, op)};
  }

  void reduce_chunks(void* data, std::size_t count, DType dtype, ReduceOp op, const char* what) {
    auto [type, mpi_op] = type_and_op(dtype, op);
    auto* p = static_cast<std::byte*>(data);
    const std::size_t width = size_of(dtype);
    for (std::size_t done = 0; done < count;) {
      const std::size_t n = std::min(count - done, kMaxChunk);
      std::byte* const at = p + done * width;
      run([&, type = type, mpi_op = mpi_op] { return MPI_Allreduce(MPI_IN_PLACE, at, static_cast<int>(n), type, mpi_op, comm_); },
          [&, type = type, mpi_op = mpi_op](MPI_Request* r) {
            return MPI_Iallreduce(MPI_IN_PLACE, at, static_cast<int>(n), type, mpi_op, comm_, r);
          },
          what);
      done += n;
    }
  }

  // The first failure poisons the link; later calls throw it again.
  [[noreturn]] void fail(FailureKind kind, std::string message) {
    if (kind != FailureKind::Mismatch) mpi_collective_abandoned() = true;
    {
      std::lock_guard lock(failure_mutex_);
      if (!failure_) failure_ = Broken{kind, std::move(message)};
    }
    rethrow();
  }

  [[noreturn]] void rethrow() const {
    Broken b;
    {
      std::lock_guard lock(failure_mutex_);
      b = *failure_;
    }
    raise(b.kind, b.message);
  }

  void check_usable() const {
    bool broken;
    {
      std::lock_guard lock(failure_mutex_);
      broken = failure_.has_value();
    }
    if (broken) rethrow();
    if (comm_ == MPI_COMM_NULL) throw Unavailable("MultiWorkerMirroredStrategy (MPI): the link is closed");
  }

  void check(int rc, const char* what) {
    if (rc == MPI_SUCCESS) return;
    fail(FailureKind::Peer, fmt::format("{} over MPI failed on {}: {}", what, name(rank_), error_text(rc)));
  }

  static std::string error_text(int rc) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) return fmt::format("MPI error {}", rc);
    return std::string(text, static_cast<std::size_t>(len));
  }

  // One collective: MPI's blocking call when no timeout is set (MPI's own algorithms and progress,
  // what a program calling MPI directly gets; Open MPI's non-blocking collectives (libnbc) took up to
  // 8.6 times as long, docs/performance.md), else the non-blocking one driven by wait() until the
  // timeout. Either way an error MPI returns fails the link.
  template <class Blocking, class Start>
  void run(Blocking&& blocking, Start&& start, const char* what) {
    if (!timeout_) return check(blocking(), what);
    MPI_Request r;
    check(start(&r), what);
    wait(r, what);
  }

  // Drives `r` to completion with MPI_Test (which is also what makes MPI progress), spinning as
  // MPI's own blocking calls do, yielding the CPU once a call takes longer than 10 ms, until the
  // operation timeout.
  void wait(MPI_Request& r, const char* what) {
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    for (std::uint64_t spins = 0;; ++spins) {
      int done = 0;
      const int rc = MPI_Test(&r, &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) check(rc, what);
      if (done) return;
      if ((spins & 63) == 63) {
        const auto waited = Clock::now() - start;
        if (timeout_ && waited > *timeout_) {
          fail(FailureKind::Timeout,
               fmt::format("{} over MPI on {}: no progress within {} ms: a worker is dead or stalled (MPI cannot "
                           "cancel the collective, so this link is now unusable)",
                           what, name(rank_), timeout_->count()));
        }
        if (waited > std::chrono::milliseconds(10)) std::this_thread::yield();
      }
    }
  }

  // Every worker's descriptor as one MPI_MAX all-reduce of (d, ~d): equal maxima and minima mean
  // every worker called the same thing; otherwise the descriptors are gathered to say who did what.
  void agree(const Descriptor& mine) {
    check_usable();
    ++seq_;
    if (!check_agreement_) return;
    const std::uint64_t packed = pack(mine);
    std::uint64_t words[4] = {packed, mine.count, ~packed, ~static_cast<std::uint64_t>(mine.count)};
    if (!significant_count(mine.kind)) words[1] = 0, words[3] = ~std::uint64_t{0};
    run([&] { return MPI_Allreduce(MPI_IN_PLACE, words, 4, MPI_UINT64_T, MPI_MAX, comm_); },
        [&](MPI_Request* r) { return MPI_Iallreduce(MPI_IN_PLACE, words, 4, MPI_UINT64_T, MPI_MAX, comm_, r); },
        "collective agreement");
    if (words[0] == ~words[2] && words[1] == ~words[3]) return;
    // They differ: gather them all for the message (every worker is here, since the reduction completed).
    std::uint64_t own[2] = {packed, mine.count};
    std::vector<std::uint64_t> all(2 * static_cast<std::size_t>(size_));
    run([&] { return MPI_Allgather(own, 2, MPI_UINT64_T, all.data(), 2, MPI_UINT64_T, comm_); },
        [&](MPI_Request* r) { return MPI_Iallgather(own, 2, MPI_UINT64_T, all.data(), 2, MPI_UINT64_T, comm_, r); },
        "collective agreement");
    const Descriptor first = unpack(all[0], all[1]);
    for (int w = 1; w < size_; ++w) {
      const Descriptor d = unpack(all[2 * static_cast<std::size_t>(w)], all[2 * static_cast<std::size_t>(w) + 1]);
      if (!compatible(first, d)) {
        fail(FailureKind::Mismatch, fmt::format("mismatched collectives at collective #{}: {} called {} but {} called {}",
                                                seq_, name(0), describe(first), name(w), describe(d)));
      }
    }
  }

  // The fields compatible() compares; all_gather and all_to_all sizes may differ by design.
  static bool significant_count(detail::CollectiveKind k) noexcept {
    return k == detail::CollectiveKind::AllReduce || k == detail::CollectiveKind::ReduceScatter || k == detail::CollectiveKind::Broadcast;
  }
  static std::uint64_t pack(const Descriptor& d) noexcept {
    const bool fields = significant_count(d.kind);
    return static_cast<std::uint64_t>(d.kind) << 56 |
           (fields ? static_cast<std::uint64_t>(d.dtype) << 48 | static_cast<std::uint64_t>(d.op) << 40 |
                         static_cast<std::uint64_t>(d.root)
                   : 0);
  }
  static Descriptor unpack(std::uint64_t packed, std::uint64_t count) noexcept {
    Descriptor d;
    d.kind = static_cast<detail::CollectiveKind>(packed >> 56);
    d.dtype = static_cast<DType>((packed >> 48) & 0xff);
    d.op = static_cast<ReduceOp>((packed >> 40) & 0xff);
    d.root = static_cast<std::uint32_t>(packed & 0xffffffffu);
    d.count = count;
    return d;
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::optional<std::chrono::milliseconds> timeout_;
  std::uint64_t seq_ = 0;
  bool check_agreement_;
  std::mutex mutex_;  // one call at a time (replica threads take turns; MPI_THREAD_SERIALIZED)
  mutable std::mutex failure_mutex_;
  std::optional<Broken> failure_;
};

inline std::unique_ptr<::distribute::core::CrossWorkerLink> make_mpi_link(const MpiLinkOptions& options) {
  return std::make_unique<MpiLink>(options);
}

// Registers the factory when this header is compiled with MPI, before main.
inline const bool kMpiLinkRegistered = (mpi_link_factory() = &make_mpi_link, true);

}  // namespace net::detail
DISTRIBUTE_END_NAMESPACE

#endif  // MPI_VERSION

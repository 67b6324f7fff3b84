// CrossWorkerLink: what a multi-worker strategy needs from the transport between its worker
// processes. The strategy layer talks to this interface only; net/ provides the TCP
// implementation (and a NCCL one can sit beside it), chosen from the cluster configuration.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <distribute/core/dtype.hpp>
#include <distribute/core/error.hpp>
#include <distribute/core/reduce_op.hpp>
#include <distribute/core/shape.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace core {

/// A 32-bit digest of the shapes of the values one cross-worker all-reduce carries (FNV-1a over
/// ranks and dimensions), which travels with the call's description: workers that pass as many
/// elements in other shapes then disagree instead of reducing element by element. Never 0, which
/// means "no shapes given".
class ShapesDigest {
 public:
  void add(const Shape& shape) noexcept {
    mix(static_cast<std::uint64_t>(shape.size()));
    for (auto d : shape) mix(static_cast<std::uint64_t>(d));
  }
  std::uint32_t value() const noexcept { return hash_ == 0 ? 1 : hash_; }

 private:
  void mix(std::uint64_t v) noexcept {
    for (int i = 0; i < 8; ++i, v >>= 8) hash_ = (hash_ ^ static_cast<std::uint32_t>(v & 0xff)) * 16777619u;
  }
  std::uint32_t hash_ = 2166136261u;
};

inline std::uint32_t shapes_digest(const Shape& shape) noexcept {
  ShapesDigest d;
  d.add(shape);
  return d.value();
}

class CrossWorkerLink {
 public:
  virtual ~CrossWorkerLink() = default;
  virtual int num_workers() const noexcept = 0;
  virtual int worker_index() const noexcept = 0;
  /// In-place all-reduce over the workers. `op` is a lowered reduction's (Reduction::op: never
  /// Mean): the caller divides, since only it knows the replica count to divide by. `shapes`:
  /// ShapesDigest of the values the buffer holds (0: none given), part of the agreement check.
  virtual void all_reduce(void* data, std::size_t count, DType dtype, ReduceOp op, std::uint32_t shapes = 0) = 0;
  /// Every worker's bytes, concatenated in worker order; `sizes[w]` = bytes from worker w.
  virtual void all_gather(const void* data, std::size_t bytes, std::vector<std::byte>& out,
                          std::vector<std::size_t>& sizes) = 0;
  /// Worker `root`'s bytes into everyone's `data`.
  virtual void broadcast(void* data, std::size_t bytes, int root) = 0;
  /// In place: `data` holds sum(counts) elements; on return elements [offset of worker w,
  /// + counts[w]) of worker w hold their reduction over the workers (the rest is scratch). `op`
  /// as for all_reduce, never Mean. `shapes` as for all_reduce.
  virtual void reduce_scatter(void* data, std::span<const std::size_t> counts, DType dtype, ReduceOp op,
                              std::uint32_t shapes = 0) {
    (void)data, (void)counts, (void)dtype, (void)op, (void)shapes;
    throw Unavailable("reduce_scatter: this cross-worker link does not implement it");
  }
  /// Block w of `send` (send_bytes[w] bytes, in worker order) goes to worker w; block u of `recv`
  /// (recv_bytes[u]) comes from worker u. Both sides know every size (the callers agreed on them).
  virtual void all_to_all(const void* send, std::span<const std::size_t> send_bytes, void* recv,
                          std::span<const std::size_t> recv_bytes) {
    (void)send, (void)send_bytes, (void)recv, (void)recv_bytes;
    throw Unavailable("all_to_all: this cross-worker link does not implement it");
  }
  virtual void barrier() = 0;
  /// Leaves the cluster cleanly before the process exits without unwinding (the preemption
  /// handler): the peers see a goodbye, not a lost task. Nothing may use the link afterwards.
  virtual void close() noexcept {}
  /// The error that broke the link (a lost or stalled worker), if one did. Lets a second
  /// transport bootstrapped over this link (NCCL) notice a lost worker while it waits.
  virtual std::optional<std::string> failure() const { return std::nullopt; }
};

}  // namespace core
DISTRIBUTE_END_NAMESPACE

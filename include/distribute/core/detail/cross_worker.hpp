// CrossWorkerLink: what a multi-worker strategy needs from the transport between its worker
// processes. The strategy layer talks to this interface only; net/ provides the TCP
// implementation (and a NCCL one can sit beside it), chosen from the cluster configuration.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include <distribute/core/dtype.hpp>
#include <distribute/core/reduce_op.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace detail {

class CrossWorkerLink {
 public:
  virtual ~CrossWorkerLink() = default;
  virtual int num_workers() const noexcept = 0;
  virtual int worker_index() const noexcept = 0;
  /// In-place all-reduce over the workers. `op` is never Mean: callers sum and divide, since
  /// only they know the replica count to divide by.
  virtual void all_reduce(void* data, std::size_t count, DType dtype, ReduceOp op) = 0;
  /// Every worker's bytes, concatenated in worker order; `sizes[w]` = bytes from worker w.
  virtual void all_gather(const void* data, std::size_t bytes, std::vector<std::byte>& out,
                          std::vector<std::size_t>& sizes) = 0;
  /// Worker `root`'s bytes into everyone's `data`.
  virtual void broadcast(void* data, std::size_t bytes, int root) = 0;
  virtual void barrier() = 0;
  /// Leaves the cluster cleanly before the process exits without unwinding (the preemption
  /// handler): the peers see a goodbye, not a lost task. Nothing may use the link afterwards.
  virtual void close() noexcept {}
  /// The error that broke the link (a lost or stalled worker), if one did. Lets a second
  /// transport bootstrapped over this link (NCCL) notice a lost worker while it waits.
  virtual std::optional<std::string> failure() const { return std::nullopt; }
};

}  // namespace detail
DISTRIBUTE_END_NAMESPACE

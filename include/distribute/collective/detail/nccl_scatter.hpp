// The NCCL calls of reduce_scatter and all_to_all (NcclCollectives in collective/nccl.hpp issues
// them inside its exchange, on the replica's communicator and stream). NCCL ranks are replica ids.
// Included by collective/nccl.hpp only, inside its DISTRIBUTE_HAS_NCCL block.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <cuda_runtime.h>
#include <nccl.h>

#include <distribute/collective/detail/nccl_support.hpp>
#include <distribute/collective/detail/scatter.hpp>
#include <distribute/core/replica_group.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace collective::detail {

/// Rank `me`'s part of `input` (cut into `ranks` parts along axis 0) reduced over every rank into
/// `out`. Parts of equal size: one ncclReduceScatter; uneven ones (np.array_split's rule): one
/// ncclReduce per part, rooted at its owner, in one NCCL group. MEAN divides afterwards where
/// ncclAvg cannot take it.
inline void enqueue_reduce_scatter(ncclComm_t comm, cudaStream_t stream, const core::BufferRef& input, int ranks, int me,
                                   void* out, Reduction red) {
  const ncclDataType_t type = *nccl_type(input.dtype);
  const NcclReduction how = nccl_reduction(red, input.dtype, ranks);
  const core::BufferRef mine = core::part_of(input, ranks, me);
  if (input.count() > 0) {
    if (input.shape[0] % ranks == 0) {
      nccl_check(ncclReduceScatter(input.data, out, mine.count(), type, how.op, comm, stream), "ncclReduceScatter", comm);
    } else {
      nccl_check(ncclGroupStart(), "ncclGroupStart", comm);
      ncclResult_t issued = ncclSuccess;
      for (int k = 0; k < ranks && issued == ncclSuccess; ++k) {
        const core::BufferRef part = core::part_of(input, ranks, k);
        if (part.count() == 0) continue;  // the same on every rank: the parts follow from the shape
        // recvbuff is read on the root only; elsewhere it names the part being sent.
        issued = ncclReduce(part.data, k == me ? out : part.data, part.count(), type, how.op, k, comm, stream);
      }
      const ncclResult_t ended = ncclGroupEnd();
      nccl_check(issued, "ncclReduce", comm);
      nccl_check(ended, "ncclGroupEnd", comm);
    }
  }
  if (how.divide_after && mine.count() > 0) {
    core::BufferRef result = mine;
    result.data = out;
    divide_on_device(result, red.divisor(), stream, "MEAN division after ncclReduceScatter");
  }
}

/// pieces[k] to rank k and, from every rank k, `received[k]` bytes into out[k]: one ncclSend and
/// one ncclRecv per peer with bytes to move, in one NCCL group (a rank's piece for itself too:
/// NCCL pairs a rank's send to itself with its receive).
inline void enqueue_all_to_all(ncclComm_t comm, cudaStream_t stream, std::span<const core::BufferRef> pieces,
                               const std::vector<std::size_t>& received, const std::vector<void*>& out) {
  nccl_check(ncclGroupStart(), "ncclGroupStart", comm);
  ncclResult_t issued = ncclSuccess;
  for (std::size_t k = 0; k < pieces.size() && issued == ncclSuccess; ++k) {
    const int peer = static_cast<int>(k);
    if (pieces[k].bytes() > 0) issued = ncclSend(pieces[k].data, pieces[k].bytes(), ncclInt8, peer, comm, stream);
    if (issued == ncclSuccess && received[k] > 0) issued = ncclRecv(out[k], received[k], ncclInt8, peer, comm, stream);
  }
  const ncclResult_t ended = ncclGroupEnd();
  nccl_check(issued, "ncclSend/ncclRecv", comm);
  nccl_check(ended, "ncclGroupEnd", comm);
}

}  // namespace collective::detail
DISTRIBUTE_END_NAMESPACE

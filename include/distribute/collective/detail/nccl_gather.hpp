// The NCCL calls of an all-gather of uneven parts (NcclCollectives::all_gather in collective/nccl.hpp
// issues them inside its exchange, on the replica's communicator and stream): NCCL's own all-gather
// takes equal parts only. Included by collective/nccl.hpp only, inside its DISTRIBUTE_HAS_NCCL block.
#pragma once

#include <cstddef>
#include <vector>

#include <cuda_runtime.h>
#include <nccl.h>

#include <distribute/backends/cuda/error.hpp>
#include <distribute/collective/detail/nccl_support.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace collective::detail {

/// Rank r's part (`bytes[r]` long; `mine` on rank `me`) lands at `dst + offsets[r]` on every rank:
/// one ncclBroadcast rooted at each rank with a non-empty part, in one NCCL group.
inline void enqueue_broadcast_gather(ncclComm_t comm, cudaStream_t stream, const void* mine, int me, std::byte* dst,
                                     const std::vector<std::size_t>& offsets, const std::vector<std::size_t>& bytes) {
  nccl_check(ncclGroupStart(), "ncclGroupStart", comm);
  ncclResult_t issued = ncclSuccess;
  for (std::size_t i = 0; i < bytes.size() && issued == ncclSuccess; ++i) {
    if (bytes[i] == 0) continue;
    const int root = static_cast<int>(i);
    const void* send = root == me ? mine : dst + offsets[i];
    issued = ncclBroadcast(send, dst + offsets[i], bytes[i], ncclInt8, root, comm, stream);
  }
  const ncclResult_t ended = ncclGroupEnd();
  nccl_check(issued, "ncclBroadcast", comm);
  nccl_check(ended, "ncclGroupEnd", comm);
}

/// The parts gathered one after another in `staged` (part i at offsets[i]: `outer` runs of runs[i]
/// bytes) into their columns of `out`, whose rows hold every part's run side by side.
inline void enqueue_interleave(cudaStream_t stream, const std::byte* staged, const std::vector<std::size_t>& offsets,
                               const std::vector<std::size_t>& runs, std::size_t outer, std::byte* out) {
  std::size_t row = 0;
  for (const std::size_t run : runs) row += run;
  std::size_t column = 0;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    if (runs[i] && outer) {
      backends::cuda_check(cudaMemcpy2DAsync(out + column, row, staged + offsets[i], runs[i], runs[i], outer,
                                             cudaMemcpyDefault, stream),
                           "cudaMemcpy2DAsync", "all_gather");
    }
    column += runs[i];
  }
}

}  // namespace collective::detail
DISTRIBUTE_END_NAMESPACE

// The MPI transport's all-reduce (net/mpi.hpp's MpiLink: the descriptor check unless MW_MPI_UNCHECKED,
// then MPI_Allreduce, or with MW_MPI_TIMEOUT_MS MPI_Iallreduce driven by MPI_Test) against a raw MPI_Allreduce, across
// the ranks mpirun starts, timed as mpi_allreduce.cpp times (common.hpp); each iteration times the
// raw call and then ours, so both see the same load and the difference is our transport's overhead.
//   mpirun -np N ... ours_mpi LABEL      Rank 0 prints two CSV lines per size: raw_LABEL, LABEL.
#include <distribute/net/mpi.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common.hpp"

namespace ds = distribute;

int main(int argc, char** argv) {
  // MW_MPI_TIMEOUT_MS: an operation timeout, as CommunicationOptions::timeout_seconds sets (the
  // collectives are then non-blocking calls driven by MPI_Test).
  ds::net::MpiLinkOptions options;
  if (const char* ms = std::getenv("MW_MPI_TIMEOUT_MS"); ms != nullptr && std::atoll(ms) > 0) {
    options.operation_timeout = std::chrono::milliseconds(std::atoll(ms));
  }
  // MW_MPI_UNCHECKED=1: without the agreement check (CommunicationOptions::mpi_check_agreement = false).
  if (const char* u = std::getenv("MW_MPI_UNCHECKED"); u != nullptr && std::atoi(u) != 0) options.check_agreement = false;
  ds::net::detail::MpiLink link(options);  // initialises MPI (and finalises it at exit)
  const int rank = link.worker_index(), size = link.num_workers();
  const char* label = argc > 1 ? argv[1] : "ours_mpi";
  auto all_reduce = [&](std::vector<float>& buf) {
    link.all_reduce(buf.data(), buf.size(), ds::DType::F32, ds::ReduceOp::Sum);
  };
  // Each iteration times a raw MPI_Allreduce and then ours on the same buffer, so the two see the
  // same load: the ratio of their medians is the transport's overhead even on a busy machine.
  auto raw = [&](std::vector<float>& buf) {
    MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(buf.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  };
  const std::string raw_label = std::string("raw_") + label;
  for (std::size_t bytes : mw::sizes()) {
    std::vector<float> buf(bytes / sizeof(float));
    mw::fill(buf, rank);
    all_reduce(buf);
    if (!mw::check(buf, size)) {
      std::fprintf(stderr, "ours_mpi: wrong result at %zu bytes\n", bytes);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (int w = 0; w < mw::warmup_for(bytes); ++w) {
      raw(buf);
      all_reduce(buf);
    }
    const int iters = mw::iters_for(bytes);
    std::vector<double> t(iters), t_raw(iters);
    for (int i = 0; i < iters; ++i) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = mw::now_s();
      raw(buf);
      t_raw[i] = mw::now_s() - t0;
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = mw::now_s();
      all_reduce(buf);
      t[i] = mw::now_s() - t0;
    }
    MPI_Allreduce(MPI_IN_PLACE, t_raw.data(), iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, t.data(), iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0) {
      mw::print_row(raw_label.c_str(), size, bytes, t_raw);
      mw::print_row(label, size, bytes, t);
    }
  }
  return 0;
}

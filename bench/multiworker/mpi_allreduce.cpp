// OpenMPI MPI_Allreduce (float32 SUM) across the ranks mpirun starts.
//   mpirun -np N ... mpi_allreduce LABEL      LABEL names the row (e.g. mpi_tcp, mpi_vader)
// Rank 0 prints one CSV line per size (see common.hpp).
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const char* label = argc > 1 ? argv[1] : "mpi";
  // MW_MPI_SEPARATE_BUFFERS=1: reduce from a send buffer into another instead of MPI_IN_PLACE
  // (Open MPI 4.1.4's coll/han dereferences MPI_IN_PLACE and crashes).
  const char* separate_env = std::getenv("MW_MPI_SEPARATE_BUFFERS");
  const bool separate = separate_env != nullptr && std::string(separate_env) == "1";
  for (std::size_t bytes : mw::sizes()) {
    const int count = static_cast<int>(bytes / sizeof(float));
    std::vector<float> buf(count), in;
    mw::fill(buf, rank);
    if (separate) in = buf;
    auto once = [&] {
      MPI_Allreduce(separate ? in.data() : MPI_IN_PLACE, buf.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    };
    once();
    if (!mw::check(buf, size)) { std::fprintf(stderr, "mpi: wrong result at %zu bytes\n", bytes); MPI_Abort(MPI_COMM_WORLD, 1); }
    for (int w = 0; w < mw::warmup_for(bytes); ++w) once();
    const int iters = mw::iters_for(bytes);
    std::vector<double> t(iters);
    for (int i = 0; i < iters; ++i) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = mw::now_s();
      once();
      t[i] = mw::now_s() - t0;
    }
    const std::vector<double> mine = t;
    MPI_Allreduce(mine.data(), t.data(), iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0) mw::print_row(label, size, bytes, t);
  }
  MPI_Finalize();
  return 0;
}

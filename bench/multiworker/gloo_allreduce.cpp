// gloo (Debian libgloo-dev) all-reduce across N processes on loopback (tcp device on 127.0.0.1, or
// MW_GLOO_HOST).
//   gloo_allreduce RANK SIZE STORE_DIR ALGO     ALGO: ring (gloo::allreduce, segmented ring, what
//   PyTorch uses) or hd (legacy AllreduceHalvingDoubling).
// FileStore rendezvous in STORE_DIR. Rank 0 prints one CSV line per size (see common.hpp).
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <gloo/allreduce.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include "common.hpp"

template <class T>
void ring_allreduce(const std::shared_ptr<gloo::Context>& ctx, T* p, std::size_t n, void (*fn)(void*, const void*, const void*, size_t), uint32_t tag) {
  gloo::AllreduceOptions o(ctx);
  o.setOutput(p, n);
  o.setReduceFunction(fn);
  o.setTag(tag);
  gloo::allreduce(o);
}

int main(int argc, char** argv) {
  if (argc < 5) { std::fprintf(stderr, "usage: gloo_allreduce RANK SIZE STORE_DIR ring|hd\n"); return 2; }
  const int rank = std::atoi(argv[1]), size = std::atoi(argv[2]);
  const std::string dir = argv[3], algo = argv[4];
  gloo::transport::tcp::attr attr;
  // MW_GLOO_HOST: the address this rank's device binds (two_hosts.py: the simulated host's).
  const char* host = std::getenv("MW_GLOO_HOST");
  attr.hostname = host != nullptr && *host != '\0' ? host : "127.0.0.1";
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore store(dir);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
  ctx->connectFullMesh(store, dev);

  gloo::BarrierOptions bo(ctx);
  auto fsum = static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>);
  auto dmax = static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::max<double>);
  const std::string impl = "gloo_" + algo;

  for (std::size_t bytes : mw::sizes()) {
    const std::size_t count = bytes / sizeof(float);
    std::vector<float> buf(count);
    mw::fill(buf, rank);
    std::unique_ptr<gloo::AllreduceHalvingDoubling<float>> hd;
    if (algo == "hd") hd = std::make_unique<gloo::AllreduceHalvingDoubling<float>>(ctx, std::vector<float*>{buf.data()}, static_cast<int>(count));
    auto once = [&] {
      if (hd) hd->run(); else ring_allreduce(ctx, buf.data(), count, fsum, 1);
    };
    once();
    if (!mw::check(buf, size)) { std::fprintf(stderr, "gloo: wrong result at %zu bytes\n", bytes); return 1; }
    for (int w = 0; w < mw::warmup_for(bytes); ++w) once();
    const int iters = mw::iters_for(bytes);
    std::vector<double> t(iters);
    for (int i = 0; i < iters; ++i) {
      gloo::barrier(bo);
      const double t0 = mw::now_s();
      once();
      t[i] = mw::now_s() - t0;
    }
    ring_allreduce(ctx, t.data(), t.size(), dmax, 2);
    if (rank == 0) mw::print_row(impl.c_str(), size, bytes, t);
  }
  gloo::barrier(bo);
  return 0;
}

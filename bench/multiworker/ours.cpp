// distribute's TCP Communicator all-reduce across N processes on loopback (or where MW_ADDRESSES says).
//   ours RANK SIZE BASE_PORT   (rank r listens on 127.0.0.1:BASE_PORT+r)
// Rank 0 prints one CSV line per size (see common.hpp).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <distribute/net/communicator.hpp>
#include <distribute/observe/collective_metrics.hpp>
#include <distribute/observe/timeline.hpp>

#include "common.hpp"

namespace ds = distribute;

int main(int argc, char** argv) {
  if (argc < 4) { std::fprintf(stderr, "usage: ours RANK SIZE BASE_PORT\n"); return 2; }
  const int rank = std::atoi(argv[1]), size = std::atoi(argv[2]), base = std::atoi(argv[3]);
  std::vector<std::string> addrs, names;
  // MW_ADDRESSES="HOST:PORT,HOST:PORT,..." (one per rank) replaces 127.0.0.1:BASE_PORT+r: ranks on
  // several (simulated) hosts, two_hosts.py.
  const char* listed = std::getenv("MW_ADDRESSES");
  for (std::string rest = listed != nullptr ? listed : ""; !rest.empty();) {
    const auto comma = rest.find(',');
    addrs.push_back(rest.substr(0, comma));
    rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
  }
  if (!addrs.empty() && static_cast<int>(addrs.size()) != size) {
    std::fprintf(stderr, "ours: MW_ADDRESSES lists %zu addresses for %d ranks\n", addrs.size(), size);
    return 2;
  }
  for (int i = 0; i < size; ++i) {
    if (listed == nullptr) addrs.push_back("127.0.0.1:" + std::to_string(base + i));
    names.push_back("worker:" + std::to_string(i));
  }
  ds::net::CommunicatorOptions opt;
  opt.cluster_token = "";  // no authentication (the peers have none either)
  // Tuning experiments only (the documented figures use the defaults): MW_CHUNK_BYTES,
  // MW_DIRECT_MAX_BYTES, MW_HD_MAX_BYTES, MW_BUSY_POLL_US, MW_SHM_MIN_BYTES, MW_SHM_SLOT_BYTES
  // override the options of the same name.
  auto knob = [](const char* name, std::size_t& field) {
    if (const char* v = std::getenv(name); v != nullptr && *v != '\0') field = std::strtoull(v, nullptr, 10);
  };
  knob("MW_CHUNK_BYTES", opt.chunk_bytes);
  knob("MW_DIRECT_MAX_BYTES", opt.direct_max_bytes);
  knob("MW_HD_MAX_BYTES", opt.halving_doubling_max_bytes);
  knob("MW_SHM_MIN_BYTES", opt.shared_memory_min_bytes);  // 0: TCP only (run.sh's ours_tcp)
  knob("MW_SHM_SLOT_BYTES", opt.shared_memory_slot_bytes);
  if (const char* v = std::getenv("MW_BUSY_POLL_US"); v != nullptr && *v != '\0') {
    opt.busy_poll = std::chrono::microseconds(std::strtoll(v, nullptr, 10));
  }
  // Observability's cost (docs/performance.md): DISTRIBUTE_TIMELINE records this rank's timeline
  // as a multi-worker strategy would (written at exit); MW_METRICS=1 counts every call.
  if (const char* tl = std::getenv("DISTRIBUTE_TIMELINE"); tl != nullptr && *tl != '\0') {
    ds::observe::Timeline::instance().start(ds::observe::timeline_file(tl, "worker", rank), "worker", rank);
  }
  if (const char* m = std::getenv("MW_METRICS"); m != nullptr && std::string(m) == "1") {
    opt.metrics = std::make_shared<ds::observe::CollectiveMetrics>(std::make_shared<ds::observe::MetricsRegistry>("worker", rank));
  }
  ds::net::Communicator comm(addrs, rank, opt, names);

  for (std::size_t bytes : mw::sizes()) {
    const std::size_t count = bytes / sizeof(float);
    std::vector<float> buf(count);
    mw::fill(buf, rank);
    comm.all_reduce(buf.data(), count, ds::DType::F32, ds::ReduceOp::Sum);
    if (!mw::check(buf, size)) { std::fprintf(stderr, "ours: wrong result at %zu bytes\n", bytes); return 1; }
    for (int w = 0; w < mw::warmup_for(bytes); ++w) comm.all_reduce(buf.data(), count, ds::DType::F32, ds::ReduceOp::Sum);
    const int iters = mw::iters_for(bytes);
    std::vector<double> t(iters);
    for (int i = 0; i < iters; ++i) {
      comm.barrier();
      const double t0 = mw::now_s();
      comm.all_reduce(buf.data(), count, ds::DType::F32, ds::ReduceOp::Sum);
      t[i] = mw::now_s() - t0;
    }
    comm.all_reduce(t.data(), t.size(), ds::DType::F64, ds::ReduceOp::Max);
    if (rank == 0) mw::print_row("ours", size, bytes, t);
  }
  comm.barrier();
  return 0;
}

// One worker process of the observability tests (check_metrics_prometheus.py, check_timeline.py).
// Reads TF_CONFIG (and DISTRIBUTE_METRICS_PORT / DISTRIBUTE_TIMELINE) like a user's program.
//   observability_helper metrics N COUNT  N all-reduces of COUNT floats, a broadcast of COUNT
//                                         floats from worker 1, prints "ready PORT", waits for a
//                                         line on stdin (the scrape is done), exits 0
//   observability_helper mismatch         3 all-reduces, then worker 0 all-reduces and worker 1
//                                         broadcasts: InvalidArgument, exit 4
//   observability_helper kill             3 all-reduces, then worker 1 SIGKILLs itself; worker 0's
//                                         next all-reduce: PeerFailure, exit 3
// Exit codes: 0 ok, 1 wrong result, 3 PeerFailure/CollectiveTimeout, 4 InvalidArgument, 5 other.
#define DISTRIBUTE_WITH_MULTI_WORKER
#include <distribute/distribute.hpp>

#include <signal.h>

#include <cstdio>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

namespace ds = distribute;
using Strategy = ds::MultiWorkerMirroredStrategy<ds::host>;

namespace {

int sum_all_reduces(Strategy& s, int n, std::size_t count) {
  const int workers = s.num_replicas_in_sync();
  for (int i = 0; i < n; ++i) {
    auto out = s.run([&](ds::ReplicaContext& ctx) {
      std::vector<float> v(count, static_cast<float>(ctx.replica_id_in_sync_group() + 1));
      return ctx.all_reduce("sum", v);
    });
    const float want = static_cast<float>(workers * (workers + 1) / 2);
    for (float x : s.local_results(out)[0]) {
      if (x != want) {
        fmt::print("MISMATCH all_reduce {}: got {} want {}\n", i, x, want);
        return 1;
      }
    }
  }
  return 0;
}

int run(std::string_view scenario, int argc, char** argv) {
  Strategy s;
  const int worker = s.worker_index();
  if (scenario == "metrics") {
    if (argc != 4) return 5;
    const int n = std::stoi(argv[2]);
    const auto count = static_cast<std::size_t>(std::stoul(argv[3]));
    if (int rc = sum_all_reduces(s, n, count)) return rc;
    auto b = s.run([&](ds::ReplicaContext& ctx) {
      return ctx.broadcast(std::vector<float>(count, static_cast<float>(worker)), 1);
    });
    if (s.local_results(b)[0] != std::vector<float>(count, 1.0f)) return 1;
    if (!s.metrics_port()) {
      fmt::print("no metrics port: DISTRIBUTE_METRICS_PORT is not set\n");
      return 5;
    }
    fmt::print("ready {}\n", *s.metrics_port());
    std::fflush(stdout);
    std::string line;
    std::getline(std::cin, line);
    return 0;
  }
  if (scenario == "mismatch") {
    if (int rc = sum_all_reduces(s, 3, 1000)) return rc;
    s.run([&](ds::ReplicaContext& ctx) {
      if (worker == 0) {
        (void)ctx.all_reduce("sum", std::vector<float>(10, 1.0f));
      } else {
        (void)ctx.broadcast(std::vector<float>(10, 1.0f), 0);
      }
    });
    return 0;
  }
  if (scenario == "kill") {
    if (int rc = sum_all_reduces(s, 3, 100000)) return rc;
    if (worker == 1) ::raise(SIGKILL);
    return sum_all_reduces(s, 1, 100000);
  }
  return 5;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 5;
  try {
    return run(argv[1], argc, argv);
  } catch (const ds::PeerFailure& e) {
    fmt::print("PeerFailure: {}\n", e.what());
    return 3;
  } catch (const ds::CollectiveTimeout& e) {
    fmt::print("CollectiveTimeout: {}\n", e.what());
    return 3;
  } catch (const ds::InvalidArgument& e) {
    fmt::print("InvalidArgument: {}\n", e.what());
    return 4;
  } catch (const std::exception& e) {
    fmt::print("error: {}\n", e.what());
    return 5;
  }
}

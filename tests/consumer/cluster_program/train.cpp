// Downstream program of the CMake consumer checks that uses the cluster part: linked with
// distribute::cluster (Boost.JSON, OpenSSL, ...) and nothing else, and run as a real 2-worker job
// (TF_CONFIG per worker, DISTRIBUTE_CLUSTER_TOKEN set: the HMAC handshake runs). Every worker
// all-reduces (its rank + 1): 1 + 2 = 3 with two workers, checked on each.
#define DISTRIBUTE_WITH_MULTI_WORKER
#include <distribute/distribute.hpp>

#include <cstdio>
#include <exception>

namespace ds = distribute;

int main() {
  try {
    ds::CommunicationOptions options;
    options.timeout_seconds = 60;  // a lost peer ends the run with an error, never a hang
    ds::MultiWorkerMirroredStrategy<ds::host> strategy(options);  // reads TF_CONFIG
    const int workers = strategy.num_workers();
    auto sums = strategy.run([&](ds::ReplicaContext& ctx) {
      return ctx.all_reduce(ds::ReduceOp::Sum, static_cast<double>(strategy.worker_index() + 1));
    });
    const double sum = strategy.local_results(sums)[0];
    const double expected = workers * (workers + 1) / 2.0;
    if (sum != expected) {
      std::fprintf(stderr, "worker %d: all-reduce gave %g, expected %g\n", strategy.worker_index(), sum, expected);
      return 1;
    }
    // The cluster spec as JSON: Boost.JSON's serializer, a compiled symbol of libboost_json.
    const std::string spec = strategy.cluster_resolver()->cluster_spec().to_json();
    std::printf("distribute %s cluster: worker %d of %d, all-reduce %g, spec %s\n", DISTRIBUTE_VERSION_STRING,
                strategy.worker_index(), workers, sum, spec.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}

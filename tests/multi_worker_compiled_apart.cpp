// A multi-worker program built with the library compiled apart (meson's distribute_compiled_dep:
// DISTRIBUTE_SEPARATE_COMPILATION, the definitions in src/distribute.cpp with the multi-worker part):
// this file sees the strategy's declarations only. Run without TF_CONFIG it is a one-worker job of
// two local replicas; run by distribute-launch (tests/meson.build) it is one worker of several.
#define DISTRIBUTE_WITH_MULTI_WORKER
#include <distribute/distribute.hpp>

#include <cstdio>
#include <vector>

namespace ds = distribute;

int main() {
  try {
    ds::CommunicationOptions options;
    options.timeout_seconds = 60;  // a lost peer ends the run with an error, never a hang
    ds::MultiWorkerMirroredStrategy<ds::host> strategy(options, nullptr, 2);
    auto scope = strategy.scope();
    ds::Variable<std::vector<float>> w(std::vector<float>(4, 0.0f), {.name = "w"});
    strategy.run([&](ds::ReplicaContext& ctx) {
      auto grad = ctx.all_reduce(ds::ReduceOp::Sum, std::vector<float>(4, float(ctx.replica_id_in_sync_group() + 1)));
      w.assign_sub(grad);
    });
    const int n = strategy.num_replicas_in_sync();
    const float expected = -static_cast<float>(n * (n + 1) / 2);  // minus the sum of 1..n
    for (float x : w.read_value()) {
      if (x != expected) {
        std::fprintf(stderr, "worker %d: w holds %g, expected %g\n", strategy.worker_index(), x, expected);
        return 1;
      }
    }
    std::printf("worker %d of %d: w = %g on %d replicas\n", strategy.worker_index(), strategy.num_workers(), expected, n);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}

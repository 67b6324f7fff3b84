// docs/multi-worker.md's first program, made complete: MultiWorkerMirroredStrategy from TF_CONFIG.
#define DISTRIBUTE_WITH_MULTI_WORKER
#include <distribute/distribute.hpp>
namespace ds = distribute;

int main() {
  ds::CommunicationOptions options;
  options.timeout_seconds = 30;
  ds::MultiWorkerMirroredStrategy<ds::host> strategy(options);
  auto scope = strategy.scope();
  ds::Variable<std::vector<float>> w(std::vector<float>(8, 0.0f), {.name = "w"});
  auto loss = strategy.run([&](ds::ReplicaContext& ctx) {
    std::vector<float> grad = ctx.all_reduce(ds::ReduceOp::Mean, std::vector<float>(8, 1.0f));
    w.assign_sub(grad);
    return grad[0];
  });
  if (strategy.is_chief()) fmt::print("loss {}\n", strategy.reduce("mean", loss));
}

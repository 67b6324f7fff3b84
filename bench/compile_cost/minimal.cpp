// The README's first program (MirroredStrategy, a Variable, one all_reduce), made complete.
#include <distribute/distribute.hpp>
namespace ds = distribute;

int main() {
  ds::MirroredStrategy<ds::host> strategy(4);
  auto scope = strategy.scope();
  ds::Variable<std::vector<float>> w(std::vector<float>(8, 0.0f), {.name = "w"});
  auto losses = strategy.run([&](ds::ReplicaContext& ctx) {
    std::vector<float> grad(8, static_cast<float>(ctx.replica_id_in_sync_group()));
    grad = ctx.all_reduce(ds::ReduceOp::Mean, std::move(grad));
    w.assign_sub(grad);
    return std::vector<float>{1.0f, 2.0f};
  });
  float mean_loss = strategy.reduce(ds::ReduceOp::Mean, losses, 0)[0];
  return mean_loss == 1.5f ? 0 : 1;
}

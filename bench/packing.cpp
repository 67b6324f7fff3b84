// Packing: 200 float32 tensors of 1 KiB all-reduced in one collective (batch_all_reduce) against
// one collective per tensor, 4 host replicas. Target: packed ≥ 10× faster.
#include <distribute/distribute.hpp>

#include <benchmark/benchmark.h>

#include <vector>

namespace ds = distribute;

namespace {
constexpr int kTensors = 200;
constexpr std::size_t kFloats = 1024 / sizeof(float);

std::vector<std::vector<float>> gradients() {
  return std::vector<std::vector<float>>(kTensors, std::vector<float>(kFloats, 0.0f));
}

void BM_Packed(benchmark::State& state) {
  ds::MirroredStrategy<> strategy(static_cast<int>(state.range(0)));
  std::vector<std::vector<std::vector<float>>> grads(static_cast<std::size_t>(state.range(0)), gradients());
  for (auto _ : state) {
    strategy.run([&](ds::ReplicaContext& ctx) {
      auto& mine = grads[static_cast<std::size_t>(ctx.local_replica_id())];
      mine = ctx.batch_all_reduce(ds::ReduceOp::Sum, std::move(mine));
    });
  }
  state.counters["tensors_per_s"] = benchmark::Counter(double(kTensors) * double(state.iterations()), benchmark::Counter::kIsRate);
}

void BM_OneCollectivePerTensor(benchmark::State& state) {
  ds::MirroredStrategy<> strategy(static_cast<int>(state.range(0)));
  std::vector<std::vector<std::vector<float>>> grads(static_cast<std::size_t>(state.range(0)), gradients());
  for (auto _ : state) {
    strategy.run([&](ds::ReplicaContext& ctx) {
      auto& mine = grads[static_cast<std::size_t>(ctx.local_replica_id())];
      for (auto& g : mine) g = ctx.all_reduce(ds::ReduceOp::Sum, std::move(g));
    });
  }
  state.counters["tensors_per_s"] = benchmark::Counter(double(kTensors) * double(state.iterations()), benchmark::Counter::kIsRate);
}
}  // namespace

BENCHMARK(BM_Packed)->Arg(4)->ArgName("replicas")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.5);
BENCHMARK(BM_OneCollectivePerTensor)->Arg(4)->ArgName("replicas")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.5);
BENCHMARK_MAIN();

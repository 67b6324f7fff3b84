// strategy.run() overhead per step: an empty step function, so what is timed is the launch of
// the replicas, their replica-context switch, and the wait for all of them to return.
//
//   run/OneDeviceStrategy                  the step runs on the calling thread
//   run/MirroredStrategy/replicas:{1,2,4}  1 runs inline; 2 and 4 wake the replica threads
//
// Diagnostic rows (to attribute the cost, not targets):
//   executor/replicas:N     backends::HostReplicaThreads::run_all with an empty job: the bare
//                           thread hand-off that run() sits on
//   run_all_reduce_1f/replicas:N  a step doing one all_reduce of a 1-float vector: run() plus
//                           the two barriers of one collective
//
// Time is wall time per step (UseRealTime: the work happens on other threads); the counters
// p50_us (median step), min_us and allocs_per_iter come from bench_common.hpp.
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <benchmark/benchmark.h>

#include <distribute/distribute.hpp>

#include "bench_common.hpp"

namespace ds = distribute;

namespace {

template <class Strategy, class... CtorArgs>
void BM_RunEmpty(benchmark::State& state, CtorArgs... ctor_args) {
  Strategy strategy(ctor_args...);
  for (int i = 0; i < 100; ++i) strategy.run([] {});  // warm the threads up
  bench::IterationTimes times(state);
  for (auto _ : state) {
    times.start();
    strategy.run([] {});
    times.stop();
  }
  times.report(state);
  state.counters["replicas"] = strategy.num_replicas_in_sync();
}

// The executor is a detail of the library whose constructor may change; accept both forms seen.
std::unique_ptr<ds::backends::HostReplicaThreads> make_executor(int n) {
  using T = ds::backends::HostReplicaThreads;
  if constexpr (std::is_constructible_v<T, int>) {
    return std::make_unique<T>(n);
  } else {
    return std::make_unique<T>(n, [](int) {});
  }
}

void BM_Executor(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  auto executor = make_executor(n);
  auto& threads = *executor;
  auto empty = [](int) {};
  ds::backends::ReplicaJob job(empty);
  for (int i = 0; i < 100; ++i) threads.run_all(job);
  bench::IterationTimes times(state);
  for (auto _ : state) {
    times.start();
    threads.run_all(job);
    times.stop();
  }
  times.report(state);
}

void BM_RunAllReduceScalar(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  ds::MirroredStrategy<ds::host> strategy(n);
  std::vector<std::vector<float>> values(static_cast<std::size_t>(n), std::vector<float>(1, 0.0f));
  auto step = [&](ds::ReplicaContext& ctx) {
    auto& v = values[static_cast<std::size_t>(ctx.local_replica_id())];
    v = ctx.all_reduce(ds::ReduceOp::Sum, std::move(v));
  };
  auto guarded = [&]() -> bool {
    try {
      strategy.run(step);
      return true;
    } catch (const std::exception&) {
      for (auto& v : values) v.assign(1, 0.0f);  // a failed all_reduce does not give the value back
      return false;
    }
  };
  for (int i = 0; i < 100; ++i) guarded();
  // A step that throws is counted (failed_steps), not fatal: this row also serves to detect the
  // library's spurious "replica returned from its step function" error (docs/performance.md).
  std::int64_t failed = 0;
  bench::IterationTimes times(state);
  for (auto _ : state) {
    times.start();
    if (!guarded()) ++failed;
    times.stop();
  }
  times.report(state);
  state.counters["failed_steps"] = static_cast<double>(failed);
}

void register_all() {
  constexpr double kMinTime = 0.5;
  auto common = [](benchmark::internal::Benchmark* b) {
    b->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(kMinTime);
  };
  common(benchmark::RegisterBenchmark("run/OneDeviceStrategy",
                                      [](benchmark::State& s) { BM_RunEmpty<ds::OneDeviceStrategy<ds::host>>(s); }));
  for (int n : {1, 2, 4}) {
    common(benchmark::RegisterBenchmark(("run/MirroredStrategy/replicas:" + std::to_string(n)).c_str(),
                                        [n](benchmark::State& s) { BM_RunEmpty<ds::MirroredStrategy<ds::host>>(s, n); }));
  }
  for (int n : {2, 4}) {
    common(benchmark::RegisterBenchmark("executor", BM_Executor)->Arg(n)->ArgName("replicas"));
  }
  for (int n : {2, 4}) {
    common(benchmark::RegisterBenchmark("run_all_reduce_1f", BM_RunAllReduceScalar)->Arg(n)->ArgName("replicas"));
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

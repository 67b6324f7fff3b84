// Diagnostic, not a target: what a step's thread hand-off costs with the library's executor
// (ds::backends::HostReplicaThreads) beside variants of it written here, to see where run()'s
// time at 4 replicas on a 2-vCPU machine goes. Not run by run_benchmarks.py; see
// docs/performance.md ("Diagnosis").
//
//   executor/library/replicas:N      the library's executor, empty job (what run() sits on)
//   executor/caller_runs_0/replicas:N  the same protocol (epoch + notify_all, remaining + notify,
//       same spin policy) but the calling thread runs replica 0 itself, so only N−1 threads are
//       woken and the caller never sleeps while they run
//   executor/caller_runs_0_nospin/replicas:N  as above, never spinning (straight to the futex)
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <benchmark/benchmark.h>

#include <distribute/distribute.hpp>

#include "bench_common.hpp"

namespace ds = distribute;

namespace {

std::unique_ptr<ds::backends::HostReplicaThreads> make_library_executor(int n) {
  using T = ds::backends::HostReplicaThreads;
  if constexpr (std::is_constructible_v<T, int>) {
    return std::make_unique<T>(n);
  } else {
    return std::make_unique<T>(n, [](int) {});
  }
}

/// The library's protocol with replica 0 on the calling thread.
class CallerRunsFirst {
 public:
  CallerRunsFirst(int count, bool spin)
      : count_(count),
        spin_limit_(!spin ? 0u
                          : static_cast<unsigned>(count) < std::max(1u, std::thread::hardware_concurrency()) ? 20000u
                                                                                                             : 64u) {
    for (int i = 1; i < count; ++i) threads_.emplace_back([this, i] { loop(i); });
  }
  ~CallerRunsFirst() {
    stopping_.store(true, std::memory_order_release);
    epoch_.fetch_add(1, std::memory_order_acq_rel);
    epoch_.notify_all();
    for (auto& t : threads_) t.join();
  }

  void run_all(const ds::backends::ReplicaJob& job) noexcept {
    job_ = &job;
    remaining_.store(count_ - 1, std::memory_order_relaxed);
    if (count_ > 1) {
      epoch_.fetch_add(1, std::memory_order_acq_rel);
      epoch_.notify_all();
    }
    job(0);
    unsigned spins = 0;
    for (;;) {
      const int left = remaining_.load(std::memory_order_acquire);
      if (left == 0) break;
      if (spins < spin_limit_) {
        ++spins;
        ds::core::cpu_relax();
      } else {
        remaining_.wait(left, std::memory_order_acquire);
      }
    }
  }

 private:
  void loop(int replica) {
    std::uint32_t seen = 0;
    for (;;) {
      unsigned spins = 0;
      std::uint32_t e;
      while ((e = epoch_.load(std::memory_order_acquire)) == seen) {
        if (spins < spin_limit_) {
          ++spins;
          ds::core::cpu_relax();
        } else {
          epoch_.wait(seen, std::memory_order_acquire);
        }
      }
      seen = e;
      if (stopping_.load(std::memory_order_acquire)) return;
      (*job_)(replica);
      if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) remaining_.notify_all();
    }
  }

  const int count_;
  const unsigned spin_limit_;
  std::vector<std::thread> threads_;
  const ds::backends::ReplicaJob* job_ = nullptr;
  alignas(64) std::atomic<std::uint32_t> epoch_{0};
  alignas(64) std::atomic<int> remaining_{0};
  std::atomic<bool> stopping_{false};
};

template <class Executor>
void time_executor(benchmark::State& state, Executor& executor) {
  auto empty = [](int) {};
  ds::backends::ReplicaJob job(empty);
  for (int i = 0; i < 100; ++i) executor.run_all(job);
  bench::IterationTimes times(state);
  for (auto _ : state) {
    times.start();
    executor.run_all(job);
    times.stop();
  }
  times.report(state);
}

void BM_Library(benchmark::State& state) {
  auto executor = make_library_executor(static_cast<int>(state.range(0)));
  time_executor(state, *executor);
}

void BM_CallerRuns(benchmark::State& state) {
  CallerRunsFirst executor(static_cast<int>(state.range(0)), /*spin=*/true);
  time_executor(state, executor);
}

void BM_CallerRunsNoSpin(benchmark::State& state) {
  CallerRunsFirst executor(static_cast<int>(state.range(0)), /*spin=*/false);
  time_executor(state, executor);
}

void register_all() {
  for (int n : {2, 4}) {
    for (auto [name, fn] : {std::pair{"executor/library", &BM_Library}, std::pair{"executor/caller_runs_0", &BM_CallerRuns},
                            std::pair{"executor/caller_runs_0_nospin", &BM_CallerRunsNoSpin}}) {
      benchmark::RegisterBenchmark(name, fn)
          ->Arg(n)
          ->ArgName("replicas")
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond)
          ->MinTime(0.5);
    }
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

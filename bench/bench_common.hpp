// Helpers shared by the benchmark binaries: per-iteration timing (so a noisy, shared machine can
// be summarised by the median of the iterations, as nccl-tests and PEERS.md do), the
// allocation counter of alloc_counter.cpp, and context switches per iteration (getrusage).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include <benchmark/benchmark.h>

#if defined(__unix__)
#include <sys/resource.h>
#endif

namespace bench {

/// Heap allocations made by this process so far (every operator new; see alloc_counter.cpp).
std::uint64_t allocations() noexcept;

/// Context switches of the whole process so far (voluntary + involuntary, every thread).
inline std::int64_t context_switches() noexcept {
#if defined(__unix__)
  rusage u{};
  if (getrusage(RUSAGE_SELF, &u) == 0) return static_cast<std::int64_t>(u.ru_nvcsw) + u.ru_nivcsw;
#endif
  return 0;
}

/// Records the wall time of each iteration into a buffer reserved up front (no allocation in
/// the timed loop), and reports median / min / allocations as user counters at the end.
class IterationTimes {
 public:
  explicit IterationTimes(const benchmark::State& state) {
    times_.reserve(static_cast<std::size_t>(std::min<benchmark::IterationCount>(state.max_iterations, 50'000'000)));
    allocs_before_ = allocations();
    switches_before_ = context_switches();
  }

  void start() noexcept { t0_ = std::chrono::steady_clock::now(); }
  void stop() noexcept {
    const auto t1 = std::chrono::steady_clock::now();
    if (times_.size() < times_.capacity()) times_.push_back(std::chrono::duration<double>(t1 - t0_).count());
  }

  /// Sets p50_us / min_us / allocs_per_iter / ctxsw_per_iter; returns the median seconds per
  /// iteration.
  double report(benchmark::State& state) {
    const std::uint64_t allocs = allocations() - allocs_before_;
    const std::int64_t switches = context_switches() - switches_before_;
    const double per_iter =
        state.iterations() > 0 ? static_cast<double>(allocs) / static_cast<double>(state.iterations()) : 0.0;
    double median = 0, lo = 0;
    if (!times_.empty()) {
      auto mid = times_.begin() + static_cast<std::ptrdiff_t>(times_.size() / 2);
      std::nth_element(times_.begin(), mid, times_.end());
      median = *mid;
      lo = *std::min_element(times_.begin(), times_.end());
    }
    state.counters["p50_us"] = benchmark::Counter(median * 1e6);
    state.counters["min_us"] = benchmark::Counter(lo * 1e6);
    state.counters["allocs_per_iter"] = benchmark::Counter(per_iter);
    if (state.iterations() > 0) {
      state.counters["ctxsw_per_iter"] =
          benchmark::Counter(static_cast<double>(switches) / static_cast<double>(state.iterations()));
    }
    return median;
  }

 private:
  std::vector<double> times_;
  std::chrono::steady_clock::time_point t0_{};
  std::uint64_t allocs_before_ = 0;
  std::int64_t switches_before_ = 0;
};

}  // namespace bench

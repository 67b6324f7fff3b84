// In-process all-reduce on the host backend, beside the physical limit measured in the same run.
//
//   allreduce<Ops>/bytes:B/replicas:N  N replicas (threads) each own a persistent
//       std::vector<float> of B bytes and run, once per iteration,
//           buf = ctx.all_reduce(ds::ReduceOp::Sum, std::move(buf));
//       inside strategy.run() of ds::MirroredStrategy<ds::host, Ops>. The buffer is moved in and
//       out, so the payload is never copied or reallocated: the benchmark checks that every buffer
//       keeps its address, and reports allocs_per_iter (every heap allocation in the timed loop,
//       the library's own small ones included: 1 + N per step today, see docs/performance.md).
//   allreduce_const<Ops>/bytes:B/replicas:N  each replica reduces a const std::vector<float> it
//       keeps (an lvalue: the library may not write it) and assigns the result to a vector it
//       keeps, `out = ctx.all_reduce(ds::ReduceOp::Sum, std::as_const(in))`: what a step that
//       reduces gradients it still needs costs, result allocation included.
//   allreduce_into<Ops>/bytes:B/replicas:N  the same const inputs reduced into an output each
//       replica keeps, `ctx.all_reduce_into(ds::ReduceOp::Sum, std::as_const(in), out)`: one pass
//       into memory reused every step (the benchmark checks that no output is reallocated).
//   memcpy/bytes:B/replicas:N  one thread copies N×B bytes (the same total bytes the replicas
//       hold) from one pre-touched buffer to another: the single-thread memory-bandwidth limit.
//
// Sizes go from 4 KiB to 256 MiB in powers of 4; each size's memcpy runs right before its
// all-reduces, so both see the same machine state. Counters: p50_us (median iteration),
// algbw = B / time and busbw = algbw·2(N−1)/N (nccl-tests' definitions, GB = 1e9); the ratio
// all-reduce / memcpy is computed by run_benchmarks.py from the JSON.
//
// To compare another cross-device ops policy, add it to `Policies` below (one line).
#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>
#include <typeinfo>
#include <utility>
#include <vector>

#include <benchmark/benchmark.h>

#include <distribute/distribute.hpp>

#include "bench_common.hpp"

namespace ds = distribute;

namespace {

template <class... Ops>
struct PolicyList {};

// ---------------------------------------------------------------------------------------------
// The cross-device ops policies measured: ds::MirroredStrategy<ds::host, Ops> for each.
using Policies = PolicyList<ds::SharedMemoryAllReduce, ds::ReductionToOneDevice, ds::HierarchicalCopyAllReduce>;
// (all the host cross-device ops policies)
// ---------------------------------------------------------------------------------------------

constexpr std::size_t kMinBytes = std::size_t{4} << 10;    // 4 KiB
constexpr std::size_t kMaxBytes = std::size_t{256} << 20;  // 256 MiB
// Replica counts: 4 unless --replicas=2,4 (a flag of this binary, read before Google Benchmark's).
std::vector<int> g_replicas = {4};

template <class Ops>
std::string policy_name() {
  if constexpr (requires { Ops::name; }) {
    return std::string(std::string_view(Ops::name));
  } else {
    return typeid(Ops).name();
  }
}

void set_bandwidth_counters(benchmark::State& state, double seconds, std::size_t bytes, int n) {
  if (seconds <= 0) return;
  const double algbw = static_cast<double>(bytes) / seconds / 1e9;
  state.counters["algbw_GBps"] = benchmark::Counter(algbw);
  state.counters["busbw_GBps"] = benchmark::Counter(algbw * 2.0 * (n - 1) / n);
}

// Runs `step` once per benchmark iteration and returns the median seconds; a failed step ends the
// benchmark with SkipWithError (a step that moved its buffers in leaves nothing to measure).
template <class Strategy, class Step>
double timed_steps(benchmark::State& state, Strategy& strategy, Step& step) {
  bench::IterationTimes times(state);
  for (auto _ : state) {
    times.start();
    try {
      strategy.run(step);
    } catch (const std::exception& e) {
      state.SkipWithError((std::string("a step failed: ") + e.what()).c_str());
      break;
    }
    times.stop();
  }
  return state.error_occurred() ? 0.0 : times.report(state);
}

template <class Ops>
void BM_AllReduce(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const int n = static_cast<int>(state.range(1));
  const std::size_t count = bytes / sizeof(float);
  ds::MirroredStrategy<ds::host, Ops> strategy(n);

  std::vector<std::vector<float>> buffers(static_cast<std::size_t>(n));
  std::vector<const float*> addresses(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    buffers[static_cast<std::size_t>(r)].assign(count, static_cast<float>(r + 1));
    addresses[static_cast<std::size_t>(r)] = buffers[static_cast<std::size_t>(r)].data();
  }
  auto step = [&](ds::ReplicaContext& ctx) {
    auto& buf = buffers[static_cast<std::size_t>(ctx.local_replica_id())];
    buf = ctx.all_reduce(ds::ReduceOp::Sum, std::move(buf));
  };

  // Warm-up, and a check that the sum is right (1 + 2 + ... + n everywhere).
  try {
    strategy.run(step);
  } catch (const std::exception& e) {
    state.SkipWithError((std::string("the warm-up step failed: ") + e.what()).c_str());
    return;
  }
  const float expected = static_cast<float>(n * (n + 1) / 2);
  for (const auto& b : buffers) {
    if (b.size() != count || b.front() != expected || b[count / 2] != expected || b.back() != expected) {
      state.SkipWithError("all_reduce returned a wrong sum");
      return;
    }
  }
  // Zeros from here on: the sums stay finite (no overflow to inf) whatever the iteration count.
  for (auto& b : buffers) std::memset(b.data(), 0, bytes);

  const double median = timed_steps(state, strategy, step);
  if (state.error_occurred()) return;

  for (int r = 0; r < n; ++r) {
    if (buffers[static_cast<std::size_t>(r)].data() != addresses[static_cast<std::size_t>(r)]) {
      state.SkipWithError("a replica's buffer was reallocated: the move in/out did not keep it");
      return;
    }
  }
  set_bandwidth_counters(state, median, bytes, n);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(bytes));
}

template <class Ops>
void BM_AllReduceConst(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const int n = static_cast<int>(state.range(1));
  const std::size_t count = bytes / sizeof(float);
  ds::MirroredStrategy<ds::host, Ops> strategy(n);

  std::vector<std::vector<float>> inputs(static_cast<std::size_t>(n)), outputs(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) inputs[static_cast<std::size_t>(r)].assign(count, static_cast<float>(r + 1));
  auto step = [&](ds::ReplicaContext& ctx) {
    const auto r = static_cast<std::size_t>(ctx.local_replica_id());
    outputs[r] = ctx.all_reduce(ds::ReduceOp::Sum, std::as_const(inputs[r]));
  };
  try {
    strategy.run(step);
  } catch (const std::exception& e) {
    state.SkipWithError((std::string("the warm-up step failed: ") + e.what()).c_str());
    return;
  }
  const float expected = static_cast<float>(n * (n + 1) / 2);
  for (int r = 0; r < n; ++r) {
    const auto& in = inputs[static_cast<std::size_t>(r)];
    const auto& out = outputs[static_cast<std::size_t>(r)];
    if (out.size() != count || out.front() != expected || out[count / 2] != expected || out.back() != expected ||
        in.front() != static_cast<float>(r + 1) || in.back() != static_cast<float>(r + 1)) {
      state.SkipWithError("all_reduce of const inputs returned a wrong sum or wrote its input");
      return;
    }
  }
  const double median = timed_steps(state, strategy, step);
  if (state.error_occurred()) return;
  set_bandwidth_counters(state, median, bytes, n);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(bytes));
}

template <class Ops>
void BM_AllReduceInto(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const int n = static_cast<int>(state.range(1));
  const std::size_t count = bytes / sizeof(float);
  ds::MirroredStrategy<ds::host, Ops> strategy(n);

  std::vector<std::vector<float>> inputs(static_cast<std::size_t>(n)), outputs(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) inputs[static_cast<std::size_t>(r)].assign(count, static_cast<float>(r + 1));
  auto step = [&](ds::ReplicaContext& ctx) {
    const auto r = static_cast<std::size_t>(ctx.local_replica_id());
    ctx.all_reduce_into(ds::ReduceOp::Sum, std::as_const(inputs[r]), outputs[r]);
  };
  try {
    strategy.run(step);  // the outputs are made here, at the inputs' size, and kept from then on
  } catch (const std::exception& e) {
    state.SkipWithError((std::string("the warm-up step failed: ") + e.what()).c_str());
    return;
  }
  const float expected = static_cast<float>(n * (n + 1) / 2);
  std::vector<const float*> addresses;
  for (int r = 0; r < n; ++r) {
    const auto& in = inputs[static_cast<std::size_t>(r)];
    const auto& out = outputs[static_cast<std::size_t>(r)];
    if (out.size() != count || out.front() != expected || out[count / 2] != expected || out.back() != expected ||
        in.front() != static_cast<float>(r + 1) || in.back() != static_cast<float>(r + 1)) {
      state.SkipWithError("all_reduce_into returned a wrong sum or wrote its input");
      return;
    }
    addresses.push_back(out.data());
  }
  const double median = timed_steps(state, strategy, step);
  if (state.error_occurred()) return;
  for (int r = 0; r < n; ++r) {
    if (outputs[static_cast<std::size_t>(r)].data() != addresses[static_cast<std::size_t>(r)]) {
      state.SkipWithError("a replica's output was reallocated: all_reduce_into did not write it in place");
      return;
    }
  }
  set_bandwidth_counters(state, median, bytes, n);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(bytes));
}

void BM_Memcpy(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const int n = static_cast<int>(state.range(1));
  const std::size_t total = bytes * static_cast<std::size_t>(n);
  std::vector<float> src(total / sizeof(float), 1.0f), dst(total / sizeof(float), 0.0f);
  std::memcpy(dst.data(), src.data(), total);  // warm-up

  bench::IterationTimes times(state);
  for (auto _ : state) {
    times.start();
    std::memcpy(dst.data(), src.data(), total);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
    times.stop();
  }
  const double median = times.report(state);
  // algbw here is the per-replica size over the time to copy all N of them, so it compares
  // directly with the all-reduce's algbw; copy_GBps is the raw copy bandwidth (total / time).
  set_bandwidth_counters(state, median, bytes, n);
  if (median > 0) state.counters["copy_GBps"] = benchmark::Counter(static_cast<double>(total) / median / 1e9);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(total));
}

// Small sizes run for a minimum time; from 16 MiB on a fixed count of iterations (≥ 20, so the
// median means something) keeps the 256 MiB runs to a few seconds each.
void configure(benchmark::internal::Benchmark* b, std::size_t bytes, int n) {
  b->Args({static_cast<std::int64_t>(bytes), n})->ArgNames({"bytes", "replicas"});
  b->UseRealTime()->Unit(benchmark::kMillisecond);
  if (bytes >= (std::size_t{16} << 20)) {
    b->Iterations(20);
  } else {
    b->MinTime(0.25);
  }
}

template <class... Ops>
void register_policies(PolicyList<Ops...>, std::size_t bytes, int n) {
  (configure(benchmark::RegisterBenchmark(("allreduce<" + policy_name<Ops>() + ">").c_str(), BM_AllReduce<Ops>),
             bytes, n),
   ...);
}

void register_all() {
  for (int n : g_replicas) {
    for (std::size_t bytes = kMinBytes; bytes <= kMaxBytes; bytes *= 4) {
      configure(benchmark::RegisterBenchmark("memcpy", BM_Memcpy), bytes, n);
      register_policies(Policies{}, bytes, n);
      configure(benchmark::RegisterBenchmark("allreduce_const<SharedMemoryAllReduce>",
                                             BM_AllReduceConst<ds::SharedMemoryAllReduce>),
                bytes, n);
      configure(benchmark::RegisterBenchmark("allreduce_into<SharedMemoryAllReduce>",
                                             BM_AllReduceInto<ds::SharedMemoryAllReduce>),
                bytes, n);
    }
  }
}

}  // namespace

// Removes --replicas=LIST from argv and applies it.
bool parse_own_flags(int& argc, char** argv) {
  constexpr std::string_view flag = "--replicas=";
  int out = 1;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg.substr(0, flag.size()) != flag) {
      argv[out++] = argv[i];
      continue;
    }
    g_replicas.clear();
    std::string list(arg.substr(flag.size()));
    std::size_t pos = 0;
    while (pos <= list.size()) {
      const std::size_t comma = std::min(list.find(',', pos), list.size());
      try {
        const int n = std::stoi(list.substr(pos, comma - pos));
        if (n < 1) throw std::out_of_range("replicas");
        g_replicas.push_back(n);
      } catch (const std::exception&) {
        std::fprintf(stderr, "bad %.*s: expected a list of positive integers like --replicas=2,4\n",
                     static_cast<int>(arg.size()), arg.data());
        return false;
      }
      pos = comma + 1;
    }
  }
  argc = out;
  argv[argc] = nullptr;
  return true;
}

int main(int argc, char** argv) {
  if (!parse_own_flags(argc, argv)) return 1;
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

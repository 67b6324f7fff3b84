// Slurm hostlist expansion (cluster/detail/slurm_hostlist.hpp): the 418-byte list of issue 20
// (a million names of 306 bytes, which took 17 s and 0.7 GB before the bound) is refused before
// anything is built; a 1.2 KB list of 60 ranges of 100,000 names likewise; a million real names
// expand in time linear in their text.
#include <distribute/cluster/slurm.hpp>

#include <benchmark/benchmark.h>

#include <string>

#include <fmt/format.h>

namespace ds = distribute;

namespace {

void refused(benchmark::State& state, const std::string& text) {
  for (auto _ : state) {
    try {
      benchmark::DoNotOptimize(ds::SlurmClusterResolver::expand_hostlist(text));
      state.SkipWithError("the list was not refused");
    } catch (const ds::ClusterConfigError&) {
    }
  }
}

void BM_Hostlist418BytesRefused(benchmark::State& state) {
  refused(state, std::string(300, 'x') + "[0-9][0-9][0-9][0-9][0-9][0-9]" + std::string(88, 'y'));
}
BENCHMARK(BM_Hostlist418BytesRefused)->Unit(benchmark::kMicrosecond);

void BM_Hostlist1200BytesRefused(benchmark::State& state) {
  std::string text;
  for (int i = 0; i < 60; ++i) text += fmt::format("{}r{}[0-99][0-99][0-9]", i ? "," : "", i);
  refused(state, text);
}
BENCHMARK(BM_Hostlist1200BytesRefused)->Unit(benchmark::kMicrosecond);

// 10^6 names of 7 bytes (the name bound).
void BM_HostlistMillionNames(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(ds::SlurmClusterResolver::expand_hostlist("n[0-9][0-9][0-9][0-9][0-9][0-9]"));
  state.SetItemsProcessed(state.iterations() * 1000000);
}
BENCHMARK(BM_HostlistMillionNames)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();

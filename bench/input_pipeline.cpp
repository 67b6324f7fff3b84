// Input pipeline throughput: elements per second through
//
//   data::from_text_files(8 CSV files) → map(parse "label,f0,...,f15") → batch(256) [→ prefetch(2)]
//
// consumed by a training loop whose step is a fixed sleep (a stand-in for the model's work).
// Without prefetch the loop pays parse + step for every batch; with prefetch the next batch is
// parsed on the background thread during the step, so the loop pays max(parse, step).
//
//   pipeline/prefetch:0/step_us:0      the pipeline alone (what one batch costs to make)
//   pipeline/prefetch:0/step_us:S      the loop without prefetch, S = 500 (about one batch's
//                                      parse time) and 2000 µs
//   pipeline/prefetch:2/step_us:S      the loop with prefetch(2)
//
// Counters: elements_per_s (rows per second of wall time), p50_us (median wall time of one loop
// iteration: next batch + step), allocs_per_iter and ctxsw_per_iter (see bench_common.hpp).
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <distribute/distribute.hpp>

#include "bench_common.hpp"

namespace ds = distribute;
namespace data = distribute::data;

namespace {

constexpr int kFiles = 8;
constexpr int kLinesPerFile = 4096;
constexpr int kFeatures = 16;
constexpr std::int64_t kBatch = 256;

/// The CSV files, written once per process into a temporary directory and removed at exit.
struct CsvFiles {
  std::filesystem::path dir;
  std::vector<std::string> paths;

  CsvFiles() {
    dir = std::filesystem::temp_directory_path() / fmt::format("distribute_bench_input_{}", ::getpid());
    std::filesystem::create_directories(dir);
    std::mt19937 rng(1);
    std::normal_distribution<float> normal;
    for (int f = 0; f < kFiles; ++f) {
      paths.push_back((dir / fmt::format("part-{}.csv", f)).string());
      std::ofstream out(paths.back());
      for (int i = 0; i < kLinesPerFile; ++i) {
        std::string line = std::to_string(i % 2);
        for (int k = 0; k < kFeatures; ++k) line += fmt::format(",{:.6f}", normal(rng));
        out << line << '\n';
      }
    }
  }
  ~CsvFiles() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

const CsvFiles& csv_files() {
  static const CsvFiles files;
  return files;
}

/// "label,f0,...,f15" → (features, label).
std::pair<std::vector<float>, int> parse(const std::string& line) {
  const char* p = line.c_str();
  char* end = nullptr;
  const int label = static_cast<int>(std::strtol(p, &end, 10));
  std::vector<float> features(kFeatures);
  for (auto& x : features) {
    p = end + 1;  // skip the comma
    x = std::strtof(p, &end);
  }
  return {std::move(features), label};
}

void BM_Pipeline(benchmark::State& state) {
  const auto prefetch = state.range(0);
  const auto step = std::chrono::microseconds(state.range(1));
  auto dataset = data::from_text_files(csv_files().paths).map(parse).batch(kBatch).repeat();
  if (prefetch > 0) dataset = dataset.prefetch(prefetch);
  auto it = dataset.begin();
  for (int i = 0; i < 4; ++i) ++it;  // start the files and the thread before timing
  std::int64_t elements = 0;
  bench::IterationTimes times(state);
  for (auto _ : state) {
    times.start();
    const auto& [features, labels] = *it;
    elements += labels.shape()[0];
    benchmark::DoNotOptimize(features.data());
    ++it;
    if (step.count() > 0) std::this_thread::sleep_for(step);  // the training step
    times.stop();
  }
  times.report(state);
  state.SetItemsProcessed(elements);
  state.counters["elements_per_s"] = benchmark::Counter(static_cast<double>(elements), benchmark::Counter::kIsRate);
  state.counters["batch"] = static_cast<double>(kBatch);
}

BENCHMARK(BM_Pipeline)
    ->Name("pipeline")
    ->ArgNames({"prefetch", "step_us"})
    ->Args({0, 0})
    ->Args({0, 500})
    ->Args({2, 500})
    ->Args({0, 2000})
    ->Args({2, 2000})
    ->UseRealTime()
    ->MinTime(2.0)
    ->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();

// One worker process of the data/ multi-worker tests (tests/test_data.cpp, suite data_multi_worker).
// Reads TF_CONFIG like a user's program, iterates distributed datasets and prints what its
// replicas saw; the test merges the workers' lines and checks the multiset.
//   data_worker_helper SCENARIO LOCAL_REPLICAS DIR        (DIR holds part-0.csv, part-1.csv, ...)
// Scenarios:
//   multiset        for each source × policy × drop_remainder prints
//                   "RESULT <policy>_<source>_<keep|drop> steps=S reduced_sum=X elems= a b c ..." and
//                   "MEAN <name> step=S mean=M rows= a b ...": reduce(Mean, loss, 0) over every
//                   worker for the last step S that had rows, and this worker's rows of that step
//                   (loss of row v: v/8 + 0.1)
//   few_files       AutoShardPolicy::File with fewer files than workers (expects InvalidArgument)
//   pipeline_error  worker 1's pipeline throws at row 1005 (File policy, one file per worker)
// Exit codes: 0 ok, 3 PeerFailure/CollectiveTimeout, 4 InvalidArgument, 5 other error.
#define DISTRIBUTE_WITH_MULTI_WORKER
#include <distribute/distribute.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace ds = distribute;
namespace data = distribute::data;
using Strategy = ds::MultiWorkerMirroredStrategy<ds::host>;
using I64 = std::int64_t;

namespace {

constexpr I64 global_batch = 4;
constexpr I64 range_size = 23;

std::vector<std::string> part_files(const std::string& dir) {
  std::vector<std::string> files;
  for (int i = 0;; ++i) {
    auto path = std::filesystem::path(dir) / fmt::format("part-{}.csv", i);
    if (!std::filesystem::exists(path)) break;
    files.push_back(path.string());
  }
  return files;
}

I64 parse_line(const std::string& line) { return std::stoll(line); }

/// A per-example "loss" of row value v (any function of the row will do; not an integer, so
/// that a Mean computed in integers would show).
double row_loss(I64 v) { return static_cast<double>(v) / 8.0 + 0.1; }

/// Iterates `dataset` distributed and prints what this worker's replicas saw, and (MEAN line) the
/// last step's reduce(Mean, per_replica_loss, axis=0) with this worker's rows of that step.
void run_case(Strategy& s, const std::string& name, const data::Dataset<ds::Tensor<I64>>& dataset) {
  I64 steps = 0, reduced_sum = 0;
  std::vector<I64> mine, last_rows;
  double last_mean = 0;
  I64 last_step = 0;  // the last step that had rows (on any worker)
  for (const auto& batch : s.distribute_dataset(dataset)) {
    auto rows = s.run(
        [](ds::ReplicaContext& ctx, const ds::Tensor<I64>& b) {
          // A collective every step: a worker that stopped before the others would leave them
          // waiting here (and the test would time out).
          ctx.all_reduce("sum", std::vector<I64>{static_cast<I64>(b.size())});
          return b;
        },
        batch);
    for (const auto& r : rows.values()) mine.insert(mine.end(), r.begin(), r.end());
    reduced_sum += s.reduce("sum", rows, 0)[0];  // across every replica of every worker
    ++steps;
    // Per-example losses of each replica's piece (possibly empty), averaged over the step's rows
    // on every worker. (Under File and Off a step can have no rows at all, where a mean is
    // undefined: those steps are left out.)
    const I64 step_rows = s.reduce("sum", s.run([](const ds::Tensor<I64>& b) { return static_cast<I64>(b.size()); }, batch));
    if (step_rows == 0) continue;
    auto per_replica_loss = s.run(
        [](const ds::Tensor<I64>& b) {
          std::vector<double> loss;
          for (I64 v : b) loss.push_back(row_loss(v));
          return loss;
        },
        batch);
    last_mean = s.reduce(ds::ReduceOp::Mean, per_replica_loss, 0)[0];
    last_step = steps;
    last_rows.clear();
    for (const auto& r : rows.values()) last_rows.insert(last_rows.end(), r.begin(), r.end());
  }
  fmt::print("RESULT {} steps={} reduced_sum={} elems= {}\n", name, steps, reduced_sum, fmt::join(mine, " "));
  fmt::print("MEAN {} step={} mean={:.17g} rows= {}\n", name, last_step, last_mean, fmt::join(last_rows, " "));
}

void multiset(Strategy& s, const std::vector<std::string>& files) {
  using P = data::AutoShardPolicy;
  for (bool drop : {false, true}) {
    const std::string suffix = drop ? "_drop" : "_keep";
    // A seeded shuffle: under Data every worker must draw the same order. Made afresh for each
    // case, so that each is the seed's first pass (a dataset reshuffles on every pass).
    auto numbers = [&] { return data::range(range_size).shuffle(10, 99).batch(global_batch, drop); };
    auto lines = data::from_text_files(files).map(parse_line).batch(global_batch, drop);
    run_case(s, "data_range" + suffix, numbers().with_options({.auto_shard_policy = P::Data}));
    run_case(s, "off_range" + suffix, numbers().with_options({.auto_shard_policy = P::Off}));
    run_case(s, "data_files" + suffix, lines.with_options({.auto_shard_policy = P::Data}));
    run_case(s, "file_files" + suffix, lines.with_options({.auto_shard_policy = P::File}));
    run_case(s, "auto_files" + suffix, lines);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string scenario = argc > 1 ? argv[1] : "multiset";
  const int local = argc > 2 ? std::atoi(argv[2]) : 1;
  const std::string dir = argc > 3 ? argv[3] : ".";
  int worker = -1;
  try {
    ds::CommunicationOptions options;
    options.timeout_seconds = 60;  // a test that goes wrong fails instead of hanging
    Strategy s(options, nullptr, local);
    worker = s.worker_index();
    fmt::print("worker {} of {}: {} replicas in sync\n", s.worker_index(), s.num_workers(), s.num_replicas_in_sync());
    const auto files = part_files(dir);
    if (scenario == "multiset") {
      multiset(s, files);
    } else if (scenario == "few_files") {
      auto lines = data::from_text_files(files).map(parse_line).batch(global_batch);
      s.distribute_dataset(lines.with_options({.auto_shard_policy = data::AutoShardPolicy::File}));
    } else if (scenario == "pipeline_error") {
      auto lines = data::from_text_files(files).map([&](const std::string& line) {
        const I64 v = parse_line(line);
        if (v == 1005) throw std::runtime_error("bad record 1005");
        return v;
      });
      auto dist = s.distribute_dataset(
          lines.batch(global_batch).with_options({.auto_shard_policy = data::AutoShardPolicy::File}));
      for (const auto& batch : dist) {
        s.run([](ds::ReplicaContext& ctx, const ds::Tensor<I64>& b) {
          ctx.all_reduce("sum", std::vector<I64>{static_cast<I64>(b.size())});
        }, batch);
      }
    } else {
      fmt::print("unknown scenario '{}'\n", scenario);
      return 5;
    }
    fmt::print("OK\n");
    return 0;
  } catch (const ds::InvalidArgument& e) {
    fmt::print("InvalidArgument: {}\n", e.what());
    return 4;
  } catch (const ds::PeerFailure& e) {
    fmt::print("PeerFailure: {}\n", e.what());
    return 3;
  } catch (const ds::CollectiveTimeout& e) {
    fmt::print("CollectiveTimeout: {}\n", e.what());
    return 3;
  } catch (const std::exception& e) {
    fmt::print("Error: {}\n", e.what());
    std::fflush(stdout);
    // The failing worker lingers a moment before its connections close, so that the test sees
    // the others report the failure through the step agreement (they would get a PeerFailure
    // for the closed connections otherwise, which is right too but less specific).
    if (worker >= 0) std::this_thread::sleep_for(std::chrono::seconds(1));
    return 5;
  }
}

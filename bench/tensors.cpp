// What bringing your own tensors costs, and what 16-bit gradients save:
//   bench_tensors mirrored [MiB]        MirroredStrategy<host>(4): all-reduce of a torch::Tensor
//                                       against a std::vector<float> of the same bytes (default 64 MiB)
//   distribute-launch -n 2 -- bench_tensors multi_worker [MiB]
//                                       2 workers: torch::Tensor against std::vector<float> (default
//                                       16 MiB, shared memory as a user gets it)
//   distribute-launch -n 2 -- bench_tensors bf16 [MiB]
//                                       2 workers: bfloat16 against float32 of the same element count
//                                       (default 16 MiB of float32) over TCP (shared_memory_min_bytes
//                                       0), as std::vector and as torch::Tensor
// Variants alternate round by round in one process, so both see the same machine state; each
// prints its median and minimum milliseconds per all-reduce and the ratio of medians.
#define DISTRIBUTE_WITH_MULTI_WORKER
#include <torch/torch.h>

#include <distribute/distribute.hpp>
#include <distribute/adapters/torch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace ds = distribute;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

/// Runs each variant `rounds` times, alternating, after one unrecorded warm-up each; every
/// variant returns the seconds of one all-reduce. Returns the per-variant times.
std::map<std::string, std::vector<double>> alternate(const std::vector<std::pair<std::string, std::function<double()>>>& variants,
                                                     int rounds) {
  std::map<std::string, std::vector<double>> times;
  for (const auto& [name, run] : variants) run();
  for (int r = 0; r < rounds; ++r) {
    for (const auto& [name, run] : variants) times[name].push_back(run());
  }
  return times;
}

void report(const std::map<std::string, std::vector<double>>& times, const std::string& variant,
            const std::string& baseline, const std::string& setting) {
  const double m = median(times.at(variant)) * 1e3, b = median(times.at(baseline)) * 1e3;
  std::printf("%-58s %-22s median %8.3f ms  min %8.3f ms   %s / %s = %.3f\n", setting.c_str(), variant.c_str(), m,
              *std::min_element(times.at(variant).begin(), times.at(variant).end()) * 1e3, variant.c_str(),
              baseline.c_str(), m / b);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

template <class Strategy>
void compare_torch_and_vector(Strategy& strategy, std::size_t bytes, int rounds, const std::string& setting) {
  const int local = strategy.num_local_replicas();
  const auto count = static_cast<std::int64_t>(bytes / sizeof(float));
  std::vector<std::vector<float>> vectors(static_cast<std::size_t>(local), std::vector<float>(static_cast<std::size_t>(count), 1.0f));
  std::vector<torch::Tensor> tensors;
  for (int r = 0; r < local; ++r) tensors.push_back(torch::ones({count}, torch::kFloat32));
  // Each variant: one step whose replicas all-reduce their buffer in place (moved in, moved back).
  auto timed = [&](auto&& body) {
    strategy.run([](ds::ReplicaContext& ctx) { return ctx.all_reduce(ds::ReduceOp::Sum, 0); });  // align workers
    const auto t0 = std::chrono::steady_clock::now();
    strategy.run(body);
    return seconds_since(t0);
  };
  auto times = alternate(
      {{"std::vector<float>",
        [&] {
          return timed([&](ds::ReplicaContext& ctx) {
            auto& v = vectors[static_cast<std::size_t>(ctx.local_replica_id())];
            v = ctx.all_reduce(ds::ReduceOp::Mean, std::move(v));
          });
        }},
       {"torch::Tensor",
        [&] {
          return timed([&](ds::ReplicaContext& ctx) {
            auto& t = tensors[static_cast<std::size_t>(ctx.local_replica_id())];
            t = ctx.all_reduce(ds::ReduceOp::Mean, std::move(t));
          });
        }}},
      rounds);
  if (strategy.worker_index() == 0) {
    report(times, "std::vector<float>", "std::vector<float>", setting);
    report(times, "torch::Tensor", "std::vector<float>", setting);
  }
}

template <class Strategy>
void compare_bf16_and_f32(Strategy& strategy, std::size_t f32_bytes, int rounds, const std::string& setting) {
  const auto count = static_cast<std::size_t>(f32_bytes / sizeof(float));
  const int local = strategy.num_local_replicas();
  std::vector<std::vector<float>> f32(static_cast<std::size_t>(local), std::vector<float>(count, 1.0f));
  std::vector<std::vector<ds::bfloat16>> bf16(static_cast<std::size_t>(local), std::vector<ds::bfloat16>(count, ds::bfloat16(1.0f)));
  std::vector<torch::Tensor> tf32, tbf16;
  for (int r = 0; r < local; ++r) {
    tf32.push_back(torch::ones({static_cast<std::int64_t>(count)}, torch::kFloat32));
    tbf16.push_back(torch::ones({static_cast<std::int64_t>(count)}, torch::kBFloat16));
  }
  auto timed = [&](auto&& body) {
    strategy.run([](ds::ReplicaContext& ctx) { return ctx.all_reduce(ds::ReduceOp::Sum, 0); });
    const auto t0 = std::chrono::steady_clock::now();
    strategy.run(body);
    return seconds_since(t0);
  };
  auto step = [&](auto& buffers) {
    return timed([&](ds::ReplicaContext& ctx) {
      auto& b = buffers[static_cast<std::size_t>(ctx.local_replica_id())];
      b = ctx.all_reduce(ds::ReduceOp::Sum, std::move(b));
    });
  };
  auto times = alternate({{"float32 std::vector", [&] { return step(f32); }},
                          {"bfloat16 std::vector", [&] { return step(bf16); }},
                          {"float32 torch", [&] { return step(tf32); }},
                          {"bfloat16 torch", [&] { return step(tbf16); }}},
                         rounds);
  if (strategy.worker_index() == 0) {
    report(times, "float32 std::vector", "float32 std::vector", setting);
    report(times, "bfloat16 std::vector", "float32 std::vector", setting);
    report(times, "float32 torch", "float32 torch", setting);
    report(times, "bfloat16 torch", "float32 torch", setting);
  }
}

}  // namespace

int main(int argc, char** argv) {
  at::set_num_threads(1);
  const std::string mode = argc > 1 ? argv[1] : "mirrored";
  const int rounds = std::getenv("BENCH_ROUNDS") ? std::atoi(std::getenv("BENCH_ROUNDS")) : 15;
  try {
    if (mode == "mirrored") {
      const std::size_t mib = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 64;
      ds::MirroredStrategy<ds::host> strategy(4);
      compare_torch_and_vector(strategy, mib << 20, rounds, fmt::format("Mirrored(4), {} MiB per replica", mib));
      return 0;
    }
    if (mode == "multi_worker") {
      const std::size_t mib = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 16;
      ds::MultiWorkerMirroredStrategy<ds::host> strategy;
      compare_torch_and_vector(strategy, mib << 20, rounds,
                               fmt::format("MultiWorker np={}, {} MiB (shared memory)", strategy.num_workers(), mib));
      return 0;
    }
    if (mode == "bf16") {
      const std::size_t mib = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 16;
      ds::CommunicationOptions tcp;
      tcp.shared_memory_min_bytes = 0;
      ds::MultiWorkerMirroredStrategy<ds::host> strategy(tcp);
      compare_bf16_and_f32(strategy, mib << 20, rounds,
                           fmt::format("MultiWorker np={}, {} MiB of float32, TCP", strategy.num_workers(), mib));
      return 0;
    }
    std::fprintf(stderr, "usage: bench_tensors mirrored|multi_worker|bf16 [MiB]\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_tensors: %s\n", e.what());
    return 1;
  }
}

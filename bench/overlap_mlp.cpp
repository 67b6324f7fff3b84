// Communication behind backward: steps/s of a libtorch MLP trained with MultiWorkerMirroredStrategy,
// its gradients all-reduced after backward (sync) or bucket by bucket while backward runs
// (--overlap, adapters/torch_bucketer.hpp). One process per worker, under distribute-launch:
//
//   distribute-launch -n 2 build-bench/bench/overlap_mlp --overlap 1 --hidden 2048 --layers 5 --batch 16
//   (--wire bf16: the bucketer sends bfloat16; --bytes-per-pack N: its bucket size)
//
// The model: --layers Linear(H, H) + ReLU, float32 (5 x 2048^2 = 21 M parameters, 84 MB of
// gradients); synthetic inputs and targets, mean-squared error, SGD. Worker 0 prints one CSV line:
//   overlap_mlp,<sync|overlap>,workers,params,batch,steps,steps_per_s,step_ms,allreduce_ms,compute_ms
// where allreduce_ms is one all-reduce of all gradients alone and compute_ms one forward + backward
// alone (both medians), so that the share of communication in a synchronous step is visible.
// CommunicationOptions come from the usual variables (DISTRIBUTE_SHARED_MEMORY_MIN_BYTES=0 keeps
// one host's workers on TCP; MW_SHM_MIN_BYTES, as bench/multiworker, does the same).
#include <torch/torch.h>

#define DISTRIBUTE_WITH_MULTI_WORKER
#include <distribute/distribute.hpp>
#include <distribute/adapters/torch.hpp>
#include <distribute/adapters/torch_bucketer.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

namespace ds = distribute;

namespace {

struct Options {
  bool overlap = false;
  int hidden = 2048;
  int layers = 5;
  int batch = 16;
  int steps = 20;
  std::size_t bytes_per_pack = std::size_t{4} << 20;
  bool bf16_wire = false;  // --wire bf16: the bucketer sends bfloat16 (overlap only)
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string_view flag = argv[i];
    const char* v = argv[i + 1];
    if (flag == "--overlap") o.overlap = std::atoi(v) != 0;
    else if (flag == "--hidden") o.hidden = std::atoi(v);
    else if (flag == "--layers") o.layers = std::atoi(v);
    else if (flag == "--batch") o.batch = std::atoi(v);
    else if (flag == "--steps") o.steps = std::atoi(v);
    else if (flag == "--bytes-per-pack") o.bytes_per_pack = std::strtoull(v, nullptr, 10);
    else if (flag == "--wire" && (std::string_view(v) == "bf16" || std::string_view(v) == "fp32")) o.bf16_wire = std::string_view(v) == "bf16";
    else throw std::runtime_error(fmt::format("unknown option {}", flag));
  }
  return o;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  torch::set_num_threads(1);  // one core per worker, as distribute-launch binds them
  ds::CommunicationOptions communication;
  if (const char* m = std::getenv("MW_SHM_MIN_BYTES")) communication.shared_memory_min_bytes = std::strtoull(m, nullptr, 10);
  ds::MultiWorkerMirroredStrategy<ds::host> strategy(communication);

  torch::manual_seed(1);
  torch::nn::Sequential model;
  for (int l = 0; l < o.layers; ++l) {
    model->push_back(torch::nn::Linear(o.hidden, o.hidden));
    if (l + 1 < o.layers) model->push_back(torch::nn::ReLU());
  }
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(1e-3));
  ds::adapters::torch::GradientBucketer bucketer(
      model->parameters(), {.bytes_per_pack = o.bytes_per_pack,
                            .wire = o.bf16_wire ? std::optional<c10::ScalarType>(c10::kBFloat16) : std::nullopt});
  std::int64_t params = 0;
  for (const auto& p : model->parameters()) params += p.numel();
  const torch::Tensor x = torch::randn({o.batch, o.hidden});
  const torch::Tensor y = torch::randn({o.batch, o.hidden});

  auto forward_backward = [&] { torch::mse_loss(model->forward(x), y).backward(); };
  auto step = [&](ds::ReplicaContext& ctx) {
    optimizer.zero_grad();
    if (o.overlap) {
      bucketer.prepare(ctx);
      forward_backward();
      bucketer.finish();
    } else {
      forward_backward();
      std::vector<torch::Tensor> grads;
      for (auto& p : model->parameters()) grads.push_back(p.grad());
      grads = ctx.batch_all_reduce(ds::ReduceOp::Mean, std::move(grads));  // in place
    }
    optimizer.step();
  };

  // The parts alone: forward + backward, and one all-reduce of every gradient.
  std::vector<double> compute, reduce;
  for (int k = 0; k < 5; ++k) {
    const auto t0 = std::chrono::steady_clock::now();
    optimizer.zero_grad();
    forward_backward();
    compute.push_back(ms_since(t0));
    strategy.run([&](ds::ReplicaContext& ctx) {
      std::vector<torch::Tensor> grads;
      for (auto& p : model->parameters()) grads.push_back(p.grad());
      strategy.barrier();
      const auto t1 = std::chrono::steady_clock::now();
      grads = ctx.batch_all_reduce(ds::ReduceOp::Mean, std::move(grads));
      reduce.push_back(ms_since(t1));
    });
  }
  for (int k = 0; k < 3; ++k) strategy.run(step);  // warm-up
  strategy.barrier();
  const auto t0 = std::chrono::steady_clock::now();
  for (int k = 0; k < o.steps; ++k) strategy.run(step);
  strategy.barrier();
  const double seconds = ms_since(t0) / 1e3;
  if (strategy.is_chief()) {
    fmt::print("overlap_mlp,{},{},{},{},{},{:.3f},{:.1f},{:.1f},{:.1f}\n", o.overlap ? "overlap" : "sync",
               strategy.num_workers(), params, o.batch, o.steps, o.steps / seconds, 1e3 * seconds / o.steps,
               median(reduce), median(compute));
  }
  return 0;
}

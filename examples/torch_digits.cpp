// The digits MLP written with libtorch (torch::nn, autograd, torch::optim::SGD), trained
// data-parallel: the gradients libtorch's autograd leaves in each parameter's .grad() are
// all-reduced as torch::Tensors, in place, with no copy into std::vector.
//
//   torch_digits [--strategy one_device|mirrored|multi_worker] [--replicas N] [--epochs E] [--batch B]
//                [--hidden H] [--learning-rate LR] [--seed S] [--grad-dtype f64|bf16] [--overlap]
//                [--data PATH] [--out DIR] [--weights-out FILE] [--logdir DIR]
//                [--progress auto|bar|lines|off] [--progress-interval S]
//   distribute-launch -n 2 -- torch_digits --strategy multi_worker
//
// The model computes in float64, so that how a batch is split across replicas changes the
// result only in the last bits: one_device, mirrored and multi_worker end with the same weights.
// --grad-dtype bf16 sends the gradients as bfloat16 (a quarter of the bytes; the library sums them
// in float32 and rounds once). --overlap all-reduces the gradients bucket by bucket while backward
// is still computing the others (adapters/torch_bucketer.hpp), with the same results. Prints a line per epoch and a final line like examples/digits, shows
// the progress inside an epoch and writes TensorBoard scalars with --logdir as digits does;
// --weights-out writes every parameter value, one per line. Exit status: 0 when the final test
// accuracy reaches 0.95, 1 when not, 2 for a usage error, 3 for any other error.
#define DISTRIBUTE_WITH_MULTI_WORKER
#include <torch/torch.h>

#include <distribute/distribute.hpp>
#include <distribute/adapters/torch.hpp>
#include <distribute/adapters/torch_bucketer.hpp>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "common/cli.hpp"
#include "common/digits_mlp.hpp"
#include "common/training_monitor.hpp"
#include "common/training_report.hpp"

#ifndef DISTRIBUTE_EXAMPLES_DATA_DIR
#define DISTRIBUTE_EXAMPLES_DATA_DIR "examples/data"
#endif

namespace ds = distribute;

namespace {

using cli::parse_number;
using cli::UsageError;

constexpr const char* kUsage =
    "usage: torch_digits [--strategy one_device|mirrored|multi_worker] [--replicas N] [--epochs E] [--batch B]\n"
    "                    [--hidden H] [--learning-rate LR] [--seed S] [--grad-dtype f64|bf16] [--overlap]\n"
    "                    [--data PATH] [--out DIR] [--weights-out FILE] [--logdir DIR]\n"
    "                    [--progress auto|bar|lines|off] [--progress-interval S]\n"
    "  --strategy     mirrored (default; --replicas host replicas, default 4), one_device, or multi_worker\n"
    "                 (one process of a cluster, e.g. under `distribute-launch -n 2 --`)\n"
    "  --grad-dtype   the gradients' dtype on the wire: f64 (default, the model's) or bf16\n"
    "  --overlap      all-reduce gradients in buckets while backward runs (same results)\n"
    "  --weights-out  write the final parameters there, one value per line\n"
    REPORT_MONITOR_USAGE;

struct Options {
  std::string strategy = "mirrored";
  int replicas = 0;
  digits::TrainConfig config;
  bool bf16_gradients = false;
  bool overlap = false;
  std::string data = DISTRIBUTE_EXAMPLES_DATA_DIR "/digits.csv";
  std::string out = "digits-out";
  std::string weights_out;
  report::MonitorOptions monitor;
};

Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw UsageError(fmt::format("{} needs a value", flag));
      return argv[++i];
    };
    if (flag == "--strategy") o.strategy = value();
    else if (flag == "--replicas") o.replicas = parse_number<int>(flag, value());
    else if (flag == "--epochs") o.config.epochs = parse_number<int>(flag, value());
    else if (flag == "--batch") o.config.global_batch = parse_number<std::int64_t>(flag, value());
    else if (flag == "--hidden") o.config.hidden = parse_number<int>(flag, value());
    else if (flag == "--learning-rate") o.config.learning_rate = parse_number<float>(flag, value());
    else if (flag == "--seed") o.config.seed = parse_number<std::uint64_t>(flag, value());
    else if (flag == "--grad-dtype") {
      const std::string d = value();
      if (d != "f64" && d != "bf16") throw UsageError(fmt::format("--grad-dtype: '{}' is not f64 or bf16", d));
      o.bf16_gradients = d == "bf16";
    } else if (flag == "--overlap") {
      o.overlap = true;
    } else if (flag == "--data") o.data = value();
    else if (flag == "--out") o.out = value();
    else if (flag == "--weights-out") o.weights_out = value();
    else if (o.monitor.parse(flag, value)) continue;
    else if (flag == "--help" || flag == "-h") throw UsageError("");
    else throw UsageError(fmt::format("unknown argument '{}'", flag));
  }
  if (o.strategy != "one_device" && o.strategy != "mirrored" && o.strategy != "multi_worker") {
    throw UsageError(fmt::format("--strategy: '{}' is not one_device, mirrored or multi_worker", o.strategy));
  }
  if (o.strategy == "one_device" && o.replicas > 1) throw UsageError("--replicas: one_device has one replica");
  if (o.replicas < 0) throw UsageError(fmt::format("--replicas: {} is negative", o.replicas));
  if (o.config.global_batch <= 0 || o.config.epochs <= 0 || o.config.hidden <= 0) {
    throw UsageError("--batch, --epochs and --hidden must be positive");
  }
  return o;
}

struct MlpImpl : torch::nn::Module {
  torch::nn::Linear hidden{nullptr}, output{nullptr};
  explicit MlpImpl(int units)
      : hidden(register_module("hidden", torch::nn::Linear(digits::kPixels, units))),
        output(register_module("output", torch::nn::Linear(units, digits::kClasses))) {}
  torch::Tensor forward(const torch::Tensor& x) { return output(torch::relu(hidden(x))); }
};
TORCH_MODULE(Mlp);

/// Rows `ids` of the data set as a (n, 64) float64 batch and its labels.
std::pair<torch::Tensor, torch::Tensor> batch_of(const digits::Examples& data, const std::vector<std::int64_t>& ids) {
  auto x = torch::empty({static_cast<std::int64_t>(ids.size()), digits::kPixels}, torch::kFloat64);
  auto y = torch::empty({static_cast<std::int64_t>(ids.size())}, torch::kInt64);
  for (std::size_t r = 0; r < ids.size(); ++r) {
    const float* image = data.image(ids[r]);
    for (int c = 0; c < digits::kPixels; ++c) x[static_cast<std::int64_t>(r)][c] = double(image[c]);
    y[static_cast<std::int64_t>(r)] = data.labels[static_cast<std::size_t>(ids[r])];
  }
  return {x, y};
}

template <class Strategy>
int train(Strategy& strategy, const Options& options, const digits::TrainTestSplit& data, bool is_chief,
          const std::string& description, std::shared_ptr<const ds::ClusterResolver> resolver = nullptr) {
  const auto& config = options.config;
  const int local = strategy.num_local_replicas();
  const int replicas = strategy.num_replicas_in_sync();
  // One model and optimizer per local replica, all initialised alike from the seed.
  std::vector<Mlp> models;
  std::vector<std::unique_ptr<torch::optim::SGD>> optimizers;
  for (int r = 0; r < local; ++r) {
    torch::manual_seed(config.seed);
    models.emplace_back(config.hidden);
    models.back()->to(torch::kFloat64);
    optimizers.push_back(std::make_unique<torch::optim::SGD>(
        models.back()->parameters(), torch::optim::SGDOptions(config.learning_rate).momentum(config.momentum)));
  }
  // --overlap: each replica's gradients go out in buckets of 64 KiB while its backward runs.
  std::vector<ds::adapters::torch::GradientBucketer> bucketers;
  if (options.overlap) {
    for (auto& m : models) {
      bucketers.emplace_back(m->parameters(),
                             ds::adapters::torch::BucketerOptions{
                                 .bytes_per_pack = 64 << 10,
                                 .op = ds::ReduceOp::Sum,
                                 .wire = options.bf16_gradients ? std::optional(torch::kBFloat16) : std::nullopt});
    }
  }
  // Every replica starts from replica 0's parameters (of the chief, across workers): a broadcast
  // into each parameter's own memory through its handle.
  strategy.run([&](ds::ReplicaContext& ctx) {
    for (auto& p : models[static_cast<std::size_t>(ctx.local_replica_id())]->parameters()) ctx.broadcast(torch::Tensor(p), 0);
  });

  auto epoch_stats = [&] {
    auto scope = strategy.scope();
    return ds::Variable<std::vector<double>>(std::vector<double>(3, 0.0),
                                             {.name = "epoch_stats", .synchronization = ds::VariableSynchronization::OnRead,
                                              .aggregation = ds::VariableAggregation::Sum});
  }();

  // The batch's loss sum, correct predictions and examples over all replicas, from the step's
  // all-reduce (set by each worker's first replica, read after run()).
  double batch_totals[3] = {0, 0, 0};

  auto step = [&](ds::ReplicaContext& ctx, const ds::Tensor<std::int64_t>& ids) {
    const auto me = static_cast<std::size_t>(ctx.local_replica_id());
    Mlp& model = models[me];
    optimizers[me]->zero_grad();
    double loss_sum = 0, correct = 0;
    const auto n = static_cast<double>(ids.size());
    double* totals_out = ctx.local_replica_id() == 0 ? batch_totals : nullptr;
    if (ids.size() > 0) {  // a replica's share of the last, partial batch may be empty
      auto [x, y] = batch_of(data.train, ids.values());
      auto logits = model->forward(x);
      auto loss = torch::nn::functional::cross_entropy(
          logits, y, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
      if (options.overlap) bucketers[me].prepare(ctx);
      loss.backward();
      loss_sum = loss.item<double>();
      correct = logits.argmax(1).eq(y).sum().item<double>();
    }
    // The batch's mean gradient: every replica's gradient sum, summed, over the examples of the
    // whole batch (exact however unevenly it was split).
    std::vector<torch::Tensor> grads;
    if (options.overlap) {
      if (ids.size() == 0) bucketers[me].prepare(ctx);  // no backward: it sends zeros
      bucketers[me].finish();  // the buckets' sums, already in .grad()
    } else {
      for (auto& p : model->parameters()) {
        if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
        grads.push_back(options.bf16_gradients ? p.grad().to(torch::kBFloat16) : p.grad());
      }
      grads = ctx.batch_all_reduce(ds::ReduceOp::Sum, std::move(grads));  // in place: the .grad() memory itself
    }
    // The example count (and, for the step's figures, the loss and correct counts) in one all-reduce.
    const std::vector<double> totals = ctx.all_reduce(ds::ReduceOp::Sum, std::vector<double>{n, loss_sum, correct});
    const double examples = totals[0];
    if (totals_out) totals_out[0] = totals[1], totals_out[1] = totals[2], totals_out[2] = totals[0];
    std::size_t k = 0;
    for (auto& p : model->parameters()) {
      if (options.bf16_gradients && !options.overlap) p.mutable_grad().copy_(grads[k]);
      p.mutable_grad().div_(examples);
      ++k;
    }
    optimizers[me]->step();
    epoch_stats.assign_add({loss_sum, correct, n});
  };

  auto test_accuracy = [&] {
    const digits::Examples& test = data.test;
    auto counts = strategy.run([&](ds::ReplicaContext& ctx) {
      torch::NoGradGuard no_grad;
      const auto [begin, end] = digits::detail::replica_share(0, test.size(), ctx.replica_id_in_sync_group(), replicas);
      if (begin == end) return 0.0;
      std::vector<std::int64_t> ids;
      for (auto i = begin; i < end; ++i) ids.push_back(i);
      auto [x, y] = batch_of(test, ids);
      return models[static_cast<std::size_t>(ctx.local_replica_id())]->forward(x).argmax(1).eq(y).sum().item<double>();
    });
    return strategy.reduce(ds::ReduceOp::Sum, counts) / static_cast<double>(test.size());
  };

  if (is_chief) {
    fmt::print("torch_digits: {}; {} training / {} test examples, global batch {}, MLP 64-{}-10 (torch::nn, float64), "
               "gradients all-reduced as {}\n",
               description, data.train.size(), data.test.size(), config.global_batch, config.hidden,
               options.bf16_gradients ? "bfloat16" : "float64");
  }
  std::vector<digits::EpochMetrics> history;
  report::TrainingMonitor monitor(options.monitor, is_chief, std::move(resolver));
  const std::int64_t steps = digits::steps_per_epoch(data.train.size(), config.global_batch);
  const auto start = std::chrono::steady_clock::now();
  for (int epoch = 1; epoch <= config.epochs; ++epoch) {
    const auto order =
        digits::detail::shuffled_indices(data.train.size(), config.seed * 1000003u + static_cast<unsigned>(epoch));
    const auto batches = ds::data::from_vector(order).batch(config.global_batch).with_options(
        {.auto_shard_policy = ds::data::AutoShardPolicy::Data});
    monitor.begin_epoch(epoch, config.epochs, steps);
    const auto epoch_start = std::chrono::steady_clock::now();
    std::int64_t step_in_epoch = 0;
    auto step_start = epoch_start;
    for (auto& ids : strategy.distribute_dataset(batches)) {
      strategy.run(step, ids);
      const auto now = std::chrono::steady_clock::now();
      ++step_in_epoch;
      monitor.step({.epoch = epoch, .step = step_in_epoch, .steps_per_epoch = steps,
                    .global_step = (epoch - 1) * steps + step_in_epoch, .loss = batch_totals[0] / batch_totals[2],
                    .accuracy = batch_totals[1] / batch_totals[2], .examples = batch_totals[2],
                    .seconds = std::chrono::duration<double>(now - step_start).count()});
      step_start = now;
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_start).count();
    const std::vector<double> totals = epoch_stats.read_value();
    epoch_stats.assign(std::vector<double>(3, 0.0));
    digits::EpochMetrics m;
    m.epoch = epoch;
    m.loss = totals[0] / totals[2];
    m.train_accuracy = totals[1] / totals[2];
    m.test_accuracy = test_accuracy();
    m.examples_per_second = totals[2] / seconds;
    history.push_back(m);
    monitor.epoch(m);
    if (is_chief) fmt::print("{}\n", report::epoch_line(m, config.epochs));
  }
  monitor.close();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::string tag = "torch-" + options.strategy + (options.bf16_gradients ? "-bf16" : "");
  if (is_chief) {
    report::write_metrics_and_plot(options.out, tag, history, fmt::format("torch digits MLP, {}: training loss", description));
    if (!options.weights_out.empty()) {
      std::ofstream out(options.weights_out);
      for (const auto& p : models[0]->parameters()) {
        const auto flat = p.detach().contiguous().view({-1});
        for (std::int64_t i = 0; i < flat.numel(); ++i) out << fmt::format("{:.17g}\n", flat[i].item<double>());
      }
      if (!out) throw std::runtime_error(fmt::format("cannot write '{}'", options.weights_out));
    }
  }
  fmt::print("{}\n", report::final_line(history.back(), tag, config.epochs, seconds));
  if (history.back().test_accuracy < cli::kTargetAccuracy) {
    fmt::print(stderr, "torch_digits: final test accuracy {:.4f} is below the target {}\n", history.back().test_accuracy,
               cli::kTargetAccuracy);
    return cli::kExitBelowTarget;
  }
  return 0;
}

int run(const Options& options) {
  at::set_num_threads(1);  // the replicas are the parallelism; libtorch's own threads would compete
  const auto data = digits::split_train_test(digits::load_csv(options.data), 0.2, digits::kSplitSeed);
  if (options.strategy == "one_device") {
    ds::OneDeviceStrategy<ds::host> strategy("/cpu:0");
    return train(strategy, options, data, true, "OneDeviceStrategy<host> on /cpu:0");
  }
  if (options.strategy == "mirrored") {
    ds::MirroredStrategy<ds::host> strategy(options.replicas ? options.replicas : 4);
    return train(strategy, options, data, true,
                 fmt::format("MirroredStrategy<host> with {} replicas", strategy.num_replicas_in_sync()));
  }
  ds::CommunicationOptions communication;
  communication.timeout_seconds = 120;
  ds::MultiWorkerMirroredStrategy<ds::host> strategy(communication, nullptr, options.replicas ? options.replicas : 1);
  return train(strategy, options, data, strategy.is_chief(),
               fmt::format("MultiWorkerMirroredStrategy<host>, {} workers, {} replicas in sync", strategy.num_workers(),
                           strategy.num_replicas_in_sync()),
               std::shared_ptr<const ds::ClusterResolver>(std::shared_ptr<const void>(), strategy.cluster_resolver()));
}

}  // namespace

int main(int argc, char** argv) {
  return cli::run_main("torch_digits", kUsage, [&] { return run(parse_args(argc, argv)); });
}

// A logistic-regression model trained with any synchronous strategy: the demo, and the test
// that a 4-replica run ends with the same weights as a one-device run.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <utility>
#include <vector>

#include <distribute/distribute.hpp>

namespace demo {

namespace ds = distribute;

/// Linearly separable-ish data: y = 1 when x·w_true + b_true + noise > 0.
struct Data {
  ds::Tensor<float> features;  // (n, d)
  std::vector<float> labels;   // n
  std::int64_t size() const { return features.shape()[0]; }
  std::int64_t dims() const { return features.shape()[1]; }
};

inline Data make_data(std::int64_t n, std::int64_t d, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w_true(static_cast<std::size_t>(d));
  for (auto& w : w_true) w = normal(rng);
  std::vector<float> x(static_cast<std::size_t>(n * d));
  std::vector<float> y(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    float logit = 0.3f;
    for (std::int64_t j = 0; j < d; ++j) {
      float v = normal(rng);
      x[static_cast<std::size_t>(i * d + j)] = v;
      logit += v * w_true[static_cast<std::size_t>(j)];
    }
    y[static_cast<std::size_t>(i)] = logit + 0.5f * normal(rng) > 0 ? 1.0f : 0.0f;
  }
  return {ds::Tensor<float>({n, d}, std::move(x)), std::move(y)};
}

struct TrainConfig {
  int epochs = 5;
  std::int64_t global_batch = 64;
  float learning_rate = 0.5f;
};

struct EpochReport {
  int epoch;
  double loss;
  double examples_per_second;
};

/// Trains weights (d) and bias (1), packed in one vector, with minibatch gradient descent.
/// The input is a tf.data-style pipeline: (features row, label) slices of `data`, batched into
/// global batches of config.global_batch (the last one partial). strategy.distribute_dataset cuts
/// each global batch into the replicas' pieces (TF's rebatching) and, across workers, shards it
/// with AutoShardPolicy::Data (every worker reads everything and keeps its own replicas' pieces),
/// so a step sees the same global batch however many replicas and workers there are. The
/// gradient sums and the example count are all-reduced in one call, and every replica applies
/// the same update to its mirrored copy. Returns the final weights.
template <class Strategy>
std::vector<float> train(Strategy& strategy, const Data& data, const TrainConfig& config,
                         const std::function<void(const EpochReport&)>& on_epoch = {}) {
  const std::int64_t n = data.size(), d = data.dims();
  const auto params = static_cast<std::size_t>(d + 1);
  auto weights = [&] {
    auto scope = strategy.scope();
    return ds::Variable<std::vector<float>>(std::vector<float>(params, 0.0f), {.name = "weights"});
  }();

  // Elements (features row (d), label); batches (features (b, d), labels (b)).
  const auto batches = ds::data::from_tensor_slices(std::make_pair(data.features, data.labels))
                           .batch(config.global_batch)
                           .with_options({.auto_shard_policy = ds::data::AutoShardPolicy::Data});
  using Batch = std::pair<ds::Tensor<float>, ds::Tensor<float>>;

  // One step on one replica: `batch` is its piece of the global batch (empty when the last,
  // partial batch has fewer rows than there are replicas).
  auto step = [&](ds::ReplicaContext& ctx, const Batch& batch) {
    const ds::Tensor<float>& features = batch.first;
    const ds::Tensor<float>& labels = batch.second;
    const std::int64_t rows = labels.shape().empty() ? 0 : labels.shape()[0];
    const std::vector<float> w = weights.read_value();  // this replica's copy (or the central one)
    std::vector<double> grad(params, 0.0);
    std::vector<float> losses;
    losses.reserve(static_cast<std::size_t>(rows));
    for (std::int64_t i = 0; i < rows; ++i) {
      const float* x = features.data() + i * d;
      double logit = w[static_cast<std::size_t>(d)];
      for (std::int64_t j = 0; j < d; ++j) logit += double(w[static_cast<std::size_t>(j)]) * x[j];
      const double p = 1.0 / (1.0 + std::exp(-logit));
      const double y = labels.data()[i];
      losses.push_back(static_cast<float>(-(y * std::log(p + 1e-12) + (1 - y) * std::log(1 - p + 1e-12))));
      for (std::int64_t j = 0; j < d; ++j) grad[static_cast<std::size_t>(j)] += (p - y) * x[j];
      grad[static_cast<std::size_t>(d)] += p - y;
    }
    // Sum of the gradients over the global batch and the batch's size, identical on every
    // replica: one packed all-reduce.
    auto [grad_sum, count] =
        ctx.all_reduce(ds::ReduceOp::Sum, std::move(grad), std::vector<double>{static_cast<double>(rows)});
    std::vector<float> update(params);
    for (std::size_t k = 0; k < params; ++k) {
      update[k] = static_cast<float>(config.learning_rate * grad_sum[k] / count[0]);
    }
    weights.assign_sub(update);  // aggregation NONE: the local copy, kept identical by the all-reduce
    return losses;
  };

  for (int epoch = 1; epoch <= config.epochs; ++epoch) {
    const auto start_time = std::chrono::steady_clock::now();
    double loss_sum = 0;
    for (const auto& batch : strategy.distribute_dataset(batches)) {
      auto per_example_loss = strategy.run(step, batch);
      loss_sum += strategy.reduce(ds::ReduceOp::Sum, per_example_loss, 0)[0];
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time).count();
    if (on_epoch) on_epoch({epoch, loss_sum / static_cast<double>(n), static_cast<double>(n) / seconds});
  }
  return weights.values().front();
}

/// Fraction of examples classified correctly.
inline double accuracy(const Data& data, const std::vector<float>& w) {
  const std::int64_t d = data.dims();
  std::int64_t correct = 0;
  for (std::int64_t i = 0; i < data.size(); ++i) {
    double logit = w[static_cast<std::size_t>(d)];
    for (std::int64_t j = 0; j < d; ++j) logit += double(w[static_cast<std::size_t>(j)]) * data.features.data()[i * d + j];
    correct += (logit > 0) == (data.labels[static_cast<std::size_t>(i)] > 0.5f);
  }
  return static_cast<double>(correct) / static_cast<double>(data.size());
}

}  // namespace demo

// A logistic-regression model trained with any synchronous strategy: the demo, and the test
// that a 4-replica run ends with the same weights as a one-device run.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
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
/// Each replica takes its slice of the global batch, the gradient sums are all-reduced, and
/// every replica applies the same update to its mirrored copy. Returns the final weights.
template <class Strategy>
std::vector<float> train(Strategy& strategy, const Data& data, const TrainConfig& config,
                         const std::function<void(const EpochReport&)>& on_epoch = {}) {
  const std::int64_t n = data.size(), d = data.dims();
  const auto params = static_cast<std::size_t>(d + 1);
  auto weights = [&] {
    auto scope = strategy.scope();
    return ds::Variable<std::vector<float>>(std::vector<float>(params, 0.0f), {.name = "weights"});
  }();
  const int replicas = strategy.num_replicas_in_sync();

  for (int epoch = 1; epoch <= config.epochs; ++epoch) {
    const auto start_time = std::chrono::steady_clock::now();
    double loss_sum = 0;
    for (std::int64_t start = 0; start < n; start += config.global_batch) {
      const std::int64_t batch = std::min(config.global_batch, n - start);  // the last batch may be partial
      auto per_example_loss = strategy.run([&](ds::ReplicaContext& ctx) {
        const std::int64_t r = ctx.replica_id_in_sync_group();
        const std::int64_t begin = start + batch * r / replicas, end = start + batch * (r + 1) / replicas;
        const std::vector<float> w = weights.read_value();  // this replica's copy (or the central one)
        std::vector<double> grad(params, 0.0);
        std::vector<float> losses;
        losses.reserve(static_cast<std::size_t>(end - begin));
        for (std::int64_t i = begin; i < end; ++i) {
          const float* x = data.features.data() + i * d;
          double logit = w[static_cast<std::size_t>(d)];
          for (std::int64_t j = 0; j < d; ++j) logit += double(w[static_cast<std::size_t>(j)]) * x[j];
          const double p = 1.0 / (1.0 + std::exp(-logit));
          const double y = data.labels[static_cast<std::size_t>(i)];
          losses.push_back(static_cast<float>(-(y * std::log(p + 1e-12) + (1 - y) * std::log(1 - p + 1e-12))));
          for (std::int64_t j = 0; j < d; ++j) grad[static_cast<std::size_t>(j)] += (p - y) * x[j];
          grad[static_cast<std::size_t>(d)] += p - y;
        }
        // Sum of the gradients over the global batch, identical on every replica.
        grad = ctx.all_reduce(ds::ReduceOp::Sum, std::move(grad));
        std::vector<float> step(params);
        for (std::size_t k = 0; k < params; ++k) {
          step[k] = static_cast<float>(config.learning_rate * grad[k] / static_cast<double>(batch));
        }
        weights.assign_sub(step);  // aggregation NONE: the local copy, kept identical by the all-reduce
        return losses;
      });
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

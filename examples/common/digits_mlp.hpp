// An MLP classifier for the UCI optical handwritten digits (8x8 images, 10 classes), trained with
// any synchronous strategy: OneDeviceStrategy, MirroredStrategy, MultiWorkerMirroredStrategy.
//
// The data: examples/data/digits.csv (see examples/data/README.md), 1,797 rows of 64 pixel values
// 0..16 and a label 0..9. The model: 64 -> hidden (ReLU) -> 10 (softmax), cross-entropy loss,
// SGD with momentum. Each global batch is split across all replicas in sync (of every worker);
// the gradients are all-reduced in one packed collective and every replica applies the same update.
#pragma once

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <distribute/distribute.hpp>

namespace digits {

namespace ds = distribute;

inline constexpr int kPixels = 64;    // 8x8 images
inline constexpr int kClasses = 10;   // digits 0..9
inline constexpr int kMaxPixel = 16;  // each pixel counts the "on" pixels of a 4x4 block

// ---------------------------------------------------------------------------------------------
// Data

/// A missing, unreadable or malformed data file.
struct DataError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Examples {
  std::vector<float> pixels;  // size() x kPixels, scaled to [0, 1]
  std::vector<int> labels;    // 0..9
  std::int64_t size() const { return static_cast<std::int64_t>(labels.size()); }
  const float* image(std::int64_t i) const { return pixels.data() + i * kPixels; }
};

namespace detail {

/// Parses one CSV row "p0,...,p63,label" into `out`; throws DataError naming path:line.
inline void parse_row(std::string_view line, const std::string& path, std::int64_t line_number, Examples& out) {
  auto fail = [&](const std::string& what) {
    throw DataError(fmt::format("{}:{}: {} (expected {} comma-separated integers: {} pixels 0..{} and a label 0..{})",
                                path, line_number, what, kPixels + 1, kPixels, kMaxPixel, kClasses - 1));
  };
  int column = 0;
  std::size_t pos = 0;
  while (true) {
    const std::size_t comma = std::min(line.find(',', pos), line.size());
    const std::string_view field = line.substr(pos, comma - pos);
    if (column > kPixels) fail(fmt::format("more than {} fields", kPixels + 1));
    int value = 0;
    const auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), value);
    if (field.empty() || ec != std::errc{} || end != field.data() + field.size()) {
      fail(fmt::format("field {} is '{}', not an integer", column + 1, field));
    }
    const bool is_label = column == kPixels;
    const int max_value = is_label ? kClasses - 1 : kMaxPixel;
    if (value < 0 || value > max_value) {
      fail(fmt::format("field {} ({}) is {}, outside 0..{}", column + 1,
                       is_label ? std::string("the label") : fmt::format("pixel {}", column), value, max_value));
    }
    if (is_label) {
      out.labels.push_back(value);
    } else {
      out.pixels.push_back(static_cast<float>(value) / kMaxPixel);
    }
    ++column;
    if (comma == line.size()) break;
    pos = comma + 1;
  }
  if (column != kPixels + 1) fail(fmt::format("only {} fields", column));
}

/// Uniform in [0, 1) from a 64-bit engine. Hand-written (like shuffle below) because the standard
/// library's distributions differ between implementations: the same seed gives the same model
/// with libstdc++ and libc++, so the documented accuracies reproduce.
inline double uniform01(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

/// Fisher-Yates shuffle of 0..n-1 (the modulo bias for n << 2^64 is negligible).
inline std::vector<std::int64_t> shuffled_indices(std::int64_t n, std::uint64_t seed) {
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) order[static_cast<std::size_t>(i)] = i;
  std::mt19937_64 rng(seed);
  for (std::int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(i + 1));
    std::swap(order[static_cast<std::size_t>(i)], order[static_cast<std::size_t>(j)]);
  }
  return order;
}

}  // namespace detail

/// Reads the digits CSV (no header; 64 pixels then the label per row; blank lines are skipped).
inline Examples load_csv(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    throw DataError(fmt::format("the digits data file '{}' is a directory (pass the CSV file's path with --data)", path));
  }
  std::ifstream in(path);
  if (!in) {
    throw DataError(fmt::format("cannot open the digits data file '{}': {} (pass its path with --data)", path,
                                std::strerror(errno)));
  }
  Examples out;
  std::string line;
  std::int64_t line_number = 0;
  while (std::getline(in, line)) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();  // CRLF files
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    detail::parse_row(line, path, line_number, out);
  }
  if (in.bad()) throw DataError(fmt::format("{}: read error after line {}", path, line_number));
  if (out.size() == 0) throw DataError(fmt::format("{}: no examples in the file", path));
  return out;
}

struct TrainTestSplit {
  Examples train, test;
};

/// A seeded shuffle of the rows, then the first (1 - test_fraction) for training, the rest for testing.
/// The seed of the examples' train/test split: every example trains and tests on the same rows.
inline constexpr std::uint64_t kSplitSeed = 20240607;

inline TrainTestSplit split_train_test(const Examples& all, double test_fraction, std::uint64_t seed) {
  const auto order = detail::shuffled_indices(all.size(), seed);
  const auto test_size = static_cast<std::int64_t>(std::llround(static_cast<double>(all.size()) * test_fraction));
  TrainTestSplit split;
  for (std::int64_t k = 0; k < all.size(); ++k) {
    const std::int64_t i = order[static_cast<std::size_t>(k)];
    Examples& dst = k < all.size() - test_size ? split.train : split.test;
    dst.pixels.insert(dst.pixels.end(), all.image(i), all.image(i) + kPixels);
    dst.labels.push_back(all.labels[static_cast<std::size_t>(i)]);
  }
  return split;
}

// ---------------------------------------------------------------------------------------------
// Model

struct TrainConfig {
  int epochs = 12;
  std::int64_t global_batch = 32;
  int hidden = 64;
  float learning_rate = 0.05f;
  float momentum = 0.9f;
  std::uint64_t seed = 1;  // weight initialisation and the per-epoch shuffles
};

/// Host values of the parameters: w1 (64 x hidden), b1 (hidden), w2 (hidden x 10), b2 (10).
struct Parameters {
  ds::Tensor<float> w1, b1, w2, b2;
  int hidden() const { return static_cast<int>(b1.size()); }
};

/// He-uniform weights for the ReLU layer, Glorot-uniform for the output layer, zero biases.
inline Parameters initial_parameters(int hidden, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto uniform_matrix = [&](std::int64_t rows, std::int64_t cols, double limit) {
    std::vector<float> v(static_cast<std::size_t>(rows * cols));
    for (auto& x : v) x = static_cast<float>((2 * detail::uniform01(rng) - 1) * limit);
    return ds::Tensor<float>({rows, cols}, std::move(v));
  };
  return {uniform_matrix(kPixels, hidden, std::sqrt(6.0 / kPixels)), ds::Tensor<float>::zeros({hidden}),
          uniform_matrix(hidden, kClasses, std::sqrt(6.0 / (hidden + kClasses))), ds::Tensor<float>::zeros({kClasses})};
}

/// Gradient sums in double, so that how a batch is split across replicas changes only rounding.
struct Gradients {
  std::vector<double> w1, b1, w2, b2;
  explicit Gradients(int hidden)
      : w1(static_cast<std::size_t>(kPixels * hidden)), b1(static_cast<std::size_t>(hidden)),
        w2(static_cast<std::size_t>(hidden * kClasses)), b2(kClasses) {}
};

/// Forward pass for one image: hidden activations and class probabilities (and, for the
/// backward pass, the gradient at the hidden layer). Reused from example to example.
struct Activations {
  std::vector<double> hidden;
  double probabilities[kClasses];
  std::vector<double> dhidden;
};

inline void forward(const Parameters& p, const float* x, Activations& a) {
  const int h = p.hidden();
  a.hidden.assign(p.b1.begin(), p.b1.end());
  for (int i = 0; i < kPixels; ++i) {
    if (x[i] == 0.0f) continue;  // about half the pixels are 0
    const float* row = p.w1.data() + i * h;
    for (int j = 0; j < h; ++j) a.hidden[static_cast<std::size_t>(j)] += double(x[i]) * row[j];
  }
  for (auto& v : a.hidden) v = std::max(v, 0.0);
  double logits[kClasses];
  for (int k = 0; k < kClasses; ++k) logits[k] = p.b2[static_cast<std::size_t>(k)];
  for (int j = 0; j < h; ++j) {
    const double hj = a.hidden[static_cast<std::size_t>(j)];
    if (hj == 0.0) continue;
    for (int k = 0; k < kClasses; ++k) logits[k] += hj * p.w2[static_cast<std::size_t>(j * kClasses + k)];
  }
  const double top = *std::max_element(logits, logits + kClasses);  // subtracted for a stable softmax
  double total = 0;
  for (int k = 0; k < kClasses; ++k) total += a.probabilities[k] = std::exp(logits[k] - top);
  for (double& q : a.probabilities) q /= total;
}

inline int predicted_class(const Activations& a) {
  return static_cast<int>(std::max_element(a.probabilities, a.probabilities + kClasses) - a.probabilities);
}

/// Loss and correct predictions of some examples (a replica's share of a batch).
struct BatchStats {
  double loss_sum = 0;
  double correct = 0;
  double count = 0;
};

/// Forward and backward pass for one example: adds its gradient to `g` and its loss to `stats`.
inline void accumulate_example(const Parameters& p, const float* x, int label, Activations& a, Gradients& g,
                               BatchStats& stats) {
  forward(p, x, a);
  const int h = p.hidden();
  stats.loss_sum -= std::log(std::max(a.probabilities[label], 1e-300));
  stats.correct += predicted_class(a) == label;
  stats.count += 1;
  // d loss / d logits = softmax - one_hot(label)
  double dlogits[kClasses];
  for (int k = 0; k < kClasses; ++k) dlogits[k] = a.probabilities[k] - (k == label);
  for (int k = 0; k < kClasses; ++k) g.b2[static_cast<std::size_t>(k)] += dlogits[k];
  a.dhidden.assign(static_cast<std::size_t>(h), 0.0);
  for (int j = 0; j < h; ++j) {
    const double hj = a.hidden[static_cast<std::size_t>(j)];
    if (hj == 0.0) continue;  // ReLU: no gradient through an inactive unit
    double dhidden = 0;
    for (int k = 0; k < kClasses; ++k) {
      const auto jk = static_cast<std::size_t>(j * kClasses + k);
      g.w2[jk] += hj * dlogits[k];
      dhidden += p.w2[jk] * dlogits[k];
    }
    a.dhidden[static_cast<std::size_t>(j)] = dhidden;
    g.b1[static_cast<std::size_t>(j)] += dhidden;
  }
  // w1 row by row (contiguous): the outer product of the input and the hidden-layer gradient.
  for (int i = 0; i < kPixels; ++i) {
    if (x[i] == 0.0f) continue;
    double* row = g.w1.data() + i * h;
    for (int j = 0; j < h; ++j) row[j] += double(x[i]) * a.dhidden[static_cast<std::size_t>(j)];
  }
}

/// Accuracy of `p` on examples [begin, end) of `data`: the count of correct predictions.
inline std::int64_t count_correct(const Parameters& p, const Examples& data, std::int64_t begin, std::int64_t end) {
  Activations a;
  std::int64_t correct = 0;
  for (std::int64_t i = begin; i < end; ++i) {
    forward(p, data.image(i), a);
    correct += predicted_class(a) == data.labels[static_cast<std::size_t>(i)];
  }
  return correct;
}

// ---------------------------------------------------------------------------------------------
// Training

struct EpochMetrics {
  int epoch = 0;
  double loss = 0;            // mean cross-entropy over the epoch's training examples
  double train_accuracy = 0;  // over the same examples, as they were seen during the epoch
  double test_accuracy = 0;   // after the epoch
  double examples_per_second = 0;  // training examples of all replicas / the epoch's training time
};

/// One training step (one global batch), as every worker sees it after the step's all-reduce.
struct StepMetrics {
  int epoch = 0;
  std::int64_t step = 0;             // 1-based within the epoch
  std::int64_t steps_per_epoch = 0;
  std::int64_t global_step = 0;      // steps done since training began (TF's optimizer.iterations)
  double loss = 0;                   // the batch's mean cross-entropy
  double accuracy = 0;               // the batch's training accuracy
  double examples = 0;               // the batch's examples, over all replicas
  double seconds = 0;                // the step's time
};

/// Steps in one epoch: global batches of `global_batch`, the last one partial.
inline std::int64_t steps_per_epoch(std::int64_t examples, std::int64_t global_batch) {
  return (examples + global_batch - 1) / global_batch;
}

struct TrainResult {
  std::vector<EpochMetrics> history;
  Parameters parameters;  // the final values (replica 0's copy; every copy is the same)
};

namespace detail {

using TensorVariable = ds::Variable<ds::Tensor<float>>;

/// The model's variables: parameters and their momentum slots, mirrored on every replica.
struct ModelVariables {
  TensorVariable w1, b1, w2, b2;
  TensorVariable v_w1, v_b1, v_w2, v_b2;  // momentum ("velocity") slots, like an optimizer's slot variables

  /// Created in the strategy's scope: the strategy places them (with MultiWorkerMirroredStrategy
  /// every worker starts from the chief's values).
  explicit ModelVariables(const Parameters& init)
      : w1(init.w1, {.name = "dense_1/kernel"}), b1(init.b1, {.name = "dense_1/bias"}),
        w2(init.w2, {.name = "dense_2/kernel"}), b2(init.b2, {.name = "dense_2/bias"}),
        v_w1(slot(init.w1), {.name = "dense_1/kernel/momentum", .trainable = false}),
        v_b1(slot(init.b1), {.name = "dense_1/bias/momentum", .trainable = false}),
        v_w2(slot(init.w2), {.name = "dense_2/kernel/momentum", .trainable = false}),
        v_b2(slot(init.b2), {.name = "dense_2/bias/momentum", .trainable = false}) {}

  /// This replica's copy (in replica context), else the primary copy.
  Parameters read() const { return {w1.read_value(), b1.read_value(), w2.read_value(), b2.read_value()}; }

 private:
  static ds::Tensor<float> slot(const ds::Tensor<float>& like) { return ds::Tensor<float>::zeros(like.shape()); }
};

/// velocity = momentum * velocity + gradient; weights -= learning_rate * velocity. Variables
/// with aggregation NONE: this changes this replica's copy, and every replica computes the same.
inline void momentum_update(TensorVariable& weights, TensorVariable& velocity, const std::vector<double>& gradient,
                            const TrainConfig& config) {
  ds::Tensor<float> v = velocity.read_value();
  ds::Tensor<float> step = ds::Tensor<float>::zeros(v.shape());
  for (std::size_t k = 0; k < v.size(); ++k) {
    v[k] = static_cast<float>(config.momentum * double(v[k]) + gradient[k]);
    step[k] = config.learning_rate * v[k];
  }
  velocity.assign(v);
  weights.assign_sub(step);
}

/// [begin, end) of replica `replica`'s share of the `size` examples starting at `start`. Shares
/// differ by at most one example; with fewer examples than replicas some get none.
inline std::pair<std::int64_t, std::int64_t> replica_share(std::int64_t start, std::int64_t size, int replica,
                                                           int replicas) {
  return {start + size * replica / replicas, start + size * (replica + 1) / replicas};
}

}  // namespace detail

/// Trains the MLP with `strategy` and returns the per-epoch metrics and the final parameters.
/// Every worker of a multi-worker strategy calls this with the same data and config (and so the
/// same batch order); `replica_id_in_sync_group` is global, so a worker's replicas take that
/// worker's part of each global batch. `on_epoch` is called after every epoch on every worker;
/// `on_epoch_begin` (epoch, steps in it) before it and `on_step` after each of its steps.
template <class Strategy>
TrainResult train(Strategy& strategy, const TrainTestSplit& data, const TrainConfig& config,
                  const std::function<void(const EpochMetrics&)>& on_epoch = {},
                  const std::function<void(const StepMetrics&)>& on_step = {},
                  const std::function<void(int, std::int64_t)>& on_epoch_begin = {}) {
  if (config.global_batch <= 0) throw ds::InvalidArgument(fmt::format("global batch {} must be positive", config.global_batch));
  if (config.epochs <= 0) throw ds::InvalidArgument(fmt::format("epochs {} must be positive", config.epochs));
  if (config.hidden <= 0) throw ds::InvalidArgument(fmt::format("hidden units {} must be positive", config.hidden));
  const Examples& train_set = data.train;
  const int replicas = strategy.num_replicas_in_sync();

  struct Variables {
    detail::ModelVariables model;
    ds::Variable<std::vector<double>> epoch_stats;
  };
  Variables variables = [&] {
    auto scope = strategy.scope();
    // epoch_stats: per-replica running sums of loss, correct predictions and examples. Sync-on-read,
    // so each replica adds to its own copy and a read outside run() sums every replica of every worker.
    return Variables{detail::ModelVariables(initial_parameters(config.hidden, config.seed)),
                     ds::Variable<std::vector<double>>(std::vector<double>(3, 0.0),
                                                       {.name = "epoch_stats",
                                                        .synchronization = ds::VariableSynchronization::OnRead,
                                                        .aggregation = ds::VariableAggregation::Sum})};
  }();
  detail::ModelVariables& model = variables.model;
  ds::Variable<std::vector<double>>& epoch_stats = variables.epoch_stats;

  // The batch's loss sum, correct predictions and examples over all replicas, from the step's
  // all-reduce (set by each worker's first replica, read after run()).
  double batch_totals[3] = {0, 0, 0};

  // One training step on one replica: `ids` are its piece of the global batch (distribute_dataset
  // cut it with TF's rebatching rule; the piece may be empty in the last, partial batch).
  auto step = [&](ds::ReplicaContext& ctx, const ds::Tensor<std::int64_t>& ids) {
    const Parameters p = model.read();
    Gradients g(config.hidden);
    BatchStats stats;
    Activations a;
    for (const std::int64_t i : ids.values()) {
      accumulate_example(p, train_set.image(i), train_set.labels[static_cast<std::size_t>(i)], a, g, stats);
    }
    // The batch's mean gradient is (sum of every replica's gradient sum) / (examples in the batch),
    // exact however unevenly the batch was split: all four gradient sums and the example count go
    // through one packed SUM all-reduce (with the loss and correct counts, for the step's figures).
    auto [g_w1, g_b1, g_w2, g_b2, count] =
        ctx.all_reduce(ds::ReduceOp::Sum, std::move(g.w1), std::move(g.b1), std::move(g.w2), std::move(g.b2),
                       std::vector<double>{static_cast<double>(ids.size()), stats.loss_sum, stats.correct});
    if (ctx.local_replica_id() == 0) batch_totals[0] = count[1], batch_totals[1] = count[2], batch_totals[2] = count[0];
    const double inverse_count = 1.0 / count[0];
    for (auto* part : {&g_w1, &g_b1, &g_w2, &g_b2}) {
      for (double& x : *part) x *= inverse_count;
    }
    detail::momentum_update(model.w1, model.v_w1, g_w1, config);
    detail::momentum_update(model.b1, model.v_b1, g_b1, config);
    detail::momentum_update(model.w2, model.v_w2, g_w2, config);
    detail::momentum_update(model.b2, model.v_b2, g_b2, config);
    epoch_stats.assign_add({stats.loss_sum, stats.correct, stats.count});
  };

  // Test accuracy: each replica counts its share of the test set, the counts are summed.
  auto test_accuracy = [&] {
    const Examples& test = data.test;
    auto correct = strategy.run([&](ds::ReplicaContext& ctx) {
      const auto [begin, end] = detail::replica_share(0, test.size(), ctx.replica_id_in_sync_group(), replicas);
      return count_correct(model.read(), test, begin, end);
    });
    return static_cast<double>(strategy.reduce(ds::ReduceOp::Sum, correct)) / static_cast<double>(test.size());
  };

  TrainResult result;
  for (int epoch = 1; epoch <= config.epochs; ++epoch) {
    // The same order on every replica and worker: it depends only on the seed and the epoch.
    const auto order = detail::shuffled_indices(train_set.size(), config.seed * 1000003u + static_cast<unsigned>(epoch));
    // Global batches of example ids, the last one partial. Data sharding: every worker reads the
    // (in-memory) ids and keeps its own replicas' pieces of each global batch, so a run on W
    // workers trains exactly like one worker with all the replicas.
    const auto batches = ds::data::from_vector(order)
                             .batch(config.global_batch)
                             .with_options({.auto_shard_policy = ds::data::AutoShardPolicy::Data});
    const std::int64_t steps = steps_per_epoch(train_set.size(), config.global_batch);
    if (on_epoch_begin) on_epoch_begin(epoch, steps);
    const auto start_time = std::chrono::steady_clock::now();
    std::int64_t step_in_epoch = 0;
    auto step_start = start_time;
    for (auto& ids : strategy.distribute_dataset(batches)) {
      strategy.run(step, ids);
      ++step_in_epoch;
      if (on_step) {
        const auto now = std::chrono::steady_clock::now();
        on_step({.epoch = epoch, .step = step_in_epoch, .steps_per_epoch = steps,
                 .global_step = (epoch - 1) * steps + step_in_epoch, .loss = batch_totals[0] / batch_totals[2],
                 .accuracy = batch_totals[1] / batch_totals[2], .examples = batch_totals[2],
                 .seconds = std::chrono::duration<double>(now - step_start).count()});
        step_start = now;
      }
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time).count();
    const std::vector<double> totals = epoch_stats.read_value();  // loss sum, correct, count over all replicas
    epoch_stats.assign(std::vector<double>(3, 0.0));
    EpochMetrics m;
    m.epoch = epoch;
    m.loss = totals[0] / totals[2];
    m.train_accuracy = totals[1] / totals[2];
    m.test_accuracy = test_accuracy();
    m.examples_per_second = totals[2] / seconds;
    result.history.push_back(m);
    if (on_epoch) on_epoch(m);
  }
  result.parameters = model.read();
  return result;
}

}  // namespace digits

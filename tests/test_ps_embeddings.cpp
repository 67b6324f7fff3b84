// Embedding tables on a parameter-server cluster of real processes on 127.0.0.1 (ps and worker tasks
// are ps_helper processes, this test is the chief): row updates applied by the ps tasks, no lost or
// doubled update under concurrent workers and a killed one, optimizer steps equal to a dense
// reference, slots checkpointed with their table, bad input refused by name, and only the touched
// rows on the wire.
#define DISTRIBUTE_WITH_CHECKPOINT
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "ps_functions.hpp"
#include "support/processes.hpp"
#include "support/ps_cluster.hpp"

using namespace std::chrono_literals;
using test_support::Cluster;
using test_support::metric_sum;
using test_support::quiet_options;
using test_support::wait_until;
using Table = ds::ShardedVariable<ds::Tensor<float>>;

namespace {

/// Bitwise equality of two float tensors (a NaN equals the same NaN), with the first difference in
/// the message.
void check_bitwise(const ds::Tensor<float>& got, const ds::Tensor<float>& want, const std::string& what) {
  REQUIRE(got.shape() == want.shape());
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) {
      FAIL_CHECK(what << ": element " << i << " is " << got[i] << ", the reference " << want[i]);
      return;
    }
  }
}

/// Random rows of a table of `rows` rows: `n` indices drawn from a few, so that some repeat.
std::vector<std::int64_t> random_ids(std::mt19937& rng, std::size_t n, std::int64_t rows) {
  std::uniform_int_distribution<std::int64_t> pick(0, rows - 1);
  std::vector<std::int64_t> pool(n / 2 + 1);
  for (auto& p : pool) p = pick(rng);
  std::uniform_int_distribution<std::size_t> which(0, pool.size() - 1);
  std::vector<std::int64_t> ids(n);
  for (auto& id : ids) id = pool[which(rng)];
  return ids;
}

ds::Tensor<float> random_rows(std::mt19937& rng, std::size_t n, std::int64_t width) {
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> v(n * static_cast<std::size_t>(width));
  for (auto& x : v) x = g(rng);
  return ds::Tensor<float>({static_cast<std::int64_t>(n), width}, std::move(v));
}

/// A dense value that holds, at row ids[i], the sum of the gradient rows given for it, added in
/// order from zero: what a gradient of the lookup of `ids` is as a dense tensor.
ds::Tensor<float> dense_gradient(const std::vector<std::int64_t>& ids, const ds::Tensor<float>& rows, const ds::Shape& shape) {
  ds::Tensor<float> d = ds::Tensor<float>::zeros(shape);
  const std::int64_t width = shape[1];
  for (std::size_t i = 0; i < ids.size(); ++i) {
    for (std::int64_t c = 0; c < width; ++c) d.at(ids[i], c) = d.at(ids[i], c) + rows.at(i, c);
  }
  return d;
}

}  // namespace

TEST_SUITE("ps_cluster") {

TEST_CASE("3 workers scatter_add integer rows into overlapping rows of a sharded table, one SIGKILLed and restarted: "
          "the exact sum") {
  Cluster cluster(2, 3);
  ds::ParameterServerStrategy strategy(cluster.resolver());
  ds::ClusterCoordinator coordinator(strategy, quiet_options());
  auto scope = strategy.scope();
  constexpr std::int64_t kRows = 37, kWidth = 4, kClosures = 600;
  ds::ShardedVariable<ds::Tensor<std::int64_t>> table(ds::Tensor<std::int64_t>::zeros({kRows, kWidth}), 2, {.name = "counts"});
  CHECK(table.devices() == std::vector<std::string>{"/job:ps/replica:0/task:0/device:CPU:0", "/job:ps/replica:0/task:1/device:CPU:0"});
  for (std::int64_t k = 0; k < kClosures; ++k) coordinator.schedule(&ps_test::scatter_closure, table, k, 2);
  auto completed = [&] {
    auto v = coordinator.closures_completed_per_worker();
    return std::accumulate(v.begin(), v.end(), std::uint64_t{0});
  };
  REQUIRE(wait_until([&] { return completed() >= kClosures / 3; }, 60s));
  Cluster::kill_task(cluster.workers[1]);
  REQUIRE(wait_until([&] { return coordinator.num_workers_up() == 2; }, 10s));
  cluster.workers[1] = cluster.start("worker", 1);
  coordinator.join();
  // The sum the closures add, computed here row by row.
  std::vector<std::int64_t> want(static_cast<std::size_t>(kRows * kWidth), 0);
  for (std::int64_t k = 0; k < kClosures; ++k) {
    const auto ids = ps_test::rows_of_closure(k, kRows);
    for (std::size_t j = 0; j < ids.size(); ++j) {
      for (std::int64_t c = 0; c < kWidth; ++c) {
        want[static_cast<std::size_t>(ids[j] * kWidth + c)] += ps_test::value_of_closure(k, static_cast<std::int64_t>(j), c);
      }
    }
  }
  CHECK(table.to_tensor().values() == want);
  // The ps tasks applied each closure's 8 rows once, whatever was retried.
  CHECK(metric_sum({cluster.ports[0], cluster.ports[1]}, "distribute_rows_updated_total") == 8.0 * kClosures);
}

TEST_CASE("scatter_* and sparse_read on ps tasks, duplicates included, equal the same operations done here in memory") {
  Cluster cluster(2, 1);
  ds::ParameterServerStrategy strategy(cluster.resolver());
  ds::ClusterCoordinator coordinator(strategy, quiet_options());
  auto scope = strategy.scope();
  constexpr std::int64_t kRows = 23, kWidth = 3;
  std::mt19937 rng(7);
  ds::Tensor<float> start = random_rows(rng, kRows, kWidth);
  Table table(start, 3, {.name = "table"});  // 3 shards on 2 ps tasks: tasks 0, 1, 0
  ds::Variable<ds::Tensor<float>> single(start, {.name = "single"});
  ds::Tensor<float> want = start;
  const char* kinds[] = {"add", "sub", "update", "min", "max"};
  for (int round = 0; round < 20; ++round) {
    const std::string kind = kinds[round % 5];
    const auto ids = random_ids(rng, 9, kRows);
    const auto values = random_rows(rng, ids.size(), kWidth);
    for (std::size_t i = 0; i < ids.size(); ++i) {  // in order: duplicates add up, or the last update stays
      for (std::int64_t c = 0; c < kWidth; ++c) {
        float& w = want.at(ids[i], c);
        const float v = values.at(i, c);
        if (kind == "add") w = w + v;
        else if (kind == "sub") w = w - v;
        else if (kind == "update") w = v;
        else if (kind == "min") w = v < w ? v : w;
        else w = w < v ? v : w;
      }
    }
    const ds::IndexedSlices<ds::Tensor<float>> slices(ids, values, table.shape());
    if (round % 2 == 0) {  // from the coordinator, straight to the ps tasks
      if (kind == "add") table.scatter_add(slices), single.scatter_add(slices);
      else if (kind == "sub") table.scatter_sub(slices), single.scatter_sub(slices);
      else if (kind == "update") table.scatter_update(slices), single.scatter_update(slices);
      else if (kind == "min") table.scatter_min(slices), single.scatter_min(slices);
      else table.scatter_max(slices), single.scatter_max(slices);
    } else {  // in a closure, which reads its own rows before they are committed
      const std::vector<std::int64_t> read = {ids[0], ids.back(), ids[0]};
      const ds::Tensor<float> seen = coordinator.schedule(&ps_test::scatter_then_read, table, kind, ids, values, read).get();
      ds::Tensor<float> want_seen = ds::Tensor<float>::zeros({3, kWidth});
      for (std::int64_t r = 0; r < 3; ++r) {
        for (std::int64_t c = 0; c < kWidth; ++c) want_seen.at(r, c) = want.at(read[static_cast<std::size_t>(r)], c);
      }
      check_bitwise(seen, want_seen, "rows a closure read after its own " + kind);
      if (kind == "add") single.scatter_add(slices);
      else if (kind == "sub") single.scatter_sub(slices);
      else if (kind == "update") single.scatter_update(slices);
      else if (kind == "min") single.scatter_min(slices);
      else single.scatter_max(slices);
    }
    check_bitwise(table.to_tensor(), want, "sharded table after " + kind);
    check_bitwise(single.read_value(), want, "variable after " + kind);
  }
  const std::vector<std::int64_t> ids = {22, 0, 5, 5, 13};
  ds::Tensor<float> rows = ds::Tensor<float>::zeros({5, kWidth});
  for (std::int64_t r = 0; r < 5; ++r) {
    for (std::int64_t c = 0; c < kWidth; ++c) rows.at(r, c) = want.at(ids[static_cast<std::size_t>(r)], c);
  }
  check_bitwise(table.sparse_read(ids), rows, "sparse_read of the sharded table");
  check_bitwise(single.sparse_read(ids), rows, "sparse_read of the variable");
  // assign_rows is a scatter_update of its rows: across a shard boundary, the rest untouched.
  table.assign_rows(6, ds::Tensor<float>::full({4, kWidth}, 0.5f));
  for (std::int64_t r = 6; r < 10; ++r) {
    for (std::int64_t c = 0; c < kWidth; ++c) want.at(r, c) = 0.5f;
  }
  check_bitwise(table.to_tensor(), want, "after assign_rows");
}

TEST_CASE("optimizer steps applied by the ps tasks equal a dense reference bit for bit (float32)") {
  Cluster cluster(2, 1);
  ds::ParameterServerStrategy strategy(cluster.resolver());
  ds::ClusterCoordinator coordinator(strategy, quiet_options());
  auto scope = strategy.scope();
  constexpr std::int64_t kRows = 41, kWidth = 5;
  std::mt19937 rng(11);
  const ds::Tensor<float> start = random_rows(rng, kRows, kWidth);

  SUBCASE("Adagrad: every row of the dense rule, the rows without gradient unchanged") {
    const ds::optimizers::Adagrad opt{.learning_rate = 0.25, .initial_accumulator_value = 0.1, .epsilon = 1e-7};
    Table table(start, 2, {.name = "adagrad"});
    opt.build(table);
    ds::Tensor<float> var = start, acc = ds::Tensor<float>::full({kRows, kWidth}, 0.1f);
    const float lr = 0.25f, eps = 1e-7f;
    for (int step = 0; step < 12; ++step) {
      const auto ids = random_ids(rng, 16, kRows);
      const auto grad = random_rows(rng, ids.size(), kWidth);
      if (step % 3 == 2) coordinator.schedule(&ps_test::adagrad_step, table, opt, ids, grad).get();
      else opt.apply_gradients(table, ds::IndexedSlices<ds::Tensor<float>>::from_lookup(ids, grad, table.shape()));
      const ds::Tensor<float> g = dense_gradient(ids, grad, table.shape());
      for (std::size_t i = 0; i < var.size(); ++i) {  // TF's ApplyAdagradV2 over the dense gradient
        acc[i] = acc[i] + g[i] * g[i];
        var[i] = var[i] - lr * g[i] / (std::sqrt(acc[i]) + eps);
      }
      check_bitwise(table.to_tensor(), var, "Adagrad table after step " + std::to_string(step));
      check_bitwise(opt.slot(table, "accumulator").to_tensor(), acc, "Adagrad accumulator after step " + std::to_string(step));
    }
  }

  SUBCASE("SGD, SGD with momentum and with Nesterov momentum: the rows of the gradient, in Keras's rule") {
    for (const auto& opt : {ds::optimizers::SGD{.learning_rate = 0.1}, ds::optimizers::SGD{.learning_rate = 0.05, .momentum = 0.9},
                            ds::optimizers::SGD{.learning_rate = 0.05, .momentum = 0.5, .nesterov = true}}) {
      CAPTURE(opt.momentum);
      CAPTURE(opt.nesterov);
      Table table(start, 2, {.name = "sgd"});
      opt.build(table);
      ds::Tensor<float> var = start, m = ds::Tensor<float>::zeros({kRows, kWidth});
      const auto lr = static_cast<float>(opt.learning_rate), mu = static_cast<float>(opt.momentum);
      for (int step = 0; step < 10; ++step) {
        const auto ids = random_ids(rng, 12, kRows);
        const auto grad = random_rows(rng, ids.size(), kWidth);
        if (step % 2 == 1) coordinator.schedule(&ps_test::sgd_step, table, opt, ids, grad).get();
        else opt.apply_gradients(table, ds::IndexedSlices<ds::Tensor<float>>::from_lookup(ids, grad, table.shape()));
        const ds::Tensor<float> g = dense_gradient(ids, grad, table.shape());
        std::vector<bool> touched(kRows, false);
        for (auto id : ids) touched[static_cast<std::size_t>(id)] = true;
        for (std::int64_t r = 0; r < kRows; ++r) {
          if (!touched[static_cast<std::size_t>(r)]) continue;  // a sparse step leaves the other rows' momentum
          for (std::int64_t c = 0; c < kWidth; ++c) {
            float& v = var.at(r, c);
            float& mr = m.at(r, c);
            const float gr = g.at(r, c);
            if (opt.momentum == 0.0 && !opt.nesterov) {
              v = v - lr * gr;
            } else {
              mr = mu * mr - lr * gr;
              v = opt.nesterov ? v + (mu * mr - lr * gr) : v + mr;
            }
          }
        }
        check_bitwise(table.to_tensor(), var, "SGD table after step " + std::to_string(step));
        if (opt.momentum != 0.0) check_bitwise(opt.slot(table, "momentum").to_tensor(), m, "momentum slot");
      }
    }
  }

  SUBCASE("a dense gradient on a Variable on a ps task: the dense rule") {
    const ds::optimizers::Adagrad opt{.learning_rate = 0.5};
    ds::Variable<ds::Tensor<float>> w(start, {.name = "dense"});
    opt.build(w);
    const auto grad = random_rows(rng, kRows, kWidth);
    opt.apply_gradients(w, grad);
    ds::Tensor<float> var = start;
    for (std::size_t i = 0; i < var.size(); ++i) {
      const float acc = 0.1f + grad[i] * grad[i];
      var[i] = var[i] - 0.5f * grad[i] / (std::sqrt(acc) + 1e-7f);
    }
    check_bitwise(w.read_value(), var, "dense Adagrad step");
  }
}

TEST_CASE("a table's Adagrad accumulator is checkpointed with it and restores into another shard count") {
  Cluster cluster(2, 1);
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("ps-embeddings-{}", ::getpid());
  std::filesystem::remove_all(dir);
  const ds::optimizers::Adagrad opt{.learning_rate = 0.1};
  ds::Tensor<float> saved_table, saved_acc;
  std::string path;
  {
    ds::ParameterServerStrategy strategy(cluster.resolver());
    auto scope = strategy.scope();
    Table table(ds::Shape{30, 4}, ds::Initializer::random_uniform(-0.05, 0.05, 3), 2, {.name = "users"});
    opt.build(table);
    std::mt19937 rng(5);
    for (int step = 0; step < 5; ++step) {
      const auto ids = random_ids(rng, 10, 30);
      opt.apply_gradients(table, ds::IndexedSlices<ds::Tensor<float>>::from_lookup(ids, random_rows(rng, ids.size(), 4), table.shape()));
    }
    ds::Checkpoint checkpoint;
    checkpoint.track_sharded("users", table.variables());
    checkpoint.track_sharded("users/accumulator", opt.slot(table, "accumulator").variables());
    path = checkpoint.save((dir / "ckpt").string());
    saved_table = table.to_tensor();
    saved_acc = opt.slot(table, "accumulator").to_tensor();
  }
  ds::ParameterServerStrategy strategy(cluster.resolver());
  auto scope = strategy.scope();
  Table table(ds::Shape{30, 4}, ds::Initializer::zeros(), 3, {.name = "users"});
  opt.build(table);
  ds::Checkpoint checkpoint;
  checkpoint.track_sharded("users", table.variables());
  checkpoint.track_sharded("users/accumulator", opt.slot(table, "accumulator").variables());
  checkpoint.restore(path);
  CHECK(table.num_shards() == 3);
  check_bitwise(table.to_tensor(), saved_table, "restored table");
  check_bitwise(opt.slot(table, "accumulator").to_tensor(), saved_acc, "restored accumulator");
  std::filesystem::remove_all(dir);
}

TEST_CASE("only the touched rows travel: bytes through a ps task per scatter and lookup, the same at 1 M rows as at 1 k") {
  Cluster cluster(1, 1);
  ds::ParameterServerStrategy strategy(cluster.resolver());
  auto scope = strategy.scope();
  constexpr std::int64_t kWidth = 16, kIds = 64;
  const auto ids = [] {
    std::vector<std::int64_t> v;
    for (std::int64_t i = 0; i < kIds; ++i) v.push_back(i * 13 % 1000);
    return v;
  }();
  const ds::Tensor<float> rows = ds::Tensor<float>::full({kIds, kWidth}, 1.0f);
  const double payload = kIds * (sizeof(std::int64_t) + kWidth * sizeof(float));  // ids and rows, one way
  auto through_ps = [&](std::int64_t table_rows) {
    Table table(ds::Shape{table_rows, kWidth}, ds::Initializer::zeros(), 1, {.name = fmt::format("t{}", table_rows)});
    const double in0 = metric_sum({cluster.ports[0]}, "distribute_wire_bytes_received_total");
    const double out0 = metric_sum({cluster.ports[0]}, "distribute_wire_bytes_sent_total");
    table.scatter_add(ds::IndexedSlices<ds::Tensor<float>>(ids, rows, table.shape()));
    const auto got = table.embedding_lookup(ids);
    CHECK(got.at(0, 0) == 1.0f);
    // Less the /metrics reads' own share: HTTP is not framed, so it is not counted.
    return std::pair{metric_sum({cluster.ports[0]}, "distribute_wire_bytes_received_total") - in0,
                     metric_sum({cluster.ports[0]}, "distribute_wire_bytes_sent_total") - out0};
  };
  const auto [in_small, out_small] = through_ps(1000);
  const auto [in_large, out_large] = through_ps(1'000'000);
  MESSAGE("ps received " << in_small << " and sent " << out_small << " bytes for " << payload << " bytes of ids and rows");
  // The same bytes at both sizes, but for a heartbeat frame (64 bytes, one a second each way when a
  // connection is idle) that may fall in either window.
  CHECK(std::abs(in_small - in_large) <= 128);
  CHECK(std::abs(out_small - out_large) <= 128);
  // In: the scatter's ids and rows, and the lookup's ids; out: the lookup's rows (and two replies).
  CHECK(in_small <= 1.25 * (payload + kIds * sizeof(std::int64_t)));
  CHECK(in_small >= payload);
  CHECK(out_small <= 1.25 * kIds * kWidth * sizeof(float));
  CHECK(out_small >= kIds * kWidth * sizeof(float));
}

TEST_CASE("bad sparse input is refused by name: from the wire, without slots, a read after a step in one closure") {
  Cluster cluster(1, 1);
  ds::ParameterServerStrategy strategy(cluster.resolver());
  ds::ClusterCoordinator coordinator(strategy, quiet_options());
  auto scope = strategy.scope();
  Table table(ds::Shape{10, 2}, ds::Initializer::zeros(), 1, {.name = "t"});
  const std::string key = table.variables()[0].remote_handle()->key;
  namespace dd = ds::ps::detail;
  ds::net::RpcClient raw(cluster.spec.task_address("ps", 0), "ps 0", {});
  auto send = [&](dd::UpdateVarMsg m) {
    try {
      raw.call(dd::RpcOp::UpdateVar, dd::encode_message(m));
    } catch (const ds::net::RemoteError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const auto f32 = static_cast<std::uint8_t>(ds::DType::F32);
  const auto add = static_cast<std::uint8_t>(ds::core::RemoteUpdate::ScatterAdd);
  auto int64s = [](std::vector<std::int64_t> v) { return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 8); };
  // An IndexedSlices that claims three rows and carries two.
  CHECK(send({key, add, f32, std::string(16, '\0'), int64s({1, 2, 3})}).find(
            "scatter_add of variable '" + key + "' on /job:ps/replica:0/task:0/device:CPU:0: 3 rows of 8 bytes claimed, 16 "
            "bytes of values sent") != std::string::npos);
  CHECK(send({key, add, f32, std::string(16, '\0'), std::string(12, '\0')}).find("12 bytes of row indices are not a whole number of int64s") !=
        std::string::npos);
  CHECK(send({key, add, f32, std::string(16, '\0'), int64s({1, 10})}).find("row 10 (at position 1) is out of range [0, 10)") !=
        std::string::npos);
  CHECK(send({key, add, f32, std::string(8, '\0'), int64s({-1})}).find("row -1 (at position 0) is out of range [0, 10)") !=
        std::string::npos);
  CHECK(send({key, static_cast<std::uint8_t>(ds::core::RemoteUpdate::ApplyAdagrad), f32, std::string(8, '\0'), int64s({1}),
              {0.1, 1e-7, 0}})
            .find("Adagrad: variable '" + key + "' on /job:ps/replica:0/task:0/device:CPU:0 has no 'accumulator' slot") !=
        std::string::npos);
  CHECK(send({key, static_cast<std::uint8_t>(ds::core::RemoteUpdate::ApplySgd), f32, std::string(8, '\0'), int64s({1}),
              {-1.0, 0, 0}})
            .find("learning_rate must be a finite number >= 0, got -1") != std::string::npos);
  CHECK(table.to_tensor() == ds::Tensor<float>::zeros({10, 2}));  // nothing was applied

  // Without build(): the step names the missing slot.
  const ds::optimizers::Adagrad opt{.learning_rate = 0.1};
  const auto slices = ds::IndexedSlices<ds::Tensor<float>>({1}, ds::Tensor<float>::full({1, 2}, 1.0f), {10, 2});
  CHECK_THROWS_WITH_AS(opt.apply_gradients(table, slices), doctest::Contains("has no 'accumulator' slot of its dtype and shape; "
                                                                              "build the optimizer on the variable first"),
                       ds::InvalidArgument);
  opt.build(table);
  // A closure that reads the table after stepping it.
  CHECK_THROWS_WITH_AS(coordinator.schedule(&ps_test::step_then_read, table, opt, std::vector<std::int64_t>{1},
                                            ds::Tensor<float>::full({1, 2}, 1.0f))
                           .get(),
                       "variable 't' is read in the closure that applied Adagrad to it: the step is applied on the ps "
                       "task when the closure commits; read it before applying the gradients, or in a later closure",
                       ds::InvalidArgument);
  CHECK_THROWS_AS(coordinator.join(), ds::InvalidArgument);  // the closure's error, once more
  // Hyperparameters, slots and dtypes checked on the coordinator too.
  CHECK_THROWS_WITH_AS((ds::optimizers::SGD{.learning_rate = 0.1, .momentum = 1.5}.apply_gradients(table, slices)),
                       "SGD with momentum on variable 't': momentum must be in [0, 1], got 1.5", ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(opt.slot(table, "momentum"), "Adagrad keeps the slot 'accumulator'; 'momentum' is not one of its slots",
                       ds::InvalidArgument);
  ds::Variable<ds::Tensor<std::int32_t>> ints(ds::Tensor<std::int32_t>::zeros({4}), {.name = "ints"});
  CHECK_THROWS_WITH_AS(opt.build(ints), "Adagrad.build: Adagrad applies to float32 and float64 variables; 'ints' is int32",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(table.scatter_add(ds::IndexedSlices<ds::Tensor<double>>({1}, ds::Tensor<double>::full({1, 2}, 1.0), {10, 2})),
                       "scatter_add: float64 rows into sharded variable 't' of float32", ds::InvalidArgument);
  // A shape claimed in a few bytes is checked before the ps task allocates it.
  CHECK_THROWS_WITH_AS(Table(ds::Shape{std::int64_t{1} << 40, 8}, ds::Initializer::zeros(), 1, {.name = "huge"}),
                       doctest::Contains("/huge' of shape (1099511627776, 8) (float32) would hold 35184372088832 bytes; a "
                                         "ps task fills at most"),
                       ds::InvalidArgument);
}

}  // TEST_SUITE

// Embeddings in one process: IndexedSlices (checks, to_dense, deduplication, the gradient of a
// lookup), initializers, the row kernels, scatter_* and sparse_read on every local placement, sharded
// tables, the replicas' all-reduce of IndexedSlices, and what the ps optimizers refuse here. The
// same on ps tasks: tests/test_ps_embeddings.cpp.
#define DISTRIBUTE_WITH_PS
#include <distribute/distribute.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace ds = distribute;
using Mirrored = ds::MirroredStrategy<ds::host>;
using Rows = ds::IndexedSlices<ds::Tensor<float>>;

namespace {

ds::Tensor<float> rows_of(std::vector<std::vector<float>> rows) {
  std::vector<float> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  const auto width = rows.empty() ? 0 : static_cast<std::int64_t>(rows.front().size());
  return ds::Tensor<float>({static_cast<std::int64_t>(rows.size()), width}, std::move(flat));
}

}  // namespace

TEST_CASE("IndexedSlices: what it holds, to_dense adds duplicates, deduplicated sums them in first-seen order") {
  const Rows s({3, 0, 3, 4}, rows_of({{1, 2}, {3, 4}, {10, 20}, {5, 6}}), {5, 2});
  CHECK(s.size() == 4);
  CHECK(s.row_elements() == 2);
  CHECK(s.dtype() == ds::DType::F32);
  CHECK(s.to_dense() == ds::Tensor<float>({5, 2}, {3, 4, 0, 0, 0, 0, 11, 22, 5, 6}));
  const Rows d = s.deduplicated();
  CHECK(d.indices() == std::vector<std::int64_t>{3, 0, 4});
  CHECK(d.values() == rows_of({{11, 22}, {3, 4}, {5, 6}}));
  CHECK(d.dense_shape() == ds::Shape{5, 2});
  CHECK(d.to_dense() == s.to_dense());
  // Empty slices are slices of nothing.
  const Rows none({}, ds::Tensor<float>::zeros({0, 2}), {5, 2});
  CHECK(none.to_dense() == ds::Tensor<float>::zeros({5, 2}));
  CHECK(none.deduplicated() == none);
  // A vector of scalars: slices of a rank-1 tensor.
  const ds::IndexedSlices<std::vector<double>> scalars({2, 2}, std::vector<double>{1.5, 2.0}, {3});
  CHECK(scalars.to_dense() == std::vector<double>{0, 0, 3.5});
}

TEST_CASE("IndexedSlices::from_lookup: the gradient of a lookup of ids of any shape") {
  // ids (2, 2) into a (6, 3) table: the gradient rows come as (2, 2, 3).
  std::vector<float> grad(12);
  for (std::size_t i = 0; i < grad.size(); ++i) grad[i] = static_cast<float>(i);
  const ds::Tensor<std::int64_t> ids({2, 2}, {5, 1, 1, 0});
  const Rows s = Rows::from_lookup(ids, ds::Tensor<float>({2, 2, 3}, grad), {6, 3});
  CHECK(s.indices() == std::vector<std::int64_t>{5, 1, 1, 0});
  CHECK(s.values().shape() == ds::Shape{4, 3});
  CHECK(s.to_dense() == ds::Tensor<float>({6, 3}, {9, 10, 11, 3 + 6, 4 + 7, 5 + 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2}));
  CHECK_THROWS_WITH_AS(Rows::from_lookup(ids, ds::Tensor<float>::zeros({4, 3}), {6, 3}),
                       "IndexedSlices::from_lookup: a gradient of shape (4, 3) for ids of shape (2, 2) into a table of "
                       "shape (6, 3); it must have shape (2, 2, 3)",
                       ds::InvalidArgument);
}

TEST_CASE("IndexedSlices refuses what is not slices of its dense shape, naming it") {
  CHECK_THROWS_WITH_AS(Rows({0, 7}, rows_of({{1}, {2}}), {5, 1}),
                       "IndexedSlices: index 7 (at position 1) is out of range [0, 5) of dense shape (5, 1)", ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(Rows({-1}, rows_of({{1}}), {5, 1}),
                       "IndexedSlices: index -1 (at position 0) is out of range [0, 5) of dense shape (5, 1)", ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(Rows({0, 1, 2}, rows_of({{1}, {2}}), {5, 1}),
                       "IndexedSlices: 3 indices but values of shape (2, 1): there must be one row of values per index",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(Rows({0}, rows_of({{1, 2, 3}}), {5, 2}),
                       "IndexedSlices: rows of shape (3,) do not fit dense shape (5, 2); each row must have shape (2,)",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(Rows({0}, rows_of({{1}}), {}),
                       "IndexedSlices: the dense shape is a scalar; slices index the first axis of a tensor of rank >= 1",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(Rows({0}, rows_of({{1}}), {5, -1}), "IndexedSlices: dense shape (5, -1) has a negative dimension",
                       ds::InvalidArgument);
}

TEST_CASE("Initializer: constant, zeros, uniform and normal values; the same numbers whatever the shard") {
  std::vector<float> u(1000), tail(400);
  const auto uniform = ds::Initializer::random_uniform(-0.05, 0.05, 9);
  uniform.fill(ds::DType::F32, std::as_writable_bytes(std::span(u)));
  for (float x : u) CHECK((x >= -0.05f && x < 0.05f));
  uniform.from(600).fill(ds::DType::F32, std::as_writable_bytes(std::span(tail)));
  CHECK(std::memcmp(tail.data(), u.data() + 600, tail.size() * sizeof(float)) == 0);  // a shard from row 600
  std::vector<float> again(1000), other(1000);
  uniform.fill(ds::DType::F32, std::as_writable_bytes(std::span(again)));
  ds::Initializer::random_uniform(-0.05, 0.05, 10).fill(ds::DType::F32, std::as_writable_bytes(std::span(other)));
  CHECK(again == u);
  CHECK(other != u);
  std::vector<double> n(20000);
  ds::Initializer::random_normal(1.0, 2.0, 3).fill(ds::DType::F64, std::as_writable_bytes(std::span(n)));
  double mean = 0, var = 0;
  for (double x : n) mean += x / n.size();
  for (double x : n) var += (x - mean) * (x - mean) / n.size();
  CHECK(mean == doctest::Approx(1.0).epsilon(0.05));
  CHECK(std::sqrt(var) == doctest::Approx(2.0).epsilon(0.05));
  std::vector<std::int32_t> c(3);
  ds::Initializer::constant(7).fill(ds::DType::I32, std::as_writable_bytes(std::span(c)));
  CHECK(c == std::vector<std::int32_t>{7, 7, 7});
  // A variable made by an initializer holds what the initializer gives; a sharded one the same.
  ds::Variable<ds::Tensor<float>> v(ds::Shape{10, 3}, uniform, {.name = "v"});
  ds::ShardedVariable<ds::Tensor<float>> t(ds::Shape{10, 3}, uniform, 3, {.name = "t"});
  CHECK(std::memcmp(v.read_value().data(), u.data(), 30 * sizeof(float)) == 0);
  CHECK(t.to_tensor() == v.read_value());
  CHECK(t.num_shards() == 3);
}

TEST_CASE("Initializer refuses what it cannot make, naming it") {
  CHECK_THROWS_WITH_AS(ds::Initializer::random_uniform(1, 1), "Initializer: random_uniform(1, 1, seed=0) needs minval < maxval",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(ds::Initializer::random_normal(0, -1), "Initializer: random_normal(0, -1, seed=0) needs stddev >= 0",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(ds::Initializer::constant(std::nan("")), "Initializer: constant(nan) has a parameter that is not finite",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(ds::Initializer::from_parts(9, 0, 0, 0, 0), "Initializer: unknown kind 9", ds::InvalidArgument);
  CHECK_THROWS_WITH_AS((ds::Variable<ds::Tensor<std::int32_t>>(ds::Shape{2}, ds::Initializer::random_uniform(), {.name = "i"})),
                       "variable 'i': random_uniform(-0.05, 0.05, seed=0) makes floating-point values, and variable 'i' is int32",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS((ds::Variable<ds::Tensor<std::int32_t>>(ds::Shape{2}, ds::Initializer::constant(0.5), {.name = "i"})),
                       "variable 'i': constant(0.5) is not a int32 value", ds::InvalidArgument);
}

TEST_CASE("row kernels: signed integers wrap, min and max as Eigen's (a NaN update leaves the row), 16-bit floats") {
  std::int32_t top = std::numeric_limits<std::int32_t>::max(), bottom = std::numeric_limits<std::int32_t>::min();
  const std::int32_t one = 1;
  ds::core::combine_bytes(ds::DType::I32, ds::core::RowOp::Add, reinterpret_cast<std::byte*>(&top), reinterpret_cast<const std::byte*>(&one), 1);
  CHECK(top == std::numeric_limits<std::int32_t>::min());
  ds::core::combine_bytes(ds::DType::I32, ds::core::RowOp::Sub, reinterpret_cast<std::byte*>(&bottom), reinterpret_cast<const std::byte*>(&one), 1);
  CHECK(bottom == std::numeric_limits<std::int32_t>::max());
  const float nan = std::numeric_limits<float>::quiet_NaN();
  float row[3] = {1, nan, 5};
  const float upd[3] = {nan, 2, 4};
  ds::core::combine_bytes(ds::DType::F32, ds::core::RowOp::Min, reinterpret_cast<std::byte*>(row), reinterpret_cast<const std::byte*>(upd), 3);
  CHECK(row[0] == 1);
  CHECK(std::isnan(row[1]));
  CHECK(row[2] == 4);
  ds::bfloat16 h[1] = {ds::bfloat16(1.5f)};
  const ds::bfloat16 hd[1] = {ds::bfloat16(0.25f)};
  ds::core::combine_bytes(ds::DType::BF16, ds::core::RowOp::Add, reinterpret_cast<std::byte*>(h), reinterpret_cast<const std::byte*>(hd), 1);
  CHECK(float(h[0]) == 1.75f);
}

TEST_CASE("scatter_* and sparse_read on a plain variable, duplicates applied in order; bad rows named") {
  ds::Variable<ds::Tensor<float>> v(ds::Tensor<float>({4, 2}, {1, 1, 2, 2, 3, 3, 4, 4}), {.name = "v"});
  v.scatter_add(Rows({1, 3, 1}, rows_of({{10, 10}, {1, 2}, {5, 5}}), {4, 2}));
  CHECK(v.read_value() == ds::Tensor<float>({4, 2}, {1, 1, 17, 17, 3, 3, 5, 6}));
  v.scatter_sub(Rows({0}, rows_of({{1, 2}}), {4, 2}));
  v.scatter_update(Rows({2, 2}, rows_of({{7, 7}, {8, 9}}), {4, 2}));  // the last update of a row stays
  v.scatter_min(Rows({1, 3}, rows_of({{20, 0}, {0, 20}}), {4, 2}));
  v.scatter_max(Rows({0}, rows_of({{-5, 3}}), {4, 2}));
  CHECK(v.read_value() == ds::Tensor<float>({4, 2}, {0, 3, 17, 0, 8, 9, 0, 6}));
  CHECK(v.sparse_read(std::vector<std::int64_t>{3, 3, 0}) == ds::Tensor<float>({3, 2}, {0, 6, 0, 6, 0, 3}));
  CHECK(v.sparse_read(ds::Tensor<std::int32_t>({2, 1}, {2, 1})) == ds::Tensor<float>({2, 1, 2}, {8, 9, 17, 0}));
  // Bad input, each named.
  CHECK_THROWS_WITH_AS(v.sparse_read(std::vector<std::int64_t>{0, 4}),
                       "sparse_read: index 4 (at position 1) is out of range [0, 4) of variable 'v'", ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(v.scatter_add(ds::IndexedSlices<ds::Tensor<double>>({0}, ds::Tensor<double>::zeros({1, 2}), {4, 2})),
                       "scatter_add: float64 rows into variable 'v' of float32", ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(v.scatter_add(Rows({0}, rows_of({{1, 2, 3}}), {4, 3})),
                       "scatter_add: rows of shape (3,) into variable 'v', whose rows have shape (2,)", ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(v.scatter_update(Rows({0}, rows_of({{1, 2}}), {6, 2})),
                       "scatter_update: IndexedSlices of dense shape (6, 2) into variable 'v' of shape (4, 2)",
                       ds::InvalidArgument);
  ds::Variable<float> scalar(1.0f, {.name = "s"});
  CHECK_THROWS_WITH_AS(scalar.scatter_add(ds::IndexedSlices<std::vector<float>>({0}, std::vector<float>{1}, {1})),
                       "scatter_add: variable 's' is a scalar and has no rows", ds::InvalidArgument);
  ds::Variable<std::vector<std::uint8_t>> flags(std::vector<std::uint8_t>{0, 1}, {.name = "flags"});
  flags.scatter_max(ds::IndexedSlices<std::vector<std::uint8_t>>({0}, std::vector<std::uint8_t>{3}, {2}));
  CHECK(flags.read_value() == std::vector<std::uint8_t>{3, 1});
  CHECK(v.read_value() == ds::Tensor<float>({4, 2}, {0, 3, 17, 0, 8, 9, 0, 6}));  // the refused ones changed nothing
}

TEST_CASE("scatter on strategies' variables: every copy in cross-replica context, its own in a replica with NONE; "
          "SUM, ON_READ and a shared plain variable refused as in TF") {
  Mirrored strategy(2);
  auto scope = strategy.scope();
  ds::Variable<ds::Tensor<float>> m(ds::Tensor<float>::zeros({3, 1}), {.name = "m"});
  m.scatter_add(Rows({2}, rows_of({{4}}), {3, 1}));
  for (const auto& copy : m.values()) CHECK(copy == ds::Tensor<float>({3, 1}, {0, 0, 4}));
  strategy.run([&](ds::ReplicaContext& ctx) {
    const auto r = static_cast<float>(ctx.replica_id_in_sync_group());
    m.scatter_update(Rows({0}, rows_of({{r + 1}}), {3, 1}));  // each replica its own copy
  });
  CHECK(m.values()[0] == ds::Tensor<float>({3, 1}, {1, 0, 4}));
  CHECK(m.values()[1] == ds::Tensor<float>({3, 1}, {2, 0, 4}));
  // With the rows all-reduced first, the copies stay equal.
  strategy.run([&](ds::ReplicaContext& ctx) {
    const auto r = static_cast<float>(ctx.replica_id_in_sync_group());
    m.scatter_add(ctx.all_reduce(ds::ReduceOp::Sum, Rows({1}, rows_of({{r + 1}}), {3, 1})));
  });
  CHECK(m.values()[0].at(1, 0) == 3);
  CHECK(m.values()[1].at(1, 0) == 3);

  ds::Variable<ds::Tensor<float>> summed(ds::Tensor<float>::zeros({3, 1}), {.name = "summed", .aggregation = ds::VariableAggregation::Sum});
  CHECK_THROWS_WITH_AS(strategy.run([&] { summed.scatter_add(Rows({0}, rows_of({{1}}), {3, 1})); }),
                       "scatter_add: variable 'summed' has SUM aggregation; in replica context a scatter is only supported "
                       "with NONE aggregation, as in TF (all-reduce the IndexedSlices first, or update in cross-replica "
                       "context)",
                       ds::InvalidArgument);
  ds::Variable<ds::Tensor<float>> on_read(ds::Tensor<float>::zeros({3, 1}),
                                          {.name = "on_read", .synchronization = ds::VariableSynchronization::OnRead,
                                           .aggregation = ds::VariableAggregation::Sum});
  CHECK_THROWS_WITH_AS(on_read.scatter_add(Rows({0}, rows_of({{1}}), {3, 1})),
                       "scatter_add: variable 'on_read' is ON_READ (sync-on-read), whose copies are aggregated when read; TF "
                       "supports no scatter on those either",
                       ds::InvalidArgument);
}

TEST_CASE("scatter on a central-storage variable in a replica: replica 0's rows, applied once") {
  ds::CentralStorageStrategy<> strategy(3);
  auto scope = strategy.scope();
  ds::Variable<ds::Tensor<float>> c(ds::Tensor<float>::zeros({2, 1}), {.name = "c"});
  strategy.run([&] { c.scatter_add(Rows({1}, rows_of({{1}}), {2, 1})); });
  CHECK(c.read_value() == ds::Tensor<float>({2, 1}, {0, 1}));
}

TEST_CASE("a sharded table in this process: scatter routed to the shards, lookups, assign_rows across shards") {
  ds::ShardedVariable<ds::Tensor<float>> t(ds::Tensor<float>::zeros({7, 2}), 3, {.name = "t"});  // rows 3, 2, 2
  CHECK(t.row_offsets() == std::vector<std::int64_t>{0, 3, 5, 7});
  t.scatter_add(Rows({6, 0, 3, 6}, rows_of({{1, 1}, {2, 2}, {3, 3}, {4, 4}}), {7, 2}));
  CHECK(t.to_tensor() == ds::Tensor<float>({7, 2}, {2, 2, 0, 0, 0, 0, 3, 3, 0, 0, 0, 0, 5, 5}));
  CHECK(t.sparse_read(std::vector<std::int64_t>{6, 6, 3}) == ds::Tensor<float>({3, 2}, {5, 5, 5, 5, 3, 3}));
  t.assign_rows(2, rows_of({{9, 9}, {8, 8}, {7, 7}}));
  CHECK(t.to_tensor() == ds::Tensor<float>({7, 2}, {2, 2, 0, 0, 9, 9, 8, 8, 7, 7, 0, 0, 5, 5}));
  t.scatter_min(Rows({4}, rows_of({{1, 10}}), {7, 2}));  // row 1 of shard 1 (rows 3 and 4)
  CHECK(t.variables()[1].read_value() == ds::Tensor<float>({2, 2}, {8, 8, 1, 7}));
  CHECK_THROWS_WITH_AS(t.scatter_add(Rows({0}, rows_of({{1, 1}}), {8, 2})),
                       "scatter_add: IndexedSlices of dense shape (8, 2) into sharded variable 't' of shape (7, 2)",
                       ds::InvalidArgument);
}

TEST_CASE("all_reduce of IndexedSlices equals the dense all_reduce of to_dense(), 1-4 replicas, duplicates, empty ones") {
  for (int n = 1; n <= 4; ++n) {
    CAPTURE(n);
    Mirrored strategy(n);
    for (const auto op : {ds::ReduceOp::Sum, ds::ReduceOp::Mean}) {
      strategy.run([&](ds::ReplicaContext& ctx) {
        const int r = ctx.replica_id_in_sync_group();
        std::vector<std::int64_t> ids;  // replica 1 sends nothing; the others a duplicated row and their own
        std::vector<std::vector<float>> rows;
        if (r != 1) {
          ids = {2, 2, r};
          rows = {{1, 2}, {3, 4}, {float(r), 8}};
        }
        const Rows mine(ids, ids.empty() ? ds::Tensor<float>::zeros({0, 2}) : rows_of(rows), {6, 2});
        const auto [sparse, dense, plain] =
            ctx.all_reduce(op, mine, mine.to_dense(), std::vector<double>{static_cast<double>(r)});
        const ds::Tensor<float> want = ctx.all_reduce(op, mine.to_dense());
        // SUM: the same numbers (small integers add exactly); MEAN: each row divided, then added.
        const ds::Tensor<float> got = sparse.to_dense();
        for (std::size_t i = 0; i < want.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-6));
        if (op == ds::ReduceOp::Sum) CHECK(got == want);
        CHECK(dense == want);
        CHECK(plain == ctx.all_reduce(op, std::vector<double>{static_cast<double>(r)}));
        // Every replica's rows, in replica order.
        std::vector<std::int64_t> all;
        for (int k = 0; k < n; ++k) {
          if (k != 1) all.insert(all.end(), {2, 2, k});
        }
        CHECK(sparse.indices() == all);
        if (op == ds::ReduceOp::Mean && !all.empty()) CHECK(sparse.values().at(0, 1) == doctest::Approx(2.0 / n));
      });
    }
  }
}

TEST_CASE("all_reduce and strategy.reduce of IndexedSlices on OneDeviceStrategy and CentralStorageStrategy") {
  ds::OneDeviceStrategy<> one;
  const auto mine = one.run([](ds::ReplicaContext& ctx) {
    return ctx.all_reduce(ds::ReduceOp::Mean, Rows({1, 1}, rows_of({{2}, {4}}), {3, 1}));
  });
  CHECK(mine.values().front() == Rows({1, 1}, rows_of({{2}, {4}}), {3, 1}));  // one replica: its own rows
  ds::CentralStorageStrategy<> central(3);
  auto per_replica = central.run([](ds::ReplicaContext& ctx) {
    const auto r = ctx.replica_id_in_sync_group();
    const Rows own({r}, rows_of({{static_cast<float>(r + 1)}}), {3, 1});
    const Rows all = ctx.all_reduce(ds::ReduceOp::Sum, own);
    CHECK(all.indices() == std::vector<std::int64_t>{0, 1, 2});
    CHECK(all.to_dense() == ds::Tensor<float>({3, 1}, {1, 2, 3}));
    return own;
  });
  const Rows reduced = central.reduce(ds::ReduceOp::Mean, per_replica);
  CHECK(reduced.indices() == std::vector<std::int64_t>{0, 1, 2});
  CHECK(reduced.values().at(2, 0) == doctest::Approx(1.0));  // 3 / 3 replicas
}

TEST_CASE("all_reduce of IndexedSlices refuses MAX, and replicas whose slices differ: the same error on every replica") {
  Mirrored strategy(2);
  CHECK_THROWS_WITH_AS(strategy.run([&](ds::ReplicaContext& ctx) {
    ctx.all_reduce(ds::ReduceOp::Max, Rows({0}, rows_of({{1}}), {2, 1}));
  }),
                       "all_reduce: IndexedSlices are reduced with SUM or MEAN (an all-gather of their rows, as in TF); MAX "
                       "is not defined for them",
                       ds::InvalidArgument);
  std::vector<std::string> errors(2);
  strategy.run([&](ds::ReplicaContext& ctx) {
    const int r = ctx.replica_id_in_sync_group();
    try {
      ctx.all_reduce(ds::ReduceOp::Sum, Rows({0}, rows_of({{1}}), {r == 0 ? 5 : 6, 1}));
    } catch (const ds::InvalidArgument& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
    }
  });
  CHECK(errors[0] == "all_reduce: value 0 is IndexedSlices of dense shape (5, 1) float32 on replica 0 but IndexedSlices of "
                     "dense shape (6, 1) float32 on replica 1; every replica passes the same kinds, dtypes and shapes");
  CHECK(errors[1] == errors[0]);
}

TEST_CASE("the ps optimizers refuse a variable that is not on a ps task, naming it") {
  ds::Variable<ds::Tensor<float>> local(ds::Tensor<float>::zeros({3, 2}), {.name = "local"});
  const ds::optimizers::Adagrad adagrad{.learning_rate = 0.1};
  CHECK_THROWS_WITH_AS(adagrad.build(local),
                       "Adagrad.build: variable 'local' is not on a ps task; these optimizers step variables where a ps task "
                       "holds them (create it in ParameterServerStrategy::scope(), connected to its cluster)",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS((ds::optimizers::Adagrad{.initial_accumulator_value = -1}.build(local)),
                       "Adagrad: initial_accumulator_value must be a finite number >= 0, got -1", ds::InvalidArgument);
}

// Parameter-server foundations: partitioners, the div rule, ShardedVariable, round-robin ps
// placement and the ParameterServerStrategy skeleton.
//
// The partitioner tables are worked out by hand from TF's algorithms and its documented examples
// (the comment on each row shows the arithmetic), not produced by running this code.
#include <distribute/ps/parameter_server_strategy.hpp>

#include <distribute/ps/partitioner.hpp>
#include <distribute/ps/placement.hpp>
#include <distribute/ps/sharded_variable.hpp>
#include <distribute/strategy/default_strategy.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace ds = distribute;

namespace {

using ds::DType;
using ds::Partitions;
using ds::Shape;

// These tests look at placement and partitioning only: no ps task runs, values stay here.
const ds::ParameterServerOptions kPlacementOnly{.connect = false};

/// A (rows, cols) float tensor holding 0, 1, 2, ... in row-major order.
ds::Tensor<float> iota_table(std::int64_t rows, std::int64_t cols) {
  std::vector<float> data(static_cast<std::size_t>(rows * cols));
  std::iota(data.begin(), data.end(), 0.0f);
  return ds::Tensor<float>({rows, cols}, std::move(data));
}

/// The dense reference for embedding_lookup: row ids[p] of `table` for every position p.
ds::Tensor<float> dense_lookup(const ds::Tensor<float>& table, const ds::Tensor<std::int64_t>& ids) {
  const std::int64_t width = table.dim(1);
  Shape shape = ids.shape();
  shape.push_back(width);
  std::vector<float> out;
  for (std::size_t p = 0; p < ids.size(); ++p) {
    for (std::int64_t c = 0; c < width; ++c) out.push_back(table[static_cast<std::size_t>(ids[p] * width + c)]);
  }
  return ds::Tensor<float>(shape, std::move(out));
}

std::string ps_device(int task) { return "/job:ps/replica:0/task:" + std::to_string(task) + "/device:CPU:0"; }

/// chief + `num_ps` ps + `num_workers` workers on distinct loopback ports; this process is the chief.
std::shared_ptr<ds::ClusterResolver> ps_cluster(int num_ps, int num_workers) {
  int port = 20000;
  std::vector<std::string> ps, workers;
  for (int i = 0; i < num_ps; ++i) ps.push_back("localhost:" + std::to_string(port++));
  for (int i = 0; i < num_workers; ++i) workers.push_back("localhost:" + std::to_string(port++));
  ds::ClusterSpec spec(ds::ClusterSpec::DenseJobs{{"chief", {"localhost:19999"}}, {"ps", ps}, {"worker", workers}});
  return std::make_shared<ds::SimpleClusterResolver>(spec, "chief", 0);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Partitioners

TEST_CASE("FixedShardsPartitioner: min(num_shards, rows) on the axis, 1 elsewhere") {
  struct Row {
    std::int64_t num_shards;
    Shape shape;
    std::size_t axis;
    Partitions expected;
  };
  const std::vector<Row> rows = {
      {2, {10, 3}, 0, {2, 1}},    // TF's docstring example
      {5, {3, 4}, 0, {3, 1}},     // never more shards than rows: min(5, 3)
      {3, {7}, 0, {3}},           // rank 1
      {4, {10, 2, 2}, 0, {4, 1, 1}},
      {2, {10, 3}, 1, {1, 2}},    // another axis: min(2, 3)
      {8, {10, 3}, 1, {1, 3}},    // min(8, 3)
      {3, {0, 4}, 0, {1, 1}},     // no rows: one (empty) shard
      {3, {}, 0, {}},             // a scalar has no axis to split
  };
  for (const auto& r : rows) {
    CAPTURE(r.num_shards);
    CAPTURE(ds::shape_string(r.shape));
    CHECK(ds::FixedShardsPartitioner(r.num_shards)(r.shape, DType::F32, r.axis) == r.expected);
  }
  // dtype plays no part
  CHECK(ds::FixedShardsPartitioner(2)({10, 3}, DType::I8) == Partitions{2, 1});
}

TEST_CASE("MinSizePartitioner: max(1, min(rows, max_shards, ceil(bytes / min_shard_bytes)))") {
  struct Row {
    std::int64_t min_shard_bytes, max_shards;
    Shape shape;
    DType dtype;
    Partitions expected;
  };
  const std::vector<Row> rows = {
      // The seed's Embedding(1024, 1024) float32: 4 MiB / 256 KiB = 16, capped by max_shards 2.
      {256 << 10, 2, {1024, 1024}, DType::F32, {2, 1}},
      // TF's docstring: (6, 1) float32 is 24 bytes, 24 / 4 = 6 shards; capped by 2, then by 10 -> 6.
      {4, 2, {6, 1}, DType::F32, {2, 1}},
      {4, 10, {6, 1}, DType::F32, {6, 1}},
      // 4 MiB / 256 KiB = 16 < 100 and < 1024 rows.
      {256 << 10, 100, {1024, 1024}, DType::F32, {16, 1}},
      // 1000 * 100 * 8 = 800000 bytes; 800000 / 262144 = 3.05 -> 4.
      {256 << 10, 100, {1000, 100}, DType::F64, {4, 1}},
      // 3 * 1000 * 4 = 12000 bytes; 12000 / 1000 = 12, but only 3 rows.
      {1000, 50, {3, 1000}, DType::F32, {3, 1}},
      // 10 * 10 * 4 = 400 bytes: far below 256 KiB -> one shard.
      {256 << 10, 8, {10, 10}, DType::F32, {1, 1}},
      // int8: 256 * 1024 = 262144 bytes is exactly one minimum shard; one row more needs two.
      {256 << 10, 4, {256, 1024}, DType::I8, {1, 1}},
      {256 << 10, 4, {257, 1024}, DType::I8, {2, 1}},
      // 40 rows of 4 bytes = 160 bytes over min 16 -> 10 shards, rank 1.
      {16, 64, {40}, DType::I32, {10}},
  };
  for (const auto& r : rows) {
    CAPTURE(r.min_shard_bytes);
    CAPTURE(r.max_shards);
    CAPTURE(ds::shape_string(r.shape));
    CHECK(ds::MinSizePartitioner(r.min_shard_bytes, r.max_shards)(r.shape, r.dtype) == r.expected);
  }
  // The defaults (256 KiB, at most 1 shard) never split.
  CHECK(ds::MinSizePartitioner()({1024, 1024}, DType::F32) == Partitions{1, 1});
  CHECK(ds::MinSizePartitioner().min_shard_bytes() == 262144);
  CHECK(ds::MinSizePartitioner().max_shards() == 1);
  CHECK(ds::MinSizePartitioner().bytes_per_string() == 16);
}

TEST_CASE("MaxSizePartitioner: ceil(rows / max(1, floor(max_shard_bytes / bytes_per_row))), capped by max_shards") {
  struct Row {
    std::int64_t max_shard_bytes, max_shards;
    Shape shape;
    DType dtype;
    Partitions expected;
  };
  const std::vector<Row> rows = {
      // TF's docstring, (6, 1) float32: a row is 4 bytes.
      {4, 0, {6, 1}, DType::F32, {6, 1}},     // 1 row per shard -> 6
      {4, 2, {6, 1}, DType::F32, {2, 1}},     // ... capped by max_shards
      {1024, 0, {6, 1}, DType::F32, {1, 1}},  // 256 rows fit -> 1
      // (10, 30) float32: a row is 120 bytes. 1000 / 120 = 8 rows per shard -> ceil(10 / 8) = 2.
      {1000, 0, {10, 30}, DType::F32, {2, 1}},
      // A row (120 bytes) larger than the limit still gets a shard of its own: 10 shards.
      {100, 0, {10, 30}, DType::F32, {10, 1}},
      // (1 << 20, 64) float32, rows of 256 bytes, limit just under 64 MiB: floor(67108863 / 256) =
      // 262143 rows per shard, and 4 * 262143 = 1048572 < 1048576 -> 5 shards.
      {(64 << 20) - 1, 0, {1 << 20, 64}, DType::F32, {5, 1}},
      {(64 << 20) - 1, 3, {1 << 20, 64}, DType::F32, {3, 1}},
      // float64 (10, 10): rows of 80 bytes; 800 holds all 10 rows, 799 only 9 -> 2 shards.
      {800, 0, {10, 10}, DType::F64, {1, 1}},
      {799, 0, {10, 10}, DType::F64, {2, 1}},
      // rank 3 (8, 2, 2) int16: rows of 8 bytes, 16 / 8 = 2 rows per shard -> 4.
      {16, 0, {8, 2, 2}, DType::I16, {4, 1, 1}},
  };
  for (const auto& r : rows) {
    CAPTURE(r.max_shard_bytes);
    CAPTURE(r.max_shards);
    CAPTURE(ds::shape_string(r.shape));
    CHECK(ds::MaxSizePartitioner(r.max_shard_bytes, r.max_shards)(r.shape, r.dtype) == r.expected);
  }
  CHECK(ds::MaxSizePartitioner(16)({}, DType::F32) == Partitions{});
  CHECK(ds::MaxSizePartitioner(16)({0, 4}, DType::F32) == Partitions{1, 1});
}

TEST_CASE("partitioners reject invalid arguments, naming them") {
  CHECK_THROWS_WITH_AS(ds::FixedShardsPartitioner(0), "FixedShardsPartitioner: num_shards must be positive, got 0",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(ds::MinSizePartitioner(0), "MinSizePartitioner: min_shard_bytes must be positive, got 0",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(ds::MinSizePartitioner(1024, 0), "MinSizePartitioner: max_shards must be positive, got 0",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(ds::MinSizePartitioner(1024, 2, -3), "MinSizePartitioner: bytes_per_string must be positive, got -3",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(ds::MaxSizePartitioner(0), "MaxSizePartitioner: max_shard_bytes must be positive, got 0",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(ds::MaxSizePartitioner(64, -1),
                       "MaxSizePartitioner: max_shards must be positive (or 0 for no limit), got -1", ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(ds::MaxSizePartitioner(64, 0, 0), "MaxSizePartitioner: bytes_per_string must be positive, got 0",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(ds::FixedShardsPartitioner(2)({4, 4}, DType::F32, 2),
                       "FixedShardsPartitioner: axis 2 is out of range for shape (4, 4) (rank 2)", ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(ds::MinSizePartitioner(4, 2)({-1, 4}, DType::F32),
                       "MinSizePartitioner: shape (-1, 4) has a negative dimension", ds::InvalidArgument);
}

TEST_CASE("shards_along_first_axis checks a partitioner's answer as ParameterServerStrategy does") {
  CHECK(ds::shards_along_first_axis({2, 1}, {10, 3}) == 2);
  CHECK(ds::shards_along_first_axis({4}, {3}) == 3);  // clamped to the rows
  CHECK(ds::shards_along_first_axis({}, {}) == 1);    // a scalar is never split
  CHECK(ds::shards_along_first_axis({1, 1}, {10, 3}) == 1);
  CHECK_THROWS_WITH_AS(ds::shards_along_first_axis({2, 2}, {4, 4}),
                       "variable partitioner returned [2, 2] for shape (4, 4); it must return one entry per dimension, "
                       "a positive first entry and 1 for every other axis (only axis 0 can be partitioned)",
                       ds::InvalidArgument);
  CHECK_THROWS_AS(ds::shards_along_first_axis({0, 1}, {4, 4}), ds::InvalidArgument);
  CHECK_THROWS_AS(ds::shards_along_first_axis({2}, {4, 4}), ds::InvalidArgument);
}

// ---------------------------------------------------------------------------------------------
// The div rule

TEST_CASE("the div rule: contiguous shards, the first rows % shards one row longer") {
  using V = std::vector<std::int64_t>;
  CHECK(ds::shard_row_counts(13, 5) == V{3, 3, 3, 2, 2});  // TF's example: [[0,1,2],[3,4,5],[6,7,8],[9,10],[11,12]]
  CHECK(ds::shard_row_offsets(13, 5) == V{0, 3, 6, 9, 11, 13});
  CHECK(ds::shard_row_counts(10, 4) == V{3, 3, 2, 2});  // TF's comment: offsets 0, 3, 6, 8, 10
  CHECK(ds::shard_row_offsets(10, 4) == V{0, 3, 6, 8, 10});
  CHECK(ds::shard_row_counts(1024, 2) == V{512, 512});
  CHECK(ds::shard_row_counts(12, 3) == V{4, 4, 4});
  CHECK(ds::shard_row_counts(13, 1) == V{13});
  CHECK(ds::shard_row_counts(5, 5) == V{1, 1, 1, 1, 1});
  CHECK(ds::shard_row_counts(0, 1) == V{0});
  CHECK_THROWS_WITH_AS(ds::shard_row_counts(3, 5), "shard_row_counts: cannot split 3 rows into 5 shards; every shard needs a row",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(ds::shard_row_counts(5, 0), "shard_row_counts: shards must be positive, got 0", ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(ds::shard_row_counts(-1, 1), "shard_row_counts: rows must not be negative, got -1",
                       ds::InvalidArgument);
}

// ---------------------------------------------------------------------------------------------
// ShardedVariable

TEST_CASE("a ShardedVariable splits its value by the div rule and concatenates it back") {
  const auto table = iota_table(13, 2);
  ds::ShardedVariable<ds::Tensor<float>> emb(table, 5, {.name = "emb"});
  REQUIRE(emb.num_shards() == 5);
  CHECK(emb.name() == "emb");
  CHECK(emb.shape() == Shape{13, 2});
  CHECK(emb.dtype() == DType::F32);
  CHECK(emb.row_offsets() == std::vector<std::int64_t>{0, 3, 6, 9, 11, 13});
  const std::vector<Shape> shard_shapes = {{3, 2}, {3, 2}, {3, 2}, {2, 2}, {2, 2}};
  for (std::size_t i = 0; i < 5; ++i) {
    CHECK(emb.variables()[i].shape() == shard_shapes[i]);
    CHECK(emb.variables()[i].name() == "emb/part_" + std::to_string(i));
    CHECK(!emb.variables()[i].is_distributed());  // outside any scope: plain shards
  }
  // Shard 3 holds rows 9 and 10.
  CHECK(emb.variables()[3].read_value() == ds::Tensor<float>({2, 2}, {18, 19, 20, 21}));
  CHECK(emb.to_tensor() == table);
  CHECK(emb.read_value() == table);

  // Never more shards than rows; a handle: copies share the shards.
  ds::ShardedVariable<ds::Tensor<float>> few(iota_table(2, 3), 8, {.name = "few"});
  CHECK(few.num_shards() == 2);
  auto alias = few;
  alias.assign(ds::Tensor<float>::full({2, 3}, 7.0f));
  CHECK(few.to_tensor() == ds::Tensor<float>::full({2, 3}, 7.0f));
  CHECK(alias == few);
}

TEST_CASE("a ShardedVariable of std::vector shards a rank-1 value") {
  ds::ShardedVariable<std::vector<double>> v(std::vector<double>{1, 2, 3, 4, 5, 6, 7}, 3, {.name = "v"});
  REQUIRE(v.num_shards() == 3);
  CHECK(v.variables()[0].read_value() == std::vector<double>{1, 2, 3});
  CHECK(v.variables()[1].read_value() == std::vector<double>{4, 5});
  CHECK(v.variables()[2].read_value() == std::vector<double>{6, 7});
  CHECK(v.read_value() == std::vector<double>{1, 2, 3, 4, 5, 6, 7});
  CHECK(v.to_tensor() == ds::Tensor<double>({1, 2, 3, 4, 5, 6, 7}));
  CHECK(v.embedding_lookup(std::vector<std::int64_t>{6, 0, 3}) == ds::Tensor<double>({7, 1, 4}));
}

TEST_CASE("a ShardedVariable wraps existing shards that stack along axis 0") {
  using Var = ds::Variable<ds::Tensor<float>>;
  ds::ShardedVariable<ds::Tensor<float>> sv({Var(iota_table(2, 3)), Var(ds::Tensor<float>::full({3, 3}, 1.0f)),
                                             Var(ds::Tensor<float>::zeros({1, 3}))});
  CHECK(sv.name() == "ShardedVariable");
  CHECK(sv.shape() == Shape{6, 3});
  CHECK(sv.row_offsets() == std::vector<std::int64_t>{0, 2, 5, 6});
  CHECK(sv.to_tensor() == ds::Tensor<float>({6, 3}, {0, 1, 2, 3, 4, 5, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0}));
  // Lookups follow the actual offsets, not the div rule.
  CHECK(sv.embedding_lookup(std::vector<std::int64_t>{5, 1, 2}) ==
        ds::Tensor<float>({3, 3}, {0, 0, 0, 3, 4, 5, 1, 1, 1}));

  CHECK_THROWS_WITH_AS((ds::ShardedVariable<ds::Tensor<float>>({Var(iota_table(2, 3)), Var(iota_table(3, 4))}, "bad")),
                       "ShardedVariable 'bad': shard 1 has shape (3, 4) which does not stack with shard 0's (2, 3); all "
                       "dimensions but the first must match",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(ds::ShardedVariable<ds::Tensor<float>>(std::vector<Var>{}, "none"),
                       "ShardedVariable 'none': needs at least one shard", ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(ds::ShardedVariable<ds::Tensor<float>>(iota_table(4, 2), 0, {.name = "zero"}),
                       "ShardedVariable 'zero': num_shards must be positive, got 0", ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(ds::ShardedVariable<float>(1.0f, 2, {.name = "s"}),
                       "ShardedVariable 's': a scalar cannot be split into 2 shards", ds::InvalidArgument);
}

TEST_CASE("ShardedVariable assign, assign_add and assign_sub update every shard with its rows") {
  ds::ShardedVariable<ds::Tensor<float>> sv(ds::Tensor<float>::zeros({5, 2}), 2, {.name = "w"});
  sv.assign(iota_table(5, 2));
  CHECK(sv.to_tensor() == iota_table(5, 2));
  CHECK(sv.variables()[1].read_value() == ds::Tensor<float>({2, 2}, {6, 7, 8, 9}));
  sv.assign_add(ds::Tensor<float>::full({5, 2}, 1.0f));
  sv.assign_sub(ds::Tensor<float>::full({5, 2}, 0.5f));
  std::vector<float> expected(10);
  std::iota(expected.begin(), expected.end(), 0.5f);
  CHECK(sv.to_tensor() == ds::Tensor<float>({5, 2}, expected));
  CHECK_THROWS_WITH_AS(sv.assign(iota_table(4, 2)),
                       "assign: value of shape (4, 2) does not match sharded variable 'w' of shape (5, 2)",
                       ds::InvalidArgument);
}

TEST_CASE("ShardedVariable::assign_rows writes rows across shard boundaries and checks bounds") {
  // 13 rows in 5 shards: [0,3) [3,6) [6,9) [9,11) [11,13).
  ds::ShardedVariable<ds::Tensor<float>> sv(ds::Tensor<float>::zeros({13, 2}), 5, {.name = "t"});
  // Rows 2..9: the end of shard 0, all of shards 1 and 2, the start of shard 3.
  const auto patch = ds::Tensor<float>::full({8, 2}, 1.0f);
  sv.assign_rows(2, patch);
  std::vector<float> expected(26, 0.0f);
  for (std::size_t i = 2 * 2; i < 10 * 2; ++i) expected[i] = 1.0f;
  CHECK(sv.to_tensor() == ds::Tensor<float>({13, 2}, expected));
  sv.assign_rows(12, ds::Tensor<float>({1, 2}, {5, 6}));  // the last row
  CHECK(sv.variables()[4].read_value() == ds::Tensor<float>({2, 2}, {0, 0, 5, 6}));
  sv.assign_rows(0, ds::Tensor<float>::zeros({0, 2}));  // nothing to write
  CHECK_THROWS_WITH_AS(sv.assign_rows(12, ds::Tensor<float>::zeros({2, 2})),
                       "assign_rows: rows [12, 14) are out of range for sharded variable 't' with 13 rows",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(sv.assign_rows(-1, ds::Tensor<float>::zeros({1, 2})),
                       "assign_rows: rows [-1, 0) are out of range for sharded variable 't' with 13 rows",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(sv.assign_rows(0, ds::Tensor<float>::zeros({1, 3})),
                       "assign_rows: rows of shape (1, 3) do not fit sharded variable 't' of shape (13, 2); all "
                       "dimensions but the first must match",
                       ds::InvalidArgument);
}

TEST_CASE("embedding_lookup matches a dense lookup over random ids") {
  const std::int64_t rows = 1000, width = 8;
  std::mt19937 rng(20240506);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<float> data(static_cast<std::size_t>(rows * width));
  for (auto& x : data) x = value(rng);
  const ds::Tensor<float> table({rows, width}, data);
  for (std::int64_t shards : {1, 2, 7}) {
    CAPTURE(shards);
    ds::ShardedVariable<ds::Tensor<float>> emb(table, shards, {.name = "emb"});
    std::uniform_int_distribution<std::int64_t> id(0, rows - 1);
    std::vector<std::int64_t> ids(200);
    for (auto& i : ids) i = id(rng);
    ids[1] = ids[0];  // duplicates are looked up twice
    const ds::Tensor<std::int64_t> ids_2d({50, 4}, ids);
    const auto got = emb.embedding_lookup(ids_2d);
    CHECK(got.shape() == Shape{50, 4, width});
    CHECK(got == dense_lookup(table, ids_2d));
    // All ids in one shard, and no ids at all.
    const ds::Tensor<std::int64_t> first_rows({3}, {2, 0, 1});
    CHECK(emb.embedding_lookup(first_rows) == dense_lookup(table, first_rows));
    CHECK(emb.embedding_lookup(std::vector<std::int64_t>{}).shape() == Shape{0, width});
    // int32 ids work the same.
    const std::vector<std::int32_t> small_ids = {999, 0, 500};
    CHECK(emb.embedding_lookup(small_ids) == dense_lookup(table, ds::Tensor<std::int64_t>({3}, {999, 0, 500})));
  }
}

TEST_CASE("embedding_lookup names an out-of-range id") {
  ds::ShardedVariable<ds::Tensor<float>> emb(iota_table(13, 2), 5, {.name = "emb"});
  CHECK_THROWS_WITH_AS(emb.embedding_lookup(std::vector<std::int64_t>{0, 12, 13}),
                       "embedding_lookup: id 13 (at position 2) is out of range for sharded variable 'emb' with 13 rows",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(emb.embedding_lookup(std::vector<std::int64_t>{-1}),
                       "embedding_lookup: id -1 (at position 0) is out of range for sharded variable 'emb' with 13 rows",
                       ds::InvalidArgument);
}

TEST_CASE("embedding lookups from several threads while rows are written stay consistent per row") {
  // Plain shards lock on every read and write, so this is race-free (ThreadSanitizer runs it).
  ds::ShardedVariable<ds::Tensor<float>> emb(ds::Tensor<float>::zeros({64, 4}), 4, {.name = "emb"});
  std::thread writer([&] {
    for (int step = 1; step <= 50; ++step) {
      emb.assign_rows(step % 60, ds::Tensor<float>::full({4, 4}, static_cast<float>(step)));
    }
  });
  std::vector<std::int64_t> ids(64);
  std::iota(ids.begin(), ids.end(), 0);
  for (int i = 0; i < 20; ++i) {
    const auto got = emb.embedding_lookup(ids);
    for (std::int64_t r = 0; r < 64; ++r) {  // a row is written whole, within one shard update
      const auto base = static_cast<std::size_t>(r * 4);
      CHECK(got[base] == got[base + 3]);
    }
  }
  writer.join();
}

// ---------------------------------------------------------------------------------------------
// Placement

TEST_CASE("ps tasks are handed out round-robin with TF's device strings") {
  CHECK(ds::ps_device_string(1) == "/job:ps/replica:0/task:1/device:CPU:0");
  // The seed: four variables over three ps go to tasks 0, 1, 2, 0.
  CHECK(ds::round_robin_ps_devices(4, 3) ==
        std::vector<std::string>{ps_device(0), ps_device(1), ps_device(2), ps_device(0)});
  CHECK(ds::round_robin_ps_devices(0, 2).empty());

  ds::RoundRobinPlacement placement(3);
  std::vector<std::thread> threads;
  std::vector<std::map<int, int>> seen(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 300; ++i) ++seen[static_cast<std::size_t>(t)][placement.next_task()];
    });
  }
  for (auto& th : threads) th.join();
  std::map<int, int> total;
  for (const auto& s : seen) {
    for (auto [task, n] : s) total[task] += n;
  }
  CHECK(total == std::map<int, int>{{0, 400}, {1, 400}, {2, 400}});  // 1200 turns, evenly
  CHECK(placement.variables_placed() == 1200);

  CHECK_THROWS_WITH_AS(ds::RoundRobinPlacement(0), "RoundRobinPlacement: needs at least one ps task, got 0",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(ds::ps_device_string(-1), "ps_device_string: task -1 is negative", ds::InvalidArgument);
}

// ---------------------------------------------------------------------------------------------
// ParameterServerStrategy (in-process skeleton)

TEST_CASE("ParameterServerStrategy places variables created in scope on ps tasks round-robin") {
  ds::ParameterServerStrategy strategy(ps_cluster(3, 2), {}, kPlacementOnly);
  CHECK(strategy.name() == "ParameterServerStrategy");
  CHECK(strategy.num_ps() == 3);
  CHECK(strategy.num_workers() == 2);
  CHECK(strategy.num_replicas_in_sync() == 1);
  REQUIRE(strategy.cluster_resolver() != nullptr);
  CHECK(strategy.cluster_resolver()->task_type() == "chief");

  // The seed's example: v1 outside scope stays on the coordinator, v2..v5 go round-robin.
  ds::Variable<float> v1(0.0f, {.name = "v1"});
  std::vector<ds::Variable<float>> in_scope;
  {
    auto scope = strategy.scope();
    CHECK(&ds::get_strategy() == &strategy);
    for (int i = 2; i <= 5; ++i) in_scope.emplace_back(static_cast<float>(i - 1), ds::VariableOptions{.name = "v" + std::to_string(i)});
  }
  CHECK(!v1.is_distributed());
  CHECK(v1.device() == "/job:localhost/replica:0/task:0/device:CPU:0");
  CHECK(in_scope[0].device() == ps_device(0));
  CHECK(in_scope[1].device() == ps_device(1));
  CHECK(in_scope[2].device() == ps_device(2));
  CHECK(in_scope[3].device() == ps_device(0));
  for (auto& v : in_scope) {
    CHECK(v.is_distributed());
    CHECK(v.strategy_id() == strategy.id());
    CHECK(v.values().size() == 1);  // one copy, on its ps task
  }
  // The coordinator reads and updates them directly (outside any step function).
  in_scope[3].assign_add(10.0f);
  CHECK(in_scope[3].read_value() == 14.0f);
}

TEST_CASE("ParameterServerStrategy partitions variables created in scope: the seed's embedding") {
  ds::ParameterServerStrategy strategy(ps_cluster(3, 1), ds::MinSizePartitioner(256 << 10, 2), kPlacementOnly);
  auto scope = strategy.scope();
  ds::ShardedVariable<ds::Tensor<float>> embedding(ds::Tensor<float>::zeros({1024, 1024}), {.name = "embedding"});
  REQUIRE(embedding.variables().size() == 2);
  CHECK(embedding.variables()[0].shape() == Shape{512, 1024});
  CHECK(embedding.variables()[1].shape() == Shape{512, 1024});
  CHECK(embedding.variables()[0].name() == "embedding/part_0");
  CHECK(embedding.devices() == std::vector<std::string>{ps_device(0), ps_device(1)});
  CHECK(embedding.shape() == Shape{1024, 1024});

  // Small variables are not partitioned; they take the next turn.
  ds::ShardedVariable<ds::Tensor<float>> bias(ds::Tensor<float>::zeros({10}), {.name = "bias"});
  CHECK(bias.num_shards() == 1);
  CHECK(bias.variables()[0].name() == "bias");
  CHECK(bias.devices() == std::vector<std::string>{ps_device(2)});
  ds::Variable<float> step(0.0f, {.name = "step"});
  CHECK(step.device() == ps_device(0));
}

TEST_CASE("ParameterServerStrategy with FixedShardsPartitioner: 13 rows over 5 shards, each shard its own turn") {
  ds::ParameterServerStrategy strategy(ps_cluster(3, 2), ds::FixedShardsPartitioner(5), kPlacementOnly);
  const auto table = iota_table(13, 3);
  std::optional<ds::ShardedVariable<ds::Tensor<float>>> emb;
  {
    auto scope = strategy.scope();
    emb.emplace(table, ds::VariableOptions{.name = "emb"});
    // A scalar is never partitioned.
    ds::ShardedVariable<float> scalar(1.0f, {.name = "scalar"});
    CHECK(scalar.num_shards() == 1);
    CHECK(scalar.devices() == std::vector<std::string>{ps_device(2)});  // the 6th turn
  }
  REQUIRE(emb->num_shards() == 5);
  CHECK(emb->row_offsets() == std::vector<std::int64_t>{0, 3, 6, 9, 11, 13});
  CHECK(emb->devices() ==
        std::vector<std::string>{ps_device(0), ps_device(1), ps_device(2), ps_device(0), ps_device(1)});
  CHECK(emb->to_tensor() == table);
  const ds::Tensor<std::int64_t> ids({4}, {12, 0, 9, 5});
  CHECK(emb->embedding_lookup(ids) == dense_lookup(table, ids));

  // Outside the scope a ShardedVariable is one plain shard.
  ds::ShardedVariable<ds::Tensor<float>> outside(table, {.name = "outside"});
  CHECK(outside.num_shards() == 1);
  CHECK(!outside.variables()[0].is_distributed());
}

TEST_CASE("ParameterServerStrategy rejects a partitioner that splits another axis") {
  ds::ParameterServerStrategy strategy(ps_cluster(2, 1), [](const Shape& shape, DType) {
    return Partitions(shape.size(), 2);
  }, kPlacementOnly);
  auto scope = strategy.scope();
  CHECK_THROWS_WITH_AS(ds::ShardedVariable<ds::Tensor<float>>(iota_table(4, 4), {.name = "w"}),
                       "variable partitioner returned [2, 2] for shape (4, 4); it must return one entry per dimension, "
                       "a positive first entry and 1 for every other axis (only axis 0 can be partitioned)",
                       ds::InvalidArgument);
}

TEST_CASE("ParameterServerStrategy needs a chief, a ps and a worker task") {
  using Jobs = ds::ClusterSpec::DenseJobs;
  auto make = [](const Jobs& jobs, const char* type) {
    return ds::ParameterServerStrategy(std::make_shared<ds::SimpleClusterResolver>(ds::ClusterSpec(jobs), type, 0), ds::VariablePartitioner{},
                                      kPlacementOnly);
  };
  CHECK_THROWS_WITH_AS(make({{"chief", {"h:1"}}, {"worker", {"h:2"}}}, "chief"),
                       "ParameterServerStrategy: the cluster (jobs: chief, worker) has no 'ps' task; there must be at "
                       "least one parameter server",
                       ds::ClusterConfigError);
  CHECK_THROWS_WITH_AS(make({{"chief", {"h:1"}}, {"ps", {"h:2"}}}, "chief"),
                       "ParameterServerStrategy: the cluster (jobs: chief, ps) has no 'worker' task; there must be at "
                       "least one worker",
                       ds::ClusterConfigError);
  CHECK_THROWS_WITH_AS(make({{"ps", {"h:2"}}, {"worker", {"h:3"}}}, "worker"),
                       "ParameterServerStrategy: the cluster (jobs: ps, worker) has 0 'chief' tasks; it needs exactly "
                       "one, the coordinator",
                       ds::ClusterConfigError);
  CHECK_THROWS_WITH_AS(make({{"chief", {"h:1"}}, {"ps", {"h:2"}}, {"worker", {"h:3"}}, {"trainer", {"h:4"}}}, "chief"),
                       "ParameterServerStrategy: the cluster has a job 'trainer'; the allowed jobs are 'chief', 'ps', "
                       "'worker' and 'evaluator'",
                       ds::ClusterConfigError);
  CHECK_THROWS_WITH_AS(
      ds::ParameterServerStrategy(std::make_shared<ds::SimpleClusterResolver>(ds::ClusterSpec(), "worker", 0)),
      "ParameterServerStrategy: the cluster spec is empty; parameter-server training needs a 'chief' (the "
      "coordinator), at least one 'ps' and at least one 'worker' task",
      ds::ClusterConfigError);
}

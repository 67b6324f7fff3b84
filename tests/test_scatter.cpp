// ReplicaContext::reduce_scatter, all_to_all and broadcast on the host strategies (threads):
// exact values, uneven splits, 1..4 replicas, every cross-device ops policy, mismatch errors.
#include <distribute/distribute.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace ds = distribute;

namespace {

// Rows of part i when d rows are cut into n parts, written out as np.array_split documents it
// (the first d % n parts get ceil(d / n) rows, the rest floor(d / n)).
std::int64_t rows_of(std::int64_t d, int n, int i) {
  const std::int64_t floor = d / n, ceil = (d + n - 1) / n;
  return i < d % n ? ceil : floor;
}

// Replica r's input to reduce_scatter: element k is (r + 1) * 1000 + k.
std::vector<std::int64_t> scatter_input(int r, std::int64_t count) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(count));
  for (std::int64_t k = 0; k < count; ++k) v[static_cast<std::size_t>(k)] = (r + 1) * 1000 + k;
  return v;
}

template <class Ops>
void check_reduce_scatter_exact() {
  for (int n = 1; n <= 4; ++n) {
    for (std::int64_t count : {0, 1, 3, 10, 1001}) {
      CAPTURE(n);
      CAPTURE(count);
      ds::MirroredStrategy<ds::host, Ops> strategy(n);
      auto sums = strategy.run([&](ds::ReplicaContext& ctx) {
        return ctx.reduce_scatter(ds::ReduceOp::Sum, scatter_input(ctx.replica_id_in_sync_group(), count));
      });
      auto maxima = strategy.run([&](ds::ReplicaContext& ctx) {
        const auto in = scatter_input(ctx.replica_id_in_sync_group(), count);
        return ctx.reduce_scatter("max", in);  // an lvalue: left as it is
      });
      std::int64_t begin = 0;
      for (int i = 0; i < n; ++i) {
        const std::int64_t rows = rows_of(count, n, i);
        REQUIRE(sums[static_cast<std::size_t>(i)].size() == static_cast<std::size_t>(rows));
        REQUIRE(maxima[static_cast<std::size_t>(i)].size() == static_cast<std::size_t>(rows));
        for (std::int64_t k = 0; k < rows; ++k) {
          // sum over r of (r + 1) * 1000 + (begin + k)
          CHECK(sums[static_cast<std::size_t>(i)][static_cast<std::size_t>(k)] == 1000 * n * (n + 1) / 2 + n * (begin + k));
          CHECK(maxima[static_cast<std::size_t>(i)][static_cast<std::size_t>(k)] == n * 1000 + begin + k);
        }
        begin += rows;
      }
    }
  }
}

}  // namespace

TEST_CASE("reduce_scatter: exact sums and maxima, np.array_split's parts, 1..4 replicas, every policy") {
  check_reduce_scatter_exact<ds::SharedMemoryAllReduce>();
  check_reduce_scatter_exact<ds::ReductionToOneDevice>();
  check_reduce_scatter_exact<ds::HierarchicalCopyAllReduce>();
}

TEST_CASE("reduce_scatter of a [7, 3] tensor over 3 replicas: rows 3, 2, 2, MEAN exact in float64") {
  ds::MirroredStrategy<ds::host> strategy(3);
  auto out = strategy.run([](ds::ReplicaContext& ctx) {
    std::vector<double> data(21);
    for (int k = 0; k < 21; ++k) data[static_cast<std::size_t>(k)] = k + 3.0 * ctx.replica_id_in_sync_group();
    return ctx.reduce_scatter(ds::ReduceOp::Mean, ds::Tensor<double>({7, 3}, data));
  });
  const std::vector<std::int64_t> rows = {3, 2, 2};
  std::int64_t first = 0;
  for (int i = 0; i < 3; ++i) {
    const auto& t = out[static_cast<std::size_t>(i)];
    CHECK(t.shape() == std::vector<std::int64_t>{rows[static_cast<std::size_t>(i)], 3});
    for (std::int64_t k = 0; k < static_cast<std::int64_t>(t.size()); ++k) {
      CHECK(t.data()[k] == static_cast<double>(first + k) + 3.0);  // mean of +0, +3, +6
    }
    first += rows[static_cast<std::size_t>(i)] * 3;
  }
}

TEST_CASE("reduce_scatter mismatches: InvalidArgument on every replica, naming both sides") {
  ds::MirroredStrategy<ds::host> strategy(2);
  auto message = [&](auto&& step) {
    try {
      strategy.run(step);
    } catch (const ds::InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(message([](ds::ReplicaContext& ctx) {
          return ctx.reduce_scatter(ds::ReduceOp::Sum, std::vector<float>(ctx.replica_id_in_sync_group() == 0 ? 10 : 9));
        }) == "reduce_scatter: replica 0 passes float32 of shape (10,) but replica 1 passes float32 of shape (9,)");
  CHECK(message([](ds::ReplicaContext& ctx) {
          return ctx.reduce_scatter(ctx.replica_id_in_sync_group() == 0 ? ds::ReduceOp::Sum : ds::ReduceOp::Max,
                                    std::vector<float>(4));
        }) == "reduce_scatter: replica 0 reduces with SUM but replica 1 with MAX");
  CHECK(message([](ds::ReplicaContext& ctx) { return ctx.reduce_scatter(ds::ReduceOp::Sum, 1.5f); }) ==
        "reduce_scatter: a scalar cannot be split across replicas; pass a value of rank >= 1 (split along axis 0)");
  // The strategy stays usable after each failed step.
  auto ok = strategy.run([](ds::ReplicaContext& ctx) { return ctx.reduce_scatter(ds::ReduceOp::Sum, std::vector<int>{1, 2}); });
  CHECK(ok[0] == std::vector<int>{2});
  CHECK(ok[1] == std::vector<int>{4});
}

TEST_CASE("all_to_all of one value split along axis 0: uneven lengths per replica, exact pieces, 1..4 replicas") {
  for (int n = 1; n <= 4; ++n) {
    CAPTURE(n);
    ds::MirroredStrategy<ds::host> strategy(n);
    // Replica r sends a [2r + 3, 2] value; element (row, c) = r * 1000 + row * 10 + c.
    auto out = strategy.run([](ds::ReplicaContext& ctx) {
      const int r = ctx.replica_id_in_sync_group();
      const std::int64_t rows = 2 * r + 3;
      std::vector<std::int32_t> data;
      for (std::int64_t row = 0; row < rows; ++row) {
        for (int c = 0; c < 2; ++c) data.push_back(static_cast<std::int32_t>(r * 1000 + row * 10 + c));
      }
      return ctx.all_to_all(ds::Tensor<std::int32_t>({rows, 2}, data));
    });
    for (int i = 0; i < n; ++i) {
      std::vector<std::int32_t> expect;
      std::int64_t total_rows = 0;
      for (int r = 0; r < n; ++r) {
        const std::int64_t rows = 2 * r + 3;
        std::int64_t begin = 0;
        for (int j = 0; j < i; ++j) begin += rows_of(rows, n, j);
        for (std::int64_t row = begin; row < begin + rows_of(rows, n, i); ++row) {
          for (int c = 0; c < 2; ++c) expect.push_back(static_cast<std::int32_t>(r * 1000 + row * 10 + c));
        }
        total_rows += rows_of(rows, n, i);
      }
      const auto& got = out[static_cast<std::size_t>(i)];
      CHECK(got.shape() == std::vector<std::int64_t>{total_rows, 2});
      CHECK(std::vector<std::int32_t>(got.data(), got.data() + got.size()) == expect);
    }
  }
}

TEST_CASE("all_to_all of a list of values: replica i gets every replica's i-th value, shapes may differ") {
  for (int n = 1; n <= 4; ++n) {
    CAPTURE(n);
    ds::MirroredStrategy<ds::host> strategy(n);
    // Replica r's value j: length r + j, elements 100 * r + j.
    auto out = strategy.run([n](ds::ReplicaContext& ctx) {
      const int r = ctx.replica_id_in_sync_group();
      std::vector<std::vector<float>> values;
      for (int j = 0; j < n; ++j) values.emplace_back(static_cast<std::size_t>(r + j), static_cast<float>(100 * r + j));
      return ctx.all_to_all(values);
    });
    for (int i = 0; i < n; ++i) {
      const auto& got = out[static_cast<std::size_t>(i)];
      REQUIRE(got.size() == static_cast<std::size_t>(n));
      for (int r = 0; r < n; ++r) {
        CHECK(got[static_cast<std::size_t>(r)] == std::vector<float>(static_cast<std::size_t>(r + i), static_cast<float>(100 * r + i)));
      }
    }
  }
}

TEST_CASE("all_to_all mismatches: wrong count, dtypes, other axes, list against split; InvalidArgument") {
  ds::MirroredStrategy<ds::host> strategy(3);
  auto message = [&](auto&& step) {
    try {
      strategy.run(step);
    } catch (const ds::InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(message([](ds::ReplicaContext& ctx) {
          return ctx.all_to_all(std::vector<std::vector<float>>(ctx.replica_id_in_sync_group() == 1 ? 2 : 3));
        }) == "all_to_all: replica 1 passed 2 values but there are 3 replicas in sync; pass one value per replica (the "
              "i-th goes to replica i)");
  CHECK(message([](ds::ReplicaContext& ctx) {
          if (ctx.replica_id_in_sync_group() == 2) return ctx.all_to_all(std::vector<double>(3)).size();
          return ctx.all_to_all(std::vector<float>(3)).size();
        }) == "all_to_all: value 0 of replica 2 is float64 but value 0 of replica 0 is float32");
  CHECK(message([](ds::ReplicaContext& ctx) {
          const std::int64_t cols = ctx.replica_id_in_sync_group() == 1 ? 4 : 2;
          return ctx.all_to_all(ds::Tensor<float>::zeros({3, cols})).size();
        }) == "all_to_all: replica 1 splits a value whose rows have shape (4,) but replica 0 one whose rows have shape "
              "(2,): values split along axis 0 must agree in the other axes");
  CHECK(message([](ds::ReplicaContext& ctx) {
          if (ctx.replica_id_in_sync_group() == 0) return ctx.all_to_all(std::vector<float>(3)).size();
          return ctx.all_to_all(std::vector<std::vector<float>>(3)).size();
        }) == "all_to_all: replica 0 passed one value to split but replica 1 passed a list of values");
  CHECK(message([](ds::ReplicaContext& ctx) { return ctx.all_to_all(2.0f).size(); }) ==
        "all_to_all: a scalar cannot be split across replicas; pass a value of rank >= 1 (split along axis 0)");
}

TEST_CASE("broadcast for users: every root of 1..4 replicas, a Tensor, and a root out of range") {
  for (int n = 1; n <= 4; ++n) {
    ds::MirroredStrategy<ds::host> strategy(n);
    for (int root = 0; root < n; ++root) {
      CAPTURE(n);
      CAPTURE(root);
      auto out = strategy.run([root](ds::ReplicaContext& ctx) {
        const auto r = static_cast<float>(ctx.replica_id_in_sync_group());
        return ctx.broadcast(ds::Tensor<float>({2, 2}, {r, r + 1, r + 2, r + 3}), root);
      });
      for (const auto& t : out.values()) {
        const auto f = static_cast<float>(root);
        CHECK(t == ds::Tensor<float>({2, 2}, {f, f + 1, f + 2, f + 3}));
      }
    }
  }
  ds::MirroredStrategy<ds::host> strategy(2);
  CHECK_THROWS_WITH_AS(strategy.run([](ds::ReplicaContext& ctx) { return ctx.broadcast(1.0f, 2); }),
                       "broadcast: root 2 is not a replica id (0..1)", ds::InvalidArgument);
}

// One worker process of the multi-worker tests (tests/test_multi_worker.cpp, test_multi_worker_scatter.cpp,
// test_mpi.cpp). Reads TF_CONFIG like a user's program, runs a scenario, checks its own results
// against exact expected values and prints what it saw. One program for every scenario: it is
// compiled three times (plain, Open MPI, MPICH), and each compile parses the whole library.
//   multi_worker_helper SCENARIO LOCAL_REPLICAS
// TEST_IMPLEMENTATION=MPI: the workers talk through MPI (built with MPI: started by mpirun).
// Exit codes: 0 ok, 1 wrong result, 3 PeerFailure/CollectiveTimeout, 4 InvalidArgument, 5 other error.
#define DISTRIBUTE_WITH_MULTI_WORKER
#include <distribute/distribute.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "../examples/common/logistic_model.hpp"
#include "support/tensor_types.hpp"

namespace ds = distribute;
using Strategy = ds::MultiWorkerMirroredStrategy<ds::host>;

namespace {
int failures = 0;
template <class A, class B>
void expect_eq(const A& got, const B& want, std::string_view what) {
  if (!(got == want)) {
    fmt::print("MISMATCH {}: got {} want {}\n", what, got, want);
    ++failures;
  }
}

void collectives(Strategy& s) {
  const int n = s.num_replicas_in_sync();
  const long tri = static_cast<long>(n) * (n - 1) / 2;  // sum of replica ids
  auto out = s.run([&](ds::ReplicaContext& ctx) {
    const int r = ctx.replica_id_in_sync_group();
    std::vector<std::int64_t> v{r, 1, 2 * r};
    std::vector<double> big(100003);
    for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<double>(i % 13) * (r + 1);
    auto [sum, sum_big] = ctx.all_reduce("sum", v, big);
    auto mx = ctx.all_reduce("max", v);
    auto mn = ctx.all_reduce("min", v);
    auto prod = ctx.all_reduce("product", std::vector<std::int64_t>{r + 1});
    auto mean = ctx.all_reduce("mean", std::vector<double>{double(r)});
    // Uneven all_gather: replica r contributes r+1 rows of 2.
    ds::Tensor<int> rows({r + 1, 2}, std::vector<int>(static_cast<std::size_t>(2 * (r + 1)), r));
    auto gathered = ctx.all_gather(rows, 0);
    auto from_last = ctx.broadcast(std::vector<int>{r * 10}, n - 1);
    return std::make_tuple(sum, sum_big, mx, mn, prod, mean, gathered, from_last);
  });
  long fact = 1;
  for (int k = 1; k <= n; ++k) fact *= k;
  std::vector<int> rows_want;
  for (int r = 0; r < n; ++r) rows_want.insert(rows_want.end(), static_cast<std::size_t>(2 * (r + 1)), r);
  for (std::size_t i = 0; i < std::get<0>(out).size(); ++i) {
    expect_eq(std::get<0>(out)[i], std::vector<std::int64_t>{tri, n, 2 * tri}, "sum");
    bool big_ok = true;
    for (std::size_t k = 0; k < std::get<1>(out)[i].size(); ++k) {
      big_ok = big_ok && std::get<1>(out)[i][k] == static_cast<double>(k % 13) * (n * (n + 1) / 2);
    }
    expect_eq(big_ok, true, "sum of 100003 doubles");
    expect_eq(std::get<2>(out)[i], std::vector<std::int64_t>{n - 1, 1, 2 * (n - 1)}, "max");
    expect_eq(std::get<3>(out)[i], std::vector<std::int64_t>{0, 1, 0}, "min");
    expect_eq(std::get<4>(out)[i], std::vector<std::int64_t>{fact}, "product");
    expect_eq(std::get<5>(out)[i], std::vector<double>{double(tri) / n}, "mean");
    expect_eq(std::get<6>(out)[i].values(), rows_want, "all_gather uneven");
    expect_eq(std::get<6>(out)[i].shape(), ds::Shape{static_cast<std::int64_t>(rows_want.size() / 2), 2}, "all_gather shape");
    expect_eq(std::get<7>(out)[i], std::vector<int>{(n - 1) * 10}, "broadcast");
  }
  // Cross-replica reduce and gather through the strategy see every worker's replicas.
  auto ids = s.run([](ds::ReplicaContext& ctx) { return ctx.replica_id_in_sync_group(); });
  expect_eq(s.reduce("sum", ids), static_cast<int>(tri), "strategy.reduce sum");
  expect_eq(s.reduce("max", ids), n - 1, "strategy.reduce max");
  auto batches = s.run([](ds::ReplicaContext& ctx) {
    const int r = ctx.replica_id_in_sync_group();
    return std::vector<double>(static_cast<std::size_t>(r % 2 ? 1 : 3), double(r));  // uneven last batch
  });
  double total = 0, count = 0;
  for (int r = 0; r < n; ++r) total += (r % 2 ? 1 : 3) * double(r), count += (r % 2 ? 1 : 3);
  expect_eq(s.reduce("mean", batches, 0)[0], total / count, "strategy.reduce mean axis 0");
  std::vector<int> all_ids(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) all_ids[static_cast<std::size_t>(r)] = r;
  auto as_vec = s.run([](ds::ReplicaContext& ctx) { return std::vector<int>{ctx.replica_id_in_sync_group()}; });
  expect_eq(s.gather(as_vec, 0), all_ids, "strategy.gather");
  // Variables start from the chief's value on every worker.
  auto scope = s.scope();
  ds::Variable<std::vector<float>> w(std::vector<float>{float(s.worker_index()) + 1, 7}, {.name = "w"});
  for (const auto& copy : w.values()) expect_eq(copy, std::vector<float>{1, 7}, "variable initial value from the chief");
  ds::Variable<float> metric(0.0f, {.name = "metric", .synchronization = ds::VariableSynchronization::OnRead,
                                    .aggregation = ds::VariableAggregation::Sum});
  s.run([&](ds::ReplicaContext& ctx) { metric.assign_add(float(ctx.replica_id_in_sync_group())); });
  expect_eq(metric.read_value(), float(tri), "sync-on-read across workers");
  ds::Variable<float> agg(0.0f, {.name = "agg", .aggregation = ds::VariableAggregation::Sum});
  s.run([&](ds::ReplicaContext& ctx) { agg.assign_add(float(ctx.replica_id_in_sync_group())); });
  expect_eq(agg.read_value(), float(tri), "SUM aggregation across workers");
}
// float16/bfloat16 and a run-time-dtype type (strided views included) across the workers, with
// sums exactly representable in 16 bits so every path (TCP ring, shared memory) must give these bits.
void half_and_runtime_types(Strategy& s) {
  using test_types::DynTensor;
  const int n = s.num_replicas_in_sync();
  const float tri = float(n * (n + 1) / 2);  // sum of r + 1 over the replicas
  auto out = s.run([&](ds::ReplicaContext& ctx) {
    const float r = float(ctx.replica_id_in_sync_group());
    std::vector<ds::bfloat16> b{ds::bfloat16(r + 1), ds::bfloat16(-0.5f), ds::bfloat16(0x1p-8f * (r + 1))};
    std::vector<ds::float16> big(100003, ds::float16(r + 1));
    auto [sum_b, sum_big] = ctx.all_reduce("sum", std::move(b), std::move(big));
    auto mean = ctx.all_reduce("mean", ds::float16(r));
    const float nan = std::numeric_limits<float>::quiet_NaN();
    auto mx = ctx.all_reduce("max", std::vector<ds::float16>{ds::float16(r == 1 ? nan : r)});
    // A transposed bfloat16 view of run-time type, reduced in its own memory.
    DynTensor storage = DynTensor::of<ds::bfloat16>({3, 2}, {ds::bfloat16(r), ds::bfloat16(1.0f), ds::bfloat16(2.0f),
                                                             ds::bfloat16(3.0f), ds::bfloat16(4.0f), ds::bfloat16(5.0f)});
    ctx.all_reduce("sum", storage.transposed());
    DynTensor gathered = ctx.all_gather(DynTensor::of<ds::float16>({1, 1}, {ds::float16(r)}), 1);
    return std::make_tuple(sum_b, sum_big, mean, mx, storage, gathered);
  });
  for (std::size_t i = 0; i < std::get<0>(out).size(); ++i) {
    const auto& sum_b = std::get<0>(out)[i];
    expect_eq(float(sum_b[0]), tri, "bf16 sum");
    expect_eq(float(sum_b[1]), -0.5f * float(n), "bf16 sum of -0.5");
    expect_eq(ds::to_bits(sum_b[2]), ds::to_bits(ds::bfloat16(0x1p-8f * tri)), "bf16 sum of small values");
    bool big_ok = true;
    for (auto x : std::get<1>(out)[i]) big_ok = big_ok && float(x) == tri;
    expect_eq(big_ok, true, "f16 sum of 100003");
    expect_eq(float(std::get<2>(out)[i]), float(n - 1) / 2, "f16 mean");
    expect_eq(std::isnan(float(std::get<3>(out)[i][0])), n > 1, "f16 max propagates NaN");
    const DynTensor& st = std::get<4>(out)[i];
    expect_eq(float(st.get<ds::bfloat16>(0)), tri - float(n), "strided run-time value: element 0");
    expect_eq(float(st.get<ds::bfloat16>(5)), 5.0f * float(n), "strided run-time value: element 5");
    const DynTensor& g = std::get<5>(out)[i];
    expect_eq(g.shape, ds::Shape{1, n}, "run-time all_gather shape");
    expect_eq(float(g.get<ds::float16>(static_cast<std::size_t>(n - 1))), float(n - 1), "run-time all_gather");
  }
  auto per_replica = s.run([](ds::ReplicaContext& ctx) {
    return std::vector<ds::bfloat16>{ds::bfloat16(float(ctx.replica_id_in_sync_group()))};
  });
  expect_eq(float(s.reduce("sum", per_replica)[0]), tri - float(n), "strategy.reduce of bf16");
  expect_eq(float(s.gather(per_replica, 0)[static_cast<std::size_t>(n - 1)]), float(n - 1), "strategy.gather of bf16");
  auto scope = s.scope();
  ds::Variable<std::vector<ds::bfloat16>> w(std::vector<ds::bfloat16>{ds::bfloat16(float(s.worker_index()) + 1)}, {.name = "w"});
  for (const auto& copy : w.values()) expect_eq(float(copy[0]), 1.0f, "bf16 variable from the chief");
  ds::Variable<DynTensor> d(DynTensor::of<ds::float16>({1}, {ds::float16(float(s.worker_index()) + 3)}),
                            {.name = "d", .aggregation = ds::VariableAggregation::Sum});
  s.run([&](ds::ReplicaContext&) { d.assign_add(DynTensor::of<ds::float16>({1}, {ds::float16(1.0f)})); });
  for (const auto& copy : d.values()) expect_eq(float(copy.get<ds::float16>(0)), 3.0f + float(n), "run-time variable");
}
// IndexedSlices across the workers: every replica's rows in replica order, equal to the dense
// all-reduce of to_dense() (SUM exactly: small integers), with a dense value in the same call, a
// replica with no rows, duplicate rows.
void sparse(Strategy& s) {
  using Rows = ds::IndexedSlices<ds::Tensor<float>>;
  const int n = s.num_replicas_in_sync();
  for (const char* op : {"sum", "mean"}) {
    auto out = s.run([&](ds::ReplicaContext& ctx) {
      const int r = ctx.replica_id_in_sync_group();
      std::vector<std::int64_t> ids;
      std::vector<float> values;
      if (r != 1) {
        ids = {r % 7, (3 * r) % 7, r % 7};
        for (int k = 0; k < 3 * 4; ++k) values.push_back(static_cast<float>(r + k));
      }
      const Rows mine(ids, ds::Tensor<float>({static_cast<std::int64_t>(ids.size()), 4}, values), {7, 4});
      auto [rows, dense] = ctx.all_reduce(op, mine, std::vector<double>{1.0, static_cast<double>(r)});
      const ds::Tensor<float> want = ctx.all_reduce(op, mine.to_dense());
      return std::make_tuple(rows, dense, want);
    });
    std::vector<std::int64_t> all_ids;
    for (int r = 0; r < n; ++r) {
      if (r != 1) all_ids.insert(all_ids.end(), {r % 7, (3 * r) % 7, r % 7});
    }
    for (std::size_t i = 0; i < std::get<0>(out).size(); ++i) {
      const Rows& rows = std::get<0>(out)[i];
      const ds::Tensor<float>& want = std::get<2>(out)[i];
      expect_eq(rows.indices() == all_ids, true, "the replicas' indices, in replica order");
      const ds::Tensor<float> got = rows.to_dense();
      bool close = got.shape() == want.shape();
      for (std::size_t k = 0; close && k < got.size(); ++k) close = std::fabs(got[k] - want[k]) <= 1e-5f * (1 + std::fabs(want[k]));
      expect_eq(close, true, fmt::format("{} of IndexedSlices against the dense all-reduce of to_dense()", op));
      if (std::string_view(op) == "sum") expect_eq(got == want, true, "sum of IndexedSlices, exactly");
      const double mean_div = std::string_view(op) == "mean" ? n : 1;
      expect_eq(std::get<1>(out)[i], std::vector<double>{n / mean_div, (n * (n - 1) / 2) / mean_div}, "dense value of the same call");
    }
  }
}
// ---- reduce_scatter, all_to_all, broadcast and all_reduce_async ----------------------------

// Rows of part i of d rows over n parts, as np.array_split documents it.
std::int64_t rows_of(std::int64_t d, int n, int i) { return i < d % n ? (d + n - 1) / n : d / n; }
std::int64_t first_row(std::int64_t d, int n, int i) {
  std::int64_t b = 0;
  for (int j = 0; j < i; ++j) b += rows_of(d, n, j);
  return b;
}

void scatter(Strategy& s) {
  const int n = s.num_replicas_in_sync();
  for (std::int64_t count : {std::int64_t{0}, std::int64_t{1}, std::int64_t{7}, std::int64_t{1001}, std::int64_t{100003}}) {
    // reduce_scatter: replica r's element k is (r + 1) * 1000 + k.
    auto sums = s.run([&](ds::ReplicaContext& ctx) {
      std::vector<std::int64_t> v(static_cast<std::size_t>(count));
      for (std::int64_t k = 0; k < count; ++k) v[static_cast<std::size_t>(k)] = (ctx.replica_id_in_sync_group() + 1) * 1000 + k;
      auto sum = ctx.reduce_scatter("sum", v);
      auto mx = ctx.reduce_scatter("max", std::move(v));
      std::vector<double> d(static_cast<std::size_t>(count), 2.0 * ctx.replica_id_in_sync_group());
      auto mean = ctx.reduce_scatter("mean", d);
      return std::make_tuple(sum, mx, mean);
    });
    for (int local = 0; local < s.num_local_replicas(); ++local) {
      const int i = s.worker_index() * s.num_local_replicas() + local;
      const std::int64_t begin = first_row(count, n, i), rows = rows_of(count, n, i);
      std::vector<std::int64_t> want_sum, want_max;
      for (std::int64_t k = begin; k < begin + rows; ++k) {
        want_sum.push_back(1000L * n * (n + 1) / 2 + n * k);
        want_max.push_back(n * 1000L + k);
      }
      expect_eq(std::get<0>(sums)[static_cast<std::size_t>(local)], want_sum, fmt::format("reduce_scatter sum of {}", count));
      expect_eq(std::get<1>(sums)[static_cast<std::size_t>(local)], want_max, fmt::format("reduce_scatter max of {}", count));
      // mean of 0, 2, 4, ..., 2(n-1) = n - 1, exact in float64
      expect_eq(std::get<2>(sums)[static_cast<std::size_t>(local)],
                std::vector<double>(static_cast<std::size_t>(rows), double(n - 1)), "reduce_scatter mean");
    }
  }
  // all_to_all of one value: replica r sends a [2r + 3, 2] value, element (row, c) = r * 1000 + row * 10 + c.
  auto split = s.run([&](ds::ReplicaContext& ctx) {
    const int r = ctx.replica_id_in_sync_group();
    const std::int64_t rows = 2 * r + 3;
    std::vector<std::int32_t> data;
    for (std::int64_t row = 0; row < rows; ++row) {
      for (int c = 0; c < 2; ++c) data.push_back(static_cast<std::int32_t>(r * 1000 + row * 10 + c));
    }
    return ctx.all_to_all(ds::Tensor<std::int32_t>({rows, 2}, data));
  });
  // all_to_all of a list: replica r's value j has r + j elements, each 100 * r + j.
  auto lists = s.run([&](ds::ReplicaContext& ctx) {
    const int r = ctx.replica_id_in_sync_group();
    std::vector<std::vector<float>> values;
    for (int j = 0; j < n; ++j) values.emplace_back(static_cast<std::size_t>(r + j), static_cast<float>(100 * r + j));
    return ctx.all_to_all(values);
  });
  for (int local = 0; local < s.num_local_replicas(); ++local) {
    const int i = s.worker_index() * s.num_local_replicas() + local;
    std::vector<std::int32_t> want;
    std::int64_t total = 0;
    for (int r = 0; r < n; ++r) {
      const std::int64_t rows = 2 * r + 3, begin = first_row(rows, n, i);
      for (std::int64_t row = begin; row < begin + rows_of(rows, n, i); ++row) {
        for (int c = 0; c < 2; ++c) want.push_back(static_cast<std::int32_t>(r * 1000 + row * 10 + c));
      }
      total += rows_of(rows, n, i);
    }
    const auto& got = split[static_cast<std::size_t>(local)];
    expect_eq(got.shape(), std::vector<std::int64_t>{total, 2}, "all_to_all split shape");
    expect_eq(std::vector<std::int32_t>(got.data(), got.data() + got.size()), want, "all_to_all split values");
    const auto& list = lists[static_cast<std::size_t>(local)];
    expect_eq(list.size(), static_cast<std::size_t>(n), "all_to_all list size");
    for (int r = 0; r < n && r < static_cast<int>(list.size()); ++r) {
      expect_eq(list[static_cast<std::size_t>(r)], std::vector<float>(static_cast<std::size_t>(r + i), static_cast<float>(100 * r + i)),
                fmt::format("all_to_all list value from {}", r));
    }
  }
  // broadcast from every root.
  for (int root = 0; root < n; ++root) {
    auto got = s.run([&](ds::ReplicaContext& ctx) {
      const int r = ctx.replica_id_in_sync_group();
      return ctx.broadcast(std::vector<std::int64_t>{r, r * 7, 100003}, root);
    });
    for (const auto& v : got.values()) expect_eq(v, std::vector<std::int64_t>{root, root * 7, 100003}, "broadcast");
  }
}
// Several all-reduces in flight per step, waited in order; exact sums.
void async(Strategy& s) {
  const int n = s.num_replicas_in_sync();
  for (int step = 0; step < 5; ++step) {
    auto out = s.run([&](ds::ReplicaContext& ctx) {
      const int r = ctx.replica_id_in_sync_group();
      std::vector<ds::CollectiveHandle<std::vector<std::int64_t>>> handles;
      for (int k = 0; k < 6; ++k) {
        std::vector<std::int64_t> v(static_cast<std::size_t>(1 + k * 40000));
        for (std::size_t i = 0; i < v.size(); ++i) v[i] = 1000 * k + r + static_cast<std::int64_t>(i) + step;
        handles.push_back(ctx.all_reduce_async("sum", std::move(v)));
      }
      std::vector<std::vector<std::int64_t>> results;
      for (auto& h : handles) results.push_back(h.wait());
      return results;
    });
    for (const auto& results : out.values()) {
      for (int k = 0; k < 6; ++k) {
        const auto& v = results[static_cast<std::size_t>(k)];
        bool exact = v.size() == static_cast<std::size_t>(1 + k * 40000);
        for (std::size_t i = 0; exact && i < v.size(); ++i) {
          exact = v[i] == n * (1000L * k + static_cast<std::int64_t>(i) + step) + n * (n - 1L) / 2;
        }
        if (!exact) {
          fmt::print("MISMATCH async all-reduce {} of step {}\n", k, step);
          ++failures;
        }
      }
    }
  }
}

// Steps of 4 all-reduces in flight until a peer dies (the test SIGKILLs one); wait() must throw.
void async_kill(Strategy& s) {
  for (int step = 0; step < 100000; ++step) {
    s.run([&](ds::ReplicaContext& ctx) {
      std::vector<ds::CollectiveHandle<std::vector<float>>> handles;
      for (int k = 0; k < 4; ++k) handles.push_back(ctx.all_reduce_async("sum", std::vector<float>(1 << 18, 1.0f)));
      for (auto& h : handles) {
        try {
          (void)h.wait();
        } catch (const ds::PeerFailure& e) {
          fmt::print("wait() threw PeerFailure: {}\n", e.what());
          std::fflush(stdout);
          throw;
        }
      }
    });
    if (step == 0) fmt::print("first step done\n");
    std::fflush(stdout);
  }
}
}  // namespace

int main(int argc, char** argv) {
  const std::string scenario = argc > 1 ? argv[1] : "collectives";
  const int local = argc > 2 ? std::atoi(argv[2]) : 1;
  try {
    ds::CommunicationOptions options;
    if (const char* t = std::getenv("TEST_TIMEOUT_SECONDS")) options.timeout_seconds = std::atof(t);
    if (const char* i = std::getenv("TEST_IMPLEMENTATION"); i && std::string_view(i) == "MPI") {
      options.implementation = ds::CommunicationImplementation::Mpi;
    }
    if (const char* c = std::getenv("TEST_MPI_CHECK_AGREEMENT")) options.mpi_check_agreement = std::atoi(c) != 0;
    if (const char* p = std::getenv("TEST_BYTES_PER_PACK")) options.bytes_per_pack = std::strtoull(p, nullptr, 10);
    if (const char* m = std::getenv("TEST_SHARED_MEMORY_MIN_BYTES")) {
      options.shared_memory_min_bytes = std::strtoull(m, nullptr, 10);
    }
    Strategy s(options, nullptr, local);
    fmt::print("worker {} of {}: {} replicas in sync (pid {})\n", s.worker_index(), s.num_workers(),
               s.num_replicas_in_sync(), ::getpid());
    if (scenario == "collectives") {
      collectives(s);
    } else if (scenario == "half") {
      half_and_runtime_types(s);
    } else if (scenario == "sparse") {
      sparse(s);
    } else if (scenario == "mismatch_sparse") {
      // IndexedSlices of another dense shape on worker 1.
      s.run([&](ds::ReplicaContext& ctx) {
        const std::int64_t rows = s.worker_index() == 1 ? 9 : 7;
        return ctx.all_reduce("sum", ds::IndexedSlices<ds::Tensor<float>>({0}, ds::Tensor<float>::zeros({1, 4}), {rows, 4})).size();
      });
    } else if (scenario == "mismatch_shape") {
      // Same element count and dtype, another shape on worker 1.
      s.run([&](ds::ReplicaContext& ctx) {
        const ds::Shape shape = s.worker_index() == 1 ? ds::Shape{3, 2} : ds::Shape{2, 3};
        return ctx.all_reduce("sum", ds::Tensor<float>::zeros(shape)).size();
      });
    } else if (scenario == "mismatch_half") {
      // Same count, float16 on worker 1 and bfloat16 elsewhere.
      s.run([&](ds::ReplicaContext& ctx) {
        if (s.worker_index() == 1) return ctx.all_reduce("sum", std::vector<ds::float16>(3)).size();
        return ctx.all_reduce("sum", std::vector<ds::bfloat16>(3)).size();
      });
    } else if (scenario == "kill") {
      // Large all-reduces until a peer dies; the test SIGKILLs one worker in the middle.
      for (int i = 0; i < 100000; ++i) {
        s.run([](ds::ReplicaContext& ctx) { return ctx.all_reduce("sum", std::vector<float>(1 << 20, 1.0f)).size(); });
        if (i == 0) fmt::print("first all-reduce done\n");
        std::fflush(stdout);
      }
    } else if (scenario == "mismatch") {
      s.run([&](ds::ReplicaContext& ctx) {
        const auto size = s.worker_index() == 1 ? 5u : 3u;
        return ctx.all_reduce("sum", std::vector<float>(size, 1.0f));
      });
    } else if (scenario == "mismatch_dtype") {
      // Same count, other element type on worker 1.
      s.run([&](ds::ReplicaContext& ctx) {
        if (s.worker_index() == 1) return ctx.all_reduce("sum", std::vector<double>(3, 1.0)).size();
        return ctx.all_reduce("sum", std::vector<float>(3, 1.0f)).size();
      });
    } else if (scenario == "demo") {
      const auto data = demo::make_data(1000, 8, 7);
      demo::TrainConfig config{.epochs = 3, .global_batch = 64, .learning_rate = 0.5f};
      auto w = demo::train(s, data, config);
      fmt::print("weights {}\n", fmt::join(w, " "));
    } else if (scenario == "scatter") {
      scatter(s);
    } else if (scenario == "async") {
      async(s);
    } else if (scenario == "async_kill") {
      async_kill(s);
    } else if (scenario == "mismatch_reduce_scatter") {  // as many elements, another shape on worker 1
      s.run([&](ds::ReplicaContext& ctx) {
        return ctx.reduce_scatter("sum", ds::Tensor<float>::zeros(s.worker_index() == 1 ? ds::Shape{3, 4} : ds::Shape{4, 3})).size();
      });
    } else if (scenario == "mismatch_all_to_all_count") {  // worker 1's replicas pass one value too many
      s.run([&](ds::ReplicaContext& ctx) {
        const auto count = static_cast<std::size_t>(ctx.num_replicas_in_sync() + (s.worker_index() == 1 ? 1 : 0));
        return ctx.all_to_all(std::vector<std::vector<float>>(count, std::vector<float>(2))).size();
      });
    } else if (scenario == "mismatch_all_to_all_dtype") {
      s.run([&](ds::ReplicaContext& ctx) {
        if (s.worker_index() == 1) return ctx.all_to_all(std::vector<double>(6)).size();
        return ctx.all_to_all(std::vector<float>(6)).size();
      });
    } else {
      fmt::print("unknown scenario {}\n", scenario);
      return 5;
    }
  } catch (const ds::PeerFailure& e) {
    fmt::print("PeerFailure: {}\n", e.what());
    return 3;
  } catch (const ds::CollectiveTimeout& e) {
    fmt::print("CollectiveTimeout: {}\n", e.what());
    return 3;
  } catch (const ds::InvalidArgument& e) {
    fmt::print("InvalidArgument: {}\n", e.what());
    return 4;
  } catch (const std::exception& e) {
    fmt::print("error: {}\n", e.what());
    return 5;
  }
  if (failures) fmt::print("FAILED {}\n", failures); else fmt::print("OK\n");
  return failures ? 1 : 0;
}

// One worker process of tests/test_multi_worker_scatter.cpp: reduce_scatter, all_to_all,
// broadcast and all_reduce_async across real worker processes. Reads TF_CONFIG, runs a scenario,
// checks its results against values computed from the formulas that made the inputs.
//   scatter_worker_helper SCENARIO LOCAL_REPLICAS
// Exit codes: 0 ok, 1 wrong result, 3 PeerFailure/CollectiveTimeout, 4 InvalidArgument, 5 other error.
#define DISTRIBUTE_WITH_MULTI_WORKER
#include <distribute/distribute.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

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
  const std::string scenario = argc > 1 ? argv[1] : "scatter";
  const int local = argc > 2 ? std::atoi(argv[2]) : 1;
  try {
    ds::CommunicationOptions options;
    if (const char* t = std::getenv("TEST_TIMEOUT_SECONDS")) options.timeout_seconds = std::atof(t);
    if (const char* i = std::getenv("TEST_IMPLEMENTATION"); i && std::string_view(i) == "MPI") {
      options.implementation = ds::CommunicationImplementation::Mpi;  // built with MPI, started by mpirun
    }
    if (const char* m = std::getenv("TEST_SHARED_MEMORY_MIN_BYTES")) {
      options.shared_memory_min_bytes = std::strtoull(m, nullptr, 10);
    }
    Strategy s(options, nullptr, local);
    fmt::print("worker {} of {}: {} replicas in sync\n", s.worker_index(), s.num_workers(), s.num_replicas_in_sync());
    const int w = s.worker_index();
    if (scenario == "scatter") {
      scatter(s);
    } else if (scenario == "async") {
      async(s);
    } else if (scenario == "async_kill") {
      async_kill(s);
    } else if (scenario == "mismatch_reduce_scatter") {  // as many elements, another shape on worker 1
      s.run([&](ds::ReplicaContext& ctx) {
        return ctx.reduce_scatter("sum", ds::Tensor<float>::zeros(w == 1 ? ds::Shape{3, 4} : ds::Shape{4, 3})).size();
      });
    } else if (scenario == "mismatch_all_to_all_count") {  // worker 1's replicas pass one value too many
      s.run([&](ds::ReplicaContext& ctx) {
        const auto count = static_cast<std::size_t>(ctx.num_replicas_in_sync() + (w == 1 ? 1 : 0));
        return ctx.all_to_all(std::vector<std::vector<float>>(count, std::vector<float>(2))).size();
      });
    } else if (scenario == "mismatch_all_to_all_dtype") {
      s.run([&](ds::ReplicaContext& ctx) {
        if (w == 1) return ctx.all_to_all(std::vector<double>(6)).size();
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
  std::fflush(stdout);
  if (failures) fmt::print("FAILED {}\n", failures); else fmt::print("OK\n");
  return failures ? 1 : 0;
}

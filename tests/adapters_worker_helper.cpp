// One process of the adapters' multi-process tests, built with every adapter meson found
// (-DWITH_TORCH=1, -DWITH_EIGEN=1, -DWITH_DLPACK=1, -DWITH_XTENSOR=1):
//   adapters_worker_helper mwms ADAPTER
//       one worker of a 2-worker MultiWorkerMirroredStrategy<host> cluster (TF_CONFIG), 1 replica
//       each: every collective, strategy.reduce/gather and mirrored variables with ADAPTER's
//       values, checked here against exact expected values (MISMATCH lines, then OK or FAILED).
//   adapters_worker_helper ps|worker INDEX CLUSTER_JSON
//       a task of a parameter-server cluster (ds::Server) until the coordinator stops it; the
//       remote functions of adapters_multi_process.hpp are registered.
// Exit codes: 0 ok, 1 wrong result, 2 usage or an adapter not built in, 5 error.
#include "adapters_multi_process.hpp"  // first: the adapters' headers and the umbrella, with the ps part

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace ds = distribute;
using Strategy = ds::MultiWorkerMirroredStrategy<ds::host>;
using ds::ReduceOp;
using adapters_mp::floats;
using adapters_mp::strides_of;

namespace {

std::atomic<int> failures{0}, checks{0};

template <class A, class B>
void expect_eq(const A& got, const B& want, std::string_view what) {
  ++checks;
  if (!(got == want)) {
    fmt::print("MISMATCH {}: got {} want {}\n", what, got, want);
    ++failures;
  }
}

/// dtype, shape and the logical elements of any value.
template <class T>
void check(const T& value, ds::DType dtype, const ds::Shape& shape, const std::vector<float>& want, std::string_view what) {
  const ds::TensorView v = ds::view_of(value);
  expect_eq(ds::to_string(v.dtype), ds::to_string(dtype), fmt::format("{}: dtype", what));
  expect_eq(v.shape, shape, fmt::format("{}: shape", what));
  expect_eq(floats(value), want, what);
}

constexpr auto F32 = ds::DType::F32;
constexpr auto BF16 = ds::DType::BF16;

/// 2 workers x 1 replica: replica r is worker r. Every expected value is written out for r = 0, 1.
template <class Kit>
void mwms(Strategy& s) {
  expect_eq(s.num_replicas_in_sync(), 2, "replicas in sync (2 workers x 1)");
  if (s.num_replicas_in_sync() != 2) return;

  s.run([&](ds::ReplicaContext& ctx) {
    const float r = float(ctx.replica_id_in_sync_group());
    check(ctx.all_reduce(ReduceOp::Sum, Kit::f32({1 + r, 2, 3 * r, -4}, {2, 2})), F32, {2, 2}, {3, 4, 3, -8},
          "all_reduce Sum float32");
    check(ctx.all_reduce(ReduceOp::Mean, Kit::f32({r, 1, 3}, {1, 3})), F32, {1, 3}, {0.5, 1, 3}, "all_reduce Mean float32");
    check(ctx.all_reduce(ReduceOp::Max, Kit::f32({r, -r, 7}, {1, 3})), F32, {1, 3}, {1, 0, 7}, "all_reduce Max float32");
    // Sums exact in bfloat16: 2^-8 + 2^-8 = 2^-7.
    check(ctx.all_reduce(ReduceOp::Sum, Kit::bf16({1 + r, 0.5, 0x1p-8f}, {1, 3})), BF16, {1, 3}, {3, 1, 0x1p-7f},
          "all_reduce Sum bfloat16");
    check(ctx.all_reduce(ReduceOp::Mean, Kit::bf16({r, 3}, {1, 2})), BF16, {1, 2}, {0.5, 3}, "all_reduce Mean bfloat16");
    check(ctx.all_reduce(ReduceOp::Max, Kit::bf16({r, -1 - r}, {1, 2})), BF16, {1, 2}, {1, -1}, "all_reduce Max bfloat16");

    check(ctx.all_gather(Kit::f32({r, 10 + r, 20 + r, 30 + r}, {2, 2}), 0), F32, {4, 2}, {0, 10, 20, 30, 1, 11, 21, 31},
          "all_gather axis 0");
    check(ctx.all_gather(Kit::f32({r, 10 + r, 20 + r, 30 + r}, {2, 2}), 1), F32, {2, 4}, {0, 10, 1, 11, 20, 30, 21, 31},
          "all_gather axis 1");
    check(ctx.all_gather(Kit::bf16({r, 0.25}, {1, 2}), 1), BF16, {1, 4}, {0, 0.25, 1, 0.25}, "all_gather bfloat16 axis 1");
    check(ctx.broadcast(Kit::f32({10 * r, 5}, {1, 2}), 1), F32, {1, 2}, {10, 5}, "broadcast from replica 1");

    // A column-major value: reduced through its strides and written back in its own layout.
    auto strided = Kit::strided({1 + r, 2, 3, 4, 5, 6}, {2, 3});
    expect_eq(strides_of(strided), ds::Strides{1, 2}, "the strided value is column-major");
    auto reduced = ctx.all_reduce(ReduceOp::Sum, std::move(strided));
    check(reduced, F32, {2, 3}, {3, 4, 6, 8, 10, 12}, "all_reduce Sum of a strided value");
    expect_eq(strides_of(reduced), ds::Strides{1, 2}, "all_reduce of a strided value keeps its layout");
    check(ctx.all_gather(Kit::strided({r, 1, 2, 3, 4, 5}, {2, 3}), 0), F32, {4, 3}, {0, 1, 2, 3, 4, 5, 1, 1, 2, 3, 4, 5},
          "all_gather of a strided value, axis 0");
    check(ctx.all_gather(Kit::strided({r, 1, 2, 3, 4, 5}, {2, 3}), 1), F32, {2, 6}, {0, 1, 2, 1, 1, 2, 3, 4, 5, 3, 4, 5},
          "all_gather of a strided value, axis 1");
    check(ctx.broadcast(Kit::strided({r, 1, 2, 3 * r}, {2, 2}), 1), F32, {2, 2}, {1, 1, 2, 3},
          "broadcast of a strided value");
  });

  // Cross-replica: per replica [[r, 2], [1, 3 + r]], column-major.
  auto per_replica = s.run([](ds::ReplicaContext& ctx) {
    const float r = float(ctx.replica_id_in_sync_group());
    return Kit::strided({r, 2, 1, 3 + r}, {2, 2});
  });
  check(s.reduce(ReduceOp::Sum, per_replica), F32, {2, 2}, {1, 4, 2, 7}, "strategy.reduce Sum");
  check(s.reduce(ReduceOp::Max, per_replica), F32, {2, 2}, {1, 2, 1, 4}, "strategy.reduce Max");
  check(s.reduce(ReduceOp::Sum, per_replica, 0), F32, {2}, {3, 11}, "strategy.reduce Sum along axis 0");
  check(s.reduce(ReduceOp::Mean, per_replica, 0), F32, {2}, {0.75, 2.75}, "strategy.reduce Mean along axis 0");
  check(s.reduce(ReduceOp::Max, per_replica, 1), F32, {2}, {2, 4}, "strategy.reduce Max along axis 1");
  check(s.gather(per_replica, 0), F32, {4, 2}, {0, 2, 1, 3, 1, 2, 1, 4}, "strategy.gather axis 0");
  check(s.gather(per_replica, 1), F32, {2, 4}, {0, 2, 1, 2, 1, 3, 1, 4}, "strategy.gather axis 1");
  auto per_replica_bf16 = s.run([](ds::ReplicaContext& ctx) {
    return Kit::bf16({float(ctx.replica_id_in_sync_group()), 0.25}, {1, 2});
  });
  check(s.reduce(ReduceOp::Sum, per_replica_bf16), BF16, {1, 2}, {1, 0.5}, "strategy.reduce Sum bfloat16");
  check(s.reduce(ReduceOp::Mean, per_replica_bf16, 1), BF16, {1}, {0.375}, "strategy.reduce Mean bfloat16 along axis 1");
  check(s.gather(per_replica_bf16, 0), BF16, {2, 2}, {0, 0.25, 1, 0.25}, "strategy.gather bfloat16 axis 0");

  // Mirrored variables start from the chief's value (worker 0's) on every worker.
  auto scope = s.scope();
  const float worker = float(s.worker_index());
  ds::Variable<typename Kit::F32> w(Kit::f32({worker + 1, 7}, {1, 2}),
                                    {.name = "w", .aggregation = ds::VariableAggregation::Sum});
  for (const auto& copy : w.values()) check(copy, F32, {1, 2}, {1, 7}, "variable from the chief's value");
  s.run([&](ds::ReplicaContext& ctx) { w.assign_add(Kit::f32({float(ctx.replica_id_in_sync_group()), 0.5}, {1, 2})); });
  for (const auto& copy : w.values()) check(copy, F32, {1, 2}, {2, 8}, "variable after assign_add (SUM)");
  check(w.read_value(), F32, {1, 2}, {2, 8}, "variable read_value");

  ds::Variable<typename Kit::Strided> v(Kit::strided({1 + 10 * worker, 2, 3, 4}, {2, 2}),
                                        {.name = "v", .aggregation = ds::VariableAggregation::Sum});
  for (const auto& copy : v.values()) check(copy, F32, {2, 2}, {1, 2, 3, 4}, "strided variable from the chief's value");
  s.run([&](ds::ReplicaContext& ctx) {
    v.assign_add(Kit::strided({float(ctx.replica_id_in_sync_group()), 1, 1, 1}, {2, 2}));
  });
  for (const auto& copy : v.values()) check(copy, F32, {2, 2}, {2, 4, 5, 6}, "strided variable after assign_add (SUM)");

  ds::Variable<typename Kit::BF16> b(Kit::bf16({1 + worker, 0x1p-8f}, {1, 2}),
                                     {.name = "b", .aggregation = ds::VariableAggregation::Mean});
  s.run([&](ds::ReplicaContext& ctx) { b.assign_add(Kit::bf16({float(ctx.replica_id_in_sync_group()), 0}, {1, 2})); });
  for (const auto& copy : b.values()) check(copy, BF16, {1, 2}, {1.5, 0x1p-8f}, "bfloat16 variable after assign_add (MEAN)");
}

int run_mwms(const std::string& adapter) {
  ds::CommunicationOptions options;
  if (const char* t = std::getenv("TEST_TIMEOUT_SECONDS")) options.timeout_seconds = std::atof(t);
  Strategy s(options, nullptr, 1);
  fmt::print("{} worker {} of {}\n", adapter, s.worker_index(), s.num_workers());
#ifdef WITH_TORCH
  if (adapter == "torch") return mwms<adapters_mp::TorchKit>(s), 0;
#endif
#ifdef WITH_EIGEN
  if (adapter == "eigen") return mwms<adapters_mp::EigenKit>(s), 0;
#endif
#ifdef WITH_DLPACK
  if (adapter == "dlpack") return mwms<adapters_mp::DlpackKit>(s), 0;
#endif
#ifdef WITH_XTENSOR
  if (adapter == "xtensor") return mwms<adapters_mp::XtensorKit>(s), 0;
#endif
  fmt::print("this helper was built without the adapter '{}'\n", adapter);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "mwms" && argc == 3) {
      if (const int rc = run_mwms(argv[2]); rc != 0) return rc;
      fmt::print("{} checks\n", checks.load());
      if (failures) fmt::print("FAILED {}\n", failures.load()); else fmt::print("OK\n");
      return failures ? 1 : 0;
    }
    if ((mode == "ps" || mode == "worker") && argc == 4) {
#ifdef ADAPTERS_MP_HAVE_PS
      ds::Server server(ds::ClusterSpec::from_json(argv[3]), mode, std::atoi(argv[2]));
      fmt::print("serving {} at {}\n", mode, server.target());
      std::fflush(stdout);
      server.join();
      fmt::print("stopped\n");
      return 0;
#else
      fmt::print("this helper was built without the parameter-server parts (cereal)\n");
      return 2;
#endif
    }
    fmt::print(stderr, "usage: adapters_worker_helper mwms ADAPTER | ps|worker INDEX CLUSTER_JSON\n");
    return 2;
  } catch (const std::exception& e) {
    fmt::print("error: {}\n", e.what());
    return 5;
  }
}

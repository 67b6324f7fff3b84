// xtensor containers through the collectives, strategies and variables (include/distribute/adapters/xtensor.hpp).
#define DISTRIBUTE_WITH_PS
#include <distribute/adapters/xtensor.hpp>

#include <distribute/distribute.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

// The multi-process cases: tests/adapters_worker_helper processes (adapters_multi_process.hpp).
#define WITH_XTENSOR 1
#include "adapters_multi_process.hpp"

namespace ds = distribute;
using xt::layout_type;

namespace {

template <class T, layout_type L>
using Matrix = xt::xtensor<T, 2, L>;

// The elements in memory order, to see which layout a result has.
template <class C>
std::vector<typename C::value_type> memory_order(const C& c) {
  return std::vector<typename C::value_type>(c.data(), c.data() + c.size());
}

}  // namespace

TEST_CASE("xtensor: traits read shape, strides and data of every layout; make is zeroed in the type's layout") {
  const Matrix<float, layout_type::row_major> r = {{1, 2, 3}, {4, 5, 6}};
  const Matrix<float, layout_type::column_major> c = {{1, 2, 3}, {4, 5, 6}};
  CHECK(ds::shape_of(r) == ds::Shape{2, 3});
  CHECK(ds::view_of(r).strides == ds::Strides{3, 1});
  CHECK(ds::view_of(c).strides == ds::Strides{1, 2});
  CHECK(ds::view_of(c).dtype == ds::DType::F32);
  CHECK(memory_order(c) == std::vector<float>{1, 4, 2, 5, 3, 6});

  auto zeros = ds::make_value<Matrix<float, layout_type::column_major>>(ds::DType::F32, {3, 2});
  CHECK(zeros.layout() == layout_type::column_major);
  CHECK(zeros.shape()[0] == 3);
  CHECK(memory_order(zeros) == std::vector<float>(6, 0.0f));
  auto any = ds::make_value<xt::xarray<std::int64_t>>(ds::DType::I64, {2, 1, 2});
  CHECK(any.dimension() == 3);
  CHECK(memory_order(any) == std::vector<std::int64_t>(4, 0));
  auto dynamic = ds::make_value<xt::xarray<double, layout_type::dynamic>>(ds::DType::F64, {2, 2});
  CHECK(dynamic.layout() == layout_type::row_major);
  CHECK(memory_order(dynamic) == std::vector<double>(4, 0.0));

  CHECK_THROWS_WITH_AS((ds::make_value<xt::xtensor<float, 2>>(ds::DType::F32, {6})),
                       doctest::Contains("cannot hold shape (6,) (rank 1) in an xt::xtensor of rank 2"),
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(ds::make_value<xt::xarray<float>>(ds::DType::F32, {2, -3}),
                       doctest::Contains("xtensor: negative dimension in shape (2, -3)"), ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(ds::make_value<xt::xarray<float>>(ds::DType::F64, {2}),
                       doctest::Contains("cannot hold float64 values in a value of element type float32"),
                       ds::InvalidArgument);
}

TEST_CASE_TEMPLATE("xtensor: every collective of MirroredStrategy<host>(3), row- and column-major", M,
                   Matrix<float, layout_type::row_major>, Matrix<float, layout_type::column_major>) {
  ds::MirroredStrategy<ds::host> strategy(3);
  auto out = strategy.run([](ds::ReplicaContext& ctx) {
    const float r = float(ctx.replica_id_in_sync_group());
    auto mine = [r] { return M{{r, 1, 2 * r}, {-r, 3, 0}}; };
    M sum = ctx.all_reduce(ds::ReduceOp::Sum, mine());
    M mean = ctx.all_reduce(ds::ReduceOp::Mean, mine());
    M max = ctx.all_reduce(ds::ReduceOp::Max, mine());
    ds::Tensor<float> rows = ctx.all_gather(mine(), 0);
    ds::Tensor<float> cols = ctx.all_gather(mine(), 1);
    M root = ctx.broadcast(mine(), 1);
    return std::make_tuple(sum, mean, max, rows, cols, root);
  });
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    CHECK(std::get<0>(out)[r] == M{{3, 3, 6}, {-3, 9, 0}});
    CHECK(std::get<1>(out)[r] == M{{1, 1, 2}, {-1, 3, 0}});
    CHECK(std::get<2>(out)[r] == M{{2, 1, 4}, {0, 3, 0}});
    CHECK(std::get<3>(out)[r].shape() == ds::Shape{6, 3});
    CHECK(std::get<3>(out)[r].values() == std::vector<float>{0, 1, 0, 0, 3, 0, 1, 1, 2, -1, 3, 0, 2, 1, 4, -2, 3, 0});
    CHECK(std::get<4>(out)[r].shape() == ds::Shape{2, 9});
    CHECK(std::get<4>(out)[r].values() ==
          std::vector<float>{0, 1, 0, 1, 1, 2, 2, 1, 4, 0, 3, 0, -1, 3, 0, -2, 3, 0});
    CHECK(std::get<5>(out)[r] == M{{1, 1, 2}, {-1, 3, 0}});
    CHECK(std::get<0>(out)[r].layout() == M::static_layout);
  }
  // The sum sits in memory in the type's own layout.
  if constexpr (M::static_layout == layout_type::column_major) {
    CHECK(memory_order(std::get<0>(out)[0]) == std::vector<float>{3, -3, 3, 9, 6, 0});
  } else {
    CHECK(memory_order(std::get<0>(out)[0]) == std::vector<float>{3, 3, 6, -3, 9, 0});
  }
}

TEST_CASE_TEMPLATE("xtensor: strategy.reduce with and without an axis, gather along every axis", A,
                   xt::xarray<std::int32_t, layout_type::row_major>, xt::xarray<std::int32_t, layout_type::column_major>) {
  ds::MirroredStrategy<ds::host> strategy(2);
  auto per_replica = strategy.run([](ds::ReplicaContext& ctx) {
    const std::int32_t r = ctx.replica_id_in_sync_group();
    return A{{{1 + r, 2}, {3, 4 * r}}, {{5, 6}, {7, 8 + r}}};  // shape (2, 2, 2)
  });
  A sum = strategy.reduce(ds::ReduceOp::Sum, per_replica);
  CHECK(sum == A{{{3, 4}, {6, 4}}, {{10, 12}, {14, 17}}});
  A max = strategy.reduce(ds::ReduceOp::Max, per_replica);
  CHECK(max == A{{{2, 2}, {3, 4}}, {{5, 6}, {7, 9}}});
  ds::Tensor<std::int32_t> along0 = strategy.reduce(ds::ReduceOp::Sum, per_replica, 0);
  CHECK(along0.shape() == ds::Shape{2, 2});
  CHECK(along0.values() == std::vector<std::int32_t>{13, 16, 20, 21});
  ds::Tensor<std::int32_t> along2 = strategy.reduce(ds::ReduceOp::Sum, per_replica, 2);
  CHECK(along2.shape() == ds::Shape{2, 2});
  CHECK(along2.values() == std::vector<std::int32_t>{7, 10, 22, 31});

  ds::Tensor<std::int32_t> g0 = strategy.gather(per_replica, 0);
  CHECK(g0.shape() == ds::Shape{4, 2, 2});
  CHECK(g0.values() == std::vector<std::int32_t>{1, 2, 3, 0, 5, 6, 7, 8, 2, 2, 3, 4, 5, 6, 7, 9});
  ds::Tensor<std::int32_t> g1 = strategy.gather(per_replica, 1);
  CHECK(g1.shape() == ds::Shape{2, 4, 2});
  CHECK(g1.values() == std::vector<std::int32_t>{1, 2, 3, 0, 2, 2, 3, 4, 5, 6, 7, 8, 5, 6, 7, 9});
  ds::Tensor<std::int32_t> g2 = strategy.gather(per_replica, 2);
  CHECK(g2.shape() == ds::Shape{2, 2, 4});
  CHECK(g2.values() == std::vector<std::int32_t>{1, 2, 2, 2, 3, 0, 3, 4, 5, 6, 5, 6, 7, 8, 7, 9});
}

TEST_CASE("xtensor: mirrored variables updated with assign_add, row- and column-major") {
  ds::MirroredStrategy<ds::host> strategy(2);
  auto scope = strategy.scope();
  ds::Variable<xt::xarray<double>> w(xt::xarray<double>{1.0, -1.0}, {.name = "w"});
  using ColMajor = Matrix<float, layout_type::column_major>;
  ds::Variable<ColMajor> m(ColMajor{{1, 2}, {3, 4}}, {.name = "m", .aggregation = ds::VariableAggregation::Mean});
  strategy.run([&](ds::ReplicaContext& ctx) {
    const int r = ctx.replica_id_in_sync_group();
    w.assign_add(ctx.all_reduce(ds::ReduceOp::Sum, xt::xarray<double>{double(r), 0.5}));
    m.assign_add(ColMajor{{float(r), 0}, {0, 10.0f * float(r)}});
  });
  for (const auto& copy : w.values()) CHECK(copy == xt::xarray<double>{2.0, 0.0});
  for (const auto& copy : m.values()) {
    CHECK(copy == ColMajor{{1.5f, 2}, {3, 9}});
    CHECK(memory_order(copy) == std::vector<float>{1.5f, 3, 2, 9});
  }
}

TEST_CASE("xtensor: 16-bit float and size-1 axes") {
  ds::MirroredStrategy<ds::host> strategy(2);
  auto out = strategy.run([](ds::ReplicaContext& ctx) {
    const float r = float(ctx.replica_id_in_sync_group());
    xt::xtensor<ds::bfloat16, 1> b = xt::xtensor<ds::bfloat16, 1>::from_shape({2});
    b(0) = ds::bfloat16(1.0f + r);
    b(1) = ds::bfloat16(0.25f);
    // (1, 3) column-major: xtensor gives its size-1 axis stride 0.
    Matrix<float, layout_type::column_major> row = {{r, 2 * r, 3 * r}};
    return std::make_tuple(ctx.all_reduce(ds::ReduceOp::Sum, std::move(b)), ctx.all_gather(row, 0),
                           ctx.all_reduce(ds::ReduceOp::Sum, row));
  });
  CHECK(float(std::get<0>(out)[0](0)) == 3.0f);
  CHECK(float(std::get<0>(out)[1](1)) == 0.5f);
  CHECK(std::get<1>(out)[0].values() == std::vector<float>{0, 0, 0, 1, 2, 3});
  CHECK(std::get<2>(out)[1] == Matrix<float, layout_type::column_major>{{1, 2, 3}});
}

TEST_CASE("xtensor: MultiWorkerMirrored, 2 worker processes") {
  // Every collective, strategy.reduce/gather and variables, checked inside each worker.
  adapters_mp::run_two_workers("xtensor");
}

TEST_CASE("xtensor: a parameter-server cluster: 1 ps, 1 worker") {
#ifdef ADAPTERS_MP_HAVE_PS
  const char* helper = adapters_mp::helper_path();
  if (!helper) {
    MESSAGE("skipped: DISTRIBUTE_ADAPTERS_HELPER is not set (the parameter-server parts need Boost and OpenSSL)");
    return;
  }
  adapters_mp::PsCluster cluster(helper);
  ds::ParameterServerStrategy strategy(cluster.resolver());
  ds::ClusterCoordinator coordinator(strategy, adapters_mp::quiet_options());
  auto scope = strategy.scope();
  // The ps variable is a column-major xtensor; arguments and results are ds::Tensor (cereal does
  // not serialise xtensor containers).
  ds::Variable<Matrix<float, layout_type::column_major>> w(Matrix<float, layout_type::column_major>{{1, 2}, {3, 4}},
                                                           {.name = "w"});
  CHECK(w.device() == "/job:ps/replica:0/task:0/device:CPU:0");
  ds::Tensor<float> seen =
      coordinator.schedule(&adapters_mp::xtensor_add_and_read, w, ds::Tensor<float>({2, 2}, {10, 30, 20, 40})).get();
  CHECK(seen.shape() == ds::Shape{2, 2});
  CHECK(seen.values() == std::vector<float>{11, 32, 23, 44});
  ds::Tensor<ds::bfloat16> half({1, 3}, {ds::bfloat16(1.5f), ds::bfloat16(-2.0f), ds::bfloat16(0x1p-7f)});
  ds::Tensor<ds::bfloat16> twice = coordinator.schedule(&adapters_mp::xtensor_twice, half).get();
  CHECK(adapters_mp::floats(twice) == std::vector<float>{3, -4, 0x1p-6f});
  coordinator.join();
  const auto now = w.read_value();
  CHECK(now.layout() == layout_type::column_major);
  CHECK(memory_order(now) == std::vector<float>{11, 23, 32, 44});
  CHECK(adapters_mp::floats(now) == std::vector<float>{11, 32, 23, 44});
  coordinator.shutdown_cluster();
  cluster.check_stopped();
#else
  MESSAGE("skipped: the parameter-server parts are not built (they need Boost, OpenSSL and cereal)");
#endif
}

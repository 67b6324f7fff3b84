// Eigen values through the collectives, strategies and variables (adapters/eigen.hpp): both storage
// orders, vectors, Maps (in place), Eigen::Tensor of both layouts, Eigen::half and bfloat16.
#define DISTRIBUTE_WITH_PS
#include <distribute/adapters/eigen.hpp>
#include <distribute/distribute.hpp>

#include <doctest/doctest.h>

#include <vector>

// The multi-process cases: tests/adapters_worker_helper processes (adapters_multi_process.hpp).
#define WITH_EIGEN 1
#include "adapters_multi_process.hpp"

namespace ds = distribute;

namespace {

using RowMajorXf = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using RowMajorTensor3i = Eigen::Tensor<int, 3, Eigen::RowMajor>;

template <class M>
M two_by_two() {
  M m(2, 2);
  m << 1, 2, 3, 4;  // operator<< fills row by row whatever the storage order
  return m;
}

template <class T>
std::vector<T> flat(const ds::Tensor<T>& t) {
  return t.values();
}

}  // namespace

TEST_CASE_TEMPLATE("Eigen matrices of either storage order: gather along each axis is the row-major result", M,
                   Eigen::MatrixXf, RowMajorXf) {
  ds::MirroredStrategy<ds::host> strategy(2);
  auto per_replica = strategy.run([](ds::ReplicaContext&) { return two_by_two<M>(); });
  auto rows = strategy.gather(per_replica, 0);
  CHECK(rows.shape() == ds::Shape{4, 2});
  CHECK(flat(rows) == std::vector<float>{1, 2, 3, 4, 1, 2, 3, 4});
  auto cols = strategy.gather(per_replica, 1);
  CHECK(cols.shape() == ds::Shape{2, 4});
  CHECK(flat(cols) == std::vector<float>{1, 2, 1, 2, 3, 4, 3, 4});
  CHECK(flat(strategy.reduce(ds::ReduceOp::Sum, per_replica, 0)) == std::vector<float>{8, 12});
  CHECK(flat(strategy.reduce(ds::ReduceOp::Mean, per_replica, 1)) == std::vector<float>{1.5, 3.5});
  M sum = strategy.reduce(ds::ReduceOp::Sum, per_replica);
  CHECK(sum(0, 1) == 4.0f);
  CHECK(sum(1, 0) == 6.0f);

  auto gathered = strategy.run([](ds::ReplicaContext& ctx) {
    M mine = two_by_two<M>() * float(ctx.replica_id_in_sync_group() + 1);
    return ctx.all_gather(mine, 1);
  });
  CHECK(flat(gathered[1]) == std::vector<float>{1, 2, 2, 4, 3, 4, 6, 8});
}

TEST_CASE("Eigen: all_reduce, broadcast and mirrored variables of matrices, arrays and vectors") {
  ds::MirroredStrategy<ds::host> strategy(3);
  auto scope = strategy.scope();
  ds::Variable<Eigen::Matrix<float, 2, 3>> w(Eigen::Matrix<float, 2, 3>::Zero(), {.name = "w"});
  auto out = strategy.run([&](ds::ReplicaContext& ctx) {
    const float r = float(ctx.replica_id_in_sync_group());
    Eigen::Matrix<float, 2, 3> g;
    g << r, 1, 2, 3, 4, 10 * r;
    auto mean = ctx.all_reduce(ds::ReduceOp::Mean, g);
    w.assign_sub(mean);
    Eigen::ArrayXXd a = Eigen::ArrayXXd::Constant(2, 2, r);
    Eigen::VectorXi v = Eigen::VectorXi::LinSpaced(3, 0, 2) * (int(r) + 1);
    auto [max_a, sum_v] = ctx.all_reduce(ds::ReduceOp::Max, std::move(a), std::move(v));
    auto root = ctx.broadcast(Eigen::Vector2f(r, -r), 2);
    return std::make_tuple(max_a, sum_v, root);
  });
  CHECK(w.values()[0](0, 0) == -1.0f);
  CHECK(w.values()[2](1, 2) == -10.0f);
  CHECK(w.values()[1](0, 1) == -1.0f);
  CHECK(std::get<0>(out)[1](1, 1) == 2.0);
  CHECK(std::get<1>(out)[0](2) == 6);  // max of 2, 4, 6
  CHECK(std::get<2>(out)[0](1) == -2.0f);

  auto vectors = strategy.run([](ds::ReplicaContext& ctx) {
    Eigen::VectorXf v = Eigen::VectorXf::Constant(2, float(ctx.replica_id_in_sync_group()));
    return v;
  });
  auto gathered = strategy.gather(vectors, 0);  // vectors are rank 1
  CHECK(gathered.shape() == ds::Shape{6});
  CHECK(flat(gathered) == std::vector<float>{0, 0, 1, 1, 2, 2});
}

TEST_CASE("Eigen::Map: an rvalue map is reduced in the memory it views, strides included") {
  ds::MirroredStrategy<ds::host> strategy(2);
  strategy.run([](ds::ReplicaContext& ctx) {
    const float r = float(ctx.replica_id_in_sync_group());
    Eigen::MatrixXf big(3, 3);
    big << 1, 2, 3, 4, 5, 6, 7, 8, 9;
    big *= r + 1;
    // The top-right 2x2 block: a column-major map with an outer stride of 3.
    Eigen::Map<Eigen::MatrixXf, 0, Eigen::OuterStride<>> block(big.data() + 3, 2, 2, Eigen::OuterStride<>(3));
    ctx.all_reduce(ds::ReduceOp::Sum, std::move(block));
    CHECK(big(0, 1) == 6.0f);   // 2 + 4
    CHECK(big(1, 2) == 18.0f);  // 6 + 12
    CHECK(big(2, 2) == 9.0f * (r + 1));  // outside the block: untouched
    CHECK(big(0, 0) == 1.0f * (r + 1));

    std::vector<double> buffer{1, 2, 3, 4, 5, 6};
    Eigen::Map<Eigen::Matrix<double, 2, 3, Eigen::RowMajor>> rows(buffer.data());
    auto gathered = ctx.all_gather(rows, 0);  // a Map gathers into a ds::Tensor
    CHECK(gathered.shape() == ds::Shape{4, 3});
    CHECK(gathered.at(3, 2) == 6.0);
  });
}

TEST_CASE("Eigen::Map: all_reduce_into writes the memory a map views; a map of another shape is refused") {
  ds::MirroredStrategy<ds::host> strategy(2);
  std::vector<std::vector<float>> memory(2, std::vector<float>(9, -1.0f));
  strategy.run([&](ds::ReplicaContext& ctx) {
    const auto r = static_cast<std::size_t>(ctx.local_replica_id());
    Eigen::MatrixXf in(2, 2);
    in << 1, 2, 3, 4;
    in *= float(r + 1);
    // A strided 2x2 window of this replica's memory (outer stride 3) receives the sum.
    Eigen::Map<Eigen::MatrixXf, 0, Eigen::OuterStride<>> out(memory[r].data() + 1, 2, 2, Eigen::OuterStride<>(3));
    ctx.all_reduce_into(ds::ReduceOp::Sum, std::as_const(in), out);
    CHECK(in(1, 0) == 3.0f * float(r + 1));
  });
  for (const auto& m : memory) {
    // Column-major with outer stride 3 from offset 1: (0,0) at 1, (1,0) at 2, (0,1) at 4, (1,1) at 5.
    CHECK(m == std::vector<float>{-1, 3, 9, -1, 6, 12, -1, -1, -1});
  }
  CHECK_THROWS_WITH_AS(strategy.run([&](ds::ReplicaContext& ctx) {
                         const auto r = static_cast<std::size_t>(ctx.local_replica_id());
                         const Eigen::Map<const Eigen::VectorXf> in(memory[r].data(), 3);
                         Eigen::Map<Eigen::VectorXf> out(memory[r].data() + 4, 2);
                         ctx.all_reduce_into(ds::ReduceOp::Sum, in, out);
                       }),
                       "all_reduce_into: the output is a view of float32 (2,) strides (1,); it cannot hold the result, float32 (3,) strides (1,)",
                       ds::InvalidArgument);
}

TEST_CASE_TEMPLATE("Eigen::Tensor of either layout: gather along every axis", T, Eigen::Tensor<int, 3>,
                   RowMajorTensor3i) {
  ds::MirroredStrategy<ds::host> strategy(2);
  auto per_replica = strategy.run([](ds::ReplicaContext& ctx) {
    T t(2, 1, 3);
    for (int i = 0; i < 2; ++i)
      for (int k = 0; k < 3; ++k) t(i, 0, k) = 100 * ctx.replica_id_in_sync_group() + 10 * i + k;
    return t;
  });
  for (int axis = 0; axis < 3; ++axis) {
    CAPTURE(axis);
    auto g = strategy.gather(per_replica, axis);
    // Expected from the parts' own logical indexing, walked in row-major order.
    ds::Shape shape{2, 1, 3};
    shape[static_cast<std::size_t>(axis)] *= 2;
    REQUIRE(g.shape() == shape);
    std::vector<int> want;
    for (std::int64_t i = 0; i < shape[0]; ++i)
      for (std::int64_t j = 0; j < shape[1]; ++j)
        for (std::int64_t k = 0; k < shape[2]; ++k) {
          std::int64_t idx[3] = {i, j, k};
          const std::int64_t part_len = shape[static_cast<std::size_t>(axis)] / 2;
          const auto replica = static_cast<std::size_t>(idx[axis] / part_len);
          idx[axis] %= part_len;
          want.push_back(per_replica[replica](idx[0], idx[1], idx[2]));
        }
    CHECK(flat(g) == want);
  }
  auto sum = strategy.reduce(ds::ReduceOp::Sum, per_replica);
  CHECK(sum(1, 0, 2) == 100 + 2 * 12);
}

TEST_CASE("Eigen::half and Eigen::bfloat16 are float16 and bfloat16") {
  static_assert(ds::dtype_of<Eigen::half>() == ds::DType::F16);
  static_assert(ds::dtype_of<Eigen::bfloat16>() == ds::DType::BF16);
  ds::MirroredStrategy<ds::host> strategy(4);
  auto out = strategy.run([](ds::ReplicaContext& ctx) {
    const float mine = ctx.replica_id_in_sync_group() == 0 ? 1.0f : 0x1p-8f;
    Eigen::Matrix<Eigen::bfloat16, Eigen::Dynamic, 1> b(3);
    b.setConstant(Eigen::bfloat16(mine));
    Eigen::Matrix<Eigen::half, 2, 2> h;
    h.setConstant(Eigen::half(0.5f + float(ctx.replica_id_in_sync_group())));
    return ctx.all_reduce(ds::ReduceOp::Sum, std::move(b), std::move(h));
  });
  // float32 accumulation, one rounding: 1 + 3 * 2^-8 rounds (to even) to 1 + 2^-6.
  CHECK(Eigen::numext::bit_cast<std::uint16_t>(std::get<0>(out)[2](1)) == 0x3F82);
  CHECK(float(std::get<1>(out)[0](1, 0)) == 8.0f);
}

TEST_CASE("Eigen: shapes a fixed-size type cannot hold are refused with a message") {
  CHECK_THROWS_WITH_AS(ds::make_value<Eigen::Matrix2f>(ds::DType::F32, {3, 3}),
                       "cannot hold shape (3, 3) in a fixed-size Eigen type of 2x2", ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(ds::make_value<Eigen::VectorXf>(ds::DType::F32, {2, 2}),
                       "cannot hold shape (2, 2) in an Eigen vector (rank 1)", ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(ds::make_value<Eigen::MatrixXf>(ds::DType::F64, {2, 2}),
                       "cannot hold float64 values in a value of element type float32", ds::InvalidArgument);
}

TEST_CASE("Eigen: MultiWorkerMirrored, 2 worker processes") {
  // Every collective, strategy.reduce/gather and variables, checked inside each worker.
  adapters_mp::run_two_workers("eigen");
}

TEST_CASE("Eigen: a parameter-server cluster: 1 ps, 1 worker") {
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
  // The ps variable is a column-major Eigen matrix; arguments and results are ds::Tensor (cereal
  // does not serialise Eigen types).
  ds::Variable<Eigen::MatrixXf> w(two_by_two<Eigen::MatrixXf>(), {.name = "w"});
  CHECK(w.device() == "/job:ps/replica:0/task:0/device:CPU:0");
  ds::Tensor<float> seen =
      coordinator.schedule(&adapters_mp::eigen_add_and_read, w, ds::Tensor<float>({2, 2}, {10, 30, 20, 40})).get();
  CHECK(seen.shape() == ds::Shape{2, 2});
  CHECK(flat(seen) == std::vector<float>{11, 32, 23, 44});
  ds::Tensor<ds::bfloat16> half({1, 3}, {ds::bfloat16(1.5f), ds::bfloat16(-2.0f), ds::bfloat16(0x1p-7f)});
  ds::Tensor<ds::bfloat16> twice = coordinator.schedule(&adapters_mp::eigen_twice, half).get();
  CHECK(adapters_mp::floats(twice) == std::vector<float>{3, -4, 0x1p-6f});
  coordinator.join();
  const Eigen::MatrixXf now = w.read_value();
  CHECK(now(0, 1) == 32.0f);
  CHECK(now(1, 0) == 23.0f);
  CHECK(adapters_mp::floats(now) == std::vector<float>{11, 32, 23, 44});
  coordinator.shutdown_cluster();
  cluster.check_stopped();
#else
  MESSAGE("skipped: the parameter-server parts are not built (they need Boost, OpenSSL and cereal)");
#endif
}

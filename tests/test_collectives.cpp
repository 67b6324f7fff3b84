// Cross-device ops policies (shared memory, reduction to one device, hierarchical copy),
// packing, and CentralStorageStrategy on the host backend.
#include <distribute/distribute.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "../examples/common/logistic_model.hpp"

namespace ds = distribute;

namespace {

// Every replica's input: deterministic, different per replica and element.
template <class T>
std::vector<T> input(int replica, std::size_t size) {
  std::vector<T> v(size);
  std::mt19937 rng(static_cast<unsigned>(replica * 7919 + 17));
  for (auto& x : v) {
    if constexpr (std::is_floating_point_v<T>) x = static_cast<T>(std::uniform_real_distribution<double>(-1, 1)(rng));
    else x = static_cast<T>(static_cast<int>(rng() % 2001) - 1000);
  }
  return v;
}

template <class Ops, class T>
std::vector<std::vector<T>> all_reduce_with(int replicas, std::size_t size, ds::ReduceOp op) {
  ds::MirroredStrategy<ds::host, Ops> strategy(replicas);
  auto out = strategy.run([&](ds::ReplicaContext& ctx) {
    return ctx.all_reduce(op, input<T>(ctx.replica_id_in_sync_group(), size));
  });
  return out.values();
}

template <class Ops>
void check_policy_matches_shared_memory() {
  const std::size_t sizes[] = {0, 1, 1001, (std::size_t{1} << 18) + 3};  // the last: 1 MiB + 12 bytes of float32
  for (int n = 1; n <= 8; ++n) {
    for (std::size_t size : sizes) {
      CAPTURE(n);
      CAPTURE(size);
      for (auto op : {ds::ReduceOp::Sum, ds::ReduceOp::Min, ds::ReduceOp::Max}) {
        auto expect = all_reduce_with<ds::SharedMemoryAllReduce, std::int32_t>(n, size, op);
        auto got = all_reduce_with<Ops, std::int32_t>(n, size, op);
        CHECK(got == expect);  // integers: bit-identical
      }
      for (auto op : {ds::ReduceOp::Sum, ds::ReduceOp::Mean}) {
        auto expect = all_reduce_with<ds::SharedMemoryAllReduce, float>(n, size, op);
        auto got = all_reduce_with<Ops, float>(n, size, op);
        REQUIRE(got.size() == expect.size());
        // Floats: the summation order may differ; bound by n ulps of the sum of magnitudes.
        std::vector<std::vector<float>> inputs;
        for (int k = 0; k < n; ++k) inputs.push_back(input<float>(k, size));
        std::size_t bad = 0;
        for (std::size_t i = 0; i < size; ++i) {
          double magnitude = 0;
          for (int k = 0; k < n; ++k) magnitude += std::abs(inputs[static_cast<std::size_t>(k)][i]);
          const double tolerance = n * std::numeric_limits<float>::epsilon() * std::max(magnitude, 1.0);
          if (std::abs(double(got[0][i]) - double(expect[0][i])) > tolerance) ++bad;
        }
        CHECK(bad == 0);
        // Every replica holds the same bits.
        for (std::size_t r = 1; r < got.size(); ++r) CHECK(got[r] == got[0]);
      }
    }
  }
}

}  // namespace

TEST_CASE("ReductionToOneDevice matches the shared-memory default for 1..8 replicas") {
  check_policy_matches_shared_memory<ds::ReductionToOneDevice>();
}

TEST_CASE("HierarchicalCopyAllReduce matches the shared-memory default for 1..8 replicas") {
  check_policy_matches_shared_memory<ds::HierarchicalCopyAllReduce>();
  check_policy_matches_shared_memory<ds::HierarchicalCopyAllReduceWith<3>>();
}

TEST_CASE("every policy: exact integer results and mismatched inputs are rejected") {
  auto exact = [](auto strategy_tag) {
    using S = decltype(strategy_tag);
    S strategy(4);
    auto out = strategy.run([](ds::ReplicaContext& ctx) {
      const int r = ctx.replica_id_in_sync_group();
      return ctx.all_reduce("sum", std::vector<std::int64_t>{r, 10 * r, 1});
    });
    for (const auto& v : out.values()) CHECK(v == std::vector<std::int64_t>{6, 60, 4});
    auto bad = [](ds::ReplicaContext& ctx) {
      if (ctx.replica_id_in_sync_group() == 3) return ctx.all_reduce("sum", std::vector<double>{1.0}).size();
      return ctx.all_reduce("sum", std::vector<float>{1.0f}).size();
    };
    CHECK_THROWS_WITH_AS(strategy.run(bad),
                         "all_reduce: value 0 is float32 of shape (1,) on replica 0 but float64 of shape (1,) on replica 3",
                         ds::InvalidArgument);
    auto gathered = strategy.run([](ds::ReplicaContext& ctx) { return ctx.all_gather(std::vector<int>{ctx.replica_id_in_sync_group()}, 0); });
    CHECK(gathered[3] == std::vector<int>{0, 1, 2, 3});
  };
  exact(ds::MirroredStrategy<ds::host, ds::SharedMemoryAllReduce>(1));
  exact(ds::MirroredStrategy<ds::host, ds::ReductionToOneDevice>(1));
  exact(ds::MirroredStrategy<ds::host, ds::HierarchicalCopyAllReduce>(1));
}

TEST_CASE("packing follows TF's rule: reverse order, new pack after bytes_per_pack, dtypes apart") {
  // Ten float32 values of 400 bytes each and bytes_per_pack 1000: packs of 3 values
  // (400, 800, 1200 > 1000 closes the pack), taken from the last value backwards.
  std::vector<std::vector<float>> storage(10, std::vector<float>(100));
  std::vector<ds::detail::BufferRef> refs;
  for (auto& s : storage) refs.push_back({s.data(), ds::DType::F32, {100}});
  auto packs = ds::detail::make_packs(refs, 1000);
  REQUIRE(packs.size() == 4);
  CHECK(packs[0].members == std::vector<std::size_t>{9, 8, 7});
  CHECK(packs[1].members == std::vector<std::size_t>{6, 5, 4});
  CHECK(packs[3].members == std::vector<std::size_t>{0});
  CHECK(ds::detail::make_packs(refs, 0).size() == 1);
}

TEST_CASE("200 tensors of mixed sizes and two element types pack, reduce and unpack in order") {
  std::mt19937 rng(3);
  std::vector<std::vector<float>> floats;
  std::vector<std::vector<std::int64_t>> ints;
  std::vector<ds::detail::BufferRef> refs;
  for (int k = 0; k < 200; ++k) {
    const std::size_t n = rng() % 700;
    if (k % 3 == 0) {
      ints.emplace_back(n);
      for (std::size_t i = 0; i < n; ++i) ints.back()[i] = k * 1000 + static_cast<std::int64_t>(i);
    } else {
      floats.emplace_back(n);
      for (std::size_t i = 0; i < n; ++i) floats.back()[i] = static_cast<float>(k) + static_cast<float>(i) / 1024.0f;
    }
  }
  std::size_t fi = 0, ii = 0;
  for (int k = 0; k < 200; ++k) {
    if (k % 3 == 0) refs.push_back({ints[ii].data(), ds::DType::I64, {static_cast<std::int64_t>(ints[ii].size())}}), ++ii;
    else refs.push_back({floats[fi].data(), ds::DType::F32, {static_cast<std::int64_t>(floats[fi].size())}}), ++fi;
  }
  const auto before_floats = floats;
  const auto before_ints = ints;
  for (std::size_t bytes_per_pack : {std::size_t{0}, std::size_t{1024}, std::size_t{32 * 1024}}) {
    auto packs = ds::detail::make_packs(refs, bytes_per_pack);
    std::size_t members = 0;
    for (const auto& p : packs) {
      members += p.members.size();
      for (auto k : p.members) CHECK(refs[k].dtype == p.dtype);  // never mixed
      std::vector<std::byte> flat(p.bytes());
      ds::detail::pack_into(p, refs, flat.data());
      // Scribble over the sources, then unpack: every value must come back exactly.
      for (auto k : p.members) std::memset(refs[k].data, 0xAB, refs[k].bytes());
      ds::detail::unpack_from(p, refs, flat.data());
    }
    CHECK(members == 200);
    CHECK(floats == before_floats);
    CHECK(ints == before_ints);
  }
  // Through a strategy: 200 values in one batch_all_reduce.
  ds::MirroredStrategy<> strategy(3);
  auto out = strategy.run([&](ds::ReplicaContext& ctx) {
    std::vector<ds::Tensor<float>> grads;
    for (int k = 0; k < 200; ++k) grads.push_back(ds::Tensor<float>::full({k % 7 + 1, 3}, float(ctx.replica_id_in_sync_group() + k)));
    return ctx.batch_all_reduce("sum", std::move(grads));
  });
  for (int k = 0; k < 200; ++k) {
    CHECK(out[2][static_cast<std::size_t>(k)] == ds::Tensor<float>::full({k % 7 + 1, 3}, float(3 * k + 3)));
  }
}

TEST_CASE("CentralStorageStrategy: one copy, updates aggregated and applied once per step") {
  ds::CentralStorageStrategy<> strategy(4);
  CHECK(strategy.num_replicas_in_sync() == 4);
  auto scope = strategy.scope();
  ds::Variable<float> sum(0.0f, {.name = "sum", .aggregation = ds::VariableAggregation::Sum});
  ds::Variable<float> mean(0.0f, {.name = "mean", .aggregation = ds::VariableAggregation::Mean});
  ds::Variable<float> none(0.0f, {.name = "none"});
  CHECK(sum.values().size() == 1);
  CHECK(sum.device() == "/job:localhost/replica:0/task:0/device:CPU:0");
  for (int step = 0; step < 3; ++step) {
    auto reads = strategy.run([&](ds::ReplicaContext& ctx) {
      const float r = static_cast<float>(ctx.replica_id_in_sync_group() + 1);
      sum.assign_add(r);        // +10 once per step
      mean.assign_add(r);       // +2.5 once per step
      none.assign_add(1.0f);    // identical values: +1 once per step
      return sum.read_value();  // every replica reads the one, updated copy
    });
    for (float v : reads.values()) CHECK(v == 10.0f * float(step + 1));
  }
  CHECK(sum.read_value() == 30.0f);
  CHECK(mean.read_value() == 7.5f);
  CHECK(none.read_value() == 3.0f);
  // Sync-on-read state stays per replica.
  ds::Variable<float> metric(0.0f, {.name = "metric", .synchronization = ds::VariableSynchronization::OnRead,
                                    .aggregation = ds::VariableAggregation::Sum});
  CHECK(metric.values().size() == 4);
}

TEST_CASE("CentralStorageStrategy(4) matches OneDeviceStrategy on the demo") {
  const auto data = demo::make_data(600, 6, 11);
  demo::TrainConfig config{.epochs = 2, .global_batch = 48, .learning_rate = 0.5f};
  ds::CentralStorageStrategy<> central(4);
  ds::OneDeviceStrategy<> one;
  auto wc = demo::train(central, data, config);
  auto w1 = demo::train(one, data, config);
  float max_diff = 0;
  for (std::size_t k = 0; k < w1.size(); ++k) max_diff = std::max(max_diff, std::abs(wc[k] - w1[k]));
  CHECK(max_diff <= 1e-5f);
}

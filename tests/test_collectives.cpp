// Cross-device ops policies (shared memory, reduction to one device, hierarchical copy),
// packing, and CentralStorageStrategy on the host backend.
#include <distribute/distribute.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

#include "../examples/common/logistic_model.hpp"
#include "support/hashed_values.hpp"
#include "support/tensor_types.hpp"

namespace ds = distribute;

namespace {

// Every replica's input: deterministic, different per replica and element; floats in [-1, 1),
// integers in [-1000, 1000]. Hashed (tests/support/hashed_values.hpp): the tests make millions of
// inputs, and std::mt19937 with a distribution per element took most of the suite's time at -O0.
template <class T>
std::vector<T> input(int replica, std::size_t size) {
  std::vector<T> v(size);
  const auto stream = static_cast<std::uint64_t>(replica);
  for (std::size_t i = 0; i < size; ++i) {
    if constexpr (std::is_floating_point_v<T>) v[i] = static_cast<T>(test_support::hashed_unit(stream, i));
    else v[i] = static_cast<T>(static_cast<int>(test_support::hashed_bits(stream, i) % 2001) - 1000);
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
    // Same element type, different shapes on one replica: the message names both shapes.
    auto reshaped = [](ds::ReplicaContext& ctx) {
      const bool odd_one = ctx.replica_id_in_sync_group() == 2;
      auto t = ds::Tensor<float>::full(odd_one ? ds::Shape{3, 2} : ds::Shape{2, 3}, 1.0f);
      return ctx.all_reduce("sum", std::move(t)).size();
    };
    bool threw_invalid_argument = false;
    try {
      strategy.run(reshaped);
    } catch (const ds::InvalidArgument& e) {
      threw_invalid_argument = true;
      const std::string message = e.what();
      CAPTURE(message);
      CHECK(message.find("(2, 3)") != std::string::npos);
      CHECK(message.find("(3, 2)") != std::string::npos);
    } catch (...) {
    }
    CHECK(threw_invalid_argument);
    // The strategy still works after the failed step.
    auto again = strategy.run([](ds::ReplicaContext& ctx) { return ctx.all_reduce("sum", std::int64_t{5}); });
    for (auto v : again.values()) CHECK(v == 20);
    auto gathered = strategy.run([](ds::ReplicaContext& ctx) { return ctx.all_gather(std::vector<int>{ctx.replica_id_in_sync_group()}, 0); });
    CHECK(gathered[3] == std::vector<int>{0, 1, 2, 3});
  };
  exact(ds::MirroredStrategy<ds::host, ds::SharedMemoryAllReduce>(1));
  exact(ds::MirroredStrategy<ds::host, ds::ReductionToOneDevice>(1));
  exact(ds::MirroredStrategy<ds::host, ds::HierarchicalCopyAllReduce>(1));
}

namespace {

// all_reduce of lvalues beside an rvalue and a column-major lvalue (staged): sums and means
// checked against loops over the inputs, the results new values, the inputs left as they were.
template <class Ops>
void check_lvalues_out_of_place(int n) {
  CAPTURE(n);
  const std::size_t size = 1001;
  ds::MirroredStrategy<ds::host, Ops> strategy(n);
  std::vector<std::vector<std::int64_t>> ints(static_cast<std::size_t>(n));
  std::vector<std::vector<float>> floats(static_cast<std::size_t>(n));
  std::vector<test_types::ColMajor> matrices;
  for (int r = 0; r < n; ++r) {
    ints[static_cast<std::size_t>(r)] = input<std::int64_t>(r, size);
    floats[static_cast<std::size_t>(r)] = input<float>(r, size);
    const auto x = static_cast<float>(r);
    matrices.push_back(test_types::ColMajor::from_rows({{x, 1 + x, 2 + x}, {3 * x, 4 + x, 5}}));
  }
  const auto ints_before = ints;
  const auto floats_before = floats;
  const auto matrices_before = matrices;
  auto out = strategy.run([&](ds::ReplicaContext& ctx) {
    const auto r = static_cast<std::size_t>(ctx.local_replica_id());
    const auto& i = ints[r];
    const auto& f = floats[r];
    auto [si, sf, rvalue, sm] =
        ctx.all_reduce(ds::ReduceOp::Sum, i, f, std::vector<std::int64_t>{static_cast<std::int64_t>(r), 1}, matrices[r]);
    CHECK(si.data() != i.data());
    CHECK(sf.data() != f.data());
    auto mf = ctx.all_reduce(ds::ReduceOp::Mean, f);
    return std::make_tuple(si, sf, rvalue, sm, mf);
  });
  CHECK(ints == ints_before);
  CHECK(floats == floats_before);
  for (int r = 0; r < n; ++r) CHECK(matrices[static_cast<std::size_t>(r)].data == matrices_before[static_cast<std::size_t>(r)].data);
  std::vector<std::int64_t> int_sum(size, 0);
  std::vector<double> float_sum(size, 0.0);
  for (int r = 0; r < n; ++r) {
    for (std::size_t k = 0; k < size; ++k) {
      int_sum[k] += ints_before[static_cast<std::size_t>(r)][k];
      float_sum[k] += floats_before[static_cast<std::size_t>(r)][k];
    }
  }
  const float m = static_cast<float>(n * (n - 1) / 2);  // the sum of 0..n-1
  const auto& [int_sums, float_sums, rvalues, matrix_sums, float_means] = out;
  for (int r = 0; r < n; ++r) {
    const auto& si = int_sums[r];
    const auto& sf = float_sums[r];
    const auto& rvalue = rvalues[r];
    const auto& sm = matrix_sums[r];
    const auto& mf = float_means[r];
    CHECK(si == int_sum);
    std::size_t off = 0;
    for (std::size_t k = 0; k < size; ++k) {
      const double tolerance = 8 * n * std::numeric_limits<float>::epsilon();
      if (std::abs(sf[k] - float_sum[k]) > tolerance || std::abs(mf[k] - float_sum[k] / n) > tolerance) ++off;
    }
    CHECK(off == 0);
    CHECK(rvalue == std::vector<std::int64_t>{static_cast<std::int64_t>(m), n});
    REQUIRE(sm.rows == 2);
    REQUIRE(sm.cols == 3);
    CHECK(sm.at(0, 0) == m);
    CHECK(sm.at(0, 2) == 2 * static_cast<float>(n) + m);
    CHECK(sm.at(1, 0) == 3 * m);
    CHECK(sm.at(1, 2) == 5 * static_cast<float>(n));
  }
}

}  // namespace

TEST_CASE("all_reduce of lvalues returns new values and leaves the inputs as they were (every policy, 1..5 replicas)") {
  for (int n = 1; n <= 5; ++n) {
    check_lvalues_out_of_place<ds::SharedMemoryAllReduce>(n);
    check_lvalues_out_of_place<ds::ReductionToOneDevice>(n);
    check_lvalues_out_of_place<ds::HierarchicalCopyAllReduce>(n);
    check_lvalues_out_of_place<ds::HierarchicalCopyAllReduceWith<3>>(n);
  }
}

TEST_CASE("all_reduce of a 40 MiB lvalue (a copy on huge pages where the kernel has them): exact sums, input unchanged") {
  const std::size_t count = (std::size_t{40} << 20) / sizeof(std::int32_t);
  ds::MirroredStrategy<ds::host> strategy(2);
  std::vector<std::vector<std::int32_t>> inputs(2);
  for (std::size_t r = 0; r < 2; ++r) {
    inputs[r].resize(count);
    for (std::size_t k = 0; k < count; ++k) inputs[r][k] = static_cast<std::int32_t>(k % 1000) * (r == 0 ? 1 : -3);
  }
  auto out = strategy.run([&](ds::ReplicaContext& ctx) {
    return ctx.all_reduce(ds::ReduceOp::Sum, std::as_const(inputs[static_cast<std::size_t>(ctx.local_replica_id())]));
  });
  for (std::size_t r = 0; r < 2; ++r) {
    const auto& sum = out.values()[r];
    REQUIRE(sum.size() == count);
    std::size_t wrong = 0, changed = 0;
    for (std::size_t k = 0; k < count; ++k) {
      if (sum[k] != -2 * static_cast<std::int32_t>(k % 1000)) ++wrong;
      if (inputs[r][k] != static_cast<std::int32_t>(k % 1000) * (r == 0 ? 1 : -3)) ++changed;
    }
    CHECK(wrong == 0);
    CHECK(changed == 0);
  }
}

namespace {

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// Three steps with inputs that change every step, into outputs kept across them (empty at first,
// so the first step makes them): every result is bitwise what all_reduce of a moved copy gives
// (the in-place reduction), the plain all_reduce of the lvalue gives the same bits, the inputs
// are left as they were, and from the second step on every output keeps its memory.
template <class Ops, class T>
void check_into_across_steps(int n, std::size_t size, ds::ReduceOp op) {
  CAPTURE(n);
  CAPTURE(size);
  const auto op_name = fmt::format("{}", op);
  CAPTURE(op_name);
  ds::MirroredStrategy<ds::host, Ops> strategy(n);
  std::vector<std::vector<T>> outputs(static_cast<std::size_t>(n));
  std::vector<const T*> kept(static_cast<std::size_t>(n), nullptr);
  for (int step = 0; step < 3; ++step) {
    CAPTURE(step);
    std::vector<std::vector<T>> inputs;
    for (int r = 0; r < n; ++r) inputs.push_back(input<T>(r + 10 * step, size));
    const auto inputs_before = inputs;
    auto out = strategy.run([&](ds::ReplicaContext& ctx) {
      const auto r = static_cast<std::size_t>(ctx.local_replica_id());
      const std::vector<T>& in = inputs[r];
      ctx.all_reduce_into(op, in, outputs[r]);
      auto plain = ctx.all_reduce(op, in);
      auto in_place = ctx.all_reduce(op, std::vector<T>(in));
      const std::vector<std::vector<T>> list{in, std::vector<T>(in.rbegin(), in.rend())};
      auto batched = ctx.batch_all_reduce(op, list);  // a list lvalue: out of place as well
      CHECK(list[0] == in);
      return std::make_tuple(plain, in_place, batched);
    });
    const auto& [plain, in_place, batched] = out;
    CHECK(inputs == inputs_before);
    for (int r = 0; r < n; ++r) {
      const auto k = static_cast<std::size_t>(r);
      CHECK(same_bits(outputs[k], in_place[r]));
      CHECK(same_bits(plain[r], in_place[r]));
      REQUIRE(batched[r].size() == 2);
      CHECK(same_bits(batched[r][0], in_place[r]));
      CHECK(same_bits(batched[r][1], std::vector<T>(in_place[r].rbegin(), in_place[r].rend())));
      CHECK(same_bits(outputs[k], outputs[0]));
      if (step > 0 && size > 0) CHECK(outputs[k].data() == kept[k]);
      kept[k] = outputs[k].data();
    }
  }
  // The results against a loop over the inputs of the last step (integers: exact).
  if constexpr (std::is_integral_v<T>) {
    std::vector<std::vector<T>> last;
    for (int r = 0; r < n; ++r) last.push_back(input<T>(r + 20, size));
    for (std::size_t i = 0; i < size; ++i) {
      std::int64_t sum = 0;
      for (int r = 0; r < n; ++r) sum += static_cast<std::int64_t>(last[static_cast<std::size_t>(r)][i]);
      if (op == ds::ReduceOp::Sum && outputs[0][i] != static_cast<T>(sum)) FAIL_CHECK("wrong sum at " << i);
    }
  }
}

template <class Ops>
void check_into_policy() {
  for (int n = 1; n <= 5; ++n) {
    for (std::size_t size : {std::size_t{0}, std::size_t{1}, std::size_t{1001}}) {
      check_into_across_steps<Ops, std::int64_t>(n, size, ds::ReduceOp::Sum);
      check_into_across_steps<Ops, std::int32_t>(n, size, ds::ReduceOp::Max);
      check_into_across_steps<Ops, float>(n, size, ds::ReduceOp::Sum);
      check_into_across_steps<Ops, float>(n, size, ds::ReduceOp::Mean);
      check_into_across_steps<Ops, double>(n, size, ds::ReduceOp::Mean);
      check_into_across_steps<Ops, ds::bfloat16>(n, size, ds::ReduceOp::Sum);
    }
  }
}

}  // namespace

TEST_CASE("all_reduce_into: bitwise all_reduce's result, into outputs kept across steps (every policy, 1..5 replicas)") {
  check_into_policy<ds::SharedMemoryAllReduce>();
  check_into_policy<ds::ReductionToOneDevice>();
  check_into_policy<ds::HierarchicalCopyAllReduce>();
  check_into_policy<ds::HierarchicalCopyAllReduceWith<3>>();
}

TEST_CASE("all_reduce_into: in place, column-major and run-time-typed outputs, one output across strategies") {
  // The input itself as the output: reduced in place.
  {
    ds::MirroredStrategy<ds::host> strategy(3);
    std::vector<std::vector<std::int64_t>> values{{1, 2}, {10, 20}, {100, 200}};
    strategy.run([&](ds::ReplicaContext& ctx) {
      auto& v = values[static_cast<std::size_t>(ctx.local_replica_id())];
      ctx.all_reduce_into(ds::ReduceOp::Sum, v, v);
    });
    for (const auto& v : values) CHECK(v == std::vector<std::int64_t>{111, 222});
  }
  // A column-major output (written through a row-major staging buffer) kept across two steps.
  {
    ds::MirroredStrategy<ds::host> strategy(2);
    std::vector<test_types::ColMajor> inputs{test_types::ColMajor::from_rows({{1, 2, 3}, {4, 5, 6}}),
                                            test_types::ColMajor::from_rows({{10, 20, 30}, {40, 50, 60}})};
    std::vector<test_types::ColMajor> outputs(2);
    std::vector<const float*> kept(2);
    for (int step = 0; step < 2; ++step) {
      strategy.run([&](ds::ReplicaContext& ctx) {
        const auto r = static_cast<std::size_t>(ctx.local_replica_id());
        ctx.all_reduce_into(ds::ReduceOp::Sum, std::as_const(inputs[r]), outputs[r]);
      });
      for (std::size_t r = 0; r < 2; ++r) {
        REQUIRE(outputs[r].rows == 2);
        REQUIRE(outputs[r].cols == 3);
        CHECK(outputs[r].at(0, 1) == 22);
        CHECK(outputs[r].at(1, 0) == 44);
        CHECK(outputs[r].at(1, 2) == 66);
        if (step == 1) CHECK(outputs[r].data.data() == kept[r]);
        kept[r] = outputs[r].data.data();
      }
    }
    CHECK(inputs[0].at(1, 2) == 6);
  }
  // A run-time-typed output of another dtype is replaced; one that shares the input's storage (as
  // a copy of a torch::Tensor does) is the input's memory: reduced in place.
  {
    ds::MirroredStrategy<ds::host> strategy(2);
    std::vector<test_types::DynTensor> inputs{test_types::DynTensor::of<double>({2}, {1.5, 2.5}),
                                             test_types::DynTensor::of<double>({2}, {10.0, 20.0})};
    std::vector<test_types::DynTensor> outputs{test_types::DynTensor::of<float>({3}, {0, 0, 0}),
                                              test_types::DynTensor::of<float>({3}, {0, 0, 0})};
    strategy.run([&](ds::ReplicaContext& ctx) {
      const auto r = static_cast<std::size_t>(ctx.local_replica_id());
      ctx.all_reduce_into(ds::ReduceOp::Sum, std::as_const(inputs[r]), outputs[r]);
    });
    for (const auto& o : outputs) {
      CHECK(o.dtype == ds::DType::F64);
      CHECK(o.shape == ds::Shape{2});
      CHECK(o.get<double>(0) == 11.5);
      CHECK(o.get<double>(1) == 22.5);
    }
    CHECK(inputs[0].get<double>(0) == 1.5);
    std::vector<test_types::DynTensor> handles = inputs;  // the same storage
    strategy.run([&](ds::ReplicaContext& ctx) {
      const auto r = static_cast<std::size_t>(ctx.local_replica_id());
      ctx.all_reduce_into(ds::ReduceOp::Sum, std::as_const(inputs[r]), handles[r]);
    });
    CHECK(inputs[0].get<double>(0) == 11.5);
    CHECK(inputs[1].get<double>(1) == 22.5);
  }
  // An output of another type: a std::vector reduced into a ds::Tensor kept across two steps.
  {
    ds::MirroredStrategy<ds::host> strategy(2);
    std::vector<ds::Tensor<std::int32_t>> outputs(2);
    std::vector<const std::int32_t*> kept(2);
    for (int step = 0; step < 2; ++step) {
      strategy.run([&](ds::ReplicaContext& ctx) {
        const auto r = static_cast<std::size_t>(ctx.local_replica_id());
        const std::vector<std::int32_t> in{static_cast<std::int32_t>(r) + step, 7};
        ctx.all_reduce_into(ds::ReduceOp::Sum, in, outputs[r]);
      });
      for (std::size_t r = 0; r < 2; ++r) {
        CHECK(outputs[r] == ds::Tensor<std::int32_t>{1 + 2 * step, 14});
        if (step == 1) CHECK(outputs[r].data() == kept[r]);
        kept[r] = outputs[r].data();
      }
    }
  }
  // The same outputs through strategies of other sizes and policies: always the new strategy's
  // result; the memory is kept wherever the shape stays.
  {
    std::vector<std::vector<float>> outputs(4);
    auto step = [&](auto& strategy, float scale) {
      strategy.run([&](ds::ReplicaContext& ctx) {
        const auto r = static_cast<std::size_t>(ctx.local_replica_id());
        const std::vector<float> in(5, scale * static_cast<float>(r + 1));
        ctx.all_reduce_into(ds::ReduceOp::Sum, in, outputs[r]);
      });
    };
    ds::MirroredStrategy<ds::host> four(4);
    ds::MirroredStrategy<ds::host, ds::ReductionToOneDevice> two(2);
    step(four, 1.0f);
    const float* first = outputs[0].data();
    for (const auto& o : outputs) CHECK(o == std::vector<float>(5, 10.0f));
    step(two, 2.0f);
    CHECK(outputs[0].data() == first);
    CHECK(outputs[0] == std::vector<float>(5, 6.0f));
    CHECK(outputs[1] == std::vector<float>(5, 6.0f));
    CHECK(outputs[3] == std::vector<float>(5, 10.0f));  // replica 3 of the first strategy, untouched
    step(four, 3.0f);
    CHECK(outputs[0].data() == first);
    for (const auto& o : outputs) CHECK(o == std::vector<float>(5, 30.0f));
  }
}

TEST_CASE("all_reduce_into: an output overlapping its input or another replica's buffers is refused") {
  ds::MirroredStrategy<ds::host> strategy(2);
  // Within one replica: a view one element into the input's storage, and its transpose.
  auto storage_of = [](std::initializer_list<float> v) { return test_types::DynTensor::of<float>({static_cast<std::int64_t>(v.size())}, v); };
  std::vector<test_types::DynTensor> inputs{storage_of({1, 2, 3, 4, 5}), storage_of({1, 2, 3, 4, 5})};
  for (auto& in : inputs) in.shape = {4};
  CHECK_THROWS_WITH_AS(strategy.run([&](ds::ReplicaContext& ctx) {
                         const auto r = static_cast<std::size_t>(ctx.local_replica_id());
                         test_types::DynTensor shifted = inputs[r];
                         shifted.offset = 1;
                         ctx.all_reduce_into(ds::ReduceOp::Sum, std::as_const(inputs[r]), shifted);
                       }),
                       "all_reduce_into: the output (float32 (4,)) overlaps the input (float32 (4,)) without being it; "
                       "pass the input itself to reduce in place, or an output of its own",
                       ds::InvalidArgument);
  std::vector<test_types::DynTensor> squares{test_types::DynTensor::of<float>({2, 2}, {1, 2, 3, 4}),
                                            test_types::DynTensor::of<float>({2, 2}, {1, 2, 3, 4})};
  CHECK_THROWS_WITH_AS(strategy.run([&](ds::ReplicaContext& ctx) {
                         const auto r = static_cast<std::size_t>(ctx.local_replica_id());
                         test_types::DynTensor t = squares[r].transposed();
                         ctx.all_reduce_into(ds::ReduceOp::Sum, std::as_const(squares[r]), t);
                       }),
                       "all_reduce_into: the output (float32 (2, 2) strides (1, 2)) overlaps the input (float32 (2, 2)) "
                       "without being it; pass the input itself to reduce in place, or an output of its own",
                       ds::InvalidArgument);
  CHECK(squares[0].get<float>(1) == 2);  // nothing written
  // Across replicas: one output shared by both, and an output that is the other replica's input.
  std::vector<float> shared(3, 0.0f);
  CHECK_THROWS_WITH_AS(strategy.run([&](ds::ReplicaContext& ctx) {
                         const std::vector<float> in(3, 1.0f);
                         ctx.all_reduce_into(ds::ReduceOp::Sum, in, shared);
                       }),
                       "all_reduce_into: the output of replica 0 overlaps the output of replica 1; every replica "
                       "needs an output of its own",
                       ds::InvalidArgument);
  CHECK(shared == std::vector<float>(3, 0.0f));
  std::vector<std::vector<float>> values{{1, 2}, {3, 4}};
  CHECK_THROWS_WITH_AS(strategy.run([&](ds::ReplicaContext& ctx) {
                         const auto r = static_cast<std::size_t>(ctx.local_replica_id());
                         ctx.all_reduce_into(ds::ReduceOp::Sum, std::as_const(values[r]), values[1 - r]);
                       }),
                       "all_reduce_into: the output of replica 0 overlaps the input of replica 1; every replica needs "
                       "an output of its own",
                       ds::InvalidArgument);
  CHECK(values == std::vector<std::vector<float>>{{1, 2}, {3, 4}});
  // An output whose element type cannot hold the input's.
  CHECK_THROWS_WITH_AS(strategy.run([&](ds::ReplicaContext& ctx) {
                         const std::vector<float> in(2, 1.0f);
                         std::vector<double> out;
                         ctx.all_reduce_into(ds::ReduceOp::Sum, in, out);
                       }),
                       "cannot hold float32 values in a value of element type float64", ds::InvalidArgument);
  // Replicas that disagree on the value: all_reduce's mismatch message; MEAN of booleans.
  CHECK_THROWS_WITH_AS(strategy.run([&](ds::ReplicaContext& ctx) {
                         const std::vector<float> in(ctx.local_replica_id() == 0 ? 2 : 3, 1.0f);
                         std::vector<float> out;
                         ctx.all_reduce_into(ds::ReduceOp::Sum, in, out);
                       }),
                       "all_reduce: value 0 is float32 of shape (2,) on replica 0 but float32 of shape (3,) on replica 1",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(strategy.run([&](ds::ReplicaContext& ctx) {
                         test_types::DynTensor flags = test_types::DynTensor::of<bool>({2}, {true, false});
                         test_types::DynTensor out;
                         ctx.all_reduce_into(ds::ReduceOp::Mean, std::as_const(flags), out);
                       }),
                       "all_reduce_into: MEAN is not defined for bool values", ds::InvalidArgument);
  // The strategy still works.
  std::vector<std::vector<float>> outputs(2);
  strategy.run([&](ds::ReplicaContext& ctx) {
    const std::vector<float> in(2, 2.0f);
    ctx.all_reduce_into(ds::ReduceOp::Sum, in, outputs[static_cast<std::size_t>(ctx.local_replica_id())]);
  });
  CHECK(outputs[1] == std::vector<float>{4, 4});
}

TEST_CASE("packing follows TF's rule: reverse order, new pack after bytes_per_pack, dtypes apart") {
  // Ten float32 values of 400 bytes each and bytes_per_pack 1000: packs of 3 values
  // (400, 800, 1200 > 1000 closes the pack), taken from the last value backwards.
  std::vector<std::vector<float>> storage(10, std::vector<float>(100));
  std::vector<ds::core::BufferRef> refs;
  for (auto& s : storage) refs.push_back({s.data(), ds::DType::F32, {100}});
  auto packs = ds::collective::detail::make_packs(refs, 1000);
  REQUIRE(packs.size() == 4);
  CHECK(packs[0].members == std::vector<std::size_t>{9, 8, 7});
  CHECK(packs[1].members == std::vector<std::size_t>{6, 5, 4});
  CHECK(packs[3].members == std::vector<std::size_t>{0});
  CHECK(ds::collective::detail::make_packs(refs, 0).size() == 1);
}

TEST_CASE("200 tensors of mixed sizes and two element types pack, reduce and unpack in order") {
  std::mt19937 rng(3);
  std::vector<std::vector<float>> floats;
  std::vector<std::vector<std::int64_t>> ints;
  std::vector<ds::core::BufferRef> refs;
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
    auto packs = ds::collective::detail::make_packs(refs, bytes_per_pack);
    std::size_t members = 0;
    for (const auto& p : packs) {
      members += p.members.size();
      for (auto k : p.members) CHECK(refs[k].dtype == p.dtype);  // never mixed
      std::vector<std::byte> flat(p.bytes());
      ds::collective::detail::pack_into(p, refs, flat.data());
      // Scribble over the sources, then unpack: every value must come back exactly.
      for (auto k : p.members) std::memset(refs[k].data, 0xAB, refs[k].bytes());
      ds::collective::detail::unpack_from(p, refs, flat.data());
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

namespace {

// 200 tensors of two element types (every third one int64, the rest float32) and varied shapes:
// scalars, empty tensors, ranks 1..3 and a few of several KiB, so that packs of 1 KiB and 32 KiB
// hold from one to many values.
constexpr std::size_t kMixedTensors = 200;
// The variadic call takes the first 64 of them: a pack of 200 arguments made this file take ten
// minutes to compile, and 64 already spread over many 1 KiB packs (four of them larger than that).
constexpr std::size_t kVariadicTensors = 64;
constexpr bool mixed_is_int(std::size_t k) { return k % 3 == 0; }
template <std::size_t K>
using MixedElement = std::conditional_t<mixed_is_int(K), std::int64_t, float>;

ds::Shape mixed_shape(std::size_t k) {
  if (k % 17 == 5) return {64, static_cast<std::int64_t>(40 + k % 9)};  // 10..12 KiB
  std::mt19937 rng(static_cast<unsigned>(1000 + k));
  const std::size_t rank = rng() % 4;
  ds::Shape shape;
  for (std::size_t d = 0; d < rank; ++d) shape.push_back(static_cast<std::int64_t>(rng() % 9));  // 0..8: some empty
  return shape;
}

std::size_t mixed_count(const ds::Shape& shape) {
  std::size_t n = 1;
  for (auto d : shape) n *= static_cast<std::size_t>(d);
  return n;
}

// Replica r's element i of tensor k. Floats are multiples of 1/4 below 2^13, so every sum over
// up to 8 replicas is exact in float32 whatever the order; ints use the upper bits of int64.
float mixed_float(int r, std::size_t k, std::size_t i) {
  return static_cast<float>((k * 31 + i * 7) % 4096) + 0.25f * static_cast<float>(r + 1);
}
std::int64_t mixed_int(int r, std::size_t k, std::size_t i) {
  return (static_cast<std::int64_t>(k + 1) << 40) + static_cast<std::int64_t>(i) * (r + 1) - 3 * r;
}

template <class T>
ds::Tensor<T> mixed_tensor(int r, std::size_t k) {
  const auto shape = mixed_shape(k);
  std::vector<T> data(mixed_count(shape));
  for (std::size_t i = 0; i < data.size(); ++i) {
    if constexpr (std::is_same_v<T, float>) data[i] = mixed_float(r, k, i);
    else data[i] = mixed_int(r, k, i);
  }
  return ds::Tensor<T>(shape, std::move(data));
}

// A reduced tensor as the test compares it: element type, shape and values.
struct MixedResult {
  bool is_int = false;
  ds::Shape shape;
  std::vector<float> floats;
  std::vector<std::int64_t> ints;
  friend bool operator==(const MixedResult&, const MixedResult&) = default;
};

template <class T>
MixedResult mixed_result(const ds::Tensor<T>& t) {
  MixedResult out;
  out.is_int = std::is_same_v<T, std::int64_t>;
  out.shape = t.shape();
  if constexpr (std::is_same_v<T, float>) out.floats.assign(t.begin(), t.end());
  else out.ints.assign(t.begin(), t.end());
  return out;
}

// The expected SUM over `replicas` replicas, computed here element by element.
MixedResult mixed_expected(int replicas, std::size_t k) {
  MixedResult out;
  out.is_int = mixed_is_int(k);
  out.shape = mixed_shape(k);
  const std::size_t n = mixed_count(out.shape);
  for (std::size_t i = 0; i < n; ++i) {
    if (out.is_int) {
      std::int64_t sum = 0;
      for (int r = 0; r < replicas; ++r) sum += mixed_int(r, k, i);
      out.ints.push_back(sum);
    } else {
      double sum = 0;
      for (int r = 0; r < replicas; ++r) sum += mixed_float(r, k, i);
      out.floats.push_back(static_cast<float>(sum));
    }
  }
  return out;
}

// The first kVariadicTensors values in one variadic all_reduce (mixed element types in one call).
template <std::size_t... K>
std::vector<MixedResult> mixed_variadic_all_reduce(ds::ReplicaContext& ctx, std::index_sequence<K...>) {
  const int r = ctx.replica_id_in_sync_group();
  auto reduced = ctx.all_reduce(ds::ReduceOp::Sum, mixed_tensor<MixedElement<K>>(r, K)...);
  std::vector<MixedResult> out;
  out.reserve(sizeof...(K));
  (out.push_back(mixed_result(std::get<K>(reduced))), ...);
  return out;
}

// The same values through batch_all_reduce: one call per element type, merged back in order.
std::vector<MixedResult> mixed_batch_all_reduce(ds::ReplicaContext& ctx) {
  const int r = ctx.replica_id_in_sync_group();
  std::vector<ds::Tensor<float>> floats;
  std::vector<ds::Tensor<std::int64_t>> ints;
  for (std::size_t k = 0; k < kMixedTensors; ++k) {
    if (mixed_is_int(k)) ints.push_back(mixed_tensor<std::int64_t>(r, k));
    else floats.push_back(mixed_tensor<float>(r, k));
  }
  floats = ctx.batch_all_reduce(ds::ReduceOp::Sum, std::move(floats));
  ints = ctx.batch_all_reduce(ds::ReduceOp::Sum, std::move(ints));
  std::vector<MixedResult> out;
  std::size_t fi = 0, ii = 0;
  for (std::size_t k = 0; k < kMixedTensors; ++k) {
    out.push_back(mixed_is_int(k) ? mixed_result(ints.at(ii++)) : mixed_result(floats.at(fi++)));
  }
  return out;
}

template <class Ops>
void check_mixed_200(int replicas, std::size_t bytes_per_pack) {
  CAPTURE(replicas);
  CAPTURE(bytes_per_pack);
  ds::MirroredStrategy<ds::host, Ops> strategy(replicas, ds::CommunicationOptions{.bytes_per_pack = bytes_per_pack});
  std::vector<MixedResult> expected;
  for (std::size_t k = 0; k < kMixedTensors; ++k) expected.push_back(mixed_expected(replicas, k));
  auto variadic = strategy.run(
      [](ds::ReplicaContext& ctx) { return mixed_variadic_all_reduce(ctx, std::make_index_sequence<kVariadicTensors>{}); });
  auto batched = strategy.run([](ds::ReplicaContext& ctx) { return mixed_batch_all_reduce(ctx); });
  for (int r = 0; r < replicas; ++r) {
    CAPTURE(r);
    for (const auto* got : {&variadic[static_cast<std::size_t>(r)], &batched[static_cast<std::size_t>(r)]}) {
      const std::size_t n = got == &variadic[static_cast<std::size_t>(r)] ? kVariadicTensors : kMixedTensors;
      REQUIRE(got->size() == n);
      std::size_t wrong = 0;
      for (std::size_t k = 0; k < n; ++k) {
        if ((*got)[k] == expected[k]) continue;
        ++wrong;
        CAPTURE(k);
        CHECK((*got)[k].is_int == expected[k].is_int);
        CHECK((*got)[k].shape == expected[k].shape);
        CHECK((*got)[k].floats == expected[k].floats);
        CHECK((*got)[k].ints == expected[k].ints);
      }
      CHECK(wrong == 0);
    }
  }
}

template <class Ops>
void check_mixed_200_all_packings() {
  for (std::size_t bytes_per_pack : {std::size_t{0}, std::size_t{1024}, std::size_t{32 * 1024}}) {
    for (int replicas : {3, 4}) check_mixed_200<Ops>(replicas, bytes_per_pack);
  }
}

}  // namespace

TEST_CASE("200 mixed float32/int64 tensors through batch all_reduce and 64 through variadic, every policy and bytes_per_pack") {
  // The inputs of the variadic call (the first 64; batch_all_reduce takes all 200) cover what the
  // check relies on: both element types, empty and scalar values, and values larger than 1 KiB.
  std::size_t ints = 0, empty = 0, scalars = 0, large = 0;
  for (std::size_t k = 0; k < kVariadicTensors; ++k) {
    const auto shape = mixed_shape(k);
    ints += mixed_is_int(k);
    empty += mixed_count(shape) == 0;
    scalars += shape.empty();
    large += mixed_count(shape) * 4 > 1024;
  }
  REQUIRE(ints > 16);
  REQUIRE(empty > 0);
  REQUIRE(scalars > 0);
  REQUIRE(large >= 4);
  SUBCASE("SharedMemoryAllReduce (the host default)") {
    static_assert(std::is_same_v<ds::MirroredStrategy<ds::host>, ds::MirroredStrategy<ds::host, ds::SharedMemoryAllReduce>>);
    check_mixed_200_all_packings<ds::SharedMemoryAllReduce>();
  }
  SUBCASE("ReductionToOneDevice") { check_mixed_200_all_packings<ds::ReductionToOneDevice>(); }
  SUBCASE("HierarchicalCopyAllReduce") { check_mixed_200_all_packings<ds::HierarchicalCopyAllReduce>(); }
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

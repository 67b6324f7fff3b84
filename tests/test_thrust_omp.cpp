// The device-shaped code paths without a GPU: built by the host compiler with Thrust's OpenMP
// device system (-DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP -fopenmp) and again with the
// sequential CPP system. thrust::device_vector and ds::DeviceTensor are then "device" values
// (MemorySpace::device) whose memory happens to be host memory, so every `if constexpr (device)`
// branch of the strategies, variables and collectives runs here as it runs on a GPU under nvcc.
// The umbrella brings in backends/cuda/device_tensor.hpp when a Thrust device system is chosen,
// so this file builds against include/ and against single_include/ alike.
#include <distribute/distribute.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <tuple>
#include <type_traits>
#include <vector>

#include <thrust/copy.h>
#include <thrust/device_vector.h>
#include <thrust/fill.h>

namespace ds = distribute;

#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
#error "test_thrust_omp.cpp is the CPU build of the device paths: pick THRUST_DEVICE_SYSTEM_OMP or _CPP"
#endif

namespace {

template <class T>
using dvec = thrust::device_vector<T>;

template <class T>
std::vector<T> host_of(const dvec<T>& v) {
  std::vector<T> out(v.size());
  thrust::copy(v.begin(), v.end(), out.begin());
  return out;
}
template <class T>
dvec<T> device_of(const std::vector<T>& v) {
  return dvec<T>(v.begin(), v.end());
}

// Deterministic inputs, different per seed; small enough that no integer op overflows a signed type.
template <class T>
std::vector<T> input(unsigned seed, std::size_t size) {
  std::vector<T> v(size);
  std::mt19937 rng(seed * 7919u + 17u);
  for (std::size_t i = 0; i < size; ++i) {
    if constexpr (std::is_same_v<T, bool>) v[i] = rng() % 2 == 1;
    else if constexpr (std::is_floating_point_v<T>) v[i] = static_cast<T>(std::uniform_real_distribution<double>(-4, 4)(rng));
    else if constexpr (std::is_signed_v<T>) v[i] = static_cast<T>(static_cast<int>(rng() % 21) - 10);
    else v[i] = static_cast<T>(rng() % 11);
  }
  if constexpr (std::is_floating_point_v<T>) {
    // Where min/max conventions differ: signed zeros, infinities and NaN.
    const T special[] = {T(0), -T(0), std::numeric_limits<T>::infinity(), -std::numeric_limits<T>::infinity(),
                         std::numeric_limits<T>::quiet_NaN()};
    for (std::size_t i = 0; i < size; i += 7) v[i] = special[(i / 7 + seed) % 5];
  }
  return v;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return false;
  if constexpr (std::is_same_v<T, bool>) return a == b;
  else return a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// The device kernels against the host kernels of core/elementwise.hpp.
template <class T>
void check_kernels_for_type() {
  CAPTURE(ds::to_string(ds::dtype_of<T>()));
  for (std::size_t size : {std::size_t{0}, std::size_t{1}, std::size_t{1037}}) {
    CAPTURE(size);
    for (auto op : {ds::ReduceOp::Sum, ds::ReduceOp::Mean, ds::ReduceOp::Min, ds::ReduceOp::Max, ds::ReduceOp::Product}) {
      CAPTURE(op);
      auto a = input<T>(1, size);
      const auto b = input<T>(2, size);
      // std::vector<bool> has no data(); the host kernel gets plain arrays.
      std::unique_ptr<T[]> host_acc(new T[size + 1]);
      std::unique_ptr<T[]> host_src(new T[size + 1]);
      for (std::size_t i = 0; i < size; ++i) host_acc[i] = a[i], host_src[i] = b[i];
      ds::core::combine(host_acc.get(), host_src.get(), size, op);
      std::vector<T> expect(host_acc.get(), host_acc.get() + size);

      auto acc = device_of(a);
      const auto src = device_of(b);
      ds::core::device_ops<dvec<T>>::combine(acc, src, op);
      CHECK(same_bits(host_of(acc), expect));  // bit for bit, floats included (same expressions)
    }
    if constexpr (!std::is_same_v<T, bool>) {
      for (std::int64_t divisor : {1, 3, 8}) {
        auto a = input<T>(3, size);
        std::vector<T> expect = a;
        ds::core::divide(expect.data(), expect.size(), divisor);
        auto acc = device_of(a);
        ds::core::device_ops<dvec<T>>::divide(acc, divisor);
        CHECK(same_bits(host_of(acc), expect));
        // The type-erased entry the NCCL collective uses for integer MEAN.
        auto raw = device_of(a);
        ds::backends::device_kernels::divide(thrust::raw_pointer_cast(raw.data()), ds::dtype_of<T>(), raw.size(), divisor);
        CHECK(same_bits(host_of(raw), expect));
      }
    }
  }
}

}  // namespace

TEST_CASE("tensor_traits: thrust::device_vector and DeviceTensor live in device memory") {
  static_assert(ds::TensorLike<dvec<float>>);
  static_assert(ds::TensorLike<dvec<bool>>);
  static_assert(ds::TensorLike<ds::DeviceTensor<std::int64_t>>);
  static_assert(ds::memory_space_v<dvec<float>> == ds::MemorySpace::device);
  static_assert(ds::memory_space_v<ds::DeviceTensor<double>> == ds::MemorySpace::device);
  static_assert(ds::memory_space_v<std::vector<float>> == ds::MemorySpace::host);
  static_assert(ds::memory_space_v<ds::Tensor<float>> == ds::MemorySpace::host);
  static_assert(std::is_same_v<ds::gathered_t<dvec<int>>, dvec<int>>);
  static_assert(std::is_same_v<ds::gathered_t<ds::DeviceTensor<int>>, ds::DeviceTensor<int>>);
  static_assert(std::is_same_v<ds::element_t<dvec<std::uint16_t>>, std::uint16_t>);

  using traits = ds::tensor_traits<dvec<float>>;
  dvec<float> v(5, 2.0f);
  CHECK(traits::shape(v) == ds::Shape{5});
  CHECK(traits::data(v) == thrust::raw_pointer_cast(v.data()));
  CHECK(host_of(traits::make({3})) == std::vector<float>{0, 0, 0});
  CHECK_THROWS_WITH_AS(traits::make({2, 2}), doctest::Contains("cannot hold shape (2, 2) in a thrust::device_vector"),
                       ds::InvalidArgument);

  ds::DeviceTensor<int> t({2, 3}, std::vector<int>{1, 2, 3, 4, 5, 6});
  CHECK(t.shape() == ds::Shape{2, 3});
  CHECK(t.size() == 6);
  CHECK(t.to_host() == ds::Tensor<int>({2, 3}, {1, 2, 3, 4, 5, 6}));
  CHECK(ds::DeviceTensor<int>::from_host(t.to_host()) == t);
  CHECK(ds::DeviceTensor<int>({2, 3}) == ds::DeviceTensor<int>::zeros({2, 3}));
  CHECK(ds::DeviceTensor<int>().shape() == ds::Shape{0});
  CHECK(fmt::format("{}", t) == "DeviceTensor<int32>(shape=(2, 3), [[1, 2, 3], [4, 5, 6]])");
  CHECK_THROWS_WITH_AS(ds::DeviceTensor<int>({2, 2}, std::vector<int>{1}),
                       "DeviceTensor: shape (2, 2) holds 4 elements but 1 values were given", ds::InvalidArgument);
  CHECK_THROWS_AS(ds::DeviceTensor<int>(ds::Shape{-1}), ds::InvalidArgument);
  CHECK(ds::tensor_traits<ds::DeviceTensor<int>>::make({2, 2}).to_host() == ds::Tensor<int>::zeros({2, 2}));
}

TEST_CASE("device kernels are bit-identical to the host kernels for every op and element type") {
  check_kernels_for_type<float>();
  check_kernels_for_type<double>();
  check_kernels_for_type<std::int8_t>();
  check_kernels_for_type<std::int16_t>();
  check_kernels_for_type<std::int32_t>();
  check_kernels_for_type<std::int64_t>();
  check_kernels_for_type<std::uint8_t>();
  check_kernels_for_type<std::uint16_t>();
  check_kernels_for_type<std::uint32_t>();
  check_kernels_for_type<std::uint64_t>();
  check_kernels_for_type<bool>();
}

TEST_CASE("device_ops: updates, host copies and concatenation along every axis") {
  using ops = ds::core::device_ops<ds::DeviceTensor<float>>;
  ds::DeviceTensor<float> a({2, 2}, std::vector<float>{1, 2, 3, 4});
  const ds::DeviceTensor<float> b({2, 2}, std::vector<float>{10, 20, 30, 40});
  ops::add(a, b);
  CHECK(a.to_host() == ds::Tensor<float>({2, 2}, {11, 22, 33, 44}));
  ops::sub(a, b);
  CHECK(a.to_host() == ds::Tensor<float>({2, 2}, {1, 2, 3, 4}));
  ops::assign(a, b);
  CHECK(a == b);
  CHECK(ops::to_host(b) == b.to_host());
  CHECK(ops::copy_to(b, "/job:localhost/replica:0/task:0/device:CPU:0") == b);
  ops::on_host(a, [](void* p) { static_cast<float*>(p)[3] = -1; });
  CHECK(a.to_host() == ds::Tensor<float>({2, 2}, {10, 20, 30, -1}));

  // Shapes (2, 1, 3) and (2, 2, 3) along axis 1; (1, 2, 3) and (2, 2, 3) along axis 0, ...
  auto iota = [](ds::Shape s, int from) {
    std::vector<float> v(static_cast<std::size_t>(ds::num_elements(s)));
    for (auto& x : v) x = static_cast<float>(from++);
    return ds::Tensor<float>(s, v);
  };
  for (std::size_t axis : {0u, 1u, 2u}) {
    ds::Shape s1{2, 2, 3}, s2{2, 2, 3};
    s1[axis] = 1;
    const auto h1 = iota(s1, 0), h2 = iota(s2, 100);
    const auto d1 = ds::DeviceTensor<float>::from_host(h1), d2 = ds::DeviceTensor<float>::from_host(h2);
    ds::core::BufferRef r1{const_cast<float*>(d1.data()), ds::DType::F32, h1.shape()};
    ds::core::BufferRef r2{const_cast<float*>(d2.data()), ds::DType::F32, h2.shape()};
    ds::core::BufferRef q1{const_cast<float*>(h1.data()), ds::DType::F32, h1.shape()};
    ds::core::BufferRef q2{const_cast<float*>(h2.data()), ds::DType::F32, h2.shape()};
    std::optional<ds::Tensor<float>> expect;
    ds::core::concat_along_axis({&q1, &q2}, axis, [&](const ds::Shape& s) -> void* {
      expect.emplace(ds::Tensor<float>::zeros(s));
      return expect->data();
    });
    CHECK(ops::concat<ds::DeviceTensor<float>>({&r1, &r2}, axis).to_host() == *expect);
  }
}

TEST_CASE("MirroredStrategy<host> with device values: run, all_reduce, reduce, gather") {
  for (int n : {1, 2, 3}) {
    CAPTURE(n);
    ds::MirroredStrategy<ds::host> strategy(n);
    for (auto op : {ds::ReduceOp::Sum, ds::ReduceOp::Mean, ds::ReduceOp::Min, ds::ReduceOp::Max, ds::ReduceOp::Product}) {
      CAPTURE(op);
      for (std::size_t size : {std::size_t{0}, std::size_t{1}, std::size_t{333}}) {
        CAPTURE(size);
        // The same step on host vectors is the reference: results must agree bit for bit.
        auto host = strategy.run([&](ds::ReplicaContext& ctx) {
          return ctx.all_reduce(op, input<std::int32_t>(static_cast<unsigned>(ctx.replica_id_in_sync_group()), size));
        });
        auto device = strategy.run([&](ds::ReplicaContext& ctx) {
          return ctx.all_reduce(op, device_of(input<std::int32_t>(static_cast<unsigned>(ctx.replica_id_in_sync_group()), size)));
        });
        for (int r = 0; r < n; ++r) CHECK(host_of(device[static_cast<std::size_t>(r)]) == host[static_cast<std::size_t>(r)]);
        CHECK(host_of(strategy.reduce(op, device)) == strategy.reduce(op, host));
        if (size > 0) CHECK(strategy.reduce(op, device, std::nullopt) == strategy.reduce(op, host, std::nullopt));
      }
    }
    // Several values in one call, different element types and memory spaces.
    auto [f, i, h] = strategy.run([](ds::ReplicaContext& ctx) {
      const auto id = ctx.replica_id_in_sync_group();
      return ctx.all_reduce(ds::ReduceOp::Sum, dvec<float>(4, 0.5f * static_cast<float>(id + 1)),
                            ds::DeviceTensor<std::int64_t>({2}, std::vector<std::int64_t>{id, 10 * id}),
                            std::vector<double>{1.0, 2.0});
    });
    const float fsum = 0.5f * static_cast<float>(n * (n + 1) / 2);
    CHECK(host_of(f[0]) == std::vector<float>(4, fsum));
    CHECK(i[static_cast<std::size_t>(n - 1)].to_host() ==
          ds::Tensor<std::int64_t>({2}, {n * (n - 1) / 2, 10 * n * (n - 1) / 2}));
    CHECK(h[0] == std::vector<double>{1.0 * n, 2.0 * n});

    // Uneven batches: gather, all_gather (axis 0 and 1), reduce with an axis.
    auto batches = strategy.distribute_values_from_function([](const ds::ValueContext& ctx) {
      const auto rows = ctx.replica_id_in_sync_group + 1;
      std::vector<float> v(static_cast<std::size_t>(rows * 2));
      for (std::size_t k = 0; k < v.size(); ++k) v[k] = static_cast<float>(100 * ctx.replica_id_in_sync_group + k);
      return ds::DeviceTensor<float>({rows, 2}, v);
    });
    auto host_batches = strategy.distribute_values_from_function([&](const ds::ValueContext& ctx) {
      return batches[static_cast<std::size_t>(ctx.replica_id_in_sync_group)].to_host();
    });
    CHECK(strategy.gather(batches, 0).to_host() == strategy.gather(host_batches, 0));
    CHECK(strategy.reduce(ds::ReduceOp::Mean, batches, 0) == strategy.reduce(ds::ReduceOp::Mean, host_batches, 0));
    if (n > 1) CHECK_THROWS_AS(strategy.reduce(ds::ReduceOp::Sum, batches, 1), ds::InvalidArgument);  // rows differ
    auto gathered = strategy.run([](ds::ReplicaContext& ctx, const ds::DeviceTensor<float>& b) { return ctx.all_gather(b, 0); },
                                 batches);
    auto host_gathered = strategy.run(
        [](ds::ReplicaContext& ctx, const ds::Tensor<float>& b) { return ctx.all_gather(b, 0); }, host_batches);
    for (int r = 0; r < n; ++r) {
      CHECK(gathered[static_cast<std::size_t>(r)].to_host() == host_gathered[static_cast<std::size_t>(r)]);
    }
    auto wide = strategy.run([](ds::ReplicaContext& ctx) {
      const auto id = ctx.replica_id_in_sync_group();
      return ctx.all_gather(ds::DeviceTensor<int>({2, id + 1}, std::vector<int>(static_cast<std::size_t>(2 * (id + 1)), id)), 1);
    });
    CHECK(wide[0].shape() == ds::Shape{2, n * (n + 1) / 2});
    CHECK(wide[static_cast<std::size_t>(n - 1)] == wide[0]);
    auto vectors = strategy.run([](ds::ReplicaContext& ctx) {
      return ctx.all_gather(dvec<int>(static_cast<std::size_t>(ctx.replica_id_in_sync_group()), 7), 0);
    });
    CHECK(host_of(vectors[0]) == std::vector<int>(static_cast<std::size_t>(n * (n - 1) / 2), 7));

    // broadcast and batch_all_reduce
    auto from_last = strategy.run([n](ds::ReplicaContext& ctx) {
      return ctx.broadcast(dvec<int>(3, ctx.replica_id_in_sync_group()), n - 1);
    });
    for (const auto& v : from_last.values()) CHECK(host_of(v) == std::vector<int>(3, n - 1));
    auto batch = strategy.run([](ds::ReplicaContext& ctx) {
      std::vector<dvec<float>> grads{dvec<float>(2, 1.0f), dvec<float>(5, 2.0f)};
      return ctx.batch_all_reduce(ds::ReduceOp::Sum, std::move(grads));
    });
    CHECK(host_of(batch[0][1]) == std::vector<float>(5, 2.0f * static_cast<float>(n)));
  }
}

TEST_CASE("other cross-device ops and OneDeviceStrategy take device values through host copies") {
  auto sum_of_ids = [](auto& strategy) {
    auto out = strategy.run([](ds::ReplicaContext& ctx) {
      return ctx.all_reduce(ds::ReduceOp::Sum, dvec<int>(9, ctx.replica_id_in_sync_group() + 1));
    });
    return host_of(out[0]);
  };
  ds::MirroredStrategy<ds::host, ds::ReductionToOneDevice> one(4);
  ds::MirroredStrategy<ds::host, ds::HierarchicalCopyAllReduce> tree(4);
  CHECK(sum_of_ids(one) == std::vector<int>(9, 10));
  CHECK(sum_of_ids(tree) == std::vector<int>(9, 10));

  ds::OneDeviceStrategy<ds::host> single;
  auto mean = single.run([](ds::ReplicaContext& ctx) { return ctx.all_reduce(ds::ReduceOp::Mean, dvec<float>(3, 6.0f)); });
  CHECK(host_of(mean[0]) == std::vector<float>(3, 6.0f));
  CHECK(host_of(single.reduce(ds::ReduceOp::Sum, mean)) == std::vector<float>(3, 6.0f));
}

TEST_CASE("variables holding device values: mirrored, aggregated, sync-on-read") {
  ds::MirroredStrategy<ds::host> strategy(3);
  auto scope = strategy.scope();
  ds::Variable<dvec<float>> w(dvec<float>(4, 1.0f), {.name = "w", .aggregation = ds::VariableAggregation::Sum});
  REQUIRE(w.values().size() == 3);
  // Distinct copies, not one storage shared three times.
  CHECK(thrust::raw_pointer_cast(w.values()[0].data()) != thrust::raw_pointer_cast(w.values()[1].data()));

  strategy.run([&](ds::ReplicaContext& ctx) { w.assign_add(dvec<float>(4, static_cast<float>(ctx.replica_id_in_sync_group()))); });
  for (const auto& copy : w.values()) CHECK(host_of(copy) == std::vector<float>(4, 1.0f + 0 + 1 + 2));
  w.assign_sub(dvec<float>(4, 1.0f));  // cross-replica: every copy
  for (const auto& copy : w.values()) CHECK(host_of(copy) == std::vector<float>(4, 3.0f));
  CHECK(host_of(w.read_value()) == std::vector<float>(4, 3.0f));

  ds::Variable<ds::DeviceTensor<float>> mean(ds::DeviceTensor<float>({2}),
                                             {.name = "m", .aggregation = ds::VariableAggregation::Mean});
  strategy.run([&](ds::ReplicaContext& ctx) {
    const auto id = static_cast<float>(ctx.replica_id_in_sync_group());
    mean.assign(ds::DeviceTensor<float>({2}, std::vector<float>{id, 2 * id}));
  });
  CHECK(mean.read_value().to_host() == ds::Tensor<float>({2}, {1, 2}));

  ds::Variable<dvec<float>> metric(dvec<float>(2, 0.0f), {.name = "metric",
                                                          .synchronization = ds::VariableSynchronization::OnRead,
                                                          .aggregation = ds::VariableAggregation::Sum});
  strategy.run([&](ds::ReplicaContext& ctx) { metric.assign_add(dvec<float>(2, static_cast<float>(ctx.replica_id_in_sync_group() + 1))); });
  CHECK(host_of(metric.read_value()) == std::vector<float>(2, 6.0f));  // cross-replica read: the sum
  metric.assign(dvec<float>(2, 9.0f));                                  // stored as 9/3 per copy
  for (const auto& copy : metric.values()) CHECK(host_of(copy) == std::vector<float>(2, 3.0f));
  CHECK(host_of(metric.read_value()) == std::vector<float>(2, 9.0f));

  ds::Variable<dvec<int>> counter(dvec<int>(1, 0), {.name = "count",
                                                    .synchronization = ds::VariableSynchronization::OnRead,
                                                    .aggregation = ds::VariableAggregation::Sum});
  strategy.run([&] { counter.assign_add(dvec<int>(1, 5)); });
  CHECK(host_of(counter.read_value()) == std::vector<int>{15});
  CHECK(host_of(strategy.reduce(ds::ReduceOp::Sum, counter)) == std::vector<int>{15});
}

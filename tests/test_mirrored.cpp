// MirroredStrategy / OneDeviceStrategy on the host backend: run, reduce, gather, local results,
// values from functions, replica-context collectives, merge_call, and failure behaviour.
#include <distribute/distribute.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <set>
#include <stdexcept>
#include <thread>
#include <tuple>
#include <vector>

namespace ds = distribute;
using Mirrored = ds::MirroredStrategy<ds::host>;

TEST_CASE("construction: replica counts, device lists and bad devices") {
  Mirrored four(4);
  CHECK(four.num_replicas_in_sync() == 4);
  CHECK(four.extended().worker_devices() ==
        std::vector<std::string>{"/job:localhost/replica:0/task:0/device:CPU:0", "/job:localhost/replica:0/task:0/device:CPU:1",
                                 "/job:localhost/replica:0/task:0/device:CPU:2", "/job:localhost/replica:0/task:0/device:CPU:3"});
  Mirrored listed(std::vector<std::string>{"/cpu:0", "CPU:1"});
  CHECK(listed.num_replicas_in_sync() == 2);
  CHECK(Mirrored().num_replicas_in_sync() == 1);
  CHECK(ds::OneDeviceStrategy<>("/cpu:0").num_replicas_in_sync() == 1);

  CHECK_THROWS_WITH_AS(Mirrored(0), "MirroredStrategy: the number of replicas must be at least 1, got 0", ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(Mirrored(std::vector<std::string>{"/cpu:0", "/cpu:0"}),
                       "MirroredStrategy: device '/cpu:0' is listed twice", ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(Mirrored(std::vector<std::string>{"/gpu:0"}), doctest::Contains("device '/gpu:0' is not a host device"),
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(Mirrored(std::vector<std::string>{"/job:worker/task:1/cpu:0"}),
                       doctest::Contains("is not a device of this process"), ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(Mirrored(std::vector<std::string>{"banana"}), doctest::Contains("invalid device string 'banana'"),
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(Mirrored(std::vector<std::string>{"/cpu:-1"}),
                       "MirroredStrategy: device '/cpu:-1' has a negative device index", ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(Mirrored(std::vector<std::string>{"/cpu"}), "MirroredStrategy: device '/cpu' names no device index",
                       ds::InvalidArgument);
  CHECK_THROWS_AS(Mirrored(std::vector<std::string>{}), ds::InvalidArgument);
}

TEST_CASE("seed: reduce SUM of replica ids") {
  for (int n : {1, 2, 4}) {
    Mirrored strategy(n);
    auto per_replica = strategy.run([] { return ds::get_replica_context()->replica_id_in_sync_group(); });
    CHECK(strategy.reduce("SUM", per_replica) == n * (n - 1) / 2);
    CHECK(strategy.reduce(ds::ReduceOp::Max, per_replica) == n - 1);
    CHECK(strategy.reduce(ds::ReduceOp::Min, per_replica) == 0);
  }
}

TEST_CASE("seed: reduce with axis=None and axis=0 over a global batch of 8") {
  Mirrored strategy(2);
  // Examples [0..3] on replica 0, [4..7] on replica 1.
  auto per_replica = strategy.distribute_values_from_function([](const ds::ValueContext& ctx) {
    float base = 4.0f * static_cast<float>(ctx.replica_id_in_sync_group);
    return std::vector<float>{base, base + 1, base + 2, base + 3};
  });
  CHECK(strategy.reduce("sum", per_replica) == std::vector<float>{0 + 4, 1 + 5, 2 + 6, 3 + 7});
  CHECK(strategy.reduce("sum", per_replica, std::nullopt) == ds::Tensor<float>{4, 6, 8, 10});
  auto total = strategy.reduce("sum", per_replica, 0);
  CHECK(total.rank() == 0);
  CHECK(total[0] == 28.0f);
}

TEST_CASE("seed: MEAN with axis over the partial batch [0,1,2,3] / [4,5] divides by 6") {
  Mirrored strategy(2);
  auto per_replica = strategy.distribute_values_from_function([](const ds::ValueContext& ctx) {
    return ctx.replica_id_in_sync_group == 0 ? std::vector<double>{0, 1, 2, 3} : std::vector<double>{4, 5};
  });
  auto mean = strategy.reduce(ds::ReduceOp::Mean, per_replica, 0);
  CHECK(mean[0] == doctest::Approx(15.0 / 6.0));
  // The naive mean of per-replica means would weigh the elements 1/8 and 1/4.
  CHECK(mean[0] != doctest::Approx(((0 + 1 + 2 + 3) / 4.0 + (4 + 5) / 2.0) / 2));
  // Without an axis the shapes must agree: the error names both.
  CHECK_THROWS_WITH_AS(strategy.reduce(ds::ReduceOp::Mean, per_replica),
                       doctest::Contains("replica 0's value is float64 of shape (4,) but replica 1's is float64 of shape (2,)"), ds::InvalidArgument);
}

TEST_CASE("reduce along an inner axis of rank-2 components") {
  Mirrored strategy(2);
  auto per_replica = strategy.distribute_values_from_function([](const ds::ValueContext& ctx) {
    int r = ctx.replica_id_in_sync_group;
    return ds::Tensor<int>({2, 3}, {r, r + 1, r + 2, 10 * r, 10 * r + 1, 10 * r + 2});
  });
  CHECK(strategy.reduce("sum", per_replica, 1) == ds::Tensor<int>({2}, {(0 + 1 + 2) + (1 + 2 + 3), (0 + 1 + 2) + (10 + 11 + 12)}));
  CHECK(strategy.reduce("max", per_replica, -1) == ds::Tensor<int>({2}, {3, 12}));
  CHECK(strategy.reduce("min", per_replica, 0) == ds::Tensor<int>({3}, {0, 1, 2}));
  CHECK(strategy.reduce("product", per_replica) == ds::Tensor<int>({2, 3}, {0, 2, 6, 0, 11, 24}));
  CHECK_THROWS_WITH_AS(strategy.reduce("sum", per_replica, 2),
                       "reduce: axis 2 is out of range for a value of rank 2 (valid: [-2, 2))", ds::InvalidArgument);
}

TEST_CASE("seed: gather of a (1,2,3) tensor over 4 replicas along axes 0, 1, 2") {
  Mirrored strategy(4);
  ds::Tensor<int> single({1, 2, 3}, {0, 1, 2, 3, 4, 5});
  auto values = strategy.distribute_values_from_function([&](const ds::ValueContext&) { return single; });

  auto g0 = strategy.gather(values, 0);
  CHECK(g0.shape() == ds::Shape{4, 2, 3});
  for (int r = 0; r < 4; ++r) CHECK(g0.at(r, 1, 2) == 5);

  auto g1 = strategy.gather(values, 1);
  CHECK(g1.shape() == ds::Shape{1, 8, 3});
  CHECK(g1.values() == std::vector<int>{0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5});

  auto g2 = strategy.gather(values, 2);
  CHECK(g2.shape() == ds::Shape{1, 2, 12});
  CHECK(g2.values() == std::vector<int>{0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5, 3, 4, 5, 3, 4, 5});

  CHECK_THROWS_WITH_AS(strategy.gather(values, 3),
                       "gather: axis 3 is out of range for values of shape (1, 2, 3) (rank 3); it must be in [-3, 3)",
                       ds::InvalidArgument);
  // A negative axis counts from the end (TF's gather with one replica; see docs/semantics.md).
  CHECK(strategy.gather(values, -1) == g2);
  CHECK(strategy.gather(values, -3) == g0);
  CHECK_THROWS_WITH_AS(strategy.gather(values, -4),
                       "gather: axis -4 is out of range for values of shape (1, 2, 3) (rank 3); it must be in [-3, 3)",
                       ds::InvalidArgument);
}

TEST_CASE("seed: gather of (2,1) components along axis 0, and uneven sizes") {
  Mirrored strategy(2);
  auto values = strategy.distribute_values_from_function(
      [](const ds::ValueContext&) { return ds::Tensor<int>({2, 1}, {1, 2}); });
  CHECK(strategy.gather(values, 0) == ds::Tensor<int>({4, 1}, {1, 2, 1, 2}));

  auto uneven = strategy.distribute_values_from_function([](const ds::ValueContext& ctx) {
    return ctx.replica_id_in_sync_group == 0 ? std::vector<int>{1, 2, 3} : std::vector<int>{4};
  });
  CHECK(strategy.gather(uneven, 0) == std::vector<int>{1, 2, 3, 4});
  // Scalars have rank 0: there is no axis to gather along.
  auto scalars = strategy.run([] { return 1.0f; });
  CHECK_THROWS_AS(strategy.gather(scalars, 0), ds::InvalidArgument);
}

TEST_CASE("seed: run examples") {
  Mirrored strategy(2);
  // 1. A constant input is passed to every replica.
  auto doubled = strategy.run([](float input) { return input * 2.0f; }, 3.0f);
  CHECK(doubled.values() == std::vector<float>{6.0f, 6.0f});
  // 2. A distributed input gives each replica its component.
  auto distributed = strategy.distribute_values_from_function([](const ds::ValueContext& ctx) { return ctx.num_replicas_in_sync; });
  CHECK(strategy.run([](int input) { return input * 2; }, distributed).values() == std::vector<int>{4, 4});
  // 3. all_reduce through the replica context.
  auto ids = strategy.distribute_values_from_function(
      [](const ds::ValueContext& ctx) { return ctx.replica_id_in_sync_group; });
  auto summed = strategy.run([](int input) { return ds::get_replica_context()->all_reduce("sum", input); }, ids);
  CHECK(summed.values() == std::vector<int>{1, 1});
}

TEST_CASE("run: void, tuple results, mixed arguments, ReplicaContext first") {
  Mirrored strategy(3);
  std::atomic<int> calls{0};
  strategy.run([&] { ++calls; });
  CHECK(calls == 3);

  auto [ids, squares] = strategy.run([](ds::ReplicaContext& ctx) {
    int id = ctx.replica_id_in_sync_group();
    return std::make_tuple(id, id * id);
  });
  CHECK(ids.values() == std::vector<int>{0, 1, 2});
  CHECK(squares.values() == std::vector<int>{0, 1, 4});

  auto per_replica = strategy.distribute_values_from_function([](const ds::ValueContext& c) { return c.replica_id_in_sync_group * 10; });
  auto mixed = strategy.run([](auto& ctx, int a, const std::string& label, int b) {
    return label + std::to_string(a + b + ctx.replica_id_in_sync_group());
  }, per_replica, std::string("r"), 1);
  CHECK(mixed.values() == std::vector<std::string>{"r1", "r12", "r23"});

  // Every replica has its own long-lived thread; on the host backend replica 0's is the caller's.
  std::set<std::thread::id> threads;
  for (int step = 0; step < 5; ++step) {
    auto tid = strategy.run([] { return std::this_thread::get_id(); });
    for (auto& t : tid.values()) threads.insert(t);
  }
  CHECK(threads.size() == 3);
  CHECK(threads.count(std::this_thread::get_id()) == 1);

  ds::PerReplica<int, Mirrored> wrong_size(std::vector<int>{1, 2});
  CHECK_THROWS_WITH_AS(strategy.run([](int) {}, wrong_size),
                       "run: argument 0 has 2 components but the strategy has 3 local replicas", ds::InvalidArgument);
}

TEST_CASE("local_results and distribute_values_from_function (seed examples)") {
  Mirrored strategy(2);
  auto ones = strategy.distribute_values_from_function([](const ds::ValueContext&) { return 1.0f; });
  CHECK(strategy.local_results(ones) == std::vector<float>{1.0f, 1.0f});

  std::vector<float> array_value{3.0f, 2.0f, 1.0f};
  auto picked = strategy.distribute_values_from_function(
      [&](const ds::ValueContext& ctx) { return array_value[static_cast<std::size_t>(ctx.replica_id_in_sync_group)]; });
  CHECK(strategy.local_results(picked) == std::vector<float>{3.0f, 2.0f});

  auto counts = strategy.distribute_values_from_function([](const ds::ValueContext& ctx) { return ctx.num_replicas_in_sync; });
  CHECK(strategy.local_results(counts) == std::vector<int>{2, 2});

  CHECK(strategy.local_results(7) == std::vector<int>{7});
  CHECK(fmt::format("{}", picked) == "PerReplica{0: 3, 1: 2}");
}

TEST_CASE("local_results refers to the components without copying them") {
  Mirrored strategy(3);
  auto big = strategy.distribute_values_from_function(
      [](const ds::ValueContext& ctx) { return std::vector<float>(1000, static_cast<float>(ctx.replica_id_in_sync_group)); });
  const auto& components = strategy.local_results(big);
  CHECK(&components == &big.values());
  for (std::size_t i = 0; i < 3; ++i) CHECK(components[i].data() == big[i].data());
  // What issue 23 found dangling: a reference to an element of the result.
  const auto& first = strategy.local_results(big)[0];
  CHECK(&first == &big[0]);
  CHECK(first[999] == 0.0f);
  // A variable's copies, likewise.
  auto scope = strategy.scope();
  ds::Variable<std::vector<float>> w(std::vector<float>{1, 2}, {.name = "w"});
  CHECK(&strategy.local_results(w) == &w.values());
  // A temporary distributed value: its components are moved out, not copied.
  auto made = strategy.distribute_values_from_function([](const ds::ValueContext&) { return std::vector<float>(4, 1.0f); });
  const float* data0 = made[0].data();
  std::vector<std::vector<float>> moved = strategy.local_results(std::move(made));
  CHECK(moved[0].data() == data0);
}

TEST_CASE("reduce takes the op as a std::string too") {
  Mirrored strategy(2);
  auto ids = strategy.run([] { return ds::get_replica_context()->replica_id_in_sync_group() + 1; });
  const std::string sum = "sum";
  CHECK(strategy.reduce(sum, ids) == 3);
  CHECK(strategy.reduce(std::string("MEAN"), ids, std::nullopt) == ds::Tensor<int>(ds::Shape{}, {1}));
  CHECK_THROWS_WITH_AS(strategy.reduce(std::string("avg"), ids),
                       "unknown reduce op 'avg': expected one of SUM, MEAN, MIN, MAX, PRODUCT (any case)", ds::InvalidArgument);
}

TEST_CASE("reduce MEAN over zero elements is NaN for floating types, as in TF; undefined for integers, MIN and MAX") {
  Mirrored strategy(2);
  // TF 2.21: MirroredStrategy(2).reduce("MEAN", tf.zeros([0, 3]) per replica, axis=0) -> [nan nan nan]; SUM -> 0.
  auto empty = strategy.distribute_values_from_function([](const ds::ValueContext&) { return ds::Tensor<float>(ds::Shape{0, 3}, {}); });
  auto mean = strategy.reduce("mean", empty, 0);
  REQUIRE(mean.shape() == ds::Shape{3});
  for (float x : mean.values()) CHECK(std::isnan(x));
  CHECK(strategy.reduce("sum", empty, 0) == ds::Tensor<float>({3}, {0, 0, 0}));
  auto mean_all = strategy.reduce("mean", empty, {0, 1});
  CHECK(std::isnan(mean_all.values().at(0)));
  auto half = strategy.distribute_values_from_function([](const ds::ValueContext&) { return ds::Tensor<ds::float16>(ds::Shape{0, 2}, {}); });
  CHECK(std::isnan(static_cast<float>(strategy.reduce("mean", half, 0).values().at(0))));
  // An integer has no NaN (TF's MEAN returns float64 there); MIN/MAX are not TF's strategy.reduce ops.
  auto ints = strategy.distribute_values_from_function([](const ds::ValueContext&) { return ds::Tensor<int>(ds::Shape{0, 3}, {}); });
  CHECK_THROWS_WITH_AS(strategy.reduce("mean", ints, 0),
                       "reduce: MEAN of int32 along axis 0 over zero elements is undefined (TF gives NaN; an integer has none)",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(strategy.reduce("max", empty, 0), "reduce: MAX of float32 along axis 0 over zero elements is undefined",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(strategy.reduce("min", ints, {0, 1}), "reduce: MIN of int32 over axes (0, 1) over zero elements is undefined",
                       ds::InvalidArgument);
}

TEST_CASE("reduce over several axes, as TF's tuple axis") {
  Mirrored strategy(2);
  // Replica r holds reshape(range(6) + 10 r, [2, 3]). Expected values: TF 2.21's
  // MirroredStrategy(2).reduce(op, v, axis=(...)).
  auto v = strategy.distribute_values_from_function([](const ds::ValueContext& ctx) {
    const float b = 10.0f * static_cast<float>(ctx.replica_id_in_sync_group);
    return ds::Tensor<float>({2, 3}, {b, b + 1, b + 2, b + 3, b + 4, b + 5});
  });
  CHECK(strategy.reduce("sum", v, {0, 1}) == ds::Tensor<float>(ds::Shape{}, {90}));
  CHECK(strategy.reduce("mean", v, {0, 1}) == ds::Tensor<float>(ds::Shape{}, {7.5f}));
  CHECK(strategy.reduce("mean", v, {-1, 0}) == ds::Tensor<float>(ds::Shape{}, {7.5f}));
  CHECK(strategy.reduce("sum", v, {}) == ds::Tensor<float>({2, 3}, {10, 12, 14, 16, 18, 20}));
  CHECK(strategy.reduce("mean", v, {}) == ds::Tensor<float>({2, 3}, {5, 6, 7, 8, 9, 10}));
  CHECK(strategy.reduce("sum", v, {0}) == ds::Tensor<float>({3}, {26, 30, 34}));
  CHECK(strategy.reduce("mean", v, {1}) == ds::Tensor<float>({2}, {6, 9}));
  const std::vector<std::int64_t> axes{1, 0};
  CHECK(strategy.reduce("max", v, axes) == ds::Tensor<float>(ds::Shape{}, {15}));
  // Components may differ along the reduced axes: MEAN divides by the total element count.
  auto uneven = strategy.distribute_values_from_function([](const ds::ValueContext& ctx) {
    const int rows = 2 + ctx.replica_id_in_sync_group;
    return ds::Tensor<float>({rows, 3}, std::vector<float>(static_cast<std::size_t>(rows) * 3, 1.0f));
  });
  CHECK(strategy.reduce("mean", uneven, {0, 1}) == ds::Tensor<float>(ds::Shape{}, {1}));
  CHECK(strategy.reduce("sum", uneven, {1, 0}) == ds::Tensor<float>(ds::Shape{}, {15}));
  // TF raises on a repeated axis and on one out of range.
  CHECK_THROWS_WITH_AS(strategy.reduce("sum", v, {1, 1}), "reduce: axis 1 is listed twice in (1, 1); each axis may be reduced once",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(strategy.reduce("sum", v, {0, -2}), "reduce: axis 0 is listed twice in (0, -2); each axis may be reduced once",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(strategy.reduce("sum", v, {0, 2}), "reduce: axis 2 is out of range for a value of rank 2 (valid: [-2, 2))",
                       ds::InvalidArgument);
  auto other = strategy.distribute_values_from_function([](const ds::ValueContext& ctx) {
    const int n = 2 + ctx.replica_id_in_sync_group;
    return ds::Tensor<float>({2, n, 2}, std::vector<float>(static_cast<std::size_t>(4 * n)));
  });
  CHECK_THROWS_WITH_AS(strategy.reduce("sum", other, {0, 2}),
                       "reduce: replica 0's value is float32 of shape (2, 2, 2) but replica 1's is float32 of shape (2, 3, 2); "
                       "they may only differ along the reduced axes (0, 2)",
                       ds::InvalidArgument);
}

TEST_CASE("seed: distribute_values_from_function with values placed on extended().worker_devices()") {
  // TF: for i in range(num_replicas_in_sync): with tf.device(worker_devices[i]): multiple_values.append(...)
  //     value_fn(ctx) = multiple_values[ctx.replica_id_in_sync_group]
  // The host backend has no device placement scope; a value records the device it was made for,
  // and each replica must receive the value made for its own device.
  struct Placed {
    std::string device;
    float value = 0;
  };
  Mirrored strategy(3);
  const auto worker_devices = strategy.extended().worker_devices();
  REQUIRE(worker_devices.size() == 3);
  std::vector<Placed> multiple_values;
  for (int i = 0; i < strategy.num_replicas_in_sync(); ++i) {
    multiple_values.push_back({worker_devices[static_cast<std::size_t>(i)], 1.0f + static_cast<float>(i)});
  }
  auto distributed_values = strategy.distribute_values_from_function(
      [&](const ds::ValueContext& ctx) { return multiple_values[static_cast<std::size_t>(ctx.replica_id_in_sync_group)]; });
  const auto local = strategy.local_results(distributed_values);
  REQUIRE(local.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(local[i].device == "/job:localhost/replica:0/task:0/device:CPU:" + std::to_string(i));
    CHECK(local[i].value == 1.0f + static_cast<float>(i));
  }
  // run hands replica i the value placed on its device.
  auto on_own_device = strategy.run(
      [](ds::ReplicaContext& ctx, const Placed& p) { return p.device == ctx.device() ? p.value : -1.0f; },
      distributed_values);
  CHECK(strategy.local_results(on_own_device) == std::vector<float>{1.0f, 2.0f, 3.0f});
  CHECK(strategy.reduce("sum", on_own_device) == 6.0f);
}

TEST_CASE("all_reduce: every op, several values in one call, mixed element types") {
  Mirrored strategy(4);
  auto out = strategy.run([](ds::ReplicaContext& ctx) {
    const int r = ctx.replica_id_in_sync_group();
    std::vector<float> a{float(r), float(r) * 2, 1.0f};
    ds::Tensor<std::int64_t> b({2, 2}, {r, r + 1, r + 2, r + 3});
    double c = r + 1;
    auto [sa, sb, sc] = ctx.all_reduce(ds::ReduceOp::Sum, a, b, c);
    auto mean = ctx.all_reduce("mean", a);
    auto mx = ctx.all_reduce("max", b);
    auto mn = ctx.all_reduce("min", c);
    auto prod = ctx.all_reduce("product", c);
    return std::make_tuple(sa, sb, sc, mean, mx, mn, prod);
  });
  for (int i = 0; i < 4; ++i) {
    CHECK(std::get<0>(out)[static_cast<std::size_t>(i)] == std::vector<float>{6, 12, 4});
    CHECK(std::get<1>(out)[static_cast<std::size_t>(i)] == ds::Tensor<std::int64_t>({2, 2}, {6, 10, 14, 18}));
    CHECK(std::get<2>(out)[static_cast<std::size_t>(i)] == 10.0);
    CHECK(std::get<3>(out)[static_cast<std::size_t>(i)] == std::vector<float>{1.5f, 3.0f, 1.0f});
    CHECK(std::get<4>(out)[static_cast<std::size_t>(i)] == ds::Tensor<std::int64_t>({2, 2}, {3, 4, 5, 6}));
    CHECK(std::get<5>(out)[static_cast<std::size_t>(i)] == 1.0);
    CHECK(std::get<6>(out)[static_cast<std::size_t>(i)] == 24.0);
  }
}

namespace {

// A cross-device ops policy that counts the collectives the replicas issue, then runs the host
// default. (Policies are the strategy's extension point; this one is the test's observer.)
std::atomic<int> counting_ops_all_reduce_calls{0};
std::atomic<int> counting_ops_values{0};

class CountingCollectives : public ds::core::ReplicaCollectives {
 public:
  explicit CountingCollectives(std::unique_ptr<ds::core::ReplicaCollectives> inner) : inner_(std::move(inner)) {}
  void all_reduce(ds::core::ReplicaGroup& group, int replica, std::span<ds::core::BufferRef> buffers,
                  ds::ReduceOp op) override {
    counting_ops_all_reduce_calls.fetch_add(1);
    counting_ops_values.fetch_add(static_cast<int>(buffers.size()));
    inner_->all_reduce(group, replica, buffers, op);
  }
  void all_gather(ds::core::ReplicaGroup& group, int replica, const ds::core::BufferRef& input, int axis,
                  const std::function<void*(const ds::Shape&)>& allocate) override {
    inner_->all_gather(group, replica, input, axis, allocate);
  }
  void broadcast(ds::core::ReplicaGroup& group, int replica, ds::core::BufferRef buffer, int root) override {
    inner_->broadcast(group, replica, buffer, root);
  }

 private:
  std::unique_ptr<ds::core::ReplicaCollectives> inner_;
};

struct CountingAllReduce {
  static constexpr std::string_view name = "CountingAllReduce";
  static std::unique_ptr<ds::core::ReplicaCollectives> make_collectives(const ds::collective::detail::CollectivesConfig& config) {
    return std::make_unique<CountingCollectives>(ds::SharedMemoryAllReduce::make_collectives(config));
  }
};

}  // namespace

TEST_CASE("all_reduce(op, a, b, c) with several values makes exactly one collective") {
  ds::MirroredStrategy<ds::host, CountingAllReduce> strategy(4);
  auto step = [](ds::ReplicaContext& ctx) {
    const int r = ctx.replica_id_in_sync_group();
    std::vector<float> a{float(r), 1.0f};
    ds::Tensor<std::int64_t> b({2, 2}, {r, r, r, 1});
    double c = r;
    return ctx.all_reduce(ds::ReduceOp::Sum, a, b, c);
  };
  counting_ops_all_reduce_calls = 0;
  counting_ops_values = 0;
  auto out = strategy.run(step);
  CHECK(counting_ops_all_reduce_calls.load() == 4);  // one call per replica: one collective
  CHECK(counting_ops_values.load() == 4 * 3);        // carrying all three values
  for (int i = 0; i < 4; ++i) {
    CHECK(std::get<0>(out)[static_cast<std::size_t>(i)] == std::vector<float>{6, 4});
    CHECK(std::get<1>(out)[static_cast<std::size_t>(i)] == ds::Tensor<std::int64_t>({2, 2}, {6, 6, 6, 4}));
    CHECK(std::get<2>(out)[static_cast<std::size_t>(i)] == 6.0);
  }
  // The counter does see separate collectives: three calls of one value each are three.
  counting_ops_all_reduce_calls = 0;
  counting_ops_values = 0;
  strategy.run([](ds::ReplicaContext& ctx) {
    ctx.all_reduce("sum", 1.0f);
    ctx.all_reduce("sum", 2.0);
    ctx.all_reduce("sum", std::int64_t{3});
  });
  CHECK(counting_ops_all_reduce_calls.load() == 4 * 3);
  CHECK(counting_ops_values.load() == 4 * 3);
}

TEST_CASE("all_reduce of large and odd-sized buffers matches a serial sum") {
  for (int n : {1, 2, 3, 4, 7}) {
    Mirrored strategy(n);
    for (std::size_t size : {std::size_t{0}, std::size_t{1}, std::size_t{5}, std::size_t{(1 << 18) + 3}}) {
      auto out = strategy.run([&](ds::ReplicaContext& ctx) {
        std::vector<std::int32_t> v(size);
        for (std::size_t i = 0; i < size; ++i) v[i] = static_cast<std::int32_t>(i % 97) * (ctx.replica_id_in_sync_group() + 1);
        return ctx.all_reduce(ds::ReduceOp::Sum, std::move(v));
      });
      const int factor = n * (n + 1) / 2;
      bool all_ok = true;
      for (const auto& v : out.values()) {
        REQUIRE(v.size() == size);
        for (std::size_t i = 0; i < size; ++i) all_ok = all_ok && v[i] == static_cast<std::int32_t>(i % 97) * factor;
      }
      CHECK(all_ok);
    }
  }
}

TEST_CASE("all_gather: components may differ in size along the axis") {
  Mirrored strategy(3);
  auto gathered = strategy.run([](ds::ReplicaContext& ctx) {
    const int r = ctx.replica_id_in_sync_group();
    ds::Tensor<int> rows({r + 1, 2}, std::vector<int>(static_cast<std::size_t>(2 * (r + 1)), r));
    return ctx.all_gather(rows, 0);
  });
  for (const auto& g : gathered.values()) {
    CHECK(g == ds::Tensor<int>({6, 2}, {0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2}));
  }
  auto cols = strategy.run([](ds::ReplicaContext& ctx) {
    return ctx.all_gather(std::vector<float>{float(ctx.replica_id_in_sync_group())}, 0);
  });
  CHECK(cols[2] == std::vector<float>{0, 1, 2});
  CHECK_THROWS_WITH_AS(strategy.run([](ds::ReplicaContext& ctx) { return ctx.all_gather(1.0f, 0); }),
                       doctest::Contains("all_gather: axis 0 is out of range for a value of shape ()"), ds::InvalidArgument);
  // A negative axis counts from the end: -1 of (2, r+1) components is axis 1.
  auto last = strategy.run([](ds::ReplicaContext& ctx) {
    const int r = ctx.replica_id_in_sync_group();
    return ctx.all_gather(ds::Tensor<int>({2, r + 1}, std::vector<int>(static_cast<std::size_t>(2 * (r + 1)), r)), -1);
  });
  CHECK(last[1] == ds::Tensor<int>({2, 6}, {0, 1, 1, 2, 2, 2, 0, 1, 1, 2, 2, 2}));
  CHECK(strategy.run([](ds::ReplicaContext& ctx) { return ctx.all_gather(ds::Tensor<int>({1, 1}, {7}), -2); })[0] ==
        ds::Tensor<int>({3, 1}, {7, 7, 7}));
  CHECK_THROWS_WITH_AS(strategy.run([](ds::ReplicaContext& ctx) { return ctx.all_gather(ds::Tensor<int>({1, 1}, {7}), -3); }),
                       "all_gather: axis -3 is out of range for a value of shape (1, 1); it must be in [-2, 2)",
                       ds::InvalidArgument);
}

TEST_CASE("merge_call runs once in cross-replica context and every replica gets the result") {
  Mirrored strategy(4);
  std::atomic<int> merge_calls{0};
  auto results = strategy.run([&](ds::ReplicaContextFor<Mirrored>& ctx) {
    return ctx.merge_call([&](Mirrored& s, const ds::PerReplica<int, Mirrored>& ids) {
      ++merge_calls;
      CHECK(ds::in_cross_replica_context());
      CHECK(ds::get_replica_context() == nullptr);
      return s.reduce("sum", ids) * 10;
    }, ctx.replica_id_in_sync_group());
  });
  CHECK(merge_calls == 1);
  CHECK(results.values() == std::vector<int>{60, 60, 60, 60});

  // An exception in the merge function reaches every replica and then the caller.
  CHECK_THROWS_WITH_AS(strategy.run([](auto& ctx) {
                         ctx.merge_call([](const ds::PerReplica<int, Mirrored>&) { throw std::runtime_error("merge failed"); }, 1);
                       }),
                       "merge failed", std::runtime_error);
}

TEST_CASE("replicas passing different shapes to all_reduce: InvalidArgument naming both shapes") {
  Mirrored strategy(2);
  auto bad = [](ds::ReplicaContext& ctx) {
    std::vector<float> v(ctx.replica_id_in_sync_group() == 0 ? 3 : 5, 1.0f);
    return ctx.all_reduce("sum", v);
  };
  CHECK_THROWS_WITH_AS(strategy.run(bad),
                       "all_reduce: value 0 is float32 of shape (3,) on replica 0 but float32 of shape (5,) on replica 1",
                       ds::InvalidArgument);
  auto other_op = [](ds::ReplicaContext& ctx) {
    return ctx.all_reduce(ctx.replica_id_in_sync_group() == 0 ? "sum" : "max", 1);
  };
  CHECK_THROWS_WITH_AS(strategy.run(other_op), "all_reduce: replica 0 reduces with SUM but replica 1 with MAX", ds::InvalidArgument);
  // The strategy is usable after a failed step.
  CHECK(strategy.reduce("sum", strategy.run([](ds::ReplicaContext& ctx) { return ctx.all_reduce("sum", 2); })) == 8);
}

TEST_CASE("an exception in one replica while the others wait in all_reduce is rethrown; no hang") {
  Mirrored strategy(4);
  for (int trial = 0; trial < 20; ++trial) {
    auto step = [&](ds::ReplicaContext& ctx) {
      if (ctx.replica_id_in_sync_group() == trial % 4) {
        std::this_thread::sleep_for(std::chrono::milliseconds(trial % 3));
        throw std::out_of_range("replica failed on purpose");
      }
      return ctx.all_reduce("sum", std::vector<float>(1000, 1.0f));
    };
    CHECK_THROWS_WITH_AS(strategy.run(step), "replica failed on purpose", std::out_of_range);
  }
  // And a library error in one replica keeps its type.
  CHECK_THROWS_AS(strategy.run([](ds::ReplicaContext& ctx) {
                    if (ctx.replica_id_in_sync_group() == 1) ds::parse_reduce_op("bogus");
                    ctx.all_reduce("sum", 1);
                  }),
                  ds::InvalidArgument);
  CHECK(strategy.reduce("sum", strategy.run([](ds::ReplicaContext& ctx) { return ctx.all_reduce("sum", 1); })) == 16);
}

TEST_CASE("a replica that skips a collective is reported, not waited for") {
  Mirrored strategy(3);
  auto step = [](ds::ReplicaContext& ctx) {
    if (ctx.replica_id_in_sync_group() == 2) return 0;
    return ctx.all_reduce("sum", 1);
  };
  CHECK_THROWS_WITH_AS(strategy.run(step), doctest::Contains("replica 2 returned from its step function while replica"),
                       ds::InvalidArgument);
  auto mixed = [](ds::ReplicaContext& ctx) {
    if (ctx.replica_id_in_sync_group() == 1) return ctx.all_gather(std::vector<int>{1}, 0).size();
    return ctx.all_reduce("sum", std::vector<int>{1}).size();
  };
  CHECK_THROWS_WITH_AS(strategy.run(mixed), doctest::Contains("but replica 1 called all_gather"), ds::InvalidArgument);
}

TEST_CASE("OneDeviceStrategy runs the same program with one replica") {
  ds::OneDeviceStrategy<> strategy("/cpu:0");
  auto out = strategy.run([](ds::ReplicaContext& ctx, float x) { return ctx.all_reduce("sum", x) + 1.0f; }, 2.0f);
  CHECK(out.values() == std::vector<float>{3.0f});
  CHECK(strategy.reduce("sum", out) == 3.0f);
  CHECK(strategy.reduce("sum", 3.0f) == 3.0f);  // a plain value with one replica
  CHECK(strategy.gather(std::vector<int>{1, 2}, 0) == std::vector<int>{1, 2});
  Mirrored two(2);
  CHECK_THROWS_WITH_AS(two.reduce("sum", 3.0f), doctest::Contains("a plain (non-distributed) value cannot be reduced with SUM"),
                       ds::InvalidArgument);
  CHECK(two.reduce("mean", 3.0f) == 3.0f);
}

TEST_CASE("run() inside a step function is refused: steps do not nest") {
  Mirrored strategy(2);
  CHECK_THROWS_WITH_AS(strategy.run([&] { strategy.run([] {}); }),
                       "run() called from inside a step function of MirroredStrategy: steps do not nest; call run() in "
                       "cross-replica context",
                       ds::InvalidArgument);
  CHECK(strategy.reduce("sum", strategy.run([] { return 1; })) == 2);  // the strategy runs steps after it
}

TEST_CASE("batch_reduce_to reduces several values at once") {
  Mirrored strategy(2);
  auto a = strategy.run([](ds::ReplicaContext& c) { return c.replica_id_in_sync_group() + 1; });
  auto b = strategy.run([](ds::ReplicaContext& c) { return std::vector<double>{1.0 * c.replica_id_in_sync_group(), 2.0}; });
  auto [ra, rb] = strategy.extended().batch_reduce_to("sum", a, b);
  CHECK(ra == 3);
  CHECK(rb == std::vector<double>{1.0, 4.0});
}

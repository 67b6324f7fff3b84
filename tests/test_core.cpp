// Core values: Tensor, tensor_traits, ReduceOp, DeviceSpec, shapes, errors.
#include <distribute/distribute.hpp>

#include <doctest/doctest.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace ds = distribute;

namespace {
// A user type that opts in to the library by specialising tensor_traits.
struct Vec3 {
  double x = 0, y = 0, z = 0;
};
}  // namespace

template <>
struct distribute::tensor_traits<Vec3> {
  using value_type = double;
  static ds::Shape shape(const Vec3&) { return {3}; }
  static const double* data(const Vec3& v) { return &v.x; }
  static double* data(Vec3& v) { return &v.x; }
  static Vec3 make(const ds::Shape&) { return {}; }
};

TEST_CASE("Tensor construction, shape and element access") {
  ds::Tensor<float> t({2, 3}, {0, 1, 2, 3, 4, 5});
  CHECK(t.rank() == 2);
  CHECK(t.size() == 6);
  CHECK(t.shape() == ds::Shape{2, 3});
  CHECK(t.at(1, 2) == 5.0f);
  CHECK(t.at(0, 1) == 1.0f);
  CHECK(t[4] == 4.0f);
  t.at(1, 0) = 9;
  CHECK(t[3] == 9.0f);

  auto z = ds::Tensor<int>::zeros({4});
  CHECK(z == ds::Tensor<int>({4}, {0, 0, 0, 0}));
  auto s = ds::Tensor<double>::scalar(2.5);
  CHECK(s.rank() == 0);
  CHECK(s.size() == 1);
  CHECK(s[0] == 2.5);
  CHECK(ds::Tensor<int>{1, 2, 3}.shape() == ds::Shape{3});
  CHECK(t.reshape({3, 2}).at(2, 1) == 5.0f);
}

TEST_CASE("Tensor rejects bad shapes and indices with messages") {
  CHECK_THROWS_WITH_AS((ds::Tensor<float>({2, 3}, {1, 2, 3})),
                       "Tensor: shape (2, 3) holds 6 elements but 3 values were given", ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(ds::Tensor<float>::zeros({-1, 2}), doctest::Contains("negative dimension"), ds::InvalidArgument);
  ds::Tensor<float> t({2, 2}, {1, 2, 3, 4});
  CHECK_THROWS_WITH_AS(t.at(2, 0), "Tensor::at: index 2 is out of range for axis 0 of shape (2, 2)",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(t.at(1), "Tensor::at: 1 indices given for a tensor of rank 2", ds::InvalidArgument);
}

TEST_CASE("Tensor prints through fmt") {
  ds::Tensor<int> t({2, 2}, {1, 2, 3, 4});
  CHECK(fmt::format("{}", t) == "Tensor<int32>(shape=(2, 2), [[1, 2], [3, 4]])");
  CHECK(fmt::format("{}", ds::Tensor<float>::scalar(1.5f)) == "Tensor<float32>(shape=(), 1.5)");
  std::vector<int> many(10);
  for (int i = 0; i < 10; ++i) many[static_cast<std::size_t>(i)] = i;
  CHECK(fmt::format("{}", ds::Tensor<int>({10}, many)) == "Tensor<int32>(shape=(10,), [0, 1, 2, ..., 7, 8, 9])");
  CHECK(fmt::format("{}", ds::Tensor<int>({0, 3}, {})) == "Tensor<int32>(shape=(0, 3), [])");
}

TEST_CASE("tensor_traits describe scalars, vectors, arrays, tensors and user types") {
  static_assert(ds::TensorLike<float>);
  static_assert(ds::TensorLike<std::int64_t>);
  static_assert(ds::TensorLike<std::vector<double>>);
  static_assert(ds::TensorLike<std::array<int, 4>>);
  static_assert(ds::TensorLike<ds::Tensor<float>>);
  static_assert(ds::TensorLike<Vec3>);
  static_assert(!ds::TensorLike<std::string>);
  static_assert(!ds::TensorLike<std::vector<std::string>>);
  static_assert(std::is_same_v<ds::gathered_t<std::vector<float>>, std::vector<float>>);
  static_assert(std::is_same_v<ds::gathered_t<std::array<int, 2>>, ds::Tensor<int>>);
  static_assert(std::is_same_v<ds::gathered_t<Vec3>, ds::Tensor<double>>);

  CHECK(ds::shape_of(3.0f).empty());
  CHECK(ds::shape_of(std::vector<int>(7)) == ds::Shape{7});
  CHECK(ds::shape_of(std::array<int, 4>{}) == ds::Shape{4});
  CHECK(ds::shape_of(Vec3{}) == ds::Shape{3});
  CHECK_THROWS_WITH_AS((ds::tensor_traits<std::array<int, 4>>::make({5})), "cannot hold shape (5,) in a std::array of 4",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(ds::tensor_traits<float>::make({2}), "cannot hold shape (2,) in a scalar", ds::InvalidArgument);
}

TEST_CASE("parse_reduce_op accepts TF's strings in any case") {
  CHECK(ds::parse_reduce_op("sum") == ds::ReduceOp::Sum);
  CHECK(ds::parse_reduce_op("SUM") == ds::ReduceOp::Sum);
  CHECK(ds::parse_reduce_op("Mean") == ds::ReduceOp::Mean);
  CHECK(ds::parse_reduce_op("min") == ds::ReduceOp::Min);
  CHECK(ds::parse_reduce_op("MAX") == ds::ReduceOp::Max);
  CHECK(ds::parse_reduce_op("product") == ds::ReduceOp::Product);
  CHECK(fmt::format("{}", ds::ReduceOp::Mean) == "MEAN");
  CHECK_THROWS_WITH_AS(ds::parse_reduce_op("avg"),
                       "unknown reduce op 'avg': expected one of SUM, MEAN, MIN, MAX, PRODUCT (any case)",
                       ds::InvalidArgument);
  CHECK_THROWS_AS(ds::parse_reduce_op(""), ds::InvalidArgument);
}

TEST_CASE("DeviceSpec parses and formats TF device strings") {
  auto gpu = ds::DeviceSpec::parse("/gpu:0");
  CHECK(gpu.device_type == "GPU");
  CHECK(gpu.device_index == 0);
  CHECK(!gpu.job);
  CHECK(gpu.to_string() == "/device:GPU:0");

  auto short_form = ds::DeviceSpec::parse("GPU:1");
  CHECK(short_form.device_type == "GPU");
  CHECK(short_form.device_index == 1);

  CHECK(ds::DeviceSpec::parse("/cpu:0").to_string() == "/device:CPU:0");
  CHECK(ds::DeviceSpec::parse("/device:CPU:*").to_string() == "/device:CPU:*");

  auto full = ds::DeviceSpec::parse("/job:worker/replica:0/task:1/device:CPU:0");
  CHECK(full.job == "worker");
  CHECK(full.replica == 0);
  CHECK(full.task == 1);
  CHECK(full.device_type == "CPU");
  CHECK(full.device_index == 0);
  CHECK(full.to_string() == "/job:worker/replica:0/task:1/device:CPU:0");
  CHECK(fmt::format("{}", full) == "/job:worker/replica:0/task:1/device:CPU:0");

  auto job_only = ds::DeviceSpec::parse("/job:ps/task:2");
  CHECK(job_only.to_string() == "/job:ps/task:2");
  CHECK(ds::DeviceSpec::parse("/cpu:3").fill_from(job_only).to_string() == "/job:ps/task:2/device:CPU:3");
}

TEST_CASE("DeviceSpec accepts and normalises what tf.DeviceSpec.from_string does") {
  // Expected strings: TensorFlow 2.21's DeviceSpec.from_string(s).to_string().
  auto str = [](std::string_view s) { return ds::DeviceSpec::parse(s).to_string(); };
  CHECK(str("") == "");
  CHECK(str("//") == "");
  CHECK(str("/cpu") == "/device:CPU:*");
  CHECK(str("gpu") == "/device:GPU:*");
  CHECK(str("/tpu") == "/device:TPU:*");
  CHECK(str("/job:") == "/job:");
  CHECK(str("device:foo:1") == "/device:foo:1");
  CHECK(str("/device:tpu:0") == "/device:tpu:0");  // only cpu/gpu are upper-cased in this form
  CHECK(str("device:cpu:0") == "/device:CPU:0");
  CHECK(str("/device:Cpu:0") == "/device:Cpu:0");
  CHECK(str("/Gpu:1") == "/device:GPU:1");        // the short form is upper-cased
  CHECK(str("/task:-1") == "/task:-1");
  CHECK(str("/task: 3") == "/task:3");
  CHECK(str("cpu:1_0") == "/device:CPU:10");
  CHECK(str("/replica:x/replica:2") == "/replica:2");  // the last one counts
  CHECK(str("/:/job:a") == "/job:a");                  // a component starting with ':' is skipped
  CHECK(str("/job:a/job:b") == "/job:b");
  CHECK(str("/job:w/replica:+0/task:007/device:gpu:*") == "/job:w/replica:0/task:7/device:GPU:*");
  auto empty = ds::DeviceSpec::parse("");
  CHECK(!empty.job);
  CHECK(!empty.device_type);
  CHECK(!empty.device_index);
}

TEST_CASE("DeviceSpec rejects what tf.DeviceSpec.from_string rejects, naming the string and the part") {
  auto fails = [](std::string_view s, const std::string& why) {
    CHECK_THROWS_WITH_AS(ds::DeviceSpec::parse(s), fmt::format("invalid device string '{}': {}", s, why).c_str(),
                         ds::InvalidArgument);
  };
  const std::string expected = "(expected job:NAME, replica:N, task:N, device:TYPE:N or CPU/GPU/TPU:N)";
  fails("foo:1", "unknown attribute 'foo' in component 'foo:1' " + expected);
  fails("/JOB:w", "unknown attribute 'JOB' in component 'JOB:w' " + expected);
  fails("/device:CPU", "unknown attribute 'device' in component 'device:CPU' " + expected);
  fails("/job:a:b", "unknown attribute 'job' in component 'job:a:b' " + expected);
  fails("banana", "unknown attribute 'banana' in component 'banana' " + expected);
  fails("/cpu:0/gpu:1", "more than one device type");
  fails("/cpu:0/device:GPU:1", "more than one device type");
  fails("/gpu:x", "device index 'x' is not an integer");
  fails("/gpu:", "device index '' is not an integer");
  fails("/task:1__0", "task '1__0' is not an integer");
  fails("/replica:x", "replica 'x' is not an integer");
  // Stricter than TF (docs/semantics.md): Python's int has no bound, ours is an int.
  fails("/GPU:2147483648", "device index '2147483648' is out of range for an int");
  fails("/task:-2147483649", "task '-2147483649' is out of range for an int");
}

TEST_CASE("errors form one hierarchy under ds::Error") {
  CHECK_THROWS_AS(throw ds::InvalidArgument("x"), ds::Error);
  CHECK_THROWS_AS(throw ds::ClusterConfigError("x"), ds::Error);
  CHECK_THROWS_AS(throw ds::PeerFailure("x"), ds::Error);
  CHECK_THROWS_AS(throw ds::CollectiveTimeout("x"), ds::Error);
  CHECK_THROWS_AS(throw ds::CheckpointError("x"), ds::Error);
  CHECK_THROWS_AS(throw ds::Unavailable("x"), std::runtime_error);
}

TEST_CASE("Sharded concatenates its shards along axis 0") {
  using S = ds::OneDeviceStrategy<>;
  ds::Sharded<ds::Tensor<int>, S> sharded(
      {ds::Tensor<int>({2, 2}, {0, 1, 2, 3}), ds::Tensor<int>({1, 2}, {4, 5})});
  CHECK(sharded.num_shards() == 2);
  CHECK(sharded.shape() == ds::Shape{3, 2});
  CHECK(sharded.to_tensor() == ds::Tensor<int>({3, 2}, {0, 1, 2, 3, 4, 5}));
  CHECK_THROWS_WITH_AS((ds::Sharded<ds::Tensor<int>, S>({ds::Tensor<int>({2, 2}, {0, 1, 2, 3}), ds::Tensor<int>({1, 3}, {4, 5, 6})})),
                       "Sharded: shard 1 has shape (1, 3) which does not stack with shard 0's (2, 2)", ds::InvalidArgument);
}

// The host reduction kernels run in blocks of 16 elements plus a scalar tail, or, on x86-64 CPUs
// with AVX2 and from 64 elements, in blocks of 32 plus a tail; every length around those
// boundaries must give each element its own definition's value.
TEST_CASE_TEMPLATE("reduction kernels: every element, across block and tail boundaries", T, float, double, std::int32_t,
                   std::int64_t, std::int8_t, std::int16_t) {
#if defined(DISTRIBUTE_X86_AVX2_DISPATCH)
  const std::string kernels = ds::core::detail::cpu_has_avx2() ? "used from 64 elements" : "not available on this CPU";
  MESSAGE("AVX2 kernels: ", kernels);
#endif
  for (std::size_t n : {0, 1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 95, 96, 97, 100, 1000, 1023}) {
    CAPTURE(n);
    std::vector<T> base(n), src(n);
    for (std::size_t i = 0; i < n; ++i) {
      base[i] = static_cast<T>(static_cast<int>(i % 13) - 6);  // negatives, zero and positives
      src[i] = static_cast<T>(static_cast<int>((i * 7) % 11) - 5);
    }
    for (ds::ReduceOp op : {ds::ReduceOp::Sum, ds::ReduceOp::Mean, ds::ReduceOp::Min, ds::ReduceOp::Max,
                            ds::ReduceOp::Product}) {
      CAPTURE(op);
      std::vector<T> acc = base;
      ds::core::combine(acc.data(), src.data(), n, op);
      for (std::size_t i = 0; i < n; ++i) {
        const T a = base[i], b = src[i];
        const T want = op == ds::ReduceOp::Min ? (b < a ? b : a)
                       : op == ds::ReduceOp::Max ? (a < b ? b : a)
                       : op == ds::ReduceOp::Product ? static_cast<T>(a * b)
                                                     : static_cast<T>(a + b);
        REQUIRE(acc[i] == want);
      }
    }
    std::vector<T> quotient = base;
    ds::core::divide(quotient.data(), n, 4);
    for (std::size_t i = 0; i < n; ++i) REQUIRE(quotient[i] == static_cast<T>(base[i] / static_cast<T>(4)));
  }
}

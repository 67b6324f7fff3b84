// Bringing your own tensors: 16-bit floats, values whose dtype is known only at run time, and
// values whose memory is not row-major contiguous (column-major matrices, transposed views).
#include <distribute/distribute.hpp>

#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "support/tensor_types.hpp"

namespace ds = distribute;
using test_types::ColMajor;
using test_types::DynTensor;

namespace {

std::uint16_t bits(ds::float16 h) { return ds::to_bits(h); }
std::uint16_t bits(ds::bfloat16 h) { return ds::to_bits(h); }

template <class H>
std::vector<H> of_bits(std::initializer_list<std::uint16_t> b) {
  std::vector<H> out;
  for (auto x : b) out.push_back(ds::from_bits<H>(x));
  return out;
}

}  // namespace

TEST_CASE("float16: known encodings, round to nearest even, overflow and subnormals") {
  CHECK(bits(ds::float16(1.0f)) == 0x3C00);
  CHECK(bits(ds::float16(-2.0f)) == 0xC000);
  CHECK(bits(ds::float16(65504.0f)) == 0x7BFF);          // largest finite
  CHECK(bits(ds::float16(65519.0f)) == 0x7BFF);          // below the midpoint to 65536
  CHECK(bits(ds::float16(65520.0f)) == 0x7C00);          // the midpoint rounds to even: inf
  CHECK(bits(ds::float16(0x1p-24f)) == 0x0001);          // smallest subnormal
  CHECK(bits(ds::float16(0x1p-25f)) == 0x0000);          // halfway to it: even (zero)
  CHECK(bits(ds::float16(0x1.8p-24f)) == 0x0002);        // 1.5 ulp: even (2)
  CHECK(bits(ds::float16(1.0f + 0x1p-11f)) == 0x3C00);   // halfway 1 .. 1+2^-10: even
  CHECK(bits(ds::float16(1.0f + 0x3p-11f)) == 0x3C02);   // halfway 1+2^-10 .. 1+2^-9: even
  CHECK(bits(ds::float16(-0.0f)) == 0x8000);
  CHECK((bits(ds::float16(std::numeric_limits<float>::quiet_NaN())) & 0x7C00) == 0x7C00);
  CHECK((bits(ds::float16(std::numeric_limits<float>::quiet_NaN())) & 0x03FF) != 0);
  CHECK(float(ds::from_bits<ds::float16>(0x0001)) == 0x1p-24f);
  CHECK(float(ds::from_bits<ds::float16>(0x7C00)) == std::numeric_limits<float>::infinity());
  CHECK(float(std::numeric_limits<ds::float16>::max()) == 65504.0f);
  CHECK(float(std::numeric_limits<ds::float16>::lowest()) == -65504.0f);
}

TEST_CASE("bfloat16: known encodings and round to nearest even") {
  CHECK(bits(ds::bfloat16(1.0f)) == 0x3F80);
  CHECK(bits(ds::bfloat16(-2.0f)) == 0xC000);
  CHECK(bits(ds::bfloat16(1.0f + 0x1p-8f)) == 0x3F80);   // halfway: even
  CHECK(bits(ds::bfloat16(1.0f + 0x3p-8f)) == 0x3F82);   // halfway: even (up)
  CHECK(bits(ds::bfloat16(3.0e38f)) == 0x7F62);
  CHECK(bits(ds::bfloat16(3.4e38f)) == 0x7F80);          // rounds past the largest finite: inf
  CHECK((bits(ds::bfloat16(std::numeric_limits<float>::quiet_NaN())) & 0x7FC0) == 0x7FC0);
  CHECK(float(ds::from_bits<ds::bfloat16>(0x4049)) == 3.140625f);
}

TEST_CASE("16-bit floats: every finite bit pattern survives float and back") {
  int f16_mismatches = 0, bf16_mismatches = 0;
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const auto h = static_cast<std::uint16_t>(b);
    const float f = float(ds::from_bits<ds::float16>(h));
    if (!std::isnan(f) && bits(ds::float16(f)) != h) ++f16_mismatches;
    const float g = float(ds::from_bits<ds::bfloat16>(h));
    if (!std::isnan(g) && bits(ds::bfloat16(g)) != h) ++bf16_mismatches;
  }
  CHECK(f16_mismatches == 0);
  CHECK(bf16_mismatches == 0);
}

TEST_CASE("DType: F16 and BF16 carry TF's names and sizes") {
  CHECK(ds::to_string(ds::DType::F16) == "float16");
  CHECK(ds::to_string(ds::DType::BF16) == "bfloat16");
  CHECK(ds::size_of(ds::DType::BF16) == 2);
  CHECK(ds::dtype_of<ds::bfloat16>() == ds::DType::BF16);
  CHECK(ds::is_floating(ds::DType::F16));
  CHECK(!ds::is_floating(ds::DType::I16));
}

TEST_CASE("all_reduce of bfloat16 accumulates in float32 and rounds once") {
  ds::MirroredStrategy<ds::host> strategy(4);
  // 1 + 3 * 2^-8 is exact in float32 and halfway between two bfloat16 values; rounding once gives
  // the even one, 1 + 2^-6 (0x3F82). Adding in bfloat16 step by step would give 1.0 (0x3F80).
  auto summed = strategy.run([](ds::ReplicaContext& ctx) {
    const float mine = ctx.replica_id_in_sync_group() == 0 ? 1.0f : 0x1p-8f;
    std::vector<ds::bfloat16> v(1000, ds::bfloat16(mine));  // longer than one reduction block
    return ctx.all_reduce(ds::ReduceOp::Sum, std::move(v));
  });
  for (const auto& r : summed.values()) {
    CHECK(bits(r[0]) == 0x3F82);
    CHECK(bits(r[999]) == 0x3F82);
  }
}

TEST_CASE("all_reduce of float16: exact sums bit for bit, every op, Mean, NaN and inf") {
  ds::MirroredStrategy<ds::host> strategy(4);
  // Replica r holds {r + 0.5, -r, 2^-24 * (r+1), 256 + r}: sums exactly representable in float16.
  auto values = [](int r) {
    return std::vector<ds::float16>{ds::float16(r + 0.5f), ds::float16(float(-r)), ds::float16(0x1p-24f * float(r + 1)),
                                    ds::float16(256.0f + float(r))};
  };
  auto run = [&](ds::ReduceOp op) {
    return strategy.run([&](ds::ReplicaContext& ctx) { return ctx.all_reduce(op, values(ctx.replica_id_in_sync_group())); });
  };
  auto sum = run(ds::ReduceOp::Sum)[3];
  CHECK(bits(sum[0]) == 0x4800);  // 8
  CHECK(bits(sum[1]) == 0xC600);  // -6
  CHECK(bits(sum[2]) == 0x000A);  // 10 * 2^-24
  CHECK(bits(sum[3]) == 0x6406);  // 1030
  auto mean = run(ds::ReduceOp::Mean)[0];
  CHECK(float(mean[0]) == 2.0f);
  CHECK(float(mean[1]) == -1.5f);
  CHECK(bits(mean[2]) == 0x0002);  // 2.5 * 2^-24: halfway, to even
  CHECK(float(mean[3]) == 257.5f);
  auto mx = run(ds::ReduceOp::Max)[1];
  CHECK(float(mx[0]) == 3.5f);
  CHECK(float(mx[1]) == 0.0f);
  auto mn = run(ds::ReduceOp::Min)[2];
  CHECK(float(mn[1]) == -3.0f);
  CHECK(float(mn[3]) == 256.0f);
  auto prod = run(ds::ReduceOp::Product)[0];
  CHECK(float(prod[0]) == 0.5f * 1.5f * 2.5f * 3.5f);

  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (auto op : {ds::ReduceOp::Sum, ds::ReduceOp::Max, ds::ReduceOp::Min, ds::ReduceOp::Mean}) {
    CAPTURE(op);
    auto out = strategy.run([&](ds::ReplicaContext& ctx) {
      const int r = ctx.replica_id_in_sync_group();
      std::vector<ds::float16> v{ds::float16(r == 2 ? nan : 1.0f), ds::float16(r == 1 ? inf : 1.0f)};
      return ctx.all_reduce(op, std::move(v));
    });
    CHECK(std::isnan(float(out[0][0])));
    if (op != ds::ReduceOp::Min) CHECK(float(out[0][1]) == inf);
  }
}

TEST_CASE("16-bit floats through strategy.reduce, gather and variables") {
  ds::MirroredStrategy<ds::host> strategy(2);
  auto scope = strategy.scope();
  auto per_replica = strategy.run([](ds::ReplicaContext& ctx) {
    const int r = ctx.replica_id_in_sync_group();
    return ds::Tensor<ds::bfloat16>({2}, {ds::bfloat16(1.0f + r), ds::bfloat16(-0.5f)});
  });
  auto sum = strategy.reduce(ds::ReduceOp::Sum, per_replica);
  CHECK(float(sum[0]) == 3.0f);
  auto along = strategy.reduce(ds::ReduceOp::Mean, per_replica, 0);
  CHECK(float(along[0]) == 0.5f);  // (1 - 0.5 + 2 - 0.5) / 4
  auto gathered = strategy.gather(per_replica, 0);
  REQUIRE(gathered.shape() == ds::Shape{4});
  CHECK(float(gathered[2]) == 2.0f);
  CHECK(fmt::format("{}", gathered) == "Tensor<bfloat16>(shape=(4,), [1, -0.5, 2, -0.5])");

  ds::Variable<std::vector<ds::float16>> w(std::vector<ds::float16>(2, ds::float16(1.0f)),
                                           {.name = "w", .aggregation = ds::VariableAggregation::Mean});
  strategy.run([&](ds::ReplicaContext& ctx) {
    w.assign_add(std::vector<ds::float16>(2, ds::float16(ctx.replica_id_in_sync_group() == 0 ? 0.25f : 0.75f)));
  });
  for (const auto& copy : w.values()) CHECK(float(copy[1]) == 1.5f);
  CHECK(w.dtype() == ds::DType::F16);
}

TEST_CASE("empty and 0-d 16-bit values") {
  ds::MirroredStrategy<ds::host> strategy(2);
  auto out = strategy.run([](ds::ReplicaContext& ctx) {
    return ctx.all_reduce(ds::ReduceOp::Sum, std::vector<ds::bfloat16>{}, ds::float16(1.5f));
  });
  CHECK(std::get<0>(out)[0].empty());
  CHECK(float(std::get<1>(out)[1]) == 3.0f);
}

// ---- values whose dtype is known only at run time ---------------------------------------------

TEST_CASE("run-time dtype: all_reduce, broadcast and all_gather of float32 and bfloat16 values") {
  ds::MirroredStrategy<ds::host> strategy(3);
  auto out = strategy.run([](ds::ReplicaContext& ctx) {
    const float r = float(ctx.replica_id_in_sync_group());
    DynTensor a = DynTensor::of<float>({2}, {r, 10.0f * r});
    DynTensor b = DynTensor::of<ds::bfloat16>({1, 2}, {ds::bfloat16(r), ds::bfloat16(0.5f)});
    auto [sa, sb] = ctx.all_reduce(ds::ReduceOp::Sum, std::move(a), std::move(b));
    DynTensor root = ctx.broadcast(DynTensor::of<std::int32_t>({1}, {int(r) + 7}), 2);
    DynTensor g = ctx.all_gather(DynTensor::of<ds::bfloat16>({1, 1}, {ds::bfloat16(r)}), 1);
    return std::make_tuple(sa, sb, root, g);
  });
  const DynTensor& sa = std::get<0>(out)[1];
  const DynTensor& sb = std::get<1>(out)[1];
  const DynTensor& root = std::get<2>(out)[0];
  const DynTensor& g = std::get<3>(out)[2];
  CHECK(sa.dtype == ds::DType::F32);
  CHECK(sa.get<float>(1) == 30.0f);
  CHECK(sb.dtype == ds::DType::BF16);
  CHECK(sb.shape == ds::Shape{1, 2});
  CHECK(float(sb.get<ds::bfloat16>(0)) == 3.0f);
  CHECK(float(sb.get<ds::bfloat16>(1)) == 1.5f);
  CHECK(root.get<std::int32_t>(0) == 9);
  CHECK(g.shape == ds::Shape{1, 3});
  CHECK(float(g.get<ds::bfloat16>(2)) == 2.0f);
}

TEST_CASE("run-time dtype: replicas passing different dtypes or shapes get an InvalidArgument naming both") {
  ds::MirroredStrategy<ds::host> strategy(2);
  auto dtypes = [&] {
    strategy.run([](ds::ReplicaContext& ctx) {
      DynTensor v = ctx.replica_id_in_sync_group() == 0 ? DynTensor::of<float>({2}, {1, 2})
                                                        : DynTensor::of<ds::bfloat16>({2}, {ds::bfloat16(1.0f), ds::bfloat16(2.0f)});
      return ctx.all_reduce(ds::ReduceOp::Sum, std::move(v));
    });
  };
  CHECK_THROWS_WITH_AS(dtypes(), doctest::Contains("float32 of shape (2,) on replica 0 but bfloat16 of shape (2,) on replica 1"),
                       ds::InvalidArgument);
  auto shapes = [&] {
    strategy.run([](ds::ReplicaContext& ctx) {
      DynTensor v = ctx.replica_id_in_sync_group() == 0 ? DynTensor::of<float>({2}, {1, 2}) : DynTensor::of<float>({1, 2}, {1, 2});
      return ctx.all_reduce(ds::ReduceOp::Sum, std::move(v));
    });
  };
  CHECK_THROWS_WITH_AS(shapes(), doctest::Contains("float32 of shape (2,) on replica 0 but float32 of shape (1, 2) on replica 1"),
                       ds::InvalidArgument);
  // strategy.reduce of components of different dtypes
  auto mixed = strategy.run([](ds::ReplicaContext& ctx) {
    return ctx.replica_id_in_sync_group() == 0 ? DynTensor::of<float>({1}, {1}) : DynTensor::of<double>({1}, {1});
  });
  CHECK_THROWS_WITH_AS(strategy.reduce(ds::ReduceOp::Sum, mixed),
                       doctest::Contains("replica 0's value is float32 of shape (1,) but replica 1's is float64 of shape (1,)"),
                       ds::InvalidArgument);
}

TEST_CASE("run-time dtype: an lvalue is left alone even when copies share memory") {
  ds::MirroredStrategy<ds::host> strategy(2);
  strategy.run([](ds::ReplicaContext& ctx) {
    DynTensor grad = DynTensor::of<float>({2}, {1.0f, 2.0f});
    DynTensor sum = ctx.all_reduce(ds::ReduceOp::Sum, grad);  // DynTensor copies share their elements
    CHECK(grad.get<float>(1) == 2.0f);
    CHECK(sum.get<float>(1) == 4.0f);
  });
}

TEST_CASE("run-time dtype: mirrored variables hold independent copies and are updated in place") {
  ds::MirroredStrategy<ds::host> strategy(2);
  auto scope = strategy.scope();
  DynTensor init = DynTensor::of<ds::bfloat16>({2}, {ds::bfloat16(1.0f), ds::bfloat16(2.0f)});
  ds::Variable<DynTensor> v(init, {.name = "v"});
  strategy.run([&](ds::ReplicaContext& ctx) {
    v.assign_add(DynTensor::of<ds::bfloat16>({2}, {ds::bfloat16(float(ctx.replica_id_in_sync_group())), ds::bfloat16(0.5f)}));
  });
  CHECK(float(v.values()[0].get<ds::bfloat16>(0)) == 1.0f);
  CHECK(float(v.values()[1].get<ds::bfloat16>(0)) == 2.0f);
  CHECK(float(v.values()[1].get<ds::bfloat16>(1)) == 2.5f);
  CHECK(float(init.get<ds::bfloat16>(0)) == 1.0f);  // the initial value's memory is not a copy's
  CHECK(v.dtype() == ds::DType::BF16);
  CHECK_THROWS_WITH_AS(v.assign(DynTensor::of<float>({2}, {1, 2})),
                       doctest::Contains("a float32 value of shape (2,) does not match variable 'v' (bfloat16 of shape (2,))"),
                       ds::InvalidArgument);
}

// ---- memory that is not row-major contiguous ---------------------------------------------------

TEST_CASE("column-major matrices: gather along each axis gives the row-major logical result") {
  ds::MirroredStrategy<ds::host> strategy(2);
  const ColMajor m = ColMajor::from_rows({{1, 2}, {3, 4}});  // memory: 1 3 2 4
  auto per_replica = strategy.run([&](ds::ReplicaContext&) { return m; });
  auto rows = strategy.gather(per_replica, 0);
  CHECK(rows.shape() == ds::Shape{4, 2});
  CHECK(rows.values() == std::vector<float>{1, 2, 3, 4, 1, 2, 3, 4});
  auto cols = strategy.gather(per_replica, 1);
  CHECK(cols.shape() == ds::Shape{2, 4});
  CHECK(cols.values() == std::vector<float>{1, 2, 1, 2, 3, 4, 3, 4});
  auto along0 = strategy.reduce(ds::ReduceOp::Sum, per_replica, 0);
  CHECK(along0.values() == std::vector<float>{8, 12});
  auto along1 = strategy.reduce(ds::ReduceOp::Sum, per_replica, 1);
  CHECK(along1.values() == std::vector<float>{6, 14});
}

TEST_CASE("column-major matrices: all_reduce, all_gather and variables") {
  ds::MirroredStrategy<ds::host> strategy(2);
  auto scope = strategy.scope();
  ds::Variable<ColMajor> w(ColMajor::from_rows({{0, 0, 0}, {0, 0, 0}}), {.name = "w"});
  auto out = strategy.run([&](ds::ReplicaContext& ctx) {
    const float r = float(ctx.replica_id_in_sync_group());
    ColMajor mine = ColMajor::from_rows({{1 + r, 2, 3}, {4, 5, 6 * r}});
    ColMajor sum = ctx.all_reduce(ds::ReduceOp::Sum, mine);
    w.assign(sum);
    return ctx.all_gather(mine, 0);  // a Tensor<float> in row-major order
  });
  CHECK(w.values()[1].at(0, 0) == 3.0f);
  CHECK(w.values()[1].at(1, 2) == 6.0f);
  CHECK(w.values()[0].at(0, 2) == 6.0f);
  CHECK(out[0].shape() == ds::Shape{4, 3});
  CHECK(out[0].values() == std::vector<float>{1, 2, 3, 4, 5, 0, 2, 2, 3, 4, 5, 6});
}

TEST_CASE("strided views: a transposed run-time value is reduced and written back in its own layout") {
  ds::MirroredStrategy<ds::host> strategy(2);
  auto out = strategy.run([](ds::ReplicaContext& ctx) {
    const float r = float(ctx.replica_id_in_sync_group());
    // Storage 3x2 row-major {a, b; c, d; e, f}; the view is its transpose, logical 2x3.
    DynTensor storage = DynTensor::of<float>({3, 2}, {1 + r, 2, 3, 4, 5, 6});
    DynTensor t = storage.transposed();
    DynTensor reduced = ctx.all_reduce(ds::ReduceOp::Sum, DynTensor(t));  // rvalue: reduced in t's memory
    CHECK(storage.get<float>(0) == 3.0f);                                 // written back through the strides
    CHECK(storage.get<float>(1) == 4.0f);
    CHECK(reduced.strides == ds::Strides{1, 2});
    return ctx.all_gather(t, 0);
  });
  // t logically [[1+r, 3, 5], [2, 4, 6]], after the in-place sum [[3, 6, 10], [4, 8, 12]]
  CHECK(out[0].shape == ds::Shape{4, 3});
  CHECK(out[0].get<float>(0) == 3.0f);
  CHECK(out[0].get<float>(1) == 6.0f);
  CHECK(out[0].get<float>(3) == 4.0f);
  CHECK(out[0].get<float>(11) == 12.0f);
}

TEST_CASE("tensor_traits that describe themselves wrongly are refused with a message") {
  DynTensor t = DynTensor::of<float>({2, 2}, {1, 2, 3, 4});
  t.strides = {1};  // rank 1 strides for a rank 2 tensor
  CHECK_THROWS_WITH_AS(ds::view_of(t), doctest::Contains("tensor_traits<test_types::DynTensor>::view gave 1 strides for a tensor of rank 2"), ds::InvalidArgument);
  t.strides = {-2, 1};
  CHECK_THROWS_WITH_AS(ds::view_of(t), doctest::Contains("negative stride"), ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(ds::make_value<std::vector<float>>(ds::DType::BF16, {2}),
                       doctest::Contains("cannot hold bfloat16 values in a value of element type float32"),
                       ds::InvalidArgument);
}

namespace {
// A run-time type whose make() ignores the dtype it is asked for: the library must notice.
struct LyingTensor {
  test_types::DynTensor t;
};
}  // namespace

template <>
struct distribute::tensor_traits<LyingTensor> {
  static TensorView view(const LyingTensor& v) { return tensor_traits<test_types::DynTensor>::view(v.t); }
  static LyingTensor make(DType, const Shape& shape) { return {tensor_traits<test_types::DynTensor>::make(DType::F32, shape)}; }
};

TEST_CASE("tensor_traits whose make() returns another dtype, or whose view has a negative dimension, are refused") {
  CHECK_THROWS_WITH_AS(ds::make_value<LyingTensor>(ds::DType::BF16, {2}),
                       "tensor_traits<(anonymous namespace)::LyingTensor>::make(bfloat16, (2,)) returned float32 (2,); it "
                       "must return a value of that dtype and shape",
                       ds::InvalidArgument);
  DynTensor t = DynTensor::of<float>({2, 2}, {1, 2, 3, 4});
  t.shape = {2, -2};
  t.strides = {2, 1};
  CHECK_THROWS_WITH_AS(ds::view_of(t), "tensor_traits<test_types::DynTensor>: negative dimension in shape (2, -2)",
                       ds::InvalidArgument);
}

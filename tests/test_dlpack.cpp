// DLPack tensors through the collectives, strategies and variables (include/distribute/adapters/dlpack.hpp).
#define DISTRIBUTE_WITH_PS
#include <distribute/adapters/dlpack.hpp>

#include <distribute/distribute.hpp>

#include <doctest/doctest.h>

#include <distribute/core/host_operands.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

// The multi-process cases: tests/adapters_worker_helper processes (adapters_multi_process.hpp).
#define WITH_DLPACK 1
#include "adapters_multi_process.hpp"

namespace ds = distribute;
namespace dl = distribute::dlpack;

namespace {

// A producer's tensor as a framework hands it out: the elements and the shape live in the manager
// context, and the deleter counts its calls.
struct Produced {
  std::vector<float> elements;
  std::vector<std::int64_t> shape, strides;
  int* deleted = nullptr;
};

DLManagedTensor* produce(std::vector<float> elements, std::vector<std::int64_t> shape, int* deleted,
                         std::vector<std::int64_t> strides = {}) {
  auto* ctx = new Produced{std::move(elements), std::move(shape), std::move(strides), deleted};
  auto* m = new DLManagedTensor{};
  m->dl_tensor.data = ctx->elements.data();
  m->dl_tensor.device = {kDLCPU, 0};
  m->dl_tensor.ndim = static_cast<int>(ctx->shape.size());
  m->dl_tensor.dtype = {kDLFloat, 32, 1};
  m->dl_tensor.shape = ctx->shape.data();
  m->dl_tensor.strides = ctx->strides.empty() ? nullptr : ctx->strides.data();
  m->manager_ctx = ctx;
  m->deleter = [](DLManagedTensor* self) {
    auto* c = static_cast<Produced*>(self->manager_ctx);
    ++*c->deleted;
    delete c;
    delete self;
  };
  return m;
}

DLTensor host_tensor(void* data, std::vector<std::int64_t>& shape, DLDataType dtype = {kDLFloat, 32, 1}) {
  DLTensor t{};
  t.data = data;
  t.device = {kDLCPU, 0};
  t.ndim = static_cast<int>(shape.size());
  t.dtype = dtype;
  t.shape = shape.data();
  return t;
}

std::vector<float> floats(const dl::Tensor& t) { return t.to_vector<float>(); }

template <class H>
std::vector<float> widened(const dl::Tensor& t) {
  std::vector<float> out;
  for (H h : t.to_vector<H>()) out.push_back(float(h));
  return out;
}

}  // namespace

TEST_CASE("dlpack: element types map both ways; others are refused naming code, bits and lanes") {
  struct Case {
    DLDataType dl;
    ds::DType dtype;
  };
  const Case cases[] = {
      {{kDLFloat, 16, 1}, ds::DType::F16}, {{kDLFloat, 32, 1}, ds::DType::F32}, {{kDLFloat, 64, 1}, ds::DType::F64},
      {{kDLBfloat, 16, 1}, ds::DType::BF16}, {{kDLInt, 8, 1}, ds::DType::I8},   {{kDLInt, 16, 1}, ds::DType::I16},
      {{kDLInt, 32, 1}, ds::DType::I32},     {{kDLInt, 64, 1}, ds::DType::I64}, {{kDLUInt, 8, 1}, ds::DType::U8},
      {{kDLUInt, 16, 1}, ds::DType::U16},    {{kDLUInt, 32, 1}, ds::DType::U32}, {{kDLUInt, 64, 1}, ds::DType::U64},
  };
  for (const Case& c : cases) {
    CAPTURE(ds::to_string(c.dtype));
    CHECK(dl::to_dtype(c.dl) == c.dtype);
    const DLDataType back = dl::to_dl_dtype(c.dtype);
    CHECK(back.code == c.dl.code);
    CHECK(back.bits == c.dl.bits);
    CHECK(back.lanes == 1);
  }
#if DISTRIBUTE_DLPACK_HAS_BOOL
  CHECK(dl::to_dtype({kDLBool, 8, 1}) == ds::DType::Bool);
  CHECK(dl::to_dl_dtype(ds::DType::Bool).code == kDLBool);
#else
  CHECK(dl::to_dl_dtype(ds::DType::Bool).code == kDLUInt);  // as PyTorch exported bool before kDLBool
  CHECK(dl::to_dl_dtype(ds::DType::Bool).bits == 8);
#endif

  CHECK_THROWS_WITH_AS(dl::to_dtype({kDLComplex, 64, 1}),
                       doctest::Contains("DLPack dtype type code 5 (complex), 64 bits, 1 lane is not supported"),
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(dl::to_dtype({kDLFloat, 32, 4}),
                       doctest::Contains("type code 2 (float), 32 bits, 4 lanes is not supported (vector types are not)"),
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(dl::to_dtype({kDLFloat, 8, 1}), doctest::Contains("type code 2 (float), 8 bits, 1 lane"),
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(dl::to_dtype({kDLBfloat, 32, 1}), doctest::Contains("type code 4 (bfloat), 32 bits"),
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(dl::to_dtype({kDLOpaqueHandle, 64, 1}), doctest::Contains("type code 3 (opaque handle)"),
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(dl::to_dtype({kDLInt, 4, 1}), doctest::Contains("type code 0 (int), 4 bits"), ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(dl::to_dtype({kDLUInt, 1, 1}), doctest::Contains("type code 1 (uint), 1 bits"), ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(dl::to_dtype({77, 32, 1}), doctest::Contains("type code 77 (unknown), 32 bits"), ds::InvalidArgument);
}

TEST_CASE("dlpack: zeros, from_values and make give row-major CPU tensors") {
  dl::Tensor z = dl::Tensor::zeros(ds::DType::I32, {2, 3});
  CHECK(z.dtype() == ds::DType::I32);
  CHECK(z.shape() == ds::Shape{2, 3});
  CHECK(z.strides().empty());
  CHECK(z.is_host());
  CHECK(z.dl_tensor().device.device_type == kDLCPU);
  CHECK(z.dl_tensor().dtype.code == kDLInt);
  CHECK(z.dl_tensor().dtype.bits == 32);
  CHECK(reinterpret_cast<std::uintptr_t>(z.data()) % 256 == 0);
  CHECK(z.to_vector<std::int32_t>() == std::vector<std::int32_t>(6, 0));

  dl::Tensor scalar = ds::make_value<dl::Tensor>(ds::DType::F64, {});
  CHECK(scalar.shape().empty());
  CHECK(scalar.dl_tensor().ndim == 0);
  CHECK(scalar.to_vector<double>() == std::vector<double>{0.0});

  dl::Tensor empty;
  CHECK(empty.shape() == ds::Shape{0});
  CHECK(empty.to_vector<float>().empty());

  // make(Bool) must view as Bool even where DLPack spells bool as uint8.
  CHECK(ds::make_value<dl::Tensor>(ds::DType::Bool, {2}).dtype() == ds::DType::Bool);

  dl::Tensor v = dl::Tensor::from_values<std::int16_t>({3}, {1, -2, 3});
  CHECK(v.to_vector<std::int16_t>() == std::vector<std::int16_t>{1, -2, 3});
}

TEST_CASE("dlpack: copies share elements, clone is deep") {
  dl::Tensor a = dl::Tensor::from_values<float>({2}, {1, 2});
  dl::Tensor b = a;
  CHECK(b.shares_with(a));
  static_cast<float*>(b.data())[0] = 5.0f;
  CHECK(floats(a) == std::vector<float>{5, 2});
  dl::Tensor c = a.clone();
  CHECK(!c.shares_with(a));
  static_cast<float*>(c.data())[0] = 7.0f;
  CHECK(floats(a) == std::vector<float>{5, 2});
  CHECK(floats(c) == std::vector<float>{7, 2});
}

TEST_CASE("dlpack: every collective of MirroredStrategy<host>(3) on float32 tensors") {
  ds::MirroredStrategy<ds::host> strategy(3);
  auto out = strategy.run([](ds::ReplicaContext& ctx) {
    const float r = float(ctx.replica_id_in_sync_group());
    // replica r: [[r, 1], [2r, -r]]
    auto mine = [r] { return dl::Tensor::from_values<float>({2, 2}, {r, 1, 2 * r, -r}); };
    dl::Tensor sum = ctx.all_reduce(ds::ReduceOp::Sum, mine());
    dl::Tensor mean = ctx.all_reduce(ds::ReduceOp::Mean, mine());
    dl::Tensor max = ctx.all_reduce(ds::ReduceOp::Max, mine());
    dl::Tensor rows = ctx.all_gather(mine(), 0);
    dl::Tensor cols = ctx.all_gather(mine(), 1);
    dl::Tensor root = ctx.broadcast(mine(), 2);
    return std::make_tuple(sum, mean, max, rows, cols, root);
  });
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    CHECK(floats(std::get<0>(out)[r]) == std::vector<float>{3, 3, 6, -3});
    CHECK(floats(std::get<1>(out)[r]) == std::vector<float>{1, 1, 2, -1});
    CHECK(floats(std::get<2>(out)[r]) == std::vector<float>{2, 1, 4, 0});
    CHECK(std::get<3>(out)[r].shape() == ds::Shape{6, 2});
    CHECK(floats(std::get<3>(out)[r]) == std::vector<float>{0, 1, 0, 0, 1, 1, 2, -1, 2, 1, 4, -2});
    CHECK(std::get<4>(out)[r].shape() == ds::Shape{2, 6});
    CHECK(floats(std::get<4>(out)[r]) == std::vector<float>{0, 1, 1, 1, 2, 1, 0, 0, 2, -1, 4, -2});
    CHECK(floats(std::get<5>(out)[r]) == std::vector<float>{2, 1, 4, -2});
    CHECK(std::get<0>(out)[r].dl_tensor().device.device_type == kDLCPU);
  }
}

TEST_CASE("dlpack: strategy.reduce with and without an axis, gather along every axis") {
  ds::MirroredStrategy<ds::host> strategy(2);
  auto per_replica = strategy.run([](ds::ReplicaContext& ctx) {
    const std::int32_t r = ctx.replica_id_in_sync_group();
    return dl::Tensor::from_values<std::int32_t>({2, 3}, {1 + r, 2, 3, 4, 5, 6 * r});  // replica 1: 6 in the corner
  });
  auto sum = strategy.reduce(ds::ReduceOp::Sum, per_replica);
  CHECK(sum.shape() == ds::Shape{2, 3});
  CHECK(sum.to_vector<std::int32_t>() == std::vector<std::int32_t>{3, 4, 6, 8, 10, 6});
  auto max = strategy.reduce(ds::ReduceOp::Max, per_replica);
  CHECK(max.to_vector<std::int32_t>() == std::vector<std::int32_t>{2, 2, 3, 4, 5, 6});
  auto along0 = strategy.reduce(ds::ReduceOp::Sum, per_replica, 0);
  CHECK(along0.shape() == ds::Shape{3});
  CHECK(along0.to_vector<std::int32_t>() == std::vector<std::int32_t>{11, 14, 12});
  auto along1 = strategy.reduce(ds::ReduceOp::Sum, per_replica, 1);
  CHECK(along1.shape() == ds::Shape{2});
  CHECK(along1.to_vector<std::int32_t>() == std::vector<std::int32_t>{13, 24});

  auto rows = strategy.gather(per_replica, 0);
  CHECK(rows.shape() == ds::Shape{4, 3});
  CHECK(rows.to_vector<std::int32_t>() == std::vector<std::int32_t>{1, 2, 3, 4, 5, 0, 2, 2, 3, 4, 5, 6});
  auto cols = strategy.gather(per_replica, 1);
  CHECK(cols.shape() == ds::Shape{2, 6});
  CHECK(cols.to_vector<std::int32_t>() == std::vector<std::int32_t>{1, 2, 3, 2, 2, 3, 4, 5, 0, 4, 5, 6});
  CHECK_THROWS_WITH_AS(strategy.gather(per_replica, 2),
                       doctest::Contains("axis 2 is out of range for values of shape (2, 3) (rank 2)"), ds::InvalidArgument);
}

TEST_CASE("dlpack: a mirrored variable is updated with assign_add on every replica") {
  ds::MirroredStrategy<ds::host> strategy(3);
  auto scope = strategy.scope();
  dl::Tensor init = dl::Tensor::from_values<double>({2}, {1.0, -1.0});
  ds::Variable<dl::Tensor> w(init, {.name = "w", .aggregation = ds::VariableAggregation::Sum});
  strategy.run([&](ds::ReplicaContext& ctx) {
    const double r = ctx.replica_id_in_sync_group();
    w.assign_add(dl::Tensor::from_values<double>({2}, {r, 0.5}));
  });
  REQUIRE(w.values().size() == 3);
  for (const dl::Tensor& copy : w.values()) {
    CHECK(copy.to_vector<double>() == std::vector<double>{4.0, 0.5});  // 1 + (0+1+2), -1 + 3*0.5
    CHECK(!copy.shares_with(init));
  }
  CHECK(init.to_vector<double>() == std::vector<double>{1.0, -1.0});
}

TEST_CASE("dlpack: float16 and bfloat16 tensors") {
  ds::MirroredStrategy<ds::host> strategy(2);
  auto scope = strategy.scope();
  auto out = strategy.run([](ds::ReplicaContext& ctx) {
    const float r = float(ctx.replica_id_in_sync_group());
    dl::Tensor h = dl::Tensor::from_values<ds::float16>({2}, {ds::float16(0.5f + r), ds::float16(-1.0f)});
    dl::Tensor b = dl::Tensor::from_values<ds::bfloat16>({1, 2}, {ds::bfloat16(r), ds::bfloat16(0.25f)});
    auto [sh, sb] = ctx.all_reduce(ds::ReduceOp::Sum, std::move(h), std::move(b));
    dl::Tensor g = ctx.all_gather(dl::Tensor::from_values<ds::bfloat16>({1, 1}, {ds::bfloat16(3.0f * r)}), 1);
    return std::make_tuple(sh, sb, g);
  });
  const dl::Tensor& sh = std::get<0>(out)[1];
  CHECK(sh.dtype() == ds::DType::F16);
  CHECK(sh.dl_tensor().dtype.code == kDLFloat);
  CHECK(sh.dl_tensor().dtype.bits == 16);
  CHECK(widened<ds::float16>(sh) == std::vector<float>{2.0f, -2.0f});
  const dl::Tensor& sb = std::get<1>(out)[0];
  CHECK(sb.dtype() == ds::DType::BF16);
  CHECK(sb.dl_tensor().dtype.code == kDLBfloat);
  CHECK(widened<ds::bfloat16>(sb) == std::vector<float>{1.0f, 0.5f});
  const dl::Tensor& g = std::get<2>(out)[0];
  CHECK(g.shape() == ds::Shape{1, 2});
  CHECK(widened<ds::bfloat16>(g) == std::vector<float>{0.0f, 3.0f});

  // A producer's float16 memory (binary16 bits) read through borrow.
  std::vector<std::uint16_t> bits{0x3C00, 0xC000};  // 1, -2
  std::vector<std::int64_t> shape{2};
  dl::Tensor borrowed = dl::borrow(host_tensor(bits.data(), shape, {kDLFloat, 16, 1}));
  auto per_replica = strategy.run([&](ds::ReplicaContext&) { return borrowed.clone(); });
  CHECK(widened<ds::float16>(strategy.reduce(ds::ReduceOp::Mean, per_replica)) == std::vector<float>{1.0f, -2.0f});
  CHECK(widened<ds::float16>(strategy.gather(per_replica, 0)) == std::vector<float>{1.0f, -2.0f, 1.0f, -2.0f});
}

TEST_CASE("dlpack: a transposed (strided) view gives the row-major logical result and is written back") {
  ds::MirroredStrategy<ds::host> strategy(2);
  auto out = strategy.run([](ds::ReplicaContext& ctx) {
    const float r = float(ctx.replica_id_in_sync_group());
    // Storage 3x2 row-major {a, b; c, d; e, f}; the view is its transpose, logical 2x3 with strides (1, 2).
    std::vector<float> storage{1 + r, 2, 3, 4, 5, 6};
    std::vector<std::int64_t> shape{2, 3}, strides{1, 2};
    DLTensor t = host_tensor(storage.data(), shape);
    t.strides = strides.data();
    dl::Tensor view = dl::borrow(t);
    CHECK(view.strides() == ds::Strides{1, 2});
    CHECK(floats(view) == std::vector<float>{1 + r, 3, 5, 2, 4, 6});
    dl::Tensor gathered = ctx.all_gather(view, 0);
    dl::Tensor reduced = ctx.all_reduce(ds::ReduceOp::Sum, dl::Tensor(view));  // rvalue: in the storage
    CHECK(storage == std::vector<float>{3, 4, 6, 8, 10, 12});                  // through the strides
    CHECK(reduced.shares_with(view));
    return gathered;
  });
  CHECK(out[0].shape() == ds::Shape{4, 3});
  CHECK(floats(out[0]) == std::vector<float>{1, 3, 5, 2, 4, 6, 2, 3, 5, 2, 4, 6});

  // strategy.reduce along an axis of strided components
  std::vector<float> storage{1, 2, 3, 4, 5, 6};
  std::vector<std::int64_t> shape{2, 3}, strides{1, 2};
  DLTensor t = host_tensor(storage.data(), shape);
  t.strides = strides.data();
  dl::Tensor view = dl::borrow(t);  // [[1, 3, 5], [2, 4, 6]]
  auto per_replica = strategy.run([&](ds::ReplicaContext&) { return view; });
  CHECK(floats(strategy.reduce(ds::ReduceOp::Sum, per_replica, 1)) == std::vector<float>{18, 24});
  CHECK(floats(strategy.gather(per_replica, 1)) == std::vector<float>{1, 3, 5, 1, 3, 5, 2, 4, 6, 2, 4, 6});
}

TEST_CASE("dlpack: a broadcast view (stride 0, as torch's expand() exports) is read in its logical order") {
  std::vector<float> storage{1, 2, 3};
  std::vector<std::int64_t> shape{2, 3}, strides{0, 1};  // the one row, twice
  DLTensor t = host_tensor(storage.data(), shape);
  t.strides = strides.data();
  const dl::Tensor expanded = dl::borrow(t);
  CHECK(floats(expanded) == std::vector<float>{1, 2, 3, 1, 2, 3});
  dl::Tensor copy = expanded.clone();
  CHECK(copy.strides().empty());
  CHECK(floats(copy) == std::vector<float>{1, 2, 3, 1, 2, 3});
  ds::MirroredStrategy<ds::host> strategy(2);
  auto sums = strategy.run([&](ds::ReplicaContext& ctx) { return ctx.all_reduce(ds::ReduceOp::Sum, expanded); });
  CHECK(floats(sums[0]) == std::vector<float>{2, 4, 6, 2, 4, 6});
  CHECK(storage == std::vector<float>{1, 2, 3});  // lvalues are copied before the collective
}

TEST_CASE("dlpack: byte_offset is honoured") {
  std::vector<float> storage{9, 9, 1, 2, 3};
  std::vector<std::int64_t> shape{3};
  DLTensor t = host_tensor(storage.data(), shape);
  t.byte_offset = 2 * sizeof(float);
  dl::Tensor v = dl::borrow(t);
  CHECK(floats(v) == std::vector<float>{1, 2, 3});
  ds::MirroredStrategy<ds::host> strategy(2);
  strategy.run([&](ds::ReplicaContext& ctx) {
    if (ctx.replica_id_in_sync_group() == 0) {
      ctx.all_reduce(ds::ReduceOp::Sum, dl::Tensor(v));  // in place, after the offset
    } else {
      ctx.all_reduce(ds::ReduceOp::Sum, dl::Tensor::from_values<float>({3}, {10, 20, 30}));
    }
  });
  CHECK(storage == std::vector<float>{9, 9, 11, 22, 33});
}

TEST_CASE("dlpack: from_dlpack owns the producer's tensor; to_dlpack hands out one the consumer frees") {
  int deleted = 0;
  {
    dl::Tensor t = dl::from_dlpack(produce({1, 2, 3, 4}, {2, 2}, &deleted));
    dl::Tensor copy = t;
    {
      dl::Tensor gone = std::move(t);
    }
    CHECK(deleted == 0);
    ds::MirroredStrategy<ds::host> strategy(2);
    auto sums = strategy.run([&](ds::ReplicaContext& ctx) { return ctx.all_reduce(ds::ReduceOp::Sum, copy); });
    CHECK(floats(sums[0]) == std::vector<float>{2, 4, 6, 8});
    CHECK(floats(copy) == std::vector<float>{1, 2, 3, 4});  // an lvalue is not reduced in place
    CHECK(deleted == 0);
  }
  CHECK(deleted == 1);

  // Export: the consumer's DLManagedTensor keeps the elements alive after every Tensor is gone.
  DLManagedTensor* exported = nullptr;
  {
    dl::Tensor t = dl::from_dlpack(produce({1, 2, 3, 4, 5, 6}, {3, 2}, &deleted));
    exported = dl::to_dlpack(t);
  }
  CHECK(deleted == 1);
  REQUIRE(exported != nullptr);
  const DLTensor& e = exported->dl_tensor;
  CHECK(e.ndim == 2);
  CHECK(e.shape[0] == 3);
  CHECK(e.shape[1] == 2);
  REQUIRE(e.strides != nullptr);  // always given, row-major here
  CHECK(e.strides[0] == 2);
  CHECK(e.strides[1] == 1);
  CHECK(e.device.device_type == kDLCPU);
  CHECK(e.dtype.code == kDLFloat);
  CHECK(static_cast<const float*>(e.data)[5] == 6.0f);
  exported->deleter(exported);
  CHECK(deleted == 2);

  // A tensor of ours exported and taken back (as a framework would round-trip it).
  dl::Tensor ours = dl::Tensor::from_values<std::uint16_t>({2}, {7, 8});
  dl::Tensor back = dl::from_dlpack(dl::to_dlpack(ours));
  CHECK(back.dtype() == ds::DType::U16);
  CHECK(back.data() == ours.data());
  CHECK(back.to_vector<std::uint16_t>() == std::vector<std::uint16_t>{7, 8});

  // A strided view exports its strides and byte_offset.
  std::vector<float> storage{0, 1, 2, 3, 4, 5, 6};
  std::vector<std::int64_t> shape{2, 3}, strides{1, 2};
  DLTensor t = host_tensor(storage.data(), shape);
  t.strides = strides.data();
  t.byte_offset = sizeof(float);
  DLManagedTensor* strided = dl::to_dlpack(dl::borrow(t));
  CHECK(strided->dl_tensor.strides[0] == 1);
  CHECK(strided->dl_tensor.strides[1] == 2);
  CHECK(strided->dl_tensor.byte_offset == sizeof(float));
  CHECK(floats(dl::from_dlpack(strided)) == std::vector<float>{1, 3, 5, 2, 4, 6});
}

TEST_CASE("dlpack: tensors on a device are refused by the host collectives with a message") {
  std::vector<float> storage{1, 2};  // never read: the device pointer is only described
  std::vector<std::int64_t> shape{2};
  DLTensor t = host_tensor(storage.data(), shape);
  t.device = {kDLCUDA, 1};
  const dl::Tensor on_gpu = dl::borrow(t);
  CHECK(!on_gpu.is_host());
  CHECK(on_gpu.view().memory == ds::MemorySpace::device);

  ds::MirroredStrategy<ds::host> strategy(2);
  auto rvalue = [&] {
    strategy.run([&](ds::ReplicaContext& ctx) { return ctx.all_reduce(ds::ReduceOp::Sum, dl::Tensor(on_gpu)); });
  };
  CHECK_THROWS_WITH_AS(rvalue(),
                       doctest::Contains("a float32 (2,) value in device memory cannot go through the host collectives"),
                       ds::InvalidArgument);
  auto lvalue = [&] {
    strategy.run([&](ds::ReplicaContext& ctx) { return ctx.all_reduce(ds::ReduceOp::Sum, on_gpu); });
  };
  CHECK_THROWS_WITH_AS(lvalue(), doctest::Contains("clone needs host memory but the elements are on kDLCUDA:1"),
                       ds::InvalidArgument);
  auto into = [&] {
    strategy.run([&](ds::ReplicaContext& ctx) {
      dl::Tensor out;
      ctx.all_reduce_into(ds::ReduceOp::Sum, on_gpu, out);
    });
  };
  CHECK_THROWS_WITH_AS(into(),
                       "all_reduce_into: a float32 (2,) value in device memory cannot go through the host collectives; "
                       "use a strategy of the device's backend",
                       ds::InvalidArgument);
  auto per_replica = strategy.run([&](ds::ReplicaContext&) { return on_gpu; });
  CHECK_THROWS_WITH_AS(strategy.reduce(ds::ReduceOp::Sum, per_replica),
                       doctest::Contains("value in device memory cannot go through the host collectives"),
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(on_gpu.to_vector<float>(),
                       doctest::Contains("to_vector needs host memory but the elements are on kDLCUDA:1"),
                       ds::InvalidArgument);
  t.device = {static_cast<DLDeviceType>(15), 0};  // not a device type this DLPack names
  CHECK_THROWS_WITH_AS(dl::borrow(t).clone(), doctest::Contains("the elements are on device type 15:0"),
                       ds::InvalidArgument);

  // Pinned host memory is host memory.
  t.device = {kDLCUDAHost, 0};
  const dl::Tensor pinned = dl::borrow(t);
  CHECK(pinned.is_host());
  auto sums = strategy.run([&](ds::ReplicaContext& ctx) { return ctx.all_reduce(ds::ReduceOp::Sum, pinned); });
  CHECK(floats(sums[1]) == std::vector<float>{2, 4});
}

TEST_CASE("dlpack: an unsupported element type is refused when the tensor is used") {
  std::vector<float> storage{1, 2, 3, 4};  // two complex64 values
  std::vector<std::int64_t> shape{2};
  const dl::Tensor complex = dl::borrow(host_tensor(storage.data(), shape, {kDLComplex, 64, 1}));
  ds::MirroredStrategy<ds::host> strategy(2);
  auto reduce = [&] {
    strategy.run([&](ds::ReplicaContext& ctx) { return ctx.all_reduce(ds::ReduceOp::Sum, dl::Tensor(complex)); });
  };
  CHECK_THROWS_WITH_AS(reduce(), doctest::Contains("DLPack dtype type code 5 (complex), 64 bits, 1 lane is not supported"),
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(complex.dtype(), doctest::Contains("type code 5 (complex)"), ds::InvalidArgument);
  const dl::Tensor float4 = dl::borrow(host_tensor(storage.data(), shape, {kDLFloat, 32, 4}));
  CHECK_THROWS_WITH_AS(ds::view_of(float4), doctest::Contains("32 bits, 4 lanes is not supported (vector types are not)"),
                       ds::InvalidArgument);
}

TEST_CASE("dlpack: malformed tensors and bad arguments are refused with a message") {
  std::vector<float> storage{1, 2, 3, 4};
  std::vector<std::int64_t> shape{2, 2};
  DLTensor good = host_tensor(storage.data(), shape);

  CHECK_THROWS_WITH_AS(dl::from_dlpack(nullptr), doctest::Contains("from_dlpack: the DLManagedTensor is null"),
                       ds::InvalidArgument);
  DLTensor t = good;
  t.ndim = -1;
  CHECK_THROWS_WITH_AS(dl::borrow(t), doctest::Contains("negative ndim -1"), ds::InvalidArgument);
  t = good;
  t.shape = nullptr;
  CHECK_THROWS_WITH_AS(dl::borrow(t), doctest::Contains("ndim is 2 but shape is null"), ds::InvalidArgument);
  t = good;
  t.data = nullptr;
  CHECK_THROWS_WITH_AS(dl::borrow(t), doctest::Contains("data is null for a tensor of shape (2, 2)"), ds::InvalidArgument);
  std::vector<std::int64_t> negative{2, -1};
  t = good;
  t.shape = negative.data();
  CHECK_THROWS_WITH_AS(dl::borrow(t), doctest::Contains("negative dimension in shape (2, -1)"), ds::InvalidArgument);
  std::vector<std::int64_t> flipped{-2, 1};
  t = good;
  t.strides = flipped.data();
  CHECK_THROWS_WITH_AS(dl::borrow(t), doctest::Contains("negative stride in strides (-2, 1) (shape (2, 2))"),
                       ds::InvalidArgument);
  std::vector<std::int64_t> huge{std::int64_t{1} << 40, std::int64_t{1} << 40};
  t = good;
  t.shape = huge.data();
  CHECK_THROWS_WITH_AS(dl::borrow(t), doctest::Contains("the element count overflows a 64-bit size"), ds::InvalidArgument);
  std::vector<std::int64_t> big{std::int64_t{1} << 31, std::int64_t{1} << 30};
  t = good;
  t.shape = big.data();  // 2^61 elements fit in int64, 2^63 bytes do not
  CHECK_THROWS_WITH_AS(dl::borrow(t), doctest::Contains("the byte extent overflows a 64-bit size"), ds::InvalidArgument);
  std::vector<std::int64_t> wide{2, std::numeric_limits<std::int64_t>::max()};
  t = good;
  t.strides = wide.data();
  CHECK_THROWS_WITH_AS(dl::borrow(t), doctest::Contains("the strides' extent overflows a 64-bit size"),
                       ds::InvalidArgument);
  t = good;
  t.byte_offset = std::numeric_limits<std::uint64_t>::max();
  CHECK_THROWS_WITH_AS(dl::borrow(t), doctest::Contains("byte_offset 18446744073709551615 is beyond any address"),
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(dl::Tensor::zeros(ds::DType::F32, {std::int64_t{1} << 62, 4}),
                       doctest::Contains("the element count overflows a 64-bit size"), ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(dl::Tensor::zeros(ds::DType::F64, {std::int64_t{1} << 61}),
                       doctest::Contains("the byte size overflows a 64-bit size"), ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(dl::Tensor::zeros(ds::DType::F32, {3, -1}), doctest::Contains("negative dimension in shape (3, -1)"),
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(dl::Tensor::from_values<float>({2, 2}, {1, 2, 3}),
                       doctest::Contains("shape (2, 2) holds 4 elements but 3 values were given"), ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(dl::borrow(good).to_vector<double>(), doctest::Contains("to_vector<float64> of a float32 tensor"),
                       ds::InvalidArgument);

  // A refused DLManagedTensor is released: from_dlpack took ownership of it.
  int deleted = 0;
  DLManagedTensor* m = produce({1, 2}, {2}, &deleted);
  m->dl_tensor.ndim = -3;
  CHECK_THROWS_WITH_AS(dl::from_dlpack(m), doctest::Contains("negative ndim -3"), ds::InvalidArgument);
  CHECK(deleted == 1);

  // A zero-size tensor may have a null data pointer.
  std::vector<std::int64_t> none{0, 3};
  t = good;
  t.shape = none.data();
  t.data = nullptr;
  CHECK(dl::borrow(t).to_vector<float>().empty());
}

TEST_CASE("dlpack: views whose use would be undefined behaviour are refused with a message") {
  // A float32 tensor whose byte_offset puts its first element at an odd address.
  alignas(16) std::array<float, 4> storage{1, 2, 3, 4};
  std::vector<std::int64_t> shape{3};
  DLTensor t = host_tensor(storage.data(), shape);
  t.byte_offset = 1;
  CHECK_THROWS_WITH_AS(dl::borrow(t),
                       doctest::Contains(fmt::format("DLPack tensor: byte_offset 1 puts the first element at {}, not aligned "
                                                     "to its 4-byte elements; copy it into aligned memory first",
                                                     static_cast<const void*>(reinterpret_cast<std::byte*>(storage.data()) + 1))
                                             .c_str()),
                       ds::InvalidArgument);
  t.byte_offset = 4;  // one whole element in: aligned
  CHECK(floats(dl::borrow(t)) == std::vector<float>{2, 3, 4});
  // Any value type's view is checked the same way (what its tensor_traits returns).
  void* odd = reinterpret_cast<std::byte*>(storage.data()) + 2;
  CHECK_THROWS_WITH_AS(ds::check_view(ds::TensorView{odd, ds::DType::F32, {1}}, typeid(dl::Tensor)),
                       doctest::Contains(fmt::format("the first element of a float32 (1,) value is at address {}, not "
                                                     "aligned to its 4-byte elements", odd)
                                             .c_str()),
                       ds::InvalidArgument);

  // 3 x 3 with strides (1, 1): element (i, j) is storage[i + j], so elements share memory. Read,
  // it is what its strides say; written in place, replicas would race on shared elements.
  std::vector<float> five{1, 2, 3, 4, 5};
  std::vector<std::int64_t> square{3, 3}, overlapping{1, 1};
  DLTensor o = host_tensor(five.data(), square);
  o.strides = overlapping.data();
  const dl::Tensor diagonals = dl::borrow(o);
  CHECK(floats(diagonals) == std::vector<float>{1, 2, 3, 2, 3, 4, 3, 4, 5});
  ds::MirroredStrategy<ds::host> strategy(2);
  CHECK_THROWS_WITH_AS(strategy.run([&](ds::ReplicaContext& ctx) { ctx.all_reduce(ds::ReduceOp::Sum, dl::Tensor(diagonals)); }),
                       doctest::Contains("a float32 (3, 3) strides (1, 1) value whose elements overlap (its strides make "
                                         "elements share memory along axis 1) cannot be written; pass a contiguous copy"),
                       ds::InvalidArgument);
  // Out of place (an lvalue is copied first), every replica gets the same sums.
  auto sums = strategy.run([&](ds::ReplicaContext& ctx) { return ctx.all_reduce(ds::ReduceOp::Sum, diagonals); });
  CHECK(floats(sums[0]) == std::vector<float>{2, 4, 6, 4, 6, 8, 6, 8, 10});
  CHECK(floats(sums[1]) == floats(sums[0]));
  CHECK(five == std::vector<float>{1, 2, 3, 4, 5});

  // A device type this DLPack does not name (42) is never loaded as the enum: device memory.
  DLTensor d = host_tensor(storage.data(), shape);
  const std::int32_t unknown = 42;
  std::memcpy(&d.device.device_type, &unknown, sizeof unknown);
  const dl::Tensor elsewhere = dl::borrow(d);
  CHECK(!elsewhere.is_host());
  CHECK_THROWS_WITH_AS(elsewhere.clone(), doctest::Contains("the elements are on device type 42:0"), ds::InvalidArgument);

#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)  // their allocators abort on 64 GiB
  // 2^34 elements at stride 0: one float in memory, 64 GiB as a row-major copy.
  std::vector<std::int64_t> huge{std::int64_t{1} << 34}, zero{0};
  DLTensor b = host_tensor(storage.data(), huge);
  b.strides = zero.data();
  const dl::Tensor broadcast = dl::borrow(b);
  CHECK_THROWS_WITH_AS(broadcast.clone(), "DLPack tensor: 68719476736 bytes of elements cannot be allocated",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(strategy.run([&](ds::ReplicaContext& ctx) { return ctx.all_reduce(ds::ReduceOp::Sum, broadcast); }),
                       "DLPack tensor: 68719476736 bytes of elements cannot be allocated", ds::InvalidArgument);
  // The same view as a collective's operand, where it is staged in a row-major copy.
  ds::core::HostOperands operands("all_reduce");
  const ds::TensorView view{storage.data(), ds::DType::F32, {std::int64_t{1} << 34}, {0}};
  CHECK_THROWS_WITH_AS(operands.add(view, true),
                       "all_reduce: a float32 (17179869184,) strides (0,) value needs a row-major copy of "
                       "68719476736 bytes, which cannot be allocated",
                       ds::InvalidArgument);
#endif
}

TEST_CASE("dlpack: MultiWorkerMirrored, 2 worker processes") {
  // Every collective, strategy.reduce/gather and variables, checked inside each worker.
  adapters_mp::run_two_workers("dlpack");
}

TEST_CASE("dlpack: a parameter-server cluster: 1 ps, 1 worker") {
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
  ds::Variable<dl::Tensor> w(dl::Tensor::from_values<float>({2, 2}, {1, 2, 3, 4}), {.name = "w"});
  CHECK(w.device() == "/job:ps/replica:0/task:0/device:CPU:0");
  // A producer's transposed view: logical [[10, 30], [20, 40]], strides (1, 2).
  dl::Tensor delta = adapters_mp::DlpackKit::strided({10, 30, 20, 40}, {2, 2});
  REQUIRE(delta.strides() == ds::Strides{1, 2});
  dl::Tensor seen = coordinator.schedule(&adapters_mp::dlpack_add_and_read, w, delta).get();
  CHECK(seen.dtype() == ds::DType::F32);
  CHECK(seen.shape() == ds::Shape{2, 2});
  CHECK(floats(seen) == std::vector<float>{11, 32, 23, 44});
  dl::Tensor twice = coordinator.schedule(&adapters_mp::dlpack_twice,
                                          dl::Tensor::from_values<ds::bfloat16>({3}, {ds::bfloat16(1.5f), ds::bfloat16(-2.0f),
                                                                                      ds::bfloat16(0x1p-7f)}))
                         .get();
  CHECK(twice.dtype() == ds::DType::BF16);
  CHECK(widened<ds::bfloat16>(twice) == std::vector<float>{3, -4, 0x1p-6f});
  coordinator.join();
  CHECK(floats(w.read_value()) == std::vector<float>{11, 32, 23, 44});
  coordinator.shutdown_cluster();
  cluster.check_stopped();
#else
  MESSAGE("skipped: the parameter-server parts are not built (they need Boost, OpenSSL and cereal)");
#endif
}

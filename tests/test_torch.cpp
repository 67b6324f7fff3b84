// torch::Tensor through the collectives, strategies and variables (adapters/torch.hpp): run-time
// dtypes incl. float16/bfloat16, handles that share memory, strided views, autograd-free writes.
#define DISTRIBUTE_WITH_PS
#include <distribute/adapters/torch.hpp>
#include <distribute/distribute.hpp>

#include <doctest/doctest.h>

#include <ATen/ATen.h>

#include <vector>

// The multi-process cases: tests/adapters_worker_helper processes (adapters_multi_process.hpp).
#define WITH_TORCH 1
#include "adapters_multi_process.hpp"

namespace ds = distribute;

namespace {

std::vector<float> values(const at::Tensor& t) {
  at::Tensor c = t.contiguous().to(at::kFloat);
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

at::Tensor of(std::vector<float> v, at::IntArrayRef shape, at::ScalarType dtype = at::kFloat) {
  return at::tensor(v).reshape(shape).to(dtype);
}

}  // namespace

TEST_CASE("torch: all_reduce of every supported dtype, with exact results") {
  ds::MirroredStrategy<ds::host> strategy(4);
  for (auto dtype : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kInt, at::kLong, at::kChar, at::kShort, at::kByte}) {
    const std::string dtype_name = c10::toString(dtype);
    CAPTURE(dtype_name);
    auto out = strategy.run([&](ds::ReplicaContext& ctx) {
      const float r = float(ctx.replica_id_in_sync_group());
      return ctx.all_reduce(ds::ReduceOp::Sum, of({r, 2 * r, 3, 1}, {2, 2}, dtype));
    });
    CHECK(static_cast<int>(out[3].scalar_type()) == static_cast<int>(dtype));
    CHECK(out[3].sizes().vec() == std::vector<std::int64_t>{2, 2});
    CHECK(values(out[3]) == std::vector<float>{6, 12, 12, 4});
  }
  auto mean = strategy.run([](ds::ReplicaContext& ctx) {
    return ctx.all_reduce(ds::ReduceOp::Mean, of({float(ctx.replica_id_in_sync_group()), 1}, {2}, at::kBFloat16));
  });
  CHECK(values(mean[0]) == std::vector<float>{1.5, 1});
}

TEST_CASE("torch: bfloat16 gradients accumulate in float32 and round once") {
  ds::MirroredStrategy<ds::host> strategy(4);
  auto out = strategy.run([](ds::ReplicaContext& ctx) {
    const float mine = ctx.replica_id_in_sync_group() == 0 ? 1.0f : 0x1p-8f;
    return ctx.all_reduce(ds::ReduceOp::Sum, at::full({300}, mine, at::kBFloat16));
  });
  CHECK(values(out[1])[299] == 1.015625f);  // 1 + 3 * 2^-8 rounded to even once, not 1.0
}

TEST_CASE("torch: handles - lvalues stay as they are, moved handles are reduced in their memory") {
  ds::MirroredStrategy<ds::host> strategy(2);
  strategy.run([](ds::ReplicaContext& ctx) {
    const float r = float(ctx.replica_id_in_sync_group());
    at::Tensor grad = of({1 + r, 2}, {2});
    at::Tensor alias = grad;  // shares the elements
    at::Tensor sum = ctx.all_reduce(ds::ReduceOp::Sum, grad);
    CHECK(values(grad) == std::vector<float>{1 + r, 2});
    CHECK(values(sum) == std::vector<float>{3, 4});

    std::vector<at::Tensor> grads{of({r, 1}, {2}), of({10 * r}, {1})};
    std::vector<at::Tensor> handles = grads;  // what a model's .grad() tensors look like
    auto reduced = ctx.batch_all_reduce(ds::ReduceOp::Mean, std::move(handles));
    CHECK(values(grads[0]) == std::vector<float>{0.5, 1});  // in place
    CHECK(values(grads[1]) == std::vector<float>{5});
    CHECK(reduced[1].data_ptr() == grads[1].data_ptr());
    (void)alias;
  });
}

TEST_CASE("torch: transposed and strided views give the logical result and are written back") {
  ds::MirroredStrategy<ds::host> strategy(2);
  auto gathered = strategy.run([](ds::ReplicaContext& ctx) {
    const float r = float(ctx.replica_id_in_sync_group());
    at::Tensor base = of({1 + r, 2, 3, 4, 5, 6}, {2, 3});
    at::Tensor t = base.t();                  // (3, 2), strides (1, 3)
    REQUIRE(!t.is_contiguous());
    ctx.all_reduce(ds::ReduceOp::Sum, at::Tensor(t));  // a handle to t's elements: reduced there
    CHECK(values(base) == std::vector<float>{3, 4, 6, 8, 10, 12});
    at::Tensor every_other = base.slice(1, 0, 3, 2);   // columns 0 and 2: (2, 2), strides (3, 2)
    return ctx.all_gather(every_other, 1);
  });
  CHECK(gathered[0].sizes().vec() == std::vector<std::int64_t>{2, 4});
  CHECK(values(gathered[0]) == std::vector<float>{3, 6, 3, 6, 8, 12, 8, 12});
}

TEST_CASE("torch: strategy.reduce and gather along every axis return torch tensors") {
  ds::MirroredStrategy<ds::host> strategy(2);
  auto per_replica = strategy.run([](ds::ReplicaContext& ctx) {
    const float r = float(ctx.replica_id_in_sync_group());
    return of({r, 1, 2, 3 + r}, {2, 2}).t();  // non-contiguous components
  });
  at::Tensor sum = strategy.reduce(ds::ReduceOp::Sum, per_replica);
  CHECK(values(sum) == std::vector<float>{1, 4, 2, 7});
  at::Tensor along = strategy.reduce(ds::ReduceOp::Max, per_replica, 1);
  CHECK(values(along) == std::vector<float>{2, 4});
  at::Tensor g0 = strategy.gather(per_replica, 0);
  CHECK(g0.sizes().vec() == std::vector<std::int64_t>{4, 2});
  CHECK(values(g0) == std::vector<float>{0, 2, 1, 3, 1, 2, 1, 4});
  at::Tensor g1 = strategy.gather(per_replica, 1);
  CHECK(values(g1) == std::vector<float>{0, 2, 1, 2, 1, 3, 1, 4});
}

TEST_CASE("torch: variables hold their own copies, updated without autograd history") {
  ds::MirroredStrategy<ds::host> strategy(2);
  auto scope = strategy.scope();
  at::Tensor init = of({1, 2, 3}, {3}).set_requires_grad(true);
  ds::Variable<at::Tensor> w(init, {.name = "w"});
  for (const auto& copy : w.values()) {
    CHECK(copy.data_ptr() != init.data_ptr());
    CHECK(!copy.requires_grad());
  }
  strategy.run([&](ds::ReplicaContext& ctx) {
    at::Tensor grad = of({0.5, 0.5, float(ctx.replica_id_in_sync_group())}, {3});
    w.assign_sub(ctx.all_reduce(ds::ReduceOp::Mean, std::move(grad)));
  });
  CHECK(values(w.values()[1]) == std::vector<float>{0.5, 1.5, 2.5});
  CHECK(values(w.read_value()) == std::vector<float>{0.5, 1.5, 2.5});
  CHECK(values(init) == std::vector<float>{1, 2, 3});
  CHECK_THROWS_WITH_AS(w.assign(of({1, 2, 3}, {3}, at::kDouble)),
                       "assign: a float64 value of shape (3,) does not match variable 'w' (float32 of shape (3,))",
                       ds::InvalidArgument);
}

TEST_CASE("torch: empty and 0-d tensors") {
  ds::MirroredStrategy<ds::host> strategy(2);
  auto out = strategy.run([](ds::ReplicaContext& ctx) {
    return ctx.all_reduce(ds::ReduceOp::Sum, at::zeros({0, 3}), at::scalar_tensor(1.5, at::kHalf));
  });
  CHECK(std::get<0>(out)[0].sizes().vec() == std::vector<std::int64_t>{0, 3});
  CHECK(std::get<1>(out)[1].dim() == 0);
  CHECK(std::get<1>(out)[1].item<float>() == 3.0f);
}

TEST_CASE("torch: bad inputs are refused with a message") {
  ds::MirroredStrategy<ds::host> strategy(2);
  auto dtypes = [&] {
    strategy.run([](ds::ReplicaContext& ctx) {
      auto dtype = ctx.replica_id_in_sync_group() == 0 ? at::kFloat : at::kHalf;
      return ctx.all_reduce(ds::ReduceOp::Sum, at::ones({2}, dtype));
    });
  };
  CHECK_THROWS_WITH_AS(dtypes(), doctest::Contains("float32 of shape (2,) on replica 0 but float16 of shape (2,) on replica 1"),
                       ds::InvalidArgument);
  auto shapes = [&] {
    strategy.run([](ds::ReplicaContext& ctx) {
      return ctx.all_reduce(ds::ReduceOp::Sum, at::ones({ctx.replica_id_in_sync_group() + 1}));
    });
  };
  CHECK_THROWS_WITH_AS(shapes(), doctest::Contains("float32 of shape (1,) on replica 0 but float32 of shape (2,) on replica 1"),
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(ds::view_of(at::ones({2}, at::kComplexFloat)),
                       "a torch::Tensor of dtype ComplexFloat cannot be reduced or sent: the library handles float32/64, "
                       "float16, bfloat16, int8/16/32/64, uint8 and bool",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(ds::view_of(at::Tensor()), "an undefined torch::Tensor (default-constructed) has no elements to use",
                       ds::InvalidArgument);
  auto expanded = [&] {
    strategy.run([](ds::ReplicaContext& ctx) { return ctx.all_reduce(ds::ReduceOp::Sum, at::ones({1}).expand({3})); });
  };
  CHECK_THROWS_WITH_AS(expanded(), doctest::Contains("elements overlap (stride 0 along axis 0"), ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(ds::make_value<at::Tensor>(ds::DType::U32, {2}), "libtorch has no uint32 tensors", ds::InvalidArgument);
}

TEST_CASE("torch: MultiWorkerMirrored, 2 worker processes") {
  // Every collective, strategy.reduce/gather and variables, checked inside each worker.
  adapters_mp::run_two_workers("torch");
}

TEST_CASE("torch: a parameter-server cluster: 1 ps, 1 worker") {
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
  ds::Variable<at::Tensor> w(of({1, 2, 3, 4}, {2, 2}), {.name = "w"});
  CHECK(w.device() == "/job:ps/replica:0/task:0/device:CPU:0");
  at::Tensor delta = of({10, 20, 30, 40}, {2, 2}).t();  // a transposed view: [[10, 30], [20, 40]]
  REQUIRE(!delta.is_contiguous());
  at::Tensor seen = coordinator.schedule(&adapters_mp::torch_add_and_read, w, delta).get();
  CHECK(static_cast<int>(seen.scalar_type()) == static_cast<int>(at::kFloat));
  CHECK(seen.sizes().vec() == std::vector<std::int64_t>{2, 2});
  CHECK(values(seen) == std::vector<float>{11, 32, 23, 44});
  at::Tensor twice = coordinator.schedule(&adapters_mp::torch_twice, of({1.5, -2, 0x1p-7f}, {3}, at::kBFloat16)).get();
  CHECK(static_cast<int>(twice.scalar_type()) == static_cast<int>(at::kBFloat16));
  CHECK(values(twice) == std::vector<float>{3, -4, 0x1p-6f});
  coordinator.join();
  CHECK(values(w.read_value()) == std::vector<float>{11, 32, 23, 44});
  coordinator.shutdown_cluster();
  cluster.check_stopped();
#else
  MESSAGE("skipped: the parameter-server parts are not built (they need Boost, OpenSSL and cereal)");
#endif
}

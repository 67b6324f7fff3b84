// GradientBucketer (adapters/torch_bucketer.hpp): a libtorch model's gradients all-reduced bucket by
// bucket while backward runs. Every result is compared bit for bit with the synchronous
// ctx.batch_all_reduce of the same .grad() tensors, computed by a second copy of each model.
#define DISTRIBUTE_WITH_MULTI_WORKER
#include <distribute/adapters/torch.hpp>
#include <distribute/adapters/torch_bucketer.hpp>
#include <distribute/distribute.hpp>

#include <doctest/doctest.h>

#include <ATen/ATen.h>

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "support/processes.hpp"

namespace ds = distribute;
using ds::adapters::torch::BucketerOptions;
using ds::adapters::torch::GradientBucketer;

namespace {

// A two-layer perceptron with parameters of several sizes, and one (`extra`) that a step may leave
// unused. Values are deterministic, the same for every copy.
struct Mlp {
  at::Tensor w1, b1, w2, b2, extra;

  Mlp() {
    auto init = [](std::vector<std::int64_t> shape, double phase) {
      const std::int64_t n = c10::multiply_integers(shape);
      return (at::arange(n, at::kFloat) * 0.37 + phase).sin().reshape(shape).mul(0.5).set_requires_grad(true);
    };
    w1 = init({9, 7}, 0.1);
    b1 = init({9}, 0.2);
    w2 = init({3, 9}, 0.3);
    b2 = init({3}, 0.4);
    extra = init({4}, 0.5);
  }
  std::vector<at::Tensor> parameters() const { return {w1, b1, w2, b2, extra}; }

  // One replica's loss for `step`; `use_extra` decides whether `extra` takes part.
  at::Tensor loss(int replica, int step, bool use_extra) const {
    const at::Tensor x = (at::arange(5 * 7, at::kFloat).reshape({5, 7}) * (0.013 * (replica + 1)) + 0.1 * step).cos();
    at::Tensor h = at::relu(at::matmul(x, w1.t()) + b1);
    at::Tensor out = at::matmul(h, w2.t()) + b2;
    at::Tensor l = (out * out).mean();
    if (use_extra) l = l + (extra * extra).sum() * 0.25;
    return l;
  }
};

void zero_grads(const Mlp& m) {
  for (auto p : m.parameters()) {
    if (p.grad().defined()) p.mutable_grad().zero_();
  }
}

// The synchronous reference: every .grad() (zeros where undefined, in the wire dtype) through one
// batch_all_reduce, written back.
void reference_all_reduce(ds::ReplicaContext& ctx, const Mlp& m, ds::ReduceOp op,
                          std::optional<at::ScalarType> wire = std::nullopt) {
  std::vector<at::Tensor> grads;
  for (const auto& p : m.parameters()) {
    at::Tensor g = p.grad().defined() ? p.grad().detach().clone() : at::zeros_like(p);
    grads.push_back(wire ? g.to(*wire) : g);
  }
  grads = ctx.batch_all_reduce(op, std::move(grads));
  at::NoGradGuard no_grad;
  const auto params = m.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    at::Tensor g = grads[i].to(params[i].scalar_type());
    if (params[i].grad().defined()) params[i].mutable_grad().copy_(g);
    else params[i].mutable_grad() = g.clone();
  }
}

void check_same_grads(const Mlp& got, const Mlp& want, const std::string& where) {
  const auto a = got.parameters(), b = want.parameters();
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO(where, ", parameter ", i);
    REQUIRE(a[i].grad().defined() == b[i].grad().defined());
    if (a[i].grad().defined()) CHECK(at::equal(a[i].grad(), b[i].grad()));  // bit for bit
  }
}

struct Scenario {
  BucketerOptions options;
  int accumulation = 1;                       // backward passes per step; the last one is bucketed
  bool extra_used_by(int replica) const { return replica % 2 == 1; }  // unused on even replicas
};

// Runs 3 steps on `strategy` with the bucketer and with the synchronous reference; checks each.
template <class Strategy>
void run_and_compare(Strategy& strategy, int local, const Scenario& sc, const std::string& where) {
  const int n = strategy.num_replicas_in_sync();
  std::vector<Mlp> bucketed(static_cast<std::size_t>(local)), reference(static_cast<std::size_t>(local));
  std::vector<GradientBucketer> bucketers;
  for (int r = 0; r < local; ++r) bucketers.emplace_back(bucketed[static_cast<std::size_t>(r)].parameters(), sc.options);
  for (int step = 0; step < 3; ++step) {
    strategy.run([&](ds::ReplicaContext& ctx) {
      const int local_id = ctx.local_replica_id(), replica = ctx.replica_id_in_sync_group();
      Mlp& mine = bucketed[static_cast<std::size_t>(local_id)];
      Mlp& ref = reference[static_cast<std::size_t>(local_id)];
      GradientBucketer& bucketer = bucketers[static_cast<std::size_t>(local_id)];
      zero_grads(mine);
      zero_grads(ref);
      for (int pass = 0; pass < sc.accumulation; ++pass) {
        const bool last = pass + 1 == sc.accumulation;
        if (last) bucketer.prepare(ctx);
        mine.loss(replica, step * 10 + pass, sc.extra_used_by(replica)).backward();
        ref.loss(replica, step * 10 + pass, sc.extra_used_by(replica)).backward();
      }
      bucketer.finish();
      reference_all_reduce(ctx, ref, sc.options.op, sc.options.wire);
    });
    for (int r = 0; r < local; ++r) {
      check_same_grads(bucketed[static_cast<std::size_t>(r)], reference[static_cast<std::size_t>(r)],
                       where + ", step " + std::to_string(step) + ", local replica " + std::to_string(r) + " of " +
                           std::to_string(n));
    }
  }
}

}  // namespace

TEST_CASE("GradientBucketer: the buckets' results equal the synchronous all-reduce bit for bit (MirroredStrategy)") {
  ds::MirroredStrategy<ds::host> strategy(3);
  SUBCASE("one bucket") {
    GradientBucketer probe(Mlp().parameters(), {.bytes_per_pack = 0});
    CHECK(probe.bucket_elements() == std::vector<std::size_t>{4 + 3 + 27 + 9 + 63});
    run_and_compare(strategy, 3, {.options = {.bytes_per_pack = 0}}, "one bucket");
  }
  SUBCASE("many buckets, in reverse parameter order, closed once they reach bytes_per_pack") {
    GradientBucketer probe(Mlp().parameters(), {.bytes_per_pack = 40});
    // extra (4 floats = 16 B), b2 (12 B), w2 (108 B: closes), b1 (36 B), w1 (252 B: closes).
    CHECK(probe.bucket_elements() == std::vector<std::size_t>{4 + 3 + 27, 9 + 63});
    run_and_compare(strategy, 3, {.options = {.bytes_per_pack = 40}}, "many buckets");
    run_and_compare(strategy, 3, {.options = {.bytes_per_pack = 4}}, "a bucket per parameter");
  }
  SUBCASE("SUM") { run_and_compare(strategy, 3, {.options = {.bytes_per_pack = 40, .op = ds::ReduceOp::Sum}}, "SUM"); }
  SUBCASE("gradient accumulation over three backward passes, the last one bucketed") {
    run_and_compare(strategy, 3, {.options = {.bytes_per_pack = 40}, .accumulation = 3}, "accumulation");
  }
  SUBCASE("bfloat16 and float16 on the wire") {
    run_and_compare(strategy, 3, {.options = {.bytes_per_pack = 40, .wire = at::kBFloat16}}, "bf16");
    run_and_compare(strategy, 3, {.options = {.bytes_per_pack = 0, .wire = at::kHalf}}, "fp16");
  }
}

TEST_CASE("GradientBucketer: a parameter without a gradient on some replicas does not hang the step") {
  // `extra` is used on odd replicas only: even replicas send zeros for it, and get the average.
  ds::MirroredStrategy<ds::host> strategy(2);
  std::vector<Mlp> models(2);
  std::vector<GradientBucketer> bucketers;
  for (auto& m : models) bucketers.emplace_back(m.parameters(), BucketerOptions{.bytes_per_pack = 4});
  strategy.run([&](ds::ReplicaContext& ctx) {
    const int r = ctx.replica_id_in_sync_group();
    bucketers[static_cast<std::size_t>(r)].prepare(ctx);
    models[static_cast<std::size_t>(r)].loss(r, 0, r == 1).backward();
    bucketers[static_cast<std::size_t>(r)].finish();
  });
  REQUIRE(models[0].extra.grad().defined());  // defined by finish(): the average of 0 and replica 1's
  CHECK(at::equal(models[0].extra.grad(), models[1].extra.grad()));
  CHECK(models[0].extra.grad().abs().sum().item<float>() > 0);
}

TEST_CASE("GradientBucketer: 2 workers (MultiWorkerMirroredStrategy over TCP, one thread each) equal the synchronous all-reduce") {
  const auto ports = test_support::free_ports(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> workers;
  for (int w = 0; w < 2; ++w) {
    workers.emplace_back([&, w] {
      try {
        auto resolver = std::make_shared<ds::TFConfigClusterResolver>(test_support::tf_config(ports, w));
        ds::MultiWorkerMirroredStrategy<ds::host> strategy({.timeout_seconds = 60}, resolver, 2);
        run_and_compare(strategy, 2, {.options = {.bytes_per_pack = 40}}, "worker " + std::to_string(w));
        run_and_compare(strategy, 2, {.options = {.bytes_per_pack = 0, .wire = at::kBFloat16}, .accumulation = 2},
                        "worker " + std::to_string(w) + ", bf16, accumulation");
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(w)] = e.what();
      }
    });
  }
  for (auto& t : workers) t.join();
  CHECK(errors[0] == "");
  CHECK(errors[1] == "");
}

TEST_CASE("GradientBucketer: bad use is refused with a message") {
  Mlp m;
  CHECK_THROWS_WITH_AS(GradientBucketer({}), "GradientBucketer: no parameters", ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(GradientBucketer({m.w1 * 2}), "GradientBucketer: parameter 0 is not a leaf tensor that requires grad",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(GradientBucketer({at::zeros({3})}),
                       "GradientBucketer: parameter 0 is not a leaf tensor that requires grad", ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(GradientBucketer(m.parameters(), {.op = ds::ReduceOp::Max}),
                       "GradientBucketer: op must be MEAN or SUM, got MAX", ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(GradientBucketer(m.parameters(), {.wire = at::kInt}),
                       "GradientBucketer: wire dtype must be bfloat16, float16 or float32, got Int", ds::InvalidArgument);
  ds::MirroredStrategy<ds::host> strategy(1);
  GradientBucketer bucketer(m.parameters());
  strategy.run([&](ds::ReplicaContext& ctx) {
    CHECK_THROWS_WITH_AS(bucketer.finish(),
                         "GradientBucketer::finish: not prepared (call prepare(ctx) before backward)",
                         ds::InvalidArgument);
    bucketer.prepare(ctx);
    CHECK_THROWS_WITH_AS(bucketer.prepare(ctx), "GradientBucketer::prepare: already prepared (call finish() first)",
                         ds::InvalidArgument);
    m.loss(0, 0, true).backward();
    bucketer.finish();
  });
  CHECK(m.w1.grad().defined());
}

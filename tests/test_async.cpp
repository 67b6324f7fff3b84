// ReplicaContext::all_reduce_async (and extended().all_reduce_async) on the host strategies:
// several in flight, exact results, completion in the order started, mixed with synchronous
// collectives, and errors at wait() or, unseen, at the end of the step.
#include <distribute/distribute.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

namespace ds = distribute;

TEST_CASE("all_reduce_async: 8 in flight, exact results, completed in the order started, 1..4 replicas") {
  for (int n = 1; n <= 4; ++n) {
    CAPTURE(n);
    ds::MirroredStrategy<ds::host> strategy(n);
    auto out = strategy.run([](ds::ReplicaContext& ctx) {
      const int r = ctx.replica_id_in_sync_group();
      std::vector<ds::CollectiveHandle<std::vector<std::int64_t>>> handles;
      for (int k = 0; k < 8; ++k) {
        // call k: 1000 * k + r + i for element i of (k + 1) * 5000 elements
        std::vector<std::int64_t> v(static_cast<std::size_t>((k + 1) * 5000));
        for (std::size_t i = 0; i < v.size(); ++i) v[i] = 1000 * k + r + static_cast<std::int64_t>(i);
        handles.push_back(ctx.all_reduce_async(ds::ReduceOp::Sum, v));  // an lvalue: copied now
      }
      auto last = handles.back().wait();
      bool earlier_done = true;
      for (int k = 0; k < 7; ++k) earlier_done = earlier_done && handles[static_cast<std::size_t>(k)].done();
      std::vector<std::vector<std::int64_t>> results;
      for (int k = 0; k < 7; ++k) results.push_back(handles[static_cast<std::size_t>(k)].wait());
      results.push_back(std::move(last));
      return std::make_tuple(results, earlier_done ? 1 : 0);
    });
    for (int i = 0; i < n; ++i) {
      CHECK(std::get<1>(out)[static_cast<std::size_t>(i)] == 1);  // the last done: every earlier one was
      const auto& results = std::get<0>(out)[static_cast<std::size_t>(i)];
      REQUIRE(results.size() == 8);
      for (int k = 0; k < 8; ++k) {
        const auto& v = results[static_cast<std::size_t>(k)];
        REQUIRE(v.size() == static_cast<std::size_t>((k + 1) * 5000));
        bool exact = true;
        for (std::size_t e = 0; e < v.size(); ++e) {
          exact = exact && v[e] == n * (1000 * k + static_cast<std::int64_t>(e)) + n * (n - 1) / 2;
        }
        CHECK(exact);
      }
    }
  }
}

TEST_CASE("all_reduce_async of several values, mixed with synchronous collectives and a variable update") {
  ds::MirroredStrategy<ds::host> strategy(3);
  auto scope = strategy.scope();
  ds::Variable<std::vector<float>> w(std::vector<float>{0.0f, 0.0f}, {.name = "w", .aggregation = ds::VariableAggregation::Sum});
  auto out = strategy.run([&](ds::ReplicaContext& ctx) {
    const auto r = static_cast<float>(ctx.replica_id_in_sync_group());
    auto h1 = ctx.all_reduce_async("mean", std::vector<float>{r, 2 * r}, std::vector<double>{1.0});
    auto h2 = strategy.extended().all_reduce_async(ds::ReduceOp::Max, std::vector<int>{static_cast<int>(r)});
    auto sync = ctx.all_reduce(ds::ReduceOp::Sum, std::vector<float>{1.0f});  // waits for h1 and h2 first
    w.assign_add(std::vector<float>{1.0f, r});                                // an all_reduce inside
    auto [mean, ones] = h1.wait();
    return std::make_tuple(mean, ones, h2.wait(), sync);
  });
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(std::get<0>(out)[i] == std::vector<float>{1.0f, 2.0f});
    CHECK(std::get<1>(out)[i] == std::vector<double>{1.0});
    CHECK(std::get<2>(out)[i] == std::vector<int>{2});
    CHECK(std::get<3>(out)[i] == std::vector<float>{3.0f});
  }
  CHECK(w.read_value() == std::vector<float>{3.0f, 3.0f});
}

TEST_CASE("all_reduce_async errors: at wait(), at the next collective, at the end of the step; the strategy goes on") {
  ds::MirroredStrategy<ds::host> strategy(2);
  const std::string mismatch = "all_reduce: value 0 is float32 of shape (3,) on replica 0 but float32 of shape (2,) on replica 1";
  // At wait(): a mismatch, and every call started after it fails the same way.
  CHECK_THROWS_WITH_AS(strategy.run([](ds::ReplicaContext& ctx) {
                         auto bad = ctx.all_reduce_async("sum", std::vector<float>(ctx.replica_id_in_sync_group() == 0 ? 3 : 2));
                         auto after = ctx.all_reduce_async("sum", std::vector<float>(4));
                         try {
                           (void)bad.wait();
                         } catch (const ds::InvalidArgument&) {
                           return after.wait().size();  // throws the first error again
                         }
                         return std::size_t{0};
                       }),
                       mismatch.c_str(), ds::InvalidArgument);
  // Never waited: the end of the step throws it.
  CHECK_THROWS_WITH_AS(strategy.run([](ds::ReplicaContext& ctx) {
                         (void)ctx.all_reduce_async("sum", std::vector<float>(ctx.replica_id_in_sync_group() == 0 ? 3 : 2));
                       }),
                       mismatch.c_str(), ds::InvalidArgument);
  // Not waited, then a synchronous collective: that one throws it.
  CHECK_THROWS_WITH_AS(strategy.run([](ds::ReplicaContext& ctx) {
                         auto h = ctx.all_reduce_async("sum", std::vector<float>(ctx.replica_id_in_sync_group() == 0 ? 3 : 2));
                         return ctx.all_reduce("sum", 1.0f);
                       }),
                       mismatch.c_str(), ds::InvalidArgument);
  // Waiting twice is an error of its own.
  CHECK_THROWS_WITH_AS(strategy.run([](ds::ReplicaContext& ctx) {
                         auto h = ctx.all_reduce_async("sum", 1.0f);
                         (void)h.wait();
                         return h.wait();
                       }),
                       "CollectiveHandle::wait: this handle was waited on already (or moved from)", ds::InvalidArgument);
  auto ok = strategy.run([](ds::ReplicaContext& ctx) { return ctx.all_reduce_async("sum", 2.5f).wait(); });
  CHECK(ok[0] == 5.0f);
  CHECK(ok[1] == 5.0f);
  CHECK_THROWS_WITH_AS((void)strategy.extended().all_reduce_async("sum", 1.0f),
                       "extended().all_reduce_async: call it inside a step function of this MirroredStrategy (replica "
                       "context); in cross-replica context batch_reduce_to reduces distributed values",
                       ds::InvalidArgument);
}

// Contexts: scope(), get_strategy, has_strategy, get_replica_context, in_cross_replica_context.
#include <distribute/distribute.hpp>

#include <doctest/doctest.h>

#include <type_traits>

namespace ds = distribute;

TEST_CASE("outside any scope: the default strategy and its replica context") {
  CHECK(!ds::has_strategy());
  CHECK(ds::get_strategy().name() == "DefaultStrategy");
  CHECK(&ds::get_strategy() == &ds::default_strategy());
  CHECK(!ds::in_cross_replica_context());
  ds::ReplicaContext* ctx = ds::get_replica_context();
  REQUIRE(ctx != nullptr);
  CHECK(ctx->replica_id_in_sync_group() == 0);
  CHECK(ctx->num_replicas_in_sync() == 1);
  // The default replica context's collectives work on one replica.
  CHECK(ctx->all_reduce("sum", 5) == 5);
}

TEST_CASE("scope() makes the strategy current and cross-replica") {
  ds::MirroredStrategy<> strategy(2);
  {
    auto scope = strategy.scope();
    CHECK(ds::has_strategy());
    CHECK(&ds::get_strategy() == &strategy);
    CHECK(ds::get_strategy().is<ds::MirroredStrategy<>>());
    CHECK(ds::get_strategy().as<ds::MirroredStrategy<>>() == &strategy);
    CHECK(ds::get_strategy().as<ds::OneDeviceStrategy<>>() == nullptr);
    CHECK(ds::in_cross_replica_context());
    CHECK(ds::get_replica_context() == nullptr);
    {
      auto again = strategy.scope();  // re-entering the same strategy is fine
      CHECK(&ds::get_strategy() == &strategy);
    }
    CHECK(&ds::get_strategy() == &strategy);
  }
  CHECK(!ds::has_strategy());
  CHECK(!ds::in_cross_replica_context());
}

TEST_CASE("scope guards cannot be copied or moved") {
  static_assert(!std::is_copy_constructible_v<ds::ScopeGuard>);
  static_assert(!std::is_move_constructible_v<ds::ScopeGuard>);
  static_assert(!std::is_copy_assignable_v<ds::ScopeGuard>);
}

TEST_CASE("entering a different strategy's scope inside another's throws") {
  ds::MirroredStrategy<> mirrored(2);
  ds::OneDeviceStrategy<> one;
  auto scope = mirrored.scope();
  auto enter_other = [&] { auto inner = one.scope(); };
  CHECK_THROWS_WITH_AS(enter_other(),
                       doctest::Contains("cannot enter the scope of OneDeviceStrategy"), ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(enter_other(), doctest::Contains("inside the scope of MirroredStrategy"), ds::InvalidArgument);
  // The failed entry left the outer scope in place.
  CHECK(&ds::get_strategy() == &mirrored);
}

TEST_CASE("inside run: replica context, the running strategy is current") {
  ds::MirroredStrategy<> strategy(3);
  auto seen = strategy.run([&] {
    ds::ReplicaContext* ctx = ds::get_replica_context();
    bool ok = ctx != nullptr && &ds::get_strategy() == &strategy && ds::has_strategy() && !ds::in_cross_replica_context();
    return ok ? ctx->replica_id_in_sync_group() : -1;
  });
  CHECK(seen.values() == std::vector<int>{0, 1, 2});
  // A different strategy's scope cannot be entered from a replica either.
  ds::OneDeviceStrategy<> other;
  CHECK_THROWS_AS(strategy.run([&] { auto s = other.scope(); }), ds::InvalidArgument);
}

TEST_CASE("run() does not nest") {
  ds::MirroredStrategy<> strategy(2);
  CHECK_THROWS_WITH_AS(strategy.run([&] { strategy.run([] {}); }),
                       doctest::Contains("run() called from inside a step function"), ds::InvalidArgument);
  // The strategy still works afterwards.
  CHECK(strategy.reduce("sum", strategy.run([] { return 1; })) == 2);
}

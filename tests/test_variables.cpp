// Variables: placement in and outside scope, ON_WRITE aggregation, ON_READ, extended().
#include <distribute/distribute.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace ds = distribute;
using Mirrored = ds::MirroredStrategy<ds::host>;

TEST_CASE("a variable created outside any scope is plain") {
  ds::Variable<float> v(1.0f, {.name = "plain"});
  CHECK(!v.is_distributed());
  CHECK(v.name() == "plain");
  CHECK(v.values().size() == 1);
  CHECK(v.read_value() == 1.0f);
  CHECK(v.device() == "/job:localhost/replica:0/task:0/device:CPU:0");
  v.assign_add(2.0f);
  CHECK(v.read_value() == 3.0f);
  ds::Variable<float> alias = v;  // a handle: copies share state
  alias.assign(7.0f);
  CHECK(v.read_value() == 7.0f);
  CHECK(alias == v);
}

TEST_CASE("a plain variable updated in the replicas of a multi-replica strategy is InvalidArgument; reading is fine") {
  // Without the check each of the 4 replicas would apply its update to the one copy: w = -400
  // where a mirrored variable gives -100 (issue 23).
  ds::Variable<std::vector<float>> w(std::vector<float>{0, 0}, {.name = "w"});
  Mirrored strategy(4);
  const std::string expected_tail =
      ": variable 'w' is not distributed (it was created outside a strategy's scope()) and is updated in a replica "
      "of MirroredStrategy with 4 replicas, each of which would apply its update to the one copy; create it under "
      "strategy.scope() (reading it is fine)";
  CHECK_THROWS_WITH_AS(strategy.run([&] { w.assign_sub(std::vector<float>{100, 100}); }), ("assign_sub" + expected_tail).c_str(),
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(strategy.run([&] { w.assign_add(std::vector<float>{1, 1}); }), ("assign_add" + expected_tail).c_str(),
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(strategy.run([&] { w.assign(std::vector<float>{1, 1}); }), ("assign" + expected_tail).c_str(),
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(strategy.run([&] { strategy.extended().update(w, [](std::vector<float>& c) { c[0] = 5; }); }),
                       ("update" + expected_tail).c_str(), ds::InvalidArgument);
  CHECK(w.read_value() == std::vector<float>{0, 0});  // nothing was applied
  // Reading in the replicas is fine; so is updating in cross-replica context, in merge_call, or
  // with one replica.
  auto seen = strategy.run([&] { return w.read_value()[0]; });
  CHECK(seen.values() == std::vector<float>{0, 0, 0, 0});
  w.assign_add(std::vector<float>{1, 1});
  strategy.run([&](ds::ReplicaContextFor<Mirrored>& ctx) {
    ctx.merge_call([&](const ds::PerReplica<int, Mirrored>&) { w.assign_add(std::vector<float>{1, 1}); }, 0);
  });
  Mirrored one(1);
  one.run([&] { w.assign_add(std::vector<float>{1, 1}); });
  CHECK(w.read_value() == std::vector<float>{3, 3});
  // The same update on a variable created under scope() is applied once per replica copy.
  auto scope = strategy.scope();
  ds::Variable<std::vector<float>> m(std::vector<float>{0, 0}, {.name = "m"});
  strategy.run([&] { m.assign_sub(std::vector<float>{100, 100}); });
  CHECK(m.read_value() == std::vector<float>{-100, -100});
}

TEST_CASE("inside a MirroredStrategy scope a variable is mirrored on every replica") {
  Mirrored strategy(3);
  auto scope = strategy.scope();
  ds::Variable<std::vector<float>> w(std::vector<float>{1, 2}, {.name = "w"});
  CHECK(w.is_distributed());
  CHECK(w.synchronization() == ds::VariableSynchronization::OnWrite);
  CHECK(w.trainable());
  CHECK(w.values().size() == 3);
  CHECK(w.devices()[2] == "/job:localhost/replica:0/task:0/device:CPU:2");
  CHECK(strategy.extended().variable_created_in_scope(w));
  ds::OneDeviceStrategy<> other;
  CHECK(!other.extended().variable_created_in_scope(w));

  // Replica reads see the local copy; each replica's device is its own.
  auto devices = strategy.run([&] { return w.device(); });
  CHECK(devices[1] == "/job:localhost/replica:0/task:0/device:CPU:1");

  // Cross-replica update applies to every copy.
  w.assign(std::vector<float>{5, 6});
  for (const auto& copy : w.values()) CHECK(copy == std::vector<float>{5, 6});
  CHECK(strategy.local_results(w).size() == 3);
  CHECK(strategy.reduce("sum", w) == std::vector<float>{15, 18});
}

TEST_CASE("ON_WRITE aggregation in replica context: NONE, SUM, MEAN, ONLY_FIRST_REPLICA") {
  Mirrored strategy(4);
  auto scope = strategy.scope();
  ds::Variable<double> none(0.0, {.name = "none"});
  ds::Variable<double> sum(0.0, {.name = "sum", .aggregation = ds::VariableAggregation::Sum});
  ds::Variable<double> mean(0.0, {.name = "mean", .aggregation = ds::VariableAggregation::Mean});
  ds::Variable<double> first(0.0, {.name = "first", .aggregation = ds::VariableAggregation::OnlyFirstReplica});
  strategy.run([&](ds::ReplicaContext& ctx) {
    const double r = ctx.replica_id_in_sync_group() + 1;  // 1, 2, 3, 4
    none.assign_add(r);   // local copy only
    sum.assign_add(r);    // every copy += 10
    mean.assign_add(r);   // every copy += 2.5
    first.assign(r * 100);  // every copy = 100
  });
  CHECK(none.values() == std::vector<double>{1, 2, 3, 4});
  CHECK(sum.values() == std::vector<double>{10, 10, 10, 10});
  CHECK(mean.values() == std::vector<double>{2.5, 2.5, 2.5, 2.5});
  CHECK(first.values() == std::vector<double>{100, 100, 100, 100});
  strategy.run([&] { sum.assign_sub(1.0); });
  CHECK(sum.read_value() == 6.0);
}

TEST_CASE("ON_READ (sync-on-read): local updates, aggregated cross-replica reads") {
  Mirrored strategy(4);
  auto scope = strategy.scope();
  ds::Variable<float> total(0.0f, {.name = "total", .synchronization = ds::VariableSynchronization::OnRead,
                                   .aggregation = ds::VariableAggregation::Sum});
  ds::Variable<float> avg(0.0f, {.name = "avg", .synchronization = ds::VariableSynchronization::OnRead,
                                 .aggregation = ds::VariableAggregation::Mean});
  CHECK(!total.trainable());  // ON_READ defaults to non-trainable, as in TF
  auto local_reads = strategy.run([&](ds::ReplicaContext& ctx) {
    total.assign_add(static_cast<float>(ctx.replica_id_in_sync_group() + 1));
    avg.assign(static_cast<float>(ctx.replica_id_in_sync_group()));
    return total.read_value();
  });
  CHECK(local_reads.values() == std::vector<float>{1, 2, 3, 4});
  CHECK(total.read_value() == 10.0f);
  CHECK(avg.read_value() == 1.5f);
  // Cross-replica assign with SUM stores value/N per copy so the sum reads back.
  total.assign(8.0f);
  CHECK(total.values() == std::vector<float>{2, 2, 2, 2});
  CHECK(total.read_value() == 8.0f);
  CHECK_THROWS_WITH_AS(total.assign_add(1.0f), doctest::Contains("assign_add of a sync-on-read variable with SUM aggregation"),
                       ds::InvalidArgument);
  ds::Variable<float> no_agg(0.0f, {.name = "no_agg", .synchronization = ds::VariableSynchronization::OnRead});
  CHECK_THROWS_WITH_AS(no_agg.read_value(), doctest::Contains("needs an aggregation"), ds::InvalidArgument);
}

TEST_CASE("variable option errors") {
  Mirrored strategy(2);
  auto scope = strategy.scope();
  CHECK_THROWS_WITH_AS(ds::Variable<int>(1, {.name = "i", .aggregation = ds::VariableAggregation::Mean}),
                       "variable 'i': MEAN aggregation needs a floating-point variable, not int32", ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(ds::Variable<float>(1, {.name = "t", .trainable = true, .synchronization = ds::VariableSynchronization::OnRead}),
                       doctest::Contains("ON_READ is only for non-trainable variables"), ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(ds::Variable<float>(1, {.name = "n", .synchronization = ds::VariableSynchronization::None}),
                       doctest::Contains("synchronization NONE is not supported inside the scope of MirroredStrategy"),
                       ds::InvalidArgument);
  ds::Variable<std::vector<float>> w(std::vector<float>{1, 2}, {.name = "w"});
  CHECK_THROWS_WITH_AS(w.assign(std::vector<float>{1, 2, 3}),
                       "assign: a float32 value of shape (3,) does not match variable 'w' (float32 of shape (2,))", ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(strategy.run([] { ds::Variable<float> inside(1.0f, {.name = "inside"}); }),
                       doctest::Contains("variable 'inside' created inside a step function"), ds::InvalidArgument);
}

TEST_CASE("a variable used in a replica of another strategy is rejected") {
  Mirrored a(2);
  Mirrored b(2);
  auto make = [&] {
    auto scope = a.scope();
    return ds::Variable<float>(1.0f, {.name = "owned_by_a"});
  };
  auto v = make();
  CHECK_THROWS_WITH_AS(b.run([&] { return v.read_value(); }), doctest::Contains("variable 'owned_by_a' belongs to MirroredStrategy"),
                       ds::InvalidArgument);
  CHECK_THROWS_AS(b.extended().update(v, [](float& x) { x = 0; }), ds::InvalidArgument);
}

TEST_CASE("OneDeviceStrategy places one copy on its device") {
  ds::OneDeviceStrategy<> strategy("/cpu:0");
  auto scope = strategy.scope();
  ds::Variable<float> v(2.0f, {.name = "v"});
  CHECK(v.is_distributed());
  CHECK(v.values().size() == 1);
  CHECK(v.device() == "/job:localhost/replica:0/task:0/device:CPU:0");
  strategy.run([&] { v.assign_add(1.0f); });
  CHECK(v.read_value() == 3.0f);
}

TEST_CASE("extended().update applies fn to each copy with per-replica arguments") {
  Mirrored strategy(3);
  auto scope = strategy.scope();
  ds::Variable<std::vector<float>> w(std::vector<float>{0, 0}, {.name = "w"});
  auto deltas = strategy.distribute_values_from_function(
      [](const ds::ValueContext& c) { return static_cast<float>(c.replica_id_in_sync_group); });
  strategy.extended().update(w, [](std::vector<float>& copy, float delta, float scale) {
    for (auto& x : copy) x += delta * scale;
  }, deltas, 2.0f);
  CHECK(w.values()[0] == std::vector<float>{0, 0});
  CHECK(w.values()[1] == std::vector<float>{2, 2});
  CHECK(w.values()[2] == std::vector<float>{4, 4});
  // In replica context it updates the local copy.
  strategy.run([&](ds::ReplicaContext& ctx) {
    strategy.extended().update(w, [&](std::vector<float>& copy) { copy[0] = static_cast<float>(ctx.replica_id_in_sync_group()); });
  });
  CHECK(w.values()[2] == std::vector<float>{2, 4});
  auto colocated = strategy.extended().colocate_vars_with(w);
  ds::Variable<float> next(0.0f, {.name = "next"});
  CHECK(strategy.extended().variable_created_in_scope(next));
}

TEST_CASE("apply_to_copies visits the copies the calling context may change") {
  ds::Variable<float> plain(1.0f, {.name = "plain"});
  std::vector<int> seen;
  plain.apply_to_copies([&](float& copy, int index) {
    copy += 1.0f;
    seen.push_back(index);
  });
  CHECK(seen == std::vector<int>{0});
  CHECK(plain.read_value() == 2.0f);

  Mirrored strategy(3);
  auto scope = strategy.scope();
  ds::Variable<float> w(0.0f, {.name = "w"});
  seen.clear();
  const auto record = [&](float&, int index) { seen.push_back(index); };  // a const callable too
  w.apply_to_copies(record);
  CHECK(seen == std::vector<int>{0, 1, 2});
  auto visited = strategy.run([&](ds::ReplicaContext& ctx) {
    int index = -1, calls = 0;
    w.apply_to_copies([&](float& copy, int i) {
      copy = static_cast<float>(ctx.replica_id_in_sync_group());
      index = i;
      ++calls;
    });
    return calls == 1 ? index : -1;
  });
  CHECK(strategy.local_results(visited) == std::vector<int>{0, 1, 2});
  CHECK(w.values() == std::vector<float>{0, 1, 2});
}

TEST_CASE("central storage: one copy for the replicas; ON_READ variables stay per replica") {
  ds::CentralStorageStrategy<> strategy(2);
  auto scope = strategy.scope();
  ds::Variable<float> w(0.0f, {.name = "w"});
  CHECK(w.values().size() == 1);
  ds::Variable<float> metric(0.0f, {.name = "metric",
                                    .synchronization = ds::VariableSynchronization::OnRead,
                                    .aggregation = ds::VariableAggregation::Sum});
  CHECK(metric.values().size() == 2);
  CHECK(metric.devices() == strategy.extended().worker_devices());
  strategy.run([&](ds::ReplicaContext& ctx) { metric.assign_add(static_cast<float>(ctx.replica_id_in_sync_group() + 1)); });
  CHECK(metric.read_value() == 3.0f);
  CHECK_THROWS_WITH_AS(ds::Variable<float>(0.0f, {.name = "none", .synchronization = ds::VariableSynchronization::None}),
                       "variable 'none': synchronization NONE is not supported inside the scope of "
                       "CentralStorageStrategy; use AUTO, ON_WRITE or ON_READ",
                       ds::InvalidArgument);
}

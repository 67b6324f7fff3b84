// Parameter-server training with real processes on 127.0.0.1: this test is the chief (it runs the
// ClusterCoordinator); ps and worker tasks are ps_helper processes running ds::Server.
#define DISTRIBUTE_WITH_CHECKPOINT
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <mutex>
#include <numeric>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "ps_functions.hpp"
#include "support/http_get.hpp"
#include "support/processes.hpp"
#include "support/ps_cluster.hpp"

using namespace std::chrono_literals;
using test_support::Child;
using test_support::http_get;
using test_support::Cluster;
using test_support::LogLines;
using test_support::metric_sum;
using test_support::quiet_options;
using test_support::wait_until;


TEST_SUITE("ps_cluster") {

TEST_CASE("1 chief, 2 ps, 3 workers: 1000 closures each add 1 to a ps variable: exactly 1000") {
  Cluster cluster(2, 3);
  ds::ParameterServerStrategy strategy(cluster.resolver());
  ds::ClusterCoordinator coordinator(strategy, quiet_options());
  auto scope = strategy.scope();
  ds::Variable<float> first(0.0f, {.name = "first"});
  ds::Variable<float> counter(0.0f, {.name = "counter"});
  CHECK(first.device() == "/job:ps/replica:0/task:0/device:CPU:0");
  CHECK(counter.device() == "/job:ps/replica:0/task:1/device:CPU:0");
  for (int i = 0; i < 1000; ++i) coordinator.schedule(&ps_test::add_one, counter);
  coordinator.join();
  CHECK(coordinator.done());
  CHECK(counter.read_value() == 1000.0f);
  CHECK(first.read_value() == 0.0f);
  const auto per_worker = coordinator.closures_completed_per_worker();
  CHECK(std::accumulate(per_worker.begin(), per_worker.end(), std::uint64_t{0}) == 1000);
  for (auto n : per_worker) CHECK(n > 0);  // every worker took part
  // The ps task holding the counter served the commits and says so on /metrics.
  CHECK(metric_sum({cluster.ports[1]}, "distribute_commits_applied_total") == 1000);
  // Labelled task_type/task_index (Prometheus sets `job` itself on every scraped series).
  const std::string ps1 = http_get(cluster.ports[1], "/metrics");
  CHECK(ps1.find("\ndistribute_commits_applied_total{task_type=\"ps\",task_index=\"1\"} 1000\n") != std::string::npos);
  CHECK(ps1.find("# TYPE distribute_requests_total counter\n") != std::string::npos);
  CHECK(ps1.find("job=") == std::string::npos);
  const std::string worker0 = http_get(cluster.ports[2], "/metrics");
  CHECK(worker0.find("distribute_closures_total{task_type=\"worker\",task_index=\"0\"} ") != std::string::npos);
  CHECK(worker0.find("job=") == std::string::npos);
  CHECK(http_get(cluster.ports[0], "/healthz") == "200 ok\n");
  CHECK(http_get(cluster.ports[2], "/nothing-here").rfind("404", 0) == 0);
  coordinator.shutdown_cluster();
  CHECK_THROWS_WITH_AS(coordinator.schedule(&ps_test::add_one, counter), doctest::Contains("the cluster was shut down"),
                       ds::InvalidArgument);
  CHECK(test_support::wait_all(cluster.ps, 60s));
  CHECK(test_support::wait_all(cluster.workers, 60s));
  for (auto& c : cluster.ps) CHECK(c.status == 0);
  for (auto& c : cluster.workers) CHECK(c.status == 0);
  for (auto* group : {&cluster.ps, &cluster.workers}) {
    for (auto& c : *group) c.pid = -1;  // reaped
  }
}

TEST_CASE("a worker SIGKILLed half-way: still exactly 1000, join completes, the restarted worker is used again") {
  Cluster cluster(2, 3);
  LogLines log;
  ds::ParameterServerStrategy strategy(cluster.resolver());
  ds::ClusterCoordinator coordinator(strategy, quiet_options(&log));
  auto scope = strategy.scope();
  ds::Variable<float> counter(0.0f, {.name = "counter"});
  for (int i = 0; i < 1000; ++i) coordinator.schedule(&ps_test::slow_add_one, counter, 2);
  auto completed = [&] {
    auto v = coordinator.closures_completed_per_worker();
    return std::accumulate(v.begin(), v.end(), std::uint64_t{0});
  };
  REQUIRE(wait_until([&] { return completed() >= 400; }, 60s));
  Cluster::kill_task(cluster.workers[1]);
  REQUIRE(wait_until([&] { return coordinator.num_workers_up() == 2; }, 10s));
  const auto before_restart = coordinator.closures_completed_per_worker()[1];
  cluster.workers[1] = cluster.start("worker", 1);
  coordinator.join();
  CHECK(counter.read_value() == 1000.0f);
  REQUIRE(wait_until([&] { return coordinator.num_workers_up() == 3; }, 20s));
  for (int i = 0; i < 300; ++i) coordinator.schedule(&ps_test::slow_add_one, counter, 2);
  coordinator.join();
  CHECK(counter.read_value() == 1300.0f);
  CHECK(coordinator.closures_completed_per_worker()[1] > before_restart);
  CHECK(log.has(fmt::format("lost worker 1 (127.0.0.1:{})", cluster.ports[3])));
  CHECK(log.has(fmt::format("worker 1 (127.0.0.1:{}) is back; it receives closures again", cluster.ports[3])));
}

TEST_CASE("a worker cut off (SIGSTOP) mid-closure: its closure is retried elsewhere and applied exactly once") {
  Cluster cluster(2, 3);
  ds::ParameterServerStrategy strategy(cluster.resolver());
  ds::ClusterCoordinator coordinator(strategy, quiet_options());
  auto scope = strategy.scope();
  ds::Variable<float> counter(0.0f, {.name = "counter"});
  for (int i = 0; i < 30; ++i) coordinator.schedule(&ps_test::slow_add_one, counter, 100);
  std::this_thread::sleep_for(250ms);
  ::kill(cluster.workers[0].pid, SIGSTOP);
  REQUIRE(wait_until([&] { return coordinator.num_workers_up() == 2; }, 30s));  // one heartbeat timeout, and then some
  std::this_thread::sleep_for(300ms);
  ::kill(cluster.workers[0].pid, SIGCONT);  // it finishes the closure it had and commits it late
  coordinator.join();
  CHECK(coordinator.closures_retried() >= 1);
  REQUIRE(wait_until([&] { return coordinator.num_workers_up() == 3; }, 20s));
  CHECK(counter.read_value() == 30.0f);
  // The late commit (or the retry's, whichever came second) was recognised and not applied.
  CHECK(wait_until([&] { return metric_sum({cluster.ports[0], cluster.ports[1]}, "distribute_commits_duplicate_total") >= 1; }, 5s));
  CHECK(metric_sum({cluster.ports[0], cluster.ports[1]}, "distribute_commits_applied_total") == 30);
}

TEST_CASE("a ps task SIGKILLed: schedule and join throw PeerFailure naming it, promptly") {
  Cluster cluster(2, 2);
  ds::ParameterServerStrategy strategy(cluster.resolver());
  ds::ClusterCoordinator coordinator(strategy, quiet_options());
  auto scope = strategy.scope();
  ds::Variable<float> a(0.0f, {.name = "a"});
  ds::Variable<float> b(0.0f, {.name = "b"});
  for (int i = 0; i < 200; ++i) coordinator.schedule(&ps_test::slow_add_one, b, 5);
  std::this_thread::sleep_for(100ms);
  Cluster::kill_task(cluster.ps[1]);
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(coordinator.join(), ds::PeerFailure);
  // Promptly: the closed connection, not a heartbeat timeout nor the workers' 60 s reconnect (20 s: ASan, 2 cores).
  CHECK(std::chrono::steady_clock::now() - start < 20s);
  try {
    coordinator.schedule(&ps_test::add_one, a);
    FAIL("schedule after a lost ps task must throw");
  } catch (const ds::PeerFailure& e) {
    CHECK(std::string(e.what()).find("/job:ps/replica:0/task:1") != std::string::npos);
  }
  CHECK_THROWS_AS(coordinator.done(), ds::PeerFailure);
}

TEST_CASE("a closure that throws: join rethrows it once, queued closures are cancelled, then work goes on") {
  Cluster cluster(1, 2);
  ds::ParameterServerStrategy strategy(cluster.resolver());
  ds::ClusterCoordinator coordinator(strategy, quiet_options());
  std::vector<ds::RemoteValue<int>> values;
  for (int x = 0; x < 14; ++x) values.push_back(coordinator.schedule(&ps_test::twice_unless_13, x));
  CHECK_THROWS_WITH_AS(coordinator.join(), "closure 13 fails on purpose", ds::Error);
  coordinator.join();  // the error was cleared
  CHECK_THROWS_WITH_AS(values[13].get(), "closure 13 fails on purpose", ds::Error);
  for (int x = 0; x < 13; ++x) CHECK(values[static_cast<std::size_t>(x)].get() == 2 * x);
  // After the error: usable again; a batch whose error comes early cancels what waits behind it.
  CHECK(coordinator.schedule(&ps_test::twice_unless_13, 21).get() == 42);
  CHECK(coordinator.schedule<int>("twice_unless_13", 5).fetch() == 10);
}

TEST_CASE("arguments and results: tensors, vectors, a closure's own writes, sharded lookups, per-worker datasets") {
  Cluster cluster(2, 3);
  ds::ParameterServerStrategy strategy(cluster.resolver(), ds::FixedShardsPartitioner(3));
  ds::ClusterCoordinator coordinator(strategy, quiet_options());
  auto scope = strategy.scope();
  ds::Variable<std::vector<float>> v(std::vector<float>{1, 2, 3}, {.name = "v"});
  ds::Variable<float> s(10.0f, {.name = "s"});
  const auto seen = coordinator.schedule(&ps_test::add_and_read, v, s, 0.5f).get();
  CHECK(seen == std::vector<float>{1.5f, 2.5f, 3.5f, 9.5f});  // read back inside the closure
  CHECK(v.read_value() == std::vector<float>{1.5f, 2.5f, 3.5f});
  CHECK(s.read_value() == 9.5f);

  const ds::Tensor<double> t({2, 2}, {1, 2, 3, 4});
  const auto scaled = coordinator.schedule(&ps_test::scale, t, 3).get();  // int 3 converts to double
  CHECK(scaled.shape() == ds::Shape{2, 2});
  CHECK(std::vector<double>(scaled.begin(), scaled.end()) == std::vector<double>{3, 6, 9, 12});

  std::vector<float> dense(7 * 4);
  std::iota(dense.begin(), dense.end(), 0.0f);
  ds::ShardedVariable<ds::Tensor<float>> table(ds::Tensor<float>({7, 4}, dense), {.name = "table"});
  REQUIRE(table.num_shards() == 3);
  CHECK(table.variables()[1].device() == "/job:ps/replica:0/task:1/device:CPU:0");
  const std::vector<std::int64_t> ids{6, 0, 3, 3, 5};
  const auto rows = coordinator.schedule(&ps_test::lookup, table, ids).get();
  const auto here = table.embedding_lookup(ids);
  REQUIRE(rows.shape() == ds::Shape{5, 4});
  for (std::size_t p = 0; p < ids.size(); ++p) {
    for (std::size_t c = 0; c < 4; ++c) {
      CHECK(rows.data()[p * 4 + c] == dense[static_cast<std::size_t>(ids[p]) * 4 + c]);
      CHECK(here.data()[p * 4 + c] == dense[static_cast<std::size_t>(ids[p]) * 4 + c]);
    }
  }

  auto per_worker = coordinator.create_per_worker_dataset(&ps_test::numbers);
  std::vector<ds::RemoteValue<std::int64_t>> got;
  for (int i = 0; i < 60; ++i) got.push_back(coordinator.schedule(&ps_test::take_next, ds::iter(per_worker)));
  coordinator.join();
  std::map<std::int64_t, int> count;
  for (auto& g : got) ++count[g.get()];
  // Each worker reads its own iterator from 0: value k appears once per worker that got > k closures.
  CHECK(count[0] >= 1);
  CHECK(count[0] <= 3);
  for (const auto& [value, n] : count) {
    CHECK(value >= 0);
    CHECK(value < 100);
    if (value > 0) CHECK(n <= count[value - 1]);
  }
}

TEST_CASE("float16, bfloat16, run-time-dtype and column-major values through the ps: variables, arguments, results") {
  using test_types::DynTensor;
  Cluster cluster(1, 1);
  ds::ParameterServerStrategy strategy(cluster.resolver(), ds::FixedShardsPartitioner(1));
  ds::ClusterCoordinator coordinator(strategy, quiet_options());
  auto scope = strategy.scope();
  ds::Variable<std::vector<ds::bfloat16>> v({ds::bfloat16(1.0f), ds::bfloat16(-2.0f), ds::bfloat16(0.5f)}, {.name = "v16"});
  const ds::Tensor<ds::float16> delta({3}, {ds::float16(0.25f), ds::float16(1.0f), ds::float16(0x1p-8f)});
  const auto seen = coordinator.schedule(&ps_test::add_half, v, delta).get();
  REQUIRE(seen.size() == 3);
  CHECK(ds::to_bits(seen[0]) == 0x3FA0);  // 1.25
  CHECK(ds::to_bits(seen[1]) == 0xBF80);  // -1
  CHECK(ds::to_bits(seen[2]) == 0x3F01);  // 0.5 + 2^-8
  CHECK(ds::to_bits(v.read_value()[2]) == 0x3F01);

  // A transposed (strided) bfloat16 argument arrives in row-major order; the result comes back.
  const DynTensor storage = DynTensor::of<ds::bfloat16>(
      {2, 3}, {ds::bfloat16(1.0f), ds::bfloat16(2.0f), ds::bfloat16(3.0f), ds::bfloat16(4.0f), ds::bfloat16(5.0f),
               ds::bfloat16(6.0f)});
  const auto scaled = coordinator.schedule(&ps_test::scale_any, storage.transposed(), 2.0).get();
  CHECK(scaled.dtype == ds::DType::BF16);
  CHECK(scaled.shape == ds::Shape{3, 2});
  CHECK(float(scaled.get<ds::bfloat16>(0)) == 2.0f);
  CHECK(float(scaled.get<ds::bfloat16>(1)) == 8.0f);
  CHECK(float(scaled.get<ds::bfloat16>(5)) == 12.0f);

  ds::Variable<DynTensor> d(DynTensor::of<ds::float16>({2}, {ds::float16(1.0f), ds::float16(2.0f)}), {.name = "d16"});
  const auto after =
      coordinator.schedule(&ps_test::add_to_any, d, DynTensor::of<ds::float16>({2}, {ds::float16(0.5f), ds::float16(0.5f)}))
          .get();
  CHECK(after.dtype == ds::DType::F16);
  CHECK(float(after.get<ds::float16>(1)) == 2.5f);
  CHECK(float(d.read_value().get<ds::float16>(0)) == 1.5f);

  // A column-major type cereal cannot save travels as row-major bytes and comes back column-major.
  const auto t = coordinator.schedule(&ps_test::transpose_scaled, test_types::ColMajor::from_rows({{1, 2, 3}, {4, 5, 6}}), 10.0f)
                     .get();
  CHECK(t.rows == 3);
  CHECK(t.cols == 2);
  CHECK(t.data == std::vector<float>{10, 20, 30, 40, 50, 60});  // [[10, 40], [20, 50], [30, 60]], column by column
}

TEST_CASE("a coordinator's checkpoint reads the ps tasks' values; restoring writes them there, into any shard count") {
  Cluster cluster(2, 2);
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("distribute-ps-ckpt-{}", ::getpid());
  std::filesystem::remove_all(dir);
  struct RemoveDir {
    std::filesystem::path p;
    ~RemoveDir() {
      std::error_code ec;
      std::filesystem::remove_all(p, ec);
    }
  } cleanup{dir};
  std::vector<float> dense(5 * 3);
  std::iota(dense.begin(), dense.end(), 1.0f);
  std::filesystem::path saved;
  {
    ds::ParameterServerStrategy strategy(cluster.resolver(), ds::FixedShardsPartitioner(2));
    ds::ClusterCoordinator coordinator(strategy, quiet_options());
    auto scope = strategy.scope();
    ds::Variable<float> counter(0.0f, {.name = "counter"});
    ds::Variable<std::vector<float>> v(std::vector<float>{1, 2, 3}, {.name = "v"});
    ds::ShardedVariable<ds::Tensor<float>> table(ds::Tensor<float>({5, 3}, dense), {.name = "table"});
    REQUIRE(table.num_shards() == 2);
    // Only the workers change these: the values exist on the ps tasks, not in this process.
    for (int i = 0; i < 100; ++i) coordinator.schedule(&ps_test::add_one, counter);
    coordinator.schedule(&ps_test::add_and_read, v, counter, 0.25f);
    coordinator.join();

    ds::Checkpoint checkpoint;
    checkpoint.track("counter", counter).track("v", v).track("table", table);
    ds::CheckpointManager manager(checkpoint, dir, 2);
    saved = manager.save();
    const auto file = ds::safetensors::read(saved);
    CHECK(file.at("counter").values<float>() == std::vector<float>{99.75f});
    CHECK(file.at("v").values<float>() == std::vector<float>{1.25f, 2.25f, 3.25f});
    CHECK(file.at("table").shape == ds::Shape{5, 3});  // the shards saved as one tensor
    CHECK(file.at("table").values<float>() == dense);
  }
  // A second coordinator (new variables on the ps tasks, 3 shards this time) restores the file:
  // the values go to the ps tasks, where the workers read them.
  ds::ParameterServerStrategy strategy(cluster.resolver(), ds::FixedShardsPartitioner(3));
  ds::ClusterCoordinator coordinator(strategy, quiet_options());
  auto scope = strategy.scope();
  ds::Variable<float> counter(0.0f, {.name = "counter"});
  ds::Variable<std::vector<float>> v(std::vector<float>{0, 0, 0}, {.name = "v"});
  ds::ShardedVariable<ds::Tensor<float>> table(ds::Tensor<float>::zeros({5, 3}), {.name = "table"});
  REQUIRE(table.num_shards() == 3);
  ds::Checkpoint checkpoint;
  checkpoint.track("counter", counter).track("v", v).track("table", table);
  ds::CheckpointManager manager(checkpoint, dir, 2);
  CHECK(manager.restore_or_initialize() == saved);
  CHECK(counter.read_value() == 99.75f);
  const std::vector<std::int64_t> ids{4, 0, 2};
  const auto rows = coordinator.schedule(&ps_test::lookup, table, ids).get();
  REQUIRE(rows.shape() == ds::Shape{3, 3});
  for (std::size_t p = 0; p < ids.size(); ++p) {
    for (std::size_t c = 0; c < 3; ++c) CHECK(rows.data()[p * 3 + c] == dense[static_cast<std::size_t>(ids[p]) * 3 + c]);
  }
  const auto seen = coordinator.schedule(&ps_test::add_and_read, v, counter, 1.0f).get();
  CHECK(seen == std::vector<float>{2.25f, 3.25f, 4.25f, 98.75f});
}

TEST_CASE("bad input: unregistered functions, argument types that do not match, a cluster without ps") {
  Cluster cluster(1, 1);
  ds::ParameterServerStrategy strategy(cluster.resolver());
  ds::ClusterCoordinator coordinator(strategy, quiet_options());
  CHECK_THROWS_WITH_AS(coordinator.schedule("no_such_function"),
                       "ClusterCoordinator::schedule: no function is registered as 'no_such_function' (register it "
                       "with DISTRIBUTE_REMOTE_FUNCTION in every process)",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(coordinator.schedule<int>("twice_unless_13", 2.5),
                       "ClusterCoordinator::schedule: function 'twice_unless_13' takes (int) but was given (double)",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(coordinator.schedule<float>("twice_unless_13", 2),
                       "ClusterCoordinator::schedule: function 'twice_unless_13' returns int, not float",
                       ds::InvalidArgument);
  int (*unregistered)(int) = +[](int x) { return x; };
  CHECK_THROWS_AS(coordinator.schedule(unregistered, 1), ds::InvalidArgument);
  ds::Variable<float> local(1.0f, {.name = "local"});  // outside the scope: not on a ps task
  CHECK_THROWS_WITH_AS(coordinator.schedule(&ps_test::add_one, local),
                       "variable 'local' is not on a ps task: only variables created inside "
                       "ParameterServerStrategy::scope() can be passed to a scheduled function",
                       ds::InvalidArgument);
  using Jobs = ds::ClusterSpec::DenseJobs;
  CHECK_THROWS_AS(ds::ParameterServerStrategy(std::make_shared<ds::SimpleClusterResolver>(
                      ds::ClusterSpec(Jobs{{"chief", {"127.0.0.1:1"}}, {"worker", {"127.0.0.1:2"}}}), "chief", 0)),
                  ds::ClusterConfigError);
  // A ps task that does not come up: PeerFailure naming it, after the connect timeout.
  const auto port = test_support::free_ports(1)[0];
  CHECK_THROWS_AS(ds::ParameterServerStrategy(
                      std::make_shared<ds::SimpleClusterResolver>(
                          ds::ClusterSpec(Jobs{{"chief", {"127.0.0.1:1"}},
                                               {"ps", {fmt::format("127.0.0.1:{}", port)}},
                                               {"worker", {"127.0.0.1:2"}}}),
                          "chief", 0),
                      {}, ds::ParameterServerOptions{.connect_timeout = 300ms}),
                  ds::PeerFailure);
}

TEST_CASE("the cluster token: a coordinator without it is refused, with it served; garbage does not hurt a server") {
  Cluster cluster(1, 1, {{"DISTRIBUTE_CLUSTER_TOKEN", "s3cret"}});
  CHECK_THROWS_WITH_AS(ds::ParameterServerStrategy(cluster.resolver(), {},
                                                   // long enough for the ps task to be listening under ASan: the
                                                   // refusal, not the deadline, ends the attempt
                                                   ds::ParameterServerOptions{.connect_timeout = 30000ms,
                                                                              .cluster_token = ""}),
                       doctest::Contains("refused the connection"), ds::PeerFailure);
  // A stranger sending random bytes and a truncated frame: the server drops it and keeps serving.
  for (std::string junk : {std::string("hello, is this HTTP?\r\n\r\n"), std::string("DSNT\x01\x0c", 6),
                           std::string(100, '\xff')}) {
    boost::asio::io_context io;
    boost::asio::ip::tcp::socket s(io);
    s.connect({boost::asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(cluster.ports[0])});
    boost::system::error_code ec;  // the server may close first: errors here are the point, not failures
    boost::asio::write(s, boost::asio::buffer(junk), ec);
    s.shutdown(boost::asio::ip::tcp::socket::shutdown_send, ec);
    char buf[256];
    s.read_some(boost::asio::buffer(buf), ec);  // closed (or a reject) without a hang
  }
  // The ps port's /metrics wants the token as a bearer credential (a Prometheus scrape setting);
  // /healthz does not.
  const std::string refused = "401 this task has a cluster token: send it as 'Authorization: Bearer TOKEN' "
                              "(Prometheus: authorization: {type: Bearer, credentials_file: FILE})\n";
  CHECK(http_get(cluster.ports[0], "/metrics") == refused);
  CHECK(http_get(cluster.ports[0], "/metrics", "Bearer wrong") == refused);
  CHECK(http_get(cluster.ports[0], "/metrics", "Basic czNjcmV0") == refused);
  CHECK(http_get(cluster.ports[0], "/metrics", "Bearer s3cret").find("# TYPE distribute_requests_total counter\n") !=
        std::string::npos);
  CHECK(http_get(cluster.ports[0], "/healthz") == "200 ok\n");
  ds::ParameterServerStrategy strategy(cluster.resolver(), {}, ds::ParameterServerOptions{.cluster_token = "s3cret"});
  ds::ClusterCoordinator coordinator(strategy, quiet_options());
  auto scope = strategy.scope();
  ds::Variable<float> counter(0.0f, {.name = "counter"});
  for (int i = 0; i < 10; ++i) coordinator.schedule(&ps_test::add_one, counter);
  coordinator.join();
  CHECK(counter.read_value() == 10.0f);
}

TEST_CASE("a ps task's variable table rejects malformed requests, naming the variable, and commits all or nothing") {
  namespace dd = ds::ps::detail;
  dd::VariableTable table("/job:ps/replica:0/task:0/device:CPU:0");
  const auto f32 = static_cast<std::uint8_t>(ds::DType::F32);
  const auto i32 = static_cast<std::uint8_t>(ds::DType::I32);
  auto floats = [](std::vector<float> v) { return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4); };
  CHECK_THROWS_WITH_AS(table.create({"w", f32, {2, 3}, std::string(20, '\0')}),
                       "variable 'w': 20 bytes for shape (2, 3) of float32 (expected 24)", ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(table.create({"w", f32, {2, -3}, ""}), "variable 'w': negative dimension in shape (2, -3)",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(table.create({"w", 200, {1}, "x"}), "variable 'w': unknown dtype code 200", ds::InvalidArgument);
  table.create({"w", f32, {2, 2}, floats({1, 2, 3, 4})});
  CHECK_THROWS_WITH_AS(table.read({"nope", f32, 16}), "no variable 'nope' on /job:ps/replica:0/task:0/device:CPU:0", ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(table.read({"w", i32, 16}), "variable 'w' on /job:ps/replica:0/task:0/device:CPU:0 is float32, not int32",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(table.read({"w", f32, 12}),
                       "variable 'w' on /job:ps/replica:0/task:0/device:CPU:0 holds 16 bytes (shape (2, 2)), 12 were asked for",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(table.read_rows({"w", f32, {0}, 4}),
                       "variable 'w' on /job:ps/replica:0/task:0/device:CPU:0: rows of 4 bytes asked for, its rows have 8", ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(table.read_rows({"w", f32, {1, 2}, 8}),
                       "variable 'w' on /job:ps/replica:0/task:0/device:CPU:0: row 2 is out of range [0, 2)", ds::InvalidArgument);
  CHECK(table.read_rows({"w", f32, {1, 0}, 8}) == floats({3, 4, 1, 2}));
  CHECK_THROWS_WITH_AS(table.update({"w", 1, f32, floats({1})}),
                       "update of variable 'w' on /job:ps/replica:0/task:0/device:CPU:0: 4 bytes for a variable of 16 (shape (2, 2))",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(table.update({"w", 200, f32, floats({1, 1, 1, 1})}), "update of variable 'w': unknown kind 200",
                       ds::InvalidArgument);
  // A commit with one bad update applies none of them; the same closure's second commit is ignored.
  table.create({"v", f32, {1}, floats({0})});
  dd::CommitMsg bad{1, 1, {{"v", 1, f32, floats({5})}, {"nope", 1, f32, floats({5})}}};
  CHECK_THROWS_WITH_AS(table.commit(bad), "no variable 'nope' on /job:ps/replica:0/task:0/device:CPU:0", ds::InvalidArgument);
  CHECK(table.read({"v", f32, 4}) == floats({0}));
  dd::CommitMsg good{1, 2, {{"v", 1, f32, floats({5})}, {"w", 2, f32, floats({1, 1, 1, 1})}}};
  CHECK(table.commit(good));
  CHECK_FALSE(table.commit(good));
  CHECK(table.read({"v", f32, 4}) == floats({5}));
  CHECK(table.read({"w", f32, 16}) == floats({0, 1, 2, 3}));
}

TEST_CASE("ds::Server rejects a job, protocol or task it cannot serve; logs refused and malformed connections") {
  const auto ports = test_support::free_ports(2);
  const ds::ClusterSpec spec(ds::ClusterSpec::DenseJobs{
      {"chief", {"127.0.0.1:1"}}, {"ps", {fmt::format("127.0.0.1:{}", ports[0])}}, {"worker", {"127.0.0.1:2"}}});
  CHECK_THROWS_WITH_AS(ds::Server(spec, "chief", 0),
                       "ds::Server: job 'chief' has nothing to serve; a Server runs on 'ps' and 'worker' tasks (the "
                       "chief runs the ClusterCoordinator)",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(ds::Server(spec, "ps", 0, "http"),
                       "ds::Server: protocol 'http' is not supported; use \"grpc\" or \"tcp\"", ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(ds::Server(spec, "ps", 3), "ds::Server: the cluster spec has no task ps:3", ds::InvalidArgument);

  std::mutex mutex;
  std::vector<std::string> lines;
  ds::ServerOptions options;
  options.cluster_token = "s3cret";
  options.log = [&](std::string_view line) {
    std::lock_guard lock(mutex);
    lines.emplace_back(line);
  };
  ds::Server server(spec, "ps", 0, "tcp", options);
  CHECK(server.target() == fmt::format("tcp://127.0.0.1:{}", ports[0]));
  auto logged = [&](const std::string& what) {
    return wait_until([&] {
      std::lock_guard lock(mutex);
      return std::any_of(lines.begin(), lines.end(), [&](const auto& l) { return l.find(what) != std::string::npos; });
    }, 5s);
  };
  ds::net::RpcOptions no_token;
  no_token.cluster_token = "";
  no_token.connect_timeout = 2000ms;
  ds::net::RpcClient stranger(fmt::format("127.0.0.1:{}", ports[0]), "ps 0", no_token);
  CHECK_THROWS_WITH_AS(stranger.call(ds::ps::detail::RpcOp::Ping, {}),
                       doctest::Contains("refused the connection (its log says why; the usual cause is a cluster "
                                         "token that differs or is missing: DISTRIBUTE_CLUSTER_TOKEN)"),
                       ds::net::ConnectionLost);
  CHECK(logged("refused connection from 127.0.0.1:"));
  CHECK(logged("the peer did not present the cluster token"));  // the reason: in the log, not to the peer
  boost::asio::io_context io;
  boost::asio::ip::tcp::socket s(io);
  s.connect({boost::asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(ports[0])});
  const auto newer = static_cast<char>(ds::net::kProtocolVersion + 1);  // a peer speaking a later protocol
  boost::asio::write(s, boost::asio::buffer(std::string("DSNT", 4) + newer + std::string(27, '\0')));
  CHECK(logged(fmt::format("malformed frame: unsupported protocol version {}", ds::net::kProtocolVersion + 1)));
}

TEST_CASE("a worker answers bad closures with errors naming what is wrong, and keeps serving") {
  Cluster cluster(1, 1);
  ds::ParameterServerStrategy strategy(cluster.resolver());
  ds::ClusterCoordinator coordinator(strategy, quiet_options());
  namespace dd = ds::ps::detail;
  dd::RpcOptions rpc;
  dd::RpcClient worker(cluster.spec.task_address("worker", 0), "worker 0", rpc);
  dd::RpcClient ps(cluster.spec.task_address("ps", 0), "ps 0", rpc);
  const std::string wdev = "/job:worker/replica:0/task:0/device:CPU:0";
  const auto* add_one = dd::RemoteFunctionRegistry::instance().find("add_one");
  REQUIRE(add_one != nullptr);
  auto run = [&](dd::RunClosureMsg m) { return worker.call(dd::RpcOp::RunClosure, dd::encode_message(m)); };
  auto fails_with = [](auto&& call, const std::string& kind, const std::string& text) {
    try {
      call();
      FAIL("expected an error reply");
    } catch (const dd::RemoteError& e) {
      CHECK(e.kind_name() == kind);
      CHECK(std::string(e.what()).find(text) != std::string::npos);
    }
  };
  fails_with([&] { run({1, 1, 0, "nope", add_one->signature, ""}); }, "InvalidArgument",
             wdev + ": no function is registered as 'nope' in this process");
  fails_with([&] { run({1, 2, 0, "add_one", "another signature", ""}); }, "InvalidArgument",
             "with another signature than the coordinator's: every process must run the same binary");
  fails_with([&] { run({1, 3, 0, "add_one", add_one->signature, "\x01"}); }, "InvalidArgument", "malformed arguments");
  fails_with([&] { worker.call(dd::RpcOp::RunClosure, dd::to_bytes("garbage")); }, "InvalidArgument",
             "malformed run-closure message");
  const auto* take_next = dd::RemoteFunctionRegistry::instance().find("take_next");
  REQUIRE(take_next != nullptr);
  fails_with([&] { run({1, 4, 0, "take_next", take_next->signature,
                        dd::save_values(ds::PerWorkerIterator<std::int64_t>(999, nullptr))}); },
             "InvalidArgument", wdev + ": per-worker dataset #999 was not created on this worker");
  fails_with([&] { worker.call(dd::RpcOp::MakeDataset, dd::encode_message(dd::MakeDatasetMsg{1, "add_one", add_one->signature, 1, 0})); },
             "InvalidArgument", "function 'add_one' does not return a ds::Dataset");
  fails_with([&] { worker.call(dd::RpcOp::ReadVar, dd::encode_message(dd::ReadVarMsg{"w", 0, 4})); }, "InvalidArgument",
             wdev + " is a worker task: variables live on ps tasks");
  fails_with([&] { ps.call(dd::RpcOp::RunClosure, {}); }, "InvalidArgument",
             "/job:ps/replica:0/task:0/device:CPU:0 is a ps task: it does not run closures or build datasets");
  CHECK(coordinator.schedule(&ps_test::twice_unless_13, 4).get() == 8);  // still serving
  ds::data::Dataset<int> (*unregistered)() = +[] { return ds::data::Dataset<int>(); };
  CHECK_THROWS_WITH_AS(coordinator.create_per_worker_dataset(unregistered),
                       "create_per_worker_dataset: the dataset function is not registered; register it with "
                       "DISTRIBUTE_REMOTE_FUNCTION(name) in every process",
                       ds::InvalidArgument);
}

TEST_CASE("remote-function misuse in one process: names, handles outside a worker, a coordinator without ps") {
  void (*other)(ds::Variable<float>) = +[](ds::Variable<float>) {};
  CHECK_THROWS_WITH_AS(ds::register_remote_function("add_one", other),
                       doctest::Contains("register_remote_function: the name 'add_one' is already registered for "
                                         "another function (void add_one("),
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(ds::register_remote_function("", other), "register_remote_function: the name is empty",
                       ds::InvalidArgument);
  auto v = ds::Variable<float>::attach_remote("v", ds::DType::F32, {}, {nullptr, 0, "k"});
  const std::string bytes = ds::ps::detail::save_values(v);
  CHECK_THROWS_WITH_AS(ds::ps::detail::load_values<ds::Variable<float>>(bytes, "arguments"),
                       "variable 'v' arrived outside a worker: ps variable handles are read by the worker that runs a "
                       "scheduled function",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(ds::ps::detail::load_values<int>(std::string_view("\x01", 1), "arguments"),
                       doctest::Contains("malformed arguments: "), ds::InvalidArgument);
  ds::PerWorkerIterator<int> it(3, nullptr);
  CHECK_THROWS_WITH_AS(it.next(),
                       "PerWorkerIterator::next: the iterator is read inside a scheduled function on a worker",
                       ds::InvalidArgument);
  using Jobs = ds::ClusterSpec::DenseJobs;
  const ds::ClusterSpec spec(Jobs{{"chief", {"127.0.0.1:1"}}, {"ps", {"127.0.0.1:2"}}, {"worker", {"127.0.0.1:3"}}});
  ds::ParameterServerStrategy placement_only(std::make_shared<ds::SimpleClusterResolver>(spec, "chief", 0),
                                             ds::VariablePartitioner{},
                                             ds::ParameterServerOptions{.connect = false});
  CHECK_THROWS_WITH_AS(ds::ClusterCoordinator{placement_only},
                       "ClusterCoordinator: the strategy was built with ParameterServerOptions{.connect = false}; a "
                       "coordinator needs the ps tasks",
                       ds::InvalidArgument);
}

TEST_CASE("wire-level errors on both sides: handshakes out of order, a busy port, replies out of turn or malformed") {
  namespace dd = ds::ps::detail;
  namespace net = ds::net;
  using boost::asio::ip::tcp;
  const auto ports = test_support::free_ports(2);
  const ds::ClusterSpec spec(ds::ClusterSpec::DenseJobs{
      {"chief", {"127.0.0.1:1"}}, {"ps", {fmt::format("127.0.0.1:{}", ports[0])}}, {"worker", {"127.0.0.1:2"}}});
  LogLines log;
  ds::ServerOptions options;
  options.cluster_token = "";
  options.log = [&](std::string_view line) {
    std::lock_guard lock(log.mutex);
    log.lines.emplace_back(line);
  };
  ds::Server server(spec, "ps", 0, "grpc", options);
  const std::string busy = fmt::format("cannot listen on 127.0.0.1:{}", ports[0]);
  CHECK_THROWS_WITH_AS(ds::Server(spec, "ps", 0), doctest::Contains(busy.c_str()), ds::Unavailable);
  // A peer whose first frame is not a hello is refused, and the refusal logged.
  {
    boost::asio::io_context io;
    tcp::socket s(io);
    s.connect({boost::asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(ports[0])});
    boost::asio::write(s, boost::asio::buffer(net::encode_frame({net::FrameType::Request, 0, 1, 1}, {})));
    CHECK(wait_until([&] { return log.has("expected a hello frame, got a request frame"); }, 5s));
  }
  // A client holding a token meets a server without one: the server refuses it (and says why in its log).
  dd::RpcOptions with_token;
  with_token.cluster_token = "s3cret";
  with_token.connect_timeout = 2000ms;
  dd::RpcClient suspicious(spec.task_address("ps", 0), "ps 0", with_token);
  CHECK_THROWS_WITH_AS(suspicious.connect(2000ms), doctest::Contains("ps 0 (127.0.0.1:"), dd::ConnectionLost);
  CHECK(wait_until([&] { return log.has("the peer presented a cluster token, and this server has none"); }, 5s));

  // A fake server that completes the handshake (its challenge carrying `proof`, and claiming a
  // token when `token`), then answers with `reply`.
  auto fake_server = [&](std::vector<std::byte> reply, bool token = false, std::optional<std::string> client_token = "") {
    boost::asio::io_context io;
    tcp::acceptor acceptor(io, {boost::asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(ports[1])});
    std::thread peer([&] {
      tcp::socket s(io);
      acceptor.accept(s);
      auto read_frame = [&] {
        net::HeaderBytes head{};
        boost::asio::read(s, boost::asio::buffer(head));
        std::vector<std::byte> payload(net::decode_header(head, 1 << 20).length);
        boost::asio::read(s, boost::asio::buffer(payload));
      };
      read_frame();  // hello
      // A challenge with a proof made without the token (all zero bytes).
      const net::detail::Challenge challenge{0, 0, 0, token, net::detail::random_nonce(), net::detail::Mac{}, true};
      boost::asio::write(s, boost::asio::buffer(net::encode_frame({net::FrameType::Challenge, 0, 0, 0},
                                                                  net::detail::encode(challenge))));
      if (token) return;  // the client refuses this proof
      read_frame();  // response
      boost::asio::write(s, boost::asio::buffer(net::encode_frame({net::FrameType::Welcome, 0, 0, 0}, {})));
      read_frame();  // the request
      boost::asio::write(s, boost::asio::buffer(reply));
      boost::system::error_code ec;
      char buf[64];
      s.read_some(boost::asio::buffer(buf), ec);  // until the client hangs up
    });
    dd::RpcOptions no_token;
    no_token.cluster_token = client_token;
    no_token.connect_timeout = 5000ms;
    dd::RpcClient client(fmt::format("127.0.0.1:{}", ports[1]), "fake", no_token);
    std::string error;
    try {
      client.call(dd::RpcOp::Ping, {}, 5000ms);
    } catch (const dd::ConnectionLost& e) {
      error = e.what();
    }
    client.disconnect();
    peer.join();
    return error;
  };
  CHECK(fake_server(net::encode_frame({net::FrameType::Reply, 0, 7, 0}, {})) ==
        fmt::format("fake (127.0.0.1:{}) answered out of turn (reply frame #7, expected reply #1)", ports[1]));
  auto bad_magic = net::encode_frame({net::FrameType::Reply, 0, 1, 0}, {});
  bad_magic[0] = std::byte{'X'};
  CHECK_MESSAGE(fake_server(bad_magic).find(fmt::format("fake (127.0.0.1:{}) sent a malformed reply: bad frame magic",
                                                        ports[1])) == 0,
                "a reply with a bad magic is malformed");
  // A client holding a token refuses a server that cannot prove it.
  CHECK(fake_server({}, true, "s3cret") ==
        fmt::format("fake at 127.0.0.1:{} failed to prove it holds the cluster token (the tokens differ)", ports[1]));
}

}  // TEST_SUITE

TEST_CASE("tensor arguments decoded from the wire: unknown dtype, overflowing shape, wrong byte count are typed errors") {
  using test_types::DynTensor;
  using Wire = ds::ps::detail::wire<DynTensor>;
  auto decode = [](auto write) {
    std::stringstream bytes;
    {
      ds::ps::detail::WireOut out(bytes);
      write(out);
    }
    ds::ps::detail::WireIn in(bytes);
    return Wire::load(in);
  };
  CHECK_THROWS_WITH_AS(decode([](auto& out) { out(std::uint8_t{200}, ds::Shape{2}); }),
                       "a tensor argument has an unknown dtype code 200", ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(decode([](auto& out) { out(std::uint8_t{0}, ds::Shape{std::int64_t{1} << 62, 4}); }),
                       "a tensor argument: shape (4611686018427387904, 4) read from the wire is negative or too large",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(decode([](auto& out) { out(std::uint8_t{0}, ds::Shape{2}, std::uint64_t{12}); }),
                       "a tensor argument: 12 bytes of elements arrived for a shape that holds 8", ds::InvalidArgument);
}

TEST_CASE("the coordinator's metrics and timeline settings: bad values, a port in use, off by default, port 0") {
  Cluster cluster(1, 1);
  ds::ParameterServerStrategy strategy(cluster.resolver());
  ::unsetenv("DISTRIBUTE_METRICS_PORT");
  ::unsetenv("DISTRIBUTE_TIMELINE");
  auto make = [&](ds::CoordinatorOptions o) { ds::ClusterCoordinator c(strategy, std::move(o)); };
  {
    auto o = quiet_options();
    o.metrics_port = 70000;
    CHECK_THROWS_WITH_AS(make(o), "CoordinatorOptions::metrics_port must be in [0, 65535], got 70000", ds::InvalidArgument);
    o.metrics_port = -1;
    CHECK_THROWS_WITH_AS(make(o), "CoordinatorOptions::metrics_port must be in [0, 65535], got -1", ds::InvalidArgument);
  }
  ::setenv("DISTRIBUTE_METRICS_PORT", "91x", 1);
  CHECK_THROWS_WITH_AS(make(quiet_options()),
                       "DISTRIBUTE_METRICS_PORT='91x' is not a port number in [0, 65535] (the first task's metrics "
                       "port; 0 for any free port)",
                       ds::InvalidArgument);
  {
    auto o = quiet_options();
    o.metrics_port = 0;  // the option wins over the variable
    ds::ClusterCoordinator c(strategy, o);
    CHECK(c.metrics_port().has_value());
  }
  ::unsetenv("DISTRIBUTE_METRICS_PORT");
  {
    auto o = quiet_options();
    o.timeline = "/nonexistent-distribute-dir/t.json";
    CHECK_THROWS_WITH_AS(make(o), doctest::Contains("timeline: cannot write '/nonexistent-distribute-dir/t.chief-0.json'"),
                         ds::InvalidArgument);
  }
  {
    boost::asio::io_context io;
    boost::asio::ip::tcp::acceptor busy(io, {boost::asio::ip::make_address("127.0.0.1"), 0});
    auto o = quiet_options();
    o.metrics_port = busy.local_endpoint().port();
    CHECK_THROWS_AS(make(o), ds::Unavailable);
  }
  {
    ds::ClusterCoordinator off(strategy, quiet_options());
    CHECK_FALSE(off.metrics_port().has_value());  // nothing set: nothing served
  }
  // Served on the chief's host, port 0 resolved; the series count what happened.
  auto o = quiet_options();
  o.metrics_port = 0;
  ds::ClusterCoordinator coordinator(strategy, o);
  REQUIRE(coordinator.metrics_port().has_value());
  const int port = *coordinator.metrics_port();
  auto scope = strategy.scope();
  ds::Variable<float> counter(0.0f, {.name = "counter"});
  std::vector<ds::RemoteValue<int>> results;
  for (int i = 0; i < 5; ++i) results.push_back(coordinator.schedule(&ps_test::twice_unless_13, i));
  coordinator.join();
  CHECK(results[3].get() == 6);
  CHECK(results[4].fetch() == 8);
  coordinator.schedule(&ps_test::twice_unless_13, 13);
  CHECK_THROWS_WITH(coordinator.join(), doctest::Contains("closure 13 fails on purpose"));
  const std::string text = http_get(port, "/metrics");
  const std::string labels = "{task_type=\"chief\",task_index=\"0\"}";
  CHECK(text.find("distribute_coordinator_closures_scheduled_total" + labels + " 6\n") != std::string::npos);
  CHECK(text.find("distribute_coordinator_closures_completed_total" + labels + " 5\n") != std::string::npos);
  CHECK(text.find("distribute_coordinator_closures_failed_total" + labels + " 1\n") != std::string::npos);
  CHECK(text.find("distribute_coordinator_closures_retried_total" + labels + " 0\n") != std::string::npos);
  CHECK(text.find("distribute_coordinator_remote_value_fetches_total" + labels + " 2\n") != std::string::npos);
  CHECK(text.find("distribute_coordinator_closure_latency_seconds_count" + labels + " 6\n") != std::string::npos);
  CHECK(text.find("distribute_coordinator_workers_up" + labels + " 1\n") != std::string::npos);
  CHECK(text.find("job=") == std::string::npos);
}

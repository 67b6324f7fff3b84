// Parameter-server training with real processes on 127.0.0.1: this test is the chief (it runs the
// ClusterCoordinator); ps and worker tasks are ps_helper processes running ds::Server.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "ps_functions.hpp"
#include "support/processes.hpp"

using namespace std::chrono_literals;
using test_support::Child;

namespace {

const char* helper_path() {
  const char* p = std::getenv("DISTRIBUTE_PS_HELPER");
  REQUIRE_MESSAGE(p != nullptr, "DISTRIBUTE_PS_HELPER is not set (run through meson test)");
  return p;
}

/// num_ps ps tasks and num_workers workers (ps_helper processes); this process is the chief.
struct Cluster {
  int num_ps, num_workers;
  std::vector<int> ports;
  ds::ClusterSpec spec;
  std::vector<Child> ps, workers;
  std::map<std::string, std::string> env;

  Cluster(int p, int w, std::map<std::string, std::string> environment = {})
      : num_ps(p), num_workers(w), ports(test_support::free_ports(p + w + 1)), env(std::move(environment)) {
    auto addr = [&](int i) { return fmt::format("127.0.0.1:{}", ports[static_cast<std::size_t>(i)]); };
    ds::ClusterSpec::DenseJobs jobs;
    jobs["chief"] = {addr(p + w)};
    for (int i = 0; i < p; ++i) jobs["ps"].push_back(addr(i));
    for (int i = 0; i < w; ++i) jobs["worker"].push_back(addr(p + i));
    spec = ds::ClusterSpec(jobs);
    for (int i = 0; i < p; ++i) ps.push_back(start("ps", i));
    for (int i = 0; i < w; ++i) workers.push_back(start("worker", i));
  }
  Cluster(const Cluster&) = delete;
  ~Cluster() {
    for (auto* group : {&ps, &workers}) {
      for (auto& c : *group) kill_task(c);
    }
  }

  Child start(const std::string& job, int index) {
    return test_support::spawn({helper_path(), job, std::to_string(index), spec.to_json()}, env);
  }
  static void kill_task(Child& c) {
    if (c.pid <= 0) return;
    ::kill(c.pid, SIGKILL);
    ::waitpid(c.pid, nullptr, 0);
    ::close(c.out_fd);
    c.pid = -1;
  }
  std::shared_ptr<ds::ClusterResolver> resolver() const {
    return std::make_shared<ds::SimpleClusterResolver>(spec, "chief", 0);
  }
};

ds::CoordinatorOptions quiet_options() {
  ds::CoordinatorOptions o;
  o.heartbeat_timeout = 1000ms;
  o.log = [](std::string_view line) { MESSAGE(std::string(line)); };
  return o;
}

/// GET `target` from a server's port (the status endpoints).
std::string http_get(int port, const std::string& target) {
  namespace http = boost::beast::http;
  boost::asio::io_context io;
  boost::asio::ip::tcp::socket socket(io);
  socket.connect({boost::asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)});
  http::request<http::empty_body> req{http::verb::get, target, 11};
  req.set(http::field::host, "127.0.0.1");
  http::write(socket, req);
  boost::beast::flat_buffer buffer;
  http::response<http::string_body> res;
  http::read(socket, buffer, res);
  return fmt::format("{} {}", res.result_int(), res.body());
}

/// The value of a Prometheus counter line `name{...} value` summed over the given ports.
double metric_sum(const std::vector<int>& ports, const std::string& name) {
  double total = 0;
  for (int port : ports) {
    const std::string text = http_get(port, "/metrics");
    std::size_t at = 0;
    while ((at = text.find("\n" + name + "{", at)) != std::string::npos) {
      const auto end = text.find('\n', at + 1);
      const auto line = text.substr(at + 1, end - at - 1);
      total += std::stod(line.substr(line.rfind(' ') + 1));
      at = end;
    }
  }
  return total;
}

template <class F>
bool wait_until(F&& ready, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!ready()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

}  // namespace

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
  CHECK(http_get(cluster.ports[0], "/healthz") == "200 ok\n");
  CHECK(http_get(cluster.ports[2], "/nothing-here").rfind("404", 0) == 0);
  coordinator.shutdown_cluster();
  CHECK(test_support::wait_all(cluster.ps, 10s));
  CHECK(test_support::wait_all(cluster.workers, 10s));
  for (auto& c : cluster.ps) CHECK(c.status == 0);
  for (auto& c : cluster.workers) CHECK(c.status == 0);
  for (auto* group : {&cluster.ps, &cluster.workers}) {
    for (auto& c : *group) c.pid = -1;  // reaped
  }
}

TEST_CASE("a worker SIGKILLed half-way: still exactly 1000, join completes, the restarted worker is used again") {
  Cluster cluster(2, 3);
  ds::ParameterServerStrategy strategy(cluster.resolver());
  ds::ClusterCoordinator coordinator(strategy, quiet_options());
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
  REQUIRE(wait_until([&] { return coordinator.num_workers_up() == 2; }, 10s));
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
  CHECK(std::chrono::steady_clock::now() - start < 5s);
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
                                                   ds::ParameterServerOptions{.connect_timeout = 2000ms,
                                                                              .cluster_token = ""}),
                       doctest::Contains("refused the connection"), ds::PeerFailure);
  // A stranger sending random bytes and a truncated frame: the server drops it and keeps serving.
  for (std::string junk : {std::string("hello, is this HTTP?\r\n\r\n"), std::string("DSNT\x01\x0c", 6),
                           std::string(100, '\xff')}) {
    boost::asio::io_context io;
    boost::asio::ip::tcp::socket s(io);
    s.connect({boost::asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(cluster.ports[0])});
    boost::asio::write(s, boost::asio::buffer(junk));
    s.shutdown(boost::asio::ip::tcp::socket::shutdown_send);
    boost::system::error_code ec;
    char buf[256];
    s.read_some(boost::asio::buffer(buf), ec);  // closed (or a reject) without a hang
  }
  ds::ParameterServerStrategy strategy(cluster.resolver(), {}, ds::ParameterServerOptions{.cluster_token = "s3cret"});
  ds::ClusterCoordinator coordinator(strategy, quiet_options());
  auto scope = strategy.scope();
  ds::Variable<float> counter(0.0f, {.name = "counter"});
  for (int i = 0; i < 10; ++i) coordinator.schedule(&ps_test::add_one, counter);
  coordinator.join();
  CHECK(counter.read_value() == 10.0f);
}

}  // TEST_SUITE

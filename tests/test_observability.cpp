// observe/: the metrics registry's text format, its HTTP server on a real socket, the settings a
// multi-worker task reads (and their bad values), and the timeline file. The multi-process checks
// (prometheus_client, failing jobs' timelines) are check_metrics_prometheus.py and check_timeline.py.
#include <distribute/observe/metrics.hpp>
#include <distribute/observe/collective_metrics.hpp>
#include <distribute/net/metrics_server.hpp>
#include <distribute/observe/timeline.hpp>
#include <distribute/strategy/observability.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <cstring>
#include <thread>
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/json.hpp>
#include <doctest/doctest.h>

#include "support/http_get.hpp"

namespace ds = distribute;
namespace obs = distribute::observe;
namespace fs = std::filesystem;

namespace {

/// {status} {body} of one HTTP request to 127.0.0.1:port.
std::string http(std::uint16_t port, const std::string& target, boost::beast::http::verb verb = boost::beast::http::verb::get) {
  namespace http = boost::beast::http;
  boost::asio::io_context io;
  boost::asio::ip::tcp::socket socket(io);
  socket.connect({boost::asio::ip::make_address("127.0.0.1"), port});
  http::request<http::empty_body> req{verb, target, 11};
  req.set(http::field::host, "127.0.0.1");
  http::write(socket, req);
  boost::beast::flat_buffer buffer;
  http::response<http::string_body> res;
  http::read(socket, buffer, res);
  return std::to_string(res.result_int()) + " " + res.body();
}

/// Sets an environment variable for one scope (the tests here run on one thread).
struct EnvVar {
  EnvVar(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value, 1);
  }
  ~EnvVar() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }
  const char* name_;
  std::optional<std::string> old_;
};

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("distribute-observe-" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
};

}  // namespace

TEST_SUITE("observability") {

TEST_CASE("the registry writes Prometheus text: task labels first, escaped values, cumulative buckets") {
  obs::MetricsRegistry reg("worker", 3);
  auto& c = reg.counter("demo_total", "Things\\done.\nTwice.", {{"kind", "a\"b\\c\nd"}});
  c.add(2);
  c.add();
  auto& h = reg.histogram("demo_seconds", "Latency.", {}, {0.5, 1.0});
  h.observe(0.25);
  h.observe(1.0);  // on a bound: counted in it (le means <=)
  h.observe(7.0);
  reg.callback("demo_bytes", "Size.", "gauge", {}, [] { return 42.0; });
  const std::string want =
      "# HELP demo_total Things\\\\done.\\nTwice.\n"
      "# TYPE demo_total counter\n"
      "demo_total{task_type=\"worker\",task_index=\"3\",kind=\"a\\\"b\\\\c\\nd\"} 3\n"
      "# HELP demo_seconds Latency.\n"
      "# TYPE demo_seconds histogram\n"
      "demo_seconds_bucket{task_type=\"worker\",task_index=\"3\",le=\"0.5\"} 1\n"
      "demo_seconds_bucket{task_type=\"worker\",task_index=\"3\",le=\"1\"} 2\n"
      "demo_seconds_bucket{task_type=\"worker\",task_index=\"3\",le=\"+Inf\"} 3\n"
      "demo_seconds_sum{task_type=\"worker\",task_index=\"3\"} 8.25\n"
      "demo_seconds_count{task_type=\"worker\",task_index=\"3\"} 3\n"
      "# HELP demo_bytes Size.\n"
      "# TYPE demo_bytes gauge\n"
      "demo_bytes{task_type=\"worker\",task_index=\"3\"} 42\n";
  CHECK(reg.expose() == want);
}

TEST_CASE("series of one family share its HELP and TYPE lines") {
  obs::MetricsRegistry reg("ps", 0);
  reg.counter("x_total", "X.", {{"op", "read"}}).add(5);
  reg.counter("x_total", "X.", {{"op", "write"}});
  CHECK(reg.expose() ==
        "# HELP x_total X.\n# TYPE x_total counter\n"
        "x_total{task_type=\"ps\",task_index=\"0\",op=\"read\"} 5\n"
        "x_total{task_type=\"ps\",task_index=\"0\",op=\"write\"} 0\n");
}

TEST_CASE("bad metric and label names, reserved labels and repeated series are refused with their reason") {
  obs::MetricsRegistry reg("worker", 0);
  CHECK_THROWS_WITH_AS(reg.counter("2bad", "h"), doctest::Contains("'2bad' is not a valid Prometheus metric name"),
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(reg.counter("a-b", "h"), doctest::Contains("'a-b' is not a valid Prometheus metric name"),
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(reg.counter("ok_total", "h", {{"bad-label", "v"}}),
                       doctest::Contains("'bad-label' is not a valid label name"), ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(reg.counter("ok_total", "h", {{"__x", "v"}}), doctest::Contains("'__x' is not a valid label name"),
                       ds::InvalidArgument);
  for (const char* reserved : {"job", "instance", "task_type", "task_index"}) {
    const std::string message = std::string("label '") + reserved + "' is reserved";
    CHECK_THROWS_WITH_AS(reg.counter("ok_total", "h", {{reserved, "v"}}), doctest::Contains(message.c_str()),
                         ds::InvalidArgument);
  }
  CHECK_THROWS_WITH_AS(reg.counter("ok_total", "h", {{"a", "1"}, {"a", "2"}}), doctest::Contains("label 'a' given twice"),
                       ds::InvalidArgument);
  reg.counter("once_total", "h", {{"k", "v"}});
  CHECK_THROWS_WITH_AS(reg.counter("once_total", "h", {{"k", "v"}}), doctest::Contains("is registered twice"),
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(reg.counter("once_total", "h", {{"other", "v"}}),
                       doctest::Contains("'once_total' is already registered as a counter with other labels"),
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(reg.histogram("once_total", "h", {{"k", "w"}}), doctest::Contains("already registered"),
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(reg.histogram("h_seconds", "h", {}, {1.0, 1.0}), doctest::Contains("strictly increasing"),
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(reg.histogram("h_seconds", "h", {}, {}), doctest::Contains("non-empty"), ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(reg.histogram("h_seconds", "h", {{"le", "1"}}), doctest::Contains("'le' is the histogram's own label"),
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(reg.callback("g", "h", "histogram", {}, [] { return 0.0; }),
                       doctest::Contains("a callback is a gauge or a counter, not 'histogram'"), ds::InvalidArgument);
}

TEST_CASE("CollectiveMetrics counts calls, bytes, latencies, retries and failures by kind and reason") {
  auto reg = std::make_shared<obs::MetricsRegistry>("chief", 0);
  obs::CollectiveMetrics m(reg);
  m.call(obs::CallKind::AllReduce, 0.002, 100, 200, false);
  m.call(obs::CallKind::AllReduce, 0.5, 1, 2, true);
  m.retry();
  m.failure(obs::FailureReason::Mismatch);
  const std::string text = reg->expose();
  const std::string l = "task_type=\"chief\",task_index=\"0\"";
  CHECK(text.find("distribute_collectives_total{" + l + ",kind=\"all_reduce\"} 2\n") != std::string::npos);
  CHECK(text.find("distribute_collectives_failed_total{" + l + ",kind=\"all_reduce\"} 1\n") != std::string::npos);
  CHECK(text.find("distribute_collective_bytes_sent_total{" + l + ",kind=\"all_reduce\"} 101\n") != std::string::npos);
  CHECK(text.find("distribute_collective_bytes_received_total{" + l + ",kind=\"all_reduce\"} 202\n") != std::string::npos);
  CHECK(text.find("distribute_collective_latency_seconds_bucket{" + l + ",kind=\"all_reduce\",le=\"0.0025\"} 1\n") !=
        std::string::npos);
  CHECK(text.find("distribute_collective_latency_seconds_bucket{" + l + ",kind=\"all_reduce\",le=\"0.5\"} 2\n") !=
        std::string::npos);
  CHECK(text.find("distribute_collective_latency_seconds_sum{" + l + ",kind=\"all_reduce\"} 0.502\n") != std::string::npos);
  CHECK(text.find("distribute_collectives_total{" + l + ",kind=\"broadcast\"} 0\n") != std::string::npos);
  CHECK(text.find("distribute_connect_retries_total{" + l + "} 1\n") != std::string::npos);
  CHECK(text.find("distribute_peer_failures_total{" + l + ",reason=\"mismatch\"} 1\n") != std::string::npos);
  CHECK(text.find("distribute_peer_failures_total{" + l + ",reason=\"peer_lost\"} 0\n") != std::string::npos);
  CHECK(text.find("job=") == std::string::npos);
}

TEST_CASE("MetricsServer answers GET /metrics with the registry's text on a real socket; other paths and methods are refused") {
  auto reg = std::make_shared<obs::MetricsRegistry>("worker", 1);
  reg->counter("hits_total", "Hits.").add(7);
  ds::net::MetricsServer server(reg, "127.0.0.1", 0);
  REQUIRE(server.port() != 0);
  CHECK(http(server.port(), "/metrics") == "200 " + reg->expose());
  reg->counter("later_total", "Registered after the server started.").add(1);
  CHECK(http(server.port(), "/metrics").find("later_total{task_type=\"worker\",task_index=\"1\"} 1\n") != std::string::npos);
  CHECK(http(server.port(), "/healthz") == "200 ok\n");
  CHECK(http(server.port(), "/nothing") == "404 not found\n");
  CHECK(http(server.port(), "/metrics", boost::beast::http::verb::post) == "405 only GET\n");
  // A client that connects and says nothing does not stop the others.
  boost::asio::io_context io;
  boost::asio::ip::tcp::socket silent(io);
  silent.connect({boost::asio::ip::make_address("127.0.0.1"), server.port()});
  CHECK(http(server.port(), "/healthz") == "200 ok\n");
}

TEST_CASE("MetricsServer with a cluster token: /metrics wants it as a bearer credential; beyond loopback, no token is refused unless insecure") {
  auto reg = std::make_shared<obs::MetricsRegistry>("worker", 1);
  reg->counter("hits_total", "Hits.").add(7);
  ds::net::MetricsServer server(reg, "127.0.0.1", 0, {.cluster_token = "s3cret"});
  const std::string refused = "401 this task has a cluster token: send it as 'Authorization: Bearer TOKEN' "
                              "(Prometheus: authorization: {type: Bearer, credentials_file: FILE})\n";
  CHECK(test_support::http_get(server.port(), "/metrics") == refused);
  CHECK(test_support::http_get(server.port(), "/metrics", "Bearer s3cre") == refused);
  CHECK(test_support::http_get(server.port(), "/metrics", "Bearer s3cret!") == refused);
  CHECK(test_support::http_get(server.port(), "/metrics", "bearer s3cret") == refused);
  CHECK(test_support::http_get(server.port(), "/metrics", "Bearer s3cret") == "200 " + reg->expose());
  CHECK(test_support::http_get(server.port(), "/healthz") == "200 ok\n");
  {  // The token from the environment, as every server of the library reads it.
    EnvVar token("DISTRIBUTE_CLUSTER_TOKEN", "from-env");
    ds::net::MetricsServer env_server(reg, "127.0.0.1", 0);
    CHECK(test_support::http_get(env_server.port(), "/metrics") == refused);
    CHECK(test_support::http_get(env_server.port(), "/metrics", "Bearer from-env") == "200 " + reg->expose());
  }
  EnvVar no_token("DISTRIBUTE_CLUSTER_TOKEN", "");
  EnvVar not_insecure("DISTRIBUTE_INSECURE", "");
  CHECK_THROWS_WITH_AS(ds::net::MetricsServer(reg, "0.0.0.0", 0),
                       "the metrics port will not listen on 0.0.0.0:0, reachable from other machines, without a cluster "
                       "token: anyone who can connect could join, run registered functions and read or change state. "
                       "Set DISTRIBUTE_CLUSTER_TOKEN to the same secret for every task (distribute-launch does), listen "
                       "on a loopback address, or accept the risk with the option insecure = true or "
                       "DISTRIBUTE_INSECURE=1",
                       ds::ClusterConfigError);
  ds::net::MetricsServer open(reg, "0.0.0.0", 0, {.insecure = true});
  CHECK(test_support::http_get(open.port(), "/metrics") == "200 " + reg->expose());
  ds::net::MetricsServer with_token(reg, "0.0.0.0", 0, {.cluster_token = "s3cret"});
  CHECK(test_support::http_get(with_token.port(), "/metrics") == refused);
}

TEST_CASE("MetricsServer: a host that does not resolve, or a port in use, is Unavailable with the address") {
  auto reg = std::make_shared<obs::MetricsRegistry>("worker", 0);
  CHECK_THROWS_WITH_AS(ds::net::MetricsServer(reg, "no-such-host.invalid", 0), doctest::Contains("cannot resolve the host 'no-such-host.invalid'"),
                       ds::Unavailable);
  ds::net::MetricsServer first(reg, "127.0.0.1", 0);
  const std::string where = "127.0.0.1:" + std::to_string(first.port());
  const std::string message = "cannot listen on " + where;
  CHECK_THROWS_WITH_AS(ds::net::MetricsServer(reg, "127.0.0.1", first.port()), doctest::Contains(message.c_str()),
                       ds::Unavailable);
}

namespace {

// A TCP connection from `source` to `destination`:`port` (IPv4, numeric); -1 when refused.
int connect_from(const char* source, const char* destination, std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in from{}, to{};
  from.sin_family = to.sin_family = AF_INET;
  ::inet_pton(AF_INET, source, &from.sin_addr);
  ::inet_pton(AF_INET, destination, &to.sin_addr);
  to.sin_port = htons(port);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof from) != 0 ||
      ::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// What a server answers a GET /healthz on `fd` within 5 s: the status line, or "closed".
std::string healthz_on(int fd) {
  const std::string req = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
  (void)!::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  std::string got;
  char buf[512];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 5000) <= 0) return "silent";
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, static_cast<std::size_t>(n));
  }
  return got.empty() ? "closed" : got.substr(0, got.find("\r\n"));
}

}  // namespace

TEST_CASE("the accept policy bounds the connections waiting from one address; other addresses are still served") {
  // In a network namespace of its own (a thread's), with three addresses on its loopback device
  // that are not loopback addresses: 10.77.0.1 serves, 10.77.0.2 floods, 10.77.0.3 comes later.
  std::string setup_error;
  std::size_t per_address = 0;
  std::vector<std::string> flood_answers;
  std::string other_answer, after_answer;
  std::thread in_namespace([&] {
    if (::unshare(CLONE_NEWNET) != 0) {
      setup_error = fmt::format("unshare(CLONE_NEWNET): {}", std::strerror(errno));
      return;
    }
    if (std::system("ip link set lo up && ip addr add 10.77.0.1/32 dev lo && ip addr add 10.77.0.2/32 dev lo && "
                    "ip addr add 10.77.0.3/32 dev lo") != 0) {
      setup_error = "ip addr add failed";
      return;
    }
    auto reg = std::make_shared<obs::MetricsRegistry>("worker", 0);
    ds::net::MetricsServer server(reg, "10.77.0.1", 0, {.cluster_token = "s3cret"}, 8);
    per_address = std::max<std::size_t>(1, server.max_pending() / 4);
    std::vector<int> held;  // idle, from 10.77.0.2: each holds its slot
    for (std::size_t k = 0; k < per_address; ++k) held.push_back(connect_from("10.77.0.2", "10.77.0.1", server.port()));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    for (int k = 0; k < 3; ++k) {  // more from the same address: closed as soon as accepted
      const int fd = connect_from("10.77.0.2", "10.77.0.1", server.port());
      flood_answers.push_back(fd < 0 ? "refused" : healthz_on(fd));
      if (fd >= 0) ::close(fd);
    }
    const int other = connect_from("10.77.0.3", "10.77.0.1", server.port());
    other_answer = other < 0 ? "refused" : healthz_on(other);
    if (other >= 0) ::close(other);
    for (int fd : held) ::close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const int again = connect_from("10.77.0.2", "10.77.0.1", server.port());
    after_answer = again < 0 ? "refused" : healthz_on(again);
    if (again >= 0) ::close(again);
  });
  in_namespace.join();
  REQUIRE_MESSAGE(setup_error.empty(), setup_error);
  CHECK(per_address == 2);  // a quarter of 8
  for (const auto& answer : flood_answers) CHECK(answer == "closed");
  CHECK(other_answer == "HTTP/1.1 200 OK");
  CHECK(after_answer == "HTTP/1.1 200 OK");  // slots are given back
}

TEST_CASE("MetricsServer under 300 idle connections at ulimit -n 64: the process keeps its descriptors, nothing spins") {
  // The server runs in a child whose descriptor limit is 64; this process opens 300 connections to
  // it and says nothing on them. The child then measures its own CPU time over 2 s and opens 8
  // files for its own work, and reports; once the flood is gone, /healthz answers again.
  int to_parent[2], to_child[2];
  REQUIRE(::pipe(to_parent) == 0);
  REQUIRE(::pipe(to_child) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::close(to_parent[0]);
    ::close(to_child[1]);
    const ::rlimit limit{64, 64};
    if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) ::_exit(3);
    try {
      auto reg = std::make_shared<obs::MetricsRegistry>("worker", 0);
      ds::net::MetricsServer server(reg, "127.0.0.1", 0);
      auto say = [&](const std::string& line) { (void)!::write(to_parent[1], line.data(), line.size()); };
      auto hear = [&] {
        char c = 0;
        return ::read(to_child[0], &c, 1) == 1;
      };
      say(fmt::format("{} {}\n", server.port(), server.max_pending()));
      if (!hear()) ::_exit(4);  // the flood is on
      auto cpu_us = [] {
        ::rusage u{};
        ::getrusage(RUSAGE_SELF, &u);
        return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1000000L + u.ru_utime.tv_usec + u.ru_stime.tv_usec;
      };
      const long before = cpu_us();
      std::this_thread::sleep_for(std::chrono::seconds(2));
      const long used = cpu_us() - before;
      int opened = 0;
      std::vector<int> files;
      for (int i = 0; i < 8; ++i) {
        const int fd = ::open("/dev/null", O_RDONLY);
        if (fd >= 0) files.push_back(fd);
      }
      opened = static_cast<int>(files.size());
      for (int fd : files) ::close(fd);
      say(fmt::format("{} {}\n", opened, used));
      if (!hear()) ::_exit(5);  // the flood is gone
      hear();                   // done
    } catch (...) {
      ::_exit(6);
    }
    ::_exit(0);
  }
  ::close(to_parent[1]);
  ::close(to_child[0]);
  auto read_line = [&] {
    std::string line;
    char c = 0;
    while (::read(to_parent[0], &c, 1) == 1 && c != '\n') line += c;
    return line;
  };
  std::istringstream started(read_line());
  int port = 0;
  std::size_t bound = 0;
  started >> port >> bound;
  REQUIRE(port > 0);
  CHECK(bound == 1);  // 64 descriptors leave room for one connection at a time: a quarter of what is free
  {
    boost::asio::io_context io;
    std::vector<boost::asio::ip::tcp::socket> flood;
    for (int i = 0; i < 300; ++i) {
      flood.emplace_back(io).connect({boost::asio::ip::make_address("127.0.0.1"), static_cast<std::uint16_t>(port)});
    }
    (void)!::write(to_child[1], "g", 1);
    std::istringstream report(read_line());
    int opened = -1;
    long cpu_us = -1;
    report >> opened >> cpu_us;
    CHECK(opened == 8);
    CHECK_MESSAGE(cpu_us < 500000, "the child used ", cpu_us, " us of CPU in 2 s under the flood");
  }
  (void)!::write(to_child[1], "g", 1);
  std::string health;
  for (int attempt = 0; attempt < 100 && health != "200 ok\n"; ++attempt) {
    try {
      health = http(static_cast<std::uint16_t>(port), "/healthz");
    } catch (const std::exception&) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the one slot is still held by a closing flood connection
    }
  }
  CHECK(health == "200 ok\n");
  (void)!::write(to_child[1], "g", 1);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  ::close(to_parent[0]);
  ::close(to_child[1]);
}

TEST_CASE("the metrics port: the option first, else DISTRIBUTE_METRICS_PORT; bad values are refused with the variable") {
  ds::CommunicationOptions o;
  {
    EnvVar unset("DISTRIBUTE_METRICS_PORT", "");
    CHECK(!ds::strategy::metrics_port_setting(o).has_value());
  }
  {
    EnvVar v("DISTRIBUTE_METRICS_PORT", "9100");
    CHECK(ds::strategy::metrics_port_setting(o) == 9100);
    o.metrics_port = 0;
    CHECK(ds::strategy::metrics_port_setting(o) == 0);  // the option wins
    o.metrics_port.reset();
  }
  for (const char* bad : {"abc", "91x", "-1", "65536", " 80"}) {
    EnvVar v("DISTRIBUTE_METRICS_PORT", bad);
    const std::string message = std::string("DISTRIBUTE_METRICS_PORT='") + bad + "' is not a port number";
    CHECK_THROWS_WITH_AS(ds::strategy::metrics_port_setting(o), doctest::Contains(message.c_str()),
                         ds::InvalidArgument);
  }
  o.metrics_port = 70000;
  CHECK_THROWS_WITH_AS(ds::strategy::metrics_port_setting(o), doctest::Contains("metrics_port must be in [0, 65535], got 70000"),
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(ds::strategy::TaskMetrics::start("worker", 3, "127.0.0.1", 65534, 3, {}),
                       doctest::Contains("metrics port 65534 + rank 3 is beyond 65535"), ds::InvalidArgument);
}

TEST_CASE("timeline file names: the task before the extension") {
  CHECK(obs::timeline_file("/tmp/tl.json", "worker", 1) == "/tmp/tl.worker-1.json");
  CHECK(obs::timeline_file("/tmp/tl", "chief", 0) == "/tmp/tl.chief-0.json");
  CHECK(obs::timeline_file("/tmp/a.b/tl", "worker", 2) == "/tmp/a.b/tl.worker-2.json");
  CHECK(obs::timeline_file("/tmp/.hidden", "worker", 0) == "/tmp/.hidden.worker-0.json");
  CHECK(obs::timeline_file("trace.v2.json", "ps", 10) == "trace.v2.ps-10.json");
}

TEST_CASE("the timeline: an unwritable file is refused; spans of two threads come out sorted, one tid each, as valid JSON") {
  TempDir dir;
  auto& tl = obs::Timeline::instance();
  CHECK_THROWS_WITH_AS(tl.start((dir.path / "no-such-dir" / "t.json").string(), "worker", 0),
                       doctest::Contains("timeline: cannot write"), ds::InvalidArgument);
  CHECK(!obs::timeline_enabled());
  {
    obs::TimelineSpan off("not recorded", "test");
    CHECK(!off.active());
  }
  const std::string file = (dir.path / "t.worker-4.json").string();
  tl.start(file, "worker", 4);
  CHECK(obs::timeline_enabled());
  CHECK_THROWS_WITH_AS(tl.start((dir.path / "other.json").string(), "worker", 4),
                       doctest::Contains("already records into"), ds::InvalidArgument);
  tl.complete("late", "test", 5000, 6000, "\"n\":1");  // recorded after the one below, starts later
  tl.complete("early \"quoted\"", "test", 1000, 9000);
  std::thread other([&] { obs::TimelineSpan s("other thread", "test", 12); });
  other.join();
  tl.instant("moment", "test", 7000);
  tl.flush();
  tl.stop();
  CHECK(!obs::timeline_enabled());

  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  const boost::json::value doc = boost::json::parse(text.str());
  CHECK(doc.at("otherData").at("task").as_string() == "worker:4");
  std::map<std::int64_t, std::vector<std::string>> by_tid;
  std::map<std::int64_t, double> last_ts;
  for (const auto& v : doc.at("traceEvents").as_array()) {
    const auto& e = v.as_object();
    CHECK(e.at("pid").as_int64() == 4);
    if (e.at("ph").as_string() == "M") continue;
    const std::int64_t tid = e.at("tid").as_int64();
    const double ts = e.at("ts").to_number<double>();
    CHECK(ts >= last_ts[tid]);
    last_ts[tid] = ts;
    by_tid[tid].push_back(std::string(e.at("name").as_string()));
    if (e.at("name").as_string() == "other thread") CHECK(e.at("args").at("step").as_int64() == 12);
    if (e.at("name").as_string() == "late") {
      CHECK(ts == 5.0);
      CHECK(e.at("dur").to_number<double>() == 1.0);
      CHECK(e.at("args").at("n").as_int64() == 1);
    }
  }
  REQUIRE(by_tid.size() == 2);
  CHECK(by_tid.begin()->second == std::vector<std::string>{"early \"quoted\"", "late", "moment"});
  CHECK(std::next(by_tid.begin())->second == std::vector<std::string>{"other thread"});
}

}  // TEST_SUITE

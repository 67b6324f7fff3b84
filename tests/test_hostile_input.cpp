// Hostile input against the parameter-server service, as an adversarial user would send it: real
// sockets on loopback, real ps processes (ps_helper) where a process limit matters, and messages
// checked. Each case is bounded in time (a hang fails the suite's timeout, not CI's).
#define DISTRIBUTE_WITH_PS
#include <distribute/distribute.hpp>

#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "ps_functions.hpp"
#include "support/processes.hpp"
#include "support/http_get.hpp"
#include "support/ps_cluster.hpp"

namespace ds = distribute;
namespace dd = ds::ps::detail;
namespace net = ds::net;
using namespace std::chrono_literals;
using test_support::http_get;
using boost::asio::ip::tcp;

namespace hostile {
inline float sum_of(std::vector<float> v) {
  float s = 0;
  for (float x : v) s += x;
  return s;
}
inline double first_of(ds::Tensor<double> t) { return t.size() ? t.data()[0] : 0.0; }
DISTRIBUTE_REMOTE_FUNCTION(sum_of);
DISTRIBUTE_REMOTE_FUNCTION(first_of);
}  // namespace hostile

namespace {

const char* env_path(const char* name) {
  const char* p = std::getenv(name);
  REQUIRE_MESSAGE(p != nullptr, name << " is not set (run through meson test)");
  return p;
}

using test_support::wait_until;

/// Lines a Server logged.
struct Log {
  std::mutex mutex;
  std::vector<std::string> lines;
  std::function<void(std::string_view)> sink() {
    return [this](std::string_view l) {
      std::lock_guard lock(mutex);
      lines.emplace_back(l);
    };
  }
  bool has(const std::string& text) {
    std::lock_guard lock(mutex);
    for (const auto& l : lines)
      if (l.find(text) != std::string::npos) return true;
    return false;
  }
  bool eventually(const std::string& text, std::chrono::milliseconds limit = 5s) {
    return wait_until([&] { return has(text); }, limit);
  }
};

/// Reads what a child wrote so far (non-blocking).
void drain(test_support::Child& c) {
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(c.out_fd, buf, sizeof buf);
    if (n <= 0) break;
    c.output.append(buf, static_cast<std::size_t>(n));
  }
}

void stop_child(test_support::Child& c) {
  if (c.pid <= 0) return;
  ::kill(c.pid, SIGKILL);
  ::waitpid(c.pid, nullptr, 0);
  drain(c);
  ::close(c.out_fd);
  c.pid = -1;
}

tcp::endpoint loopback(int port) { return {boost::asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)}; }

/// The hello a client of the ps service sends (no rank; `token`: whether it claims to hold one).
std::vector<std::byte> service_hello(bool token = false) {
  return net::encode_frame({net::FrameType::Hello, 0, 0, 0},
                           net::detail::encode(net::detail::Hello{0, 0, 0, token, net::detail::random_nonce(), true}));
}

/// A socket through the tokenless handshake, as any stranger can do against a cluster without a token.
struct RawPeer {
  boost::asio::io_context io;
  tcp::socket s{io};
  explicit RawPeer(int port) { s.connect(loopback(port)); }
  void send(const std::vector<std::byte>& bytes) { boost::asio::write(s, boost::asio::buffer(bytes)); }
  net::Frame read() {
    net::HeaderBytes head{};
    boost::asio::read(s, boost::asio::buffer(head));
    net::Frame f;
    f.header = net::decode_header(head, 1 << 20);
    f.payload.resize(f.header.length);
    boost::asio::read(s, boost::asio::buffer(f.payload));
    return f;
  }
  void handshake() {
    send(service_hello());
    REQUIRE(read().header.type == net::FrameType::Challenge);
    send(net::encode_frame({net::FrameType::Response, 0, 0, 0}, net::detail::Mac{}));  // no token: no proof
    REQUIRE(read().header.type == net::FrameType::Welcome);
  }
  /// True once the server has closed the connection (a read sees EOF or a reset).
  bool closed_within(std::chrono::milliseconds limit) {
    s.non_blocking(true);
    const auto deadline = std::chrono::steady_clock::now() + limit;
    char buf[256];
    while (std::chrono::steady_clock::now() < deadline) {
      boost::system::error_code ec;
      s.read_some(boost::asio::buffer(buf), ec);
      if (ec && ec != boost::asio::error::would_block) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }
};

long rss_kib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

ds::ClusterSpec one_ps_one_worker(const std::vector<int>& ports) {
  return ds::ClusterSpec(ds::ClusterSpec::DenseJobs{{"chief", {fmt::format("127.0.0.1:{}", ports[2])}},
                                                    {"ps", {fmt::format("127.0.0.1:{}", ports[0])}},
                                                    {"worker", {fmt::format("127.0.0.1:{}", ports[1])}}});
}

/// The error an RpcClient call came back with, as "Kind: message".
template <class F>
std::string remote_error(F&& call) {
  try {
    call();
  } catch (const dd::RemoteError& e) {
    return std::string(e.kind_name()) + ": " + e.what();
  }
  return "no error";
}

}  // namespace

TEST_SUITE("hostile") {

TEST_CASE("a flood of idle connections beyond the ps task's descriptor limit: a worker is still served, /healthz answers") {
  const auto ports = test_support::free_ports(3);
  const auto spec = one_ps_one_worker(ports);
  // The ps task with 256 descriptors (RLIMIT_NOFILE lowered in the child's shell before exec).
  auto ps = test_support::spawn({"/bin/sh", "-c", "ulimit -n 256 && exec \"$0\" ps 0 \"$1\"", env_path("DISTRIBUTE_PS_HELPER"),
                                 spec.to_json()},
                                {{"DISTRIBUTE_CLUSTER_TOKEN", ""}});
  REQUIRE(wait_until([&] { drain(ps); return ps.output.find("serving ps") != std::string::npos; }, 20s));
  // 300 idle connections, held open: more than the task has descriptors.
  std::vector<std::unique_ptr<RawPeer>> flood;
  for (int i = 0; i < 300; ++i) flood.push_back(std::make_unique<RawPeer>(ports[0]));
  std::this_thread::sleep_for(500ms);
  // A worker and this chief join while the flood still holds its sockets.
  auto worker = test_support::spawn({env_path("DISTRIBUTE_PS_HELPER"), "worker", "0", spec.to_json()},
                                    {{"DISTRIBUTE_CLUSTER_TOKEN", ""}});
  {
    ds::ParameterServerStrategy strategy(std::make_shared<ds::SimpleClusterResolver>(spec, "chief", 0), {},
                                         ds::ParameterServerOptions{.connect_timeout = 60000ms, .cluster_token = ""});
    ds::CoordinatorOptions options;
    options.log = [](std::string_view l) { MESSAGE(std::string(l)); };
    ds::ClusterCoordinator coordinator(strategy, options);
    auto scope = strategy.scope();
    ds::Variable<float> counter(0.0f, {.name = "counter"});
    for (int i = 0; i < 20; ++i) coordinator.schedule(&ps_test::add_one, counter);
    coordinator.join();
    CHECK(counter.read_value() == 20.0f);
    CHECK(http_get(ports[0], "/healthz").rfind("200 ", 0) == 0);
    coordinator.shutdown_cluster();
  }
  drain(ps);
  CHECK(::kill(ps.pid, 0) == 0);  // alive: never terminated
  INFO(ps.output);
  CHECK(ps.output.find("connections are already in their handshake") != std::string::npos);
  CHECK(ps.output.find("terminate") == std::string::npos);
  flood.clear();
  stop_child(worker);
  stop_child(ps);
}

TEST_CASE("a header claiming 2 GiB: memory grows with the bytes sent, and a half-sent frame is dropped") {
  const auto ports = test_support::free_ports(3);
  Log log;
  ds::ServerOptions options;
  options.cluster_token = "";
  options.read_timeout = 1000ms;
  options.log = log.sink();
  ds::Server server(one_ps_one_worker(ports), "ps", 0, "tcp", options);
  // Before authentication: a hello that claims 2 GiB is malformed at once.
  {
    RawPeer p(ports[0]);
    auto head = net::encode_header({net::FrameType::Hello, std::uint64_t{1} << 31, 0, 0});
    p.send({head.begin(), head.end()});
    CHECK(p.closed_within(5s));
    CHECK(log.eventually("malformed frame: hello frame payload of 2147483648 bytes exceeds the limit of 1024 bytes"));
  }
  // After the (tokenless) handshake: a request claiming 2 GiB - 1, of which 1 MiB arrives.
  const long before = rss_kib();
  RawPeer p(ports[0]);
  p.handshake();
  auto head = net::encode_header({net::FrameType::Request, (std::uint64_t{1} << 31) - 1, 1,
                                  static_cast<std::uint64_t>(dd::RpcOp::CreateVar)});
  p.send({head.begin(), head.end()});
  p.send(std::vector<std::byte>(1 << 20, std::byte{7}));
  std::this_thread::sleep_for(300ms);
  const long grown = rss_kib() - before;
  INFO("RSS grew by " << grown << " KiB");
  CHECK(grown < 64 * 1024);  // the 1 MiB sent and a chunk, not 2 GiB
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(p.closed_within(10s));  // the rest never comes: dropped after the read timeout
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  CHECK(log.eventually("closing the connection from 127.0.0.1:"));
  CHECK(log.has("request: timed out after 1000 ms"));
}

TEST_CASE("overflowing and oversized lengths in requests are typed errors naming what was wrong; the task keeps serving") {
  const auto ports = test_support::free_ports(3);
  const auto spec = one_ps_one_worker(ports);
  ds::ServerOptions options;
  options.cluster_token = "";
  options.log = [](std::string_view) {};
  ds::Server ps(spec, "ps", 0, "tcp", options);
  ds::Server worker(spec, "worker", 0, "tcp", options);
  dd::RpcOptions rpc;
  rpc.cluster_token = "";
  dd::RpcClient to_ps(spec.task_address("ps", 0), "ps 0", rpc);
  dd::RpcClient to_worker(spec.task_address("worker", 0), "worker 0", rpc);

  // A Tensor argument of shape (2^62 + 1, 4): the element count overflows 64 bits.
  const auto* first_of = dd::RemoteFunctionRegistry::instance().find("first_of");
  REQUIRE(first_of != nullptr);
  std::ostringstream tensor_args(std::ios::binary);
  {
    dd::WireOut out(tensor_args);
    out(ds::Shape{(std::int64_t{1} << 62) + 1, 4}, std::uint64_t{16});
  }
  CHECK(remote_error([&] {
          to_worker.call(dd::RpcOp::RunClosure,
                         dd::encode_message(dd::RunClosureMsg{1, 1, 0, "first_of", first_of->signature, tensor_args.str()}));
        }) == "InvalidArgument: a ds::Tensor argument: shape (4611686018427387905, 4) read from the wire is negative or too large");
  // A shape that fits, with 1 GiB of elements claimed in a few bytes: refused before allocating.
  std::ostringstream big_args(std::ios::binary);
  {
    dd::WireOut out(big_args);
    out(ds::Shape{std::int64_t{1} << 27}, std::uint64_t{1} << 30);
  }
  CHECK(remote_error([&] {
          to_worker.call(dd::RpcOp::RunClosure,
                         dd::encode_message(dd::RunClosureMsg{1, 2, 0, "first_of", first_of->signature, big_args.str()}));
        }) == "InvalidArgument: a ds::Tensor argument: 1073741824 bytes of elements claimed, 0 left in the message");

  // A std::vector argument whose length says 2^62 elements.
  const auto* sum_of = dd::RemoteFunctionRegistry::instance().find("sum_of");
  REQUIRE(sum_of != nullptr);
  std::ostringstream vec_args(std::ios::binary);
  {
    dd::WireOut out(vec_args);
    out(cereal::make_size_tag(std::uint64_t{1} << 62), std::uint32_t{0});
  }
  CHECK(remote_error([&] {
          to_worker.call(dd::RpcOp::RunClosure,
                         dd::encode_message(dd::RunClosureMsg{1, 3, 0, "sum_of", sum_of->signature, vec_args.str()}));
        }) == "InvalidArgument: malformed arguments: a vector of 4611686018427387904 elements claimed with 4 bytes left");

  // 76 bytes claiming 2^52 row ids.
  std::vector<std::byte> rows = dd::encode_message(dd::ReadRowsMsg{"w", 0, {}, 4});
  // Layout: key (8-byte length + "w"), dtype (1), rows' length (8) ...: patch the length, pad to 76.
  const std::size_t at = 8 + 1 + 1;
  net::detail::store_le(rows.data() + at, std::uint64_t{1} << 52, 8);
  rows.resize(76);
  CHECK(remote_error([&] { to_ps.call(dd::RpcOp::ReadRows, rows); }) ==
        "InvalidArgument: malformed read-rows message (76 bytes): a vector of 4503599627370496 elements claimed with "
        "58 bytes left");
  // A variable's shape that overflows: a typed error, not a wrapped-around size.
  CHECK(remote_error([&] {
          to_ps.call(dd::RpcOp::CreateVar,
                     dd::encode_message(dd::CreateVarMsg{"v", 0, {(std::int64_t{1} << 62) + 1, 4}, ""}));
        }) == "InvalidArgument: variable 'v': shape (4611686018427387905, 4) read from the wire is negative or too large");
  // ... and both tasks still answer.
  CHECK(dd::decode_message<dd::PingReply>(to_ps.call(dd::RpcOp::Ping, {}), "ping").job == "ps");
  CHECK(hostile::sum_of({1, 2}) == 3.0f);
  std::ostringstream ok_args(std::ios::binary);
  {
    dd::WireOut out(ok_args);
    out(std::vector<float>{1, 2, 3});
  }
  CHECK_NOTHROW(to_worker.call(dd::RpcOp::RunClosure,
                               dd::encode_message(dd::RunClosureMsg{1, 4, 0, "sum_of", sum_of->signature, ok_args.str()})));
}

TEST_CASE("decoders on a byte span: every bogus length is InvalidArgument, never length_error or bad_alloc") {
  std::vector<std::byte> huge_string(16, std::byte{0});
  net::detail::store_le(huge_string.data(), std::uint64_t{1} << 62, 8);
  CHECK_THROWS_WITH_AS(dd::decode_message<dd::PingReply>(huge_string, "ping reply"),
                       "malformed ping reply message (16 bytes): a string of 4611686018427387904 elements claimed with 8 "
                       "bytes left",
                       ds::InvalidArgument);
  std::vector<std::byte> commit(8 + 8 + 8, std::byte{0});
  net::detail::store_le(commit.data() + 16, ~std::uint64_t{0}, 8);  // 2^64 - 1 updates
  CHECK_THROWS_WITH_AS(dd::decode_message<dd::CommitMsg>(commit, "commit"),
                       "malformed commit message (24 bytes): a vector of 18446744073709551615 elements claimed with 0 "
                       "bytes left",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(ds::num_elements(ds::Shape{(std::int64_t{1} << 62) + 1, 4}),
                       "shape (4611686018427387905, 4): its number of elements overflows 64 bits", ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(ds::num_elements(ds::Shape{2, -3}), "shape (2, -3) has a negative dimension", ds::InvalidArgument);
  CHECK(ds::num_elements(ds::Shape{2, 3, 4}) == 24);
  CHECK(ds::num_elements(ds::Shape{}) == 1);
  // A dimension of 0 holds no elements, whatever the others multiply to; a negative one is still refused.
  CHECK(ds::num_elements(ds::Shape{std::int64_t{1} << 62, 4, 0}) == 0);
  CHECK(ds::checked_byte_size(ds::Shape{std::int64_t{1} << 62, 4, 0}, 8, "tensor") == 0);
  CHECK_THROWS_WITH_AS(ds::num_elements(ds::Shape{0, -1}), "shape (0, -1) has a negative dimension", ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(ds::checked_byte_size(ds::Shape{std::int64_t{1} << 62, 4}, 8, "tensor"),
                       "tensor: shape (4611686018427387904, 4) read from the wire is negative or too large", ds::InvalidArgument);
}

TEST_CASE("a stranger without the token is refused while training goes on; the refusal says only \"refused\"") {
  const auto ports = test_support::free_ports(3);
  const auto spec = one_ps_one_worker(ports);
  const std::map<std::string, std::string> env{{"DISTRIBUTE_CLUSTER_TOKEN", "s3cret"}};
  auto ps = test_support::spawn({env_path("DISTRIBUTE_PS_HELPER"), "ps", "0", spec.to_json()}, env);
  auto worker = test_support::spawn({env_path("DISTRIBUTE_PS_HELPER"), "worker", "0", spec.to_json()}, env);
  ds::ParameterServerStrategy strategy(std::make_shared<ds::SimpleClusterResolver>(spec, "chief", 0), {},
                                       ds::ParameterServerOptions{.cluster_token = "s3cret"});
  ds::ClusterCoordinator coordinator(strategy);
  auto scope = strategy.scope();
  ds::Variable<float> counter(0.0f, {.name = "counter"});
  for (int i = 0; i < 200; ++i) coordinator.schedule(&ps_test::slow_add_one, counter, 5);
  for (int task : {0, 1}) {  // the ps task, then the worker, while closures run
    RawPeer p(ports[task]);
    p.send(service_hello());  // without a token: refused before any challenge
    const net::Frame verdict = p.read();
    CHECK(verdict.header.type == net::FrameType::Reject);
    CHECK(std::string(dd::as_chars(verdict.payload)) == "refused");
    dd::RpcOptions none;
    none.cluster_token = "";
    none.connect_timeout = 2000ms;
    dd::RpcClient stranger(spec.task_address(task == 0 ? "ps" : "worker", 0), "task", none);
    CHECK_THROWS_WITH_AS(stranger.call(dd::RpcOp::Stop, {}),
                         fmt::format("task (127.0.0.1:{}) refused the connection (its log says why; the usual cause is a "
                                     "cluster token that differs or is missing: DISTRIBUTE_CLUSTER_TOKEN)",
                                     ports[task])
                             .c_str(),
                         dd::ConnectionLost);
  }
  coordinator.join();
  CHECK(counter.read_value() == 200.0f);
  coordinator.shutdown_cluster();
  drain(ps);
  CHECK(ps.output.find("refused connection from 127.0.0.1:") != std::string::npos);
  CHECK(ps.output.find("the peer did not present the cluster token") != std::string::npos);
  stop_child(worker);
  stop_child(ps);
}

TEST_CASE("a ds::Server will not listen beyond loopback without a token unless told insecure, then warns once; on loopback, or with a token, it starts quietly") {
  const auto ports = test_support::free_ports(3);
  auto spec_on = [&](const std::string& host) {
    return ds::ClusterSpec(ds::ClusterSpec::DenseJobs{{"chief", {fmt::format("127.0.0.1:{}", ports[2])}},
                                                      {"ps", {fmt::format("{}:{}", host, ports[0])}},
                                                      {"worker", {fmt::format("127.0.0.1:{}", ports[1])}}});
  };
  auto lines_of = [&](const std::string& host, const char* token, bool insecure = false) {
    Log log;
    ds::ServerOptions options;
    options.cluster_token = token;
    options.insecure = insecure;
    options.log = log.sink();
    { ds::Server server(spec_on(host), "ps", 0, "tcp", options); }
    std::lock_guard lock(log.mutex);
    return log.lines;
  };
  ::unsetenv("DISTRIBUTE_INSECURE");
  for (const char* host : {"0.0.0.0", "[::]"}) {
    const std::string address = fmt::format("{}:{}", host, ports[0]);
    CHECK_THROWS_WITH_AS(lines_of(host, ""),
                         fmt::format("/job:ps/replica:0/task:0/device:CPU:0 will not listen on {}, reachable from other "
                                     "machines, without a cluster token: anyone who can connect could join, run "
                                     "registered functions and read or change state. Set DISTRIBUTE_CLUSTER_TOKEN to "
                                     "the same secret for every task (distribute-launch does), listen on a loopback "
                                     "address, or accept the risk with the option insecure = true or "
                                     "DISTRIBUTE_INSECURE=1",
                                     address)
                             .c_str(),
                         ds::ClusterConfigError);
  }
  const auto open = lines_of("0.0.0.0", "", true);
  REQUIRE(open.size() == 1);
  CHECK(open[0] == fmt::format("WARNING: /job:ps/replica:0/task:0/device:CPU:0 listens on 0.0.0.0:{}, reachable from other "
                               "machines, without a cluster token (insecure, as chosen): anyone who can connect can "
                               "join, run registered functions and read or change state",
                               ports[0]));
  ::setenv("DISTRIBUTE_INSECURE", "1", 1);  // the same choice from the environment
  CHECK(lines_of("0.0.0.0", "").size() == 1);
  ::unsetenv("DISTRIBUTE_INSECURE");
  CHECK(lines_of("0.0.0.0", "s3cret").empty());
  CHECK(lines_of("127.0.0.1", "").empty());
}

TEST_CASE("a stranger against a cluster the launcher started without --token is refused: the launcher made a token") {
  const char* launcher = std::getenv("DISTRIBUTE_LAUNCH");
  if (launcher == nullptr) {
    MESSAGE("distribute-launch is not built: skipped");
    return;
  }
  auto job = test_support::spawn({launcher, "--ps", "1", "--workers", "1", "--no-chief", "--",
                                  env_path("DISTRIBUTE_PS_HELPER"), "tf-config"},
                                 {{"DISTRIBUTE_CLUSTER_TOKEN", ""}});
  std::string address;
  REQUIRE(wait_until([&] {
    drain(job);
    const auto at = job.output.find("serving ps at ");
    if (at == std::string::npos) return false;
    const auto end = job.output.find('\n', at);
    if (end == std::string::npos) return false;
    address = job.output.substr(at + 14, end - at - 14);
    return true;
  }, 30s));
  CHECK(job.output.find("--token") == std::string::npos);
  dd::RpcOptions none;
  none.cluster_token = "";
  none.connect_timeout = 2000ms;
  dd::RpcClient stranger(address, "ps 0", none);
  CHECK_THROWS_WITH_AS(stranger.call(dd::RpcOp::Stop, {}), doctest::Contains("refused the connection"), dd::ConnectionLost);
  ::kill(job.pid, SIGTERM);
  std::vector<test_support::Child> jobs{job};
  CHECK(test_support::wait_all(jobs, 30s));
  CHECK(jobs[0].output.find("the peer did not present the cluster token") != std::string::npos);
}

}  // TEST_SUITE

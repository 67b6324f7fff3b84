// MultiWorkerMirroredStrategy with real worker processes on 127.0.0.1 (tests/multi_worker_helper).
#define DISTRIBUTE_WITH_MULTI_WORKER
#define DISTRIBUTE_WITH_NET
#include <distribute/distribute.hpp>

#include <distribute/collective/detail/bootstrap.hpp>

#include <doctest/doctest.h>

#include <barrier>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../examples/common/logistic_model.hpp"
#include "support/multi_worker_cluster.hpp"
#include "support/processes.hpp"

namespace ds = distribute;
using namespace std::chrono_literals;
using test_support::start_workers;
using test_support::worker_names;

namespace {

void require_all_ok(std::vector<test_support::Child>& children) {
  const bool finished = test_support::wait_all(children, 120s);
  CHECK(finished);
  for (std::size_t i = 0; i < children.size(); ++i) {
    INFO("worker ", i, " output:\n", children[i].output);
    CHECK(children[i].status == 0);
    CHECK(children[i].output.find("OK") != std::string::npos);
  }
}

}  // namespace

TEST_CASE("2, 3 and 4 workers x 1 and 2 local replicas: collectives, reduce, gather, variables") {
  for (int workers : {2, 3, 4}) {
    for (int local : {1, 2}) {
      CAPTURE(workers);
      CAPTURE(local);
      auto children = start_workers(workers, "collectives", local);
      require_all_ok(children);
    }
  }
}

TEST_CASE("float16, bfloat16 and run-time-dtype values across workers, over TCP and through shared memory") {
  for (int workers : {2, 3}) {
    for (int local : {1, 2}) {
      for (const char* shared_memory_min_bytes : {"0", "1"}) {  // 0: TCP only; 1: shared memory for all
        CAPTURE(workers);
        CAPTURE(local);
        CAPTURE(shared_memory_min_bytes);
        auto children = start_workers(workers, "half", local, {{"TEST_SHARED_MEMORY_MIN_BYTES", shared_memory_min_bytes}});
        require_all_ok(children);
      }
    }
  }
}

TEST_CASE("IndexedSlices all-reduced across 1-3 workers x 1-4 local replicas equal the dense all-reduce, TCP and shared memory") {
  for (int workers : {1, 2, 3}) {
    for (int local : {1, 2, 3, 4}) {
      const char* shared = local % 2 ? "0" : "1";  // 0: TCP only; 1: shared memory for all
      CAPTURE(workers);
      CAPTURE(local);
      CAPTURE(shared);
      auto children = start_workers(workers, "sparse", local, {{"TEST_SHARED_MEMORY_MIN_BYTES", shared}});
      require_all_ok(children);
    }
  }
  // IndexedSlices of another dense shape on one worker: the same InvalidArgument everywhere.
  auto children = start_workers(3, "mismatch_sparse", 2, {{"TEST_TIMEOUT_SECONDS", "20"}});
  CHECK(test_support::wait_all(children, 60s));
  for (auto& c : children) {
    INFO(c.output);
    CHECK(c.status == 4);
    CHECK(c.output.find("InvalidArgument: all_reduce: value 0 is IndexedSlices of dense shape (7, 4) float32 on replica 0 "
                        "but IndexedSlices of dense shape (9, 4) float32 on replica 2") != std::string::npos);
  }
}

TEST_CASE("packing across workers: several values in small packs give the same exact results") {
  auto children = start_workers(3, "collectives", 2, {{"TEST_BYTES_PER_PACK", "64"}});
  require_all_ok(children);
}

TEST_CASE("no TF_CONFIG: a single-worker cluster behaves like MirroredStrategy") {
  std::vector<test_support::Child> one;
  one.push_back(test_support::spawn({test_support::multi_worker_helper_path(), "collectives", "3"}, {{"TF_CONFIG", ""}}));
  require_all_ok(one);
}

namespace {
// Starts 3 workers in an all-reduce loop, SIGKILLs one mid-collective, and checks every survivor
// throws PeerFailure naming it, promptly. `extra`: more environment for the workers.
void kill_one_worker_mid_all_reduce(int trials, unsigned seed, const std::map<std::string, std::string>& extra) {
  std::mt19937 rng(seed);
  for (int trial = 0; trial < trials; ++trial) {
    CAPTURE(trial);
    const int victim = static_cast<int>(rng() % 3);
    auto children = start_workers(3, "kill", 1, extra);
    // Wait until every worker is inside the all-reduce loop.
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    for (;;) {
      bool all_started = true;
      for (auto& c : children) {
        char buf[4096];
        ssize_t n;
        while ((n = read(c.out_fd, buf, sizeof buf)) > 0) c.output.append(buf, static_cast<std::size_t>(n));
        all_started = all_started && c.output.find("first all-reduce done") != std::string::npos;
      }
      if (all_started || std::chrono::steady_clock::now() > deadline) break;
      std::this_thread::sleep_for(5ms);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 50));
    kill(children[static_cast<std::size_t>(victim)].pid, SIGKILL);
    const auto killed_at = std::chrono::steady_clock::now();
    const bool finished = test_support::wait_all(children, 20s);
    const auto took = std::chrono::steady_clock::now() - killed_at;
    CHECK(finished);  // nobody hangs
    CHECK(took < 12s);  // within the heartbeat bound (10 s), in practice at once
    for (int i = 0; i < 3; ++i) {
      if (i == victim) continue;
      const auto& c = children[static_cast<std::size_t>(i)];
      INFO("worker ", i, " output:\n", c.output);
      CHECK(c.status == 3);
      CHECK(c.output.find("PeerFailure") != std::string::npos);
      CHECK(c.output.find("CollectiveTimeout") == std::string::npos);  // a lost peer, not a slow one
      CHECK(c.output.find(fmt::format("worker:{}", victim)) != std::string::npos);
    }
  }
}
}  // namespace

TEST_CASE("a worker SIGKILLed mid all-reduce: every survivor throws PeerFailure naming it (20 times)") {
  kill_one_worker_mid_all_reduce(20, 12345, {});
}

TEST_CASE("a worker SIGKILLed mid all-reduce with timeout_seconds set: still PeerFailure naming it (8 times)") {
  // The timeout bounds a stalled peer; a killed one is reported as lost, by name, before it.
  kill_one_worker_mid_all_reduce(8, 777, {{"TEST_TIMEOUT_SECONDS", "15"}});
}

TEST_CASE("workers calling all_reduce on other shapes or dtypes: a clear InvalidArgument on every worker, no hang") {
  for (const char* scenario : {"mismatch", "mismatch_dtype", "mismatch_half", "mismatch_shape"}) {
    CAPTURE(scenario);
    auto children = start_workers(3, scenario, 2, {{"TEST_TIMEOUT_SECONDS", "20"}});
    const auto started = std::chrono::steady_clock::now();
    CHECK(test_support::wait_all(children, 60s));
    CHECK(std::chrono::steady_clock::now() - started < 20s);  // the mismatch is seen, not timed out
    for (auto& c : children) {
      INFO(c.output);
      CHECK(c.status == 4);
      CHECK(c.output.find("InvalidArgument") != std::string::npos);
      CHECK(c.output.find("CollectiveTimeout") == std::string::npos);
      if (std::string_view(scenario) == "mismatch_dtype") {
        CHECK(c.output.find("float64") != std::string::npos);
        CHECK(c.output.find("float32") != std::string::npos);
      }
      if (std::string_view(scenario) == "mismatch_shape") {  // as many elements, other shapes
        CHECK(c.output.find("shapes #") != std::string::npos);
      }
      if (std::string_view(scenario) == "mismatch_half") {
        CHECK(c.output.find("float16") != std::string::npos);
        CHECK(c.output.find("bfloat16") != std::string::npos);
      }
    }
  }
}

TEST_CASE("mismatched collectives across workers: InvalidArgument on every worker") {
  auto children = start_workers(3, "mismatch", 1);
  CHECK(test_support::wait_all(children, 60s));
  for (auto& c : children) {
    INFO(c.output);
    CHECK(c.status == 4);
    CHECK(c.output.find("InvalidArgument") != std::string::npos);
  }
}

TEST_CASE("the demo on 3 workers ends with the same weights as on one device") {
  auto children = start_workers(3, "demo", 1);
  CHECK(test_support::wait_all(children, 120s));
  const auto data = demo::make_data(1000, 8, 7);
  demo::TrainConfig config{.epochs = 3, .global_batch = 64, .learning_rate = 0.5f};
  ds::OneDeviceStrategy<> one;
  const auto reference = demo::train(one, data, config);
  for (auto& c : children) {
    INFO(c.output);
    REQUIRE(c.status == 0);
    auto at = c.output.find("weights ");
    REQUIRE(at != std::string::npos);
    std::istringstream in(c.output.substr(at + 8));
    std::vector<float> w;
    float x;
    while (w.size() < reference.size() && in >> x) w.push_back(x);
    REQUIRE(w.size() == reference.size());
    float max_diff = 0;
    for (std::size_t k = 0; k < w.size(); ++k) max_diff = std::max(max_diff, std::abs(w[k] - reference[k]));
    CHECK(max_diff <= 1e-5f);
  }
}

TEST_CASE("configuration errors") {
  ds::TFConfigClusterResolver ps_task(R"({"cluster": {"worker": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"]},
                                          "task": {"type": "ps", "index": 0}})");
  auto resolver = std::make_shared<ds::TFConfigClusterResolver>(ps_task);
  CHECK_THROWS_WITH_AS(ds::MultiWorkerMirroredStrategy<>({}, resolver), doctest::Contains("this task is 'ps'"),
                       ds::ClusterConfigError);
  CHECK_THROWS_WITH_AS(ds::MultiWorkerMirroredStrategy<>({.implementation = ds::CommunicationImplementation::Nccl}),
                       doctest::Contains("NCCL needs the cuda backend"), ds::InvalidArgument);
}

TEST_CASE("the demo under distribute-launch -n 3 ends with the same weights as on one device") {
  const char* launcher = std::getenv("DISTRIBUTE_LAUNCH");
  REQUIRE_MESSAGE(launcher != nullptr, "DISTRIBUTE_LAUNCH is not set (run through meson test)");
  std::vector<test_support::Child> run;
  run.push_back(test_support::spawn({launcher, "-n", "3", "--timeout", "120", "--", test_support::multi_worker_helper_path(), "demo", "1"}, {}));
  CHECK(test_support::wait_all(run, 150s));
  INFO(run[0].output);
  REQUIRE(run[0].status == 0);
  const auto data = demo::make_data(1000, 8, 7);
  demo::TrainConfig config{.epochs = 3, .global_batch = 64, .learning_rate = 0.5f};
  ds::OneDeviceStrategy<> one;
  const auto reference = demo::train(one, data, config);
  for (int worker = 0; worker < 3; ++worker) {
    const std::string prefix = fmt::format("[worker:{}] weights ", worker);
    auto at = run[0].output.find(prefix);
    REQUIRE(at != std::string::npos);
    std::istringstream in(run[0].output.substr(at + prefix.size()));
    std::vector<float> w;
    float x;
    while (w.size() < reference.size() && in >> x) w.push_back(x);
    REQUIRE(w.size() == reference.size());
    float max_diff = 0;
    for (std::size_t k = 0; k < w.size(); ++k) max_diff = std::max(max_diff, std::abs(w[k] - reference[k]));
    CHECK(max_diff <= 1e-5f);
  }
}

TEST_CASE("the demo across two launchers (--nnodes 2, 2 workers each) ends with the same weights as on one device") {
  const char* launcher = std::getenv("DISTRIBUTE_LAUNCH");
  REQUIRE_MESSAGE(launcher != nullptr, "DISTRIBUTE_LAUNCH is not set (run through meson test)");
  const std::string port = std::to_string(test_support::free_ports(1)[0]);
  std::vector<test_support::Child> nodes;
  for (const char* rank : {"1", "0"}) {
    nodes.push_back(test_support::spawn({launcher, "--nnodes", "2", "--node-rank", rank, "--master-addr", "127.0.0.1",
                                         "--master-port", port, "--token", "demo-secret", "-n", "2", "--timeout", "120", test_support::multi_worker_helper_path(), "demo",
                                         "1"},
                                        {}));
  }
  CHECK(test_support::wait_all(nodes, 150s));
  const std::string output = nodes[0].output + nodes[1].output;
  INFO(output);
  REQUIRE(nodes[0].status == 0);
  REQUIRE(nodes[1].status == 0);
  const auto data = demo::make_data(1000, 8, 7);
  demo::TrainConfig config{.epochs = 3, .global_batch = 64, .learning_rate = 0.5f};
  ds::OneDeviceStrategy<> one;
  const auto reference = demo::train(one, data, config);
  for (int worker = 0; worker < 4; ++worker) {
    const std::string prefix = fmt::format("[worker:{}] weights ", worker);
    auto at = output.find(prefix);
    REQUIRE(at != std::string::npos);
    std::istringstream in(output.substr(at + prefix.size()));
    std::vector<float> w;
    float x;
    while (w.size() < reference.size() && in >> x) w.push_back(x);
    REQUIRE(w.size() == reference.size());
    float max_diff = 0;
    for (std::size_t k = 0; k < w.size(); ++k) max_diff = std::max(max_diff, std::abs(w[k] - reference[k]));
    CHECK(max_diff <= 1e-5f);
  }
}

// ---- in-process clusters: each worker is a thread with its own real net::Communicator -------

namespace {

std::vector<std::string> loopback_addresses(int n) {
  std::vector<std::string> out;
  for (int port : test_support::free_ports(n)) out.push_back(fmt::format("127.0.0.1:{}", port));
  return out;
}


// Runs fn(rank) on n threads at once; returns what each threw ("" for nothing), type and message.
template <class Fn>
std::vector<std::string> on_worker_threads(int n, Fn fn) {
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto& e = errors[static_cast<std::size_t>(r)];
      try {
        fn(r);
      } catch (const ds::InvalidArgument& x) {
        e = std::string("InvalidArgument: ") + x.what();
      } catch (const ds::ClusterConfigError& x) {
        e = std::string("ClusterConfigError: ") + x.what();
      } catch (const ds::Unavailable& x) {
        e = std::string("Unavailable: ") + x.what();
      } catch (const std::exception& x) {
        e = std::string("other: ") + x.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

std::unique_ptr<ds::net::CommunicatorLink> link_of(const std::vector<std::string>& addresses, int rank) {
  ds::net::CommunicatorOptions options;
  options.connect_timeout = 30s;
  options.operation_timeout = 30s;
  return std::make_unique<ds::net::CommunicatorLink>(
      std::make_unique<ds::net::Communicator>(addresses, rank, options, worker_names(static_cast<int>(addresses.size()))));
}

// A CrossWorkerLink that forwards to a real one and counts the all-reduces it carries.
class CountingLink final : public ds::core::CrossWorkerLink {
 public:
  explicit CountingLink(ds::core::CrossWorkerLink& inner) : inner_(&inner) {}
  int num_workers() const noexcept override { return inner_->num_workers(); }
  int worker_index() const noexcept override { return inner_->worker_index(); }
  void all_reduce(void* data, std::size_t count, ds::DType dtype, ds::ReduceOp op, std::uint32_t shapes = 0) override {
    ++all_reduces;
    inner_->all_reduce(data, count, dtype, op, shapes);
  }
  void all_gather(const void* data, std::size_t bytes, std::vector<std::byte>& out,
                  std::vector<std::size_t>& sizes) override {
    inner_->all_gather(data, bytes, out, sizes);
  }
  void broadcast(void* data, std::size_t bytes, int root) override { inner_->broadcast(data, bytes, root); }
  void barrier() override { inner_->barrier(); }
  int all_reduces = 0;

 private:
  ds::core::CrossWorkerLink* inner_;
};

// The composable core over a link the test owns (SyncStrategy's multi-worker constructor).
class LinkedStrategy : public ds::SyncStrategy<LinkedStrategy, ds::host, ds::SharedMemoryAllReduce> {
  using Base = ds::SyncStrategy<LinkedStrategy, ds::host, ds::SharedMemoryAllReduce>;

 public:
  LinkedStrategy(int local, ds::CommunicationOptions options, ds::core::CrossWorkerLink& link)
      : Base(ds::host::devices(local, "LinkedStrategy"), options, &link) {}
  std::string_view name() const noexcept override { return "LinkedStrategy"; }
};

std::shared_ptr<ds::ClusterResolver> resolver_for(const std::vector<std::string>& addresses, int index) {
  std::string workers;
  for (std::size_t i = 0; i < addresses.size(); ++i) workers += fmt::format("{}\"{}\"", i ? ", " : "", addresses[i]);
  return std::make_shared<ds::TFConfigClusterResolver>(fmt::format(
      R"({{"cluster": {{"worker": [{}]}}, "task": {{"type": "worker", "index": {}}}}})", workers, index));
}

}  // namespace

TEST_CASE("communication_implementation(): AUTO and RING resolve to RING on the host backend, NCCL and MPI (not compiled in) are refused") {
  using Setup = ds::strategy::detail::MultiWorkerSetup;
  using CI = ds::CommunicationImplementation;
  static_assert(!ds::collective::spans_workers_v<ds::SharedMemoryAllReduce>);
  CHECK(Setup::resolve<ds::host>(CI::Auto) == CI::Ring);
  CHECK(Setup::resolve<ds::host>(CI::Ring) == CI::Ring);
  CHECK_THROWS_WITH_AS(Setup::resolve<ds::host>(CI::Nccl), doctest::Contains("NCCL needs the cuda backend"),
                       ds::InvalidArgument);
  // This file is compiled without MPI (tests/test_mpi.cpp runs the helper built with it).
  CHECK_THROWS_WITH_AS(ds::MultiWorkerMirroredStrategy<>({.implementation = CI::Mpi}),
                       "MultiWorkerMirroredStrategy: CommunicationImplementation MPI is not compiled into this program: "
                       "build with MPI's compiler wrapper (mpicxx) and -DDISTRIBUTE_WITH_MPI, or link the CMake target "
                       "distribute::mpi (meson: distribute_mpi_dep)",
                       ds::InvalidArgument);
  CHECK(ds::to_string(CI::Mpi) == "MPI");
  // A single-worker cluster reports its resolved choice too.
  auto alone = std::make_shared<ds::TFConfigClusterResolver>(std::string_view(""));
  CHECK(ds::MultiWorkerMirroredStrategy<>({}, alone).communication_implementation() == CI::Ring);
  // Two real workers: AUTO and RING are RING, and an all-reduce crosses them.
  for (CI requested : {CI::Auto, CI::Ring}) {
    CAPTURE(ds::to_string(requested));
    const auto addresses = loopback_addresses(2);
    std::vector<CI> resolved(2, CI::Auto);
    std::vector<float> sums(2, 0.0f);
    const auto errors = on_worker_threads(2, [&](int r) {
      ds::MultiWorkerMirroredStrategy<> s({.timeout_seconds = 30.0, .implementation = requested},
                                          resolver_for(addresses, r));
      resolved[static_cast<std::size_t>(r)] = s.communication_implementation();
      auto out = s.run([](ds::ReplicaContext& ctx) { return ctx.all_reduce("sum", float(ctx.replica_id_in_sync_group() + 1)); });
      sums[static_cast<std::size_t>(r)] = out[0];
    });
    for (int r = 0; r < 2; ++r) {
      CHECK(errors[static_cast<std::size_t>(r)] == "");
      CHECK(resolved[static_cast<std::size_t>(r)] == CI::Ring);
      CHECK(sums[static_cast<std::size_t>(r)] == 3.0f);
    }
  }
}

TEST_CASE("NCCL bootstrap without a GPU: the chief's 128-byte id reaches every worker intact over real communicators") {
  struct UniqueIdLike {  // the size and kind of an ncclUniqueId (char internal[128])
    char internal[128];
  };
  for (int n : {2, 3}) {
    CAPTURE(n);
    const auto addresses = loopback_addresses(n);
    UniqueIdLike made{};
    std::mt19937 rng(99);
    for (char& c : made.internal) c = static_cast<char>(rng());
    std::vector<UniqueIdLike> got(static_cast<std::size_t>(n));
    std::vector<int> made_calls(static_cast<std::size_t>(n), 0);
    const auto errors = on_worker_threads(n, [&](int r) {
      auto link = link_of(addresses, r);
      got[static_cast<std::size_t>(r)] = ds::collective::detail::broadcast_from_chief<UniqueIdLike>(
          *link,
          [&] {
            ++made_calls[static_cast<std::size_t>(r)];
            return made;
          },
          "the test id");
      ds::collective::detail::check_same_on_every_worker(*link, 2, "local GPUs");  // agreeing workers pass
    });
    for (int r = 0; r < n; ++r) {
      CHECK(errors[static_cast<std::size_t>(r)] == "");
      CHECK(std::memcmp(got[static_cast<std::size_t>(r)].internal, made.internal, sizeof made.internal) == 0);
      CHECK(made_calls[static_cast<std::size_t>(r)] == (r == 0 ? 1 : 0));  // only the chief makes it
    }
  }
  SUBCASE("the chief fails to make the id: it rethrows its error, the others are told (no hang)") {
    const auto addresses = loopback_addresses(3);
    const auto errors = on_worker_threads(3, [&](int r) {
      auto link = link_of(addresses, r);
      (void)ds::collective::detail::broadcast_from_chief<UniqueIdLike>(
          *link, []() -> UniqueIdLike { throw ds::InvalidArgument("ncclGetUniqueId failed: test"); }, "the NCCL unique id");
    });
    CHECK(errors[0] == "InvalidArgument: ncclGetUniqueId failed: test");
    for (int r = 1; r < 3; ++r) {
      CHECK(errors[static_cast<std::size_t>(r)] ==
            "Unavailable: the NCCL unique id: the chief (worker 0) failed to create it; see the chief's error");
    }
  }
  SUBCASE("workers that disagree on their local GPU count, or on the call, all throw InvalidArgument") {
    const auto addresses = loopback_addresses(2);
    std::vector<std::string> call_errors(2);
    const auto errors = on_worker_threads(2, [&](int r) {
      auto link = link_of(addresses, r);
      try {
        ds::collective::detail::check_same_call_on_every_worker(*link, r == 0 ? "all_reduce(SUM, device float32 [3])"
                                                                  : "all_reduce(SUM, device float32 [5])");
      } catch (const ds::InvalidArgument& e) {
        call_errors[static_cast<std::size_t>(r)] = e.what();
      }
      ds::collective::detail::check_same_on_every_worker(*link, r == 0 ? 2 : 1, "the number of local GPUs");
    });
    for (int r = 0; r < 2; ++r) {
      CHECK(errors[static_cast<std::size_t>(r)] ==
            "InvalidArgument: the number of local GPUs must be the same on every worker (worker 0: 2, worker 1: 1)");
      CHECK(call_errors[static_cast<std::size_t>(r)] ==
            "worker 0 called all_reduce(SUM, device float32 [3]) but worker 1 called all_reduce(SUM, device float32 "
            "[5]): every worker must issue the same collectives in the same order");
    }
  }
}

TEST_CASE("batch_reduce_to across workers packs its values: one collective per pack, exact results") {
  // bytes_per_pack 0: one pack per element type (float32: a and b; float64: c) = 2 collectives.
  // bytes_per_pack 2: taken in reverse order, b's pack (4 bytes) exceeds 2 bytes, so a starts
  // another = 3. A large bytes_per_pack is one pack per type again = 2.
  for (const auto& pack_case : {std::pair<std::size_t, int>{0, 2}, {2, 3}, {1 << 20, 2}}) {
    // Named copies, not a structured binding: CAPTURE and the lambda take them, and clang 14 cannot.
    const std::size_t bytes_per_pack = pack_case.first;
    const int expected = pack_case.second;
    CAPTURE(bytes_per_pack);
    const auto addresses = loopback_addresses(2);
    std::vector<int> batched(2, -1), separate(2, -1), mean_calls(2, -1);
    std::vector<std::string> wrong(2);
    const auto errors = on_worker_threads(2, [&](int r) {
      auto link = link_of(addresses, r);
      CountingLink counting(*link);
      LinkedStrategy s(2, {.bytes_per_pack = bytes_per_pack}, counting);
      auto [a, b, c] = s.run([](ds::ReplicaContext& ctx) {
        const int id = ctx.replica_id_in_sync_group();  // 0..3 over the two workers
        return std::make_tuple(std::vector<float>{float(id), 1.0f}, float(2 * id), std::vector<double>{double(id), 0.5});
      });
      counting.all_reduces = 0;
      auto [ra, rb, rc] = s.extended().batch_reduce_to("sum", a, b, c);
      batched[static_cast<std::size_t>(r)] = counting.all_reduces;
      if (ra != std::vector<float>{6, 4} || rb != 12.0f || rc != std::vector<double>{6, 2}) wrong[static_cast<std::size_t>(r)] += "sum ";
      counting.all_reduces = 0;
      auto [ma, mc] = s.extended().batch_reduce_to("mean", a, c);
      mean_calls[static_cast<std::size_t>(r)] = counting.all_reduces;
      if (ma != std::vector<float>{1.5f, 1} || mc != std::vector<double>{1.5, 0.5}) wrong[static_cast<std::size_t>(r)] += "mean ";
      counting.all_reduces = 0;  // the counter does see separate collectives: three reduces are three
      (void)s.reduce("sum", a), (void)s.reduce("sum", b), (void)s.reduce("sum", c);
      separate[static_cast<std::size_t>(r)] = counting.all_reduces;
    });
    for (int r = 0; r < 2; ++r) {
      CHECK(errors[static_cast<std::size_t>(r)] == "");
      CHECK(wrong[static_cast<std::size_t>(r)] == "");
      CHECK(batched[static_cast<std::size_t>(r)] == expected);
      CHECK(mean_calls[static_cast<std::size_t>(r)] == 2);  // float32 and float64 never share a pack
      CHECK(separate[static_cast<std::size_t>(r)] == 3);
    }
  }
}

TEST_CASE("CommunicationOptions::cluster_token: a wrong or missing token fails clearly, the right one joins") {
  // Each time worker 1 first tries to join with a bad token and is refused by worker 0, then
  // joins with the good one and the two all-reduce.
  struct Case {
    const char* name;
    std::optional<std::string> good;      // both workers' option
    std::optional<std::string> bad;       // the impostor's option
    const char* environment;              // DISTRIBUTE_CLUSTER_TOKEN, or null
    const char* expected;                 // the impostor's error after "worker:0 at ADDRESS "
  };
  const Case cases[] = {
      {"option: a wrong token", std::string("right token"), std::string("wrong token"), nullptr,
       "failed to prove it holds the cluster token (the tokens differ)"},
      {"option: no token", std::string("right token"), std::string(""), nullptr,
       "refused worker:1 (its log says why; cluster specs or cluster tokens that differ are the usual cause)"},
      {"unset option: the environment's token; an option overrides it", std::nullopt, std::string("other token"),
       "token from the environment", "failed to prove it holds the cluster token (the tokens differ)"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    if (c.environment) setenv("DISTRIBUTE_CLUSTER_TOKEN", c.environment, 1);
    else unsetenv("DISTRIBUTE_CLUSTER_TOKEN");
    const auto addresses = loopback_addresses(2);
    std::string impostor_error = "(the impostor joined)";
    std::vector<float> sums(2, 0.0f);
    const auto errors = on_worker_threads(2, [&](int r) {
      ds::CommunicationOptions good{.timeout_seconds = 30.0, .cluster_token = c.good};
      if (r == 1) {
        std::this_thread::sleep_for(100ms);
        ds::CommunicationOptions bad = good;
        bad.cluster_token = c.bad;
        try {
          ds::MultiWorkerMirroredStrategy<> impostor(bad, resolver_for(addresses, 1));
        } catch (const ds::ClusterConfigError& e) {
          impostor_error = e.what();
        }
      }
      ds::MultiWorkerMirroredStrategy<> s(good, resolver_for(addresses, r));
      CHECK(s.communication_options().cluster_token == c.good);
      auto out = s.run([](ds::ReplicaContext& ctx) { return ctx.all_reduce("sum", float(ctx.replica_id_in_sync_group() + 1)); });
      sums[static_cast<std::size_t>(r)] = out[0];
    });
    unsetenv("DISTRIBUTE_CLUSTER_TOKEN");
    CHECK(impostor_error == fmt::format("worker:0 at {} {}", addresses[0], c.expected));
    for (int r = 0; r < 2; ++r) {
      CHECK(errors[static_cast<std::size_t>(r)] == "");
      CHECK(sums[static_cast<std::size_t>(r)] == 3.0f);
    }
  }
}

#if defined(__linux__)
TEST_CASE("CommunicationOptions::shared_memory_min_bytes reaches the communicator") {
  // Each worker that uses shared memory maps the segment once; it has no name in /dev/shm, so
  // /proc/self/maps shows it as "/memfd:distribute-... (deleted)".
  auto segments_mapped = [] {
    std::ifstream maps("/proc/self/maps");
    int count = 0;
    for (std::string line; std::getline(maps, line);) count += line.find("/memfd:distribute-") != std::string::npos ? 1 : 0;
    return count;
  };
  for (const std::optional<std::size_t> min_bytes : {std::optional<std::size_t>{}, std::optional<std::size_t>{0}}) {
    CAPTURE(min_bytes.has_value());
    const auto addresses = loopback_addresses(2);
    const int before = segments_mapped();
    int during = -1;
    std::barrier sync(2);
    const auto errors = on_worker_threads(2, [&](int r) {
      ds::MultiWorkerMirroredStrategy<> s({.timeout_seconds = 30.0, .shared_memory_min_bytes = min_bytes}, resolver_for(addresses, r));
      auto out = s.run([](ds::ReplicaContext& ctx) { return ctx.all_reduce("sum", float(ctx.replica_id_in_sync_group() + 1)); });
      CHECK(out[0] == 3.0f);
      sync.arrive_and_wait();  // both strategies exist
      if (r == 0) during = segments_mapped() - before;
      sync.arrive_and_wait();
    });
    for (const auto& e : errors) CHECK(e == "");
    CHECK(during == (min_bytes ? 0 : 2));
    CHECK(segments_mapped() == before);  // unmapped with the strategies
  }
}

TEST_CASE("CommunicationOptions::loopback_congestion_control reaches the communicator") {
  // Worker 0's listening socket refuses the name at once, before any peer is awaited.
  const auto addresses = loopback_addresses(2);
  CHECK_THROWS_WITH_AS(ds::MultiWorkerMirroredStrategy<>({.loopback_congestion_control = "no-such-cc"}, resolver_for(addresses, 0)),
                       doctest::Contains("loopback_congestion_control 'no-such-cc' is refused by the kernel"),
                       ds::InvalidArgument);
}
#endif

// reduce_scatter, all_to_all, broadcast and all_reduce_async of MultiWorkerMirroredStrategy with
// real worker processes on 127.0.0.1 (tests/multi_worker_helper is one worker).
#define DISTRIBUTE_WITH_MULTI_WORKER
#define DISTRIBUTE_WITH_NET
#include <distribute/distribute.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <map>
#include <numeric>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <unistd.h>

#include "support/multi_worker_cluster.hpp"
#include "support/processes.hpp"

namespace ds = distribute;

using namespace std::chrono_literals;
using test_support::start_workers;

TEST_CASE("reduce_scatter, all_to_all and broadcast: 2-4 workers x 1-2 local replicas, over TCP and shared memory") {
  for (const char* shm : {"0", "4096"}) {  // 0: TCP only; 4096: buffers of 4 KiB and more through shared memory
    for (int workers = 2; workers <= 4; ++workers) {
      for (int local = 1; local <= 2; ++local) {
        CAPTURE(shm);
        CAPTURE(workers);
        CAPTURE(local);
        auto children = start_workers(workers, "scatter", local, {{"TEST_SHARED_MEMORY_MIN_BYTES", shm}});
        CHECK(test_support::wait_all(children, 120s));
        for (auto& c : children) {
          INFO(c.output);
          CHECK(c.status == 0);
          CHECK(c.output.find("OK") != std::string::npos);
        }
      }
    }
  }
}

TEST_CASE("reduce_scatter and all_to_all mismatched across workers: InvalidArgument on every worker, no hang") {
  const std::map<std::string, std::string> expect = {
      {"mismatch_reduce_scatter", "shapes #"},
      {"mismatch_all_to_all_count", "passed 5 values but there are 4 replicas in sync"},
      {"mismatch_all_to_all_dtype", "is float64 but value 0 of replica 0 is float32"},
  };
  for (const auto& [scenario_name, text] : expect) {
    const std::string& scenario = scenario_name;  // clang 14 cannot capture a structured binding (INFO's lambda)
    INFO(scenario);
    auto children = start_workers(2, scenario, 2, {{"TEST_TIMEOUT_SECONDS", "20"}});
    const auto started = std::chrono::steady_clock::now();
    CHECK(test_support::wait_all(children, 60s));
    CHECK(std::chrono::steady_clock::now() - started < 20s);  // seen, not timed out
    for (auto& c : children) {
      INFO(c.output);
      CHECK(c.status == 4);
      CHECK(c.output.find(text) != std::string::npos);
    }
  }
}

TEST_CASE("all_reduce_async across 2 and 3 workers x 1 and 2 local replicas: 6 in flight per step, exact sums") {
  for (int workers = 2; workers <= 3; ++workers) {
    for (int local = 1; local <= 2; ++local) {
      CAPTURE(workers);
      CAPTURE(local);
      auto children = start_workers(workers, "async", local);
      CHECK(test_support::wait_all(children, 120s));
      for (auto& c : children) {
        INFO(c.output);
        CHECK(c.status == 0);
        CHECK(c.output.find("OK") != std::string::npos);
      }
    }
  }
}

TEST_CASE("a worker SIGKILLed with 4 all_reduce_async in flight: every survivor's wait() throws PeerFailure (10 times)") {
  for (int trial = 0; trial < 10; ++trial) {
    CAPTURE(trial);
    const int victim = trial % 3;
    auto children = start_workers(3, "async_kill", 1, {{"TEST_TIMEOUT_SECONDS", "30"}});
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    for (bool all_started = false; !all_started && std::chrono::steady_clock::now() < deadline;) {
      all_started = true;
      for (auto& c : children) {
        char buf[4096];
        ssize_t got;
        while ((got = read(c.out_fd, buf, sizeof buf)) > 0) c.output.append(buf, static_cast<std::size_t>(got));
        all_started = all_started && c.output.find("first step done") != std::string::npos;
      }
      std::this_thread::sleep_for(5ms);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(7 * trial));
    kill(children[static_cast<std::size_t>(victim)].pid, SIGKILL);
    const auto killed_at = std::chrono::steady_clock::now();
    CHECK(test_support::wait_all(children, 30s));  // nobody hangs
    CHECK(std::chrono::steady_clock::now() - killed_at < 12s);
    for (int i = 0; i < 3; ++i) {
      if (i == victim) continue;
      const auto& c = children[static_cast<std::size_t>(i)];
      INFO("worker ", i, " output:\n", c.output);
      CHECK(c.status == 3);
      CHECK(c.output.find("wait() threw PeerFailure") != std::string::npos);
      CHECK(c.output.find(fmt::format("worker:{}", victim)) != std::string::npos);
    }
  }
}

// ---- net::Communicator::reduce_scatter and all_to_all, ranks as threads over real sockets ----

namespace {
// Runs fn(rank) for each of n ranks, each in a thread with its own Communicator; returns what
// each threw ("" for none).
template <class F>
std::vector<std::string> run_ranks(int n, F&& fn) {
  const auto ports = test_support::free_ports(n);
  std::vector<std::string> addresses, errors(static_cast<std::size_t>(n));
  for (int p : ports) addresses.push_back(fmt::format("127.0.0.1:{}", p));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        ds::net::CommunicatorOptions options;
        options.shared_memory_min_bytes = 0;  // TCP: the shared-memory path is the all-reduce's
        ds::net::Communicator comm(addresses, r, options);
        fn(comm, r);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}
}  // namespace

TEST_CASE("net::Communicator::reduce_scatter: uneven segments (one empty), SUM and MEAN, exact; chunked") {
  for (int n = 2; n <= 4; ++n) {
    CAPTURE(n);
    // Segment k has 3k elements (segment 0 empty); element e of rank r is r * 100 + e.
    std::vector<std::size_t> counts;
    for (int k = 0; k < n; ++k) counts.push_back(static_cast<std::size_t>(3 * k) + (k == n - 1 ? 200000 : 0));
    std::vector<std::string> problems(static_cast<std::size_t>(n));
    const auto errors = run_ranks(n, [&](ds::net::Communicator& comm, int r) {
      std::size_t total = 0, begin = 0;
      for (int k = 0; k < n; ++k) {
        if (k < r) begin += counts[static_cast<std::size_t>(k)];
        total += counts[static_cast<std::size_t>(k)];
      }
      for (auto op : {ds::ReduceOp::Sum, ds::ReduceOp::Mean}) {
        std::vector<double> v(total);
        for (std::size_t e = 0; e < total; ++e) v[e] = r * 100.0 + static_cast<double>(e);
        comm.reduce_scatter(v.data(), counts, ds::DType::F64, op);
        for (std::size_t e = begin; e < begin + counts[static_cast<std::size_t>(r)]; ++e) {
          // sum over ranks of (rank * 100 + e); MEAN: that over n
          const double sum = 100.0 * n * (n - 1) / 2 + static_cast<double>(n) * static_cast<double>(e);
          if (v[e] != (op == ds::ReduceOp::Sum ? sum : sum / n)) {
            problems[static_cast<std::size_t>(r)] = fmt::format("element {}: {} (op {})", e, v[e], op);
            break;
          }
        }
      }
    });
    for (int r = 0; r < n; ++r) {
      CHECK(errors[static_cast<std::size_t>(r)] == "");
      CHECK(problems[static_cast<std::size_t>(r)] == "");
    }
  }
}

TEST_CASE("net::Communicator::all_to_all: blocks of every size between every pair, exact; argument errors") {
  const int n = 3;
  std::vector<std::string> problems(n);
  // Rank r sends (r + 1) * (k + 1) * 1000 bytes of value r * 16 + k to rank k.
  auto bytes = [](int from, int to) { return static_cast<std::size_t>((from + 1) * (to + 1) * 1000); };
  const auto errors = run_ranks(n, [&](ds::net::Communicator& comm, int r) {
    std::vector<std::size_t> send_bytes, recv_bytes;
    std::vector<std::byte> send;
    for (int k = 0; k < n; ++k) {
      send_bytes.push_back(bytes(r, k));
      recv_bytes.push_back(bytes(k, r));
      send.insert(send.end(), bytes(r, k), static_cast<std::byte>(r * 16 + k));
    }
    std::vector<std::byte> recv(std::accumulate(recv_bytes.begin(), recv_bytes.end(), std::size_t{0}));
    comm.all_to_all(send.data(), send_bytes, recv.data(), recv_bytes);
    std::size_t at = 0;
    for (int k = 0; k < n; ++k) {
      for (std::size_t b = 0; b < bytes(k, r); ++b) {
        if (recv[at + b] != static_cast<std::byte>(k * 16 + r)) {
          problems[static_cast<std::size_t>(r)] = fmt::format("byte {} from rank {}", b, k);
          break;
        }
      }
      at += bytes(k, r);
    }
    if (r == 0) {  // argument errors: thrown before anything is sent, the communicator stays usable
      const std::vector<std::size_t> two{1, 1};
      std::vector<float> v(2);
      try {
        comm.reduce_scatter(v.data(), two, ds::DType::F32, ds::ReduceOp::Sum);
        problems[0] += "; no error for 2 counts";
      } catch (const ds::InvalidArgument& e) {
        if (std::string(e.what()) != "reduce_scatter: 2 counts for a cluster of 3") problems[0] += e.what();
      }
      try {
        comm.reduce_scatter(nullptr, std::vector<std::size_t>{1, 0, 0}, ds::DType::F32, ds::ReduceOp::Sum);
        problems[0] += "; no error for null data";
      } catch (const ds::InvalidArgument& e) {
        if (std::string(e.what()) != "reduce_scatter: data is null but count is 1") problems[0] += e.what();
      }
      try {
        comm.all_to_all(send.data(), two, recv.data(), send_bytes);
        problems[0] += "; no error for 2 sizes";
      } catch (const ds::InvalidArgument& e) {
        if (std::string(e.what()) != "all_to_all: 2 send and 3 receive sizes for a cluster of 3") problems[0] += e.what();
      }
      try {
        comm.all_to_all(nullptr, send_bytes, recv.data(), recv_bytes);
        problems[0] += "; no error for a null buffer";
      } catch (const ds::InvalidArgument& e) {
        if (std::string(e.what()) != "all_to_all: a buffer is null") problems[0] += e.what();
      }
    }
    comm.barrier();
  });
  for (int r = 0; r < n; ++r) {
    CHECK(errors[static_cast<std::size_t>(r)] == "");
    CHECK(problems[static_cast<std::size_t>(r)] == "");
  }
}

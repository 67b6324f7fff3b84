// Rows applied per second by one ps task, against the bound of this machine: a single-threaded
// in-memory loop doing the same scatter_add (a plain loop over the rows) on a table of the same size.
//
// One ps task (this program, started again in that role) holds a float32 table; `clients` threads
// of this process each send scatter_add calls of `batch` random rows to it, the calls of different
// threads in flight together. The ps task applies each call under its table's lock on its network
// thread, so rows/s is that thread's rate; the figure is checked against the task's own counter
// (distribute_rows_updated_total on /metrics).
//   bench_ps_rows [rows 1000000] [width 32] [batch 1024] [seconds 5] [clients 3]
// Prints a table; not a Google Benchmark program, because it needs its own processes.
#define DISTRIBUTE_WITH_PS
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <distribute/distribute.hpp>

#include "../tests/support/http_get.hpp"   // a task's /metrics, as the tests read it
#include "../tests/support/processes.hpp"  // free loopback ports, as the tests pick them

namespace ds = distribute;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

/// `batch` random rows of a table of `rows` rows, and their values, for call `k` of a client.
struct Call {
  std::vector<std::int64_t> ids;
  std::vector<float> values;
};
std::vector<Call> make_calls(std::int64_t rows, std::int64_t width, std::int64_t batch, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::int64_t> pick(0, rows - 1);
  std::vector<Call> calls(16);
  for (auto& c : calls) {
    for (std::int64_t i = 0; i < batch; ++i) c.ids.push_back(pick(rng));
    c.values.assign(static_cast<std::size_t>(batch * width), 1.0f);
  }
  return calls;
}

double counter(int port, const std::string& name) {
  const std::string text = test_support::http_get(port, "/metrics");
  const auto at = text.find("\n" + name + "{");
  if (at == std::string::npos) return 0;
  const auto end = text.find('\n', at + 1);
  const auto line = text.substr(at + 1, end - at - 1);
  return std::stod(line.substr(line.rfind(' ') + 1));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--ps") {  // the ps task
    ds::Server server(ds::ClusterSpec::from_json(argv[3]), "ps", std::atoi(argv[2]));
    server.join();
    return 0;
  }
  const std::int64_t rows = argc > 1 ? std::atoll(argv[1]) : 1'000'000;
  const std::int64_t width = argc > 2 ? std::atoll(argv[2]) : 32;
  const std::int64_t batch = argc > 3 ? std::atoll(argv[3]) : 1024;
  const double seconds = argc > 4 ? std::atof(argv[4]) : 5.0;
  const int clients = argc > 5 ? std::atoi(argv[5]) : 3;
  if (rows < 1 || width < 1 || batch < 1 || !(seconds > 0) || clients < 1) {
    std::fprintf(stderr, "usage: bench_ps_rows [rows] [width] [batch] [seconds] [clients] (all positive)\n");
    return 2;
  }
  const auto ports = test_support::free_ports(2);
  ds::ClusterSpec::DenseJobs jobs;
  jobs["chief"] = {fmt::format("127.0.0.1:{}", ports[1])};
  jobs["ps"] = {fmt::format("127.0.0.1:{}", ports[0])};
  jobs["worker"] = {"127.0.0.1:1"};  // none runs: this program calls the ps task itself
  const ds::ClusterSpec spec(jobs);
  const pid_t ps = fork();
  if (ps == 0) {
    const std::string json = spec.to_json();
    execl("/proc/self/exe", argv[0], "--ps", "0", json.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int rc = 0;
  try {
    const double row_bytes = static_cast<double>(width) * sizeof(float);
    std::printf("rows applied per second by scatter_add: table %lld x %lld float32, %lld rows per call\n",
                static_cast<long long>(rows), static_cast<long long>(width), static_cast<long long>(batch));
    std::printf("%-46s %14s %12s\n", "case", "rows/s", "MB/s of rows");

    // The bound: one thread applying the same calls to a table in its own memory.
    {
      std::vector<float> table(static_cast<std::size_t>(rows * width), 0.0f);
      const auto calls = make_calls(rows, width, batch, 1);
      std::int64_t applied = 0;
      const auto t = std::chrono::steady_clock::now();
      for (std::size_t k = 0; seconds_since(t) < seconds; ++k) {
        const Call& c = calls[k % calls.size()];
        for (std::size_t i = 0; i < c.ids.size(); ++i) {  // a plain loop, not the library's kernel
          float* row = table.data() + c.ids[i] * width;
          const float* add = c.values.data() + static_cast<std::int64_t>(i) * width;
          for (std::int64_t k = 0; k < width; ++k) row[k] += add[k];
        }
        applied += batch;
      }
      const double r = static_cast<double>(applied) / seconds_since(t);
      std::printf("%-46s %14.0f %12.1f\n", "in-memory loop, one thread (the bound)", r, r * row_bytes / 1e6);
      std::fflush(stdout);
    }

    ds::ParameterServerStrategy strategy(std::make_shared<ds::SimpleClusterResolver>(spec, "chief", 0));
    auto scope = strategy.scope();
    ds::Variable<ds::Tensor<float>> table(ds::Shape{rows, width}, ds::Initializer::zeros(), {.name = "table"});
    const ds::core::RemoteHandle handle = *table.remote_handle();
    const double before = counter(ports[0], "distribute_rows_updated_total");
    std::atomic<bool> stop{false};
    std::atomic<std::int64_t> sent{0};
    std::vector<std::thread> threads;
    const auto t = std::chrono::steady_clock::now();
    for (int c = 0; c < clients; ++c) {
      threads.emplace_back([&, c] {
        ds::ps::detail::PsClientStore store(spec, {});  // a connection of its own
        const auto calls = make_calls(rows, width, batch, static_cast<std::uint64_t>(c) + 2);
        for (std::size_t k = 0; !stop.load(); ++k) {
          const Call& call = calls[k % calls.size()];
          ds::core::RowsUpdate u;
          u.kind = ds::core::RemoteUpdate::ScatterAdd;
          u.rows = call.ids;
          u.values = std::as_bytes(std::span(call.values));
          store.update_rows(handle.task, handle.key, u);
          sent += batch;
        }
      });
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    stop = true;
    for (auto& th : threads) th.join();
    const double elapsed = seconds_since(t);
    const double applied = counter(ports[0], "distribute_rows_updated_total") - before;
    if (applied != static_cast<double>(sent.load())) {
      std::fprintf(stderr, "the ps task counted %.0f rows, the clients sent %lld\n", applied, static_cast<long long>(sent.load()));
      rc = 1;
    }
    const double r = applied / elapsed;
    std::printf("%-46s %14.0f %12.1f\n", fmt::format("one ps task, {} clients over loopback", clients).c_str(), r,
                r * row_bytes / 1e6);
    // Every row added 1.0 to each of its elements: the table holds how many times each was hit.
    const auto sum = table.read_value();
    double total = 0;
    for (float x : sum) total += x;
    if (total != applied * static_cast<double>(width)) {
      std::fprintf(stderr, "the table adds up to %.0f, %.0f rows x %lld were applied\n", total, applied,
                   static_cast<long long>(width));
      rc = 1;
    }
    ds::ps::detail::PsClientStore(spec, {}).stop_all();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_ps_rows: %s\n", e.what());
    rc = 1;
  }
  kill(ps, SIGKILL);
  waitpid(ps, nullptr, 0);
  return rc;
}

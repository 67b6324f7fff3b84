// Parameter-server throughput over loopback: 2 ps tasks and 3 workers (this program, started again
// in those roles), and this process as the coordinator. Reports closures/s of an empty function
// and variable updates/s (one assign_add of a 1 KiB or 1 MiB float32 variable per closure).
//   bench_ps_throughput [closures]         (default 3000; the 1 MiB case runs a tenth of that)
// Prints a table; not a Google Benchmark program, because it needs its own processes.
#define DISTRIBUTE_WITH_PS
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <distribute/distribute.hpp>

#include "../tests/support/processes.hpp"  // free loopback ports, as the tests pick them

namespace ds = distribute;

namespace {

void empty_closure() {}
void add_to(ds::Variable<std::vector<float>> v, std::vector<float> delta) { v.assign_add(delta); }
DISTRIBUTE_REMOTE_FUNCTION(empty_closure);
DISTRIBUTE_REMOTE_FUNCTION(add_to);

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 5 && std::string(argv[1]) == "--task") {  // a ps or worker task
    ds::Server server(ds::ClusterSpec::from_json(argv[4]), argv[2], std::atoi(argv[3]));
    server.join();
    return 0;
  }
  const int closures = argc > 1 ? std::atoi(argv[1]) : 3000;
  const int num_ps = 2, num_workers = 3;
  const auto ports = test_support::free_ports(num_ps + num_workers + 1);
  ds::ClusterSpec::DenseJobs jobs;
  auto addr = [&](int i) { return fmt::format("127.0.0.1:{}", ports[static_cast<std::size_t>(i)]); };
  jobs["chief"] = {addr(num_ps + num_workers)};
  for (int i = 0; i < num_ps; ++i) jobs["ps"].push_back(addr(i));
  for (int i = 0; i < num_workers; ++i) jobs["worker"].push_back(addr(num_ps + i));
  const ds::ClusterSpec spec(jobs);
  std::vector<pid_t> children;
  auto start = [&](const char* job, int index) {
    const pid_t pid = fork();
    if (pid == 0) {
      const std::string i = std::to_string(index), json = spec.to_json();
      execl("/proc/self/exe", argv[0], "--task", job, i.c_str(), json.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    children.push_back(pid);
  };
  for (int i = 0; i < num_ps; ++i) start("ps", i);
  for (int i = 0; i < num_workers; ++i) start("worker", i);
  int rc = 0;
  try {
    ds::ParameterServerStrategy strategy(std::make_shared<ds::SimpleClusterResolver>(spec, "chief", 0));
    ds::ClusterCoordinator coordinator(strategy);
    std::printf("parameter-server throughput: %d ps, %d workers, coordinator here, loopback\n", num_ps, num_workers);
    std::printf("%-34s %10s %12s %14s\n", "case", "closures", "seconds", "per second");
    {
      for (int i = 0; i < 200; ++i) coordinator.schedule(&empty_closure);  // warm-up
      coordinator.join();
      const auto t = std::chrono::steady_clock::now();
      for (int i = 0; i < closures; ++i) coordinator.schedule(&empty_closure);
      coordinator.join();
      const double s = seconds_since(t);
      std::printf("%-34s %10d %12.3f %14.0f\n", "empty closure", closures, s, closures / s);
    }
    auto scope = strategy.scope();
    for (const std::size_t bytes : {std::size_t{1} << 10, std::size_t{1} << 20}) {
      const std::size_t n = bytes / sizeof(float);
      ds::Variable<std::vector<float>> v(std::vector<float>(n, 0.0f), {.name = "v"});
      const std::vector<float> delta(n, 1.0f);
      const int count = bytes > 4096 ? std::max(1, closures / 10) : closures;
      const auto t = std::chrono::steady_clock::now();
      for (int i = 0; i < count; ++i) coordinator.schedule(&add_to, v, delta);
      coordinator.join();
      const double s = seconds_since(t);
      const auto check = v.read_value();
      if (check.front() != static_cast<float>(count) || check.back() != static_cast<float>(count)) {
        std::fprintf(stderr, "wrong result: %f after %d updates\n", check.front(), count);
        rc = 1;
      }
      std::printf("%-34s %10d %12.3f %14.0f  (%.1f MB/s of updates)\n",
                  fmt::format("assign_add of {} KiB float32", bytes >> 10).c_str(), count, s, count / s,
                  static_cast<double>(count) * static_cast<double>(bytes) / s / 1e6);
    }
    coordinator.shutdown_cluster();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_ps_throughput: %s\n", e.what());
    rc = 1;
  }
  for (pid_t pid : children) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      if (waitpid(pid, &status, WNOHANG) == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
      }
    }
  }
  return rc;
}

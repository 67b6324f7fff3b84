// MultiWorkerMirroredStrategy<ds::host> over MPI (CommunicationImplementation::Mpi, net/mpi.hpp):
// the multi-worker helper built against Open MPI and against MPICH, started by each one's own
// launcher (mpirun / mpiexec) with 2 to 4 ranks. The helper checks its collectives' results
// against exact values and says OK or what it saw; this file checks that every rank did, that
// mismatched calls and a killed rank become typed errors on every survivor, and that nothing hangs.
//
// MPI_OPENMPI_HELPER / MPI_MPICH_HELPER (set by tests/meson.build where that MPI is installed)
// name the helpers; an MPI whose helper is not built is skipped, and the suite reports SKIP when
// neither is.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include "support/processes.hpp"

using namespace std::chrono_literals;

namespace {

struct Mpi {
  std::string name;
  std::string helper;  // tests/multi_worker_helper.cpp, built with this MPI: every scenario
  std::vector<std::string> launcher;  // up to "-np"
  std::vector<std::string> survive_a_dead_rank;  // the launcher's flag to let the others run on
  // Whether the survivors of a dead rank live on to see it as an error: Open MPI's mpirun with
  // --enable-recovery lets them; MPICH's mpiexec ends the whole job (its ch4 device asserts in
  // MPI_Test when told to go on with MPIR_CVAR_ENABLE_FT), which is not a hang either.
  bool survivors_see_errors = false;
};

std::vector<Mpi> installed_mpis() {
  std::vector<Mpi> out;
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v ? v : "";
  };
  if (!env("MPI_OPENMPI_HELPER").empty() && !env("MPI_OPENMPI_LAUNCHER").empty())
    out.push_back({"Open MPI", env("MPI_OPENMPI_HELPER"),
                   {env("MPI_OPENMPI_LAUNCHER"), "--oversubscribe"}, {"--enable-recovery"}, true});
  if (!env("MPI_MPICH_HELPER").empty() && !env("MPI_MPICH_LAUNCHER").empty())
    out.push_back({"MPICH", env("MPI_MPICH_HELPER"), {env("MPI_MPICH_LAUNCHER")}, {},
                   false});
  return out;
}

// Reads what the job wrote for up to `wait`.
void pump(test_support::Child& c, std::chrono::milliseconds wait) {
  pollfd p{c.out_fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(wait.count())) <= 0) return;
  char buf[4096];
  for (ssize_t n; (n = ::read(c.out_fd, buf, sizeof buf)) > 0;) c.output.append(buf, static_cast<std::size_t>(n));
}

// The pid the helper of worker `rank` printed ("worker R of N: ... (pid P)"), or -1.
int pid_of_worker(const std::string& output, int rank) {
  const std::string prefix = fmt::format("worker {} of ", rank);
  const auto at = output.find(prefix);
  if (at == std::string::npos) return -1;
  const auto pid = output.find("(pid ", at);
  return pid == std::string::npos ? -1 : std::atoi(output.c_str() + pid + 5);
}

std::size_t count(const std::string& haystack, std::string_view needle) {
  std::size_t n = 0;
  for (auto at = haystack.find(needle); at != std::string::npos; at = haystack.find(needle, at + needle.size())) ++n;
  return n;
}

// mpirun refuses root without these; harmless otherwise.
const std::map<std::string, std::string> kEnv = {{"OMPI_ALLOW_RUN_AS_ROOT", "1"},
                                                 {"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"},
                                                 {"TEST_IMPLEMENTATION", "MPI"}};

test_support::Child start(const Mpi& mpi, int np, std::vector<std::string> helper_args,
                          std::vector<std::string> extra_launcher_args = {},
                          std::map<std::string, std::string> env = kEnv, const std::string& helper = {}) {
  std::vector<std::string> argv = mpi.launcher;
  argv.insert(argv.end(), extra_launcher_args.begin(), extra_launcher_args.end());
  argv.insert(argv.end(), {"-np", std::to_string(np), helper.empty() ? mpi.helper : helper});
  argv.insert(argv.end(), helper_args.begin(), helper_args.end());
  return test_support::spawn(argv, env);
}

test_support::Child run(const Mpi& mpi, int np, std::vector<std::string> helper_args,
                        const std::string& helper = {}) {
  std::vector<test_support::Child> job;
  job.push_back(start(mpi, np, std::move(helper_args), {}, kEnv, helper));
  CHECK_MESSAGE(test_support::wait_all(job, 120s), "the MPI job did not end within 120 s");
  return std::move(job[0]);
}

}  // namespace

TEST_SUITE("mpi") {

TEST_CASE("MPI: the collectives battery gives exact results on every rank, 2 to 4 ranks, 1 and 2 local replicas") {
  const auto mpis = installed_mpis();
  REQUIRE_MESSAGE(!mpis.empty(), "MPI_OPENMPI_HELPER / MPI_MPICH_HELPER are not set (run through meson test)");
  for (const auto& mpi : mpis) {
    for (int np : {2, 3, 4}) {
      for (const char* local : {"1", "2"}) {
        const auto job = run(mpi, np, {"collectives", local});
        INFO(mpi.name, " -np ", np, ", ", local, " local replicas:\n", job.output);
        CHECK(job.status == 0);
        CHECK(count(job.output, fmt::format("of {}: {} replicas in sync", np, np * std::atoi(local))) ==
              static_cast<std::size_t>(np));
        CHECK(count(job.output, "OK\n") == static_cast<std::size_t>(np));
        CHECK(count(job.output, "MISMATCH") == 0);
      }
    }
    // Without the agreement check (mpi_check_agreement = false) the same calls give the same results.
    auto unchecked_env = kEnv;
    unchecked_env["TEST_MPI_CHECK_AGREEMENT"] = "0";
    for (int np : {2, 3}) {
      std::vector<test_support::Child> job;
      job.push_back(start(mpi, np, {"collectives", "2"}, {}, unchecked_env));
      CHECK_MESSAGE(test_support::wait_all(job, 120s), "the MPI job did not end within 120 s");
      INFO(mpi.name, " -np ", np, " without the agreement check:\n", job[0].output);
      CHECK(job[0].status == 0);
      CHECK(count(job[0].output, "OK\n") == static_cast<std::size_t>(np));
      CHECK(count(job[0].output, "MISMATCH") == 0);
    }
    // IndexedSlices: one all-gather of the replicas' rows through MPI.
    for (const char* local : {"1", "3"}) {
      const auto job = run(mpi, 3, {"sparse", local});
      INFO(mpi.name, " sparse, ", local, " local replicas:\n", job.output);
      CHECK(job.status == 0);
      CHECK(count(job.output, "OK\n") == 3);
      CHECK(count(job.output, "MISMATCH") == 0);
    }
    // float16, bfloat16 and run-time dtypes: reduced by the library's own code inside MPI (custom MPI_Ops).
    const auto half = run(mpi, 3, {"half", "1"});
    INFO(mpi.name, " half:\n", half.output);
    CHECK(half.status == 0);
    CHECK(count(half.output, "MISMATCH") == 0);
    CHECK(count(half.output, "OK\n") == 3);
  }
}

TEST_CASE("MPI: reduce_scatter, all_to_all and all_reduce_async give exact results, 2 to 4 ranks, 1 and 2 local replicas") {
  for (const auto& mpi : installed_mpis()) {
    for (int np : {2, 3, 4}) {
      for (const char* local : {"1", "2"}) {
        for (const char* scenario : {"scatter", "async"}) {
          const auto job = run(mpi, np, {scenario, local}, mpi.helper);
          INFO(mpi.name, " -np ", np, ", ", local, " local replicas, ", scenario, ":\n", job.output);
          CHECK(job.status == 0);
          CHECK(count(job.output, "OK\n") == static_cast<std::size_t>(np));
          CHECK(count(job.output, "MISMATCH") == 0);
        }
      }
    }
    const auto mismatch = run(mpi, 2, {"mismatch_reduce_scatter", "1"}, mpi.helper);
    INFO(mpi.name, " mismatch_reduce_scatter:\n", mismatch.output);
    CHECK(count(mismatch.output, "InvalidArgument: ") == 2);
  }
}

TEST_CASE("MPI: the demo ends with the same weights on every rank as over TCP") {
  for (const auto& mpi : installed_mpis()) {
    const auto job = run(mpi, 3, {"demo", "1"});
    INFO(mpi.name, ":\n", job.output);
    REQUIRE(job.status == 0);
    // Every rank prints its weights; they must be identical (the mirrored copies stayed in sync).
    std::vector<std::string> weights;
    for (auto at = job.output.find("weights "); at != std::string::npos; at = job.output.find("weights ", at + 1))
      weights.push_back(job.output.substr(at, job.output.find('\n', at) - at));
    REQUIRE(weights.size() == 3);
    CHECK(weights[0] == weights[1]);
    CHECK(weights[1] == weights[2]);
  }
}

TEST_CASE("MPI: mismatched calls are an InvalidArgument on every rank that names both calls") {
  struct Case {
    const char* scenario;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"mismatch",
       "InvalidArgument: mismatched collectives at collective #1: worker:0 called all_reduce(count=3, dtype=float32, "
       "op=SUM, shapes #"},
      {"mismatch_dtype", "but worker:1 called all_reduce(count=3, dtype=float64, op=SUM, shapes #"},
      {"mismatch_half", "but worker:1 called all_reduce(count=3, dtype=float16, op=SUM, shapes #"},
  };
  for (const auto& mpi : installed_mpis()) {
    for (const auto& c : cases) {
      const auto job = run(mpi, 3, {c.scenario, "1"});
      INFO(mpi.name, " ", c.scenario, ":\n", job.output);
      CHECK(job.status != 0);
      CHECK(count(job.output, c.message) == 3);  // every rank, the same pair named
    }
    const auto shape = run(mpi, 2, {"mismatch_shape", "1"});
    INFO(mpi.name, " mismatch_shape:\n", shape.output);
    CHECK(count(shape.output, "InvalidArgument: mismatched collectives at collective #1") == 2);
  }
}

TEST_CASE("MPI: a rank killed mid-training becomes CollectiveTimeout or PeerFailure on every survivor, no hang") {
  for (const auto& mpi : installed_mpis()) {
    auto env = kEnv;
    env["TEST_TIMEOUT_SECONDS"] = "5";
    std::vector<test_support::Child> job;
    job.push_back(start(mpi, 3, {"kill", "1"}, mpi.survive_a_dead_rank, env));
    // Wait until every rank finished its first all-reduce, then kill one rank (not the launcher).
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    while (count(job[0].output, "first all-reduce done") < 3 && std::chrono::steady_clock::now() < deadline) {
      pump(job[0], 200ms);
    }
    REQUIRE_MESSAGE(count(job[0].output, "first all-reduce done") == 3, job[0].output);
    const int victim = pid_of_worker(job[0].output, 2);
    REQUIRE(victim > 0);
    ::kill(victim, SIGKILL);
    const auto killed = std::chrono::steady_clock::now();
    CHECK_MESSAGE(test_support::wait_all(job, 60s), "survivors hung after a rank was killed");
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
    INFO(mpi.name, " (", seconds, " s after the kill):\n", job[0].output);
    CHECK(seconds < 40);
    if (mpi.survivors_see_errors) {  // (mpirun --enable-recovery exits 0 whatever its ranks did)
      CHECK(count(job[0].output, "CollectiveTimeout: ") + count(job[0].output, "PeerFailure: ") == 2);
    } else {
      CHECK(job[0].status != 0);
      CHECK(count(job[0].output, "OK\n") == 0);  // nobody carried on as if nothing happened
    }
  }
}

}  // TEST_SUITE

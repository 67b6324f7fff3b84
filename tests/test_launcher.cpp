// Tests of tools/distribute-launch with real processes. The launcher and the task program
// (tests/launcher_child.cpp) are found through the environment variables DISTRIBUTE_LAUNCH and
// LAUNCHER_CHILD, which tests/meson.build sets. Every launcher run is bounded in time: past its
// limit the launcher is SIGKILLed (its tasks die with it through PR_SET_PDEATHSIG) and the test fails.
#include <boost/json.hpp>
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <distribute/version.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <launch_node_protocol.hpp>

#include <iterator>
#include <memory>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "support/processes.hpp"

namespace {

using Clock = std::chrono::steady_clock;

std::string env_path(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) throw std::runtime_error(fmt::format("{} is not set (run the tests through meson)", name));
  return v;
}
std::string launcher() { return env_path("DISTRIBUTE_LAUNCH"); }
std::string child() { return env_path("LAUNCHER_CHILD"); }

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// ------------------------------------------------------------------------------------------------
// Running the launcher

struct Result {
  int code = -1;  // exit status, or 128+signal
  std::string out, err;
  double seconds = 0;
  bool timed_out = false;
};

/// A whole command line, for a launcher started through another program (`sh -c 'ulimit ...'`).
struct CommandLine {
  std::vector<std::string> argv;
};

class Job {
 public:
  explicit Job(std::vector<std::string> args) : Job(CommandLine{with_launcher(std::move(args))}) {}
  explicit Job(CommandLine command) {
    std::vector<std::string>& args = command.argv;
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) throw std::runtime_error("pipe");
    start_ = Clock::now();
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork");
    if (pid_ == 0) {
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
      ::execv(argv[0], argv.data());
      ::_exit(126);
    }
    ::close(out[1]);
    ::close(err[1]);
    out_fd_ = out[0];
    err_fd_ = err[0];
  }
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;
  ~Job() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    for (int fd : {out_fd_, err_fd_})
      if (fd >= 0) ::close(fd);
  }

  // Collects output until pred(result so far) holds (true) or `seconds` pass (false).
  bool wait_for(const std::function<bool(const Result&)>& pred, double seconds) {
    const auto deadline = Clock::now() + to_duration(seconds);
    while (!pred(r_)) {
      if (Clock::now() >= deadline || (out_fd_ < 0 && err_fd_ < 0)) return pred(r_);
      pump(deadline);
    }
    return true;
  }

  void signal(int sig) { ::kill(pid_, sig); }
  pid_t pid() const { return pid_; }

  // Waits for the launcher to exit and close its output; SIGKILLs it after `seconds`.
  Result finish(double seconds = 30) {
    const auto deadline = Clock::now() + to_duration(seconds);
    while (out_fd_ >= 0 || err_fd_ >= 0) {
      if (Clock::now() >= deadline) {
        r_.timed_out = true;
        ::kill(pid_, SIGKILL);
        break;
      }
      pump(deadline);
    }
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    r_.seconds = since(start_);
    r_.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    while (out_fd_ >= 0 || err_fd_ >= 0) pump(Clock::now() + std::chrono::seconds(2));
    return r_;
  }

 private:
  static std::vector<std::string> with_launcher(std::vector<std::string> args) {
    args.insert(args.begin(), launcher());
    return args;
  }

  static Clock::duration to_duration(double s) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  }

  void pump(Clock::time_point deadline) {
    pollfd fds[2] = {{out_fd_, POLLIN, 0}, {err_fd_, POLLIN, 0}};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    const int n = ::poll(fds, 2, static_cast<int>(std::clamp<long long>(left, 0, 1000)));
    if (n <= 0) {
      if (Clock::now() >= deadline) {  // finish() callers drain after SIGKILL: give up on the fds
        for (int* fd : {&out_fd_, &err_fd_})
          if (*fd >= 0 && r_.timed_out) {
            ::close(*fd);
            *fd = -1;
          }
      }
      return;
    }
    read_from(fds[0], out_fd_, r_.out);
    read_from(fds[1], err_fd_, r_.err);
  }

  static void read_from(const pollfd& p, int& fd, std::string& into) {
    if (fd < 0 || !(p.revents & (POLLIN | POLLHUP | POLLERR))) return;
    char buf[8192];
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      into.append(buf, static_cast<std::size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      ::close(fd);
      fd = -1;
    }
  }

  pid_t pid_ = -1;
  int out_fd_ = -1, err_fd_ = -1;
  Clock::time_point start_;
  Result r_;
};

Result run(std::vector<std::string> args, double seconds = 30) {
  Job job(std::move(args));
  return job.finish(seconds);
}

// A fresh empty directory for the children's `barrier` command.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "distribute-launch-test-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp");
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string str() const { return path.string(); }
};

// A process that no longer runs (gone, or a zombie waiting for init to reap it).
bool process_gone(int pid, double wait_seconds = 3) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<int>(wait_seconds * 1000));
  for (;;) {
    std::ifstream f(fmt::format("/proc/{}/stat", pid));
    std::string stat;
    if (!f || !std::getline(f, stat)) return true;
    const auto paren = stat.rfind(')');
    if (paren == std::string::npos || paren + 2 >= stat.size()) return true;
    const char state = stat[paren + 2];
    if (state == 'Z' || state == 'X') return true;
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> v;
  std::size_t start = 0;
  while (start < text.size()) {
    const auto nl = text.find('\n', start);
    if (nl == std::string::npos) {
      v.push_back(text.substr(start));
      break;
    }
    v.push_back(text.substr(start, nl - start));
    start = nl + 1;
  }
  return v;
}

bool contains(const std::string& haystack, std::string_view needle) {
  return haystack.find(needle) != std::string::npos;
}

std::size_t count(const std::string& haystack, std::string_view needle) {
  std::size_t n = 0;
  for (auto p = haystack.find(needle); p != std::string::npos; p = haystack.find(needle, p + 1)) ++n;
  return n;
}

// ------------------------------------------------------------------------------------------------
// TF_CONFIG read with Boost.JSON. at() throws on a missing key or a value of the wrong kind, so a
// malformed TF_CONFIG fails the test with Boost's message.

namespace json = boost::json;

// An object's keys in their order in the text (json::object keeps insertion order).
std::vector<std::string> keys(const json::value& v) {
  std::vector<std::string> k;
  for (const auto& kv : v.as_object()) k.emplace_back(kv.key());
  return k;
}

// An array of strings.
std::vector<std::string> strings(const json::value& v) {
  std::vector<std::string> s;
  for (const auto& e : v.as_array()) s.emplace_back(e.as_string());
  return s;
}

// ------------------------------------------------------------------------------------------------
// What the children print with `info`: "[T:I] INFO task=T:I pid=P tf_config=JSON".

struct TaskInfo {
  std::string prefix_task;  // from the launcher's "[T:I] " prefix
  std::string env_task;     // DISTRIBUTE_LAUNCH_TASK as the child saw it
  int pid = 0;
  std::string raw;
  json::value tf;
};

std::map<std::string, TaskInfo> task_infos(const std::string& out) {
  static const std::regex re(R"(^\[([a-z]+:[0-9]+)\] INFO task=(\S*) pid=([0-9]+) tf_config=(.*)$)");
  std::map<std::string, TaskInfo> infos;
  for (const auto& line : lines(out)) {
    std::smatch m;
    if (!std::regex_match(line, m, re)) continue;
    TaskInfo t;
    t.prefix_task = m[1];
    t.env_task = m[2];
    t.pid = std::stoi(m[3]);
    t.raw = m[4];
    t.tf = json::parse(t.raw);
    infos[t.prefix_task] = std::move(t);
  }
  return infos;
}

int port_of(const std::string& address) {
  const auto colon = address.rfind(':');
  REQUIRE(colon != std::string::npos);
  CHECK(address.substr(0, colon) == "127.0.0.1");
  return std::stoi(address.substr(colon + 1));
}

// Checks that every task saw the same cluster, with the expected job sizes and distinct ports,
// and its own type and index.
void check_cluster(const std::map<std::string, TaskInfo>& infos, const std::map<std::string, int>& jobs) {
  int total = 0;
  for (const auto& [job, n] : jobs) total += n;
  REQUIRE(static_cast<int>(infos.size()) == total);
  const json::value& cluster = infos.begin()->second.tf.at("cluster");
  std::vector<std::string> expected_keys;
  for (const char* job : {"chief", "worker", "ps"})
    if (jobs.count(job) && jobs.at(job) > 0) expected_keys.push_back(job);
  CHECK(keys(cluster) == expected_keys);
  std::set<int> ports;
  for (const auto& [job, n] : jobs) {
    const auto addresses = strings(cluster.at(job));
    CHECK(static_cast<int>(addresses.size()) == n);
    for (const auto& a : addresses) ports.insert(port_of(a));
  }
  CHECK(static_cast<int>(ports.size()) == total);  // all distinct
  for (int p : ports) CHECK((p > 0 && p < 65536));

  const std::string cluster_text = [&] {
    const auto& raw = infos.begin()->second.raw;
    return raw.substr(0, raw.find("\"task\""));
  }();
  for (const auto& entry : infos) {  // no structured binding: INFO captures it, and clang 14 cannot
    const std::string& name = entry.first;
    const TaskInfo& t = entry.second;
    INFO("task ", name, ": ", t.raw);
    CHECK(t.env_task == name);
    CHECK(t.raw.substr(0, t.raw.find("\"task\"")) == cluster_text);  // the same cluster everywhere
    const json::value& task = t.tf.at("task");
    CHECK(task.at("index").is_int64());
    const std::string type(task.at("type").as_string());
    CHECK(fmt::format("{}:{}", type, task.at("index").as_int64()) == name);
    CHECK(jobs.count(type) == 1);
  }
}

void check_all_gone(const std::map<std::string, TaskInfo>& infos) {
  for (const auto& entry : infos) {  // no structured binding: INFO captures it, and clang 14 cannot
    const std::string& name = entry.first;
    const TaskInfo& t = entry.second;
    INFO("task ", name, " pid ", t.pid);
    CHECK(process_gone(t.pid));
  }
}

}  // namespace

// ------------------------------------------------------------------------------------------------

TEST_SUITE("launcher") {

TEST_CASE("-n 3 gives each worker its own index and the same cluster of 3 distinct ports") {
  const Result r = run({"-n", "3", "--", child(), "info", "exit", "0"});
  INFO("stdout:\n", r.out, "\nstderr:\n", r.err);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.code == 0);
  const auto infos = task_infos(r.out);
  CHECK(infos.count("worker:0") == 1);
  CHECK(infos.count("worker:1") == 1);
  CHECK(infos.count("worker:2") == 1);
  check_cluster(infos, {{"worker", 3}});
  CHECK_FALSE(contains(r.err, "distribute-launch:"));
  check_all_gone(infos);
}

TEST_CASE("output lines are forwarded with a task prefix, stderr to stderr") {
  const Result r = run({"-n", "2", "--", child(), "print", "first line", "eprint", "to stderr", "print",
                        "second line", "partial", "no newline"});
  INFO("stdout:\n", r.out, "\nstderr:\n", r.err);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.code == 0);
  for (const char* w : {"worker:0", "worker:1"}) {
    const auto first = r.out.find(fmt::format("[{}] first line\n", w));
    const auto second = r.out.find(fmt::format("[{}] second line\n", w));
    CHECK(first != std::string::npos);
    CHECK(second != std::string::npos);
    CHECK(first < second);
    CHECK(contains(r.out, fmt::format("[{}] no newline\n", w)));  // partial last line flushed
    CHECK(contains(r.err, fmt::format("[{}] to stderr\n", w)));
  }
  CHECK_FALSE(contains(r.out, "to stderr"));
  CHECK_FALSE(contains(r.err, "line"));
  for (const auto& line : lines(r.out)) CHECK((line.rfind("[worker:0] ", 0) == 0 || line.rfind("[worker:1] ", 0) == 0));
  CHECK(r.out.back() == '\n');
}

TEST_CASE("a task failing with status 3 stops the others and the launcher exits 3") {
  TempDir dir;
  const Result r = run({"-n", "3", "--", child(), "info", "barrier", dir.str(), "3", "@worker:1", "sleep", "100",
                        "exit", "3", "@all", "sleep", "60000", "print", "not stopped"});
  INFO("stdout:\n", r.out, "\nstderr:\n", r.err);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.code == 3);
  CHECK(contains(r.err, "distribute-launch: worker:1 exited with status 3; stopping the other tasks"));
  CHECK(r.seconds < 20);  // the sleepers (60 s) were terminated
  CHECK_FALSE(contains(r.out, "not stopped"));
  const auto infos = task_infos(r.out);
  CHECK(infos.size() == 3);
  check_all_gone(infos);
}

TEST_CASE("a task that ignores SIGTERM is SIGKILLed after the grace period") {
  TempDir dir;
  const Result r = run({"--grace", "1", "-n", "2", "--", child(), "ignore-term", "info", "barrier", dir.str(),
                        "2", "@worker:1", "exit", "4", "@all", "sleep", "60000"});
  INFO("stdout:\n", r.out, "\nstderr:\n", r.err);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.code == 4);
  CHECK(contains(r.err, "worker:1 exited with status 4; stopping the other tasks"));
  CHECK(contains(r.err, "worker:0 did not stop within 1 s; sending SIGKILL"));
  CHECK(r.seconds >= 0.9);
  CHECK(r.seconds < 15);
  check_all_gone(task_infos(r.out));
}

TEST_CASE("a task killed by SIGKILL makes the launcher fail and report it") {
  TempDir dir;
  const Result r = run({"-n", "2", "--", child(), "info", "barrier", dir.str(), "2", "@worker:0", "kill-self", "9",
                        "@all", "sleep", "60000"});
  INFO("stdout:\n", r.out, "\nstderr:\n", r.err);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.code == 128 + 9);
  CHECK(contains(r.err, "distribute-launch: worker:0 was killed by signal 9"));
  CHECK(contains(r.err, "stopping the other tasks"));
  CHECK(r.seconds < 20);
  check_all_gone(task_infos(r.out));
}

TEST_CASE("signals sent to the launcher are forwarded to every task") {
  SUBCASE("SIGTERM") {
    Job job({"-n", "3", "--", child(), "trap-term", "info", "print", "ready", "sleep", "60000"});
    REQUIRE(job.wait_for([](const Result& r) { return count(r.out, "] ready\n") == 3; }, 20));
    const auto sent = Clock::now();
    job.signal(SIGTERM);
    const Result r = job.finish();
    INFO("stdout:\n", r.out, "\nstderr:\n", r.err);
    REQUIRE_FALSE(r.timed_out);
    CHECK(since(sent) < 8);  // well before the 10 s grace period: the tasks exited on SIGTERM
    CHECK(r.code == 128 + SIGTERM);
    CHECK(contains(r.err, "received SIGTERM; forwarding it to the tasks"));
    for (int k = 0; k < 3; ++k) CHECK(contains(r.out, fmt::format("[worker:{}] caught SIGTERM\n", k)));
    check_all_gone(task_infos(r.out));
  }
  SUBCASE("SIGINT") {
    Job job({"-n", "2", "--", child(), "info", "print", "ready", "sleep", "60000"});
    REQUIRE(job.wait_for([](const Result& r) { return count(r.out, "] ready\n") == 2; }, 20));
    job.signal(SIGINT);
    const Result r = job.finish();
    INFO("stdout:\n", r.out, "\nstderr:\n", r.err);
    REQUIRE_FALSE(r.timed_out);
    CHECK(r.code == 128 + SIGINT);
    CHECK(contains(r.err, "received SIGINT"));
    CHECK_FALSE(contains(r.err, "stopping the other tasks"));  // tasks we stopped are not failures
    check_all_gone(task_infos(r.out));
  }
  SUBCASE("a second SIGTERM kills tasks that ignore the first") {
    Job job({"--grace", "60", "-n", "2", "--", child(), "ignore-term", "info", "print", "ready", "sleep", "60000"});
    REQUIRE(job.wait_for([](const Result& r) { return count(r.out, "] ready\n") == 2; }, 20));
    job.signal(SIGTERM);
    REQUIRE(job.wait_for([](const Result& r) { return contains(r.err, "received SIGTERM"); }, 10));
    const auto sent = Clock::now();
    job.signal(SIGTERM);
    const Result r = job.finish();
    INFO("stdout:\n", r.out, "\nstderr:\n", r.err);
    REQUIRE_FALSE(r.timed_out);
    CHECK(since(sent) < 10);
    CHECK(r.code == 128 + SIGTERM);
    CHECK(contains(r.err, "received SIGTERM again; killing all tasks"));
    check_all_gone(task_infos(r.out));
  }
}

TEST_CASE("the tasks die with a launcher that is SIGKILLed (PR_SET_PDEATHSIG)") {
  Job job({"-n", "2", "--", child(), "ignore-term", "info", "print", "ready", "sleep", "60000"});
  REQUIRE(job.wait_for([](const Result& r) { return count(r.out, "] ready\n") == 2; }, 20));
  job.signal(SIGKILL);
  const Result r = job.finish();
  INFO("stdout:\n", r.out, "\nstderr:\n", r.err);
  CHECK(r.code == 128 + SIGKILL);
  const auto infos = task_infos(r.out);
  CHECK(infos.size() == 2);
  check_all_gone(infos);
}

TEST_CASE("ps mode: chief, 2 ps and 3 workers; done when chief and workers are, ps tasks stopped") {
  TempDir dir;
  const Result r = run({"--ps", "2", "--workers", "3", "--", child(), "info", "barrier", dir.str(), "6", "@ps",
                        "sleep", "600000", "@all", "exit", "0"});
  INFO("stdout:\n", r.out, "\nstderr:\n", r.err);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.code == 0);
  CHECK(r.seconds < 20);
  const auto infos = task_infos(r.out);
  for (const char* t : {"chief:0", "ps:0", "ps:1", "worker:0", "worker:1", "worker:2"}) CHECK(infos.count(t) == 1);
  check_cluster(infos, {{"chief", 1}, {"ps", 2}, {"worker", 3}});
  CHECK_FALSE(contains(r.err, "stopping the other tasks"));
  CHECK(contains(r.err, "distribute-launch: the chief and worker tasks are done; stopping the ps tasks"));
  CHECK_FALSE(contains(r.err, "SIGKILL"));
  check_all_gone(infos);
}

TEST_CASE("ps mode variants") {
  TempDir dir;
  SUBCASE("--no-chief") {
    const Result r = run({"--ps", "1", "--workers", "2", "--no-chief", "--", child(), "info", "barrier", dir.str(),
                          "3", "@ps", "sleep", "600000"});
    INFO("stdout:\n", r.out, "\nstderr:\n", r.err);
    REQUIRE_FALSE(r.timed_out);
    CHECK(r.code == 0);
    check_cluster(task_infos(r.out), {{"ps", 1}, {"worker", 2}});
  }
  SUBCASE("-n with --chief") {
    const Result r = run({"-n", "2", "--chief", "--", child(), "info"});
    INFO("stdout:\n", r.out, "\nstderr:\n", r.err);
    REQUIRE_FALSE(r.timed_out);
    CHECK(r.code == 0);
    check_cluster(task_infos(r.out), {{"chief", 1}, {"worker", 2}});
  }
  SUBCASE("a failing ps task stops the job") {
    const Result r = run({"--ps", "1", "--workers", "1", "--", child(), "info", "barrier", dir.str(), "3", "@ps",
                          "exit", "5", "@all", "sleep", "60000"});
    INFO("stdout:\n", r.out, "\nstderr:\n", r.err);
    REQUIRE_FALSE(r.timed_out);
    CHECK(r.code == 5);
    CHECK(contains(r.err, "ps:0 exited with status 5; stopping the other tasks"));
    CHECK(r.seconds < 20);
    check_all_gone(task_infos(r.out));
  }
  SUBCASE("a failing worker fails the job") {
    const Result r = run({"--ps", "1", "--workers", "2", "--", child(), "info", "barrier", dir.str(), "4", "@ps",
                          "sleep", "60000", "@worker:1", "exit", "6"});
    INFO("stdout:\n", r.out, "\nstderr:\n", r.err);
    REQUIRE_FALSE(r.timed_out);
    CHECK(r.code == 6);
    CHECK(contains(r.err, "worker:1 exited with status 6; stopping the other tasks"));
    check_all_gone(task_infos(r.out));
  }
}

TEST_CASE("--restart-workers: a failing worker of a ps cluster is started again, at most N times") {
  SUBCASE("killed, then failing, then done: restarted twice and the job succeeds") {
    const Result r = run({"--ps", "1", "--workers", "2", "--restart-workers", "2", "--restart-delay", "0.1", "--",
                          child(), "@ps", "sleep", "600000", "@worker:1#0", "kill-self", "9", "@worker:1#1", "exit",
                          "3", "@all", "env", "DISTRIBUTE_LAUNCH_RESTART", "print", "done"});
    INFO("stdout:\n", r.out, "\nstderr:\n", r.err);
    REQUIRE_FALSE(r.timed_out);
    CHECK(r.code == 0);
    CHECK(contains(r.err, "worker:1 was killed by signal 9 (Killed); restarting it in 0.1 s (restart 1 of 2)"));
    CHECK(contains(r.err, "worker:1 exited with status 3; restarting it in 0.1 s (restart 2 of 2)"));
    CHECK(contains(r.err, "distribute-launch: starting worker:1 again"));
    CHECK(contains(r.out, "[worker:1] ENV DISTRIBUTE_LAUNCH_RESTART=2\n[worker:1] done\n"));
    CHECK_FALSE(contains(r.out, "[worker:1] ENV DISTRIBUTE_LAUNCH_RESTART=1"));  // that start exited first
    CHECK(contains(r.out, "[worker:0] ENV DISTRIBUTE_LAUNCH_RESTART=0"));
    CHECK(contains(r.out, "[chief:0] done"));
    CHECK(contains(r.err, "the chief and worker tasks are done; stopping the ps tasks"));
  }
  SUBCASE("a worker that keeps failing fails the job once the restarts are used up") {
    const Result r = run({"--ps", "1", "--workers", "2", "--restart-workers", "1", "--restart-delay", "0", "--",
                          child(), "@ps", "sleep", "600000", "@worker:1", "exit", "4", "@worker:0", "sleep", "600000"});
    INFO("stdout:\n", r.out, "\nstderr:\n", r.err);
    REQUIRE_FALSE(r.timed_out);
    CHECK(r.code == 4);
    CHECK(contains(r.err, "worker:1 exited with status 4; restarting it in 0 s (restart 1 of 1)"));
    CHECK(contains(r.err, "worker:1 exited with status 4; stopping the other tasks"));
    CHECK(r.seconds < 20);
  }
  SUBCASE("the chief and ps tasks are not restarted") {
    const Result r = run({"--ps", "1", "--workers", "1", "--restart-workers", "3", "--", child(), "@chief", "exit", "5",
                          "@all", "sleep", "600000"});
    INFO("stdout:\n", r.out, "\nstderr:\n", r.err);
    REQUIRE_FALSE(r.timed_out);
    CHECK(r.code == 5);
    CHECK(contains(r.err, "chief:0 exited with status 5; stopping the other tasks"));
    CHECK_FALSE(contains(r.err, "restarting"));
  }
}

TEST_CASE("--keep-going lets the other tasks finish and still fails") {
  const Result r = run({"--keep-going", "-n", "3", "--", child(), "@worker:1", "exit", "3", "@all", "sleep", "300",
                        "print", "done"});
  INFO("stdout:\n", r.out, "\nstderr:\n", r.err);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.code == 3);
  CHECK(contains(r.err, "worker:1 exited with status 3; the other tasks go on (--keep-going)"));
  CHECK(contains(r.out, "[worker:0] done\n"));
  CHECK(contains(r.out, "[worker:2] done\n"));
  CHECK_FALSE(contains(r.out, "[worker:1] done"));
}

TEST_CASE("--timeout stops a job that runs too long") {
  const Result r = run({"--timeout", "1", "-n", "2", "--", child(), "info", "sleep", "60000"});
  INFO("stdout:\n", r.out, "\nstderr:\n", r.err);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.code == 124);
  CHECK(r.seconds >= 0.9);
  CHECK(r.seconds < 15);
  CHECK(contains(r.err, "--timeout"));
  check_all_gone(task_infos(r.out));
}

TEST_CASE("--env, --token and DISTRIBUTE_LAUNCH_TASK reach every task") {
  SUBCASE("--token auto") {
    const Result r = run({"--env", "FOO=bar", "--env", "FOO=baz", "--env", "EMPTY=", "--token", "auto", "-n", "2",
                          "--", child(), "env", "FOO", "env", "EMPTY", "env", "DISTRIBUTE_CLUSTER_TOKEN", "env",
                          "DISTRIBUTE_LAUNCH_TASK"});
    INFO("stdout:\n", r.out, "\nstderr:\n", r.err);
    REQUIRE_FALSE(r.timed_out);
    CHECK(r.code == 0);
    std::set<std::string> tokens;
    static const std::regex tok(R"(^\[worker:[01]\] ENV DISTRIBUTE_CLUSTER_TOKEN=([0-9a-f]{32})$)");
    for (const auto& line : lines(r.out)) {
      std::smatch m;
      if (std::regex_match(line, m, tok)) tokens.insert(m[1]);
    }
    CHECK(tokens.size() == 1);  // 32 hex digits, the same for both tasks
    CHECK(count(r.out, "ENV DISTRIBUTE_CLUSTER_TOKEN=") == 2);
    for (int k = 0; k < 2; ++k) {
      CHECK(contains(r.out, fmt::format("[worker:{}] ENV FOO=baz\n", k)));  // the last --env wins
      CHECK(contains(r.out, fmt::format("[worker:{}] ENV EMPTY=\n", k)));
      CHECK(contains(r.out, fmt::format("[worker:{0}] ENV DISTRIBUTE_LAUNCH_TASK=worker:{0}\n", k)));
    }
  }
  SUBCASE("--token VALUE") {
    const Result r = run({"--token", "s3cret", "-n", "1", "--", child(), "env", "DISTRIBUTE_CLUSTER_TOKEN"});
    INFO("stdout:\n", r.out, "\nstderr:\n", r.err);
    CHECK(r.code == 0);
    CHECK(contains(r.out, "[worker:0] ENV DISTRIBUTE_CLUSTER_TOKEN=s3cret\n"));
  }
}

TEST_CASE("secure default: a random token per job unless --no-token; a token the caller set is kept") {
  static const std::regex tok(R"(^\[worker:[01]\] ENV DISTRIBUTE_CLUSTER_TOKEN=([0-9a-f]{32})$)");
  auto tokens_of = [](const Result& r) {
    std::set<std::string> tokens;
    for (const auto& line : lines(r.out)) {
      std::smatch m;
      if (std::regex_match(line, m, tok)) tokens.insert(m[1]);
    }
    return tokens;
  };
  ::unsetenv("DISTRIBUTE_CLUSTER_TOKEN");
  const Result a = run({"-n", "2", "--", child(), "env", "DISTRIBUTE_CLUSTER_TOKEN"});
  const Result b = run({"-n", "2", "--", child(), "env", "DISTRIBUTE_CLUSTER_TOKEN"});
  INFO("stdout:\n", a.out, "\n", b.out, "\nstderr:\n", a.err, b.err);
  CHECK(a.code == 0);
  CHECK(b.code == 0);
  CHECK(count(a.out, "ENV DISTRIBUTE_CLUSTER_TOKEN=") == 2);
  REQUIRE(tokens_of(a).size() == 1);  // one token for the job's tasks...
  REQUIRE(tokens_of(b).size() == 1);
  CHECK(*tokens_of(a).begin() != *tokens_of(b).begin());  // ...and another for the next job
  CHECK_FALSE(contains(a.out + a.err, "--token"));
  ::setenv("DISTRIBUTE_CLUSTER_TOKEN", "callers-own", 1);
  const Result kept = run({"-n", "1", "--", child(), "env", "DISTRIBUTE_CLUSTER_TOKEN"});
  const Result none = run({"--no-token", "-n", "1", "--", child(), "env", "DISTRIBUTE_CLUSTER_TOKEN"});
  ::unsetenv("DISTRIBUTE_CLUSTER_TOKEN");
  INFO("stdout:\n", kept.out, "\n", none.out);
  CHECK(contains(kept.out, "[worker:0] ENV DISTRIBUTE_CLUSTER_TOKEN=callers-own\n"));
  CHECK(none.code == 0);
  CHECK(contains(none.out, "[worker:0] ENV DISTRIBUTE_CLUSTER_TOKEN unset\n"));  // not even the caller's
}

TEST_CASE("what a task leaves behind in its process group is killed when it exits") {
  const Result r = run({"-n", "1", "--", child(), "grandchild", "exit", "0"});
  INFO("stdout:\n", r.out, "\nstderr:\n", r.err);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.code == 0);
  CHECK(r.seconds < 15);  // did not wait for the grandchild's 60 s
  static const std::regex re(R"(\[worker:0\] GRANDCHILD pid=([0-9]+))");
  std::smatch m;
  REQUIRE(std::regex_search(r.out, m, re));
  CHECK(process_gone(std::stoi(m[1])));
}

TEST_CASE("a program that cannot be started fails the job with 127") {
  const Result r = run({"-n", "2", "--", "/nonexistent/distribute-launch-test-program"});
  INFO("stdout:\n", r.out, "\nstderr:\n", r.err);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.code == 127);
  // Whichever task fails first: its own message comes before the launcher's note about it.
  static const std::regex note(R"(distribute-launch: (worker:[01]) exited with status 127; stopping the other tasks\n)");
  std::smatch m;
  REQUIRE(std::regex_search(r.err, m, note));
  const auto own = r.err.find(fmt::format(
      "[{}] distribute-launch: cannot run '/nonexistent/distribute-launch-test-program': No such file or directory\n",
      m[1].str()));
  CHECK(own != std::string::npos);
  CHECK(own < static_cast<std::size_t>(m.position(0)));
}

TEST_CASE("an address that does not resolve fails the job with exit 1 and names the option") {
  // RFC 2606: .invalid never resolves. The resolver's own reason (no name, no network) follows the colon.
  SUBCASE("--host") {
    const Result r = run({"--host", "no-such-host.invalid", "-n", "1", "--", child(), "exit", "0"});
    INFO("stderr:\n", r.err);
    CHECK(r.code == 1);
    CHECK(contains(r.err, "distribute-launch: cannot resolve --host 'no-such-host.invalid': "));
  }
  SUBCASE("--master-addr, on node 0") {
    const Result r = run({"--nnodes", "2", "--node-rank", "0", "--host", "127.0.0.1", "--master-addr", "no-such-host.invalid",
                          "--master-port", "29999", "--token", "t", "-n", "1", "--", child(), "exit", "0"});
    INFO("stderr:\n", r.err);
    CHECK(r.code == 1);
    CHECK(contains(r.err, "distribute-launch: node 0: the launchers could not agree on the job: cannot resolve "
                          "--master-addr 'no-such-host.invalid': "));
  }
}

// The CPUs this process may run on, in order (what the launcher splits among its tasks).
std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

// task name -> the CPUs it reported with the child's `affinity` command.
std::map<std::string, std::vector<int>> task_affinities(const std::string& out) {
  std::map<std::string, std::vector<int>> m;
  static const std::regex re(R"(AFFINITY (\S+) ([0-9,]+))");
  for (const auto& line : lines(out)) {
    std::smatch match;
    if (!std::regex_search(line, match, re)) continue;
    std::vector<int> cpus;
    std::stringstream list(match[2].str());
    for (std::string c; std::getline(list, c, ',');) cpus.push_back(std::stoi(c));
    m[match[1].str()] = cpus;
  }
  return m;
}

TEST_CASE("--bind-to core gives each task its own equal share of the CPUs, or each CPU an equal share of the tasks; the default binds nothing") {
  const std::vector<int> all = allowed_cpus();
  REQUIRE_FALSE(all.empty());

  SUBCASE("one task per CPU: each on its own equal block, and the binding reported") {
    if (all.size() < 2) {
      MESSAGE("this process may run on one CPU only: nothing to split");
      return;
    }
    const Result r = run({"--bind-to", "core", "-n", "2", "--", child(), "affinity", "exit", "0"});
    INFO("stdout:\n", r.out, "\nstderr:\n", r.err);
    REQUIRE(r.code == 0);
    const auto got = task_affinities(r.out);
    REQUIRE(got.size() == 2);
    // Equal contiguous blocks of the allowed CPUs, in order: worker:0 the first half.
    const std::size_t first = (all.size() + 1) / 2;
    CHECK(got.at("worker:0") == std::vector<int>(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(first)));
    CHECK(got.at("worker:1") == std::vector<int>(all.begin() + static_cast<std::ptrdiff_t>(first), all.end()));
    CHECK(contains(r.err, "binding tasks to CPUs: worker:0 on "));
  }

  SUBCASE("the default, and --bind-to none: every task may run on every CPU the launcher may") {
    for (const bool explicit_none : {false, true}) {
      std::vector<std::string> args = {"-n", "2", "--", child(), "affinity", "exit", "0"};
      if (explicit_none) args.insert(args.begin(), {"--bind-to", "none"});
      const Result r = run(args);
      INFO("--bind-to none given: ", explicit_none, "\nstdout:\n", r.out, "\nstderr:\n", r.err);
      REQUIRE(r.code == 0);
      const auto got = task_affinities(r.out);
      REQUIRE(got.size() == 2);
      for (const auto& entry : got) CHECK(entry.second == all);
      CHECK_FALSE(contains(r.err, "binding"));
    }
  }

  SUBCASE("more tasks than CPUs, not a multiple of them: nothing is bound, and an explicit --bind-to core says so") {
    if (all.size() < 2) {
      MESSAGE("this process may run on one CPU only: every task count is a multiple of it");
      return;
    }
    const std::string n = std::to_string(all.size() + 1);
    const Result r = run({"--bind-to", "core", "-n", n, "--", child(), "affinity", "exit", "0"});
    INFO("stdout:\n", r.out, "\nstderr:\n", r.err);
    REQUIRE(r.code == 0);
    const auto got = task_affinities(r.out);
    CHECK(got.size() == all.size() + 1);
    for (const auto& [task, cpus] : got) CHECK(cpus == all);
    CHECK(contains(r.err, fmt::format("{} tasks and {} CPUs: not binding (with more tasks than CPUs, --bind-to core "
                                      "needs the same number of tasks on every CPU)",
                                      all.size() + 1, all.size())));
  }

  SUBCASE("twice as many tasks as CPUs: each CPU runs its own block of two tasks, in order") {
    if (all.size() > 16) {
      MESSAGE("more than 16 CPUs: not starting twice as many tasks");
      return;
    }
    const std::size_t n = 2 * all.size();
    const Result r = run({"--bind-to", "core", "-n", std::to_string(n), "--", child(), "affinity", "exit", "0"});
    INFO("stdout:\n", r.out, "\nstderr:\n", r.err);
    REQUIRE(r.code == 0);
    const auto got = task_affinities(r.out);
    REQUIRE(got.size() == n);
    for (std::size_t i = 0; i < n; ++i) {
      CHECK(got.at(fmt::format("worker:{}", i)) == std::vector<int>{all[i / 2]});
    }
    CHECK(contains(r.err, fmt::format("binding tasks to CPUs: worker:0 on {}, worker:1 on {}, worker:2 on ", all[0], all[0])));
  }

  SUBCASE("twice as many tasks as CPUs, one of them a ps task: nothing is bound, and it says why") {
    if (all.size() > 16) {
      MESSAGE("more than 16 CPUs: not starting twice as many tasks");
      return;
    }
    // A chief, a ps task and 2 CPUs - 2 workers.
    const std::size_t n = 2 * all.size();
    const Result r = run({"--bind-to", "core", "--ps", "1", "--workers", std::to_string(n - 2), "--", child(),
                          "affinity", "exit", "0"});
    INFO("stdout:\n", r.out, "\nstderr:\n", r.err);
    REQUIRE(r.code == 0);
    const auto got = task_affinities(r.out);
    // The ps task may be stopped, once the others are done, before it has reported.
    CHECK(got.size() >= n - 1);
    for (const auto& [task, cpus] : got) CHECK(cpus == all);
    CHECK(contains(r.err, fmt::format("{} tasks and {} CPUs: not binding (with more tasks than CPUs, --bind-to core "
                                      "needs the same number of tasks on every CPU, and no ps tasks)",
                                      n, all.size())));
  }

  SUBCASE("an unknown --bind-to value is a usage error that names it") {
    const Result r = run({"--bind-to", "socket", "-n", "2", "--", child(), "exit", "0"});
    CHECK(r.code == 2);
    CHECK(contains(r.err, "--bind-to expects 'core' or 'none', got 'socket'"));
  }
}

// ------------------------------------------------------------------------------------------------
// Across nodes: one launcher per node (here all on loopback), meeting at node 0's --master-port.

namespace {

constexpr const char* kNodesToken = "the-job-secret";

std::vector<std::string> node_args(int nnodes, int rank, int port, int tasks, const std::string& token = kNodesToken) {
  return {"--nnodes", std::to_string(nnodes), "--node-rank", std::to_string(rank), "--master-addr", "127.0.0.1",
          "--master-port", std::to_string(port), "--token", token, "-n", std::to_string(tasks)};
}

std::vector<std::string> operator+(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::string env_of(const std::string& out, const std::string& task, const std::string& name) {
  const std::string prefix = fmt::format("[{}] ENV {}=", task, name);
  const auto at = out.find(prefix);
  if (at == std::string::npos) return "unset";
  return out.substr(at + prefix.size(), out.find('\n', at) - at - prefix.size());
}

}  // namespace

TEST_CASE("--nnodes 2: two launchers agree on one cluster; ranks follow the node ranks") {
  const int port = test_support::free_ports(1)[0];
  const std::vector<std::string> program = {child(), "info", "env", "RANK", "env", "LOCAL_RANK", "env", "WORLD_SIZE",
                                            "env", "LOCAL_WORLD_SIZE", "env", "GROUP_RANK", "env", "MASTER_ADDR",
                                            "env", "MASTER_PORT"};
  // Node 1 starts first: it retries until node 0 listens.
  Job node1(node_args(2, 1, port, 2) + program);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  Job node0(node_args(2, 0, port, 1) + program);
  const Result r0 = node0.finish(60), r1 = node1.finish(60);
  INFO("node 0 stdout:\n", r0.out, "\nnode 0 stderr:\n", r0.err, "\nnode 1 stdout:\n", r1.out, "\nnode 1 stderr:\n",
       r1.err);
  REQUIRE_FALSE(r0.timed_out);
  REQUIRE_FALSE(r1.timed_out);
  CHECK(r0.code == 0);
  CHECK(r1.code == 0);
  CHECK(contains(r1.err, "node 1: 2 nodes, 3 tasks; this node's are ranks 1..2"));
  auto infos = task_infos(r0.out);
  for (auto& entry : task_infos(r1.out)) infos.insert(std::move(entry));
  check_cluster(infos, {{"worker", 3}});
  const std::map<std::string, std::array<std::string, 5>> expected = {
      // RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK
      {"worker:0", {"0", "0", "3", "1", "0"}},
      {"worker:1", {"1", "0", "3", "2", "1"}},
      {"worker:2", {"2", "1", "3", "2", "1"}}};
  const std::string master_port = env_of(r0.out, "worker:0", "MASTER_PORT");
  std::set<int> task_ports;
  for (const auto& entry : infos)
    for (const auto& a : strings(entry.second.tf.at("cluster").at("worker"))) task_ports.insert(port_of(a));
  for (const auto& [task_name, want] : expected) {
    const std::string& task = task_name;  // clang 14 cannot capture a structured binding (INFO's lambda)
    const std::string& out = task == "worker:0" ? r0.out : r1.out;
    INFO(task);
    CHECK(env_of(out, task, "RANK") == want[0]);
    CHECK(env_of(out, task, "LOCAL_RANK") == want[1]);
    CHECK(env_of(out, task, "WORLD_SIZE") == want[2]);
    CHECK(env_of(out, task, "LOCAL_WORLD_SIZE") == want[3]);
    CHECK(env_of(out, task, "GROUP_RANK") == want[4]);
    CHECK(env_of(out, task, "MASTER_ADDR") == "127.0.0.1");
    CHECK(env_of(out, task, "MASTER_PORT") == master_port);  // node 0's, the same everywhere
  }
  CHECK(master_port != std::to_string(port));  // not the launchers' meeting port
  CHECK(task_ports.count(std::stoi(master_port)) == 0);
}

TEST_CASE("--nnodes: a task failing on one node stops every node, and every launcher exits with its status") {
  const int port = test_support::free_ports(1)[0];
  TempDir dir;
  const std::vector<std::string> program = {child(), "info", "barrier", dir.str(), "4", "@worker:3", "exit", "3",
                                            "@all", "sleep", "60000", "print", "not stopped"};
  Job node0(node_args(2, 0, port, 2) + program);
  Job node1(node_args(2, 1, port, 2) + program);
  const Result r1 = node1.finish(60), r0 = node0.finish(60);
  INFO("node 0 stdout:\n", r0.out, "\nnode 0 stderr:\n", r0.err, "\nnode 1 stdout:\n", r1.out, "\nnode 1 stderr:\n",
       r1.err);
  REQUIRE_FALSE(r0.timed_out);
  REQUIRE_FALSE(r1.timed_out);
  CHECK(r1.code == 3);
  CHECK(r0.code == 3);
  CHECK(contains(r1.err, "worker:3 exited with status 3; stopping the other tasks"));
  CHECK(contains(r0.err, "node 1 failed with status 3; stopping this node's tasks"));
  CHECK(r0.seconds < 30);  // the sleepers (60 s) were stopped
  CHECK_FALSE(contains(r0.out + r1.out, "not stopped"));
  check_all_gone(task_infos(r0.out));
  check_all_gone(task_infos(r1.out));
}

TEST_CASE("--nnodes: a node whose launcher dies stops the job on the others") {
  const int port = test_support::free_ports(1)[0];
  SUBCASE("node 1's launcher is SIGKILLed") {
    Job node0(node_args(2, 0, port, 1) + std::vector<std::string>{child(), "info", "print", "ready", "sleep", "60000"});
    Job node1(node_args(2, 1, port, 1) + std::vector<std::string>{child(), "info", "print", "ready", "sleep", "60000"});
    REQUIRE(node1.wait_for([](const Result& r) { return contains(r.out, "] ready\n"); }, 30));
    REQUIRE(node0.wait_for([](const Result& r) { return contains(r.out, "] ready\n"); }, 30));
    node1.signal(SIGKILL);
    const Result r0 = node0.finish(30);
    INFO("node 0 stdout:\n", r0.out, "\nnode 0 stderr:\n", r0.err);
    REQUIRE_FALSE(r0.timed_out);
    CHECK(r0.code == 1);
    CHECK(contains(r0.err, "node 1 launcher was lost (its connection closed); stopping this node's tasks"));
    check_all_gone(task_infos(r0.out));
    check_all_gone(task_infos(node1.finish(10).out));  // PR_SET_PDEATHSIG
  }
  SUBCASE("node 0's launcher is SIGKILLed") {
    Job node0(node_args(2, 0, port, 1) + std::vector<std::string>{child(), "info", "print", "ready", "sleep", "60000"});
    Job node1(node_args(2, 1, port, 1) + std::vector<std::string>{child(), "info", "print", "ready", "sleep", "60000"});
    REQUIRE(node0.wait_for([](const Result& r) { return contains(r.out, "] ready\n"); }, 30));
    REQUIRE(node1.wait_for([](const Result& r) { return contains(r.out, "] ready\n"); }, 30));
    node0.signal(SIGKILL);
    const Result r1 = node1.finish(30);
    INFO("node 1 stdout:\n", r1.out, "\nnode 1 stderr:\n", r1.err);
    REQUIRE_FALSE(r1.timed_out);
    CHECK(r1.code == 1);
    CHECK(contains(r1.err, "node 0 launcher was lost (its connection closed); stopping this node's tasks"));
    check_all_gone(task_infos(r1.out));
  }
}

TEST_CASE("--nnodes: launchers that disagree, or a node that never comes, fail with what was wrong") {
  const int port = test_support::free_ports(1)[0];
  SUBCASE("another --nnodes") {
    Job node0(node_args(2, 0, port, 1) + std::vector<std::string>{child(), "info"});
    Job node1(node_args(3, 1, port, 1) + std::vector<std::string>{child(), "info"});
    const Result r0 = node0.finish(60), r1 = node1.finish(60);
    INFO("node 0 stderr:\n", r0.err, "\nnode 1 stderr:\n", r1.err);
    CHECK(r0.code == 1);
    CHECK(r1.code == 1);
    CHECK(contains(r0.err, "node 0: the launchers could not agree on the job: node 1 was started with --nnodes 3, "
                           "node 0 with --nnodes 2"));
    CHECK(contains(r1.err, "node 1: the launchers could not agree on the job: node 0 refused this node: 'node 0 was "
                           "started with --nnodes 2, this node with --nnodes 3"));
    CHECK(task_infos(r0.out + r1.out).empty());  // nothing was started
  }
  SUBCASE("a node that never joins: --rdzv-timeout") {
    const Result r0 = run(node_args(2, 0, port, 1) + std::vector<std::string>{"--rdzv-timeout", "1", child(), "info"});
    INFO("node 0 stderr:\n", r0.err);
    CHECK(r0.code == 1);
    CHECK(contains(r0.err, "timed out after --rdzv-timeout waiting for node(s) 1 to join"));
    CHECK(r0.seconds < 10);
  }
  SUBCASE("no node 0 to join") {
    const Result r1 = run(node_args(2, 1, port, 1) + std::vector<std::string>{"--rdzv-timeout", "1", child(), "info"});
    INFO("node 1 stderr:\n", r1.err);
    CHECK(r1.code == 1);
    CHECK(contains(r1.err, fmt::format("cannot reach node 0 at 127.0.0.1:{} within --rdzv-timeout", port)));
  }
}

namespace {

// A connection to node 0's meeting port that says what the test gives it, as a stranger would.
class Stranger {
 public:
  explicit Stranger(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd_ < 0 || ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
      throw std::runtime_error(fmt::format("cannot connect to node 0: {}", std::strerror(errno)));
  }
  /// The next connection to `listen_fd` (the test playing node 0).
  struct Accepted {
    int listen_fd;
  };
  explicit Stranger(Accepted from) : fd_(::accept4(from.listen_fd, nullptr, nullptr, SOCK_CLOEXEC)) {
    if (fd_ < 0) throw std::runtime_error(fmt::format("accept: {}", std::strerror(errno)));
  }
  Stranger(const Stranger&) = delete;
  Stranger& operator=(const Stranger&) = delete;
  ~Stranger() { ::close(fd_); }

  void say(std::string_view bytes) {  // errors ignored: node 0 may close first
    while (!bytes.empty()) {
      const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n <= 0) return;
      bytes.remove_prefix(static_cast<std::size_t>(n));
    }
  }

  // The next line node 0 sends; "<closed>" when it closed first, "<silent>" after `seconds`.
  std::string hear(double seconds = 10) {
    const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<int>(seconds * 1000));
    for (;;) {
      if (const auto nl = buf_.find('\n'); nl != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return line;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return "<silent>";
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
      char chunk[4096];
      const ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
      if (n <= 0) return "<closed>";
      buf_.append(chunk, static_cast<std::size_t>(n));
    }
  }

 private:
  int fd_ = -1;
  std::string buf_;
};

// A launcher's greeting made by the test with `token`: HELLO, node 0's challenge checked, JOIN
// with `fields`. Returns node 0's answer to the JOIN, or what went wrong before.
std::string join_as(Stranger& s, const std::string& token, const std::string& fields, double seconds = 10) {
  const auto nonce = distribute::net::detail::random_nonce();
  s.say(launch::hello_line(nonce) + "\n");
  const launch::Challenge c = launch::parse_challenge(s.hear());
  if (!distribute::net::detail::macs_equal(c.proof, launch::node0_proof(token, nonce, c.nonce)))
    return "<node 0 did not prove the token>";
  s.say(launch::join_line(launch::join_proof(token, nonce, c.nonce, fields), fields) + "\n");
  return s.hear(seconds);
}

// CPU seconds a process has used (user + system), from /proc.
double cpu_seconds(pid_t pid) {
  std::ifstream f(fmt::format("/proc/{}/stat", pid));
  std::string stat;
  std::getline(f, stat);
  std::istringstream rest(stat.substr(stat.rfind(')') + 2));
  std::vector<std::string> fields{std::istream_iterator<std::string>(rest), {}};
  REQUIRE(fields.size() > 12);
  return static_cast<double>(std::stoll(fields[11]) + std::stoll(fields[12])) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

bool waiting_for_nodes(const Result& r) { return contains(r.err, "waiting for 1 other node(s)"); }

}  // namespace

TEST_CASE("--nnodes without a token the user gave every launcher is a usage error that says how to set one") {
  ::unsetenv("DISTRIBUTE_CLUSTER_TOKEN");
  const std::vector<std::string> meeting = {"--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1",
                                            "--master-port", "29999", "-n", "1"};
  for (const auto& token : std::vector<std::vector<std::string>>{{}, {"--token", "auto"}, {"--no-token"}}) {
    const Result r = run(token + meeting + std::vector<std::string>{child(), "info"});
    INFO("stderr:\n", r.err);
    CHECK(r.code == 2);
    CHECK(contains(r.err, "--nnodes needs a cluster token that every launcher of the job shares: set "
                          "DISTRIBUTE_CLUSTER_TOKEN to the same secret in each launcher's environment (e.g. 'export "
                          "DISTRIBUTE_CLUSTER_TOKEN=$(openssl rand -hex 16)' once, then copy it to every node)"));
    CHECK(task_infos(r.out).empty());
  }
  ::setenv("DISTRIBUTE_CLUSTER_TOKEN", kNodesToken, 1);  // the launcher's environment is a way to give it
  const int port = test_support::free_ports(1)[0];
  Job node0(std::vector<std::string>{"--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1", "--master-port",
                                     std::to_string(port), "-n", "1", child(), "info"});
  Job node1(node_args(2, 1, port, 1) + std::vector<std::string>{child(), "info"});
  const Result r1 = node1.finish(60), r0 = node0.finish(60);
  ::unsetenv("DISTRIBUTE_CLUSTER_TOKEN");
  INFO("node 0 stderr:\n", r0.err, "\nnode 1 stderr:\n", r1.err);
  CHECK(r0.code == 0);
  CHECK(r1.code == 0);
}

TEST_CASE("the node meeting: strangers' lines are refused, take no slot and learn nothing; the real node joins") {
  const int port = test_support::free_ports(1)[0];
  Job node0(node_args(2, 0, port, 1) + std::vector<std::string>{"--rdzv-timeout", "60", child(), "info"});
  REQUIRE(node0.wait_for(waiting_for_nodes, 30));
  struct Line {
    std::string says, answer;
  };
  const std::string zeros(64, '0');
  const std::vector<Line> lines = {
      // The first protocol's HELLO claiming node 1's slot with its own address.
      {"HELLO distribute-launch-nodes/1 2 1 1 127.0.0.1 1\n",
       "ERROR refused: node 0 speaks distribute-launch-nodes/2, not 'distribute-launch-nodes/1'"},
      {"HELLO distribute-launch-nodes/2 2 1 1 127.0.0.1 1\n", "ERROR refused: a HELLO has 3 words, not 7"},
      {"HELLO distribute-launch-nodes/2 two\n", "ERROR refused: the nonce is not 64 hex digits"},
      {"HELLO distribute-launch-nodes/2 " + std::string(64, 'g') + "\n", "ERROR refused: the nonce is not 64 hex digits"},
      {"JOIN " + zeros + " 2 1 1 127.0.0.1 1\n", "ERROR refused: not a distribute-launch node"},
      {"\n", "ERROR refused: not a distribute-launch node"},
      {std::string(600, 'x') + "\n", "<closed>"},          // longer than a greeting may be
      {std::string(2 << 20, 'x'), "<closed>"},             // 2 MiB without a newline
  };
  for (const auto& line : lines) {
    Stranger s(port);
    s.say(line.says);
    const std::string heard = s.hear();
    INFO("said: ", line.says.substr(0, 80));
    CHECK(heard == line.answer);
  }
  {  // A HELLO gets a challenge, whose proof is no use without the token; a JOIN without it is refused.
    Stranger s(port);
    s.say("HELLO distribute-launch-nodes/2 " + zeros + "\n");
    const std::string challenge = s.hear();
    CHECK(challenge.rfind("CHALLENGE ", 0) == 0);
    CHECK(challenge.size() == std::string("CHALLENGE ").size() + 64 + 1 + 64);
    s.say("JOIN " + zeros + " 2 1 1 127.0.0.1 1\n");
    CHECK(s.hear() == "ERROR refused: not proven to hold this job's cluster token");
  }
  {  // With another token, the same.
    Stranger s(port);
    CHECK(join_as(s, "another-secret", "2 1 1 127.0.0.1 1") == "<node 0 did not prove the token>");
  }
  {  // A stranger that says nothing holds its place for a bounded time only.
    Stranger s(port);
    CHECK(s.hear(15) == "<closed>");
  }
  // Node 1's slot is still free: the real node joins and the job runs.
  Job node1(node_args(2, 1, port, 1) + std::vector<std::string>{child(), "info"});
  const Result r1 = node1.finish(60), r0 = node0.finish(60);
  INFO("node 0 stdout:\n", r0.out, "\nnode 0 stderr:\n", r0.err, "\nnode 1 stderr:\n", r1.err);
  CHECK(r0.code == 0);
  CHECK(r1.code == 0);
  CHECK(contains(r0.err, "node 0: refused a connection from 127.0.0.1:"));
  auto infos = task_infos(r0.out);
  for (auto& entry : task_infos(r1.out)) infos.insert(std::move(entry));
  check_cluster(infos, {{"worker", 2}});
  CHECK_FALSE(contains(r0.out + r1.out, "127.0.0.1:1\""));  // the stranger's address is nowhere
  CHECK_FALSE(contains(r0.err + r1.err, kNodesToken));
}

TEST_CASE("the node meeting: a proven launcher whose fields are out of bounds ends it, saying which") {
  struct Bad {
    std::string fields, answer, node0_error;
  };
  const std::vector<Bad> bad = {
      {"2 1 -5 127.0.0.1 5000", "ERROR task count -5 is not between 1 and 1024",
       "sent a malformed JOIN: task count -5 is not between 1 and 1024"},
      {"2 1 2147483647 127.0.0.1 5000", "ERROR task count 2147483647 is not between 1 and 1024",
       "sent a malformed JOIN: task count 2147483647 is not between 1 and 1024"},
      {"2 1 99999999999 127.0.0.1 5000", "ERROR malformed node message: task count '99999999999' is not a number",
       "sent a malformed JOIN: malformed node message: task count '99999999999' is not a number"},
      {"2 1 4 127.0.0.1 65534", "ERROR port 65534 is not between 1 and 65532",
       "sent a malformed JOIN: port 65534 is not between 1 and 65532"},
      {"2 1 1 127.0.0.1 0", "ERROR port 0 is not between 1 and 65535", "port 0 is not between 1 and 65535"},
      {"2 one 1 127.0.0.1 5000", "ERROR malformed node message: node rank 'one' is not a number",
       "node rank 'one' is not a number"},
      {"2 1 1 " + std::string(300, 'h') + " 5000",
       "ERROR host '" + std::string(64, 'h') + "...' (300 bytes) cannot be sent to the other nodes (empty, too long or "
       "with spaces)",
       "host '" + std::string(64, 'h') + "...' (300 bytes) cannot be sent to the other nodes"},
      {"2 0 1 127.0.0.1 5000", "ERROR --node-rank 0 is taken", "two launchers say --node-rank 0"},
      {"2 5 1 127.0.0.1 5000", "ERROR node rank 5 is not between 0 and 1", "node rank 5 is not between 0 and 1"},
      {"-3 1 1 127.0.0.1 5000", "ERROR --nnodes -3 is not between 1 and 1024", "--nnodes -3 is not between 1 and 1024"},
  };
  for (const auto& b : bad) {
    INFO("JOIN fields: ", b.fields.substr(0, 80));
    const int port = test_support::free_ports(1)[0];
    Job node0(node_args(2, 0, port, 1) + std::vector<std::string>{"--rdzv-timeout", "60", child(), "info"});
    REQUIRE(node0.wait_for(waiting_for_nodes, 30));
    Stranger s(port);
    CHECK(join_as(s, kNodesToken, b.fields) == b.answer);
    const Result r0 = node0.finish(30);
    INFO("node 0 stderr:\n", r0.err);
    CHECK(r0.code == 1);
    CHECK(contains(r0.err, "node 0: the launchers could not agree on the job: "));
    CHECK(contains(r0.err, b.node0_error));
    CHECK(task_infos(r0.out).empty());
  }
  SUBCASE("a second launcher claiming a taken node rank gets no slot; the meeting ends for both") {
    const int port = test_support::free_ports(1)[0];
    Job node0(node_args(3, 0, port, 1) + std::vector<std::string>{"--rdzv-timeout", "60", child(), "info"});
    REQUIRE(node0.wait_for([](const Result& r) { return contains(r.err, "waiting for 2 other node(s)"); }, 30));
    Stranger first(port), second(port);
    CHECK(join_as(first, kNodesToken, "3 1 1 127.0.0.1 5000", 1) == "<silent>");  // admitted: waits for node 2
    CHECK(join_as(second, kNodesToken, "3 1 1 127.0.0.2 6000") == "ERROR --node-rank 1 is taken");
    CHECK(first.hear() == "ERROR two launchers say --node-rank 1");
    const Result r0 = node0.finish(30);
    CHECK(r0.code == 1);
    CHECK(contains(r0.err, "two launchers say --node-rank 1"));
  }
}

TEST_CASE("the node meeting: a launcher with another token is refused and says why; node 0 learns nothing of it") {
  const int port = test_support::free_ports(1)[0];
  Job node0(node_args(2, 0, port, 1) + std::vector<std::string>{"--rdzv-timeout", "5", child(), "info"});
  Job node1(node_args(2, 1, port, 1, "not-the-job-secret") + std::vector<std::string>{child(), "info"});
  const Result r1 = node1.finish(60), r0 = node0.finish(60);
  INFO("node 0 stderr:\n", r0.err, "\nnode 1 stderr:\n", r1.err);
  CHECK(r1.code == 1);
  CHECK(contains(r1.err, fmt::format("node 1: the launchers could not agree on the job: node 0 at 127.0.0.1:{} did "
                                     "not prove it holds this job's cluster token: give every launcher the same "
                                     "DISTRIBUTE_CLUSTER_TOKEN",
                                     port)));
  CHECK(r0.code == 1);
  CHECK(contains(r0.err, "timed out after --rdzv-timeout waiting for node(s) 1 to join"));
  CHECK(task_infos(r0.out + r1.out).empty());
}

namespace {

// A listening socket on 127.0.0.1:port for the test to play node 0 (a stranger's, to a joiner).
int listen_on(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 16) != 0)
    throw std::runtime_error(fmt::format("cannot listen on {}: {}", port, std::strerror(errno)));
  return fd;
}

}  // namespace

TEST_CASE("the node meeting, seen by a joiner: a node 0 that answers wrongly is refused with what was wrong") {
  struct Bad {
    std::string cluster;  // node 0's answer to the JOIN ({} is the joiner's entry as it sent it)
    std::string error;
  };
  const std::vector<Bad> bad = {
      {"CLUSTER 127.0.0.1 29400 3 0,1,127.0.0.1,29401 {} 2,1,127.0.0.1,29500",
       "malformed cluster message from node 0 (3 nodes, 7 words; this node has --nnodes 2)"},
      {"CLUSTER 127.0.0.1 29400 2 {} 0,1,127.0.0.1,29401", "node 0 sent node 1's entry in place 0"},
      {"CLUSTER 127.0.0.1 29400 2 0,1,127.0.0.1,29401 1,7,127.0.0.1,29500",
       "node 0's cluster does not hold this node's entry as it sent it"},
      {"CLUSTER 127.0.0.1 70000 2 0,1,127.0.0.1,29401 {}", "master port 70000 is not between 1 and 65535"},
      {"CLUSTER 127.0.0.1 29400 2 0,1,127.0.0.1 {}", "malformed node entry '0,1,127.0.0.1' from node 0"},
      {"WELCOME", "unexpected message from node 0: 'WELCOME'"},
  };
  SUBCASE("a cluster that is malformed, or does not hold this node as it joined") {
    for (const auto& b : bad) {
      INFO("node 0 says: ", b.cluster);
      const int port = test_support::free_ports(1)[0];
      const int listen_fd = listen_on(port);
      Job node1(node_args(2, 1, port, 1) + std::vector<std::string>{"--rdzv-timeout", "20", child(), "info"});
      {
        Stranger joiner(Stranger::Accepted{listen_fd});
        const auto theirs = launch::parse_hello(joiner.hear());
        const auto mine = distribute::net::detail::random_nonce();
        joiner.say(launch::challenge_line(mine, launch::node0_proof(kNodesToken, theirs, mine)) + "\n");
        const launch::Join j = launch::parse_join(joiner.hear());
        REQUIRE(distribute::net::detail::macs_equal(j.proof, launch::join_proof(kNodesToken, theirs, mine, j.fields)));
        const auto w = [&] {  // "2 1 1 HOST PORT" -> "1,1,HOST,PORT"
          std::istringstream in(j.fields);
          std::string nnodes, rank, tasks, host, port_base;
          in >> nnodes >> rank >> tasks >> host >> port_base;
          return fmt::format("{},{},{},{}", rank, tasks, host, port_base);
        }();
        std::string line = b.cluster;
        if (const auto at = line.find("{}"); at != std::string::npos) line.replace(at, 2, w);
        joiner.say(line + "\n");
        const Result r1 = node1.finish(30);
        INFO("node 1 stderr:\n", r1.err);
        CHECK(r1.code == 1);
        CHECK(contains(r1.err, "node 1: the launchers could not agree on the job: " + b.error));
        CHECK(task_infos(r1.out).empty());
      }
      ::close(listen_fd);
    }
  }
  SUBCASE("a node 0 that answers the HELLO with something else") {
    const int port = test_support::free_ports(1)[0];
    const int listen_fd = listen_on(port);
    Job node1(node_args(2, 1, port, 1) + std::vector<std::string>{"--rdzv-timeout", "20", child(), "info"});
    {
      Stranger joiner(Stranger::Accepted{listen_fd});
      (void)joiner.hear();
      joiner.say("CHALLENGE " + std::string(64, '0') + "\n");
      const Result r1 = node1.finish(30);
      CHECK(r1.code == 1);
      CHECK(contains(r1.err, "node 1: the launchers could not agree on the job: unexpected answer from node 0: "
                             "'CHALLENGE " + std::string(54, '0') + "...' (74 bytes)"));
    }
    ::close(listen_fd);
  }
  SUBCASE("a node 0 that closes every connection unanswered, until --rdzv-timeout") {
    const int port = test_support::free_ports(1)[0];
    const int listen_fd = listen_on(port);
    Job node1(node_args(2, 1, port, 1) + std::vector<std::string>{"--rdzv-timeout", "3", child(), "info"});
    Result r1;
    const auto until = Clock::now() + std::chrono::seconds(20);
    while (Clock::now() < until) {
      pollfd p{listen_fd, POLLIN, 0};
      if (::poll(&p, 1, 100) > 0) ::close(::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC));
      if (node1.wait_for([](const Result& r) { return contains(r.err, "rdzv-timeout"); }, 0.05)) break;
    }
    r1 = node1.finish(30);
    INFO("node 1 stderr:\n", r1.err);
    CHECK(r1.code == 1);
    CHECK(contains(r1.err, fmt::format("node 1: the launchers could not agree on the job: node 0 at 127.0.0.1:{} "
                                       "closed every connection before answering, until --rdzv-timeout",
                                       port)));
    ::close(listen_fd);
  }
}

TEST_CASE("the node meeting under 189 idle connections at ulimit -n 64: node 0 neither spins nor exits; the node joins") {
  const int port = test_support::free_ports(1)[0];
  std::vector<std::string> argv = {"/bin/sh", "-c", "ulimit -n 64 && exec \"$0\" \"$@\"", launcher()};
  argv = argv + node_args(2, 0, port, 1) + std::vector<std::string>{"--rdzv-timeout", "60", child(), "info"};
  Job node0(CommandLine{argv});
  REQUIRE(node0.wait_for(waiting_for_nodes, 30));
  std::vector<std::unique_ptr<Stranger>> idle;
  for (int k = 0; k < 189; ++k) idle.push_back(std::make_unique<Stranger>(port));
  const double cpu_before = cpu_seconds(node0.pid());
  std::this_thread::sleep_for(std::chrono::seconds(3));
  const double cpu_in_3s = cpu_seconds(node0.pid()) - cpu_before;
  CHECK(cpu_in_3s < 0.5);  // a spinning accept loop burns ~3 s here
  Job node1(node_args(2, 1, port, 1) + std::vector<std::string>{child(), "info"});
  const Result r1 = node1.finish(60), r0 = node0.finish(60);
  INFO("node 0 stderr:\n", r0.err, "\nnode 1 stderr:\n", r1.err);
  CHECK(r0.code == 0);
  CHECK(r1.code == 0);
  CHECK(contains(r0.err, "node 0: refused connection from 127.0.0.1:"));  // the accept policy's bound, logged
}

TEST_CASE("a usage error exits 2 and prints one line: what was wrong, and where the help is") {
  const std::string c = child();
  struct Bad {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Bad> bad = {
      {{}, "no program to run: give it after the options, e.g. 'distribute-launch -n 2 ./train'"},
      {{"-n", "2", "--"}, "no program to run"},
      {{"-n", "2"}, "no program to run"},
      {{"-n", "0", "--", c}, "-n must be between 1 and 1024, got 0"},
      {{"-np", "0", c}, "-np must be between 1 and 1024, got 0"},
      {{"-n", "-1", "--", c}, "-n must be between 1 and 1024, got -1"},
      {{"-n", "two", "--", c}, "-n expects an integer, got 'two'"},
      {{"-np", "two", c}, "-np expects an integer, got 'two'"},
      {{"-np3x", c}, "-np expects an integer, got '3x'"},
      {{"-n"}, "-n needs a value"},
      {{"-np"}, "-np needs a value"},
      {{"--bogus", "-n", "1", "--", c}, "unknown option '--bogus'"},
      {{"-x", "-n", "1", c}, "unknown option '-x'"},
      {{"--", c}, "the number of workers (-n N) is required"},
      {{c}, "the number of workers (-n N) is required"},
      {{"--ps", "2", "--", c}, "--ps needs --workers M"},
      {{"--nnodes", "2", "-n", "1", c}, "--nnodes needs --node-rank R (0 for the node that --master-addr names)"},
      {{"--nnodes", "2", "--node-rank", "2", "-n", "1", c}, "--node-rank must be below --nnodes 2, got 2"},
      {{"--nnodes", "2", "--node-rank", "1", "-n", "1", c},
       "--nnodes needs --master-addr and --master-port (where node 0's launcher listens)"},
      {{"--node-rank", "1", "-n", "1", c}, "--node-rank 1 needs --nnodes"},
      {{"--master-port", "70000", "-n", "1", c}, "--master-port expects a port between 1 and 65535, got '70000'"},
      {{"--nnodes", "2", "--node-rank", "0", "--master-addr", "h", "--master-port", "1", "--ps", "1", "--workers",
        "1", c},
       "--nnodes starts worker tasks only (-n N per node); --ps and --chief are for one host"},
      {{"--ps", "0", "--workers", "1", "--", c}, "--ps must be between 1 and 1024, got 0"},
      {{"--env", "NOEQUALS", "-n", "1", "--", c}, "--env expects K=V, got 'NOEQUALS'"},
      {{"--env", "TF_CONFIG={}", "-n", "1", "--", c}, "--env cannot set TF_CONFIG: the launcher sets it for each task"},
      {{"--env", "RANK=3", "-n", "1", c}, "--env cannot set RANK: the launcher sets it for each task"},
      {{"--env", "MASTER_PORT=1", "-n", "1", c}, "--env cannot set MASTER_PORT: the launcher sets it for each task"},
      {{"--timeout", "soon", "-n", "1", "--", c}, "--timeout expects a non-negative number of seconds, got 'soon'"},
      {{"--keep-going=yes", "-n", "1", "--", c}, "--keep-going takes no value"},
      {{"--restart-workers", "1", "-n", "2", "--", c},
       "--restart-workers needs --ps (only a parameter-server cluster takes a worker back)"},
      {{"--restart-workers", "x", "--ps", "1", "--workers", "1", "--", c}, "--restart-workers expects an integer, got 'x'"},
      {{"--restart-delay", "-1", "--ps", "1", "--workers", "1", "--", c},
       "--restart-delay expects a non-negative number of seconds, got '-1'"},
      {{"--env", "DISTRIBUTE_LAUNCH_RESTART=1", "-n", "1", "--", c},
       "--env cannot set DISTRIBUTE_LAUNCH_RESTART: the launcher sets it for each task"},
      {{"--bind-to", "socket", "-n", "1", "--", c}, "--bind-to expects 'core' or 'none', got 'socket'"},
      {{"--bind-to", "-n", "1", "--", c}, "--bind-to expects 'core' or 'none', got '-n'"},
      {{"--token", "x", "--no-token", "-n", "1", "--", c}, "--token and --no-token exclude each other"},
      {{"--no-token", "--token", "auto", "-n", "1", "--", c}, "--token and --no-token exclude each other"},
      {{"--no-token=1", "-n", "1", "--", c}, "--no-token takes no value"},
  };
  for (const auto& [args, message] : bad) {
    std::string joined;
    for (const auto& a : args) joined += " " + a;
    const Result r = run(args);
    INFO("args:", joined, "\nstdout:\n", r.out, "\nstderr:\n", r.err);
    CHECK(r.code == 2);
    CHECK(r.out.empty());
    CHECK(lines(r.err).size() == 1);
    CHECK(r.err.rfind("distribute-launch: " + message, 0) == 0);
    CHECK(contains(r.err, "; see 'distribute-launch --help'\n"));
    CHECK_FALSE(contains(r.err, "usage: distribute-launch"));  // the help is for --help only
  }
}

TEST_CASE("--help prints the usage on stdout, --version the library's version") {
  for (const char* opt : {"--help", "-h"}) {
    const Result help = run({"-n", "2", opt, child()});
    INFO(opt, "\nstdout:\n", help.out, "\nstderr:\n", help.err);
    CHECK(help.code == 0);
    CHECK(help.out.rfind("usage: distribute-launch -n N [options] [--] PROGRAM [ARGS...]\n", 0) == 0);
    for (const char* names : {"-np N", "--version", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                              "MASTER_ADDR", "MASTER_PORT"})
      CHECK(contains(help.out, names));
    CHECK(help.err.empty());
  }
  const Result version = run({"--version"});
  INFO("stdout:\n", version.out, "\nstderr:\n", version.err);
  CHECK(version.code == 0);
  CHECK(std::regex_match(version.out, std::regex(R"(distribute-launch \(distribute\) [0-9]+\.[0-9]+\.[0-9]+\n)")));
  // The version of the library in this checkout (include/distribute/version.hpp).
  CHECK(version.out == fmt::format("distribute-launch (distribute) {}\n", DISTRIBUTE_VERSION_STRING));
  CHECK(version.err.empty());
}

TEST_CASE("-np N is -n N, and the program may follow the options without '--'") {
  for (const std::vector<std::string>& count : std::vector<std::vector<std::string>>{
           {"-np", "2"}, {"-np2"}, {"--np", "2"}, {"--np=2"}, {"-n", "2"}, {"-n2"}, {"--workers", "2"}}) {
    std::vector<std::string> args = count;
    args.insert(args.end(), {child(), "info", "exit", "0"});
    const Result r = run(args);
    INFO("count option: ", count[0], "\nstdout:\n", r.out, "\nstderr:\n", r.err);
    CHECK(r.code == 0);
    check_cluster(task_infos(r.out), {{"worker", 2}});
  }
  SUBCASE("everything after the program is the program's, options included") {
    const Result r = run({"-n", "1", "--timeout", "30", child(), "print", "-n", "print", "--version", "print", "--"});
    INFO("stdout:\n", r.out, "\nstderr:\n", r.err);
    CHECK(r.code == 0);
    CHECK(r.out == "[worker:0] -n\n[worker:0] --version\n[worker:0] --\n");
  }
  SUBCASE("'--' still ends the options") {
    const Result r = run({"-np", "1", "--", child(), "print", "after --"});
    INFO("stdout:\n", r.out, "\nstderr:\n", r.err);
    CHECK(r.code == 0);
    CHECK(r.out == "[worker:0] after --\n");
  }
}

namespace {
// "[T:I] ENV NAME=VALUE" lines: task -> name -> value.
std::map<std::string, std::map<std::string, std::string>> task_env(const std::string& out) {
  static const std::regex re(R"(^\[([a-z]+:[0-9]+)\] ENV ([A-Z_]+)=(.*)$)");
  std::map<std::string, std::map<std::string, std::string>> env;
  for (const auto& line : lines(out)) {
    std::smatch m;
    if (std::regex_match(line, m, re)) env[m[1]][m[2]] = m[3];
  }
  return env;
}

// Sets an environment variable for the launcher (inherited by its tasks) for one scope.
struct ScopedEnv {
  std::string name;
  ScopedEnv(std::string n, const char* value) : name(std::move(n)) { ::setenv(name.c_str(), value, 1); }
  ~ScopedEnv() { ::unsetenv(name.c_str()); }
};
}  // namespace

TEST_CASE("every task gets torchrun's RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT") {
  // Variables of an outer job (the launcher run under torchrun, say) must not leak into the tasks.
  const ScopedEnv outer_rank("RANK", "17"), outer_world("WORLD_SIZE", "99"), outer_port("MASTER_PORT", "1");
  struct Case {
    std::vector<std::string> cluster;
    std::vector<std::string> rank_order;  // tasks in RANK order
  };
  const std::vector<Case> cases = {
      {{"-np", "3"}, {"worker:0", "worker:1", "worker:2"}},
      {{"-n", "2", "--chief"}, {"chief:0", "worker:0", "worker:1"}},
      // chief, workers, ps: the chief is rank 0 (MultiWorkerMirroredStrategy's order, chief first).
      {{"--ps", "2", "--workers", "2"}, {"chief:0", "worker:0", "worker:1", "ps:0", "ps:1"}},
  };
  for (const Case& c : cases) {  // no structured binding: INFO captures it, and clang 14 cannot
    const std::vector<std::string>& cluster = c.cluster;
    const std::vector<std::string>& order = c.rank_order;
    std::vector<std::string> args = cluster;
    args.push_back(child());
    for (const char* v : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"})
      args.insert(args.end(), {"env", v});
    // Every task reports before any ends (the ps tasks are stopped once the others are done).
    const TempDir barrier;
    args.insert(args.end(), {"info", "barrier", barrier.str(), std::to_string(order.size()), "@ps", "sleep", "30000"});
    const Result r = run(args);
    INFO("cluster: ", cluster[0], " ", cluster[1], "\nstdout:\n", r.out, "\nstderr:\n", r.err);
    CHECK(r.code == 0);
    const auto env = task_env(r.out);
    const auto infos = task_infos(r.out);
    REQUIRE(env.size() == order.size());
    REQUIRE(infos.size() == order.size());
    const std::string master_port = env.begin()->second.at("MASTER_PORT");
    const std::string world = std::to_string(order.size());
    for (std::size_t rank = 0; rank < order.size(); ++rank) {
      const std::string& task = order[rank];
      INFO("task ", task);
      REQUIRE(env.count(task) == 1);
      const auto& e = env.at(task);
      CHECK(e.at("RANK") == std::to_string(rank));
      CHECK(e.at("LOCAL_RANK") == std::to_string(rank));  // one host
      CHECK(e.at("WORLD_SIZE") == world);
      CHECK(e.at("LOCAL_WORLD_SIZE") == world);
      CHECK(e.at("MASTER_ADDR") == "127.0.0.1");
      CHECK(e.at("MASTER_PORT") == master_port);
      // TF_CONFIG's address of the task of rank r is MASTER_PORT + 1 + r: MASTER_PORT is no task's.
      const json::value& tf = infos.at(task).tf;
      const auto type = task.substr(0, task.find(':'));
      const int index = std::stoi(task.substr(task.find(':') + 1));
      const auto addresses = strings(tf.at("cluster").at(type));
      REQUIRE(index < static_cast<int>(addresses.size()));
      CHECK(port_of(addresses[static_cast<std::size_t>(index)]) == std::stoi(master_port) + 1 + static_cast<int>(rank));
    }
  }
}

TEST_CASE("a torch-style program that reads only RANK, WORLD_SIZE and MASTER_* runs unchanged") {
  const std::string torch_style = env_path("LAUNCHER_TORCH_STYLE");
  SUBCASE("-np 3: rank 0 listens on MASTER_PORT, ranks 1 and 2 join it") {
    const Result r = run({"-np", "3", torch_style});
    INFO("stdout:\n", r.out, "\nstderr:\n", r.err);
    CHECK(r.code == 0);
    CHECK(contains(r.out, "[worker:0] TORCH rank=0 local_rank=0 world_size=3 local_world_size=3 all 3 ranks joined\n"));
    CHECK(contains(r.out, "[worker:1] TORCH rank=1 local_rank=1 world_size=3 local_world_size=3 joined\n"));
    CHECK(contains(r.out, "[worker:2] TORCH rank=2 local_rank=2 world_size=3 local_world_size=3 joined\n"));
  }
  SUBCASE("a ps cluster: every task, ps included, has a rank") {
    const Result r = run({"--ps", "1", "--workers", "2", torch_style});
    INFO("stdout:\n", r.out, "\nstderr:\n", r.err);
    CHECK(r.code == 0);
    CHECK(contains(r.out, "[chief:0] TORCH rank=0 local_rank=0 world_size=4 local_world_size=4 all 4 ranks joined\n"));
    CHECK(contains(r.out, "[worker:1] TORCH rank=2 local_rank=2 world_size=4 local_world_size=4 joined\n"));
  }
  SUBCASE("without the launcher's variables it fails and says which is missing") {
    const Result r = run({"-n", "1", "--", "env", "-u", "RANK", torch_style});
    INFO("stdout:\n", r.out, "\nstderr:\n", r.err);
    CHECK(r.code == 3);
    CHECK(contains(r.err, "[worker:0] launcher_torch_style: RANK is not set\n"));
  }
}

TEST_CASE("LauncherClusterResolver (port_offset 1) resolves the same cluster as TF_CONFIG under the launcher") {
  const char* resolver_child = std::getenv("LAUNCHER_RESOLVER_CHILD");
  if (!resolver_child || !*resolver_child) {
    MESSAGE("LAUNCHER_RESOLVER_CHILD is not set (built without Boost.JSON): not checked");
    return;
  }
  const Result r = run({"-np", "3", resolver_child});
  INFO("stdout:\n", r.out, "\nstderr:\n", r.err);
  REQUIRE(r.code == 0);
  static const std::regex tf_re(R"(^\[(worker:[0-9])\] RESOLVER tf_config=(\S+) (.*)$)");
  static const std::regex launcher_re(R"(^\[(worker:[0-9])\] RESOLVER launcher=(\S+) local_rank=([0-9]+) (.*)$)");
  std::map<std::string, std::pair<std::string, std::string>> tf, launched;
  std::map<std::string, std::string> local_rank;
  for (const auto& line : lines(r.out)) {
    std::smatch m;
    if (std::regex_match(line, m, tf_re)) tf[m[1]] = {m[2], m[3]};
    if (std::regex_match(line, m, launcher_re)) {
      launched[m[1]] = {m[2], m[4]};
      local_rank[m[1]] = m[3];
    }
  }
  REQUIRE(tf.size() == 3);
  REQUIRE(launched.size() == 3);
  for (int k = 0; k < 3; ++k) {
    const std::string task = fmt::format("worker:{}", k);
    INFO("task ", task);
    CHECK(tf[task].first == task);
    CHECK(launched[task] == tf[task]);  // the same task id and the same cluster JSON
    CHECK(local_rank[task] == std::to_string(k));
  }
}

}  // TEST_SUITE

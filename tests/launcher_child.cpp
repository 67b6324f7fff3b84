// A tiny task program for tests/test_launcher.cpp: it runs the commands given in argv, in order.
//
//   info               print "INFO task=<DISTRIBUTE_LAUNCH_TASK> pid=<pid> tf_config=<raw TF_CONFIG>"
//   env NAME           print "ENV NAME=<value>" or "ENV NAME unset"
//   affinity           print "AFFINITY <task> <cpus>": the CPUs it may run on, e.g. "0,1" (Linux)
//   print TEXT         print TEXT and a newline on stdout
//   eprint TEXT        print TEXT and a newline on stderr
//   partial TEXT       print TEXT on stdout without a newline
//   sleep MS           sleep MS milliseconds
//   exit CODE          exit with CODE
//   kill-self SIG      send signal SIG to itself
//   ignore-term        ignore SIGTERM from now on
//   trap-term          on SIGTERM print "caught SIGTERM" and exit 0
//   grandchild         fork a process that prints "GRANDCHILD pid=<pid>" and sleeps for a minute
//   barrier DIR N      create DIR/<task>, then wait (up to 30 s, else exit 97) until DIR holds N
//                      entries: every task has got that far
//   @TYPE | @TYPE:IDX  run the following commands only in tasks of that type (and index)
//   @all               run the following commands in every task again
//   @FILTER#K          as @FILTER, and only when DISTRIBUTE_LAUNCH_RESTART is K (the K-th restart)
//
// stdout is line-buffered, so the launcher sees each line as soon as it is printed.
#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

namespace {

extern "C" void on_term(int) {
  const char msg[] = "caught SIGTERM\n";
  [[maybe_unused]] auto n = ::write(1, msg, sizeof msg - 1);
  ::_exit(0);
}

const char* env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

int count_entries(const char* dir) {
  DIR* d = ::opendir(dir);
  if (!d) return -1;
  int n = 0;
  while (const dirent* e = ::readdir(d))
    if (e->d_name[0] != '.') ++n;
  ::closedir(d);
  return n;
}

int usage(const char* what) {
  std::fprintf(stderr, "launcher_child: bad arguments near '%s'\n", what);
  return 99;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const std::string task = env_or("DISTRIBUTE_LAUNCH_TASK", "");
  const std::string type = task.substr(0, task.find(':'));
  bool active = true;
  for (int i = 1; i < argc; ++i) {
    const std::string cmd = argv[i];
    auto arg = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    if (!cmd.empty() && cmd[0] == '@') {
      std::string filter = cmd.substr(1);
      bool this_start = true;
      if (const auto hash = filter.find('#'); hash != std::string::npos) {
        this_start = filter.substr(hash + 1) == env_or("DISTRIBUTE_LAUNCH_RESTART", "");
        filter.resize(hash);
      }
      active = this_start && (filter == "all" || filter == task || filter == type);
      continue;
    }
    const bool takes_arg = cmd == "env" || cmd == "print" || cmd == "eprint" || cmd == "partial" ||
                           cmd == "sleep" || cmd == "exit" || cmd == "kill-self" || cmd == "barrier";
    const char* a = takes_arg ? arg() : nullptr;
    const char* b = cmd == "barrier" ? arg() : nullptr;
    if ((takes_arg && !a) || (cmd == "barrier" && !b)) return usage(cmd.c_str());
    if (!active) continue;
    if (cmd == "affinity") {
      cpu_set_t set;
      CPU_ZERO(&set);
      if (::sched_getaffinity(0, sizeof set, &set) != 0) return 95;
      std::string cpus;
      for (int c = 0; c < CPU_SETSIZE; ++c) {
        if (CPU_ISSET(c, &set)) cpus += (cpus.empty() ? "" : ",") + std::to_string(c);
      }
      std::printf("AFFINITY %s %s\n", task.c_str(), cpus.c_str());
    } else if (cmd == "info") {
      std::printf("INFO task=%s pid=%d tf_config=%s\n", task.c_str(), static_cast<int>(::getpid()),
                  env_or("TF_CONFIG", "<unset>"));
    } else if (cmd == "env") {
      if (const char* v = std::getenv(a))
        std::printf("ENV %s=%s\n", a, v);
      else
        std::printf("ENV %s unset\n", a);
    } else if (cmd == "print") {
      std::printf("%s\n", a);
    } else if (cmd == "eprint") {
      std::fprintf(stderr, "%s\n", a);
    } else if (cmd == "partial") {
      std::printf("%s", a);
      std::fflush(stdout);
    } else if (cmd == "sleep") {
      std::this_thread::sleep_for(std::chrono::milliseconds(std::atol(a)));
    } else if (cmd == "exit") {
      std::fflush(stdout);
      return std::atoi(a);
    } else if (cmd == "kill-self") {
      std::fflush(stdout);
      ::kill(::getpid(), std::atoi(a));
      ::pause();
    } else if (cmd == "barrier") {
      const std::string mine = std::string(a) + "/" + task;
      const int fd = ::open(mine.c_str(), O_CREAT | O_WRONLY, 0644);
      if (fd < 0) return 96;
      ::close(fd);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (count_entries(a) < std::atoi(b)) {
        if (std::chrono::steady_clock::now() > deadline) return 97;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    } else if (cmd == "ignore-term") {
      ::signal(SIGTERM, SIG_IGN);
    } else if (cmd == "trap-term") {
      ::signal(SIGTERM, on_term);
    } else if (cmd == "grandchild") {
      std::fflush(stdout);
      int ready[2];
      if (::pipe(ready) != 0) return 98;
      if (::fork() == 0) {
        std::printf("GRANDCHILD pid=%d\n", static_cast<int>(::getpid()));
        std::fflush(stdout);
        [[maybe_unused]] auto n = ::write(ready[1], "x", 1);
        std::this_thread::sleep_for(std::chrono::seconds(60));
        ::_exit(0);
      }
      char c;
      [[maybe_unused]] auto n = ::read(ready[0], &c, 1);  // it has printed: go on
      ::close(ready[0]);
      ::close(ready[1]);
    } else {
      return usage(cmd.c_str());
    }
  }
  return 0;
}

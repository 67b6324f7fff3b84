// Real child processes for multi-process tests: start with an environment, capture output,
// wait with a deadline (a test fails instead of hanging), kill.
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

namespace test_support {

struct Child {
  pid_t pid = -1;
  int out_fd = -1;  // stdout and stderr, merged
  std::string output;
  int status = -1;  // exit code, or 128 + signal
  bool done = false;
};

/// Starts argv[0] with `env` added to this process's environment. The child is SIGKILLed when
/// this process dies (PR_SET_PDEATHSIG): a test that crashes, or that a sanitizer stops, leaves no
/// servers behind holding ports. Call it from a thread that outlives the child (the main thread).
inline Child spawn(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env) {
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the test died before the line above
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    close(fds[0]);
    close(fds[1]);
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(fds[1]);
  fcntl(fds[0], F_SETFL, O_NONBLOCK);
  Child child;
  child.pid = pid;
  child.out_fd = fds[0];
  return child;
}

/// Reads output and reaps children until all exit or `deadline` passes; then kills the rest
/// (SIGKILL) and marks them with status -2. Returns true if all exited by themselves.
inline bool wait_all(std::vector<Child>& children, std::chrono::milliseconds deadline) {
  const auto end = std::chrono::steady_clock::now() + deadline;
  auto drain = [](Child& c) {
    char buf[4096];
    for (;;) {
      ssize_t n = read(c.out_fd, buf, sizeof buf);
      if (n <= 0) break;
      c.output.append(buf, static_cast<std::size_t>(n));
    }
  };
  for (;;) {
    bool all_done = true;
    for (auto& c : children) {
      drain(c);
      if (c.done) continue;
      int st = 0;
      pid_t r = waitpid(c.pid, &st, WNOHANG);
      if (r == c.pid) {
        c.done = true;
        c.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        drain(c);
      } else {
        all_done = false;
      }
    }
    if (all_done) break;
    if (std::chrono::steady_clock::now() > end) {
      for (auto& c : children) {
        if (!c.done) {
          kill(c.pid, SIGKILL);
          waitpid(c.pid, nullptr, 0);
          c.done = true;
          c.status = -2;
          drain(c);
        }
      }
      for (auto& c : children) close(c.out_fd);
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (auto& c : children) close(c.out_fd);
  return true;
}

/// Free TCP ports on 127.0.0.1 (bound and released; a small race the tests tolerate).
inline std::vector<int> free_ports(int n) {
  std::vector<int> fds, ports;
  for (int i = 0; i < n; ++i) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t len = sizeof a;
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    ports.push_back(ntohs(a.sin_port));
    fds.push_back(fd);
  }
  for (int fd : fds) close(fd);
  return ports;
}

/// TF_CONFIG for `n` workers on the given ports, for task `index`.
inline std::string tf_config(const std::vector<int>& ports, int index, const std::string& type = "worker") {
  std::string workers;
  for (std::size_t i = 0; i < ports.size(); ++i) workers += fmt::format("{}\"127.0.0.1:{}\"", i ? ", " : "", ports[i]);
  return fmt::format(R"({{"cluster": {{"worker": [{}]}}, "task": {{"type": "{}", "index": {}}}}})", workers, type, index);
}

/// The task names of `n` workers: "worker:0", "worker:1", ...
inline std::vector<std::string> worker_names(int n) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) out.push_back(fmt::format("worker:{}", i));
  return out;
}

}  // namespace test_support

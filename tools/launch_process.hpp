// distribute-launch's processes: starting a task, the signals the launcher forwards, and what a
// task's wait status means.
//
// Process groups: every task runs in its own process group (its pid is the group id), so a Ctrl-C
// at the terminal reaches only the launcher, which forwards it exactly once, to each task's whole
// group (the task and anything it spawned). When a task's main process exits, the launcher
// SIGKILLs whatever is left in its group before reaping it (race-free: the zombie still holds the
// group id), so no orphans stay behind. On Linux each task also gets PR_SET_PDEATHSIG=SIGKILL, so
// the tasks die even if the launcher itself is SIGKILLed. Tasks read stdin from /dev/null (a
// background process group reading the terminal would stop).
//
// Signals reach the launcher's poll loop through a self-pipe: the handler writes the signal's
// number, the loop reads it (take_signals).
#pragma once

#include <fmt/format.h>

#include "launch_binding.hpp"

#include <cerrno>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <fcntl.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sched.h>
#include <sys/prctl.h>
#endif

namespace launch {

inline constexpr int kForwardedSignals[] = {SIGINT, SIGTERM, SIGHUP};

namespace process_detail {
inline int signal_pipe[2] = {-1, -1};
}  // namespace process_detail

extern "C" inline void launch_on_signal(int sig) {
  const int saved = errno;
  const unsigned char b = static_cast<unsigned char>(sig);
  [[maybe_unused]] const ssize_t n = ::write(process_detail::signal_pipe[1], &b, 1);
  errno = saved;
}

/// Routes the forwarded signals and SIGCHLD to the self-pipe; ignores SIGPIPE (a closed stdout
/// must not kill the launcher).
inline void install_signal_handlers() {
  if (::pipe2(process_detail::signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
    throw std::runtime_error(fmt::format("pipe: {}", std::strerror(errno)));
  struct sigaction sa {};
  sa.sa_handler = launch_on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (const int sig : kForwardedSignals) ::sigaction(sig, &sa, nullptr);
  sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  ::sigaction(SIGCHLD, &sa, nullptr);
  struct sigaction ign {};
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  ::sigaction(SIGPIPE, &ign, nullptr);
}

/// The fd the poll loop waits on for signals.
inline int signal_fd() { return process_detail::signal_pipe[0]; }

/// The signals that arrived since the last call, in order.
inline std::vector<int> take_signals() {
  std::vector<int> out;
  unsigned char buf[64];
  for (;;) {
    const ssize_t n = ::read(process_detail::signal_pipe[0], buf, sizeof buf);
    if (n <= 0) break;
    for (ssize_t k = 0; k < n; ++k) out.push_back(buf[k]);
  }
  return out;
}

/// fds 0-2 must be open, or pipes created later could land on them.
inline void ensure_std_fds() {
  for (int fd = 0; fd < 3; ++fd) {
    if (::fcntl(fd, F_GETFD) == -1 && errno == EBADF) {
      const int n = ::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
      if (n >= 0 && n != fd) {
        ::dup2(n, fd);
        ::close(n);
      }
    }
  }
}

inline std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = ::strsignal(sig);
    return fmt::format("was killed by signal {} ({})", sig, name ? name : "?");
  }
  return fmt::format("ended with wait status {:#x}", status);
}

/// The launcher's exit status for a task's wait status (128+signal for a signal).
inline int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

inline bool succeeded(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }

inline const char* signal_name(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    case SIGKILL: return "SIGKILL";
    default: return "signal";
  }
}

/// Sends `sig` to the process group `pid` leads (to `pid` alone when there is no such group).
inline void signal_group(pid_t pid, int sig) {
  if (::kill(-pid, sig) != 0) ::kill(pid, sig);
}

/// A child that exited, reaped: its pid and wait status.
struct ExitedProcess {
  pid_t pid = -1;
  int status = 0;
};

/// Reaps the next child that exited; none when no child has. When `leads_task(pid)`, whatever the
/// task left in its process group is SIGKILLed first, while its zombie still holds the group id
/// (so the id cannot have been reused).
template <typename LeadsTask>
std::optional<ExitedProcess> reap_next(LeadsTask&& leads_task) {
  siginfo_t info{};
  if (::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0) return std::nullopt;  // ECHILD etc.
  if (info.si_pid == 0) return std::nullopt;
  ExitedProcess exited{info.si_pid, 0};
  if (leads_task(exited.pid)) ::kill(-exited.pid, SIGKILL);  // ESRCH when nothing is left
  while (::waitpid(exited.pid, &exited.status, 0) < 0 && errno == EINTR) {
  }
  return exited;
}

/// A started task: its pid (its process group's id) and the non-blocking read ends of its
/// stdout and stderr; or, when it could not be started, why.
struct StartedProcess {
  pid_t pid = -1;
  int out_fd = -1;
  int err_fd = -1;
  std::string error;
};

/// Starts `command` with environment `env` in a process group of its own, stdin from /dev/null,
/// stdout and stderr into pipes, bound to `cpus` when not empty. `name` ("worker:0") is for the
/// messages. The launcher is single-threaded, so the child may run ordinary code before exec.
inline StartedProcess start_process(const std::vector<std::string>& command, std::vector<std::string> env,
                                    const std::vector<int>& cpus, std::string_view name) {
  StartedProcess started;
  const int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (devnull < 0) {
    started.error = fmt::format("cannot open /dev/null: {}", std::strerror(errno));
    return started;
  }
  std::vector<std::string> args = command;
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  const pid_t self = ::getpid();
  const std::string exec_error_prefix = fmt::format("distribute-launch: cannot run '{}': ", command[0]);
#ifdef __linux__
  cpu_set_t cpu_set;
  CPU_ZERO(&cpu_set);
  for (const int c : cpus) CPU_SET(c, &cpu_set);
  const std::string bind_warning =
      fmt::format("distribute-launch: warning: cannot bind {} to CPUs {}: ", name, cpu_list(cpus));
#endif

  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) {
    ::close(devnull);
    started.error = fmt::format("pipe: {}", std::strerror(errno));
    return started;
  }
  if (::pipe2(err, O_CLOEXEC) != 0) {
    started.error = fmt::format("pipe: {}", std::strerror(errno));
    for (int fd : {out[0], out[1], devnull}) ::close(fd);
    return started;
  }
  // Signals stay blocked around fork, so that one arriving in the child before exec does not run
  // the launcher's handler there (which would write to the launcher's self-pipe).
  sigset_t all, old;
  sigfillset(&all);
  ::sigprocmask(SIG_SETMASK, &all, &old);
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int e = errno;
    ::sigprocmask(SIG_SETMASK, &old, nullptr);
    for (int fd : {out[0], out[1], err[0], err[1], devnull}) ::close(fd);
    started.error = fmt::format("fork: {}", std::strerror(e));
    return started;
  }
  if (pid == 0) {
    ::setpgid(0, 0);
#ifdef __linux__
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != self) ::_exit(1);  // the launcher is already gone
#endif
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    for (const int sig : kForwardedSignals) ::sigaction(sig, &dfl, nullptr);
    ::sigaction(SIGCHLD, &dfl, nullptr);
    ::sigaction(SIGPIPE, &dfl, nullptr);
    ::dup2(devnull, 0);
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
#ifdef __linux__
    if (!cpus.empty() && ::sched_setaffinity(0, sizeof cpu_set, &cpu_set) != 0) {
      // The CPUs may have been taken away since they were read (a cpuset change): run unbound.
      const std::string msg = bind_warning + std::strerror(errno) + "; running it unbound\n";
      [[maybe_unused]] const ssize_t n = ::write(2, msg.data(), msg.size());
    }
#endif
    ::execvpe(argv[0], argv.data(), envp.data());
    const int e = errno;
    const std::string msg = exec_error_prefix + std::strerror(e) + "\n";
    [[maybe_unused]] const ssize_t n = ::write(2, msg.data(), msg.size());
    ::_exit(e == ENOENT ? 127 : 126);
  }
  ::setpgid(pid, pid);  // also in the parent, so the group exists before it is signalled
  ::sigprocmask(SIG_SETMASK, &old, nullptr);
  for (int fd : {out[1], err[1], devnull}) ::close(fd);
  ::fcntl(out[0], F_SETFL, O_NONBLOCK);
  ::fcntl(err[0], F_SETFL, O_NONBLOCK);
  started.pid = pid;
  started.out_fd = out[0];
  started.err_fd = err[0];
  return started;
}

}  // namespace launch

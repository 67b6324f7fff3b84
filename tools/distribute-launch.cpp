// distribute-launch: start a multi-process job with a correct TF_CONFIG per task.
//
//   distribute-launch -n N [options] [--] prog args...
//       N "worker" tasks (index 0..N-1); with --chief also one "chief" task.
//   distribute-launch --ps N --workers M [--chief|--no-chief] [options] [--] prog args...
//       a parameter-server cluster: one chief (on by default in this mode), N "ps", M "worker".
//
// Every task gets the whole cluster in TF_CONFIG, DISTRIBUTE_LAUNCH_TASK=T:I, torchrun's
// variables and the job's cluster token (launch_cluster.hpp); its output lines are forwarded with
// a "[T:I] " prefix (launch_output.hpp). This file is the job's life: start the tasks, watch them,
// forward signals, restart workers, stop together. Its parts: the command line (launch_args.hpp),
// processes and signals (launch_process.hpp), CPU binding (launch_binding.hpp), several nodes
// (launch_node_job.hpp).
//
// The job's rules, as the usage text states them: the first failing task stops the job (SIGTERM,
// SIGKILL after --grace) unless --keep-going, and its status is the launcher's; a signal is
// forwarded once, a second one SIGKILLs; --restart-workers starts a failed worker of a ps cluster
// again (same TF_CONFIG, same port), as restartPolicy OnFailure would; ps tasks serve until every
// chief and worker task has exited, then get SIGTERM.

#include <fmt/format.h>

#include "launch_args.hpp"
#include "launch_binding.hpp"
#include "launch_cluster.hpp"
#include "launch_node_job.hpp"
#include "launch_output.hpp"
#include "launch_process.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <poll.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;
using namespace launch;

constexpr int kExitTimeout = 124;

Clock::time_point after_seconds(double s) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

/// A task of this launcher: its place in the cluster and its process.
struct Task : TaskIdentity {
  pid_t pid = -1;
  bool running = false;
  std::optional<Clock::time_point> restart_at;  // a pending restart
  std::vector<int> cpus;                        // bound to these (empty: not bound)
  int status = 0;
  Stream out, err;
};

class Launcher {
 public:
  explicit Launcher(Options o) : opt_(std::move(o)), nodes_(opt_) {}

  int run() {
    choose_token(opt_, job_);
    if (opt_.nnodes > 1) nodes_.meet(*given_token(opt_));  // parse_options made sure there is one
    build_tasks();
    install_signal_handlers();
    if (opt_.timeout > 0) job_deadline_ = after_seconds(opt_.timeout);
    spawn_all();
    loop();
    if (opt_.nnodes > 1)
      return nodes_.finish(
          exit_code_.value_or(0),
          [&] {
            handle_signals();
            handle_node_messages();
          },
          [&] { return exit_code_; });
    return exit_code_.value_or(0);
  }

 private:
  void build_tasks() {
    const bool with_chief = opt_.chief.value_or(opt_.ps_given);
    auto add = [&](const char* type, int count) {
      for (int k = 0; k < count; ++k) {
        Task t;
        t.type = type;
        t.index = k;
        t.local_rank = static_cast<int>(tasks_.size());
        t.rank = t.local_rank;
        tasks_.push_back(std::move(t));
      }
    };
    add("chief", with_chief ? 1 : 0);
    add("worker", opt_.workers);
    add("ps", opt_.ps_given ? opt_.ps : 0);
    job_.local_world_size = static_cast<int>(tasks_.size());
    job_.node_rank = opt_.node_rank;
    if (opt_.nnodes > 1) {
      // This node's tasks are worker:RANK, ranks following the node ranks.
      const NodeAgreement& a = nodes_.agreement();
      for (auto& t : tasks_) t.index = t.rank = a.rank_offset(opt_.node_rank) + t.local_rank;
      job_.cluster = nodes_.tf_config_cluster();
      job_.world_size = a.world_size();
      job_.master_addr = a.master_addr;
      job_.master_port = a.master_port;
    } else {
      // MASTER_PORT, then one port per task in rank order.
      job_.master_port = pick_port_block(opt_.host, static_cast<int>(tasks_.size()) + 1);
      job_.master_addr = opt_.host;
      job_.world_size = static_cast<int>(tasks_.size());
      std::vector<std::string> addresses;
      for (const auto& t : tasks_) addresses.push_back(host_port(opt_.host, job_.master_port + 1 + t.rank));
      job_.cluster = tf_config_cluster(std::vector<TaskIdentity>(tasks_.begin(), tasks_.end()), addresses);
    }
    for (auto& t : tasks_) {
      t.name = fmt::format("{}:{}", t.type, t.index);
      t.out.prefix = t.err.prefix = fmt::format("[{}] ", t.name);
      t.out.dest = 1;
      t.err.dest = 2;
    }
    if (opt_.bind_to_core) {
      std::vector<std::string> names;
      for (const auto& t : tasks_) names.push_back(t.name);
      const bool with_ps = std::any_of(tasks_.begin(), tasks_.end(), [](const Task& t) { return t.type == "ps"; });
      auto cpus = bind_to_cores(names, with_ps, opt_.bind_to_given);
      for (std::size_t k = 0; k < tasks_.size(); ++k) tasks_[k].cpus = std::move(cpus[k]);
    }
  }

  // ---- across nodes (launch_node_job.hpp) -----------------------------------------------------

  void handle_node_messages() {
    nodes_.handle_messages([&](int node, int code, const std::string& what) { node_failed(node, code, what); });
  }

  void node_failed(int node, int code, const std::string& what) {
    if (stopping_ && exit_code_) return;
    if (!exit_code_) exit_code_ = code;
    if (any_running()) note("node {} {}; stopping this node's tasks", node, what);
    else note("node {} {}", node, what);
    nodes_.tell_failure(exit_code_);
    begin_stop(SIGTERM);
  }

  void spawn_all() {
    std::string spawn_error;
    for (auto& t : tasks_) {
      spawn_error = spawn(t);
      if (!spawn_error.empty()) break;
    }
    if (!spawn_error.empty()) {
      note("{}; stopping the tasks already started", spawn_error);
      exit_code_ = 1;
      begin_stop(SIGTERM);
    }
  }

  // Starts `t` (again, for a restart); returns what went wrong, or nothing.
  std::string spawn(Task& t) {
    for (Stream* s : {&t.out, &t.err}) close_stream(*s);  // what the previous run left unread
    StartedProcess p = start_process(opt_.command, task_environment(job_, opt_, t, environ), t.cpus, t.name);
    if (!p.error.empty()) return p.error;
    t.pid = p.pid;
    t.running = true;
    t.out.fd = p.out_fd;
    t.err.fd = p.err_fd;
    return {};
  }

  bool any_running() const {
    return std::any_of(tasks_.begin(), tasks_.end(), [](const Task& t) { return t.running; });
  }
  bool any_restart_pending() const {
    return std::any_of(tasks_.begin(), tasks_.end(), [](const Task& t) { return t.restart_at.has_value(); });
  }

  void signal_task(Task& t, int sig) {
    if (t.running) signal_group(t.pid, sig);
  }

  // Asks every running task to stop with `sig`; SIGKILL follows after the grace period.
  void begin_stop(int sig) {
    for (auto& t : tasks_) {
      t.restart_at.reset();  // a stopping job starts nothing again
      signal_task(t, sig);
    }
    if (!stopping_) {
      stopping_ = true;
      kill_deadline_ = after_seconds(opt_.grace);
    }
  }

  void kill_all() {
    for (auto& t : tasks_) signal_task(t, SIGKILL);
  }

  void handle_signals() {
    for (const int sig : take_signals()) {
      if (sig == SIGCHLD) continue;
      if (!exit_code_) exit_code_ = 128 + sig;
      if (++signals_received_ == 1) {
        if (any_running()) note("received {}; forwarding it to the tasks", signal_name(sig));
        begin_stop(sig);
      } else {
        if (any_running()) note("received {} again; killing all tasks", signal_name(sig));
        kill_all();
        stopping_ = true;
      }
    }
  }

  Task* find(pid_t pid) {
    for (auto& t : tasks_)
      if (t.pid == pid && t.running) return &t;
    return nullptr;
  }

  void reap() {
    while (auto exited = reap_next([&](pid_t pid) { return find(pid) != nullptr; })) {
      Task* t = find(exited->pid);
      if (!t) continue;
      t->running = false;
      t->status = exited->status;
      // Forward what it wrote before it exited ahead of any note about its exit.
      for (Stream* s : {&t->out, &t->err})
        if (s->fd >= 0) drain(*s);
      on_exit(*t);
    }
  }

  void on_exit(Task& t) {
    const bool ok = succeeded(t.status);
    if (!ok && !stopping_ && t.type == "worker" && t.restarts < opt_.restart_workers) {
      ++t.restarts;
      note("{} {}; restarting it in {} s (restart {} of {})", t.name, describe_status(t.status), opt_.restart_delay,
           t.restarts, opt_.restart_workers);
      t.restart_at = after_seconds(opt_.restart_delay);
      return;
    }
    if (!stopping_) {
      if (!ok) {
        if (!exit_code_) exit_code_ = exit_code_of(t.status);
        if (opt_.keep_going) {
          note("{} {}; the other tasks go on (--keep-going)", t.name, describe_status(t.status));
        } else if (any_running()) {
          note("{} {}; stopping the other tasks", t.name, describe_status(t.status));
          begin_stop(SIGTERM);
          return;
        } else {
          note("{} {}", t.name, describe_status(t.status));
          return;
        }
      } else if (t.type == "ps") {
        note("{} exited with status 0", t.name);  // e.g. stopped by the coordinator
      }
      // The job is done when every chief/worker task has exited; ps tasks are then stopped.
      const bool workers_done = std::none_of(tasks_.begin(), tasks_.end(), [](const Task& x) {
        return (x.running || x.restart_at) && x.type != "ps";
      });
      if (workers_done && any_running()) {
        note("the chief and worker tasks are done; stopping the ps tasks");
        begin_stop(SIGTERM);
      }
    }
  }

  void on_deadlines() {
    const auto now = Clock::now();
    for (auto& t : tasks_) {
      if (!t.restart_at || now < *t.restart_at) continue;
      t.restart_at.reset();
      note("starting {} again", t.name);
      if (const std::string error = spawn(t); !error.empty()) {
        note("cannot restart {}: {}; stopping the job", t.name, error);
        if (!exit_code_) exit_code_ = 1;
        begin_stop(SIGTERM);
      }
    }
    if (job_deadline_ && now >= *job_deadline_) {
      job_deadline_.reset();
      if (any_running() && !stopping_) {  // when already stopping, the grace period bounds it
        note("the job ran longer than --timeout {} s; stopping all tasks", opt_.timeout);
        if (!exit_code_) exit_code_ = kExitTimeout;
        begin_stop(SIGTERM);
      }
    }
    if (stopping_ && kill_deadline_ && now >= *kill_deadline_) {
      kill_deadline_.reset();
      for (auto& t : tasks_) {
        if (!t.running) continue;
        note("{} did not stop within {} s; sending SIGKILL", t.name, opt_.grace);
        signal_task(t, SIGKILL);
      }
    }
  }

  void loop() {
    std::optional<Clock::time_point> drain_deadline;
    std::vector<pollfd> fds;
    std::vector<Stream*> streams;
    for (;;) {
      handle_signals();
      reap();
      on_deadlines();
      if (opt_.nnodes > 1) {
        nodes_.tell_failure(exit_code_);
        handle_node_messages();
      }

      fds.clear();
      streams.clear();
      fds.push_back({signal_fd(), POLLIN, 0});
      for (auto& t : tasks_) {
        for (Stream* s : {&t.out, &t.err}) {
          if (s->fd < 0) continue;
          fds.push_back({s->fd, POLLIN, 0});
          streams.push_back(s);
        }
      }
      if (!any_running() && !any_restart_pending()) {
        // Every task is reaped. Their groups were SIGKILLed, so the pipes close right away unless
        // something escaped to another process group; do not wait for that for long.
        if (streams.empty()) break;
        if (!drain_deadline) drain_deadline = Clock::now() + std::chrono::seconds(2);
        if (Clock::now() >= *drain_deadline) {
          for (Stream* s : streams) close_stream(*s);
          break;
        }
      }

      std::optional<Clock::time_point> next;  // the poll waits until the nearest deadline
      for (const auto& d : {job_deadline_, kill_deadline_, drain_deadline})
        if (d && (!next || *d < *next)) next = d;
      for (const auto& t : tasks_)
        if (t.restart_at && (!next || *t.restart_at < *next)) next = t.restart_at;
      const int timeout_ms = next ? static_cast<int>(std::clamp<long long>(
                                        std::chrono::ceil<std::chrono::milliseconds>(*next - Clock::now()).count(),
                                        0, 60'000))
                                  : -1;
      const std::size_t task_fds = fds.size();
      nodes_.add_poll_fds(fds);  // read in handle_node_messages
      const int n = ::poll(fds.data(), fds.size(), timeout_ms);
      if (n < 0) {
        if (errno == EINTR) continue;
        throw std::runtime_error(fmt::format("poll: {}", std::strerror(errno)));
      }
      for (std::size_t k = 1; k < task_fds; ++k) {
        if (fds[k].revents & (POLLIN | POLLHUP | POLLERR | POLLNVAL)) drain(*streams[k - 1]);
      }
    }
  }

  Options opt_;
  NodeJob nodes_;
  JobEnvironment job_;
  std::vector<Task> tasks_;
  std::optional<int> exit_code_;
  bool stopping_ = false;
  int signals_received_ = 0;
  std::optional<Clock::time_point> job_deadline_;
  std::optional<Clock::time_point> kill_deadline_;
};

}  // namespace

int main(int argc, char** argv) {
  ensure_std_fds();
  Options opt;
  try {
    opt = parse_args(argc, argv);
  } catch (const UsageError& e) {
    write_all(2, usage_error_line(e));
    return kExitUsage;
  }
  if (opt.help) {
    write_all(1, kUsage);
    return 0;
  }
  if (opt.version) {
    write_all(1, version_text());
    return 0;
  }
  try {
    return Launcher(std::move(opt)).run();
  } catch (const std::exception& e) {
    note("{}", e.what());
    return 1;
  }
}

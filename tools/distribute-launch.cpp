// distribute-launch: start a local multi-process job with a correct TF_CONFIG per task.
//
//   distribute-launch -n N [options] [--] prog args...
//       N "worker" tasks (index 0..N-1); with --chief also one "chief" task.
//   distribute-launch --ps N --workers M [--chief|--no-chief] [options] [--] prog args...
//       a parameter-server cluster: one chief (on by default in this mode), N "ps", M "worker".
// The command line (options, usage text, --version) is parsed in launch_args.hpp.
//
// Every task gets the whole cluster in TF_CONFIG (TF's schema: {"cluster": {"chief": [...],
// "worker": [...], "ps": [...]}, "task": {"type": T, "index": I}}), DISTRIBUTE_LAUNCH_TASK=T:I,
// torchrun's RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and
// DISTRIBUTE_CLUSTER_TOKEN (a random one per job unless --token or --no-token says otherwise; in the
// environment, never on a command line). Output lines are forwarded with a "[T:I] " prefix.
//
// Design notes (also in the usage text):
//  * Ranks: the tasks in TF_CONFIG's order (chief, workers, ps) are ranks 0..WORLD_SIZE-1, which
//    is also MultiWorkerMirroredStrategy's order (the chief first). On one host LOCAL_RANK = RANK
//    and LOCAL_WORLD_SIZE = WORLD_SIZE.
//  * Across nodes (--nnodes): one launcher per node; they meet at node 0 and stop together
//    (launch_nodes.hpp). Ranks follow the node ranks.
//  * Ports: one block of WORLD_SIZE + 1 consecutive free ports P..P+WORLD_SIZE on --host:
//    MASTER_PORT = P (free for a torch-style rank 0 to listen on, as env:// rendezvous does) and
//    rank r's TF_CONFIG address uses P+1+r. So LauncherClusterResolver (task i at MASTER_PORT +
//    port_offset + i) with port_offset 1 resolves the same all-worker cluster as TF_CONFIG. Each
//    port is checked free by binding and closing it; between that and the task binding it, another
//    process could take it: a small race that the launcher does not retry.
//  * Process groups: every task runs in its own process group (its pid is the group id), so a
//    Ctrl-C at the terminal reaches only the launcher, which forwards it exactly once, to each
//    task's whole group (the task and anything it spawned). When a task's main process exits, the
//    launcher SIGKILLs whatever is left in its group before reaping it (race-free: the zombie
//    still holds the group id), so no orphans stay behind. On Linux each task also gets
//    PR_SET_PDEATHSIG=SIGKILL, so the tasks die even if the launcher itself is SIGKILLed.
//    Tasks read stdin from /dev/null (a background process group reading the terminal would stop).
//  * Signals: the first SIGINT/SIGTERM/SIGHUP is forwarded to every task, which then get --grace
//    seconds (default 10) before SIGKILL; a second one SIGKILLs everything at once. The launcher
//    then exits with 128+signal.
//  * Failure: the first task that exits non-zero or is killed by a signal stops the job (SIGTERM to
//    the others, SIGKILL after the grace period) unless --keep-going; the launcher exits with that
//    task's status (128+signal for a signal). --timeout expiry exits 124. Usage errors exit 2.
//  * Restarts: with --restart-workers N a worker task of a parameter-server cluster that fails
//    is started again (same TF_CONFIG, same port) after --restart-delay, at most N times per task,
//    as a cluster manager with restartPolicy OnFailure would do; DISTRIBUTE_LAUNCH_RESTART counts
//    its restarts (0 on the first start). The coordinator takes the worker back when it answers.
//  * ps tasks serve until stopped: in a cluster with ps tasks the job is done when every chief and
//    worker task has exited; the launcher then SIGTERMs the ps tasks and exits 0 if all of those
//    exited 0.
//  * CPU binding (Linux): with --bind-to core (the default) and no more tasks than CPUs the
//    launcher may run on, each task is bound to its own contiguous block of those CPUs (an equal
//    share), as mpirun binds ranks to cores. Each rank's threads then share caches and do not
//    preempt another rank's network thread; at 2 workers on 2 cores a 1 MiB all-reduce took 0.56 ms
//    bound against 0.73 ms unbound (docs/performance.md). With more tasks than CPUs, when the CPUs
//    divide them evenly and none is a ps task, each CPU runs its own contiguous block of tasks
//    (4 tasks on 2 CPUs: a 1 MiB all-reduce 1.12-1.32 ms bound against 1.37-1.56 unbound,
//    docs/performance.md); otherwise nothing is bound, since a CPU with one training task more
//    than another would hold back every synchronous step.
//  * Output: lines are forwarded whole (one write each, so tasks never interleave mid-line); a
//    last line without a newline is flushed with one when the stream closes. Tasks write to
//    pipes, so their stdio is block-buffered unless they flush or set line buffering.

#include <fmt/format.h>

#include "launch_args.hpp"
#include "launch_nodes.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <fcntl.h>
#include <netdb.h>
#ifdef __linux__
#include <sched.h>
#endif
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

using launch::kExitUsage;
using launch::Options;
using launch::UsageError;
constexpr int kExitTimeout = 124;
constexpr std::size_t kMaxLine = 64 * 1024;  // longer lines are forwarded in pieces

// ------------------------------------------------------------------------------------------------
// Small POSIX helpers

void write_all(int fd, std::string_view data) {
  static bool broken[3] = {false, false, false};
  if (fd >= 0 && fd < 3 && broken[fd]) return;
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n > 0) {
      data.remove_prefix(static_cast<std::size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 1000);
    } else {
      if (fd >= 0 && fd < 3) broken[fd] = true;  // e.g. EPIPE: drop further output there
      return;
    }
  }
}

template <typename... Args>
void note(fmt::format_string<Args...> f, Args&&... args) {
  write_all(2, "distribute-launch: " + fmt::format(f, std::forward<Args>(args)...) + "\n");
}

std::string json_escape(std::string_view s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20)
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
        else
          out += c;
    }
  }
  return out;
}

// Returns P such that ports P..P+n-1 on `host` are all free (see "Ports" at the top of the file):
// P comes from binding port 0, the others are checked by binding them; a block with a port in
// use is dropped and another P tried.
int pick_port_block(const std::string& host, int n) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), "0", &hints, &res); rc != 0 || res == nullptr)
    throw std::runtime_error(fmt::format("cannot resolve --host '{}': {}", host, ::gai_strerror(rc)));
  sockaddr_storage base_addr{};
  std::memcpy(&base_addr, res->ai_addr, res->ai_addrlen);
  const socklen_t addr_len = res->ai_addrlen;
  const int family = res->ai_family;
  ::freeaddrinfo(res);
  auto port_ref = [&](sockaddr_storage& a) -> in_port_t& {
    return family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&a)->sin6_port
                              : reinterpret_cast<sockaddr_in*>(&a)->sin_port;
  };
  // Binds `port` (0: any) and closes again; returns the port bound, 0 when it is in use.
  auto try_port = [&](int port) -> int {
    const int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throw std::runtime_error(fmt::format("socket: {}", std::strerror(errno)));
    sockaddr_storage addr = base_addr;
    port_ref(addr) = htons(static_cast<in_port_t>(port));
    int got = 0;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), addr_len) == 0) {
      socklen_t len = sizeof addr;
      if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) got = ntohs(port_ref(addr));
    } else if (errno != EADDRINUSE && errno != EACCES) {
      const int e = errno;
      ::close(fd);
      throw std::runtime_error(fmt::format("cannot bind a port on '{}': {}", host, std::strerror(e)));
    }
    ::close(fd);
    return got;
  };
  constexpr int kAttempts = 200;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    const int base = try_port(0);
    if (base == 0 || base + n - 1 > 65535) continue;
    bool all_free = true;
    for (int k = 1; k < n && all_free; ++k) all_free = try_port(base + k) == base + k;
    if (all_free) return base;
  }
  throw std::runtime_error(
      fmt::format("cannot find {} consecutive free ports on '{}' ({} blocks tried)", n, host, kAttempts));
}

std::string random_token() {
  unsigned char bytes[16];
  const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error(fmt::format("cannot open /dev/urandom: {}", std::strerror(errno)));
  std::size_t got = 0;
  while (got < sizeof bytes) {
    const ssize_t n = ::read(fd, bytes + got, sizeof bytes - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      throw std::runtime_error("cannot read /dev/urandom");
    }
    got += static_cast<std::size_t>(n);
  }
  ::close(fd);
  std::string hex;
  for (const unsigned char b : bytes) hex += fmt::format("{:02x}", b);
  return hex;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = ::strsignal(sig);
    return fmt::format("was killed by signal {} ({})", sig, name ? name : "?");
  }
  return fmt::format("ended with wait status {:#x}", status);
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

bool succeeded(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }

const char* signal_name(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    case SIGKILL: return "SIGKILL";
    default: return "signal";
  }
}

// ------------------------------------------------------------------------------------------------
// Signals: a self-pipe wakes the poll loop.

int g_signal_pipe[2] = {-1, -1};

extern "C" void on_signal(int sig) {
  const int saved = errno;
  const unsigned char b = static_cast<unsigned char>(sig);
  [[maybe_unused]] const ssize_t n = ::write(g_signal_pipe[1], &b, 1);
  errno = saved;
}

constexpr int kForwardedSignals[] = {SIGINT, SIGTERM, SIGHUP};

void install_signal_handlers() {
  if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
    throw std::runtime_error(fmt::format("pipe: {}", std::strerror(errno)));
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (const int sig : kForwardedSignals) ::sigaction(sig, &sa, nullptr);
  sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  ::sigaction(SIGCHLD, &sa, nullptr);
  struct sigaction ign {};
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  ::sigaction(SIGPIPE, &ign, nullptr);  // a closed stdout must not kill the launcher
}

// ------------------------------------------------------------------------------------------------
// Tasks

struct Stream {
  int fd = -1;
  int dest = 1;  // launcher fd it is forwarded to
  std::string buf;
};

struct Task {
  std::string type;
  int index = 0;
  int rank = 0;      // RANK: the place in the order chief, workers, ps (across nodes: node by node)
  int local_rank = 0;  // LOCAL_RANK: the place among this launcher's tasks
  std::string name;  // "worker:0"
  std::string prefix;  // "[worker:0] "
  pid_t pid = -1;
  bool running = false;
  int restarts = 0;                                // times started again after a failure
  std::optional<Clock::time_point> restart_at;     // a pending restart
  std::vector<int> cpus;                           // bound to these (empty: not bound)
  int status = 0;
  Stream out, err;
};

void forward_lines(const Task& t, Stream& s, bool final) {
  std::size_t start = 0;
  std::string chunk;
  for (;;) {
    const auto nl = s.buf.find('\n', start);
    if (nl == std::string::npos) break;
    chunk.append(t.prefix).append(s.buf, start, nl - start + 1);
    start = nl + 1;
  }
  s.buf.erase(0, start);
  while (s.buf.size() >= kMaxLine) {  // an overlong line: forward it in pieces
    chunk.append(t.prefix).append(s.buf, 0, kMaxLine).append("\n");
    s.buf.erase(0, kMaxLine);
  }
  if (final && !s.buf.empty()) {
    chunk.append(t.prefix).append(s.buf).append("\n");
    s.buf.clear();
  }
  if (!chunk.empty()) write_all(s.dest, chunk);
}

void close_stream(const Task& t, Stream& s) {
  if (s.fd < 0) return;
  forward_lines(t, s, /*final=*/true);
  ::close(s.fd);
  s.fd = -1;
}

// Reads what is available; closes the stream at EOF or on error.
void drain(const Task& t, Stream& s) {
  char buf[64 * 1024];
  for (;;) {
    const ssize_t n = ::read(s.fd, buf, sizeof buf);
    if (n > 0) {
      s.buf.append(buf, static_cast<std::size_t>(n));
      forward_lines(t, s, false);
      if (static_cast<std::size_t>(n) < sizeof buf) return;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    close_stream(t, s);  // EOF or error
    return;
  }
}

class Launcher {
 public:
  explicit Launcher(Options o) : opt_(std::move(o)) {}

  int run() {
    // Secure by default: a job gets a token unless told --no-token (or given one by the caller's
    // environment, which the tasks inherit).
    if (!opt_.token && !opt_.no_token) {
      const char* inherited = std::getenv("DISTRIBUTE_CLUSTER_TOKEN");
      if (inherited == nullptr || *inherited == '\0') opt_.token = "auto";
    }
    if (opt_.no_token) unset_inherited_token_ = true;
    if (opt_.token) {
      token_generated_ = *opt_.token == "auto";
      token_ = token_generated_ ? random_token() : *opt_.token;
    }
    if (opt_.nnodes > 1) meet_nodes();
    build_tasks();
    install_signal_handlers();
    if (opt_.timeout > 0)
      job_deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                         std::chrono::duration<double>(opt_.timeout));
    spawn_all();
    loop();
    if (opt_.nnodes > 1) return finish_nodes();
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
        t.name = fmt::format("{}:{}", type, k);
        t.prefix = fmt::format("[{}] ", t.name);
        t.out.dest = 1;
        t.err.dest = 2;
        tasks_.push_back(std::move(t));
      }
    };
    add("chief", with_chief ? 1 : 0);
    add("worker", opt_.workers);
    add("ps", opt_.ps_given ? opt_.ps : 0);

    for (std::size_t k = 0; k < tasks_.size(); ++k) tasks_[k].local_rank = static_cast<int>(k);
    if (opt_.nnodes > 1) {
      build_node_tasks();
      assign_cpus();
      return;
    }
    // MASTER_PORT, then one port per task in rank order.
    master_port_ = pick_port_block(opt_.host, static_cast<int>(tasks_.size()) + 1);
    master_addr_ = opt_.host;
    world_size_ = static_cast<int>(tasks_.size());
    std::vector<int> ports;
    for (std::size_t r = 0; r < tasks_.size(); ++r) {
      tasks_[r].rank = static_cast<int>(r);
      ports.push_back(master_port_ + 1 + static_cast<int>(r));
    }
    std::string cluster = "{";
    std::size_t k = 0;
    for (const char* type : {"chief", "worker", "ps"}) {
      std::string list;
      for (const auto& t : tasks_) {
        if (t.type != type) continue;
        if (!list.empty()) list += ", ";
        list += fmt::format("\"{}\"", json_escape(host_port(opt_.host, ports[k])));
        ++k;
      }
      if (list.empty()) continue;
      if (cluster.size() > 1) cluster += ", ";
      cluster += fmt::format("\"{}\": [{}]", type, list);
    }
    cluster += "}";
    cluster_json_ = cluster;
    assign_cpus();
  }

  static std::string host_port(const std::string& host, int port) {
    return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port) : fmt::format("{}:{}", host, port);
  }

  // ---- across nodes (launch_nodes.hpp) ------------------------------------------------------

  // Meets the other nodes' launchers and keeps the agreed cluster in node_agreement_.
  void meet_nodes() {
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(opt_.rdzv_timeout));
    launch::NodeEntry me;
    me.node_rank = opt_.node_rank;
    me.tasks = opt_.workers;
    try {
      if (opt_.node_rank == 0) {
        me.host = opt_.host_given ? opt_.host : opt_.master_addr;
        launch::nodes_detail::check_word(me.host, "--host");
        // One port more on node 0: MASTER_PORT for torch-style rank 0, as on one host.
        const int base = pick_port_block(me.host, me.tasks + 1);
        me.port_base = base + 1;
        const int listen_fd = launch::listen_for_nodes(opt_.master_addr, opt_.master_port);
        note("node 0: waiting for {} other node(s) on {}", opt_.nnodes - 1, host_port(opt_.master_addr, opt_.master_port));
        launch::NodeAgreement agreed;
        try {
          node_links_ = launch::gather_nodes(listen_fd, opt_.nnodes, me, me.host, base,
                                             token_generated_ ? token_ : std::nullopt, deadline, agreed);
        } catch (...) {
          ::close(listen_fd);
          throw;
        }
        ::close(listen_fd);  // the job's members are known: later connections are refused
        node_agreement_ = std::move(agreed);
      } else {
        launch::NodeLink link = launch::connect_to_master(opt_.master_addr, opt_.master_port, deadline);
        me.host = opt_.host_given ? opt_.host : link.local_address();
        launch::nodes_detail::check_word(me.host, "--host");
        me.port_base = pick_port_block(me.host, me.tasks);
        if (!link.send(launch::hello_line(opt_.nnodes, me)))
          throw launch::RendezvousError("node 0 closed the connection before this node joined");
        node_agreement_ = launch::parse_agreement(link.read_line(deadline, "node 0's cluster"));
        node_links_.resize(1);
        node_links_[0] = std::move(link);
        // A token this node made up yields to node 0's: one token per job.
        if (node_agreement_.token && (!token_ || token_generated_)) token_ = node_agreement_.token;
      }
    } catch (const launch::RendezvousError& e) {
      throw std::runtime_error(fmt::format("node {}: the launchers could not agree on the job: {}", opt_.node_rank,
                                           e.what()));
    }
    note("node {}: {} nodes, {} tasks; this node's are ranks {}..{}", opt_.node_rank, node_agreement_.nodes.size(),
         node_agreement_.world_size(), node_agreement_.rank_offset(opt_.node_rank),
         node_agreement_.rank_offset(opt_.node_rank) + opt_.workers - 1);
  }

  // This node's tasks: worker:RANK, with the whole job's cluster in TF_CONFIG.
  void build_node_tasks() {
    const auto& a = node_agreement_;
    const int offset = a.rank_offset(opt_.node_rank);
    for (auto& t : tasks_) {
      t.rank = offset + t.local_rank;
      t.index = t.rank;
      t.name = fmt::format("worker:{}", t.index);
      t.prefix = fmt::format("[{}] ", t.name);
    }
    std::string list;
    for (const auto& node : a.nodes)
      for (int k = 0; k < node.tasks; ++k)
        list += fmt::format("{}\"{}\"", list.empty() ? "" : ", ", json_escape(host_port(node.host, node.port_base + k)));
    cluster_json_ = fmt::format("{{\"worker\": [{}]}}", list);
    world_size_ = a.world_size();
    master_addr_ = a.master_addr;
    master_port_ = a.master_port;
  }

  // The first failure of this node (a task, a signal, --timeout) is told to the others at once.
  void tell_nodes_of_failure() {
    if (opt_.nnodes <= 1 || !exit_code_ || failure_told_) return;
    failure_told_ = true;
    if (opt_.node_rank == 0) {
      for (auto& l : node_links_)
        if (l.open()) l.send(fmt::format("STOP 0 {}", *exit_code_));
    } else if (!node_links_.empty()) {
      node_links_[0].send(fmt::format("FAIL {}", *exit_code_));
    }
  }

  // What the other launchers said (node 0: FAIL/DONE from the nodes; the others: STOP/END).
  void handle_node_messages() {
    for (auto& link : node_links_) {
      if (!link.open()) continue;
      std::vector<std::string> lines = link.take_pending();
      for (auto& l : link.read_lines()) lines.push_back(std::move(l));
      for (const auto& line : lines) {
        const auto w = launch::nodes_detail::words(line);
        if (w.empty()) continue;
        const int code = w.size() >= 2 ? std::atoi(std::string(w.back()).c_str()) : 1;
        if (opt_.node_rank == 0 && (w[0] == "FAIL" || w[0] == "DONE")) {
          if (w[0] == "DONE") nodes_done_.insert(link.peer_node());
          if (code != 0) node_failed(link.peer_node(), code, fmt::format("failed with status {}", code));
        } else if (w[0] == "STOP") {
          node_failed(0, code, fmt::format("says the job failed (status {})", code));
        } else if (w[0] == "END") {
          job_end_ = code;
        }
      }
      if (link.eof()) {
        const int peer = link.peer_node();
        link.close();
        if (job_end_) continue;
        if (opt_.node_rank == 0 && nodes_done_.count(peer)) continue;
        node_failed(peer, 1, "launcher was lost (its connection closed)");
      }
    }
  }

  void node_failed(int node, int code, const std::string& what) {
    if (stopping_ && exit_code_) return;
    if (!exit_code_) exit_code_ = code;
    if (any_running()) note("node {} {}; stopping this node's tasks", node, what);
    else note("node {} {}", node, what);
    failure_told_ = failure_told_ || opt_.node_rank != 0;  // a node does not echo node 0's verdict
    tell_nodes_of_failure();
    begin_stop(SIGTERM);
  }

  bool waiting_for_nodes() const {
    if (opt_.nnodes <= 1) return false;
    if (opt_.node_rank != 0) return !job_end_ && !node_links_.empty() && node_links_[0].open();
    for (std::size_t r = 1; r < node_links_.size(); ++r)
      if (node_links_[r].open() && !nodes_done_.count(static_cast<int>(r))) return true;
    return false;
  }

  // After this node's tasks: node 0 waits for every node's DONE and sends the verdict (END); the
  // others send DONE and wait for it. Returns the job's exit status.
  int finish_nodes() {
    const int mine = exit_code_.value_or(0);
    if (opt_.node_rank != 0) {
      if (!node_links_.empty() && node_links_[0].open()) node_links_[0].send(fmt::format("DONE {}", mine));
    }
    while (waiting_for_nodes()) {
      std::vector<pollfd> fds{{g_signal_pipe[0], POLLIN, 0}};
      for (auto& l : node_links_)
        if (l.open()) fds.push_back({l.fd(), POLLIN, 0});
      if (::poll(fds.data(), fds.size(), 1000) < 0 && errno != EINTR) break;
      handle_signals();
      handle_node_messages();
    }
    if (opt_.node_rank == 0) {
      const int verdict = exit_code_.value_or(0);
      for (auto& l : node_links_)
        if (l.open()) l.send(fmt::format("END {}", verdict));
      return verdict;
    }
    return job_end_ ? (*job_end_ != 0 && mine == 0 ? *job_end_ : mine) : exit_code_.value_or(1);
  }

  // --bind-to core: task i gets the i-th of tasks_.size() equal, contiguous blocks of the CPUs this
  // process may run on (the first ones one CPU larger when they do not divide evenly); with k
  // times more tasks than CPUs, CPU j runs tasks jk .. jk+k-1.
  void assign_cpus() {
    if (!opt_.bind_to_core) return;
#ifdef __linux__
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    std::vector<int> cpus;
    if (::sched_getaffinity(0, sizeof allowed, &allowed) == 0) {
      for (int c = 0; c < CPU_SETSIZE; ++c) {
        if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
      }
    }
    const std::size_t n = tasks_.size();
    // Sharing CPUs suits only tasks that do the same work: ps tasks serve, the others train.
    const bool with_ps = std::any_of(tasks_.begin(), tasks_.end(), [](const Task& t) { return t.type == "ps"; });
    if (cpus.empty() || (n > cpus.size() && (n % cpus.size() != 0 || with_ps))) {
      if (opt_.bind_to_given) {
        note("{} tasks and {} CPUs: not binding (with more tasks than CPUs, --bind-to core needs the same number of "
             "tasks on every CPU{})",
             n, cpus.size(), with_ps ? ", and no ps tasks" : "");
      }
      return;
    }
    const std::size_t share = cpus.size() / n, extra = cpus.size() % n;
    std::size_t next = 0;
    std::string report;
    for (std::size_t i = 0; i < n; ++i) {
      if (n > cpus.size()) {
        tasks_[i].cpus = {cpus[i / (n / cpus.size())]};
      } else {
        const std::size_t count = share + (i < extra ? 1 : 0);
        tasks_[i].cpus.assign(cpus.begin() + static_cast<std::ptrdiff_t>(next),
                              cpus.begin() + static_cast<std::ptrdiff_t>(next + count));
        next += count;
      }
      report += fmt::format("{}{} on {}", i == 0 ? "" : ", ", tasks_[i].name, cpu_list(tasks_[i].cpus));
    }
    if (opt_.bind_to_given) note("binding tasks to CPUs: {}", report);  // like mpirun, quiet by default
#else
    if (opt_.bind_to_given) note("--bind-to core: binding is only implemented on Linux; not binding");
#endif
  }

  // "0-3,6" for {0,1,2,3,6}.
  static std::string cpu_list(const std::vector<int>& cpus) {
    std::string out;
    for (std::size_t i = 0; i < cpus.size();) {
      std::size_t j = i;
      while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
      out += fmt::format("{}{}", out.empty() ? "" : ",", cpus[i]);
      if (j > i) out += fmt::format("-{}", cpus[j]);
      i = j + 1;
    }
    return out;
  }

  std::vector<std::string> environment_for(const Task& t) const {
    // The task's own variables replace any the launcher inherited (e.g. RANK from an outer job).
    std::set<std::string> overridden(std::begin(launch::kTaskVariables), std::end(launch::kTaskVariables));
    if (token_ || unset_inherited_token_) overridden.insert("DISTRIBUTE_CLUSTER_TOKEN");
    // --env entries, the last one of a key wins; the launcher's own variables win over --env.
    std::vector<std::pair<std::string, std::string>> extra;
    std::set<std::string> seen;
    for (auto it = opt_.env.rbegin(); it != opt_.env.rend(); ++it)
      if (!overridden.count(it->first) && seen.insert(it->first).second) extra.push_back(*it);
    std::reverse(extra.begin(), extra.end());
    for (const auto& key : seen) overridden.insert(key);
    std::vector<std::string> env;
    for (char** e = environ; e && *e; ++e) {
      std::string_view kv(*e);
      const auto eq = kv.find('=');
      if (overridden.count(std::string(kv.substr(0, eq)))) continue;
      env.emplace_back(kv);
    }
    for (const auto& [key, value] : extra) env.push_back(key + "=" + value);
    env.push_back(fmt::format(R"(TF_CONFIG={{"cluster": {}, "task": {{"type": "{}", "index": {}}}}})",
                              cluster_json_, t.type, t.index));
    env.push_back(fmt::format("DISTRIBUTE_LAUNCH_TASK={}", t.name));
    env.push_back(fmt::format("DISTRIBUTE_LAUNCH_RESTART={}", t.restarts));
    // torchrun's variables, so torch-style programs (and LauncherClusterResolver) run unchanged.
    env.push_back(fmt::format("RANK={}", t.rank));
    env.push_back(fmt::format("LOCAL_RANK={}", t.local_rank));
    env.push_back(fmt::format("WORLD_SIZE={}", world_size_));
    env.push_back(fmt::format("LOCAL_WORLD_SIZE={}", tasks_.size()));
    env.push_back(fmt::format("GROUP_RANK={}", opt_.node_rank));
    env.push_back(fmt::format("MASTER_ADDR={}", master_addr_));
    env.push_back(fmt::format("MASTER_PORT={}", master_port_));
    if (token_) env.push_back("DISTRIBUTE_CLUSTER_TOKEN=" + *token_);
    return env;
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
    for (Stream* s : {&t.out, &t.err}) close_stream(t, *s);  // what the previous run left unread
    const int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devnull < 0) return fmt::format("cannot open /dev/null: {}", std::strerror(errno));
    std::vector<char*> argv;
    for (auto& a : opt_.command) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t self = ::getpid();
    std::vector<std::string> env = environment_for(t);
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    const std::string exec_error_prefix = fmt::format("distribute-launch: cannot run '{}': ", opt_.command[0]);
#ifdef __linux__
    cpu_set_t cpus;
    CPU_ZERO(&cpus);
    for (const int c : t.cpus) CPU_SET(c, &cpus);
    const std::string bind_warning =
        fmt::format("distribute-launch: warning: cannot bind {} to CPUs {}: ", t.name, cpu_list(t.cpus));
#endif

    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) != 0) {
      ::close(devnull);
      return fmt::format("pipe: {}", std::strerror(errno));
    }
    if (::pipe2(err, O_CLOEXEC) != 0) {
      for (int fd : {out[0], out[1], devnull}) ::close(fd);
      return fmt::format("pipe: {}", std::strerror(errno));
    }
    // Block signals around fork so that a signal arriving in the child before exec does not run
    // the launcher's handler there (which would write to the launcher's self-pipe).
    sigset_t all, old;
    sigfillset(&all);
    ::sigprocmask(SIG_SETMASK, &all, &old);
    const pid_t pid = ::fork();
    if (pid < 0) {
      const int e = errno;
      ::sigprocmask(SIG_SETMASK, &old, nullptr);
      for (int fd : {out[0], out[1], err[0], err[1], devnull}) ::close(fd);
      return fmt::format("fork: {}", std::strerror(e));
    }
    if (pid == 0) {
      // Child. The launcher is single-threaded, so the calls below are safe after fork.
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
      if (!t.cpus.empty() && ::sched_setaffinity(0, sizeof cpus, &cpus) != 0) {
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
    ::setpgid(pid, pid);  // also in the parent, so the group exists before we signal it
    ::sigprocmask(SIG_SETMASK, &old, nullptr);
    for (int fd : {out[1], err[1], devnull}) ::close(fd);
    ::fcntl(out[0], F_SETFL, O_NONBLOCK);
    ::fcntl(err[0], F_SETFL, O_NONBLOCK);
    t.pid = pid;
    t.running = true;
    t.out.fd = out[0];
    t.err.fd = err[0];
    return {};
  }

  bool any_running() const {
    return std::any_of(tasks_.begin(), tasks_.end(), [](const Task& t) { return t.running; });
  }
  bool any_restart_pending() const {
    return std::any_of(tasks_.begin(), tasks_.end(), [](const Task& t) { return t.restart_at.has_value(); });
  }

  void signal_task(Task& t, int sig) {
    if (!t.running) return;
    if (::kill(-t.pid, sig) != 0) ::kill(t.pid, sig);
  }

  // Asks every running task to stop with `sig`; SIGKILL follows after the grace period.
  void begin_stop(int sig) {
    for (auto& t : tasks_) {
      t.restart_at.reset();  // a stopping job starts nothing again
      signal_task(t, sig);
    }
    if (!stopping_) {
      stopping_ = true;
      kill_deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(opt_.grace));
    }
  }

  void kill_all() {
    for (auto& t : tasks_) signal_task(t, SIGKILL);
  }

  void handle_signals() {
    unsigned char buf[64];
    for (;;) {
      const ssize_t n = ::read(g_signal_pipe[0], buf, sizeof buf);
      if (n <= 0) break;
      for (ssize_t k = 0; k < n; ++k) {
        const int sig = buf[k];
        if (sig == SIGCHLD) continue;
        ++signals_received_;
        if (signals_received_ == 1) {
          if (any_running()) note("received {}; forwarding it to the tasks", signal_name(sig));
          if (!exit_code_) exit_code_ = 128 + sig;
          begin_stop(sig);
        } else {
          if (any_running()) note("received {} again; killing all tasks", signal_name(sig));
          if (!exit_code_) exit_code_ = 128 + sig;
          kill_all();
          stopping_ = true;
        }
      }
    }
  }

  Task* find(pid_t pid) {
    for (auto& t : tasks_)
      if (t.pid == pid && t.running) return &t;
    return nullptr;
  }

  void reap() {
    for (;;) {
      siginfo_t info{};
      // WNOWAIT: look at the exited child without reaping it, so that its pid (= its process
      // group id) cannot be reused while we kill whatever it left behind in its group.
      if (::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0) return;  // ECHILD etc.
      if (info.si_pid == 0) return;
      const pid_t pid = info.si_pid;
      Task* t = find(pid);
      if (t) ::kill(-pid, SIGKILL);  // leftovers in the task's group; ESRCH when there are none
      int status = 0;
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      if (!t) continue;
      t->running = false;
      t->status = status;
      // Forward what it wrote before it exited ahead of any note about its exit.
      for (Stream* s : {&t->out, &t->err})
        if (s->fd >= 0) drain(*t, *s);
      on_exit(*t);
    }
  }

  void on_exit(Task& t) {
    const bool ok = succeeded(t.status);
    if (!ok && !stopping_ && t.type == "worker" && t.restarts < opt_.restart_workers) {
      ++t.restarts;
      note("{} {}; restarting it in {} s (restart {} of {})", t.name, describe_status(t.status), opt_.restart_delay,
           t.restarts, opt_.restart_workers);
      t.restart_at = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(opt_.restart_delay));
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
    std::vector<Task*> owners;
    for (;;) {
      handle_signals();
      reap();
      on_deadlines();
      if (opt_.nnodes > 1) {
        tell_nodes_of_failure();
        handle_node_messages();
      }

      fds.clear();
      streams.clear();
      owners.clear();
      fds.push_back({g_signal_pipe[0], POLLIN, 0});
      for (auto& t : tasks_) {
        for (Stream* s : {&t.out, &t.err}) {
          if (s->fd < 0) continue;
          fds.push_back({s->fd, POLLIN, 0});
          streams.push_back(s);
          owners.push_back(&t);
        }
      }
      if (!any_running() && !any_restart_pending()) {
        // Every task is reaped. Their groups were SIGKILLed, so the pipes close right away unless
        // something escaped to another process group; do not wait for that for long.
        if (streams.empty()) break;
        if (!drain_deadline) drain_deadline = Clock::now() + std::chrono::seconds(2);
        if (Clock::now() >= *drain_deadline) {
          for (std::size_t k = 0; k < streams.size(); ++k) close_stream(*owners[k], *streams[k]);
          break;
        }
      }

      std::optional<Clock::time_point> next;
      for (const auto& d : {job_deadline_, kill_deadline_, drain_deadline})
        if (d && (!next || *d < *next)) next = d;
      for (const auto& t : tasks_)
        if (t.restart_at && (!next || *t.restart_at < *next)) next = t.restart_at;
      int timeout_ms = -1;
      if (next) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*next - Clock::now()).count();
        timeout_ms = static_cast<int>(std::clamp<long long>(left + 1, 0, 60'000));
      }
      const std::size_t task_fds = fds.size();
      for (auto& l : node_links_)
        if (l.open()) fds.push_back({l.fd(), POLLIN, 0});  // read in handle_node_messages
      const int n = ::poll(fds.data(), fds.size(), timeout_ms);
      if (n < 0) {
        if (errno == EINTR) continue;
        throw std::runtime_error(fmt::format("poll: {}", std::strerror(errno)));
      }
      for (std::size_t k = 1; k < task_fds; ++k) {
        if (fds[k].revents & (POLLIN | POLLHUP | POLLERR | POLLNVAL)) drain(*owners[k - 1], *streams[k - 1]);
      }
    }
  }

  Options opt_;
  std::vector<Task> tasks_;
  std::string cluster_json_;
  int master_port_ = 0;
  std::string master_addr_;
  int world_size_ = 0;
  std::optional<std::string> token_;
  bool unset_inherited_token_ = false;  // --no-token: the tasks do not inherit the launcher's token
  bool token_generated_ = false;
  // Across nodes: node 0 holds a link to every other node (index = node rank, [0] unused); the
  // others hold one, to node 0.
  launch::NodeAgreement node_agreement_;
  std::vector<launch::NodeLink> node_links_;
  std::set<int> nodes_done_;        // node 0: nodes whose tasks are all done (DONE received)
  std::optional<int> job_end_;      // the others: node 0's verdict (END)
  bool failure_told_ = false;
  std::optional<int> exit_code_;
  bool stopping_ = false;
  int signals_received_ = 0;
  std::optional<Clock::time_point> job_deadline_;
  std::optional<Clock::time_point> kill_deadline_;
};

// fds 0-2 must be open, or pipes created later could land on them.
void ensure_std_fds() {
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

}  // namespace

int main(int argc, char** argv) {
  ensure_std_fds();
  Options opt;
  try {
    opt = launch::parse_args(argc, argv);
  } catch (const UsageError& e) {
    write_all(2, launch::usage_error_line(e));
    return kExitUsage;
  }
  if (opt.help) {
    write_all(1, launch::kUsage);
    return 0;
  }
  if (opt.version) {
    write_all(1, launch::version_text());
    return 0;
  }
  try {
    return Launcher(std::move(opt)).run();
  } catch (const std::exception& e) {
    note("{}", e.what());
    return 1;
  }
}

// distribute-launch's command line: the options, their parsing, the usage text and --version.
// Kept apart from the process handling in distribute-launch.cpp; no POSIX here.
//
// Conventions borrowed from mpirun and torchrun so that their users are not surprised:
//   * -n N, -np N, --np N and --workers N are the same option (mpirun spells it -np);
//   * the program may follow the options directly: the first argument that is not an option (or
//     an option's value) starts the program, and everything after it belongs to the program; a
//     "--" still ends the options explicitly (needed for a program whose name starts with '-');
//   * a usage error is one line on stderr that says what was wrong and points to --help.
#pragma once

#include <fmt/format.h>

#include <charconv>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <distribute/version.hpp>

namespace launch {

constexpr int kExitUsage = 2;
constexpr int kMaxTasks = 1024;

constexpr const char* kUsage = R"(usage: distribute-launch -n N [options] [--] PROGRAM [ARGS...]
       distribute-launch --ps N --workers M [--chief|--no-chief] [options] [--] PROGRAM [ARGS...]

Starts a local multi-process job: every task runs PROGRAM with TF_CONFIG describing the whole
cluster (on free loopback ports) and its own task type and index. The first argument that is not
an option starts PROGRAM; everything after it is PROGRAM's. "--" ends the options explicitly.

  -n N, -np N,        number of "worker" tasks (index 0..N-1), N >= 1
    --workers N
  --ps N              parameter-server cluster with N "ps" tasks (N >= 1); a chief is added
                      unless --no-chief
  --chief, --no-chief add (or not) one "chief" task; default: on with --ps, off otherwise
  --host ADDR         address put in TF_CONFIG and used to pick free ports (default 127.0.0.1)
  --env K=V           extra environment variable for every task (repeatable)
  --token auto|VALUE  set DISTRIBUTE_CLUSTER_TOKEN for every task; "auto" makes a random
                      128-bit hex token from /dev/urandom. The default: the launcher's own
                      DISTRIBUTE_CLUSTER_TOKEN if set, else "auto" (every job has a token; it
                      travels in the environment, never on a command line)
  --no-token          no cluster token: any process that can connect may join the job
                      (not with --nnodes: across nodes the launchers need a token they share)
  --timeout SECONDS   stop every task and exit 124 if the job runs longer
  --grace SECONDS     time between SIGTERM and SIGKILL when stopping tasks (default 10)
  --keep-going        a failing task does not stop the others (exit status: the first failure)
  --restart-workers N with --ps: a worker task that fails (non-zero exit or a signal) is started
                      again, at most N times per task; each start sets DISTRIBUTE_LAUNCH_RESTART
                      to the number of restarts so far (0 at first)
  --restart-delay S   seconds before such a restart (default 1)
  --nnodes N          the job spans N nodes, one launcher on each (torchrun's options); -n is
                      then this node's number of tasks (may differ between nodes). Needs
                      the same DISTRIBUTE_CLUSTER_TOKEN (or --token VALUE) on every node: the
                      launchers prove they hold it before a node joins
  --node-rank R       this node's place, 0..N-1; ranks follow the node ranks
  --master-addr H     where node 0's launcher listens for the others (node 0: an address of
                      its own; the other launchers connect to it)
  --master-port P     that port (node 0's tasks get another one as MASTER_PORT)
  --rdzv-timeout S    how long the launchers wait for each other (default 300)
  --bind-to none|core none (default): the scheduler places the tasks. core: bind each task
                      to its own equal block of the CPUs available to the launcher, or with k
                      times more tasks than CPUs and no ps tasks, k tasks to each CPU (Linux);
                      as fast on an idle machine, up to 7x slower beside other work
  -h, --help          show this help
  --version           show the version

Each task also gets DISTRIBUTE_LAUNCH_TASK=TYPE:INDEX, DISTRIBUTE_LAUNCH_RESTART=K and torchrun's
variables: RANK (the task's place in the order chief, workers, ps: 0..WORLD_SIZE-1; across nodes
node by node), LOCAL_RANK (its place on this node), WORLD_SIZE and LOCAL_WORLD_SIZE (the number of
tasks, of this node's tasks), GROUP_RANK (--node-rank),
MASTER_ADDR (--host) and MASTER_PORT (a free port no task's TF_CONFIG address uses; the tasks'
ports are MASTER_PORT+1+RANK). Its stdout and stderr lines are forwarded to the launcher's stdout
and stderr with a "[TYPE:INDEX] " prefix.

Exit status: 0 when every task succeeded (ps tasks are stopped once the chief and all workers are
done); otherwise the status of the first task that failed (128+N if killed by signal N); 128+N
when the launcher got signal N (forwarded to the tasks); 124 on --timeout; 2 on usage errors.
Tasks run in their own process groups: SIGINT/SIGTERM/SIGHUP sent to the launcher are forwarded
once to each task group; the tasks get --grace seconds, then SIGKILL. A second signal SIGKILLs
them at once. Ports are picked by binding and closing them; another process could take one
before the task binds it (not retried).
)";

/// "distribute-launch (distribute) 0.1.0": the library version this launcher was built with.
inline std::string version_text() {
  return fmt::format("distribute-launch (distribute) {}\n", DISTRIBUTE_VERSION_STRING);
}

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// The one line printed for a usage error (the whole help is for --help).
inline std::string usage_error_line(const UsageError& e) {
  return fmt::format("distribute-launch: {}; see 'distribute-launch --help'\n", e.what());
}

struct Options {
  int workers = 0;
  bool workers_given = false;
  int ps = 0;
  bool ps_given = false;
  std::optional<bool> chief;
  std::string host = "127.0.0.1";
  std::vector<std::pair<std::string, std::string>> env;
  std::optional<std::string> token;
  bool no_token = false;  // --no-token: none, not even the default one
  double timeout = 0;  // 0: none
  double grace = 10;
  bool keep_going = false;
  int restart_workers = 0;
  double restart_delay = 1;
  bool bind_to_core = false;  // --bind-to none|core
  bool bind_to_given = false;
  bool help = false;
  bool version = false;
  bool host_given = false;
  // Across nodes (torchrun's names): one launcher per node; -n is then the tasks of this node.
  int nnodes = 1;
  int node_rank = 0;
  bool node_rank_given = false;
  std::string master_addr;
  int master_port = 0;
  double rdzv_timeout = 300;
  std::vector<std::string> command;
};

// Variables the launcher sets for each task itself: --env cannot set them.
constexpr std::string_view kTaskVariables[] = {
    "TF_CONFIG", "DISTRIBUTE_LAUNCH_TASK", "DISTRIBUTE_LAUNCH_RESTART", "RANK", "LOCAL_RANK",
    "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT"};

inline bool is_reserved_env(std::string_view key) {
  for (const auto v : kTaskVariables)
    if (key == v) return true;
  return false;
}

/// The cluster token the user gave this launcher (--token VALUE, else DISTRIBUTE_CLUSTER_TOKEN);
/// none with --token auto (made up here) or --no-token.
inline std::optional<std::string> given_token(const Options& o) {
  if (o.no_token) return std::nullopt;
  if (o.token) return *o.token == "auto" ? std::nullopt : o.token;
  const char* inherited = std::getenv("DISTRIBUTE_CLUSTER_TOKEN");
  if (inherited == nullptr || *inherited == '\0') return std::nullopt;
  return std::string(inherited);
}

inline int parse_count(std::string_view opt, std::string_view text, int min) {
  int value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size())
    throw UsageError(fmt::format("{} expects an integer, got '{}'", opt, text));
  if (value < min || value > kMaxTasks)
    throw UsageError(fmt::format("{} must be between {} and {}, got {}", opt, min, kMaxTasks, value));
  return value;
}

inline double parse_seconds(std::string_view opt, const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || errno != 0 || end != text.c_str() + text.size() || !std::isfinite(value) ||
      value < 0 || value > 1e9)
    throw UsageError(fmt::format("{} expects a non-negative number of seconds, got '{}'", opt, text));
  return value;
}

inline Options parse_args(int argc, const char* const* argv) {
  Options o;
  int i = 1;
  for (; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    // The first argument that is not an option starts the program (as mpirun and torchrun do).
    if (arg.empty() || arg[0] != '-' || arg == "-") break;
    if (arg == "-h" || arg == "--help") {
      o.help = true;
      return o;
    }
    if (arg == "--version") {
      o.version = true;
      return o;
    }
    // Accept "--opt=value", "--opt value", "-nN", "-n N", "-npN" and "-np N".
    std::string name = arg;
    std::optional<std::string> inline_value;
    if (arg.rfind("--", 0) == 0) {
      if (auto eq = arg.find('='); eq != std::string::npos) {
        name = arg.substr(0, eq);
        inline_value = arg.substr(eq + 1);
      }
    } else if (arg.rfind("-np", 0) == 0 && arg.size() > 3) {
      name = "-np";
      inline_value = arg.substr(3);
    } else if (arg.rfind("-n", 0) == 0 && arg.size() > 2 && arg != "-np") {
      name = "-n";
      inline_value = arg.substr(2);
    }
    auto value = [&]() -> std::string {
      if (inline_value) return *inline_value;
      if (i + 1 >= argc) throw UsageError(fmt::format("{} needs a value", name));
      return argv[++i];
    };
    auto flag = [&] {
      if (inline_value) throw UsageError(fmt::format("{} takes no value", name));
    };
    if (name == "-n" || name == "-np" || name == "--np" || name == "--workers") {
      o.workers = parse_count(name, value(), 1);
      o.workers_given = true;
    } else if (name == "--ps") {
      o.ps = parse_count(name, value(), 1);
      o.ps_given = true;
    } else if (name == "--chief") {
      flag();
      o.chief = true;
    } else if (name == "--no-chief") {
      flag();
      o.chief = false;
    } else if (name == "--host") {
      o.host = value();
      if (o.host.empty()) throw UsageError("--host must not be empty");
      o.host_given = true;
    } else if (name == "--nnodes") {
      o.nnodes = parse_count(name, value(), 1);
    } else if (name == "--node-rank" || name == "--node_rank") {
      o.node_rank = parse_count(name, value(), 0);
      o.node_rank_given = true;
    } else if (name == "--master-addr" || name == "--master_addr") {
      o.master_addr = value();
      if (o.master_addr.empty()) throw UsageError("--master-addr must not be empty");
    } else if (name == "--master-port" || name == "--master_port") {
      const std::string v = value();
      int port = 0;
      auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), port);
      if (ec != std::errc{} || end != v.data() + v.size() || port < 1 || port > 65535)
        throw UsageError(fmt::format("{} expects a port between 1 and 65535, got '{}'", name, v));
      o.master_port = port;
    } else if (name == "--rdzv-timeout") {
      o.rdzv_timeout = parse_seconds(name, value());
      if (o.rdzv_timeout <= 0) throw UsageError("--rdzv-timeout must be positive");
    } else if (name == "--env") {
      const std::string kv = value();
      const auto eq = kv.find('=');
      if (eq == std::string::npos || eq == 0) throw UsageError(fmt::format("--env expects K=V, got '{}'", kv));
      std::string key = kv.substr(0, eq);
      if (is_reserved_env(key))
        throw UsageError(fmt::format("--env cannot set {}: the launcher sets it for each task", key));
      o.env.emplace_back(std::move(key), kv.substr(eq + 1));
    } else if (name == "--token") {
      o.token = value();
      if (o.token->empty()) throw UsageError("--token must be 'auto' or a non-empty value");
      if (o.no_token) throw UsageError("--token and --no-token exclude each other");
    } else if (name == "--no-token") {
      flag();
      if (o.token) throw UsageError("--token and --no-token exclude each other");
      o.no_token = true;
    } else if (name == "--timeout") {
      o.timeout = parse_seconds(name, value());
      if (o.timeout <= 0) throw UsageError("--timeout must be positive");
    } else if (name == "--grace") {
      o.grace = parse_seconds(name, value());
    } else if (name == "--keep-going") {
      flag();
      o.keep_going = true;
    } else if (name == "--restart-workers") {
      o.restart_workers = parse_count(name, value(), 0);
    } else if (name == "--restart-delay") {
      o.restart_delay = parse_seconds(name, value());
    } else if (name == "--bind-to") {
      const std::string v = value();
      if (v != "core" && v != "none")
        throw UsageError(fmt::format("--bind-to expects 'core' or 'none', got '{}'", v));
      o.bind_to_core = v == "core";
      o.bind_to_given = true;
    } else {
      throw UsageError(fmt::format("unknown option '{}'", arg));
    }
  }
  for (; i < argc; ++i) o.command.emplace_back(argv[i]);
  if (o.command.empty() || o.command[0].empty())
    throw UsageError("no program to run: give it after the options, e.g. 'distribute-launch -n 2 ./train'");
  if (!o.workers_given)
    throw UsageError(o.ps_given ? "--ps needs --workers M" : "the number of workers (-n N) is required");
  // Only a parameter-server cluster survives a lost worker (its coordinator reschedules the
  // closures); a synchronous job would only wait for the restarted task in a broken collective.
  if (o.nnodes > 1) {
    if (!o.node_rank_given) throw UsageError("--nnodes needs --node-rank R (0 for the node that --master-addr names)");
    if (o.node_rank >= o.nnodes)
      throw UsageError(fmt::format("--node-rank must be below --nnodes {}, got {}", o.nnodes, o.node_rank));
    if (o.master_addr.empty() || o.master_port == 0)
      throw UsageError("--nnodes needs --master-addr and --master-port (where node 0's launcher listens)");
    if (o.ps_given || o.chief.value_or(false))
      throw UsageError("--nnodes starts worker tasks only (-n N per node); --ps and --chief are for one host");
    // The launchers prove to each other that they hold the job's token before any joins: it must
    // be one that every node was given, not one made up here.
    if (!given_token(o))
      throw UsageError(
          "--nnodes needs a cluster token that every launcher of the job shares: set DISTRIBUTE_CLUSTER_TOKEN to the "
          "same secret in each launcher's environment (e.g. 'export DISTRIBUTE_CLUSTER_TOKEN=$(openssl rand -hex 16)' "
          "once, then copy it to every node); the launchers prove they hold it before a node may join");
  } else if (o.node_rank_given && o.node_rank != 0) {
    throw UsageError(fmt::format("--node-rank {} needs --nnodes", o.node_rank));
  }
  if (o.restart_workers > 0 && !o.ps_given)
    throw UsageError("--restart-workers needs --ps (only a parameter-server cluster takes a worker back)");
  return o;
}

}  // namespace launch

// distribute-launch's job description: the ports the tasks listen on, TF_CONFIG and the other
// variables each task gets.
//
// Ranks: the tasks in TF_CONFIG's order (chief, workers, ps) are ranks 0..WORLD_SIZE-1, which is
// also MultiWorkerMirroredStrategy's order (the chief first). On one host LOCAL_RANK = RANK and
// LOCAL_WORLD_SIZE = WORLD_SIZE; across nodes ranks follow the node ranks.
//
// Ports: one block of WORLD_SIZE + 1 consecutive free ports P..P+WORLD_SIZE on --host:
// MASTER_PORT = P (free for a torch-style rank 0 to listen on, as env:// rendezvous does) and
// rank r's TF_CONFIG address uses P+1+r. So LauncherClusterResolver (task i at MASTER_PORT +
// port_offset + i) with port_offset 1 resolves the same all-worker cluster as TF_CONFIG. Each port
// is checked free by binding and closing it; between that and the task binding it, another process
// could take it: a small race that the launcher does not retry.
//
// TF_CONFIG is written with Boost.JSON, the library the tasks read it with.
#pragma once

#include <fmt/format.h>

#include <boost/json.hpp>

#include "launch_args.hpp"
#include "launch_node_link.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace launch {

/// Returns P such that ports P..P+n-1 on `host` are all free: P comes from binding port 0, the
/// others are checked by binding them; a block with a port in use is dropped and another P tried.
inline int pick_port_block(const std::string& host, int n) {
  std::string error;
  const auto resolved = resolve_tcp(host, 0, error);
  if (!resolved) throw std::runtime_error(fmt::format("cannot resolve --host '{}': {}", host, error));
  const sockaddr_storage base_addr = resolved->addr;
  const socklen_t addr_len = resolved->len;
  const int family = resolved->family;
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

/// 128 random bits in hex: the job's cluster token unless one is given.
inline std::string random_token() {
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

/// "host:port", with an IPv6 address in brackets.
inline std::string host_port(const std::string& host, int port) {
  return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port) : fmt::format("{}:{}", host, port);
}

/// A task's place in the cluster.
struct TaskIdentity {
  std::string type;    // "chief", "worker", "ps"
  int index = 0;
  int rank = 0;        // RANK: the place in the order chief, workers, ps (across nodes: node by node)
  int local_rank = 0;  // LOCAL_RANK: the place among this launcher's tasks
  std::string name;    // "worker:0"
  int restarts = 0;    // times started again after a failure
};

/// TF_CONFIG's "cluster": the lists of chief, worker and ps addresses, in that order and each in
/// rank order; a type without tasks has no list. `addresses[k]` is the address of `tasks[k]`.
inline boost::json::object tf_config_cluster(const std::vector<TaskIdentity>& tasks,
                                             const std::vector<std::string>& addresses) {
  boost::json::object cluster;
  for (const char* type : {"chief", "worker", "ps"}) {
    boost::json::array list;
    for (std::size_t k = 0; k < tasks.size(); ++k)
      if (tasks[k].type == type) list.emplace_back(addresses[k]);
    if (!list.empty()) cluster[type] = std::move(list);
  }
  return cluster;
}

/// TF_CONFIG for one task: {"cluster": ..., "task": {"type": T, "index": I}}.
inline std::string tf_config(const boost::json::object& cluster, std::string_view type, int index) {
  boost::json::object config;
  config["cluster"] = cluster;
  config["task"] = boost::json::object{{"type", type}, {"index", index}};
  return boost::json::serialize(config);
}

/// What every task of one launcher shares.
struct JobEnvironment {
  boost::json::object cluster;
  int world_size = 0;
  int local_world_size = 0;
  int node_rank = 0;
  std::string master_addr;
  int master_port = 0;
  std::optional<std::string> token;
  bool unset_inherited_token = false;  // --no-token: the tasks do not inherit the launcher's token
};

/// Sets `job`'s cluster token: --token's, or one made up ("auto", and the default unless the
/// launcher's environment has one, which the tasks then inherit: secure by default), or none with
/// --no-token (which also keeps an inherited one from the tasks). Returns whether it was made up.
inline bool choose_token(const Options& opt, JobEnvironment& job) {
  std::optional<std::string> token = opt.token;
  if (!token && !opt.no_token) {
    const char* inherited = std::getenv("DISTRIBUTE_CLUSTER_TOKEN");
    if (inherited == nullptr || *inherited == '\0') token = "auto";
  }
  job.unset_inherited_token = opt.no_token;
  const bool generated = token && *token == "auto";
  if (token) job.token = generated ? random_token() : *token;
  return generated;
}

/// A task's environment: the launcher's own, less the variables the task gets from the launcher,
/// then --env's (the last one of a key wins), then TF_CONFIG, torchrun's RANK, LOCAL_RANK,
/// WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT, DISTRIBUTE_LAUNCH_TASK,
/// DISTRIBUTE_LAUNCH_RESTART and the cluster token (never on a command line).
inline std::vector<std::string> task_environment(const JobEnvironment& job, const Options& opt,
                                                 const TaskIdentity& t, char** inherited) {
  std::set<std::string> overridden(std::begin(kTaskVariables), std::end(kTaskVariables));
  if (job.token || job.unset_inherited_token) overridden.insert("DISTRIBUTE_CLUSTER_TOKEN");
  std::vector<std::pair<std::string, std::string>> extra;
  std::set<std::string> seen;
  for (auto it = opt.env.rbegin(); it != opt.env.rend(); ++it)
    if (!overridden.count(it->first) && seen.insert(it->first).second) extra.push_back(*it);
  std::reverse(extra.begin(), extra.end());
  for (const auto& key : seen) overridden.insert(key);
  std::vector<std::string> env;
  for (char** e = inherited; e && *e; ++e) {
    std::string_view kv(*e);
    const auto eq = kv.find('=');
    if (overridden.count(std::string(kv.substr(0, eq)))) continue;
    env.emplace_back(kv);
  }
  for (const auto& [key, value] : extra) env.push_back(key + "=" + value);
  env.push_back("TF_CONFIG=" + tf_config(job.cluster, t.type, t.index));
  env.push_back(fmt::format("DISTRIBUTE_LAUNCH_TASK={}", t.name));
  env.push_back(fmt::format("DISTRIBUTE_LAUNCH_RESTART={}", t.restarts));
  // torchrun's variables, so torch-style programs (and LauncherClusterResolver) run unchanged.
  env.push_back(fmt::format("RANK={}", t.rank));
  env.push_back(fmt::format("LOCAL_RANK={}", t.local_rank));
  env.push_back(fmt::format("WORLD_SIZE={}", job.world_size));
  env.push_back(fmt::format("LOCAL_WORLD_SIZE={}", job.local_world_size));
  env.push_back(fmt::format("GROUP_RANK={}", job.node_rank));
  env.push_back(fmt::format("MASTER_ADDR={}", job.master_addr));
  env.push_back(fmt::format("MASTER_PORT={}", job.master_port));
  if (job.token) env.push_back("DISTRIBUTE_CLUSTER_TOKEN=" + *job.token);
  return env;
}

}  // namespace launch

// LauncherClusterResolver: the cluster from the variables mpirun / torchrun-style launchers set.
#pragma once

#include <array>
#include <climits>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include <distribute/cluster/address.hpp>
#include <distribute/cluster/cluster_resolver.hpp>
#include <distribute/cluster/cluster_spec.hpp>
#include <distribute/cluster/detail/env.hpp>
#include <distribute/core/error.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

/// Fallbacks and extras for LauncherClusterResolver. The environment wins where it sets a value.
struct LauncherOptions {
  /// Used when MASTER_ADDR is unset (mpirun sets no address; `mpirun -x MASTER_ADDR=...` does).
  std::optional<std::string> master_addr;
  /// Used when MASTER_PORT is unset.
  std::optional<int> master_port;
  /// Task i's port is MASTER_PORT + port_offset + i. torchrun's agent already listens on
  /// MASTER_PORT itself, so under torchrun use 1 or more. Under distribute-launch (-n N), 1 gives
  /// the same addresses as the TF_CONFIG it sets (it leaves MASTER_PORT free for a torch rank 0).
  int port_offset = 0;
  std::string rpc_layer = "grpc";
  AcceleratorCounts num_accelerators;
};

namespace cluster::detail {

/// The variables of one launcher family: rank, world size, rank on this host.
struct LauncherVars {
  std::string_view rank;
  std::string_view size;
  std::string_view local_rank;
  std::string_view launcher;
};

// In this order: a process started by mpirun inside a torchrun job (or the reverse) reads the
// launcher closest to it, and MPI's variables are only ever set by MPI.
inline constexpr std::array<LauncherVars, 3> kLauncherVars = {{
    {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "Open MPI mpirun"},
    {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "PMI (MPICH / Intel MPI mpiexec)"},
    {"RANK", "WORLD_SIZE", "LOCAL_RANK", "torchrun"},
}};

inline const LauncherVars* find_launcher(const EnvReader& env) {
  for (const auto& vars : kLauncherVars) {
    if (env.has(vars.rank)) return &vars;
  }
  return nullptr;
}

}  // namespace cluster::detail

/// Resolves the cluster of processes started by a launcher that hands each one a rank and the
/// world size: Open MPI's mpirun (OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE), PMI launchers
/// such as MPICH's and Intel MPI's mpiexec (PMI_RANK / PMI_SIZE), or torchrun (RANK /
/// WORLD_SIZE), checked in that order. The rendezvous point comes from MASTER_ADDR and
/// MASTER_PORT (or LauncherOptions when unset).
///
/// These launchers say nothing about the other tasks' addresses, so by convention every task
/// is a worker and task i's address is MASTER_ADDR:(MASTER_PORT + port_offset + i): worker 0
/// (the chief) is reachable at the rendezvous address, and on one host every task has a port of
/// its own. Across hosts only the chief's entry is a real address of that task; transports
/// should rendezvous through master_address() and exchange real addresses there.
///
/// With one task and no MASTER_ADDR/MASTER_PORT the result is local mode (an empty spec, worker
/// 0). No launcher variables at all, a rank outside [0, size), a missing size, address or port
/// throw ClusterConfigError naming the variable.
class LauncherClusterResolver : public ClusterResolver {
 public:
  LauncherClusterResolver() : LauncherClusterResolver(LauncherOptions{}) {}
  explicit LauncherClusterResolver(LauncherOptions options) { init(std::move(options), cluster::detail::EnvReader{}); }
  /// Reads the variables from `env` instead of the process environment.
  LauncherClusterResolver(LauncherOptions options, const EnvVars& env) { init(std::move(options), cluster::detail::EnvReader{&env}); }

  /// True when the process environment (or `env`) has a launcher's rank variable.
  static bool detected() { return cluster::detail::find_launcher(cluster::detail::EnvReader{}) != nullptr; }
  static bool detected(const EnvVars& env) { return cluster::detail::find_launcher(cluster::detail::EnvReader{&env}) != nullptr; }

  const ClusterSpec& cluster_spec() const override { return spec_; }
  std::string task_type() const override { return "worker"; }
  int task_id() const override { return rank_; }
  std::string rpc_layer() const override { return rpc_layer_; }
  AcceleratorCounts num_accelerators() const override { return accelerators_; }

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  /// This process's rank on its host, when the launcher says (OMPI_COMM_WORLD_LOCAL_RANK,
  /// MPI_LOCALRANKID, LOCAL_RANK): handy to pick a GPU.
  std::optional<int> local_rank() const { return local_rank_; }
  /// The variable the rank came from: "OMPI_COMM_WORLD_RANK", "PMI_RANK" or "RANK".
  std::string_view rank_variable() const { return vars_->rank; }

 private:
  void init(LauncherOptions options, const cluster::detail::EnvReader& env) {
    constexpr std::string_view who = "LauncherClusterResolver";
    rpc_layer_ = std::move(options.rpc_layer);
    accelerators_ = std::move(options.num_accelerators);
    vars_ = cluster::detail::find_launcher(env);
    if (vars_ == nullptr) {
      throw ClusterConfigError(fmt::format(
          "{}: no launcher environment: none of OMPI_COMM_WORLD_RANK (mpirun), PMI_RANK (mpiexec) or RANK (torchrun) is "
          "set", who));
    }
    const std::string hint = fmt::format(" ({} sets it together with {}, which is set)", vars_->launcher, vars_->rank);
    world_size_ = cluster::detail::require_env_int(env, who, vars_->size, 1, 1'000'000, hint);
    rank_ = cluster::detail::require_env_int(env, who, vars_->rank, 0, INT_MAX);
    if (rank_ >= world_size_) {
      throw ClusterConfigError(fmt::format("{}: {}={} is out of range for {}={}", who, vars_->rank, rank_, vars_->size, world_size_));
    }
    if (env.has(vars_->local_rank)) local_rank_ = cluster::detail::require_env_int(env, who, vars_->local_rank, 0, INT_MAX);

    auto addr = env.get("MASTER_ADDR");
    if (!addr) addr = options.master_addr;
    std::optional<int> port;
    if (env.has("MASTER_PORT")) {
      port = cluster::detail::require_env_int(env, who, "MASTER_PORT", 1, 65535);
    } else if (options.master_port) {
      port = *options.master_port;
      if (*port < 1 || *port > 65535) {
        throw ClusterConfigError(fmt::format("{}: master_port {} is out of range [1, 65535]", who, *port));
      }
    }
    if (world_size_ == 1 && !addr && !port) return;  // one process and nobody to meet: local mode
    auto missing = [&](std::string_view name) {
      return ClusterConfigError(fmt::format(
          "{}: {} is not set; {} tasks ({}={}) need the chief's address in MASTER_ADDR and MASTER_PORT (mpirun: -x {}=...)",
          who, name, world_size_, vars_->size, world_size_, name));
    };
    if (!addr) throw missing("MASTER_ADDR");
    if (!port) throw missing("MASTER_PORT");
    if (options.port_offset < 0) throw ClusterConfigError(fmt::format("{}: port_offset {} is negative", who, options.port_offset));
    const std::int64_t last = static_cast<std::int64_t>(*port) + options.port_offset + world_size_ - 1;
    if (last > 65535) {
      throw ClusterConfigError(fmt::format("{}: MASTER_PORT={} + port_offset {} leaves no room for {} tasks: port {} is past 65535",
                                           who, *port, options.port_offset, world_size_, last));
    }
    std::string why;
    // MASTER_ADDR is a bare host; IPv6 hosts come without brackets, so HostPort adds them.
    const std::string master = HostPort{*addr, *port + options.port_offset}.to_string();
    if (addr->empty() || addr->front() == '[' || !cluster::detail::split_host_port(master, why)) {
      throw ClusterConfigError(fmt::format("{}: MASTER_ADDR='{}' is not a host name or IP address", who, *addr));
    }
    std::map<int, std::string> workers;
    for (int i = 0; i < world_size_; ++i) workers[i] = HostPort{*addr, *port + options.port_offset + i}.to_string();
    spec_ = ClusterSpec::from_sparse({{"worker", std::move(workers)}});
  }

  ClusterSpec spec_;
  int rank_ = 0;
  int world_size_ = 1;
  std::optional<int> local_rank_;
  const cluster::detail::LauncherVars* vars_ = nullptr;
  std::string rpc_layer_;
  AcceleratorCounts accelerators_;
};

DISTRIBUTE_END_NAMESPACE

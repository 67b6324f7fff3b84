// CommunicationOptions: how a strategy's collectives travel (TF's tf.distribute.experimental.CommunicationOptions).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <distribute/version.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

/// How the workers of a MultiWorkerMirroredStrategy communicate. AUTO: NCCL for GPUs where it is
/// compiled in, else RING (TCP, and shared memory between workers on one host). MPI: MPI's
/// collectives, in a program started by mpirun/mpiexec/srun and compiled with MPI (net/mpi.hpp).
enum class CommunicationImplementation { Auto, Ring, Nccl, Mpi };

constexpr std::string_view to_string(CommunicationImplementation i) noexcept {
  switch (i) {
    case CommunicationImplementation::Auto: return "AUTO";
    case CommunicationImplementation::Ring: return "RING";
    case CommunicationImplementation::Nccl: return "NCCL";
    case CommunicationImplementation::Mpi: return "MPI";
  }
  return "?";
}

struct CommunicationOptions {
  /// Values of one all-reduce are packed into buffers of about this many bytes (TF's rule:
  /// taken in reverse order; a new pack starts once the previous exceeds it). 0: one pack.
  std::size_t bytes_per_pack = 0;
  /// A collective that has not finished after this long throws CollectiveTimeout.
  std::optional<double> timeout_seconds = std::nullopt;
  CommunicationImplementation implementation = CommunicationImplementation::Auto;
  /// MPI only: every collective first checks, with one small MPI_Allreduce, that all workers call
  /// the same one (kind, count, dtype, op, shapes), so a mismatch is an InvalidArgument on every
  /// worker. That costs about a third of a 4 KiB all-reduce and nothing measurable from 1 MiB up.
  /// false leaves the check out: a mismatch is then undefined, as between raw MPI calls (a hang, a
  /// truncation error or a wrong result). The TCP and NCCL transports always check.
  bool mpi_check_agreement = true;
  /// Shared secret the workers prove to each other when they connect (HMAC-SHA256; see
  /// net::CommunicatorOptions::cluster_token). Unset: DISTRIBUTE_CLUSTER_TOKEN, if non-empty;
  /// "" switches authentication off.
  std::optional<std::string> cluster_token = std::nullopt;
  /// Listen (for the other workers, and the metrics port) on an address other machines reach
  /// without a cluster token, where anyone who can connect may join: refused (ClusterConfigError)
  /// unless set, or DISTRIBUTE_INSECURE=1.
  bool insecure = false;
  /// TCP congestion control of the connections between workers on one host (see
  /// net::CommunicatorOptions::loopback_congestion_control). Unset: "reno"; "" keeps the
  /// system's default.
  std::optional<std::string> loopback_congestion_control = std::nullopt;
  /// When every worker runs on one host, all-reduces between them of at least this many bytes go
  /// through shared memory instead of TCP (see net::CommunicatorOptions::shared_memory_min_bytes).
  /// Unset: 256 KiB; 0: always TCP.
  std::optional<std::size_t> shared_memory_min_bytes = std::nullopt;
  /// Serve this worker's metrics (Prometheus text, GET /metrics; docs/observability.md) over HTTP
  /// on its own host (its cluster address's host, never every interface), at this port plus the
  /// worker's rank (the chief 0, then the workers), so one value serves a whole job; 0: a free
  /// port each (see MultiWorkerMirroredStrategy::metrics_port()). Unset: the environment variable
  /// DISTRIBUTE_METRICS_PORT, if set and non-empty; otherwise no metrics and no cost.
  std::optional<int> metrics_port = std::nullopt;
  /// Record a timeline of this task's collectives and run() steps (Chrome trace-event JSON,
  /// observe/timeline.hpp) into this path with the task inserted before its extension
  /// (tl.json -> tl.worker-1.json). Unset: DISTRIBUTE_TIMELINE, if non-empty; "": none.
  std::optional<std::string> timeline = std::nullopt;
};

namespace observe {
class CollectiveMetrics;
}  // namespace observe

namespace collective::detail {
/// What a cross-device ops policy needs to build the collectives of one strategy.
struct CollectivesConfig {
  int num_replicas_in_sync = 1;
  std::vector<std::string> devices;  // the local replicas' devices
  CommunicationOptions options;
  /// The task's collective metrics (a multi-worker task that serves them), else null. Policies
  /// whose calls do not go through the TCP transport (NCCL) count them here.
  observe::CollectiveMetrics* metrics = nullptr;
};
}  // namespace collective::detail

DISTRIBUTE_END_NAMESPACE

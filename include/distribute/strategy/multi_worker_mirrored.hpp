// MultiWorkerMirroredStrategy: synchronous data parallelism over the local devices of several
// worker processes (replicas = local devices × workers). With RING an all-reduce is a local
// reduce, one cross-worker collective per pack over TCP (net::Communicator), and a local copy
// back out; with NCCL (ds::cuda) it is one ncclAllReduce per pack over communicators spanning
// every GPU of every worker, bootstrapped through the same TCP rendezvous. Variables are
// mirrored everywhere and start from the chief's initial values.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include <distribute/backends/host/host.hpp>
#include <distribute/cluster/cluster_resolver.hpp>
#include <distribute/collective/communication_options.hpp>
#include <distribute/collective/multi_worker.hpp>
#include <distribute/core/cross_worker.hpp>
#include <distribute/net/mpi.hpp>
#include <distribute/strategy/detail/sync_strategy.hpp>
#include <distribute/strategy/mirrored.hpp>

// Connecting the workers (MultiWorkerSetup::connect): the TCP transport, the metrics server. With
// separate compilation (version.hpp) only the library's own translation unit parses them.
#if DISTRIBUTE_DETAIL_DEFINE
#include <distribute/cluster/tf_config.hpp>
#include <distribute/net/communicator_link.hpp>
#include <distribute/net/address.hpp>
#include <distribute/strategy/observability.hpp>
#endif

DISTRIBUTE_BEGIN_NAMESPACE
namespace strategy {
struct TaskMetrics;  // strategy/observability.hpp
}  // namespace strategy

namespace strategy::detail {

/// Built before the strategy's SyncStrategy base (which needs the link): the resolver and, for
/// a cluster of more than one worker, the communicator connected to every other worker.
struct MultiWorkerSetup {
  std::shared_ptr<ClusterResolver> resolver;
  std::unique_ptr<TaskMetrics> metrics;  // before link: outlives the communicator that counts into it
  std::unique_ptr<core::CrossWorkerLink> link;
  CommunicationImplementation implementation = CommunicationImplementation::Ring;  // resolved: never Auto

  MultiWorkerSetup();
  MultiWorkerSetup(MultiWorkerSetup&&) noexcept;
  MultiWorkerSetup& operator=(MultiWorkerSetup&&) noexcept;
  ~MultiWorkerSetup();

  /// The port metrics are served on, when they are on.
  std::optional<std::uint16_t> metrics_port() const noexcept;
  /// The collective metrics, when they are on (NCCL counts its calls there), else null.
  observe::CollectiveMetrics* collective_metrics() const noexcept;

  /// AUTO is NCCL where the backend's cross-device ops span workers (ds::cuda compiled by nvcc
  /// with NCCL), RING otherwise; an explicit NCCL that cannot run is InvalidArgument.
  template <class Backend>
  static CommunicationImplementation resolve(CommunicationImplementation requested) {
    constexpr bool nccl = collective::spans_workers_v<default_cross_device_ops_t<Backend>>;
    if (requested == CommunicationImplementation::Nccl && !nccl) {
      if (Backend::name == std::string_view("host")) {
        throw InvalidArgument(
            "MultiWorkerMirroredStrategy: CommunicationImplementation NCCL needs the cuda backend; the host backend "
            "communicates with RING (or AUTO)");
      }
      throw InvalidArgument(fmt::format(
          "MultiWorkerMirroredStrategy: CommunicationImplementation NCCL is not available on the {} backend here: "
          "NCCL is compiled in only by a CUDA compiler (nvcc) with <nccl.h>; use RING or AUTO",
          Backend::name));
    }
    if (requested == CommunicationImplementation::Mpi) {
      if (Backend::name != std::string_view("host")) {
        throw InvalidArgument(fmt::format(
            "MultiWorkerMirroredStrategy: CommunicationImplementation MPI carries host values; the {} backend "
            "communicates with NCCL (or AUTO)",
            Backend::name));
      }
      if (net::mpi_link_factory() == nullptr) {
        throw InvalidArgument(
            "MultiWorkerMirroredStrategy: CommunicationImplementation MPI is not compiled into this program: build "
            "with MPI's compiler wrapper (mpicxx) and -DDISTRIBUTE_WITH_MPI, or link the CMake target distribute::mpi "
            "(meson: distribute_mpi_dep)");
      }
    }
    if (requested == CommunicationImplementation::Auto) {
      return nccl ? CommunicationImplementation::Nccl : CommunicationImplementation::Ring;
    }
    return requested;
  }

  template <class Backend>
  static MultiWorkerSetup make(const CommunicationOptions& options, std::shared_ptr<ClusterResolver> resolver) {
    return connect(options, std::move(resolver), resolve<Backend>(options.implementation));
  }

  /// The resolver (TF_CONFIG's by default) and, for a cluster of more than one worker, the link to
  /// every other worker: what make() does once the implementation is resolved.
  static MultiWorkerSetup connect(const CommunicationOptions& options, std::shared_ptr<ClusterResolver> resolver,
                                  CommunicationImplementation implementation);

  /// MPI: the workers are MPI_COMM_WORLD's ranks. Without a resolver the cluster is read from MPI
  /// (every rank a worker, named by its host); a resolver given must agree with MPI on the
  /// number of workers and this one's index.
  static MultiWorkerSetup make_mpi(const CommunicationOptions& options, std::shared_ptr<ClusterResolver> resolver,
                                   MultiWorkerSetup& setup);
};

#if DISTRIBUTE_DETAIL_DEFINE  // compiled apart with DISTRIBUTE_SEPARATE_COMPILATION (version.hpp)
DISTRIBUTE_DECL MultiWorkerSetup::MultiWorkerSetup() = default;
DISTRIBUTE_DECL MultiWorkerSetup::MultiWorkerSetup(MultiWorkerSetup&&) noexcept = default;
DISTRIBUTE_DECL MultiWorkerSetup& MultiWorkerSetup::operator=(MultiWorkerSetup&&) noexcept = default;
DISTRIBUTE_DECL MultiWorkerSetup::~MultiWorkerSetup() = default;

DISTRIBUTE_DECL std::optional<std::uint16_t> MultiWorkerSetup::metrics_port() const noexcept {
  return metrics ? std::optional<std::uint16_t>(metrics->server->port()) : std::nullopt;
}

DISTRIBUTE_DECL observe::CollectiveMetrics* MultiWorkerSetup::collective_metrics() const noexcept {
  return metrics ? metrics->collectives.get() : nullptr;
}

DISTRIBUTE_DECL MultiWorkerSetup MultiWorkerSetup::connect(const CommunicationOptions& options,
                                                          std::shared_ptr<ClusterResolver> resolver,
                                                          CommunicationImplementation implementation) {
  if (!resolver && implementation != CommunicationImplementation::Mpi) resolver = std::make_shared<TFConfigClusterResolver>();
  if (options.timeout_seconds && !(*options.timeout_seconds > 0)) {
    throw InvalidArgument(fmt::format("MultiWorkerMirroredStrategy: timeout_seconds must be positive, got {}",
                                      *options.timeout_seconds));
  }
  MultiWorkerSetup setup;
  setup.implementation = implementation;
  if (implementation == CommunicationImplementation::Mpi) return make_mpi(options, std::move(resolver), setup);
  setup.resolver = resolver;
  const ClusterSpec& spec = resolver->cluster_spec();
  const std::string type = resolver->task_type();
  const std::optional<int> metrics_port = metrics_port_setting(options);
  if (spec.empty()) {  // a single-worker cluster: no communication
    start_timeline(options, type.empty() ? "worker" : type, resolver->task_id());
    return setup;
  }
  if (type != "chief" && type != "worker") {
    throw ClusterConfigError(fmt::format(
        "MultiWorkerMirroredStrategy runs on chief and worker tasks; this task is '{}' (task.type)", type));
  }
  // Ranks follow TF's id_in_cluster: the chief first, then the workers by index.
  std::vector<std::string> addresses, names;
  for (const char* job : {"chief", "worker"}) {
    if (!spec.has_job(job)) continue;
    for (int index = 0; index < spec.num_tasks(job); ++index) {
      addresses.push_back(spec.task_address(job, index));
      names.push_back(fmt::format("{}:{}", job, index));
    }
  }
  start_timeline(options, type, resolver->task_id());
  if (addresses.size() <= 1) return setup;
  net::CommunicatorOptions comm_options;
  if (metrics_port) {
    const int rank = resolver->id_in_cluster();
    const auto own = net::parse_host_port(addresses[static_cast<std::size_t>(rank)]);
    setup.metrics = TaskMetrics::start(type, resolver->task_id(), own.host, *metrics_port, rank,
                                       net::MetricsAccess{options.cluster_token, options.insecure});
    comm_options.metrics = setup.metrics->collectives;
  }
  comm_options.cluster_token = options.cluster_token;  // unset: net/ reads DISTRIBUTE_CLUSTER_TOKEN
  comm_options.insecure = options.insecure;
  if (options.loopback_congestion_control) comm_options.loopback_congestion_control = *options.loopback_congestion_control;
  if (options.shared_memory_min_bytes) comm_options.shared_memory_min_bytes = *options.shared_memory_min_bytes;
  if (options.timeout_seconds) {
    comm_options.operation_timeout =
        std::chrono::milliseconds(static_cast<std::int64_t>(*options.timeout_seconds * 1000.0));
  }
  setup.link = std::make_unique<net::CommunicatorLink>(std::make_unique<net::Communicator>(
      std::move(addresses), resolver->id_in_cluster(), comm_options, std::move(names)));
  return setup;
}

DISTRIBUTE_DECL MultiWorkerSetup MultiWorkerSetup::make_mpi(const CommunicationOptions& options,
                                                           std::shared_ptr<ClusterResolver> resolver,
                                                           MultiWorkerSetup& setup) {
  net::MpiLinkOptions mpi_options;
  mpi_options.check_agreement = options.mpi_check_agreement;
  if (options.timeout_seconds) {
    mpi_options.operation_timeout =
        std::chrono::milliseconds(static_cast<std::int64_t>(*options.timeout_seconds * 1000.0));
  }
  auto link = net::mpi_link_factory()(mpi_options);
  const int size = link->num_workers(), rank = link->worker_index();
  if (resolver) {
    if (resolver->worker_count() != size || resolver->id_in_cluster() != rank) {
      throw ClusterConfigError(fmt::format(
          "MultiWorkerMirroredStrategy (MPI): the cluster resolver says worker {} of {}, MPI says rank {} of {}",
          resolver->id_in_cluster(), resolver->worker_count(), rank, size));
    }
  } else if (size > 1) {
    std::vector<std::string> workers;
    for (int w = 0; w < size; ++w) workers.push_back(fmt::format("mpi-rank-{}:1", w));  // MPI has the addresses
    resolver = std::make_shared<SimpleClusterResolver>(ClusterSpec({{"worker", workers}}), "worker", rank, "mpi");
  } else {
    resolver = std::make_shared<SimpleClusterResolver>(ClusterSpec(), "worker", 0, "mpi");
  }
  setup.resolver = std::move(resolver);
  start_timeline(options, "worker", rank);
  if (size > 1) setup.link = std::move(link);
  return std::move(setup);
}
#endif  // DISTRIBUTE_DETAIL_DEFINE

}  // namespace strategy::detail

template <class Backend = host>
class MultiWorkerMirroredStrategy
    : private strategy::detail::MultiWorkerSetup,
      public SyncStrategy<MultiWorkerMirroredStrategy<Backend>, Backend, default_cross_device_ops_t<Backend>> {
  using Base = SyncStrategy<MultiWorkerMirroredStrategy<Backend>, Backend, default_cross_device_ops_t<Backend>>;

 public:
  /// `resolver` defaults to TFConfigClusterResolver (the TF_CONFIG environment variable; without
  /// it, a single-worker cluster). `local_replicas`: replicas per worker (host: threads).
  explicit MultiWorkerMirroredStrategy(CommunicationOptions options = {},
                                       std::shared_ptr<ClusterResolver> resolver = nullptr, int local_replicas = 1)
      : strategy::detail::MultiWorkerSetup(strategy::detail::MultiWorkerSetup::make<Backend>(options, std::move(resolver))),
        Base(Backend::devices(local_replicas, "MultiWorkerMirroredStrategy"), options, link.get(), implementation,
             collective_metrics()) {}

  std::string_view name() const noexcept override { return "MultiWorkerMirroredStrategy"; }

  /// How the workers communicate: options.implementation resolved (AUTO is NCCL on the cuda
  /// backend where NCCL is compiled in, RING otherwise). Never Auto.
  CommunicationImplementation communication_implementation() const noexcept { return implementation; }

  /// The cluster this strategy runs in.
  const ClusterResolver* cluster_resolver() const noexcept { return resolver.get(); }
  /// The port this task serves its metrics on (GET /metrics), when metrics are on
  /// (CommunicationOptions::metrics_port or DISTRIBUTE_METRICS_PORT, in a cluster of several workers).
  std::optional<std::uint16_t> metrics_port() const noexcept { return strategy::detail::MultiWorkerSetup::metrics_port(); }

  /// True on the worker that writes checkpoints and summaries (the chief, else worker 0).
  bool is_chief() const { return this->worker_index() == 0; }
  /// Waits until every worker reaches this point.
  void barrier() {
    if (link) link->barrier();
  }
};

DISTRIBUTE_END_NAMESPACE

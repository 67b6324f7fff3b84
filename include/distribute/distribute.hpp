// distribute: tf.distribute for C++. The umbrella header.
//
// It always gives the strategies on the host and what they use: core/ (tensors, values, variables,
// contexts), data/ (datasets), the host backend and its collectives, and OneDeviceStrategy,
// MirroredStrategy, CentralStorageStrategy and the default strategy. The parts that need other
// libraries, and whose headers cost a translation unit several times as much to compile, come
// only when the program asks for them, by defining a switch before including this header:
//
//   DISTRIBUTE_WITH_CHECKPOINT    checkpoint/: safetensors, Checkpoint, CheckpointManager,
//                                 PreemptionCheckpointHandler                    (Boost.JSON)
//   DISTRIBUTE_WITH_CLUSTER       cluster/: ClusterSpec and the cluster resolvers (Boost.JSON)
//   DISTRIBUTE_WITH_MULTI_WORKER  + MultiWorkerMirroredStrategy                 (+ Boost.Asio, OpenSSL)
//   DISTRIBUTE_WITH_NET           net::Communicator, the TCP collectives themselves (Boost.Asio, OpenSSL)
//   DISTRIBUTE_WITH_PS            + ps/: ParameterServerStrategy, ds::Server, ClusterCoordinator,
//                                 remote functions, ShardedVariable, partitioners, optimizers::SGD and
//                                 optimizers::Adagrad (+ Boost.Beast, cereal)
//   DISTRIBUTE_WITH_SUMMARY       + summary/: SummaryWriter (TensorBoard event files)
//   DISTRIBUTE_WITH_ALL           all of the above
//
// "+" means the part brings the one above it too (MULTI_WORKER brings CLUSTER, PS brings
// MULTI_WORKER and NET; SUMMARY brings CLUSTER). DISTRIBUTE_WITH_MPI (net/mpi.hpp) brings MULTI_WORKER.
// The GPU parts keep their own switches (at the end of this file).
//
// A part's own headers give it without a switch (#include <distribute/strategy/multi_worker_mirrored.hpp>).
// A program that names a part it did not ask for gets one compile error naming the switch.
//
// There is no #pragma once: each part below is guarded on its own, so that including this header
// again after defining another switch adds that part.

#include <distribute/version.hpp>

// ---------------------------------------------------------------------------------------------
// Which parts: the switches and what each brings.
#if defined(DISTRIBUTE_WITH_ALL) || defined(DISTRIBUTE_WITH_PS)
#define DISTRIBUTE_DETAIL_PART_PS 1
#endif
#if defined(DISTRIBUTE_WITH_ALL) || defined(DISTRIBUTE_WITH_MULTI_WORKER) || defined(DISTRIBUTE_WITH_MPI) || \
    defined(DISTRIBUTE_DETAIL_PART_PS)
#define DISTRIBUTE_DETAIL_PART_MULTI_WORKER 1
#endif
#if defined(DISTRIBUTE_WITH_ALL) || defined(DISTRIBUTE_WITH_NET) || defined(DISTRIBUTE_DETAIL_PART_PS)
#define DISTRIBUTE_DETAIL_PART_NET 1
#endif
#if defined(DISTRIBUTE_WITH_ALL) || defined(DISTRIBUTE_WITH_SUMMARY)
#define DISTRIBUTE_DETAIL_PART_SUMMARY 1
#endif
#if defined(DISTRIBUTE_WITH_ALL) || defined(DISTRIBUTE_WITH_CLUSTER) || \
    defined(DISTRIBUTE_DETAIL_PART_MULTI_WORKER) || defined(DISTRIBUTE_DETAIL_PART_SUMMARY)
#define DISTRIBUTE_DETAIL_PART_CLUSTER 1
#endif
#if defined(DISTRIBUTE_WITH_ALL) || defined(DISTRIBUTE_WITH_CHECKPOINT)
#define DISTRIBUTE_DETAIL_PART_CHECKPOINT 1
#endif

// A part asked for whose library is missing: say which (rather than a missing-file error deep inside).
#if (defined(DISTRIBUTE_DETAIL_PART_CLUSTER) || defined(DISTRIBUTE_DETAIL_PART_CHECKPOINT)) && \
    !__has_include(<boost/json.hpp>)
#error "distribute: the cluster and checkpoint parts need Boost.JSON (<boost/json.hpp>; Debian: libboost-json-dev)"
#endif
#if (defined(DISTRIBUTE_DETAIL_PART_MULTI_WORKER) || defined(DISTRIBUTE_DETAIL_PART_NET)) && \
    (!__has_include(<boost/asio.hpp>) || !__has_include(<openssl/hmac.h>))
#error "distribute: DISTRIBUTE_WITH_MULTI_WORKER and _NET need Boost.Asio and OpenSSL (Debian: libboost-dev libssl-dev)"
#endif
#if defined(DISTRIBUTE_DETAIL_PART_PS) && !__has_include(<cereal/cereal.hpp>)
#error "distribute: DISTRIBUTE_WITH_PS needs cereal (<cereal/cereal.hpp>; Debian: libcereal-dev)"
#endif

// ---------------------------------------------------------------------------------------------
// Always: the strategies on the host.
#include <distribute/core/device.hpp>
#include <distribute/core/dtype.hpp>
#include <distribute/core/error.hpp>
#include <distribute/core/reduce_op.hpp>
#include <distribute/core/shape.hpp>
#include <distribute/core/tensor.hpp>
#include <distribute/core/tensor_traits.hpp>
#include <distribute/core/values.hpp>
#include <distribute/core/context.hpp>
#include <distribute/core/indexed_slices.hpp>
#include <distribute/core/initializer.hpp>
#include <distribute/core/variable.hpp>

#include <distribute/data/options.hpp>
#include <distribute/data/record_file.hpp>
#include <distribute/data/dataset.hpp>
#include <distribute/data/input_context.hpp>
#include <distribute/data/distributed_dataset.hpp>

#include <distribute/backends/host/host.hpp>
#include <distribute/backends/host/replica_threads.hpp>
#include <distribute/collective/communication_options.hpp>
#include <distribute/collective/shared_memory.hpp>
#include <distribute/collective/reduction_to_one_device.hpp>
#include <distribute/collective/hierarchical_copy.hpp>
#include <distribute/collective/packing.hpp>

#include <distribute/strategy/default_strategy.hpp>
#include <distribute/strategy/mirrored.hpp>
#include <distribute/strategy/one_device.hpp>
#include <distribute/strategy/central_storage.hpp>

// ---------------------------------------------------------------------------------------------
// The parts asked for.
#if defined(DISTRIBUTE_DETAIL_PART_CHECKPOINT) && !defined(DISTRIBUTE_DETAIL_HAS_CHECKPOINT)
#define DISTRIBUTE_DETAIL_HAS_CHECKPOINT 1
#include <distribute/checkpoint/safetensors.hpp>
#include <distribute/checkpoint/checkpoint.hpp>
#include <distribute/checkpoint/checkpoint_manager.hpp>
#include <distribute/checkpoint/preemption.hpp>
#endif

#if defined(DISTRIBUTE_DETAIL_PART_CLUSTER) && !defined(DISTRIBUTE_DETAIL_HAS_CLUSTER)
#define DISTRIBUTE_DETAIL_HAS_CLUSTER 1
#include <distribute/cluster/address.hpp>
#include <distribute/cluster/cluster_spec.hpp>
#include <distribute/cluster/cluster_resolver.hpp>
#include <distribute/cluster/tf_config.hpp>
#include <distribute/cluster/slurm.hpp>
#include <distribute/cluster/launcher.hpp>
#endif

#if defined(DISTRIBUTE_DETAIL_PART_SUMMARY) && !defined(DISTRIBUTE_DETAIL_HAS_SUMMARY)
#define DISTRIBUTE_DETAIL_HAS_SUMMARY 1
#include <distribute/summary/event.hpp>
#include <distribute/summary/summary_writer.hpp>
#endif

#if defined(DISTRIBUTE_DETAIL_PART_MULTI_WORKER) && !defined(DISTRIBUTE_DETAIL_HAS_MULTI_WORKER)
#define DISTRIBUTE_DETAIL_HAS_MULTI_WORKER 1
#include <distribute/strategy/multi_worker_mirrored.hpp>
#endif

#if defined(DISTRIBUTE_DETAIL_PART_NET) && !defined(DISTRIBUTE_DETAIL_HAS_NET)
#define DISTRIBUTE_DETAIL_HAS_NET 1
#include <distribute/net/communicator.hpp>
#endif

#if defined(DISTRIBUTE_DETAIL_PART_PS) && !defined(DISTRIBUTE_DETAIL_HAS_PS)
#define DISTRIBUTE_DETAIL_HAS_PS 1
#include <distribute/ps/partitioner.hpp>
#include <distribute/ps/placement.hpp>
#include <distribute/ps/sharded_variable.hpp>
#include <distribute/ps/optimizers.hpp>
#include <distribute/ps/parameter_server_strategy.hpp>
#include <distribute/ps/remote_function.hpp>
#include <distribute/ps/server.hpp>
#include <distribute/ps/cluster_coordinator.hpp>
#endif

// ---------------------------------------------------------------------------------------------
// The parts not asked for: their main names, declared so that a use is one error naming the
// switch. They live in distribute::parts_not_included, which `distribute` nominates with a
// using-directive: a qualified name (ds::X) finds them only when the library itself declares no
// X (C++'s qualified lookup looks at nominated namespaces only then), so a part's header included
// later still wins.
#if !defined(DISTRIBUTE_DETAIL_NOT_INCLUDED_BASE)
#define DISTRIBUTE_DETAIL_NOT_INCLUDED_BASE 1
namespace distribute::parts_not_included {
template <class...>
inline constexpr bool asked_for = false;
}  // namespace distribute::parts_not_included
namespace distribute {
using namespace parts_not_included;
}  // namespace distribute

// A class (template) of a part not included: using it (constructing one, naming it with template
// arguments) fails the static_assert; naming it bare where a type is needed fails with a note
// that points here, to the line that names the switch.
#define DISTRIBUTE_DETAIL_NOT_INCLUDED_CLASS(name, part_switch, header) \
  DISTRIBUTE_DETAIL_NOT_INCLUDED_CLASS_AS(name, "distribute::" #name, part_switch, header)
#define DISTRIBUTE_DETAIL_NOT_INCLUDED_CLASS_AS(name, shown, part_switch, header)                           \
  template <class... A>                                                                                    \
  class name {                                                                                             \
    static_assert(::distribute::parts_not_included::asked_for<A...>,                                       \
                  shown " is not included: #define " part_switch                                          \
                  " before #include <distribute/distribute.hpp> (or include <" header ">)");              \
                                                                                                           \
   public:                                                                                                 \
    template <class... U>                                                                                  \
    name(U&&...) {}                                                                                        \
  }
#define DISTRIBUTE_DETAIL_NOT_INCLUDED_FUNCTION(name, shown, part_switch, header)                           \
  template <class... A>                                                                                    \
  void name(A&&...) {                                                                                      \
    static_assert(::distribute::parts_not_included::asked_for<A...>,                                       \
                  shown "() is not included: #define " part_switch                                        \
                  " before #include <distribute/distribute.hpp> (or include <" header ">)");              \
  }
#endif

#if !defined(DISTRIBUTE_DETAIL_PART_CHECKPOINT) && !defined(DISTRIBUTE_DETAIL_NOT_INCLUDED_CHECKPOINT)
#define DISTRIBUTE_DETAIL_NOT_INCLUDED_CHECKPOINT 1
namespace distribute::parts_not_included {
DISTRIBUTE_DETAIL_NOT_INCLUDED_CLASS(Checkpoint, "DISTRIBUTE_WITH_CHECKPOINT", "distribute/checkpoint/checkpoint.hpp");
DISTRIBUTE_DETAIL_NOT_INCLUDED_CLASS(CheckpointOptions, "DISTRIBUTE_WITH_CHECKPOINT",
                                     "distribute/checkpoint/checkpoint.hpp");
DISTRIBUTE_DETAIL_NOT_INCLUDED_CLASS(CheckpointManager, "DISTRIBUTE_WITH_CHECKPOINT",
                                     "distribute/checkpoint/checkpoint_manager.hpp");
DISTRIBUTE_DETAIL_NOT_INCLUDED_CLASS(CheckpointManagerOptions, "DISTRIBUTE_WITH_CHECKPOINT",
                                     "distribute/checkpoint/checkpoint_manager.hpp");
DISTRIBUTE_DETAIL_NOT_INCLUDED_FUNCTION(latest_checkpoint, "distribute::latest_checkpoint",
                                        "DISTRIBUTE_WITH_CHECKPOINT", "distribute/checkpoint/checkpoint_manager.hpp")
DISTRIBUTE_DETAIL_NOT_INCLUDED_CLASS(PreemptionCheckpointHandler, "DISTRIBUTE_WITH_CHECKPOINT",
                                     "distribute/checkpoint/preemption.hpp");
DISTRIBUTE_DETAIL_NOT_INCLUDED_CLASS(PreemptionOptions, "DISTRIBUTE_WITH_CHECKPOINT",
                                     "distribute/checkpoint/preemption.hpp");
}  // namespace distribute::parts_not_included
#endif

#if !defined(DISTRIBUTE_DETAIL_PART_CLUSTER) && !defined(DISTRIBUTE_DETAIL_NOT_INCLUDED_CLUSTER)
#define DISTRIBUTE_DETAIL_NOT_INCLUDED_CLUSTER 1
namespace distribute::parts_not_included {
DISTRIBUTE_DETAIL_NOT_INCLUDED_CLASS(ClusterSpec, "DISTRIBUTE_WITH_CLUSTER", "distribute/cluster/cluster_spec.hpp");
DISTRIBUTE_DETAIL_NOT_INCLUDED_CLASS(ClusterResolver, "DISTRIBUTE_WITH_CLUSTER",
                                     "distribute/cluster/cluster_resolver.hpp");
DISTRIBUTE_DETAIL_NOT_INCLUDED_CLASS(SimpleClusterResolver, "DISTRIBUTE_WITH_CLUSTER",
                                     "distribute/cluster/cluster_resolver.hpp");
DISTRIBUTE_DETAIL_NOT_INCLUDED_CLASS(TFConfigClusterResolver, "DISTRIBUTE_WITH_CLUSTER",
                                     "distribute/cluster/tf_config.hpp");
DISTRIBUTE_DETAIL_NOT_INCLUDED_CLASS(SlurmClusterResolver, "DISTRIBUTE_WITH_CLUSTER", "distribute/cluster/slurm.hpp");
DISTRIBUTE_DETAIL_NOT_INCLUDED_CLASS(LauncherClusterResolver, "DISTRIBUTE_WITH_CLUSTER",
                                     "distribute/cluster/launcher.hpp");
}  // namespace distribute::parts_not_included
#endif

#if !defined(DISTRIBUTE_DETAIL_PART_SUMMARY) && !defined(DISTRIBUTE_DETAIL_NOT_INCLUDED_SUMMARY)
#define DISTRIBUTE_DETAIL_NOT_INCLUDED_SUMMARY 1
namespace distribute::parts_not_included {
DISTRIBUTE_DETAIL_NOT_INCLUDED_CLASS(SummaryWriter, "DISTRIBUTE_WITH_SUMMARY", "distribute/summary/summary_writer.hpp");
namespace summary {
DISTRIBUTE_DETAIL_NOT_INCLUDED_CLASS_AS(SummaryWriter, "distribute::summary::SummaryWriter", "DISTRIBUTE_WITH_SUMMARY",
                                        "distribute/summary/summary_writer.hpp");
DISTRIBUTE_DETAIL_NOT_INCLUDED_FUNCTION(create_file_writer, "distribute::summary::create_file_writer",
                                        "DISTRIBUTE_WITH_SUMMARY", "distribute/summary/summary_writer.hpp")
}  // namespace summary
}  // namespace distribute::parts_not_included
DISTRIBUTE_BEGIN_NAMESPACE
namespace summary {
using namespace ::distribute::parts_not_included::summary;
}  // namespace summary
DISTRIBUTE_END_NAMESPACE
#endif

#if !defined(DISTRIBUTE_DETAIL_PART_MULTI_WORKER) && !defined(DISTRIBUTE_DETAIL_NOT_INCLUDED_MULTI_WORKER)
#define DISTRIBUTE_DETAIL_NOT_INCLUDED_MULTI_WORKER 1
namespace distribute::parts_not_included {
DISTRIBUTE_DETAIL_NOT_INCLUDED_CLASS(MultiWorkerMirroredStrategy, "DISTRIBUTE_WITH_MULTI_WORKER",
                                     "distribute/strategy/multi_worker_mirrored.hpp");
}  // namespace distribute::parts_not_included
#endif

#if !defined(DISTRIBUTE_DETAIL_PART_NET) && !defined(DISTRIBUTE_DETAIL_NOT_INCLUDED_NET)
#define DISTRIBUTE_DETAIL_NOT_INCLUDED_NET 1
namespace distribute::parts_not_included::net {
DISTRIBUTE_DETAIL_NOT_INCLUDED_CLASS_AS(Communicator, "distribute::net::Communicator", "DISTRIBUTE_WITH_NET",
                                        "distribute/net/communicator.hpp");
DISTRIBUTE_DETAIL_NOT_INCLUDED_CLASS_AS(CommunicatorOptions, "distribute::net::CommunicatorOptions",
                                        "DISTRIBUTE_WITH_NET", "distribute/net/communicator.hpp");
}  // namespace distribute::parts_not_included::net
// ds::net exists without this part (net/mpi.hpp opens it): its own using-directive reaches the stand-ins.
DISTRIBUTE_BEGIN_NAMESPACE
namespace net {
using namespace ::distribute::parts_not_included::net;
}  // namespace net
DISTRIBUTE_END_NAMESPACE
#endif

#if !defined(DISTRIBUTE_DETAIL_PART_PS) && !defined(DISTRIBUTE_DETAIL_NOT_INCLUDED_PS)
#define DISTRIBUTE_DETAIL_NOT_INCLUDED_PS 1
namespace distribute::parts_not_included {
DISTRIBUTE_DETAIL_NOT_INCLUDED_CLASS(ParameterServerStrategy, "DISTRIBUTE_WITH_PS",
                                     "distribute/ps/parameter_server_strategy.hpp");
DISTRIBUTE_DETAIL_NOT_INCLUDED_CLASS(ParameterServerOptions, "DISTRIBUTE_WITH_PS",
                                     "distribute/ps/parameter_server_strategy.hpp");
DISTRIBUTE_DETAIL_NOT_INCLUDED_CLASS(Server, "DISTRIBUTE_WITH_PS", "distribute/ps/server.hpp");
DISTRIBUTE_DETAIL_NOT_INCLUDED_CLASS(ServerOptions, "DISTRIBUTE_WITH_PS", "distribute/ps/server.hpp");
DISTRIBUTE_DETAIL_NOT_INCLUDED_CLASS(ClusterCoordinator, "DISTRIBUTE_WITH_PS", "distribute/ps/cluster_coordinator.hpp");
DISTRIBUTE_DETAIL_NOT_INCLUDED_CLASS(CoordinatorOptions, "DISTRIBUTE_WITH_PS", "distribute/ps/cluster_coordinator.hpp");
DISTRIBUTE_DETAIL_NOT_INCLUDED_CLASS(ShardedVariable, "DISTRIBUTE_WITH_PS", "distribute/ps/sharded_variable.hpp");
DISTRIBUTE_DETAIL_NOT_INCLUDED_CLASS(FixedShardsPartitioner, "DISTRIBUTE_WITH_PS", "distribute/ps/partitioner.hpp");
DISTRIBUTE_DETAIL_NOT_INCLUDED_CLASS(MinSizePartitioner, "DISTRIBUTE_WITH_PS", "distribute/ps/partitioner.hpp");
DISTRIBUTE_DETAIL_NOT_INCLUDED_CLASS(MaxSizePartitioner, "DISTRIBUTE_WITH_PS", "distribute/ps/partitioner.hpp");
DISTRIBUTE_DETAIL_NOT_INCLUDED_FUNCTION(register_remote_function, "distribute::register_remote_function",
                                        "DISTRIBUTE_WITH_PS", "distribute/ps/remote_function.hpp")
}  // namespace distribute::parts_not_included
namespace distribute::parts_not_included::optimizers {
DISTRIBUTE_DETAIL_NOT_INCLUDED_CLASS_AS(SGD, "distribute::optimizers::SGD", "DISTRIBUTE_WITH_PS",
                                        "distribute/ps/optimizers.hpp");
DISTRIBUTE_DETAIL_NOT_INCLUDED_CLASS_AS(Adagrad, "distribute::optimizers::Adagrad", "DISTRIBUTE_WITH_PS",
                                        "distribute/ps/optimizers.hpp");
}  // namespace distribute::parts_not_included::optimizers
DISTRIBUTE_BEGIN_NAMESPACE
namespace optimizers {
using namespace ::distribute::parts_not_included::optimizers;
}  // namespace optimizers
DISTRIBUTE_END_NAMESPACE
#if !defined(DISTRIBUTE_REMOTE_FUNCTION)
#define DISTRIBUTE_REMOTE_FUNCTION(fn)                                                                     \
  static_assert(::distribute::parts_not_included::asked_for<>,                                            \
                "DISTRIBUTE_REMOTE_FUNCTION is not included: #define DISTRIBUTE_WITH_PS before #include "  \
                "<distribute/distribute.hpp> (or include <distribute/ps/remote_function.hpp>)")
#endif
#endif

// ---------------------------------------------------------------------------------------------
// GPU parts (backends/cuda, collective/nccl.hpp). Device values (ds::DeviceTensor,
// thrust::device_vector) under a CUDA compiler, or in a CPU build that chose a Thrust device
// system (-DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP or _CPP, CCCL on the include path).
// The ds::cuda backend and NcclAllReduce under a CUDA compiler; in a host-compiled file define
// DISTRIBUTE_WITH_CUDA for the backend tag alone (links libcudart).
#if defined(__CUDACC__) || (defined(THRUST_DEVICE_SYSTEM) && __has_include(<thrust/device_vector.h>))
#include <distribute/backends/cuda/device_tensor.hpp>
#endif
#if defined(__CUDACC__) || defined(DISTRIBUTE_WITH_CUDA)
#include <distribute/backends/cuda/cuda.hpp>
#include <distribute/collective/nccl.hpp>
#endif

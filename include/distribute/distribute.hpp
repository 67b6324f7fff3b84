// distribute: tf.distribute for C++. The umbrella header: includes every enabled part.
#pragma once

#include <distribute/version.hpp>

#include <distribute/core/device.hpp>
#include <distribute/core/dtype.hpp>
#include <distribute/core/error.hpp>
#include <distribute/core/reduce_op.hpp>
#include <distribute/core/shape.hpp>
#include <distribute/core/tensor.hpp>
#include <distribute/core/tensor_traits.hpp>
#include <distribute/core/values.hpp>
#include <distribute/core/context.hpp>
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

// checkpoint/ (needs Boost.JSON)
#if __has_include(<boost/json.hpp>)
#include <distribute/checkpoint/safetensors.hpp>
#include <distribute/checkpoint/checkpoint.hpp>
#include <distribute/checkpoint/checkpoint_manager.hpp>
#include <distribute/checkpoint/preemption.hpp>
#endif

// cluster/ (needs Boost.JSON)
#if __has_include(<boost/json.hpp>)
#include <distribute/cluster/address.hpp>
#include <distribute/cluster/cluster_spec.hpp>
#include <distribute/cluster/cluster_resolver.hpp>
#include <distribute/cluster/tf_config.hpp>
#include <distribute/cluster/slurm.hpp>
#include <distribute/cluster/launcher.hpp>
// summary/: SummaryWriter, TensorBoard event files (its chief comes from cluster/'s resolvers);
// 0.15% more preprocessed lines than the rest of the umbrella, a compile time within the noise
#include <distribute/summary/event.hpp>
#include <distribute/summary/summary_writer.hpp>
#endif

// ps/: partitioners, round-robin ps placement, sharded variables; ParameterServerStrategy also
// needs cluster/ (Boost.JSON)
#include <distribute/ps/partitioner.hpp>
#include <distribute/ps/placement.hpp>
#include <distribute/ps/sharded_variable.hpp>

// net/ (needs Boost.Asio and OpenSSL) and the strategies built on it
#if __has_include(<boost/asio.hpp>) && __has_include(<openssl/hmac.h>) && __has_include(<boost/json.hpp>)
#include <distribute/net/communicator.hpp>
#include <distribute/strategy/multi_worker_mirrored.hpp>
#endif

// Parameter-server training: the strategy, ds::Server, ClusterCoordinator and remote functions
// (needs Boost.Asio/Beast/JSON, OpenSSL and cereal)
#if __has_include(<boost/asio.hpp>) && __has_include(<openssl/hmac.h>) && __has_include(<boost/json.hpp>) && \
    __has_include(<cereal/cereal.hpp>)
#include <distribute/strategy/parameter_server.hpp>
#include <distribute/ps/remote_function.hpp>
#include <distribute/ps/server.hpp>
#include <distribute/ps/cluster_coordinator.hpp>
#endif

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

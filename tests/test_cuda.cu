// MirroredStrategy<ds::cuda> end to end on the visible GPUs, NCCL against host results, and the
// cuda backend's errors. Compiled by nvcc. Two modes (tests/meson.build registers both), and a
// third the tests start themselves (one worker of a 2-process NCCL cluster, --nccl-worker):
//
//   test_cuda --no-gpu-checks   run with CUDA_VISIBLE_DEVICES=-1: a cuda strategy must throw
//                               Unavailable (with CUDA's reason) and bad device lists
//                               InvalidArgument; runs on every machine, GPU or not.
//   test_cuda                   the GPU tests; with no GPU visible prints "skipped: no GPU" and
//                               exits 77, which meson reports as SKIP, not as a pass.
#include <distribute/backends/cuda/cuda.hpp>  // first: configures fmt for nvcc

#include <distribute/backends/cuda/device_tensor.hpp>
#include <distribute/collective/nccl.hpp>
#include <distribute/core/variable.hpp>
#include <distribute/strategy/central_storage.hpp>
#include <distribute/strategy/mirrored.hpp>
#include <distribute/strategy/one_device.hpp>

#if __has_include(<boost/asio.hpp>) && __has_include(<openssl/hmac.h>) && __has_include(<boost/json.hpp>)
#define DISTRIBUTE_TEST_MULTI_WORKER 1
#include <distribute/strategy/multi_worker_mirrored.hpp>

#include "support/http_get.hpp"
#include "support/processes.hpp"
#else
#define DISTRIBUTE_TEST_MULTI_WORKER 0
#endif

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <cuda_runtime.h>
#include <thrust/device_vector.h>
#include <thrust/host_vector.h>

namespace ds = distribute;

namespace {

template <class T>
using dvec = thrust::device_vector<T>;

template <class T>
std::vector<T> host_of(const dvec<T>& v) {
  const thrust::host_vector<T> h(v);
  return std::vector<T>(h.begin(), h.end());
}

// Every element within `tolerance` of `value`.
template <class T>
bool all_near(const std::vector<T>& v, double value, double tolerance = 1e-6) {
  for (const T& x : v) {
    if (std::abs(double(x) - value) > tolerance) return false;
  }
  return true;
}

template <class T>
std::vector<T> input(int replica, std::size_t size) {
  std::vector<T> v(size);
  std::mt19937 rng(static_cast<unsigned>(replica) * 7919u + 17u);
  for (std::size_t i = 0; i < size; ++i) {
    if constexpr (std::is_floating_point_v<T>) v[i] = static_cast<T>(std::uniform_real_distribution<double>(-1, 1)(rng));
    else v[i] = static_cast<T>(static_cast<int>(rng() % 2001) - 1000);
  }
  return v;
}

// What every replica must hold after all_reduce(op), computed on the host.
template <class T>
std::vector<T> host_all_reduce(int replicas, std::size_t size, ds::ReduceOp op) {
  std::vector<T> acc = input<T>(0, size);
  for (int r = 1; r < replicas; ++r) {
    const auto src = input<T>(r, size);
    ds::core::combine(acc.data(), src.data(), size, op);
  }
  if (op == ds::ReduceOp::Mean) ds::core::divide(acc.data(), size, replicas);
  return acc;
}

int visible_gpus() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

}  // namespace

// ---- no GPU visible (CUDA_VISIBLE_DEVICES=-1, or no GPU at all) ------------------------------

TEST_CASE("no_gpu: a cuda strategy without a visible GPU is Unavailable, naming CUDA's reason" *
          doctest::test_suite("no_gpu")) {
  using Mirrored = ds::MirroredStrategy<ds::cuda>;
  CHECK_THROWS_WITH_AS(Mirrored(), doctest::Contains("MirroredStrategy: no CUDA device visible: cudaGetDeviceCount"),
                       ds::Unavailable);
  CHECK_THROWS_AS(Mirrored(2), ds::Unavailable);
  CHECK_THROWS_AS(ds::OneDeviceStrategy<ds::cuda>(), ds::Unavailable);
  CHECK_THROWS_AS(ds::cuda::device_count(), ds::Unavailable);
  try {
    Mirrored strategy;
  } catch (const ds::Unavailable& e) {
    MESSAGE("the error a user sees: " << std::string(e.what()));
  }
  // An unknown GPU: nothing is visible, so Unavailable (InvalidArgument where GPUs exist).
  CHECK_THROWS_AS(Mirrored(std::vector<std::string>{"/gpu:99"}), ds::Unavailable);
  // Spelling errors are found before the machine is asked about GPUs.
  CHECK_THROWS_WITH_AS(Mirrored(std::vector<std::string>{"/cpu:0"}), doctest::Contains("device '/cpu:0' is not a GPU"),
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(Mirrored(std::vector<std::string>{"/gpu:0", "GPU:0"}),
                       "MirroredStrategy: device 'GPU:0' is listed twice", ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(Mirrored(std::vector<std::string>{"/device:GPU:*"}), doctest::Contains("names no device index"),
                       ds::InvalidArgument);
  CHECK_THROWS_AS(Mirrored(std::vector<std::string>{}), ds::InvalidArgument);
  CHECK_THROWS_AS(Mirrored(0), ds::InvalidArgument);
  CHECK(ds::cuda::current_stream() == nullptr);  // not a replica thread: the default stream
  CHECK(ds::cuda::current_device() == -1);
}

TEST_CASE("no_gpu: CentralStorageStrategy<ds::cuda> without a visible GPU is Unavailable" *
          doctest::test_suite("no_gpu")) {
  using Central = ds::CentralStorageStrategy<ds::cuda>;
  // CUDA's own reason, asked of CUDA here.
  int count = -1;
  const cudaError_t why = cudaGetDeviceCount(&count);
  (void)cudaGetLastError();
  REQUIRE((why != cudaSuccess || count == 0));
  for (int attempt = 0; attempt < 3; ++attempt) {
    CAPTURE(attempt);
    bool unavailable = false;
    try {
      if (attempt == 0) Central strategy;
      else if (attempt == 1) Central strategy(2);
      else Central strategy(std::vector<std::string>{"/gpu:0"});
    } catch (const ds::Unavailable& e) {
      unavailable = true;
      const std::string message = e.what();
      CAPTURE(message);
      CHECK(message.rfind("CentralStorageStrategy: no CUDA device visible", 0) == 0);
      if (why != cudaSuccess) CHECK(message.find(cudaGetErrorString(why)) != std::string::npos);
    } catch (...) {
    }
    CHECK(unavailable);
  }
}

TEST_CASE("no_gpu: a failed CUDA call is a CudaError carrying CUDA's error name and text" *
          doctest::test_suite("no_gpu")) {
  CHECK_NOTHROW(ds::backends::cuda_check(cudaSuccess, "cudaMemcpy"));
  auto message_of = [](auto&& fn) -> std::string {
    try {
      fn();
    } catch (const ds::CudaError& e) {
      return e.what();
    }
    return "(no CudaError)";
  };
  // The error code as given.
  CHECK_THROWS_AS(ds::backends::cuda_check(cudaErrorInvalidValue, "cudaMemcpy"), ds::CudaError);
  CHECK_THROWS_AS(ds::backends::cuda_check(cudaErrorInvalidValue, "cudaMemcpy"), ds::Error);  // the library's base
  try {
    ds::backends::cuda_check(cudaErrorInvalidValue, "cudaMemcpy", "all_reduce");
  } catch (const ds::CudaError& e) {
    CHECK(e.code() == static_cast<int>(cudaErrorInvalidValue));
  }
  const std::string invalid = message_of([] { ds::backends::cuda_check(cudaErrorInvalidValue, "cudaMemcpy", "all_reduce"); });
  CAPTURE(invalid);
  CHECK(invalid.find("cudaMemcpy") != std::string::npos);
  CHECK(invalid.find("all_reduce") != std::string::npos);
  CHECK(invalid.find("cudaErrorInvalidValue") != std::string::npos);
  CHECK(invalid.find(cudaGetErrorString(cudaErrorInvalidValue)) != std::string::npos);  // "invalid argument"
  // Whether this machine lets CUDA's last-error slot be cleared (without a driver every call,
  // cudaGetLastError included, reports the missing driver).
  (void)cudaGetLastError();
  const bool clearable = cudaGetLastError() == cudaSuccess;
  // A real failing call (no such device on any machine): its code and CUDA's text come through.
  const cudaError_t e = cudaSetDevice(4096);
  REQUIRE(e != cudaSuccess);
  const std::string real = message_of([&] { ds::backends::cuda_check(e, "cudaSetDevice"); });
  CAPTURE(real);
  CHECK(real.find("cudaSetDevice") != std::string::npos);
  CHECK(real.find(cudaGetErrorName(e)) != std::string::npos);
  CHECK(real.find(cudaGetErrorString(e)) != std::string::npos);
  if (clearable) CHECK(cudaGetLastError() == cudaSuccess);  // cuda_check cleared CUDA's last-error slot
}

#if DISTRIBUTE_HAS_NCCL
TEST_CASE("no_gpu: a failed NCCL call is an NcclError carrying NCCL's error text" * doctest::test_suite("no_gpu")) {
  CHECK_NOTHROW(ds::collective::detail::nccl_check(ncclSuccess, "ncclAllReduce"));
  auto message_of = [](ncclResult_t r, const char* call) -> std::string {
    try {
      ds::collective::detail::nccl_check(r, call);
    } catch (const ds::NcclError& e) {
      CHECK(e.code() == static_cast<int>(r));
      return e.what();
    }
    return "(no NcclError)";
  };
  CHECK_THROWS_AS(ds::collective::detail::nccl_check(ncclInvalidArgument, "ncclAllReduce"), ds::Error);
  const std::string invalid = message_of(ncclInvalidArgument, "ncclAllReduce");
  CAPTURE(invalid);
  CHECK(invalid.find("ncclAllReduce") != std::string::npos);
  CHECK(invalid.find(ncclGetErrorString(ncclInvalidArgument)) != std::string::npos);
  CHECK(message_of(ncclUnhandledCudaError, "ncclGroupEnd").find(ncclGetErrorString(ncclUnhandledCudaError)) !=
        std::string::npos);
  // A real failing call (a null communicator), needing no GPU.
  const ncclResult_t r = ncclCommCount(nullptr, nullptr);
  REQUIRE(r != ncclSuccess);
  const std::string real = message_of(r, "ncclCommCount");
  CAPTURE(real);
  CHECK(real.find("ncclCommCount") != std::string::npos);
  CHECK(real.find(ncclGetErrorString(r)) != std::string::npos);
  MESSAGE("the error a user sees: " << real);
}
#endif

TEST_CASE("no_gpu: the cuda backend's compile-time choices" * doctest::test_suite("no_gpu")) {
#if DISTRIBUTE_HAS_NCCL
  static_assert(std::is_same_v<ds::MirroredStrategy<ds::cuda>::cross_device_ops, ds::NcclAllReduce>);
#else
  static_assert(std::is_same_v<ds::MirroredStrategy<ds::cuda>::cross_device_ops, ds::SharedMemoryAllReduce>);
#endif
  static_assert(std::is_same_v<ds::MirroredStrategy<>::cross_device_ops, ds::SharedMemoryAllReduce>);
  static_assert(ds::memory_space_v<dvec<float>> == ds::MemorySpace::device);
  static_assert(!ds::cuda::single_replica_on_caller_thread);
  CHECK(DISTRIBUTE_THRUST_CUDA == 1);
}

// ---- on GPUs -------------------------------------------------------------------------------

TEST_CASE("gpu: replicas are bound to their GPUs and own a stream" * doctest::test_suite("gpu")) {
  const int gpus = ds::cuda::device_count();
  ds::MirroredStrategy<ds::cuda> strategy;
  CHECK(strategy.num_replicas_in_sync() == gpus);
  CHECK(strategy.extended().worker_devices().front() == "/job:localhost/replica:0/task:0/device:GPU:0");
  auto seen = strategy.run([](ds::ReplicaContext& ctx) {
    int device = -1;
    ds::backends::cuda_check(cudaGetDevice(&device), "cudaGetDevice");
    CHECK(ds::cuda::current_stream() != nullptr);
    CHECK(ds::cuda::current_device() == device);
    return device == ctx.replica_id_in_sync_group();
  });
  for (bool ok : seen.values()) CHECK(ok);

  CHECK_THROWS_WITH_AS(ds::MirroredStrategy<ds::cuda>(std::vector<std::string>{"/gpu:99"}),
                       doctest::Contains("device '/gpu:99' does not exist"), ds::InvalidArgument);
  CHECK_THROWS_AS(ds::MirroredStrategy<ds::cuda>(gpus + 1), ds::InvalidArgument);
  ds::OneDeviceStrategy<ds::cuda> one("/gpu:" + std::to_string(gpus - 1));
  auto where = one.run([] { return ds::cuda::current_device(); });
  CHECK(where[0] == gpus - 1);
}

TEST_CASE("gpu: NCCL all-reduce matches the host kernels, 1..N GPUs, sizes 0 .. 1 MiB + 3" *
          doctest::test_suite("gpu")) {
  const int gpus = ds::cuda::device_count();
  const std::size_t sizes[] = {0, 1, 1001, (std::size_t{1} << 18) + 3};  // the last: 1 MiB + 12 bytes of int32/float32
  for (int n = 1; n <= gpus; ++n) {
    ds::MirroredStrategy<ds::cuda> strategy(n);
    for (std::size_t size : sizes) {
      CAPTURE(n);
      CAPTURE(size);
      for (auto op : {ds::ReduceOp::Sum, ds::ReduceOp::Min, ds::ReduceOp::Max}) {
        CAPTURE(op);
        auto out = strategy.run([&](ds::ReplicaContext& ctx) {
          const auto in = input<std::int32_t>(ctx.replica_id_in_sync_group(), size);
          return ctx.all_reduce(op, dvec<std::int32_t>(in.begin(), in.end()));
        });
        const auto expect = host_all_reduce<std::int32_t>(n, size, op);
        for (const auto& v : out.values()) CHECK(host_of(v) == expect);  // integers: exact
      }
      for (auto op : {ds::ReduceOp::Sum, ds::ReduceOp::Mean}) {
        CAPTURE(op);
        auto out = strategy.run([&](ds::ReplicaContext& ctx) {
          const auto in = input<float>(ctx.replica_id_in_sync_group(), size);
          return ctx.all_reduce(op, dvec<float>(in.begin(), in.end()));
        });
        const auto expect = host_all_reduce<float>(n, size, op);
        const auto first = host_of(out[0]);
        std::size_t bad = 0;
        for (std::size_t i = 0; i < size; ++i) {
          // NCCL sums in its own order (and MEAN may pre-scale): n ulps of magnitude n.
          if (std::abs(double(first[i]) - double(expect[i])) > 4.0 * n * std::numeric_limits<float>::epsilon() * n) ++bad;
        }
        CHECK(bad == 0);
        for (const auto& v : out.values()) CHECK(host_of(v) == first);  // every replica holds the same bits
      }
    }
    // Integer MEAN truncates as on the host; several values travel in one NCCL group.
    auto [mean, flags, shorts] = strategy.run([&](ds::ReplicaContext& ctx) {
      const int id = ctx.replica_id_in_sync_group();
      return ctx.all_reduce(ds::ReduceOp::Mean, dvec<std::int64_t>(5, 2 * id + 1), dvec<double>(3, double(id)),
                            dvec<std::int16_t>(4, static_cast<std::int16_t>(id)));  // int16: not NCCL's, host fallback
    });
    CHECK(host_of(mean[0]) == std::vector<std::int64_t>(5, static_cast<std::int64_t>(n * n) / n));
    CHECK(all_near(host_of(flags[0]), (n - 1) / 2.0, 1e-12));  // ncclAvg may pre-scale
    CHECK(host_of(shorts[0]) == std::vector<std::int16_t>(4, static_cast<std::int16_t>(n * (n - 1) / 2 / n)));
    auto any = strategy.run([&](ds::ReplicaContext& ctx) {
      return ctx.all_reduce(ds::ReduceOp::Max, dvec<bool>(2, ctx.replica_id_in_sync_group() == n - 1));
    });
    CHECK(host_of(any[0]) == std::vector<bool>{true, true});
    // Host values under the NCCL policy take the shared-memory path.
    auto host = strategy.run([](ds::ReplicaContext& ctx) {
      return ctx.all_reduce(ds::ReduceOp::Sum, std::vector<int>{ctx.replica_id_in_sync_group(), 1});
    });
    CHECK(host[0] == std::vector<int>{n * (n - 1) / 2, n});
  }
}

TEST_CASE("gpu: all_gather (uneven, axis 0 and 1), broadcast, reduce and gather across GPUs" *
          doctest::test_suite("gpu")) {
  const int n = ds::cuda::device_count();
  ds::MirroredStrategy<ds::cuda> strategy;
  auto rows = strategy.distribute_values_from_function([](const ds::ValueContext& ctx) {
    const std::int64_t r = ctx.replica_id_in_sync_group + 1;
    std::vector<float> v(static_cast<std::size_t>(r * 3));
    for (std::size_t k = 0; k < v.size(); ++k) v[k] = static_cast<float>(100 * ctx.replica_id_in_sync_group + k);
    return ds::DeviceTensor<float>({r, 3}, v);  // made on the calling thread: strategy.gather copes
  });
  auto host_rows = strategy.distribute_values_from_function(
      [&](const ds::ValueContext& ctx) { return rows[static_cast<std::size_t>(ctx.replica_id_in_sync_group)].to_host(); });
  ds::MirroredStrategy<ds::host> reference(n);
  auto reference_rows = reference.distribute_values_from_function(
      [&](const ds::ValueContext& ctx) { return host_rows[static_cast<std::size_t>(ctx.replica_id_in_sync_group)]; });
  const auto expect_gather = reference.gather(reference_rows, 0);

  auto gathered = strategy.run([](ds::ReplicaContext& ctx, const ds::Tensor<float>& mine) {
    return ctx.all_gather(ds::DeviceTensor<float>::from_host(mine), 0);
  }, host_rows);
  for (const auto& g : gathered.values()) CHECK(g.to_host() == expect_gather);

  auto columns = strategy.run([](ds::ReplicaContext& ctx) {
    const int id = ctx.replica_id_in_sync_group();
    return ctx.all_gather(ds::DeviceTensor<int>({2, id + 1}, std::vector<int>(static_cast<std::size_t>(2 * (id + 1)), id)), 1);
  });
  std::vector<int> row;
  for (int id = 0; id < n; ++id) row.insert(row.end(), static_cast<std::size_t>(id + 1), id);
  std::vector<int> both = row;
  both.insert(both.end(), row.begin(), row.end());
  for (const auto& c : columns.values()) {
    CHECK(c.shape() == ds::Shape{2, n * (n + 1) / 2});
    CHECK(c.to_host().values() == both);
  }

  auto from_last = strategy.run([n](ds::ReplicaContext& ctx) {
    return ctx.broadcast(dvec<double>(7, ctx.replica_id_in_sync_group() + 0.5), n - 1);
  });
  for (const auto& v : from_last.values()) CHECK(host_of(v) == std::vector<double>(7, n - 0.5));

  // Cross-replica: components on different GPUs, results on the caller's.
  auto per_replica = strategy.run([](ds::ReplicaContext& ctx) { return dvec<int>(6, ctx.replica_id_in_sync_group() + 1); });
  CHECK(host_of(strategy.reduce(ds::ReduceOp::Sum, per_replica)) == std::vector<int>(6, n * (n + 1) / 2));
  CHECK(host_of(strategy.reduce(ds::ReduceOp::Max, per_replica)) == std::vector<int>(6, n));
  CHECK(strategy.reduce(ds::ReduceOp::Sum, per_replica, 0) == ds::Tensor<int>::scalar(6 * n * (n + 1) / 2));
  CHECK(host_of(strategy.gather(per_replica, 0)).size() == static_cast<std::size_t>(6 * n));
  CHECK(strategy.gather(rows, 0).to_host() == expect_gather);
}

TEST_CASE("gpu: reduce_scatter (even and uneven parts, SUM and integer MEAN) and all_to_all through NCCL" *
          doctest::test_suite("gpu")) {
  const int n = ds::cuda::device_count();
  ds::MirroredStrategy<ds::cuda> strategy;
  ds::MirroredStrategy<ds::host> reference(n);
  for (std::int64_t rows : {std::int64_t{4} * n, std::int64_t{4} * n + 1, std::int64_t{1}}) {
    CAPTURE(rows);
    // Replica r's [rows, 3] value: element k is r * 1000 + k (int64, so SUM and MEAN are exact).
    auto make = [rows](int r) {
      std::vector<std::int64_t> v(static_cast<std::size_t>(rows * 3));
      for (std::size_t k = 0; k < v.size(); ++k) v[k] = r * 1000 + static_cast<std::int64_t>(k);
      return ds::Tensor<std::int64_t>({rows, 3}, v);
    };
    for (auto op : {ds::ReduceOp::Sum, ds::ReduceOp::Mean}) {
      auto got = strategy.run([&](ds::ReplicaContext& ctx) {
        return ctx.reduce_scatter(op, ds::DeviceTensor<std::int64_t>::from_host(make(ctx.replica_id_in_sync_group())));
      });
      auto want = reference.run([&](ds::ReplicaContext& ctx) { return ctx.reduce_scatter(op, make(ctx.replica_id_in_sync_group())); });
      for (int i = 0; i < n; ++i) CHECK(got[static_cast<std::size_t>(i)].to_host() == want[static_cast<std::size_t>(i)]);
    }
    auto split = strategy.run([&](ds::ReplicaContext& ctx) {
      return ctx.all_to_all(ds::DeviceTensor<std::int64_t>::from_host(make(ctx.replica_id_in_sync_group())));
    });
    auto split_want = reference.run([&](ds::ReplicaContext& ctx) { return ctx.all_to_all(make(ctx.replica_id_in_sync_group())); });
    for (int i = 0; i < n; ++i) CHECK(split[static_cast<std::size_t>(i)].to_host() == split_want[static_cast<std::size_t>(i)]);
  }
}

TEST_CASE("gpu: variables are mirrored on every GPU and updated through NCCL" * doctest::test_suite("gpu")) {
  const int n = ds::cuda::device_count();
  ds::MirroredStrategy<ds::cuda> strategy;
  auto scope = strategy.scope();
  ds::Variable<dvec<float>> w(dvec<float>(1000, 1.0f), {.name = "w", .aggregation = ds::VariableAggregation::Mean});
  REQUIRE(w.values().size() == static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    CHECK(ds::backends::cuda_device_of(thrust::raw_pointer_cast(w.values()[static_cast<std::size_t>(r)].data())) == r);
  }
  strategy.run([&](ds::ReplicaContext& ctx) { w.assign_sub(dvec<float>(1000, float(ctx.replica_id_in_sync_group()))); });
  for (const auto& copy : w.values()) CHECK(all_near(host_of(copy), 1.0 - (n - 1) / 2.0));
  w.assign(dvec<float>(1000, 3.0f));  // cross-replica: from this thread's GPU to every copy
  for (const auto& copy : w.values()) CHECK(host_of(copy) == std::vector<float>(1000, 3.0f));

  ds::Variable<dvec<int>> seen(dvec<int>(1, 0), {.name = "seen",
                                                 .synchronization = ds::VariableSynchronization::OnRead,
                                                 .aggregation = ds::VariableAggregation::Sum});
  strategy.run([&] { seen.assign_add(dvec<int>(1, 2)); });
  CHECK(host_of(seen.read_value()) == std::vector<int>{2 * n});
}

TEST_CASE("gpu: a failing replica does not leave the others in NCCL; the strategy stays usable" *
          doctest::test_suite("gpu")) {
  const int n = ds::cuda::device_count();
  ds::MirroredStrategy<ds::cuda> strategy;
  CHECK_THROWS_WITH(strategy.run([](ds::ReplicaContext& ctx) {
    if (ctx.replica_id_in_sync_group() == 0) throw std::runtime_error("replica 0 failed");
    return ctx.all_reduce(ds::ReduceOp::Sum, dvec<float>(16, 1.0f));
  }),
                    "replica 0 failed");
  auto ok = strategy.run([](ds::ReplicaContext& ctx) { return ctx.all_reduce(ds::ReduceOp::Sum, dvec<float>(16, 1.0f)); });
  CHECK(host_of(ok[0]) == std::vector<float>(16, float(n)));
  // Mismatched shapes are rejected on every replica before any NCCL call.
  if (n > 1) {
    CHECK_THROWS_WITH_AS(strategy.run([](ds::ReplicaContext& ctx) {
      return ctx.all_reduce(ds::ReduceOp::Sum, dvec<float>(static_cast<std::size_t>(ctx.replica_id_in_sync_group() + 1)));
    }),
                         doctest::Contains("all_reduce: value 0 is float32 of shape"), ds::InvalidArgument);
  }
}

#if DISTRIBUTE_TEST_MULTI_WORKER
TEST_CASE("no_gpu: MultiWorkerMirroredStrategy<ds::cuda> resolves AUTO to NCCL where NCCL is compiled in" *
          doctest::test_suite("no_gpu")) {
  using Setup = ds::strategy::detail::MultiWorkerSetup;
  using CI = ds::CommunicationImplementation;
  CHECK(Setup::resolve<ds::cuda>(CI::Ring) == CI::Ring);
#if DISTRIBUTE_HAS_NCCL
  static_assert(ds::collective::spans_workers_v<ds::NcclAllReduce>);
  CHECK(Setup::resolve<ds::cuda>(CI::Auto) == CI::Nccl);
  CHECK(Setup::resolve<ds::cuda>(CI::Nccl) == CI::Nccl);
#else
  CHECK(Setup::resolve<ds::cuda>(CI::Auto) == CI::Ring);
  CHECK_THROWS_WITH_AS(Setup::resolve<ds::cuda>(CI::Nccl), doctest::Contains("NCCL is not available on the cuda backend"),
                       ds::InvalidArgument);
#endif
  CHECK(Setup::resolve<ds::host>(CI::Auto) == CI::Ring);
}
#endif

TEST_CASE("gpu: several values of mixed types in packs (bytes_per_pack) match the host kernels" *
          doctest::test_suite("gpu")) {
  const int n = ds::cuda::device_count();
  for (std::size_t bytes_per_pack : {std::size_t{0}, std::size_t{16}, std::size_t{1} << 20}) {
    CAPTURE(bytes_per_pack);
    ds::MirroredStrategy<ds::cuda> strategy(n, {.bytes_per_pack = bytes_per_pack});
    auto out = strategy.run([](ds::ReplicaContext& ctx) {
      const int r = ctx.replica_id_in_sync_group();
      return ctx.all_reduce(ds::ReduceOp::Sum, dvec<float>(1001, float(r + 1)), dvec<float>(3, 1.0f),
                            dvec<std::int64_t>(5, r), dvec<float>(0), dvec<double>(7, 0.5 * r));
    });
    const double tri = n * (n - 1) / 2.0;
    for (int i = 0; i < n; ++i) {
      const auto k = static_cast<std::size_t>(i);
      CHECK(all_near(host_of(std::get<0>(out)[k]), n * (n + 1) / 2.0));
      CHECK(all_near(host_of(std::get<1>(out)[k]), n));
      CHECK(all_near(host_of(std::get<2>(out)[k]), tri));
      CHECK(std::get<3>(out)[k].empty());
      CHECK(all_near(host_of(std::get<4>(out)[k]), 0.5 * tri));
    }
    auto mean = strategy.run([](ds::ReplicaContext& ctx) {
      const int r = ctx.replica_id_in_sync_group();
      return ctx.all_reduce(ds::ReduceOp::Mean, dvec<float>(4, float(r)), dvec<int>(2, 2 * r));
    });
    CHECK(all_near(host_of(std::get<0>(mean)[0]), (n - 1) / 2.0));
    CHECK(all_near(host_of(std::get<1>(mean)[0]), double(n - 1)));  // sum 2*tri, divided by n: exact
  }
}

#if DISTRIBUTE_TEST_MULTI_WORKER && DISTRIBUTE_HAS_NCCL
namespace {

// The value of metric `name` with label kind="`kind`" in a scrape, or -1 where it is missing.
double metric_of_kind(const std::string& scrape, const std::string& name, const std::string& kind) {
  const std::string label = "kind=\"" + kind + "\"} ";
  for (std::size_t at = 0; at < scrape.size();) {
    std::size_t end = scrape.find('\n', at);
    if (end == std::string::npos) end = scrape.size();
    const std::string line = scrape.substr(at, end - at);
    at = end + 1;
    if (line.rfind(name + "{", 0) != 0) continue;
    if (const auto k = line.find(label); k != std::string::npos) return std::stod(line.substr(k + label.size()));
  }
  return -1;
}

// One worker of the 2-process cluster below (TF_CONFIG and CUDA_VISIBLE_DEVICES set by the test):
// NCCL across the workers, checked against exact values, and counted in the metrics. Exit 0 and
// "OK", else 1 (wrong result) or 3 (an error).
int nccl_worker() {
  int failures = 0;
  auto expect = [&](bool ok, const char* what) {
    if (!ok) {
      std::printf("MISMATCH %s\n", what);
      ++failures;
    }
  };
  try {
    using CI = ds::CommunicationImplementation;
    ds::MultiWorkerMirroredStrategy<ds::cuda> s(
        {.bytes_per_pack = 64, .timeout_seconds = 60.0, .implementation = CI::Nccl, .metrics_port = 0});
    expect(s.communication_implementation() == CI::Nccl, "communication_implementation() is NCCL");
    const int n = s.num_replicas_in_sync();
    const double tri = n * (n - 1) / 2.0;
    auto sum = s.run([](ds::ReplicaContext& ctx) {
      const int r = ctx.replica_id_in_sync_group();
      return ctx.all_reduce(ds::ReduceOp::Sum, dvec<float>(1001, float(r + 1)), dvec<float>(3, 1.0f),
                            dvec<std::int64_t>(5, r), dvec<double>((1 << 18) + 3, 0.5 * r));
    });
    expect(all_near(host_of(std::get<0>(sum)[0]), n * (n + 1) / 2.0), "sum float32");
    expect(all_near(host_of(std::get<1>(sum)[0]), n), "sum float32 (packed with the first)");
    expect(all_near(host_of(std::get<2>(sum)[0]), tri), "sum int64");
    expect(all_near(host_of(std::get<3>(sum)[0]), 0.5 * tri), "sum float64, 2 MiB");
    auto mean = s.run([](ds::ReplicaContext& ctx) {
      return ctx.all_reduce(ds::ReduceOp::Mean, dvec<float>(4, float(ctx.replica_id_in_sync_group())));
    });
    expect(all_near(host_of(mean[0]), (n - 1) / 2.0), "mean float32");
    auto from_last = s.run([&](ds::ReplicaContext& ctx) {
      return ctx.broadcast(dvec<int>(2, 10 * ctx.replica_id_in_sync_group()), n - 1);
    });
    expect(host_of(from_last[0]) == std::vector<int>(2, 10 * (n - 1)), "broadcast from the last replica");
    auto gathered = s.run([](ds::ReplicaContext& ctx) {
      const int r = ctx.replica_id_in_sync_group();
      return ctx.all_gather(dvec<int>(static_cast<std::size_t>(r + 1), r), 0);
    });
    std::vector<int> want;
    for (int r = 0; r < n; ++r) want.insert(want.end(), static_cast<std::size_t>(r + 1), r);
    expect(host_of(gathered[0]) == want, "all_gather (uneven, over TCP)");
    auto ids = s.run([](ds::ReplicaContext& ctx) { return ctx.replica_id_in_sync_group(); });
    expect(s.reduce("sum", ids) == static_cast<int>(tri), "strategy.reduce");
    // One all-reduce through NCCL: counted once on each worker, its payload (1001 float32) as the
    // bytes it sent and received; the calls' agreement over TCP counts as all_gather, not here.
    const auto port = s.metrics_port();
    expect(port.has_value(), "metrics are served (metrics_port 0: a free port)");
    if (port) {
      const std::string before = test_support::http_get(*port, "/metrics");
      s.run([](ds::ReplicaContext& ctx) { (void)ctx.all_reduce(ds::ReduceOp::Sum, dvec<float>(1001, 1.0f)); });
      const std::string after = test_support::http_get(*port, "/metrics");
      auto grew = [&](const char* name) {
        return metric_of_kind(after, name, "all_reduce") - metric_of_kind(before, name, "all_reduce");
      };
      expect(grew("distribute_collectives_total") == 1, "an NCCL all-reduce counts once per worker");
      expect(grew("distribute_collective_bytes_sent_total") == 4004, "its payload counts as bytes sent");
      expect(grew("distribute_collective_bytes_received_total") == 4004, "and as bytes received");
      expect(metric_of_kind(after, "distribute_collectives_failed_total", "all_reduce") == 0, "no failed all-reduce");
    }
  } catch (const std::exception& e) {
    std::printf("error: %s\n", e.what());
    return 3;
  }
  std::printf(failures ? "FAILED\n" : "OK\n");
  return failures ? 1 : 0;
}

}  // namespace

TEST_CASE("gpu: MultiWorkerMirroredStrategy<ds::cuda> with NCCL across 2 worker processes" * doctest::test_suite("gpu")) {
  const int gpus = visible_gpus();
  if (gpus < 2) {
    MESSAGE("skipped: the 2-process NCCL test needs 2 GPUs (one per worker process); " << gpus << " visible");
    return;
  }
  // Each worker sees one GPU: the i-th of this process's visible ones.
  std::vector<std::string> visible;
  if (const char* list = std::getenv("CUDA_VISIBLE_DEVICES"); list && *list) {
    std::string item;
    for (const char* c = list;; ++c) {
      if (*c == ',' || *c == '\0') {
        visible.push_back(item);
        item.clear();
        if (*c == '\0') break;
      } else {
        item += *c;
      }
    }
  } else {
    visible = {"0", "1"};
  }
  REQUIRE(visible.size() >= 2);
  const auto ports = test_support::free_ports(2);
  std::vector<test_support::Child> workers;
  for (int i = 0; i < 2; ++i) {
    workers.push_back(test_support::spawn({"/proc/self/exe", "--nccl-worker"},
                                          {{"TF_CONFIG", test_support::tf_config(ports, i)},
                                           {"CUDA_VISIBLE_DEVICES", visible[static_cast<std::size_t>(i)]}}));
  }
  CHECK(test_support::wait_all(workers, std::chrono::seconds(240)));
  for (std::size_t i = 0; i < workers.size(); ++i) {
    INFO("worker ", i, " output:\n", workers[i].output);
    CHECK(workers[i].status == 0);
    CHECK(workers[i].output.find("OK") != std::string::npos);
  }
}
#endif

int main(int argc, char** argv) {
#if DISTRIBUTE_TEST_MULTI_WORKER && DISTRIBUTE_HAS_NCCL
  if (argc > 1 && std::strcmp(argv[1], "--nccl-worker") == 0) return nccl_worker();
#endif
  bool no_gpu_checks = false;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--no-gpu-checks") == 0) no_gpu_checks = true;
    else args.push_back(argv[i]);
  }
  doctest::Context context(static_cast<int>(args.size()), args.data());
  if (no_gpu_checks) {
    if (visible_gpus() > 0) {
      std::printf("the --no-gpu-checks tests need no visible GPU: run them with CUDA_VISIBLE_DEVICES=-1\n");
      return 1;
    }
    context.addFilter("test-suite", "no_gpu");
  } else {
    if (visible_gpus() == 0) {
      int count = 0;
      const cudaError_t e = cudaGetDeviceCount(&count);
      std::printf("skipped: no GPU (cudaGetDeviceCount: %s)\n",
                  e == cudaSuccess ? "0 devices" : ds::backends::cuda_error_text(e).c_str());
      return 77;
    }
    context.addFilter("test-suite", "gpu");
  }
  return context.run();
}

// NCCL all-reduce through MirroredStrategy<ds::cuda> (ReplicaContext::all_reduce, float32 SUM,
// in place) beside a raw ncclAllReduce loop in the same program: the wrapper's overhead.
//
// Both sides do the same work per iteration: every GPU's thread issues one ncclAllReduce on its
// own communicator and stream and waits for it; the host thread starts an iteration once the
// previous one finished on every GPU. The raw loop uses its own communicators (ncclCommInitAll),
// one spinning thread per GPU and cudaStreamSynchronize. Timings: per iteration, median after
// warm-up, the two sides alternating per size (this machine may be shared); nccl-tests'
// definitions: algbw = bytes / time (GB = 1e9), busbw = algbw * 2(n-1)/n.
//
//   bench_nccl_allreduce [--min-bytes B] [--max-bytes B] [--iters N] [--rounds R]
// Exits 77 ("skipped: no GPU") where no GPU is visible.
#include <distribute/backends/cuda/cuda.hpp>  // first: configures fmt for nvcc

#include <distribute/backends/cuda/device_tensor.hpp>
#include <distribute/collective/nccl.hpp>
#include <distribute/strategy/mirrored.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime.h>
#include <fmt/format.h>
#include <thrust/device_vector.h>

namespace ds = distribute;
using Clock = std::chrono::steady_clock;

#if !DISTRIBUTE_HAS_NCCL
int main() {
  std::printf("skipped: NCCL is not compiled in (needs nvcc and nccl.h)\n");
  return 77;
}
#else

namespace {

void nccl_ok(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) {
    std::fprintf(stderr, "%s failed: %s\n", what, ncclGetErrorString(r));
    std::exit(1);
  }
}
void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s failed: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// The raw baseline: one spinning thread per GPU, each with its communicator, stream and buffer.
class RawNccl {
 public:
  explicit RawNccl(int gpus) : n_(gpus), comms_(static_cast<std::size_t>(gpus)) {
    std::vector<int> devices(static_cast<std::size_t>(gpus));
    for (int i = 0; i < gpus; ++i) devices[static_cast<std::size_t>(i)] = i;
    nccl_ok(ncclCommInitAll(comms_.data(), gpus, devices.data()), "ncclCommInitAll");
    streams_.resize(static_cast<std::size_t>(gpus));
    buffers_.assign(static_cast<std::size_t>(gpus), nullptr);
    for (int i = 0; i < gpus; ++i) {
      threads_.emplace_back([this, i] { loop(i); });
    }
    // Each thread creates its stream; wait until they are ready.
    run([](int) {});
  }
  ~RawNccl() {
    stop_.store(true);
    epoch_.fetch_add(1);
    for (auto& t : threads_) t.join();
    for (auto c : comms_) ncclCommDestroy(c);
  }

  void allocate(std::size_t bytes) {
    bytes_ = bytes;
    run([this](int i) {
      auto& b = buffers_[static_cast<std::size_t>(i)];
      if (b) cuda_ok(cudaFree(b), "cudaFree");
      b = nullptr;
      if (bytes_) {
        cuda_ok(cudaMalloc(&b, bytes_), "cudaMalloc");
        cuda_ok(cudaMemset(b, 0, bytes_), "cudaMemset");
      }
    });
  }

  double iteration_ms() {
    const auto t0 = Clock::now();
    run([this](int i) {
      const auto k = static_cast<std::size_t>(i);
      nccl_ok(ncclAllReduce(buffers_[k], buffers_[k], bytes_ / sizeof(float), ncclFloat32, ncclSum, comms_[k], streams_[k]),
              "ncclAllReduce");
      cuda_ok(cudaStreamSynchronize(streams_[k]), "cudaStreamSynchronize");
    });
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  }

 private:
  template <class F>
  void run(F f) {
    job_ = f;
    remaining_.store(n_);
    epoch_.fetch_add(1, std::memory_order_acq_rel);
    while (remaining_.load(std::memory_order_acquire) != 0) {
    }
  }

  void loop(int i) {
    cuda_ok(cudaSetDevice(i), "cudaSetDevice");
    cuda_ok(cudaStreamCreate(&streams_[static_cast<std::size_t>(i)]), "cudaStreamCreate");
    unsigned seen = 0;
    for (;;) {
      unsigned e;
      while ((e = epoch_.load(std::memory_order_acquire)) == seen) {
      }
      seen = e;
      if (stop_.load()) break;
      job_(i);
      remaining_.fetch_sub(1, std::memory_order_acq_rel);
    }
    auto& b = buffers_[static_cast<std::size_t>(i)];
    if (b) cudaFree(b);
    cudaStreamDestroy(streams_[static_cast<std::size_t>(i)]);
  }

  int n_;
  std::vector<ncclComm_t> comms_;
  std::vector<cudaStream_t> streams_;
  std::vector<void*> buffers_;
  std::size_t bytes_ = 0;
  std::function<void(int)> job_;
  std::vector<std::thread> threads_;
  std::atomic<unsigned> epoch_{0};
  std::atomic<int> remaining_{0};
  std::atomic<bool> stop_{false};
};

struct Options {
  std::size_t min_bytes = std::size_t{1} << 20;
  std::size_t max_bytes = std::size_t{1} << 30;
  int iters = 0;  // 0: 50 up to 64 MiB, 20 above
  int rounds = 2;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i];
    const auto value = std::strtoull(argv[i + 1], nullptr, 10);
    if (key == "--min-bytes") o.min_bytes = value;
    else if (key == "--max-bytes") o.max_bytes = value;
    else if (key == "--iters") o.iters = static_cast<int>(value);
    else if (key == "--rounds") o.rounds = static_cast<int>(value);
    else {
      std::fprintf(stderr, "unknown option %s\n", key.c_str());
      std::exit(2);
    }
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  int gpus = 0;
  try {
    gpus = ds::cuda::device_count();
  } catch (const ds::Unavailable& e) {
    std::printf("skipped: no GPU (%s)\n", e.what());
    return 77;
  }
  int nccl_version = 0;
  ncclGetVersion(&nccl_version);
  cudaDeviceProp prop{};
  cuda_ok(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");

  ds::MirroredStrategy<ds::cuda> strategy;  // every visible GPU, NcclAllReduce
  RawNccl raw(gpus);
  const int n = strategy.num_replicas_in_sync();
  std::vector<thrust::device_vector<float>> buffers(static_cast<std::size_t>(n));

  fmt::print("NCCL all-reduce, float32 SUM in place, {} x {} (NCCL {}), median of per-iteration times\n", n, prop.name,
             nccl_version);
  fmt::print("{:>10} | {:>11} {:>11} | {:>9} {:>9} | {:>9} {:>9} | {:>8}\n", "size", "strategy ms", "raw ms",
             "algbw", "busbw", "raw algbw", "raw busbw", "overhead");
  fmt::print("{:->10}-+-{:->11}-{:->11}-+-{:->9}-{:->9}-+-{:->9}-{:->9}-+-{:->8}\n", "", "", "", "", "", "", "", "");
  const double bus_factor = n > 1 ? 2.0 * (n - 1) / n : 0.0;

  for (std::size_t bytes = options.min_bytes; bytes <= options.max_bytes; bytes *= 4) {
    const std::size_t count = bytes / sizeof(float);
    const int iters = options.iters > 0 ? options.iters : (bytes <= (std::size_t{64} << 20) ? 50 : 20);
    const int warmup = 5;
    // Each replica's buffer on its own GPU (made on its replica thread); zeros keep SUM finite.
    strategy.run([&](ds::ReplicaContext& ctx) {
      buffers[static_cast<std::size_t>(ctx.local_replica_id())] = thrust::device_vector<float>(count, 0.0f);
    });
    raw.allocate(bytes);
    auto step = [&](ds::ReplicaContext& ctx) {
      auto& b = buffers[static_cast<std::size_t>(ctx.local_replica_id())];
      b = ctx.all_reduce(ds::ReduceOp::Sum, std::move(b));  // moved in and out: no copy
    };
    std::vector<double> ours, theirs;
    for (int round = 0; round < options.rounds; ++round) {
      for (int i = 0; i < warmup + iters; ++i) {
        const auto t0 = Clock::now();
        strategy.run(step);
        const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        if (i >= warmup) ours.push_back(ms);
      }
      for (int i = 0; i < warmup + iters; ++i) {
        const double ms = raw.iteration_ms();
        if (i >= warmup) theirs.push_back(ms);
      }
    }
    const double a = median(ours), b = median(theirs);
    const double algbw = static_cast<double>(bytes) / (a * 1e-3) / 1e9;
    const double raw_algbw = static_cast<double>(bytes) / (b * 1e-3) / 1e9;
    const std::string size = bytes >= (std::size_t{1} << 30) ? fmt::format("{} GiB", bytes >> 30)
                                                               : fmt::format("{} MiB", bytes >> 20);
    fmt::print("{:>10} | {:>11.4f} {:>11.4f} | {:>9.2f} {:>9.2f} | {:>9.2f} {:>9.2f} | {:>7.2f}%\n", size, a, b, algbw,
               algbw * bus_factor, raw_algbw, raw_algbw * bus_factor, 100.0 * (a - b) / b);
    std::fflush(stdout);
  }
  // Free the strategy's buffers on their own GPUs' threads before the strategy goes.
  strategy.run([&](ds::ReplicaContext& ctx) { buffers[static_cast<std::size_t>(ctx.local_replica_id())] = thrust::device_vector<float>(); });
  raw.allocate(0);
  return 0;
}

#endif  // DISTRIBUTE_HAS_NCCL

// Downstream program of the 'cmake_cuda' consumer check: a host-compiled file on distribute::cuda
// (DISTRIBUTE_WITH_CUDA and CUDA::cudart come from the target). On a machine with GPUs it all-reduces
// over them; without one the strategy throws Unavailable, which still proves the compile and link.
#include <distribute/distribute.hpp>

#include <cstdio>
#include <exception>

namespace ds = distribute;

int main() {
  try {
    ds::MirroredStrategy<ds::cuda> strategy;  // every visible GPU
    auto ones = strategy.run([] { return 1.0f; });
    const float sum = strategy.reduce("sum", ones);
    if (sum != static_cast<float>(strategy.num_replicas_in_sync())) {
      std::fprintf(stderr, "sum over %d GPUs is %g\n", strategy.num_replicas_in_sync(), sum);
      return 1;
    }
    std::printf("distribute %s cuda: %d GPUs, sum %g\n", DISTRIBUTE_VERSION_STRING, strategy.num_replicas_in_sync(),
                sum);
  } catch (const ds::Unavailable& e) {
    std::printf("distribute %s cuda: no GPU (%s)\n", DISTRIBUTE_VERSION_STRING, e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}

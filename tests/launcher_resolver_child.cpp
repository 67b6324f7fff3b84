// A task program for tests/test_launcher.cpp: the cluster as two resolvers see it under
// distribute-launch, TF_CONFIG's and LauncherClusterResolver's (torchrun's RANK, WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT; port_offset 1, since MASTER_PORT itself is left for a torch-style
// rank 0). Prints
//   RESOLVER tf_config=<task type>:<index> <cluster JSON>
//   RESOLVER launcher=worker:<rank> local_rank=<L> <cluster JSON>
// or the resolver's error and exit status 3.
#include <distribute/cluster/launcher.hpp>
#include <distribute/cluster/tf_config.hpp>

#include <cstdio>
#include <exception>

namespace ds = distribute;

int main() {
  try {
    const ds::TFConfigClusterResolver tf;
    std::printf("RESOLVER tf_config=%s:%d %s\n", tf.task_type().c_str(), tf.task_id(),
                tf.cluster_spec().to_json().c_str());
    ds::LauncherOptions options;
    options.port_offset = 1;
    const ds::LauncherClusterResolver launcher(options);
    std::printf("RESOLVER launcher=%s:%d local_rank=%d %s\n", launcher.task_type().c_str(), launcher.task_id(),
                launcher.local_rank().value_or(-1), launcher.cluster_spec().to_json().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "launcher_resolver_child: %s\n", e.what());
    return 3;
  }
  return 0;
}

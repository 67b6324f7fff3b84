// What the parameter-server examples share: every task runs the same program and plays the part
// TF_CONFIG gives it (run_task), and, to show the fault tolerance, a worker that SIGKILLs itself once
// in the middle of a step (--kill-worker I --kill-at-step K) and a coordinator that waits for lost
// workers to come back.
#pragma once

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <thread>

#include <unistd.h>

#include <fmt/format.h>

#include <distribute/cluster/tf_config.hpp>
#include <distribute/ps/cluster_coordinator.hpp>
#include <distribute/ps/server.hpp>

#include "cli.hpp"

namespace ps_tasks {

/// This task's part of the cluster TF_CONFIG describes: a ds::Server on a ps or worker task, until
/// the coordinator stops it (0); `coordinate(resolver)` on the chief. A usage error outside a
/// cluster or on another job.
template <class Coordinate>
int run_task(Coordinate&& coordinate) {
  auto resolver = std::make_shared<distribute::TFConfigClusterResolver>();
  if (resolver->cluster_spec().empty()) {
    throw cli::UsageError("no cluster (TF_CONFIG is not set); run it under `distribute-launch --ps N --workers M --`, "
                          "which starts a chief, ps and worker tasks");
  }
  const std::string type = resolver->task_type();
  if (type == "ps" || type == "worker") {
    distribute::Server server(resolver->cluster_spec(), type, resolver->task_id());
    fmt::print("serving {}:{} at {}\n", type, resolver->task_id(), server.target());
    server.join();
    return 0;
  }
  if (type != "chief") {
    throw cli::UsageError(fmt::format("this task is '{}'; a parameter-server cluster has chief, ps and worker tasks (as "
                                      "`distribute-launch --ps N --workers M --` starts)",
                                      type));
  }
  return coordinate(std::move(resolver));
}

/// Dies like a crashed machine, once, in step `kill_at_step` of worker `kill_worker` (< 0: never),
/// after the step's updates are computed and before they are committed. Only on the worker's first
/// start: a worker the launcher restarts (DISTRIBUTE_LAUNCH_RESTART > 0) lives.
inline void maybe_die_in_step(int kill_worker, std::int64_t kill_at_step) {
  // Whether this process is the one to die is fixed at start-up: decided once, not per step.
  static const bool armed = [&] {
    if (kill_worker < 0) return false;
    const char* restarts = std::getenv("DISTRIBUTE_LAUNCH_RESTART");
    if (restarts && std::atoi(restarts) != 0) return false;
    const char* task = std::getenv("DISTRIBUTE_LAUNCH_TASK");
    return task && std::string_view(task) == fmt::format("worker:{}", kill_worker);
  }();
  static std::atomic<std::int64_t> steps{0};
  if (!armed || ++steps != kill_at_step) return;
  fmt::print(stderr, "worker {}: --kill-worker: SIGKILL in step {}, before its updates are committed\n", kill_worker,
             kill_at_step);
  std::fflush(stderr);
  ::kill(::getpid(), SIGKILL);
}

/// Waits (up to `seconds`) until every worker is up again, saying so.
inline void wait_for_workers(distribute::ClusterCoordinator& coordinator, double seconds) {
  fmt::print("waiting up to {} s for the lost workers to come back ({} of {} up)\n", seconds,
             coordinator.num_workers_up(), coordinator.num_workers());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (coordinator.num_workers_up() < coordinator.num_workers() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  fmt::print("{} of {} workers up\n", coordinator.num_workers_up(), coordinator.num_workers());
}

}  // namespace ps_tasks

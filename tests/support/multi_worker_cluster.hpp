// Worker processes of a multi-worker test cluster on 127.0.0.1: tests/multi_worker_helper, one
// process per TF_CONFIG task, each running a scenario the helper names.
#pragma once

#include <doctest/doctest.h>

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "processes.hpp"

namespace test_support {

/// The helper program (DISTRIBUTE_MULTI_WORKER_HELPER, which meson test sets).
inline std::string multi_worker_helper_path() {
  const char* p = std::getenv("DISTRIBUTE_MULTI_WORKER_HELPER");
  REQUIRE_MESSAGE(p != nullptr, "DISTRIBUTE_MULTI_WORKER_HELPER is not set (run through meson test)");
  return p;
}

/// `n` helper processes, worker i of n on fresh ports, running `scenario` with `local` replicas
/// each; `extra` is added to each one's environment.
inline std::vector<Child> start_workers(int n, const std::string& scenario, int local,
                                        std::map<std::string, std::string> extra = {}) {
  const std::string helper = multi_worker_helper_path();
  auto ports = free_ports(n);
  std::vector<Child> children;
  for (int i = 0; i < n; ++i) {
    auto env = extra;
    env["TF_CONFIG"] = tf_config(ports, i);
    children.push_back(spawn({helper, scenario, std::to_string(local)}, env));
  }
  return children;
}

}  // namespace test_support

// distribute-launch's CPU binding (--bind-to core, not the default): which CPUs each task may run on.
//
// Not the default: on an idle machine it gains nothing measurable, and beside other work (a pod
// with a CPU quota, a laptop, CI) a bound task cannot leave a busy CPU: 2-7x slower all-reduces
// (docs/performance.md, "CPU binding of distribute-launch").
//
// With no more tasks than the CPUs the launcher may run on, task i is bound to the i-th of n equal,
// contiguous blocks of them (the first blocks one CPU larger when they do not divide evenly), as
// mpirun binds ranks to cores. With k times more tasks than CPUs and no ps task, CPU j runs tasks
// jk .. jk+k-1. Otherwise nothing is bound: a CPU with one training task more than another would
// hold back every synchronous step, and ps tasks serve while the others train.
#pragma once

#include <fmt/format.h>

#include "launch_output.hpp"

#include <cstddef>
#include <string>
#include <vector>

#ifdef __linux__
#include <sched.h>
#endif

namespace launch {

/// "0-3,6" for {0,1,2,3,6}.
inline std::string cpu_list(const std::vector<int>& cpus) {
  std::string out;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    out += fmt::format("{}{}", out.empty() ? "" : ",", cpus[i]);
    if (j > i) out += fmt::format("-{}", cpus[j]);
    i = j + 1;
  }
  return out;
}

/// The CPUs this process may run on (its affinity mask); empty where that cannot be read.
inline std::vector<int> allowed_cpus() {
  std::vector<int> cpus;
#ifdef __linux__
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (::sched_getaffinity(0, sizeof allowed, &allowed) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  }
#endif
  return cpus;
}

/// Each task's CPUs, or (all empty) why the tasks are not bound.
struct BindingPlan {
  std::vector<std::vector<int>> cpus;  // by task; empty lists when not bound
  std::string not_bound;               // the reason, when not bound
};

inline BindingPlan plan_binding(const std::vector<int>& cpus, std::size_t tasks, bool with_ps) {
  BindingPlan plan;
  plan.cpus.resize(tasks);
  if (tasks == 0) return plan;
  if (cpus.empty()) {
    plan.not_bound = "the CPUs this process may run on cannot be read";
    return plan;
  }
  if (tasks > cpus.size() && (tasks % cpus.size() != 0 || with_ps)) {
    plan.not_bound = fmt::format(
        "{} tasks and {} CPUs: not binding (with more tasks than CPUs, --bind-to core needs the same number of tasks "
        "on every CPU{})",
        tasks, cpus.size(), with_ps ? ", and no ps tasks" : "");
    return plan;
  }
  const std::size_t share = cpus.size() / tasks, extra = cpus.size() % tasks;
  std::size_t next = 0;
  for (std::size_t i = 0; i < tasks; ++i) {
    if (tasks > cpus.size()) {
      plan.cpus[i] = {cpus[i / (tasks / cpus.size())]};
    } else {
      const std::size_t count = share + (i < extra ? 1 : 0);
      plan.cpus[i].assign(cpus.begin() + static_cast<std::ptrdiff_t>(next),
                          cpus.begin() + static_cast<std::ptrdiff_t>(next + count));
      next += count;
    }
  }
  return plan;
}

/// --bind-to core for the tasks called `names` (in rank order): each one's CPUs (all empty when
/// not bound). `verbose` (--bind-to given) notes the binding, or why there is none.
inline std::vector<std::vector<int>> bind_to_cores(const std::vector<std::string>& names, bool with_ps, bool verbose) {
#ifdef __linux__
  BindingPlan plan = plan_binding(allowed_cpus(), names.size(), with_ps);
  if (!plan.not_bound.empty()) {
    if (verbose) note("{}", plan.not_bound);
    return plan.cpus;
  }
  std::string report;
  for (std::size_t i = 0; i < names.size(); ++i)
    report += fmt::format("{}{} on {}", i == 0 ? "" : ", ", names[i], cpu_list(plan.cpus[i]));
  if (verbose) note("binding tasks to CPUs: {}", report);  // like mpirun, quiet by default
  return plan.cpus;
#else
  if (verbose) note("--bind-to core: binding is only implemented on Linux; not binding");
  return std::vector<std::vector<int>>(names.size());
#endif
}

}  // namespace launch

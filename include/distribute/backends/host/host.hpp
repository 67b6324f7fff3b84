// The host backend: replicas are threads on logical CPU devices "/cpu:0".."/cpu:N-1".
#pragma once

#include <set>
#include <string_view>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/device.hpp>
#include <distribute/core/error.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace backends::detail {

/// "/cpu:0" .. "/cpu:count-1" as canonical device strings; count >= 1.
DISTRIBUTE_DECL std::vector<std::string> host_devices(int count, const char* strategy);
/// Parses a user's device list for the host backend: CPU devices of this process, no duplicates.
DISTRIBUTE_DECL std::vector<std::string> host_devices(const std::vector<std::string>& names, const char* strategy);

#if DISTRIBUTE_DETAIL_DEFINE  // compiled apart with DISTRIBUTE_SEPARATE_COMPILATION (version.hpp)
DISTRIBUTE_DECL std::vector<std::string> host_devices(int count, const char* strategy) {
  if (count < 1) {
    throw InvalidArgument(fmt::format("{}: the number of replicas must be at least 1, got {}", strategy, count));
  }
  std::vector<std::string> out;
  for (int i = 0; i < count; ++i) out.push_back(local_device_string("CPU", i));
  return out;
}

DISTRIBUTE_DECL std::vector<std::string> host_devices(const std::vector<std::string>& names, const char* strategy) {
  if (names.empty()) throw InvalidArgument(fmt::format("{}: the device list is empty", strategy));
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const auto& name : names) {
    DeviceSpec d = DeviceSpec::parse(name);
    if (d.device_type != "CPU") {
      throw InvalidArgument(fmt::format("{}: device '{}' is not a host device; the host backend runs on CPU devices "
                                        "(\"/cpu:0\", \"/cpu:1\", ...)",
                                        strategy, name));
    }
    if (!d.device_index) {
      throw InvalidArgument(fmt::format("{}: device '{}' names no device index", strategy, name));
    }
    if (*d.device_index < 0) {  // TF's DeviceSpec parses "/cpu:-1"; no device has that index
      throw InvalidArgument(fmt::format("{}: device '{}' has a negative device index", strategy, name));
    }
    if ((d.job && *d.job != "localhost") || (d.task && *d.task != 0) || (d.replica && *d.replica != 0)) {
      throw InvalidArgument(fmt::format("{}: device '{}' is not a device of this process (job localhost, task 0)",
                                        strategy, name));
    }
    auto canonical = local_device_string("CPU", *d.device_index);
    if (!seen.insert(canonical).second) {
      throw InvalidArgument(fmt::format("{}: device '{}' is listed twice", strategy, name));
    }
    out.push_back(canonical);
  }
  return out;
}

#endif  // DISTRIBUTE_DETAIL_DEFINE
}  // namespace backends::detail

/// Backend tag: replicas are threads of this process on logical CPU devices. A backend tag
/// names its devices and prepares a replica thread; strategies are written once over it.
struct host {
  static constexpr std::string_view name = "host";
  static constexpr std::string_view device_type = "CPU";
  /// Replica 0 runs on the thread that calls run(): nothing to bind, one hand-off fewer per step.
  static constexpr bool single_replica_on_caller_thread = true;

  /// What a strategy uses when given no devices: one CPU device.
  static std::vector<std::string> default_devices(const char* strategy) { return backends::detail::host_devices(1, strategy); }
  static std::vector<std::string> devices(int count, const char* strategy) { return backends::detail::host_devices(count, strategy); }
  static std::vector<std::string> devices(const std::vector<std::string>& names, const char* strategy) {
    return backends::detail::host_devices(names, strategy);
  }
  /// Called once on each replica thread before its first step.
  static void enter_replica_thread(int /*local_replica*/, const std::string& /*device*/) noexcept {}
};

DISTRIBUTE_END_NAMESPACE

// Validation of the device lists the host backend is given.
#pragma once

#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/device.hpp>
#include <distribute/core/error.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace detail {

/// "/job:localhost/replica:0/task:0/device:CPU:i": the canonical name of local host device i.
inline std::string local_device_string(std::string_view type, int index) {
  return DeviceSpec{"localhost", 0, 0, std::string(type), index}.to_string();
}

inline std::vector<std::string> host_devices(int count, const char* strategy) {
  if (count < 1) {
    throw InvalidArgument(fmt::format("{}: the number of replicas must be at least 1, got {}", strategy, count));
  }
  std::vector<std::string> out;
  for (int i = 0; i < count; ++i) out.push_back(local_device_string("CPU", i));
  return out;
}

/// Parses a user's device list for the host backend: CPU devices of this process, no duplicates.
inline std::vector<std::string> host_devices(const std::vector<std::string>& names, const char* strategy) {
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

}  // namespace detail
DISTRIBUTE_END_NAMESPACE

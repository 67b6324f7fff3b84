// DeviceSpec: TF device strings ("/gpu:0", "GPU:1", "/job:worker/replica:0/task:1/device:CPU:0").
#pragma once

#include <algorithm>
#include <cctype>
#include <charconv>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include <distribute/core/error.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

/// A (possibly partial) device name. Absent parts are left unset; to_string() writes the
/// canonical TF form with only the parts that are set.
struct DeviceSpec {
  std::optional<std::string> job;
  std::optional<int> replica;
  std::optional<int> task;
  std::optional<std::string> device_type;  // upper case: "CPU", "GPU"
  std::optional<int> device_index;

  /// Parses "/job:w/replica:0/task:1/device:CPU:0", "/cpu:0", "GPU:1", "/device:GPU:*"... and
  /// throws InvalidArgument naming the string and the part that is wrong.
  static DeviceSpec parse(std::string_view text);

  static DeviceSpec local(std::string_view type, int index) {
    return DeviceSpec{{}, {}, {}, std::string(type), index};
  }

  /// "/job:worker/replica:0/task:1/device:CPU:0" with only the parts that are set.
  std::string to_string() const {
    std::string out;
    if (job) out += fmt::format("/job:{}", *job);
    if (replica) out += fmt::format("/replica:{}", *replica);
    if (task) out += fmt::format("/task:{}", *task);
    if (device_type) out += fmt::format("/device:{}:{}", *device_type, device_index ? std::to_string(*device_index) : "*");
    return out;
  }

  /// The device with job/replica/task filled in from `base` where this one leaves them unset.
  DeviceSpec fill_from(const DeviceSpec& base) const {
    DeviceSpec d = *this;
    if (!d.job) d.job = base.job;
    if (!d.replica) d.replica = base.replica;
    if (!d.task) d.task = base.task;
    if (!d.device_type) d.device_type = base.device_type;
    if (!d.device_index) d.device_index = base.device_index;
    return d;
  }

  friend bool operator==(const DeviceSpec&, const DeviceSpec&) = default;
};

namespace detail {
inline std::string upper(std::string_view s) {
  std::string u(s);
  std::transform(u.begin(), u.end(), u.begin(), [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  return u;
}
inline std::optional<int> parse_index(std::string_view s) {
  int v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || p != s.data() + s.size() || v < 0 || s.empty()) return std::nullopt;
  return v;
}
}  // namespace detail

inline DeviceSpec DeviceSpec::parse(std::string_view text) {
  auto fail = [&](std::string_view why) -> DeviceSpec {
    throw InvalidArgument(fmt::format("invalid device string '{}': {}", text, why));
  };
  if (text.empty()) return fail("it is empty");
  DeviceSpec spec;
  std::string_view rest = text;
  if (rest.front() == '/') rest.remove_prefix(1);
  while (!rest.empty()) {
    auto slash = rest.find('/');
    std::string_view part = rest.substr(0, slash);
    rest = slash == std::string_view::npos ? std::string_view{} : rest.substr(slash + 1);
    if (part.empty()) return fail("empty component");
    auto colon = part.find(':');
    if (colon == std::string_view::npos) return fail(fmt::format("component '{}' has no ':'", part));
    std::string key = detail::upper(part.substr(0, colon));
    std::string_view value = part.substr(colon + 1);
    auto index_or_fail = [&](std::string_view v, std::string_view what) -> int {
      auto i = detail::parse_index(v);
      if (!i) fail(fmt::format("{} '{}' is not a non-negative integer", what, v));
      return *i;
    };
    if (key == "JOB") {
      if (value.empty()) return fail("empty job name");
      spec.job = std::string(value);
    } else if (key == "REPLICA") {
      spec.replica = index_or_fail(value, "replica");
    } else if (key == "TASK") {
      spec.task = index_or_fail(value, "task");
    } else {
      // "device:CPU:0", or the short forms "CPU:0" / "gpu:1".
      std::string_view type_and_index = part;
      if (key == "DEVICE") type_and_index = value;
      auto c = type_and_index.find(':');
      std::string type = detail::upper(type_and_index.substr(0, c));
      if (type.empty() || !std::all_of(type.begin(), type.end(), [](char ch) { return std::isalpha(static_cast<unsigned char>(ch)) || ch == '_'; })) {
        return fail(fmt::format("device type '{}' is not a name", type_and_index.substr(0, c)));
      }
      if (spec.device_type) return fail("more than one device component");
      spec.device_type = type;
      if (c != std::string_view::npos) {
        auto idx = type_and_index.substr(c + 1);
        if (idx != "*") spec.device_index = index_or_fail(idx, "device index");
      }
    }
  }
  return spec;
}

/// "/job:localhost/replica:0/task:0/device:CPU:i": the canonical name of local device i.
inline std::string local_device_string(std::string_view type, int index) {
  return DeviceSpec{"localhost", 0, 0, std::string(type), index}.to_string();
}

DISTRIBUTE_END_NAMESPACE

template <>
struct fmt::formatter<distribute::DeviceSpec> : fmt::formatter<std::string> {
  template <class Ctx>
  auto format(const distribute::DeviceSpec& d, Ctx& ctx) const {
    return fmt::formatter<std::string>::format(d.to_string(), ctx);
  }
};

// DeviceSpec: TF device strings ("/gpu:0", "GPU:1", "/job:worker/replica:0/task:1/device:CPU:0").
#pragma once

#include <algorithm>
#include <cctype>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/error.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

/// A (possibly partial) device name. Absent parts are left unset; to_string() writes the
/// canonical TF form with only the parts that are set.
struct DeviceSpec {
  std::optional<std::string> job;
  std::optional<int> replica;
  std::optional<int> task;
  std::optional<std::string> device_type;  // "CPU", "GPU", ... (TF upper-cases only cpu/gpu, and short forms)
  std::optional<int> device_index;

  /// Parses a device string exactly as TF's `tf.DeviceSpec.from_string` does:
  /// "/job:w/replica:0/task:1/device:CPU:0", "/cpu:0", "GPU:1", "/cpu" (= "/device:CPU:*"),
  /// "" and "//" (nothing set). Throws InvalidArgument naming the string and the part that is
  /// wrong where TF raises. Only where Python's int() and ours part: non-ASCII digits, and
  /// values beyond int (see docs/semantics.md).
  static DeviceSpec parse(std::string_view text);

  static DeviceSpec local(std::string_view type, int index) {
    return DeviceSpec{{}, {}, {}, std::string(type), index};
  }

  /// "/job:worker/replica:0/task:1/device:CPU:0" with only the parts that are set.
  std::string to_string() const;

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

/// "/job:localhost/replica:0/task:0/device:CPU:i": the canonical name of local device i.
DISTRIBUTE_DECL std::string local_device_string(std::string_view type, int index);

#if DISTRIBUTE_DETAIL_DEFINE  // compiled apart with DISTRIBUTE_SEPARATE_COMPILATION (version.hpp)
DISTRIBUTE_DECL std::string DeviceSpec::to_string() const {
  std::string out;
  if (job) out += fmt::format("/job:{}", *job);
  if (replica) out += fmt::format("/replica:{}", *replica);
  if (task) out += fmt::format("/task:{}", *task);
  if (device_type) out += fmt::format("/device:{}:{}", *device_type, device_index ? std::to_string(*device_index) : "*");
  return out;
}

namespace core::detail {
inline std::string upper(std::string_view s) {
  std::string u(s);
  std::transform(u.begin(), u.end(), u.begin(), [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  return u;
}

/// Python's int(s) for base 10 on ASCII text, as TF applies it to device-string fields:
/// surrounding whitespace, a sign, and single underscores between digits are allowed.
/// nullopt when Python would raise; values beyond int saturate (the caller reports them).
inline std::optional<long long> parse_python_int(std::string_view s) {
  auto space = [](char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= '\x1c' && c <= '\x1f'); };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  bool negative = false;
  if (!s.empty() && (s.front() == '+' || s.front() == '-')) {
    negative = s.front() == '-';
    s.remove_prefix(1);
  }
  if (s.empty() || s.front() == '_' || s.back() == '_') return std::nullopt;
  long long v = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '_') {
      if (s[i + 1] == '_') return std::nullopt;  // (the last character is not '_')
      continue;
    }
    if (c < '0' || c > '9') return std::nullopt;
    v = std::min(v * 10 + (c - '0'), 1LL << 40);  // saturates far beyond int
  }
  return negative ? -v : v;
}

/// The device types TF's DeviceSpec knows in short form ("cpu:0", "/tpu:1"): its
/// _VALID_DEVICE_TYPES (pluggable devices add theirs in TF; there are none here).
inline bool is_short_device_type(std::string_view upper_type) {
  for (std::string_view t : {"CPU", "GPU", "TPU", "CUSTOM", "EPU"}) {
    if (upper_type == t) return true;
  }
  return false;
}

inline std::vector<std::string_view> device_string_split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  for (;;) {
    auto at = s.find(sep);
    out.push_back(s.substr(0, at));
    if (at == std::string_view::npos) return out;
    s.remove_prefix(at + 1);
  }
}
}  // namespace core::detail

// TF's DeviceSpecV2._string_to_components, rule for rule: components split on '/', fields on
// ':'; keys are case-sensitive; an empty component, or one that starts with ':', is skipped;
// a later job/replica/task replaces an earlier one; replica and task are converted after the
// whole string is read (so only the last one must be an integer).
DISTRIBUTE_DECL DeviceSpec DeviceSpec::parse(std::string_view text) {
  auto fail = [&](std::string_view why) -> DeviceSpec {
    throw InvalidArgument(fmt::format("invalid device string '{}': {}", text, why));
  };
  auto integer = [&](std::string_view v, std::string_view what) -> int {
    auto i = core::detail::parse_python_int(v);
    if (!i) fail(fmt::format("{} '{}' is not an integer", what, v));
    if (*i < std::numeric_limits<int>::min() || *i > std::numeric_limits<int>::max()) {
      fail(fmt::format("{} '{}' is out of range for an int", what, v));  // Python's int has no bound
    }
    return static_cast<int>(*i);
  };
  DeviceSpec spec;
  std::optional<std::string_view> replica, task;
  for (std::string_view component : core::detail::device_string_split(text, '/')) {
    const auto y = core::detail::device_string_split(component, ':');
    const std::string_view key = y[0];
    const std::size_t ly = y.size();
    if (ly == 2 && key == "job") {
      spec.job = std::string(y[1]);
    } else if (ly == 2 && key == "replica") {
      replica = y[1];
    } else if (ly == 2 && key == "task") {
      task = y[1];
    } else if (ly <= 2 && core::detail::is_short_device_type(core::detail::upper(key))) {
      if (spec.device_type) return fail("more than one device type");
      spec.device_type = core::detail::upper(key);  // "cpu:0" -> CPU, "tpu" -> TPU
      if (ly == 2 && y[1] != "*") spec.device_index = integer(y[1], "device index");
    } else if (ly == 3 && key == "device") {
      if (spec.device_type) return fail("more than one device type");
      // Only "cpu" and "gpu" are normalised in this form; other types are kept as written.
      spec.device_type = y[1] == "cpu" || y[1] == "gpu" ? core::detail::upper(y[1]) : std::string(y[1]);
      if (y[2] != "*") spec.device_index = integer(y[2], "device index");
    } else if (!key.empty()) {
      return fail(fmt::format("unknown attribute '{}' in component '{}' (expected job:NAME, replica:N, task:N, "
                              "device:TYPE:N or CPU/GPU/TPU:N)",
                              key, component));
    }
  }
  if (replica) spec.replica = integer(*replica, "replica");
  if (task) spec.task = integer(*task, "task");
  return spec;
}

DISTRIBUTE_DECL std::string local_device_string(std::string_view type, int index) {
  return DeviceSpec{"localhost", 0, 0, std::string(type), index}.to_string();
}
#endif  // DISTRIBUTE_DETAIL_DEFINE

DISTRIBUTE_END_NAMESPACE

template <>
struct fmt::formatter<distribute::DeviceSpec> : fmt::formatter<std::string> {
  template <class Ctx>
  auto format(const distribute::DeviceSpec& d, Ctx& ctx) const {
    return fmt::formatter<std::string>::format(d.to_string(), ctx);
  }
};

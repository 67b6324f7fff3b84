// Reading environment variables, from the process or from an injected map (tests).
#pragma once

#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include <distribute/core/error.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace cluster::detail {

/// Variable name → value. Transparent comparison so lookups by string_view do not allocate.
using EnvMap = std::map<std::string, std::string, std::less<>>;

/// Looks variables up in `map` when one is given, else in the process environment. Resolvers
/// take a map in a constructor overload so tests never have to mutate the real environment
/// (setenv is not thread-safe and would leak between test cases).
class EnvReader {
 public:
  EnvReader() = default;
  explicit EnvReader(const EnvMap* map) : map_(map) {}

  std::optional<std::string> get(std::string_view name) const {
    if (map_ != nullptr) {
      auto it = map_->find(name);
      if (it == map_->end()) return std::nullopt;
      return it->second;
    }
    // std::getenv needs a NUL-terminated name.
    const char* v = std::getenv(std::string(name).c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  }

  bool has(std::string_view name) const { return get(name).has_value(); }

 private:
  const EnvMap* map_ = nullptr;
};

/// Parses a whole decimal integer (optional leading '-'; no spaces, signs or suffixes).
inline std::optional<std::int64_t> parse_env_integer(std::string_view s) {
  std::int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc{} || p != s.data() + s.size()) return std::nullopt;
  return v;
}

/// The integer value of variable `name`, which must be set and lie in [lo, hi]. `who` prefixes
/// the message ("SlurmClusterResolver") so the user knows which resolver read it.
inline int require_env_int(const EnvReader& env, std::string_view who, std::string_view name, std::int64_t lo,
                           std::int64_t hi, std::string_view hint = {}) {
  auto raw = env.get(name);
  if (!raw) throw ClusterConfigError(fmt::format("{}: environment variable {} is not set{}", who, name, hint));
  auto v = parse_env_integer(*raw);
  if (!v) throw ClusterConfigError(fmt::format("{}: {}='{}' is not an integer", who, name, *raw));
  if (*v < lo || *v > hi) {
    throw ClusterConfigError(fmt::format("{}: {}={} is out of range; it must be in [{}, {}]", who, name, *v, lo, hi));
  }
  return static_cast<int>(*v);
}

}  // namespace cluster::detail
DISTRIBUTE_END_NAMESPACE

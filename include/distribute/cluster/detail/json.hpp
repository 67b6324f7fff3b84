// Boost.JSON helpers shared by ClusterSpec and TFConfigClusterResolver: parsing text with the
// error position, describing a value in a message, reading integers strictly.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include <boost/json.hpp>
#include <fmt/format.h>

#include <distribute/core/error.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace cluster::detail {

/// Parses `text` as one JSON document. Errors name `who` (the variable or type being read), the
/// character offset and Boost.JSON's own message.
inline boost::json::value cluster_parse_json(std::string_view text, std::string_view who) {
  boost::json::parser parser;
  boost::system::error_code ec;
  std::size_t consumed = parser.write(text.data(), text.size(), ec);
  if (ec) {
    throw ClusterConfigError(fmt::format("{}: invalid JSON at offset {}: {}", who, consumed, ec.message()));
  }
  return parser.release();
}

/// "array", "object", "null", or the value itself for scalars ("number 1.5", "string \"x\"",
/// "bool true"), for "..., got X" in messages.
inline std::string cluster_json_describe(const boost::json::value& v) {
  switch (v.kind()) {
    case boost::json::kind::null: return "null";
    case boost::json::kind::bool_: return fmt::format("bool {}", v.get_bool());
    case boost::json::kind::int64: return fmt::format("number {}", v.get_int64());
    case boost::json::kind::uint64: return fmt::format("number {}", v.get_uint64());
    // fmt, not serialize(): serialize writes 1.5 as "1.5E0".
    case boost::json::kind::double_: return fmt::format("number {}", v.get_double());
    case boost::json::kind::string: return fmt::format("string {}", boost::json::serialize(v));
    case boost::json::kind::array: return "array";
    case boost::json::kind::object: return "object";
  }
  return "unknown";
}

/// The value as an integer if it is a JSON integer that fits in int64 (1.0 and "1" are not).
inline std::optional<std::int64_t> cluster_json_integer(const boost::json::value& v) {
  if (v.is_int64()) return v.get_int64();
  if (v.is_uint64() && v.get_uint64() <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    return static_cast<std::int64_t>(v.get_uint64());
  }
  return std::nullopt;
}

}  // namespace cluster::detail
DISTRIBUTE_END_NAMESPACE

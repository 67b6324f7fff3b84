// Task addresses: "host:port", IPv6 hosts in brackets ("[::1]:2222").
#pragma once

#include <algorithm>
#include <cctype>
#include <charconv>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include <distribute/core/error.hpp>
#include <distribute/core/host_name.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

/// A task address split into its parts. `host` carries no brackets, so it can go straight to a
/// resolver; to_string() puts them back for IPv6 hosts.
struct HostPort {
  std::string host;
  int port = 0;

  std::string to_string() const {
    return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port) : fmt::format("{}:{}", host, port);
  }
  friend bool operator==(const HostPort&, const HostPort&) = default;
};

namespace cluster::detail {

/// Splits `address`, or says what is wrong with it as the end of a sentence that starts with
/// "address 'X' " (so every caller can put its own field name in front).
inline std::optional<HostPort> split_host_port(std::string_view address, std::string& why) {
  auto fail = [&](std::string reason) -> std::optional<HostPort> {
    why = std::move(reason);
    return std::nullopt;
  };
  if (address.empty()) return fail("is empty");
  if (auto scheme = address.find("://"); scheme != std::string_view::npos) {
    return fail(fmt::format("has a scheme ({}); write host:port and set the rpc layer separately",
                            quote_input(address.substr(0, scheme + 3))));
  }
  std::string_view host;
  std::string_view port;
  if (address.front() == '[') {
    auto close = address.find(']');
    if (close == std::string_view::npos) return fail("has an unclosed '['");
    host = address.substr(1, close - 1);
    auto rest = address.substr(close + 1);
    if (rest.empty() || rest.front() != ':') return fail("has no ':port' after ']'; expected [host]:port");
    port = rest.substr(1);
    if (host.empty()) return fail("has an empty host in brackets; expected [host]:port");
    if (host.size() > kMaxHostNameBytes) return fail(fmt::format("has a {}", host_problem(host, true)));
    // An IPv6 literal (inet_pton decides), then an optional "%zone".
    if (!host_problem(host, true).empty()) return fail(fmt::format("has {} in brackets, which is not an IPv6 address", quote_input(host)));
  } else {
    auto colon = address.rfind(':');
    if (colon == std::string_view::npos) return fail("has no port; expected host:port");
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) {
      return fail("has an IPv6 host without brackets; write [host]:port, e.g. [::1]:2222");
    }
    if (host.empty()) return fail("has an empty host; expected host:port");
    if (host.size() > kMaxHostNameBytes) return fail(fmt::format("has a {}", host_problem(host, false)));
    if (auto bad = std::find_if_not(host.begin(), host.end(), is_hostname_char); bad != host.end()) {
      return fail(fmt::format("has host {} with the invalid character '{}'", quote_input(host), *bad));
    }
  }
  if (port.empty()) return fail("has an empty port; expected host:port");
  int p = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  bool digits = std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits || (ec != std::errc{} && ec != std::errc::result_out_of_range) || end != port.data() + port.size()) {
    return fail(fmt::format("has port {}, which is not a number", quote_input(port)));
  }
  if (ec == std::errc::result_out_of_range || p < 1 || p > 65535) {
    return fail(fmt::format("has port {}{}, out of range [1, 65535]", port.substr(0, 20), port.size() > 20 ? "..." : ""));
  }
  return HostPort{std::string(host), p};
}

}  // namespace cluster::detail

/// Splits "host:port" or "[v6]:port"; throws ClusterConfigError naming the address and what is
/// wrong with it (no port, port out of [1, 65535], an unbracketed IPv6 host, a URL scheme...).
inline HostPort split_host_port(std::string_view address) {
  std::string why;
  auto hp = cluster::detail::split_host_port(address, why);
  if (!hp) throw ClusterConfigError(fmt::format("address {} {}", quote_input(address), why));
  return *hp;
}

/// True when split_host_port(address) would succeed.
inline bool is_valid_address(std::string_view address) {
  std::string why;
  return cluster::detail::split_host_port(address, why).has_value();
}

DISTRIBUTE_END_NAMESPACE
